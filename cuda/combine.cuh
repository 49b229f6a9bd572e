// combine.cuh: the MoE combine kernels (the routing weights' sum of a token's chosen experts'
// rows, and its backward), included by moe.cu; device code only, so that test/test_moe_emu.cc
// runs them on the host emulation (emu.cuh).
#ifndef SL_COMBINE_CUH
#define SL_COMBINE_CUH

#ifndef MAXK
#define MAXK 32		// most experts a token may choose (Qwen3-MoE: 8)
#endif

__global__ void k_combine_fwd(bf16 *out, const bf16 *y, const float *w, const int *slot, int k,
			      int H)
{
	int t = blockIdx.x;

	for (int h = threadIdx.x; h < H; h += blockDim.x) {
		float acc = 0.f;

		for (int j = 0; j < k; j++) {
			size_t r = (size_t)slot[(size_t)t * k + j];

			acc += w[(size_t)t * k + j] * bf(y[r * H + h]);
		}
		out[(size_t)t * H + h] = tobf(acc);
	}
}

__global__ void k_combine_bwd(bf16 *dy, float *dw, const bf16 *g, const bf16 *y, const float *w,
			      const int *slot, int k, int H)
{
	__shared__ float sh[32];
	int t = blockIdx.x, lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
	int nw = blockDim.x >> 5;

	for (int j = 0; j < k; j++) {
		size_t r = (size_t)slot[(size_t)t * k + j];
		float wj = w[(size_t)t * k + j], dot = 0.f;

		for (int h = threadIdx.x; h < H; h += blockDim.x) {
			float gv = bf(g[(size_t)t * H + h]);

			dot += gv * bf(y[r * H + h]);
			dy[r * H + h] = tobf(wj * gv);
		}
		dot = warp_sum(dot);
		__syncthreads();
		if (!lane)
			sh[wid] = dot;
		__syncthreads();
		if (!threadIdx.x) {
			float s = 0.f;

			for (int i = 0; i < nw; i++)
				s += sh[i];
			dw[(size_t)t * k + j] = s;
		}
	}
}

// The same two on 16-byte words (H a multiple of 8, rows 16-byte aligned): a thread owns 8
// columns and loads a batch of up to CB chosen rows' words before it uses any (the scalar kernels
// issue one 2-byte load after another); combine_bwd reads the token's gradient row once and
// reduces its k dot products together at the end (two barriers instead of two a choice).  The
// forward's sums and every dy are the scalar kernels' bit for bit; dw's sums run in another order.
#define CB 8

// the 16-byte words at column h of chosen rows j0 .. j0 + CB - 1 (those below k; row r at y +
// sr[r]), every load issued before any is used
static __device__ __forceinline__ void rows_word(uint4 *v, const bf16 *y, const size_t *sr,
						 int j0, int k, int h)
{
#pragma unroll
	for (int j = 0; j < CB; j++)
		if (j0 + j < k)
			v[j] = *(const uint4 *)(y + sr[j0 + j] + h);
}

__global__ void k_combine_fwd8(bf16 *out, const bf16 *y, const float *w, const int *slot, int k,
			       int H)
{
	__shared__ size_t sr[MAXK];
	__shared__ float sw[MAXK];
	const int t = blockIdx.x;

	if (threadIdx.x < k) {
		sr[threadIdx.x] = (size_t)slot[(size_t)t * k + threadIdx.x] * H;
		sw[threadIdx.x] = w[(size_t)t * k + threadIdx.x];
	}
	__syncthreads();
	for (int h = threadIdx.x * 8; h < H; h += blockDim.x * 8) {
		float acc[8];

#pragma unroll
		for (int e = 0; e < 8; e++)
			acc[e] = 0.f;
		for (int j0 = 0; j0 < k; j0 += CB) {
			uint4 v[CB];

			rows_word(v, y, sr, j0, k, h);
#pragma unroll
			for (int j = 0; j < CB; j++)
				if (j0 + j < k) {
					float f[8];

					cvt8(f, v[j]);
#pragma unroll
					for (int e = 0; e < 8; e++)
						acc[e] += sw[j0 + j] * f[e];
				}
		}
		st8(out + (size_t)t * H + h, acc);
	}
}

// KM: the most choices it takes (its dot products live in registers): CB, or MAXK
template <int KM>
__global__ void k_combine_bwd8(bf16 *dy, float *dw, const bf16 *g, const bf16 *y, const float *w,
			       const int *slot, int k, int H)
{
	__shared__ size_t sr[KM];
	__shared__ float sw[KM], sh[KM][32];
	const int t = blockIdx.x, lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
	const int nw = blockDim.x >> 5;
	float dot[KM];

	if (threadIdx.x < k) {
		sr[threadIdx.x] = (size_t)slot[(size_t)t * k + threadIdx.x] * H;
		sw[threadIdx.x] = w[(size_t)t * k + threadIdx.x];
	}
#pragma unroll
	for (int j = 0; j < KM; j++)
		dot[j] = 0.f;
	__syncthreads();
	for (int h = threadIdx.x * 8; h < H; h += blockDim.x * 8) {
		float gv[8];

		ld8(gv, g + (size_t)t * H + h);
#pragma unroll
		for (int j0 = 0; j0 < KM; j0 += CB) {
			uint4 v[CB];

			if (j0 >= k)
				break;
			rows_word(v, y, sr, j0, k, h);
#pragma unroll
			for (int j = 0; j < CB; j++)
				if (j0 + j < k) {
					float f[8], o[8];

					cvt8(f, v[j]);
#pragma unroll
					for (int e = 0; e < 8; e++) {
						dot[j0 + j] += gv[e] * f[e];
						o[e] = sw[j0 + j] * gv[e];
					}
					st8(dy + sr[j0 + j] + h, o);
				}
		}
	}
#pragma unroll
	for (int j = 0; j < KM; j++)
		if (j < k) {
			const float d = warp_sum(dot[j]);

			if (!lane)
				sh[j][wid] = d;
		}
	__syncthreads();
	if (threadIdx.x < k) {
		float s = 0.f;

		for (int i = 0; i < nw; i++)
			s += sh[threadIdx.x][i];
		dw[(size_t)t * k + threadIdx.x] = s;
	}
}

#endif
