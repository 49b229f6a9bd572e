/*
 * host_adamw: vectorized host kernels of the offloaded optimizer (see host_adamw.h).
 *
 * Bandwidth bound: one AdamW element reads p, m, v, g (16 bytes) and writes p, m, v and the bf16
 * copy (14 bytes), ~15 flops.  Every loop is `omp parallel for simd` over contiguous elements
 * with a static schedule so each thread streams its own range, and branch-free so that it
 * vectorizes: sqrtf without errno (src/Makefile.am: the correctly rounded instruction), the
 * lerp form chosen outside the loop, bf16 rounding as a select.  Floating-point contraction is
 * off: an FMA would round differently from the cpu backend and the cuda kernel (__f*_rn).
 */
#pragma GCC optimize("fp-contract=off")

#include "host_adamw.h"

#include <omp.h>
#include <string.h>

#include "adamw_math.h"

/* float -> bf16 bits, round to nearest even (NaN stays a quiet NaN), as __float2bfloat16_rn */
static inline uint16_t bf16_bits(float f)
{
	uint32_t x;

	uint32_t r, q;

	memcpy(&x, &f, sizeof(x));
	r = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
	q = (x >> 16) | 0x40u;
	return (uint16_t)((x & 0x7fffffffu) > 0x7f800000u ? q : r);
}

/*
 * The update over [lo, hi) on one thread, vectorized; the parallel region only splits the range.
 * lerp_lo is made a constant per loop so the compiler folds sl_adamw_elem's test.
 */
#define ADAMW_LOOP(K, STORE)                                                              \
	do {                                                                               \
		_Pragma("omp simd")                                                        \
		for (size_t i = lo; i < hi; i++) {                                         \
			float pi_ = sl_adamw_elem(K, &p[i], &m[i], &v[i], grad[i]);        \
			STORE;                                                             \
		}                                                                          \
	} while (0)

#define ADAMW_BOTH(STORE)                                                                 \
	do {                                                                               \
		struct sl_adamw_consts kc = *k;                                            \
		if (k->lerp_lo) {                                                          \
			kc.lerp_lo = true;                                                 \
			ADAMW_LOOP(&kc, STORE);                                            \
		} else {                                                                   \
			kc.lerp_lo = false;                                                \
			ADAMW_LOOP(&kc, STORE);                                            \
		}                                                                          \
	} while (0)

/* AVX2 where the host has it (twice the lanes for the sqrt and divisions; no FMA either way) */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
__attribute__((target_clones("avx2", "default")))
#endif
static void adamw_range(const struct sl_adamw_consts *k, float *restrict p, float *restrict m,
			float *restrict v, const float *restrict grad, void *w_out, size_t elt,
			size_t lo, size_t hi)
{
	if (w_out && elt == 2) {
		uint16_t *restrict w = w_out;

		ADAMW_BOTH(w[i] = bf16_bits(pi_));
	} else if (w_out && elt == 4) {
		float *restrict w = w_out;

		ADAMW_BOTH(w[i] = pi_);
	} else if (w_out) {
		double *restrict w = w_out;

		ADAMW_BOTH(w[i] = pi_);
	} else {
		ADAMW_BOTH((void)pi_);
	}
}

void sl_host_adamw(float *p, float *m, float *v, const float *grad, void *w_out, size_t elt,
		   size_t n, const struct sl_adamw_args *a)
{
	const struct sl_adamw_consts k = sl_adamw_consts(a);

#pragma omp parallel
	{
		int nt = omp_get_num_threads(), id = omp_get_thread_num();
		/* 16-element multiples: whole vectors and cache lines per thread */
		size_t per = (n / nt + 15) / 16 * 16, lo = per * id;
		size_t hi = lo + per < n ? lo + per : n;

		if (lo < hi)
			adamw_range(&k, p, m, v, grad, w_out, elt, lo, hi);
	}
}

void sl_host_add(float *y, const float *x, size_t n)
{
#pragma omp parallel for simd schedule(static)
	for (size_t i = 0; i < n; i++)
		y[i] += x[i];
}

double sl_host_sumsq(const float *x, size_t n)
{
	double sum = 0;

#pragma omp parallel for simd reduction(+ : sum) schedule(static)
	for (size_t i = 0; i < n; i++)
		sum += (double)x[i] * x[i];
	return sum;
}

void sl_host_to_compute(void *dst, const float *src, size_t elt, size_t n)
{
	if (elt == 2) {
		uint16_t *w = dst;

#pragma omp parallel for simd schedule(static)
		for (size_t i = 0; i < n; i++)
			w[i] = bf16_bits(src[i]);
	} else if (elt == 4) {
		memcpy(dst, src, n * sizeof(float));
	} else {
		double *w = dst;

#pragma omp parallel for simd schedule(static)
		for (size_t i = 0; i < n; i++)
			w[i] = src[i];
	}
}
