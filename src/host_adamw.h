/*
 * host_adamw: the host half of parallel.offload's arithmetic (shard's offload worker and
 * bench/adamw_host): AdamW over an fp32 shard fused with writing the new compute-precision copy,
 * gradient accumulation and sums of squares, vectorized and parallel over all OpenMP threads.
 * The element update is adamw_math.h's, the one the cpu backend's adamw_f32 uses and the cuda
 * kernel repeats with explicitly rounded operations, so host and device updates agree.
 */
#ifndef SL_HOST_ADAMW_H
#define SL_HOST_ADAMW_H

#include <stddef.h>
#include <stdint.h>

#include "backend.h"

/*
 * In place over n elements (backend.h's adamw_f32); when @w_out is non-NULL it gets the new p
 * in compute precision of @elt bytes: 2 bf16 (round to nearest even, as the cuda backend's
 * to_compute), 4 float, 8 double.
 */
void sl_host_adamw(float *p, float *m, float *v, const float *grad, void *w_out, size_t elt,
		   size_t n, const struct sl_adamw_args *a);
/* y(n) += x(n) */
void sl_host_add(float *y, const float *x, size_t n);
/* sum of x(n)^2 in double */
double sl_host_sumsq(const float *x, size_t n);
/* dst(n) of @elt bytes = src(n) (as sl_host_adamw writes w_out) */
void sl_host_to_compute(void *dst, const float *src, size_t elt, size_t n);

#endif
