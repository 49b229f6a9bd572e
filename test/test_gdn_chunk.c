/*
 * test_gdn_chunk: the chunked gated delta rule's math (gdn_chunk_ref.h, the algorithm of
 * cuda/gdn_chunk.cu written out on the host in double) against the cpu64 backend's plain
 * recurrence (backend_cpu_gdn.c), forward and backward, on random inputs: records shorter than
 * a chunk, ending on a chunk boundary, crossing chunks, padded, empty; L not a multiple of 64;
 * several value heads per key head; strong and weak decays.  In double both ways, so the two
 * must agree to rounding (1e-9 relative): any slip in the chunked derivation shows.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "testutil.h"
#include "gdn_chunk_ref.h"

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
	double *q = unit_rows((size_t)T * nk, dk, 1 / sqrt(dk)), *k = unit_rows((size_t)T * nk, dk, 1);
	double *v = vec(NV), *beta = vec((size_t)T * nv), *g = vec((size_t)T * nv);
	double *dout = vec((size_t)T * nv * dv);
	double *o[2] = { vec((size_t)T * nv * dv), vec((size_t)T * nv * dv) };
	double *st[2] = { vec(NS), vec(NS) }, *dst = vec(NS);
	double *dq[2] = { vec((size_t)T * nk * dk), vec((size_t)T * nk * dk) };
	double *dk_[2] = { vec((size_t)T * nk * dk), vec((size_t)T * nk * dk) };
	double *dval[2] = { vec(NV), vec(NV) }, *db[2] = { vec((size_t)T * nv), vec((size_t)T * nv) };
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
	be->gdn_rule_fwd(be, o[0], st[0], q, k, v, vs, beta, g, lens, B, L, nk, nv, dk, dv);
	be->gdn_rule_bwd(be, dq[0], dk_[0], dval[0], db[0], dg[0], dout, st[0], q, k, v, vs, beta,
			 g, lens, B, L, nk, nv, dk, dv);
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

int main(void)
{
	struct sl_backend *be = sl_backend_cpu64_create();
	int32_t l1[2] = { 9, 4 }, l2[3] = { 150, 64, 0 }, l3[2] = { 128, 65 };
	int32_t l4[3] = { 200, 1, 63 };

	CHECK(be && be->gdn_rule_fwd, "cpu64 backend with the Qwen3.5 ops");
	if (!be || !be->gdn_rule_fwd)
		return test_exit("test_gdn_chunk");
	run(be, 2, 9, l1, 1, 2, 4, 3, -0.5);		/* shorter than a chunk */
	run(be, 3, 150, l2, 2, 4, 16, 24, -0.5);	/* crossing, on a boundary, empty */
	run(be, 2, 128, l3, 1, 3, 8, 5, -4);		/* strong decay: Ga underflows far */
	run(be, 3, 200, l4, 2, 4, 32, 32, -0.05);	/* weak decay: T far from I */
	be->destroy(be);
	return test_exit("test_gdn_chunk");
}
