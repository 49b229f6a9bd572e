// attention.cu: causal grouped-query flash attention, forward and backward, for variable record
// lengths in a right-padded batch.  The L x L score matrix is never stored: the forward keeps a
// running max and sum per query (online softmax) and writes the log-sum-exp; the backward
// recomputes probabilities from it.
//
// Head dims 64, 128 and 256 run on tensor cores (mma.sync, flash.cuh); SL_ATTN=generic selects the
// generic path for them too.  The generic path (any even head_dim up to 256): a group of TPR threads owns one row
// (a query, or in the dk/dv kernel a key) and DPT = head_dim/TPR of its dimensions; dot products
// are reduced across the group with shuffles; key/value (or query/dout) tiles are staged in shared
// memory and read by every row of the block.  fp32 accumulation throughout.  The backward is two
// kernels, dq over query tiles and dk/dv over key tiles (summing the query heads of a kv group in a
// fixed order), so no atomics are needed and results repeat bit for bit.
#include <cstdint>
#include <cstring>

#include "common.cuh"

// Packed rows: pos (B*L) holds each token's position in its document (common.cuh's doc_start).

#define TPR 8		// threads per row
#define ROWS 32		// rows per block
#define NTHR (TPR * ROWS)

static __device__ __forceinline__ float group_sum(float v, unsigned mask)
{
	v += __shfl_xor_sync(mask, v, 4);
	v += __shfl_xor_sync(mask, v, 2);
	v += __shfl_xor_sync(mask, v, 1);
	return v;
}

// keys per shared tile: two (BK x 8*DPT) bf16 tiles stay within 32 KB
template <int DPT> struct tile {
	static const int HDP = TPR * DPT;
	static const int BK = DPT >= 32 ? 32 : 64;
};

// rows [r0, r0 + BK) of one head (column offset col) of the qkv-layout buffer into sh (BK x HDP),
// zero past r1 or past hd
template <int DPT>
static __device__ __forceinline__ void load_tile(bf16 *sh, const bf16 *base, size_t stride, int col,
						 int r0, int r1, int hd)
{
	const int HDP = tile<DPT>::HDP, BK = tile<DPT>::BK;

	for (int e = threadIdx.x; e < BK * HDP / 2; e += NTHR) {
		int r = e / (HDP / 2), d = (e % (HDP / 2)) * 2;
		__nv_bfloat162 v = __floats2bfloat162_rn(0.f, 0.f);

		if (r0 + r < r1 && d < hd)
			v = *(const __nv_bfloat162 *)(base + (size_t)(r0 + r) * stride + col + d);
		*(__nv_bfloat162 *)(sh + r * HDP + d) = v;
	}
}

// this thread's DPT dims of a row in global memory, zero past hd
template <int DPT>
static __device__ __forceinline__ void load_row(float *dst, const bf16 *src, int d0, int hd)
{
	for (int d = 0; d < DPT; d++)
		dst[d] = d0 + d < hd ? bf(src[d0 + d]) : 0.f;
}

template <int DPT>
__global__ void __launch_bounds__(NTHR)
k_attn_fwd(bf16 *out, float *lse, const bf16 *qkv, const int *lens, const int *pos, int L, int nh,
	   int nkv, int hd, float scale_log2)
{
	const int HDP = tile<DPT>::HDP, BK = tile<DPT>::BK;
	__shared__ __align__(16) bf16 ks[BK * HDP], vs[BK * HDP];
	const int W = (nh + 2 * nkv) * hd, b = blockIdx.z, h = blockIdx.y, grp = nh / nkv;
	const int q0 = blockIdx.x * ROWS, r = threadIdx.x / TPR, d0 = (threadIdx.x % TPR) * DPT;
	const int i = q0 + r, len = lens[b];
	const unsigned mask = 0xffu << ((threadIdx.x & 31) & ~7);
	const bf16 *base = qkv + (size_t)b * L * W;
	const int kcol = (nh + h / grp) * hd, vcol = (nh + nkv + h / grp) * hd;
	float q[DPT], o[DPT], m = -INFINITY, l = 0.f;
	bool active = i < len;
	const int ds = active ? doc_start(pos, b, L, i) : 0;
	const int kbeg = q0 < len ? doc_start(pos, b, L, q0) / BK * BK : 0;

	if (i < L && active) {
		load_row<DPT>(q, base + (size_t)i * W + (size_t)h * hd, d0, hd);
		for (int d = 0; d < DPT; d++)
			q[d] *= scale_log2;	// scores in log2 units: exp2 is one instruction
	}
	for (int d = 0; d < DPT; d++)
		o[d] = 0.f;
	// keys any row of this block sees; none when the whole block is padding
	int kend = q0 < len ? min(len, q0 + ROWS) : 0;
	for (int k0 = kbeg; k0 < kend; k0 += BK) {
		__syncthreads();
		load_tile<DPT>(ks, base, W, kcol, k0, kend, hd);
		load_tile<DPT>(vs, base, W, vcol, k0, kend, hd);
		__syncthreads();
		if (!active)
			continue;
		int jn = min(BK, i + 1 - k0);
		for (int jj = max(0, ds - k0); jj < jn; jj++) {
			const bf16 *kr = ks + jj * HDP + d0, *vr = vs + jj * HDP + d0;
			float s = 0.f, p;

			for (int d = 0; d < DPT; d++)
				s += q[d] * bf(kr[d]);
			s = group_sum(s, mask);
			if (s > m) {
				float cr = exp2f(m - s);

				l *= cr;
				for (int d = 0; d < DPT; d++)
					o[d] *= cr;
				m = s;
			}
			p = exp2f(s - m);
			l += p;
			for (int d = 0; d < DPT; d++)
				o[d] += p * bf(vr[d]);
		}
	}
	if (i >= L)
		return;
	bf16 *y = out + ((size_t)b * L + i) * nh * hd + (size_t)h * hd;
	for (int d = 0; d < DPT; d++)
		if (d0 + d < hd)
			y[d0 + d] = tobf(active ? o[d] / l : 0.f);
	if (d0 == 0)
		lse[((size_t)b * L + i) * nh + h] = active ? (m + log2f(l)) * 0.69314718055994531f : 0.f;
}

// D(t, h) = dout . out, per query row: the softmax-gradient correction term
__global__ void k_attn_dot(float *D, const bf16 *dout, const bf16 *out, size_t rows, int hd)
{
	size_t row = blockIdx.x * (size_t)(blockDim.x / 32) + threadIdx.x / 32;
	int lane = threadIdx.x & 31;
	float s = 0.f;

	if (row >= rows)
		return;
	for (int d = lane; d < hd; d += 32)
		s += bf(dout[row * hd + d]) * bf(out[row * hd + d]);
	for (int o = 16; o; o >>= 1)
		s += __shfl_xor_sync(0xffffffffu, s, o);
	if (!lane)
		D[row] = s;
}

template <int DPT>
__global__ void __launch_bounds__(NTHR)
k_attn_dq(bf16 *dqkv, const bf16 *dout, const float *lse, const float *D, const bf16 *qkv,
	  const int *lens, const int *pos, int L, int nh, int nkv, int hd, float scale)
{
	const int HDP = tile<DPT>::HDP, BK = tile<DPT>::BK;
	__shared__ __align__(16) bf16 ks[BK * HDP], vs[BK * HDP];
	const int W = (nh + 2 * nkv) * hd, b = blockIdx.z, h = blockIdx.y, grp = nh / nkv;
	const int q0 = blockIdx.x * ROWS, r = threadIdx.x / TPR, d0 = (threadIdx.x % TPR) * DPT;
	const int i = q0 + r, len = lens[b];
	const unsigned mask = 0xffu << ((threadIdx.x & 31) & ~7);
	const bf16 *base = qkv + (size_t)b * L * W;
	const int kcol = (nh + h / grp) * hd, vcol = (nh + nkv + h / grp) * hd;
	const size_t t = (size_t)b * L + i;
	float q[DPT], g[DPT], dq[DPT], ls = 0.f, Di = 0.f;
	bool active = i < len;
	const int ds = active ? doc_start(pos, b, L, i) : 0;
	const int kbeg = q0 < len ? doc_start(pos, b, L, q0) / BK * BK : 0;

	if (active) {
		load_row<DPT>(q, base + (size_t)i * W + (size_t)h * hd, d0, hd);
		load_row<DPT>(g, dout + t * nh * hd + (size_t)h * hd, d0, hd);
		ls = lse[t * nh + h];
		Di = D[t * nh + h];
	}
	for (int d = 0; d < DPT; d++)
		dq[d] = 0.f;
	int kend = q0 < len ? min(len, q0 + ROWS) : 0;
	for (int k0 = kbeg; k0 < kend; k0 += BK) {
		__syncthreads();
		load_tile<DPT>(ks, base, W, kcol, k0, kend, hd);
		load_tile<DPT>(vs, base, W, vcol, k0, kend, hd);
		__syncthreads();
		if (!active)
			continue;
		int jn = min(BK, i + 1 - k0);
		for (int jj = max(0, ds - k0); jj < jn; jj++) {
			const bf16 *kr = ks + jj * HDP + d0, *vr = vs + jj * HDP + d0;
			float s = 0.f, dp = 0.f, p, ds;

			for (int d = 0; d < DPT; d++) {
				s += q[d] * bf(kr[d]);
				dp += g[d] * bf(vr[d]);
			}
			s = group_sum(s, mask);
			dp = group_sum(dp, mask);
			p = __expf(s * scale - ls);
			ds = p * (dp - Di);
			for (int d = 0; d < DPT; d++)
				dq[d] += ds * bf(kr[d]);
		}
	}
	if (i >= L)
		return;
	bf16 *y = dqkv + t * W + (size_t)h * hd;
	for (int d = 0; d < DPT; d++)
		if (d0 + d < hd)
			y[d0 + d] = tobf(active ? dq[d] * scale : 0.f);
}

// one row group per key j of kv head blockIdx.y; loops over the group's query heads in order and
// the queries i >= j of each
template <int DPT>
__global__ void __launch_bounds__(NTHR)
k_attn_dkdv(bf16 *dqkv, const bf16 *dout, const float *lse, const float *D, const bf16 *qkv,
	    const int *lens, const int *pos, int L, int nh, int nkv, int hd, float scale)
{
	const int HDP = tile<DPT>::HDP, BQ = tile<DPT>::BK;
	__shared__ __align__(16) bf16 qs[BQ * HDP], gs[BQ * HDP];
	__shared__ float lss[BQ], Ds[BQ];
	__shared__ int dss[BQ];
	const int W = (nh + 2 * nkv) * hd, OW = nh * hd, b = blockIdx.z, kv = blockIdx.y;
	const int grp = nh / nkv;
	const int j0 = blockIdx.x * ROWS, r = threadIdx.x / TPR, d0 = (threadIdx.x % TPR) * DPT;
	const int j = j0 + r, len = lens[b];
	const unsigned mask = 0xffu << ((threadIdx.x & 31) & ~7);
	const bf16 *base = qkv + (size_t)b * L * W;
	const bf16 *gbase = dout + (size_t)b * L * OW;
	float k[DPT], v[DPT], dk[DPT], dv[DPT];
	bool active = j < len;

	if (active) {
		load_row<DPT>(k, base + (size_t)j * W + (size_t)(nh + kv) * hd, d0, hd);
		load_row<DPT>(v, base + (size_t)j * W + (size_t)(nh + nkv + kv) * hd, d0, hd);
	}
	for (int d = 0; d < DPT; d++)
		dk[d] = dv[d] = 0.f;
	// the queries that see this block's keys end where a document starts after its last key
	const int jl = min(j0 + ROWS, len) - 1;

	for (int h = kv * grp; h < (kv + 1) * grp; h++) {
		for (int i0 = j0; i0 < len && doc_start(pos, b, L, i0) <= jl; i0 += BQ) {
			__syncthreads();
			load_tile<DPT>(qs, base, W, h * hd, i0, len, hd);
			load_tile<DPT>(gs, gbase, OW, h * hd, i0, len, hd);
			for (int e = threadIdx.x; e < BQ; e += NTHR) {
				size_t t = (size_t)b * L + i0 + e;

				lss[e] = i0 + e < len ? lse[t * nh + h] : 0.f;
				Ds[e] = i0 + e < len ? D[t * nh + h] : 0.f;
				dss[e] = i0 + e < len ? doc_start(pos, b, L, i0 + e) : 0;
			}
			__syncthreads();
			if (!active)
				continue;
			int ib = max(0, j - i0), in = min(BQ, len - i0);
			for (int ii = ib; ii < in; ii++) {
				const bf16 *qr = qs + ii * HDP + d0, *gr = gs + ii * HDP + d0;
				float s = 0.f, dp = 0.f, p, ds;

				if (dss[ii] > j)
					break;	// this query and the later ones are in later documents

				for (int d = 0; d < DPT; d++) {
					s += bf(qr[d]) * k[d];
					dp += bf(gr[d]) * v[d];
				}
				s = group_sum(s, mask);
				dp = group_sum(dp, mask);
				p = __expf(s * scale - lss[ii]);
				ds = p * (dp - Ds[ii]);
				for (int d = 0; d < DPT; d++) {
					dv[d] += p * bf(gr[d]);
					dk[d] += ds * bf(qr[d]);
				}
			}
		}
	}
	if (j >= L)
		return;
	bf16 *yk = dqkv + ((size_t)b * L + j) * W + (size_t)(nh + kv) * hd;
	bf16 *yv = yk + (size_t)nkv * hd;
	for (int d = 0; d < DPT; d++) {
		if (d0 + d < hd) {
			yk[d0 + d] = tobf(active ? dk[d] * scale : 0.f);
			yv[d0 + d] = tobf(active ? dv[d] : 0.f);
		}
	}
}

#include "flash.cuh"

// the tensor-core path unless SL_ATTN=generic (a switch for comparing the two)
static bool use_mma(int hd, const void *qkv, const void *out)
{
	static int mode = -1;

	if (mode < 0) {
		const char *e = getenv("SL_ATTN");

		mode = e && !strcmp(e, "generic") ? 0 : 1;
	}
	return mode && (hd == 64 || hd == 128 || hd == 256) && (uintptr_t)qkv % 16 == 0 &&
	       (uintptr_t)out % 4 == 0;
}

static int dpt_for(int hd)
{
	if (hd < 2 || hd > 256 || hd % 2) {
		fprintf(stderr, "cuda: attention: head_dim %d unsupported (even, 2..256)\n", hd);
		abort();
	}
	return hd <= 8 ? 1 : hd <= 16 ? 2 : hd <= 32 ? 4 : hd <= 64 ? 8 : hd <= 128 ? 16 : 32;
}

#define DISPATCH(dpt, KERNEL, grid, ...)                                                  \
	do {                                                                              \
		switch (dpt) {                                                            \
		case 1: KERNEL<1><<<grid, NTHR, 0, c->stream>>>(__VA_ARGS__); break;      \
		case 2: KERNEL<2><<<grid, NTHR, 0, c->stream>>>(__VA_ARGS__); break;      \
		case 4: KERNEL<4><<<grid, NTHR, 0, c->stream>>>(__VA_ARGS__); break;      \
		case 8: KERNEL<8><<<grid, NTHR, 0, c->stream>>>(__VA_ARGS__); break;      \
		case 16: KERNEL<16><<<grid, NTHR, 0, c->stream>>>(__VA_ARGS__); break;    \
		default: KERNEL<32><<<grid, NTHR, 0, c->stream>>>(__VA_ARGS__); break;    \
		}                                                                         \
		CUDA_LAUNCHED();                                                          \
	} while (0)

static void check_heads(int nh, int nkv)
{
	if (nkv < 1 || nh % nkv) {
		fprintf(stderr, "cuda: attention: %d heads not a multiple of %d kv heads\n", nh, nkv);
		abort();
	}
}

// one of the tensor-core instantiations by head_dim (64, 128 or 256: use_mma said yes)
template <bool CP>
static void fa_fwd_hd(struct sl_cuda *c, int hd, bf16 *out, float *lse, const bf16 *qkv,
		      const int *lens, const int *pos, int B, int L, int nh, int nkv, float sl2,
		      const fa_rows &x)
{
	if (hd == 256)
		fa_fwd<256, CP>(c, out, lse, qkv, lens, pos, B, L, nh, nkv, sl2, x);
	else if (hd == 128)
		fa_fwd<128, CP>(c, out, lse, qkv, lens, pos, B, L, nh, nkv, sl2, x);
	else
		fa_fwd<64, CP>(c, out, lse, qkv, lens, pos, B, L, nh, nkv, sl2, x);
}

// dqa: the fused dq's sums, dsg: the dS path's buffer, or NULL (fa_bwd_k)
template <bool CP>
static void fa_bwd_hd(struct sl_cuda *c, int hd, bf16 *dqkv, bf16 *dkv, const bf16 *dout,
		      const float *lse, const float *D, const bf16 *qkv, const int *lens,
		      const int *pos, int B, int L, int nh, int nkv, const fa_rows &x,
		      float *dqa = nullptr, bf16 *dsg = nullptr)
{
	const float scale = (float)(1.0 / sqrt((double)hd));
	const float sl2 = (float)(1.4426950408889634 / sqrt((double)hd));

	if (hd == 256)
		fa_bwd<256, CP>(c, dqkv, dkv, dout, lse, D, qkv, lens, pos, B, L, nh, nkv, sl2, scale,
				x, dqa, dsg);
	else if (hd == 128)
		fa_bwd<128, CP>(c, dqkv, dkv, dout, lse, D, qkv, lens, pos, B, L, nh, nkv, sl2, scale,
				x, dqa, dsg);
	else
		fa_bwd<64, CP>(c, dqkv, dkv, dout, lse, D, qkv, lens, pos, B, L, nh, nkv, sl2, scale,
			       x, dqa, dsg);
}

// the dS path's largest buffer (SHARDLM_FA_DS_MAX_MB, read once)
static size_t fa_ds_max(void)
{
	static size_t mb = 0;

	if (!mb) {
		const char *e = getenv("SHARDLM_FA_DS_MAX_MB");

		mb = e && atol(e) > 0 ? (size_t)atol(e) : 4096;
	}
	return mb << 20;
}

// D = rowsum(dout * out) per (query row, head), in the scratch
static float *attn_dot(struct sl_cuda *c, const void *dout, const void *out, size_t rows, int hd)
{
	float *D = sl_cuda_scratch(c, rows * sizeof(float), "attention backward");

	k_attn_dot<<<(unsigned)((rows + 7) / 8), 256, 0, c->stream>>>(D, (const bf16 *)dout,
								     (const bf16 *)out, rows, hd);
	CUDA_LAUNCHED();
	return D;
}

extern "C" void sl_cuda_attention_fwd(struct sl_cuda *c, void *out, float *lse, const void *qkv,
				      const int *lens, const int *pos, int B, int L, int nh, int nkv,
				      int hd)
{
	int dpt = dpt_for(hd);
	dim3 grid((L + ROWS - 1) / ROWS, nh, B);
	float scale_log2 = (float)(1.4426950408889634 / sqrt((double)hd));

	check_heads(nh, nkv);
	if (B <= 0 || L <= 0)
		return;
	if (use_mma(hd, qkv, out)) {
		fa_fwd_hd<false>(c, hd, (bf16 *)out, lse, (const bf16 *)qkv, lens, pos, B, L, nh, nkv,
				 scale_log2, fa_rows{});
		return;
	}
	DISPATCH(dpt, k_attn_fwd, grid, (bf16 *)out, lse, (const bf16 *)qkv, lens, pos, L, nh, nkv,
		 hd, scale_log2);
}

extern "C" void sl_cuda_attention_bwd(struct sl_cuda *c, void *dqkv, const void *dout,
				      const void *out, const float *lse, const void *qkv,
				      const int *lens, const int *pos, int B, int L, int nh, int nkv,
				      int hd)
{
	int dpt = dpt_for(hd);
	float scale = (float)(1.0 / sqrt((double)hd));
	float *D;

	check_heads(nh, nkv);
	if (B <= 0 || L <= 0)
		return;
	const bool mma = use_mma(hd, qkv, dqkv) && (uintptr_t)dout % 16 == 0;
	float *dqa = NULL;
	bf16 *dsg = NULL;
	// the dS path's buffer after D in the scratch (as the fused dq's sums below), where it is
	// at most SHARDLM_FA_DS_MAX_MB (default 4096) and the device has room; else the dq kernel
	const size_t at = ((size_t)B * L * nh * sizeof(float) + 255) / 256 * 256;

	if (mma && fa_bwd_ds(hd)) {
		const size_t ds = fa_ds_bytes(B, L, nh);

		if (ds <= fa_ds_max() && sl_cuda_scratch_grow(c, at + ds) == 0)
			dsg = (bf16 *)((char *)c->scratch + at);
	}
	if (mma && !dsg && fa_bwd_fused(c, hd)) {
		// the fused dq's sums after D in the scratch, grown (once, the stream drained) to
		// hold them; where the device has no room, the dq kernel as usual
		const size_t need = at + (size_t)B * nh * hd * fa_dq_pitch(L) * sizeof(float);

		if (sl_cuda_scratch_grow(c, need) == 0)
			dqa = (float *)((char *)c->scratch + at);
	}
	D = attn_dot(c, dout, out, (size_t)B * L * nh, hd);
	if (mma) {
		fa_bwd_hd<false>(c, hd, (bf16 *)dqkv, NULL, (const bf16 *)dout, lse, D,
				 (const bf16 *)qkv, lens, pos, B, L, nh, nkv, fa_rows{}, dqa, dsg);
		return;
	}
	DISPATCH(dpt, k_attn_dq, dim3((L + ROWS - 1) / ROWS, nh, B), (bf16 *)dqkv,
		 (const bf16 *)dout, lse, D, (const bf16 *)qkv, lens, pos, L, nh, nkv, hd, scale);
	DISPATCH(dpt, k_attn_dkdv, dim3((L + ROWS - 1) / ROWS, nkv, B), (bf16 *)dqkv,
		 (const bf16 *)dout, lse, D, (const bf16 *)qkv, lens, pos, L, nh, nkv, hd, scale);
}

// ---- context parallel (backend.h's cp_attention ops) ---------------------------------------------
// The tensor-core kernels with the rank's queries against whole rows' keys; head_dim 64, 128 or
// 256 only (sl_cuda_cp_attention_supported).

extern "C" int sl_cuda_cp_attention_supported(int hd)
{
	return hd == 64 || hd == 128 || hd == 256;
}

static void cp_check(int hd, int nh, int nkv, const void *a, const void *b2)
{
	check_heads(nh, nkv);
	if (!sl_cuda_cp_attention_supported(hd) || (uintptr_t)a % 16 || (uintptr_t)b2 % 16) {
		fprintf(stderr, "cuda: context-parallel attention needs head_dim 64, 128 or 256 and "
			"16-byte aligned rows (head_dim %d)\n", hd);
		abort();
	}
}

extern "C" void sl_cuda_cp_attention_fwd(struct sl_cuda *c, void *out, float *lse, const void *qkv,
					 const void *kv, const int *gidx, const int *pos,
					 const int *lens, int B, int Lc, int L, int nh, int nkv,
					 int hd, int me, int C, int part)
{
	const fa_rows x = { (const bf16 *)kv, gidx, pos, Lc, L / (2 * C), C, me, part };

	cp_check(hd, nh, nkv, qkv, kv);
	if (B <= 0 || Lc <= 0)
		return;
	fa_fwd_hd<true>(c, hd, (bf16 *)out, lse, (const bf16 *)qkv, lens, NULL, B, L, nh, nkv,
			(float)(1.4426950408889634 / sqrt((double)hd)), x);
}

extern "C" void sl_cuda_cp_attention_bwd(struct sl_cuda *c, void *dqkv, void *dkv,
					 const void *dout, const void *out, const float *lse,
					 const void *qkv, const void *kv, const int *gidx,
					 const int *pos, const int *lens, int B, int Lc, int L,
					 int nh, int nkv, int hd)
{
	const fa_rows x = { (const bf16 *)kv, gidx, pos, Lc, L, 1, 0, 0 };
	float *D;

	cp_check(hd, nh, nkv, qkv, kv);
	if (B <= 0 || Lc <= 0)
		return;
	// the k|v columns of dqkv stay zero (the kernels write dq only)
	CUDA_CHECK(cudaMemsetAsync(dqkv, 0, (size_t)B * Lc * (nh + 2 * nkv) * hd * sizeof(bf16),
				   c->stream));
	D = attn_dot(c, dout, out, (size_t)B * Lc * nh, hd);
	fa_bwd_hd<true>(c, hd, (bf16 *)dqkv, (bf16 *)dkv, (const bf16 *)dout, lse, D,
			(const bf16 *)qkv, lens, NULL, B, L, nh, nkv, x);
}
