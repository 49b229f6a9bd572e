// qknorm.cuh: the Qwen3 q/k RMSNorm + rotary kernels (forward, backward, the norm weights'
// first pass), included by ops.cu; device code only, so that test/test_qk_emu.cc runs them on
// the host emulation (emu.cuh).
#ifndef SL_QKNORM_CUH
#define SL_QKNORM_CUH

#include <type_traits>

#define QK_WARPS 8
#define QK_FWD_ROWS QK_WARPS	// (token, head) rows a block of k_qk_norm_rope_fwd_w takes
#define HD_MAX 256

// the token's position: pos[t] (packed rows, context parallel) or its index in its row
static __device__ __forceinline__ int rope_pos(const int *pos, int t, int L)
{
	return pos ? pos[t] : t % L;
}

// the rotary angle's cos and sin computed in double (no table: rows too long for the scratch);
// not inlined, so that the double math's registers do not weigh on the kernels' table path
static __device__ SL_NOINLINE float2 rope_angle(int p, int hd, float theta, int i)
{
	double ang = p * pow((double)theta, -2.0 * i / hd), sd, cd;

	sincos(ang, &sd, &cd);
	return make_float2((float)cd, (float)sd);
}

// cos and sin of position p for pair i: from the rotary table (norm_dw.cuh rope_table, rot =
// hd), or without one the same angle in double computed here
static __device__ __forceinline__ void rope_pair(const float *tab, int p, int hd, float theta,
						 int i, float *c, float *s)
{
	if (tab) {
		*c = tab[(size_t)p * hd + i];
		*s = tab[(size_t)p * hd + hd / 2 + i];
	} else {
		const float2 cs = rope_angle(p, hd, theta, i);

		*c = cs.x;
		*s = cs.y;
	}
}

// any even head_dim: one block per token, warp per head
__global__ void __launch_bounds__(QK_WARPS * 32)
k_qk_norm_rope_fwd(bf16 *out, float *rstd, const bf16 *qkv, const bf16 *qw, const bf16 *kw,
		   const float *tab, int L, const int *pos, int nh, int nkv, int hd, float eps,
		   float theta)
{
	__shared__ float cs[HD_MAX / 2], sn[HD_MAX / 2];
	__shared__ float nb[QK_WARPS][HD_MAX];
	const int t = blockIdx.x, W = (nh + 2 * nkv) * hd, nq = nh + nkv, half = hd / 2;
	const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
	const bf16 *in = qkv + (size_t)t * W;
	bf16 *o = out + (size_t)t * W;

	for (int i = threadIdx.x; i < half; i += blockDim.x)
		rope_pair(tab, rope_pos(pos, t, L), hd, theta, i, &cs[i], &sn[i]);
	__syncthreads();

	for (int j = warp; j < nq; j += QK_WARPS) {
		const bf16 *x = in + (size_t)j * hd, *w = j < nh ? qw : kw;
		float *n = nb[warp], ss = 0.f, r;

		for (int i = lane; i < hd; i += 32) {
			float v = bf(x[i]);

			ss += v * v;
		}
		ss = warp_sum(ss);
		r = 1.f / sqrtf(ss / hd + eps);
		if (!lane)
			rstd[(size_t)t * nq + j] = r;
		for (int i = lane; i < hd; i += 32)
			n[i] = (bf(x[i]) * r) * bf(w[i]);
		__syncwarp();
		for (int i = lane; i < half; i += 32) {
			o[(size_t)j * hd + i] = tobf(n[i] * cs[i] - n[i + half] * sn[i]);
			o[(size_t)j * hd + i + half] = tobf(n[i + half] * cs[i] + n[i] * sn[i]);
		}
		__syncwarp();
	}
	for (int i = threadIdx.x; i < nkv * hd; i += blockDim.x)
		o[(size_t)nq * hd + i] = in[(size_t)nq * hd + i];
}

// gradient w.r.t. the normed, un-rotated element i, from the rotated gradient dy
static __device__ __forceinline__ float rope_back(const bf16 *dy, const float *cs, const float *sn,
						  int i, int half)
{
	if (i < half)
		return bf(dy[i]) * cs[i] + bf(dy[i + half]) * sn[i];
	i -= half;
	return -bf(dy[i]) * sn[i] + bf(dy[i + half]) * cs[i];
}

__global__ void __launch_bounds__(QK_WARPS * 32)
k_qk_norm_rope_bwd(bf16 *dqkv, const bf16 *dout, const bf16 *qkv, const bf16 *qw, const bf16 *kw,
		   const float *rstd, const float *tab, int L, const int *pos, int nh, int nkv,
		   int hd, float theta)
{
	__shared__ float cs[HD_MAX / 2], sn[HD_MAX / 2];
	const int t = blockIdx.x, W = (nh + 2 * nkv) * hd, nq = nh + nkv, half = hd / 2;
	const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;

	for (int i = threadIdx.x; i < half; i += blockDim.x)
		rope_pair(tab, rope_pos(pos, t, L), hd, theta, i, &cs[i], &sn[i]);
	__syncthreads();

	for (int j = warp; j < nq; j += QK_WARPS) {
		size_t off = (size_t)t * W + (size_t)j * hd;
		const bf16 *x = qkv + off, *dy = dout + off, *w = j < nh ? qw : kw;
		float r = rstd[(size_t)t * nq + j], s = 0.f, k;

		for (int i = lane; i < hd; i += 32)
			s += rope_back(dy, cs, sn, i, half) * bf(w[i]) * bf(x[i]);
		s = warp_sum(s);
		k = s * r * r * r / hd;
		for (int i = lane; i < hd; i += 32)
			dqkv[off + i] = tobf(r * bf(w[i]) * rope_back(dy, cs, sn, i, half) -
					     bf(x[i]) * k);
	}
	for (int i = threadIdx.x; i < nkv * hd; i += blockDim.x) {
		size_t off = (size_t)t * W + (size_t)nq * hd + i;

		dqkv[off] = dout[off];
	}
}

// VE (2, 4 or 8) consecutive bf16 as one word of 4, 8 or 16 bytes (the v heads' copy); VE fp32 as
// one vector access (32 bytes for VE 8 as two: the rotary table)
template <int VE>
using bf_word = std::conditional_t<VE == 8, uint4, std::conditional_t<VE == 4, uint2, uint32_t>>;
template <int VE> struct alignas(4 * VE) f_vec {
	float v[VE];
};

// VE (2, 4 or 8) bf16 at a 2 VE-byte aligned address as floats, and back (common.cuh's ld8 and
// st8, cvt4 and pack4)
template <int VE> static __device__ __forceinline__ void ld_bfv(float *f, const bf16 *p)
{
	if constexpr (VE == 8) {
		ld8(f, p);
	} else if constexpr (VE == 4) {
		cvt4(f, *(const uint2 *)p);
	} else {
		const float2 t = __bfloat1622float2(*(const __nv_bfloat162 *)p);

		f[0] = t.x;
		f[1] = t.y;
	}
}

template <int VE> static __device__ __forceinline__ void st_bfv(bf16 *p, const float *f)
{
	if constexpr (VE == 8)
		st8(p, f);
	else if constexpr (VE == 4)
		*(uint2 *)p = pack4(f);
	else
		*(__nv_bfloat162 *)p = __floats2bfloat162_rn(f[0], f[1]);
}

// the rotary cos and sin of pairs i .. i + VE - 1 at position p (VE consecutive, i a multiple of
// VE): from the table by vectors, else computed
template <int HD, int VE>
static __device__ __forceinline__ void rope_vec(const float *tab, int p, float theta, int i,
						float *c, float *s)
{
	if (tab) {
		const f_vec<VE> cv = *(const f_vec<VE> *)(tab + (size_t)p * HD + i);
		const f_vec<VE> sv = *(const f_vec<VE> *)(tab + (size_t)p * HD + HD / 2 + i);

#pragma unroll
		for (int k = 0; k < VE; k++) {
			c[k] = cv.v[k];
			s[k] = sv.v[k];
		}
		return;
	}
#pragma unroll
	for (int k = 0; k < VE; k++)
		rope_pair(NULL, p, HD, theta, i + k, &c[k], &s[k]);
}

// head_dim HD a multiple of 64: one warp per (token, head), lane l holding elements l + 32k in
// registers, so an element and its rotary partner (k + HD/64) sit in the same lane; v heads are
// copied.  The same arithmetic, in the same order, as the kernels above.
template <int HD>
__global__ void __launch_bounds__(QK_WARPS * 32)
k_qk_norm_rope_fwd_w(bf16 *out, float *rstd, const bf16 *qkv, const bf16 *qw, const bf16 *kw,
		     const float *tab, int T, int L, const int *pos, int nh, int nkv, float eps,
		     float theta)
{
	constexpr int NK = HD / 32, HK = NK / 2, half = HD / 2;
	const int nj = nh + 2 * nkv, nq = nh + nkv, lane = threadIdx.x & 31;
	const size_t wid = (blockIdx.x * (size_t)blockDim.x + threadIdx.x) >> 5;

	if (wid >= (size_t)T * nj)
		return;
	const int t = (int)(wid / nj), j = (int)(wid % nj);
	const size_t off = (size_t)t * nj * HD + (size_t)j * HD;
	float x[NK], wv[NK], c[HK], sn[HK], ss = 0.f, r;

	if (j >= nq) {
#pragma unroll
		for (int k = 0; k < NK; k++)
			out[off + lane + 32 * k] = qkv[off + lane + 32 * k];
		return;
	}
	// every load first (the row, the weights, the rotary pairs), so that a warp waits for
	// memory once: a warp's row is only 2 HD bytes, the kernel lives on loads in flight
	const bf16 *w = j < nh ? qw : kw;
	const int p = rope_pos(pos, t, L);
#pragma unroll
	for (int k = 0; k < NK; k++) {
		x[k] = bf(qkv[off + lane + 32 * k]);
		wv[k] = bf(w[lane + 32 * k]);
	}
#pragma unroll
	for (int k = 0; k < HK; k++)
		rope_pair(tab, p, HD, theta, lane + 32 * k, &c[k], &sn[k]);
#pragma unroll
	for (int k = 0; k < NK; k++)
		ss += x[k] * x[k];
	ss = warp_sum(ss);
	r = 1.f / sqrtf(ss / HD + eps);
	if (!lane)
		rstd[(size_t)t * nq + j] = r;
#pragma unroll
	for (int k = 0; k < NK; k++)
		x[k] = (x[k] * r) * wv[k];
#pragma unroll
	for (int k = 0; k < HK; k++) {
		const int i = lane + 32 * k;

		out[off + i] = tobf(x[k] * c[k] - x[k + HK] * sn[k]);
		out[off + i + half] = tobf(x[k + HK] * c[k] + x[k] * sn[k]);
	}
}

// One q or k row's backward, lane l holding elements l VE .. l VE + VE - 1 (the rotary partner
// in lane l ^ 16): from dy (the rotated output's gradient), x (the row), wv (its norm weights),
// c, sn (the rotary pairs (l & 15) VE ..) and r (its rstd), the row's gradient g, and dn x r
// added to aq (a q row) or ak (a k row), the norm weights' gradient (the warp-per-row and the
// staged backward's).
template <int HD, int VE>
static __device__ __forceinline__ void qk_row_bwd(float *g, float *aq, float *ak, const float *dy,
						  const float *x, const float *wv, const float *c,
						  const float *sn, float r, bool isq, int lane)
{
	float dyp[VE], dn[VE], s = 0.f, kk;

#pragma unroll
	for (int k = 0; k < VE; k++)
		dyp[k] = __shfl_xor_sync(0xffffffffu, dy[k], 16);
#pragma unroll
	for (int k = 0; k < VE; k++)	// first half: dy c + dy' s; second: -dy' s + dy c
		dn[k] = lane < 16 ? dy[k] * c[k] + dyp[k] * sn[k] : -dyp[k] * sn[k] + dy[k] * c[k];
#pragma unroll
	for (int k = 0; k < VE; k++) {
		const float e = dn[k] * x[k];

		s += e * wv[k];
		if (isq)
			aq[k] += e * r;
		else
			ak[k] += e * r;
	}
	s = warp_sum(s);
	kk = s * r * r * r / HD;
#pragma unroll
	for (int k = 0; k < VE; k++)
		g[k] = r * wv[k] * dn[k] - x[k] * kk;
}

// the block's norm weight gradients: each warp's lane sums (aq, ak) through red, added over the
// warps in order into part[(kind * gridDim.x + block) * HD + i] (kind 0 q, 1 k)
template <int HD, int VE>
static __device__ __forceinline__ void qk_dw_block(float (*red)[2][HD], float *part,
						   const float *aq, const float *ak, int warp,
						   int lane)
{
#pragma unroll
	for (int k = 0; k < VE; k++) {
		red[warp][0][lane * VE + k] = aq[k];
		red[warp][1][lane * VE + k] = ak[k];
	}
	__syncthreads();
	for (int e = threadIdx.x; e < 2 * HD; e += QK_WARPS * 32) {
		const int kind = e / HD, i = e % HD;
		float acc = 0.f;

		for (int w = 0; w < QK_WARPS; w++)
			acc += red[w][kind][i];
		part[((size_t)kind * gridDim.x + blockIdx.x) * HD + i] = acc;
	}
}

// A warp per (token, head) in turn (warps stride over them: warp w of block b takes every
// (gridDim.x * QK_WARPS)-th one from b * QK_WARPS + w), lane l holding the VE = HD / 32
// consecutive elements from l VE (one 4- to 16-byte access each; an element's rotary partner,
// i + HD/2 or i - HD/2, sits at the same place in lane l ^ 16 and comes by one shuffle), and the
// norm weights' gradients on the way: each lane sums dn x rstd of its columns over its
// warp's q heads and k heads, the block adds its warps' sums in order into
// part[(kind * gridDim.x + block) * HD + i] (kind 0 q, 1 k), which norm_dw_final adds up in a
// fixed order: the same sums on every run.
template <int HD>
__global__ void __launch_bounds__(QK_WARPS * 32)
k_qk_norm_rope_bwd_w(bf16 *dqkv, float *part, const bf16 *dout, const bf16 *qkv, const bf16 *qw,
		     const bf16 *kw, const float *rstd, const float *tab, int T, int L,
		     const int *pos, int nh, int nkv, float theta)
{
	constexpr int VE = HD / 32;
	__shared__ float red[QK_WARPS][2][HD];
	const int nj = nh + 2 * nkv, nq = nh + nkv, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
	const size_t n = (size_t)T * nj, stride = (size_t)gridDim.x * QK_WARPS;
	float aq[VE], ak[VE];

#pragma unroll
	for (int k = 0; k < VE; k++)
		aq[k] = ak[k] = 0.f;
	for (size_t wid = (size_t)blockIdx.x * QK_WARPS + warp; wid < n; wid += stride) {
		const int t = (int)(wid / nj), j = (int)(wid % nj);
		const size_t off = (size_t)t * nj * HD + (size_t)j * HD + lane * VE;

		if (j >= nq) {
			*(bf_word<VE> *)(dqkv + off) = *(const bf_word<VE> *)(dout + off);
			continue;
		}
		const bool isq = j < nh;
		float dy[VE], x[VE], wv[VE], c[VE], sn[VE], g[VE];

		ld_bfv<VE>(dy, dout + off);
		ld_bfv<VE>(x, qkv + off);
		ld_bfv<VE>(wv, (isq ? qw : kw) + lane * VE);
		rope_vec<HD, VE>(tab, rope_pos(pos, t, L), theta, (lane & 15) * VE, c, sn);
		qk_row_bwd<HD, VE>(g, aq, ak, dy, x, wv, c, sn, rstd[(size_t)t * nq + j], isq, lane);
		st_bfv<VE>(dqkv + off, g);
	}
	qk_dw_block<HD, VE>(red, part, aq, ak, warp, lane);
}

// ---- the staged kernels: a token's rows through shared memory, several tokens ahead ----------
//
// Head_dim HD a multiple of 64, with the rotary table.  A block walks tokens t = blockIdx.x,
// + gridDim.x, ...; each token's rows (the forward: qkv's; the backward: dout's, qkv's q and k
// heads, their rstd) and its rotary table row come into shared memory QK_STAGES - 1 tokens ahead
// by cp.async, which holds no registers while in flight: an SM keeps tens of KB of loads going
// whatever its occupancy (the warp-per-row kernels above keep one row's loads a warp, about 10 KB
// an SM).  The warps then take the token's heads j = warp, + QK_WARPS, ..., lane l holding the
// VE = HD / 32 consecutive elements from l VE; an element's rotary partner (i +- HD/2) sits at
// the same place in lane l ^ 16 and comes by one shuffle.  A stage is refilled only after the
// barrier that ends its token.
#define QK_STAGES 3

// bytes of one stage: the rows, 16-byte aligned, then the table row (HD floats), then (the
// backward) the token's nq rstd
static __host__ __device__ inline int qk_stage_bytes(int nh, int nkv, int HD, bool bwd)
{
	const int nq = nh + nkv, nj = nq + nkv;

	return bwd ? (nj + nq) * HD * 2 + HD * 4 + (nq * 4 + 15) / 16 * 16 : nj * HD * 2 + HD * 4;
}

// copies of token t into the stage at shared address d (a group committed whether or not t < T,
// so that a wait counts groups the same way on every pass)
template <int HD, bool BWD>
static __device__ __forceinline__ void qk_stage_load(uint32_t d, const bf16 *qkv, const bf16 *dout,
						     const float *rstd, const float *tab, int t,
						     int T, int L, const int *pos, int nh,
						     int nkv)
{
	if (t < T) {
		const int nq = nh + nkv, nj = nq + nkv, W = nj * HD;
		// 16-byte pieces: dout's row (backward), qkv's (the q and k heads for the backward),
		// the table row
		const int na = BWD ? W / 8 : 0, nb = (BWD ? nq : nj) * HD / 8, nt = HD / 4;
		const char *a = (const char *)(dout + (size_t)t * W);
		const char *b = (const char *)(qkv + (size_t)t * W);
		const char *tr = (const char *)(tab + (size_t)rope_pos(pos, t, L) * HD);

		for (int i = threadIdx.x; i < na + nb + nt; i += blockDim.x) {
			const char *src = i < na ? a + 16 * i :
					  i < na + nb ? b + 16 * (i - na) : tr + 16 * (i - na - nb);

			cp_async16(d + 16 * i, src, true);
		}
		if (BWD)
			for (int i = threadIdx.x; i < nq; i += blockDim.x)
				cp_async4(d + 16 * (na + nb + nt) + 4 * i, rstd + (size_t)t * nq + i,
					  true);
	}
	cp_commit();
}

template <int HD>
__global__ void __launch_bounds__(QK_WARPS * 32)
k_qk_norm_rope_fwd_s(bf16 *out, float *rstd, const bf16 *qkv, const bf16 *qw, const bf16 *kw,
		     const float *tab, int T, int L, const int *pos, int nh, int nkv, float eps)
{
	constexpr int VE = HD / 32;
	SL_DYN_SMEM(char, sm);
	const int nq = nh + nkv, nj = nq + nkv, W = nj * HD, lane = threadIdx.x & 31;
	const int warp = threadIdx.x >> 5, sb = qk_stage_bytes(nh, nkv, HD, false), pi = (lane & 15) * VE;
	const uint32_t s0 = smem_u32(sm);
	float wq[VE], wk[VE];

	ld_bfv<VE>(wq, qw + lane * VE);
	ld_bfv<VE>(wk, kw + lane * VE);
	for (int s = 0; s < QK_STAGES - 1; s++)
		qk_stage_load<HD, false>(s0 + s * sb, qkv, NULL, NULL, tab, blockIdx.x + s * gridDim.x,
					 T, L, pos, nh, nkv);
	int it = 0;

	for (int t = blockIdx.x; t < T; t += gridDim.x, it++) {
		qk_stage_load<HD, false>(s0 + (it + QK_STAGES - 1) % QK_STAGES * sb, qkv, NULL, NULL,
					 tab, t + (QK_STAGES - 1) * gridDim.x, T, L, pos, nh, nkv);
		cp_wait2();	// this token's group (all but the QK_STAGES - 1 newest)
		__syncthreads();
		const char *st = sm + (size_t)(it % QK_STAGES) * sb;
		const bf16 *row = (const bf16 *)st;
		const float *cs = (const float *)(st + (size_t)W * 2);
		float c[VE], sn[VE];

#pragma unroll
		for (int k = 0; k < VE; k++) {
			c[k] = cs[pi + k];
			sn[k] = cs[HD / 2 + pi + k];
		}
		for (int j = warp; j < nj; j += QK_WARPS) {
			const size_t off = (size_t)t * W + (size_t)j * HD + lane * VE;
			float x[VE], n[VE], y[VE], ss = 0.f;

			ld_bfv<VE>(x, row + (size_t)j * HD + lane * VE);
			if (j >= nq) {	// v heads: copied
				st_bfv<VE>(out + off, x);
				continue;
			}
#pragma unroll
			for (int k = 0; k < VE; k++)
				ss += x[k] * x[k];
			ss = warp_sum(ss);
			const float r = 1.f / sqrtf(ss / HD + eps);

			if (!lane)
				rstd[(size_t)t * nq + j] = r;
#pragma unroll
			for (int k = 0; k < VE; k++)
				n[k] = (x[k] * r) * (j < nh ? wq[k] : wk[k]);
#pragma unroll
			for (int k = 0; k < VE; k++) {
				const float p = __shfl_xor_sync(0xffffffffu, n[k], 16);

				// first half: n c - n' s; second: n c + n' s
				y[k] = lane < 16 ? n[k] * c[k] - p * sn[k] : n[k] * c[k] + p * sn[k];
			}
			st_bfv<VE>(out + off, y);
		}
		__syncthreads();	// the stage is refilled from the next pass on
	}
	cp_wait_all();
}


// the backward, with the norm weights' gradients as k_qk_norm_rope_bwd_w sums them: each lane
// over its warp's q heads and k heads, the block's warps in order into
// part[(kind * gridDim.x + block) * HD + i]
template <int HD>
__global__ void __launch_bounds__(QK_WARPS * 32)
k_qk_norm_rope_bwd_s(bf16 *dqkv, float *part, const bf16 *dout, const bf16 *qkv, const bf16 *qw,
		     const bf16 *kw, const float *rstd, const float *tab, int T, int L,
		     const int *pos, int nh, int nkv)
{
	constexpr int VE = HD / 32;
	SL_DYN_SMEM(char, sm);
	__shared__ float red[QK_WARPS][2][HD];
	const int nq = nh + nkv, nj = nq + nkv, W = nj * HD, lane = threadIdx.x & 31;
	const int warp = threadIdx.x >> 5, sb = qk_stage_bytes(nh, nkv, HD, true), pi = (lane & 15) * VE;
	const uint32_t s0 = smem_u32(sm);
	float wq[VE], wk[VE], aq[VE], ak[VE];

	ld_bfv<VE>(wq, qw + lane * VE);
	ld_bfv<VE>(wk, kw + lane * VE);
#pragma unroll
	for (int k = 0; k < VE; k++)
		aq[k] = ak[k] = 0.f;
	for (int s = 0; s < QK_STAGES - 1; s++)
		qk_stage_load<HD, true>(s0 + s * sb, qkv, dout, rstd, tab, blockIdx.x + s * gridDim.x,
					T, L, pos, nh, nkv);
	int it = 0;

	for (int t = blockIdx.x; t < T; t += gridDim.x, it++) {
		qk_stage_load<HD, true>(s0 + (it + QK_STAGES - 1) % QK_STAGES * sb, qkv, dout, rstd,
					tab, t + (QK_STAGES - 1) * gridDim.x, T, L, pos, nh, nkv);
		cp_wait2();
		__syncthreads();
		const char *st = sm + (size_t)(it % QK_STAGES) * sb;
		const bf16 *dyr = (const bf16 *)st, *xr = dyr + W;
		const float *cs = (const float *)(st + (size_t)(W + nq * HD) * 2);
		const float *rs = cs + HD;
		float c[VE], sn[VE];

#pragma unroll
		for (int k = 0; k < VE; k++) {
			c[k] = cs[pi + k];
			sn[k] = cs[HD / 2 + pi + k];
		}
		for (int j = warp; j < nj; j += QK_WARPS) {
			const size_t off = (size_t)t * W + (size_t)j * HD + lane * VE;
			float dy[VE], x[VE], wv[VE], g[VE];

			ld_bfv<VE>(dy, dyr + (size_t)j * HD + lane * VE);
			if (j >= nq) {	// v heads: the gradient passes through
				st_bfv<VE>(dqkv + off, dy);
				continue;
			}
			const bool isq = j < nh;

#pragma unroll
			for (int k = 0; k < VE; k++)
				wv[k] = isq ? wq[k] : wk[k];
			ld_bfv<VE>(x, xr + (size_t)j * HD + lane * VE);
			qk_row_bwd<HD, VE>(g, aq, ak, dy, x, wv, c, sn, rs[j], isq, lane);
			st_bfv<VE>(dqkv + off, g);
		}
		__syncthreads();
	}
	cp_wait_all();
	qk_dw_block<HD, VE>(red, part, aq, ak, warp, lane);
}

// norm weight gradients, pass 1: blockIdx.y 0 = q heads, 1 = k heads; block (hd, R) sums the
// tokens of chunk blockIdx.x (lanes of y take every R-th token)
__global__ void k_qk_dw_partial(float *part, const bf16 *dout, const bf16 *qkv, const float *rstd,
				const float *tab, int T, int L, const int *pos, int nh, int nkv,
				int hd, float theta, int tpc)
{
	SL_DYN_SMEM(float, red);	// (R, hd)
	const int W = (nh + 2 * nkv) * hd, nq = nh + nkv, half = hd / 2, kind = blockIdx.y;
	const int i = threadIdx.x, ii = i < half ? i : i - half, R = blockDim.y;
	const int j0 = kind ? nh : 0, j1 = kind ? nq : nh;
	int t0 = blockIdx.x * tpc, t1 = min(T, t0 + tpc);
	float acc = 0.f;

	for (int t = t0 + threadIdx.y; t < t1; t += R) {
		float c, s;

		rope_pair(tab, rope_pos(pos, t, L), hd, theta, ii, &c, &s);

		for (int j = j0; j < j1; j++) {
			size_t off = (size_t)t * W + (size_t)j * hd;
			const bf16 *dy = dout + off;
			float dn = i < half ? bf(dy[i]) * c + bf(dy[i + half]) * s :
					      -bf(dy[ii]) * s + bf(dy[ii + half]) * c;

			acc += dn * bf(qkv[off + i]) * rstd[(size_t)t * nq + j];
		}
	}
	red[threadIdx.y * hd + i] = acc;
	__syncthreads();
	if (!threadIdx.y) {
		for (int k = 1; k < R; k++)
			acc += red[k * hd + i];
		part[((size_t)kind * gridDim.x + blockIdx.x) * hd + i] = acc;
	}
}

#endif
