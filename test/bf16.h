/*
 * bf16.h: bfloat16 on the host for the CUDA tests (round to nearest even, as the kernels store
 * it; NaN stays NaN).
 */
#ifndef SL_TEST_BF16_H
#define SL_TEST_BF16_H

#include <stdint.h>
#include <string.h>

static inline uint16_t f2bf(float f)
{
	uint32_t u;

	memcpy(&u, &f, 4);
	if ((u & 0x7fffffff) > 0x7f800000)
		return 0x7fc0;
	u += 0x7fff + ((u >> 16) & 1);	/* round to nearest even */
	return (uint16_t)(u >> 16);
}

static inline float bf2f(uint16_t h)
{
	uint32_t u = (uint32_t)h << 16;
	float f;

	memcpy(&f, &u, 4);
	return f;
}

/* @f rounded to the nearest bf16 */
static inline float round_bf(float f)
{
	return bf2f(f2bf(f));
}

#endif
