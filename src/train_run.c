/*
 * train_run: the run directory of `shardlm train` (a new run, a run to resume, or a refusal), the
 * checkpoints the job writes, the one it resumes from (a resumed run may change only a few keys)
 * and the final export of the model.
 */
#define _GNU_SOURCE
#include "sl_build.h"
#include "train_impl.h"

#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ckpt.h"
#include "fsutil.h"
#include "log.h"

static bool dir_has_run(const char *path)
{
	char probe[SL_PATH_MAX + 32];
	static const char *const files[] = { "training_metrics.json", "train.log", "config.yaml",
					     "model", "checkpoints" };

	for (size_t i = 0; i < sizeof(files) / sizeof(files[0]); i++) {
		snprintf(probe, sizeof(probe), "%s/%s", path, files[i]);
		if (access(probe, F_OK) == 0)
			return true;
	}
	return false;
}

/*
 * Rank 0 decides what the run directory holds: a new run (0), a run to resume from the newest
 * complete checkpoint (1, its dir in @ckpt_dir), or refuses (-1).  A directory that holds a run
 * is never overwritten: --fresh moves it aside to RUN.old-N.
 */
int train_prepare_run_dir(const struct sl_config *c, bool fresh, char *ckpt_dir, size_t n)
{
	const char *dir = c->run.dir;
	char root[SL_PATH_MAX + 64], aside[SL_PATH_MAX + 32];
	int step, found;

	if (sl_is_dir(dir) && dir_has_run(dir)) {
		if (fresh) {
			if (sl_move_aside(dir, aside, sizeof(aside)))
				return -1;
			sl_log("moved the previous run %s aside to %s", dir, aside);
		} else {
			sl_checkpoint_root(c, root, sizeof(root));
			found = sl_ckpt_find_latest(root, ckpt_dir, n, &step);
			if (found < 0)
				return -1;
			if (found)
				return 1;
			sl_error("run directory %s already holds a run and has no complete "
				 "checkpoint to resume from; pass --fresh to move it aside (to "
				 "%s.old-N), or set run.dir to another directory", dir, dir);
			return -1;
		}
	}
	return sl_mkdir_p(dir) ? -1 : 0;
}

/* A resumed run may change only these keys (and the world size). */
static int check_resume_config(const struct sl_config *now, const char *old_yaml, int old_R,
			       int R, const char *ckpt_dir)
{
	static const char *const may_change[] = { "train.steps", "train.epochs", "train.batch",
						  "train.accum", "checkpoint.", "run.log_every",
						  "run.dir", "gpu_log.",
						  /* checkpoints hold every expert whole */
						  "parallel.expert", NULL };
	struct sl_config *old = calloc(1, sizeof(*old));
	char path[] = "/tmp/shardlm-resume-XXXXXX", key[128], a[256], b[256];
	int fd = mkstemp(path), ret = -1;

	if (fd < 0 || !old)
		goto out;
	if (write(fd, old_yaml, strlen(old_yaml)) != (ssize_t)strlen(old_yaml)) {
		close(fd);
		goto out_unlink;
	}
	close(fd);
	if (sl_config_load(old, path, NULL, 0, false)) {
		sl_error("%s: the checkpoint's stored config does not load", ckpt_dir);
		goto out_unlink;
	}
	if (sl_config_diff_ignoring(old, now, may_change, key, sizeof(key))) {
		sl_config_format(old, key, a, sizeof(a));
		sl_config_format(now, key, b, sizeof(b));
		sl_error("cannot resume %s: %s changed from %s to %s; a resumed run may change only "
			 "the world size, parallel.expert, train.steps, batch/accum keeping the "
			 "records per step, checkpoint.*, run.log_every and gpu_log.* (or pass "
			 "--fresh to start over)",
			 ckpt_dir, key, a, b);
		goto out_unlink;
	}
	if (old_R != R) {
		sl_error("cannot resume %s: records per step change from %d to %d (batch x accum x "
			 "data-parallel ranks must stay the same)", ckpt_dir, old_R, R);
		goto out_unlink;
	}
	ret = 0;
out_unlink:
	unlink(path);
out:
	free(old);
	return ret;
}

static struct sl_ckpt_geom geom_of(struct job *j)
{
	return (struct sl_ckpt_geom){
		.lay = &j->mf.lay, .shard_size = j->sh.S, .shard_rank = j->sh.shard_rank,
		.writer = j->g.replica.rank == 0, .world = j->d.world, .rank = j->d.rank,
		.shard = j->sh.shard_sizes, .start = j->sh.shard_starts, .count = j->sh.shard_counts,
	};
}

/* Host copies of this rank's shards, for checkpoints. */
static void alloc_host_state(struct job *j, float ***ma, float ***mm, float ***mv)
{
	int n = j->sh.n_units;

	*ma = calloc(n, sizeof(float *));
	*mm = calloc(n, sizeof(float *));
	*mv = calloc(n, sizeof(float *));
	for (int u = 0; u < n; u++) {
		(*ma)[u] = malloc(j->sh.u[u].shard * sizeof(float));
		(*mm)[u] = malloc(j->sh.u[u].shard * sizeof(float));
		(*mv)[u] = malloc(j->sh.u[u].shard * sizeof(float));
	}
}

static void free_host_state(int n, float **ma, float **mm, float **mv)
{
	sl_model_free_units(ma, n);
	sl_model_free_units(mm, n);
	sl_model_free_units(mv, n);
}

int train_write_checkpoint(struct job *j, int step)
{
	struct sl_ckpt_geom g = geom_of(j);
	struct sl_ckpt_state st = { .step = step, .seed = (uint64_t)j->c->data.seed,
				    .data_cursor = (int64_t)step * j->R,
				    .config_yaml = j->yaml };
	float **ma, **mm, **mv;
	double bytes = 0, secs = 0;
	int ret;

	alloc_host_state(j, &ma, &mm, &mv);
	for (int u = 0; u < j->sh.n_units; u++) {
		sl_shard_get_state(&j->sh, u, ma[u], mm[u], mv[u]);
		bytes += j->sh.u[u].shard * 4.0 * (j->c->checkpoint.optimizer ? 3 : 1);
	}
	/* a long collective: the timeout plus this rank's bytes at a slow 20 MB/s */
	sl_watchdog_arm(j->c->parallel.timeout_s + bytes / 20e6, "checkpoint step-%06d", step);
	ret = sl_ckpt_write(j->ckpt_root, &g, &st, ma, mm, mv, j->c->checkpoint.optimizer,
			    j->c->checkpoint.keep, MPI_COMM_WORLD, &bytes, &secs);
	sl_watchdog_disarm();
	free_host_state(j->sh.n_units, ma, mm, mv);
	if (ret == 0) {
		sl_log("checkpoint step-%06d: %.1f MB in %.2f s (%.0f MB/s)", step, bytes / 1e6,
		       secs, bytes / 1e6 / fmax(secs, 1e-9));
		j->last_ckpt_step = step;
		j->last_ckpt_s = secs;
	} else if (j->last_ckpt_step) {
		sl_error("checkpoint step-%06d could not be written (see above); stopping. The last "
			 "complete checkpoint, step-%06d, is kept: fix the cause and resubmit to "
			 "resume from it", step, j->last_ckpt_step);
	} else {
		sl_error("checkpoint step-%06d could not be written (see above); stopping (this "
			 "run has no earlier checkpoint)", step);
	}
	return ret;
}

int train_resume_from(struct job *j, const char *dir)
{
	struct sl_ckpt_geom g = geom_of(j);
	struct sl_ckpt_state st = { 0 };
	float **ma, **mm, **mv;
	int ret = -1, old_R, has_opt;

	has_opt = sl_ckpt_has_optimizer(dir);
	if (!all_ok(has_opt >= 0))
		return -1;
	alloc_host_state(j, &ma, &mm, &mv);
	if (sl_ckpt_read(dir, &g, &st, ma, has_opt ? mm : NULL, has_opt ? mv : NULL,
			 MPI_COMM_WORLD))
		goto out;
	old_R = st.step ? (int)(st.data_cursor / st.step) : j->R;
	if (!all_ok(check_resume_config(j->c, st.config_yaml ? st.config_yaml : "", old_R, j->R,
					dir) == 0))
		goto out;
	for (int u = 0; u < j->sh.n_units; u++)
		sl_shard_set_state(&j->sh, u, ma[u], has_opt ? mm[u] : NULL, has_opt ? mv[u] : NULL);
	j->first_step = st.step + 1;
	j->last_ckpt_step = st.step;
	sl_log("resuming from %s (step %d of %d)%s", dir, st.step, j->steps,
	       has_opt ? "" : "; it holds weights only: AdamW moments start from zero");
	ret = 0;
out:
	free((void *)st.config_yaml);
	free_host_state(j->sh.n_units, ma, mm, mv);
	return ret;
}

int train_export_final(struct job *j)
{
	char path[SL_PATH_MAX + 16];
	float **units = NULL;
	int n_files = j->sh.S < j->sh.n_units ? j->sh.S : j->sh.n_units, ret = 0;
	bool exporter = j->g.replica.rank == 0;

	snprintf(path, sizeof(path), "%s/model", j->c->run.dir);
	if (exporter) {
		ret = sl_model_gather_for_export(&j->sh, n_files, &units);
		if (ret == 0)
			ret = sl_model_export(path, &j->mf, units, j->c->export_.dtype,
					      j->g.shard.mpi);
		sl_model_free_units(units, j->sh.n_units);
	}
	if (!all_ok(ret == 0))
		return -1;
	sl_log("exported the model to %s (%s, %d safetensors file(s))", path,
	       sl_precision_name(j->c->export_.dtype), n_files);
	return 0;
}
