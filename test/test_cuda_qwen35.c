/*
 * test_cuda_qwen35: the cuda backend's Qwen3.5 hybrid ops (cuda/gdn.cu) against the cpu backend
 * (the numeric reference) on random inputs, as test_cuda_ops does for the others: a fresh seed
 * each run (printed; pass one as argv[1] to repeat it), outputs poisoned with NaN first, inputs
 * rounded to bf16 before the cpu sees them, bf16 outputs within about 1e-2 relative.  Padded
 * batches whose longest record crosses 64-token chunks; the backward ops get the cpu's saved
 * statistics so that only their own arithmetic is compared.  Then the tiny hybrid model's loss
 * and gradients, cuda against cpu.  The gated delta rule's cases run with each delta-rule kernel
 * (gdn.cu's recurrence; gdn_chunk.cu's chunked form: the default, its forward the chunk-local
 * pass then the walk over the chunks making the output, its backward's state pass in two, the
 * state walked in registers and, where dv <= dk, the gradients' sums in registers; the same
 * with the output by a pass of its own (SHARDLM_GDN_WALK=registers-state) and walked in shared
 * memory with the one-kernel gradients (SHARDLM_GDN_WALK=shared); the forward in one kernel
 * with either backward: a cuda backend each, made under
 * SHARDLM_GDN_KERNEL), the model with the recurrence, the default and the one-kernel forward;
 * then, at the Qwen3.5 4B layer's shape, the default against the recurrence, the one-kernel
 * forward with the fused and the two-pass backward, and the two other walks, timed.
 * SL_TEST_RULE_ONLY=1: the delta rule's cases alone (for
 * compute-sanitizer); SL_TEST_RULE_ONLY=chunked: three small cases of the chunked kernel alone
 * (racecheck); SL_TEST_RULE_ONLY=pair: the 4B-shaped pairs alone (profiling).
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gpupair.h"
#include "model.h"
#include "../cuda/sl_cuda.h"

/* gpu (gpupair.h): the one under test, one of these; gpu_def: SHARDLM_GDN_KERNEL unset (the
 * whole model's runs) */
static struct sl_backend *gpu_rec, *gpu_chk, *gpu_fus, *gpu_def, *gpu_shw, *gpu_rs;

/* the cpu's values of a stat buffer onto the gpu (a backward then sees the same statistics) */
static void sync_stat(struct buf *b)
{
	float *c = cget(b);

	gpu->upload(gpu, b->g, c, b->n * 4);
	free(c);
}

/* values in [lo, hi) on both sides */
static struct buf *unif(enum kind k, size_t n, double lo, double hi)
{
	struct buf *b = mk(k, n);

	for (size_t i = 0; i < n; i++) {
		float v = (float)(lo + (hi - lo) * rng_unif());

		b->h[i] = k == BF ? round_bf(v) : v;
	}
	put(b);
	return b;
}

static struct buf *mk_lens(int B, int L)
{
	struct buf *l = mk(I32, B);

	for (int b = 0; b < B; b++)
		l->hi[b] = b == 0 ? L : 1 + (int)(rng_next() % (uint64_t)L);
	put(l);
	return l;
}

static void t_conv(int B, int L, int C, int K, int xs)
{
	char sh[64];
	int T = B * L;
	struct buf *x = rnd(BF, (size_t)T * xs, 1), *w = rnd(BF, (size_t)C * K, 0.5);
	struct buf *o = out(BF, (size_t)T * C), *pre = out(BF, (size_t)T * C);
	struct buf *g = rnd(BF, (size_t)T * C, 1), *dx = rnd(BF, (size_t)T * xs, 1);
	struct buf *dw = rnd(BF, (size_t)C * K, 1);

	snprintf(sh, sizeof(sh), "T=%dx%d C=%d K=%d", B, L, C, K);
	cpu->conv1d_silu_fwd(cpu, o->c, pre->c, x->c, xs, w->c, T, L, C, K, NULL);
	TIMED(gpu->conv1d_silu_fwd(gpu, o->g, pre->g, x->g, xs, w->g, T, L, C, K, NULL));
	cmp("conv1d_silu_fwd", sh, "out", o, TOL);
	cmp("conv1d_silu_fwd", sh, "pre", pre, TOL);
	cpu->conv1d_silu_bwd(cpu, dx->c, xs, dw->c, g->c, x->c, pre->c, w->c, T, L, C, K, NULL,
			     NULL);
	TIMED(gpu->conv1d_silu_bwd(gpu, dx->g, xs, dw->g, g->g, x->g, pre->g, w->g, T, L, C, K,
				   NULL, NULL));
	cmp("conv1d_silu_bwd", sh, "dx", dx, TOL);	/* columns past C: untouched on both */
	cmp("conv1d_silu_bwd", sh, "dw", dw, TOL);
	drop(x), drop(w), drop(o), drop(pre), drop(g), drop(dx), drop(dw);
}

/* the halo (context parallel): K-1 rows before each record, and their gradient */
static void t_conv_halo(int B, int L, int C, int K, int xs)
{
	char sh[64];
	int T = B * L;
	struct buf *x = rnd(BF, (size_t)T * xs, 1), *w = rnd(BF, (size_t)C * K, 0.5);
	struct buf *h = rnd(BF, (size_t)B * (K - 1) * xs, 1);
	struct buf *o = out(BF, (size_t)T * C), *pre = out(BF, (size_t)T * C);
	struct buf *g = rnd(BF, (size_t)T * C, 1), *dx = rnd(BF, (size_t)T * xs, 1);
	struct buf *dw = rnd(BF, (size_t)C * K, 1), *dh = rnd(BF, (size_t)B * (K - 1) * xs, 1);

	snprintf(sh, sizeof(sh), "T=%dx%d C=%d K=%d halo", B, L, C, K);
	cpu->conv1d_silu_fwd(cpu, o->c, pre->c, x->c, xs, w->c, T, L, C, K, h->c);
	TIMED(gpu->conv1d_silu_fwd(gpu, o->g, pre->g, x->g, xs, w->g, T, L, C, K, h->g));
	cmp("conv1d_silu_fwd", sh, "out", o, TOL);
	cmp("conv1d_silu_fwd", sh, "pre", pre, TOL);
	cpu->conv1d_silu_bwd(cpu, dx->c, xs, dw->c, g->c, x->c, pre->c, w->c, T, L, C, K, h->c,
			     dh->c);
	TIMED(gpu->conv1d_silu_bwd(gpu, dx->g, xs, dw->g, g->g, x->g, pre->g, w->g, T, L, C, K,
				   h->g, dh->g));
	cmp("conv1d_silu_bwd", sh, "dx", dx, TOL);
	cmp("conv1d_silu_bwd", sh, "dw", dw, TOL);
	cmp("conv1d_silu_bwd", sh, "dhalo", dh, TOL);	/* columns past C: untouched on both */
	drop(x), drop(w), drop(h), drop(o), drop(pre), drop(g), drop(dx), drop(dw), drop(dh);
}

static void t_prep(int T, int nk, int nv, int dk, int dv, int abs)
{
	char sh[64];
	int C = 2 * nk * dk + nv * dv;
	struct buf *qkv = rnd(BF, (size_t)T * C, 1), *ab = rnd(BF, (size_t)T * abs, 1);
	struct buf *A = unif(BF, nv, -2, 1.5), *dt = rnd(BF, nv, 0.5);
	struct buf *qn = out(BF, (size_t)T * nk * dk), *kn = out(BF, (size_t)T * nk * dk);
	struct buf *rqk = out(STAT, (size_t)T * 2 * nk), *beta = out(STAT, (size_t)T * nv);
	struct buf *g = out(STAT, (size_t)T * nv);
	struct buf *gq = rnd(BF, (size_t)T * nk * dk, 1), *gk = rnd(BF, (size_t)T * nk * dk, 1);
	struct buf *gb = rnd(BF, (size_t)T * nv, 1), *gg = rnd(BF, (size_t)T * nv, 1);
	struct buf *dqkv = rnd(BF, (size_t)T * C, 1), *dab = rnd(BF, (size_t)T * abs, 1);
	struct buf *dA = rnd(BF, nv, 1), *ddt = rnd(BF, nv, 1);

	snprintf(sh, sizeof(sh), "T=%d k=%dx%d v=%dx%d", T, nk, dk, nv, dv);
	cpu->gdn_prep_fwd(cpu, qn->c, kn->c, rqk->c, beta->c, g->c, qkv->c, ab->c, abs, A->c,
			  dt->c, T, nk, nv, dk, dv);
	TIMED(gpu->gdn_prep_fwd(gpu, qn->g, kn->g, rqk->g, beta->g, g->g, qkv->g, ab->g, abs, A->g,
				dt->g, T, nk, nv, dk, dv));
	cmp("gdn_prep_fwd", sh, "qn", qn, TOL);
	cmp("gdn_prep_fwd", sh, "kn", kn, TOL);
	cmp("gdn_prep_fwd", sh, "rqk", rqk, 1e-5);
	cmp("gdn_prep_fwd", sh, "beta", beta, 1e-5);
	cmp("gdn_prep_fwd", sh, "g", g, 1e-5);
	sync_stat(rqk), sync_stat(beta), sync_stat(g);
	cpu->gdn_prep_bwd(cpu, dqkv->c, dab->c, abs, dA->c, ddt->c, gq->c, gk->c, gb->c, gg->c,
			  qkv->c, ab->c, rqk->c, beta->c, g->c, A->c, dt->c, T, nk, nv, dk, dv);
	TIMED(gpu->gdn_prep_bwd(gpu, dqkv->g, dab->g, abs, dA->g, ddt->g, gq->g, gk->g, gb->g,
				gg->g, qkv->g, ab->g, rqk->g, beta->g, g->g, A->g, dt->g, T, nk, nv,
				dk, dv));
	cmp("gdn_prep_bwd", sh, "dqkv", dqkv, TOL);
	cmp("gdn_prep_bwd", sh, "dab", dab, TOL);
	cmp("gdn_prep_bwd", sh, "dA_log", dA, TOL);
	cmp("gdn_prep_bwd", sh, "ddt_bias", ddt, TOL);
	drop(qkv), drop(ab), drop(A), drop(dt), drop(qn), drop(kn), drop(rqk), drop(beta);
	drop(g), drop(gq), drop(gk), drop(gb), drop(gg), drop(dqkv), drop(dab), drop(dA);
	drop(ddt);
}

/* l2-normalized rows of d (bf16-exact), as gdn_prep_fwd gives the rule */
static struct buf *unit_rows(size_t rows, int d, double scale)
{
	struct buf *b = mk(BF, rows * d);

	for (size_t r = 0; r < rows; r++) {
		double ss = 0;

		for (int i = 0; i < d; i++) {
			b->h[r * d + i] = (float)rng_normal();
			ss += b->h[r * d + i] * b->h[r * d + i];
		}
		for (int i = 0; i < d; i++)
			b->h[r * d + i] = round_bf((float)(b->h[r * d + i] * scale / sqrt(ss)));
	}
	put(b);
	return b;
}

/* a states buffer of n floats (NaN) whose gpu side has the room past them that the backend's
 * forward may fill for its backward (gdn_states_extra, for B records of L) */
static struct buf *out_states(size_t n, int B, int L, int nv, int dk, int dv)
{
	struct buf *b = out(STAT, n);
	size_t x = gpu->gdn_states_extra ?
		gpu->gdn_states_extra(gpu, (size_t)B * ((L + 63) / 64), nv, dk, dv) : 0;

	if (x) {
		gpu->free(gpu, b->g);
		b->g = gpu->alloc(gpu, (n + x) * 4);
		put(b);
	}
	return b;
}

static void t_rule(int B, int L, int nk, int nv, int dk, int dv)
{
	char sh[64];
	int T = B * L, vs = nv * dv + 5, nch = (L + 63) / 64;
	struct buf *lens = mk_lens(B, L);
	struct buf *q = unit_rows((size_t)T * nk, dk, 1 / sqrt(dk)), *k = unit_rows((size_t)T * nk, dk, 1);
	struct buf *v = rnd(BF, (size_t)T * vs, 1), *beta = unif(STAT, (size_t)T * nv, 0, 1);
	struct buf *g = unif(STAT, (size_t)T * nv, -0.5, 0);
	struct buf *o = out(BF, (size_t)T * nv * dv);
	struct buf *st = out_states((size_t)B * nch * nv * dk * dv, B, L, nv, dk, dv);
	struct buf *go = rnd(BF, (size_t)T * nv * dv, 1);
	struct buf *dq = out(BF, (size_t)T * nk * dk), *dk_ = out(BF, (size_t)T * nk * dk);
	struct buf *dv_ = rnd(BF, (size_t)T * vs, 1), *db = out(BF, (size_t)T * nv);
	struct buf *dg = out(BF, (size_t)T * nv);

	snprintf(sh, sizeof(sh), "T=%dx%d k=%dx%d v=%dx%d", B, L, nk, dk, nv, dv);
	cpu->gdn_rule_fwd(cpu, o->c, st->c, q->c, k->c, v->c, vs, beta->c, g->c, lens->c, B, L,
			  L, nk, nv, dk, dv, NULL, NULL);
	TIMED(gpu->gdn_rule_fwd(gpu, o->g, st->g, q->g, k->g, v->g, vs, beta->g, g->g, lens->g, B,
				L, L, nk, nv, dk, dv, NULL, NULL));
	cmp("gdn_rule_fwd", sh, "o", o, TOL);
	/* fp32 states: the recurrence's FMA sums 1e-4; the chunked kernel's tensor-core products
	 * take tf32 operands (a 10-bit mantissa, 2^-11 relative rounding): 2e-3 */
	cmp("gdn_rule_fwd", sh, "states", st, gpu != gpu_rec ? 2e-3 : 1e-4);
	sync_stat(st);
	cpu->gdn_rule_bwd(cpu, dq->c, dk_->c, dv_->c, db->c, dg->c, go->c, st->c, q->c, k->c,
			  v->c, vs, beta->c, g->c, lens->c, B, L, L, nk, nv, dk, dv, NULL, NULL);
	TIMED(gpu->gdn_rule_bwd(gpu, dq->g, dk_->g, dv_->g, db->g, dg->g, go->g, st->g, q->g, k->g,
				v->g, vs, beta->g, g->g, lens->g, B, L, L, nk, nv, dk, dv, NULL,
				NULL));
	cmp("gdn_rule_bwd", sh, "dq", dq, TOL);
	cmp("gdn_rule_bwd", sh, "dk", dk_, TOL);
	cmp("gdn_rule_bwd", sh, "dv", dv_, TOL);
	cmp("gdn_rule_bwd", sh, "dbeta", db, TOL);
	cmp("gdn_rule_bwd", sh, "dg", dg, TOL);
	drop(lens), drop(q), drop(k), drop(v), drop(beta), drop(g), drop(o), drop(st), drop(go);
	drop(dq), drop(dk_), drop(dv_), drop(db), drop(dg);
}

/* ---- the chunked rule's tensor-core product (cuda/tc_mm.cuh) against a host product ------- */

/* n host floats to device memory d, as bf16 (through t) when bf */
static void tc_put(struct sl_cuda *cu, void *d, const float *x, size_t n, bool bf, uint16_t *t)
{
	if (!bf) {
		sl_cuda_upload(cu, d, x, n * 4);
		return;
	}
	for (size_t i = 0; i < n; i++)
		t[i] = f2bf(x[i]);
	sl_cuda_upload(cu, d, t, n * 2);
}

/*
 * C = alpha diag(rs) A diag(sk) B + cb C on one block, A (M x K) and B (K x N) float or bf16
 * (ta / tb: stored transposed), C transposed when tc; against the same in double on the host.
 * tf32 operands (10-bit mantissa): 2e-3 relative.
 */
static void t_tc_mm(struct sl_cuda *cu, int M, int N, int K, bool abf, bool bbf, bool ta,
		    bool tb, bool tc, bool scale, float alpha, float cb)
{
	size_t na = (size_t)M * K, nb = (size_t)K * N, nc = (size_t)M * N;
	float *a = malloc(na * 4), *b = malloc(nb * 4), *c = malloc(nc * 4), *got = malloc(nc * 4);
	float *sk = malloc(K * 4 + 4), *rs = malloc(M * 4 + 4);
	uint16_t *t = malloc((na > nb ? na : nb) * 2 + 2);
	void *da = sl_cuda_malloc(cu, na * 4), *db = sl_cuda_malloc(cu, nb * 4);
	float *dc = sl_cuda_malloc(cu, nc * 4), *dsk = sl_cuda_malloc(cu, K * 4 + 4);
	float *drs = sl_cuda_malloc(cu, M * 4 + 4);
	double num = 0, den = 0, e;
	char sh[96];

	for (size_t i = 0; i < na; i++)
		a[i] = abf ? round_bf(rng_normal()) : rng_normal();
	for (size_t i = 0; i < nb; i++)
		b[i] = bbf ? round_bf(rng_normal()) : rng_normal();
	for (size_t i = 0; i < nc; i++)
		c[i] = rng_normal();
	for (int i = 0; i < K; i++)
		sk[i] = rng_unif() + 0.5;
	for (int i = 0; i < M; i++)
		rs[i] = rng_unif() + 0.5;
	tc_put(cu, da, a, na, abf, t);
	tc_put(cu, db, b, nb, bbf, t);
	sl_cuda_upload(cu, dsk, sk, K * 4);
	sl_cuda_upload(cu, drs, rs, M * 4);
	for (int shm = 0; shm < 3; shm++) {	/* operands in global memory, A in shared, both */
		num = den = 0;
		sl_cuda_upload(cu, dc, c, nc * 4);
		/* a[] holds A(m, k) at m * K + k when stored plainly, at k * M + m when transposed */
		sl_cuda_tc_mm_test(cu, M, N, K, da, ta ? 1 : K, ta ? M : 1, abf, db, tb ? 1 : N,
				   tb ? K : 1, bbf, scale ? dsk : NULL, scale ? drs : NULL, alpha,
				   cb, dc, tc ? 1 : N, tc ? M : 1, shm);
		sl_cuda_download(cu, got, dc, nc * 4);
		for (int m = 0; m < M; m++)
			for (int n = 0; n < N; n++) {
				size_t o = tc ? (size_t)n * M + m : (size_t)m * N + n;
				double s = 0, w;

				for (int k = 0; k < K; k++)
					s += (double)(ta ? a[(size_t)k * M + m] :
							   a[(size_t)m * K + k]) *
					     (scale ? sk[k] : 1) *
					     (tb ? b[(size_t)n * K + k] : b[(size_t)k * N + n]);
				w = alpha * s * (scale ? rs[m] : 1) + cb * c[o];
				num += (got[o] - w) * (got[o] - w);
				den += w * w;
				if (!isfinite(got[o]))
					num = INFINITY;
			}
		e = sqrt(num / den);
		snprintf(sh, sizeof(sh), "%dx%dx%d %s%s%s%s%s%s%s", M, N, K, abf ? "a:bf" : "a:f",
			 bbf ? " b:bf" : " b:f", ta ? " aT" : "", tb ? " bT" : "", tc ? " cT" : "",
			 scale ? " scaled" : "", shm == 2 ? " smem:ab" : shm ? " smem:a" : "");
		printf("%-18s %-28s %-8s %10.2e\n", "tc_mm", sh, "C", e);
		CHECK(e < 2e-3, "tc_mm %s: relative error %g", sh, e);
	}
	sl_cuda_free(cu, da), sl_cuda_free(cu, db), sl_cuda_free(cu, dc), sl_cuda_free(cu, dsk);
	sl_cuda_free(cu, drs);
	free(a), free(b), free(c), free(got), free(sk), free(rs), free(t);
}

static void t_tc_mm_all(void)
{
	struct sl_cuda *cu = sl_cuda_create(0);

	CHECK(cu, "a cuda context for tc_mm");
	if (!cu)
		return;
	t_tc_mm(cu, 64, 64, 128, true, true, false, true, false, false, 1, 0);	/* k.k^T */
	t_tc_mm(cu, 64, 128, 64, false, false, false, false, false, false, 1, 0);
	t_tc_mm(cu, 128, 128, 64, true, false, true, false, false, true, 1, 0.7f);
	t_tc_mm(cu, 64, 128, 64, false, true, true, false, false, false, -1, 1);
	t_tc_mm(cu, 16, 48, 48, false, false, false, false, false, false, -1, 0);
	t_tc_mm(cu, 64, 64, 64, true, true, false, true, false, false, 1, 1);	/* dD V^T */
	t_tc_mm(cu, 17, 23, 13, true, true, true, true, true, true, 0.5f, -2);	/* ragged */
	t_tc_mm(cu, 5, 3, 4, false, false, false, false, false, true, 1, 0);
	/* the vector loads' remaining pairing: A m-contiguous with B k-contiguous, both types */
	t_tc_mm(cu, 64, 128, 64, true, false, true, true, false, true, 1, 0);
	t_tc_mm(cu, 128, 64, 64, false, true, true, true, false, false, -1, 1);
	sl_cuda_destroy(cu);
}

/* ---- the two delta-rule kernels against each other at the 4B's shape, timed ------------------ */

/* n host floats onto be (bf16 when bf) */
static void *dev_put(struct sl_backend *be, const float *h, size_t n, bool bf)
{
	void *d = be->alloc(be, n * (bf ? 2 : 4));

	if (bf) {
		uint16_t *t = malloc(n * 2 + 2);

		for (size_t i = 0; i < n; i++)
			t[i] = f2bf(h[i]);
		be->upload(be, d, t, n * 2);
		free(t);
	} else {
		be->upload(be, d, h, n * 4);
	}
	return d;
}

/* norm-relative difference of two bf16 device buffers of n values */
static double dev_diff(struct sl_backend *a, void *da, struct sl_backend *b, void *db, size_t n)
{
	uint16_t *x = malloc(n * 2 + 2), *y = malloc(n * 2 + 2);
	double num = 0, den = 0;

	a->download(a, x, da, n * 2);
	b->download(b, y, db, n * 2);
	for (size_t i = 0; i < n; i++) {
		double u = bf2f(x[i]), w = bf2f(y[i]);

		if (!isfinite(u) || !isfinite(w)) {
			num = INFINITY;
			break;
		}
		num += (u - w) * (u - w);
		den += w * w;
	}
	free(x), free(y);
	return den > 0 ? sqrt(num / den) : sqrt(num);
}

/*
 * The chunked kernel (gc) against the recurrent one (gr) where the cpu would take minutes: the
 * Qwen3.5 4B's Gated DeltaNet shape, one record padded.  Their fwd and bwd times are printed
 * (no threshold); the outputs must agree within 2e-2 (norm-relative: both round to bf16, the
 * recurrence's dq, dk once per value head).
 */
static void t_rule_pair(struct sl_backend *gr, struct sl_backend *gc, const char *nr,
			const char *nc, int B, int L, int nk, int nv, int dk, int dv)
{
	struct sl_backend *be[2] = { gr, gc };
	int T = B * L, vs = nv * dv, nch = (L + 63) / 64;
	size_t nq = (size_t)T * nk * dk, nvv = (size_t)T * vs, nb = (size_t)T * nv;
	size_t ns = (size_t)B * nch * nv * dk * dv;
	float *hq = malloc(nq * 4), *hk = malloc(nq * 4), *hv = malloc(nvv * 4);
	float *hb = malloc(nb * 4), *hg = malloc(nb * 4), *hgo = malloc(nvv * 4);
	int32_t *hl = malloc(B * 4);
	void *q[2], *k[2], *v[2], *bt[2], *g[2], *go[2], *o[2], *st[2], *dq[2], *dk_[2];
	void *dv_[2], *db[2], *dg[2];
	int32_t *lens[2];
	double ms[2][2], e[6];
	char sh[64];

	for (size_t r = 0; r < (size_t)T * nk; r++) {	/* l2-normalized rows, q / sqrt(dk) */
		double sq = 0, sk = 0;

		for (int i = 0; i < dk; i++) {
			hq[r * dk + i] = (float)rng_normal();
			hk[r * dk + i] = (float)rng_normal();
			sq += hq[r * dk + i] * hq[r * dk + i];
			sk += hk[r * dk + i] * hk[r * dk + i];
		}
		for (int i = 0; i < dk; i++) {
			hq[r * dk + i] /= (float)sqrt(sq * dk);
			hk[r * dk + i] /= (float)sqrt(sk);
		}
	}
	for (size_t i = 0; i < nvv; i++) {
		hv[i] = (float)rng_normal();
		hgo[i] = (float)rng_normal();
	}
	for (size_t i = 0; i < nb; i++) {
		hb[i] = (float)rng_unif();
		hg[i] = (float)(-0.5 * rng_unif());
	}
	for (int b = 0; b < B; b++)
		hl[b] = b == B - 1 ? L - L / 4 - 3 : L;
	snprintf(sh, sizeof(sh), "T=%dx%d k=%dx%d v=%dx%d", B, L, nk, dk, nv, dv);
	for (int s = 0; s < 2; s++) {
		struct sl_backend *x = be[s];

		q[s] = dev_put(x, hq, nq, true);
		k[s] = dev_put(x, hk, nq, true);
		v[s] = dev_put(x, hv, nvv, true);
		go[s] = dev_put(x, hgo, nvv, true);
		bt[s] = dev_put(x, hb, nb, false);
		g[s] = dev_put(x, hg, nb, false);
		lens[s] = x->alloc(x, B * 4);
		x->upload(x, lens[s], hl, B * 4);
		o[s] = x->alloc(x, nvv * 2);
		st[s] = x->alloc(x, (ns + (x->gdn_states_extra ?
					   x->gdn_states_extra(x, (size_t)B * nch, nv, dk, dv) :
					   0)) * 4);
		dq[s] = x->alloc(x, nq * 2);
		dk_[s] = x->alloc(x, nq * 2);
		dv_[s] = x->alloc(x, nvv * 2);
		db[s] = x->alloc(x, nb * 2);
		dg[s] = x->alloc(x, nb * 2);
		for (int rep = 0; rep < 2; rep++) {	/* the second call is timed */
			gpu = x;
			TIMED(x->gdn_rule_fwd(x, o[s], st[s], q[s], k[s], v[s], vs, bt[s], g[s],
					      lens[s], B, L, L, nk, nv, dk, dv, NULL, NULL));
			ms[s][0] = t_ms;
			TIMED(x->gdn_rule_bwd(x, dq[s], dk_[s], dv_[s], db[s], dg[s], go[s], st[s],
					      q[s], k[s], v[s], vs, bt[s], g[s], lens[s], B, L, L,
					      nk, nv, dk, dv, NULL, NULL));
			ms[s][1] = t_ms;
		}
	}
	e[0] = dev_diff(gc, o[1], gr, o[0], nvv);
	e[1] = dev_diff(gc, dq[1], gr, dq[0], nq);
	e[2] = dev_diff(gc, dk_[1], gr, dk_[0], nq);
	e[3] = dev_diff(gc, dv_[1], gr, dv_[0], nvv);
	e[4] = dev_diff(gc, db[1], gr, db[0], nb);
	e[5] = dev_diff(gc, dg[1], gr, dg[0], nb);
	printf("%-18s %-28s %-8s %10s %10s %8.3f\n", "gdn_rule_fwd", sh, nr, "", "", ms[0][0]);
	printf("%-18s %-28s %-8s %10.2e %10s %8.3f\n", "gdn_rule_fwd", sh, nc, e[0], "", ms[1][0]);
	printf("%-18s %-28s %-8s %10s %10s %8.3f\n", "gdn_rule_bwd", sh, nr, "", "", ms[0][1]);
	printf("%-18s %-28s %-8s %10.2e %10s %8.3f  (dq dk dv db dg vs %s: %.1e %.1e %.1e "
	       "%.1e %.1e)\n", "gdn_rule_bwd", sh, nc, e[1], "", ms[1][1], nr, e[1], e[2], e[3],
	       e[4], e[5]);
	for (int i = 0; i < 6; i++)
		CHECK(e[i] <= 2e-2, "%s: %s vs %s, output %d: relative difference %g", sh, nc, nr,
		      i, e[i]);
	for (int s = 0; s < 2; s++) {
		void *all[] = { q[s], k[s], v[s], go[s], bt[s], g[s], lens[s], o[s], st[s], dq[s],
				dk_[s], dv_[s], db[s], dg[s] };

		for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++)
			be[s]->free(be[s], all[i]);
	}
	free(hq), free(hk), free(hv), free(hb), free(hg), free(hgo), free(hl);
}

/*
 * One chunk of each of B rows (context parallel): record stride rs = L + 5 (the rows past L
 * untouched), a start state s0, the end state, and in the backward the end state's gradient in
 * and the start state's out
 */
static void t_rule_chunk(int B, int L, int nk, int nv, int dk, int dv)
{
	char sh[64];
	int rs = L + 5, T = B * rs, vs = nv * dv + 5, nch = (L + 63) / 64;
	size_t ns = (size_t)B * nv * dk * dv;
	struct buf *lens = mk_lens(B, L);
	struct buf *q = unit_rows((size_t)T * nk, dk, 1 / sqrt(dk)), *k = unit_rows((size_t)T * nk, dk, 1);
	struct buf *v = rnd(BF, (size_t)T * vs, 1), *beta = unif(STAT, (size_t)T * nv, 0, 1);
	struct buf *g = unif(STAT, (size_t)T * nv, -0.5, 0);
	struct buf *o = rnd(BF, (size_t)T * nv * dv, 1);
	struct buf *st = out(STAT, (size_t)B * nch * nv * dk * dv);
	struct buf *s0 = rnd(STAT, ns, 0.3), *se = out(STAT, ns), *dse = rnd(STAT, ns, 0.3);
	struct buf *ds0 = out(STAT, ns);
	struct buf *go = rnd(BF, (size_t)T * nv * dv, 1);
	struct buf *dq = rnd(BF, (size_t)T * nk * dk, 1), *dk_ = rnd(BF, (size_t)T * nk * dk, 1);
	struct buf *dv_ = rnd(BF, (size_t)T * vs, 1), *db = rnd(BF, (size_t)T * nv, 1);
	struct buf *dg = rnd(BF, (size_t)T * nv, 1);

	snprintf(sh, sizeof(sh), "T=%dx%d/%d k=%dx%d v=%dx%d s0", B, L, rs, nk, dk, nv, dv);
	cpu->gdn_rule_fwd(cpu, o->c, st->c, q->c, k->c, v->c, vs, beta->c, g->c, lens->c, B, L,
			  rs, nk, nv, dk, dv, s0->c, se->c);
	TIMED(gpu->gdn_rule_fwd(gpu, o->g, st->g, q->g, k->g, v->g, vs, beta->g, g->g, lens->g, B,
				L, rs, nk, nv, dk, dv, s0->g, se->g));
	cmp("gdn_rule_fwd", sh, "o", o, TOL);
	cmp("gdn_rule_fwd", sh, "states", st, 1e-4);
	cmp("gdn_rule_fwd", sh, "s_end", se, 1e-4);
	sync_stat(st);
	cpu->gdn_rule_bwd(cpu, dq->c, dk_->c, dv_->c, db->c, dg->c, go->c, st->c, q->c, k->c,
			  v->c, vs, beta->c, g->c, lens->c, B, L, rs, nk, nv, dk, dv, dse->c,
			  ds0->c);
	TIMED(gpu->gdn_rule_bwd(gpu, dq->g, dk_->g, dv_->g, db->g, dg->g, go->g, st->g, q->g, k->g,
				v->g, vs, beta->g, g->g, lens->g, B, L, rs, nk, nv, dk, dv, dse->g,
				ds0->g));
	cmp("gdn_rule_bwd", sh, "dq", dq, TOL);
	cmp("gdn_rule_bwd", sh, "dk", dk_, TOL);
	cmp("gdn_rule_bwd", sh, "dv", dv_, TOL);
	cmp("gdn_rule_bwd", sh, "dbeta", db, TOL);
	cmp("gdn_rule_bwd", sh, "dg", dg, TOL);
	cmp("gdn_rule_bwd", sh, "ds0", ds0, 1e-4);
	drop(lens), drop(q), drop(k), drop(v), drop(beta), drop(g), drop(o), drop(st), drop(go);
	drop(s0), drop(se), drop(dse), drop(ds0), drop(dq), drop(dk_), drop(dv_), drop(db);
	drop(dg);
}

static void t_gnorm(int T, int nh, int d, int zs)
{
	char sh[64];
	struct buf *x = rnd(BF, (size_t)T * nh * d, 1), *z = rnd(BF, (size_t)T * zs, 1);
	struct buf *w = rnd(BF, d, 1), *o = out(BF, (size_t)T * nh * d);
	struct buf *rs = out(STAT, (size_t)T * nh), *g = rnd(BF, (size_t)T * nh * d, 1);
	struct buf *dx = out(BF, (size_t)T * nh * d), *dz = rnd(BF, (size_t)T * zs, 1);
	struct buf *dw = rnd(BF, d, 1);

	snprintf(sh, sizeof(sh), "T=%d h=%d d=%d", T, nh, d);
	cpu->gated_rmsnorm_fwd(cpu, o->c, rs->c, x->c, z->c, zs, w->c, T, nh, d, 1e-6f);
	TIMED(gpu->gated_rmsnorm_fwd(gpu, o->g, rs->g, x->g, z->g, zs, w->g, T, nh, d, 1e-6f));
	cmp("gated_rmsnorm_fwd", sh, "out", o, TOL);
	cmp("gated_rmsnorm_fwd", sh, "rstd", rs, 1e-5);
	sync_stat(rs);
	cpu->gated_rmsnorm_bwd(cpu, dx->c, dz->c, zs, dw->c, g->c, x->c, z->c, w->c, rs->c, T, nh,
			       d, 1e-6f);
	TIMED(gpu->gated_rmsnorm_bwd(gpu, dx->g, dz->g, zs, dw->g, g->g, x->g, z->g, w->g, rs->g,
				     T, nh, d, 1e-6f));
	cmp("gated_rmsnorm_bwd", sh, "dx", dx, TOL);
	cmp("gated_rmsnorm_bwd", sh, "dz", dz, TOL);
	cmp("gated_rmsnorm_bwd", sh, "dw", dw, TOL);
	drop(x), drop(z), drop(w), drop(o), drop(rs), drop(g), drop(dx), drop(dz), drop(dw);
}

/* @pos: positions given (context parallel's positions in the row: (7 t + 3) % L), or t % L */
static void t_gattn(int B, int L, int nh, int nkv, int hd, int rot, bool pos)
{
	char sh[64];
	int T = B * L, Win = (2 * nh + 2 * nkv) * hd, Wout = (nh + 2 * nkv) * hd;
	struct buf *ps = mk(I32, (size_t)T);
	struct buf *x = rnd(BF, (size_t)T * Win, 1), *qw = rnd(BF, hd, 1), *kw = rnd(BF, hd, 1);
	struct buf *o = out(BF, (size_t)T * Wout), *gt = out(BF, (size_t)T * nh * hd);
	struct buf *rs = out(STAT, (size_t)T * (nh + nkv)), *g = rnd(BF, (size_t)T * Wout, 1);
	struct buf *gg = rnd(BF, (size_t)T * nh * hd, 1), *dx = out(BF, (size_t)T * Win);
	struct buf *dq = rnd(BF, hd, 1), *dk = rnd(BF, hd, 1);
	struct buf *y = out(BF, (size_t)T * nh * hd), *dy = out(BF, (size_t)T * nh * hd);
	struct buf *dgt = out(BF, (size_t)T * nh * hd);
	float theta = 1e7f;

	for (int t = 0; t < T; t++)
		ps->hi[t] = (7 * t + 3) % L;
	put(ps);
	snprintf(sh, sizeof(sh), "T=%dx%d h=%d/%d hd=%d r=%d%s", B, L, nh, nkv, hd, rot,
		 pos ? " pos" : "");
	cpu->gattn_qk_fwd(cpu, o->c, gt->c, rs->c, x->c, qw->c, kw->c, T, L, pos ? ps->c : NULL,
			  nh, nkv, hd, rot, 1e-6f, theta);
	TIMED(gpu->gattn_qk_fwd(gpu, o->g, gt->g, rs->g, x->g, qw->g, kw->g, T, L,
				pos ? ps->g : NULL, nh, nkv, hd, rot, 1e-6f, theta));
	cmp("gattn_qk_fwd", sh, "out", o, TOL);
	cmp("gattn_qk_fwd", sh, "gate", gt, 1e-6);
	cmp("gattn_qk_fwd", sh, "rstd", rs, 1e-5);
	sync_stat(rs);
	cpu->gattn_qk_bwd(cpu, dx->c, dq->c, dk->c, g->c, gg->c, x->c, qw->c, kw->c, rs->c, T, L,
			  pos ? ps->c : NULL, nh, nkv, hd, rot, 1e-6f, theta);
	TIMED(gpu->gattn_qk_bwd(gpu, dx->g, dq->g, dk->g, g->g, gg->g, x->g, qw->g, kw->g, rs->g,
				T, L, pos ? ps->g : NULL, nh, nkv, hd, rot, 1e-6f, theta));
	cmp("gattn_qk_bwd", sh, "dqgkv", dx, TOL);
	cmp("gattn_qk_bwd", sh, "dq_norm_w", dq, TOL);
	cmp("gattn_qk_bwd", sh, "dk_norm_w", dk, TOL);
	/* the output gate, on the gate halves just made */
	cpu->sigmoid_mul_fwd(cpu, y->c, g->c, gt->c, (size_t)T * nh * hd);
	TIMED(gpu->sigmoid_mul_fwd(gpu, y->g, g->g, gt->g, (size_t)T * nh * hd));
	cmp("sigmoid_mul_fwd", sh, "y", y, TOL);
	cpu->sigmoid_mul_bwd(cpu, dy->c, dgt->c, gg->c, g->c, gt->c, (size_t)T * nh * hd);
	TIMED(gpu->sigmoid_mul_bwd(gpu, dy->g, dgt->g, gg->g, g->g, gt->g, (size_t)T * nh * hd));
	cmp("sigmoid_mul_bwd", sh, "dx", dy, TOL);
	cmp("sigmoid_mul_bwd", sh, "dgate", dgt, TOL);
	drop(x), drop(qw), drop(kw), drop(o), drop(gt), drop(rs), drop(g), drop(gg), drop(dx);
	drop(dq), drop(dk), drop(y), drop(dy), drop(dgt), drop(ps);
}


/* ---- the tiny hybrid model: loss and gradients, cuda against cpu ---------------------------- */

struct side {
	struct sl_backend *be;
	void **w, **g;
};

static const void *side_w(void *ctx, int u)
{
	return ((struct side *)ctx)->w[u];
}

static void *side_g(void *ctx, int u)
{
	return ((struct side *)ctx)->g[u];
}

/*
 * The tiny hybrid (GDN, gated attention, GDN, GDN; records of 150, 70 and 5 tokens) on both
 * backends from the same bf16 weights: loss, scores and every gradient.  @sft: the causal-LM
 * head (untied), targets at about two thirds of the real positions; else the scalar head.
 * @experts > 0: every layer sparse (Qwen3.5-MoE: routed experts, all of them taken (k = E, so
 * that no near-tie in a top-k choice can send a token elsewhere in bf16 than in fp32), the
 * shared expert of @shared (0: none) and its gate, the load-balancing loss).
 * The bounds come from the model itself: a third run on the cpu with every weight moved by a
 * random relative +-2^-8 (what bf16 rounding does) measures how far its gradients move under
 * bf16-sized noise; cuda (which also rounds every activation) must stay within 3x that, at least
 * 2e-2 for the whole gradient and 3e-2 per tensor (of the tensor's share of the whole gradient
 * where its own gradient is far smaller).  (With weights of std 0.15 this model
 * amplifies such noise to 5-25% of the gradient; at 0.05 it stays near 1%.)
 * SL_TEST_VERBOSE=1 prints every tensor's error and noise, and a case without the shared expert.
 */
static void t_model(const char *name, bool sft, int experts, int shared)
{
	static const enum sl_layer_kind kinds[4] = {
		SL_LAYER_LINEAR_ATTENTION, SL_LAYER_GATED_ATTENTION, SL_LAYER_LINEAR_ATTENTION,
		SL_LAYER_LINEAR_ATTENTION
	};
	struct sl_model_config mc = { .vocab = 50, .hidden = 64, .n_layers = 4, .n_heads = 4,
				      .n_kv_heads = 2, .head_dim = 32, .intermediate = 96,
				      .max_position = 512, .rms_eps = 1e-6, .rope_theta = 1e4,
				      .initializer_range = 0.05, .num_labels = 1,
				      .norm_offset = true, .rot_dim = 8, .lin_nk = 2, .lin_nv = 4,
				      .lin_dk = 16, .lin_dv = 24, .lin_conv = 4 };
	struct sl_layout lay;
	/* the cpu (reference), cuda, and the cpu again with every weight moved by a random relative
	 * +-2^-8 (bf16's rounding): how far this model's gradients move under bf16-sized noise */
	struct side sd[3] = { { .be = cpu }, { .be = gpu }, { .be = cpu } };
	int B = 3, L = 150, T = B * L, n_tgt = 0;
	int32_t ids[450], lens[3] = { 150, 70, 5 }, last[3], tpos[450], tids[450];
	float labels[3] = { 0.3f, 0.8f, 0.5f }, sc[3][3];
	double loss[3], num = 0, den = 0, pnum = 0, worst = 0, wrel = 0, wtol = 0;
	uint64_t prng = 99;
	const char *wname = "";
	float **gh = calloc(3, sizeof(float *));

	mc.layer_kind = (enum sl_layer_kind *)kinds;
	mc.mlp_kind = calloc(4, sizeof(*mc.mlp_kind));
	strcpy(mc.model_type, experts ? "qwen3_5_moe_text" : "qwen3_5_text");
	if (experts) {
		for (int l = 0; l < 4; l++)
			mc.mlp_kind[l] = SL_MLP_MOE;
		mc.n_experts = mc.top_k = experts;
		mc.moe_intermediate = 32;
		mc.norm_topk_prob = true;
		mc.router_aux_loss_coef = 0.05;
		mc.shared_intermediate = shared;
	}
	CHECK(sl_model_layout(&mc, sft, &lay) == 0, "%s: layout", name);
	for (int b = 0; b < B; b++)
		last[b] = b * L + lens[b] - 1;
	for (int t = 0; t < T; t++)
		ids[t] = (int32_t)(rng_next() % 50);
	for (int b = 0; b < B; b++)	/* position p predicts token p + 1 */
		for (int p = 0; p + 1 < lens[b]; p++)
			if (rng_unif() < 0.67) {
				tpos[n_tgt] = b * L + p;
				tids[n_tgt++] = ids[b * L + p + 1];
			}
	for (int s = 0; s < 3; s++)
		gh[s] = calloc(lay.total_numel, sizeof(float));
	for (int s = 0; s < 3; s++) {
		struct sl_backend *be = sd[s].be;
		struct sl_unit_source src = { .ctx = &sd[s], .weights = side_w, .grads = side_g };
		int32_t *d_ids = be->alloc(be, T * 4), *d_lens = be->alloc(be, B * 4);
		int32_t *d_last = be->alloc(be, B * 4);
		int32_t *d_tpos = be->alloc(be, T * 4), *d_tids = be->alloc(be, T * 4);
		float *d_lab = be->alloc(be, B * 4);
		struct sl_batch_dev bt = { .B = B, .L = L, .ids = d_ids, .lens = d_lens,
					   .last = d_last, .labels = sft ? NULL : d_lab,
					   .h_lens = lens };
		struct sl_model *m;
		size_t base = 0;
		uint64_t keep = rng_state;

		if (sft) {
			bt.n_tgt = n_tgt;
			bt.tgt_pos = d_tpos;
			bt.tgt_ids = d_tids;
		}
		rng_state = 777;	/* the same weights on both sides */
		sd[s].w = calloc(lay.n_units, sizeof(void *));
		sd[s].g = calloc(lay.n_units, sizeof(void *));
		for (int u = 0; u < lay.n_units; u++) {
			size_t n = lay.unit_numel[u];
			float *h = malloc(n * 4), *f = be->alloc(be, n * 4);

			for (size_t i = 0; i < n; i++)
				h[i] = round_bf((float)(0.05 * rng_normal()));
			for (int i = 0; i < lay.n_tensors; i++)	/* A_log: decays in a sane range */
				if (lay.t[i].unit == u && strstr(lay.t[i].name, "A_log"))
					for (size_t k = 0; k < lay.t[i].numel; k++)
						h[lay.t[i].offset + k] = round_bf((float)log(0.1 + rng_unif()));
			for (size_t i = 0; s == 2 && i < n; i++) {
				prng = prng * 6364136223846793005ULL + 1442695040888963407ULL;
				h[i] *= (float)(1 + ((double)(prng >> 11) * 0x1p-52 - 1) * 0x1p-8);
			}
			sd[s].w[u] = be->alloc(be, n * be->elt);
			sd[s].g[u] = be->alloc(be, n * be->elt);
			be->upload(be, f, h, n * 4);
			be->to_compute(be, sd[s].w[u], f, n);
			be->free(be, f);
			free(h);
		}
		rng_state = keep;
		be->upload(be, d_ids, ids, T * 4);
		be->upload(be, d_lens, lens, B * 4);
		be->upload(be, d_last, last, B * 4);
		be->upload(be, d_lab, labels, B * 4);
		be->upload(be, d_tpos, tpos, T * 4);
		be->upload(be, d_tids, tids, T * 4);
		m = sl_model_create(&mc, &lay, be, T, B, false);
		CHECK(m, "%s: model on %s", name, be->name);
		if (!m)
			return;
		if (s == 1)
			TIMED(sl_model_train_step(m, &src, &bt, sft ? 1.0f / n_tgt : 1.0f / B,
						  &loss[s], sft ? NULL : sc[s]));
		else
			sl_model_train_step(m, &src, &bt, sft ? 1.0f / n_tgt : 1.0f / B, &loss[s],
					    sft ? NULL : sc[s]);
		for (int u = 0; u < lay.n_units; u++) {
			size_t n = lay.unit_numel[u];
			float *f = be->alloc(be, n * 4);

			be->to_f32(be, f, sd[s].g[u], n);
			be->download(be, gh[s] + base, f, n * 4);
			be->free(be, f);
			base += n;
		}
		sl_model_destroy(m);
		be->free(be, d_ids), be->free(be, d_lens), be->free(be, d_last), be->free(be, d_lab);
		be->free(be, d_tpos), be->free(be, d_tids);
		for (int u = 0; u < lay.n_units; u++) {
			be->free(be, sd[s].w[u]);
			be->free(be, sd[s].g[u]);
		}
		free(sd[s].w), free(sd[s].g);
	}
	CHECK_CLOSE(loss[1], loss[0], 2e-2, 1e-3);
	for (int b = 0; !sft && b < B; b++)
		CHECK_CLOSE(sc[1][b], sc[0][b], 3e-2, 3e-2);
	for (size_t i = 0; i < lay.total_numel; i++) {
		num += ((double)gh[1][i] - gh[0][i]) * ((double)gh[1][i] - gh[0][i]);
		pnum += ((double)gh[2][i] - gh[0][i]) * ((double)gh[2][i] - gh[0][i]);
		den += (double)gh[0][i] * gh[0][i];
	}
	/* the bounds: 3x the move under weight noise (cuda rounds every activation too), at
	 * least 2e-2 for the whole gradient and 3e-2 for a tensor */
	double rel = sqrt(num / den), prel = sqrt(pnum / den), tol = fmax(2e-2, 3 * prel);

	CHECK(rel <= tol, "%s: model gradients: relative error %g (bound %g)", name, rel, tol);
	/* tensor by tensor (the layout's units are laid out one after another) */
	size_t base = 0;
	for (int u = 0; u < lay.n_units; u++) {
		for (int i = 0; i < lay.n_tensors; i++) {
			const struct sl_tensor_info *t = &lay.t[i];
			double tn = 0, td = 0, tp = 0, r, pr, ttol;

			if (t->unit != u)
				continue;
			for (size_t k = 0; k < t->numel; k++) {
				double c = gh[0][base + t->offset + k];
				double d = (double)gh[1][base + t->offset + k] - c;
				double dp = (double)gh[2][base + t->offset + k] - c;

				tn += d * d;
				tp += dp * dp;
				td += c * c;
			}
			r = td > 0 ? sqrt(tn / td) : sqrt(tn);
			pr = td > 0 ? sqrt(tp / td) : sqrt(tp);
			/* as test_cuda_model: a tensor whose gradient is far below its share of the
			 * whole (a handful of per-head A_log / dt_bias sums) is held to 3% of that
			 * share (layer 0's reached 3.5% of their own size on the H200) */
			ttol = fmax(3e-2 * fmax(1.0, sqrt(den / (double)lay.total_numel *
							   (double)t->numel / fmax(td, 1e-300))),
				    3 * pr);
			if (getenv("SL_TEST_VERBOSE"))	/* each tensor: its error, its share */
				printf("  %-52s rel %.3e  noise %.3e  |g| %.3e  share %.3f\n",
				       t->name, r, pr, sqrt(td), tn / num);
			CHECK(r <= ttol, "%s: gradient of %s: relative error %g (bound %g)", name,
			      t->name, r, ttol);
			if (!(r / ttol <= worst)) {
				worst = r / ttol;
				wrel = r;
				wtol = ttol;
				wname = t->name;
			}
		}
		base += lay.unit_numel[u];
	}
	printf("%-18s %-28s %-8s %10.2e %10.2e %8.3f  %s\n", "model train_step", name, "grads", rel,
	       tol, t_ms, rel <= tol && worst <= 1 ? "ok" : "FAIL");
	printf("%-18s   worst tensor %s: %.2e (bound %.2e); losses cpu %.6f cuda %.6f\n", "",
	       wname, wrel, wtol, loss[0], loss[1]);
	for (int s = 0; s < 3; s++)
		free(gh[s]);
	free(gh);
	free(mc.mlp_kind);
	sl_layout_free(&lay);
}

/* a cuda backend made under SHARDLM_GDN_KERNEL=k and SHARDLM_GDN_WALK=w (NULL: unset), checked
 * made (ok) or refused (!ok); kept where keep, else destroyed (NULL) */
static struct sl_backend *made(const char *k, const char *w, bool ok, bool keep)
{
	struct sl_backend *b;

	setenv("SHARDLM_GDN_KERNEL", k, 1);
	if (w)
		setenv("SHARDLM_GDN_WALK", w, 1);
	b = sl_backend_cuda_create(0);
	unsetenv("SHARDLM_GDN_KERNEL");
	unsetenv("SHARDLM_GDN_WALK");
	CHECK(ok == (b != NULL), "SHARDLM_GDN_KERNEL=%s SHARDLM_GDN_WALK=%s: the cuda backend %s",
	      k, w ? w : "(unset)", ok ? "refused" : "made");
	if (b && !keep) {
		b->destroy(b);
		b = NULL;
	}
	return b;
}

int main(int argc, char **argv)
{
	const char *rule_only;
	uint64_t seed = argc > 1 ? strtoull(argv[1], NULL, 0) :
			(uint64_t)time(NULL) ^ ((uint64_t)clock() << 32);

	rng_state = seed ? seed : 1;
	printf("test_cuda_qwen35: seed %llu\n", (unsigned long long)seed);
	cpu = sl_backend_cpu_create();
	/* the two delta-rule kernels, each on a backend of its own (SHARDLM_GDN_KERNEL is read
	 * when a backend is made) */
	setenv("SHARDLM_GDN_KERNEL", "recurrent", 1);
	gpu = gpu_rec = sl_backend_cuda_create(0);
	if (!cpu || !gpu) {
		fprintf(stderr, "test_cuda_qwen35: no %s backend\n", cpu ? "cuda" : "cpu");
		return 77;
	}
	made("bogus", NULL, false, false);
	made("chunked", "bogus", false, false);
	made("chunked", NULL, true, false);		/* the default's names */
	made("chunked-3pass", NULL, true, false);
	gpu_chk = made("chunked-1pass", NULL, true, true);
	gpu_fus = made("chunked-fused", NULL, true, true);
	/* the default with the state walked in shared memory (block-wide products) instead of
	 * registers; with the forward's walk in registers without the output (k_gdn_fwd_o makes
	 * it) */
	gpu_shw = made("chunked", "shared", true, true);
	gpu_rs = made("chunked", "registers-state", true, true);
	gpu_def = sl_backend_cuda_create(0);
	if (!gpu_chk || !gpu_fus || !gpu_def || !gpu_shw || !gpu_rs)
		return test_exit("test_cuda_qwen35");
	printf("%-18s %-28s %-8s %10s %10s %8s\n", "op", "shape", "output", "rel.err", "max/scale",
	       "gpu ms");
	t_tc_mm_all();
	/* SL_TEST_RULE_ONLY=chunked: the chunked kernel's cases alone, small (racecheck is slow) */
	rule_only = getenv("SL_TEST_RULE_ONLY");
	if (rule_only && !strcmp(rule_only, "pair")) {	/* the 4B-shaped pair alone (profiling) */
		t_rule_pair(gpu_rec, gpu_def, "recur", "chunked", 4, 2048, 16, 32, 128, 128);
		t_rule_pair(gpu_fus, gpu_chk, "fused", "1-pass", 4, 2048, 16, 32, 128, 128);
		t_rule_pair(gpu_rec, gpu_shw, "recur", "shared", 4, 2048, 16, 32, 128, 128);
		t_rule_pair(gpu_rec, gpu_rs, "recur", "reg-state", 4, 2048, 16, 32, 128, 128);
		goto out;
	}
	if (rule_only && !strcmp(rule_only, "chunked")) {
		for (int kk = 0; kk < 4; kk++) {	/* chunked-1pass, the default, shared walks,
							 * the walk without the output */
			gpu = kk == 3 ? gpu_rs : kk == 2 ? gpu_shw : kk ? gpu_def : gpu_chk;
			t_rule(2, 9, 1, 2, 4, 3);
			t_rule(2, 150, 2, 4, 16, 24);
			t_rule(1, 130, 1, 2, 128, 128);
		}
		goto out;
	}
	t_conv(2, 9, 7, 4, 11);
	t_conv(3, 70, 160, 4, 200);
	t_conv(2, 300, 1000, 4, 1100);
	t_conv_halo(4, 5, 7, 4, 11);
	t_conv_halo(2, 150, 300, 4, 330);
	/* 8 channels a thread (C and the stride in 16-byte groups): records that start inside a
	 * thread's token run and inside its groups of 4 loads, with and without the halo */
	t_conv(3, 99, 256, 4, 264);
	t_conv_halo(3, 77, 320, 4, 336);
	/* the Qwen3.5 4B layer's conv (8,192 channels of the 12,352-wide projection), timed */
	t_conv(4, 2048, 8192, 4, 12352);
	t_prep(5, 1, 2, 4, 3, 9);
	t_prep(140, 2, 4, 16, 24, 10);
	t_prep(700, 16, 48, 128, 128, 100);
	/* recurrent, chunked-1pass (the one-kernel forward's delta and Q S0 taken by the
	 * two-pass backward's gradient kernel), chunked-fused, the default (the three-pass forward
	 * and the two-pass backward, the state walked in registers), the default with the state
	 * walked in shared memory, the default with the output by a pass of its own */
	for (int kk = 0; kk < 6; kk++) {
		static const char *name[] = { "recurrent", "chunked-1pass", "chunked-fused",
					      "chunked (default)", "chunked, shared walks",
					      "chunked, the output by a pass of its own" };
		struct sl_backend *bk[] = { gpu_rec, gpu_chk, gpu_fus, gpu_def, gpu_shw, gpu_rs };

		gpu = bk[kk];
		printf("-- gated delta rule: %s kernel\n", name[kk]);
		t_rule(2, 9, 1, 2, 4, 3);
		t_rule(3, 150, 2, 4, 16, 24);
		t_rule(2, 200, 2, 6, 128, 128);
		t_rule(3, 300, 2, 4, 32, 40);
		t_rule(2, 130, 1, 3, 96, 70);
		/* dv <= dk (the default's value-column sums in registers, k_gdn_grad_v): a half
		 * of dk of one n-tile each (16), and none for the second half (8) */
		t_rule(2, 100, 2, 4, 16, 16);
		t_rule(1, 70, 1, 2, 8, 8);
		/* one chunk of each row with its start and end state: the chunked backend falls
		 * back to the recurrence there */
		t_rule_chunk(3, 70, 2, 4, 16, 24);
		t_rule_chunk(2, 130, 2, 6, 128, 128);
	}
	gpu = gpu_rec;
	if (rule_only)	/* the delta rule alone (under compute-sanitizer) */
		goto out;
	t_gnorm(7, 2, 3, 11);
	t_gnorm(140, 4, 24, 200);
	t_gnorm(300, 48, 128, 7000);
	t_gnorm(70, 6, 256, 1600);	/* 8 elements a lane */
	t_gnorm(50, 4, 128, 514);	/* z's stride off 8 bytes: the 2-byte kernels */
	t_gnorm(8192, 32, 128, 12352);	/* the 4B layer's, timed */
	t_gattn(2, 9, 2, 1, 8, 4, false);
	t_gattn(3, 70, 4, 2, 32, 8, false);
	t_gattn(2, 150, 24, 4, 256, 64, false);
	t_gattn(2, 150, 24, 4, 256, 64, true);
	for (int kk = 0; kk < 3; kk++) {	/* the whole model with each delta-rule setting */
		gpu = kk == 2 ? gpu_chk : kk ? gpu_def : gpu_rec;
		printf("-- model: %s gated delta rule\n",
		       kk == 2 ? "chunked-1pass" : kk ? "default (chunked)" : "recurrent");
		t_model("3x150 classify", false, 0, 0);
		t_model("3x150 sft", true, 0, 0);
		t_model("3x150 moe sft k=E=4", true, 4, 24);
		if (getenv("SL_TEST_VERBOSE"))
			t_model("3x150 moe sft k=E=4 no shared", true, 4, 0);
	}
	/* the Qwen3.5 4B's Gated DeltaNet layer: the default chunked kernels against the
	 * recurrent ones, both timed */
	t_rule_pair(gpu_rec, gpu_def, "recur", "chunked", 4, 2048, 16, 32, 128, 128);
	/* the one-kernel forward with the fused backward against the one-kernel forward with the
	 * two-pass backward; the default's kernels with the state walked in shared memory */
	t_rule_pair(gpu_fus, gpu_chk, "fused", "1-pass", 4, 2048, 16, 32, 128, 128);
	t_rule_pair(gpu_rec, gpu_shw, "recur", "shared", 4, 2048, 16, 32, 128, 128);
	t_rule_pair(gpu_rec, gpu_rs, "recur", "reg-state", 4, 2048, 16, 32, 128, 128);
	gpu = gpu_rec;
out:
	printf("peak %zu bytes, reserved %zu\n", sl_backend_cuda_peak_bytes(gpu),
	       sl_backend_cuda_reserved_bytes(gpu));
	gpu_fus->destroy(gpu_fus);
	gpu_def->destroy(gpu_def);
	gpu_chk->destroy(gpu_chk);
	gpu_shw->destroy(gpu_shw);
	gpu_rs->destroy(gpu_rs);
	gpu_rec->destroy(gpu_rec);	/* gpu is one of the three */
	cpu->destroy(cpu);
	return test_exit("test_cuda_qwen35");
}
