/*
 * test_gdn_chunk: the chunked gated delta rule's math (gdn_chunk_ref.h, the algorithm of
 * cuda/gdn_chunk.cu written out on the host in double) against the cpu64 backend's plain
 * recurrence (backend_cpu_gdn.c), forward and backward, on random inputs: records shorter than
 * a chunk, ending on a chunk boundary, crossing chunks, padded, empty; L not a multiple of 64;
 * several value heads per key head; strong and weak decays.  In double both ways, so the two
 * must agree to rounding (1e-9 relative): any slip in the chunked derivation shows.  Then
 * gdn_chunk.cuh's kernels themselves, emulated on the host, on bf16 inputs; where dv <= dk also
 * the gradient kernel's 64 x 64 part alone, given the sums over the value columns that the
 * GPU-only k_gdn_grad_v makes (made here in double from the same inputs) and followed by
 * k_gdn_grad_k's dq, dk (likewise): the algebra of that split, in CI.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "testutil.h"
#include "gdn_chunk_ref.h"
#include "gdn_chunk_emu.h"

static uint64_t rng = 12345;

static double runif(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return ((rng >> 11) + 0.5) / 9007199254740992.0;
}

static double rnorm(void)
{
	return sqrt(-2 * log(runif())) * cos(2 * M_PI * runif());
}

static double *vec(size_t n)
{
	return calloc(n ? n : 1, sizeof(double));
}

/* rows of d scaled to norm s (as gdn_prep_fwd's l2-normalized q and k) */
static double *unit_rows(size_t rows, int d, double s)
{
	double *x = vec(rows * d);

	for (size_t r = 0; r < rows; r++) {
		double ss = 0;

		for (int i = 0; i < d; i++) {
			x[r * d + i] = rnorm();
			ss += x[r * d + i] * x[r * d + i];
		}
		for (int i = 0; i < d; i++)
			x[r * d + i] *= s / sqrt(ss);
	}
	return x;
}

/* relative error of n values (norm-wise), every one finite */
static double relerr(const double *a, const double *want, size_t n)
{
	double num = 0, den = 0;

	for (size_t i = 0; i < n; i++) {
		if (!isfinite(a[i]))
			return INFINITY;
		num += (a[i] - want[i]) * (a[i] - want[i]);
		den += want[i] * want[i];
	}
	return den > 0 ? sqrt(num / den) : sqrt(num);
}

static void run(struct sl_backend *be, int B, int L, const int32_t *lens, int nk, int nv, int dk,
		int dv, double gmin)
{
	int T = B * L, vs = nv * dv + 3, nch = (L + RC - 1) / RC;
	size_t NS = (size_t)B * nch * nv * dk * dv, NV = (size_t)T * vs;
	double *q = unit_rows((size_t)T * nk, dk, 1 / sqrt(dk));
	double *k = unit_rows((size_t)T * nk, dk, 1);
	double *v = vec(NV), *beta = vec((size_t)T * nv), *g = vec((size_t)T * nv);
	double *dout = vec((size_t)T * nv * dv);
	double *o[2] = { vec((size_t)T * nv * dv), vec((size_t)T * nv * dv) };
	double *st[2] = { vec(NS), vec(NS) }, *dst = vec(NS);
	double *dq[2] = { vec((size_t)T * nk * dk), vec((size_t)T * nk * dk) };
	double *dk_[2] = { vec((size_t)T * nk * dk), vec((size_t)T * nk * dk) };
	double *dval[2] = { vec(NV), vec(NV) };
	double *db[2] = { vec((size_t)T * nv), vec((size_t)T * nv) };
	double *dg[2] = { vec((size_t)T * nv), vec((size_t)T * nv) };
	double e[7];
	char sh[96];

	for (size_t i = 0; i < NV; i++)
		v[i] = rnorm();
	for (size_t i = 0; i < (size_t)T * nv; i++) {
		beta[i] = runif();
		g[i] = gmin * runif();
	}
	for (size_t i = 0; i < (size_t)T * nv * dv; i++)
		dout[i] = rnorm();
	be->gdn_rule_fwd(be, o[0], st[0], q, k, v, vs, beta, g, lens, B, L, L, nk, nv, dk, dv, NULL,
			 NULL);
	be->gdn_rule_bwd(be, dq[0], dk_[0], dval[0], db[0], dg[0], dout, st[0], q, k, v, vs, beta,
			 g, lens, B, L, L, nk, nv, dk, dv, NULL, NULL);
	ref_fwd(o[1], st[1], q, k, v, vs, beta, g, lens, B, L, nk, nv, dk, dv);
	ref_bwd_states(dst, dout, q, k, v, vs, beta, g, lens, B, L, nk, nv, dk, dv);
	ref_bwd_grads(dq[1], dk_[1], dval[1], db[1], dg[1], dout, st[1], dst, q, k, v, vs, beta, g,
		      lens, B, L, nk, nv, dk, dv);
	e[0] = relerr(o[1], o[0], (size_t)T * nv * dv);
	e[1] = relerr(st[1], st[0], NS);
	e[2] = relerr(dq[1], dq[0], (size_t)T * nk * dk);
	e[3] = relerr(dk_[1], dk_[0], (size_t)T * nk * dk);
	e[4] = relerr(dval[1], dval[0], NV);
	e[5] = relerr(db[1], db[0], (size_t)T * nv);
	e[6] = relerr(dg[1], dg[0], (size_t)T * nv);
	snprintf(sh, sizeof(sh), "B=%d L=%d k=%dx%d v=%dx%d g>=%g", B, L, nk, dk, nv, dv, gmin);
	printf("%-40s o %.1e st %.1e dq %.1e dk %.1e dv %.1e db %.1e dg %.1e\n", sh, e[0], e[1],
	       e[2], e[3], e[4], e[5], e[6]);
	for (int i = 0; i < 7; i++)
		CHECK(e[i] < 1e-9, "%s: output %d: relative error %g", sh, i, e[i]);
	free(q), free(k), free(v), free(beta), free(g), free(dout), free(dst);
	for (int i = 0; i < 2; i++) {
		free(o[i]), free(st[i]), free(dq[i]), free(dk_[i]), free(dval[i]), free(db[i]);
		free(dg[i]);
	}
}

/* ---- the CUDA kernels themselves, emulated (gdn_chunk_emu.h) ------------------------------ */

static struct {
	bf16 *o, *q, *k, *v, *dout, *dq, *dk, *dv, *db, *dg;
	float *states, *dst, *acc, *beta, *g, *scr, *slots, *gslots, *aux, *gaux, *aux3, *gv;
	int *lens;
	int vs, L, nk, nv, dk_, dv_, first, grp;
} E;

static void body_fwd(void)
{
	k_gdn_fwd(E.o, E.states, E.aux, E.q, E.k, E.v, E.vs, E.beta, E.g, E.lens, E.L, E.nk, E.nv,
		  E.dk_, E.dv_);
}

static void body_prep(void)
{
	k_gdn_prep(E.scr, E.q, E.k, E.v, E.vs, NULL, E.beta, E.g, E.lens, E.L, E.nk, E.nv, E.dk_,
		   E.dv_, 0);
}

static void body_prep_b(void)
{
	k_gdn_prep(E.slots, E.q, E.k, E.v, E.vs, E.dout, E.beta, E.g, E.lens, E.L, E.nk, E.nv,
		   E.dk_, E.dv_, E.first * E.grp);
}

static void body_bwd_h(void)
{
	k_gdn_bwd_h(E.dst, E.slots, E.dout, E.q, E.k, E.lens, E.L, E.nk, E.nv, E.dk_, E.dv_,
		    E.first);
}

static void body_fwd_h(void)
{
	k_gdn_fwd_h(E.states, E.scr, E.aux3, E.k, E.lens, E.L, E.nk, E.nv, E.dk_, E.dv_);
}

static void body_fwd_o(void)
{
	k_gdn_fwd_o(E.o, E.states, E.scr, E.aux3, E.q, E.lens, E.L, E.nk, E.nv, E.dk_, E.dv_);
}

static void body_state(void)
{
	k_gdn_bwd_state(E.dst, E.dout, E.q, E.k, E.beta, E.g, E.lens, E.L, E.nk, E.nv, E.dk_,
			E.dv_, E.first);
}

static void body_grad(void)	/* slots: k_gdn_prep's, or NULL (tc_local); gaux: the forward's */
{
	k_gdn_bwd_grad(E.dq, E.dk, E.dv, E.db, E.dg, E.dout, E.states, E.gaux, E.dst, E.acc,
		       E.gslots,
		       E.q, E.k, E.v, E.vs, E.beta, E.g, E.lens, E.L, E.nk, E.nv, E.dk_, E.dv_,
		       E.first, E.gv);
}

/*
 * What k_gdn_grad_v (cuda/gdn_grad.cuh, GPU only) leaves k_gdn_bwd_grad, made here in double
 * from the wave's slots, dS, the saved states and the forward's tiles: per (value head, chunk)
 * dW = -dD S0^T, dP = dO delta^T, dT = dD V^T and the rows' sums (all in half 0's share), the
 * key head's dq, dk sums over its value heads (diag(Ga) dO S0^T, diag(e) delta dS^T) in acc,
 * and dv = diag(beta) T^T dD; dD = X + diag(e) KD from the slot (k_gdn_bwd_h's KD).
 */
static void host_grad_v(int ng)
{
	const int L = E.L, nk = E.nk, nv = E.nv, dk = E.dk_, dv = E.dv_, grp = E.grp;
	const int nch = (L + RC - 1) / RC;
	const size_t SS = (size_t)dk * dv;
	double *dD = vec((size_t)RC * dv);

	for (int gi = 0; gi < ng; gi++)
		for (int ch = 0; ch < nch; ch++) {
			int bk = E.first + gi, b = bk / nk, kh = bk % nk, c0 = ch * RC;
			int n = chunk_n(E.lens[b], c0);
			size_t t0 = (size_t)b * L + c0;
			float *aq = E.acc + ((size_t)gi * nch + ch) * 2 * RC * dk, *ak = aq + RC * dk;

			if (!n)
				continue;
			for (int x = 0; x < 2 * RC * dk; x++)
				aq[x] = 0.f;
			for (int hg = 0; hg < grp; hg++) {
				int h = kh * grp + hg;
				size_t slot = ((size_t)gi * grp + hg) * nch + ch;
				struct fslot f = fslot_at(E.slots, slot, dk, dv, 1);
				const float *S0 = E.states + (((size_t)b * nch + ch) * nv + h) * SS;
				const float *dS = E.dst + slot * SS;
				const float *de = E.aux + AUX_HEAD +
						  (((size_t)b * nch + ch) * nv + h) * 2 * RC * dv;
				const float *qs = de + (size_t)RC * dv;
				float *gs = E.gv + slot * gv_floats(dk), *dP = gs + (size_t)RC * dk;
				float *dT = dP + RC * RC, *vc = dT + RC * RC;
				double sd = 0, Ga[RC], e[RC], bt[RC];

#define DO(r, j) ((r) < n ? (double)bf(E.dout[(t0 + (r)) * nv * dv + (size_t)h * dv + (j)]) : 0)
#define VV(r, j) ((r) < n ? (double)bf(E.v[(t0 + (r)) * E.vs + (size_t)h * dv + (j)]) : 0)
				for (int r = 0; r < RC; r++) {
					Ga[r] = exp(f.G[r]);
					e[r] = exp(f.G[RC - 1] - f.G[r]);
					bt[r] = r < n ? E.beta[(t0 + r) * nv + h] : 0;
					for (int j = 0; j < dv; j++)
						dD[r * dv + j] = f.U[r * dv + j] + e[r] * f.W[r * dv + j];
				}
				for (size_t x = 0; x < SS; x++)
					sd += (double)S0[x] * dS[x];
				for (int r = 0; r < RC; r++) {
					double qz = 0, d = 0, xv = 0;

					for (int i = 0; i < dk; i++) {
						double w = 0, y1 = 0, y2 = 0;

						for (int j = 0; j < dv; j++) {
							w += dD[r * dv + j] * S0[i * dv + j];
							y1 += DO(r, j) * S0[i * dv + j];
							y2 += de[r * dv + j] * dS[i * dv + j];
						}
						gs[r * dk + i] = (float)-w;
						aq[r * dk + i] += (float)(Ga[r] * y1);
						ak[r * dk + i] += (float)(e[r] * y2);
					}
					for (int s2 = 0; s2 < RC; s2++) {
						double p = 0, t = 0;

						for (int j = 0; j < dv; j++) {
							p += DO(r, j) * de[s2 * dv + j];
							t += dD[r * dv + j] * VV(s2, j);
						}
						dP[r * RC + s2] = (float)p;
						dT[r * RC + s2] = (float)t;
					}
					for (int j = 0; j < dv; j++) {
						double x = 0;

						for (int s2 = 0; s2 < RC; s2++)
							x += f.T[s2 * RC + r] * dD[s2 * dv + j];
						qz += qs[r * dv + j] * DO(r, j);
						d += f.W[r * dv + j] * de[r * dv + j];
						xv += x * VV(r, j);
						if (c0 + r < L)
							E.dv[(t0 + r) * E.vs + (size_t)h * dv + j] =
								tobf((float)(bt[r] * x));
					}
					vc[r] = (float)qz, vc[RC + r] = (float)(d * e[r]);
					vc[2 * RC + r] = (float)xv;
					vc[4 * RC + r] = vc[5 * RC + r] = vc[6 * RC + r] = 0.f;
				}
				vc[3 * RC] = (float)sd, vc[7 * RC] = 0.f;
#undef DO
#undef VV
			}
		}
	free(dD);
}

/*
 * What k_gdn_grad_k (GPU only) makes after k_gdn_bwd_grad: dq = acc's + M K, dk = acc's + M^T Q
 * + (D + D^T) K + diag(beta Ga) T^T dW per value head, M and D + D^T from gv, out as bf16
 */
static void host_grad_k(int ng)
{
	const int L = E.L, nk = E.nk, nv = E.nv, dk = E.dk_, dv = E.dv_, grp = E.grp;
	const int nch = (L + RC - 1) / RC;

	for (int gi = 0; gi < ng; gi++)
		for (int ch = 0; ch < nch; ch++) {
			int bk = E.first + gi, b = bk / nk, kh = bk % nk, c0 = ch * RC;
			int n = chunk_n(E.lens[b], c0);
			size_t t0 = (size_t)b * L + c0;
			const float *aq = E.acc + ((size_t)gi * nch + ch) * 2 * RC * dk;

			if (!n)
				continue;
			for (int r = 0; r < RC && c0 + r < L; r++)
				for (int i = 0; i < dk; i++) {
					size_t o = (t0 + r) * nk * dk + (size_t)kh * dk + i;
					double q = aq[r * dk + i], k = aq[(RC + r) * dk + i];

#define KK(s) ((s) < n ? (double)bf(E.k[(t0 + (s)) * nk * dk + (size_t)kh * dk + i]) : 0)
#define QQ(s) ((s) < n ? (double)bf(E.q[(t0 + (s)) * nk * dk + (size_t)kh * dk + i]) : 0)
					for (int hg = 0; hg < grp; hg++) {
						int h = kh * grp + hg;
						size_t slot = ((size_t)gi * grp + hg) * nch + ch;
						struct fslot f = fslot_at(E.slots, slot, dk, dv, 1);
						const float *gs = E.gv + slot * gv_floats(dk);
						const float *M = gs + (size_t)RC * dk, *D = M + RC * RC;
						double bg = r < n ? E.beta[(t0 + r) * nv + h] *
								    exp(f.G[r]) : 0;

						for (int s2 = 0; s2 < RC; s2++) {
							q += M[r * RC + s2] * KK(s2);
							k += M[s2 * RC + r] * QQ(s2) +
							     D[r * RC + s2] * KK(s2) +
							     bg * f.T[s2 * RC + r] * gs[s2 * dk + i];
						}
					}
#undef KK
#undef QQ
					E.dq[o] = tobf(r < n ? (float)q : 0.f);
					E.dk[o] = tobf(r < n ? (float)k : 0.f);
				}
		}
}

static bf16 *to_bf(double *x, size_t n)	/* x rounded to bf16 in place, and as bf16 */
{
	bf16 *b = malloc(n * sizeof(bf16) + 2);

	for (size_t i = 0; i < n; i++) {
		b[i] = tobf((float)x[i]);
		x[i] = bf(b[i]);
	}
	return b;
}

static float *to_f(double *x, size_t n)
{
	float *f = malloc(n * 4 + 4);

	for (size_t i = 0; i < n; i++) {
		f[i] = (float)x[i];
		x[i] = f[i];
	}
	return f;
}

/*
 * bf16 (or float) results against the double reference: norm-relative over the first w of
 * every s values (the rest must hold what they held: 7), every value finite
 */
static double emu_err(const void *got, bool isbf, const double *want, size_t n, size_t w,
		      size_t s)
{
	double num = 0, den = 0;

	for (size_t i = 0; i < n; i++) {
		double x = isbf ? bf(((const bf16 *)got)[i]) : ((const float *)got)[i];

		if (i % s >= w) {
			if (x != 7)
				return INFINITY;
			continue;
		}

		if (!isfinite(x))
			return INFINITY;
		num += (x - want[i]) * (x - want[i]);
		den += want[i] * want[i];
	}
	return den > 0 ? sqrt(num / den) : sqrt(num);
}

/*
 * The three-pass forward's tiles for the backward (a) against the one-kernel forward's (b): the
 * same chunks written (NaN where neither wrote), norm-relative elsewhere
 */
static double aux_err(const float *a, const float *b, size_t n)
{
	double num = 0, den = 0;

	for (size_t i = 0; i < n; i++) {
		if (isnan(a[i]) != isnan(b[i]))
			return INFINITY;
		if (isnan(a[i]))
			continue;
		num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
		den += (double)b[i] * b[i];
	}
	return den > 0 ? sqrt(num / den) : sqrt(num);
}

/*
 * The kernels on bf16 inputs against cpu64 on the same (rounded) values; the backward in waves
 * of @per_wave (record, key head) groups, as sl_cuda_gdn_chunk_bwd runs them when the scratch is
 * short.  Outputs start as NaN: whatever a kernel leaves unwritten fails.
 */
static void run_emu(struct sl_backend *be, int B, int L, const int32_t *lens, int nk, int nv,
		    int dk, int dv, double gmin, int per_wave)
{
	int T = B * L, vs = nv * dv + 3, nch = (L + RC - 1) / RC, grp = nv / nk;
	size_t NS = (size_t)B * nch * nv * dk * dv, NV = (size_t)T * vs, NO = (size_t)T * nv * dv;
	size_t NQ = (size_t)T * nk * dk, NB = (size_t)T * nv;
	double *q = unit_rows((size_t)T * nk, dk, 1 / sqrt(dk));
	double *k = unit_rows((size_t)T * nk, dk, 1);
	double *v = vec(NV), *beta = vec(NB), *g = vec(NB), *dout = vec(NO), *o = vec(NO);
	double *st = vec(NS), *dq = vec(NQ), *dk_ = vec(NQ), *dval = vec(NV), *db = vec(NB);
	double *dg = vec(NB), e[20];
	char sh[96];

	for (size_t i = 0; i < NV; i++)
		v[i] = rnorm();
	for (size_t i = 0; i < NB; i++) {
		beta[i] = runif();
		g[i] = gmin * runif();
	}
	for (size_t i = 0; i < NO; i++)
		dout[i] = rnorm();
	E.q = to_bf(q, NQ), E.k = to_bf(k, NQ), E.v = to_bf(v, NV), E.dout = to_bf(dout, NO);
	E.beta = to_f(beta, NB), E.g = to_f(g, NB);
	E.lens = (int *)lens;
	E.vs = vs, E.L = L, E.nk = nk, E.nv = nv, E.dk_ = dk, E.dv_ = dv;
	E.o = malloc(NO * 2), E.dq = malloc(NQ * 2), E.dk = malloc(NQ * 2);
	E.dv = malloc(NV * 2), E.db = malloc(NB * 2), E.dg = malloc(NB * 2);
	E.states = malloc(NS * 4);
	/* k_gdn_fwd's tiles for the backward (NaN until written), the flag clear until it sets it */
	E.aux = malloc(aux_floats((size_t)B * nch, nv, dv) * 4);
	memset(E.aux, 0xff, aux_floats((size_t)B * nch, nv, dv) * 4);
	memset(E.aux, 0, sizeof(int));
	E.dst = malloc(bwd_scratch_floats(per_wave, grp, nch, dk, dv) * 4);
	E.acc = E.dst + (size_t)per_wave * grp * nch * dk * dv;
	memset(E.o, 0xff, NO * 2), memset(E.dq, 0xff, NQ * 2), memset(E.dk, 0xff, NQ * 2);
	memset(E.db, 0xff, NB * 2), memset(E.dg, 0xff, NB * 2), memset(E.states, 0xff, NS * 4);
	for (size_t i = 0; i < NV; i++)		/* past the value columns: must stay untouched */
		E.dv[i] = i % vs < (size_t)nv * dv ? tobf(NAN) : tobf(7.f);
	be->gdn_rule_fwd(be, o, st, q, k, v, vs, beta, g, lens, B, L, L, nk, nv, dk, dv, NULL, NULL);
	be->gdn_rule_bwd(be, dq, dk_, dval, db, dg, dout, st, q, k, v, vs, beta, g, lens, B, L, L,
			 nk, nv, dk, dv, NULL, NULL);
	CHECK(fwd_smem(dk, dv) <= EMU_SM * 4 && state_smem(dk, dv) <= EMU_SM * 4 &&
	      gq_smem(dk) <= EMU_SM * 4, "shared memory of dk=%d within the H200's", dk);
	emu_launch(B * nv, fwd_smem(dk, dv), body_fwd);
	CHECK(*(int *)E.aux, "emu B=%d L=%d: k_gdn_fwd left the flag of its tiles clear", B, L);
	for (int first = 0; first < B * nk; first += per_wave) {
		int ng = B * nk - first < per_wave ? B * nk - first : per_wave;

		E.first = first;
		memset(E.dst, 0xff, bwd_scratch_floats(per_wave, grp, nch, dk, dv) * 4);
		emu_launch(ng * grp, state_smem(dk, dv), body_state);
		emu_launch(ng * nch, gq_smem(dk), body_grad);
	}
	e[0] = emu_err(E.o, true, o, NO, NO, NO);
	e[1] = emu_err(E.states, false, st, NS, NS, NS);
	e[2] = emu_err(E.dq, true, dq, NQ, NQ, NQ);
	e[3] = emu_err(E.dk, true, dk_, NQ, NQ, NQ);
	e[4] = emu_err(E.dv, true, dval, NV, (size_t)nv * dv, vs);
	e[5] = emu_err(E.db, true, db, NB, NB, NB);
	e[6] = emu_err(E.dg, true, dg, NB, NB, NB);
	/* the forward in three passes (k_gdn_prep, _fwd_h, _fwd_o), into fresh outputs, its tiles
	 * for the backward too (held to the one-kernel forward's) */
	E.aux3 = malloc(aux_floats((size_t)B * nch, nv, dv) * 4);
	memset(E.aux3, 0xff, aux_floats((size_t)B * nch, nv, dv) * 4);
	memset(E.aux3, 0, sizeof(int));
	E.scr = malloc((size_t)B * nv * nch * fslot_floats(dk, dv, 0) * 4);
	memset(E.scr, 0xff, (size_t)B * nv * nch * fslot_floats(dk, dv, 0) * 4);
	memset(E.o, 0xff, NO * 2), memset(E.states, 0xff, NS * 4);
	CHECK(prep_smem(dk, dv) <= EMU_SM * 4 && fwd_h_smem(dk, dv) <= EMU_SM * 4 &&
	      fwd_o_smem(dk, dv) <= EMU_SM * 4, "split forward's shared memory within the H200's");
	emu_launch(B * nv * nch, prep_smem(dk, dv), body_prep);
	emu_launch(B * nv, fwd_h_smem(dk, dv), body_fwd_h);
	emu_launch(B * nv * nch, fwd_o_smem(dk, dv), body_fwd_o);
	e[7] = emu_err(E.o, true, o, NO, NO, NO);
	e[8] = emu_err(E.states, false, st, NS, NS, NS);
	CHECK(*(int *)E.aux3, "emu B=%d L=%d: k_gdn_fwd_o left the flag of its tiles clear", B, L);
	e[14] = aux_err(E.aux3 + AUX_HEAD, E.aux + AUX_HEAD, aux_floats((size_t)B * nch, nv, dv) -
							      AUX_HEAD);
	/* the backward's state pass in two (k_gdn_prep with dO, k_gdn_bwd_h), into fresh outputs,
	 * the gradient kernel with the one-kernel forward's delta and diag(Ga) Q S0 (the defaults;
	 * the fused walk above made them itself) */
	memset(E.dq, 0xff, NQ * 2), memset(E.dk, 0xff, NQ * 2);
	memset(E.db, 0xff, NB * 2), memset(E.dg, 0xff, NB * 2);
	for (size_t i = 0; i < NV; i++)
		E.dv[i] = i % vs < (size_t)nv * dv ? tobf(NAN) : tobf(7.f);
	E.grp = grp;
	CHECK(bwd_h_smem(dk, dv) <= EMU_SM * 4, "bwd_h's shared memory within the H200's");
	for (int first = 0; first < B * nk; first += per_wave) {
		int ng = B * nk - first < per_wave ? B * nk - first : per_wave;

		E.first = first;
		memset(E.dst, 0xff, bwd_scratch_floats(per_wave, grp, nch, dk, dv) * 4);
		E.slots = E.dst + bwd_slots(per_wave, grp, nch, dk, dv);
		emu_launch(ng * grp * nch, prep_smem(dk, dv), body_prep_b);
		emu_launch(ng * grp, bwd_h_smem(dk, dv), body_bwd_h);
		E.gslots = E.slots, E.gaux = E.aux;
		emu_launch(ng * nch, gq_smem(dk), body_grad);
		E.gslots = NULL, E.gaux = NULL;
	}
	e[9] = emu_err(E.dq, true, dq, NQ, NQ, NQ);
	e[10] = emu_err(E.dk, true, dk_, NQ, NQ, NQ);
	e[11] = emu_err(E.dv, true, dval, NV, (size_t)nv * dv, vs);
	e[12] = emu_err(E.db, true, db, NB, NB, NB);
	e[13] = emu_err(E.dg, true, dg, NB, NB, NB);
	/* dv <= dk: the gradient kernel given k_gdn_grad_v's sums (gv; made here, as is
	 * k_gdn_grad_k's dq, dk after it), its 64 x 64 part alone */
	for (int i = 15; i < 20; i++)
		e[i] = 0;
	if (dv <= dk) {
		memset(E.dq, 0xff, NQ * 2), memset(E.dk, 0xff, NQ * 2);
		memset(E.db, 0xff, NB * 2), memset(E.dg, 0xff, NB * 2);
		for (size_t i = 0; i < NV; i++)
			E.dv[i] = i % vs < (size_t)nv * dv ? tobf(NAN) : tobf(7.f);
		for (int first = 0; first < B * nk; first += per_wave) {
			int ng = B * nk - first < per_wave ? B * nk - first : per_wave;

			E.first = first;
			memset(E.dst, 0xff, bwd_scratch_floats(per_wave, grp, nch, dk, dv) * 4);
			E.slots = E.dst + bwd_slots(per_wave, grp, nch, dk, dv);
			E.gv = E.dst + bwd_gv(per_wave, grp, nch, dk, dv);
			emu_launch(ng * grp * nch, prep_smem(dk, dv), body_prep_b);
			emu_launch(ng * grp, bwd_h_smem(dk, dv), body_bwd_h);
			host_grad_v(ng);
			E.gslots = E.slots, E.gaux = E.aux;
			emu_launch(ng * nch, gq_smem(dk), body_grad);
			host_grad_k(ng);
			E.gslots = NULL, E.gaux = NULL, E.gv = NULL;
		}
		e[15] = emu_err(E.dq, true, dq, NQ, NQ, NQ);
		e[16] = emu_err(E.dk, true, dk_, NQ, NQ, NQ);
		e[17] = emu_err(E.dv, true, dval, NV, (size_t)nv * dv, vs);
		e[18] = emu_err(E.db, true, db, NB, NB, NB);
		e[19] = emu_err(E.dg, true, dg, NB, NB, NB);
	}
	snprintf(sh, sizeof(sh), "emu B=%d L=%d k=%dx%d v=%dx%d w=%d", B, L, nk, dk, nv, dv,
		 per_wave);
	printf("%-40s o %.1e st %.1e dq %.1e dk %.1e dv %.1e db %.1e dg %.1e\n", sh, e[0], e[1],
	       e[2], e[3], e[4], e[5], e[6]);
	printf("%-40s o %.1e st %.1e dq %.1e dk %.1e dv %.1e db %.1e dg %.1e tiles %.1e\n",
	       "  (split passes)", e[7], e[8], e[9], e[10], e[11], e[12], e[13], e[14]);
	if (dv <= dk)
		printf("%-40s dq %.1e dk %.1e dv %.1e db %.1e dg %.1e\n",
		       "  (the 64 x 64 part alone)", e[15], e[16], e[17], e[18], e[19]);
	/* bf16 outputs: ~2^-9 rounding, fp32 sums; states and tiles fp32 throughout */
	for (int i = 0; i < 20; i++)
		CHECK(e[i] < (i == 1 || i == 8 || i == 14 ? 1e-4 : 1e-2),
		      "%s: output %d: relative error %g", sh, i, e[i]);
	CHECK(!emu_divergent, "%s: %ld rounds with a barrier skipped by some threads", sh,
	      emu_divergent);
	CHECK(!emu_overrun, "%s: %ld blocks wrote past their shared memory", sh, emu_overrun);
	free(q), free(k), free(v), free(beta), free(g), free(dout), free(o), free(st), free(dq);
	free(dk_), free(dval), free(db), free(dg);
	free(E.q), free(E.k), free(E.v), free(E.dout), free(E.beta), free(E.g), free(E.o);
	free(E.dq), free(E.dk), free(E.dv), free(E.db), free(E.dg), free(E.states), free(E.dst);
	free(E.scr), free(E.aux), free(E.aux3);
}

int main(int argc, char **argv)
{
	struct sl_backend *be = sl_backend_cpu64_create();
	int32_t l1[2] = { 9, 4 }, l2[3] = { 150, 64, 0 }, l3[2] = { 128, 65 };
	int32_t l4[3] = { 200, 1, 63 }, l5[2] = { 150, 64 };
	int32_t l6[2] = { 100, 37 }, l7[2] = { 130, 70 };

	CHECK(be && be->gdn_rule_fwd, "cpu64 backend with the Qwen3.5 ops");
	if (!be || !be->gdn_rule_fwd)
		return test_exit("test_gdn_chunk");
	run(be, 2, 9, l1, 1, 2, 4, 3, -0.5);		/* shorter than a chunk */
	run(be, 3, 150, l2, 2, 4, 16, 24, -0.5);	/* crossing, on a boundary, empty */
	run(be, 2, 128, l3, 1, 3, 8, 5, -4);		/* strong decay: Ga underflows far */
	run(be, 3, 200, l4, 2, 4, 32, 32, -0.05);	/* weak decay: T far from I */
	/* the kernels themselves (slow: a block's 256 threads take turns at every barrier) */
	run_emu(be, 2, 9, l1, 1, 2, 4, 3, -0.5, 2);
	run_emu(be, 2, 150, l5, 1, 2, 24, 72, -0.5, 1);	/* two waves, two value quarters */
	run_emu(be, 2, 130, l7, 2, 6, 16, 24, -0.5, 3);	/* 3 heads a key head, a part wave */
	/* weak decay over four chunks: the end state's gradient reaches back (Ga_last <S0, dS>
	 * in dg is not lost in the decay), and a quarter of 40 value columns */
	run_emu(be, 1, 200, l4, 1, 2, 16, 40, -0.05, 1);
	/* dv <= dk over two value quarters: k_gdn_bwd_h's K dS taken by the gradient kernel */
	run_emu(be, 1, 130, l7, 1, 2, 80, 72, -0.5, 1);
	/* dv <= dk with correlated keys (dk 8) and weak decay: T far from I, so that the 64 x 64
	 * part's terms through T (dbeta's (T o U) row sums) weigh */
	run_emu(be, 1, 130, l7, 1, 2, 8, 8, -0.05, 1);
	if (argc > 1 && !strcmp(argv[1], "full"))	/* the Qwen3.5 head dims (a minute) */
		run_emu(be, 2, 100, l6, 1, 2, 128, 128, -0.5, 1);
	emu_free();
	be->destroy(be);
	return test_exit("test_gdn_chunk");
}
