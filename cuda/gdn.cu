// gdn.cu: the Qwen3.5 hybrid's Gated DeltaNet kernels (issue 12) with their extern "C" launchers:
// the causal depthwise conv + SiLU, the Gated DeltaNet inputs, the gated delta rule and the gated
// RMSNorm (gattn.cu has the gated attention's).  bf16 in memory, fp32 arithmetic, reductions in a
// fixed order (no atomics), so results repeat bit for bit.
//
// The delta rule runs as the plain recurrence, one block per (record, value head) and one thread
// per value column: a column of the state evolves on its own (S = g S + k (b (v - S^T k))^T acts
// column by column), so the forward needs no communication between threads beyond loading k and
// q.  The backward recomputes each 64-position chunk's states from the saved chunk start into
// scratch and walks it backwards.  gdn_chunk.cu has the chunked form of the same ops
// (the default; SHARDLM_GDN_KERNEL=recurrent picks this file's).
#include <cmath>

#include "common.cuh"

#define NT 256
#define GDN_CHUNK 64

static int round32(int n)
{
	return (n + 31) / 32 * 32;
}

#define GRID_LOOP(i, n)                                                                     \
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (n);             \
	     i += (size_t)gridDim.x * blockDim.x)

// ---- causal depthwise conv1d + SiLU -----------------------------------------------------------

// the row that holds x(t - back) of record row t (position p): x's, the halo's for a position
// before 0, or NULL (zeros: no halo)
static __device__ __forceinline__ const bf16 *conv_row(const bf16 *x, const bf16 *halo, int xs,
						       int t, int p, int back, int L, int K)
{
	if (p - back >= 0)
		return x + (size_t)(t - back) * xs;
	if (!halo)
		return NULL;
	return halo + ((size_t)(t / L) * (K - 1) + (K - 1) + (p - back)) * xs;
}

// x(t - back, c) (conv_row's row, element c)
static __device__ __forceinline__ float conv_in(const bf16 *x, const bf16 *halo, int xs, int t,
						int p, int back, int L, int K, int c)
{
	const bf16 *r = conv_row(x, halo, xs, t, p, back, L, K);

	return r ? bf(r[c]) : 0.f;
}

#define CONV_KMAX 8	// the window kernels' bound on K (the models' 4); larger: k_conv_*_any
#define CONV_TPC 32	// tokens a thread walks in the window kernels

// thread (channel, CONV_TPC tokens): the last K inputs in registers, each read once
__global__ void k_conv_fwd(bf16 *out, bf16 *pre, const bf16 *x, int xs, const bf16 *w, int T,
			   int L, int C, int K, const bf16 *halo)
{
	const int c = blockIdx.x * blockDim.x + threadIdx.x, t0 = blockIdx.y * CONV_TPC;
	const int t1 = min(T, t0 + CONV_TPC);
	float wr[CONV_KMAX], in[CONV_KMAX];	// wr[b] = w(c, K - 1 - b); in[b] = x(t - b)
	int p = t0 % L;

	if (c >= C)
		return;
#pragma unroll
	for (int b = 0; b < CONV_KMAX; b++) {
		wr[b] = b < K ? bf(w[(size_t)c * K + K - 1 - b]) : 0.f;
		in[b] = b > 0 && b < K ? conv_in(x, halo, xs, t0, p, b, L, K, c) : 0.f;
	}
	for (int t = t0; t < t1; t++) {
		float acc = 0.f;

		in[0] = bf(x[(size_t)t * xs + c]);
#pragma unroll
		for (int b = 0; b < CONV_KMAX; b++)
			acc += in[b] * wr[b];
		pre[(size_t)t * C + c] = tobf(acc);
		out[(size_t)t * C + c] = tobf(acc * sigm(acc));
		if (++p == L) {		// t + 1 starts a record: its halo, or zeros
			p = 0;
#pragma unroll
			for (int b = CONV_KMAX - 1; b > 0; b--)
				in[b] = b < K && t + 1 < T ?
						conv_in(x, halo, xs, t + 1, 0, b, L, K, c) : 0.f;
		} else {
#pragma unroll
			for (int b = CONV_KMAX - 1; b > 0; b--)
				in[b] = in[b - 1];
		}
	}
}

// the same, one thread per output (K above CONV_KMAX)
__global__ void k_conv_fwd_any(bf16 *out, bf16 *pre, const bf16 *x, int xs, const bf16 *w, int T,
			       int L, int C, int K, const bf16 *halo)
{
	GRID_LOOP(i, (size_t)T * C)
	{
		int t = i / C, c = i % C, p = t % L;
		float acc = 0.f;

		for (int j = 0; j < K; j++)
			acc += conv_in(x, halo, xs, t, p, K - 1 - j, L, K, c) *
			       bf(w[(size_t)c * K + j]);
		pre[i] = tobf(acc);
		out[i] = tobf(acc * sigm(acc));
	}
}

// g times SiLU's derivative at u
static __device__ __forceinline__ float dsilu(float g, float u)
{
	float s = sigm(u);

	return g * s * (1.f + u * (1.f - s));
}

static __device__ __forceinline__ float dsilu_g(const bf16 *g, const bf16 *pre, size_t o)
{
	return dsilu(bf(g[o]), bf(pre[o]));
}

// thread (channel, CONV_TPC tokens) walking down: the next K values of dsilu in registers, each
// computed once
__global__ void k_conv_bwd_dx(bf16 *dx, int xs, const bf16 *g, const bf16 *pre, const bf16 *w,
			      int T, int L, int C, int K)
{
	const int c = blockIdx.x * blockDim.x + threadIdx.x, t0 = blockIdx.y * CONV_TPC;
	const int t1 = min(T, t0 + CONV_TPC);
	float wr[CONV_KMAX], d[CONV_KMAX];	// wr as k_conv_fwd's; d[back] = dsilu(t + back)
	int p = (t1 - 1) % L;

	if (c >= C)
		return;
#pragma unroll
	for (int b = 0; b < CONV_KMAX; b++) {
		wr[b] = b < K ? bf(w[(size_t)c * K + K - 1 - b]) : 0.f;
		d[b] = b < K && p + b < L ? dsilu_g(g, pre, (size_t)(t1 - 1 + b) * C + c) : 0.f;
	}
	for (int t = t1 - 1; t >= t0; t--) {
		float acc = 0.f;

#pragma unroll
		for (int b = 0; b < CONV_KMAX; b++)
			acc += d[b] * wr[b];
		dx[(size_t)t * xs + c] = tobf(acc);
		if (t == t0)
			break;
		if (--p < 0) {		// t - 1 ends a record: nothing past it
			p = L - 1;
#pragma unroll
			for (int b = CONV_KMAX - 1; b > 0; b--)
				d[b] = 0.f;
		} else {
#pragma unroll
			for (int b = CONV_KMAX - 1; b > 0; b--)
				d[b] = d[b - 1];
		}
		d[0] = dsilu_g(g, pre, (size_t)(t - 1) * C + c);
	}
}

// the same, one thread per output (K above CONV_KMAX)
__global__ void k_conv_bwd_dx_any(bf16 *dx, int xs, const bf16 *g, const bf16 *pre,
				  const bf16 *w, int T, int L, int C, int K)
{
	GRID_LOOP(i, (size_t)T * C)
	{
		int t = i / C, c = i % C, p = t % L;
		float acc = 0.f;

		for (int j = 0; j < K; j++) {
			int back = K - 1 - j;

			if (p + back < L)
				acc += dsilu_g(g, pre, (size_t)(t + back) * C + c) *
				       bf(w[(size_t)c * K + j]);
		}
		dx[(size_t)t * xs + c] = tobf(acc);
	}
}

// dw in two passes, in a fixed order (no atomics): thread (channel c, token chunk) sums its
// chunk's tokens for each of the K taps into part(nchunk, C, K); k_dw_final adds the
// chunks in order.  K <= CONV_KMAX; a larger K takes the one-pass kernel.  The thread keeps the
// last K inputs in registers (win[j]: x at position p - (K - 1 - j)), reading each token's once
// and refilling the window where a record starts; the position p counts along (no division a
// token).
__global__ void k_conv_bwd_dw_partial(float *part, const bf16 *g, const bf16 *x, int xs,
				      const bf16 *pre, int T, int L, int C, int K, const bf16 *halo,
				      int tpc)
{
	const int c = blockIdx.x * blockDim.x + threadIdx.x, t0 = blockIdx.y * tpc;
	const int t1 = min(T, t0 + tpc);
	float acc[CONV_KMAX], win[CONV_KMAX];
	int p = t0 % L;

	if (c >= C)
		return;
#pragma unroll
	for (int j = 0; j < CONV_KMAX; j++) {
		const int back = K - 1 - j;

		acc[j] = 0.f;
		win[j] = j < K ? conv_in(x, halo, xs, t0, p, back, L, K, c) : 0.f;
	}
	for (int t = t0; t < t1; t++) {
		if (t > t0 && p == 0) {	// a record starts: the halo's rows, or zeros
#pragma unroll
			for (int j = 0; j < CONV_KMAX; j++)
				win[j] = j < K ? conv_in(x, halo, xs, t, 0, K - 1 - j, L, K, c) : 0.f;
		} else if (t > t0) {	// slide by one token
			const float xt = bf(x[(size_t)t * xs + c]);

#pragma unroll
			for (int j = 0; j < CONV_KMAX; j++)
				win[j] = j + 1 < K ? win[j + 1] : j + 1 == K ? xt : win[j];
		}
		const float d = dsilu_g(g, pre, (size_t)t * C + c);

#pragma unroll
		for (int j = 0; j < CONV_KMAX; j++)
			if (j < K && (p - (K - 1 - j) >= 0 || halo))
				acc[j] += d * win[j];
		if (++p == L)
			p = 0;
	}
#pragma unroll
	for (int j = 0; j < CONV_KMAX; j++)
		if (j < K)
			part[((size_t)blockIdx.y * C + c) * K + j] = acc[j];
}

// the second pass of the two-pass weight gradients here (conv and gated norm): dw(n) += the
// nchunk partials part(nchunk, n), in chunk order
__global__ void k_dw_final(bf16 *dw, const float *part, int nchunk, int CK)
{
	GRID_LOOP(i, (size_t)CK)
	{
		float acc = 0.f;

		for (int k = 0; k < nchunk; k++)
			acc += part[(size_t)k * CK + i];
		dw[i] = tobf(bf(dw[i]) + acc);
	}
}

// one pass, thread per (channel, tap): a kernel size above CONV_KMAX, or no room in the scratch
__global__ void k_conv_bwd_dw(bf16 *dw, const bf16 *g, const bf16 *x, int xs, const bf16 *pre,
			      int T, int L, int C, int K, const bf16 *halo)
{
	GRID_LOOP(i, (size_t)C * K)
	{
		int c = i / K, j = i % K, back = K - 1 - j;
		float acc = 0.f;

		for (int t = 0; t < T; t++)
			if (t % L - back >= 0 || halo)
				acc += dsilu_g(g, pre, (size_t)t * C + c) *
				       conv_in(x, halo, xs, t, t % L, back, L, K, c);
		dw[i] = tobf(bf(dw[i]) + acc);
	}
}

// the halo's row i of record rec (position i - K + 1) feeds the outputs p = i - K + 1 + back >= 0
__global__ void k_conv_bwd_dhalo(bf16 *dhalo, int xs, const bf16 *g, const bf16 *pre,
				 const bf16 *w, int T, int L, int C, int K)
{
	GRID_LOOP(i, (size_t)(T / L) * (K - 1) * C)
	{
		int r = i / C, c = i % C, rec = r / (K - 1), hi = r % (K - 1);
		float acc = 0.f;

		for (int j = 0; j < K; j++) {
			int p = hi - (K - 1) + (K - 1 - j);

			if (p >= 0 && p < L)
				acc += dsilu_g(g, pre, ((size_t)rec * L + p) * C + c) *
				       bf(w[(size_t)c * K + j]);
		}
		dhalo[(size_t)r * xs + c] = tobf(acc);
	}
}

// ---- the same three kernels, 8 channels a thread (the models' shapes) ----------------------------
// A thread of the kernels above moves 2 bytes a token and waits on each load before the next:
// at the Qwen3.5 4B's 8,192 channels they ran at a fifth of the memory's bandwidth or less.
// These take 8 adjacent channels a thread (16-byte loads and stores) and issue the loads of
// CONV_U tokens before using them; the sums are the kernels' above, term for term.  Where C,
// the row strides and the pointers allow it (conv_vec_ok) and K is 4.
#define CV 8
#define CONV_U 4
#define CONV_VK 4	// the kernel size these are built for (the models')
#if CONV_VK != 4
#error "k_conv_bwd_dw_partial8 writes a channel's K taps as one float4"
#endif

static __device__ __forceinline__ uint4 ld_u4(const bf16 *p)
{
	return *(const uint4 *)p;
}

// conv_in for the 8 channels from c
static __device__ __forceinline__ void conv_in8(float *f, const bf16 *x, const bf16 *halo, int xs,
						int t, int p, int back, int L, int K, int c)
{
	const bf16 *r = conv_row(x, halo, xs, t, p, back, L, K);

	if (r) {
		ld8(f, r + c);
	} else {
#pragma unroll
		for (int k = 0; k < CV; k++)
			f[k] = 0.f;
	}
}

// dsilu_g of 8 channels from their raw g and pre
static __device__ __forceinline__ void dsilu8(float *d, uint4 graw, uint4 praw)
{
	float gv[CV], u[CV];

	cvt8(gv, graw);
	cvt8(u, praw);
#pragma unroll
	for (int k = 0; k < CV; k++)
		d[k] = dsilu(gv[k], u[k]);
}

// wr[b][k] = w(c + k, K - 1 - b), as the window kernels' wr
static __device__ __forceinline__ void conv_w8(float (*wr)[CV], const bf16 *w, int c)
{
#pragma unroll
	for (int b = 0; b < CONV_VK; b++)
#pragma unroll
		for (int k = 0; k < CV; k++)
			wr[b][k] = bf(w[(size_t)(c + k) * CONV_VK + CONV_VK - 1 - b]);
}

// a[b] = a[b - 1] for b = K - 1 down to 1 (the window moves one token on)
static __device__ __forceinline__ void conv_shift8(float (*a)[CV])
{
#pragma unroll
	for (int b = CONV_VK - 1; b > 0; b--)
#pragma unroll
		for (int k = 0; k < CV; k++)
			a[b][k] = a[b - 1][k];
}

__global__ void __launch_bounds__(128) k_conv_fwd8(bf16 *out, bf16 *pre, const bf16 *x, int xs,
						   const bf16 *w, int T, int L, int C,
						   const bf16 *halo)
{
	const int K = CONV_VK, c = (blockIdx.x * blockDim.x + threadIdx.x) * CV;
	const int t0 = blockIdx.y * CONV_TPC, t1 = min(T, t0 + CONV_TPC);
	float wr[K][CV], in[K][CV];	// as k_conv_fwd's, for 8 channels
	int p = t0 % L;

	if (c >= C)
		return;
	conv_w8(wr, w, c);
#pragma unroll
	for (int b = 1; b < K; b++)
		conv_in8(in[b], x, halo, xs, t0, p, b, L, K, c);
	for (int tb = t0; tb < t1; tb += CONV_U) {
		uint4 raw[CONV_U];

#pragma unroll
		for (int u = 0; u < CONV_U; u++)
			if (tb + u < t1)
				raw[u] = ld_u4(x + (size_t)(tb + u) * xs + c);
#pragma unroll
		for (int u = 0; u < CONV_U; u++) {
			const int t = tb + u;
			float acc[CV], o[CV];

			if (t >= t1)
				break;
			if (!p && t > t0) {	// a record starts: its halo, or zeros
#pragma unroll
				for (int b = 1; b < K; b++)
					conv_in8(in[b], x, halo, xs, t, 0, b, L, K, c);
			}
			cvt8(in[0], raw[u]);
#pragma unroll
			for (int k = 0; k < CV; k++) {
				acc[k] = 0.f;
#pragma unroll
				for (int b = 0; b < K; b++)
					acc[k] += in[b][k] * wr[b][k];
				o[k] = acc[k] * sigm(acc[k]);
			}
			st8(pre + (size_t)t * C + c, acc);
			st8(out + (size_t)t * C + c, o);
			conv_shift8(in);
			if (++p == L)
				p = 0;
		}
	}
}

__global__ void __launch_bounds__(128) k_conv_bwd_dx8(bf16 *dx, int xs, const bf16 *g,
						      const bf16 *pre, const bf16 *w, int T, int L,
						      int C)
{
	const int K = CONV_VK, c = (blockIdx.x * blockDim.x + threadIdx.x) * CV;
	const int t0 = blockIdx.y * CONV_TPC, t1 = min(T, t0 + CONV_TPC);
	float wr[K][CV], d[K][CV];	// as k_conv_bwd_dx's, for 8 channels
	int p = (t1 - 1) % L;

	if (c >= C)
		return;
	conv_w8(wr, w, c);
#pragma unroll
	for (int b = 0; b < K; b++) {
#pragma unroll
		for (int k = 0; k < CV; k++)
			d[b][k] = 0.f;
		if (p + b < L) {
			size_t o = (size_t)(t1 - 1 + b) * C + c;

			dsilu8(d[b], ld_u4(g + o), ld_u4(pre + o));
		}
	}
	for (int tb = t1 - 1; tb >= t0; tb -= CONV_U) {
		uint4 graw[CONV_U], praw[CONV_U];	// tokens tb - 1 - u: the next d[0]s

#pragma unroll
		for (int u = 0; u < CONV_U; u++)
			if (tb - 1 - u >= t0) {
				size_t o = (size_t)(tb - 1 - u) * C + c;

				graw[u] = ld_u4(g + o);
				praw[u] = ld_u4(pre + o);
			}
#pragma unroll
		for (int u = 0; u < CONV_U; u++) {
			const int t = tb - u;
			float acc[CV];

			if (t < t0)
				break;
#pragma unroll
			for (int k = 0; k < CV; k++) {
				acc[k] = 0.f;
#pragma unroll
				for (int b = 0; b < K; b++)
					acc[k] += d[b][k] * wr[b][k];
			}
			st8(dx + (size_t)t * xs + c, acc);
			if (t == t0)
				break;
			if (--p < 0) {	// t - 1 ends a record: nothing past it
				p = L - 1;
#pragma unroll
				for (int b = K - 1; b > 0; b--)
#pragma unroll
					for (int k = 0; k < CV; k++)
						d[b][k] = 0.f;
			} else {
				conv_shift8(d);
			}
			dsilu8(d[0], graw[u], praw[u]);
		}
	}
}

__global__ void __launch_bounds__(128) k_conv_bwd_dw_partial8(float *part, const bf16 *g,
							      const bf16 *x, int xs,
							      const bf16 *pre, int T, int L,
							      int C, const bf16 *halo, int tpc)
{
	const int K = CONV_VK, c = (blockIdx.x * blockDim.x + threadIdx.x) * CV;
	const int t0 = blockIdx.y * tpc, t1 = min(T, t0 + tpc);
	float acc[K][CV], win[K][CV];	// as k_conv_bwd_dw_partial's, for 8 channels
	int p = t0 % L;

	if (c >= C)
		return;
#pragma unroll
	for (int j = 0; j < K; j++) {
#pragma unroll
		for (int k = 0; k < CV; k++)
			acc[j][k] = 0.f;
		conv_in8(win[j], x, halo, xs, t0, p, K - 1 - j, L, K, c);
	}
	for (int tb = t0; tb < t1; tb += CONV_U) {
		uint4 xraw[CONV_U], graw[CONV_U], praw[CONV_U];

#pragma unroll
		for (int u = 0; u < CONV_U; u++)
			if (tb + u < t1) {
				size_t o = (size_t)(tb + u) * C + c;

				xraw[u] = ld_u4(x + (size_t)(tb + u) * xs + c);
				graw[u] = ld_u4(g + o);
				praw[u] = ld_u4(pre + o);
			}
#pragma unroll
		for (int u = 0; u < CONV_U; u++) {
			const int t = tb + u;
			float d[CV];

			if (t >= t1)
				break;
			if (t > t0 && !p) {	// a record starts: the halo's rows, or zeros
#pragma unroll
				for (int j = 0; j < K; j++)
					conv_in8(win[j], x, halo, xs, t, 0, K - 1 - j, L, K, c);
			} else if (t > t0) {	// slide by one token
#pragma unroll
				for (int j = 0; j + 1 < K; j++)
#pragma unroll
					for (int k = 0; k < CV; k++)
						win[j][k] = win[j + 1][k];
				cvt8(win[K - 1], xraw[u]);
			}
			dsilu8(d, graw[u], praw[u]);
#pragma unroll
			for (int j = 0; j < K; j++)
				if (p - (K - 1 - j) >= 0 || halo) {
#pragma unroll
					for (int k = 0; k < CV; k++)
						acc[j][k] += d[k] * win[j][k];
				}
			if (++p == L)
				p = 0;
		}
	}
	float4 *dst = (float4 *)(part + ((size_t)blockIdx.y * C + c) * K);

#pragma unroll
	for (int k = 0; k < CV; k++)	// part(chunk, c + k, j): CV * K floats in a row
		dst[k] = make_float4(acc[0][k], acc[1][k], acc[2][k], acc[3][k]);
}

// whether the 8-channel kernels take this conv: K 4, C and the row strides in whole 16-byte
// groups, every pointer on 16 bytes
static bool conv_vec_ok(int K, int C, int xs, const void *a, const void *b, const void *x,
			const void *h, const void *d)
{
	return K == CONV_VK && !(C % CV) && !(xs % CV) &&
	       !(((uintptr_t)a | (uintptr_t)b | (uintptr_t)x | (uintptr_t)h | (uintptr_t)d) & 15);
}

extern "C" void sl_cuda_conv1d_silu_fwd(struct sl_cuda *c, void *out, void *pre, const void *x,
					int xs, const void *w, int T, int L, int C, int K,
					const void *halo)
{
	if (conv_vec_ok(K, C, xs, out, pre, x, halo, NULL))
		k_conv_fwd8<<<dim3((C / CV + 127) / 128, (T + CONV_TPC - 1) / CONV_TPC), 128, 0,
			      c->stream>>>((bf16 *)out, (bf16 *)pre, (const bf16 *)x, xs,
					   (const bf16 *)w, T, L, C, (const bf16 *)halo);
	else if (K <= CONV_KMAX)
		k_conv_fwd<<<dim3((C + 127) / 128, (T + CONV_TPC - 1) / CONV_TPC), 128, 0,
			     c->stream>>>((bf16 *)out, (bf16 *)pre, (const bf16 *)x, xs,
					  (const bf16 *)w, T, L, C, K, (const bf16 *)halo);
	else
		k_conv_fwd_any<<<grid_for((size_t)T * C, NT), NT, 0, c->stream>>>(
			(bf16 *)out, (bf16 *)pre, (const bf16 *)x, xs, (const bf16 *)w, T, L, C, K,
			(const bf16 *)halo);
	CUDA_LAUNCHED();
}

extern "C" void sl_cuda_conv1d_silu_bwd(struct sl_cuda *c, void *dx, int xs, void *dw,
					const void *dout, const void *x, const void *pre,
					const void *w, int T, int L, int C, int K, const void *halo,
					void *dhalo)
{
	const bool vec = conv_vec_ok(K, C, xs, dx, dout, x, halo, pre);

	if (vec)
		k_conv_bwd_dx8<<<dim3((C / CV + 127) / 128, (T + CONV_TPC - 1) / CONV_TPC), 128, 0,
				 c->stream>>>((bf16 *)dx, xs, (const bf16 *)dout,
					      (const bf16 *)pre, (const bf16 *)w, T, L, C);
	else if (K <= CONV_KMAX)
		k_conv_bwd_dx<<<dim3((C + 127) / 128, (T + CONV_TPC - 1) / CONV_TPC), 128, 0,
				c->stream>>>((bf16 *)dx, xs, (const bf16 *)dout, (const bf16 *)pre,
					     (const bf16 *)w, T, L, C, K);
	else
		k_conv_bwd_dx_any<<<grid_for((size_t)T * C, NT), NT, 0, c->stream>>>(
			(bf16 *)dx, xs, (const bf16 *)dout, (const bf16 *)pre, (const bf16 *)w, T,
			L, C, K);
	CUDA_LAUNCHED();
	// chunks of 64 tokens, or longer ones where the scratch holds fewer partials
	const size_t row = (size_t)C * K * sizeof(float), cap = c->scratch_bytes / row;
	int nchunk = (T + 63) / 64;

	if ((size_t)nchunk > cap)
		nchunk = (int)cap;
	const int tpc = nchunk > 0 ? (T + nchunk - 1) / nchunk : T;

	if (K <= CONV_KMAX && nchunk > 0) {
		nchunk = (T + tpc - 1) / tpc;
		float *part = sl_cuda_scratch(c, (size_t)nchunk * row, "conv1d dw");

		if (vec)
			k_conv_bwd_dw_partial8<<<dim3((C / CV + 127) / 128, nchunk), 128, 0,
						 c->stream>>>(part, (const bf16 *)dout,
							      (const bf16 *)x, xs,
							      (const bf16 *)pre, T, L, C,
							      (const bf16 *)halo, tpc);
		else
			k_conv_bwd_dw_partial<<<dim3((C + 127) / 128, nchunk), 128, 0,
						c->stream>>>(part, (const bf16 *)dout,
							     (const bf16 *)x, xs, (const bf16 *)pre,
							     T, L, C, K, (const bf16 *)halo, tpc);
		CUDA_LAUNCHED();
		k_dw_final<<<grid_for((size_t)C * K, NT), NT, 0, c->stream>>>(
			(bf16 *)dw, part, nchunk, C * K);
	} else {
		k_conv_bwd_dw<<<grid_for((size_t)C * K, 128), 128, 0, c->stream>>>(
			(bf16 *)dw, (const bf16 *)dout, (const bf16 *)x, xs, (const bf16 *)pre, T, L,
			C, K, (const bf16 *)halo);
	}
	CUDA_LAUNCHED();
	if (dhalo && K > 1) {
		k_conv_bwd_dhalo<<<grid_for((size_t)(T / L) * (K - 1) * C, NT), NT, 0, c->stream>>>(
			(bf16 *)dhalo, xs, (const bf16 *)dout, (const bf16 *)pre, (const bf16 *)w, T,
			L, C, K);
		CUDA_LAUNCHED();
	}
}

// ---- Gated DeltaNet inputs ----------------------------------------------------------------------

static __device__ __forceinline__ float softplus20(float u)
{
	return u > 20.f ? u : log1pf(expf(u));
}

static __device__ __forceinline__ float softplus20_grad(float u)
{
	return u > 20.f ? 1.f : sigm(u);
}

// one warp per (token, q or k head)
__global__ void k_prep_fwd_qk(bf16 *qn, bf16 *kn, float *rqk, const bf16 *qkv, int T, int nk,
			      int dk, int C, float scale)
{
	int wid = (blockIdx.x * blockDim.x + threadIdx.x) >> 5, lane = threadIdx.x & 31;

	if (wid >= T * 2 * nk)
		return;
	int t = wid / (2 * nk), j = wid % (2 * nk);
	const bf16 *x = qkv + (size_t)t * C + (size_t)j * dk;
	bf16 *y = (j < nk ? qn : kn) + (size_t)t * nk * dk + (size_t)(j % nk) * dk;
	float ss = 0.f, r, sc = j < nk ? scale : 1.f;

	for (int i = lane; i < dk; i += 32)
		ss += bf(x[i]) * bf(x[i]);
	ss = warp_sum(ss);
	r = rsqrtf(ss + 1e-6f);
	if (!lane)
		rqk[(size_t)t * 2 * nk + j] = r;
	for (int i = lane; i < dk; i += 32)
		y[i] = tobf(bf(x[i]) * r * sc);
}

__global__ void k_prep_fwd_bg(float *beta, float *g, const bf16 *ab, int abs, const bf16 *A_log,
			      const bf16 *dt, int T, int nv)
{
	GRID_LOOP(i, (size_t)T * nv)
	{
		int t = i / nv, h = i % nv;
		float b = bf(ab[(size_t)t * abs + h]), a = bf(ab[(size_t)t * abs + nv + h]);

		beta[i] = sigm(b);
		g[i] = -expf(bf(A_log[h])) * softplus20(a + bf(dt[h]));
	}
}

__global__ void k_prep_bwd_qk(bf16 *dqkv, const bf16 *dqn, const bf16 *dkn, const bf16 *qkv,
			      const float *rqk, int T, int nk, int dk, int C, float scale)
{
	int wid = (blockIdx.x * blockDim.x + threadIdx.x) >> 5, lane = threadIdx.x & 31;

	if (wid >= T * 2 * nk)
		return;
	int t = wid / (2 * nk), j = wid % (2 * nk);
	const bf16 *x = qkv + (size_t)t * C + (size_t)j * dk;
	const bf16 *dy = (j < nk ? dqn : dkn) + (size_t)t * nk * dk + (size_t)(j % nk) * dk;
	bf16 *dx = dqkv + (size_t)t * C + (size_t)j * dk;
	float r = rqk[(size_t)t * 2 * nk + j], sc = j < nk ? scale : 1.f, s = 0.f;

	for (int i = lane; i < dk; i += 32)
		s += bf(x[i]) * bf(dy[i]);
	s = warp_sum(s);
	for (int i = lane; i < dk; i += 32)
		dx[i] = tobf(sc * (r * bf(dy[i]) - r * r * r * bf(x[i]) * s));
}

__global__ void k_prep_bwd_ab(bf16 *dab, int abs, const bf16 *dbeta, const bf16 *dg,
			      const bf16 *ab, const float *beta, const bf16 *A_log, const bf16 *dt,
			      int T, int nv)
{
	GRID_LOOP(i, (size_t)T * nv)
	{
		int t = i / nv, h = i % nv;
		float b = beta[i], u = bf(ab[(size_t)t * abs + nv + h]) + bf(dt[h]);

		dab[(size_t)t * abs + h] = tobf(bf(dbeta[i]) * b * (1.f - b));
		dab[(size_t)t * abs + nv + h] =
			tobf(bf(dg[i]) * -expf(bf(A_log[h])) * softplus20_grad(u));
	}
}

// one block per value head: dA_log += sum dg g, ddt_bias += sum dg dg/du
__global__ void k_prep_bwd_params(bf16 *dA, bf16 *ddt, const bf16 *dg, const float *g,
				  const bf16 *ab, int abs, const bf16 *A_log, const bf16 *dt,
				  int T, int nv)
{
	int h = blockIdx.x;
	float sa = 0.f, sd = 0.f, A = expf(bf(A_log[h]));

	for (int t = threadIdx.x; t < T; t += blockDim.x) {
		float d = bf(dg[(size_t)t * nv + h]);
		float u = bf(ab[(size_t)t * abs + nv + h]) + bf(dt[h]);

		sa += d * g[(size_t)t * nv + h];
		sd += d * -A * softplus20_grad(u);
	}
	sa = block_sum(sa);
	sd = block_sum(sd);
	if (!threadIdx.x) {
		dA[h] = tobf(bf(dA[h]) + sa);
		ddt[h] = tobf(bf(ddt[h]) + sd);
	}
}

extern "C" void sl_cuda_gdn_prep_fwd(struct sl_cuda *c, void *qn, void *kn, float *rqk,
				     float *beta, float *g, const void *qkv, const void *ab,
				     int abs, const void *A_log, const void *dt_bias, int T, int nk,
				     int nv, int dk, int dv)
{
	int C = 2 * nk * dk + nv * dv;
	size_t warps = (size_t)T * 2 * nk;

	k_prep_fwd_qk<<<(unsigned)((warps * 32 + NT - 1) / NT), NT, 0, c->stream>>>(
		(bf16 *)qn, (bf16 *)kn, rqk, (const bf16 *)qkv, T, nk, dk, C, 1.f / sqrtf(dk));
	CUDA_LAUNCHED();
	k_prep_fwd_bg<<<grid_for((size_t)T * nv, NT), NT, 0, c->stream>>>(
		beta, g, (const bf16 *)ab, abs, (const bf16 *)A_log, (const bf16 *)dt_bias, T, nv);
	CUDA_LAUNCHED();
}

extern "C" void sl_cuda_gdn_prep_bwd(struct sl_cuda *c, void *dqkv, void *dab, int abs,
				     void *dA_log, void *ddt_bias, const void *dqn,
				     const void *dkn, const void *dbeta, const void *dg,
				     const void *qkv, const void *ab, const float *rqk,
				     const float *beta, const float *g, const void *A_log,
				     const void *dt_bias, int T, int nk, int nv, int dk, int dv)
{
	int C = 2 * nk * dk + nv * dv;
	size_t warps = (size_t)T * 2 * nk;

	k_prep_bwd_qk<<<(unsigned)((warps * 32 + NT - 1) / NT), NT, 0, c->stream>>>(
		(bf16 *)dqkv, (const bf16 *)dqn, (const bf16 *)dkn, (const bf16 *)qkv, rqk, T, nk,
		dk, C, 1.f / sqrtf(dk));
	CUDA_LAUNCHED();
	k_prep_bwd_ab<<<grid_for((size_t)T * nv, NT), NT, 0, c->stream>>>(
		(bf16 *)dab, abs, (const bf16 *)dbeta, (const bf16 *)dg, (const bf16 *)ab, beta,
		(const bf16 *)A_log, (const bf16 *)dt_bias, T, nv);
	CUDA_LAUNCHED();
	k_prep_bwd_params<<<nv, NT, 0, c->stream>>>((bf16 *)dA_log, (bf16 *)ddt_bias,
						    (const bf16 *)dg, g, (const bf16 *)ab, abs,
						    (const bf16 *)A_log, (const bf16 *)dt_bias, T,
						    nv);
	CUDA_LAUNCHED();
}

// ---- the gated delta rule ------------------------------------------------------------------------

// block (record, value head); thread j < dv owns column j of S (shared, dk x dv)
__global__ void k_rule_fwd(bf16 *o, float *states, const bf16 *qn, const bf16 *kn, const bf16 *v,
			   int vs, const float *beta, const float *g, const int *lens, int L, int rs,
			   int nk, int nv, int dk, int dv, const float *s0, float *s_end)
{
	extern __shared__ float sm[];
	float *S = sm, *kk = S + (size_t)dk * dv, *qq = kk + dk;
	int b = blockIdx.x / nv, h = blockIdx.x % nv, kh = h / (nv / nk), len = lens[b];
	int j = threadIdx.x, nch = (L + GDN_CHUNK - 1) / GDN_CHUNK;
	size_t SS = (size_t)dk * dv;

	if (j < dv)
		for (int i = 0; i < dk; i++)
			S[(size_t)i * dv + j] =
				s0 ? s0[(size_t)blockIdx.x * SS + (size_t)i * dv + j] : 0.f;
	for (int p = 0; p < L; p++) {
		size_t t = (size_t)b * rs + p;

		if (p % GDN_CHUNK == 0 && j < dv) {
			float *sv = states + (((size_t)b * nch + p / GDN_CHUNK) * nv + h) * SS;

			for (int i = 0; i < dk; i++)
				sv[(size_t)i * dv + j] = S[(size_t)i * dv + j];
		}
		if (p >= len) {
			if (j < dv)
				o[t * nv * dv + (size_t)h * dv + j] = tobf(0.f);
			continue;
		}
		__syncthreads();
		for (int i = j; i < dk; i += blockDim.x) {
			kk[i] = bf(kn[t * nk * dk + (size_t)kh * dk + i]);
			qq[i] = bf(qn[t * nk * dk + (size_t)kh * dk + i]);
		}
		__syncthreads();
		if (j < dv) {
			float gam = expf(g[t * nv + h]), bet = beta[t * nv + h];
			float vj = bf(v[t * vs + (size_t)h * dv + j]), pred = 0.f, d, acc = 0.f;

			for (int i = 0; i < dk; i++) {
				float s = S[(size_t)i * dv + j] * gam;

				S[(size_t)i * dv + j] = s;
				pred += s * kk[i];
			}
			d = bet * (vj - pred);
			for (int i = 0; i < dk; i++) {
				float s = S[(size_t)i * dv + j] + kk[i] * d;

				S[(size_t)i * dv + j] = s;
				acc += s * qq[i];
			}
			o[t * nv * dv + (size_t)h * dv + j] = tobf(acc);
		}
	}
	if (s_end && j < dv)	// column j is this thread's alone: no barrier needed
		for (int i = 0; i < dk; i++)
			s_end[(size_t)blockIdx.x * SS + (size_t)i * dv + j] = S[(size_t)i * dv + j];
}

// block (record, key head) of a wave: the value heads of the group one after the other (their
// dq, dk add up in a fixed order); hist: (CHUNK + 1) states of dk x dv per block
__global__ void k_rule_bwd(bf16 *dqn, bf16 *dkn, bf16 *dval, bf16 *dbeta, bf16 *dg,
			   const bf16 *dout, const float *states, const bf16 *qn, const bf16 *kn,
			   const bf16 *v, int vs, const float *beta, const float *g,
			   const int *lens, int L, int rs, int nk, int nv, int dk, int dv, int first,
			   float *hist_all, const float *ds_end, float *ds0)
{
	extern __shared__ float sm[];
	const int ld = dv + 1;	// padded rows: row and column walks are both conflict-free
	float *dS = sm, *kk = dS + (size_t)dk * ld, *qq = kk + dk, *dO = qq + dk;
	float *dl = dO + dv, *dp = dl + dv;
	int bk = first + blockIdx.x, b = bk / nk, kh = bk % nk, len = lens[b], grp = nv / nk;
	int tid = threadIdx.x, nch = (L + GDN_CHUNK - 1) / GDN_CHUNK;
	size_t SS = (size_t)dk * dv;
	float *hist = hist_all + (size_t)blockIdx.x * (GDN_CHUNK + 1) * SS;

	for (int hi = 0; hi < grp; hi++) {
		int h = kh * grp + hi;

		for (int p = len; p < L; p++) {
			size_t t = (size_t)b * rs + p;

			for (int x = tid; x < dv; x += blockDim.x)
				dval[t * vs + (size_t)h * dv + x] = tobf(0.f);
			if (!tid) {
				dbeta[t * nv + h] = tobf(0.f);
				dg[t * nv + h] = tobf(0.f);
			}
			if (!hi)
				for (int x = tid; x < dk; x += blockDim.x) {
					dqn[t * nk * dk + (size_t)kh * dk + x] = tobf(0.f);
					dkn[t * nk * dk + (size_t)kh * dk + x] = tobf(0.f);
				}
		}
		__syncthreads();	// the previous head's ds0 read dS
		for (int i = tid; i < dk * ld; i += blockDim.x)
			dS[i] = ds_end && i % ld < dv ?
				ds_end[((size_t)b * nv + h) * SS + (size_t)(i / ld) * dv + i % ld] :
				0.f;
		for (int ch = len > 0 ? (len - 1) / GDN_CHUNK : -1; ch >= 0; ch--) {
			int c0 = ch * GDN_CHUNK, c1 = min(c0 + GDN_CHUNK, len);
			const float *sv = states + (((size_t)b * nch + ch) * nv + h) * SS;

			// the chunk's states: hist[s] = S before position c0 + s
			__syncthreads();
			if (tid < dv)
				for (int i = 0; i < dk; i++)
					hist[(size_t)i * dv + tid] = sv[(size_t)i * dv + tid];
			for (int p = c0; p < c1; p++) {
				size_t t = (size_t)b * rs + p;
				const float *Sp = hist + (size_t)(p - c0) * SS;
				float *Sn = hist + (size_t)(p - c0 + 1) * SS;

				__syncthreads();
				for (int i = tid; i < dk; i += blockDim.x)
					kk[i] = bf(kn[t * nk * dk + (size_t)kh * dk + i]);
				__syncthreads();
				if (tid < dv) {
					float gam = expf(g[t * nv + h]), bet = beta[t * nv + h];
					float pred = 0.f, d;

					for (int i = 0; i < dk; i++)
						pred += gam * Sp[(size_t)i * dv + tid] * kk[i];
					d = bet * (bf(v[t * vs + (size_t)h * dv + tid]) - pred);
					for (int i = 0; i < dk; i++)
						Sn[(size_t)i * dv + tid] =
							gam * Sp[(size_t)i * dv + tid] + kk[i] * d;
				}
			}
			for (int p = c1 - 1; p >= c0; p--) {
				size_t t = (size_t)b * rs + p;
				const float *Sp = hist + (size_t)(p - c0) * SS, *Sn = Sp + SS;
				float gam = expf(g[t * nv + h]), bet = beta[t * nv + h];
				float dbet = 0.f, dgam = 0.f;
				size_t qo = t * nk * dk + (size_t)kh * dk;

				__syncthreads();
				for (int i = tid; i < dk; i += blockDim.x) {
					kk[i] = bf(kn[qo + i]);
					qq[i] = bf(qn[qo + i]);
				}
				for (int x = tid; x < dv; x += blockDim.x)
					dO[x] = bf(dout[t * nv * dv + (size_t)h * dv + x]);
				__syncthreads();
				// o = S_p^T q
				if (tid < dv)
					for (int i = 0; i < dk; i++)
						dS[(size_t)i * ld + tid] += qq[i] * dO[tid];
				if (tid < dk) {
					float a = 0.f;

					for (int x = 0; x < dv; x++)
						a += Sn[(size_t)tid * dv + x] * dO[x];
					a += hi ? bf(dqn[qo + tid]) : 0.f;
					dqn[qo + tid] = tobf(a);
				}
				__syncthreads();
				// S_p = S_a + k delta^T, S_a = gam S_{p-1}, pred = S_a^T k
				if (tid < dv) {
					float pr = 0.f, dd = 0.f, vj;

					for (int i = 0; i < dk; i++) {
						pr += gam * Sp[(size_t)i * dv + tid] * kk[i];
						dd += dS[(size_t)i * ld + tid] * kk[i];
					}
					vj = bf(v[t * vs + (size_t)h * dv + tid]);
					dl[tid] = bet * (vj - pr);
					dp[tid] = -bet * dd;
					dbet = dd * (vj - pr);
					dval[t * vs + (size_t)h * dv + tid] = tobf(bet * dd);
				}
				dbet = block_sum(dbet);
				if (tid < dk) {
					float a = 0.f;

					for (int x = 0; x < dv; x++)
						a += dS[(size_t)tid * ld + x] * dl[x] +
						     gam * Sp[(size_t)tid * dv + x] * dp[x];
					a += hi ? bf(dkn[qo + tid]) : 0.f;
					dkn[qo + tid] = tobf(a);
				}
				__syncthreads();
				if (tid < dv)
					for (int i = 0; i < dk; i++) {
						float ds = dS[(size_t)i * ld + tid] + kk[i] * dp[tid];

						dgam += ds * Sp[(size_t)i * dv + tid];
						dS[(size_t)i * ld + tid] = gam * ds;
					}
				dgam = block_sum(dgam);
				if (!tid) {
					dbeta[t * nv + h] = tobf(dbet);
					dg[t * nv + h] = tobf(gam * dgam);
				}
			}
		}
		if (ds0) {
			__syncthreads();
			for (int i = tid; i < dk * dv; i += blockDim.x)
				ds0[((size_t)b * nv + h) * SS + i] = dS[(size_t)(i / dv) * ld + i % dv];
		}
	}
}

static size_t rule_fwd_smem(int dk, int dv)
{
	return ((size_t)dk * dv + 2 * dk) * sizeof(float);
}

static size_t rule_bwd_smem(int dk, int dv)
{
	return ((size_t)dk * (dv + 1) + 2 * dk + 3 * dv) * sizeof(float);
}

extern "C" void sl_cuda_gdn_rule_fwd(struct sl_cuda *c, void *o, float *states, const void *qn,
				     const void *kn, const void *v, int vs, const float *beta,
				     const float *g, const int *lens, int B, int L, int rs, int nk,
				     int nv, int dk, int dv, const float *s0, float *s_end)
{
	size_t smem = rule_fwd_smem(dk, dv);
	int threads = round32(dv > dk ? dv : dk);

	if (threads > 1024 || smem > 227 * 1024) {
		fprintf(stderr, "cuda: gated delta rule with key dim %d, value dim %d is too large\n",
			dk, dv);
		abort();
	}
	CUDA_CHECK(cudaFuncSetAttribute(k_rule_fwd, cudaFuncAttributeMaxDynamicSharedMemorySize,
					(int)smem));
	k_rule_fwd<<<B * nv, threads, smem, c->stream>>>(
		(bf16 *)o, states, (const bf16 *)qn, (const bf16 *)kn, (const bf16 *)v, vs, beta, g,
		lens, L, rs, nk, nv, dk, dv, s0, s_end);
	CUDA_LAUNCHED();
}

extern "C" void sl_cuda_gdn_rule_bwd(struct sl_cuda *c, void *dqn, void *dkn, void *dval,
				     void *dbeta, void *dg, const void *dout, const float *states,
				     const void *qn, const void *kn, const void *v, int vs,
				     const float *beta, const float *g, const int *lens, int B,
				     int L, int rs, int nk, int nv, int dk, int dv,
				     const float *ds_end, float *ds0)
{
	size_t smem = rule_bwd_smem(dk, dv), hist = (size_t)(GDN_CHUNK + 1) * dk * dv * 4;
	int threads = round32(dv > dk ? dv : dk), per_wave = (int)(c->scratch_bytes / hist);
	float *scratch;

	if (threads > 1024 || smem > 227 * 1024 || per_wave < 1) {
		fprintf(stderr, "cuda: gated delta rule with key dim %d, value dim %d is too large\n",
			dk, dv);
		abort();
	}
	if (per_wave > B * nk)
		per_wave = B * nk;
	scratch = sl_cuda_scratch(c, (size_t)per_wave * hist, "gated delta rule backward");
	CUDA_CHECK(cudaFuncSetAttribute(k_rule_bwd, cudaFuncAttributeMaxDynamicSharedMemorySize,
					(int)smem));
	for (int first = 0; first < B * nk; first += per_wave) {
		int n = B * nk - first < per_wave ? B * nk - first : per_wave;

		k_rule_bwd<<<n, threads, smem, c->stream>>>(
			(bf16 *)dqn, (bf16 *)dkn, (bf16 *)dval, (bf16 *)dbeta, (bf16 *)dg,
			(const bf16 *)dout, states, (const bf16 *)qn, (const bf16 *)kn,
			(const bf16 *)v, vs, beta, g, lens, L, rs, nk, nv, dk, dv, first, scratch,
			ds_end, ds0);
		CUDA_LAUNCHED();
	}
}

// ---- gated RMSNorm --------------------------------------------------------------------------------

// the gate z sigm(z); y = w (x r) gate, one row's term of dw: dy x r gate (r: the row's
// 1 / rms); with gw = dy w, dz = gw x r (the gate's derivative)
static __device__ __forceinline__ float gn_gate(float z)
{
	return z * sigm(z);
}

static __device__ __forceinline__ float gn_out(float w, float x, float r, float z)
{
	return w * (x * r) * gn_gate(z);
}

static __device__ __forceinline__ float gn_dw(float g, float x, float r, float z)
{
	return g * x * r * gn_gate(z);
}

static __device__ __forceinline__ float gn_dz(float gw, float x, float r, float z)
{
	float sz = sigm(z);

	return gw * x * r * sz * (1.f + z * (1.f - sz));
}

// one warp per (token, head) row of d
__global__ void k_gnorm_fwd(bf16 *out, float *rstd, const bf16 *x, const bf16 *z, int zs,
			    const bf16 *w, int T, int nh, int d, float eps)
{
	int row = (blockIdx.x * blockDim.x + threadIdx.x) >> 5, lane = threadIdx.x & 31;

	if (row >= T * nh)
		return;
	int t = row / nh, h = row % nh;
	const bf16 *xr = x + (size_t)row * d, *zr = z + (size_t)t * zs + (size_t)h * d;
	float ss = 0.f, r;

	for (int i = lane; i < d; i += 32)
		ss += bf(xr[i]) * bf(xr[i]);
	r = rsqrtf(warp_sum(ss) / d + eps);
	if (!lane)
		rstd[row] = r;
	for (int i = lane; i < d; i += 32) {
		float zv = bf(zr[i]);

		out[(size_t)row * d + i] = tobf(gn_out(bf(w[i]), bf(xr[i]), r, zv));
	}
}

__global__ void k_gnorm_bwd(bf16 *dx, bf16 *dz, int zs, const bf16 *g, const bf16 *x,
			    const bf16 *z, const bf16 *w, const float *rstd, int T, int nh, int d)
{
	int row = (blockIdx.x * blockDim.x + threadIdx.x) >> 5, lane = threadIdx.x & 31;

	if (row >= T * nh)
		return;
	int t = row / nh, h = row % nh;
	const bf16 *xr = x + (size_t)row * d, *zr = z + (size_t)t * zs + (size_t)h * d;
	const bf16 *gr = g + (size_t)row * d;
	float r = rstd[row], s = 0.f;

	for (int i = lane; i < d; i += 32) {
		float zv = bf(zr[i]), xv = bf(xr[i]), gw = bf(gr[i]) * bf(w[i]);

		s += gw * gn_gate(zv) * xv;
		dz[(size_t)t * zs + (size_t)h * d + i] = tobf(gn_dz(gw, xv, r, zv));
	}
	s = warp_sum(s);
	for (int i = lane; i < d; i += 32) {
		float dxh = bf(gr[i]) * bf(w[i]) * gn_gate(bf(zr[i]));

		dx[(size_t)row * d + i] = tobf(r * dxh - bf(xr[i]) * s * r * r * r / d);
	}
}

// dw in two passes, in a fixed order (no atomics): block = GNORM_RPB rows; warp w sums rows w,
// w + 8, ... of them, lane l the elements l, l + 32, ... (coalesced), then the block adds its
// warps in order into part(nchunk, d); k_dw_final adds the chunks in order.  d <= 32 *
// GNORM_EPL (the models' 128); a larger d takes the one-pass kernel.
#define GNORM_RPB 512
#define GNORM_EPL 8
__global__ void __launch_bounds__(NT) k_gnorm_dw_partial(float *part, const bf16 *g, const bf16 *x,
							 const bf16 *z, int zs, const float *rstd,
							 int T, int nh, int d)
{
	__shared__ float red[NT / 32][32 * GNORM_EPL];
	const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, rows = T * nh;
	const int r0 = blockIdx.x * GNORM_RPB, r1 = min(rows, r0 + GNORM_RPB);
	float acc[GNORM_EPL];

#pragma unroll
	for (int e = 0; e < GNORM_EPL; e++)
		acc[e] = 0.f;
	for (int row = r0 + warp; row < r1; row += NT / 32) {
		int t = row / nh, h = row % nh;
		const bf16 *zr = z + (size_t)t * zs + (size_t)h * d;
		float r = rstd[row];

#pragma unroll
		for (int e = 0; e < GNORM_EPL; e++) {
			int i = lane + 32 * e;

			if (i < d) {
				acc[e] += gn_dw(bf(g[(size_t)row * d + i]),
						bf(x[(size_t)row * d + i]), r, bf(zr[i]));
			}
		}
	}
#pragma unroll
	for (int e = 0; e < GNORM_EPL; e++)
		red[warp][lane + 32 * e] = acc[e];
	__syncthreads();
	for (int i = threadIdx.x; i < d; i += NT) {
		float a = 0.f;

		for (int w = 0; w < NT / 32; w++)
			a += red[w][i];
		part[(size_t)blockIdx.x * d + i] = a;
	}
}

// one pass, one block per element i of the weight (d above 32 * GNORM_EPL, or no scratch)
__global__ void k_gnorm_dw(bf16 *dw, const bf16 *g, const bf16 *x, const bf16 *z, int zs,
			   const float *rstd, int T, int nh, int d)
{
	int i = blockIdx.x;
	float acc = 0.f;

	for (int row = threadIdx.x; row < T * nh; row += blockDim.x) {
		int t = row / nh, h = row % nh;
		float zv = bf(z[(size_t)t * zs + (size_t)h * d + i]);

		acc += gn_dw(bf(g[(size_t)row * d + i]), bf(x[(size_t)row * d + i]), rstd[row], zv);
	}
	acc = block_sum(acc);
	if (!threadIdx.x)
		dw[i] = tobf(bf(dw[i]) + acc);
}

// ---- the same, 4 adjacent elements a lane (d 128 or 256) -----------------------------------------
// The kernels above load 2 bytes a lane at a time, a load waiting on the one before: at the 4B's
// rows of 128 they ran at a third of the memory's bandwidth or less.  Here every load of a row is
// issued first, 8 bytes a lane; the dw partials take two rows a warp at a time.  The row sums
// go lane by lane in another order than above (rounding differs, not the math).
#define GN_NVMAX 2

#define GN_AT(p, v) (*(const uint2 *)((p) + 4 * lane + 128 * (v)))
#define GN_PUT(p, v, f) (*(uint2 *)((p) + 4 * lane + 128 * (v)) = pack4(f))

template <int NV>
__global__ void k_gnorm_fwd4(bf16 *out, float *rstd, const bf16 *x, const bf16 *z, int zs,
			     const bf16 *w, int T, int nh, float eps)
{
	const int d = 128 * NV, row = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
	const int lane = threadIdx.x & 31;

	if (row >= T * nh)
		return;
	const int t = row / nh, h = row % nh;
	const bf16 *xr = x + (size_t)row * d, *zr = z + (size_t)t * zs + (size_t)h * d;
	uint2 xu[NV], zu[NV], wu[NV];
	float ss = 0.f, r;

#pragma unroll
	for (int v = 0; v < NV; v++) {
		xu[v] = GN_AT(xr, v);
		zu[v] = GN_AT(zr, v);
		wu[v] = GN_AT(w, v);
	}
#pragma unroll
	for (int v = 0; v < NV; v++) {
		float xv[4];

		cvt4(xv, xu[v]);
#pragma unroll
		for (int e = 0; e < 4; e++)
			ss += xv[e] * xv[e];
	}
	r = rsqrtf(warp_sum(ss) / d + eps);
	if (!lane)
		rstd[row] = r;
#pragma unroll
	for (int v = 0; v < NV; v++) {
		float xv[4], zv[4], wv[4], o[4];

		cvt4(xv, xu[v]);
		cvt4(zv, zu[v]);
		cvt4(wv, wu[v]);
#pragma unroll
		for (int e = 0; e < 4; e++)
			o[e] = gn_out(wv[e], xv[e], r, zv[e]);
		GN_PUT(out + (size_t)row * d, v, o);
	}
}

template <int NV>
__global__ void k_gnorm_bwd4(bf16 *dx, bf16 *dz, int zs, const bf16 *g, const bf16 *x,
			     const bf16 *z, const bf16 *w, const float *rstd, int T, int nh)
{
	const int d = 128 * NV, row = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
	const int lane = threadIdx.x & 31;

	if (row >= T * nh)
		return;
	const int t = row / nh, h = row % nh;
	const size_t zo = (size_t)t * zs + (size_t)h * d;
	const bf16 *xr = x + (size_t)row * d, *zr = z + zo, *gr = g + (size_t)row * d;
	uint2 xu[NV], zu[NV], gu[NV], wu[NV];
	float r = rstd[row], s = 0.f, dxh[NV][4];

#pragma unroll
	for (int v = 0; v < NV; v++) {
		xu[v] = GN_AT(xr, v);
		zu[v] = GN_AT(zr, v);
		gu[v] = GN_AT(gr, v);
		wu[v] = GN_AT(w, v);
	}
#pragma unroll
	for (int v = 0; v < NV; v++) {
		float xv[4], zv[4], gv[4], wv[4], dzv[4];

		cvt4(xv, xu[v]);
		cvt4(zv, zu[v]);
		cvt4(gv, gu[v]);
		cvt4(wv, wu[v]);
#pragma unroll
		for (int e = 0; e < 4; e++) {
			float gw = gv[e] * wv[e];

			dxh[v][e] = gw * gn_gate(zv[e]);
			s += dxh[v][e] * xv[e];
			dzv[e] = gn_dz(gw, xv[e], r, zv[e]);
		}
		GN_PUT(dz + zo, v, dzv);
	}
	s = warp_sum(s);
#pragma unroll
	for (int v = 0; v < NV; v++) {
		float xv[4], o[4];

		cvt4(xv, xu[v]);
#pragma unroll
		for (int e = 0; e < 4; e++)
			o[e] = r * dxh[v][e] - xv[e] * s * r * r * r / d;
		GN_PUT(dx + (size_t)row * d, v, o);
	}
}

// k_gnorm_dw_partial's sums (rows w, w + 8, ... of the block's GNORM_RPB by warp w, in order),
// two rows' loads at a time
template <int NV>
__global__ void __launch_bounds__(NT) k_gnorm_dw_partial4(float *part, const bf16 *g,
							  const bf16 *x, const bf16 *z, int zs,
							  const float *rstd, int T, int nh)
{
	__shared__ float red[NT / 32][128 * NV];
	const int d = 128 * NV, warp = threadIdx.x >> 5, lane = threadIdx.x & 31, rows = T * nh;
	const int r0 = blockIdx.x * GNORM_RPB, r1 = min(rows, r0 + GNORM_RPB);
	float acc[NV][4];

#pragma unroll
	for (int v = 0; v < NV; v++)
#pragma unroll
		for (int e = 0; e < 4; e++)
			acc[v][e] = 0.f;
	for (int row = r0 + warp; row < r1; row += 2 * (NT / 32)) {
		uint2 xu[2][NV], zu[2][NV], gu[2][NV];
		float rr[2];

#pragma unroll
		for (int i = 0; i < 2; i++) {
			const int ri = row + i * (NT / 32);

			if (ri < r1) {
				const int t = ri / nh, h = ri % nh;

				rr[i] = rstd[ri];
#pragma unroll
				for (int v = 0; v < NV; v++) {
					xu[i][v] = GN_AT(x + (size_t)ri * d, v);
					gu[i][v] = GN_AT(g + (size_t)ri * d, v);
					zu[i][v] = GN_AT(z + (size_t)t * zs + (size_t)h * d, v);
				}
			}
		}
#pragma unroll
		for (int i = 0; i < 2; i++) {
			if (row + i * (NT / 32) >= r1)
				break;
#pragma unroll
			for (int v = 0; v < NV; v++) {
				float xv[4], zv[4], gv[4];

				cvt4(xv, xu[i][v]);
				cvt4(zv, zu[i][v]);
				cvt4(gv, gu[i][v]);
#pragma unroll
				for (int e = 0; e < 4; e++)
					acc[v][e] += gn_dw(gv[e], xv[e], rr[i], zv[e]);
			}
		}
	}
#pragma unroll
	for (int v = 0; v < NV; v++)
#pragma unroll
		for (int e = 0; e < 4; e++)
			red[warp][4 * lane + 128 * v + e] = acc[v][e];
	__syncthreads();
	for (int i = threadIdx.x; i < d; i += NT) {
		float a = 0.f;

		for (int w = 0; w < NT / 32; w++)
			a += red[w][i];
		part[(size_t)blockIdx.x * d + i] = a;
	}
}

// whether the 4-element kernels take this norm: d = 128 NV, z's stride and every pointer on
// 8 bytes
static int gnorm_nv(int d, int zs, const void *a, const void *b, const void *x, const void *z,
		    const void *w, const void *e)
{
	if (d % 128 || d > 128 * GN_NVMAX || zs % 4 ||
	    (((uintptr_t)a | (uintptr_t)b | (uintptr_t)x | (uintptr_t)z | (uintptr_t)w |
	      (uintptr_t)e) & 7))
		return 0;
	return d / 128;
}

extern "C" void sl_cuda_gated_rmsnorm_fwd(struct sl_cuda *c, void *out, float *rstd,
					  const void *x, const void *z, int zs, const void *w,
					  int T, int nh, int d, float eps)
{
	size_t rows = (size_t)T * nh;
	const unsigned nb = (unsigned)((rows * 32 + NT - 1) / NT);

	switch (gnorm_nv(d, zs, out, NULL, x, z, w, NULL)) {
#define GN_FWD(NV)                                                                               \
	case NV:                                                                                 \
		k_gnorm_fwd4<NV><<<nb, NT, 0, c->stream>>>((bf16 *)out, rstd, (const bf16 *)x,   \
							   (const bf16 *)z, zs, (const bf16 *)w, \
							   T, nh, eps);                          \
		break;
		GN_FWD(1)
		GN_FWD(2)
#undef GN_FWD
	default:
		k_gnorm_fwd<<<nb, NT, 0, c->stream>>>((bf16 *)out, rstd, (const bf16 *)x,
						     (const bf16 *)z, zs, (const bf16 *)w, T, nh,
						     d, eps);
	}
	CUDA_LAUNCHED();
}

extern "C" void sl_cuda_gated_rmsnorm_bwd(struct sl_cuda *c, void *dx, void *dz, int zs,
					  void *dw, const void *dout, const void *x,
					  const void *z, const void *w, const float *rstd, int T,
					  int nh, int d, float eps)
{
	size_t rows = (size_t)T * nh;
	const unsigned nb = (unsigned)((rows * 32 + NT - 1) / NT);
	const int nv = gnorm_nv(d, zs, dx, dz, x, z, w, dout);

	switch (nv) {
#define GN_BWD(NV)                                                                               \
	case NV:                                                                                 \
		k_gnorm_bwd4<NV><<<nb, NT, 0, c->stream>>>(                                      \
			(bf16 *)dx, (bf16 *)dz, zs, (const bf16 *)dout, (const bf16 *)x,         \
			(const bf16 *)z, (const bf16 *)w, rstd, T, nh);                          \
		break;
		GN_BWD(1)
		GN_BWD(2)
#undef GN_BWD
	default:
		k_gnorm_bwd<<<nb, NT, 0, c->stream>>>((bf16 *)dx, (bf16 *)dz, zs,
						     (const bf16 *)dout, (const bf16 *)x,
						     (const bf16 *)z, (const bf16 *)w, rstd, T, nh,
						     d);
	}
	CUDA_LAUNCHED();
	const int nchunk = (int)((rows + GNORM_RPB - 1) / GNORM_RPB);

	if (d <= 32 * GNORM_EPL && (size_t)nchunk * d * sizeof(float) <= c->scratch_bytes) {
		float *part = sl_cuda_scratch(c, (size_t)nchunk * d * sizeof(float), "gnorm dw");

		switch (nv) {
#define GN_DW(NV)                                                                                \
	case NV:                                                                                 \
		k_gnorm_dw_partial4<NV><<<nchunk, NT, 0, c->stream>>>(                           \
			part, (const bf16 *)dout, (const bf16 *)x, (const bf16 *)z, zs, rstd, T, \
			nh);                                                                     \
		break;
			GN_DW(1)
			GN_DW(2)
#undef GN_DW
		default:
			k_gnorm_dw_partial<<<nchunk, NT, 0, c->stream>>>(
				part, (const bf16 *)dout, (const bf16 *)x, (const bf16 *)z, zs,
				rstd, T, nh, d);
		}
		CUDA_LAUNCHED();
		k_dw_final<<<grid_for(d, NT), NT, 0, c->stream>>>((bf16 *)dw, part, nchunk, d);
	} else {
		k_gnorm_dw<<<d, NT, 0, c->stream>>>((bf16 *)dw, (const bf16 *)dout,
						    (const bf16 *)x, (const bf16 *)z, zs, rstd, T,
						    nh, d);
	}
	CUDA_LAUNCHED();
}
