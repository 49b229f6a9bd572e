// norm_dw.cuh: what ops.cu's Qwen3 and gattn.cu's Qwen3.5 q/k norms share (included by both;
// device code and a launcher, C++): the norm weights' second pass and the rotary table.
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

// cos at cs[p*rot + i], sin at cs[p*rot + rot/2 + i] for positions p < L and pairs i < rot/2;
// angles in double (long positions would lose the low bits of the angle in float), rounded to
// float once, like the cpu reference
static __global__ void k_rope_table(float *cs, int L, int rot, float theta)
{
	const int half = rot / 2;

	for (size_t k = blockIdx.x * (size_t)blockDim.x + threadIdx.x; k < (size_t)L * half;
	     k += (size_t)gridDim.x * blockDim.x) {
		int p = (int)(k / half), i = (int)(k % half);
		double s, co, ang = p * pow((double)theta, -2.0 * i / rot);

		sincos(ang, &s, &co);
		cs[(size_t)p * rot + i] = (float)co;
		cs[(size_t)p * rot + half + i] = (float)s;
	}
}

// the table at the start of the context's scratch (valid until the next user of the scratch)
static float *rope_table(struct sl_cuda *c, int L, int rot, float theta, const char *who)
{
	float *cs = sl_cuda_scratch(c, (size_t)L * rot * sizeof(float), who);

	k_rope_table<<<grid_for((size_t)L * (rot / 2), 256), 256, 0, c->stream>>>(cs, L, rot,
									     theta);
	CUDA_LAUNCHED();
	return cs;
}

// floats in the scratch the table takes, rounded up to 256 bytes (what follows it starts there)
static inline size_t rope_table_floats(int L, int rot)
{
	return ((size_t)L * rot + 63) / 64 * 64;
}

#endif
