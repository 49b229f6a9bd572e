/*
 * test_backend_cpu: ops of the fp32 cpu backend against naive double loops written here from the
 * op definitions in backend.h (matmul, RMSNorm, q/k norm + rotary, causal GQA attention with
 * padding, SwiGLU, embedding scatter, BCE, AdamW as torch writes it, sum of squares).  Gradients
 * of the differentiable ops are covered by test_gradcheck.
 */
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "testutil.h"

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;

static double rnd(void)
{
	rng_state ^= rng_state << 13;
	rng_state ^= rng_state >> 7;
	rng_state ^= rng_state << 17;
	return ((rng_state >> 11) + 0.5) / 9007199254740992.0 * 2 - 1;
}

static float *rand_f(size_t n, double amp)
{
	float *p = malloc(n * sizeof(float));

	for (size_t i = 0; i < n; i++)
		p[i] = (float)(amp * rnd());
	return p;
}

static void close_all(const char *what, const float *got, const double *want, size_t n,
		      double tol)
{
	double worst = 0, floor = 1e-30;

	/* relative, with a floor at 1% of the largest value so that cancellation is not punished */
	for (size_t i = 0; i < n; i++)
		floor = fmax(floor, 1e-2 * fabs(want[i]));
	for (size_t i = 0; i < n; i++) {
		double d = fabs(got[i] - want[i]) / (fabs(want[i]) + floor);

		if (d > worst)
			worst = d;
	}
	CHECK(worst <= tol, "%s: worst relative error %.3g > %.3g", what, worst, tol);
}

static void test_matmul(struct sl_backend *be, int T, int K, int N)
{
	float *x = rand_f(T * K, 1), *w = rand_f(N * K, 1), *bias = rand_f(N, 1);
	float *out = malloc(T * N * sizeof(float)), *g = rand_f(T * N, 1);
	float *dx = calloc(T * K, sizeof(float)), *dw = calloc(N * K, sizeof(float));
	float *db = calloc(N, sizeof(float));
	double *ref = calloc(T * N, sizeof(double)), *rdx = calloc(T * K, sizeof(double));
	double *rdw = calloc(N * K, sizeof(double)), *rdb = calloc(N, sizeof(double));

	be->matmul_fwd(be, out, x, w, bias, T, K, N);
	for (int t = 0; t < T; t++)
		for (int n = 0; n < N; n++) {
			ref[t * N + n] = bias[n];
			for (int k = 0; k < K; k++)
				ref[t * N + n] += (double)x[t * K + k] * w[n * K + k];
		}
	close_all("matmul_fwd", out, ref, T * N, 1e-4);

	/* with a residual instead of the bias: the product plus g, in a naive double sum */
	be->matmul_fwd_res(be, out, x, w, g, T, K, N);
	for (int t = 0; t < T; t++)
		for (int n = 0; n < N; n++) {
			ref[t * N + n] = g[t * N + n];
			for (int k = 0; k < K; k++)
				ref[t * N + n] += (double)x[t * K + k] * w[n * K + k];
		}
	close_all("matmul_fwd_res", out, ref, T * N, 1e-4);

	/* accumulate into dx = 1, dw and db start at 0 */
	for (int i = 0; i < T * K; i++)
		dx[i] = 1;
	be->matmul_bwd(be, dx, dw, db, g, x, w, T, K, N, true);
	for (int t = 0; t < T; t++)
		for (int k = 0; k < K; k++) {
			rdx[t * K + k] = 1;
			for (int n = 0; n < N; n++)
				rdx[t * K + k] += (double)g[t * N + n] * w[n * K + k];
		}
	for (int n = 0; n < N; n++) {
		for (int t = 0; t < T; t++)
			rdb[n] += g[t * N + n];
		for (int k = 0; k < K; k++)
			for (int t = 0; t < T; t++)
				rdw[n * K + k] += (double)g[t * N + n] * x[t * K + k];
	}
	close_all("matmul_bwd dx", dx, rdx, T * K, 1e-4);
	close_all("matmul_bwd dw", dw, rdw, N * K, 1e-4);
	close_all("matmul_bwd db", db, rdb, N, 1e-4);
	free(x); free(w); free(bias); free(out); free(g); free(dx); free(dw); free(db);
	free(ref); free(rdx); free(rdw); free(rdb);
}

static void test_rmsnorm(struct sl_backend *be)
{
	const int T = 5, H = 33;
	float *x = rand_f(T * H, 2), *w = rand_f(H, 1), *out = malloc(T * H * sizeof(float));
	float rstd[5];
	double ref[5 * 33];

	be->rmsnorm_fwd(be, out, rstd, x, w, T, H, 1e-6f);
	for (int t = 0; t < T; t++) {
		double ss = 0;

		for (int j = 0; j < H; j++)
			ss += (double)x[t * H + j] * x[t * H + j];
		for (int j = 0; j < H; j++)
			ref[t * H + j] = x[t * H + j] / sqrt(ss / H + 1e-6) * w[j];
	}
	close_all("rmsnorm_fwd", out, ref, T * H, 1e-6);
	free(x); free(w); free(out);
}

/* q/k norm + rotary (rotate_half) and then attention, both against the definitions */
static void test_attention(struct sl_backend *be)
{
	enum { B = 3, L = 9, NH = 4, NKV = 2, HD = 8, W = (NH + 2 * NKV) * HD };
	const int T = B * L, lens[B] = { 9, 4, 1 };
	const float theta = 10000, eps = 1e-6f;
	float *qkv = rand_f(T * W, 1), *qn = rand_f(HD, 1), *kn = rand_f(HD, 1);
	float *r = malloc(T * W * sizeof(float)), *rstd = malloc(T * (NH + NKV) * sizeof(float));
	float *out = malloc(T * NH * HD * sizeof(float)), *lse = malloc(T * NH * sizeof(float));
	double *rr = calloc(T * W, sizeof(double)), *ro = calloc(T * NH * HD, sizeof(double));

	be->qk_norm_rope_fwd(be, r, rstd, qkv, qn, kn, T, L, NULL, NH, NKV, HD, eps, theta);
	for (int t = 0; t < T; t++) {
		int pos = t % L;

		for (int j = 0; j < NH + NKV; j++) {
			const float *x = qkv + t * W + j * HD, *w = j < NH ? qn : kn;
			double n[HD], ss = 0;

			for (int i = 0; i < HD; i++)
				ss += (double)x[i] * x[i];
			for (int i = 0; i < HD; i++)
				n[i] = x[i] / sqrt(ss / HD + eps) * w[i];
			for (int i = 0; i < HD; i++) {
				int f = i % (HD / 2);
				double ang = pos / pow(theta, 2.0 * f / HD);
				double rot = i < HD / 2 ? -n[i + HD / 2] : n[i - HD / 2];

				rr[t * W + j * HD + i] = n[i] * cos(ang) + rot * sin(ang);
			}
		}
		for (int i = (NH + NKV) * HD; i < W; i++)
			rr[t * W + i] = qkv[t * W + i];
	}
	close_all("qk_norm_rope_fwd", r, rr, T * W, 1e-5);

	be->attention_fwd(be, out, lse, r, lens, NULL, B, L, NH, NKV, HD);
	for (int b = 0; b < B; b++)
		for (int h = 0; h < NH; h++)
			for (int i = 0; i < lens[b]; i++) {
				const float *q = r + (b * L + i) * W + h * HD;
				double s[L], mx = -1e300, z = 0;
				int kv = h / (NH / NKV);

				for (int j = 0; j < L; j++) {
					const float *k = r + (b * L + j) * W + (NH + kv) * HD;

					s[j] = -1e300;
					if (j > i || j >= lens[b])
						continue;
					s[j] = 0;
					for (int e = 0; e < HD; e++)
						s[j] += (double)q[e] * k[e] / sqrt(HD);
					mx = fmax(mx, s[j]);
				}
				for (int j = 0; j <= i; j++)
					z += exp(s[j] - mx);
				for (int j = 0; j <= i; j++) {
					const float *v = r + (b * L + j) * W + (NH + NKV + kv) * HD;

					for (int e = 0; e < HD; e++)
						ro[(b * L + i) * NH * HD + h * HD + e] +=
							exp(s[j] - mx) / z * v[e];
				}
				CHECK_CLOSE(lse[(b * L + i) * NH + h], mx + log(z), 1e-5, 1e-5);
			}
	/* padded rows stay 0 in the reference */
	close_all("attention_fwd", out, ro, T * NH * HD, 1e-5);
	free(qkv); free(qn); free(kn); free(r); free(rstd); free(out); free(lse); free(rr);
	free(ro);
}

/*
 * Packed rows: one row of three documents (5, 4 and 2 tokens, then a padded slot) gives, for
 * rotary, attention and both backwards, what the same documents give as three records of their
 * own (the unpacked path, checked against the definitions above).
 */
static void test_packed(struct sl_backend *be)
{
	enum { NH = 4, NKV = 2, HD = 8, W = (NH + 2 * NKV) * HD, NQ = NH + NKV, LP = 12, LU = 5 };
	const int dl[3] = { 5, 4, 2 }, lp[1] = { 11 }, lu[3] = { 5, 4, 2 };
	int32_t pos[LP];
	const float theta = 1000, eps = 1e-6f;
	float *x = rand_f(LP * W, 1), *qn = rand_f(HD, 1), *kn = rand_f(HD, 1);
	float *g = rand_f(LP * NH * HD, 1), *gr = rand_f(LP * W, 1);
	float *xu = calloc(3 * LU * W, 4), *gu = calloc(3 * LU * NH * HD, 4);
	float *gru = calloc(3 * LU * W, 4);
	float *rp = malloc(LP * W * 4), *ru = malloc(3 * LU * W * 4);
	float *sp = malloc(LP * NQ * 4), *su = malloc(3 * LU * NQ * 4);
	float *op = malloc(LP * NH * HD * 4), *ou = malloc(3 * LU * NH * HD * 4);
	float *lp_ = malloc(LP * NH * 4), *lu_ = malloc(3 * LU * NH * 4);
	float *dp = malloc(LP * W * 4), *du = malloc(3 * LU * W * 4);
	float *xp = malloc(LP * W * 4), *xuu = malloc(3 * LU * W * 4);
	float dqp[HD] = { 0 }, dkp[HD] = { 0 }, dqu[HD] = { 0 }, dku[HD] = { 0 };
	int t = 0, bad = 0;

	for (int d = 0; d < 3; d++)
		for (int i = 0; i < dl[d]; i++, t++) {
			pos[t] = i;
			memcpy(xu + (d * LU + i) * W, x + t * W, W * 4);
			memcpy(gu + (d * LU + i) * NH * HD, g + t * NH * HD, NH * HD * 4);
			memcpy(gru + (d * LU + i) * W, gr + t * W, W * 4);
		}
	pos[t] = 0;	/* the padded slot: no gradient reaches it (as in the model) */
	memset(gr + t * W, 0, W * 4);
	be->qk_norm_rope_fwd(be, rp, sp, x, qn, kn, LP, LP, pos, NH, NKV, HD, eps, theta);
	be->qk_norm_rope_fwd(be, ru, su, xu, qn, kn, 3 * LU, LU, NULL, NH, NKV, HD, eps, theta);
	be->attention_fwd(be, op, lp_, rp, lp, pos, 1, LP, NH, NKV, HD);
	be->attention_fwd(be, ou, lu_, ru, lu, NULL, 3, LU, NH, NKV, HD);
	be->attention_bwd(be, dp, g, op, lp_, rp, lp, pos, 1, LP, NH, NKV, HD);
	be->attention_bwd(be, du, gu, ou, lu_, ru, lu, NULL, 3, LU, NH, NKV, HD);
	be->qk_norm_rope_bwd(be, xp, dqp, dkp, gr, x, qn, kn, sp, LP, LP, pos, NH, NKV, HD, eps,
			     theta);
	be->qk_norm_rope_bwd(be, xuu, dqu, dku, gru, xu, qn, kn, su, 3 * LU, LU, NULL, NH, NKV, HD,
			     eps, theta);
	t = 0;
	for (int d = 0; d < 3; d++)
		for (int i = 0; i < dl[d]; i++, t++) {
			size_t u = (size_t)d * LU + i;

			for (int e = 0; e < W; e++) {
				bad += fabsf(rp[t * W + e] - ru[u * W + e]) > 1e-6f;
				bad += fabsf(dp[t * W + e] - du[u * W + e]) > 1e-5f;
				bad += fabsf(xp[t * W + e] - xuu[u * W + e]) > 1e-5f;
			}
			for (int e = 0; e < NH * HD; e++)
				bad += fabsf(op[t * NH * HD + e] - ou[u * NH * HD + e]) > 1e-6f;
			for (int e = 0; e < NH; e++)
				bad += fabsf(lp_[t * NH + e] - lu_[u * NH + e]) > 1e-6f;
		}
	for (int e = 0; e < HD; e++) {
		bad += fabsf(dqp[e] - dqu[e]) > 1e-4f * (1 + fabsf(dqu[e])) ||
		       fabsf(dkp[e] - dku[e]) > 1e-4f * (1 + fabsf(dku[e]));
	}
	CHECK(bad == 0, "packed row differs from separate records in %d values", bad);
	free(x); free(qn); free(kn); free(g); free(gr); free(xu); free(gu); free(gru); free(rp);
	free(ru); free(sp); free(su); free(op); free(ou); free(lp_); free(lu_); free(dp); free(du);
	free(xp); free(xuu);
}

static void test_misc(struct sl_backend *be)
{
	const int T = 6, I = 7, H = 5, V = 4;
	float *gu = rand_f(T * 2 * I, 3), *h = malloc(T * I * sizeof(float));
	double ref[6 * 7];
	int32_t ids[6] = { 1, 3, 1, 1, 0, 3 };
	float *g = rand_f(T * H, 1), *tab = calloc(V * H, sizeof(float));
	double rtab[4 * 5] = { 0 };
	float z[4] = { -30, -0.5f, 0.25f, 40 }, y[4] = { 0.1f, 1, 0.5f, 0.3f }, dz[4];
	double loss, want = 0, ss;

	be->swiglu_fwd(be, h, gu, T, I);
	for (int t = 0; t < T; t++)
		for (int i = 0; i < I; i++) {
			double a = gu[t * 2 * I + i];

			ref[t * I + i] = a / (1 + exp(-a)) * gu[t * 2 * I + I + i];
		}
	close_all("swiglu_fwd", h, ref, T * I, 1e-6);

	be->embedding_bwd(be, tab, ids, g, T, H);
	for (int t = 0; t < T; t++)
		for (int j = 0; j < H; j++)
			rtab[ids[t] * H + j] += g[t * H + j];
	close_all("embedding_bwd", tab, rtab, V * H, 1e-6);

	be->bce_fwd_bwd(be, &loss, dz, z, y, 4, 0.25f);
	for (int i = 0; i < 4; i++) {
		double p = 1 / (1 + exp(-(double)z[i]));

		/* -(y log p + (1-y) log(1-p)), in a form that stays finite at |z| = 40 */
		want += -y[i] * log(p) - (1 - y[i]) * (-(double)z[i] + log(p));
		CHECK_CLOSE(dz[i], 0.25 * (p - y[i]), 1e-6, 1e-9);
	}
	CHECK_CLOSE(loss, want, 1e-9, 1e-9);

	be->sumsq_f32(be, &ss, g, T * H);
	want = 0;
	for (int i = 0; i < T * H; i++)
		want += (double)g[i] * g[i];
	CHECK_CLOSE(ss, want, 1e-12, 0);
	free(gu); free(h); free(g); free(tab);
}

/* three AdamW steps against the update written out in double */
static void test_adamw(struct sl_backend *be)
{
	const size_t n = 1000;
	float *p = rand_f(n, 1), *m = calloc(n, 4), *v = calloc(n, 4), *wout = malloc(n * 4);
	double *rp = malloc(n * 8), *rm = calloc(n, 8), *rv = calloc(n, 8);
	const double lr = 1e-2, b1 = 0.9, b2 = 0.95, eps = 1e-8, wd = 0.1, gs = 0.5;

	for (size_t i = 0; i < n; i++)
		rp[i] = p[i];
	for (int s = 1; s <= 3; s++) {
		float *g = rand_f(n, 1);
		struct sl_adamw_args a = { .lr = lr, .beta1 = b1, .beta2 = b2, .eps = eps,
					   .weight_decay = wd, .bc1 = 1 - pow(b1, s),
					   .bc2 = 1 - pow(b2, s), .grad_scale = gs };

		be->adamw_f32(be, p, m, v, g, wout, n, &a);
		for (size_t i = 0; i < n; i++) {
			double gg = gs * g[i];

			rp[i] *= 1 - lr * wd;
			rm[i] = b1 * rm[i] + (1 - b1) * gg;
			rv[i] = b2 * rv[i] + (1 - b2) * gg * gg;
			rp[i] -= lr * (rm[i] / (1 - pow(b1, s))) /
				 (sqrt(rv[i] / (1 - pow(b2, s))) + eps);
		}
		free(g);
	}
	close_all("adamw p", p, rp, n, 1e-5);
	close_all("adamw m", m, rm, n, 1e-5);
	close_all("adamw v", v, rv, n, 1e-4);
	CHECK(!memcmp(p, wout, n * 4), "adamw w_out differs from p");
	free(p); free(m); free(v); free(wout); free(rp); free(rm); free(rv);
}

int main(void)
{
	struct sl_backend *be = sl_backend_cpu_create();

	CHECK(be && be->elt == 4 && be->stat_elt == 4, "cpu backend");
	if (!be)
		return test_exit("test_backend_cpu");
	/* the second size is big enough for the row split over threads */
	omp_set_num_threads(4);
	test_matmul(be, 37, 29, 19);
	test_matmul(be, 300, 64, 200);
	test_rmsnorm(be);
	test_attention(be);
	test_packed(be);
	test_misc(be);
	test_adamw(be);
	be->destroy(be);
	return test_exit("test_backend_cpu");
}
