/*
 * adamw_math: the element-wise AdamW update, shared by the cpu backend's adamw_f32 and the host
 * optimizer of parallel.offload (shard.c), so the two are the same arithmetic by construction.
 *
 * The order of operations and the float rounding of each scalar follow torch's single-tensor
 * AdamW: its Python-float scalars (1 - lr*wd, 1 - beta1, lr/bc1, sqrt(bc2)) are formed in double
 * and rounded to float once, and lerp_/addcmul_/addcdiv_ evaluate as its CPU kernels do.
 */
#ifndef SL_ADAMW_MATH_H
#define SL_ADAMW_MATH_H

#include <math.h>
#include <stdbool.h>

#include "backend.h"

/* the per-call scalars, rounded to float once */
struct sl_adamw_consts {
	float decay;		/* 1 - lr*wd */
	float w1;		/* 1 - beta1 */
	float b2, w2;		/* beta2, 1 - beta2 */
	float bc2s;		/* sqrt(bc2) */
	float step;		/* -lr/bc1 */
	float eps, gs;
	bool lerp_lo;		/* torch's lerp picks its formula by |weight| < 0.5 */
};

static inline struct sl_adamw_consts sl_adamw_consts(const struct sl_adamw_args *a)
{
	struct sl_adamw_consts k;

	k.decay = (float)(1.0 - (double)a->lr * a->weight_decay);
	k.w1 = (float)(1.0 - (double)a->beta1);
	k.b2 = a->beta2;
	k.w2 = (float)(1.0 - (double)a->beta2);
	k.bc2s = (float)sqrt((double)a->bc2);
	k.step = (float)(-((double)a->lr / a->bc1));
	k.eps = a->eps;
	k.gs = a->grad_scale;
	k.lerp_lo = fabsf(k.w1) < 0.5f;
	return k;
}

/* One element: updates *p, *m, *v in place and returns the new p. */
static inline float sl_adamw_elem(const struct sl_adamw_consts *k, float *p, float *m, float *v,
				  float grad)
{
	float g = grad * k->gs;
	float pi = *p * k->decay;
	float mi = k->lerp_lo ? *m + k->w1 * (g - *m) : g - (g - *m) * (1 - k->w1);
	float vi = *v * k->b2;
	float den;

	vi = vi + k->w2 * g * g;
	den = sqrtf(vi) / k->bc2s + k->eps;
	pi = pi + k->step * mi / den;
	*p = pi;
	*m = mi;
	*v = vi;
	return pi;
}

#endif
