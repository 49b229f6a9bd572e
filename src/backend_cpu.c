/*
 * backend_cpu: the cpu backend, the numeric reference for every op of struct sl_backend.
 *
 * Compute elements are float (sl_backend_cpu_create) or, when backend_cpu64.c includes this file
 * with SL_CPU_DOUBLE defined, double (sl_backend_cpu64_create, for gradient checks); stat buffers
 * use the compute type.  Matmuls go to OpenBLAS, everything else is plain loops parallelized with
 * OpenMP.  Sums over tokens (weight gradients, embedding scatter) are parallelized over the
 * elements they reduce into, so results do not depend on the number of threads.  Dot products
 * and row sums accumulate in double in both builds.
 */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "adamw_math.h"
#include "backend.h"
#include "backend_cpu_async.h"

#include <cblas.h>
/* OpenBLAS pulls in <complex.h>, whose I would shadow the intermediate size I below */
#undef I

#ifdef SL_CPU_DOUBLE
typedef double real;
#define CPU_GEMM cblas_dgemm
#define CPU_NAME "cpu64"
#define CPU_CREATE sl_backend_cpu64_create
#else
typedef float real;
#define CPU_GEMM cblas_sgemm
#define CPU_NAME "cpu"
#define CPU_CREATE sl_backend_cpu_create
#endif

/* columns per task of the column-parallel reductions: one cache line of floats */
#define COLBLK 16

static inline int imin(int a, int b)
{
	return a < b ? a : b;
}

/* ---- memory ------------------------------------------------------------------------------ */

static void *cpu_alloc(struct sl_backend *be, size_t bytes)
{
	size_t n = (bytes + 63) / 64 * 64;
	void *p;

	if (!n)
		n = 64;
	p = aligned_alloc(64, n);
	if (!p) {
		fprintf(stderr, "%s backend: out of memory (%zu bytes)\n", CPU_NAME, bytes);
		abort();
	}
	memset(p, 0, n);
	return p;
}

static void cpu_free(struct sl_backend *be, void *p)
{
	free(p);
}

static void cpu_zero(struct sl_backend *be, void *p, size_t bytes)
{
	memset(p, 0, bytes);
}

static void cpu_copy(struct sl_backend *be, void *dst, const void *src, size_t bytes)
{
	if (bytes)
		memcpy(dst, src, bytes);
}

static void cpu_sync(struct sl_backend *be)
{
}

static void cpu_to_compute(struct sl_backend *be, void *dst, const float *src, size_t n)
{
	real *d = dst;

#pragma omp parallel for simd schedule(static)
	for (size_t i = 0; i < n; i++)
		d[i] = src[i];
}

static void cpu_to_f32(struct sl_backend *be, float *dst, const void *src, size_t n)
{
	const real *s = src;

#pragma omp parallel for simd schedule(static)
	for (size_t i = 0; i < n; i++)
		dst[i] = (float)s[i];
}

/* ---- embedding --------------------------------------------------------------------------- */

static void cpu_embedding_fwd(struct sl_backend *be, void *out, const int32_t *ids,
			      const void *table, int T, int H)
{
	const real *tab = table;
	real *o = out;

#pragma omp parallel for schedule(static)
	for (int t = 0; t < T; t++)
		memcpy(o + (size_t)t * H, tab + (size_t)ids[t] * H, (size_t)H * sizeof(real));
}

static void cpu_embedding_bwd(struct sl_backend *be, void *dtable, const int32_t *ids,
			      const void *dout, int T, int H)
{
	const real *g = dout;
	real *dt = dtable;

	/* tokens may repeat ids: split columns, not tokens, so no two threads touch one row slot */
#pragma omp parallel for schedule(static)
	for (int j0 = 0; j0 < H; j0 += COLBLK) {
		int j1 = imin(j0 + COLBLK, H);

		for (int t = 0; t < T; t++) {
			real *d = dt + (size_t)ids[t] * H;
			const real *s = g + (size_t)t * H;

			for (int j = j0; j < j1; j++)
				d[j] += s[j];
		}
	}
}

/* ---- RMSNorm ----------------------------------------------------------------------------- */

static void cpu_rmsnorm_fwd(struct sl_backend *be, void *out, void *rstd, const void *x,
			    const void *w, int T, int H, float eps)
{
	const real *xx = x, *ww = w;
	real *o = out, *rs = rstd;

#pragma omp parallel for schedule(static)
	for (int t = 0; t < T; t++) {
		const real *xr = xx + (size_t)t * H;
		real *orow = o + (size_t)t * H;
		double ss = 0;
		real r;

		for (int j = 0; j < H; j++)
			ss += (double)xr[j] * xr[j];
		r = (real)(1.0 / sqrt(ss / H + eps));
		rs[t] = r;
		for (int j = 0; j < H; j++)
			orow[j] = (xr[j] * r) * ww[j];
	}
}

static void cpu_rmsnorm_bwd(struct sl_backend *be, void *dx, void *dw, const void *dout,
			    const void *x, const void *w, const void *rstd, int T, int H,
			    bool accumulate)
{
	const real *g = dout, *xx = x, *ww = w, *rs = rstd;
	real *dxx = dx, *dww = dw;

#pragma omp parallel for schedule(static)
	for (int t = 0; t < T; t++) {
		const real *gr = g + (size_t)t * H, *xr = xx + (size_t)t * H;
		real *d = dxx + (size_t)t * H;
		double r = rs[t], s = 0, c;

		for (int j = 0; j < H; j++)
			s += (double)gr[j] * ww[j] * xr[j];
		c = s * r * r * r / H;
		for (int j = 0; j < H; j++) {
			real v = (real)(r * ww[j] * gr[j] - xr[j] * c);

			d[j] = accumulate ? d[j] + v : v;
		}
	}

#pragma omp parallel for schedule(static)
	for (int j0 = 0; j0 < H; j0 += COLBLK) {
		int j1 = imin(j0 + COLBLK, H);
		double acc[COLBLK] = { 0 };

		for (int t = 0; t < T; t++) {
			const real *gr = g + (size_t)t * H, *xr = xx + (size_t)t * H;
			double r = rs[t];

			for (int j = j0; j < j1; j++)
				acc[j - j0] += (double)gr[j] * xr[j] * r;
		}
		for (int j = j0; j < j1; j++)
			dww[j] += (real)acc[j - j0];
	}
}

/* ---- matmul ------------------------------------------------------------------------------ */

/*
 * C(M,N) = alpha op(A) op(B) + beta C, with the M rows split over OpenMP threads, each calling
 * single-threaded OpenBLAS: OpenBLAS's own pthreads spin against the OpenMP team between calls
 * and made small GEMMs several times slower.  Each row's result is the same whatever the split.
 */
static void gemm_rows(enum CBLAS_TRANSPOSE ta, enum CBLAS_TRANSPOSE tb, int M, int N, int K,
		      const real *A, int lda, const real *Bm, int ldb, real beta, real *C,
		      int ldc)
{
	int chunks = omp_get_max_threads();

	if (M <= 0 || N <= 0)
		return;
	/* a chunk below ~64 rows or ~1 MFLOP is not worth a thread */
	chunks = imin(chunks, (M + 63) / 64);
	if ((double)M * N * K < 1e6 * chunks)
		chunks = 1;
	if (chunks <= 1) {
		CPU_GEMM(CblasRowMajor, ta, tb, M, N, K, 1, A, lda, Bm, ldb, beta, C, ldc);
		return;
	}
#pragma omp parallel for schedule(static)
	for (int c = 0; c < chunks; c++) {
		int m0 = (int)((long)M * c / chunks), m1 = (int)((long)M * (c + 1) / chunks);
		const real *a = ta == CblasNoTrans ? A + (size_t)m0 * lda : A + m0;

		if (m1 > m0)
			CPU_GEMM(CblasRowMajor, ta, tb, m1 - m0, N, K, 1, a, lda, Bm, ldb, beta,
				 C + (size_t)m0 * ldc, ldc);
	}
}

static void cpu_matmul_fwd(struct sl_backend *be, void *out, const void *x, const void *w,
			   const void *bias, int T, int K, int N)
{
	real *o = out;
	real beta = 0;

	if (T <= 0 || N <= 0)
		return;
	if (bias) {
		for (int t = 0; t < T; t++)
			memcpy(o + (size_t)t * N, bias, (size_t)N * sizeof(real));
		beta = 1;
	}
	gemm_rows(CblasNoTrans, CblasTrans, T, N, K, x, K, w, K, beta, o, N);
}

static void cpu_matmul_fwd_res(struct sl_backend *be, void *out, const void *x, const void *w,
			       const void *res, int T, int K, int N)
{
	if (T <= 0 || N <= 0)
		return;
	memcpy(out, res, (size_t)T * N * sizeof(real));
	gemm_rows(CblasNoTrans, CblasTrans, T, N, K, x, K, w, K, 1, out, N);
}

static void cpu_matmul_bwd(struct sl_backend *be, void *dx, void *dw, void *dbias,
			   const void *dout, const void *x, const void *w, int T, int K, int N,
			   bool accumulate)
{
	const real *g = dout;

	if (T <= 0 || N <= 0)
		return;
	if (dx)
		gemm_rows(CblasNoTrans, CblasNoTrans, T, K, N, g, N, w, K, accumulate ? 1 : 0,
			  dx, K);
	gemm_rows(CblasTrans, CblasNoTrans, N, K, T, g, N, x, K, 1, dw, K);
	if (dbias) {
		real *db = dbias;

#pragma omp parallel for schedule(static)
		for (int n0 = 0; n0 < N; n0 += COLBLK) {
			int n1 = imin(n0 + COLBLK, N);
			double acc[COLBLK] = { 0 };

			for (int t = 0; t < T; t++)
				for (int n = n0; n < n1; n++)
					acc[n - n0] += g[(size_t)t * N + n];
			for (int n = n0; n < n1; n++)
				db[n] += (real)acc[n - n0];
		}
	}
}

static void cpu_add(struct sl_backend *be, void *y, const void *x, size_t n)
{
	real *yy = y;
	const real *xx = x;

#pragma omp parallel for simd schedule(static)
	for (size_t i = 0; i < n; i++)
		yy[i] += xx[i];
}

static void cpu_add_f32(struct sl_backend *be, float *y, const float *x, size_t n)
{
#pragma omp parallel for simd schedule(static)
	for (size_t i = 0; i < n; i++)
		y[i] += x[i];
}

/* ---- q/k norm + rotary ------------------------------------------------------------------- */

/*
 * cos and sin of position p at cs[p*hd + i] and cs[p*hd + hd/2 + i], i < hd/2; angles in double
 * so that long positions lose nothing before the rounding to the compute type.
 */
static real *rope_table(int L, int hd, double theta)
{
	int half = hd / 2;
	real *cs = malloc((size_t)L * hd * sizeof(real));

	if (!cs) {
		fprintf(stderr, "%s backend: out of memory (rope table)\n", CPU_NAME);
		abort();
	}
	for (int p = 0; p < L; p++) {
		for (int i = 0; i < half; i++) {
			double ang = p * pow(theta, -2.0 * i / hd);

			cs[(size_t)p * hd + i] = (real)cos(ang);
			cs[(size_t)p * hd + half + i] = (real)sin(ang);
		}
	}
	return cs;
}

static void cpu_qk_norm_rope_fwd(struct sl_backend *be, void *out, void *rstd, const void *qkv,
				 const void *q_norm_w, const void *k_norm_w, int T, int L,
				 const int32_t *pos, int nh, int nkv, int hd, float eps, float theta)
{
	const int W = (nh + 2 * nkv) * hd, nq = nh + nkv, half = hd / 2;
	const real *in = qkv;
	real *o = out, *rs = rstd;
	real *cs = rope_table(L, hd, theta);

#pragma omp parallel for schedule(static)
	for (int t = 0; t < T; t++) {
		const real *c = cs + (size_t)(pos ? pos[t] : t % L) * hd, *s = c + half;
		real n[hd];

		for (int j = 0; j < nq; j++) {
			const real *x = in + (size_t)t * W + (size_t)j * hd;
			const real *w = j < nh ? (const real *)q_norm_w : (const real *)k_norm_w;
			real *y = o + (size_t)t * W + (size_t)j * hd;
			double ss = 0;
			real r;

			for (int i = 0; i < hd; i++)
				ss += (double)x[i] * x[i];
			r = (real)(1.0 / sqrt(ss / hd + eps));
			rs[(size_t)t * nq + j] = r;
			for (int i = 0; i < hd; i++)
				n[i] = (x[i] * r) * w[i];
			for (int i = 0; i < half; i++) {
				y[i] = n[i] * c[i] - n[i + half] * s[i];
				y[i + half] = n[i + half] * c[i] + n[i] * s[i];
			}
		}
		memcpy(o + (size_t)t * W + (size_t)nq * hd, in + (size_t)t * W + (size_t)nq * hd,
		       (size_t)nkv * hd * sizeof(real));
	}
	free(cs);
}

/* gradient w.r.t. the normed (un-rotated) value i of a head, from the rotated gradient dy */
static inline double rope_back(const real *dy, const real *c, const real *s, int i, int half)
{
	if (i < half)
		return (double)dy[i] * c[i] + (double)dy[i + half] * s[i];
	i -= half;
	return -(double)dy[i] * s[i] + (double)dy[i + half] * c[i];
}

static void cpu_qk_norm_rope_bwd(struct sl_backend *be, void *dqkv, void *dq_norm_w,
				 void *dk_norm_w, const void *dout, const void *qkv,
				 const void *q_norm_w, const void *k_norm_w, const void *rstd,
				 int T, int L, const int32_t *pos, int nh, int nkv, int hd, float eps,
				 float theta)
{
	const int W = (nh + 2 * nkv) * hd, nq = nh + nkv, half = hd / 2;
	const real *g = dout, *in = qkv, *rs = rstd;
	real *d = dqkv;
	real *cs = rope_table(L, hd, theta);

#pragma omp parallel for schedule(static)
	for (int t = 0; t < T; t++) {
		const real *c = cs + (size_t)(pos ? pos[t] : t % L) * hd, *s = c + half;
		double dn[hd];

		for (int j = 0; j < nq; j++) {
			const real *x = in + (size_t)t * W + (size_t)j * hd;
			const real *dy = g + (size_t)t * W + (size_t)j * hd;
			const real *w = j < nh ? (const real *)q_norm_w : (const real *)k_norm_w;
			real *dx = d + (size_t)t * W + (size_t)j * hd;
			double r = rs[(size_t)t * nq + j], sum = 0, k;

			for (int i = 0; i < hd; i++) {
				dn[i] = rope_back(dy, c, s, i, half);
				sum += dn[i] * w[i] * x[i];
			}
			k = sum * r * r * r / hd;
			for (int i = 0; i < hd; i++)
				dx[i] = (real)(r * w[i] * dn[i] - x[i] * k);
		}
		memcpy(d + (size_t)t * W + (size_t)nq * hd, g + (size_t)t * W + (size_t)nq * hd,
		       (size_t)nkv * hd * sizeof(real));
	}

	/* weight gradients: one task per (q|k, element), summing over tokens and heads */
#pragma omp parallel for schedule(static)
	for (int ii = 0; ii < 2 * hd; ii++) {
		int kind = ii / hd, i = ii % hd;
		int j0 = kind ? nh : 0, j1 = kind ? nq : nh;
		double acc = 0;

		for (int t = 0; t < T; t++) {
			const real *c = cs + (size_t)(pos ? pos[t] : t % L) * hd, *s = c + half;

			for (int j = j0; j < j1; j++) {
				size_t off = (size_t)t * W + (size_t)j * hd;

				acc += rope_back(g + off, c, s, i, half) * in[off + i] *
				       rs[(size_t)t * nq + j];
			}
		}
		if (kind)
			((real *)dk_norm_w)[i] += (real)acc;
		else
			((real *)dq_norm_w)[i] += (real)acc;
	}
	free(cs);
}

/* ---- attention --------------------------------------------------------------------------- */

static void *xmalloc(size_t bytes)
{
	void *p = malloc(bytes ? bytes : 1);

	if (!p) {
		fprintf(stderr, "%s backend: out of memory (%zu bytes)\n", CPU_NAME, bytes);
		abort();
	}
	return p;
}

static inline double dot(const real *a, const real *b, int n)
{
	double s = 0;

#pragma omp simd reduction(+ : s)
	for (int i = 0; i < n; i++)
		s += (double)a[i] * b[i];
	return s;
}

/*
 * One query's attention over keys and values j0..i (rows of stride @stride from kb, vb):
 * y(hd) = softmax(q . k_j * scale) . v_j; returns the log-sum-exp.  p (>= i + 1) and acc (hd)
 * are scratch.
 */
static real attend(real *y, const real *q, const real *kb, const real *vb, size_t stride, int j0,
		   int i, int hd, double scale, double *p, double *acc)
{
	double mx = -INFINITY, sum = 0;

	for (int j = j0; j <= i; j++) {
		p[j] = dot(q, kb + (size_t)j * stride, hd) * scale;
		if (p[j] > mx)
			mx = p[j];
	}
	for (int d = 0; d < hd; d++)
		acc[d] = 0;
	for (int j = j0; j <= i; j++) {
		const real *v = vb + (size_t)j * stride;
		double e = exp(p[j] - mx);

		sum += e;
		for (int d = 0; d < hd; d++)
			acc[d] += e * v[d];
	}
	for (int d = 0; d < hd; d++)
		y[d] = (real)(acc[d] / sum);
	return (real)(mx + log(sum));
}

static void cpu_attention_fwd(struct sl_backend *be, void *out, void *lse, const void *qkv,
			      const int32_t *lens, const int32_t *pos, int B, int L, int nh,
			      int nkv, int hd)
{
	const int W = (nh + 2 * nkv) * hd, grp = nh / nkv;
	const double scale = 1.0 / sqrt((double)hd);
	const real *in = qkv;
	real *o = out, *ls = lse;

#pragma omp parallel
	{
		double *p = xmalloc((size_t)L * sizeof(double));
		double *acc = xmalloc((size_t)hd * sizeof(double));

#pragma omp for collapse(3) schedule(dynamic, 4)
		for (int b = 0; b < B; b++) {
			for (int h = 0; h < nh; h++) {
				for (int i = 0; i < L; i++) {
					size_t t = (size_t)b * L + i;
					real *y = o + t * nh * hd + (size_t)h * hd;
					const real *q = in + t * W + (size_t)h * hd;
					const real *kb = in + (size_t)b * L * W +
							 (size_t)(nh + h / grp) * hd;
					const real *vb = kb + (size_t)nkv * hd;
					/* the first key of the query's document */
					const int j0 = pos && i < lens[b] ? i - pos[t] : 0;

					if (i >= lens[b]) {
						memset(y, 0, (size_t)hd * sizeof(real));
						ls[t * nh + h] = 0;
						continue;
					}
					ls[t * nh + h] = attend(y, q, kb, vb, W, j0, i, hd, scale, p,
								acc);
				}
			}
		}
		free(acc);
		free(p);
	}
}

/*
 * One task per (record, query head) computes its queries' dq and its share of dk, dv into a
 * private buffer; a second pass sums the shares of the query heads that read each kv head, in a
 * fixed order.  Every output has one writer, so the result does not depend on the thread count.
 * Probabilities are recomputed from lse.
 *
 * Queries, dout, out and lse have @Lc rows a record, each row's position in the record from
 * @gidx (its row index when NULL) and its document start from @pos (the record's start when
 * NULL); keys and values have @L rows a record in @kv, of @kvw elements from column @kvoff
 * (k heads, then v heads), and their gradients go to the same places in @dkv.
 */
static void attention_bwd_rows(real *d, real *dkv, const real *g, const real *o, const real *ls,
			       const real *in, const real *kv, int kvw, int kvoff,
			       const int32_t *gidx, const int32_t *pos, const int32_t *lens,
			       int B, int Lc, int L, int nh, int nkv, int hd)
{
	const int W = (nh + 2 * nkv) * hd, grp = nh / nkv, OW = nh * hd;
	const double scale = 1.0 / sqrt((double)hd);
	const size_t part_n = (size_t)L * hd * 2;	/* dk (L, hd) then dv (L, hd) */
	double *part = xmalloc((size_t)B * nh * part_n * sizeof(double));

	memset(d, 0, (size_t)B * Lc * W * sizeof(real));

#pragma omp parallel
	{
		double *acc = xmalloc((size_t)hd * sizeof(double));

#pragma omp for collapse(2) schedule(dynamic, 1)
		for (int b = 0; b < B; b++) {
			for (int h = 0; h < nh; h++) {
				double *pk = part + ((size_t)b * nh + h) * part_n;
				double *pv = pk + (size_t)L * hd;
				const real *kb = kv + (size_t)b * L * kvw + kvoff +
						 (size_t)(h / grp) * hd;
				const real *vb = kb + (size_t)nkv * hd;

				memset(pk, 0, part_n * sizeof(double));
				for (int r = 0; r < Lc; r++) {
					size_t t = (size_t)b * Lc + r;
					const int i = gidx ? gidx[t] : r;
					const real *q = in + t * W + (size_t)h * hd;
					const real *dy = g + t * OW + (size_t)h * hd;
					real *dq = d + t * W + (size_t)h * hd;
					double Di, l;

					if (i >= lens[b])
						continue;
					Di = dot(dy, o + t * OW + (size_t)h * hd, hd);
					l = ls[t * nh + h];
					for (int e = 0; e < hd; e++)
						acc[e] = 0;
					for (int j = pos ? i - pos[t] : 0; j <= i; j++) {
						const real *k = kb + (size_t)j * kvw;
						const real *v = vb + (size_t)j * kvw;
						double *dk = pk + (size_t)j * hd;
						double *dv = pv + (size_t)j * hd;
						double p = exp(dot(q, k, hd) * scale - l);
						double ds = p * (dot(dy, v, hd) - Di);

						for (int e = 0; e < hd; e++) {
							acc[e] += ds * k[e];
							dk[e] += ds * q[e];
							dv[e] += p * dy[e];
						}
					}
					for (int e = 0; e < hd; e++)
						dq[e] = (real)(acc[e] * scale);
				}
			}
		}
		free(acc);

#pragma omp for collapse(2) schedule(static)
		for (int b = 0; b < B; b++) {
			for (int kvh = 0; kvh < nkv; kvh++) {
				for (int j = 0; j < L; j++) {
					real *dk = dkv + ((size_t)b * L + j) * kvw + kvoff +
						   (size_t)kvh * hd;
					real *dv = dk + (size_t)nkv * hd;

					for (int e = 0; e < hd; e++) {
						double sk = 0, sv = 0;

						for (int h = kvh * grp; h < (kvh + 1) * grp; h++) {
							const double *pk = part +
								((size_t)b * nh + h) * part_n;

							sk += pk[(size_t)j * hd + e];
							sv += pk[(size_t)(L + j) * hd + e];
						}
						dk[e] = (real)(sk * scale);
						dv[e] = (real)sv;
					}
				}
			}
		}
	}
	free(part);
}

static void cpu_attention_bwd(struct sl_backend *be, void *dqkv, const void *dout,
			      const void *out, const void *lse, const void *qkv,
			      const int32_t *lens, const int32_t *pos, int B, int L, int nh,
			      int nkv, int hd)
{
	/* keys and values are qkv's own columns after the query heads */
	attention_bwd_rows(dqkv, dqkv, dout, out, lse, qkv, qkv, (nh + 2 * nkv) * hd, nh * hd,
			   NULL, pos, lens, B, L, L, nh, nkv, hd);
}

/* ---- SwiGLU ------------------------------------------------------------------------------ */

static void cpu_swiglu_fwd(struct sl_backend *be, void *h, const void *gu, int T, int I)
{
	const real *x = gu;
	real *y = h;

#pragma omp parallel for schedule(static)
	for (int t = 0; t < T; t++) {
		const real *gate = x + (size_t)t * 2 * I, *up = gate + I;
		real *yr = y + (size_t)t * I;

		for (int i = 0; i < I; i++)
			yr[i] = gate[i] / (1 + exp(-gate[i])) * up[i];
	}
}

static void cpu_swiglu_bwd(struct sl_backend *be, void *dgu, const void *dh, const void *gu,
			   int T, int I)
{
	const real *x = gu, *g = dh;
	real *d = dgu;

#pragma omp parallel for schedule(static)
	for (int t = 0; t < T; t++) {
		const real *gate = x + (size_t)t * 2 * I, *up = gate + I, *gr = g + (size_t)t * I;
		real *dgate = d + (size_t)t * 2 * I, *dup = dgate + I;

		for (int i = 0; i < I; i++) {
			double sg = 1 / (1 + exp(-(double)gate[i]));
			double silu = gate[i] * sg;

			dgate[i] = (real)(gr[i] * up[i] * sg * (1 + gate[i] * (1 - sg)));
			dup[i] = (real)(gr[i] * silu);
		}
	}
}

/* ---- rows -------------------------------------------------------------------------------- */

static void cpu_gather_rows(struct sl_backend *be, void *out, const void *x, const int32_t *idx,
			    int n, int H)
{
	for (int i = 0; i < n; i++)
		memcpy((real *)out + (size_t)i * H, (const real *)x + (size_t)idx[i] * H,
		       (size_t)H * sizeof(real));
}

static void cpu_scatter_add_rows(struct sl_backend *be, void *dx, const void *dout,
				 const int32_t *idx, int n, int H)
{
	for (int i = 0; i < n; i++) {
		real *d = (real *)dx + (size_t)idx[i] * H;
		const real *s = (const real *)dout + (size_t)i * H;

		for (int j = 0; j < H; j++)
			d[j] += s[j];
	}
}

/* ---- loss -------------------------------------------------------------------------------- */

static void cpu_bce_fwd_bwd(struct sl_backend *be, double *loss_sum, void *dlogits,
			    const void *logits, const float *labels, int n, float scale)
{
	const real *z = logits;
	real *dz = dlogits;
	double sum = 0;

	for (int i = 0; i < n; i++) {
		double x = z[i], y = labels[i], sg;

		sum += fmax(x, 0) - x * y + log1p(exp(-fabs(x)));
		if (x >= 0) {
			sg = 1 / (1 + exp(-x));
		} else {
			double e = exp(x);

			sg = e / (1 + e);
		}
		dz[i] = (real)(scale * (sg - y));
	}
	*loss_sum = sum;
}

/* ---- optimizer helpers (f32 in both builds) ------------------------------------------------ */

static void cpu_ce_fwd_bwd(struct sl_backend *be, double *loss_sum, float *row_loss,
			   void *dlogits, const void *logits, const int32_t *targets, int n, int V,
			   float scale)
{
	/* the sum is of the double row values, so the double build's loss keeps its precision */
	double *rl = xmalloc((size_t)(n > 0 ? n : 1) * sizeof(double)), sum = 0;

#pragma omp parallel for schedule(static)
	for (int i = 0; i < n; i++) {
		const real *z = (const real *)logits + (size_t)i * V;
		real *dz = (real *)dlogits + (size_t)i * V;
		double mx = z[0], se = 0, lse;

		for (int v = 1; v < V; v++)
			mx = z[v] > mx ? z[v] : mx;
		for (int v = 0; v < V; v++)
			se += exp(z[v] - mx);
		lse = mx + log(se);
		/* z[target] is read before dz (possibly the same buffer) overwrites it */
		rl[i] = lse - z[targets[i]];
		for (int v = 0; v < V; v++)
			dz[v] = (real)(scale * exp(z[v] - lse));
		dz[targets[i]] -= (real)scale;
	}
	for (int i = 0; i < n; i++) {
		row_loss[i] = (float)rl[i];
		sum += rl[i];
	}
	*loss_sum += sum;
	free(rl);
}

static void cpu_sumsq_f32(struct sl_backend *be, double *out, const float *g, size_t n)
{
	double s = 0;

	if (sl_backend_cpu_side_defer_sumsq(be, false, out, g, n))
		return;
#pragma omp parallel for simd reduction(+ : s) schedule(static)
	for (size_t i = 0; i < n; i++)
		s += (double)g[i] * g[i];
	*out = s;
}

/* The update itself is sl_adamw_elem (adamw_math.h), shared with the offloaded host optimizer. */
static void cpu_adamw_f32(struct sl_backend *be, float *p, float *m, float *v, const float *grad,
			  void *w_out, size_t n, const struct sl_adamw_args *a)
{
	const struct sl_adamw_consts k = sl_adamw_consts(a);
	real *wo = w_out;

	if (sl_backend_cpu_side_defer(be, false, p, m, v, grad, w_out, n, a))
		return;
	if (a->gate && !isfinite(*a->gate))
		return;
#pragma omp parallel for simd schedule(static)
	for (size_t i = 0; i < n; i++) {
		float pi = sl_adamw_elem(&k, &p[i], &m[i], &v[i], grad[i]);

		if (wo)
			wo[i] = pi;
	}
}

static void cpu_sumsq_c(struct sl_backend *be, double *out, const void *g, size_t n)
{
	const real *x = g;
	double s = 0;

	if (sl_backend_cpu_side_defer_sumsq(be, true, out, g, n))
		return;
#pragma omp parallel for simd reduction(+ : s) schedule(static)
	for (size_t i = 0; i < n; i++) {
		float f = (float)x[i];

		s += (double)f * f;
	}
	*out = s;
}

static void cpu_adamw_c(struct sl_backend *be, float *p, float *m, float *v, const void *grad,
			void *w_out, size_t n, const struct sl_adamw_args *a)
{
	const struct sl_adamw_consts k = sl_adamw_consts(a);
	const real *gr = grad;
	real *wo = w_out;

	if (sl_backend_cpu_side_defer(be, true, p, m, v, grad, w_out, n, a))
		return;
	if (a->gate && !isfinite(*a->gate))
		return;
#pragma omp parallel for simd schedule(static)
	for (size_t i = 0; i < n; i++) {
		float pi = sl_adamw_elem(&k, &p[i], &m[i], &v[i], (float)gr[i]);

		if (wo)
			wo[i] = pi;
	}
}

#include "backend_cpu_moe.c"
/* the Qwen3.5 hybrid's ops, in this file's float and double builds */
#include "backend_cpu_gdn.c"
#include "backend_cpu_cp.c"
/* the Qwen3.5-MoE shared expert's gate */
#include "backend_cpu_q35moe.c"

static void cpu_destroy(struct sl_backend *be)
{
	sl_backend_cpu_async_fini(be);
	free(be);
}

struct sl_backend *CPU_CREATE(void)
{
	struct sl_backend *be = calloc(1, sizeof(*be));

	if (!be)
		return NULL;
	/* parallelism comes from OpenMP (see gemm_rows); one OpenBLAS thread per caller */
	openblas_set_num_threads(1);
	be->name = CPU_NAME;
	be->elt = sizeof(real);
	be->align = 64;
	be->stat_elt = sizeof(real);
	be->alloc = cpu_alloc;
	be->free = cpu_free;
	be->zero = cpu_zero;
	be->upload = cpu_copy;
	be->download = cpu_copy;
	be->sync = cpu_sync;
	be->to_compute = cpu_to_compute;
	be->to_f32 = cpu_to_f32;
	be->embedding_fwd = cpu_embedding_fwd;
	be->embedding_bwd = cpu_embedding_bwd;
	be->rmsnorm_fwd = cpu_rmsnorm_fwd;
	be->rmsnorm_bwd = cpu_rmsnorm_bwd;
	be->matmul_fwd = cpu_matmul_fwd;
	be->matmul_fwd_res = cpu_matmul_fwd_res;
	be->matmul_bwd = cpu_matmul_bwd;
	be->add = cpu_add;
	be->add_f32 = cpu_add_f32;
	be->qk_norm_rope_fwd = cpu_qk_norm_rope_fwd;
	be->qk_norm_rope_bwd = cpu_qk_norm_rope_bwd;
	be->attention_fwd = cpu_attention_fwd;
	be->attention_bwd = cpu_attention_bwd;
	be->swiglu_fwd = cpu_swiglu_fwd;
	be->swiglu_bwd = cpu_swiglu_bwd;
	be->gather_rows = cpu_gather_rows;
	be->scatter_add_rows = cpu_scatter_add_rows;
	be->bce_fwd_bwd = cpu_bce_fwd_bwd;
	be->ce_fwd_bwd = cpu_ce_fwd_bwd;
	be->sumsq_f32 = cpu_sumsq_f32;
	be->adamw_f32 = cpu_adamw_f32;
	be->sumsq_c = cpu_sumsq_c;
	be->adamw_c = cpu_adamw_c;
	cpu_moe_install(be);
	cpu_gdn_init(be);
	cpu_cp_install(be);
	cpu_q35moe_install(be);
	be->destroy = cpu_destroy;
	sl_backend_cpu_async_init(be);
	return be;
}
