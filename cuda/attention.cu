// attention.cu: causal grouped-query flash attention, forward and backward, for variable record
// lengths in a right-padded batch.  The L x L score matrix is never stored: the forward keeps a
// running max and sum per query (online softmax) and writes the log-sum-exp; the backward
// recomputes probabilities from it.
//
// Head dims 64 and 128 run on tensor cores (mma.sync, below); SL_ATTN=generic selects the
// generic path for them too.  The generic path (any even head_dim up to 256): a group of TPR threads owns one row
// (a query, or in the dk/dv kernel a key) and DPT = head_dim/TPR of its dimensions; dot products
// are reduced across the group with shuffles; key/value (or query/dout) tiles are staged in shared
// memory and read by every row of the block.  fp32 accumulation throughout.  The backward is two
// kernels, dq over query tiles and dk/dv over key tiles (summing the query heads of a kv group in a
// fixed order), so no atomics are needed and results repeat bit for bit.
#include <cstdint>
#include <cstring>

#include "common.cuh"

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
k_attn_fwd(bf16 *out, float *lse, const bf16 *qkv, const int *lens, int L, int nh, int nkv, int hd,
	   float scale_log2)
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

	if (i < L && active) {
		load_row<DPT>(q, base + (size_t)i * W + (size_t)h * hd, d0, hd);
		for (int d = 0; d < DPT; d++)
			q[d] *= scale_log2;	// scores in log2 units: exp2 is one instruction
	}
	for (int d = 0; d < DPT; d++)
		o[d] = 0.f;
	// keys any row of this block sees; none when the whole block is padding
	int kend = q0 < len ? min(len, q0 + ROWS) : 0;
	for (int k0 = 0; k0 < kend; k0 += BK) {
		__syncthreads();
		load_tile<DPT>(ks, base, W, kcol, k0, kend, hd);
		load_tile<DPT>(vs, base, W, vcol, k0, kend, hd);
		__syncthreads();
		if (!active)
			continue;
		int jn = min(BK, i + 1 - k0);
		for (int jj = 0; jj < jn; jj++) {
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
	  const int *lens, int L, int nh, int nkv, int hd, float scale)
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

	if (active) {
		load_row<DPT>(q, base + (size_t)i * W + (size_t)h * hd, d0, hd);
		load_row<DPT>(g, dout + t * nh * hd + (size_t)h * hd, d0, hd);
		ls = lse[t * nh + h];
		Di = D[t * nh + h];
	}
	for (int d = 0; d < DPT; d++)
		dq[d] = 0.f;
	int kend = q0 < len ? min(len, q0 + ROWS) : 0;
	for (int k0 = 0; k0 < kend; k0 += BK) {
		__syncthreads();
		load_tile<DPT>(ks, base, W, kcol, k0, kend, hd);
		load_tile<DPT>(vs, base, W, vcol, k0, kend, hd);
		__syncthreads();
		if (!active)
			continue;
		int jn = min(BK, i + 1 - k0);
		for (int jj = 0; jj < jn; jj++) {
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
	    const int *lens, int L, int nh, int nkv, int hd, float scale)
{
	const int HDP = tile<DPT>::HDP, BQ = tile<DPT>::BK;
	__shared__ __align__(16) bf16 qs[BQ * HDP], gs[BQ * HDP];
	__shared__ float lss[BQ], Ds[BQ];
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
	for (int h = kv * grp; h < (kv + 1) * grp; h++) {
		for (int i0 = j0; i0 < len; i0 += BQ) {
			__syncthreads();
			load_tile<DPT>(qs, base, W, h * hd, i0, len, hd);
			load_tile<DPT>(gs, gbase, OW, h * hd, i0, len, hd);
			for (int e = threadIdx.x; e < BQ; e += NTHR) {
				size_t t = (size_t)b * L + i0 + e;

				lss[e] = i0 + e < len ? lse[t * nh + h] : 0.f;
				Ds[e] = i0 + e < len ? D[t * nh + h] : 0.f;
			}
			__syncthreads();
			if (!active)
				continue;
			int ib = max(0, j - i0), in = min(BQ, len - i0);
			for (int ii = ib; ii < in; ii++) {
				const bf16 *qr = qs + ii * HDP + d0, *gr = gs + ii * HDP + d0;
				float s = 0.f, dp = 0.f, p, ds;

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

// ---- tensor-core forward (head_dim 64 and 128) ---------------------------------------------
//
// FlashAttention-2's forward on mma.sync m16n8k16 (bf16 in, fp32 accumulate): a block of 4 warps
// owns 64 queries, each warp 16 of them, with Q held as A fragments in registers; key tiles of 64
// go through shared memory, K row-major (the B operand of S = Q K^T reads key rows) and V
// transposed (the B operand of O += P V reads, per output dim, consecutive keys), both padded by
// 8 elements a row so the fragment loads of a warp fall in distinct banks.  S stays in registers
// and becomes P's A fragments directly (the accumulator layout of two n-tiles is the A layout of
// one k-step).  Row max and sum are kept per quad of lanes (the 4 lanes that share a row).

#define MMA_BQ 64
#define MMA_BK 64

static __device__ __forceinline__ void mma16816(float *c, const uint32_t *a, const uint32_t *b)
{
	asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
		     "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
		     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
		     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

static __device__ __forceinline__ uint32_t ld32(const bf16 *p)
{
	return *(const uint32_t *)p;
}

static __device__ __forceinline__ uint32_t pack_bf2(float lo, float hi)
{
	__nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);

	return *(uint32_t *)&v;
}

template <int HD>
__global__ void __launch_bounds__(128)
k_attn_fwd_mma(bf16 *out, float *lse, const bf16 *qkv, const int *lens, int L, int nh, int nkv,
	       float scale_log2)
{
	const int KP = HD + 8, VP = MMA_BK + 8;
	__shared__ __align__(16) bf16 ks[MMA_BK * (HD + 8)];
	__shared__ __align__(16) bf16 vt[HD * (MMA_BK + 8)];
	const int W = (nh + 2 * nkv) * HD, b = blockIdx.z, h = blockIdx.y, grp = nh / nkv;
	const int q0 = blockIdx.x * MMA_BQ, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
	const int g = lane >> 2, tq = lane & 3, len = lens[b];
	const bf16 *base = qkv + (size_t)b * L * W;
	const int kcol = (nh + h / grp) * HD, vcol = (nh + nkv + h / grp) * HD;
	const int r0 = q0 + warp * 16 + g, r1 = r0 + 8;
	uint32_t qf[HD / 16][4];
	float o[HD / 8][4], m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;

	for (int k = 0; k < HD / 16; k++) {
		const bf16 *p0 = base + (size_t)r0 * W + (size_t)h * HD + k * 16 + tq * 2;
		const bf16 *p1 = p0 + (size_t)8 * W;

		qf[k][0] = r0 < len ? ld32(p0) : 0u;
		qf[k][1] = r1 < len ? ld32(p1) : 0u;
		qf[k][2] = r0 < len ? ld32(p0 + 8) : 0u;
		qf[k][3] = r1 < len ? ld32(p1 + 8) : 0u;
	}
	for (int n = 0; n < HD / 8; n++)
		o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
	const int kend = q0 < len ? min(len, q0 + MMA_BQ) : 0;
	for (int k0 = 0; k0 < kend; k0 += MMA_BK) {
		__syncthreads();
		for (int e = threadIdx.x; e < MMA_BK * HD / 8; e += 128) {
			int r = e / (HD / 8), c = (e % (HD / 8)) * 8;
			uint4 kv = make_uint4(0, 0, 0, 0), vv = kv;

			if (k0 + r < kend) {
				kv = *(const uint4 *)(base + (size_t)(k0 + r) * W + kcol + c);
				vv = *(const uint4 *)(base + (size_t)(k0 + r) * W + vcol + c);
			}
			*(uint4 *)(ks + r * KP + c) = kv;
			const bf16 *ve = (const bf16 *)&vv;
			for (int j = 0; j < 8; j++)
				vt[(c + j) * VP + r] = ve[j];
		}
		__syncthreads();

		float s[MMA_BK / 8][4];
		for (int n = 0; n < MMA_BK / 8; n++)
			s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
		for (int k = 0; k < HD / 16; k++) {
			for (int n = 0; n < MMA_BK / 8; n++) {
				const bf16 *kp = ks + (n * 8 + g) * KP + k * 16 + tq * 2;
				uint32_t bb[2] = { ld32(kp), ld32(kp + 8) };

				mma16816(s[n], qf[k], bb);
			}
		}
		// scale to log2 units; mask keys after the query and past the record
		float mx0 = m0, mx1 = m1;
		for (int n = 0; n < MMA_BK / 8; n++) {
			for (int e = 0; e < 4; e++) {
				int row = e < 2 ? r0 : r1, key = k0 + n * 8 + tq * 2 + (e & 1);
				float v = s[n][e] * scale_log2;

				s[n][e] = key > row || key >= len ? -INFINITY : v;
			}
			mx0 = fmaxf(mx0, fmaxf(s[n][0], s[n][1]));
			mx1 = fmaxf(mx1, fmaxf(s[n][2], s[n][3]));
		}
		mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
		mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
		mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
		mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
		// a row with nothing unmasked yet keeps max -inf: subtract 0 instead (no inf - inf)
		float b0 = mx0 == -INFINITY ? 0.f : mx0, b1 = mx1 == -INFINITY ? 0.f : mx1;
		float c0 = exp2f(m0 - b0), c1 = exp2f(m1 - b1);

		m0 = mx0;
		m1 = mx1;
		l0 *= c0;
		l1 *= c1;
		for (int n = 0; n < HD / 8; n++) {
			o[n][0] *= c0;
			o[n][1] *= c0;
			o[n][2] *= c1;
			o[n][3] *= c1;
		}
		for (int n = 0; n < MMA_BK / 8; n++) {
			s[n][0] = exp2f(s[n][0] - b0);
			s[n][1] = exp2f(s[n][1] - b0);
			s[n][2] = exp2f(s[n][2] - b1);
			s[n][3] = exp2f(s[n][3] - b1);
			l0 += s[n][0] + s[n][1];
			l1 += s[n][2] + s[n][3];
		}
		for (int kk = 0; kk < MMA_BK / 16; kk++) {
			uint32_t pa[4] = { pack_bf2(s[2 * kk][0], s[2 * kk][1]),
					   pack_bf2(s[2 * kk][2], s[2 * kk][3]),
					   pack_bf2(s[2 * kk + 1][0], s[2 * kk + 1][1]),
					   pack_bf2(s[2 * kk + 1][2], s[2 * kk + 1][3]) };

			for (int n = 0; n < HD / 8; n++) {
				const bf16 *vp = vt + (n * 8 + g) * VP + kk * 16 + tq * 2;
				uint32_t bb[2] = { ld32(vp), ld32(vp + 8) };

				mma16816(o[n], pa, bb);
			}
		}
	}
	l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
	l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
	l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
	l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
	for (int half = 0; half < 2; half++) {
		int row = half ? r1 : r0;
		float l = half ? l1 : l0, m = half ? m1 : m0;
		bool act = row < len;

		if (row >= L)
			continue;
		bf16 *y = out + ((size_t)b * L + row) * nh * HD + (size_t)h * HD;
		for (int n = 0; n < HD / 8; n++) {
			float a = act ? o[n][2 * half] / l : 0.f, c = act ? o[n][2 * half + 1] / l : 0.f;

			*(uint32_t *)(y + n * 8 + tq * 2) = pack_bf2(a, c);
		}
		if (!tq)
			lse[((size_t)b * L + row) * nh + h] =
				act ? (m + log2f(l)) * 0.69314718055994531f : 0.f;
	}
}

// Backward on tensor cores, same layout ideas, 32-row tiles so three or four tiles fit in 48 KB.
// dq kernel: a warp's 16 queries hold Q and dO as A fragments; per key tile S = Q K^T and
// dP = dO V^T (K and V row-major in shared memory), dS = P (dP - D) rounded to bf16 becomes the A
// operand of dQ += dS K (K transposed in shared memory).
#define MMA_BT 32

template <int HD>
__global__ void __launch_bounds__(128)
k_attn_dq_mma(bf16 *dqkv, const bf16 *dout, const float *lse, const float *D, const bf16 *qkv,
	      const int *lens, int L, int nh, int nkv, float scale_log2, float scale)
{
	const int KP = HD + 8, TP = MMA_BT + 8;
	__shared__ __align__(16) bf16 ks[MMA_BT * (HD + 8)], vs[MMA_BT * (HD + 8)];
	__shared__ __align__(16) bf16 kt[HD * (MMA_BT + 8)];
	const int W = (nh + 2 * nkv) * HD, OW = nh * HD, b = blockIdx.z, h = blockIdx.y;
	const int grp = nh / nkv, q0 = blockIdx.x * MMA_BQ, warp = threadIdx.x >> 5;
	const int lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3, len = lens[b];
	const bf16 *base = qkv + (size_t)b * L * W, *gbase = dout + (size_t)b * L * OW;
	const int kcol = (nh + h / grp) * HD, vcol = (nh + nkv + h / grp) * HD;
	const int r0 = q0 + warp * 16 + g, r1 = r0 + 8;
	uint32_t qf[HD / 16][4], gf[HD / 16][4];
	float dq[HD / 8][4], ls0 = 0.f, ls1 = 0.f, D0 = 0.f, D1 = 0.f;

	for (int k = 0; k < HD / 16; k++) {
		const bf16 *p0 = base + (size_t)r0 * W + (size_t)h * HD + k * 16 + tq * 2;
		const bf16 *p1 = p0 + (size_t)8 * W;
		const bf16 *o0 = gbase + (size_t)r0 * OW + (size_t)h * HD + k * 16 + tq * 2;
		const bf16 *o1 = o0 + (size_t)8 * OW;

		qf[k][0] = r0 < len ? ld32(p0) : 0u;
		qf[k][1] = r1 < len ? ld32(p1) : 0u;
		qf[k][2] = r0 < len ? ld32(p0 + 8) : 0u;
		qf[k][3] = r1 < len ? ld32(p1 + 8) : 0u;
		gf[k][0] = r0 < len ? ld32(o0) : 0u;
		gf[k][1] = r1 < len ? ld32(o1) : 0u;
		gf[k][2] = r0 < len ? ld32(o0 + 8) : 0u;
		gf[k][3] = r1 < len ? ld32(o1 + 8) : 0u;
	}
	if (r0 < len) {
		ls0 = lse[((size_t)b * L + r0) * nh + h] * 1.4426950408889634f;
		D0 = D[((size_t)b * L + r0) * nh + h];
	}
	if (r1 < len) {
		ls1 = lse[((size_t)b * L + r1) * nh + h] * 1.4426950408889634f;
		D1 = D[((size_t)b * L + r1) * nh + h];
	}
	for (int n = 0; n < HD / 8; n++)
		dq[n][0] = dq[n][1] = dq[n][2] = dq[n][3] = 0.f;
	const int kend = q0 < len ? min(len, q0 + MMA_BQ) : 0;
	for (int k0 = 0; k0 < kend; k0 += MMA_BT) {
		__syncthreads();
		for (int e = threadIdx.x; e < MMA_BT * HD / 8; e += 128) {
			int r = e / (HD / 8), c = (e % (HD / 8)) * 8;
			uint4 kv = make_uint4(0, 0, 0, 0), vv = kv;

			if (k0 + r < kend) {
				kv = *(const uint4 *)(base + (size_t)(k0 + r) * W + kcol + c);
				vv = *(const uint4 *)(base + (size_t)(k0 + r) * W + vcol + c);
			}
			*(uint4 *)(ks + r * KP + c) = kv;
			*(uint4 *)(vs + r * KP + c) = vv;
			const bf16 *ke = (const bf16 *)&kv;
			for (int j = 0; j < 8; j++)
				kt[(c + j) * TP + r] = ke[j];
		}
		__syncthreads();

		float s[MMA_BT / 8][4], dp[MMA_BT / 8][4];
		for (int n = 0; n < MMA_BT / 8; n++)
			for (int e = 0; e < 4; e++)
				s[n][e] = dp[n][e] = 0.f;
		for (int k = 0; k < HD / 16; k++) {
			for (int n = 0; n < MMA_BT / 8; n++) {
				const bf16 *kp = ks + (n * 8 + g) * KP + k * 16 + tq * 2;
				const bf16 *vp = vs + (n * 8 + g) * KP + k * 16 + tq * 2;
				uint32_t kb[2] = { ld32(kp), ld32(kp + 8) };
				uint32_t vb[2] = { ld32(vp), ld32(vp + 8) };

				mma16816(s[n], qf[k], kb);
				mma16816(dp[n], gf[k], vb);
			}
		}
		for (int n = 0; n < MMA_BT / 8; n++) {
			for (int e = 0; e < 4; e++) {
				int row = e < 2 ? r0 : r1, key = k0 + n * 8 + tq * 2 + (e & 1);
				float p = key > row || key >= len || row >= len ? 0.f :
					  exp2f(s[n][e] * scale_log2 - (e < 2 ? ls0 : ls1));

				s[n][e] = p * (dp[n][e] - (e < 2 ? D0 : D1));
			}
		}
		for (int kk = 0; kk < MMA_BT / 16; kk++) {
			uint32_t da[4] = { pack_bf2(s[2 * kk][0], s[2 * kk][1]),
					   pack_bf2(s[2 * kk][2], s[2 * kk][3]),
					   pack_bf2(s[2 * kk + 1][0], s[2 * kk + 1][1]),
					   pack_bf2(s[2 * kk + 1][2], s[2 * kk + 1][3]) };

			for (int n = 0; n < HD / 8; n++) {
				const bf16 *kp = kt + (n * 8 + g) * TP + kk * 16 + tq * 2;
				uint32_t kb[2] = { ld32(kp), ld32(kp + 8) };

				mma16816(dq[n], da, kb);
			}
		}
	}
	for (int half = 0; half < 2; half++) {
		int row = half ? r1 : r0;
		bool act = row < len;

		if (row >= L)
			continue;
		bf16 *y = dqkv + ((size_t)b * L + row) * W + (size_t)h * HD;
		for (int n = 0; n < HD / 8; n++)
			*(uint32_t *)(y + n * 8 + tq * 2) =
				pack_bf2(act ? dq[n][2 * half] * scale : 0.f,
					 act ? dq[n][2 * half + 1] * scale : 0.f);
	}
}

// dk/dv kernel: a warp's 16 keys hold K and V as A fragments; per query tile (of each query head
// of the kv group, in order) S^T = K Q^T and dP^T = V dO^T, then dV += P^T dO and
// dK += dS^T Q with Q and dO transposed in shared memory.
template <int HD>
__global__ void __launch_bounds__(128)
k_attn_dkdv_mma(bf16 *dqkv, const bf16 *dout, const float *lse, const float *D, const bf16 *qkv,
		const int *lens, int L, int nh, int nkv, float scale_log2, float scale)
{
	const int QP = HD + 8, TP = MMA_BT + 8;
	__shared__ __align__(16) bf16 qs[MMA_BT * (HD + 8)], gs[MMA_BT * (HD + 8)];
	__shared__ __align__(16) bf16 qt[HD * (MMA_BT + 8)], gt[HD * (MMA_BT + 8)];
	__shared__ float lss[MMA_BT], Ds[MMA_BT];
	const int W = (nh + 2 * nkv) * HD, OW = nh * HD, b = blockIdx.z, kv = blockIdx.y;
	const int grp = nh / nkv, j0 = blockIdx.x * MMA_BQ, warp = threadIdx.x >> 5;
	const int lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3, len = lens[b];
	const bf16 *base = qkv + (size_t)b * L * W, *gbase = dout + (size_t)b * L * OW;
	const int r0 = j0 + warp * 16 + g, r1 = r0 + 8;
	uint32_t kf[HD / 16][4], vf[HD / 16][4];
	float dk[HD / 8][4], dv[HD / 8][4];

	for (int k = 0; k < HD / 16; k++) {
		const bf16 *p0 = base + (size_t)r0 * W + (size_t)(nh + kv) * HD + k * 16 + tq * 2;
		const bf16 *p1 = p0 + (size_t)8 * W;
		const bf16 *v0 = p0 + (size_t)nkv * HD, *v1 = p1 + (size_t)nkv * HD;

		kf[k][0] = r0 < len ? ld32(p0) : 0u;
		kf[k][1] = r1 < len ? ld32(p1) : 0u;
		kf[k][2] = r0 < len ? ld32(p0 + 8) : 0u;
		kf[k][3] = r1 < len ? ld32(p1 + 8) : 0u;
		vf[k][0] = r0 < len ? ld32(v0) : 0u;
		vf[k][1] = r1 < len ? ld32(v1) : 0u;
		vf[k][2] = r0 < len ? ld32(v0 + 8) : 0u;
		vf[k][3] = r1 < len ? ld32(v1 + 8) : 0u;
	}
	for (int n = 0; n < HD / 8; n++)
		for (int e = 0; e < 4; e++)
			dk[n][e] = dv[n][e] = 0.f;
	for (int h = kv * grp; h < (kv + 1) * grp; h++) {
		for (int i0 = j0; i0 < len; i0 += MMA_BT) {
			__syncthreads();
			for (int e = threadIdx.x; e < MMA_BT * HD / 8; e += 128) {
				int r = e / (HD / 8), c = (e % (HD / 8)) * 8;
				uint4 qv = make_uint4(0, 0, 0, 0), gv = qv;

				if (i0 + r < len) {
					qv = *(const uint4 *)(base + (size_t)(i0 + r) * W +
							      (size_t)h * HD + c);
					gv = *(const uint4 *)(gbase + (size_t)(i0 + r) * OW +
							      (size_t)h * HD + c);
				}
				*(uint4 *)(qs + r * QP + c) = qv;
				*(uint4 *)(gs + r * QP + c) = gv;
				const bf16 *qe = (const bf16 *)&qv, *ge = (const bf16 *)&gv;
				for (int j = 0; j < 8; j++) {
					qt[(c + j) * TP + r] = qe[j];
					gt[(c + j) * TP + r] = ge[j];
				}
			}
			for (int e = threadIdx.x; e < MMA_BT; e += 128) {
				size_t t = (size_t)b * L + i0 + e;

				lss[e] = i0 + e < len ? lse[t * nh + h] * 1.4426950408889634f : 0.f;
				Ds[e] = i0 + e < len ? D[t * nh + h] : 0.f;
			}
			__syncthreads();

			float s[MMA_BT / 8][4], dp[MMA_BT / 8][4];
			for (int n = 0; n < MMA_BT / 8; n++)
				for (int e = 0; e < 4; e++)
					s[n][e] = dp[n][e] = 0.f;
			for (int k = 0; k < HD / 16; k++) {
				for (int n = 0; n < MMA_BT / 8; n++) {
					const bf16 *qp = qs + (n * 8 + g) * QP + k * 16 + tq * 2;
					const bf16 *gp = gs + (n * 8 + g) * QP + k * 16 + tq * 2;
					uint32_t qb[2] = { ld32(qp), ld32(qp + 8) };
					uint32_t gb[2] = { ld32(gp), ld32(gp + 8) };

					mma16816(s[n], kf[k], qb);
					mma16816(dp[n], vf[k], gb);
				}
			}
			for (int n = 0; n < MMA_BT / 8; n++) {
				for (int e = 0; e < 4; e++) {
					int key = e < 2 ? r0 : r1, qc = n * 8 + tq * 2 + (e & 1);
					int qi = i0 + qc;
					float p = qi < key || qi >= len || key >= len ? 0.f :
						  exp2f(s[n][e] * scale_log2 - lss[qc]);

					s[n][e] = p;
					dp[n][e] = p * (dp[n][e] - Ds[qc]);
				}
			}
			for (int kk = 0; kk < MMA_BT / 16; kk++) {
				uint32_t pa[4] = { pack_bf2(s[2 * kk][0], s[2 * kk][1]),
						   pack_bf2(s[2 * kk][2], s[2 * kk][3]),
						   pack_bf2(s[2 * kk + 1][0], s[2 * kk + 1][1]),
						   pack_bf2(s[2 * kk + 1][2], s[2 * kk + 1][3]) };
				uint32_t da[4] = { pack_bf2(dp[2 * kk][0], dp[2 * kk][1]),
						   pack_bf2(dp[2 * kk][2], dp[2 * kk][3]),
						   pack_bf2(dp[2 * kk + 1][0], dp[2 * kk + 1][1]),
						   pack_bf2(dp[2 * kk + 1][2], dp[2 * kk + 1][3]) };

				for (int n = 0; n < HD / 8; n++) {
					const bf16 *gp = gt + (n * 8 + g) * TP + kk * 16 + tq * 2;
					const bf16 *qp = qt + (n * 8 + g) * TP + kk * 16 + tq * 2;
					uint32_t gb[2] = { ld32(gp), ld32(gp + 8) };
					uint32_t qb[2] = { ld32(qp), ld32(qp + 8) };

					mma16816(dv[n], pa, gb);
					mma16816(dk[n], da, qb);
				}
			}
		}
	}
	for (int half = 0; half < 2; half++) {
		int row = half ? r1 : r0;
		bool act = row < len;

		if (row >= L)
			continue;
		bf16 *yk = dqkv + ((size_t)b * L + row) * W + (size_t)(nh + kv) * HD;
		bf16 *yv = yk + (size_t)nkv * HD;
		for (int n = 0; n < HD / 8; n++) {
			*(uint32_t *)(yk + n * 8 + tq * 2) =
				pack_bf2(act ? dk[n][2 * half] * scale : 0.f,
					 act ? dk[n][2 * half + 1] * scale : 0.f);
			*(uint32_t *)(yv + n * 8 + tq * 2) =
				pack_bf2(act ? dv[n][2 * half] : 0.f, act ? dv[n][2 * half + 1] : 0.f);
		}
	}
}

// the tensor-core path unless SL_ATTN=generic (a switch for comparing the two)
static bool use_mma(int hd, const void *qkv, const void *out)
{
	static int mode = -1;

	if (mode < 0) {
		const char *e = getenv("SL_ATTN");

		mode = e && !strcmp(e, "generic") ? 0 : 1;
	}
	return mode && (hd == 64 || hd == 128) && (uintptr_t)qkv % 16 == 0 &&
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

extern "C" void sl_cuda_attention_fwd(struct sl_cuda *c, void *out, float *lse, const void *qkv,
				      const int *lens, int B, int L, int nh, int nkv, int hd)
{
	int dpt = dpt_for(hd);
	dim3 grid((L + ROWS - 1) / ROWS, nh, B);
	float scale_log2 = (float)(1.4426950408889634 / sqrt((double)hd));

	check_heads(nh, nkv);
	if (B <= 0 || L <= 0)
		return;
	if (use_mma(hd, qkv, out)) {
		dim3 mgrid((L + MMA_BQ - 1) / MMA_BQ, nh, B);

		if (hd == 128)
			k_attn_fwd_mma<128><<<mgrid, 128, 0, c->stream>>>((bf16 *)out, lse,
				(const bf16 *)qkv, lens, L, nh, nkv, scale_log2);
		else
			k_attn_fwd_mma<64><<<mgrid, 128, 0, c->stream>>>((bf16 *)out, lse,
				(const bf16 *)qkv, lens, L, nh, nkv, scale_log2);
		CUDA_LAUNCHED();
		return;
	}
	DISPATCH(dpt, k_attn_fwd, grid, (bf16 *)out, lse, (const bf16 *)qkv, lens, L, nh, nkv, hd,
		 scale_log2);
}

extern "C" void sl_cuda_attention_bwd(struct sl_cuda *c, void *dqkv, const void *dout,
				      const void *out, const float *lse, const void *qkv,
				      const int *lens, int B, int L, int nh, int nkv, int hd)
{
	int dpt = dpt_for(hd);
	size_t rows = (size_t)B * L * nh;
	float scale = (float)(1.0 / sqrt((double)hd));
	float *D;

	check_heads(nh, nkv);
	if (B <= 0 || L <= 0)
		return;
	D = sl_cuda_scratch(c, rows * sizeof(float), "attention backward");
	k_attn_dot<<<(unsigned)((rows + 7) / 8), 256, 0, c->stream>>>(D, (const bf16 *)dout,
								     (const bf16 *)out, rows, hd);
	CUDA_LAUNCHED();
	if (use_mma(hd, qkv, dqkv) && (uintptr_t)dout % 16 == 0) {
		float sl2 = (float)(1.4426950408889634 / sqrt((double)hd));
		dim3 gq((L + MMA_BQ - 1) / MMA_BQ, nh, B), gk((L + MMA_BQ - 1) / MMA_BQ, nkv, B);

		if (hd == 128) {
			k_attn_dq_mma<128><<<gq, 128, 0, c->stream>>>((bf16 *)dqkv,
				(const bf16 *)dout, lse, D, (const bf16 *)qkv, lens, L, nh, nkv, sl2,
				scale);
			CUDA_LAUNCHED();
			k_attn_dkdv_mma<128><<<gk, 128, 0, c->stream>>>((bf16 *)dqkv,
				(const bf16 *)dout, lse, D, (const bf16 *)qkv, lens, L, nh, nkv, sl2,
				scale);
		} else {
			k_attn_dq_mma<64><<<gq, 128, 0, c->stream>>>((bf16 *)dqkv,
				(const bf16 *)dout, lse, D, (const bf16 *)qkv, lens, L, nh, nkv, sl2,
				scale);
			CUDA_LAUNCHED();
			k_attn_dkdv_mma<64><<<gk, 128, 0, c->stream>>>((bf16 *)dqkv,
				(const bf16 *)dout, lse, D, (const bf16 *)qkv, lens, L, nh, nkv, sl2,
				scale);
		}
		CUDA_LAUNCHED();
		return;
	}
	DISPATCH(dpt, k_attn_dq, dim3((L + ROWS - 1) / ROWS, nh, B), (bf16 *)dqkv,
		 (const bf16 *)dout, lse, D, (const bf16 *)qkv, lens, L, nh, nkv, hd, scale);
	DISPATCH(dpt, k_attn_dkdv, dim3((L + ROWS - 1) / ROWS, nkv, B), (bf16 *)dqkv,
		 (const bf16 *)dout, lse, D, (const bf16 *)qkv, lens, L, nh, nkv, hd, scale);
}
