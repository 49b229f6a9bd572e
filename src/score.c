/*
 * score: `shardlm score` (one JSON line per record) and `shardlm export` (a checkpoint as a
 * Hugging Face model directory), both on one rank.
 */
#define _GNU_SOURCE
#include "sl_build.h"
#include "train.h"

#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend.h"
#include "ckpt.h"
#include "data.h"
#include "dist.h"
#include "fsutil.h"
#include "log.h"
#include "model.h"
#include "modelio.h"
#include "shard.h"
#include "tokenizer.h"

/* Whole units of a checkpoint, read as one rank (any world size wrote it). */
static int read_checkpoint_units(const char *dir, const struct sl_model_files *mf,
				 struct sl_shard *sh)
{
	struct sl_ckpt_geom g = { .lay = &mf->lay, .shard_size = 1, .shard_rank = 0,
				  .writer = true, .world = 1, .rank = 0,
				  .shard = sh->shard_sizes };
	struct sl_ckpt_state st = { 0 };
	float **units = calloc(mf->lay.n_units, sizeof(float *));
	int ret;

	for (int u = 0; u < mf->lay.n_units; u++)
		units[u] = calloc(sh->u[u].shard, sizeof(float));
	ret = sl_ckpt_read(dir, &g, &st, units, NULL, NULL, MPI_COMM_SELF);
	if (ret == 0)
		for (int u = 0; u < mf->lay.n_units; u++)
			sl_shard_set_state(sh, u, units[u], NULL, NULL);
	free((void *)st.config_yaml);
	sl_model_free_units(units, mf->lay.n_units);
	return ret;
}

/* logits of every record of @ds, micro-batches of @batch records of similar length */
static void score_all(struct sl_backend *be, struct sl_model *m, const struct sl_unit_source *src,
		      const struct sl_dataset *ds, int batch, int max_L, int32_t pad, float *out)
{
	struct sl_host_batch hb;
	int *order = malloc(ds->n * sizeof(int));
	float *s = malloc(batch * sizeof(float));
	int32_t *ids = be->alloc(be, (size_t)batch * max_L * sizeof(int32_t));
	int32_t *lens = be->alloc(be, batch * sizeof(int32_t));
	int32_t *last = be->alloc(be, batch * sizeof(int32_t));

	for (int i = 0; i < ds->n; i++)
		order[i] = i;
	sl_data_sort_longest_first(ds, order, ds->n);
	sl_host_batch_alloc(&hb, batch, max_L);
	for (int i = 0; i < ds->n; i += batch) {
		int n = ds->n - i < batch ? ds->n - i : batch;
		struct sl_batch_dev b;

		sl_host_batch_fill(&hb, ds, order + i, n, pad);
		be->upload(be, ids, hb.ids, (size_t)hb.B * hb.L * sizeof(int32_t));
		be->upload(be, lens, hb.lens, hb.B * sizeof(int32_t));
		be->upload(be, last, hb.last, hb.B * sizeof(int32_t));
		b = (struct sl_batch_dev){ .B = hb.B, .L = hb.L, .ids = ids, .lens = lens,
					   .last = last, .labels = NULL, .h_lens = hb.lens };
		sl_model_score(m, src, &b, s);
		for (int j = 0; j < n; j++)
			out[order[i + j]] = s[j];
	}
	be->free(be, ids);
	be->free(be, lens);
	be->free(be, last);
	sl_host_batch_free(&hb);
	free(order);
	free(s);
}

int sl_cmd_score(int argc, char **argv)
{
	struct sl_cmd_args a;
	struct sl_config *c = calloc(1, sizeof(*c));
	struct sl_dist d;
	struct sl_model_files mf;
	struct sl_dataset ds = { 0 };
	struct sl_backend *be = NULL;
	struct sl_shard sh = { 0 };
	struct sl_model *model = NULL;
	struct sl_shard_opts so = { 0 };
	char exported[SL_PATH_MAX + 64], probe[SL_PATH_MAX + 96], root[SL_PATH_MAX + 64];
	char ckpt[SL_PATH_MAX + 64];
	const char *weights, *ckpt_dir = NULL;
	struct sl_tokenizer *tok = NULL;
	float *scores = NULL;
	int ret = 2, batch, n_init = 0, step, max_L;
	bool have_mf = false;

	sl_log_init();
	sl_log_to_stderr(true);
	if (sl_dist_init(&d, &argc, &argv))
		sl_dist_abort("MPI start-up failed");
	sl_log_set_rank(d.rank, d.world, d.host);
	ret = sl_cmd_parse("score", argc, argv, &a);
	if (ret) {
		ret = ret > 0 ? 0 : 2;
		goto out;
	}
	ret = 2;
	if (d.world > 1) {
		sl_error("score runs on one rank; start it without mpirun/srun");
		goto out;
	}
	if (sl_config_load(c, a.config, a.set, a.nset, false) || sl_check_supported(c, false))
		goto out;
	if (c->task != SL_TASK_CLASSIFY) {
		sl_error("%s: task: %s has no scores; score applies to task classify (an sft run "
			 "reports its validation loss while training)", c->source,
			 sl_task_name(c->task));
		goto out;
	}
	/* weights: --model, else the run's export, else its newest checkpoint, else model.path */
	snprintf(exported, sizeof(exported), "%s/model", c->run.dir);
	snprintf(probe, sizeof(probe), "%s/config.json", exported);
	sl_checkpoint_root(c, root, sizeof(root));
	if (a.model) {
		snprintf(probe, sizeof(probe), "%s/index.h5", a.model);
		if (sl_is_file(probe))
			ckpt_dir = a.model;
		weights = ckpt_dir ? c->model.path : a.model;
	} else if (sl_is_file(probe)) {
		weights = exported;
	} else if (sl_ckpt_find_latest(root, ckpt, sizeof(ckpt), &step) > 0) {
		ckpt_dir = ckpt;
		weights = c->model.path;
	} else if (c->model.path[0]) {
		weights = c->model.path;
	} else {
		sl_error("%s: no weights to score with: pass --model DIR, train first (%s), or set "
			 "model.path", a.config, exported);
		goto out;
	}
	if (ckpt_dir && !weights[0]) {
		sl_error("%s: scoring checkpoint %s needs model.path (for config.json)", a.config,
			 ckpt_dir);
		goto out;
	}
	if (sl_model_files_open(&mf, weights, weights == c->model.path ? c->model.revision : "",
				c->task))
		goto out;
	have_mf = true;
	be = sl_backend_cpu_create();
	if (!be || sl_shard_create(&sh, be, &mf.lay, &so))
		goto out;
	if (ckpt_dir) {
		sl_log("scoring %s with checkpoint %s", a.data, ckpt_dir);
		if (read_checkpoint_units(ckpt_dir, &mf, &sh))
			goto out;
	} else {
		sl_log("scoring %s with %s", a.data, mf.dir);
		if (sl_model_files_load_shard(&mf, &sh, (uint64_t)c->data.seed, &n_init))
			goto out;
		if (n_init)
			sl_warn("%s has no trained head: the scores come from a randomly initialized "
				"one", mf.dir);
	}
	{
		struct sl_data_opts o = {
			.text_field = c->data.text_field, .label_field = c->data.label_field,
			.max_state = 0, .need_label = false,
			.skip_errors = c->data.on_error == SL_ON_ERROR_SKIP, .vocab = mf.mc.vocab,
		};

		snprintf(probe, sizeof(probe), "%s/tokenizer.json", mf.dir);
		if (sl_is_file(probe)) {
			tok = sl_tokenizer_load(probe);
			if (!tok)
				goto out;
			o.tokenizer = tok;
		}
		if (sl_data_load(&ds, a.data, &o))
			goto out;
	}
	batch = c->train.batch;
	max_L = sl_data_max_len(&ds);
	/* no backward: no room for what the forward would keep for it */
	be->gdn_states_extra = NULL;
	model = sl_model_create(&mf.mc, &mf.lay, be, batch * max_L, batch, false);
	if (!model)
		goto out;
	scores = malloc(ds.n * sizeof(float));
	score_all(be, model, &sh.src, &ds, batch, max_L,
		  mf.mc.pad_token_id >= 0 ? mf.mc.pad_token_id : 0, scores);
	for (int i = 0; i < ds.n; i++)
		printf("{\"index\":%d,\"score\":%.9g,\"prob\":%.9g}\n", i, scores[i],
		       1.0 / (1.0 + exp(-(double)scores[i])));
	fflush(stdout);
	ret = 0;
out:
	free(scores);
	if (be) {
		if (model)
			sl_model_destroy(model);
		sl_shard_destroy(&sh);
		be->destroy(be);
	}
	sl_data_free(&ds);
	if (tok)
		sl_tokenizer_free(tok);
	if (have_mf)
		sl_model_files_close(&mf);
	free(c);
	sl_dist_finalize(&d);
	return ret;
}

int sl_cmd_export(int argc, char **argv)
{
	struct sl_cmd_args a;
	struct sl_config *c = calloc(1, sizeof(*c));
	struct sl_dist d;
	struct sl_model_files mf;
	struct sl_backend *be = NULL;
	struct sl_shard sh = { 0 };
	struct sl_shard_opts so = { 0 };
	char tmp[] = "/tmp/shardlm-export-XXXXXX", *yaml = NULL;
	float **units = NULL;
	int ret = 2, fd;
	bool have_mf = false;

	sl_log_init();
	if (sl_dist_init(&d, &argc, &argv))
		sl_dist_abort("MPI start-up failed");
	ret = sl_cmd_parse("export", argc, argv, &a);
	if (ret) {
		ret = ret > 0 ? 0 : 2;
		goto out;
	}
	ret = 2;
	if (d.world > 1) {
		sl_error("export runs on one rank; start it without mpirun/srun");
		goto out;
	}
	/* the checkpoint's own config names the model (config.json, tokenizer) and export.dtype */
	yaml = sl_ckpt_read_config(a.checkpoint);
	if (!yaml)
		goto out;
	fd = mkstemp(tmp);
	if (fd < 0 || write(fd, yaml, strlen(yaml)) != (ssize_t)strlen(yaml)) {
		sl_error("cannot write a temporary file for the checkpoint's config");
		if (fd >= 0)
			close(fd);
		goto out;
	}
	close(fd);
	ret = sl_config_load(c, tmp, NULL, 0, false);
	unlink(tmp);
	if (ret) {
		ret = 2;
		sl_error("%s: the stored config does not load", a.checkpoint);
		goto out;
	}
	ret = 2;
	if (sl_model_files_open(&mf, c->model.path, c->model.revision, c->task)) {
		sl_error("%s: export needs the model the run started from (model.path %s) for "
			 "config.json and the tokenizer files", a.checkpoint, c->model.path);
		goto out;
	}
	have_mf = true;
	be = sl_backend_cpu_create();
	if (!be || sl_shard_create(&sh, be, &mf.lay, &so))
		goto out;
	if (read_checkpoint_units(a.checkpoint, &mf, &sh))
		goto out;
	if (sl_model_gather_for_export(&sh, 1, &units) ||
	    sl_model_export(a.out, &mf, units, c->export_.dtype, MPI_COMM_SELF))
		goto out;
	sl_log("exported %s to %s (%s)", a.checkpoint, a.out, sl_precision_name(c->export_.dtype));
	ret = 0;
out:
	sl_model_free_units(units, have_mf ? mf.lay.n_units : 0);
	if (be) {
		sl_shard_destroy(&sh);
		be->destroy(be);
	}
	if (have_mf)
		sl_model_files_close(&mf);
	free(yaml);
	free(c);
	sl_dist_finalize(&d);
	return ret;
}
