// norm_dw.cuh: a kernel ops.cu and gattn.cu share (included by both; device code, C++).
#ifndef SL_NORM_DW_CUH
#define SL_NORM_DW_CUH

#include "common.cuh"

// the q and k norm weights' gradients, second pass (ops.cu's Qwen3 and gattn.cu's Qwen3.5 norms):
// block q|k, thread element i; dqw, dkw(hd) += the sum over nchunk partials part(2, nchunk, hd),
// in chunk order
static __global__ void k_norm_dw_final(bf16 *dqw, bf16 *dkw, const float *part, int nchunk, int hd)
{
	int i = threadIdx.x, kind = blockIdx.x;
	bf16 *d = kind ? dkw : dqw;
	float acc = 0.f;

	for (int k = 0; k < nchunk; k++)
		acc += part[((size_t)kind * nchunk + k) * hd + i];
	d[i] = tobf(bf(d[i]) + acc);
}

#endif
