// norm_dw.cuh: what ops.cu's Qwen3 and gattn.cu's Qwen3.5 q/k norms share (included by both;
// device code and a launcher, C++): the norm weights' second pass and the rotary table.
#ifndef SL_NORM_DW_CUH
#define SL_NORM_DW_CUH

#include "common.cuh"

// the q and k norm weights' gradients, second pass (ops.cu's Qwen3 and gattn.cu's Qwen3.5 norms):
// dqw, dkw(hd) += the sum over nchunk partials part(2, nchunk, hd).  Block (32 elements, q|k),
// lane the element: warp w sums the chunks w, w + NDW_WARPS, ... and the block adds its warps
// in order (a fixed order: the same sums on every run).  One thread walking all the chunks (up
// to 2,048) took 0.1 ms a layer on the H200.
#define NDW_WARPS 32
static __global__ void __launch_bounds__(NDW_WARPS * 32)
k_norm_dw_final(bf16 *dqw, bf16 *dkw, const float *part, int nchunk, int hd)
{
	__shared__ float red[NDW_WARPS][32];
	const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, kind = blockIdx.y;
	const int i = blockIdx.x * 32 + lane;
	const float *p = part + (size_t)kind * nchunk * hd + i;
	float acc = 0.f;

	if (i < hd) {
#pragma unroll 4
		for (int k = w; k < nchunk; k += NDW_WARPS)
			acc += p[(size_t)k * hd];
	}
	red[w][lane] = acc;
	__syncthreads();
	if (!w && i < hd) {
		bf16 *d = kind ? dkw : dqw;
		float a = 0.f;

		for (int j = 0; j < NDW_WARPS; j++)
			a += red[j][lane];
		d[i] = tobf(bf(d[i]) + a);
	}
}

static void norm_dw_final(struct sl_cuda *c, void *dqw, void *dkw, const float *part, int nchunk,
			  int hd)
{
	k_norm_dw_final<<<dim3((hd + 31) / 32, 2), NDW_WARPS * 32, 0, c->stream>>>(
		(bf16 *)dqw, (bf16 *)dkw, part, nchunk, hd);
	CUDA_LAUNCHED();
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
