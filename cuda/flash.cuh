// flash.cuh: the tensor-core flash-attention kernels and their launchers (included by
// attention.cu, which dispatches to them; device code and host launchers, C++).
#ifndef SL_FLASH_CUH
#define SL_FLASH_CUH

// ---- tensor-core path (head_dim 64, 128 and 256) ------------------------------------------
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
// buffers: results repeat bit for bit.  (Opt-in alternatives, head_dim 64 and 128: the fused dq,
// atomic fp32 sums; and the dS path, the dk/dv kernel storing dS for a matmul kernel that makes
// dq: 5 products, no atomics, a bf16 buffer of the causal score tiles.)  The backward computes in steps of 32 columns to keep the
// live scores (S and dP) at 32 registers.

// the kernels' dynamic shared memory
#define FA_SMEM SL_DYN_SMEM(bf16, fa_sm)

#define FA_BM 64		// rows a block owns (16 per warp)
#define FA_BN 64		// rows of a streamed shared-memory tile
#define FA_SUB 32		// columns per compute step in the backward
#define FA_THR 128
#define LOG2E 1.4426950408889634f
#define FA_RESCALE 8.f		// log2 of how far P may grow past 1 before O is rescaled
#define FA_WS_ST 3		// k_fa_dkdv_ws's stages of query tiles

// The warpgroup kernels at head_dim 256: a warpgroup's 64 x 256 fp32 accumulator takes 128
// registers a thread, so what the head_dim-128 kernels hold in registers besides moves to shared
// memory, and a block has two warpgroups (one block an SM).  The forward and dq (BIG): 128 query
// rows a block (64 a warpgroup), Q (and dO) read by the products from shared memory; dq streams
// keys in tiles of 32.  dk/dv (SPLIT): the block's 64 keys, each warpgroup accumulating dK and dV
// for half of the head's columns (both make S^T and dP^T over all of them).
#ifndef FA_BIG_HD
#define FA_BIG_HD 256	// the least head_dim whose forward and dq kernels are BIG
#endif
template <int HD, bool WG> struct fa_cfg {
	static constexpr bool BIG = WG && HD >= FA_BIG_HD;
	static constexpr int NWG = BIG ? 2 : 1;		// warpgroups a forward or dq block
	static constexpr int NT = FA_THR * NWG;		// its threads
	static constexpr int MINB = BIG ? 1 : 2;		// its blocks an SM
	static constexpr int BMQ = FA_BM * NWG;		// its query rows
	static constexpr int BNQ = BIG && HD > 128 ? 32 : FA_BN;	// dq's streamed key rows
	static constexpr bool SPLIT = WG && HD > 128;
	static constexpr int KNWG = SPLIT ? 2 : 1;		// warpgroups a dk/dv block
	static constexpr int KNT = FA_THR * KNWG, KMINB = SPLIT ? 1 : 2;
	static constexpr int HO = HD / KNWG;		// dK and dV columns a warpgroup holds
};

static __device__ __forceinline__ void mma16816(float *c, const uint32_t *a, const uint32_t *b)
{
#ifdef SL_EMU
	__trap();	// (the mma.sync kernels are not emulated)
#else
	asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
		     "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
		     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
		     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#endif
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

// one MUFU instruction; -inf gives 0 (masked scores)
static __device__ __forceinline__ float fexp2(float x)
{
#ifdef SL_EMU
	return exp2f(x);
#else
	float y;

	asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
	return y;
#endif
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

#include "wgmma.cuh"

// *p += x, p[1] += y (8-byte aligned, global memory), nothing returned: one vector reduction
static __device__ __forceinline__ void red_add2(float *p, float x, float y)
{
#if SL_WG_DEV
	asm volatile("red.global.add.v2.f32 [%0], {%1, %2};\n" ::"l"(p), "f"(x), "f"(y) : "memory");
#elif defined(SL_EMU)
	emu_red_add(p, x);
	emu_red_add(p + 1, y);
#else
	__trap();	// (the fused dq's kernels run only where the warpgroup kernels do)
#endif
}

// a streamed tile: padded rows for ldmatrix (mma.sync kernels) or swizzled panels (wgmma, WG)
template <int HD, int NR, bool WG, int NT = FA_THR>
static __device__ __forceinline__ void fa_tile(bf16 *sh, const bf16 *g, size_t stride, int row0,
					       int rend)
{
	if constexpr (WG)
		tile_sw<HD, NR, NT>(sh, g, stride, row0, rend);
	else
		tile_async<HD, NR>(sh, g, stride, row0, rend);
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

// Where a block's queries and keys are.  Whole rows (the attention op): queries and keys are rows
// of the same qkv, a query's index in its row is its row.  Context parallel (CP, the cp_attention
// ops): the rank's Lq query rows of each record come from its local qkv, each with its index in
// the row (gidx) and position in its document (pos); keys and values are whole rows of kv
// (B*L, 2 nkv HD).  part (forward only): 0 every key, 1 only the keys of chunks (of ch tokens)
// that rank me of C holds, 2 only the others', merged into out and lse.
struct fa_rows {
	const bf16 *kv;
	const int *gidx, *pos;
	int Lq, ch, C, me, part;
};

// a query row's index in its row, or -1 for padding (and rows past the record's local rows)
template <bool CP>
static __device__ __forceinline__ int fa_qidx(const fa_rows &x, int b, int len, int r)
{
	if (!CP)
		return r < len ? r : -1;
	if (r >= x.Lq)
		return -1;
	const int i = x.gidx[(size_t)b * x.Lq + r];
	return i < len ? i : -1;
}

// the first key index of query row r's document (i: its index, >= 0)
template <bool CP>
static __device__ __forceinline__ int fa_qdoc(const fa_rows &x, const int *pos, int b, int L,
					      int r, int i)
{
	return CP ? i - x.pos[(size_t)b * x.Lq + r] : doc_start(pos, b, L, r);
}

// key j left out by the forward's part
static __device__ __forceinline__ bool fa_skip_key(const fa_rows &x, int j)
{
	const int c = j / x.ch, owner = c < x.C ? c : 2 * x.C - 1 - c;

	return (owner == x.me) == (x.part == 2);
}

// A forward tile's scores (this lane's two rows r0 (index p0, document start ds0) and r1 by
// FA_BN keys from k0, in the accumulator layout): keys after a query, past the record, before a
// query's document, or left out by the part: masked, on the tiles where any can be (ds1 >= ds0:
// the later row's start)
static __device__ __forceinline__ void fa_mask_fwd(float (*s)[4], const fa_rows &x, int part,
						   int k0, int p0, int p1, int ds0, int ds1, int len,
						   int tq)
{
	if (part || k0 + FA_BN - 1 > p0 || k0 + FA_BN > len || k0 < ds1) {
#pragma unroll
		for (int n = 0; n < FA_BN / 8; n++) {
#pragma unroll
			for (int e = 0; e < 4; e++) {
				const int qi = e < 2 ? p0 : p1, key = k0 + n * 8 + tq * 2 + (e & 1);

				if (key > qi || key >= len || key < (e < 2 ? ds0 : ds1) ||
				    (part && fa_skip_key(x, key)))
					s[n][e] = -INFINITY;
			}
		}
	}
}

// The online softmax of a masked forward tile, first part: the rows' reference max m.  It moves
// (log2 units: m sl2) only when a row's max passes it by more than FA_RESCALE (the whole warp
// then moves every row's): below that, P and the sums stay under 2^FA_RESCALE and O needs no
// rescaling this tile (a new max is rare after a row's first tiles).  True when it moved: l has
// been multiplied by c0, c1 (rows r0, r1) and O must be too.
static __device__ __forceinline__ bool fa_rescale_fwd(const float (*s)[4], float &m0, float &m1,
						      float &l0, float &l1, float sl2, float &c0,
						      float &c1)
{
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
	if (!__any_sync(0xffffffffu, (mx0 - m0) * sl2 > FA_RESCALE ||
					 (mx1 - m1) * sl2 > FA_RESCALE))
		return false;
	const float n0 = mx0 == -INFINITY ? 0.f : mx0 * sl2;
	const float n1 = mx1 == -INFINITY ? 0.f : mx1 * sl2;

	c0 = fexp2(m0 * sl2 - n0);
	c1 = fexp2(m1 * sl2 - n1);
	m0 = mx0;
	m1 = mx1;
	l0 *= c0;
	l1 *= c1;
	return true;
}

// second part: P = 2^(s sl2 - m sl2) in place and the row sums l (a row with nothing unmasked
// yet subtracts 0: no inf - inf)
static __device__ __forceinline__ void fa_exp_fwd(float (*s)[4], float m0, float m1, float &l0,
						  float &l1, float sl2)
{
	const float b0 = m0 == -INFINITY ? 0.f : m0 * sl2;
	const float b1 = m1 == -INFINITY ? 0.f : m1 * sl2;

#pragma unroll
	for (int n = 0; n < FA_BN / 8; n++) {
		s[n][0] = fexp2(fmaf(s[n][0], sl2, -b0));
		s[n][1] = fexp2(fmaf(s[n][1], sl2, -b0));
		s[n][2] = fexp2(fmaf(s[n][2], sl2, -b1));
		s[n][3] = fexp2(fmaf(s[n][3], sl2, -b1));
		l0 += s[n][0] + s[n][1];
		l1 += s[n][2] + s[n][3];
	}
}

// O's rows r0, r1 times c0, c1
template <int HD> static __device__ __forceinline__ void fa_scale_o(float (*o)[4], float c0, float c1)
{
#pragma unroll
	for (int n = 0; n < HD / 8; n++) {
		o[n][0] *= c0;
		o[n][1] *= c0;
		o[n][2] *= c1;
		o[n][3] *= c1;
	}
}

// one output row of a forward block (half 0: r0, 1: r1): O / l in bf16 at y, its lse at ly (0
// for a padding row, whose output is zeros)
template <int HD>
static __device__ __forceinline__ void fa_out_row(bf16 *y, float *ly, const float (*o)[4],
						  int half, float l, float m, bool act, float sl2,
						  int tq)
{
	const float inv = act ? 1.f / l : 0.f;

#pragma unroll
	for (int n = 0; n < HD / 8; n++)
		*(uint32_t *)(y + n * 8 + tq * 2) =
			pack_bf2(o[n][2 * half] * inv, o[n][2 * half + 1] * inv);
	if (!tq)
		*ly = act ? (m * sl2 + log2f(l)) * 0.69314718055994531f : 0.f;
}

template <int HD, bool CP, bool WG>
__global__ void __launch_bounds__(fa_cfg<HD, WG>::NT, fa_cfg<HD, WG>::MINB)
k_fa_fwd(bf16 *out, float *lse, const bf16 *qkv, const int *lens, const int *pos, int L, int nh,
	 int nkv, float sl2, fa_rows x)
{
	using C = fa_cfg<HD, WG>;
	constexpr bool BIG = C::BIG;
	constexpr int BM = C::BMQ, NT = C::NT;
	const int P = HD + 8, TILE = WG ? FA_BN * HD : FA_BN * P;
	FA_SMEM;
	// BIG: the block's queries (BM x HD, swizzled) after the key and value stages
	bf16 *ks = WG ? sw_base(fa_sm) : fa_sm, *vs = ks + 2 * TILE, *qsm = vs + 2 * TILE;
	const int W = (nh + 2 * nkv) * HD, b = blockIdx.z, h = blockIdx.y, grp = nh / nkv;
	const int Lq = CP ? x.Lq : L, KS = CP ? 2 * nkv * HD : W, part = CP ? x.part : 0;
	// the longest blocks (last queries) first, so the short ones fill the tail
	const int q0 = (gridDim.x - 1 - blockIdx.x) * BM, warp = threadIdx.x >> 5, wg = warp >> 2;
	const int lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3, len = lens[b];
	const bf16 *base = qkv + (size_t)b * Lq * W;
	const bf16 *kvb = CP ? x.kv + (size_t)b * L * KS : base;
	const bf16 *kg = kvb + (size_t)((CP ? 0 : nh) + h / grp) * HD;
	const bf16 *vg = kvb + (size_t)((CP ? 0 : nh) + nkv + h / grp) * HD;
	const int r0 = q0 + warp * 16 + g, r1 = r0 + 8;
	// query indices (-1: padding) and document starts; indices and starts grow along the rows
	const int p0 = fa_qidx<CP>(x, b, len, r0), p1 = fa_qidx<CP>(x, b, len, r1);
	const int ds0 = p0 >= 0 ? fa_qdoc<CP>(x, pos, b, L, r0, p0) : 0;
	const int ds1 = p1 >= 0 ? fa_qdoc<CP>(x, pos, b, L, r1, p1) : ds0;
	// the block's keys: from its first query's document to its last query (or the record's end)
	const int pf = fa_qidx<CP>(x, b, len, q0), pl = fa_qidx<CP>(x, b, len, min(q0 + BM, Lq) - 1);
	const int kend = pf < 0 ? 0 : pl < 0 ? len : min(len, pl + 1), nt = (kend + FA_BN - 1) / FA_BN;
	const int kt0 = pf >= 0 ? fa_qdoc<CP>(x, pos, b, L, q0, pf) / FA_BN : 0;
	const uint32_t ob = off_b<P>(lane), obt = off_bt<P>(lane);
	uint32_t qf[BIG ? 1 : HD / 16][4];
	float o[HD / 8][4], m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;

	if (nt > kt0) {
		fa_tile<HD, FA_BN, WG, NT>(ks, kg, KS, kt0 * FA_BN, kend);
		fa_tile<HD, FA_BN, WG, NT>(vs, vg, KS, kt0 * FA_BN, kend);
		if constexpr (BIG)	// padding rows too: every key is masked for them
			fa_tile<HD, BM, WG, NT>(qsm, base + (size_t)h * HD, W, q0, Lq);
	}
	cp_commit();
	if constexpr (!BIG)
		load_afrag<HD>(qf, base + (size_t)r0 * W + (size_t)h * HD, W, p0 >= 0, p1 >= 0,
			       tq);
#pragma unroll
	for (int n = 0; n < HD / 8; n++)
		o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
	for (int t = kt0; t < nt; t++) {
		const int k0 = t * FA_BN, st = (t - kt0) & 1;

		if (t + 1 < nt) {
			fa_tile<HD, FA_BN, WG, NT>(ks + (st ^ 1) * TILE, kg, KS, k0 + FA_BN, kend);
			fa_tile<HD, FA_BN, WG, NT>(vs + (st ^ 1) * TILE, vg, KS, k0 + FA_BN, kend);
		}
		cp_commit();
		cp_wait1();
		if (WG)
			fence_async_smem();
		__syncthreads();
		// a tile wholly in the chunks the part leaves out (chunks of 64 keys or more: a tile
		// then spans two chunks at most): nothing to add
		if (part && x.ch >= FA_BN && fa_skip_key(x, k0) &&
		    fa_skip_key(x, min(k0 + FA_BN, L) - 1)) {
			__syncthreads();
			continue;
		}
		// BIG: a tile wholly after the warpgroup's queries (the block's other warpgroup's)
		if (BIG && !CP && k0 > q0 + 64 * wg + 63) {
			__syncthreads();
			continue;
		}
		const bf16 *kt = ks + st * TILE, *vt = vs + st * TILE;
		float s[FA_BN / 8][4];

		if constexpr (WG) {	// the first k-step writes S (acc 0): nothing to zero
			wg_fence();
#pragma unroll
			for (int kk = 0; kk < HD / 16; kk++) {
				if constexpr (BIG)
					wgmma_ss<FA_BN>(&s[0][0], desc_k<BM>(qsm, 64 * wg, kk),
							desc_k<FA_BN>(kt, 0, kk), kk > 0);
				else
					wgmma_rs<FA_BN, 0>(&s[0][0], qf[kk], desc_k<FA_BN>(kt, 0, kk),
							   kk > 0);
			}
			wg_commit();
			wg_wait0();
		} else {
#pragma unroll
			for (int n = 0; n < FA_BN / 8; n++)
				s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
#pragma unroll
			for (int kk = 0; kk < HD / 16; kk++) {
#pragma unroll
				for (int np = 0; np < FA_BN / 16; np++) {
					uint32_t bb[4];

					ldsm4(bb, smem_u32(kt) + ob + (np * 16 * P + kk * 16) * 2);
					mma16816(s[2 * np], qf[kk], bb);
					mma16816(s[2 * np + 1], qf[kk], bb + 2);
				}
			}
		}
		fa_mask_fwd(s, x, part, k0, p0, p1, ds0, ds1, len, tq);
		float c0, c1;

		if (fa_rescale_fwd(s, m0, m1, l0, l1, sl2, c0, c1))
			fa_scale_o<HD>(o, c0, c1);
		fa_exp_fwd(s, m0, m1, l0, l1, sl2);
		if constexpr (WG) {
			uint32_t pa[FA_BN / 16][4];

#pragma unroll
			for (int kk = 0; kk < FA_BN / 16; kk++)
				acc_to_a(pa[kk], s[2 * kk], s[2 * kk + 1]);
			wg_fence();
#pragma unroll
			for (int kk = 0; kk < FA_BN / 16; kk++)
				wgmma_rs_mn<HD, FA_BN>(&o[0][0], pa[kk], vt, kk * 16);
			wg_commit();
			wg_wait0();
		} else {
#pragma unroll
			for (int kk = 0; kk < FA_BN / 16; kk++) {
				uint32_t pa[4];

				acc_to_a(pa, s[2 * kk], s[2 * kk + 1]);
#pragma unroll
				for (int np = 0; np < HD / 16; np++) {
					uint32_t bb[4];

					ldsm4t(bb, smem_u32(vt) + obt + (kk * 16 * P + np * 16) * 2);
					mma16816(o[2 * np], pa, bb);
					mma16816(o[2 * np + 1], pa, bb + 2);
				}
			}
		}
		__syncthreads();	// the next iteration's prefetch overwrites this stage
	}
	l0 = quad_sum(l0);
	l1 = quad_sum(l1);
	// part 2: part 1's lse of both rows, read by every lane before any lane writes
	float lold[2] = { 0.f, 0.f };

	if (part == 2) {
		if (p0 >= 0)
			lold[0] = lse[((size_t)b * Lq + r0) * nh + h];
		if (p1 >= 0)
			lold[1] = lse[((size_t)b * Lq + r1) * nh + h];
		__syncwarp();
	}
#pragma unroll
	for (int half = 0; half < 2; half++) {
		const int row = half ? r1 : r0;
		const float l = half ? l1 : l0, m = half ? m1 : m0;
		const bool act = (half ? p1 : p0) >= 0;

		if (row >= Lq)
			continue;
		bf16 *y = out + ((size_t)b * Lq + row) * nh * HD + (size_t)h * HD;
		float *ly = lse + ((size_t)b * Lq + row) * nh + h;

		if (part == 2) {
			// merge with part 1's (y, ly); a padding row or one with no other key keeps it
			if (!act || l == 0.f)
				continue;
			const float l2 = (m * sl2 + log2f(l)) * 0.69314718055994531f, l1p = lold[half];
			const float mm = fmaxf(l1p, l2), w1 = __expf(l1p - mm), w2 = __expf(l2 - mm);
			const float f1 = w1 / (w1 + w2), f2 = w2 / (w1 + w2) / l;

#pragma unroll
			for (int n = 0; n < HD / 8; n++) {
				uint32_t *yp = (uint32_t *)(y + n * 8 + tq * 2);
				const float2 old = __bfloat1622float2(*(const __nv_bfloat162 *)yp);

				*yp = pack_bf2(f1 * old.x + f2 * o[n][2 * half],
					       f1 * old.y + f2 * o[n][2 * half + 1]);
			}
			if (!tq)
				*ly = mm + logf(w1 + w2);
			continue;
		}
		fa_out_row<HD>(y, ly, o, half, l, m, act, sl2, tq);
	}
}

// The forward on warpgroup products, pipelined inside the warpgroup (head_dim 64 and 128, whole
// rows; the default there, SHARDLM_FA_PIPE=0 for k_fa_fwd): iteration t issues S_t = Q K_t and then O += P_{t-1} V_{t-1}, waits
// for S_t alone, and makes P_t (mask, row max, exponentials, row sums) while the tensor cores
// add P_{t-1} V_{t-1}; then it waits for that product, rescales O where the reference max moved,
// and packs P_t as the next iteration's A operand.  Key and value tiles stream through two
// stages each, the values a tile behind the keys (V_t is copied during iteration t and read in
// iteration t + 1).  O sees the same operations in the same order as in k_fa_fwd (O += P_{t-1}
// V_{t-1}, O *= c_t, O += P_t V_t), so the two kernels' results are equal bit for bit.
template <int HD>
__global__ void __launch_bounds__(FA_THR, 2)
k_fa_fwd_pipe(bf16 *out, float *lse, const bf16 *qkv, const int *lens, const int *pos, int L,
	      int nh, int nkv, float sl2)
{
	constexpr int TILE = FA_BN * HD, NO = HD / 8 * 4, NS = FA_BN / 8 * 4;
	FA_SMEM;
	bf16 *ks = sw_base(fa_sm), *vs = ks + 2 * TILE;
	const fa_rows x{};
	const int W = (nh + 2 * nkv) * HD, b = blockIdx.z, h = blockIdx.y, grp = nh / nkv;
	const int q0 = (gridDim.x - 1 - blockIdx.x) * FA_BM, warp = threadIdx.x >> 5;
	const int lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3, len = lens[b];
	const bf16 *base = qkv + (size_t)b * L * W;
	const bf16 *kg = base + (size_t)(nh + h / grp) * HD;
	const bf16 *vg = base + (size_t)(nh + nkv + h / grp) * HD;
	const int r0 = q0 + warp * 16 + g, r1 = r0 + 8;
	const int p0 = fa_qidx<false>(x, b, len, r0), p1 = fa_qidx<false>(x, b, len, r1);
	const int ds0 = p0 >= 0 ? fa_qdoc<false>(x, pos, b, L, r0, p0) : 0;
	const int ds1 = p1 >= 0 ? fa_qdoc<false>(x, pos, b, L, r1, p1) : ds0;
	const int pf = fa_qidx<false>(x, b, len, q0);
	const int pl = fa_qidx<false>(x, b, len, min(q0 + FA_BM, L) - 1);
	const int kend = pf < 0 ? 0 : pl < 0 ? len : min(len, pl + 1), nt = (kend + FA_BN - 1) / FA_BN;
	const int kt0 = pf >= 0 ? fa_qdoc<false>(x, pos, b, L, q0, pf) / FA_BN : 0;
	uint32_t qf[HD / 16][4], pa[FA_BN / 16][4];
	float o[HD / 8][4], s[FA_BN / 8][4], m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;

	if (nt > kt0)
		tile_sw<HD, FA_BN, FA_THR>(ks, kg, W, kt0 * FA_BN, kend);
	cp_commit();
	load_afrag<HD>(qf, base + (size_t)r0 * W + (size_t)h * HD, W, p0 >= 0, p1 >= 0, tq);
#pragma unroll
	for (int n = 0; n < HD / 8; n++)
		o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
	for (int t = kt0; t < nt; t++) {
		const int k0 = t * FA_BN, st = (t - kt0) & 1;

		// K_{t+1} over K_{t-1}, V_t over V_{t-2}: both products that read them were waited
		// for by every warp before the last iteration's closing barrier
		if (t + 1 < nt)
			tile_sw<HD, FA_BN, FA_THR>(ks + (st ^ 1) * TILE, kg, W, k0 + FA_BN, kend);
		tile_sw<HD, FA_BN, FA_THR>(vs + st * TILE, vg, W, k0, kend);
		cp_commit();
		cp_wait1();	// K_t and V_{t-1}
		fence_async_smem();
		__syncthreads();
		wg_fence();
#pragma unroll
		for (int kk = 0; kk < HD / 16; kk++)
			wgmma_rs<FA_BN, 0>(&s[0][0], qf[kk], desc_k<FA_BN>(ks + st * TILE, 0, kk),
					   kk > 0);
		wg_commit();
		if (t > kt0) {
			wg_fence();
#pragma unroll
			for (int kk = 0; kk < FA_BN / 16; kk++)
				wgmma_rs_mn<HD, FA_BN>(&o[0][0], pa[kk], vs + (st ^ 1) * TILE,
						       kk * 16);
			wg_commit();
			wg_wait1();	// S_t; P_{t-1} V_{t-1} may still run
		} else {
			wg_wait0();
		}
		wg_pin<NS>(&s[0][0]);
		fa_mask_fwd(s, x, 0, k0, p0, p1, ds0, ds1, len, tq);
		float c0 = 1.f, c1 = 1.f;
		// k_fa_fwd's softmax; O's rescaling waits for the product in flight
		const bool resc = fa_rescale_fwd(s, m0, m1, l0, l1, sl2, c0, c1);

		fa_exp_fwd(s, m0, m1, l0, l1, sl2);

		wg_wait0();
		wg_pin<NO>(&o[0][0]);
		if (resc)
			fa_scale_o<HD>(o, c0, c1);
#pragma unroll
		for (int kk = 0; kk < FA_BN / 16; kk++)
			acc_to_a(pa[kk], s[2 * kk], s[2 * kk + 1]);
		__syncthreads();	// every warp past its waits: the next copies may overwrite
	}
	if (nt > kt0) {		// O += P V of the last tile
		cp_wait_all();
		fence_async_smem();
		__syncthreads();
		wg_fence();
#pragma unroll
		for (int kk = 0; kk < FA_BN / 16; kk++)
			wgmma_rs_mn<HD, FA_BN>(&o[0][0], pa[kk], vs + ((nt - 1 - kt0) & 1) * TILE,
					       kk * 16);
		wg_commit();
		wg_wait0();
		wg_pin<NO>(&o[0][0]);
	}
	l0 = quad_sum(l0);
	l1 = quad_sum(l1);
#pragma unroll
	for (int half = 0; half < 2; half++) {
		const int row = half ? r1 : r0;
		const float l = half ? l1 : l0, m = half ? m1 : m0;
		const bool act = (half ? p1 : p0) >= 0;

		if (row >= L)
			continue;
		fa_out_row<HD>(out + ((size_t)b * L + row) * nh * HD + (size_t)h * HD,
			       lse + ((size_t)b * L + row) * nh + h, o, half, l, m, act, sl2, tq);
	}
}

// a dq sub-step's dS = P (dP - D) in place of S (s): this lane's queries (indices p0, p1: -1
// padding; document starts ds0, ds1; lse * log2 e ls0, ls1; D0, D1) by the FA_SUB keys from c0;
// keys after the query, past the record or before the query's document are zeros
static __device__ __forceinline__ void fa_dq_p(float (*s)[4], const float (*dp)[4], int c0,
					       int p0, int p1, int ds0, int ds1, float ls0,
					       float ls1, float D0, float D1, int len, int tq,
					       float sl2)
{
	const bool msk = c0 + FA_SUB - 1 > p0 || c0 + FA_SUB > len || c0 < ds1;

#pragma unroll
	for (int n = 0; n < FA_SUB / 8; n++) {
#pragma unroll
		for (int e = 0; e < 4; e++) {
			const int qi = e < 2 ? p0 : p1, key = c0 + n * 8 + tq * 2 + (e & 1);
			float p = fexp2(fmaf(s[n][e], sl2, -(e < 2 ? ls0 : ls1)));

			if (msk && (key > qi || key >= len || key < (e < 2 ? ds0 : ds1)))
				p = 0.f;
			s[n][e] = p * (dp[n][e] - (e < 2 ? D0 : D1));
		}
	}
}

// a dq sub-step's dS (fa_dq_p's s) as the A fragments of dQ += dS K on warpgroup products
static __device__ __forceinline__ void fa_dq_frags(uint32_t (*da)[4], const float (*s)[4])
{
#pragma unroll
	for (int kk = 0; kk < FA_SUB / 16; kk++)
		acc_to_a(da[kk], s[2 * kk], s[2 * kk + 1]);
}

// The dq kernel's key tiles on warpgroup products, pipelined (head_dim 64 and 128; the default,
// SHARDLM_FA_DQ_PIPE=0 runs the unpipelined loop): three stages of key and value tiles (stages 0
// and 1 where the unpipelined loop keeps its two, stage 2 after them), tile t + 2 loading while
// tile t computes.  A tile's two sub-steps' S and dP are issued at once, while the previous
// tile's dQ products still run; the first sub-step's dS is made while the second's products
// run, the second's while the first's dQ product runs.  Every sub-step always runs (a
// warpgroup's queries reach past a tile's first FA_SUB keys unless the record ends inside it;
// masked keys give zeros), so every warp takes the same path and ptxas keeps the products
// asynchronous.  The same sums as the unpipelined loop, in the same order.  ks: the stages'
// base, tile kt0 already issued into stage 0 as the only pending copy group.
template <int HD, int BN, int NT>
static __device__ __forceinline__ void
fa_dq_loop_wg(float (*dq)[4], const uint32_t (*qf)[4], const uint32_t (*gf)[4], bf16 *ks,
	      int TILE, const bf16 *kg, const bf16 *vg, int KS, int kt0, int nt, int kend, int p0,
	      int p1, int ds0, int ds1, float ls0, float ls1, float D0, float D1, int len, int tq,
	      float sl2)
{
	static_assert(BN == 2 * FA_SUB, "fa_dq_loop_wg: two sub-steps a tile");
	float s[2][FA_SUB / 8][4], dp[2][FA_SUB / 8][4];
	uint32_t da[2][FA_SUB / 16][4];
	auto kst = [&](int st) { return ks + (st < 2 ? st : 4) * TILE; };
	auto vst = [&](int st) { return ks + (st < 2 ? 2 + st : 5) * TILE; };
	auto load = [&](int t) {	// tile t into its stage
		const int st = (t - kt0) % 3;

		fa_tile<HD, BN, true, NT>(kst(st), kg, KS, t * BN, kend);
		fa_tile<HD, BN, true, NT>(vst(st), vg, KS, t * BN, kend);
	};
	auto sdp = [&](const bf16 *kt, const bf16 *vt, int sb) {	// S and dP (acc 0 first)
		wg_fence();
#pragma unroll
		for (int kk = 0; kk < HD / 16; kk++) {
			wgmma_rs<FA_SUB, 0>(&s[sb][0][0], qf[kk], desc_k<BN>(kt, sb * FA_SUB, kk),
					    kk > 0);
			wgmma_rs<FA_SUB, 0>(&dp[sb][0][0], gf[kk], desc_k<BN>(vt, sb * FA_SUB, kk),
					    kk > 0);
		}
		wg_commit();
	};
	auto dqp = [&](const bf16 *kt, int sb) {	// dQ += dS K
		wg_fence();
#pragma unroll
		for (int kk = 0; kk < FA_SUB / 16; kk++)
			wgmma_rs_mn<HD, BN>(&dq[0][0], da[sb][kk], kt, sb * FA_SUB + kk * 16);
		wg_commit();
	};

	if (kt0 + 1 < nt)
		load(kt0 + 1);
	cp_commit();
	for (int t = kt0; t < nt; t++) {
		const int st = (t - kt0) % 3, k0 = t * BN;
		const bf16 *kt = kst(st), *vt = vst(st);

		cp_wait1();	// tile t's copies (tile t + 1's may still run)
		fence_async_smem();
		__syncthreads();
		sdp(kt, vt, 0);
		sdp(kt, vt, 1);
		wg_wait2();		// the previous tile's dQ products ...
		__syncthreads();	// ... in every warp: their stage takes tile t + 2
		if (t + 2 < nt)
			load(t + 2);
		cp_commit();
		wg_wait1();	// sub-step 0's S and dP; 1's may still run
		wg_pin<FA_SUB / 2>(&s[0][0][0]);
		wg_pin<FA_SUB / 2>(&dp[0][0][0]);
		fa_dq_p(s[0], dp[0], k0, p0, p1, ds0, ds1, ls0, ls1, D0, D1, len, tq, sl2);
		fa_dq_frags(da[0], s[0]);
		dqp(kt, 0);
		wg_wait1();	// sub-step 1's S and dP; 0's dQ may still run
		wg_pin<FA_SUB / 2>(&s[1][0][0]);
		wg_pin<FA_SUB / 2>(&dp[1][0][0]);
		fa_dq_p(s[1], dp[1], k0 + FA_SUB, p0, p1, ds0, ds1, ls0, ls1, D0, D1, len, tq, sl2);
		fa_dq_frags(da[1], s[1]);
		dqp(kt, 1);
	}
	wg_wait0();
	wg_pin<HD / 2>(&dq[0][0]);
}

// dq: a warp's 16 queries hold Q and dO as A fragments; per key step S = Q K^T and dP = dO V^T
// (K, V not transposed), dS = P (dP - D) rounded to bf16 is the A operand of dQ += dS K (K
// transposed by ldmatrix).  pipe: the warpgroup kernel's tiles by fa_dq_loop_wg (head_dim 64 and
// 128)
template <int HD, bool CP, bool WG>
__global__ void __launch_bounds__(fa_cfg<HD, WG>::NT, fa_cfg<HD, WG>::MINB)
k_fa_dq(bf16 *dqkv, const bf16 *dout, const float *lse, const float *D, const bf16 *qkv,
	const int *lens, const int *pos, int L, int nh, int nkv, float sl2, float scale, fa_rows x,
	bool pipe)
{
	using C = fa_cfg<HD, WG>;
	constexpr bool BIG = C::BIG;
	constexpr int BM = C::BMQ, BN = C::BNQ, NT = C::NT;
	const int P = HD + 8, TILE = WG ? BN * HD : BN * P;
	FA_SMEM;
	// BIG: the block's queries and their dO (BM x HD each, swizzled) after the stages
	bf16 *ks = WG ? sw_base(fa_sm) : fa_sm, *vs = ks + 2 * TILE, *qsm = vs + 2 * TILE;
	bf16 *gsm = qsm + BM * HD;
	const int W = (nh + 2 * nkv) * HD, OW = nh * HD, b = blockIdx.z, h = blockIdx.y;
	const int Lq = CP ? x.Lq : L, KS = CP ? 2 * nkv * HD : W;
	const int grp = nh / nkv, q0 = (gridDim.x - 1 - blockIdx.x) * BM, warp = threadIdx.x >> 5;
	const int lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3, len = lens[b];
	const bf16 *base = qkv + (size_t)b * Lq * W, *gbase = dout + (size_t)b * Lq * OW;
	const bf16 *kvb = CP ? x.kv + (size_t)b * L * KS : base;
	const bf16 *kg = kvb + (size_t)((CP ? 0 : nh) + h / grp) * HD;
	const bf16 *vg = kvb + (size_t)((CP ? 0 : nh) + nkv + h / grp) * HD;
	const int r0 = q0 + warp * 16 + g, r1 = r0 + 8;
	const int p0 = fa_qidx<CP>(x, b, len, r0), p1 = fa_qidx<CP>(x, b, len, r1);
	const int ds0 = p0 >= 0 ? fa_qdoc<CP>(x, pos, b, L, r0, p0) : 0;
	const int ds1 = p1 >= 0 ? fa_qdoc<CP>(x, pos, b, L, r1, p1) : ds0;
	const int pf = fa_qidx<CP>(x, b, len, q0), pl = fa_qidx<CP>(x, b, len, min(q0 + BM, Lq) - 1);
	const int kend = pf < 0 ? 0 : pl < 0 ? len : min(len, pl + 1), nt = (kend + BN - 1) / BN;
	const int kt0 = pf >= 0 ? fa_qdoc<CP>(x, pos, b, L, q0, pf) / BN : 0;
	const uint32_t ob = off_b<P>(lane), obt = off_bt<P>(lane);
	uint32_t qf[BIG ? 1 : HD / 16][4], gf[BIG ? 1 : HD / 16][4];
	float dq[HD / 8][4], ls0 = 0.f, ls1 = 0.f, D0 = 0.f, D1 = 0.f;
	// the warp's last query index (-1: all padding): key steps after it are skipped; the
	// warpgroup's products take the whole block, so there the block's last query (kend - 1),
	// BIG the warpgroup's (its 64 rows')
	int wmax = max(p0, p1);

	wmax = max(wmax, __shfl_xor_sync(0xffffffffu, wmax, 4));
	wmax = max(wmax, __shfl_xor_sync(0xffffffffu, wmax, 8));
	wmax = max(wmax, __shfl_xor_sync(0xffffffffu, wmax, 16));
	if (WG)
		wmax = BIG && !CP ? min(kend - 1, q0 + 64 * (warp >> 2) + 63) : kend - 1;
	if (nt > kt0) {
		fa_tile<HD, BN, WG, NT>(ks, kg, KS, kt0 * BN, kend);
		fa_tile<HD, BN, WG, NT>(vs, vg, KS, kt0 * BN, kend);
		if constexpr (BIG) {	// padding rows too: their dS is zero
			fa_tile<HD, BM, WG, NT>(qsm, base + (size_t)h * HD, W, q0, Lq);
			fa_tile<HD, BM, WG, NT>(gsm, gbase + (size_t)h * HD, OW, q0, Lq);
		}
	}
	cp_commit();
	if constexpr (!BIG) {
		load_afrag<HD>(qf, base + (size_t)r0 * W + (size_t)h * HD, W, p0 >= 0, p1 >= 0, tq);
		load_afrag<HD>(gf, gbase + (size_t)r0 * OW + (size_t)h * HD, OW, p0 >= 0, p1 >= 0,
			       tq);
	}
	if (p0 >= 0) {
		ls0 = lse[((size_t)b * Lq + r0) * nh + h] * LOG2E;
		D0 = D[((size_t)b * Lq + r0) * nh + h];
	}
	if (p1 >= 0) {
		ls1 = lse[((size_t)b * Lq + r1) * nh + h] * LOG2E;
		D1 = D[((size_t)b * Lq + r1) * nh + h];
	}
#pragma unroll
	for (int n = 0; n < HD / 8; n++)
		dq[n][0] = dq[n][1] = dq[n][2] = dq[n][3] = 0.f;
	bool piped = false;

	if constexpr (WG && !BIG) {
		if (pipe) {
			fa_dq_loop_wg<HD, BN, NT>(dq, qf, gf, ks, TILE, kg, vg, KS, kt0, nt, kend, p0,
						  p1, ds0, ds1, ls0, ls1, D0, D1, len, tq, sl2);
			piped = true;
		}
	}
	for (int t = piped ? nt : kt0; t < nt; t++) {
		const int k0 = t * BN, st = (t - kt0) & 1;

		if (t + 1 < nt) {
			fa_tile<HD, BN, WG, NT>(ks + (st ^ 1) * TILE, kg, KS, k0 + BN, kend);
			fa_tile<HD, BN, WG, NT>(vs + (st ^ 1) * TILE, vg, KS, k0 + BN, kend);
		}
		cp_commit();
		cp_wait1();
		if (WG)
			fence_async_smem();
		__syncthreads();
		const bf16 *kt = ks + st * TILE, *vt = vs + st * TILE;
		const uint32_t kb = smem_u32(kt), vb = smem_u32(vt);

#pragma unroll
		for (int sub = 0; sub < BN / FA_SUB; sub++) {
			const int c0 = k0 + sub * FA_SUB;
			float s[FA_SUB / 8][4], dp[FA_SUB / 8][4];

			if (c0 > wmax)
				continue;	// every key after every query of this warp
			if constexpr (WG) {	// the first k-step writes S and dP (acc 0)
				wg_fence();
#pragma unroll
				for (int kk = 0; kk < HD / 16; kk++) {
					const uint64_t bk = desc_k<BN>(kt, sub * FA_SUB, kk);
					const uint64_t bv = desc_k<BN>(vt, sub * FA_SUB, kk);

					if constexpr (BIG) {
						const int m0 = 64 * (warp >> 2);

						wgmma_ss<FA_SUB>(&s[0][0], desc_k<BM>(qsm, m0, kk), bk,
								 kk > 0);
						wgmma_ss<FA_SUB>(&dp[0][0], desc_k<BM>(gsm, m0, kk), bv,
								 kk > 0);
					} else {
						wgmma_rs<FA_SUB, 0>(&s[0][0], qf[kk], bk, kk > 0);
						wgmma_rs<FA_SUB, 0>(&dp[0][0], gf[kk], bv, kk > 0);
					}
				}
				wg_commit();
				wg_wait0();
			} else {
#pragma unroll
				for (int n = 0; n < FA_SUB / 8; n++)
#pragma unroll
					for (int e = 0; e < 4; e++)
						s[n][e] = dp[n][e] = 0.f;
#pragma unroll
				for (int kk = 0; kk < HD / 16; kk++) {
#pragma unroll
					for (int np = 0; np < FA_SUB / 16; np++) {
						const uint32_t o =
							((sub * FA_SUB + np * 16) * P + kk * 16) * 2;
						uint32_t bk[4], bv[4];

						ldsm4(bk, kb + ob + o);
						ldsm4(bv, vb + ob + o);
						mma16816(s[2 * np], qf[kk], bk);
						mma16816(s[2 * np + 1], qf[kk], bk + 2);
						mma16816(dp[2 * np], gf[kk], bv);
						mma16816(dp[2 * np + 1], gf[kk], bv + 2);
					}
				}
			}
			fa_dq_p(s, dp, c0, p0, p1, ds0, ds1, ls0, ls1, D0, D1, len, tq, sl2);
			if constexpr (WG) {
				uint32_t da[FA_SUB / 16][4];

				fa_dq_frags(da, s);
				wg_fence();
#pragma unroll
				for (int kk = 0; kk < FA_SUB / 16; kk++)
					wgmma_rs_mn<HD, BN>(&dq[0][0], da[kk], kt,
							    sub * FA_SUB + kk * 16);
				wg_commit();
				wg_wait0();
			} else {
#pragma unroll
				for (int kk = 0; kk < FA_SUB / 16; kk++) {
					uint32_t da[4];

					acc_to_a(da, s[2 * kk], s[2 * kk + 1]);
#pragma unroll
					for (int np = 0; np < HD / 16; np++) {
						uint32_t bk[4];

						ldsm4t(bk, kb + obt +
							       ((sub * FA_SUB + kk * 16) * P + np * 16) * 2);
						mma16816(dq[2 * np], da, bk);
						mma16816(dq[2 * np + 1], da, bk + 2);
					}
				}
			}
		}
		__syncthreads();
	}
#pragma unroll
	for (int half = 0; half < 2; half++) {
		const int row = half ? r1 : r0;
		const float f = (half ? p1 : p0) >= 0 ? scale : 0.f;

		if (row >= Lq)
			continue;
		bf16 *y = dqkv + ((size_t)b * Lq + row) * W + (size_t)h * HD;
#pragma unroll
		for (int n = 0; n < HD / 8; n++)
			*(uint32_t *)(y + n * 8 + tq * 2) =
				pack_bf2(dq[n][2 * half] * f, dq[n][2 * half + 1] * f);
	}
}

// the first of a record's Lq local query rows whose index is at least j (Lq when none): indices
// grow along the rows
static __device__ int fa_first_row(const fa_rows &x, int b, int j)
{
	int lo = 0, hi = x.Lq;

	while (lo < hi) {
		const int mid = (lo + hi) / 2;

		if (x.gidx[(size_t)b * x.Lq + mid] < j)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

// A dk/dv block's record, kv head and first key (BK keys a block).  The blocks start in the order
// of their work, longest first over every kv head and record (the key blocks nearest a record's
// start have the most queries after them): the hardware starts blocks in index order, x fastest,
// so the launch index walks (kv, record) fastest and the key block slowest.  (In grid order, key
// block by key block per (kv, record), the last records' heavy first key blocks start late and
// finish alone: at 2 x 4096 with 4 kv heads, 512 blocks in 1.9 waves, the dk/dv kernel ran 17%
// slower for its FLOPs than at 4 x 2048 with 1,024 blocks.)
static __device__ __forceinline__ void fa_kv_block(int BK, int &b, int &kv, int &j0)
{
	const unsigned lin = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
	const unsigned yz = gridDim.y * gridDim.z;

	b = (int)((lin % yz) / gridDim.y);
	kv = (int)((lin % yz) % gridDim.y);
	j0 = (int)(lin / yz) * BK;
}

// A dk/dv block's query tiles a head: from local row qs0 (the first query at or after the block's
// first key j0) to the record's end or, packed, to the first tile wholly in documents that start
// after the block's last key
template <bool CP>
static __device__ __forceinline__ int fa_kv_ntq(const fa_rows &x, const int *pos, int b, int L,
						int len, int j0, int BK, int qs0)
{
	int ntq = 0;

	if (j0 < len) {
		const int jl = min(j0 + BK, len) - 1;

		for (;;) {
			const int r = qs0 + ntq * FA_BN, i = fa_qidx<CP>(x, b, len, r);

			if (i < 0 || fa_qdoc<CP>(x, pos, b, L, r, i) > jl)
				break;
			ntq++;
		}
	}
	return ntq;
}

// A thread's dK (times scale) and dV, the NC columns it holds of its key rows r0 and r1 (zeros
// past the record's len, nothing past its L rows): row r's dK at yk + r stride, its dV voff on
template <int NC>
static __device__ __forceinline__ void fa_kv_store(bf16 *yk, size_t stride, size_t voff,
						   const float (*dk)[4], const float (*dv)[4], int r0,
						   int r1, int len, int L, int tq, float scale)
{
#pragma unroll
	for (int half = 0; half < 2; half++) {
		const int row = half ? r1 : r0;
		const bool act = row < len;
		bf16 *k = yk + (size_t)row * stride, *v = k + voff;

		if (row >= L)
			continue;
#pragma unroll
		for (int n = 0; n < NC / 8; n++) {
			*(uint32_t *)(k + n * 8 + tq * 2) =
				pack_bf2(act ? dk[n][2 * half] * scale : 0.f,
					 act ? dk[n][2 * half + 1] * scale : 0.f);
			*(uint32_t *)(v + n * 8 + tq * 2) =
				pack_bf2(act ? dv[n][2 * half] : 0.f, act ? dv[n][2 * half + 1] : 0.f);
		}
	}
}

// The dS path's buffer (fa_bwd_ds): dS^T, bf16, a tile of 64 keys by 64 queries for every
// (record, query head, query tile i, key tile kt <= i), the tiles of a (record, head) in the order
// (i, kt) = (0, 0), (1, 0), (1, 1), (2, 0), ...  A tile is one 128-byte-swizzled panel as
// wgmma.cuh lays them (key rows of 64 queries), so k_fa_dq_ds copies it to shared memory as it
// is and reads it as an MN-major operand.  Elements a tile:
#define FA_DS_TILE (64 * 64)

// (record b, query head h, query tile i, key tile kt) -> the tile's first element; T: query tiles
// a row
static __device__ __forceinline__ size_t fa_ds_tile(int b, int h, int nh, int T, int i, int kt)
{
	return (((size_t)b * nh + h) * ((size_t)T * (T + 1) / 2) + (size_t)i * (i + 1) / 2 + kt) *
	       FA_DS_TILE;
}

// key row key, query column q inside a tile
static __device__ __forceinline__ int fa_ds_at(int key, int q)
{
	return key * 64 + ((((q >> 3) ^ (key & 7))) << 3) + (q & 7);
}

// a dk/dv sub-step's P^T and dS^T = P^T o (dP^T - D) in place of S^T (s) and dP^T (dp): this
// lane's keys r0, r1 by the sub-step's FA_SUB queries (their lse, D, document starts and indices
// in the stage's lsl, Dl, dsl, qil); msk: some key may be masked (after its query, or before the
// query's document)
static __device__ __forceinline__ void fa_dst(float (*s)[4], float (*dp)[4], int sub, bool msk,
					      int r0, int r1, int tq, float sl2, const float *lsl,
					      const float *Dl, const int *dsl, const int *qil)
{
#pragma unroll
	for (int n = 0; n < FA_SUB / 8; n++) {
#pragma unroll
		for (int e = 0; e < 4; e++) {
			const int key = e < 2 ? r0 : r1;
			const int qc = sub * FA_SUB + n * 8 + tq * 2 + (e & 1), q = qil[qc];
			float p = fexp2(fmaf(s[n][e], sl2, -(lsl[qc] * LOG2E)));

			if (msk && (q < key || key < dsl[qc]))
				p = 0.f;
			s[n][e] = p;
			dp[n][e] = p * (dp[n][e] - Dl[qc]);
		}
	}
}

// One query tile of the dk/dv kernel on warpgroup products (the default; SHARDLM_FA_BWD_PIPE=0
// runs the sub-steps one after the other): two sub-steps of FA_SUB queries, the second's S^T
// and dP^T issued with the first's dV and dK products and its P^T and dS^T made while those run
// (a skipped first sub-step adds zeros: the control flow stays the same for every warp of the
// group, so ptxas keeps the products asynchronous).  The same sums as the unpipelined steps, in
// the same order.
//
// FQ (the fused dq, fa_bwd_fused): dQ too, from the same dS: each sub-step's dS^T goes to shared
// memory (dsb: two K-major tiles of FA_SUB query rows by the block's FA_BM keys, one a sub-step)
// and dQ^T (head_dim x FA_SUB) = K^T dS^T runs beside dV and dK (A: the key tile read MN-major,
// a 64-row half of head_dim a product); the block's partial dQ^T is added into dqt (fp32,
// (head_dim, Lp) at the tile's first query, scale not applied) by vector reductions.  The other
// blocks add into the same sums in no fixed order: not deterministic.
//
// F2 (k_fa_dkdv_ws, the two-warpgroup fused dq): the block's 128 keys are two warpgroups' 64 each
// (wg picks the key rows of ks and vs, not columns: HO is HD); each sub-step's dS^T goes to the
// warpgroup's panel of dsb (query rows, its 64 keys; zeros for a skipped sub-step), from which the
// kernel makes dQ^T.
//
// GS (the dS path, fa_bwd_ds): each computed sub-step's dS^T also goes to global memory, to the
// tile at dsg (fa_ds_tile's layout: the block's 64 keys by the tile's 64 queries, the same bf16
// rounding as da) for k_fa_dq_ds; a skipped sub-step (all its queries padding) writes nothing.
template <int HD, int HO, bool FQ = false, bool F2 = false, bool GS = false>
static __device__ __forceinline__ void
fa_dkdv_tile_wg(float (*dk)[4], float (*dv)[4], const bf16 *ks, const bf16 *vs, const bf16 *qt,
		const bf16 *gt, int j0, int wk, int r0, int r1, int tq, int wg, float sl2,
		const float *lsl, const float *Dl, const int *dsl, const int *qil, bool mskall,
		bf16 *dsb = nullptr, float *dqt = nullptr, int Lp = 0, bf16 *dsg = nullptr)
{
	static_assert(FA_BN == 2 * FA_SUB, "fa_dkdv_tile_wg: two sub-steps a tile");
	static_assert(!FQ || (HO == HD && HD % 64 == 0 && HD <= 128 && FA_BM == 64),
		      "fa_dkdv_tile_wg: the fused dq needs one warpgroup over head_dim 64 or 128");
	static_assert(!F2 || (!FQ && HO == HD && FA_BM == 64),
		      "fa_dkdv_tile_wg: F2 is two warpgroups of 64 keys, each over all columns");
	constexpr int KR = F2 ? 2 * FA_BM : FA_BM;	// rows of the key and value tiles
	const int kr0 = F2 ? wg * FA_BM : 0, cw = F2 ? 0 : wg;	// this warpgroup's keys, columns
	uint32_t pa[FA_SUB / 16][4], da[FA_SUB / 16][4];
	float s[FA_SUB / 8][4], dp[FA_SUB / 8][4];
	float dq[FQ ? HD / 64 : 1][FA_SUB / 2];	// dQ^T: rows 64 p + this lane's, FA_SUB queries
	const int kl0 = r0 - j0;		// this lane's first key in the block (its second: + 8)
	bool go[2], msk[2];

#pragma unroll
	for (int sb = 0; sb < 2; sb++) {
		const int qa = qil[sb * FA_SUB], qz = qil[sb * FA_SUB + FA_SUB - 1];

		// all queries padding, or (the last one real, so the latest) every query before
		// every key of the block
		go[sb] = !(qa < 0 || (qz >= 0 && qz < j0));
		msk[sb] = mskall || qa < wk + 15 || qz < 0;
	}
	auto sdp = [&](int sb) {	// S^T and dP^T (the first k-step writes them: acc 0)
		wg_fence();
#pragma unroll
		for (int kk = 0; kk < HD / 16; kk++) {
			wgmma_ss32(&s[0][0], desc_k<KR>(ks, kr0, kk),
				   desc_k<FA_BN>(qt, sb * FA_SUB, kk), kk > 0);
			wgmma_ss32(&dp[0][0], desc_k<KR>(vs, kr0, kk),
				   desc_k<FA_BN>(gt, sb * FA_SUB, kk), kk > 0);
		}
		wg_commit();
	};
	auto dvdk = [&](int sb) {	// dV += P^T dO, dK += dS^T Q over the warpgroup's columns
		wg_fence();
#pragma unroll
		for (int kk = 0; kk < FA_SUB / 16; kk++) {
			// the warpgroup's columns [cw HO, (cw + 1) HO): panels of 64
			const int r = sb * FA_SUB + kk * 16, c = cw * (HO / 64) * FA_BN * 64;

			wgmma_rs_mn<HO, FA_BN>(&dv[0][0], pa[kk], gt + c, r);
			wgmma_rs_mn<HO, FA_BN>(&dk[0][0], da[kk], qt + c, r);
		}
		wg_commit();
	};
	auto pack = [&]() {
#pragma unroll
		for (int kk = 0; kk < FA_SUB / 16; kk++) {
			acc_to_a(pa[kk], s[2 * kk], s[2 * kk + 1]);
			acc_to_a(da[kk], dp[2 * kk], dp[2 * kk + 1]);
		}
	};
	// FQ: sub-step sb's dS^T (in dp) into its tile: query row q, key column (chunk key / 8 at
	// chunk (key / 8) ^ (q % 8), wgmma.cuh's swizzle); the same bf16 rounding as da
	// (F2: the warpgroup's 64-row panel, rows sb FA_SUB on: the same addresses one panel on)
	auto st_ds = [&](int sb) {
		bf16 *t = dsb + (F2 ? wg * FA_BN * 64 : 0) + sb * FA_SUB * FA_BM;
#pragma unroll
		for (int n = 0; n < FA_SUB / 8; n++)
#pragma unroll
			for (int e = 0; e < 4; e++) {
				const int key = kl0 + (e >> 1) * 8, q = n * 8 + tq * 2 + (e & 1);

				t[q * 64 + (((key >> 3) ^ (q & 7)) << 3) + (key & 7)] =
					__float2bfloat16_rn(dp[n][e]);
			}
	};
	// GS: a sub-step's dS^T to the global tile from its A fragments (d, as pack() leaves da:
	// d[kk][2 i + h] holds this lane's pair of key row kl0 + 8 h, queries 8 (2 kk + i) + 2 tq),
	// 16 bytes a store: lane tq of the quad holds the pairs 8 n + 2 tq (n < 4) of a key row's 32
	// queries; a 4 x 4 transpose across the quad (three exchanges) gives it the 8 queries 8 tq..
	// (one chunk; the quad's four fill half of the row's 128 bytes).  The stores wait until the
	// tile's last products are issued: the next wgmma.fence waits for them to complete, and
	// right before the next sub-step's products that cost a round trip to L2 each time (the
	// dk/dv kernel 0.2 ms slower at 4 x 2048, 0.5 at 2 x 4096).
	static_assert(FA_SUB == 32, "fa_dkdv_tile_wg: the dS^T stores transpose 4 x 4 pairs");
	auto st_g = [&](int sb, const uint32_t (*d)[4]) {
#pragma unroll
		for (int h = 0; h < 2; h++) {
			uint32_t v[4], w[4];

#pragma unroll
			for (int n = 0; n < 4; n++)
				v[n] = w[n] = d[n >> 1][2 * (n & 1) + h];
#pragma unroll
			for (int k = 1; k < 4; k++) {
				const int o = tq ^ k;	// the partner; it holds my chunk's pair o
				const uint32_t send = o == 0 ? v[0] : o == 1 ? v[1] : o == 2 ? v[2] : v[3];
				const uint32_t got = __shfl_xor_sync(0xffffffffu, send, k);

#pragma unroll
				for (int j = 0; j < 4; j++)
					if (j == o)
						w[j] = got;
			}
			*(uint4 *)(dsg + fa_ds_at(kl0 + 8 * h, sb * FA_SUB + 8 * tq)) =
				make_uint4(w[0], w[1], w[2], w[3]);
		}
	};
	uint32_t ds0[GS ? FA_SUB / 16 : 1][4];	// GS: sub-step 0's da, kept for st_g
	// F2: a skipped sub-step's rows of the panel, zeros (dp zeroed)
	auto st_zeros = [&](int sb) {
#pragma unroll
		for (int n = 0; n < FA_SUB / 8; n++)
#pragma unroll
			for (int e = 0; e < 4; e++)
				dp[n][e] = 0.f;
		st_ds(sb);
	};
	// every thread's dS^T stores reach the warpgroup's products (the block is one warpgroup)
	auto ds_ready = [&]() {
		fence_async_smem();
		__syncthreads();
	};
	auto dqp = [&](int sb) {	// dQ^T = K^T dS^T (acc 0 on the first k-step)
		wg_fence();
#pragma unroll
		for (int kk = 0; kk < FA_BM / 16; kk++)
#pragma unroll
			for (int p = 0; p < HD / 64; p++)
				wgmma_ss32<1, 0>(dq[p], desc_mn<FA_BM>(ks + p * FA_BM * 64, 16 * kk),
						 desc_k<FA_SUB>(dsb + sb * FA_SUB * FA_BM, 0, kk),
						 kk > 0);
		wg_commit();
	};
	auto pin_dq = [&]() {
#pragma unroll
		for (int p = 0; p < HD / 64; p++)
			wg_pin<FA_SUB / 2>(dq[p]);
	};
	// dq[p][4 n + 2 h + i]: row 64 p + kl0 + 8 h of dQ^T, query sb FA_SUB + 8 n + 2 tq + i
	auto red = [&](int sb) {
#pragma unroll
		for (int p = 0; p < HD / 64; p++)
#pragma unroll
			for (int n = 0; n < FA_SUB / 8; n++)
#pragma unroll
				for (int h = 0; h < 2; h++)
					red_add2(dqt + (size_t)(64 * p + kl0 + 8 * h) * Lp +
							 sb * FA_SUB + n * 8 + tq * 2,
						 dq[p][4 * n + 2 * h], dq[p][4 * n + 2 * h + 1]);
	};

	if (go[0]) {
		sdp(0);
		wg_wait0();
		wg_pin<FA_SUB / 2>(&s[0][0]);
		wg_pin<FA_SUB / 2>(&dp[0][0]);
		fa_dst(s, dp, 0, msk[0], r0, r1, tq, sl2, lsl, Dl, dsl, qil);
		pack();
		if constexpr (FQ || F2)
			st_ds(0);
		if constexpr (GS)
#pragma unroll
			for (int kk = 0; kk < FA_SUB / 16; kk++)
#pragma unroll
				for (int e = 0; e < 4; e++)
					ds0[kk][e] = da[kk][e];
	} else {
#pragma unroll
		for (int kk = 0; kk < FA_SUB / 16; kk++)
#pragma unroll
			for (int e = 0; e < 4; e++)
				pa[kk][e] = da[kk][e] = 0u;
		if constexpr (F2)	// the kernel's dQ^T reads every row of the panel
			st_zeros(0);
	}
	if (go[1]) {
		// FQ: a skipped first sub-step's dQ^T reads whatever its tile holds and is dropped
		// (not added): the products stay the same for every warp, as with dV and dK
		if constexpr (FQ)
			ds_ready();
		sdp(1);
		dvdk(0);
		if constexpr (FQ) {
			dqp(0);
			wg_wait2();	// S^T, dP^T; sub-step 0's dV, dK and dQ^T may still run
		} else {
			wg_wait1();	// S^T, dP^T; sub-step 0's dV, dK may still run
		}
		wg_pin<FA_SUB / 2>(&s[0][0]);
		wg_pin<FA_SUB / 2>(&dp[0][0]);
		fa_dst(s, dp, 1, msk[1], r0, r1, tq, sl2, lsl, Dl, dsl, qil);
		if constexpr (FQ || F2)
			st_ds(1);
		wg_wait0();
		wg_pin<HO / 2>(&dv[0][0]);
		wg_pin<HO / 2>(&dk[0][0]);
		if constexpr (FQ) {
			pin_dq();
			if (go[0])
				red(0);
		}
		pack();
		if constexpr (FQ)
			ds_ready();
		dvdk(1);
		if constexpr (FQ)
			dqp(1);
		if constexpr (GS) {	// (da is only read while dvdk(1) runs)
			if (go[0])
				st_g(0, ds0);
			st_g(1, da);
		}
		wg_wait0();
		wg_pin<HO / 2>(&dv[0][0]);
		wg_pin<HO / 2>(&dk[0][0]);
		if constexpr (FQ) {
			pin_dq();
			red(1);
		}
	} else if (go[0]) {
		if constexpr (F2)	// sub-step 1 skipped (dp is sub-step 0's, packed already)
			st_zeros(1);
		if constexpr (FQ)
			ds_ready();
		dvdk(0);
		if constexpr (FQ)
			dqp(0);
		if constexpr (GS)
			st_g(0, da);
		wg_wait0();
		wg_pin<HO / 2>(&dv[0][0]);
		wg_pin<HO / 2>(&dk[0][0]);
		if constexpr (FQ) {
			pin_dq();
			red(0);
		}
	} else if constexpr (F2) {	// both skipped
		st_zeros(1);
	}
}

// dk/dv: a block's 64 keys (and values) sit in shared memory for the whole kernel; query tiles of
// each query head of the kv group stream through, in a fixed order (heads ascending, queries
// ascending).  Per step a warp's 16 keys give S^T = K Q^T and dP^T = V dO^T (A from K, V; B from
// Q, dO untransposed), then dV += P^T dO and dK += dS^T Q (B transposed by ldmatrix).  Context
// parallel: the keys are whole rows' (dk, dv into dkv), the queries the rank's own.
//
// FQ (whole rows, the warpgroup kernels pipelined, head_dim 64 or 128): dQ as well, summed into
// dqa (fp32, (B nh HD, Lp): dQ^T per record and head, unscaled) by every key block (see
// fa_dkdv_tile_wg); no dq kernel.
//
// GS (whole rows, the pipelined warpgroup tiles, head_dim 64 or 128): every tile's dS^T to dsg
// as well (fa_ds_tile), for k_fa_dq_ds; no dq kernel.  GS 1: the threads store it; 2: they
// write it to a tile in shared memory, and thread 0 has the copy engine store that (one bulk
// copy of 8 KB a tile; SHARDLM_FA_DS_BULK=1).
template <int HD, bool CP, bool WG, bool FQ = false, int GS = 0>
__global__ void __launch_bounds__(fa_cfg<HD, WG>::KNT, fa_cfg<HD, WG>::KMINB)
k_fa_dkdv(bf16 *dqkv, bf16 *dkv, const bf16 *dout, const float *lse, const float *D,
	  const bf16 *qkv, const int *lens, const int *pos, int L, int nh, int nkv, float sl2,
	  float scale, fa_rows x, bool pipe, float *dqa, int Lp, bf16 *dsg = nullptr)
{
	// the block's keys and values, then two stages of query and dout tiles (WG: all swizzled);
	// FQ: the two dS^T tiles
	using C = fa_cfg<HD, WG>;
	constexpr int NT = C::KNT, HO = C::HO;
	constexpr int BK = FA_BM;	// the block's keys
	static_assert(!FQ || (WG && !CP), "k_fa_dkdv: the fused dq is for whole rows, warpgroups");
	static_assert(!GS || (WG && !CP && !FQ && HD <= 128),
		      "k_fa_dkdv: the dS path is for whole rows, one warpgroup a block");
	const int P = HD + 8, TILE = WG ? FA_BN * HD : FA_BN * P, KT = WG ? BK * HD : BK * P;
	FA_SMEM;
	bf16 *ks = WG ? sw_base(fa_sm) : fa_sm, *vs = ks + KT, *qs = vs + KT, *gs = qs + 2 * TILE;
	bf16 *dsb = gs + 2 * TILE;
	float *lss = (float *)(dsb + (FQ ? 2 * FA_SUB * FA_BM : 0));
	float *Ds = lss + 2 * FA_BN;
	int *dss = (int *)(Ds + 2 * FA_BN);	// (2, FA_BN) the queries' document starts
	int *qis = dss + 2 * FA_BN;		// (2, FA_BN) the queries' indices (-1: padding)
	bf16 *dstage = (bf16 *)(qis + 2 * FA_BN);	// GS 2: the tile's dS^T for the bulk copy
	int b, kv, j0;

	fa_kv_block(BK, b, kv, j0);	// (the heaviest blocks first)
	const int W = (nh + 2 * nkv) * HD, OW = nh * HD;
	const int Lq = CP ? x.Lq : L, KS = CP ? 2 * nkv * HD : W;
	// warp: of the warpgroup (its 16 keys); wg: the warpgroup (BIG: its half of the columns)
	const int grp = nh / nkv, warp = (threadIdx.x >> 5) & 3;
	const int wg = threadIdx.x >> 7;
	const int lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3, len = lens[b];
	const bf16 *base = qkv + (size_t)b * Lq * W, *gbase = dout + (size_t)b * Lq * OW;
	const bf16 *kvb = CP ? x.kv + (size_t)b * L * KS : base;
	const int wk = j0 + warp * 16, r0 = wk + g, r1 = r0 + 8;
	const int qs0 = CP ? (j0 < len ? fa_first_row(x, b, j0) : Lq) : j0;
	const int ntq = fa_kv_ntq<CP>(x, pos, b, L, len, j0, BK, qs0), nt = grp * ntq;
	const uint32_t ob = off_b<P>(lane), obt = off_bt<P>(lane);
	const uint32_t ka = smem_u32(ks + warp * 16 * P) + off_a<P>(lane);
	const uint32_t va = smem_u32(vs + warp * 16 * P) + off_a<P>(lane);
	float dk[HO / 8][4], dv[HO / 8][4];

	// issue the loads of step t (query head, query tile) into stage t & 1.  The queries' lse and
	// D too by cp.async (zeros for padding), in flight with the tiles: loaded into registers
	// here, they held warps 0 and 1 for a round trip to memory at every tile (lse is scaled by
	// log2 e where fa_dst reads it)
	auto issue = [&](int t) {
		const int h = kv * grp + t / ntq, i0 = qs0 + (t % ntq) * FA_BN, st = t & 1;

		fa_tile<HD, FA_BN, WG, NT>(qs + st * TILE, base + (size_t)h * HD, W, i0, Lq);
		fa_tile<HD, FA_BN, WG, NT>(gs + st * TILE, gbase + (size_t)h * HD, OW, i0, Lq);
		for (int e = threadIdx.x; e < FA_BN; e += FA_THR) {
			const size_t tr = ((size_t)b * Lq + i0 + e) * nh + h;
			const int i = fa_qidx<CP>(x, b, len, i0 + e);

			cp_async4(smem_u32(lss + st * FA_BN + e), i >= 0 ? lse + tr : lse, i >= 0);
			cp_async4(smem_u32(Ds + st * FA_BN + e), i >= 0 ? D + tr : D, i >= 0);
			dss[st * FA_BN + e] = i >= 0 ? fa_qdoc<CP>(x, pos, b, L, i0 + e, i) : 0;
			qis[st * FA_BN + e] = i;
		}
	};

	if (nt > 0) {
		fa_tile<HD, BK, WG, NT>(ks, kvb + (size_t)((CP ? 0 : nh) + kv) * HD, KS, j0, len);
		fa_tile<HD, BK, WG, NT>(vs, kvb + (size_t)((CP ? 0 : nh) + nkv + kv) * HD, KS, j0,
					len);
		issue(0);
	}
	cp_commit();
#pragma unroll
	for (int n = 0; n < HO / 8; n++)
		for (int e = 0; e < 4; e++)
			dk[n][e] = dv[n][e] = 0.f;
	for (int t = 0; t < nt; t++) {
		const int st = t & 1;

		if (t + 1 < nt)
			issue(t + 1);
		cp_commit();
		cp_wait1();
		if (WG)
			fence_async_smem();
		if constexpr (GS == 2)	// the last tile's bulk copy has read the stage
			if (threadIdx.x == 0)
				bulk_wait0<true>();
		__syncthreads();
		const bf16 *qt = qs + st * TILE, *gt = gs + st * TILE;
		const uint32_t qb = smem_u32(qt), gb = smem_u32(gt);
		const float *lsl = lss + st * FA_BN, *Dl = Ds + st * FA_BN;
		const int *dsl = dss + st * FA_BN, *qil = qis + st * FA_BN;

		if constexpr (FQ) {
			const int h = kv * grp + t / ntq, i0 = qs0 + (t % ntq) * FA_BN;

			fa_dkdv_tile_wg<HD, HO, true>(dk, dv, ks, vs, qt, gt, j0, wk, r0, r1, tq, wg,
						      sl2, lsl, Dl, dsl, qil, pos != nullptr, dsb,
						      dqa + ((size_t)b * nh + h) * HD * Lp + i0, Lp);
		} else if constexpr (GS) {	// (query tile i0 / 64, key tile j0 / 64)
			const int h = kv * grp + t / ntq, i0 = qs0 + (t % ntq) * FA_BN;
			bf16 *dt = dsg + fa_ds_tile(b, h, nh, (L + 63) / 64, i0 / 64, j0 / 64);

			fa_dkdv_tile_wg<HD, HO, false, false, true>(
				dk, dv, ks, vs, qt, gt, j0, wk, r0, r1, tq, wg, sl2, lsl, Dl, dsl, qil,
				pos != nullptr, nullptr, nullptr, 0, GS == 2 ? dstage : dt);
			if constexpr (GS == 2) {
				fence_async_smem();
				__syncthreads();
				if (threadIdx.x == 0) {
					bulk_store(dt, smem_u32(dstage), FA_DS_TILE * sizeof(bf16));
					bulk_commit();
				}
				continue;
			}
		} else if constexpr (WG) {
			if (pipe)
				fa_dkdv_tile_wg<HD, HO>(dk, dv, ks, vs, qt, gt, j0, wk, r0, r1, tq, wg,
							sl2, lsl, Dl, dsl, qil, CP || pos);
		}
		// every thread done with the stage the next tile's loads take
		if (FQ || GS || (WG && pipe)) {
			__syncthreads();
			continue;
		}
		if constexpr (!FQ && !GS)	// (the fused dq's and dS path's never get here)
#pragma unroll
		for (int sub = 0; sub < FA_BN / FA_SUB; sub++) {
			const int qa = qil[sub * FA_SUB], qz = qil[sub * FA_SUB + FA_SUB - 1];
			float s[FA_SUB / 8][4], dp[FA_SUB / 8][4];

			// all queries padding, or (the last one real, so the latest) every query
			// before every key of this warp (of the block: the warpgroup's products)
			if (qa < 0 || (qz >= 0 && qz < (WG ? j0 : wk)))
				continue;
			if constexpr (WG) {	// the first k-step writes S^T and dP^T (acc 0)
				wg_fence();
#pragma unroll
				for (int kk = 0; kk < HD / 16; kk++) {
					wgmma_ss32(&s[0][0], desc_k<FA_BM>(ks, 0, kk),
						   desc_k<FA_BN>(qt, sub * FA_SUB, kk), kk > 0);
					wgmma_ss32(&dp[0][0], desc_k<FA_BM>(vs, 0, kk),
						   desc_k<FA_BN>(gt, sub * FA_SUB, kk), kk > 0);
				}
				wg_commit();
				wg_wait0();
			} else {
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
						const uint32_t o =
							((sub * FA_SUB + np * 16) * P + kk * 16) * 2;
						uint32_t bq[4], bg[4];

						ldsm4(bq, qb + ob + o);
						ldsm4(bg, gb + ob + o);
						mma16816(s[2 * np], ak, bq);
						mma16816(s[2 * np + 1], ak, bq + 2);
						mma16816(dp[2 * np], av, bg);
						mma16816(dp[2 * np + 1], av, bg + 2);
					}
				}
			}
			fa_dst(s, dp, sub, CP || pos || qa < wk + 15 || qz < 0, r0, r1, tq, sl2, lsl,
			       Dl, dsl, qil);
			if constexpr (WG) {
				uint32_t pa[FA_SUB / 16][4], da[FA_SUB / 16][4];

#pragma unroll
				for (int kk = 0; kk < FA_SUB / 16; kk++) {
					acc_to_a(pa[kk], s[2 * kk], s[2 * kk + 1]);
					acc_to_a(da[kk], dp[2 * kk], dp[2 * kk + 1]);
				}
				wg_fence();
#pragma unroll
				for (int kk = 0; kk < FA_SUB / 16; kk++) {
					// the warpgroup's columns [wg HO, (wg + 1) HO): panels of 64
					const int r = sub * FA_SUB + kk * 16, c = wg * (HO / 64) * FA_BN * 64;

					wgmma_rs_mn<HO, FA_BN>(&dv[0][0], pa[kk], gt + c, r);
					wgmma_rs_mn<HO, FA_BN>(&dk[0][0], da[kk], qt + c, r);
				}
				wg_commit();
				wg_wait0();
			} else {
#pragma unroll
				for (int kk = 0; kk < FA_SUB / 16; kk++) {
					uint32_t pa[4], da[4];

					acc_to_a(pa, s[2 * kk], s[2 * kk + 1]);
					acc_to_a(da, dp[2 * kk], dp[2 * kk + 1]);
#pragma unroll
					for (int np = 0; np < HD / 16; np++) {
						const uint32_t o =
							((sub * FA_SUB + kk * 16) * P + np * 16) * 2;
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
		}
		__syncthreads();
	}
	if constexpr (GS == 2)	// (the stage stays until its copy has read it)
		if (threadIdx.x == 0)
			bulk_wait0<false>();
	fa_kv_store<HO>((CP ? dkv + (size_t)b * L * KS + (size_t)kv * HD :
			      dqkv + (size_t)b * L * W + (size_t)(nh + kv) * HD) + wg * HO,
			CP ? KS : W, (size_t)nkv * HD, dk, dv, r0, r1, len, L, tq, scale);
}

// The fused dq on two warpgroups of 64 keys, warp-specialized (head_dim 128, whole rows;
// SHARDLM_FA_BWD_DQ=wg2).  A block's 128 keys and values sit in shared memory; warpgroup 2 is the
// loader (few registers: setmaxnreg gives the rest to the other two): it copies the keys and
// values, then each query tile (query head of the kv group, 64 queries) with its dO, lse, D,
// document starts and indices into a ring of FA_WS_ST stages, a stage's mbarrier full[s]
// completing when they have landed and empty[s] when both multiplier warpgroups are done with it.
// Warpgroup w (0, 1) makes S^T, dP^T, dV and dK for keys [64 w, 64 w + 64) (fa_dkdv_tile_wg, F2)
// and puts its dS^T into its panel of the tile's dsb slot (two slots, by tile parity: dsf[slot]
// completes when both panels are written).  dQ^T of a tile, rows [64 w, 64 w + 64) of head_dim
// over all 128 keys (m64 n64 k16: A the key tile's panel w read MN-major, B the slot's panels),
// is made at the start of the next tile (its accumulators are dead before S^T and dP^T live; made
// beside them, 48-108 bytes spilled at 232-240 registers; here ptxas spills 8) and added into dqa (fp32, (B nh HD, Lp), unscaled) by vector
// reductions.  The two warpgroups wait for each other only there, a tile apart.  On an H100 at
// 4 x 2048 (32/8 heads) it runs the backward in 1.41-1.44 ms, against 1.48-1.50 for the
// twenty-eighth session's form (block-wide barriers three times a tile) and 1.18-1.21 for the
// default dq and dk/dv kernels (bench/RESULTS.md, twenty-ninth session, with the forms tried
// since).  Not deterministic (the reductions' order).
template <int HD>
__global__ void __launch_bounds__(3 * FA_THR, 1)
k_fa_dkdv_ws(bf16 *dqkv, const bf16 *dout, const float *lse, const float *D, const bf16 *qkv,
	     const int *lens, const int *pos, int L, int nh, int nkv, float sl2, float scale,
	     fa_rows x, float *dqa, int Lp)
{
	static_assert(HD == 128 && FA_BM == 64 && FA_BN == 64, "k_fa_dkdv_ws: head_dim 128");
	constexpr int BK = 2 * FA_BM, ST = FA_WS_ST, TILE = FA_BN * HD, KT = BK * HD;
	constexpr int PANELS = 2 * FA_BN * FA_BM;	// a dsb slot: two 64 x 64 panels
	FA_SMEM;
	bf16 *ks = sw_base(fa_sm), *vs = ks + KT, *qs = vs + KT, *gs = qs + ST * TILE;
	bf16 *dsb = gs + ST * TILE;
	float *lss = (float *)(dsb + 2 * PANELS), *Ds = lss + ST * FA_BN;
	int *dss = (int *)(Ds + ST * FA_BN), *qis = dss + ST * FA_BN;
	uint64_t *full = (uint64_t *)(qis + ST * FA_BN), *empty = full + ST, *dsf = empty + ST;
	uint64_t *kvf = dsf + 2;
	int b, kv, j0;

	fa_kv_block(BK, b, kv, j0);	// (the heaviest blocks first)
	const int W = (nh + 2 * nkv) * HD, OW = nh * HD, grp = nh / nkv, len = lens[b];
	const bf16 *base = qkv + (size_t)b * L * W, *gbase = dout + (size_t)b * L * OW;
	const int ntq = fa_kv_ntq<false>(x, pos, b, L, len, j0, BK, j0), nt = grp * ntq;

	if (threadIdx.x == 0) {
		for (int s = 0; s < ST; s++) {
			mbar_init(&full[s], FA_THR + FA_BN);	// the loaders' copies, 64 stores
			mbar_init(&empty[s], 2 * FA_THR);
		}
		for (int s = 0; s < 2; s++)
			mbar_init(&dsf[s], 2 * FA_THR);
		mbar_init(kvf, FA_THR);
	}
	__syncthreads();
	if (threadIdx.x >= 2 * FA_THR) {	// the loader
		wg_regs_dec<40>();
		const int lt = threadIdx.x - 2 * FA_THR;

		if (nt == 0)
			return;
		{
			mm_ld<HD, BK> lk;

			lk.init(lt, W);
			mm_load(lk, smem_u32(ks), base + (size_t)(nh + kv) * HD, j0, len);
			mm_load(lk, smem_u32(vs), base + (size_t)(nh + nkv + kv) * HD, j0, len);
			cp_arrive(kvf);
		}
		mm_ld<HD, FA_BN> lq, lg;

		lq.init(lt, W);
		lg.init(lt, OW);
		for (int t = 0; t < nt; t++) {
			const int st = t % ST, h = kv * grp + t / ntq, i0 = j0 + (t % ntq) * FA_BN;

			if (t >= ST)
				mbar_wait(&empty[st], (t / ST - 1) & 1);
			mm_load(lq, smem_u32(qs + st * TILE), base + (size_t)h * HD, i0, L);
			mm_load(lg, smem_u32(gs + st * TILE), gbase + (size_t)h * HD, i0, L);
			if (lt < FA_BN) {
				const size_t tr = ((size_t)b * L + i0 + lt) * nh + h;
				const int i = fa_qidx<false>(x, b, len, i0 + lt), e = st * FA_BN + lt;

				cp_async4(smem_u32(lss + e), i >= 0 ? lse + tr : lse, i >= 0);
				cp_async4(smem_u32(Ds + e), i >= 0 ? D + tr : D, i >= 0);
				dss[e] = i >= 0 ? fa_qdoc<false>(x, pos, b, L, i0 + lt, i) : 0;
				qis[e] = i;
			}
			cp_arrive(&full[st]);
			if (lt < FA_BN)
				mbar_arrive(&full[st]);
		}
		cp_wait_all();
		return;
	}
	wg_regs_inc<232>();
	const int warp = (threadIdx.x >> 5) & 3, wg = threadIdx.x >> 7, lane = threadIdx.x & 31;
	const int g = lane >> 2, tq = lane & 3;
	const int jw = j0 + wg * FA_BM, wk = jw + warp * 16, r0 = wk + g, r1 = r0 + 8;
	float dk[HD / 8][4], dv[HD / 8][4], dq[8][4];	// dq: dQ^T rows 64 wg + 16 warp + g (+ 8)

#pragma unroll
	for (int n = 0; n < HD / 8; n++)
		for (int e = 0; e < 4; e++)
			dk[n][e] = dv[n][e] = 0.f;
	auto dq_issue = [&](int u) {	// tile u's dQ^T, once both panels are written
		mbar_wait(&dsf[u & 1], (u >> 1) & 1);
		wg_fence();
#pragma unroll
		for (int kk = 0; kk < BK / 16; kk++)
			wgmma_ss64<1, 0>(&dq[0][0], desc_mn<BK>(ks + wg * BK * 64, 16 * kk),
					 desc_k<FA_BN>(dsb + (u & 1) * PANELS, 0, kk), kk > 0);
		wg_commit();
	};
	auto dq_add = [&](int u) {	// (its products done) the sums out
		wg_pin<32>(&dq[0][0]);
		const int h = kv * grp + u / ntq, i0 = j0 + (u % ntq) * FA_BN;
		float *dqt = dqa + (((size_t)b * nh + h) * HD + wg * 64 + warp * 16 + g) * Lp + i0 +
			     tq * 2;

#pragma unroll
		for (int n = 0; n < 8; n++)
#pragma unroll
			for (int hh = 0; hh < 2; hh++)
				red_add2(dqt + (size_t)(8 * hh) * Lp + n * 8, dq[n][2 * hh],
					 dq[n][2 * hh + 1]);
	};

	if (nt > 0) {
		mbar_wait(kvf, 0);
		fence_async_smem();	// the loader's cp.async writes, seen here, reach the products
	}
	for (int t = 0; t < nt; t++) {
		const int st = t % ST;

		mbar_wait(&full[st], (t / ST) & 1);
		fence_async_smem();
		// (dq_issue's wait also frees the slot of tile t - 2 for this tile's panels: both
		// warpgroups have finished tile t - 1, where their dQ^T of tile t - 2 was waited for)
		if (t > 0) {
			dq_issue(t - 1);
			wg_wait0();
			dq_add(t - 1);
		}
		fa_dkdv_tile_wg<HD, HD, false, true>(
			dk, dv, ks, vs, qs + st * TILE, gs + st * TILE, jw, wk, r0, r1, tq, wg, sl2,
			lss + st * FA_BN, Ds + st * FA_BN, dss + st * FA_BN, qis + st * FA_BN,
			pos != nullptr, dsb + (t & 1) * PANELS);
		fence_async_smem();	// this thread's dS^T stores, to the other warpgroup's products
		mbar_arrive(&dsf[t & 1]);
		mbar_arrive(&empty[st]);
	}
	if (nt > 0) {
		dq_issue(nt - 1);
		wg_wait0();
		dq_add(nt - 1);
	}
	fa_kv_store<HD>(dqkv + (size_t)b * L * W + (size_t)(nh + kv) * HD, W, (size_t)nkv * HD, dk,
			dv, r0, r1, len, L, tq, scale);
}

// WG: unpadded rows, and 1 KB to start the tiles on a 1024-byte boundary; BIG: the queries
template <int HD, bool WG> static size_t fa_smem_fwd(void)
{
	using C = fa_cfg<HD, WG>;

	return (size_t)(4 * FA_BN + (C::BIG ? C::BMQ : 0)) * (WG ? HD : HD + 8) * sizeof(bf16) +
	       (WG ? 1024 : 0);
}

// the dq kernel's: two stages of keys and values; BIG: the queries and their dO
template <int HD, bool WG> static size_t fa_smem_dq(void)
{
	using C = fa_cfg<HD, WG>;

	// (the pipelined warpgroup loop, fa_dq_loop_wg: a third stage of key and value tiles)
	return (size_t)((WG && !C::BIG ? 6 : 4) * C::BNQ + (C::BIG ? 2 * C::BMQ : 0)) *
		       (WG ? HD : HD + 8) * sizeof(bf16) + (WG ? 1024 : 0);
}

template <int HD, bool WG, bool FQ = false, int GS = 0> static size_t fa_smem_dkdv(void)
{
	return (size_t)(2 * FA_BM + 4 * FA_BN) * (WG ? HD : HD + 8) * sizeof(bf16) +
	       (FQ ? 2 * FA_SUB * FA_BM * sizeof(bf16) : 0) + 4 * FA_BN * sizeof(float) +
	       4 * FA_BN * sizeof(int) + (GS == 2 ? FA_DS_TILE * sizeof(bf16) : 0) +
	       (WG ? 1024 : 0);
}

// k_fa_dkdv_ws's: keys and values (128 rows each), FA_WS_ST stages of query and dout tiles and
// their lse, D, document starts and indices, two slots of dS^T panels, the mbarriers
template <int HD> static size_t fa_smem_ws(void)
{
	return (size_t)(2 * 2 * FA_BM + 2 * FA_WS_ST * FA_BN) * HD * sizeof(bf16) +
	       2 * 2 * FA_BN * FA_BM * sizeof(bf16) + 4 * FA_WS_ST * FA_BN * 4 +
	       (2 * FA_WS_ST + 3) * sizeof(uint64_t) + 1024;
}

// the fused dq's sums: query rows per record and head, a multiple of the query tiles
static int fa_dq_pitch(int L)
{
	return (L + FA_BN - 1) / FA_BN * FA_BN;
}

// The fused dq's sums into dqkv's query columns: row r of record b, column c = h HD + d gets
// scale dqa[b nhd + c][r] (bf16), through a 32 x 32 tile in shared memory (read along dqa's rows,
// written along dqkv's)
__global__ void __launch_bounds__(256)
k_fa_dq_out(bf16 *dqkv, const float *dqa, int L, int Lp, int W, int nhd, float scale)
{
	__shared__ float t[32][33];
	const int b = blockIdx.z, r0 = blockIdx.x * 32, c0 = blockIdx.y * 32;
	const float *a = dqa + ((size_t)b * nhd + c0) * Lp + r0;

	for (int i = threadIdx.y; i < 32; i += 8)
		t[i][threadIdx.x] = r0 + (int)threadIdx.x < L ? a[(size_t)i * Lp + threadIdx.x] : 0.f;
	__syncthreads();
	for (int i = threadIdx.y; i < 32; i += 8)
		if (r0 + i < L)
			dqkv[((size_t)b * L + r0 + i) * W + c0 + threadIdx.x] =
				__float2bfloat16_rn(t[threadIdx.x][i] * scale);
}

// The dS path's dq (fa_bwd_ds): dQ = scale dS K from the dS^T tiles k_fa_dkdv<GS> wrote, a plain
// matmul over each query tile's key tiles (no scores recomputed).  A block is NHB warpgroups on
// one query tile of NHB query heads of one kv group (the key tiles shared); each warpgroup holds
// its head's 64 x HD dQ.  Key tiles kt0 (the tile of the first query's document start) to the
// tile of the last real query: exactly those k_fa_dkdv visited for this query tile.  Key and dS^T
// tiles stream through FA_DS_ST stages (cp.async); each stage's products are m64 nHD k16 from
// shared memory, dS^T read MN-major (A) and the key tile MN-major (B).  Padding rows get zeros
// (their dS may be whatever a skipped sub-step left: only their own rows read it).
#define FA_DS_ST 3

template <int HD, int NHB> static __host__ __device__ constexpr int fa_ds_stage(void)
{
	return 64 * HD + NHB * FA_DS_TILE;	// elements: the key tile, then the heads' dS^T tiles
}

template <int HD, int NHB>
__global__ void __launch_bounds__(NHB * FA_THR, NHB <= 2 ? 2 : 1)
k_fa_dq_ds(bf16 *dqkv, const bf16 *dsg, const bf16 *qkv, const int *lens, const int *pos, int L,
	   int nh, int nkv, float scale)
{
	static_assert(HD == 64 || HD == 128, "k_fa_dq_ds: head_dim 64 or 128");
	constexpr int NT = NHB * FA_THR, STG = fa_ds_stage<HD, NHB>();
	FA_SMEM;
	bf16 *sm = sw_base(fa_sm);
	const int T = (L + 63) / 64, i = (int)(gridDim.x - 1 - blockIdx.x), b = blockIdx.z;
	const int wg = threadIdx.x >> 7, h = blockIdx.y * NHB + wg, kvh = blockIdx.y * NHB / (nh / nkv);
	const int W = (nh + 2 * nkv) * HD, q0 = i * 64, len = lens[b];
	const int warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3;
	const bf16 *kg = qkv + (size_t)b * L * W + (size_t)(nh + kvh) * HD;
	const bf16 *dsh = dsg + fa_ds_tile(b, h, nh, T, i, 0);
	int kt0 = 0, nt = 0;
	float dq[HD / 8][4];

	if (q0 < len) {
		kt0 = doc_start(pos, b, L, q0) / 64;
		nt = (min(len, q0 + 64) - 1) / 64 - kt0 + 1;
	}
	auto issue = [&](int t) {	// key tile kt0 + t and the heads' dS^T tiles into its stage
		bf16 *st = sm + (t % FA_DS_ST) * STG;
		const bf16 *src = dsh + (size_t)(kt0 + t) * FA_DS_TILE;
		const uint32_t dst = smem_u32(st + 64 * HD + wg * FA_DS_TILE);

		fa_tile<HD, 64, true, NT>(st, kg, W, (kt0 + t) * 64, len);
#pragma unroll
		for (int c = threadIdx.x & 127; c < FA_DS_TILE / 8; c += FA_THR)
			cp_async16(dst + c * 16, src + c * 8, true);
	};

#pragma unroll
	for (int n = 0; n < HD / 8; n++)
		dq[n][0] = dq[n][1] = dq[n][2] = dq[n][3] = 0.f;
	for (int t = 0; t < FA_DS_ST - 1; t++) {
		if (t < nt)
			issue(t);
		cp_commit();
	}
	for (int t = 0; t < nt; t++) {
		cp_wait1();	// (FA_DS_ST 3: stage t landed, t + 1 may be in flight)
		fence_async_smem();
		__syncthreads();	// every warpgroup done with the stage the next loads take
		if (t + FA_DS_ST - 1 < nt)
			issue(t + FA_DS_ST - 1);
		cp_commit();
		const bf16 *st = sm + (t % FA_DS_ST) * STG, *ds = st + 64 * HD + wg * FA_DS_TILE;

		wg_fence();
#pragma unroll
		for (int kk = 0; kk < 4; kk++) {
			if constexpr (HD == 128)
				wgmma_ss128<1, 1>(&dq[0][0], desc_mn<64>(ds, 16 * kk),
						  desc_mn<64>(st, 16 * kk), 1);
			else
				wgmma_ss64<1, 1>(&dq[0][0], desc_mn<64>(ds, 16 * kk),
						 desc_mn<64>(st, 16 * kk), 1);
		}
		wg_commit();
		wg_wait0();
		wg_pin<HD / 2>(&dq[0][0]);
	}
	static_assert(FA_DS_ST == 3, "k_fa_dq_ds: cp_wait1 is for three stages");
#pragma unroll
	for (int half = 0; half < 2; half++) {
		const int row = q0 + warp * 16 + g + 8 * half;
		const bool real = row < len;

		if (row >= L)
			continue;
		bf16 *y = dqkv + ((size_t)b * L + row) * W + (size_t)h * HD;
#pragma unroll
		for (int n = 0; n < HD / 8; n++)
			*(uint32_t *)(y + n * 8 + tq * 2) =
				pack_bf2(real ? dq[n][2 * half] * scale : 0.f,
					 real ? dq[n][2 * half + 1] * scale : 0.f);
	}
}

template <int HD, int NHB> static size_t fa_smem_ds(void)
{
	return (size_t)FA_DS_ST * fa_ds_stage<HD, NHB>() * sizeof(bf16) + 1024;
}

#ifndef SL_EMU	// the launchers: not in the host emulation's build (test/test_fa_emu.cc)
// the warpgroup (wgmma) kernels: built for sm_90a (SL_WGMMA), head_dim 64, 128 or 256, on a device of
// compute capability 9.0; SHARDLM_FA_WGMMA=0 falls back to the mma.sync kernels (make check-gpu
// runs test_cuda_ops and test_cuda_model both ways).
static bool fa_wg(int hd)
{
#ifdef SL_WGMMA
	static int ok = -1;

	if (ok < 0) {
		const char *e = getenv("SHARDLM_FA_WGMMA");

		ok = sl_cuda_sm90() && !(e && !strcmp(e, "0"));
	}
	return ok && (hd == 64 || hd == 128 || hd == 256);
#else
	(void)hd;
	return false;
#endif
}

// an environment switch that is on unless set to "0", read once into *cache (-1: not yet)
static bool fa_env_on(const char *name, int *cache)
{
	if (*cache < 0) {
		const char *e = getenv(name);

		*cache = !(e && !strcmp(e, "0"));
	}
	return *cache;
}

// the pipelined warpgroup forward (k_fa_fwd_pipe) for head_dim 64 and 128 on whole rows, unless
// SHARDLM_FA_PIPE=0 (make check-gpu runs test_cuda_ops and test_cuda_model both ways)
static bool fa_pipe(void)
{
	static int on = -1;

	return fa_env_on("SHARDLM_FA_PIPE", &on);
}

// the dk/dv warpgroup kernel's tiles pipelined (fa_dkdv_tile_wg), unless SHARDLM_FA_BWD_PIPE=0
static bool fa_bwd_pipe(void)
{
	static int on = -1;

	return fa_env_on("SHARDLM_FA_BWD_PIPE", &on);
}

// the dq warpgroup kernel's tiles pipelined (fa_dq_loop_wg), unless SHARDLM_FA_DQ_PIPE=0
static bool fa_dq_pipe(void)
{
	static int on = -1;

	return fa_env_on("SHARDLM_FA_DQ_PIPE", &on);
}

// The fused dq (the dk/dv kernel computes dQ as well and adds it into fp32 sums by atomic
// reductions; no dq kernel: 5 products instead of 7) on whole rows, where the pipelined warpgroup
// dk/dv runs: opt-in (SHARDLM_FA_BWD_DQ, read once: "fused" one warpgroup a block, head_dim 64
// and 128; "wg2" two, head_dim 128 only, other head_dims as without), and never with
// train.deterministic (the sums' order varies from run to run).  0: off, else 1 or 2 warpgroups.
static int fa_bwd_fused(const struct sl_cuda *c, int hd)
{
	static int on = -1;

	if (on < 0) {
		const char *e = getenv("SHARDLM_FA_BWD_DQ");

		on = !e ? 0 : !strcmp(e, "fused") ? 1 : !strcmp(e, "wg2") ? 2 : 0;
	}
	if (!on || c->deterministic || !fa_wg(hd) || !fa_bwd_pipe())
		return 0;
	return on == 2 ? (hd == 128 ? 2 : 0) : (hd == 64 || hd == 128 ? 1 : 0);
}

// The dS path (k_fa_dkdv<GS> writes dS^T, k_fa_dq_ds multiplies it by K: 5 products and no
// atomics, in exchange for a bf16 buffer of B nh T (T + 1) / 2 tiles of 8 KB) on whole rows,
// head_dim 64 and 128, where the pipelined warpgroup dk/dv runs: opt-in (SHARDLM_FA_BWD_DQ=ds);
// deterministic, so also under train.deterministic.
static bool fa_bwd_ds(int hd)
{
	static int on = -1;

	if (on < 0) {
		const char *e = getenv("SHARDLM_FA_BWD_DQ");

		on = e && !strcmp(e, "ds");
	}
	return on && fa_wg(hd) && fa_bwd_pipe() && (hd == 64 || hd == 128);
}

// the dS buffer's bytes
static size_t fa_ds_bytes(int B, int L, int nh)
{
	const size_t T = (size_t)(L + 63) / 64;

	return (size_t)B * nh * (T * (T + 1) / 2) * FA_DS_TILE * sizeof(bf16);
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

// Lq: query rows per record (L, or the context-parallel x.Lq)
template <int HD, bool CP>
static void fa_fwd(struct sl_cuda *c, bf16 *out, float *lse, const bf16 *qkv, const int *lens,
		   const int *pos, int B, int L, int nh, int nkv, float sl2, const fa_rows &x)
{
	static bool done, done_wg;
	const int Lq = CP ? x.Lq : L;

	if (fa_wg(HD)) {
		using C = fa_cfg<HD, true>;
		const size_t sm = fa_smem_fwd<HD, true>();
		const dim3 grid((Lq + C::BMQ - 1) / C::BMQ, nh, B);

		if constexpr (!CP && !C::BIG) {
			static bool done_p;

			if (fa_pipe()) {
				fa_allow(k_fa_fwd_pipe<HD>, sm, &done_p);
				k_fa_fwd_pipe<HD><<<grid, FA_THR, sm, c->stream>>>(out, lse, qkv, lens,
										   pos, L, nh, nkv,
										   sl2);
				CUDA_LAUNCHED();
				return;
			}
		}

		fa_allow(k_fa_fwd<HD, CP, true>, sm, &done_wg);
		k_fa_fwd<HD, CP, true><<<grid, C::NT, sm, c->stream>>>(out, lse, qkv, lens, pos, L,
									nh, nkv, sl2, x);
		CUDA_LAUNCHED();
		return;
	}
	const size_t sm = fa_smem_fwd<HD, false>();

	fa_allow(k_fa_fwd<HD, CP, false>, sm, &done);
	k_fa_fwd<HD, CP, false><<<dim3((Lq + FA_BM - 1) / FA_BM, nh, B), FA_THR, sm, c->stream>>>(
		out, lse, qkv, lens, pos, L, nh, nkv, sl2, x);
	CUDA_LAUNCHED();
}

// dqa: the fused dq's sums (fa_bwd_fused; B nh HD x fa_dq_pitch(L) floats), or NULL; dsg: the
// dS path's buffer (fa_bwd_ds; fa_ds_bytes), or NULL
template <int HD, bool CP, bool WG>
static void fa_bwd_k(struct sl_cuda *c, bf16 *dqkv, bf16 *dkv, const bf16 *dout, const float *lse,
		     const float *D, const bf16 *qkv, const int *lens, const int *pos, int B, int L,
		     int nh, int nkv, float sl2, float scale, const fa_rows &x, float *dqa,
		     bf16 *dsg)
{
	using C = fa_cfg<HD, WG>;
	static bool done_q, done_kv;
	const size_t smq = fa_smem_dq<HD, WG>(), smk = fa_smem_dkdv<HD, WG>();
	const int Lq = CP ? x.Lq : L;

	if constexpr (WG && !CP && HD <= 128) {
		if (dsg) {
			static bool done_g, done_d1, done_d2;
			const int T = (L + 63) / 64;

			static bool done_b;
			static int bulk = -1;

			if (bulk < 0) {	// SHARDLM_FA_DS_BULK=1: the dS^T tiles by bulk copies
				const char *e = getenv("SHARDLM_FA_DS_BULK");

				bulk = e && !strcmp(e, "1");
			}
			if (bulk) {
				const size_t smb = fa_smem_dkdv<HD, true, false, 2>();

				fa_allow(k_fa_dkdv<HD, false, true, false, 2>, smb, &done_b);
				k_fa_dkdv<HD, false, true, false, 2>
					<<<dim3((L + FA_BM - 1) / FA_BM, nkv, B), C::KNT, smb,
					   c->stream>>>(dqkv, dkv, dout, lse, D, qkv, lens, pos, L, nh,
							nkv, sl2, scale, x, true, nullptr, 0, dsg);
			} else {
				fa_allow(k_fa_dkdv<HD, false, true, false, 1>, smk, &done_g);
				k_fa_dkdv<HD, false, true, false, 1>
					<<<dim3((L + FA_BM - 1) / FA_BM, nkv, B), C::KNT, smk,
					   c->stream>>>(dqkv, dkv, dout, lse, D, qkv, lens, pos, L, nh,
							nkv, sl2, scale, x, true, nullptr, 0, dsg);
			}
			CUDA_LAUNCHED();
			static bool done_d4;
			static int nhb = -1;

			if (nhb < 0) {	// heads a block (SHARDLM_FA_DS_NHB: 1, 2 or 4; default 2)
				const char *e = getenv("SHARDLM_FA_DS_NHB");

				nhb = e ? atoi(e) : 2;
			}
			if (nhb == 4 && (nh / nkv) % 4 == 0) {
				fa_allow(k_fa_dq_ds<HD, 4>, fa_smem_ds<HD, 4>(), &done_d4);
				k_fa_dq_ds<HD, 4><<<dim3(T, nh / 4, B), 4 * FA_THR,
						    fa_smem_ds<HD, 4>(), c->stream>>>(
					dqkv, dsg, qkv, lens, pos, L, nh, nkv, scale);
			} else if (nhb >= 2 && (nh / nkv) % 2 == 0) {
				fa_allow(k_fa_dq_ds<HD, 2>, fa_smem_ds<HD, 2>(), &done_d2);
				k_fa_dq_ds<HD, 2><<<dim3(T, nh / 2, B), 2 * FA_THR,
						    fa_smem_ds<HD, 2>(), c->stream>>>(
					dqkv, dsg, qkv, lens, pos, L, nh, nkv, scale);
			} else {
				fa_allow(k_fa_dq_ds<HD, 1>, fa_smem_ds<HD, 1>(), &done_d1);
				k_fa_dq_ds<HD, 1><<<dim3(T, nh, B), FA_THR, fa_smem_ds<HD, 1>(),
						    c->stream>>>(dqkv, dsg, qkv, lens, pos, L, nh,
								 nkv, scale);
			}
			CUDA_LAUNCHED();
			return;
		}
		if (dqa) {
			static bool done_f, done_2;
			const int Lp = fa_dq_pitch(L), mode = fa_bwd_fused(c, HD);

			CUDA_CHECK(cudaMemsetAsync(dqa, 0, (size_t)B * nh * HD * Lp * sizeof(float),
						   c->stream));
			if constexpr (HD == 128) {
				if (mode == 2) {
					const size_t sm2 = fa_smem_ws<HD>();

					fa_allow(k_fa_dkdv_ws<HD>, sm2, &done_2);
					k_fa_dkdv_ws<HD>
						<<<dim3((L + 2 * FA_BM - 1) / (2 * FA_BM), nkv, B),
						   3 * FA_THR, sm2, c->stream>>>(
							dqkv, dout, lse, D, qkv, lens, pos, L, nh,
							nkv, sl2, scale, x, dqa, Lp);
				}
			}
			if (mode == 1) {
				const size_t smf = fa_smem_dkdv<HD, true, true>();

				fa_allow(k_fa_dkdv<HD, false, true, true>, smf, &done_f);
				k_fa_dkdv<HD, false, true, true>
					<<<dim3((L + FA_BM - 1) / FA_BM, nkv, B), C::KNT, smf,
					   c->stream>>>(dqkv, dkv, dout, lse, D, qkv, lens, pos, L, nh,
							nkv, sl2, scale, x, true, dqa, Lp);
			}
			CUDA_LAUNCHED();
			k_fa_dq_out<<<dim3((L + 31) / 32, nh * HD / 32, B), dim3(32, 8), 0,
				      c->stream>>>(dqkv, dqa, L, Lp, (nh + 2 * nkv) * HD, nh * HD,
						   scale);
			CUDA_LAUNCHED();
			return;
		}
	}
	fa_allow(k_fa_dq<HD, CP, WG>, smq, &done_q);
	fa_allow(k_fa_dkdv<HD, CP, WG>, smk, &done_kv);
	k_fa_dq<HD, CP, WG><<<dim3((Lq + C::BMQ - 1) / C::BMQ, nh, B), C::NT, smq, c->stream>>>(
		dqkv, dout, lse, D, qkv, lens, pos, L, nh, nkv, sl2, scale, x, fa_dq_pipe());
	CUDA_LAUNCHED();
	k_fa_dkdv<HD, CP, WG><<<dim3((L + FA_BM - 1) / FA_BM, nkv, B), C::KNT, smk, c->stream>>>(
		dqkv, dkv, dout, lse, D, qkv, lens, pos, L, nh, nkv, sl2, scale, x, fa_bwd_pipe(),
		nullptr, 0, nullptr);
	CUDA_LAUNCHED();
}

// context parallel: dkv (B*L, 2 nkv HD) gets the keys' and values' gradients, dqkv only dq
template <int HD, bool CP>
static void fa_bwd(struct sl_cuda *c, bf16 *dqkv, bf16 *dkv, const bf16 *dout, const float *lse,
		   const float *D, const bf16 *qkv, const int *lens, const int *pos, int B, int L,
		   int nh, int nkv, float sl2, float scale, const fa_rows &x, float *dqa, bf16 *dsg)
{
	if (fa_wg(HD)) {
		fa_bwd_k<HD, CP, true>(c, dqkv, dkv, dout, lse, D, qkv, lens, pos, B, L, nh, nkv, sl2,
				       scale, x, dqa, dsg);
		return;
	}
	fa_bwd_k<HD, CP, false>(c, dqkv, dkv, dout, lse, D, qkv, lens, pos, B, L, nh, nkv, sl2,
				scale, x, nullptr, nullptr);
}

#endif	// SL_EMU

#endif
