/*
 * safetensors_convert: dtype conversions and the deterministic generator (see safetensors.h).
 *
 * Owns: bf16/f16 <-> float (round to nearest even), a checkpoint tensor to float
 * (sl_st_to_f32), and the splitmix64 + Box-Muller normal generator that initializes optional
 * tensors a checkpoint lacks and test models (the same numbers on every machine).
 */
#include "safetensors.h"

#include <math.h>
#include <string.h>

#include "safetensors_impl.h"

/* ---- conversions ----------------------------------------------------------------------------- */

static uint32_t f32_bits(float f)
{
	uint32_t u;

	memcpy(&u, &f, 4);
	return u;
}

static float bits_f32(uint32_t u)
{
	float f;

	memcpy(&f, &u, 4);
	return f;
}

float sl_bf16_to_f32(uint16_t h)
{
	return bits_f32((uint32_t)h << 16);
}

uint16_t sl_f32_to_bf16(float f)
{
	uint32_t u = f32_bits(f);

	/* rounding could carry a NaN's payload into the exponent (NaN -> inf); keep it a quiet NaN */
	if ((u & 0x7fffffffu) > 0x7f800000u)
		return (uint16_t)((u >> 16) | 0x0040);
	/* nearest, ties to even: add just under half an ulp, plus one if the kept lsb is 1 */
	u += 0x7fffu + ((u >> 16) & 1);
	return (uint16_t)(u >> 16);
}

float sl_f16_to_f32(uint16_t h)
{
	uint32_t sign = (uint32_t)(h & 0x8000) << 16;
	uint32_t exp = (h >> 10) & 0x1f;
	uint32_t man = h & 0x3ff;

	if (exp == 0x1f)		/* inf, nan (payload kept) */
		return bits_f32(sign | 0x7f800000u | (man << 13));
	if (exp == 0) {			/* zero, subnormal: man x 2^-24, exact in float */
		float v = ldexpf((float)man, -24);

		return sign ? -v : v;
	}
	return bits_f32(sign | ((exp - 15 + 127) << 23) | (man << 13));
}

void sl_st_to_f32(const struct sl_st_tensor *t, float *out)
{
	const uint8_t *p = t->data;
	uint16_t h;

	switch (t->dtype) {
	case SL_DT_F32:
		memcpy(out, t->data, t->numel * 4);
		break;
	/* threads: a 27B checkpoint is ~50 GB of page faults and conversions */
	case SL_DT_BF16:
#pragma omp parallel for private(h) if (t->numel > (1 << 20))
		for (size_t i = 0; i < t->numel; i++) {
			memcpy(&h, p + 2 * i, 2);	/* the mapping need not be 2-aligned */
			out[i] = sl_bf16_to_f32(h);
		}
		break;
	case SL_DT_F16:
#pragma omp parallel for private(h) if (t->numel > (1 << 20))
		for (size_t i = 0; i < t->numel; i++) {
			memcpy(&h, p + 2 * i, 2);
			out[i] = sl_f16_to_f32(h);
		}
		break;
	default:
		/* callers check the dtype first; NaN makes a missed check loud */
		for (size_t i = 0; i < t->numel; i++)
			out[i] = NAN;
	}
}

/* ---- a small deterministic generator (splitmix64 + Box-Muller) ------------------------------- */

static uint64_t splitmix64(uint64_t *s)
{
	uint64_t z = (*s += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

void sl_st_fill_normal(float *x, size_t n, double std, uint64_t seed)
{
	uint64_t s = seed;

	for (size_t i = 0; i < n; i += 2) {
		/* u1 in (0, 1] so the log is finite */
		double u1 = ((splitmix64(&s) >> 11) + 1) * 0x1p-53;
		double u2 = (splitmix64(&s) >> 11) * 0x1p-53;
		double r = sqrt(-2.0 * log(u1));

		x[i] = (float)(std * r * cos(2 * M_PI * u2));
		if (i + 1 < n)
			x[i + 1] = (float)(std * r * sin(2 * M_PI * u2));
	}
}
