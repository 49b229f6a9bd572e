/*
 * test_gradcheck: the model's backward (model.c over the cpu backends) against central finite
 * differences of its own loss, in double, for every parameter of a tiny Qwen3 classifier, with and
 * without attention biases.  Also: gradient accumulation over micro-batches, activation
 * checkpointing (identical gradients), padding invariance, and the fp32 backend against the
 * double one.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "model.h"
#include "testutil.h"

#define VOCAB 23
#define MAXT 32
#define MAXB 4

/* ---- deterministic random numbers ---------------------------------------------------------- */

static uint64_t rng_state = 88172645463325252ull;

static uint64_t rng_next(void)
{
	rng_state ^= rng_state << 13;
	rng_state ^= rng_state >> 7;
	rng_state ^= rng_state << 17;
	return rng_state;
}

static double rng_unif(void)
{
	return ((rng_next() >> 11) + 0.5) / 9007199254740992.0;
}

static double rng_normal(void)
{
	return sqrt(-2 * log(rng_unif())) * cos(2 * M_PI * rng_unif());
}

/* ---- a unit source over host-side double parameters ---------------------------------------- */

struct env {
	struct sl_backend *be;
	struct sl_layout lay;
	struct sl_model *m;
	size_t *ubase;		/* (n_units) offset of each unit in params */
	double *params;		/* (total_numel) the parameters, padding 0 */
	void **w;		/* (n_units) device weights */
	void **g;		/* (n_units) device grads */
	void **gsink;		/* (n_units) grads nobody reads (finite differences) */
	bool sink;
	int n_fwd_release, n_bwd_release;
};

static const void *src_weights(void *ctx, int u)
{
	return ((struct env *)ctx)->w[u];
}

static void *src_grads(void *ctx, int u)
{
	struct env *e = ctx;

	return e->sink ? e->gsink[u] : e->g[u];
}

static void src_release_fwd(void *ctx, int u)
{
	((struct env *)ctx)->n_fwd_release++;
}

static void src_release_bwd(void *ctx, int u)
{
	((struct env *)ctx)->n_bwd_release++;
}

static void put_elt(struct env *e, int u, size_t off, double v)
{
	float f = (float)v;

	e->be->upload(e->be, (char *)e->w[u] + off * e->be->elt,
		      e->be->elt == sizeof(double) ? (const void *)&v : (const void *)&f,
		      e->be->elt);
}

static void upload_all(struct env *e)
{
	for (int u = 0; u < e->lay.n_units; u++)
		for (size_t i = 0; i < e->lay.unit_numel[u]; i++)
			put_elt(e, u, i, e->params[e->ubase[u] + i]);
}

static void zero_grads(struct env *e)
{
	for (int u = 0; u < e->lay.n_units; u++)
		e->be->zero(e->be, e->g[u], e->lay.unit_numel[u] * e->be->elt);
}

/* all gradients as one double vector (total_numel) */
static void get_grads(struct env *e, double *out)
{
	size_t elt = e->be->elt;

	for (int u = 0; u < e->lay.n_units; u++) {
		size_t n = e->lay.unit_numel[u];
		char *h = malloc(n * elt);

		e->be->download(e->be, h, e->g[u], n * elt);
		for (size_t i = 0; i < n; i++)
			out[e->ubase[u] + i] = elt == sizeof(double) ? ((double *)h)[i] :
								       ((float *)h)[i];
		free(h);
	}
}

static void fill_config(struct sl_model_config *mc, bool bias)
{
	memset(mc, 0, sizeof(*mc));
	strcpy(mc->model_type, "qwen3");
	mc->vocab = VOCAB;
	mc->hidden = 12;
	mc->n_layers = 2;
	mc->n_heads = 4;
	mc->n_kv_heads = 2;
	mc->head_dim = 8;
	mc->intermediate = 20;
	mc->max_position = 64;
	mc->rms_eps = 1e-6;
	mc->rope_theta = 10000;
	mc->attention_bias = bias;
	mc->initializer_range = 0.02;
	mc->pad_token_id = -1;
	mc->bos_token_id = -1;
	mc->eos_token_id = -1;
	mc->num_labels = 1;
	mc->layer_kind = calloc(mc->n_layers, sizeof(*mc->layer_kind));
	mc->mlp_kind = calloc(mc->n_layers, sizeof(*mc->mlp_kind));
}

static void free_config(struct sl_model_config *mc)
{
	free(mc->layer_kind);
	free(mc->mlp_kind);
}

/* random parameters: the same for every env made from the same seed */
static void init_params(struct sl_layout *lay, size_t *ubase, double *p, uint64_t seed)
{
	rng_state = seed;
	for (int i = 0; i < lay->n_tensors; i++) {
		const struct sl_tensor_info *t = &lay->t[i];
		double *q = p + ubase[t->unit] + t->offset;

		for (size_t k = 0; k < t->numel; k++)
			q[k] = t->init == SL_INIT_ONES ? 1 + 0.2 * rng_normal() :
							 0.3 * rng_normal();
	}
}

static void env_init_task(struct env *e, const struct sl_model_config *mc,
			  struct sl_backend *be, bool ckpt, int task)
{
	int rc;

	memset(e, 0, sizeof(*e));
	e->be = be;
	rc = sl_model_layout(mc, task, &e->lay);
	CHECK(rc == 0, "layout: %d", rc);
	e->ubase = calloc(e->lay.n_units, sizeof(*e->ubase));
	for (int u = 1; u < e->lay.n_units; u++)
		e->ubase[u] = e->ubase[u - 1] + e->lay.unit_numel[u - 1];
	e->params = calloc(e->lay.total_numel, sizeof(double));
	init_params(&e->lay, e->ubase, e->params, 12345);
	e->w = calloc(e->lay.n_units, sizeof(void *));
	e->g = calloc(e->lay.n_units, sizeof(void *));
	e->gsink = calloc(e->lay.n_units, sizeof(void *));
	for (int u = 0; u < e->lay.n_units; u++) {
		e->w[u] = be->alloc(be, e->lay.unit_numel[u] * be->elt);
		e->g[u] = be->alloc(be, e->lay.unit_numel[u] * be->elt);
		e->gsink[u] = be->alloc(be, e->lay.unit_numel[u] * be->elt);
	}
	upload_all(e);
	e->m = sl_model_create(mc, &e->lay, be, MAXT, MAXB, ckpt);
	CHECK(e->m != NULL, "%s", "");
}

static void env_init(struct env *e, const struct sl_model_config *mc, struct sl_backend *be,
		     bool ckpt)
{
	env_init_task(e, mc, be, ckpt, 0);
}

static void env_free(struct env *e)
{
	sl_model_destroy(e->m);
	for (int u = 0; u < e->lay.n_units; u++) {
		e->be->free(e->be, e->w[u]);
		e->be->free(e->be, e->g[u]);
		e->be->free(e->be, e->gsink[u]);
	}
	free(e->w);
	free(e->g);
	free(e->gsink);
	free(e->params);
	free(e->ubase);
	sl_layout_free(&e->lay);
}

/* ---- micro-batches ------------------------------------------------------------------------- */

struct hbatch {
	int B, L;
	int32_t ids[MAXT], lens[MAXB], last[MAXB];
	float labels[MAXB];
	int n_tgt;			/* sft */
	int32_t tgt_pos[MAXT], tgt_ids[MAXT];
};

static void make_batch(struct hbatch *hb, int B, const int *lens, const float *labels)
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
static void make_targets(struct hbatch *hb)
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
static double run_step(struct env *e, const struct hbatch *hb, float loss_scale, float *scores)
{
	struct sl_backend *be = e->be;
	size_t T = (size_t)hb->B * hb->L;
	int32_t *ids = be->alloc(be, T * 4), *lens = be->alloc(be, hb->B * 4);
	int32_t *last = be->alloc(be, hb->B * 4);
	float *labels = be->alloc(be, hb->B * 4);
	struct sl_batch_dev b = { .B = hb->B, .L = hb->L, .ids = ids, .lens = lens, .last = last,
				  .labels = labels, .h_lens = hb->lens };
	struct sl_unit_source src = { e, src_weights, src_grads, src_release_fwd,
				      src_release_bwd };
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

static int score_only(struct env *e, const struct hbatch *hb, float *scores)
{
	struct sl_backend *be = e->be;
	size_t T = (size_t)hb->B * hb->L;
	int32_t *ids = be->alloc(be, T * 4), *lens = be->alloc(be, hb->B * 4);
	int32_t *last = be->alloc(be, hb->B * 4);
	struct sl_batch_dev b = { .B = hb->B, .L = hb->L, .ids = ids, .lens = lens, .last = last,
				  .h_lens = hb->lens };
	struct sl_unit_source src = { e, src_weights, src_grads, NULL, NULL };
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

/* where parameter i lives: unit and element; false for padding */
static bool param_at(const struct env *e, size_t i, int *unit, size_t *off, const char **name)
{
	for (int k = 0; k < e->lay.n_tensors; k++) {
		const struct sl_tensor_info *t = &e->lay.t[k];
		size_t base = e->ubase[t->unit] + t->offset;

		if (i >= base && i < base + t->numel) {
			*unit = t->unit;
			*off = t->offset + (i - base);
			*name = t->name;
			return true;
		}
	}
	return false;
}

/* d(sum of the batches' scaled losses)/d(param i) by central differences */
static double fd_grad(struct env *e, const struct hbatch *hbs, int nb, float scale, size_t i)
{
	const double h = 1e-5;
	double p0 = e->params[i], lp = 0, lm = 0;
	int u;
	size_t off;
	const char *name;

	if (!param_at(e, i, &u, &off, &name))
		return 0;
	e->sink = true;
	put_elt(e, u, off, p0 + h);
	for (int k = 0; k < nb; k++)
		lp += run_step(e, &hbs[k], scale, NULL);
	put_elt(e, u, off, p0 - h);
	for (int k = 0; k < nb; k++)
		lm += run_step(e, &hbs[k], scale, NULL);
	put_elt(e, u, off, p0);
	e->sink = false;
	return (lp - lm) / (2 * h);
}

/* analytic gradient g against finite differences at every @stride-th parameter */
static void check_fd(struct env *e, const struct hbatch *hbs, int nb, float scale,
		     const double *g, size_t stride, const char *what)
{
	double worst = 0;
	size_t n = 0;

	for (size_t i = 0; i < e->lay.total_numel; i += stride) {
		int u;
		size_t off;
		const char *name;
		double fd = fd_grad(e, hbs, nb, scale, i), d = fabs(g[i] - fd);

		if (!param_at(e, i, &u, &off, &name)) {
			CHECK(g[i] == 0, "%s: padding element %zu has gradient %g", what, i, g[i]);
			continue;
		}
		n++;
		if (d / (fabs(fd) + 1e-6) > worst)
			worst = d / (fabs(fd) + 1e-6);
		CHECK(d <= 1e-6 * fabs(fd) + 1e-9, "%s: %s[%zu]: analytic %.10g, finite diff "
		      "%.10g", what, name, off, g[i], fd);
	}
	printf("%s: %zu parameters, worst |analytic - fd| / (|fd| + 1e-6) = %.2e\n", what, n,
	       worst);
}

static void check_same(const double *a, const double *b, size_t n, double rel, const char *what)
{
	double worst = 0;
	int bad = 0;

	for (size_t i = 0; i < n; i++) {
		double d = fabs(a[i] - b[i]);

		if (d > worst)
			worst = d;
		if (d > rel * fabs(b[i]) + 1e-300 && bad++ < 5)
			CHECK(0, "%s: element %zu: %.17g vs %.17g", what, i, a[i], b[i]);
	}
	CHECK(bad == 0, "%s: %d elements differ (max abs diff %g)", what, bad, worst);
}

static void run_config(bool bias)
{
	struct sl_model_config mc;
	struct env e, ec, e32;
	struct hbatch hb[2], hb2;
	const int lensA[3] = { 5, 2, 7 }, lensB[2] = { 3, 6 };
	const float labA[3] = { 0.2f, 0.9f, 0.55f }, labB[2] = { 0.7f, 0.05f };
	const float scale = 1.0f / 3;
	float sA[3], sC[3], s32[3], s1;
	double *gA, *gB, *gAB, *gC, *g32, lossA, lossC, loss32, gmax = 0;
	size_t N;
	char what[64];

	fill_config(&mc, bias);
	env_init(&e, &mc, sl_backend_cpu64_create(), false);
	if (!e.m)
		return;
	N = e.lay.total_numel;
	gA = calloc(N, sizeof(double));
	gB = calloc(N, sizeof(double));
	gAB = calloc(N, sizeof(double));
	gC = calloc(N, sizeof(double));
	g32 = calloc(N, sizeof(double));

	rng_state = 777;
	make_batch(&hb[0], 3, lensA, labA);
	make_batch(&hb[1], 2, lensB, labB);

	/* loss against the BCE of the returned scores, and the hooks */
	zero_grads(&e);
	e.n_fwd_release = e.n_bwd_release = 0;
	lossA = run_step(&e, &hb[0], scale, sA);
	CHECK(e.n_fwd_release == e.lay.n_units && e.n_bwd_release == e.lay.n_units,
	      "release hooks: %d fwd, %d bwd for %d units", e.n_fwd_release, e.n_bwd_release,
	      e.lay.n_units);
	{
		double ref = 0;

		for (int b = 0; b < 3; b++) {
			double z = sA[b], y = labA[b];

			ref += log(1 + exp(z)) - z * y;
		}
		CHECK_CLOSE(lossA, scale * ref, 1e-6, 1e-9);
	}
	get_grads(&e, gA);

	/* every parameter against finite differences */
	snprintf(what, sizeof(what), "bias=%d batch A", bias);
	check_fd(&e, &hb[0], 1, scale, gA, 1, what);

	/* accumulation: A then B into the same grads is gA + gB, and matches d(LA + LB) */
	zero_grads(&e);
	run_step(&e, &hb[1], scale, NULL);
	get_grads(&e, gB);
	zero_grads(&e);
	run_step(&e, &hb[0], scale, NULL);
	run_step(&e, &hb[1], scale, NULL);
	get_grads(&e, gAB);
	for (size_t i = 0; i < N; i++)
		gB[i] += gA[i];
	snprintf(what, sizeof(what), "bias=%d accum A+B", bias);
	check_same(gAB, gB, N, 1e-12, what);
	check_fd(&e, hb, 2, scale, gAB, 5, what);

	/* activation checkpointing: identical loss, scores and gradients */
	env_init(&ec, &mc, sl_backend_cpu64_create(), true);
	zero_grads(&ec);
	lossC = run_step(&ec, &hb[0], scale, sC);
	get_grads(&ec, gC);
	CHECK(lossC == lossA, "checkpointed loss %.17g vs %.17g", lossC, lossA);
	for (int b = 0; b < 3; b++)
		CHECK(sC[b] == sA[b], "checkpointed score %d: %.9g vs %.9g", b, sC[b], sA[b]);
	snprintf(what, sizeof(what), "bias=%d checkpointing", bias);
	check_same(gC, gA, N, 0, what);
	{
		struct sl_backend *bc = ec.be;

		env_free(&ec);
		bc->destroy(bc);
	}

	/* padding: each record alone scores as inside the batch */
	for (int b = 0; b < 3; b++) {
		struct hbatch one;
		int len = lensA[b];

		make_batch(&one, 1, &len, &labA[b]);
		memcpy(one.ids, &hb[0].ids[b * hb[0].L], len * sizeof(int32_t));
		CHECK(score_only(&e, &one, &s1) == 0, "%s", "");
		CHECK_CLOSE(s1, sA[b], 1e-12, 1e-14);
	}
	/* padded ids change nothing, to the bit */
	hb2 = hb[0];
	for (int b = 0; b < 3; b++)
		for (int t = lensA[b]; t < hb2.L; t++)
			hb2.ids[b * hb2.L + t] = (hb2.ids[b * hb2.L + t] + 1 + b) % VOCAB;
	zero_grads(&e);
	CHECK(run_step(&e, &hb2, scale, sC) == lossA, "%s", "");
	get_grads(&e, gC);
	for (int b = 0; b < 3; b++)
		CHECK(sC[b] == sA[b], "padded ids changed score %d", b);
	snprintf(what, sizeof(what), "bias=%d padded ids", bias);
	check_same(gC, gA, N, 0, what);

	/* the fp32 backend agrees with the double one */
	env_init(&e32, &mc, sl_backend_cpu_create(), false);
	zero_grads(&e32);
	loss32 = run_step(&e32, &hb[0], scale, s32);
	get_grads(&e32, g32);
	CHECK_CLOSE(loss32, lossA, 1e-5, 1e-6);
	for (int b = 0; b < 3; b++)
		CHECK_CLOSE(s32[b], sA[b], 1e-4, 1e-5);
	for (size_t i = 0; i < N; i++)
		gmax = fmax(gmax, fabs(gA[i]));
	{
		double worst = 0;

		for (size_t i = 0; i < N; i++) {
			double d = fabs(g32[i] - gA[i]) / (fabs(gA[i]) + 1e-3 * gmax);

			worst = fmax(worst, d);
			if (d > 1e-4)
				CHECK(0, "bias=%d fp32 grad %zu: %.9g vs %.9g", bias, i, g32[i],
				      gA[i]);
		}
		printf("bias=%d fp32 vs fp64: worst grad |d| / (|g| + 1e-3 max|g|) = %.2e\n", bias,
		       worst);
	}
	{
		struct sl_backend *b32 = e32.be;

		env_free(&e32);
		b32->destroy(b32);
	}

	{
		struct sl_backend *b64 = e.be;

		env_free(&e);
		b64->destroy(b64);
	}
	free(gA);
	free(gB);
	free(gAB);
	free(gC);
	free(g32);
	free_config(&mc);
}

/*
 * task sft: the causal-LM head (untied, or tied to the embedding) against finite differences;
 * the loss against a direct computation of the targets' cross-entropies from logits that the test
 * computes itself from the final hidden states is left to the Hugging Face parity test.  Chunked
 * logits (3 rows per chunk) give the same loss and gradients as one chunk.
 */
static void run_sft(bool tied)
{
	struct sl_model_config mc;
	struct env e;
	struct hbatch hb[2];
	const int lensA[3] = { 5, 2, 7 }, lensB[2] = { 3, 6 };
	const float lab[3] = { 0 };
	const float scale = 1.0f / 9;
	double *g1, *g2, l1, l2;
	size_t N;
	char what[64];

	fill_config(&mc, true);
	mc.tie_word_embeddings = tied;
	env_init_task(&e, &mc, sl_backend_cpu64_create(), false, 1);
	CHECK(sl_model_is_lm(e.m), "%s", "");
	CHECK((sl_layout_find(&e.lay, "lm_head.weight") != NULL) == !tied, "%s", "");
	CHECK(sl_layout_find(&e.lay, "score.weight") == NULL, "%s", "");
	N = e.lay.total_numel;
	g1 = calloc(N, sizeof(double));
	g2 = calloc(N, sizeof(double));
	rng_state = 4242;
	make_batch(&hb[0], 3, lensA, lab);
	make_batch(&hb[1], 2, lensB, lab);
	make_targets(&hb[0]);
	make_targets(&hb[1]);

	zero_grads(&e);
	e.n_fwd_release = e.n_bwd_release = 0;
	l1 = run_step(&e, &hb[0], scale, NULL);
	CHECK(l1 > 0, "sft loss %g", l1);
	get_grads(&e, g1);
	snprintf(what, sizeof(what), "sft tied=%d", tied);
	check_fd(&e, &hb[0], 1, scale, g1, 1, what);

	/* two micro-batches accumulate */
	zero_grads(&e);
	run_step(&e, &hb[0], scale, NULL);
	run_step(&e, &hb[1], scale, NULL);
	get_grads(&e, g2);
	snprintf(what, sizeof(what), "sft tied=%d accum", tied);
	check_fd(&e, hb, 2, scale, g2, 3, what);

	/* chunks of 3 rows: the same loss and gradients */
	sl_model_set_lm_chunk(e.m, 3);
	zero_grads(&e);
	l2 = run_step(&e, &hb[0], scale, NULL);
	get_grads(&e, g2);
	CHECK_CLOSE(l2, l1, 1e-13, 1e-15);
	snprintf(what, sizeof(what), "sft tied=%d chunked", tied);
	check_same(g2, g1, N, 1e-11, what);
	{
		struct sl_backend *b64 = e.be;

		env_free(&e);
		b64->destroy(b64);
	}
	free(g1);
	free(g2);
	free_config(&mc);
}

/* layout: HF names, fused groups contiguous, offsets aligned, units as model.h says */
static void check_layout(void)
{
	struct sl_model_config mc;
	struct sl_layout lay;
	const struct sl_tensor_info *q, *k, *v, *gt, *up, *sc, *bq, *bk, *bv;

	fill_config(&mc, true);
	CHECK(sl_model_layout(&mc, 0, &lay) == 0, "%s", "");
	CHECK(lay.n_units == 4, "%s", "");
	q = sl_layout_find(&lay, "model.layers.1.self_attn.q_proj.weight");
	k = sl_layout_find(&lay, "model.layers.1.self_attn.k_proj.weight");
	v = sl_layout_find(&lay, "model.layers.1.self_attn.v_proj.weight");
	bq = sl_layout_find(&lay, "model.layers.1.self_attn.q_proj.bias");
	bk = sl_layout_find(&lay, "model.layers.1.self_attn.k_proj.bias");
	bv = sl_layout_find(&lay, "model.layers.1.self_attn.v_proj.bias");
	gt = sl_layout_find(&lay, "model.layers.1.mlp.gate_proj.weight");
	up = sl_layout_find(&lay, "model.layers.1.mlp.up_proj.weight");
	sc = sl_layout_find(&lay, "score.weight");
	CHECK(q && k && v && bq && bk && bv && gt && up && sc, "%s", "");
	if (!(q && k && v && bq && bk && bv && gt && up && sc))
		return;
	CHECK(q->unit == 2 && q->shape[0] == 32 && q->shape[1] == 12, "%s", "");
	CHECK(k->offset == q->offset + q->numel && v->offset == k->offset + k->numel, "%s", "");
	CHECK(bk->offset == bq->offset + bq->numel && bv->offset == bk->offset + bk->numel,
	      "bias group");
	CHECK(up->offset == gt->offset + gt->numel && up->shape[0] == 20, "%s", "");
	CHECK(sc->unit == 3 && sc->head && sc->optional && sc->decay &&
	      sc->init == SL_INIT_NORMAL, "score.weight flags");
	CHECK(sl_layout_find(&lay, "model.embed_tokens.weight")->unit == 0, "%s", "");
	CHECK(!sl_layout_find(&lay, "model.layers.1.self_attn.q_norm.weight")->decay, "%s", "");
	CHECK(sl_layout_find(&lay, "model.layers.1.self_attn.q_norm.weight")->numel == 8, "%s", "");
	{
		size_t total = 0;

		for (int u = 0; u < lay.n_units; u++) {
			CHECK(lay.unit_numel[u] % 16 == 0, "%s", "");
			total += lay.unit_numel[u];
		}
		CHECK(total == lay.total_numel, "%s", "");
	}
	for (int i = 0; i < lay.n_tensors; i++) {
		const struct sl_tensor_info *t = &lay.t[i];

		CHECK(t->offset + t->numel <= lay.unit_numel[t->unit], "%s", "");
		if (i && lay.t[i - 1].unit == t->unit)
			CHECK(t->offset >= lay.t[i - 1].offset + lay.t[i - 1].numel, "%s", "");
		if (t != k && t != v && t != bk && t != bv && t != up &&
		    !strstr(t->name, "k_proj") && !strstr(t->name, "v_proj") &&
		    !strstr(t->name, "up_proj"))
			CHECK(t->offset % 16 == 0, "%s at %zu", t->name, t->offset);
	}
	/* 2 layers x (q,k,v,o,gate,up,down) + score */
	CHECK(sl_model_matmul_params(&mc, &lay) ==
	      2.0 * (64 * 12 + 12 * 32 + 3 * 20 * 12) + 12, "%g",
	      sl_model_matmul_params(&mc, &lay));
	sl_layout_free(&lay);
	free_config(&mc);
}

int main(void)
{
	check_layout();
	run_config(false);
	run_config(true);
	run_sft(false);
	run_sft(true);
	return test_exit("test_gradcheck");
}
