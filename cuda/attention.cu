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

// Packed rows: pos (B*L) holds each token's position in its document, so row i's document starts
// at i - pos[i] and its keys are [i - pos[i], i].  Without pos the row is one document.  Document
// starts never decrease along a row, so a block's first row has the earliest one.
static __device__ __forceinline__ int doc_start(const int *pos, int b, int L, int i)
{
	return pos ? i - pos[(size_t)b * L + i] : 0;
}

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

// ---- tensor-core path (head_dim 64 and 128) ------------------------------------------------
//
// FlashAttention-2 on mma.sync m16n8k16 (bf16 in, fp32 accumulate).  A block of 4 warps owns 64
// rows (queries in the forward and the dq kernel, keys in the dk/dv kernel), each warp 16 of them;
// the other operand streams through shared memory in tiles of 64 rows, double-buffered with
// cp.async so the next tile loads while this one computes.  Every tile is stored row-major as it
// lies in memory (row pitch HD + 8 elements: the 8 row addresses of an ldmatrix then fall in
// distinct banks); ldmatrix (.trans where the product wants the other orientation) turns it into
// mma fragments, so nothing is transposed by hand.  Scores stay in registers: the accumulator
// layout of two n-tiles is the A-operand layout of one k-step, so P (or dS) feeds the next product
// directly.  Causal: tiles wholly after a block's rows are never loaded, and the mask is applied
// only on the tiles that cross the diagonal or the record's end.
//
// Backward: a dq kernel over query blocks and a dk/dv kernel over key blocks (the group's query
// heads in a fixed order), 7 products instead of FA2's 5 but no atomics and no partial-sum
// buffers: results repeat bit for bit.  The backward computes in steps of 32 columns to keep the
// live scores (S and dP) at 32 registers.

#define FA_BM 64		// rows a block owns (16 per warp)
#define FA_BN 64		// rows of a streamed shared-memory tile
#define FA_SUB 32		// columns per compute step in the backward
#define FA_THR 128
#define LOG2E 1.4426950408889634f

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

static __device__ __forceinline__ uint32_t smem_u32(const void *p)
{
	return (uint32_t)__cvta_generic_to_shared(p);
}

// 16 bytes global -> shared without passing through registers; !valid writes zeros (rows past
// the record: their products must be finite and their keys contribute nothing)
static __device__ __forceinline__ void cp_async16(uint32_t dst, const void *src, bool valid)
{
	asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
		     "r"(valid ? 16 : 0));
}

static __device__ __forceinline__ void cp_commit(void)
{
	asm volatile("cp.async.commit_group;\n" ::);
}

// all but the newest group complete (the newest is the tile being prefetched)
static __device__ __forceinline__ void cp_wait1(void)
{
	asm volatile("cp.async.wait_group 1;\n" ::: "memory");
}

static __device__ __forceinline__ void ldsm4(uint32_t *r, uint32_t addr)
{
	asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
		     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
		     : "r"(addr));
}

static __device__ __forceinline__ void ldsm4t(uint32_t *r, uint32_t addr)
{
	asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
		     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
		     : "r"(addr));
}

// one MUFU instruction; -inf gives 0 (masked scores)
static __device__ __forceinline__ float fexp2(float x)
{
	float y;

	asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
	return y;
}

// rows [row0, row0 + NR) of a (rows, stride) bf16 matrix, columns [0, HD) from g, into sh with
// pitch HD + 8; rows at or past rend are zeros
template <int HD, int NR>
static __device__ __forceinline__ void tile_async(bf16 *sh, const bf16 *g, size_t stride, int row0,
						  int rend)
{
	const int CPR = HD / 8;

#pragma unroll
	for (int e = threadIdx.x; e < NR * CPR; e += FA_THR) {
		int r = e / CPR, c = (e % CPR) * 8;
		bool ok = row0 + r < rend;

		cp_async16(smem_u32(sh + r * (HD + 8) + c), ok ? g + (size_t)(row0 + r) * stride + c : g,
			   ok);
	}
}

// Byte offsets of this lane's ldmatrix row address in a pitch-P tile, for the three operand
// shapes (lane l addresses row l%8 of 8x8 matrix l/8):
//  B, not transposed (tile rows are the n index, e.g. keys for S = Q K^T): matrices (n 0-7, k lo),
//    (n 0-7, k hi), (n 8-15, k lo), (n 8-15, k hi) -> b of n-tile 0 in r0,r1, of n-tile 1 in r2,r3;
//  B, transposed (tile rows are the k index, e.g. keys for O += P V): (k lo, n 0-7), (k hi, n 0-7),
//    (k lo, n 8-15), (k hi, n 8-15);
//  A (tile rows are the m index): (m lo, k lo), (m hi, k lo), (m lo, k hi), (m hi, k hi).
template <int P> static __device__ __forceinline__ uint32_t off_b(int lane)
{
	return (uint32_t)((((lane >> 4) * 8 + (lane & 7)) * P + ((lane >> 3) & 1) * 8) * 2);
}

template <int P> static __device__ __forceinline__ uint32_t off_bt(int lane)
{
	return (uint32_t)(((((lane >> 3) & 1) * 8 + (lane & 7)) * P + (lane >> 4) * 8) * 2);
}

#define off_a off_bt	// the same lane pattern: rows from bit 3, columns from bit 4

// a warp's 16 rows x HD columns of a row-major matrix as A fragments, straight from global memory
// (once per block); rows at or past len are zeros
template <int HD>
static __device__ __forceinline__ void load_afrag(uint32_t (*f)[4], const bf16 *p0, size_t stride,
						  bool ok0, bool ok1, int tq)
{
	const bf16 *p1 = p0 + 8 * stride;

#pragma unroll
	for (int k = 0; k < HD / 16; k++) {
		f[k][0] = ok0 ? ld32(p0 + k * 16 + tq * 2) : 0u;
		f[k][1] = ok1 ? ld32(p1 + k * 16 + tq * 2) : 0u;
		f[k][2] = ok0 ? ld32(p0 + k * 16 + tq * 2 + 8) : 0u;
		f[k][3] = ok1 ? ld32(p1 + k * 16 + tq * 2 + 8) : 0u;
	}
}

// accumulator pairs (n-tiles 2kk, 2kk+1) as the A fragment of k-step kk
static __device__ __forceinline__ void acc_to_a(uint32_t *a, const float *c0, const float *c1)
{
	a[0] = pack_bf2(c0[0], c0[1]);
	a[1] = pack_bf2(c0[2], c0[3]);
	a[2] = pack_bf2(c1[0], c1[1]);
	a[3] = pack_bf2(c1[2], c1[3]);
}

template <int HD>
__global__ void __launch_bounds__(FA_THR, 2)
k_fa_fwd(bf16 *out, float *lse, const bf16 *qkv, const int *lens, const int *pos, int L, int nh,
	 int nkv, float sl2)
{
	const int P = HD + 8, TILE = FA_BN * P;
	extern __shared__ __align__(16) bf16 fa_sm[];
	bf16 *ks = fa_sm, *vs = fa_sm + 2 * TILE;
	const int W = (nh + 2 * nkv) * HD, b = blockIdx.z, h = blockIdx.y, grp = nh / nkv;
	// the longest blocks (last queries) first, so the short ones fill the tail
	const int q0 = (gridDim.x - 1 - blockIdx.x) * FA_BM, warp = threadIdx.x >> 5;
	const int lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3, len = lens[b];
	const bf16 *base = qkv + (size_t)b * L * W;
	const bf16 *kg = base + (size_t)(nh + h / grp) * HD, *vg = base + (size_t)(nh + nkv + h / grp) * HD;
	const int wr = q0 + warp * 16, r0 = wr + g, r1 = r0 + 8;
	const int kend = q0 < len ? min(len, q0 + FA_BM) : 0, nt = (kend + FA_BN - 1) / FA_BN;
	const uint32_t ob = off_b<P>(lane), obt = off_bt<P>(lane);
	uint32_t qf[HD / 16][4];
	float o[HD / 8][4], m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;
	// packed rows: the tiles before the block's first document hold no visible key
	const int kt0 = q0 < len ? doc_start(pos, b, L, q0) / FA_BN : 0;
	const int ds0 = r0 < len ? doc_start(pos, b, L, r0) : 0;
	const int ds1 = r1 < len ? doc_start(pos, b, L, r1) : 0;

	if (nt > kt0) {
		tile_async<HD, FA_BN>(ks, kg, W, kt0 * FA_BN, kend);
		tile_async<HD, FA_BN>(vs, vg, W, kt0 * FA_BN, kend);
	}
	cp_commit();
	load_afrag<HD>(qf, base + (size_t)r0 * W + (size_t)h * HD, W, r0 < len, r1 < len, tq);
#pragma unroll
	for (int n = 0; n < HD / 8; n++)
		o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
	for (int t = kt0; t < nt; t++) {
		const int k0 = t * FA_BN, st = (t - kt0) & 1;

		if (t + 1 < nt) {
			tile_async<HD, FA_BN>(ks + (st ^ 1) * TILE, kg, W, k0 + FA_BN, kend);
			tile_async<HD, FA_BN>(vs + (st ^ 1) * TILE, vg, W, k0 + FA_BN, kend);
		}
		cp_commit();
		cp_wait1();
		__syncthreads();
		const uint32_t kb = smem_u32(ks + st * TILE) + ob, vb = smem_u32(vs + st * TILE) + obt;
		float s[FA_BN / 8][4];

#pragma unroll
		for (int n = 0; n < FA_BN / 8; n++)
			s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
#pragma unroll
		for (int kk = 0; kk < HD / 16; kk++) {
#pragma unroll
			for (int np = 0; np < FA_BN / 16; np++) {
				uint32_t bb[4];

				ldsm4(bb, kb + (np * 16 * P + kk * 16) * 2);
				mma16816(s[2 * np], qf[kk], bb);
				mma16816(s[2 * np + 1], qf[kk], bb + 2);
			}
		}
		// keys after the query or past the record: only on the diagonal and the last tile;
		// keys of earlier documents: wherever a document starts after the tile's first key
		if (k0 + FA_BN - 1 > wr || k0 + FA_BN > len || k0 < ds1) {
#pragma unroll
			for (int n = 0; n < FA_BN / 8; n++) {
#pragma unroll
				for (int e = 0; e < 4; e++) {
					int row = e < 2 ? r0 : r1, key = k0 + n * 8 + tq * 2 + (e & 1);

					if (key > row || key >= len || key < (e < 2 ? ds0 : ds1))
						s[n][e] = -INFINITY;
				}
			}
		}
		float mx0 = m0, mx1 = m1;

#pragma unroll
		for (int n = 0; n < FA_BN / 8; n++) {
			mx0 = fmaxf(mx0, fmaxf(s[n][0], s[n][1]));
			mx1 = fmaxf(mx1, fmaxf(s[n][2], s[n][3]));
		}
		mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
		mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
		mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
		mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
		// max in log2 units; a row with nothing unmasked yet subtracts 0 (no inf - inf)
		const float b0 = mx0 == -INFINITY ? 0.f : mx0 * sl2;
		const float b1 = mx1 == -INFINITY ? 0.f : mx1 * sl2;
		const float c0 = fexp2(m0 * sl2 - b0), c1 = fexp2(m1 * sl2 - b1);

		m0 = mx0;
		m1 = mx1;
		l0 *= c0;
		l1 *= c1;
#pragma unroll
		for (int n = 0; n < HD / 8; n++) {
			o[n][0] *= c0;
			o[n][1] *= c0;
			o[n][2] *= c1;
			o[n][3] *= c1;
		}
#pragma unroll
		for (int n = 0; n < FA_BN / 8; n++) {
			s[n][0] = fexp2(fmaf(s[n][0], sl2, -b0));
			s[n][1] = fexp2(fmaf(s[n][1], sl2, -b0));
			s[n][2] = fexp2(fmaf(s[n][2], sl2, -b1));
			s[n][3] = fexp2(fmaf(s[n][3], sl2, -b1));
			l0 += s[n][0] + s[n][1];
			l1 += s[n][2] + s[n][3];
		}
#pragma unroll
		for (int kk = 0; kk < FA_BN / 16; kk++) {
			uint32_t pa[4];

			acc_to_a(pa, s[2 * kk], s[2 * kk + 1]);
#pragma unroll
			for (int np = 0; np < HD / 16; np++) {
				uint32_t bb[4];

				ldsm4t(bb, vb + (kk * 16 * P + np * 16) * 2);
				mma16816(o[2 * np], pa, bb);
				mma16816(o[2 * np + 1], pa, bb + 2);
			}
		}
		__syncthreads();	// the next iteration's prefetch overwrites this stage
	}
	l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
	l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
	l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
	l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
#pragma unroll
	for (int half = 0; half < 2; half++) {
		const int row = half ? r1 : r0;
		const float l = half ? l1 : l0, m = half ? m1 : m0;
		const bool act = row < len;

		if (row >= L)
			continue;
		bf16 *y = out + ((size_t)b * L + row) * nh * HD + (size_t)h * HD;
		const float inv = act ? 1.f / l : 0.f;
#pragma unroll
		for (int n = 0; n < HD / 8; n++)
			*(uint32_t *)(y + n * 8 + tq * 2) =
				pack_bf2(o[n][2 * half] * inv, o[n][2 * half + 1] * inv);
		if (!tq)
			lse[((size_t)b * L + row) * nh + h] =
				act ? (m * sl2 + log2f(l)) * 0.69314718055994531f : 0.f;
	}
}

// dq: a warp's 16 queries hold Q and dO as A fragments; per key step S = Q K^T and dP = dO V^T
// (K, V not transposed), dS = P (dP - D) rounded to bf16 is the A operand of dQ += dS K (K
// transposed by ldmatrix)
template <int HD>
__global__ void __launch_bounds__(FA_THR, 2)
k_fa_dq(bf16 *dqkv, const bf16 *dout, const float *lse, const float *D, const bf16 *qkv,
	const int *lens, const int *pos, int L, int nh, int nkv, float sl2, float scale)
{
	const int P = HD + 8, TILE = FA_BN * P;
	extern __shared__ __align__(16) bf16 fa_sm[];
	bf16 *ks = fa_sm, *vs = fa_sm + 2 * TILE;
	const int W = (nh + 2 * nkv) * HD, OW = nh * HD, b = blockIdx.z, h = blockIdx.y;
	const int grp = nh / nkv, q0 = (gridDim.x - 1 - blockIdx.x) * FA_BM, warp = threadIdx.x >> 5;
	const int lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3, len = lens[b];
	const bf16 *base = qkv + (size_t)b * L * W, *gbase = dout + (size_t)b * L * OW;
	const bf16 *kg = base + (size_t)(nh + h / grp) * HD, *vg = base + (size_t)(nh + nkv + h / grp) * HD;
	const int wr = q0 + warp * 16, r0 = wr + g, r1 = r0 + 8;
	const int kend = q0 < len ? min(len, q0 + FA_BM) : 0, nt = (kend + FA_BN - 1) / FA_BN;
	const uint32_t ob = off_b<P>(lane), obt = off_bt<P>(lane);
	uint32_t qf[HD / 16][4], gf[HD / 16][4];
	float dq[HD / 8][4], ls0 = 0.f, ls1 = 0.f, D0 = 0.f, D1 = 0.f;
	const int kt0 = q0 < len ? doc_start(pos, b, L, q0) / FA_BN : 0;
	const int ds0 = r0 < len ? doc_start(pos, b, L, r0) : 0;
	const int ds1 = r1 < len ? doc_start(pos, b, L, r1) : 0;

	if (nt > kt0) {
		tile_async<HD, FA_BN>(ks, kg, W, kt0 * FA_BN, kend);
		tile_async<HD, FA_BN>(vs, vg, W, kt0 * FA_BN, kend);
	}
	cp_commit();
	load_afrag<HD>(qf, base + (size_t)r0 * W + (size_t)h * HD, W, r0 < len, r1 < len, tq);
	load_afrag<HD>(gf, gbase + (size_t)r0 * OW + (size_t)h * HD, OW, r0 < len, r1 < len, tq);
	if (r0 < len) {
		ls0 = lse[((size_t)b * L + r0) * nh + h] * LOG2E;
		D0 = D[((size_t)b * L + r0) * nh + h];
	}
	if (r1 < len) {
		ls1 = lse[((size_t)b * L + r1) * nh + h] * LOG2E;
		D1 = D[((size_t)b * L + r1) * nh + h];
	}
#pragma unroll
	for (int n = 0; n < HD / 8; n++)
		dq[n][0] = dq[n][1] = dq[n][2] = dq[n][3] = 0.f;
	for (int t = kt0; t < nt; t++) {
		const int k0 = t * FA_BN, st = (t - kt0) & 1;

		if (t + 1 < nt) {
			tile_async<HD, FA_BN>(ks + (st ^ 1) * TILE, kg, W, k0 + FA_BN, kend);
			tile_async<HD, FA_BN>(vs + (st ^ 1) * TILE, vg, W, k0 + FA_BN, kend);
		}
		cp_commit();
		cp_wait1();
		__syncthreads();
		const uint32_t kb = smem_u32(ks + st * TILE), vb = smem_u32(vs + st * TILE);

#pragma unroll
		for (int sub = 0; sub < FA_BN / FA_SUB; sub++) {
			const int c0 = k0 + sub * FA_SUB;
			float s[FA_SUB / 8][4], dp[FA_SUB / 8][4];

			if (c0 > wr + 15)
				continue;	// every key after every query of this warp
#pragma unroll
			for (int n = 0; n < FA_SUB / 8; n++)
#pragma unroll
				for (int e = 0; e < 4; e++)
					s[n][e] = dp[n][e] = 0.f;
#pragma unroll
			for (int kk = 0; kk < HD / 16; kk++) {
#pragma unroll
				for (int np = 0; np < FA_SUB / 16; np++) {
					const uint32_t o = ((sub * FA_SUB + np * 16) * P + kk * 16) * 2;
					uint32_t bk[4], bv[4];

					ldsm4(bk, kb + ob + o);
					ldsm4(bv, vb + ob + o);
					mma16816(s[2 * np], qf[kk], bk);
					mma16816(s[2 * np + 1], qf[kk], bk + 2);
					mma16816(dp[2 * np], gf[kk], bv);
					mma16816(dp[2 * np + 1], gf[kk], bv + 2);
				}
			}
			const bool msk = c0 + FA_SUB - 1 > wr || c0 + FA_SUB > len || c0 < ds1;
#pragma unroll
			for (int n = 0; n < FA_SUB / 8; n++) {
#pragma unroll
				for (int e = 0; e < 4; e++) {
					const int row = e < 2 ? r0 : r1, key = c0 + n * 8 + tq * 2 + (e & 1);
					float p = fexp2(fmaf(s[n][e], sl2, -(e < 2 ? ls0 : ls1)));

					if (msk && (key > row || key >= len || key < (e < 2 ? ds0 : ds1)))
						p = 0.f;
					s[n][e] = p * (dp[n][e] - (e < 2 ? D0 : D1));
				}
			}
#pragma unroll
			for (int kk = 0; kk < FA_SUB / 16; kk++) {
				uint32_t da[4];

				acc_to_a(da, s[2 * kk], s[2 * kk + 1]);
#pragma unroll
				for (int np = 0; np < HD / 16; np++) {
					uint32_t bk[4];

					ldsm4t(bk, kb + obt + ((sub * FA_SUB + kk * 16) * P + np * 16) * 2);
					mma16816(dq[2 * np], da, bk);
					mma16816(dq[2 * np + 1], da, bk + 2);
				}
			}
		}
		__syncthreads();
	}
#pragma unroll
	for (int half = 0; half < 2; half++) {
		const int row = half ? r1 : r0;
		const float f = row < len ? scale : 0.f;

		if (row >= L)
			continue;
		bf16 *y = dqkv + ((size_t)b * L + row) * W + (size_t)h * HD;
#pragma unroll
		for (int n = 0; n < HD / 8; n++)
			*(uint32_t *)(y + n * 8 + tq * 2) =
				pack_bf2(dq[n][2 * half] * f, dq[n][2 * half + 1] * f);
	}
}

// dk/dv: a block's 64 keys (and values) sit in shared memory for the whole kernel; query tiles of
// each query head of the kv group stream through, in a fixed order (heads ascending, queries
// ascending).  Per step a warp's 16 keys give S^T = K Q^T and dP^T = V dO^T (A from K, V; B from
// Q, dO untransposed), then dV += P^T dO and dK += dS^T Q (B transposed by ldmatrix).
template <int HD>
__global__ void __launch_bounds__(FA_THR, 2)
k_fa_dkdv(bf16 *dqkv, const bf16 *dout, const float *lse, const float *D, const bf16 *qkv,
	  const int *lens, const int *pos, int L, int nh, int nkv, float sl2, float scale)
{
	const int P = HD + 8, TILE = FA_BN * P;
	extern __shared__ __align__(16) bf16 fa_sm[];
	bf16 *ks = fa_sm, *vs = ks + FA_BM * P, *qs = vs + FA_BM * P, *gs = qs + 2 * TILE;
	float *lss = (float *)(gs + 2 * TILE), *Ds = lss + 2 * FA_BN;
	int *dss = (int *)(Ds + 2 * FA_BN);	// (2, FA_BN) packed rows: the queries' document starts
	const int W = (nh + 2 * nkv) * HD, OW = nh * HD, b = blockIdx.z, kv = blockIdx.y;
	const int grp = nh / nkv, j0 = blockIdx.x * FA_BM, warp = threadIdx.x >> 5;
	const int lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3, len = lens[b];
	const bf16 *base = qkv + (size_t)b * L * W, *gbase = dout + (size_t)b * L * OW;
	const int wk = j0 + warp * 16, r0 = wk + g, r1 = r0 + 8;
	// query tiles from the block's first key to the record's end, or, packed, to the first tile
	// wholly in documents that start after the block's last key
	int ntq = 0;

	if (j0 < len) {
		const int jl = min(j0 + FA_BM, len) - 1;

		while (j0 + ntq * FA_BN < len && doc_start(pos, b, L, j0 + ntq * FA_BN) <= jl)
			ntq++;
	}
	const int nt = grp * ntq;
	const uint32_t ob = off_b<P>(lane), obt = off_bt<P>(lane);
	const uint32_t ka = smem_u32(ks + warp * 16 * P) + off_a<P>(lane);
	const uint32_t va = smem_u32(vs + warp * 16 * P) + off_a<P>(lane);
	float dk[HD / 8][4], dv[HD / 8][4];

	// issue the loads of step t (query head, query tile) into stage t & 1
	auto issue = [&](int t) {
		const int h = kv * grp + t / ntq, i0 = j0 + (t % ntq) * FA_BN, st = t & 1;

		tile_async<HD, FA_BN>(qs + st * TILE, base + (size_t)h * HD, W, i0, len);
		tile_async<HD, FA_BN>(gs + st * TILE, gbase + (size_t)h * HD, OW, i0, len);
		for (int e = threadIdx.x; e < FA_BN; e += FA_THR) {
			const size_t tr = ((size_t)b * L + i0 + e) * nh + h;
			const bool ok = i0 + e < len;

			lss[st * FA_BN + e] = ok ? lse[tr] * LOG2E : 0.f;
			Ds[st * FA_BN + e] = ok ? D[tr] : 0.f;
			dss[st * FA_BN + e] = ok ? doc_start(pos, b, L, i0 + e) : 0;
		}
	};

	if (nt > 0) {
		tile_async<HD, FA_BM>(ks, base + (size_t)(nh + kv) * HD, W, j0, len);
		tile_async<HD, FA_BM>(vs, base + (size_t)(nh + nkv + kv) * HD, W, j0, len);
		issue(0);
	}
	cp_commit();
#pragma unroll
	for (int n = 0; n < HD / 8; n++)
		for (int e = 0; e < 4; e++)
			dk[n][e] = dv[n][e] = 0.f;
	for (int t = 0; t < nt; t++) {
		const int i0 = j0 + (t % ntq) * FA_BN, st = t & 1;

		if (t + 1 < nt)
			issue(t + 1);
		cp_commit();
		cp_wait1();
		__syncthreads();
		const uint32_t qb = smem_u32(qs + st * TILE), gb = smem_u32(gs + st * TILE);
		const float *lsl = lss + st * FA_BN, *Dl = Ds + st * FA_BN;
		const int *dsl = dss + st * FA_BN;

#pragma unroll
		for (int sub = 0; sub < FA_BN / FA_SUB; sub++) {
			const int c0 = i0 + sub * FA_SUB;
			float s[FA_SUB / 8][4], dp[FA_SUB / 8][4];

			// every query before every key of this warp, or all queries padding
			if (c0 + FA_SUB - 1 < wk || c0 >= len)
				continue;
#pragma unroll
			for (int n = 0; n < FA_SUB / 8; n++)
#pragma unroll
				for (int e = 0; e < 4; e++)
					s[n][e] = dp[n][e] = 0.f;
#pragma unroll
			for (int kk = 0; kk < HD / 16; kk++) {
				uint32_t ak[4], av[4];

				ldsm4(ak, ka + kk * 32);
				ldsm4(av, va + kk * 32);
#pragma unroll
				for (int np = 0; np < FA_SUB / 16; np++) {
					const uint32_t o = ((sub * FA_SUB + np * 16) * P + kk * 16) * 2;
					uint32_t bq[4], bg[4];

					ldsm4(bq, qb + ob + o);
					ldsm4(bg, gb + ob + o);
					mma16816(s[2 * np], ak, bq);
					mma16816(s[2 * np + 1], ak, bq + 2);
					mma16816(dp[2 * np], av, bg);
					mma16816(dp[2 * np + 1], av, bg + 2);
				}
			}
			const bool msk = c0 < wk + 15 || c0 + FA_SUB > len || pos;
#pragma unroll
			for (int n = 0; n < FA_SUB / 8; n++) {
#pragma unroll
				for (int e = 0; e < 4; e++) {
					const int key = e < 2 ? r0 : r1;
					const int qc = sub * FA_SUB + n * 8 + tq * 2 + (e & 1), q = i0 + qc;
					float p = fexp2(fmaf(s[n][e], sl2, -lsl[qc]));

					if (msk && (q < key || q >= len || key < dsl[qc]))
						p = 0.f;
					s[n][e] = p;
					dp[n][e] = p * (dp[n][e] - Dl[qc]);
				}
			}
#pragma unroll
			for (int kk = 0; kk < FA_SUB / 16; kk++) {
				uint32_t pa[4], da[4];

				acc_to_a(pa, s[2 * kk], s[2 * kk + 1]);
				acc_to_a(da, dp[2 * kk], dp[2 * kk + 1]);
#pragma unroll
				for (int np = 0; np < HD / 16; np++) {
					const uint32_t o = ((sub * FA_SUB + kk * 16) * P + np * 16) * 2;
					uint32_t bg[4], bq[4];

					ldsm4t(bg, gb + obt + o);
					ldsm4t(bq, qb + obt + o);
					mma16816(dv[2 * np], pa, bg);
					mma16816(dv[2 * np + 1], pa, bg + 2);
					mma16816(dk[2 * np], da, bq);
					mma16816(dk[2 * np + 1], da, bq + 2);
				}
			}
		}
		__syncthreads();
	}
#pragma unroll
	for (int half = 0; half < 2; half++) {
		const int row = half ? r1 : r0;
		const bool act = row < len;

		if (row >= L)
			continue;
		bf16 *yk = dqkv + ((size_t)b * L + row) * W + (size_t)(nh + kv) * HD;
		bf16 *yv = yk + (size_t)nkv * HD;
#pragma unroll
		for (int n = 0; n < HD / 8; n++) {
			*(uint32_t *)(yk + n * 8 + tq * 2) =
				pack_bf2(act ? dk[n][2 * half] * scale : 0.f,
					 act ? dk[n][2 * half + 1] * scale : 0.f);
			*(uint32_t *)(yv + n * 8 + tq * 2) =
				pack_bf2(act ? dv[n][2 * half] : 0.f, act ? dv[n][2 * half + 1] : 0.f);
		}
	}
}

template <int HD> static size_t fa_smem_fwd(void)
{
	return (size_t)4 * FA_BN * (HD + 8) * sizeof(bf16);
}

template <int HD> static size_t fa_smem_dkdv(void)
{
	return (size_t)(2 * FA_BM + 4 * FA_BN) * (HD + 8) * sizeof(bf16) + 4 * FA_BN * sizeof(float) +
	       2 * FA_BN * sizeof(int);
}

// above 48 KB a kernel needs its dynamic shared-memory limit raised, once
template <typename K> static void fa_allow(K kernel, size_t bytes, bool *done)
{
	if (!*done) {
		CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
						(int)bytes));
		*done = true;
	}
}

template <int HD>
static void fa_fwd(struct sl_cuda *c, bf16 *out, float *lse, const bf16 *qkv, const int *lens,
		   const int *pos, int B, int L, int nh, int nkv, float sl2)
{
	static bool done;
	size_t sm = fa_smem_fwd<HD>();

	fa_allow(k_fa_fwd<HD>, sm, &done);
	k_fa_fwd<HD><<<dim3((L + FA_BM - 1) / FA_BM, nh, B), FA_THR, sm, c->stream>>>(
		out, lse, qkv, lens, pos, L, nh, nkv, sl2);
	CUDA_LAUNCHED();
}

template <int HD>
static void fa_bwd(struct sl_cuda *c, bf16 *dqkv, const bf16 *dout, const float *lse,
		   const float *D, const bf16 *qkv, const int *lens, const int *pos, int B, int L,
		   int nh, int nkv, float sl2, float scale)
{
	static bool done_q, done_kv;
	size_t smq = fa_smem_fwd<HD>(), smk = fa_smem_dkdv<HD>();

	fa_allow(k_fa_dq<HD>, smq, &done_q);
	fa_allow(k_fa_dkdv<HD>, smk, &done_kv);
	k_fa_dq<HD><<<dim3((L + FA_BM - 1) / FA_BM, nh, B), FA_THR, smq, c->stream>>>(
		dqkv, dout, lse, D, qkv, lens, pos, L, nh, nkv, sl2, scale);
	CUDA_LAUNCHED();
	k_fa_dkdv<HD><<<dim3((L + FA_BM - 1) / FA_BM, nkv, B), FA_THR, smk, c->stream>>>(
		dqkv, dout, lse, D, qkv, lens, pos, L, nh, nkv, sl2, scale);
	CUDA_LAUNCHED();
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
				      const int *lens, const int *pos, int B, int L, int nh, int nkv,
				      int hd)
{
	int dpt = dpt_for(hd);
	dim3 grid((L + ROWS - 1) / ROWS, nh, B);
	float scale_log2 = (float)(1.4426950408889634 / sqrt((double)hd));

	check_heads(nh, nkv);
	if (B <= 0 || L <= 0)
		return;
	/* packed rows: the generic kernels (the tensor-core ones fail their packed test for now) */
	if (!pos && use_mma(hd, qkv, out)) {
		if (hd == 128)
			fa_fwd<128>(c, (bf16 *)out, lse, (const bf16 *)qkv, lens, pos, B, L, nh, nkv,
				    scale_log2);
		else
			fa_fwd<64>(c, (bf16 *)out, lse, (const bf16 *)qkv, lens, pos, B, L, nh, nkv,
				   scale_log2);
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
	if (!pos && use_mma(hd, qkv, dqkv) && (uintptr_t)dout % 16 == 0) {
		float sl2 = (float)(1.4426950408889634 / sqrt((double)hd));

		if (hd == 128)
			fa_bwd<128>(c, (bf16 *)dqkv, (const bf16 *)dout, lse, D, (const bf16 *)qkv,
				    lens, pos, B, L, nh, nkv, sl2, scale);
		else
			fa_bwd<64>(c, (bf16 *)dqkv, (const bf16 *)dout, lse, D, (const bf16 *)qkv,
				   lens, pos, B, L, nh, nkv, sl2, scale);
		return;
	}
	DISPATCH(dpt, k_attn_dq, dim3((L + ROWS - 1) / ROWS, nh, B), (bf16 *)dqkv,
		 (const bf16 *)dout, lse, D, (const bf16 *)qkv, lens, pos, L, nh, nkv, hd, scale);
	DISPATCH(dpt, k_attn_dkdv, dim3((L + ROWS - 1) / ROWS, nkv, B), (bf16 *)dqkv,
		 (const bf16 *)dout, lse, D, (const bf16 *)qkv, lens, pos, L, nh, nkv, hd, scale);
}
