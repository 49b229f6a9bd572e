/*
 * test_cuda_ops: every op of the cuda backend against the cpu backend (the numeric reference) on
 * random inputs: a fresh seed each run (printed; pass one as argv[1] to repeat a run), values never
 * all zero, outputs poisoned with NaN first so that an element the op fails to write fails the
 * check.  Inputs are rounded to bf16 before the cpu sees them, so only the arithmetic's rounding
 * differs: bf16 outputs must match to about 1e-2 relative (norm-wise, and element-wise against the
 * output's scale), f32 outputs of the optimizer to float rounding.  Several shapes each, odd sizes
 * and padded batches included.  Prints a table of op, shape, errors and GPU time.  A last argument
 * --bench adds the timings of the 4B's GEMMs and attention (and the Qwen3.5 4B's head_dim-256
 * attention), the q/k norm kernels and AdamW; --bench-only runs those timings alone.
 */
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gpupair.h"

/* ---- the ops ------------------------------------------------------------------------------- */

static void t_casts(size_t n)
{
	char sh[64];
	struct buf *s = rnd(F32, n, 3), *d = out(BF, n), *back = out(F32, n);
	uint16_t *g = malloc(n * 2 + 2);
	size_t bad = 0;

	snprintf(sh, sizeof(sh), "n=%zu", n);
	TIMED(gpu->to_compute(gpu, d->g, s->g, n));
	gpu->download(gpu, g, d->g, n * 2);
	for (size_t i = 0; i < n; i++)
		bad += g[i] != f2bf(s->h[i]);
	CHECK(bad == 0, "to_compute: %zu elements not rounded to nearest even", bad);
	printf("%-18s %-28s %-8s %10zu %10s %8.3f  %s\n", "to_compute", sh, "bits", bad, "-", t_ms,
	       bad ? "FAIL" : "ok");
	cpu->to_compute(cpu, d->c, s->c, n);
	cpu->to_f32(cpu, back->c, d->c, n);
	TIMED(gpu->to_f32(gpu, back->g, d->g, n));
	/* cpu round trip is exact; compare against the rounded values */
	for (size_t i = 0; i < n; i++)
		back->h[i] = round_bf(s->h[i]);
	cpu->upload(cpu, back->c, back->h, n * 4);
	cmp("to_f32", sh, "out", back, 0);
	free(g);
	drop(s);
	drop(d);
	drop(back);
}

static void t_add(size_t n)
{
	char sh[64];
	struct buf *y = rnd(BF, n, 1), *x = rnd(BF, n, 1), *yf = rnd(F32, n, 1), *xf = rnd(F32, n, 1);

	snprintf(sh, sizeof(sh), "n=%zu", n);
	cpu->add(cpu, y->c, x->c, n);
	TIMED(gpu->add(gpu, y->g, x->g, n));
	cmp("add", sh, "y", y, TOL);
	cpu->add_f32(cpu, yf->c, xf->c, n);
	TIMED(gpu->add_f32(gpu, yf->g, xf->g, n));
	cmp("add_f32", sh, "y", yf, 1e-7);
	drop(y);
	drop(x);
	drop(yf);
	drop(xf);
}

static void t_embedding(int V, int H, int T)
{
	char sh[64];
	struct buf *tab = rnd(BF, (size_t)V * H, 1), *ids = ints(T, 0, V - 1);
	struct buf *o = out(BF, (size_t)T * H), *g = rnd(BF, (size_t)T * H, 1);
	struct buf *dt = rnd(BF, (size_t)V * H, 1);

	snprintf(sh, sizeof(sh), "V=%d H=%d T=%d", V, H, T);
	cpu->embedding_fwd(cpu, o->c, ids->c, tab->c, T, H);
	TIMED(gpu->embedding_fwd(gpu, o->g, ids->g, tab->g, T, H));
	cmp("embedding_fwd", sh, "out", o, 0);
	cpu->embedding_bwd(cpu, dt->c, ids->c, g->c, T, H);
	TIMED(gpu->embedding_bwd(gpu, dt->g, ids->g, g->g, T, H));
	cmp("embedding_bwd", sh, "dtable", dt, TOL);
	drop(tab);
	drop(ids);
	drop(o);
	drop(g);
	drop(dt);
}

static void t_rmsnorm(int T, int H, bool acc)
{
	char sh[64];
	struct buf *x = rnd(BF, (size_t)T * H, 2), *w = rnd(BF, H, 1), *o = out(BF, (size_t)T * H);
	struct buf *rs = out(STAT, T), *g = rnd(BF, (size_t)T * H, 1);
	struct buf *dx = acc ? rnd(BF, (size_t)T * H, 1) : out(BF, (size_t)T * H);
	struct buf *dw = rnd(BF, H, 1);

	snprintf(sh, sizeof(sh), "T=%d H=%d%s", T, H, acc ? " acc" : "");
	cpu->rmsnorm_fwd(cpu, o->c, rs->c, x->c, w->c, T, H, 1e-6f);
	TIMED(gpu->rmsnorm_fwd(gpu, o->g, rs->g, x->g, w->g, T, H, 1e-6f));
	cmp("rmsnorm_fwd", sh, "out", o, TOL);
	cmp("rmsnorm_fwd", sh, "rstd", rs, 1e-5);
	/* the backward from the cpu's rstd on both sides: it is an input here */
	{
		float *rc = cget(rs);

		gpu->upload(gpu, rs->g, rc, (size_t)T * 4);
		free(rc);
	}
	cpu->rmsnorm_bwd(cpu, dx->c, dw->c, g->c, x->c, w->c, rs->c, T, H, acc);
	TIMED(gpu->rmsnorm_bwd(gpu, dx->g, dw->g, g->g, x->g, w->g, rs->g, T, H, acc));
	cmp("rmsnorm_bwd", sh, "dx", dx, TOL);
	cmp("rmsnorm_bwd", sh, "dw", dw, TOL);
	drop(x);
	drop(w);
	drop(o);
	drop(rs);
	drop(g);
	drop(dx);
	drop(dw);
}

static void t_matmul(int T, int K, int N, bool bias, bool acc)
{
	char sh[64];
	double s = 1 / sqrt(K);
	struct buf *x = rnd(BF, (size_t)T * K, 1), *w = rnd(BF, (size_t)N * K, s);
	struct buf *b = bias ? rnd(BF, N, 1) : NULL, *o = out(BF, (size_t)T * N);
	struct buf *g = rnd(BF, (size_t)T * N, 1);
	struct buf *dx = acc ? rnd(BF, (size_t)T * K, 1) : out(BF, (size_t)T * K);
	struct buf *dw = rnd(BF, (size_t)N * K, 1), *db = bias ? rnd(BF, N, 1) : NULL;

	snprintf(sh, sizeof(sh), "T=%d K=%d N=%d%s%s", T, K, N, bias ? " bias" : "",
		 acc ? " acc" : "");
	cpu->matmul_fwd(cpu, o->c, x->c, w->c, b ? b->c : NULL, T, K, N);
	TIMED(gpu->matmul_fwd(gpu, o->g, x->g, w->g, b ? b->g : NULL, T, K, N));
	cmp("matmul_fwd", sh, "out", o, TOL);
	/* the residual form: out = x w^T + g (g stands for the residual) */
	cpu->matmul_fwd_res(cpu, o->c, x->c, w->c, g->c, T, K, N);
	TIMED(gpu->matmul_fwd_res(gpu, o->g, x->g, w->g, g->g, T, K, N));
	cmp("matmul_fwd_res", sh, "out", o, TOL);
	cpu->matmul_bwd(cpu, dx->c, dw->c, db ? db->c : NULL, g->c, x->c, w->c, T, K, N, acc);
	TIMED(gpu->matmul_bwd(gpu, dx->g, dw->g, db ? db->g : NULL, g->g, x->g, w->g, T, K, N,
			      acc));
	cmp("matmul_bwd", sh, "dx", dx, TOL);
	cmp("matmul_bwd", sh, "dw", dw, TOL);
	if (db)
		cmp("matmul_bwd", sh, "dbias", db, TOL);
	drop(x);
	drop(w);
	drop(o);
	drop(g);
	drop(dx);
	drop(dw);
	if (b) {
		drop(b);
		drop(db);
	}
}

/* a padded batch: B records of lengths lens (the first is L) */
static struct buf *mk_lens(int B, int L)
{
	struct buf *l = mk(I32, B);

	for (int b = 0; b < B; b++)
		l->hi[b] = b == 0 ? L : 1 + (int)(rng_next() % (uint64_t)L);
	if (B > 2)
		l->hi[B - 1] = 1;	/* a one-token record */
	put(l);
	return l;
}

/*
 * Packed rows: positions of documents of random lengths (1 .. L/3 + 1) back to back in each row,
 * up to its length; NULL when @packed is false.
 */
static struct buf *mk_pos(int B, int L, const struct buf *lens, bool packed)
{
	struct buf *p;

	if (!packed)
		return NULL;
	p = mk(I32, (size_t)B * L);
	for (int b = 0; b < B; b++) {
		int start = 0, dlen = 1 + (int)(rng_next() % (uint64_t)(L / 3 + 1));

		for (int i = 0; i < L; i++) {
			if (i - start >= dlen) {
				start = i;
				dlen = 1 + (int)(rng_next() % (uint64_t)(L / 3 + 1));
			}
			p->hi[(size_t)b * L + i] = lens && i >= lens->hi[b] ? 0 : i - start;
		}
	}
	put(p);
	return p;
}

static void t_qk_p(int B, int L, int nh, int nkv, int hd, bool packed);

static void t_qk(int B, int L, int nh, int nkv, int hd)
{
	t_qk_p(B, L, nh, nkv, hd, false);
}

static void t_qk_p(int B, int L, int nh, int nkv, int hd, bool packed)
{
	char sh[64];
	int T = B * L, W = (nh + 2 * nkv) * hd, nq = nh + nkv;
	struct buf *x = rnd(BF, (size_t)T * W, 1), *qw = rnd(BF, hd, 1), *kw = rnd(BF, hd, 1);
	struct buf *o = out(BF, (size_t)T * W), *rs = out(STAT, (size_t)T * nq);
	struct buf *g = rnd(BF, (size_t)T * W, 1), *dx = out(BF, (size_t)T * W);
	struct buf *dq = rnd(BF, hd, 1), *dk = rnd(BF, hd, 1);
	float theta = 1e6f;
	struct buf *pos = mk_pos(B, L, NULL, packed);

	snprintf(sh, sizeof(sh), "T=%dx%d h=%d/%d hd=%d%s", B, L, nh, nkv, hd, packed ? " pk" : "");
	cpu->qk_norm_rope_fwd(cpu, o->c, rs->c, x->c, qw->c, kw->c, T, L, pos ? pos->c : NULL, nh,
			      nkv, hd, 1e-6f, theta);
	TIMED(gpu->qk_norm_rope_fwd(gpu, o->g, rs->g, x->g, qw->g, kw->g, T, L,
				    pos ? pos->g : NULL, nh, nkv, hd, 1e-6f, theta));
	cmp("qk_norm_rope_fwd", sh, "out", o, TOL);
	cmp("qk_norm_rope_fwd", sh, "rstd", rs, 1e-5);
	{
		float *rc = cget(rs);

		gpu->upload(gpu, rs->g, rc, (size_t)T * nq * 4);
		free(rc);
	}
	cpu->qk_norm_rope_bwd(cpu, dx->c, dq->c, dk->c, g->c, x->c, qw->c, kw->c, rs->c, T, L,
			      pos ? pos->c : NULL, nh, nkv, hd, 1e-6f, theta);
	TIMED(gpu->qk_norm_rope_bwd(gpu, dx->g, dq->g, dk->g, g->g, x->g, qw->g, kw->g, rs->g, T, L,
				    pos ? pos->g : NULL, nh, nkv, hd, 1e-6f, theta));
	cmp("qk_norm_rope_bwd", sh, "dqkv", dx, TOL);
	cmp("qk_norm_rope_bwd", sh, "dq_norm_w", dq, TOL);
	cmp("qk_norm_rope_bwd", sh, "dk_norm_w", dk, TOL);
	drop(x);
	drop(qw);
	drop(kw);
	drop(o);
	drop(rs);
	drop(g);
	drop(dx);
	drop(dq);
	drop(dk);
	if (pos)
		drop(pos);
}

static void t_attention_p(int B, int L, int nh, int nkv, int hd, double qs, bool packed);

static void t_attention(int B, int L, int nh, int nkv, int hd, double qs)
{
	t_attention_p(B, L, nh, nkv, hd, qs, false);
}

static void t_attention_p(int B, int L, int nh, int nkv, int hd, double qs, bool packed)
{
	char sh[64];
	int T = B * L, W = (nh + 2 * nkv) * hd;
	struct buf *lens = mk_lens(B, L), *qkv = rnd(BF, (size_t)T * W, qs);
	struct buf *pos = mk_pos(B, L, lens, packed);
	const int32_t *pc = pos ? pos->c : NULL, *pg = pos ? pos->g : NULL;
	struct buf *o = out(BF, (size_t)T * nh * hd), *lse = out(STAT, (size_t)T * nh);
	struct buf *g = rnd(BF, (size_t)T * nh * hd, 1), *d = out(BF, (size_t)T * W);
	double flops = 0;

	for (int b = 0; b < B; b++)
		flops += 2.0 * lens->hi[b] * (lens->hi[b] + 1) * hd * nh;	/* QK^T + PV, causal */
	snprintf(sh, sizeof(sh), "%dx%d h=%d/%d hd=%d%s", B, L, nh, nkv, hd, packed ? " pk" : "");
	cpu->attention_fwd(cpu, o->c, lse->c, qkv->c, lens->c, pc, B, L, nh, nkv, hd);
	TIMED(gpu->attention_fwd(gpu, o->g, lse->g, qkv->g, lens->g, pg, B, L, nh, nkv, hd));
	cmp("attention_fwd", sh, "out", o, TOL);
	cmp("attention_fwd", sh, "lse", lse, 1e-3);
	if (L >= 512)
		printf("  attention_fwd %s: %.2f TFLOP/s\n", sh, flops / t_ms / 1e9);
	/*
	 * The backward from the same inputs on both sides: the cpu's out rounded to bf16 and its
	 * lse.  (From its own forward each side would differ by out's bf16 rounding, which a peaked
	 * softmax amplifies in dout . out - dout . v; test_cuda_model covers that path end to end.)
	 */
	{
		float *oc = cget(o), *lc = cget(lse);

		for (size_t k = 0; k < o->n; k++)
			o->h[k] = round_bf(oc[k]);
		put(o);
		gpu->upload(gpu, lse->g, lc, lse->n * 4);
		free(oc);
		free(lc);
	}
	cpu->attention_bwd(cpu, d->c, g->c, o->c, lse->c, qkv->c, lens->c, pc, B, L, nh, nkv, hd);
	TIMED(gpu->attention_bwd(gpu, d->g, g->g, o->g, lse->g, qkv->g, lens->g, pg, B, L, nh, nkv,
				 hd));
	cmp("attention_bwd", sh, "dqkv", d, 2 * TOL);
	if (L >= 512)
		printf("  attention_bwd %s: %.2f TFLOP/s (2.5x fwd flops)\n", sh,
		       2.5 * flops / t_ms / 1e9);
	drop(lens);
	drop(qkv);
	drop(o);
	drop(lse);
	drop(g);
	drop(d);
	if (pos)
		drop(pos);
}

static void t_swiglu(int T, int I)
{
	char sh[64];
	struct buf *gu = rnd(BF, (size_t)T * 2 * I, 2), *h = out(BF, (size_t)T * I);
	struct buf *dh = rnd(BF, (size_t)T * I, 1), *dgu = out(BF, (size_t)T * 2 * I);

	snprintf(sh, sizeof(sh), "T=%d I=%d", T, I);
	cpu->swiglu_fwd(cpu, h->c, gu->c, T, I);
	TIMED(gpu->swiglu_fwd(gpu, h->g, gu->g, T, I));
	cmp("swiglu_fwd", sh, "h", h, TOL);
	cpu->swiglu_bwd(cpu, dgu->c, dh->c, gu->c, T, I);
	TIMED(gpu->swiglu_bwd(gpu, dgu->g, dh->g, gu->g, T, I));
	cmp("swiglu_bwd", sh, "dgu", dgu, TOL);
	drop(gu);
	drop(h);
	drop(dh);
	drop(dgu);
}

static void t_rows(int R, int n, int H)
{
	char sh[64];
	struct buf *x = rnd(BF, (size_t)R * H, 1), *idx = ints(n, 0, R - 1);
	struct buf *o = out(BF, (size_t)n * H), *dx = rnd(BF, (size_t)R * H, 1);
	struct buf *g = rnd(BF, (size_t)n * H, 1);

	snprintf(sh, sizeof(sh), "R=%d n=%d H=%d", R, n, H);
	cpu->gather_rows(cpu, o->c, x->c, idx->c, n, H);
	TIMED(gpu->gather_rows(gpu, o->g, x->g, idx->g, n, H));
	cmp("gather_rows", sh, "out", o, 0);
	/* scatter: distinct rows (the op's contract), in a random order */
	drop(idx);
	idx = distinct_ints(n, R);
	n = (int)idx->n;
	cpu->scatter_add_rows(cpu, dx->c, g->c, idx->c, n, H);
	TIMED(gpu->scatter_add_rows(gpu, dx->g, g->g, idx->g, n, H));
	cmp("scatter_add_rows", sh, "dx", dx, TOL);
	drop(x);
	drop(idx);
	drop(o);
	drop(dx);
	drop(g);
}

static void t_bce(int n)
{
	char sh[64];
	struct buf *z = rnd(BF, n, 8), *y = mk(F32, n), *dz = out(BF, n);
	double *lg = gpu->alloc(gpu, 8), lc = NAN, lgh = NAN;

	for (int i = 0; i < n; i++)
		y->h[i] = (float)rng_unif();
	put(y);
	snprintf(sh, sizeof(sh), "n=%d", n);
	cpu->bce_fwd_bwd(cpu, &lc, dz->c, z->c, y->c, n, 0.25f);
	TIMED(gpu->bce_fwd_bwd(gpu, lg, dz->g, z->g, y->g, n, 0.25f));
	gpu->download(gpu, &lgh, lg, 8);
	cmp("bce_fwd_bwd", sh, "dlogits", dz, TOL);
	CHECK_CLOSE(lgh, lc, 1e-6, 0);
	printf("%-18s %-28s %-8s %10.2e %10s %8.3f  %s\n", "bce_fwd_bwd", sh, "loss",
	       fabs(lgh - lc) / fabs(lc), "-", t_ms, fabs(lgh - lc) <= 1e-6 * fabs(lc) ? "ok" : "FAIL");
	gpu->free(gpu, lg);
	drop(z);
	drop(y);
	drop(dz);
}

/* the LM head's cross-entropy, in place as the model runs it; loss within 1e-3 (bf16 logits) */
static void t_ce(int n, int V, double s)
{
	char sh[64];
	struct buf *z = rnd(BF, (size_t)n * V, s), *tg = ints(n, 0, V - 1);
	struct buf *rl = out(F32, n);
	double *lg = gpu->alloc(gpu, 8), lc = 0.5, lgh = 0.5;

	gpu->upload(gpu, lg, &lgh, 8);
	snprintf(sh, sizeof(sh), "n=%d V=%d", n, V);
	cpu->ce_fwd_bwd(cpu, &lc, rl->c, z->c, z->c, tg->c, n, V, 0.125f);
	TIMED(gpu->ce_fwd_bwd(gpu, lg, rl->g, z->g, z->g, tg->g, n, V, 0.125f));
	gpu->download(gpu, &lgh, lg, 8);
	cmp("ce_fwd_bwd", sh, "dlogits", z, TOL);
	cmp("ce_fwd_bwd", sh, "row_loss", rl, 1e-3);
	/* += onto what loss_sum held (0.5 on both sides) */
	CHECK_CLOSE(lgh, lc, 1e-4, 0);
	printf("%-18s %-28s %-8s %10.2e %10s %8.3f  %s\n", "ce_fwd_bwd", sh, "loss",
	       fabs(lgh - lc) / fabs(lc), "-", t_ms, fabs(lgh - lc) <= 1e-4 * fabs(lc) ? "ok" : "FAIL");
	gpu->free(gpu, lg);
	drop(z);
	drop(tg);
	drop(rl);
}

/* @k F32: the fp32 ops; BF: sumsq_c and adamw_c on bf16 gradients (one rank's direct
 * gradients, shard.c), against the cpu's fp32 ops on the same (bf16-exact) values */
static void t_sumsq_at(size_t n, enum kind k, size_t off);

static void t_sumsq(size_t n, enum kind k)
{
	t_sumsq_at(n, k, 0);
}

/* @off: the sum of elements [off, n) (a start off the 16-byte vectors for off % 4 or % 8) */
static void t_sumsq_at(size_t n, enum kind k, size_t off)
{
	char sh[64];
	struct buf *g = rnd(k, n, 1);
	double *og = gpu->alloc(gpu, 8), c = NAN, h = NAN;
	const char *op = k == BF ? "sumsq_c" : "sumsq_f32";

	snprintf(sh, sizeof(sh), "n=%zu from %zu", n, off);
	cpu->sumsq_f32(cpu, &c, (float *)g->c + off, n - off);
	if (k == BF)
		TIMED(gpu->sumsq_c(gpu, og, (uint16_t *)g->g + off, n - off));
	else
		TIMED(gpu->sumsq_f32(gpu, og, (float *)g->g + off, n - off));
	gpu->download(gpu, &h, og, 8);
	CHECK_CLOSE(h, c, 1e-12, 0);
	printf("%-18s %-28s %-8s %10.2e %10s %8.3f  %s\n", op, sh, "sum",
	       fabs(h - c) / c, "-", t_ms, fabs(h - c) <= 1e-12 * c ? "ok" : "FAIL");
	gpu->free(gpu, og);
	drop(g);
}

/* AdamW on elements [off, n) of each buffer (the first off untouched on both sides): off % 4
 * != 0 takes the one-element kernel, else the 16-byte one (its last n % 4 elements alone).
 * gate: 0 none, 1 a finite one (the update runs), 2 a NaN one (nothing written, on both sides;
 * the cpu's p checked against its start too) */
static void t_adamw_g(size_t n, bool wout, enum kind k, size_t off, int gate)
{
	double hg = gate == 2 ? NAN : 3.5, *dg = NULL;
	char sh[64];
	struct buf *p = rnd(F32, n, 1), *m = rnd(F32, n, 0.1), *v = mk(F32, n);
	struct buf *gr = rnd(k, n, 1), *wo = wout ? out(BF, n) : NULL;
	struct sl_adamw_args a = { .lr = 3e-4f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f,
				   .weight_decay = 0.1f, .bc1 = 1 - powf(0.9f, 7),
				   .bc2 = 1 - powf(0.95f, 7), .grad_scale = 0.7f };
	const char *op = k == BF ? "adamw_c" : "adamw_f32";
	const size_t es = k == BF ? 2 : 4, r = n - off;

	for (size_t i = 0; i < n; i++)
		v->h[i] = (float)(0.01 * rng_unif());
	put(v);
	snprintf(sh, sizeof(sh), "n=%zu%s from %zu%s", n, wout ? " w_out" : "", off,
		 gate == 2 ? " gate NaN" : gate ? " gate" : "");
	if (gate) {
		dg = gpu->alloc(gpu, sizeof(double));
		gpu->upload(gpu, dg, &hg, sizeof(double));
	}
	if (wo && (off || gate == 2)) {	/* what is not written stays: 0 on both sides */
		for (size_t i = 0; i < (gate == 2 ? n : off); i++)
			wo->h[i] = 0;
		put(wo);
	}
	a.gate = gate ? &hg : NULL;
	cpu->adamw_f32(cpu, (float *)p->c + off, (float *)m->c + off, (float *)v->c + off,
		       (float *)gr->c + off, wo ? (float *)wo->c + off : NULL, r, &a);
	a.gate = dg;
	if (k == BF)
		TIMED(gpu->adamw_c(gpu, (float *)p->g + off, (float *)m->g + off,
				   (float *)v->g + off, (char *)gr->g + off * es,
				   wo ? (char *)wo->g + off * 2 : NULL, r, &a));
	else
		TIMED(gpu->adamw_f32(gpu, (float *)p->g + off, (float *)m->g + off,
				     (float *)v->g + off, (float *)gr->g + off,
				     wo ? (char *)wo->g + off * 2 : NULL, r, &a));
	cmp(op, sh, "p", p, 1e-7);
	cmp(op, sh, "m", m, 1e-7);
	cmp(op, sh, "v", v, 1e-7);
	if (wo)
		cmp(op, sh, "w_out", wo, 4e-3);
	if (gate == 2) {
		float *c = cget(p);
		size_t moved = 0;

		for (size_t i = 0; i < n; i++)
			moved += c[i] != p->h[i];
		CHECK(moved == 0, "%s %s: %zu elements of p written on the cpu", op, sh, moved);
		free(c);
	}
	if (dg)
		gpu->free(gpu, dg);
	drop(p);
	drop(m);
	drop(v);
	drop(gr);
	if (wo)
		drop(wo);
}

static void t_adamw_at(size_t n, bool wout, enum kind k, size_t off)
{
	t_adamw_g(n, wout, k, off, 0);
}

static void t_adamw(size_t n, bool wout, enum kind k)
{
	t_adamw_at(n, wout, k, 0);
}

/* a 4B-like matmul and attention shape, timed (no cpu reference: too slow there) */
#include "cuda_moe_ops.inc"
/* the Qwen3.5-MoE shared expert's gate */
#include "cuda_q35moe_ops.inc"
/* context parallel: the rank's queries against whole rows' keys */
#include "cuda_cp_ops.inc"

static void bench(void)
{
	const int T = 8192, H = 2560, Q = (32 + 16) * 128, I = 9728;
	size_t big = (size_t)T * 2 * I;
	void *x = gpu->alloc(gpu, (size_t)T * I * 2), *w = gpu->alloc(gpu, (size_t)2 * I * H * 2);
	void *o = gpu->alloc(gpu, big * 2);
	float *f = gpu->alloc(gpu, big * 4);
	struct { const char *name; int K, N; } mm[] = {
		{ "qkv", H, Q }, { "o_proj", 32 * 128, H }, { "gate_up", H, 2 * I }, { "down", I, H },
	};

	/* random, non-zero operands: the rounding of N(0,1) floats */
	for (int r = 0; r < 2; r++) {
		uint16_t *hbuf = malloc(big * 2);

		for (size_t i = 0; i < big; i++)
			hbuf[i] = f2bf((float)(rng_normal() * 0.05));
		gpu->upload(gpu, r ? o : x, hbuf, (r ? big : (size_t)T * I) * 2);
		gpu->upload(gpu, w, hbuf, (size_t)2 * I * H * 2);
		free(hbuf);
	}
	double gemm_ms = 0, attn_ms = 0;

	printf("\nbench (4B shape, T = %d tokens):\n", T);
	for (size_t k = 0; k < sizeof(mm) / sizeof(mm[0]); k++) {
		double fl = 2.0 * T * mm[k].K * mm[k].N, ms;

		/* warm-up: the first call of a shape queries cuBLASLt's heuristic */
		gpu->matmul_fwd(gpu, o, x, w, NULL, T, mm[k].K, mm[k].N);
		gpu->matmul_bwd(gpu, x, w, NULL, o, x, w, T, mm[k].K, mm[k].N, false);
		TIMED(for (int i = 0; i < 10; i++)
			      gpu->matmul_fwd(gpu, o, x, w, NULL, T, mm[k].K, mm[k].N));
		ms = t_ms / 10;
		gemm_ms += ms;
		printf("  matmul_fwd %-8s T=%d K=%d N=%d: %.3f ms, %.0f TFLOP/s\n", mm[k].name, T,
		       mm[k].K, mm[k].N, ms, fl / ms / 1e9);
		TIMED(for (int i = 0; i < 5; i++)
			      gpu->matmul_bwd(gpu, x, w, NULL, o, x, w, T, mm[k].K, mm[k].N, false));
		ms = t_ms / 5;
		gemm_ms += ms;
		printf("  matmul_bwd %-8s (dx + dw): %.3f ms, %.0f TFLOP/s\n", mm[k].name, ms,
		       2 * fl / ms / 1e9);
	}
	/* attention, 4 records of 2048: the 4B's 32 heads, 8 kv heads, hd 128; then the Qwen3.5 4B
	 * gated attention's 16 heads, 4 kv heads, hd 256; then issue 8's Qwen3-MoE, 2 records of
	 * 4096, 32 heads, 4 kv heads, hd 128 (the same tokens: the buffers fit) */
	for (int s = 0; s < 3; s++) {
		const int Bs[3] = { 4, 4, 2 }, Ls[3] = { 2048, 2048, 4096 }, nhs[3] = { 32, 16, 32 };
		const int nkvs[3] = { 8, 4, 4 }, hds[3] = { 128, 256, 128 };
		int B = Bs[s], L = Ls[s], nh = nhs[s], nkv = nkvs[s], hd = hds[s];
		int W = (nh + 2 * nkv) * hd;
		int32_t hl[4] = { L, L, L, L };
		int32_t *lens = gpu->alloc(gpu, sizeof(hl));
		void *qkv = o, *att = x, *dq = (char *)o + (size_t)B * L * W * 2;
		double fl = 4.0 * B * ((double)L * (L + 1) / 2) * hd * nh, ms, ams = 0;

		gpu->upload(gpu, lens, hl, sizeof(hl));
		gpu->attention_fwd(gpu, att, f, qkv, lens, NULL, B, L, nh, nkv, hd);
		TIMED(for (int i = 0; i < 5; i++)
			      gpu->attention_fwd(gpu, att, f, qkv, lens, NULL, B, L, nh, nkv, hd));
		ms = t_ms / 5;
		ams += ms;
		printf("  attention_fwd %dx%d h=%d/%d hd=%d: %.2f ms, %.1f TFLOP/s\n", B, L, nh, nkv,
		       hd, ms, fl / ms / 1e9);
		gpu->attention_bwd(gpu, dq, att, att, f, qkv, lens, NULL, B, L, nh, nkv, hd);
		TIMED(for (int i = 0; i < 5; i++)
			      gpu->attention_bwd(gpu, dq, att, att, f, qkv, lens, NULL, B, L, nh, nkv, hd));
		ms = t_ms / 5;
		ams += ms;
		printf("  attention_bwd %dx%d h=%d/%d hd=%d: %.2f ms, %.1f TFLOP/s (2.5x fwd)\n", B,
		       L, nh, nkv, hd, ms, 2.5 * fl / ms / 1e9);
		gpu->free(gpu, lens);
		if (s)
			continue;
		attn_ms = ams;
		/* one decoder layer's GEMM and attention time, forward + backward, and x36 layers */
		printf("  per layer (fwd+bwd, %d tokens): gemm %.2f ms, attention %.2f ms; "
		       "36 layers: gemm %.0f ms, attention %.0f ms\n", T, gemm_ms, attn_ms,
		       36 * gemm_ms, 36 * attn_ms);
	}
	/* the 4B layer's q/k RMSNorm + rotary (32 q, 8 k, 8 v heads of 128), forward and backward
	 * (the backward with the norm weights' gradients); bytes moved: forward reads and writes
	 * the qkv rows, the backward reads them and dout and writes dqkv */
	{
		const int L = 2048, nh = 32, nkv = 8, hd = 128, W = (nh + 2 * nkv) * hd;
		const double mb = (double)T * W * 2 / 1e6;
		void *qkv = o, *dout = (char *)o + (size_t)T * W * 2, *qw = w;
		void *kw = (char *)w + hd * 2, *dqw = (char *)f + ((size_t)64 << 20);
		void *dkw = (char *)dqw + hd * 4;
		double ms;

		gpu->qk_norm_rope_fwd(gpu, x, f, qkv, qw, kw, T, L, NULL, nh, nkv, hd, 1e-6f, 1e6f);
		TIMED(for (int i = 0; i < 10; i++)
			      gpu->qk_norm_rope_fwd(gpu, x, f, qkv, qw, kw, T, L, NULL, nh, nkv, hd,
						    1e-6f, 1e6f));
		ms = t_ms / 10;
		printf("  qk_norm_rope_fwd 4x2048 h=%d/%d hd=%d: %.3f ms, %.0f GB/s\n", nh, nkv, hd, ms,
		       2 * mb / ms);
		gpu->qk_norm_rope_bwd(gpu, x, dqw, dkw, dout, qkv, qw, kw, f, T, L, NULL, nh, nkv, hd,
				      1e-6f, 1e6f);
		TIMED(for (int i = 0; i < 10; i++)
			      gpu->qk_norm_rope_bwd(gpu, x, dqw, dkw, dout, qkv, qw, kw, f, T, L, NULL,
						    nh, nkv, hd, 1e-6f, 1e6f));
		ms = t_ms / 10;
		printf("  qk_norm_rope_bwd 4x2048 h=%d/%d hd=%d: %.3f ms, %.0f GB/s\n", nh, nkv, hd, ms,
		       3 * mb / ms);
	}
	/* the 4B layer's RMSNorm backward (accumulating into dx, with the weight gradient); bytes
	 * moved: dout, x and dx read, dx written */
	{
		void *g = o, *xx = (char *)o + (size_t)T * H * 2, *dx = x, *nw = w;
		void *dw = (char *)f + ((size_t)64 << 20);
		float *rs = f;
		const double mb = (double)T * H * 2 / 1e6;
		double ms;

		gpu->rmsnorm_fwd(gpu, (char *)o + (size_t)2 * T * H * 2, rs, xx, nw, T, H, 1e-6f);
		gpu->rmsnorm_bwd(gpu, dx, dw, g, xx, nw, rs, T, H, true);
		TIMED(for (int i = 0; i < 10; i++)
			      gpu->rmsnorm_bwd(gpu, dx, dw, g, xx, nw, rs, T, H, true));
		ms = t_ms / 10;
		printf("  rmsnorm_bwd 4x2048 H=%d (accumulating, with dw): %.3f ms, %.0f GB/s\n", H,
		       ms, 4 * mb / ms);
	}
	bench_moe();
	/* the causal-LM head's cross-entropy on one chunk of logits as the Qwen3-MoE step has them
	 * (816 rows of Qwen3's 151,936, in place); bytes: the rows read twice and written once */
	{
		const int n = 816, V = 151936;
		int32_t *tg = malloc(n * 4), *dt = gpu->alloc(gpu, n * 4);
		double *ls = gpu->alloc(gpu, 8), ms;
		float *rl = gpu->alloc(gpu, n * 4);

		for (int i = 0; i < n; i++)
			tg[i] = (int32_t)(rng_next() % V);
		gpu->upload(gpu, dt, tg, n * 4);
		gpu->ce_fwd_bwd(gpu, ls, rl, o, o, dt, n, V, 0.125f);
		TIMED(for (int i = 0; i < 5; i++) gpu->ce_fwd_bwd(gpu, ls, rl, o, o, dt, n, V, 0.125f));
		ms = t_ms / 5;
		printf("  ce_fwd_bwd %d x %d in place: %.3f ms, %.0f GB/s (3 passes)\n", n, V, ms,
		       3.0 * n * V * 2 / ms / 1e6);
		gpu->free(gpu, dt);
		gpu->free(gpu, ls);
		gpu->free(gpu, rl);
		free(tg);
	}
	/* AdamW on 64M parameters with bf16 gradients and the bf16 copy (28 bytes a parameter),
	 * from an aligned start (16-byte kernel) and one element in (one-element kernel) */
	{
		const size_t n = (size_t)64 << 20;
		float *pm = gpu->alloc(gpu, 3 * (n + 4) * 4), *hb = malloc((n + 4) * 4);
		void *gb = gpu->alloc(gpu, (n + 4) * 2), *wo = gpu->alloc(gpu, (n + 4) * 2);
		struct sl_adamw_args a = { .lr = 3e-4f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f,
					   .weight_decay = 0.1f, .bc1 = 0.5f, .bc2 = 0.3f,
					   .grad_scale = 0.7f };

		for (size_t i = 0; i < n + 4; i++)
			hb[i] = (float)(0.01 * rng_unif());
		for (int b = 0; b < 3; b++)
			gpu->upload(gpu, pm + b * (n + 4), hb, (n + 4) * 4);
		for (size_t i = 0; i < n + 4; i++)	/* the gradients: bf16 of the same values */
			((uint16_t *)hb)[i] = f2bf(hb[i] - 0.005f);
		gpu->upload(gpu, gb, hb, (n + 4) * 2);
		free(hb);
		for (int o1 = 0; o1 < 2; o1++) {
			float *p = pm + o1, *m = pm + (n + 4) + o1, *v = pm + 2 * (n + 4) + o1;
			void *g = (char *)gb + 2 * o1, *wq = (char *)wo + 2 * o1;
			double ms;

			gpu->adamw_c(gpu, p, m, v, g, wq, n, &a);
			TIMED(for (int i = 0; i < 5; i++) gpu->adamw_c(gpu, p, m, v, g, wq, n, &a));
			ms = t_ms / 5;
			printf("  adamw_c 64M bf16 grads + bf16 copy, start +%d: %.3f ms, %.0f GB/s\n",
			       o1, ms, 28.0 * n / ms / 1e6);
		}
		{	/* the bandwidth a plain copy gets: the ceiling for AdamW's mix of reads and
			 * writes (half and half) */
			const size_t cb = 3 * (n + 4) * 4;
			void *dst = gpu->alloc(gpu, cb);

			cudaError_t err = cudaMemcpy(dst, pm, cb, cudaMemcpyDeviceToDevice);

			TIMED(for (int i = 0; i < 5; i++)
				      cudaMemcpyAsync(dst, pm, cb, cudaMemcpyDeviceToDevice, 0);
			      if (err == cudaSuccess) err = cudaDeviceSynchronize());
			if (err != cudaSuccess)
				printf("  device copy: %s\n", cudaGetErrorString(err));
			else
				printf("  device copy %.0f MB: %.3f ms, %.0f GB/s (read + write)\n",
				       cb / 1e6, t_ms / 5, 2.0 * cb / (t_ms / 5) / 1e6);
			gpu->free(gpu, dst);
		}
		gpu->free(gpu, pm);
		gpu->free(gpu, gb);
		gpu->free(gpu, wo);
	}
	gpu->free(gpu, x);
	gpu->free(gpu, w);
	gpu->free(gpu, o);
	gpu->free(gpu, f);
}

int main(int argc, char **argv)
{
	uint64_t seed = argc > 1 && strncmp(argv[1], "--bench", 7) ? strtoull(argv[1], NULL, 0) :
			(uint64_t)time(NULL) ^ ((uint64_t)clock() << 32);
	bool do_bench = argc > 1 && !strcmp(argv[argc - 1], "--bench");
	bool bench_only = argc > 1 && !strcmp(argv[argc - 1], "--bench-only");

	rng_state = seed ? seed : 1;
	printf("test_cuda_ops: seed %llu\n", (unsigned long long)seed);
	cpu = sl_backend_cpu_create();
	gpu = sl_backend_cuda_create(0);
	if (!cpu || !gpu) {
		fprintf(stderr, "test_cuda_ops: no %s backend\n", cpu ? "cuda" : "cpu");
		return 77;
	}
	printf("%-18s %-28s %-8s %10s %10s %8s\n", "op", "shape", "output", "rel.err", "max/scale",
	       "gpu ms");

	if (bench_only) {	/* the timings alone */
		bench();
		goto out;
	}
	t_casts(1);
	t_casts(100003);
	t_add(1);
	t_add(77777);
	t_embedding(37, 70, 50);
	t_embedding(1000, 2100, 300);
	t_embedding(5, 64, 1000);	/* heavy repeats */
	t_rmsnorm(1, 12, false);
	t_rmsnorm(7, 33, true);
	t_rmsnorm(130, 1000, false);
	t_rmsnorm(512, 2560, true);
	/* more rows than the staged backward's blocks: each walks several (its stages wrap) */
	t_rmsnorm(3000, 2048, true);
	t_rmsnorm(2500, 1024, false);
	t_matmul(5, 12, 1, false, false);
	t_matmul(37, 64, 96, true, false);
	t_matmul(33, 70, 46, true, true);
	t_matmul(256, 512, 384, false, true);
	t_qk(2, 9, 4, 2, 8);
	t_qk(3, 17, 4, 2, 16);
	t_qk(2, 40, 8, 2, 64);
	t_qk(2, 33, 4, 4, 128);
	t_qk(1, 20, 2, 1, 256);
	/* more tokens than the staged kernels' blocks: each walks several */
	t_qk(4, 1024, 8, 2, 128);
	t_qk(2, 1500, 4, 1, 64);
	t_attention(3, 9, 4, 2, 8, 1);
	t_attention(4, 37, 4, 2, 16, 1);
	t_attention(3, 70, 8, 2, 64, 1);
	t_attention(3, 150, 4, 1, 128, 1);
	t_attention(2, 100, 4, 4, 128, 3);	/* peaked softmax */
	t_attention(2, 45, 2, 1, 256, 1);
	t_attention(2, 300, 4, 2, 256, 1);	/* several tiles, hd 256 (the Qwen3.5 gated attention) */
	t_attention(2, 40, 3, 3, 6, 1);		/* hd not a power of 2 */
	t_attention(2, 600, 8, 2, 128, 1);
	t_attention(2, 333, 6, 2, 64, 2);	/* several key and query tiles, hd 64 */
	/* peaked over eleven key tiles: a row's max passes the forward's reference by more than
	 * 2^8 on some tiles (O rescaled) and by less on others (the reference kept) */
	t_attention(2, 700, 4, 2, 128, 2.5);
	/* packed rows (documents back to back): both paths, tiles that start mid-document */
	t_qk_p(2, 40, 4, 2, 64, true);
	t_qk_p(4, 700, 4, 2, 128, true);
	t_attention_p(3, 70, 4, 2, 16, 1, true);
	t_attention_p(2, 45, 2, 1, 256, 1, true);
	t_attention_p(2, 300, 4, 2, 256, 1, true);	/* hd 256 blocks of 128 queries, packed */
	t_attention_p(2, 300, 8, 2, 128, 1, true);
	t_attention_p(2, 333, 6, 2, 64, 2, true);
	t_swiglu(7, 13);
	t_swiglu(64, 1000);
	t_rows(50, 5, 70);
	t_rows(9, 20, 300);	/* repeated indices (gather) */
	t_rows(9, 20, 24);	/* repeated indices, rows of 16-byte vectors */
	t_rows(40, 30, 33);	/* odd H */
	t_rows(4096, 4095, 2048);	/* the sft head's targets */
	t_bce(1);
	t_bce(5);
	t_bce(300);
	t_ce(3, 37, 2);		/* V not a multiple of 8: the scalar path */
	t_ce(17, 1000, 4);
	t_ce(64, 151936, 3);	/* Qwen3's vocabulary */
	t_sumsq(1, F32);
	t_sumsq(1000, F32);
	t_sumsq(3000001, F32);
	t_sumsq(1000, BF);
	t_sumsq(3000001, BF);
	/* vector loads: an odd number of passes, a partial last vector, starts off the vectors */
	t_sumsq(3 * 512 * 256 * 8 + 13, BF);
	t_sumsq(3 * 512 * 256 * 4 + 3, F32);
	t_sumsq_at(1000003, BF, 3);
	t_sumsq_at(1000003, F32, 1);
	t_sumsq_at(20, BF, 5);
	t_adamw(1, true, F32);
	t_adamw(1000, false, F32);
	t_adamw(100001, true, F32);
	t_adamw(1000, false, BF);
	t_adamw(100001, true, BF);
	/* the 16-byte kernel with 3 elements after its vectors and a start 4 elements in; the
	 * one-element kernel from starts off the vectors */
	t_adamw(7, true, BF);
	t_adamw_at(100003, true, BF, 4);
	t_adamw_at(100003, true, F32, 4);
	t_adamw_at(1003, true, BF, 1);
	t_adamw_at(1003, false, F32, 2);
	/* a gate (the updates issued in the backward): finite runs the update, NaN writes nothing */
	t_adamw_g(100003, true, BF, 0, 1);
	t_adamw_g(100003, true, BF, 0, 2);
	t_adamw_g(1003, true, F32, 1, 2);
	t_moe_all();
	t_q35moe_all();
	t_cp_all();
	if (do_bench)
		bench();
out:
	printf("peak %zu bytes, reserved %zu\n", sl_backend_cuda_peak_bytes(gpu),
	       sl_backend_cuda_reserved_bytes(gpu));
	gpu->destroy(gpu);
	cpu->destroy(cpu);
	return test_exit("test_cuda_ops");
}
