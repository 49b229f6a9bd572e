/*
 * test_qwen35: the Qwen3.5 hybrid on the cpu backends.
 *  - every new op's backward against central finite differences of its forward (cpu64), the
 *    gated delta rule over two 64-position chunks with two records of different lengths;
 *  - the gated delta rule's forward against a hand computation (one head of dims 1 x 1) and
 *    against records run one at a time (no state leaks between records, padding changes nothing);
 * The model-level checks are in test_qwen35_model.c.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend.h"
#include "model.h"
#include "testrng.h"
#include "testutil.h"

/* ---- random numbers --------------------------------------------------------------------------- */

static double *randn(size_t n, double scale)
{
	double *x = malloc(n * sizeof(double));

	for (size_t i = 0; i < n; i++)
		x[i] = scale * rng_normal();
	return x;
}

static double *zeros(size_t n)
{
	return calloc(n ? n : 1, sizeof(double));
}

static double dotv(const double *a, const double *b, size_t n)
{
	double s = 0;

	for (size_t i = 0; i < n; i++)
		s += a[i] * b[i];
	return s;
}

/*
 * Finite-difference check of one op: @fwd computes the op's outputs from the inputs (all
 * double buffers, the cpu64 backend's host memory), loss = sum_k r_k . out_k; @an holds the
 * analytic gradient of input @x (n elements).  Central differences with step 1e-6.
 */
typedef double (*loss_fn)(void *ctx);

static void fd_check(const char *what, loss_fn f, void *ctx, double *x, const double *an,
		     size_t n, double tol)
{
	int bad = 0;
	double worst = 0;

	for (size_t i = 0; i < n; i++) {
		double x0 = x[i], lp, lm, fd, d;

		x[i] = x0 + 1e-6;
		lp = f(ctx);
		x[i] = x0 - 1e-6;
		lm = f(ctx);
		x[i] = x0;
		fd = (lp - lm) / 2e-6;
		d = fabs(fd - an[i]);
		if (d > worst)
			worst = d;
		if (d > tol * fabs(fd) + 1e-8 && bad++ < 5)
			fprintf(stderr, "%s[%zu]: analytic %.10g, finite difference %.10g\n", what,
				i, an[i], fd);
	}
	CHECK(bad == 0, "%s: %d of %zu gradient elements differ (max abs diff %g)", what, bad, n,
	      worst);
}

static struct sl_backend *be;	/* cpu64 */

/* ---- conv1d + SiLU ------------------------------------------------------------------------- */

struct conv_ctx {
	int T, L, C, K, xs;
	double *x, *w, *r, *out, *pre, *halo;	/* halo: NULL, zeros */
};

static double conv_loss(void *p)
{
	struct conv_ctx *c = p;

	be->conv1d_silu_fwd(be, c->out, c->pre, c->x, c->xs, c->w, c->T, c->L, c->C, c->K,
			    c->halo);
	return dotv(c->out, c->r, (size_t)c->T * c->C);
}

static void test_conv(void)
{
	struct conv_ctx c = { .T = 2 * 9, .L = 9, .C = 5, .K = 4, .xs = 7 };
	double *dx, *dw;

	c.x = randn((size_t)c.T * c.xs, 1);
	c.w = randn((size_t)c.C * c.K, 0.5);
	c.r = randn((size_t)c.T * c.C, 1);
	c.out = zeros((size_t)c.T * c.C);
	c.pre = zeros((size_t)c.T * c.C);
	dx = zeros((size_t)c.T * c.xs);
	dw = zeros((size_t)c.C * c.K);
	conv_loss(&c);
	/* hand check: record 1, position 0 sees only itself (weight tap K-1) */
	{
		double u = c.x[(size_t)9 * c.xs + 2] * c.w[2 * c.K + 3];

		CHECK_CLOSE(c.out[9 * c.C + 2], u / (1 + exp(-u)), 1e-12, 1e-14);
	}
	be->conv1d_silu_bwd(be, dx, c.xs, dw, c.r, c.x, c.pre, c.w, c.T, c.L, c.C, c.K, NULL,
			    NULL);
	/* only the first C columns of each row are inputs; the others are not written */
	for (int t = 0; t < c.T; t++)
		for (int j = c.C; j < c.xs; j++)
			CHECK(dx[(size_t)t * c.xs + j] == 0, "dx column %d written", j);
	fd_check("conv dx", conv_loss, &c, c.x, dx, (size_t)c.T * c.xs, 1e-6);
	fd_check("conv dw", conv_loss, &c, c.w, dw, (size_t)c.C * c.K, 1e-6);
	free(c.x), free(c.w), free(c.r), free(c.out), free(c.pre), free(dx), free(dw);
}

/*
 * The halo (context parallel): a record's chunk with the K-1 rows before it as its halo gives
 * what the whole record gives on the chunk's rows, forward and backward (the halo rows' outputs
 * taking no gradient), and the halo's gradient is the whole record's input gradient on those
 * rows; dhalo and dw against finite differences too.
 */
static void test_conv_halo(void)
{
	const int L = 6, K = 4, C = 3, xs = 5, R = 2, Lw = L + K - 1;
	struct conv_ctx c = { .T = R * L, .L = L, .C = C, .K = K, .xs = xs };
	struct conv_ctx w = { .T = R * Lw, .L = Lw, .C = C, .K = K, .xs = xs };
	double *dx, *dw, *dh, *wdx, *wdw;

	c.x = randn((size_t)c.T * xs, 1);
	c.halo = randn((size_t)R * (K - 1) * xs, 1);
	c.w = randn((size_t)C * K, 0.5);
	c.r = randn((size_t)c.T * C, 1);
	c.out = zeros((size_t)c.T * C), c.pre = zeros((size_t)c.T * C);
	/* the whole records: halo rows, then the chunk's */
	w.x = zeros((size_t)w.T * xs), w.w = c.w, w.r = zeros((size_t)w.T * C);
	w.out = zeros((size_t)w.T * C), w.pre = zeros((size_t)w.T * C);
	for (int b = 0; b < R; b++) {
		memcpy(w.x + (size_t)b * Lw * xs, c.halo + (size_t)b * (K - 1) * xs,
		       (size_t)(K - 1) * xs * sizeof(double));
		memcpy(w.x + ((size_t)b * Lw + K - 1) * xs, c.x + (size_t)b * L * xs,
		       (size_t)L * xs * sizeof(double));
		memcpy(w.r + ((size_t)b * Lw + K - 1) * C, c.r + (size_t)b * L * C,
		       (size_t)L * C * sizeof(double));
	}
	conv_loss(&c);
	conv_loss(&w);
	for (int b = 0; b < R; b++)
		for (int i = 0; i < L * C; i++)
			CHECK_CLOSE(c.out[(size_t)b * L * C + i],
				    w.out[((size_t)b * Lw + K - 1) * C + i], 1e-14, 1e-15);
	dx = zeros((size_t)c.T * xs), dw = zeros((size_t)C * K);
	dh = zeros((size_t)R * (K - 1) * xs);
	wdx = zeros((size_t)w.T * xs), wdw = zeros((size_t)C * K);
	be->conv1d_silu_bwd(be, dx, xs, dw, c.r, c.x, c.pre, c.w, c.T, L, C, K, c.halo, dh);
	be->conv1d_silu_bwd(be, wdx, xs, wdw, w.r, w.x, w.pre, w.w, w.T, Lw, C, K, NULL, NULL);
	for (int b = 0; b < R; b++)
		for (int j = 0; j < C; j++) {
			for (int i = 0; i < K - 1; i++)
				CHECK_CLOSE(dh[((size_t)b * (K - 1) + i) * xs + j],
					    wdx[((size_t)b * Lw + i) * xs + j], 1e-14, 1e-15);
			for (int i = 0; i < L; i++)
				CHECK_CLOSE(dx[((size_t)b * L + i) * xs + j],
					    wdx[((size_t)b * Lw + K - 1 + i) * xs + j], 1e-14, 1e-15);
		}
	for (int i = 0; i < C * K; i++)
		CHECK_CLOSE(dw[i], wdw[i], 1e-13, 1e-15);
	for (int r = 0; r < R * (K - 1); r++)
		for (int j = C; j < xs; j++)
			CHECK(dh[(size_t)r * xs + j] == 0, "dhalo column %d written", j);
	fd_check("conv dhalo", conv_loss, &c, c.halo, dh, (size_t)R * (K - 1) * xs, 1e-6);
	memset(dw, 0, (size_t)C * K * sizeof(double));
	be->conv1d_silu_bwd(be, dx, xs, dw, c.r, c.x, c.pre, c.w, c.T, L, C, K, c.halo, NULL);
	fd_check("conv dw (halo)", conv_loss, &c, c.w, dw, (size_t)C * K, 1e-6);
	free(c.x), free(c.halo), free(c.w), free(c.r), free(c.out), free(c.pre);
	free(w.x), free(w.r), free(w.out), free(w.pre);
	free(dx), free(dw), free(dh), free(wdx), free(wdw);
}

/* ---- Gated DeltaNet prep ------------------------------------------------------------------- */

struct prep_ctx {
	int T, nk, nv, dk, dv, abs;
	double *qkv, *ab, *A, *dt, *qn, *kn, *rqk, *beta, *g, *r1, *r2, *r3, *r4;
};

static double prep_loss(void *p)
{
	struct prep_ctx *c = p;
	size_t nq = (size_t)c->T * c->nk * c->dk, nb = (size_t)c->T * c->nv;

	be->gdn_prep_fwd(be, c->qn, c->kn, c->rqk, c->beta, c->g, c->qkv, c->ab, c->abs, c->A,
			 c->dt, c->T, c->nk, c->nv, c->dk, c->dv);
	return dotv(c->qn, c->r1, nq) + dotv(c->kn, c->r2, nq) + dotv(c->beta, c->r3, nb) +
	       dotv(c->g, c->r4, nb);
}

static void test_prep(void)
{
	struct prep_ctx c = { .T = 5, .nk = 2, .nv = 4, .dk = 3, .dv = 2, .abs = 11 };
	size_t C = 2 * c.nk * c.dk + c.nv * c.dv, nq = (size_t)c.T * c.nk * c.dk;
	size_t nb = (size_t)c.T * c.nv;
	double *dqkv, *dab, *dA, *ddt;

	c.qkv = randn(c.T * C, 1);
	c.ab = randn((size_t)c.T * c.abs, 1);
	c.ab[3 * c.abs + c.nv + 1] = 25;	/* softplus beyond its threshold */
	c.A = randn(c.nv, 0.5);
	c.dt = randn(c.nv, 0.5);
	c.qn = zeros(nq), c.kn = zeros(nq), c.rqk = zeros((size_t)c.T * 2 * c.nk);
	c.beta = zeros(nb), c.g = zeros(nb);
	c.r1 = randn(nq, 1), c.r2 = randn(nq, 1), c.r3 = randn(nb, 1), c.r4 = randn(nb, 1);
	dqkv = zeros(c.T * C), dab = zeros((size_t)c.T * c.abs), dA = zeros(c.nv);
	ddt = zeros(c.nv);
	prep_loss(&c);
	/* hand check of one q head: l2-normalized and scaled by 1/sqrt(dk) */
	{
		const double *q = c.qkv + C + 3;	/* token 1, q head 1 */
		double n = sqrt(q[0] * q[0] + q[1] * q[1] + q[2] * q[2] + 1e-6);

		CHECK_CLOSE(c.qn[(size_t)1 * c.nk * c.dk + 3 + 2], q[2] / n / sqrt(3.0), 1e-12,
			    1e-14);
		CHECK_CLOSE(c.g[2 * c.nv + 1], -exp(c.A[1]) * log1p(exp(c.ab[2 * c.abs + c.nv + 1] +
									 c.dt[1])), 1e-12, 1e-14);
	}
	be->gdn_prep_bwd(be, dqkv, dab, c.abs, dA, ddt, c.r1, c.r2, c.r3, c.r4, c.qkv, c.ab,
			 c.rqk, c.beta, c.g, c.A, c.dt, c.T, c.nk, c.nv, c.dk, c.dv);
	/* the v columns of dqkv belong to the delta rule's backward: only q, k are checked */
	for (int t = 0; t < c.T; t++)
		for (size_t j = 2 * c.nk * c.dk; j < C; j++)
			dqkv[t * C + j] = 0;
	fd_check("prep dqkv", prep_loss, &c, c.qkv, dqkv, c.T * C, 1e-6);
	for (int t = 0; t < c.T; t++)
		for (int j = 2 * c.nv; j < c.abs; j++)
			CHECK(dab[(size_t)t * c.abs + j] == 0, "dab column %d written", j);
	fd_check("prep dab", prep_loss, &c, c.ab, dab, (size_t)c.T * c.abs, 1e-6);
	fd_check("prep dA_log", prep_loss, &c, c.A, dA, c.nv, 1e-6);
	fd_check("prep ddt_bias", prep_loss, &c, c.dt, ddt, c.nv, 1e-6);
	free(c.qkv), free(c.ab), free(c.A), free(c.dt), free(c.qn), free(c.kn), free(c.rqk);
	free(c.beta), free(c.g), free(c.r1), free(c.r2), free(c.r3), free(c.r4);
	free(dqkv), free(dab), free(dA), free(ddt);
}

/* ---- the gated delta rule ------------------------------------------------------------------ */

struct rule_ctx {
	int B, L, nk, nv, dk, dv, vs;
	int32_t lens[4];
	double *q, *k, *v, *beta, *g, *o, *st, *r;
};

static size_t n_states(const struct rule_ctx *c)
{
	return (size_t)c->B * ((c->L + 63) / 64) * c->nv * c->dk * c->dv;
}

static double rule_loss(void *p)
{
	struct rule_ctx *c = p;

	be->gdn_rule_fwd(be, c->o, c->st, c->q, c->k, c->v, c->vs, c->beta, c->g, c->lens, c->B,
			 c->L, c->L, c->nk, c->nv, c->dk, c->dv, NULL, NULL);
	return dotv(c->o, c->r, (size_t)c->B * c->L * c->nv * c->dv);
}

static void test_rule_hand(void)
{
	/* one record, one head of dims 1 x 1: S_t = g S_{t-1} + k b (v - g S_{t-1} k); o = S q */
	double q[3] = { 0.5, -1, 2 }, k[3] = { 1.5, 0.3, -0.7 }, v[3] = { 2, -1, 0.25 };
	double beta[3] = { 0.9, 0.2, 0.5 }, g[3] = { -0.1, -2, 0 }, o[3], st[1], S = 0;
	int32_t len = 3;

	be->gdn_rule_fwd(be, o, st, q, k, v, 1, beta, g, &len, 1, 3, 3, 1, 1, 1, 1, NULL, NULL);
	for (int t = 0; t < 3; t++) {
		double Sa = exp(g[t]) * S;

		S = Sa + k[t] * beta[t] * (v[t] - Sa * k[t]);
		CHECK_CLOSE(o[t], S * q[t], 1e-14, 1e-15);
	}
	CHECK(st[0] == 0, "the saved first-chunk state is the zero initial state");
}

static void test_rule(void)
{
	struct rule_ctx c = { .B = 2, .L = 70, .nk = 1, .nv = 2, .dk = 3, .dv = 2 };
	size_t T, nq, nb, nvv;
	double *dq, *dk, *dv, *db, *dg;

	c.vs = c.nv * c.dv + 3;
	c.lens[0] = 70;
	c.lens[1] = 37;
	T = (size_t)c.B * c.L, nq = T * c.nk * c.dk, nb = T * c.nv, nvv = T * c.vs;
	c.q = randn(nq, 0.5), c.k = randn(nq, 0.5), c.v = randn(nvv, 1);
	c.beta = zeros(nb), c.g = zeros(nb);
	for (size_t i = 0; i < nb; i++) {
		c.beta[i] = rng_unif();
		c.g[i] = -0.3 * rng_unif();
	}
	c.o = zeros(T * c.nv * c.dv), c.st = zeros(n_states(&c));
	c.r = randn(T * c.nv * c.dv, 1);
	dq = zeros(nq), dk = zeros(nq), dv = zeros(nvv), db = zeros(nb), dg = zeros(nb);
	rule_loss(&c);
	be->gdn_rule_bwd(be, dq, dk, dv, db, dg, c.r, c.st, c.q, c.k, c.v, c.vs, c.beta, c.g,
			 c.lens, c.B, c.L, c.L, c.nk, c.nv, c.dk, c.dv, NULL, NULL);
	/* padded positions: zero outputs and zero gradients */
	for (int p = c.lens[1]; p < c.L; p++) {
		size_t t = (size_t)c.L + p;

		for (int j = 0; j < c.nv * c.dv; j++)
			CHECK(c.o[t * c.nv * c.dv + j] == 0, "padded output");
		CHECK(db[t * c.nv] == 0 && dg[t * c.nv + 1] == 0 && dq[t * c.dk] == 0,
		      "padded gradient");
	}
	fd_check("rule dq", rule_loss, &c, c.q, dq, nq, 1e-6);
	fd_check("rule dk", rule_loss, &c, c.k, dk, nq, 1e-6);
	/* the columns past nv dv of each v row are not the rule's */
	for (size_t t = 0; t < T; t++)
		for (int j = c.nv * c.dv; j < c.vs; j++)
			CHECK(dv[t * c.vs + j] == 0, "dv column %d written", j);
	fd_check("rule dv", rule_loss, &c, c.v, dv, nvv, 1e-6);
	fd_check("rule dbeta", rule_loss, &c, c.beta, db, nb, 1e-6);
	fd_check("rule dg", rule_loss, &c, c.g, dg, nb, 1e-6);

	/* record 1 alone (its own batch of L = 37) gives the same outputs: no state crosses records */
	{
		struct rule_ctx one = c;
		size_t off = (size_t)c.L;

		one.B = 1;
		one.L = c.lens[1];
		one.lens[0] = c.lens[1];
		one.q = c.q + off * c.nk * c.dk, one.k = c.k + off * c.nk * c.dk;
		one.v = c.v + off * c.vs, one.beta = c.beta + off * c.nv, one.g = c.g + off * c.nv;
		one.o = zeros((size_t)one.L * c.nv * c.dv), one.st = zeros(n_states(&one));
		one.r = c.r;
		rule_loss(&c);
		rule_loss(&one);
		for (size_t i = 0; i < (size_t)one.L * c.nv * c.dv; i++)
			CHECK(one.o[i] == c.o[off * c.nv * c.dv + i], "record alone differs at %zu",
			      i);
		free(one.o), free(one.st);
	}
	free(c.q), free(c.k), free(c.v), free(c.beta), free(c.g), free(c.o), free(c.st);
	free(c.r), free(dq), free(dk), free(dv), free(db), free(dg);
}

/*
 * A row cut into chunks (context parallel): each record of the rule's test batch run as two
 * chunks of 40 and 30 positions (record stride 70), the first chunk's s_end passed to the
 * second as s0, gives the whole record's outputs; the backward, the second chunk's ds0 passed
 * to the first as ds_end, its gradients.  A record that ends in the first chunk leaves the
 * second nothing to do (its state passes through).  ds0 and the gradients under a nonzero
 * ds_end against finite differences of a loss that also weighs s_end.
 */
struct relay_ctx {
	struct rule_ctx *c;
	int off, L;
	int32_t lens[2];
	double *s0, *s_end, *rs;
};

static double relay_loss(void *p)
{
	struct relay_ctx *x = p;
	struct rule_ctx *c = x->c;
	size_t o = (size_t)x->off, SS = (size_t)c->dk * c->dv, n = (size_t)c->B * c->nv * SS;
	double l = 0;

	memset(c->o, 0, (size_t)c->B * c->L * c->nv * c->dv * sizeof(double));
	be->gdn_rule_fwd(be, c->o + o * c->nv * c->dv, c->st, c->q + o * c->nk * c->dk,
			 c->k + o * c->nk * c->dk, c->v + o * c->vs, c->vs, c->beta + o * c->nv,
			 c->g + o * c->nv, x->lens, c->B, x->L, c->L, c->nk, c->nv, c->dk, c->dv,
			 x->s0, x->s_end);
	for (int b = 0; b < c->B; b++)
		for (int p = 0; p < x->L; p++) {
			size_t t = (size_t)b * c->L + x->off + p;

			l += dotv(c->o + t * c->nv * c->dv, c->r + t * c->nv * c->dv,
				  (size_t)c->nv * c->dv);
		}
	return l + (x->rs ? dotv(x->s_end, x->rs, n) : 0);
}

static void test_rule_relay(void)
{
	struct rule_ctx c = { .B = 2, .L = 70, .nk = 1, .nv = 2, .dk = 3, .dv = 2 };
	const size_t SS = 6, T = 140, nq = T * 3, nb = T * 2, no = T * 4, ns = 2 * 2 * SS;
	struct relay_ctx x1 = { .c = &c, .off = 0, .L = 40, .lens = { 40, 37 } };
	struct relay_ctx x2 = { .c = &c, .off = 40, .L = 30, .lens = { 30, 0 } };
	double *whole, *S1, *S2, *Sw, *dq, *dk, *dv, *db, *dg, *cq, *ck, *cv, *cb, *cg, *D1, *D0;

	c.vs = 7;
	c.lens[0] = 70, c.lens[1] = 37;
	c.q = randn(nq, 0.5), c.k = randn(nq, 0.5), c.v = randn(T * c.vs, 1);
	c.beta = zeros(nb), c.g = zeros(nb);
	for (size_t i = 0; i < nb; i++) {
		c.beta[i] = rng_unif();
		c.g[i] = -0.3 * rng_unif();
	}
	c.o = zeros(no), c.st = zeros(n_states(&c)), c.r = randn(no, 1);
	whole = zeros(no), S1 = zeros(ns), S2 = zeros(ns), Sw = zeros(ns);
	be->gdn_rule_fwd(be, whole, c.st, c.q, c.k, c.v, c.vs, c.beta, c.g, c.lens, 2, 70, 70, 1,
			 2, 3, 2, NULL, Sw);
	/* the chunks (x1 then x2 write their own rows; the other rows stay) */
	x1.s_end = S1;
	x2.s0 = S1, x2.s_end = S2;
	be->gdn_rule_fwd(be, c.o, c.st, c.q, c.k, c.v, c.vs, c.beta, c.g, x1.lens, 2, 40, 70, 1, 2,
			 3, 2, NULL, S1);
	be->gdn_rule_fwd(be, c.o + 40 * 4, c.st, c.q + 40 * 3, c.k + 40 * 3, c.v + 40 * c.vs,
			 c.vs, c.beta + 40 * 2, c.g + 40 * 2, x2.lens, 2, 30, 70, 1, 2, 3, 2, S1,
			 S2);
	for (size_t i = 0; i < no; i++)
		CHECK_CLOSE(c.o[i], whole[i], 1e-13, 1e-15);
	for (size_t i = 0; i < ns; i++)
		CHECK_CLOSE(S2[i], Sw[i], 1e-13, 1e-15);
	for (size_t i = 0; i < SS * 2; i++)	/* record 1 ended in chunk 1: passed through */
		CHECK(S2[2 * SS + i] == S1[2 * SS + i], "a state passes an empty chunk unchanged");

	/* backward: the whole record's, then chunk 2 (ds0 -> D1) and chunk 1 (ds_end = D1) */
	dq = zeros(nq), dk = zeros(nq), dv = zeros(T * c.vs), db = zeros(nb), dg = zeros(nb);
	cq = zeros(nq), ck = zeros(nq), cv = zeros(T * c.vs), cb = zeros(nb), cg = zeros(nb);
	D1 = zeros(ns), D0 = zeros(ns);
	be->gdn_rule_fwd(be, whole, c.st, c.q, c.k, c.v, c.vs, c.beta, c.g, c.lens, 2, 70, 70, 1,
			 2, 3, 2, NULL, NULL);
	be->gdn_rule_bwd(be, dq, dk, dv, db, dg, c.r, c.st, c.q, c.k, c.v, c.vs, c.beta, c.g,
			 c.lens, 2, 70, 70, 1, 2, 3, 2, NULL, NULL);
	relay_loss(&x2);
	be->gdn_rule_bwd(be, cq + 40 * 3, ck + 40 * 3, cv + 40 * c.vs, cb + 40 * 2, cg + 40 * 2,
			 c.r + 40 * 4, c.st, c.q + 40 * 3, c.k + 40 * 3, c.v + 40 * c.vs, c.vs,
			 c.beta + 40 * 2, c.g + 40 * 2, x2.lens, 2, 30, 70, 1, 2, 3, 2, NULL, D1);
	relay_loss(&x1);
	be->gdn_rule_bwd(be, cq, ck, cv, cb, cg, c.r, c.st, c.q, c.k, c.v, c.vs, c.beta, c.g,
			 x1.lens, 2, 40, 70, 1, 2, 3, 2, D1, D0);
	for (size_t i = 0; i < nq; i++) {
		CHECK_CLOSE(cq[i], dq[i], 1e-12, 1e-14);
		CHECK_CLOSE(ck[i], dk[i], 1e-12, 1e-14);
	}
	for (size_t i = 0; i < T * c.vs; i++)
		CHECK_CLOSE(cv[i], dv[i], 1e-12, 1e-14);
	for (size_t i = 0; i < nb; i++) {
		CHECK_CLOSE(cb[i], db[i], 1e-12, 1e-14);
		CHECK_CLOSE(cg[i], dg[i], 1e-12, 1e-14);
	}

	/* finite differences: chunk 2 from a random s0, its loss weighing s_end by rs */
	x2.s0 = randn(ns, 0.5);
	x2.rs = randn(ns, 1);
	relay_loss(&x2);
	memset(cq, 0, nq * sizeof(double));
	memset(ck, 0, nq * sizeof(double));
	memset(cv, 0, T * c.vs * sizeof(double));
	memset(cb, 0, nb * sizeof(double));
	memset(cg, 0, nb * sizeof(double));
	be->gdn_rule_bwd(be, cq + 40 * 3, ck + 40 * 3, cv + 40 * c.vs, cb + 40 * 2, cg + 40 * 2,
			 c.r + 40 * 4, c.st, c.q + 40 * 3, c.k + 40 * 3, c.v + 40 * c.vs, c.vs,
			 c.beta + 40 * 2, c.g + 40 * 2, x2.lens, 2, 30, 70, 1, 2, 3, 2, x2.rs, D1);
	fd_check("rule ds0", relay_loss, &x2, x2.s0, D1, ns, 1e-6);
	fd_check("rule dq (ds_end)", relay_loss, &x2, c.q, cq, nq, 1e-6);
	fd_check("rule dv (ds_end)", relay_loss, &x2, c.v, cv, T * c.vs, 1e-6);
	fd_check("rule dg (ds_end)", relay_loss, &x2, c.g, cg, nb, 1e-6);
	free(x2.s0), free(x2.rs);
	free(c.q), free(c.k), free(c.v), free(c.beta), free(c.g), free(c.o), free(c.st), free(c.r);
	free(whole), free(S1), free(S2), free(Sw), free(D1), free(D0);
	free(dq), free(dk), free(dv), free(db), free(dg), free(cq), free(ck), free(cv), free(cb);
	free(cg);
}

/* ---- gated RMSNorm ------------------------------------------------------------------------- */

struct gn_ctx {
	int T, nh, d, zs;
	double *x, *z, *w, *out, *rstd, *r;
};

static double gn_loss(void *p)
{
	struct gn_ctx *c = p;

	be->gated_rmsnorm_fwd(be, c->out, c->rstd, c->x, c->z, c->zs, c->w, c->T, c->nh, c->d,
			      1e-6f);
	return dotv(c->out, c->r, (size_t)c->T * c->nh * c->d);
}

static void test_gated_norm(void)
{
	struct gn_ctx c = { .T = 3, .nh = 2, .d = 4, .zs = 11 };
	size_t n = (size_t)c.T * c.nh * c.d;
	double *dx, *dz, *dw;

	c.x = randn(n, 1), c.z = randn((size_t)c.T * c.zs, 1), c.w = randn(c.d, 1);
	c.out = zeros(n), c.rstd = zeros((size_t)c.T * c.nh), c.r = randn(n, 1);
	dx = zeros(n), dz = zeros((size_t)c.T * c.zs), dw = zeros(c.d);
	gn_loss(&c);
	{
		/* token 2, head 1, element 3 by hand */
		const double *x = c.x + 2 * 8 + 4, z = c.z[2 * c.zs + 4 + 3];
		double ms = (x[0] * x[0] + x[1] * x[1] + x[2] * x[2] + x[3] * x[3]) / 4;

		CHECK_CLOSE(c.out[2 * 8 + 4 + 3], c.w[3] * x[3] / sqrt(ms + 1e-6) * z /
						  (1 + exp(-z)), 1e-12, 1e-14);
	}
	be->gated_rmsnorm_bwd(be, dx, dz, c.zs, dw, c.r, c.x, c.z, c.w, c.rstd, c.T, c.nh, c.d,
			      1e-6f);
	fd_check("gated norm dx", gn_loss, &c, c.x, dx, n, 1e-6);
	fd_check("gated norm dz", gn_loss, &c, c.z, dz, (size_t)c.T * c.zs, 1e-6);
	fd_check("gated norm dw", gn_loss, &c, c.w, dw, c.d, 1e-6);
	free(c.x), free(c.z), free(c.w), free(c.out), free(c.rstd), free(c.r);
	free(dx), free(dz), free(dw);
}

/* ---- gated attention q/k, sigmoid gate ------------------------------------------------------ */

struct ga_ctx {
	int T, L, nh, nkv, hd, rot;
	double *in, *qw, *kw, *out, *gate, *rstd, *r1, *r2;
	const int32_t *pos;	/* NULL: t % L */
};

static double ga_loss(void *p)
{
	struct ga_ctx *c = p;

	be->gattn_qk_fwd(be, c->out, c->gate, c->rstd, c->in, c->qw, c->kw, c->T, c->L, c->pos,
			 c->nh, c->nkv, c->hd, c->rot, 1e-6f, 100.0f);
	return dotv(c->out, c->r1, (size_t)c->T * (c->nh + 2 * c->nkv) * c->hd) +
	       dotv(c->gate, c->r2, (size_t)c->T * c->nh * c->hd);
}

static void test_gattn(void)
{
	struct ga_ctx c = { .T = 6, .L = 3, .nh = 2, .nkv = 1, .hd = 8, .rot = 4 };
	size_t nin = (size_t)c.T * (2 * c.nh + 2 * c.nkv) * c.hd;
	size_t nout = (size_t)c.T * (c.nh + 2 * c.nkv) * c.hd, ng = (size_t)c.T * c.nh * c.hd;
	double *din, *dqw, *dkw;

	c.in = randn(nin, 1), c.qw = randn(c.hd, 1), c.kw = randn(c.hd, 1);
	c.out = zeros(nout), c.gate = zeros(ng), c.rstd = zeros((size_t)c.T * 3);
	c.r1 = randn(nout, 1), c.r2 = randn(ng, 1);
	din = zeros(nin), dqw = zeros(c.hd), dkw = zeros(c.hd);
	ga_loss(&c);
	{
		/* token 4 (position 1), q head 1: gate = its second half; dims >= rot unrotated;
		 * dim 0 rotated with dim 2 by angle 1 * 100^0 = 1 */
		const double *q = c.in + 4 * 48 + 16;
		double ss = 0, r, n0, n2, n5;

		for (int i = 0; i < 8; i++)
			ss += q[i] * q[i];
		r = 1 / sqrt(ss / 8 + 1e-6);
		n0 = q[0] * r * c.qw[0], n2 = q[2] * r * c.qw[2], n5 = q[5] * r * c.qw[5];
		CHECK(c.gate[4 * 16 + 8 + 3] == q[8 + 3], "gate half");
		CHECK_CLOSE(c.out[4 * 32 + 8 + 5], n5, 1e-12, 1e-14);
		CHECK_CLOSE(c.out[4 * 32 + 8 + 0], n0 * cos(1) - n2 * sin(1), 1e-12, 1e-14);
		CHECK(c.out[4 * 32 + 24 + 7] == c.in[4 * 48 + 40 + 7], "v copied");
	}
	be->gattn_qk_bwd(be, din, dqw, dkw, c.r1, c.r2, c.in, c.qw, c.kw, c.rstd, c.T, c.L, NULL,
			 c.nh, c.nkv, c.hd, c.rot, 1e-6f, 100.0f);
	fd_check("gattn dqgkv", ga_loss, &c, c.in, din, nin, 1e-6);
	fd_check("gattn dqw", ga_loss, &c, c.qw, dqw, c.hd, 1e-6);
	fd_check("gattn dkw", ga_loss, &c, c.kw, dkw, c.hd, 1e-6);
	/* positions given (context parallel: a token's position in its row): token 4 at 5 */
	{
		static const int32_t pos[6] = { 2, 0, 5, 1, 5, 3 };
		const double *q = c.in + 4 * 48 + 16;
		double ss = 0, r, n0, n2;

		c.pos = pos;
		c.L = 6;
		ga_loss(&c);
		for (int i = 0; i < 8; i++)
			ss += q[i] * q[i];
		r = 1 / sqrt(ss / 8 + 1e-6);
		n0 = q[0] * r * c.qw[0], n2 = q[2] * r * c.qw[2];
		CHECK_CLOSE(c.out[4 * 32 + 8 + 0], n0 * cos(5) - n2 * sin(5), 1e-12, 1e-14);
		memset(din, 0, nin * sizeof(double));
		memset(dqw, 0, c.hd * sizeof(double));
		be->gattn_qk_bwd(be, din, dqw, dkw, c.r1, c.r2, c.in, c.qw, c.kw, c.rstd, c.T, c.L,
				 pos, c.nh, c.nkv, c.hd, c.rot, 1e-6f, 100.0f);
		fd_check("gattn dqgkv (pos)", ga_loss, &c, c.in, din, nin, 1e-6);
		fd_check("gattn dqw (pos)", ga_loss, &c, c.qw, dqw, c.hd, 1e-6);
	}
	free(c.in), free(c.qw), free(c.kw), free(c.out), free(c.gate), free(c.rstd);
	free(c.r1), free(c.r2), free(din), free(dqw), free(dkw);

	{
		double x[3] = { 1, -2, 0.5 }, gt[3] = { 0.3, -1, 2 }, y[3], dy[3] = { 1, 2, -1 };
		double dx[3], dgt[3];

		be->sigmoid_mul_fwd(be, y, x, gt, 3);
		be->sigmoid_mul_bwd(be, dx, dgt, dy, x, gt, 3);
		for (int i = 0; i < 3; i++) {
			double s = 1 / (1 + exp(-gt[i]));

			CHECK_CLOSE(y[i], x[i] * s, 1e-15, 1e-16);
			CHECK_CLOSE(dx[i], dy[i] * s, 1e-15, 1e-16);
			CHECK_CLOSE(dgt[i], dy[i] * x[i] * s * (1 - s), 1e-15, 1e-16);
		}
	}
}

int main(void)
{
	rng_state = 0x9e3779b97f4a7c15ull;
	be = sl_backend_cpu64_create();
	CHECK(be && be->gdn_rule_fwd, "cpu64 backend with the Qwen3.5 ops");
	if (!be || !be->gdn_rule_fwd)
		return test_exit("test_qwen35");
	test_conv();
	test_conv_halo();
	test_prep();
	test_rule_hand();
	test_rule();
	test_rule_relay();
	test_gated_norm();
	test_gattn();
	be->destroy(be);
	return test_exit("test_qwen35");
}
