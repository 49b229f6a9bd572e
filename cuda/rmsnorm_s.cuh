// rmsnorm_s.cuh: the RMSNorm backward with its weight gradient's first pass in one kernel, the
// rows through shared memory several rows ahead (included by ops.cu; device code only, so that
// test/test_rmsnorm_emu.cc runs it on the host emulation, emu.cuh).
//
// Rows of H = 8k elements.  A block walks rows t = blockIdx.x, + gridDim.x, ...; each row's dout,
// x (and, accumulating, the old dx) and its rstd come into shared memory RS_STAGES - 1 rows ahead
// by cp.async, which holds no registers while in flight, so an SM keeps tens of KB of loads going
// (ops.cu's row-a-block kernel keeps one row's, and the weight gradient's column sums read dout
// and x a second time).  Thread i owns the columns' groups of 8 i, i + blockDim.x, ... (RS_V of
// them): dx as k_rmsnorm_bwd_dx8 makes it, and the weight gradient's sum over the block's rows of
// dout x rstd in registers, written once into part[blockIdx.x * H + column]; ops.cu's
// k_colsum_final adds the blocks' partials in order into dw: the same sums on every run.
#ifndef SL_RMSNORM_S_CUH
#define SL_RMSNORM_S_CUH

#define RS_STAGES 3
#define RS_V 2

// bytes of one stage: dout's row, x's, (accumulating) dx's, then rstd padded to 16
static __host__ __device__ inline int rs_stage_bytes(int H, bool acc)
{
	return (acc ? 3 : 2) * H * 2 + 16;
}

// the copies of row t into the stage at shared address d, committed as one group (empty past T)
template <bool ACC>
static __device__ __forceinline__ void rs_stage_load(uint32_t d, const bf16 *g, const bf16 *x,
						     const bf16 *dx, const float *rstd, int t,
						     int T, int H)
{
	if (t < T) {
		const int n = H / 8, nr = (ACC ? 3 : 2) * n;	// 16-byte pieces a row
		const size_t o = (size_t)t * H;

		for (int i = threadIdx.x; i < nr; i += blockDim.x) {
			const bf16 *src = i < n ? g + o + 8 * i : i < 2 * n ? x + o + 8 * (i - n) :
								    dx + o + 8 * (i - 2 * n);

			cp_async16(d + 16 * i, src, true);
		}
		if (!threadIdx.x)
			cp_async4(d + 16 * nr, rstd + t, true);
	}
	cp_commit();
}

template <bool ACC>
__global__ void __launch_bounds__(1024)
k_rmsnorm_bwd_s(bf16 *dx, float *part, const bf16 *g, const bf16 *x, const bf16 *w,
		const float *rstd, int T, int H)
{
	SL_DYN_SMEM(char, sm);
	const int H8 = H / 8, sb = rs_stage_bytes(H, ACC);
	const uint32_t s0 = smem_u32(sm);
	float wv[RS_V][8], acc[RS_V][8];

#pragma unroll
	for (int k = 0; k < RS_V; k++) {
		const int j = threadIdx.x + k * blockDim.x;

#pragma unroll
		for (int e = 0; e < 8; e++)
			acc[k][e] = wv[k][e] = 0.f;
		if (j < H8)
			ld8(wv[k], w + j * 8);
	}
	for (int s = 0; s < RS_STAGES - 1; s++)
		rs_stage_load<ACC>(s0 + s * sb, g, x, dx, rstd, blockIdx.x + s * gridDim.x, T, H);
	int it = 0;

	for (int t = blockIdx.x; t < T; t += gridDim.x, it++) {
		rs_stage_load<ACC>(s0 + (it + RS_STAGES - 1) % RS_STAGES * sb, g, x, dx, rstd,
				   t + (RS_STAGES - 1) * gridDim.x, T, H);
		cp_wait2();	// this row's group (all but the RS_STAGES - 1 newest)
		__syncthreads();
		const bf16 *gr = (const bf16 *)(sm + (size_t)(it % RS_STAGES) * sb), *xr = gr + H;
		const bf16 *dr = xr + H;
		const float r = *(const float *)(gr + (ACC ? 3 : 2) * H);
		float gv[RS_V][8], xv[RS_V][8], s = 0.f, kk;

#pragma unroll
		for (int k = 0; k < RS_V; k++) {
			const int j = threadIdx.x + k * blockDim.x;

			if (j < H8) {
				ld8(gv[k], gr + j * 8);
				ld8(xv[k], xr + j * 8);
#pragma unroll
				for (int e = 0; e < 8; e++)
					s += gv[k][e] * wv[k][e] * xv[k][e];
			}
		}
		s = block_sum(s);
		kk = s * r * r * r / H;
#pragma unroll
		for (int k = 0; k < RS_V; k++) {
			const int j = threadIdx.x + k * blockDim.x;
			float d[8];

			if (j >= H8)
				continue;
			if (ACC)
				ld8(d, dr + j * 8);
#pragma unroll
			for (int e = 0; e < 8; e++) {
				const float v = r * wv[k][e] * gv[k][e] - xv[k][e] * kk;

				d[e] = ACC ? d[e] + v : v;
				acc[k][e] += gv[k][e] * xv[k][e] * r;
			}
			st8(dx + (size_t)t * H + j * 8, d);
		}
		__syncthreads();	// the stage is refilled from the next pass on
	}
	cp_wait_all();
#pragma unroll
	for (int k = 0; k < RS_V; k++) {
		const int j = threadIdx.x + k * blockDim.x;

		if (j < H8)
#pragma unroll
			for (int e = 0; e < 8; e++)
				part[(size_t)blockIdx.x * H + j * 8 + e] = acc[k][e];
	}
}

#endif
