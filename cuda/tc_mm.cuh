// tc_mm.cuh: block-wide matrix products on the tensor cores for the chunked gated delta rule
// (gdn_chunk.cuh): C = alpha diag(rs) A diag(sk) B + cb C over operands in shared or global
// memory with any strides (a transpose is a stride), each float or bf16.  mma.sync m16n8k8 with
// tf32 operands (rounded to nearest from fp32; bf16 values are exact) and fp32 sums.
//
// The block's NTH threads share the output in warp tiles, warp w taking tiles w, w + NTH/32, ...:
// 32 x 32 where that still gives every warp a tile, else 16 x 32, else 16 x 16 (by M and N
// alone); within each 16 x 8, lane (g = lane / 4, t = lane % 4) owns rows g, g + 8 and columns
// 2t, 2t + 1 (the accumulator layout of m16n8k8).  A call with the same M and N therefore gives
// every output element to the same thread, so calls that accumulate into one C need no barrier
// between them.  Rows and columns past M, N, K are masked (any shape works; multiples of 32 and
// 8 waste nothing).
//
// Device code only.  The host side is C: test/gdn_chunk_emu.h runs the kernels on the host,
// where tc_mm's #else branch has each thread sum its own elements of 16 x 16 tiles in order (no
// tensor cores; the fragment loads and the mma of the C++ branch are what only the GPU runs:
// test_cuda_qwen35 holds them to a host product, each warp tile and operand type).
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

#ifdef __CUDA_ARCH__
static __device__ __forceinline__ unsigned mm_tf32(float x)
{
	unsigned r;

	asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
	return r;
}

static __device__ __forceinline__ void mm_mma(float *c, const unsigned *a, const unsigned *b)
{
	asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 "
		     "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
		     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
		     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// element x of an operand as a tf32 register: a bf16 is its own tf32 (its bits, shifted); a
// float is rounded to nearest (times s when SK)
template <bool BF, bool SK>
static __device__ __forceinline__ unsigned mm_reg(const void *p, int x, float s)
{
	if (BF && !SK)
		return (unsigned)((const unsigned short *)p)[x] << 16;
	if (BF)
		return mm_tf32(bf(((const bf16 *)p)[x]) * s);
	return mm_tf32(SK ? ((const float *)p)[x] * s : ((const float *)p)[x]);
}

// one warp's TM x TN blocks of 16 x 8 at (m0, n0), summed over K into c.  CHK: rows, columns or
// K ragged (masked loads); else every index is in range.  SK: A's columns scaled by sk.
template <bool ABF, bool BBF, int TM, int TN, bool SK, bool CHK>
static __device__ __forceinline__ void mm_warp(int M, int N, int K, struct mmop A, struct mmop B,
					       const float *sk, int m0, int n0, int g, int t,
					       float (&c)[TM][TN][4])
{
	int ar[TM][2], bc[TN];
	bool am[TM][2], bn[TN];

#pragma unroll
	for (int i = 0; i < TM; i++)
#pragma unroll
		for (int h = 0; h < 2; h++) {
			int m = m0 + 16 * i + g + 8 * h;

			am[i][h] = !CHK || m < M;
			ar[i][h] = (!CHK || m < M ? m : 0) * A.rs;
		}
#pragma unroll
	for (int j = 0; j < TN; j++) {
		int n = n0 + 8 * j + g;

		bn[j] = !CHK || n < N;
		bc[j] = (!CHK || n < N ? n : 0) * B.cs;
	}
#pragma unroll 2
	for (int k0 = 0; k0 < K; k0 += 8) {
		const int k1 = k0 + t, k2 = k1 + 4;
		const bool o1 = !CHK || k1 < K, o2 = !CHK || k2 < K;
		const int a1 = (o1 ? k1 : 0) * A.cs, a2 = (o2 ? k2 : 0) * A.cs;
		const int b1 = (o1 ? k1 : 0) * B.rs, b2 = (o2 ? k2 : 0) * B.rs;
		const float s1 = SK && o1 ? sk[k1] : 1.f, s2 = SK && o2 ? sk[k2] : 1.f;
		unsigned a[TM][4], b[TN][2];

		// a0 (g, t), a1 (g + 8, t), a2 (g, t + 4), a3 (g + 8, t + 4)
#pragma unroll
		for (int i = 0; i < TM; i++) {
			a[i][0] = am[i][0] && o1 ? mm_reg<ABF, SK>(A.p, ar[i][0] + a1, s1) : 0u;
			a[i][1] = am[i][1] && o1 ? mm_reg<ABF, SK>(A.p, ar[i][1] + a1, s1) : 0u;
			a[i][2] = am[i][0] && o2 ? mm_reg<ABF, SK>(A.p, ar[i][0] + a2, s2) : 0u;
			a[i][3] = am[i][1] && o2 ? mm_reg<ABF, SK>(A.p, ar[i][1] + a2, s2) : 0u;
		}
		// b0 (k = t, n = g), b1 (k = t + 4, n = g)
#pragma unroll
		for (int j = 0; j < TN; j++) {
			b[j][0] = bn[j] && o1 ? mm_reg<BBF, false>(B.p, b1 + bc[j], 1.f) : 0u;
			b[j][1] = bn[j] && o2 ? mm_reg<BBF, false>(B.p, b2 + bc[j], 1.f) : 0u;
		}
#pragma unroll
		for (int i = 0; i < TM; i++)
#pragma unroll
			for (int j = 0; j < TN; j++)
				mm_mma(c[i][j], a[i], b[j]);
	}
}

// the block's tiles of (16 TM) x (8 TN), and the epilogue: c0 (g, 2t), c1 (g, 2t + 1),
// c2 (g + 8, 2t), c3 (g + 8, 2t + 1) of each 16 x 8
template <bool ABF, bool BBF, int TM, int TN, bool SK, bool CHK>
static __device__ __noinline__ void mm_block(int M, int N, int K, struct mmop A, struct mmop B,
					     const float *sk, const float *rs, float alpha,
					     float cb, float *C, int crs, int ccs)
{
	const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
	const int tn = (N + 8 * TN - 1) / (8 * TN), tiles = (M + 16 * TM - 1) / (16 * TM) * tn;

	for (int tile = warp; tile < tiles; tile += NTH / 32) {
		int m0 = tile / tn * 16 * TM, n0 = tile % tn * 8 * TN;
		float c[TM][TN][4];

#pragma unroll
		for (int i = 0; i < TM; i++)
#pragma unroll
			for (int j = 0; j < TN; j++)
				c[i][j][0] = c[i][j][1] = c[i][j][2] = c[i][j][3] = 0.f;
		mm_warp<ABF, BBF, TM, TN, SK, CHK>(M, N, K, A, B, sk, m0, n0, g, t, c);
#pragma unroll
		for (int i = 0; i < TM; i++)
#pragma unroll
			for (int j = 0; j < TN; j++)
#pragma unroll
				for (int x = 0; x < 4; x++) {
					int m = m0 + 16 * i + g + 8 * (x >> 1);
					int n = n0 + 8 * j + 2 * t + (x & 1);
					float v;
					size_t o;

					if (CHK && (m >= M || n >= N))
						continue;
					o = (size_t)m * crs + (size_t)n * ccs;
					v = alpha * c[i][j][x];
					if (rs)
						v *= rs[m];
					if (cb != 0.f)
						v += cb * C[o];
					C[o] = v;
				}
	}
}

template <bool ABF, bool BBF, int TM, int TN>
static __device__ __forceinline__ void mm_tiled(int M, int N, int K, struct mmop A, struct mmop B,
						const float *sk, const float *rs, float alpha,
						float cb, float *C, int crs, int ccs)
{
	const bool chk = M % (16 * TM) || N % (8 * TN) || K % 8;

	if (sk && chk)
		mm_block<ABF, BBF, TM, TN, true, true>(M, N, K, A, B, sk, rs, alpha, cb, C, crs,
						       ccs);
	else if (sk)
		mm_block<ABF, BBF, TM, TN, true, false>(M, N, K, A, B, sk, rs, alpha, cb, C, crs,
							ccs);
	else if (chk)
		mm_block<ABF, BBF, TM, TN, false, true>(M, N, K, A, B, sk, rs, alpha, cb, C, crs,
							ccs);
	else
		mm_block<ABF, BBF, TM, TN, false, false>(M, N, K, A, B, sk, rs, alpha, cb, C, crs,
							 ccs);
}

// the warp tile by shape: 32 x 32 where that still gives every warp a tile, else 16 x 32, else
// 16 x 16 (the choice depends on M and N alone)
template <bool ABF, bool BBF>
static __device__ __forceinline__ void mm_shape(int M, int N, int K, struct mmop A,
						struct mmop B, const float *sk, const float *rs,
						float alpha, float cb, float *C, int crs, int ccs)
{
	const int w = NTH / 32;

	if (((M + 31) / 32) * ((N + 31) / 32) >= w)
		mm_tiled<ABF, BBF, 2, 4>(M, N, K, A, B, sk, rs, alpha, cb, C, crs, ccs);
	else if (((M + 15) / 16) * ((N + 31) / 32) >= w)
		mm_tiled<ABF, BBF, 1, 4>(M, N, K, A, B, sk, rs, alpha, cb, C, crs, ccs);
	else
		mm_tiled<ABF, BBF, 1, 2>(M, N, K, A, B, sk, rs, alpha, cb, C, crs, ccs);
}
#endif

// C (M x N, element (i, j) at C[i * crs + j * ccs]) = alpha diag(rs) A diag(sk) B + cb C, with
// A (M x K) and B (K x N); rs, sk may be NULL (ones); C is read only when cb != 0.  Every thread
// of the block calls it; it has no barrier of its own.
static __device__ void tc_mm(int M, int N, int K, struct mmop A, struct mmop B, const float *sk,
			     const float *rs, float alpha, float cb, float *C, int crs, int ccs)
{
#ifdef __CUDA_ARCH__
	if (A.bf && B.bf)
		mm_shape<true, true>(M, N, K, A, B, sk, rs, alpha, cb, C, crs, ccs);
	else if (A.bf)
		mm_shape<true, false>(M, N, K, A, B, sk, rs, alpha, cb, C, crs, ccs);
	else if (B.bf)
		mm_shape<false, true>(M, N, K, A, B, sk, rs, alpha, cb, C, crs, ccs);
	else
		mm_shape<false, false>(M, N, K, A, B, sk, rs, alpha, cb, C, crs, ccs);
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
