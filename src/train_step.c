/*
 * train_step: the step loop of `shardlm train` (train.c sets up the job it runs).
 *
 * The step loop reads top to bottom: pick the step's records (data; each data-parallel rank runs
 * its own micro-batches), run each micro-batch's forward and backward (model over the backend,
 * units through shard), finish the step (shard: reduce, norm, AdamW), agree on the loss over the
 * ranks, log and rewrite training_metrics.json (metrics), write a checkpoint when due (ckpt).
 * A step with a non-finite loss or gradient is skipped (train.max_bad_steps of them in a row stop
 * the run); a signal stops the run at a step boundary.
 */
#define _GNU_SOURCE
#include "sl_build.h"
#include "train_impl.h"

#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "optim.h"
#include "signals.h"

/* sft: the target tokens of record i */
static long record_targets(const struct sl_dataset *ds, int i)
{
	const struct sl_record *r = &ds->rec[i];
	long n = 0;

	for (int p = 1; r->mask && p < r->len; p++)
		n += r->mask[p] != 0;
	return n;
}

/*
 * Tests only: SHARDLM_TEST_NAN_STEP=N (or N-M) makes those steps' loss and gradient non-finite,
 * so the bad-step path is tested without a model that diverges.  No production use.
 */
static bool test_nan_step(int step)
{
	const char *e = getenv("SHARDLM_TEST_NAN_STEP");
	int a, b;

	if (!e || sscanf(e, "%d-%d", &a, &b) < 1)
		return false;
	if (!strchr(e, '-'))
		b = a;
	return step >= a && step <= b;
}

/* a NaN step (SHARDLM_TEST_NAN_STEP) whose updates run in the backward: each unit's gradient
 * poisoned as the backward finishes it (sl_shard_early_update); SHARDLM_TEST_NAN_PART=1 only
 * the embedding's (the last), so the others' updates run */
static int test_early_poison(void)
{
	const char *e = getenv("SHARDLM_TEST_NAN_PART");

	return e && !strcmp(e, "1") ? 2 : 1;
}

static void poison_gradient(struct job *j, double *loss)
{
	float nan = NAN;

	*loss = NAN;
	if (j->sh.early_step)
		return;		/* poisoned as the backward finished each unit */
	if (j->d.rank != 0)
		return;		/* the norm is summed over ranks: one NaN reaches all */
	if (j->sh.host_state && j->sh.lean) {
		j->be->upload(j->be, j->sh.u[0].d_acc, &nan, sizeof(nan));
	} else if (j->sh.host_state) {
		sl_shard_drain(&j->sh);	/* the offload worker may still be writing it */
		j->sh.u[0].grad32[0] = nan;
	}
	else if (j->sh.grad_direct)
		sl_shard_poison(j->be, j->sh.u[0].gradc);
	else
		j->be->upload(j->be, j->sh.u[0].grad32, &nan, sizeof(nan));
}

/* A skipped step's records, by line of the data file, for the log. */
static void log_step_records(struct job *j, int step)
{
	int *idx = malloc(j->R * sizeof(int)), n, used = 0;
	char buf[512];

	if (!idx || (n = sl_sampler_step(&j->smp, step - 1, idx)) < 0) {
		free(idx);
		return;
	}
	buf[0] = 0;
	for (int i = 0; i < n && used < (int)sizeof(buf) - 32; i++)
		used += snprintf(buf + used, sizeof(buf) - used, "%s%ld", i ? "," : "",
				 j->train.rec[idx[i]].line);
	sl_log("step %d skipped: its %d record(s) are lines %s%s of %s", step, n, buf,
	       used >= (int)sizeof(buf) - 32 ? ",..." : "", j->train.path);
	free(idx);
}

/*
 * train.max_bad_steps non-finite steps in a row: stop with a checkpoint of the last good step
 * (skipped steps leave the shards alone, so they still hold it).  The exit status.
 */
static int bad_steps_stop(struct job *j, int step, int bad)
{
	int good = step - bad;

	sl_error("%d steps in a row with a non-finite loss or gradient (train.max_bad_steps %d); "
		 "stopping after step %d. Lower optim.lr or check the records logged above",
		 bad, j->c->train.max_bad_steps, step);
	if (good > j->last_ckpt_step && train_write_checkpoint(j, good))
		return SL_EXIT_ERROR;
	if (j->last_ckpt_step)
		sl_log("the last good step's state is checkpoint step-%06d", j->last_ckpt_step);
	return SL_EXIT_BAD_STEPS;
}

/*
 * At a step boundary: stop when a signal asked for it (signals.h), after a checkpoint when there
 * is time.  0 = go on, else the exit status.
 */
static int signal_stop(struct job *j, int step)
{
	bool ckpt;
	int sig;

	/* a collective: a rank that died or hangs must not leave the others waiting here */
	sl_watchdog_arm(j->c->parallel.timeout_s, "the signal check after step %d", step);
	sig = sl_signals_agree(MPI_COMM_WORLD, j->last_ckpt_s, &ckpt);
	sl_watchdog_disarm();
	if (!sig)
		return 0;
	if (!ckpt) {
		sl_log("%s: no time for a checkpoint within checkpoint.term_grace_s (%d s; the last "
		       "write took %.0f s): stopping after step %d without one; resubmitting "
		       "resumes from step %d", sl_signals_name(sig), j->c->checkpoint.term_grace_s,
		       j->last_ckpt_s, step, j->last_ckpt_step);
		return 128 + sig;
	}
	if (j->last_ckpt_step != step && train_write_checkpoint(j, step))
		return SL_EXIT_ERROR;
	sl_log("%s: stopped after step %d with checkpoint step-%06d; resubmit to resume "
	       "(exit status %d)", sl_signals_name(sig), step, step, SL_EXIT_STOPPED);
	return SL_EXIT_STOPPED;
}

/* H100/H200 dense bf16 peak, the MFU denominator (DESIGN.md §3) */
#define SL_PEAK_FLOPS 989e12

/* the micro-batch's tokens per expert into the step's (sm->expert_tokens, one buffer reused) */
static void expert_tokens_add(const struct sl_model *m, struct sl_step_metrics *sm, bool first)
{
	static long long *sum;
	const int64_t *c;
	int nl, ne;
	double aux;

	c = sl_model_expert_counts(m, &nl, &ne, &aux);
	if (!c)
		return;
	if (!sum && !(sum = calloc((size_t)nl * ne, sizeof(*sum))))
		sl_dist_abort("out of memory");
	for (size_t i = 0; i < (size_t)nl * ne; i++)
		sum[i] = (first ? 0 : sum[i]) + c[i];
	sm->moe_layers = nl;
	sm->n_experts = ne;
	sm->expert_tokens = sum;
}

/*
 * Model FLOPs of one micro-batch's forward and backward: 6 per parameter of every matrix
 * multiply (embedding excluded; experts at top_k / n_experts) per real token, plus the token
 * mixers (sl_model_mixer_flops: causal attention, the gated delta rule) of each record.  The head
 * counts for the rows it is applied to: each record's last token (classify), each target's
 * predecessor (sft; the tied head included).  Padding is not counted.
 */
static double model_flops(const struct job *j, const struct sl_host_batch *hb)
{
	const struct sl_model_config *mc = &j->mf.mc;
	const struct sl_layout *lay = &j->mf.lay;
	double f = 0, p = sl_model_matmul_params(mc, lay), head = 0, rows;

	for (int i = 0; i < lay->n_tensors; i++)
		if (lay->t[i].head)
			head += (double)lay->t[i].numel;
	p -= head;
	if (sl_model_is_lm(j->model)) {
		head = (double)mc->vocab * mc->hidden;
		rows = j->db.view.n_tgt;
	} else {
		rows = hb->B;
	}
	for (int b = 0; b < hb->B; b++) {
		double n = hb->lens[b];

		f += 6 * p * n;
		if (!hb->packed) {
			f += sl_model_mixer_flops(mc, n);
			continue;
		}
		/* packed: each record mixes only its own tokens (positions restart at 0) */
		for (int t = 0, start = 0; t <= hb->lens[b]; t++)
			if (t == hb->lens[b] || (t > start && hb->pos[(size_t)b * hb->L + t] == 0)) {
				f += sl_model_mixer_flops(mc, t - start);
				start = t;
			}
	}
	return f + 6 * head * rows;
}

int train_run_steps(struct job *j)
{
	const struct sl_config *c = j->c;
	int *idx = malloc(c->train.batch * sizeof(int)), bad_steps = 0, ret = -1;
	bool lm = sl_model_is_lm(j->model);
	int *step_idx = malloc(j->R * sizeof(int));
	double denom = j->R;	/* classify: mean over the step's records */
	int pad = j->mf.mc.pad_token_id >= 0 ? j->mf.mc.pad_token_id : 0;
	double t_train0 = sl_now();
	char dur[64];
	bool do_eval0 = j->valid.n && j->first_step == 1;

	if (do_eval0) {
		sl_watchdog_arm(c->parallel.timeout_s, "evaluation before step 1");
		train_run_eval(j, 0, pad);
		sl_watchdog_disarm();
	}
	for (int step = j->first_step; step <= j->steps; step++) {
		struct sl_step_metrics sm = { .step = step };
		struct sl_optim_hparams h;
		double t0 = sl_now(), mine[5] = { 0 }, sums[5], peak;
		int status, stop;

		sl_watchdog_arm(c->parallel.timeout_s, "step %d", step);
		if (j->be->step_range)
			j->be->step_range(j->be, step);
		train_gpu_reset_peak(j);
		sl_shard_begin_step(&j->sh);
		h = (struct sl_optim_hparams){
			.lr = sl_lr_at(c->optim.schedule, c->optim.lr, c->optim.min_lr,
				       c->optim.warmup, step, j->steps),
			.head_lr_mult = c->optim.head_lr_mult, .beta1 = c->optim.betas[0],
			.beta2 = c->optim.betas[1], .eps = c->optim.eps,
			.weight_decay = c->optim.weight_decay, .clip = c->optim.clip, .step = step,
		};
		sl_shard_early_update(&j->sh, &h, test_nan_step(step) ? test_early_poison() : 0);
		if (lm) {
			/* the loss is per target token of the whole step: every rank counts them */
			sl_sampler_step(&j->smp, step - 1, step_idx);
			denom = 0;
			for (int i = 0; i < j->R; i++)
				denom += record_targets(&j->train, step_idx[i]);
			if (denom <= 0)
				sl_dist_abort("internal error: an sft step without target tokens");
		}
		for (int acc = 0; acc < c->train.accum; acc++) {
			int n = sl_sampler_microbatch(&j->smp, step - 1, acc, j->d.rank / j->C, idx);
			const struct sl_batch_dev *view = &j->db.view;
			double part = 0;

			if (n < 0 || (c->data.pack ?
				      sl_host_batch_pack(&j->hb, &j->train, idx, n, pad, j->max_L) :
				      sl_host_batch_fill(&j->hb, &j->train, idx, n, pad)))
				sl_dist_abort("internal error: bad micro-batch");
			if (j->C > 1) {
				view = sl_cp_upload(&j->cp, &j->hb, pad, lm);
			} else {
				dev_batch_upload(j->be, &j->db, &j->hb);
				if (lm)
					dev_batch_targets(j->be, &j->db, &j->hb);
			}
			sl_shard_begin_micro(&j->sh, acc == c->train.accum - 1);
			if (sl_model_train_step(j->model, &j->sh.src, view, (float)(1.0 / denom),
						&part, NULL))
				sl_dist_abort("the model step failed");
			mine[0] += part;
			expert_tokens_add(j->model, &sm, acc == 0);
			sm.dropped_tokens += sl_model_moe_dropped(j->model);
			if (j->d.rank % j->C)
				continue;	/* the context group's records count once */
			mine[1] += n;
			mine[2] += j->hb.tokens;
			mine[3] += j->hb.padded_tokens;
			mine[4] += model_flops(j, &j->hb);
		}
		if (test_nan_step(step))
			poison_gradient(j, &mine[0]);
		/* the loss first: a non-finite one skips the update as a non-finite norm does */
		MPI_Allreduce(mine, sums, 5, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
		if (sm.moe_layers)
			MPI_Allreduce(MPI_IN_PLACE, (long long *)sm.expert_tokens,
				      sm.moe_layers * sm.n_experts, MPI_LONG_LONG, MPI_SUM,
				      MPI_COMM_WORLD);
		sm.capacity = c->parallel.capacity_factor > 0;
		if (sm.capacity)
			MPI_Allreduce(MPI_IN_PLACE, &sm.dropped_tokens, 1, MPI_LONG_LONG, MPI_SUM,
				      MPI_COMM_WORLD);
		{
			double mem[3];

			mem[0] = train_gpu_peak(j);
			train_gpu_reserved(j, &mem[1], &mem[2]);
			MPI_Allreduce(MPI_IN_PLACE, mem, 3, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
			peak = mem[0];
			sm.peak_gpu_bytes = (long long)mem[0];
			sm.reserved_gpu_bytes = (long long)mem[1];
			sm.device_used_bytes = (long long)mem[2];
		}
		sm.grad_norm = NAN;
		/* updates issued in the backward (sl_shard_early_update) already ran where their
		 * unit's gradient was finite: the shard says what happened */
		if (j->sh.early_step) {
			status = sl_shard_optim_step(&j->sh, &h, &sm.grad_norm);
			if (!status && !isfinite(sums[0]))
				status = 2;
		} else {
			status = isfinite(sums[0]) ? sl_shard_optim_step(&j->sh, &h, &sm.grad_norm) : 1;
		}
		if (status == 2) {
			j->be->sync(j->be);
			sl_error("step %d: the loss (%g) or a gradient is not finite, but the updates "
				 "issued in the backward (optim.clip 0) ran for the units whose "
				 "gradient came before it: the step cannot be skipped; stopping without "
				 "a checkpoint (SHARDLM_OPT_BWD=0 skips such steps)", step,
				 sums[0] / denom);
			if (j->last_ckpt_step)
				sl_log("the last good step's state is checkpoint step-%06d",
				       j->last_ckpt_step);
			ret = SL_EXIT_BAD_STEPS;
			goto out;
		}
		j->be->sync(j->be);
		sm.loss = sums[0] / denom;
		sm.targets = lm ? (long)denom : 0;
		sm.records = (long)sums[1];
		sm.tokens = (long)sums[2];
		sm.padded_tokens = (long)sums[3];
		sm.lr = h.lr;
		sm.time_s = sl_now() - t0;
		sm.end_unix = sl_unix_time();
		sl_signals_step_done(sm.time_s);
		if (status) {
			bad_steps++;
			sm.skipped = true;
			sl_metrics_run_int(j->met, "skipped_steps", ++j->skipped_steps);
			if (j->d.rank == 0)
				sl_warn("step %d: the loss (%g) or gradient norm (%g) is not finite; "
					"skipped the update (%d of train.max_bad_steps %d in a row)",
					step, sm.loss, sm.grad_norm, bad_steps,
					c->train.max_bad_steps);
			log_step_records(j, step);
			if (bad_steps >= c->train.max_bad_steps) {
				sl_metrics_add_step(j->met, &sm);
				if (j->d.rank == 0)
					sl_metrics_write(j->met);
				ret = bad_steps_stop(j, step, bad_steps);
				goto out;
			}
		} else {
			bad_steps = 0;
		}
		sl_metrics_add_step(j->met, &sm);
		if (j->tb && (sl_tb_scalar(j->tb, "train/loss", step, sm.loss) ||
			      sl_tb_scalar(j->tb, "train/lr", step, sm.lr) ||
			      sl_tb_scalar(j->tb, "train/grad_norm", step, sm.grad_norm) ||
			      sl_tb_scalar(j->tb, "train/tokens_per_s", step,
					   sm.tokens / fmax(sm.time_s, 1e-9)))) {
			sl_warn("TensorBoard events stop here; training goes on");
			sl_tb_close(j->tb);
			j->tb = NULL;
		}
		if (j->tb && j->cuda) {
			sl_tb_scalar(j->tb, "train/mfu", step,
				     sums[4] / fmax(sm.time_s, 1e-9) / j->d.world / SL_PEAK_FLOPS);
			sl_tb_scalar(j->tb, "gpu/peak_memory_gb", step, peak / 1e9);
		}
		if (step % c->run.log_every == 0 || step == j->steps || step == j->first_step) {
			char gpu[96] = "";

			if (j->cuda)
				snprintf(gpu, sizeof(gpu), "  mfu %.1f%%  peak_gpu %.1f GB",
					 100 * sums[4] / fmax(sm.time_s, 1e-9) / j->d.world /
					 SL_PEAK_FLOPS, peak / 1e9);
			sl_log("step %d/%d  loss %.4f  lr %.3e  grad_norm %.4f  s/step %.3f  "
			       "tokens/s %.0f%s  world %d", step, j->steps, sm.loss, sm.lr,
			       sm.grad_norm, sm.time_s, sm.tokens / fmax(sm.time_s, 1e-9), gpu,
			       j->d.world);
		}
		if (j->valid.n && ((c->train.eval_every && step % c->train.eval_every == 0) ||
				   step == j->steps)) {
			sl_watchdog_arm(c->parallel.timeout_s, "evaluation after step %d", step);
			train_run_eval(j, step, pad);
		}
		if (j->tb && (step % c->run.log_every == 0 || step == j->steps))
			sl_tb_flush(j->tb);
		if (j->d.rank == 0 && sl_metrics_write_async(j->met))
			sl_dist_abort("cannot write training_metrics.json");
		sl_watchdog_disarm();
		if (c->checkpoint.every > 0 && !status &&
		    (step % c->checkpoint.every == 0 || step == j->steps) &&
		    train_write_checkpoint(j, step))
			goto out;
		stop = signal_stop(j, step);
		if (stop) {
			ret = stop;
			goto out;
		}
	}
	train_format_duration(sl_now() - t_train0, dur, sizeof(dur));
	sl_log("trained steps %d to %d in %s", j->first_step, j->steps, dur);
	ret = 0;
out:
	/* the metrics' writer thread has the last step's document still to write */
	if (j->d.rank == 0 && sl_metrics_flush(j->met))
		sl_dist_abort("cannot write training_metrics.json");
	/* the last update may still run on the side stream (overlap_optimizer) */
	sl_shard_settle(&j->sh);
	j->be->sync(j->be);
	if (j->be->step_range)
		j->be->step_range(j->be, 0);
	free(idx);
	free(step_idx);
	return ret;
}
