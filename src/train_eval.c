/*
 * train_eval: validation during `shardlm train`.  Every rank runs the same number of forwards
 * over its share of the validation records and the sums are added over the ranks: classify gives
 * the mean BCE, Brier score and correlation, sft the mean cross-entropy per target token; they
 * go to the log, the metrics and TensorBoard.
 */
#define _GNU_SOURCE
#include "sl_build.h"
#include "train_impl.h"

#include <math.h>
#include <mpi.h>
#include <stdlib.h>

#include "log.h"

/*
 * Micro-batches every rank runs in a validation pass.  Sharded weights are gathered by
 * collectives inside each forward, so every rank must run the same number of forwards, though
 * records i % world == rank leave some ranks one record short: a rank past its own records runs
 * a stand-in batch (one of its records, or record 0) and discards what it gives.
 */
static int eval_rounds(int n, int world, int batch)
{
	int per_rank = (n + world - 1) / world;

	return (per_rank + batch - 1) / batch;
}

/* this rank's validation records (i % world == rank), longest first; *n_mine of them */
static int *eval_order(const struct sl_dataset *ds, int rank, int world, int *n_mine)
{
	int *order = malloc((ds->n / world + 1) * sizeof(int)), n = 0;

	if (!order)
		sl_dist_abort("out of host memory for the validation pass");
	for (int i = rank; i < ds->n; i += world)
		order[n++] = i;
	sl_data_sort_longest_first(ds, order, n);
	*n_mine = n;
	return order;
}

/*
 * Validation of the sft task over all ranks (records i % world == rank, similar lengths
 * together): the mean cross-entropy over every target token of the set.
 */
static double evaluate_lm(struct sl_backend *be, struct sl_model *m,
			  const struct sl_unit_source *src, const struct sl_dataset *ds, int batch,
			  int max_L, int32_t pad, int rank, int world, struct sl_cp *cp,
			  long *targets)
{
	struct sl_host_batch hb;
	struct dev_batch db;
	int n_mine, *order = eval_order(ds, rank, world, &n_mine), stand_in;
	double sums[2] = { 0 }, all[2];

	stand_in = n_mine ? order[0] : 0;
	sl_host_batch_alloc(&hb, batch, max_L);
	dev_batch_alloc(be, &db, batch, max_L);
	for (int i = 0; i < eval_rounds(ds->n, world, batch) * batch; i += batch) {
		/* past its own records a rank runs a stand-in batch: see eval_rounds */
		bool real = i < n_mine;
		int n = !real ? 1 : n_mine - i < batch ? n_mine - i : batch, tg;
		const struct sl_batch_dev *view = &db.view;
		double part = 0;

		sl_host_batch_fill(&hb, ds, real ? order + i : &stand_in, n, pad);
		if (cp) {	/* each target is on one rank of the context group */
			view = sl_cp_upload(cp, &hb, pad, true);
			tg = view->n_tgt;
		} else {
			dev_batch_upload(be, &db, &hb);
			tg = dev_batch_targets(be, &db, &hb);
		}
		if (sl_model_lm_loss(m, src, view, &part))
			sl_dist_abort("the model's validation pass failed");
		if (real) {
			sums[0] += part;
			sums[1] += tg;
		}
	}
	MPI_Allreduce(sums, all, 2, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
	dev_batch_free(be, &db);
	sl_host_batch_free(&hb);
	free(order);
	*targets = (long)all[1];
	return all[1] > 0 ? all[0] / all[1] : NAN;
}

enum { EV_N, EV_BCE, EV_SE, EV_P, EV_Y, EV_PP, EV_YY, EV_PY, EV_COUNT };

/*
 * Validation over all ranks: rank r scores records i with i % world == r (in micro-batches of
 * similar length); the sums are added over the ranks in a fixed order.  out: mean BCE, Brier
 * score, Pearson correlation of predicted and labelled probabilities.
 */
static void evaluate(struct sl_backend *be, struct sl_model *m, const struct sl_unit_source *src,
		     const struct sl_dataset *ds, int batch, int max_L, int32_t pad, int rank,
		     int world, struct sl_cp *cp, double out[3])
{
	struct sl_host_batch hb;
	struct dev_batch db;
	int n_mine, *order = eval_order(ds, rank, world, &n_mine), stand_in;
	float *s = malloc(batch * sizeof(float));
	double sums[EV_COUNT] = { 0 }, all[EV_COUNT];

	if (!s)
		sl_dist_abort("out of host memory for the validation pass");
	stand_in = n_mine ? order[0] : 0;
	sl_host_batch_alloc(&hb, batch, max_L);
	dev_batch_alloc(be, &db, batch, max_L);
	for (int i = 0; i < eval_rounds(ds->n, world, batch) * batch; i += batch) {
		/* past its own records a rank runs a stand-in batch: see eval_rounds */
		bool real = i < n_mine;
		int n = !real ? 1 : n_mine - i < batch ? n_mine - i : batch;

		sl_host_batch_fill(&hb, ds, real ? order + i : &stand_in, n, pad);
		/* context parallel: the rank holding a record's last token scores it */
		if (cp) {
			sl_model_score(m, src, sl_cp_upload(cp, &hb, pad, false), s);
			n = cp->cpb.n_last;
		} else {
			sl_model_score(m, src, dev_batch_upload(be, &db, &hb), s);
		}
		for (int j = 0; real && j < n; j++) {
			int r = cp ? cp->h_last_rec[j] : j;
			double z = s[j], y = ds->rec[order[i + r]].label;
			double p = 1 / (1 + exp(-z));

			sums[EV_N] += 1;
			sums[EV_BCE] += fmax(z, 0) - z * y + log1p(exp(-fabs(z)));
			sums[EV_SE] += (p - y) * (p - y);
			sums[EV_P] += p;
			sums[EV_Y] += y;
			sums[EV_PP] += p * p;
			sums[EV_YY] += y * y;
			sums[EV_PY] += p * y;
		}
	}
	MPI_Allreduce(sums, all, EV_COUNT, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
	{
		double n = all[EV_N], cov = all[EV_PY] / n - all[EV_P] / n * all[EV_Y] / n;
		double vp = all[EV_PP] / n - pow(all[EV_P] / n, 2);
		double vy = all[EV_YY] / n - pow(all[EV_Y] / n, 2);

		out[0] = all[EV_BCE] / n;
		out[1] = all[EV_SE] / n;
		out[2] = vp > 0 && vy > 0 ? cov / sqrt(vp * vy) : NAN;
	}
	dev_batch_free(be, &db);
	sl_host_batch_free(&hb);
	free(order);
	free(s);
}

/* Validation after @step (0: before training): log line, metrics, TensorBoard. */
static void eval_once(struct job *j, int step, int32_t pad)
{
	const struct sl_config *c = j->c;
	double ev[3];
	long targets;

	if (sl_model_is_lm(j->model)) {
		ev[0] = evaluate_lm(j->be, j->model, &j->sh.src, &j->valid, c->train.batch,
				    j->max_L, pad, j->d.rank / j->C, j->d.world / j->C,
				    j->C > 1 ? &j->cp : NULL, &targets);
		sl_metrics_add_eval_stats(j->met, step, j->valid.n, 1,
					  (const char *const[]){ "loss" }, ev);
		sl_log("eval step %d  valid loss %.4f  (%d records, %ld target tokens)", step,
		       ev[0], j->valid.n, targets);
		if (j->tb && step)
			sl_tb_scalar(j->tb, "valid/loss", step, ev[0]);
		return;
	}
	evaluate(j->be, j->model, &j->sh.src, &j->valid, c->train.batch, j->max_L, pad,
		 j->d.rank / j->C, j->d.world / j->C, j->C > 1 ? &j->cp : NULL, ev);
	sl_metrics_add_eval_stats(j->met, step, j->valid.n, 3,
				  (const char *const[]){ "loss", "brier", "corr" }, ev);
	sl_log("eval step %d  valid loss %.4f  brier %.4f  corr %.3f  (%d records)", step, ev[0],
	       ev[1], ev[2], j->valid.n);
	if (j->tb && step) {
		sl_tb_scalar(j->tb, "valid/loss", step, ev[0]);
		sl_tb_scalar(j->tb, "valid/brier", step, ev[1]);
		sl_tb_scalar(j->tb, "valid/corr", step, ev[2]);
	}
}

/* evaluation drops no token (every rank runs the same forwards: eval_rounds) */
void train_run_eval(struct job *j, int step, int32_t pad)
{
	sl_model_moe_dispatch_pause(j->model, true);
	eval_once(j, step, pad);
	sl_model_moe_dispatch_pause(j->model, false);
}
