/*
 * host_adamw: vectorized host kernels of the offloaded optimizer (see host_adamw.h).
 *
 * Bandwidth bound: one AdamW element reads p, m, v, g (16 bytes) and writes p, m, v and the bf16
 * copy (14 bytes), ~15 flops.  Every loop is `omp parallel for simd` over contiguous elements
 * with a static schedule so each thread streams its own range.  Floating-point contraction is
 * off: an FMA would round differently from the cpu backend and the cuda kernel (__f*_rn).
 */
#pragma GCC optimize("fp-contract=off")

#include "host_adamw.h"

#include <string.h>

#include "adamw_math.h"

/* float -> bf16 bits, round to nearest even (NaN stays a quiet NaN), as __float2bfloat16_rn */
static inline uint16_t bf16_bits(float f)
{
	uint32_t x;

	memcpy(&x, &f, sizeof(x));
	if ((x & 0x7fffffffu) > 0x7f800000u)
		return (uint16_t)((x >> 16) | 0x40u);
	x += 0x7fffu + ((x >> 16) & 1u);
	return (uint16_t)(x >> 16);
}

void sl_host_adamw(float *p, float *m, float *v, const float *grad, void *w_out, size_t elt,
		   size_t n, const struct sl_adamw_args *a)
{
	const struct sl_adamw_consts k = sl_adamw_consts(a);

	if (w_out && elt == 2) {
		uint16_t *w = w_out;

#pragma omp parallel for simd schedule(static)
		for (size_t i = 0; i < n; i++)
			w[i] = bf16_bits(sl_adamw_elem(&k, &p[i], &m[i], &v[i], grad[i]));
	} else if (w_out && elt == 4) {
		float *w = w_out;

#pragma omp parallel for simd schedule(static)
		for (size_t i = 0; i < n; i++)
			w[i] = sl_adamw_elem(&k, &p[i], &m[i], &v[i], grad[i]);
	} else if (w_out) {
		double *w = w_out;

#pragma omp parallel for simd schedule(static)
		for (size_t i = 0; i < n; i++)
			w[i] = sl_adamw_elem(&k, &p[i], &m[i], &v[i], grad[i]);
	} else {
#pragma omp parallel for simd schedule(static)
		for (size_t i = 0; i < n; i++)
			sl_adamw_elem(&k, &p[i], &m[i], &v[i], grad[i]);
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
