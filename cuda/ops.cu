// ops.cu: the element-wise, normalization, rotary, embedding, row, loss and optimizer kernels of
// the cuda backend, with their extern "C" launchers.  bf16 in memory, fp32 arithmetic.  Every
// reduction runs in a fixed order (no atomics), so results repeat bit for bit.
#include <cmath>
#include <type_traits>

#include "common.cuh"
#include "norm_dw.cuh"
#include "qknorm.cuh"
#include "rmsnorm_s.cuh"

#define NT 256		// threads of the row and element-wise kernels

// ---- casts and adds ----------------------------------------------------------------------

__global__ void k_f32_to_bf16(bf16 *d, const float *s, size_t n)
{
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
	     i += (size_t)gridDim.x * blockDim.x)
		d[i] = tobf(s[i]);
}

__global__ void k_bf16_to_f32(float *d, const bf16 *s, size_t n)
{
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
	     i += (size_t)gridDim.x * blockDim.x)
		d[i] = bf(s[i]);
}

__global__ void k_add_bf16(bf16 *y, const bf16 *x, size_t n)
{
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
	     i += (size_t)gridDim.x * blockDim.x)
		y[i] = tobf(bf(y[i]) + bf(x[i]));
}

__global__ void k_add_f32(float *y, const float *x, size_t n)
{
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
	     i += (size_t)gridDim.x * blockDim.x)
		y[i] += x[i];
}

extern "C" void sl_cuda_f32_to_bf16(struct sl_cuda *c, void *dst, const float *src, size_t n)
{
	if (!n)
		return;
	k_f32_to_bf16<<<grid_for(n, NT), NT, 0, c->stream>>>((bf16 *)dst, src, n);
	CUDA_LAUNCHED();
}

extern "C" void sl_cuda_bf16_to_f32(struct sl_cuda *c, float *dst, const void *src, size_t n)
{
	if (!n)
		return;
	k_bf16_to_f32<<<grid_for(n, NT), NT, 0, c->stream>>>(dst, (const bf16 *)src, n);
	CUDA_LAUNCHED();
}

extern "C" void sl_cuda_add(struct sl_cuda *c, void *y, const void *x, size_t n)
{
	if (!n)
		return;
	k_add_bf16<<<grid_for(n, NT), NT, 0, c->stream>>>((bf16 *)y, (const bf16 *)x, n);
	CUDA_LAUNCHED();
}

extern "C" void sl_cuda_add_f32(struct sl_cuda *c, float *y, const float *x, size_t n)
{
	if (!n)
		return;
	k_add_f32<<<grid_for(n, NT), NT, 0, c->stream>>>(y, x, n);
	CUDA_LAUNCHED();
}

// ---- column sums over rows, in two deterministic passes ----------------------------------
//
// Weight gradients of norms and biases sum a (rows x cols) product over rows.  Pass 1: a grid of
// (column tiles x row chunks) writes one partial per chunk and column (rows of a chunk summed in
// a fixed order); pass 2 adds the chunks in order into the bf16 gradient.

#define CS_W 32		// columns per tile
#define CS_R 8		// row lanes per tile

enum colsum_kind { CS_PLAIN, CS_RMSNORM };

template <int KIND>
__global__ void k_colsum_partial(float *part, const bf16 *g, const bf16 *x, const float *rstd,
				 int R, int C, int rows_per_chunk)
{
	__shared__ float sh[CS_R][CS_W + 1];
	int j = blockIdx.x * CS_W + threadIdx.x, chunk = blockIdx.y;
	int r0 = chunk * rows_per_chunk, r1 = min(R, r0 + rows_per_chunk);
	float acc = 0.f;

	if (j < C) {
		for (int r = r0 + threadIdx.y; r < r1; r += CS_R) {
			size_t o = (size_t)r * C + j;

			if (KIND == CS_RMSNORM)
				acc += bf(g[o]) * bf(x[o]) * rstd[r];
			else
				acc += bf(g[o]);
		}
	}
	sh[threadIdx.y][threadIdx.x] = acc;
	__syncthreads();
	if (threadIdx.y == 0 && j < C) {
		for (int k = 1; k < CS_R; k++)
			acc += sh[k][threadIdx.x];
		part[(size_t)chunk * C + j] = acc;
	}
}

__global__ void k_colsum_final(bf16 *out, const float *part, int C, int nchunk)
{
	int j = blockIdx.x * blockDim.x + threadIdx.x;
	float acc = 0.f;

	if (j >= C)
		return;
	for (int k = 0; k < nchunk; k++)
		acc += part[(size_t)k * C + j];
	out[j] = tobf(bf(out[j]) + acc);
}

static void colsum(struct sl_cuda *c, int kind, bf16 *out, const bf16 *g, const bf16 *x,
		   const float *rstd, int R, int C)
{
	// ~64 rows a chunk, as many chunks as the scratch holds
	int nchunk = (R + 63) / 64;
	size_t cap = c->scratch_bytes / ((size_t)C * sizeof(float));

	if (R <= 0 || C <= 0)
		return;
	if ((size_t)nchunk > cap)
		nchunk = (int)cap;
	if (nchunk > 2048)
		nchunk = 2048;
	if (nchunk < 1)
		nchunk = 1;
	int rpc = (R + nchunk - 1) / nchunk;
	nchunk = (R + rpc - 1) / rpc;
	float *part = sl_cuda_scratch(c, (size_t)nchunk * C * sizeof(float), "column sum");
	dim3 grid((C + CS_W - 1) / CS_W, nchunk), blk(CS_W, CS_R);

	if (kind == CS_RMSNORM)
		k_colsum_partial<CS_RMSNORM><<<grid, blk, 0, c->stream>>>(part, g, x, rstd, R, C, rpc);
	else
		k_colsum_partial<CS_PLAIN><<<grid, blk, 0, c->stream>>>(part, g, x, rstd, R, C, rpc);
	CUDA_LAUNCHED();
	k_colsum_final<<<(C + NT - 1) / NT, NT, 0, c->stream>>>(out, part, C, nchunk);
	CUDA_LAUNCHED();
}

extern "C" void sl_cuda_bias_grad(struct sl_cuda *c, void *dbias, const void *dout, int T, int N)
{
	colsum(c, CS_PLAIN, (bf16 *)dbias, (const bf16 *)dout, NULL, NULL, T, N);
}

// ---- embedding ---------------------------------------------------------------------------

__global__ void k_embedding_fwd(bf16 *out, const int *ids, const bf16 *tab, int T, int H)
{
	for (int t = blockIdx.x; t < T; t += gridDim.x) {
		const bf16 *s = tab + (size_t)ids[t] * H;
		bf16 *d = out + (size_t)t * H;

		for (int j = threadIdx.x; j < H; j += blockDim.x)
			d[j] = s[j];
	}
}

#define EMB_VEC 8	// columns a thread accumulates per pass

// Deterministic scatter-add without atomics or sorting: the block of token t works only when t is
// the first occurrence of its id; it then collects every later token with that id, in token
// order (an ordered compaction per chunk of NT ids), and sums their rows in fp32 before a single
// add into the bf16 table row.  Each table row thus has one writer and one summation order.
__global__ void __launch_bounds__(NT) k_embedding_bwd(bf16 *dtab, const int *ids, const bf16 *g,
						      int T, int H)
{
	__shared__ int match[NT];
	__shared__ int wcount[NT / 32];
	const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;

	for (int t = blockIdx.x; t < T; t += gridDim.x) {
		int id = ids[t], before = 0;

		for (int u = threadIdx.x; u < t && !before; u += NT)
			before = ids[u] == id;
		if (__syncthreads_or(before))
			continue;
		for (int c0 = 0; c0 < H; c0 += NT * EMB_VEC) {
			float acc[EMB_VEC];

			for (int v = 0; v < EMB_VEC; v++)
				acc[v] = 0.f;
			for (int u0 = t; u0 < T; u0 += NT) {
				int u = u0 + threadIdx.x;
				int hit = u < T && ids[u] == id;
				unsigned bal = __ballot_sync(0xffffffffu, hit);
				int off = 0, tot = 0;

				if (!lane)
					wcount[warp] = __popc(bal);
				__syncthreads();
				for (int w = 0; w < NT / 32; w++) {
					off += w < warp ? wcount[w] : 0;
					tot += wcount[w];
				}
				if (hit)
					match[off + __popc(bal & ((1u << lane) - 1))] = u;
				__syncthreads();
				for (int k = 0; k < tot; k++) {
					const bf16 *row = g + (size_t)match[k] * H;

					for (int v = 0; v < EMB_VEC; v++) {
						int j = c0 + v * NT + threadIdx.x;

						if (j < H)
							acc[v] += bf(row[j]);
					}
				}
				__syncthreads();	// match and wcount are rewritten next chunk
			}
			bf16 *d = dtab + (size_t)id * H;

			for (int v = 0; v < EMB_VEC; v++) {
				int j = c0 + v * NT + threadIdx.x;

				if (j < H)
					d[j] = tobf(bf(d[j]) + acc[v]);
			}
		}
	}
}

extern "C" void sl_cuda_embedding_fwd(struct sl_cuda *c, void *out, const int *ids,
				      const void *table, int T, int H)
{
	if (T <= 0)
		return;
	k_embedding_fwd<<<T < 65535 ? T : 65535, NT, 0, c->stream>>>((bf16 *)out, ids,
								   (const bf16 *)table, T, H);
	CUDA_LAUNCHED();
}

extern "C" void sl_cuda_embedding_bwd(struct sl_cuda *c, void *dtable, const int *ids,
				      const void *dout, int T, int H)
{
	if (T <= 0)
		return;
	k_embedding_bwd<<<T < 65535 ? T : 65535, NT, 0, c->stream>>>((bf16 *)dtable, ids,
								   (const bf16 *)dout, T, H);
	CUDA_LAUNCHED();
}

// ---- RMSNorm -----------------------------------------------------------------------------

__global__ void k_rmsnorm_fwd(bf16 *out, float *rstd, const bf16 *x, const bf16 *w, int H,
			      float eps)
{
	const bf16 *xr = x + (size_t)blockIdx.x * H;
	bf16 *o = out + (size_t)blockIdx.x * H;
	float ss = 0.f, r;

	for (int j = threadIdx.x; j < H; j += blockDim.x) {
		float v = bf(xr[j]);

		ss += v * v;
	}
	ss = block_sum(ss);
	r = 1.f / sqrtf(ss / H + eps);
	if (!threadIdx.x)
		rstd[blockIdx.x] = r;
	// (x * r) * w, in that order, as Hugging Face's Qwen3RMSNorm
	for (int j = threadIdx.x; j < H; j += blockDim.x)
		o[j] = tobf((bf(xr[j]) * r) * bf(w[j]));
}

__global__ void k_rmsnorm_bwd_dx(bf16 *dx, const bf16 *g, const bf16 *x, const bf16 *w,
				 const float *rstd, int H, int accumulate)
{
	size_t o = (size_t)blockIdx.x * H;
	float r = rstd[blockIdx.x], s = 0.f, k;

	for (int j = threadIdx.x; j < H; j += blockDim.x)
		s += bf(g[o + j]) * bf(w[j]) * bf(x[o + j]);
	s = block_sum(s);
	k = s * r * r * r / H;
	for (int j = threadIdx.x; j < H; j += blockDim.x) {
		float v = r * bf(w[j]) * bf(g[o + j]) - bf(x[o + j]) * k;

		dx[o + j] = tobf(accumulate ? bf(dx[o + j]) + v : v);
	}
}

static int row_threads(int H)
{
	return H >= 1024 ? 512 : H > 128 ? 256 : 64;
}

// Rows of H = 8k elements: a thread holds up to RN_V groups of 8 in registers (one read of x,
// 16-byte loads), rn_threads(H) threads a row; the same arithmetic per element as the kernels
// above.
#define RN_V 2

__global__ void __launch_bounds__(1024)
k_rmsnorm_fwd8(bf16 *out, float *rstd, const bf16 *x, const bf16 *w, int H, float eps)
{
	const bf16 *xr = x + (size_t)blockIdx.x * H;
	bf16 *o = out + (size_t)blockIdx.x * H;
	const int H8 = H / 8;
	float v[RN_V][8], ss = 0.f, r;

#pragma unroll
	for (int k = 0; k < RN_V; k++) {
		int j = threadIdx.x + k * blockDim.x;

		if (j < H8) {
			ld8(v[k], xr + j * 8);
#pragma unroll
			for (int e = 0; e < 8; e++)
				ss += v[k][e] * v[k][e];
		}
	}
	ss = block_sum(ss);
	r = 1.f / sqrtf(ss / H + eps);
	if (!threadIdx.x)
		rstd[blockIdx.x] = r;
#pragma unroll
	for (int k = 0; k < RN_V; k++) {
		int j = threadIdx.x + k * blockDim.x;
		float wv[8];

		if (j < H8) {
			ld8(wv, w + j * 8);
#pragma unroll
			for (int e = 0; e < 8; e++)
				wv[e] = (v[k][e] * r) * wv[e];
			st8(o + j * 8, wv);
		}
	}
}

__global__ void __launch_bounds__(1024)
k_rmsnorm_bwd_dx8(bf16 *dx, const bf16 *g, const bf16 *x, const bf16 *w, const float *rstd,
		  int H, int accumulate)
{
	const size_t o = (size_t)blockIdx.x * H;
	const int H8 = H / 8;
	float gv[RN_V][8], xv[RN_V][8], r = rstd[blockIdx.x], s = 0.f, kk;

#pragma unroll
	for (int k = 0; k < RN_V; k++) {
		int j = threadIdx.x + k * blockDim.x;
		float wv[8];

		if (j < H8) {
			ld8(gv[k], g + o + j * 8);
			ld8(xv[k], x + o + j * 8);
			ld8(wv, w + j * 8);
#pragma unroll
			for (int e = 0; e < 8; e++)
				s += gv[k][e] * wv[e] * xv[k][e];
		}
	}
	s = block_sum(s);
	kk = s * r * r * r / H;
#pragma unroll
	for (int k = 0; k < RN_V; k++) {
		int j = threadIdx.x + k * blockDim.x;
		float wv[8], d[8];

		if (j < H8) {
			ld8(wv, w + j * 8);
			if (accumulate)
				ld8(d, dx + o + j * 8);
#pragma unroll
			for (int e = 0; e < 8; e++) {
				float v = r * wv[e] * gv[k][e] - xv[k][e] * kk;

				d[e] = accumulate ? d[e] + v : v;
			}
			st8(dx + o + j * 8, d);
		}
	}
}

static int rn_threads(int H)
{
	return (H / 8 + RN_V - 1) / RN_V + 31 & ~31;
}

static bool rows_wide(int H)
{
	return H % 8 == 0 && rn_threads(H) <= 1024;
}

extern "C" void sl_cuda_rmsnorm_fwd(struct sl_cuda *c, void *out, float *rstd, const void *x,
				    const void *w, int T, int H, float eps)
{
	if (T <= 0)
		return;
	if (rows_wide(H))
		k_rmsnorm_fwd8<<<T, rn_threads(H), 0, c->stream>>>((bf16 *)out, rstd, (const bf16 *)x,
							  (const bf16 *)w, H, eps);
	else
		k_rmsnorm_fwd<<<T, row_threads(H), 0, c->stream>>>((bf16 *)out, rstd,
								   (const bf16 *)x,
								   (const bf16 *)w, H, eps);
	CUDA_LAUNCHED();
}

// the staged kernels copy rows in 16-byte pieces (their rows' lengths are multiples of 16 bytes)
static bool aligned16(const void *a, const void *b, const void *c)
{
	return (((uintptr_t)a | (uintptr_t)b | (uintptr_t)c) & 15) == 0;
}

// A staged kernel's grid (qknorm.cuh k_qk_norm_rope_fwd_s / _bwd_s, rmsnorm_s.cuh
// k_rmsnorm_bwd_s: as many blocks of @threads as fit on the SMs at once, at most one a row), or 0
// where it does not run: the environment variable @env is 0 (the kernels before them, kept for
// comparison and for make check-gpu), or @smem bytes of stages and @fixed of static shared memory
// do not fit a block.
static int staged_grid(struct sl_cuda *c, const char *env, int *mode, const void *kern, int smem,
		       int fixed, int threads, int T)
{
	// the blocks that fit at once, per kernel, stage bytes and device: asked of the runtime
	// once, not on every call (a step calls these kernels a few times a layer)
	static struct {
		const void *kern;
		int smem, device, blocks;
	} fit[32];
	static int n_fit;
	int blocks = -1;

	if (*mode < 0) {
		const char *e = getenv(env);

		*mode = !e || strcmp(e, "0");
	}
	if (!*mode)
		return 0;
	for (int i = 0; i < n_fit && blocks < 0; i++)
		if (fit[i].kern == kern && fit[i].smem == smem && fit[i].device == c->device)
			blocks = fit[i].blocks;
	if (blocks < 0) {
		int per_sm = 0, sms = 0, optin = 0;

		CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin,
						  c->device));
		if (smem + fixed <= optin) {
			// all that may be asked (fixed covers the static part), so that no stage size
			// of this kernel lowers the limit below another's
			CUDA_CHECK(cudaFuncSetAttribute(
				kern, cudaFuncAttributeMaxDynamicSharedMemorySize, optin - fixed));
			CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kern,
										 threads, smem));
			CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount,
							  c->device));
		}
		blocks = per_sm * sms;
		if (n_fit < (int)(sizeof(fit) / sizeof(fit[0])))
			fit[n_fit++] = { kern, smem, c->device, blocks };
	}
	return blocks < T ? blocks : T;
}

// the staged backward (rmsnorm_s.cuh: dx and the weight gradient's partials in one pass, then
// k_colsum_final) unless SHARDLM_RMS_STAGED=0; false where it does not run
static bool rmsnorm_bwd_staged(struct sl_cuda *c, void *dx, void *dw, const void *dout,
			       const void *x, const void *w, const float *rstd, int T, int H,
			       int accumulate)
{
	static int mode = -1;
	const int threads = ((H / 8 + RS_V - 1) / RS_V + 31) & ~31;
	const int smem = RS_STAGES * rs_stage_bytes(H, accumulate);
	const void *kern = accumulate ? (const void *)k_rmsnorm_bwd_s<true> :
					(const void *)k_rmsnorm_bwd_s<false>;
	int grid;

	if (H % 8 || threads > 1024 || !aligned16(dx, dout, x))	/* cp.async's 16-byte pieces */
		return false;
	grid = staged_grid(c, "SHARDLM_RMS_STAGED", &mode, kern, smem, 32 * 4, threads, T);
	if ((size_t)grid * H * sizeof(float) > c->scratch_bytes)
		grid = (int)(c->scratch_bytes / ((size_t)H * sizeof(float)));
	if (grid < 1)
		return false;
	float *part = sl_cuda_scratch(c, (size_t)grid * H * sizeof(float), "rmsnorm dw");

	if (accumulate)
		k_rmsnorm_bwd_s<true><<<grid, threads, smem, c->stream>>>(
			(bf16 *)dx, part, (const bf16 *)dout, (const bf16 *)x, (const bf16 *)w, rstd,
			T, H);
	else
		k_rmsnorm_bwd_s<false><<<grid, threads, smem, c->stream>>>(
			(bf16 *)dx, part, (const bf16 *)dout, (const bf16 *)x, (const bf16 *)w, rstd,
			T, H);
	CUDA_LAUNCHED();
	k_colsum_final<<<(H + NT - 1) / NT, NT, 0, c->stream>>>((bf16 *)dw, part, H, grid);
	CUDA_LAUNCHED();
	return true;
}

extern "C" void sl_cuda_rmsnorm_bwd(struct sl_cuda *c, void *dx, void *dw, const void *dout,
				    const void *x, const void *w, const float *rstd, int T, int H,
				    int accumulate)
{
	if (T <= 0)
		return;
	if (rmsnorm_bwd_staged(c, dx, dw, dout, x, w, rstd, T, H, accumulate))
		return;
	if (rows_wide(H))
		k_rmsnorm_bwd_dx8<<<T, rn_threads(H), 0, c->stream>>>((bf16 *)dx, (const bf16 *)dout,
							     (const bf16 *)x, (const bf16 *)w,
							     rstd, H, accumulate);
	else
		k_rmsnorm_bwd_dx<<<T, row_threads(H), 0, c->stream>>>(
			(bf16 *)dx, (const bf16 *)dout, (const bf16 *)x, (const bf16 *)w, rstd, H,
			accumulate);
	CUDA_LAUNCHED();
	colsum(c, CS_RMSNORM, (bf16 *)dw, (const bf16 *)dout, (const bf16 *)x, rstd, T, H);
}

// ---- q/k RMSNorm + rotary ----------------------------------------------------------------

// f(std::integral_constant<int, HD>) for the head dims the warp-per-head kernels take (64, 128,
// 256); false for another
template <typename F> static bool by_hd(int hd, F &&f)
{
	switch (hd) {
	case 64:
		f(std::integral_constant<int, 64>());
		return true;
	case 128:
		f(std::integral_constant<int, 128>());
		return true;
	case 256:
		f(std::integral_constant<int, 256>());
		return true;
	}
	return false;
}

static int check_hd(int hd, const char *who)
{
	if (hd < 2 || hd > HD_MAX || hd % 2) {
		fprintf(stderr, "cuda: %s: head_dim %d unsupported (even, 2..%d)\n", who, hd, HD_MAX);
		abort();
	}
	return hd;
}

// the q/k norm kernels' (SHARDLM_QK_STAGED=0: the warp-per-row ones)
static int qk_staged_grid(struct sl_cuda *c, const void *kern, int smem, int T)
{
	static int mode = -1;

	return staged_grid(c, "SHARDLM_QK_STAGED", &mode, kern, smem, HD_MAX * 2 * QK_WARPS * 4,
			   QK_WARPS * 32, T);
}

extern "C" void sl_cuda_qk_norm_rope_fwd(struct sl_cuda *c, void *out, float *rstd,
					 const void *qkv, const void *qw, const void *kw, int T,
					 int L, const int32_t *pos, int nh, int nkv, int hd, float eps,
					 float theta)
{
	const size_t rows = (size_t)T * (nh + 2 * nkv);
	const unsigned blocks = (unsigned)((rows + QK_FWD_ROWS - 1) / QK_FWD_ROWS);
	const float *tab;
	bool staged = false;

	check_hd(hd, "qk_norm_rope_fwd");
	if (T <= 0)
		return;
	tab = (size_t)L * hd * sizeof(float) <= c->scratch_bytes ?
		rope_table(c, L, hd, theta, "rotary table") : NULL;
	if (tab && by_hd(hd, [&](auto k) {
		    constexpr int HD = decltype(k)::value;
		    const int smem = QK_STAGES * qk_stage_bytes(nh, nkv, HD, false);
		    const int grid = aligned16(out, qkv, qkv) ?
			    qk_staged_grid(c, (const void *)k_qk_norm_rope_fwd_s<HD>, smem, T) : 0;

		    if (grid)
			    k_qk_norm_rope_fwd_s<HD><<<grid, QK_WARPS * 32, smem, c->stream>>>(
				    (bf16 *)out, rstd, (const bf16 *)qkv, (const bf16 *)qw,
				    (const bf16 *)kw, tab, T, L, (const int *)pos, nh, nkv, eps);
		    staged = grid > 0;
	    }) && staged) {
		CUDA_LAUNCHED();
		return;
	}
	if (!by_hd(hd, [&](auto k) {
		    k_qk_norm_rope_fwd_w<decltype(k)::value><<<blocks, QK_WARPS * 32, 0, c->stream>>>(
			    (bf16 *)out, rstd, (const bf16 *)qkv, (const bf16 *)qw, (const bf16 *)kw,
			    tab, T, L, (const int *)pos, nh, nkv, eps, theta);
	    }))
		k_qk_norm_rope_fwd<<<T, QK_WARPS * 32, 0, c->stream>>>(
			(bf16 *)out, rstd, (const bf16 *)qkv, (const bf16 *)qw, (const bf16 *)kw, tab,
			L, (const int *)pos, nh, nkv, hd, eps, theta);
	CUDA_LAUNCHED();
}

extern "C" void sl_cuda_qk_norm_rope_bwd(struct sl_cuda *c, void *dqkv, void *dqw, void *dkw,
					 const void *dout, const void *qkv, const void *qw,
					 const void *kw, const float *rstd, int T, int L,
					 const int32_t *pos, int nh, int nkv, int hd, float eps,
					 float theta)
{
	const size_t warps = (size_t)T * (nh + 2 * nkv);
	int R, tpc, nchunk;
	const float *tab;

	check_hd(hd, "qk_norm_rope_bwd");
	if (T <= 0)
		return;
	// the warp-per-head kernel sums the weight gradients itself, each block a partial: one block
	// per 8 heads a warp (at most 2048 blocks, each warp then walking 8 or more heads);
	// otherwise a second pass over the tokens, in chunks
	const bool fused = by_hd(hd, [](auto) {});	// the head dims with a warp-per-head kernel
	int staged = 0;	// the staged kernel's grid, 0 for none

	by_hd(hd, [&](auto k) {
		constexpr int HD = decltype(k)::value;
		const int smem = QK_STAGES * qk_stage_bytes(nh, nkv, HD, true);

		staged = aligned16(dqkv, dout, qkv) ?
			 qk_staged_grid(c, (const void *)k_qk_norm_rope_bwd_s<HD>, smem, T) : 0;
	});
	if (staged) {
		nchunk = staged;
		tpc = R = 0;
	} else if (fused) {
		nchunk = (int)((warps + QK_WARPS * 8 - 1) / (QK_WARPS * 8));
		nchunk = nchunk < 2048 ? nchunk : 2048;
		tpc = R = 0;
	} else {
		R = 256 / hd > 0 ? 256 / hd : 1;
		tpc = 32;
		nchunk = (T + tpc - 1) / tpc;
		if (nchunk > 1024) {
			nchunk = 1024;
			tpc = (T + nchunk - 1) / nchunk;
			nchunk = (T + tpc - 1) / tpc;
		}
	}
	// the weight gradients' partials after the rotary table in the scratch (no table when
	// the rows are too long for it)
	const size_t pf = (size_t)2 * nchunk * hd;
	size_t tf = rope_table_floats(L, hd);

	if ((tf + pf) * sizeof(float) > c->scratch_bytes)
		tf = 0;
	float *part = sl_cuda_scratch(c, (tf + pf) * sizeof(float), "qk norm dw") + tf;

	tab = tf ? rope_table(c, L, hd, theta, "rotary table") : NULL;
	if (staged && tab) {
		by_hd(hd, [&](auto k) {
			constexpr int HD = decltype(k)::value;

			k_qk_norm_rope_bwd_s<HD>
				<<<nchunk, QK_WARPS * 32, QK_STAGES * qk_stage_bytes(nh, nkv, HD, true),
				   c->stream>>>((bf16 *)dqkv, part, (const bf16 *)dout,
						(const bf16 *)qkv, (const bf16 *)qw, (const bf16 *)kw,
						rstd, tab, T, L, (const int *)pos, nh, nkv);
		});
		CUDA_LAUNCHED();
	} else if (fused) {
		by_hd(hd, [&](auto k) {
			k_qk_norm_rope_bwd_w<decltype(k)::value>
				<<<nchunk, QK_WARPS * 32, 0, c->stream>>>(
				(bf16 *)dqkv, part, (const bf16 *)dout, (const bf16 *)qkv,
				(const bf16 *)qw, (const bf16 *)kw, rstd, tab, T, L, (const int *)pos,
				nh, nkv, theta);
		});
		CUDA_LAUNCHED();
	} else {
		k_qk_norm_rope_bwd<<<T, QK_WARPS * 32, 0, c->stream>>>(
			(bf16 *)dqkv, (const bf16 *)dout, (const bf16 *)qkv, (const bf16 *)qw,
			(const bf16 *)kw, rstd, tab, L, (const int *)pos, nh, nkv, hd, theta);
		CUDA_LAUNCHED();
		k_qk_dw_partial<<<dim3(nchunk, 2), dim3(hd, R), (size_t)R * hd * sizeof(float),
				  c->stream>>>(part, (const bf16 *)dout, (const bf16 *)qkv, rstd, tab,
					       T, L, (const int *)pos, nh, nkv, hd, theta, tpc);
		CUDA_LAUNCHED();
	}
	norm_dw_final(c, dqw, dkw, part, nchunk, hd);
}

// ---- SwiGLU ------------------------------------------------------------------------------

__global__ void k_swiglu_fwd(bf16 *h, const bf16 *gu, int T, int I)
{
	size_t n = (size_t)T * I;

	for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < n;
	     e += (size_t)gridDim.x * blockDim.x) {
		size_t t = e / I, i = e % I;
		float g = bf(gu[t * 2 * I + i]), u = bf(gu[t * 2 * I + I + i]);

		h[e] = tobf(g / (1.f + expf(-g)) * u);
	}
}

__global__ void k_swiglu_bwd(bf16 *dgu, const bf16 *dh, const bf16 *gu, int T, int I)
{
	size_t n = (size_t)T * I;

	for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < n;
	     e += (size_t)gridDim.x * blockDim.x) {
		size_t t = e / I, i = e % I, o = t * 2 * I + i;
		float g = bf(gu[o]), u = bf(gu[o + I]), d = bf(dh[e]);
		float sg = 1.f / (1.f + expf(-g));

		dgu[o] = tobf(d * u * sg * (1.f + g * (1.f - sg)));
		dgu[o + I] = tobf(d * g * sg);
	}
}

// 8 elements a thread, 16-byte loads and stores (I a multiple of 8); the same arithmetic per
// element as the kernels above
__global__ void k_swiglu_fwd8(bf16 *h, const bf16 *gu, unsigned n8, unsigned I8)
{
	const size_t I = (size_t)I8 * 8;

	for (unsigned e = blockIdx.x * blockDim.x + threadIdx.x; e < n8; e += gridDim.x * blockDim.x) {
		unsigned t = e / I8;
		size_t o = t * 2 * I + (size_t)(e - t * I8) * 8;
		float g[8], u[8], y[8];

		ld8(g, gu + o);
		ld8(u, gu + o + I);
#pragma unroll
		for (int k = 0; k < 8; k++)
			y[k] = g[k] / (1.f + expf(-g[k])) * u[k];
		st8(h + (size_t)e * 8, y);
	}
}

__global__ void k_swiglu_bwd8(bf16 *dgu, const bf16 *dh, const bf16 *gu, unsigned n8, unsigned I8)
{
	const size_t I = (size_t)I8 * 8;

	for (unsigned e = blockIdx.x * blockDim.x + threadIdx.x; e < n8; e += gridDim.x * blockDim.x) {
		unsigned t = e / I8;
		size_t o = t * 2 * I + (size_t)(e - t * I8) * 8;
		float g[8], u[8], d[8], dg[8], du[8];

		ld8(g, gu + o);
		ld8(u, gu + o + I);
		ld8(d, dh + (size_t)e * 8);
#pragma unroll
		for (int k = 0; k < 8; k++) {
			float sg = 1.f / (1.f + expf(-g[k]));

			dg[k] = d[k] * u[k] * sg * (1.f + g[k] * (1.f - sg));
			du[k] = d[k] * g[k] * sg;
		}
		st8(dgu + o, dg);
		st8(dgu + o + I, du);
	}
}

// the 8-wide kernels when every row starts 16-byte aligned and the count fits 32 bits
static bool swiglu_wide(int T, int I)
{
	return I % 8 == 0 && (size_t)T * I / 8 < 0xffffffffu;
}

extern "C" void sl_cuda_swiglu_fwd(struct sl_cuda *c, void *h, const void *gu, int T, int I)
{
	size_t n = (size_t)T * I;

	if (!n)
		return;
	if (swiglu_wide(T, I))
		k_swiglu_fwd8<<<grid_for(n / 8, NT), NT, 0, c->stream>>>(
			(bf16 *)h, (const bf16 *)gu, (unsigned)(n / 8), (unsigned)(I / 8));
	else
		k_swiglu_fwd<<<grid_for(n, NT), NT, 0, c->stream>>>((bf16 *)h, (const bf16 *)gu,
								    T, I);
	CUDA_LAUNCHED();
}

extern "C" void sl_cuda_swiglu_bwd(struct sl_cuda *c, void *dgu, const void *dh, const void *gu,
				   int T, int I)
{
	size_t n = (size_t)T * I;

	if (!n)
		return;
	if (swiglu_wide(T, I))
		k_swiglu_bwd8<<<grid_for(n / 8, NT), NT, 0, c->stream>>>(
			(bf16 *)dgu, (const bf16 *)dh, (const bf16 *)gu, (unsigned)(n / 8),
			(unsigned)(I / 8));
	else
		k_swiglu_bwd<<<grid_for(n, NT), NT, 0, c->stream>>>((bf16 *)dgu, (const bf16 *)dh,
								    (const bf16 *)gu, T, I);
	CUDA_LAUNCHED();
}

// ---- rows --------------------------------------------------------------------------------

// A block per row, 8 bf16 (16 bytes) a thread where the row width and both buffers allow
// (rows_vec), else one.  The scatter's rows are distinct (backend.h): no two blocks meet.
static bool rows_vec(int H, const void *a, const void *b)
{
	return H % 8 == 0 && (uintptr_t)a % 16 == 0 && (uintptr_t)b % 16 == 0;
}

__global__ void k_gather_rows(bf16 *out, const bf16 *x, const int *idx, int n, int H, bool vec)
{
	for (int i = blockIdx.x; i < n; i += gridDim.x) {
		const bf16 *s = x + (size_t)idx[i] * H;
		bf16 *d = out + (size_t)i * H;

		if (vec)
			for (int j = 8 * threadIdx.x; j < H; j += 8 * blockDim.x)
				*(uint4 *)(d + j) = *(const uint4 *)(s + j);
		else
			for (int j = threadIdx.x; j < H; j += blockDim.x)
				d[j] = s[j];
	}
}

__global__ void k_scatter_add_rows(bf16 *dx, const bf16 *g, const int *idx, int n, int H,
				   bool vec)
{
	for (int i = blockIdx.x; i < n; i += gridDim.x) {
		bf16 *d = dx + (size_t)idx[i] * H;
		const bf16 *s = g + (size_t)i * H;

		if (vec) {
			for (int j = 8 * threadIdx.x; j < H; j += 8 * blockDim.x) {
				float a[8], b[8];

				ld8(a, d + j);
				ld8(b, s + j);
				for (int k = 0; k < 8; k++)
					a[k] += b[k];
				st8(d + j, a);
			}
		} else {
			for (int j = threadIdx.x; j < H; j += blockDim.x)
				d[j] = tobf(bf(d[j]) + bf(s[j]));
		}
	}
}

extern "C" void sl_cuda_gather_rows(struct sl_cuda *c, void *out, const void *x, const int *idx,
				    int n, int H)
{
	if (n <= 0)
		return;
	k_gather_rows<<<n < 65535 ? n : 65535, NT, 0, c->stream>>>((bf16 *)out, (const bf16 *)x,
								   idx, n, H, rows_vec(H, out, x));
	CUDA_LAUNCHED();
}

extern "C" void sl_cuda_scatter_add_rows(struct sl_cuda *c, void *dx, const void *dout,
					 const int *idx, int n, int H)
{
	if (n <= 0)
		return;
	k_scatter_add_rows<<<n < 65535 ? n : 65535, NT, 0, c->stream>>>(
		(bf16 *)dx, (const bf16 *)dout, idx, n, H, rows_vec(H, dx, dout));
	CUDA_LAUNCHED();
}

// dst(T, dst_w) columns [dst_off, dst_off + n) = (or +=) src(T, src_w) columns [src_off, +n)
__global__ void k_copy_cols(bf16 *dst, int dst_w, int dst_off, const bf16 *src, int src_w,
			    int src_off, int T, int n, bool add)
{
	const size_t total = (size_t)T * n;

	for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < total;
	     e += (size_t)gridDim.x * blockDim.x) {
		const size_t t = e / n, i = e % n;
		const float v = bf(src[t * src_w + src_off + i]);
		bf16 *d = dst + t * dst_w + dst_off + i;

		*d = tobf(add ? bf(*d) + v : v);
	}
}

extern "C" void sl_cuda_copy_cols(struct sl_cuda *c, void *dst, int dst_w, int dst_off,
				  const void *src, int src_w, int src_off, int T, int n, bool add)
{
	const size_t total = (size_t)T * n;

	if (!total)
		return;
	k_copy_cols<<<grid_for(total, NT), NT, 0, c->stream>>>((bf16 *)dst, dst_w, dst_off,
							       (const bf16 *)src, src_w, src_off,
							       T, n, add);
	CUDA_LAUNCHED();
}

// ---- BCE ---------------------------------------------------------------------------------

// one block; per-thread sums in double, then a fixed-order tree
__global__ void k_bce(double *loss_sum, bf16 *dz, const bf16 *z, const float *y, int n, float scale)
{
	__shared__ double sh[NT];
	double s = 0;

	for (int i = threadIdx.x; i < n; i += NT) {
		double x = bf(z[i]), yy = y[i], sg;

		s += fmax(x, 0.0) - x * yy + log1p(exp(-fabs(x)));
		if (x >= 0) {
			sg = 1 / (1 + exp(-x));
		} else {
			double e = exp(x);

			sg = e / (1 + e);
		}
		dz[i] = tobf((float)(scale * (sg - yy)));
	}
	sh[threadIdx.x] = s;
	__syncthreads();
	for (int o = NT / 2; o; o >>= 1) {
		if (threadIdx.x < o)
			sh[threadIdx.x] += sh[threadIdx.x + o];
		__syncthreads();
	}
	if (!threadIdx.x)
		*loss_sum = sh[0];
}

extern "C" void sl_cuda_bce_fwd_bwd(struct sl_cuda *c, double *loss_sum, void *dlogits,
				    const void *logits, const float *labels, int n, float scale)
{
	k_bce<<<1, NT, 0, c->stream>>>(loss_sum, (bf16 *)dlogits, (const bf16 *)logits, labels, n,
				       scale);
	CUDA_LAUNCHED();
}

// ---- the causal-LM head's cross-entropy -----------------------------------------------------

#define CE_NT 512	// threads per row: a 151,936-entry row is ~300 elements per thread

// (max, sum of exp(x - max)) pairs merged
static __device__ __forceinline__ void ms_merge(float &m, float &s, float m2, float s2)
{
	float mx = fmaxf(m, m2);

	s = (m == -INFINITY ? 0.f : s * __expf(m - mx)) + (m2 == -INFINITY ? 0.f : s2 * __expf(m2 - mx));
	m = mx;
}

// One block per row: the row's log-sum-exp in one online pass, then the gradient in a second.
// The target's logit is read before any thread overwrites the row (dz may be z).  The second
// pass walks the row from its end, where the first pass's latest reads are, so more of them are
// still in L2 (on an H100 4% faster than from the start: bench/RESULTS.md, thirty-third session).
__global__ void __launch_bounds__(CE_NT) k_ce(float *row_loss, bf16 *dz, const bf16 *z,
					      const int *tgt, int V, float scale)
{
	__shared__ float sm[CE_NT / 32], ss[CE_NT / 32], s_zt, s_lse;
	const bf16 *zr = z + (size_t)blockIdx.x * V;
	bf16 *dr = dz + (size_t)blockIdx.x * V;
	const int t = tgt[blockIdx.x];
	const bool vec = (V & 7) == 0;
	float m = -INFINITY, s = 0.f;

	if (!threadIdx.x)
		s_zt = bf(zr[t]);
	if (vec) {
		for (int i = threadIdx.x * 8; i < V; i += CE_NT * 8) {
			uint4 u = *(const uint4 *)(zr + i);
			const bf16 *e = (const bf16 *)&u;
			float x[8], mx = m;

			for (int k = 0; k < 8; k++) {
				x[k] = bf(e[k]);
				mx = fmaxf(mx, x[k]);
			}
			s = m == -INFINITY ? 0.f : s * __expf(m - mx);
			for (int k = 0; k < 8; k++)
				s += __expf(x[k] - mx);
			m = mx;
		}
	} else {
		for (int i = threadIdx.x; i < V; i += CE_NT)
			ms_merge(m, s, bf(zr[i]), 1.f);
	}
	for (int o = 16; o; o >>= 1) {
		float m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);

		ms_merge(m, s, m2, s2);
	}
	if ((threadIdx.x & 31) == 0) {
		sm[threadIdx.x >> 5] = m;
		ss[threadIdx.x >> 5] = s;
	}
	__syncthreads();
	if (!threadIdx.x) {
		float mm = sm[0], st = ss[0];

		for (int w = 1; w < CE_NT / 32; w++)
			ms_merge(mm, st, sm[w], ss[w]);
		s_lse = mm + logf(st);
		row_loss[blockIdx.x] = s_lse - s_zt;
	}
	__syncthreads();
	const float lse = s_lse;

	if (vec) {
		const int nv = V / 8, tid = threadIdx.x;
		const int last = tid < nv ? nv - 1 - (nv - 1 - tid) % CE_NT : -1;

		for (int j = last; j >= 0; j -= CE_NT) {
			const int i = 8 * j;
			uint4 u = *(const uint4 *)(zr + i), o;
			const bf16 *e = (const bf16 *)&u;
			bf16 *d = (bf16 *)&o;

			for (int k = 0; k < 8; k++)
				d[k] = tobf(scale * (__expf(bf(e[k]) - lse) - (i + k == t ? 1.f : 0.f)));
			*(uint4 *)(dr + i) = o;
		}
	} else {
		for (int i = threadIdx.x; i < V; i += CE_NT)
			dr[i] = tobf(scale * (__expf(bf(zr[i]) - lse) - (i == t ? 1.f : 0.f)));
	}
}

// *loss_sum += sum of row_loss(n), in double, in a fixed order
__global__ void k_add_sum(double *loss_sum, const float *row_loss, int n)
{
	__shared__ double sh[NT];
	double s = 0;

	for (int i = threadIdx.x; i < n; i += NT)
		s += row_loss[i];
	sh[threadIdx.x] = s;
	__syncthreads();
	for (int o = NT / 2; o; o >>= 1) {
		if (threadIdx.x < o)
			sh[threadIdx.x] += sh[threadIdx.x + o];
		__syncthreads();
	}
	if (!threadIdx.x)
		*loss_sum += sh[0];
}

extern "C" void sl_cuda_ce_fwd_bwd(struct sl_cuda *c, double *loss_sum, float *row_loss,
				   void *dlogits, const void *logits, const int32_t *targets, int n,
				   int V, float scale)
{
	if (n <= 0)
		return;
	k_ce<<<n, CE_NT, 0, c->stream>>>(row_loss, (bf16 *)dlogits, (const bf16 *)logits,
					 (const int *)targets, V, scale);
	CUDA_LAUNCHED();
	k_add_sum<<<1, NT, 0, c->stream>>>(loss_sum, row_loss, n);
	CUDA_LAUNCHED();
}

// ---- optimizer ---------------------------------------------------------------------------

#define SQ_BLOCKS 512	// fixed, so the summation tree does not depend on the device

static __device__ __forceinline__ float gval(float g)
{
	return g;
}

static __device__ __forceinline__ float gval(bf16 g)
{
	return bf(g);
}

// gradients in fp32 (the shard's accumulator) or bf16 (one rank, one micro-batch: the backward's
// own buffer, shard.c grad_direct); each element widened to float, then to double
// Each thread takes 16-byte vectors of g in turn, two in flight; the elements before the first
// 16-byte boundary and after the last whole vector one a thread; a fixed grid, so the sums are
// the same on every run
template <typename G>
__global__ void k_sumsq_partial(double *part, const G *g, size_t n)
{
	constexpr int VE = 16 / sizeof(G);
	struct alignas(16) vec {
		G v[VE];
	};
	__shared__ double sh[NT];
	const size_t head = min(n, (size_t)((16 - ((uintptr_t)g & 15)) & 15) / sizeof(G));
	const size_t nv = (n - head) / VE, stride = (size_t)SQ_BLOCKS * NT;
	const size_t tid = blockIdx.x * (size_t)NT + threadIdx.x, t0 = head + nv * VE;
	const vec *gv = (const vec *)(g + head);
	double s = 0, s2 = 0;
	size_t i = tid;

	if (tid < head) {
		const double x = gval(g[tid]);

		s += x * x;
	}

	for (; i + stride < nv; i += 2 * stride) {
		const vec a = gv[i], b = gv[i + stride];

#pragma unroll
		for (int k = 0; k < VE; k++) {
			const double x = gval(a.v[k]), y = gval(b.v[k]);

			s += x * x;
			s2 += y * y;
		}
	}
	if (i < nv) {
		const vec a = gv[i];

#pragma unroll
		for (int k = 0; k < VE; k++) {
			const double x = gval(a.v[k]);

			s += x * x;
		}
	}
	if (t0 + tid < n) {
		const double x = gval(g[t0 + tid]);

		s2 += x * x;
	}
	sh[threadIdx.x] = s + s2;
	__syncthreads();
	for (int o = NT / 2; o; o >>= 1) {
		if (threadIdx.x < o)
			sh[threadIdx.x] += sh[threadIdx.x + o];
		__syncthreads();
	}
	if (!threadIdx.x)
		part[blockIdx.x] = sh[0];
}

__global__ void k_sumsq_final(double *out, const double *part)
{
	__shared__ double sh[SQ_BLOCKS];

	for (int i = threadIdx.x; i < SQ_BLOCKS; i += blockDim.x)
		sh[i] = part[i];
	__syncthreads();
	for (int o = SQ_BLOCKS / 2; o; o >>= 1) {
		for (int i = threadIdx.x; i < o; i += blockDim.x)
			sh[i] += sh[i + o];
		__syncthreads();
	}
	if (!threadIdx.x)
		*out = sh[0];
}

template <typename G> static void sumsq(struct sl_cuda *c, double *out, const G *g, size_t n)
{
	double *part = (double *)sl_cuda_scratch(c, SQ_BLOCKS * sizeof(double), "sumsq");

	k_sumsq_partial<G><<<SQ_BLOCKS, NT, 0, c->stream>>>(part, g, n);
	CUDA_LAUNCHED();
	k_sumsq_final<<<1, NT, 0, c->stream>>>(out, part);
	CUDA_LAUNCHED();
}

extern "C" void sl_cuda_sumsq_f32(struct sl_cuda *c, double *out, const float *g, size_t n)
{
	sumsq(c, out, g, n);
}

extern "C" void sl_cuda_sumsq_bf16(struct sl_cuda *c, double *out, const void *g, size_t n)
{
	sumsq(c, out, (const bf16 *)g, n);
}

// torch's AdamW step in its order, one element; explicit _rn intrinsics so nvcc contracts
// nothing into FMAs and the fp32 results equal the cpu reference's
struct adamw_k {
	float decay, w1, b2, w2, bc2s, step, eps, gs;
	int lerp_lo;
};

static __device__ __forceinline__ void adamw_el(float &p, float &m, float &v, float graw,
						const adamw_k &a)
{
	float g = __fmul_rn(graw, a.gs);
	float pi = __fmul_rn(p, a.decay);
	float mi = m, vi, den;

	mi = a.lerp_lo ? __fadd_rn(mi, __fmul_rn(a.w1, __fsub_rn(g, mi))) :
			 __fsub_rn(g, __fmul_rn(__fsub_rn(g, mi), __fsub_rn(1.f, a.w1)));
	vi = __fmul_rn(v, a.b2);
	vi = __fadd_rn(vi, __fmul_rn(__fmul_rn(a.w2, g), g));
	den = __fadd_rn(__fdiv_rn(__fsqrt_rn(vi), a.bc2s), a.eps);
	p = __fadd_rn(pi, __fdiv_rn(__fmul_rn(a.step, mi), den));
	m = mi;
	v = vi;
}

// element i in place (and its bf16 copy)
template <typename G>
static __device__ __forceinline__ void adamw_at(float *p, float *m, float *v, const G *grad,
						bf16 *wo, size_t i, const adamw_k &a)
{
	float pi = p[i], mi = m[i], vi = v[i];

	adamw_el(pi, mi, vi, gval(grad[i]), a);
	p[i] = pi;
	m[i] = mi;
	v[i] = vi;
	if (wo)
		wo[i] = tobf(pi);
}

// one element a thread (any alignment)
template <typename G>
__global__ void k_adamw(float *p, float *m, float *v, const G *grad, bf16 *wo, size_t n,
			adamw_k a, const double *gate)
{
	if (gate && !isfinite(*gate))
		return;
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
	     i += (size_t)gridDim.x * blockDim.x)
		adamw_at(p, m, v, grad, wo, i, a);
}

// four elements a thread: p, m, v as 16-byte words, the gradient as 8 (bf16) or 16 bytes, the
// bf16 copy as 8 bytes (every pointer aligned so, the launcher's check); the last n % 4
// elements one a thread of block 0
static __device__ __forceinline__ void gval4(float *g, const bf16 *p)
{
	cvt4(g, *(const uint2 *)p);
}

static __device__ __forceinline__ void gval4(float *g, const float *p)
{
	float4 t = *(const float4 *)p;

	g[0] = t.x, g[1] = t.y, g[2] = t.z, g[3] = t.w;
}

// elements 4 i .. 4 i + 3 (k_adamw4's step)
template <typename G>
static __device__ __forceinline__ void adamw4_at(float *p, float *m, float *v, const G *grad,
						 bf16 *wo, size_t i, const adamw_k &a)
{
	float4 P = ((const float4 *)p)[i], M = ((const float4 *)m)[i];
	float4 V = ((const float4 *)v)[i];
	float g[4], pf[4] = { P.x, P.y, P.z, P.w }, mf[4] = { M.x, M.y, M.z, M.w };
	float vf[4] = { V.x, V.y, V.z, V.w };

	gval4(g, grad + 4 * i);
#pragma unroll
	for (int k = 0; k < 4; k++)
		adamw_el(pf[k], mf[k], vf[k], g[k], a);
	((float4 *)p)[i] = make_float4(pf[0], pf[1], pf[2], pf[3]);
	((float4 *)m)[i] = make_float4(mf[0], mf[1], mf[2], mf[3]);
	((float4 *)v)[i] = make_float4(vf[0], vf[1], vf[2], vf[3]);
	if (wo)
		*(uint2 *)(wo + 4 * i) = pack4(pf);
}

template <typename G>
__global__ void k_adamw4(float *p, float *m, float *v, const G *grad, bf16 *wo, size_t n,
			 adamw_k a, const double *gate)
{
	const size_t n4 = n / 4;

	if (gate && !isfinite(*gate))
		return;
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n4;
	     i += (size_t)gridDim.x * blockDim.x)
		adamw4_at(p, m, v, grad, wo, i, a);
	if (blockIdx.x == 0 && threadIdx.x < n - 4 * n4)
		adamw_at(p, m, v, grad, wo, 4 * n4 + threadIdx.x, a);
}

template <typename G>
static void adamw(struct sl_cuda *c, float *p, float *m, float *v, const G *grad, void *w_out,
		  size_t n, float lr, float beta1, float beta2, float eps, float wd, float bc1,
		  float bc2, float grad_scale, const double *gate)
{
	// the scalars torch forms as Python floats (double), rounded to float once
	const float decay = (float)(1.0 - (double)lr * wd);
	const float w1 = (float)(1.0 - (double)beta1);
	const float w2 = (float)(1.0 - (double)beta2);
	const float bc2s = (float)sqrt((double)bc2);
	const float step = (float)(-((double)lr / bc1));

	if (!n)
		return;
	const adamw_k a = { decay, w1, beta2, w2, bc2s, step, eps, grad_scale, fabsf(w1) < 0.5f };
	const bool vec = (uintptr_t)p % 16 == 0 && (uintptr_t)m % 16 == 0 &&
			 (uintptr_t)v % 16 == 0 && (uintptr_t)grad % (4 * sizeof(G)) == 0 &&
			 (uintptr_t)w_out % 8 == 0;

	if (vec)
		k_adamw4<G><<<grid_for(n / 4 ? n / 4 : 1, NT), NT, 0, c->stream>>>(
			p, m, v, grad, (bf16 *)w_out, n, a, gate);
	else
		k_adamw<G><<<grid_for(n, NT), NT, 0, c->stream>>>(p, m, v, grad, (bf16 *)w_out, n,
								  a, gate);
	CUDA_LAUNCHED();
}

extern "C" void sl_cuda_adamw_f32(struct sl_cuda *c, float *p, float *m, float *v,
				  const float *grad, void *w_out, size_t n, float lr, float beta1,
				  float beta2, float eps, float wd, float bc1, float bc2,
				  float grad_scale, const double *gate)
{
	adamw(c, p, m, v, grad, w_out, n, lr, beta1, beta2, eps, wd, bc1, bc2, grad_scale, gate);
}

extern "C" void sl_cuda_adamw_bf16g(struct sl_cuda *c, float *p, float *m, float *v,
				    const void *grad, void *w_out, size_t n, float lr, float beta1,
				    float beta2, float eps, float wd, float bc1, float bc2,
				    float grad_scale, const double *gate)
{
	adamw(c, p, m, v, (const bf16 *)grad, w_out, n, lr, beta1, beta2, eps, wd, bc1, bc2,
	      grad_scale, gate);
}
