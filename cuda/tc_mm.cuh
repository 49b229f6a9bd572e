// tc_mm.cuh: block-wide matrix products on the tensor cores for the chunked gated delta rule
// (gdn_chunk.cuh): C = alpha diag(rs) A diag(sk) B + cb C over operands in shared or global
// memory with any strides (a transpose is a stride), each float or bf16.  mma.sync m16n8k8 with
// tf32 operands (rounded to nearest from fp32; bf16 values are exact) and fp32 sums.
//
// The block's NTH threads share the output in warp tiles, warp w taking tiles w, w + NTH/32, ...:
// 32 x 32 where that still gives every warp a tile, else 16 x 32, else 16 x 16 (by M and N
// alone), each made of 16 x 8 mma tiles whose rows and columns are permuted (mm_warp) so that a
// lane's elements of an operand lie side by side: where the shape is whole tiles, the operands
// k-contiguous or m- (n-) contiguous and aligned and C row-major and aligned, a lane loads them
// as vectors (2 or 4 elements) with 32-bit offsets and stores C as vectors; else element by
// element, masked.  Whether A's columns are scaled (sk) is a template argument too, so a
// function carries only the code its calls run.  Which thread owns an
// output element depends on M and N alone, so calls with the same M and N that accumulate into
// one C need no barrier between them.  Rows and columns past M, N, K are masked (any shape
// works; multiples of 32 and 8 waste nothing).
//
// Device code.  The host side is C: test/gdn_chunk_emu.h runs the kernels on the host, where
// tc_mm's #else branch has each thread sum its own elements of 16 x 16 tiles in order (no
// tensor cores).  The device branch's fragments and epilogue run on the host in
// test/test_tc_frag.cc (TC_MM_FRAG_HOST, the mma emulated from the PTX ISA's fragment layouts,
// exact sums); on the GPU, test_cuda_qwen35 holds tc_mm to a host product, each warp tile,
// layout and operand type.
#ifndef SL_TC_MM_CUH
#define SL_TC_MM_CUH

// an operand: element (i, j) at p[i * rs + j * cs], bf16 when bf
struct mmop {
	const void *p;
	int rs, cs, bf;
};

static __device__ __forceinline__ struct mmop mm_f(const float *p, int rs, int cs)
{
	struct mmop o;

	o.p = p, o.rs = rs, o.cs = cs, o.bf = 0;
	return o;
}

static __device__ __forceinline__ struct mmop mm_b(const bf16 *p, int rs, int cs)
{
	struct mmop o;

	o.p = p, o.rs = rs, o.cs = cs, o.bf = 1;
	return o;
}

static __device__ __forceinline__ float mm_ld(struct mmop o, int i, int j)
{
	size_t x = (size_t)i * o.rs + (size_t)j * o.cs;

	return o.bf ? bf(((const bf16 *)o.p)[x]) : ((const float *)o.p)[x];
}

#if defined(__CUDA_ARCH__) || defined(TC_MM_FRAG_HOST)
#ifdef __CUDA_ARCH__
// to nearest (ties away from zero) at tf32's 10 mantissa bits: the mma ignores the 13 low bits,
// so adding half of their unit is the rounding (what cvt.rna.tf32.f32 compiles to on sm_90,
// less its test for inf and NaN: an inf becomes a NaN, a NaN stays one but for payloads of
// 0x7ffff000 and above, which no product here makes)
static __device__ __forceinline__ unsigned mm_tf32(float x)
{
	return __float_as_uint(x) + 0x1000u;
}

// loads from shared memory by 32-bit address (a generic load of a pointer the compiler cannot
// place costs a 64-bit address and a descriptor): no volatile, no clobber, so the compiler may
// schedule them freely; nothing in a product writes its own operands
static __device__ __forceinline__ unsigned mm_sa(const void *p, int byte)
{
	return (unsigned)__cvta_generic_to_shared(p) + (unsigned)byte;
}

static __device__ __forceinline__ unsigned short mm_lds16(unsigned a)
{
	unsigned short v;

	asm("ld.shared.u16 %0, [%1];" : "=h"(v) : "r"(a));
	return v;
}

static __device__ __forceinline__ unsigned mm_lds32(unsigned a)
{
	unsigned v;

	asm("ld.shared.b32 %0, [%1];" : "=r"(v) : "r"(a));
	return v;
}

static __device__ __forceinline__ uint2 mm_lds64(unsigned a)
{
	uint2 v;

	asm("ld.shared.v2.b32 {%0, %1}, [%2];" : "=r"(v.x), "=r"(v.y) : "r"(a));
	return v;
}

static __device__ __forceinline__ uint4 mm_lds128(unsigned a)
{
	uint4 v;

	asm("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];"
	    : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
	    : "r"(a));
	return v;
}

static __device__ __forceinline__ unsigned mm_bits(float x)
{
	return __float_as_uint(x);
}

static __device__ __forceinline__ float mm_float(unsigned u)
{
	return __uint_as_float(u);
}

static __device__ __forceinline__ bool mm_shared(const void *p)
{
	return __isShared(p);
}

static __device__ __forceinline__ void mm_mma(float *c, const unsigned *a, const unsigned *b)
{
	asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 "
		     "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
		     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
		     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
#endif
// (TC_MM_FRAG_HOST: test/test_tc_frag.cc compiles this branch on the host, giving mm_tf32,
// mm_bits, mm_float, mm_shared (its choice: the loads are the same there) and mm_mma, the last
// a warp's mma emulated from the PTX ISA's fragment layouts, and float2, float4, uint2)

// the bits of V consecutive elements from element x of p (float, or bf16 when BF) in one load,
// as 32-bit words (bf16: two a word, the first in the low half); x and p aligned to V elements.
// SH: p in shared memory (on the host, where the test emulates the fragments, the same loads)
template <bool BF, int V, bool SH>
static __device__ __forceinline__ void mm_raw(const void *p, int x, unsigned *w)
{
#ifdef __CUDA_ARCH__
	if (SH) {
		const unsigned a = mm_sa(p, x * (BF ? 2 : 4)), nb = V * (BF ? 2 : 4);

		if (nb == 2) {
			w[0] = mm_lds16(a);
		} else if (nb == 4) {
			w[0] = mm_lds32(a);
		} else if (nb == 8) {
			uint2 u = mm_lds64(a);

			w[0] = u.x, w[1] = u.y;
		} else {
			uint4 u = mm_lds128(a);

			w[0] = u.x, w[1] = u.y, w[2] = u.z, w[3] = u.w;
		}
		return;
	}
#endif
	if (BF && V == 1) {
		w[0] = ((const unsigned short *)p)[x];
	} else if (BF && V == 2) {
		w[0] = ((const unsigned *)p)[x >> 1];
	} else if (BF && V == 4) {
		uint2 u = ((const uint2 *)p)[x >> 2];

		w[0] = u.x, w[1] = u.y;
	} else if (V == 1) {
		w[0] = mm_bits(((const float *)p)[x]);
	} else if (V == 2) {
		float2 u = ((const float2 *)p)[x >> 1];

		w[0] = mm_bits(u.x), w[1] = mm_bits(u.y);
	} else {
		float4 u = ((const float4 *)p)[x >> 2];

		w[0] = mm_bits(u.x), w[1] = mm_bits(u.y), w[2] = mm_bits(u.z), w[3] = mm_bits(u.w);
	}
}

// V consecutive elements from element x of p as floats (mm_raw's load)
template <bool BF, int V, bool SH>
static __device__ __forceinline__ void mm_ldv(const void *p, int x, float *v)
{
	unsigned w[4];

	mm_raw<BF, V, SH>(p, x, w);
#pragma unroll
	for (int i = 0; i < V; i++)
		v[i] = mm_float(!BF ? w[i] : i & 1 ? w[i >> 1] & 0xffff0000u : w[i >> 1] << 16);
}

// V floats to p (aligned to V)
template <int V>
static __device__ __forceinline__ void mm_stv(float *p, const float *v)
{
	if (V == 2) {
		float2 u;

		u.x = v[0], u.y = v[1];
		*(float2 *)p = u;
	} else {
		float4 u;

		u.x = v[0], u.y = v[1], u.z = v[2], u.w = v[3];
		*(float4 *)p = u;
	}
}

// a value as a tf32 register: a bf16 is its own tf32 (its bits); anything else (a float, or a
// bf16 times a scale) rounded to nearest
template <bool BF>
static __device__ __forceinline__ unsigned mm_reg(float v, bool scaled)
{
	return BF && !scaled ? mm_bits(v) : mm_tf32(v);
}

// The layouts that load with vectors (LA for A, LB for B; 0 = any, element by element):
#define MM_KC 1	// k-contiguous: A's columns (cs 1), B's rows (rs 1)
#define MM_MN 2	// A m-contiguous (rs 1), B n-contiguous (cs 1)

// an operand's elements for a k-step, the operand seen as rows x k (A as it is, B transposed):
// v[x][r] = element (row0 + r, ka + x) at p[row * ls + k * ks].  L = MM_KC: pairs along k (ks
// 1); MM_MN: runs of R along the rows (ls 1); 0: one by one, masked past nr rows and K when CHK.
// SH: p in shared memory
template <bool BF, int R, int L, bool CHK, bool SH>
static __device__ __forceinline__ void mm_frag(const void *p, int ls, int ks, int row0, int nr,
					       int ka, int K, float (&v)[2][R])
{
	if (L == MM_KC) {
#pragma unroll
		for (int r = 0; r < R; r++) {
			float u[2];

			mm_ldv<BF, 2, SH>(p, (row0 + r) * ls + ka, u);
			v[0][r] = u[0], v[1][r] = u[1];
		}
	} else if (L == MM_MN) {
#pragma unroll
		for (int x = 0; x < 2; x++)
			mm_ldv<BF, R, SH>(p, (ka + x) * ks + row0, v[x]);
	} else {
#pragma unroll
		for (int x = 0; x < 2; x++)
#pragma unroll
			for (int r = 0; r < R; r++) {
				if (!CHK || (row0 + r < nr && ka + x < K))
					mm_ldv<BF, 1, SH>(p, (row0 + r) * ls + (ka + x) * ks, &v[x][r]);
				else
					v[x][r] = 0.f;
			}
	}
}

// The fragments are permuted, so that each lane's elements lie side by side.  Within a k-step
// of 8, mma slots t and t + 4 (lane t's) take k0 + 2t and k0 + 2t + 1: a pair.  A's row slots g
// and g + 8 of the warp's tile i are rows mr + 2i and mr + 2i + 1, mr = m0 + 2 TM g: the lane's
// 2 TM rows are a run.  B's column slot g of tile j is column n0 + TN g + j: the lane's TN
// columns are a run.  So an accumulator's column slot s of tile j is column n0 + TN s + j.
// Which thread owns an output element still depends on M and N alone.
// SM: which operands are in shared memory (MM_SH_A: A, MM_SH_AB: both, else neither)
#define MM_SH_A 1
#define MM_SH_AB 2

template <bool ABF, bool BBF, bool SC, int TM, int TN, int LA, int LB, bool CHK, int SM>
static __device__ __forceinline__ void mm_warp(int M, int N, int K, struct mmop A, struct mmop B,
					       const float *sk, int m0, int n0, int g, int t,
					       float (&c)[TM][TN][4])
{
	const int mr = m0 + 2 * TM * g, nc = n0 + TN * g;
	float av[2][2 * TM], bv[2][TN];	// [k - ka][row - mr], [k - ka][column - nc]

	// software-pipelined: a k-step's operands are loaded while the step before multiplies
	// (one step ahead; operands in global memory had every mma wait on its loads)
	mm_frag<ABF, 2 * TM, LA, CHK, SM != 0>(A.p, A.rs, A.cs, mr, M, 2 * t, K, av);
	mm_frag<BBF, TN, LB, CHK, SM == MM_SH_AB>(B.p, B.cs, B.rs, nc, N, 2 * t, K, bv);
#pragma unroll 2
	for (int k0 = 0; k0 < K; k0 += 8) {
		const int ka = k0 + 2 * t;
		unsigned a[TM][4], b[TN][2];

		if (SC) {	// sk given (few callers scale: no scaling code elsewhere)
#pragma unroll
			for (int x = 0; x < 2; x++) {
				float s = !CHK || ka + x < K ? sk[ka + x] : 0.f;

#pragma unroll
				for (int r = 0; r < 2 * TM; r++)
					av[x][r] *= s;
			}
		}
		// a0 (row slot g, k slot t), a1 (g + 8, t), a2 (g, t + 4), a3 (g + 8, t + 4);
		// b0 (k slot t, column slot g), b1 (t + 4, g)
#pragma unroll
		for (int i = 0; i < TM; i++) {
			a[i][0] = mm_reg<ABF>(av[0][2 * i], SC);
			a[i][1] = mm_reg<ABF>(av[0][2 * i + 1], SC);
			a[i][2] = mm_reg<ABF>(av[1][2 * i], SC);
			a[i][3] = mm_reg<ABF>(av[1][2 * i + 1], SC);
		}
#pragma unroll
		for (int j = 0; j < TN; j++) {
			b[j][0] = mm_reg<BBF>(bv[0][j], false);
			b[j][1] = mm_reg<BBF>(bv[1][j], false);
		}
		if (k0 + 8 < K) {	// the next step's operands
			mm_frag<ABF, 2 * TM, LA, CHK, SM != 0>(A.p, A.rs, A.cs, mr, M, ka + 8, K, av);
			mm_frag<BBF, TN, LB, CHK, SM == MM_SH_AB>(B.p, B.cs, B.rs, nc, N, ka + 8, K,
								 bv);
		}
#pragma unroll
		for (int i = 0; i < TM; i++)
#pragma unroll
			for (int j = 0; j < TN; j++)
				mm_mma(c[i][j], a[i], b[j]);
	}
}

// the block's tiles of (16 TM) x (8 TN), and the epilogue: c0 (row slot g, column slot 2t),
// c1 (g, 2t + 1), c2 (g + 8, 2t), c3 (g + 8, 2t + 1) of each 16 x 8, permuted as mm_warp says.
// The unmasked forms (CHK false) store a lane's TN columns of a row as one vector (mm_tiled sends
// them only a row-major, aligned C); the masked one element by element.  (Each form with both
// epilogues was twice the code: the delta rule's gradient kernel ran 135 kB of these functions
// a chunk, more than the SM's instruction cache holds.)
template <bool ABF, bool BBF, bool SC, int TM, int TN, int LA, int LB, bool CHK, int SM>
static __device__ __noinline__ void mm_block(int M, int N, int K, struct mmop A, struct mmop B,
					     const float *sk, const float *rs, float alpha,
					     float cb, float *C, int crs, int ccs)
{
	const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
	const int tn = (N + 8 * TN - 1) / (8 * TN), tiles = (M + 16 * TM - 1) / (16 * TM) * tn;

#ifdef TC_MM_FRAG_HOST
	tc_frag_path(TM, TN, LA, LB, CHK, SM);	// the host test asks which path ran
	tc_frag_store(!CHK);
#endif
	for (int tile = warp; tile < tiles; tile += NTH / 32) {
		int m0 = tile / tn * 16 * TM, n0 = tile % tn * 8 * TN;
		float c[TM][TN][4];

#pragma unroll
		for (int i = 0; i < TM; i++)
#pragma unroll
			for (int j = 0; j < TN; j++)
				c[i][j][0] = c[i][j][1] = c[i][j][2] = c[i][j][3] = 0.f;
		mm_warp<ABF, BBF, SC, TM, TN, LA, LB, CHK, SM>(M, N, K, A, B, sk, m0, n0, g, t, c);
#pragma unroll
		for (int i = 0; i < TM; i++)
#pragma unroll
			for (int x = 0; x < 4; x++) {
				int m = m0 + 2 * TM * g + 2 * i + (x >> 1);
				float r = alpha;

				if (CHK && m >= M)
					continue;
				if (rs)
					r *= rs[m];
				if (!CHK) {	// a lane's TN columns of a row and column slot: a run
					float *o = C + m * crs + n0 + TN * (2 * t + (x & 1));
					float v[TN], u[TN];

#pragma unroll
					for (int j = 0; j < TN; j++)
						v[j] = r * c[i][j][x];
					if (cb != 0.f) {
						mm_ldv<false, TN, false>(o, 0, u);
#pragma unroll
						for (int j = 0; j < TN; j++)
							v[j] += cb * u[j];
					}
					mm_stv<TN>(o, v);
				} else {
#pragma unroll
					for (int j = 0; j < TN; j++) {
						int n = n0 + TN * (2 * t + (x & 1)) + j;
						float *o, v;

						if (n >= N)
							continue;
						o = C + m * crs + n * ccs;
						v = r * c[i][j][x];
						if (cb != 0.f)
							v += cb * *o;
						*o = v;
					}
				}
			}
	}
}

// A's layout for loads of 2 (k-contiguous) or 2 TM (m-contiguous) elements; 0: neither
template <int TM>
static __device__ __forceinline__ int mm_lay_a(struct mmop A, int esz)
{
	unsigned long long p = (unsigned long long)A.p;

	if (A.cs == 1 && A.rs % 2 == 0 && p % (2 * esz) == 0)
		return MM_KC;
	if (A.rs == 1 && A.cs % (2 * TM) == 0 && p % (2 * TM * esz) == 0)
		return MM_MN;
	return 0;
}

// B's layout for loads of 2 (k-contiguous) or TN (n-contiguous) elements; 0: neither
template <int TN>
static __device__ __forceinline__ int mm_lay_b(struct mmop B, int esz)
{
	unsigned long long p = (unsigned long long)B.p;

	if (B.rs == 1 && B.cs % 2 == 0 && p % (2 * esz) == 0)
		return MM_KC;
	if (B.cs == 1 && B.rs % TN == 0 && p % (TN * esz) == 0)
		return MM_MN;
	return 0;
}

// the vector layouts' products, by which operands are in shared memory
template <bool ABF, bool BBF, bool SC, int TM, int TN, int SM>
static __device__ __forceinline__ void mm_lay(int la, int lb, int M, int N, int K, struct mmop A,
					      struct mmop B, const float *sk, const float *rs,
					      float alpha, float cb, float *C, int crs, int ccs)
{
	if (la == MM_KC && lb == MM_KC)
		mm_block<ABF, BBF, SC, TM, TN, MM_KC, MM_KC, false, SM>(M, N, K, A, B, sk, rs,
									alpha, cb, C, crs, ccs);
	else if (la == MM_KC)
		mm_block<ABF, BBF, SC, TM, TN, MM_KC, MM_MN, false, SM>(M, N, K, A, B, sk, rs,
									alpha, cb, C, crs, ccs);
	else if (lb == MM_KC)
		mm_block<ABF, BBF, SC, TM, TN, MM_MN, MM_KC, false, SM>(M, N, K, A, B, sk, rs,
									alpha, cb, C, crs, ccs);
	else
		mm_block<ABF, BBF, SC, TM, TN, MM_MN, MM_MN, false, SM>(M, N, K, A, B, sk, rs,
									alpha, cb, C, crs, ccs);
}

// vector loads where the shape is whole tiles, both layouts allow them and C takes a lane's run
// of TN columns as one vector (row-major, rows and start aligned to TN floats); by 32-bit shared
// addresses where the operands are there (A alone or both); else element by element, masked
template <bool ABF, bool BBF, bool SC, int TM, int TN>
static __device__ __forceinline__ void mm_tiled(int M, int N, int K, struct mmop A, struct mmop B,
						const float *sk, const float *rs, float alpha,
						float cb, float *C, int crs, int ccs)
{
	const bool chk = M % (16 * TM) || N % (8 * TN) || K % 8 || ccs != 1 || crs % TN ||
			 (unsigned long long)C % (4 * TN);
	const int la = mm_lay_a<TM>(A, ABF ? 2 : 4), lb = mm_lay_b<TN>(B, BBF ? 2 : 4);

	if (chk || !la || !lb)
		mm_block<ABF, BBF, SC, TM, TN, 0, 0, true, 0>(M, N, K, A, B, sk, rs, alpha, cb, C,
							      crs, ccs);
	else if (!mm_shared(A.p))
		mm_lay<ABF, BBF, SC, TM, TN, 0>(la, lb, M, N, K, A, B, sk, rs, alpha, cb, C, crs,
						ccs);
	else if (!mm_shared(B.p))
		mm_lay<ABF, BBF, SC, TM, TN, MM_SH_A>(la, lb, M, N, K, A, B, sk, rs, alpha, cb, C,
						      crs, ccs);
	else
		mm_lay<ABF, BBF, SC, TM, TN, MM_SH_AB>(la, lb, M, N, K, A, B, sk, rs, alpha, cb, C,
						       crs, ccs);
}

// the warp tile by shape: 32 x 32 where that still gives every warp a tile, else 16 x 32, else
// 16 x 16 (the choice depends on M and N alone)
template <bool ABF, bool BBF, bool SC>
static __device__ __forceinline__ void mm_shape(int M, int N, int K, struct mmop A,
						struct mmop B, const float *sk, const float *rs,
						float alpha, float cb, float *C, int crs, int ccs)
{
	const int w = NTH / 32;

	if (((M + 31) / 32) * ((N + 31) / 32) >= w)
		mm_tiled<ABF, BBF, SC, 2, 4>(M, N, K, A, B, sk, rs, alpha, cb, C, crs, ccs);
	else if (((M + 15) / 16) * ((N + 31) / 32) >= w)
		mm_tiled<ABF, BBF, SC, 1, 4>(M, N, K, A, B, sk, rs, alpha, cb, C, crs, ccs);
	else
		mm_tiled<ABF, BBF, SC, 1, 2>(M, N, K, A, B, sk, rs, alpha, cb, C, crs, ccs);
}

// by the operands' types and whether A's columns are scaled
template <bool ABF, bool BBF>
static __device__ __forceinline__ void mm_scaled(int M, int N, int K, struct mmop A,
						 struct mmop B, const float *sk, const float *rs,
						 float alpha, float cb, float *C, int crs, int ccs)
{
	if (sk)
		mm_shape<ABF, BBF, true>(M, N, K, A, B, sk, rs, alpha, cb, C, crs, ccs);
	else
		mm_shape<ABF, BBF, false>(M, N, K, A, B, sk, rs, alpha, cb, C, crs, ccs);
}
#endif

// C (M x N, element (i, j) at C[i * crs + j * ccs]) = alpha diag(rs) A diag(sk) B + cb C, with
// A (M x K) and B (K x N); rs, sk may be NULL (ones); C is read only when cb != 0.  Every thread
// of the block calls it; it has no barrier of its own.  Inlined: a dispatcher to the mm_block
// functions (called, it was register-starved: ptxas gave its callers 128 registers and 2 kB of
// spills)
static __device__ __forceinline__ void tc_mm(int M, int N, int K, struct mmop A, struct mmop B,
					    const float *sk, const float *rs, float alpha,
					    float cb, float *C, int crs, int ccs)
{
#if defined(__CUDA_ARCH__) || defined(TC_MM_FRAG_HOST)
	if (A.bf && B.bf)
		mm_scaled<true, true>(M, N, K, A, B, sk, rs, alpha, cb, C, crs, ccs);
	else if (A.bf)
		mm_scaled<true, false>(M, N, K, A, B, sk, rs, alpha, cb, C, crs, ccs);
	else if (B.bf)
		mm_scaled<false, true>(M, N, K, A, B, sk, rs, alpha, cb, C, crs, ccs);
	else
		mm_scaled<false, false>(M, N, K, A, B, sk, rs, alpha, cb, C, crs, ccs);
#else
	// the host: each thread sums its own elements of 16 x 16 tiles, in order; the operands in
	// fp32 unless the emulator rounds them (test_gdn_chunk built with GDN_EMU_OPERAND_BITS)
#ifndef TC_MM_HOST_OPERAND
#define TC_MM_HOST_OPERAND(x) (x)
#endif
	const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
	const int tn = (N + 15) >> 4, tiles = ((M + 15) >> 4) * tn;

	for (int tile = warp; tile < tiles; tile += NTH / 32) {
		int m0 = tile / tn * 16, n0 = tile % tn * 16;

		for (int hh = 0; hh < 2; hh++)
			for (int x = 0; x < 4; x++) {
				int m = m0 + g + 8 * (x >> 1), n = n0 + 8 * hh + 2 * t + (x & 1);
				float v = 0.f;
				size_t o;

				if (m >= M || n >= N)
					continue;
				for (int k = 0; k < K; k++)
					v += TC_MM_HOST_OPERAND(mm_ld(A, m, k) * (sk ? sk[k] : 1.f)) *
					     TC_MM_HOST_OPERAND(mm_ld(B, k, n));
				o = (size_t)m * crs + (size_t)n * ccs;
				v *= alpha;
				if (rs)
					v *= rs[m];
				if (cb != 0.f)
					v += cb * C[o];
				C[o] = v;
			}
	}
#endif
}

#endif
