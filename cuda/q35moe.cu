// q35moe.cu: the Qwen3.5-MoE shared expert's per-token sigmoid gate with its extern "C" launchers.
// bf16 in memory, fp32 arithmetic; one block per token row, the row sum of the backward in a
// fixed order (deterministic).
#include <cmath>

#include "common.cuh"

#define NT 256

// out(T,H) += sigmoid(gate(t)) y(T,H); block t
__global__ void k_row_gate_fwd(bf16 *out, const bf16 *y, const bf16 *gate, int H)
{
	size_t r = (size_t)blockIdx.x * H;
	float s = sigm(bf(gate[blockIdx.x]));

	for (int h = threadIdx.x; h < H; h += blockDim.x)
		out[r + h] = tobf(bf(out[r + h]) + s * bf(y[r + h]));
}

// dy = s dout; dgate(t) = s (1 - s) sum_h dout y; block t
__global__ void k_row_gate_bwd(bf16 *dy, bf16 *dgate, const bf16 *dout, const bf16 *y,
			       const bf16 *gate, int H)
{
	size_t r = (size_t)blockIdx.x * H;
	float s = sigm(bf(gate[blockIdx.x])), acc = 0.f;

	for (int h = threadIdx.x; h < H; h += blockDim.x) {
		float d = bf(dout[r + h]);

		acc += d * bf(y[r + h]);
		dy[r + h] = tobf(s * d);
	}
	acc = block_sum(acc);
	if (!threadIdx.x)
		dgate[blockIdx.x] = tobf(acc * s * (1.f - s));
}

extern "C" void sl_cuda_row_gate_fwd(struct sl_cuda *c, void *out, const void *y,
				     const void *gate, int T, int H)
{
	if (T <= 0 || H <= 0)
		return;
	k_row_gate_fwd<<<T, NT, 0, c->stream>>>((bf16 *)out, (const bf16 *)y, (const bf16 *)gate,
						H);
	CUDA_LAUNCHED();
}

extern "C" void sl_cuda_row_gate_bwd(struct sl_cuda *c, void *dy, void *dgate, const void *dout,
				     const void *y, const void *gate, int T, int H)
{
	if (T <= 0 || H <= 0)
		return;
	k_row_gate_bwd<<<T, NT, 0, c->stream>>>((bf16 *)dy, (bf16 *)dgate, (const bf16 *)dout,
						(const bf16 *)y, (const bf16 *)gate, H);
	CUDA_LAUNCHED();
}
