/*
 * fdbatch.h: random classifier (and sft) micro-batches for a tiny Qwen3 model, train steps and
 * scores over them, and the finite-difference check of every @stride-th parameter
 * (test_gradcheck, test_moe_gradcheck).  The test defines VOCAB, MAXT (tokens of a micro-batch)
 * and MAXB (its records) before including it.
 */
#ifndef SL_FDBATCH_H
#define SL_FDBATCH_H

#include "fdcheck.h"

#if !defined(VOCAB) || !defined(MAXT) || !defined(MAXB)
#error "fdbatch.h: define VOCAB, MAXT and MAXB first"
#endif

/* the gradient checks' tiny Qwen3 (@model_type, @n_layers): hidden 12, 4 heads of 8, 2 kv */
static inline void qwen3_config(struct sl_model_config *mc, const char *model_type, int n_layers,
				bool bias)
{
	tiny_config(mc, model_type, n_layers);
	mc->vocab = VOCAB;
	mc->hidden = 12;
	mc->n_heads = 4;
	mc->n_kv_heads = 2;
	mc->head_dim = 8;
	mc->intermediate = 20;
	mc->max_position = 64;
	mc->attention_bias = bias;
}

/* random parameters: the same for every env made from the same seed */
static inline void init_params(struct env *e, uint64_t seed)
{
	rng_state = seed;
	for (int i = 0; i < e->lay.n_tensors; i++) {
		const struct sl_tensor_info *t = &e->lay.t[i];
		double *q = e->params + e->ubase[t->unit] + t->offset;

		for (size_t k = 0; k < t->numel; k++)
			q[k] = t->init == SL_INIT_ONES ? 1 + 0.2 * rng_normal() :
							 0.3 * rng_normal();
	}
}

static inline void env_init_task(struct env *e, const struct sl_model_config *mc,
				 struct sl_backend *be, bool ckpt, int task)
{
	env_layout(e, mc, be, task);
	init_params(e, 12345);
	env_create(e, mc, ckpt, MAXT, MAXB);
}

static inline void env_init(struct env *e, const struct sl_model_config *mc,
			    struct sl_backend *be, bool ckpt)
{
	env_init_task(e, mc, be, ckpt, 0);
}

/* ---- micro-batches ------------------------------------------------------------------------- */

struct hbatch {
	int B, L;
	int32_t ids[MAXT], lens[MAXB], last[MAXB];
	float labels[MAXB];
	int n_tgt;			/* sft */
	int32_t tgt_pos[MAXT], tgt_ids[MAXT];
};

/* @B records of @lens tokens (random ids) right-padded to the longest, with @labels */
static inline void make_batch(struct hbatch *hb, int B, const int *lens, const float *labels)
{
	hb->B = B;
	hb->L = 0;
	for (int b = 0; b < B; b++)
		if (lens[b] > hb->L)
			hb->L = lens[b];
	for (int b = 0; b < B; b++) {
		hb->lens[b] = lens[b];
		hb->last[b] = b * hb->L + lens[b] - 1;
		hb->labels[b] = labels[b];
	}
	for (int t = 0; t < B * hb->L; t++)
		hb->ids[t] = (int32_t)(rng_next() % VOCAB);
	hb->n_tgt = 0;
}

/* sft targets: token p + 1 of record b is a target when (b + p) % 3 != 0 (p + 1 < len) */
static inline void make_targets(struct hbatch *hb)
{
	hb->n_tgt = 0;
	for (int b = 0; b < hb->B; b++)
		for (int p = 0; p + 1 < hb->lens[b]; p++)
			if ((b + p) % 3) {
				hb->tgt_pos[hb->n_tgt] = b * hb->L + p;
				hb->tgt_ids[hb->n_tgt++] = hb->ids[b * hb->L + p + 1];
			}
}

/* forward + backward; returns loss_scale * loss_sum */
static inline double run_step(struct env *e, const struct hbatch *hb, float loss_scale,
			      float *scores)
{
	struct sl_backend *be = e->be;
	size_t T = (size_t)hb->B * hb->L;
	int32_t *ids = be->alloc(be, T * 4), *lens = be->alloc(be, hb->B * 4);
	int32_t *last = be->alloc(be, hb->B * 4);
	float *labels = be->alloc(be, hb->B * 4);
	struct sl_batch_dev b = { .B = hb->B, .L = hb->L, .ids = ids, .lens = lens, .last = last,
				  .labels = labels, .h_lens = hb->lens };
	struct sl_unit_source src = env_source(e, true);
	int32_t *tpos = be->alloc(be, MAXT * 4), *tids = be->alloc(be, MAXT * 4);
	double loss = NAN;
	int rc;

	be->upload(be, ids, hb->ids, T * 4);
	be->upload(be, lens, hb->lens, hb->B * 4);
	be->upload(be, last, hb->last, hb->B * 4);
	be->upload(be, labels, hb->labels, hb->B * 4);
	if (hb->n_tgt) {
		be->upload(be, tpos, hb->tgt_pos, hb->n_tgt * 4);
		be->upload(be, tids, hb->tgt_ids, hb->n_tgt * 4);
		b.n_tgt = hb->n_tgt;
		b.tgt_pos = tpos;
		b.tgt_ids = tids;
	}
	rc = sl_model_train_step(e->m, &src, &b, loss_scale, &loss, scores);
	CHECK(rc == 0, "train_step: %d", rc);
	be->free(be, tpos);
	be->free(be, tids);
	be->free(be, ids);
	be->free(be, lens);
	be->free(be, last);
	be->free(be, labels);
	return loss_scale * loss;
}

static inline int score_only(struct env *e, const struct hbatch *hb, float *scores)
{
	struct sl_backend *be = e->be;
	size_t T = (size_t)hb->B * hb->L;
	int32_t *ids = be->alloc(be, T * 4), *lens = be->alloc(be, hb->B * 4);
	int32_t *last = be->alloc(be, hb->B * 4);
	struct sl_batch_dev b = { .B = hb->B, .L = hb->L, .ids = ids, .lens = lens, .last = last,
				  .h_lens = hb->lens };
	struct sl_unit_source src = env_source(e, false);
	int rc;

	be->upload(be, ids, hb->ids, T * 4);
	be->upload(be, lens, hb->lens, hb->B * 4);
	be->upload(be, last, hb->last, hb->B * 4);
	rc = sl_model_score(e->m, &src, &b, scores);
	be->free(be, ids);
	be->free(be, lens);
	be->free(be, last);
	return rc;
}

/* ---- checks -------------------------------------------------------------------------------- */

/* d(sum of the batches' scaled losses)/d(param i) by central differences; 0 for padding */
static inline double fd_grad(struct env *e, const struct hbatch *hbs, int nb, float scale,
			     size_t i)
{
	const double h = 1e-5;
	double p0 = e->params[i], lp = 0, lm = 0;

	if (!param_tensor(e, i, &(size_t){ 0 }))
		return 0;
	e->sink = true;
	put(e, i, p0 + h);
	for (int k = 0; k < nb; k++)
		lp += run_step(e, &hbs[k], scale, NULL);
	put(e, i, p0 - h);
	for (int k = 0; k < nb; k++)
		lm += run_step(e, &hbs[k], scale, NULL);
	put(e, i, p0);
	e->sink = false;
	return (lp - lm) / (2 * h);
}

/* analytic gradient g against finite differences at every @stride-th parameter */
static inline void check_fd(struct env *e, const struct hbatch *hbs, int nb, float scale,
			    const double *g, size_t stride, const char *what)
{
	double worst = 0;
	size_t n = 0;

	for (size_t i = 0; i < e->lay.total_numel; i += stride) {
		size_t off;
		const struct sl_tensor_info *t = param_tensor(e, i, &off);
		double fd = fd_grad(e, hbs, nb, scale, i), d = fabs(g[i] - fd);

		if (!t) {
			CHECK(g[i] == 0, "%s: padding element %zu has gradient %g", what, i, g[i]);
			continue;
		}
		n++;
		if (d / (fabs(fd) + 1e-6) > worst)
			worst = d / (fabs(fd) + 1e-6);
		CHECK(d <= 1e-6 * fabs(fd) + 1e-9, "%s: %s[%zu]: analytic %.10g, finite diff "
		      "%.10g", what, t->name, off, g[i], fd);
	}
	printf("%s: %zu parameters, worst |analytic - fd| / (|fd| + 1e-6) = %.2e\n", what, n,
	       worst);
}

#endif
