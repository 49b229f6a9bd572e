// gdn_chunk.cuh: the chunked gated delta rule's kernels (gdn_chunk.cu has the launchers and the
// overview).  Device code, with what it needs from common.cuh (bf16, bf(), tobf(), block_sum)
// defined by the includer: gdn_chunk.cu, and test/test_gdn_chunk.c, which runs these very kernels
// on the host, a block's threads as cooperative fibers, against the cpu backend (nothing here may
// be C++ only, outside tc_mm.cuh's device branch).
#ifndef SL_GDN_CHUNK_CUH
#define SL_GDN_CHUNK_CUH

// Register bounds: the kernels whose shared memory leaves room for one block an SM say so
// (__launch_bounds__(NTH, 1): up to 255 registers; without it ptxas held them to 128 and
// spilled around the tc_mm calls), k_gdn_prep and k_gdn_fwd_o, two blocks an SM, to 128.
#define GC 64		// positions per chunk (GDN_CHUNK)
#define NTH 256		// threads per block (8 warps share each product)
#define DKMAX 128	// key dim bound of the chunked kernels (X2 = T^T dW fits the quarters)
#if NTH != 4 * GC || GC % (NTH / 32)
#error "the row sums give each chunk row four threads (quad_sum)"
#endif

#include "tc_mm.cuh"

// the elements of an R x C block without a division: rows by warp, columns by lane
#define FOR_RC(r, j, R, C)                                                     \
	for (int r = (int)(threadIdx.x >> 5); r < (R); r += NTH / 32)          \
		for (int j = (int)(threadIdx.x & 31); j < (C); j += 32)

static __device__ __forceinline__ int chunk_n(int len, int c0)
{
	int n = len - c0;

	return n < 0 ? 0 : n > GC ? GC : n;
}

// Tiles from global into shared memory.  On the GPU, where the shapes and addresses allow, by
// cp.async, 16 bytes (else 4) a copy: every copy of the tile in flight at once, none through
// registers (copied through registers, 2 bf16 or 4 floats a load, the kernels waited on one
// round trip to L2 per 4 to 8 rows).  The caller calls tile_wait() before the barrier that
// publishes them.  The emulator copies element by element, at once.

// every tile copy of this thread complete (before the barrier that publishes the tiles)
static __device__ __forceinline__ void tile_wait(void)
{
#ifdef __CUDA_ARCH__
	cp_wait_all();
#endif
}

#ifdef __CUDA_ARCH__
// ld_tile_bf's copies, E bf16 a copy (8: 16 bytes, 2: 4 bytes), the size fixed at compile time
// (f327fbc's one loop picking it at run time measured 0.1 ms slower in the backward, in one
// build with acc_out's packing through pack4, whose PTX is the same as packing by hand)
template <int E>
static __device__ __forceinline__ void ld_tile_cp(bf16 *dst, int ds, const bf16 *src,
						  size_t ss, int n, int w, int wc)
{
	const int ce = wc / E;

	for (int x = threadIdx.x; x < GC * ce; x += NTH) {
		int r = x / ce, j = E * (x % ce);
		bool ok = r < n && j < w;
		uint32_t d = smem_u32(dst + r * ds + j);
		const bf16 *s = ok ? src + r * ss + j : src;

		if (E == 8)
			cp_async16(d, s, ok);
		else
			cp_async4(d, s, ok);
	}
}
#endif

// rows [0, GC) x columns [0, wc) of dst (bf16, row stride ds): element (r, j) = src[r ss + j]
// for r < n and j < w, else 0; no barrier, tile_wait before one
static __device__ void ld_tile_bf(bf16 *dst, int ds, const bf16 *src, size_t ss, int n, int w,
				  int wc)
{
#ifdef __CUDA_ARCH__
	const unsigned long long sa = (unsigned long long)src, da = (unsigned long long)dst;

	if (!((w | wc | ds | (int)(ss & 7)) & 7) && !(sa & 15) && !(da & 15)) {
		ld_tile_cp<8>(dst, ds, src, ss, n, w, wc);
		return;
	}
	if (!((w | wc | ds | (int)(ss & 1)) & 1) && !(sa & 3) && !(da & 3)) {
		ld_tile_cp<2>(dst, ds, src, ss, n, w, wc);
		return;
	}
#endif
	FOR_RC(r, j, GC, wc)
		dst[r * ds + j] = r < n && j < w ? src[r * ss + j] : tobf(0.f);
}

// R x C floats from global to shared memory: dst[r ds + j] = src[r ss + j]; no barrier,
// tile_wait before one
static __device__ void ld_tile_f(float *dst, int ds, const float *src, int ss, int R, int C)
{
#ifdef __CUDA_ARCH__
	if (!((C | ds | ss) & 3) && !((unsigned long long)src & 15) &&
	    !((unsigned long long)dst & 15)) {
		const int c4 = C / 4;

		for (int x = threadIdx.x; x < R * c4; x += NTH) {
			int r = x / c4, j = 4 * (x % c4);

			cp_async16(smem_u32(dst + r * ds + j), src + r * ss + j, true);
		}
		return;
	}
#endif
	FOR_RC(r, j, R, C)
		dst[r * ds + j] = src[r * ss + j];
}

// R x C floats from shared to global memory (or either way): dst[r ds + j] = src[r ss + j]; no
// barrier
static __device__ void cp_tile_f(float *dst, int ds, const float *src, int ss, int R, int C)
{
#ifdef __CUDA_ARCH__
	if (!((C | ds | ss) & 3) && !((unsigned long long)src & 15) &&
	    !((unsigned long long)dst & 15)) {
		const int c4 = C / 4, n4 = R * c4;

		for (int x0 = threadIdx.x; x0 < n4; x0 += 4 * NTH) {	// 4 loads, then 4 stores
			float4 u[4];

#pragma unroll
			for (int i = 0; i < 4; i++) {
				int x = x0 + i * NTH;

				if (x < n4)
					u[i] = *(const float4 *)(src + x / c4 * ss + 4 * (x % c4));
			}
#pragma unroll
			for (int i = 0; i < 4; i++) {
				int x = x0 + i * NTH;

				if (x < n4)
					*(float4 *)(dst + x / c4 * ds + 4 * (x % c4)) = u[i];
			}
		}
		return;
	}
#endif
	FOR_RC(r, j, R, C)
		dst[r * ds + j] = src[r * ss + j];
}

// s + the sum of x[i ld + j] y[i ld + j] over this thread's elements of an R x C block (C <= 64)
// in FOR_RC's order (the order of the sums is the kernels' since they were first checked), the
// loads issued four rows at a time (one at a time, each product waited on its global loads)
static __device__ float dot_rc(float s, const float *x, const float *y, int ld, int R, int C)
{
	const int w = (int)(threadIdx.x >> 5), lane = (int)(threadIdx.x & 31), RB = 4;

	for (int i0 = w; i0 < R; i0 += RB * (NTH / 32)) {
		float a[RB][2], b[RB][2];

#pragma unroll
		for (int r = 0; r < RB; r++)
#pragma unroll
			for (int m = 0; m < 2; m++) {
				int i = i0 + r * (NTH / 32), j = lane + 32 * m;
				bool ok = i < R && j < C;

				a[r][m] = ok ? x[i * ld + j] : 0.f;
				b[r][m] = ok ? y[i * ld + j] : 0.f;
			}
#pragma unroll
		for (int r = 0; r < RB; r++)
#pragma unroll
			for (int m = 0; m < 2; m++)
				if (i0 + r * (NTH / 32) < R && lane + 32 * m < C)
					s += a[r][m] * b[r][m];
	}
	return s;
}

// ---- the sequential passes, on the tensor cores ------------------------------------------------
//
// One block per (record, value head) walks the record's chunks with the whole dk x dv state in
// shared memory, making each chunk's local quantities once (tc_local) and every product with
// tc_mm (tc_mm.cuh: tf32 operands, fp32 sums and states).  Row strides: k, q of dk + 8 (bf16),
// the GC x GC matrices GC + 4, the state and the value-wide tiles dv + 4 (float).

#define ZLD 52		// row stride of the 16 x 48 product in tri_inv
#define DVMAX 128	// value dim bound of the sequential passes (the state in shared memory)

struct tl {
	float *A, *T, *P;		// (GC, GC): A = E o k.k^T (s < r) (KE),
					// T = (I + diag(beta) KE)^-1, P = E o q.k^T (s <= r);
					// A and T adjacent (spent together)
	bf16 *K, *Q;			// (GC, dk): 0 past the record
	float *Z;			// (16, ZLD): tri_inv's products
	float *bet, *G, *Ga, *e, *bg;	// (GC): beta, cumsum(g), exp(G), exp(G_last - G),
					// beta Ga
};

static __host__ __device__ size_t tl_floats(int dk)
{
	return (size_t)3 * GC * (GC + 4) + (size_t)GC * (dk + 8) + 16 * ZLD + 5 * GC;
}

static __device__ float *tl_carve(struct tl *c, float *p, int dk)
{
	c->A = p, c->T = p + GC * (GC + 4), c->P = c->T + GC * (GC + 4);
	p = c->P + GC * (GC + 4);
	c->K = (bf16 *)p;
	c->Q = c->K + (size_t)GC * (dk + 8);
	p += (size_t)GC * (dk + 8);
	c->Z = p;
	p += 16 * ZLD;
	c->bet = p, c->G = p + GC, c->Ga = p + 2 * GC, c->e = p + 3 * GC, c->bg = p + 4 * GC;
	return p + 5 * GC;
}

// T = (I + diag(beta) KE)^-1 by blocks of 16: the diagonal blocks by forward substitution (a
// thread per column), then block row i: T_i,<i = -T_ii (diag(beta_i) KE_i,<i T_<i,<i).  Ends
// with every thread past a barrier.
static __device__ void tri_inv(const struct tl *c)
{
	const int tid = threadIdx.x, ldg = GC + 4;

	for (int x = tid; x < GC * GC; x += NTH) {
		int r = x / GC, s = x % GC;

		if ((s >> 4) > (r >> 4))
			c->T[r * ldg + s] = 0.f;
	}
	if (tid < GC) {	// the column in registers: x[i] = T(base + i, col)
		int col = tid, base = tid & ~15, j = col - base;
		float x[16];

#pragma unroll
		for (int i = 0; i < 16; i++) {
			float a = 0.f;

#pragma unroll
			for (int s = 0; s < i; s++)
				a += c->A[(base + i) * ldg + base + s] * x[s];
			x[i] = i < j ? 0.f : i == j ? 1.f : -c->bet[base + i] * a;
		}
#pragma unroll
		for (int i = 0; i < 16; i++)
			c->T[(base + i) * ldg + col] = x[i];
	}
	__syncthreads();
	for (int i = 1; i < GC / 16; i++) {
		tc_mm(16, 16 * i, 16 * i, mm_f(c->A + 16 * i * ldg, ldg, 1), mm_f(c->T, ldg, 1),
		      NULL, c->bet + 16 * i, 1.f, 0.f, c->Z, ZLD, 1);
		__syncthreads();
		tc_mm(16, 16 * i, 16, mm_f(c->T + 16 * i * (ldg + 1), ldg, 1), mm_f(c->Z, ZLD, 1),
		      NULL, NULL, -1.f, 0.f, c->T + 16 * i * ldg, ldg, 1);
		__syncthreads();
	}
}

// chunk rows [t0, t0 + n) of key head kh into K and Q (row stride dk + 8), zeros past n; no
// barrier, tile_wait before one
static __device__ void tl_kq(bf16 *K, bf16 *Q, const bf16 *qn, const bf16 *kn, size_t t0, int n,
			     int nk, int dk, int kh)
{
	const int ldk = dk + 8;
	const size_t o = t0 * nk * dk + (size_t)kh * dk;

	ld_tile_bf(K, ldk, kn + o, (size_t)nk * dk, n, dk, dk);
	ld_tile_bf(Q, ldk, qn + o, (size_t)nk * dk, n, dk, dk);
}

// chunk rows [t0, t0 + n) of key head kh (value head h for beta, g), zeros past n: K, Q, the
// vectors, KE (in A), P and T.  Starts and ends with every thread past a barrier,
// every tile copy the threads had in flight complete (tile_wait).
static __device__ void tc_local(const struct tl *c, const bf16 *qn, const bf16 *kn,
				const float *beta, const float *g, size_t t0, int n, int nk, int nv,
				int dk, int kh, int h)
{
	const int tid = threadIdx.x, ldk = dk + 8, ldg = GC + 4;

	__syncthreads();
	tl_kq(c->K, c->Q, qn, kn, t0, n, nk, dk, kh);
	if (tid < GC) {
		c->bet[tid] = tid < n ? beta[(t0 + tid) * nv + h] : 0.f;
		c->G[tid] = tid < n ? g[(t0 + tid) * nv + h] : 0.f;
	}
	tile_wait();
	__syncthreads();
	if (tid < GC) {	// G = cumsum(g), each row its own sum (in order)
		float a = 0.f;

		for (int r = 0; r <= tid; r++)
			a += c->G[r];
		c->Z[tid] = a;	// Z: spare until tri_inv
	}
	__syncthreads();
	if (tid < GC) {
		c->G[tid] = c->Z[tid];
		c->Ga[tid] = expf(c->Z[tid]);
		c->e[tid] = expf(c->Z[GC - 1] - c->Z[tid]);
		c->bg[tid] = c->bet[tid] * c->Ga[tid];
	}
	// k.k^T into A, q.k^T into P (k^T: element (i, s) at K[s * ldk + i])
	tc_mm(GC, GC, dk, mm_b(c->K, ldk, 1), mm_b(c->K, 1, ldk), NULL, NULL, 1.f, 0.f, c->A, ldg,
	      1);
	tc_mm(GC, GC, dk, mm_b(c->Q, ldk, 1), mm_b(c->K, 1, ldk), NULL, NULL, 1.f, 0.f, c->P, ldg,
	      1);
	__syncthreads();
	for (int x = tid; x < GC * GC; x += NTH) {
		int r = x / GC, s = x % GC;
		float E = s <= r ? expf(c->G[r] - c->G[s]) : 0.f;

		c->A[r * ldg + s] = s < r ? E * c->A[r * ldg + s] : 0.f;
		c->P[r * ldg + s] = E * c->P[r * ldg + s];
	}
	__syncthreads();
	tri_inv(c);
}

// tc_local's results from a chunk's full slot (k_gdn_prep's): K and Q (where kq; else those of
// the last call, the same key head) and beta as tc_local loads them, A, T, P and G from the
// slot.  Starts and ends with every thread past a barrier.
static __device__ void tl_load(const struct tl *c, const float *sP, const float *sG,
			       const float *sT, const float *sA, const bf16 *qn, const bf16 *kn,
			       const float *beta, size_t t0, int n, int nk, int nv, int dk, int kh,
			       int h, bool kq)
{
	const int tid = threadIdx.x, ldg = GC + 4;

	__syncthreads();
	if (kq)
		tl_kq(c->K, c->Q, qn, kn, t0, n, nk, dk, kh);
	ld_tile_f(c->A, ldg, sA, GC, GC, GC);
	ld_tile_f(c->T, ldg, sT, GC, GC, GC);
	ld_tile_f(c->P, ldg, sP, GC, GC, GC);
	if (tid < GC) {
		c->bet[tid] = tid < n ? beta[(t0 + tid) * nv + h] : 0.f;
		c->G[tid] = sG[tid];
		c->Ga[tid] = expf(sG[tid]);
		c->e[tid] = expf(sG[GC - 1] - sG[tid]);
		c->bg[tid] = c->bet[tid] * c->Ga[tid];
	}
	tile_wait();
	__syncthreads();
}

// What the forward leaves the backward past the states where the caller gave room (aux):
// AUX_HEAD floats whose first holds a flag (nonzero: the tiles below are this forward's), then
// per chunk its delta and diag(Ga) Q S0, (GC, dv) floats each, chunk (record, chunk, value head)
// i = (record * nch + chunk) * nv + head (the states' order) at AUX_HEAD + 2 i GC dv.  The
// gradient kernel loads them instead of making them again from S0 (two products with S0 read
// from global memory, a third with T).
#define AUX_HEAD 64

static __host__ __device__ size_t aux_floats(size_t chunks, int nv, int dv)
{
	return AUX_HEAD + (size_t)2 * chunks * nv * GC * dv;
}

// the forward: o, and the chunk-start states; with aux, every chunk's delta and diag(Ga) Q S0
// past its head, and the head's flag set.  Block (record, value head).
__global__ void __launch_bounds__(NTH, 1) k_gdn_fwd(bf16 *o, float *states, float *aux,
						 const bf16 *qn, const bf16 *kn, const bf16 *v,
						 int vs, const float *beta, const float *g,
						 const int *lens, int L, int nk, int nv, int dk,
						 int dv)
{
	extern __shared__ float sm[];
	struct tl c;
	const int tid = threadIdx.x, lds = dv + 4, ldk = dk + 8, ldg = GC + 4;
	int b = blockIdx.x / nv, h = blockIdx.x % nv, kh = h / (nv / nk), len = lens[b];
	int nch = (L + GC - 1) / GC;
	float *S = tl_carve(&c, sm, dk), *R = S + (size_t)dk * lds, *D = R + (size_t)GC * lds;
	bf16 *Vt = (bf16 *)D;	// the chunk's v (GC, dv + 8), in D until delta is made
	size_t SS = (size_t)dk * dv, od = (size_t)nv * dv;

	if (aux && !blockIdx.x && !tid)	// the tiles below are this forward's (stream order)
		*(int *)aux = 1;
	for (int x = tid; x < dk * lds; x += NTH)
		S[x] = 0.f;
	for (int ch = 0; ch < nch; ch++) {
		int c0 = ch * GC, n = chunk_n(len, c0);
		size_t t0 = (size_t)b * L + c0;
		float *sv = states + (((size_t)b * nch + ch) * nv + h) * SS;

		__syncthreads();
		cp_tile_f(sv, dv, S, lds, dk, dv);
		if (!n) {
			FOR_RC(r, j, GC, dv)
				if (c0 + r < L)
					o[(t0 + r) * od + (size_t)h * dv + j] = tobf(0.f);
			continue;
		}
		// v's tile in flight meanwhile (tc_local's tile_wait completes it; D is spent)
		ld_tile_bf(Vt, dv + 8, v + t0 * vs + (size_t)h * dv, (size_t)vs, n, dv, dv);
		tc_local(&c, qn, kn, beta, g, t0, n, nk, nv, dk, kh, h);
		// R = diag(beta) (V - diag(Ga) K S)
		tc_mm(GC, dv, dk, mm_b(c.K, ldk, 1), mm_f(S, lds, 1), NULL, NULL, 1.f, 0.f, R, lds,
		      1);
		__syncthreads();
		FOR_RC(r, j, GC, dv) {
			float *y = &R[r * lds + j];

			*y = r < n ? c.bet[r] * (bf(Vt[r * (dv + 8) + j]) - c.Ga[r] * *y) : 0.f;
		}
		__syncthreads();
		// delta = T R
		tc_mm(GC, dv, GC, mm_f(c.T, ldg, 1), mm_f(R, lds, 1), NULL, NULL, 1.f, 0.f, D, lds,
		      1);
		__syncthreads();
		// O = diag(Ga) Q S + P delta, into R (the two calls own the same elements)
		tc_mm(GC, dv, dk, mm_b(c.Q, ldk, 1), mm_f(S, lds, 1), NULL, c.Ga, 1.f, 0.f, R, lds,
		      1);
		if (aux) {	// delta and diag(Ga) Q S0 out for the backward first
			float *a = aux + AUX_HEAD + (((size_t)b * nch + ch) * nv + h) * 2 * GC * dv;

			__syncthreads();
			cp_tile_f(a, dv, D, lds, GC, dv);
			cp_tile_f(a + (size_t)GC * dv, dv, R, lds, GC, dv);
			__syncthreads();
		}
		tc_mm(GC, dv, GC, mm_f(c.P, ldg, 1), mm_f(D, lds, 1), NULL, NULL, 1.f, 1.f, R, lds,
		      1);
		__syncthreads();
		FOR_RC(r, j, GC, dv)
			if (c0 + r < L)
				o[(t0 + r) * od + (size_t)h * dv + j] =
					tobf(r < n ? R[r * lds + j] : 0.f);
		// S = Ga_last S + K^T diag(e) delta
		tc_mm(dk, dv, GC, mm_b(c.K, 1, ldk), mm_f(D, lds, 1), c.e, NULL, 1.f, c.Ga[GC - 1],
		      S, lds, 1);
	}
}

// ---- the forward in three passes (as flash-linear-attention splits it) -------------------------
//
// The chunk-local work needs no state: k_gdn_prep makes it for every (record, value head, chunk)
// at once, W = T diag(beta Ga) K and U = T diag(beta) V, with P and G, into the chunk's slot of
// the scratch.  The pass over the chunks, k_gdn_fwd_h, is then two products a chunk: delta =
// U - W S (written over U), S = Ga_last S + K^T diag(e) delta.  k_gdn_fwd_o makes every chunk's
// o = diag(Ga) Q S + P delta at once from the saved start states.  The same sums as k_gdn_fwd.

// a chunk's slot: W (GC, dk), U then delta (GC, dv), P (GC, GC), G = cumsum(g) (GC), floats;
// the backward's (full) also T and A (GC, GC each), for k_gdn_bwd_grad
struct fslot {
	float *W, *U, *P, *G, *T, *A;
};

static __host__ __device__ size_t fslot_floats(int dk, int dv, int full)
{
	return (size_t)GC * dk + (size_t)GC * dv + (size_t)(full ? 3 : 1) * GC * GC + GC;
}

// slot i = (record * nv + value head) * nch + chunk
static __device__ struct fslot fslot_at(float *scr, size_t i, int dk, int dv, int full)
{
	struct fslot f;

	f.W = scr + i * fslot_floats(dk, dv, full);
	f.U = f.W + (size_t)GC * dk;
	f.P = f.U + (size_t)GC * dv;
	f.G = f.P + (size_t)GC * GC;
	f.T = full ? f.G + GC : NULL;
	f.A = full ? f.T + GC * GC : NULL;
	return f;
}

// where the forward's passes keep chunk ch's delta (GC, dv) of value head bh = record * nv +
// head: the backward's tile of it past the states (aux, given), else U's place in the chunk's
// slot (scr)
static __device__ float *delta_at(float *scr, float *aux, int bh, int ch, int nch, int nv, int dk,
				  int dv)
{
	if (aux)
		return aux + AUX_HEAD + (((size_t)(bh / nv) * nch + ch) * nv + bh % nv) * 2 * GC * dv;
	return fslot_at(scr, (size_t)bh * nch + ch, dk, dv, 0).U;
}

// Block (value head bh0 + blockIdx.x / nch, chunk blockIdx.x % nch) into slot blockIdx.x; value
// head bh = record * nv + head.  The forward (dout NULL): W, U, P, G; the backward: W, X =
// P^T dO (in U's place), P, G, T, A (full slots).  Shared memory: tl, then V or dO (GC, dv + 8)
// bf16.
__global__ void __launch_bounds__(NTH, 2) k_gdn_prep(float *scr, const bf16 *qn, const bf16 *kn,
						  const bf16 *v, int vs, const bf16 *dout,
						  const float *beta, const float *g, const int *lens,
						  int L, int nk, int nv, int dk, int dv, int bh0)
{
	extern __shared__ float sm[];
	struct tl c;
	const int tid = threadIdx.x, ldk = dk + 8, ldg = GC + 4, ldv = dv + 8;
	int nch = (L + GC - 1) / GC, bh = bh0 + blockIdx.x / nch, ch = blockIdx.x % nch;
	int b = bh / nv, h = bh % nv, kh = h / (nv / nk), c0 = ch * GC, n = chunk_n(lens[b], c0);
	size_t t0 = (size_t)b * L + c0;
	bf16 *V = (bf16 *)tl_carve(&c, sm, dk);
	struct fslot f = fslot_at(scr, blockIdx.x, dk, dv, dout != NULL);

	if (!n)		// past the record: the other passes skip the chunk
		return;
	tc_local(&c, qn, kn, beta, g, t0, n, nk, nv, dk, kh, h);
	if (dout)
		ld_tile_bf(V, ldv, dout + t0 * nv * dv + (size_t)h * dv, (size_t)nv * dv, n, dv, dv);
	else
		ld_tile_bf(V, ldv, v + t0 * vs + (size_t)h * dv, (size_t)vs, n, dv, dv);
	FOR_RC(r, s, GC, GC) {
		f.P[r * GC + s] = c.P[r * ldg + s];
		if (dout) {
			f.T[r * GC + s] = c.T[r * ldg + s];
			f.A[r * GC + s] = c.A[r * ldg + s];
		}
	}
	if (tid < GC)
		f.G[tid] = c.G[tid];
	tc_mm(GC, dk, GC, mm_f(c.T, ldg, 1), mm_b(c.K, ldk, 1), c.bg, NULL, 1.f, 0.f, f.W, dk, 1);
	tile_wait();
	__syncthreads();
	if (dout)
		tc_mm(GC, dv, GC, mm_f(c.P, 1, ldg), mm_b(V, ldv, 1), NULL, NULL, 1.f, 0.f, f.U,
		      dv, 1);
	else
		tc_mm(GC, dv, GC, mm_f(c.T, ldg, 1), mm_b(V, ldv, 1), c.bet, NULL, 1.f, 0.f, f.U,
		      dv, 1);
}

static __host__ size_t prep_smem(int dk, int dv)
{
	return tl_floats(dk) * sizeof(float) + (size_t)GC * (dv + 8) * 2;
}

// block (record, value head): the state walks the chunks; the chunk-start states out, delta
// to delta_at (over U, or the backward's tile where aux).  Shared memory: S (dk, dv + 4), W
// (GC, dk + 4), delta (GC, dv + 4), e (GC), K (GC, dk + 8) bf16.
__global__ void __launch_bounds__(NTH, 1) k_gdn_fwd_h(float *states, float *scr, float *aux,
						   const bf16 *kn, const int *lens, int L, int nk,
						   int nv, int dk, int dv)
{
	extern __shared__ float sm[];
	const int tid = threadIdx.x, lds = dv + 4, ldw = dk + 4, ldk = dk + 8;
	int b = blockIdx.x / nv, h = blockIdx.x % nv, kh = h / (nv / nk), len = lens[b];
	int nch = (L + GC - 1) / GC;
	float *S = sm, *W = S + (size_t)dk * lds, *D = W + (size_t)GC * ldw, *e = D + GC * lds;
	bf16 *K = (bf16 *)(e + GC);
	size_t SS = (size_t)dk * dv;

	for (int x = tid; x < dk * lds; x += NTH)
		S[x] = 0.f;
	for (int ch = 0; ch < nch; ch++) {
		int c0 = ch * GC, n = chunk_n(len, c0);
		size_t t0 = (size_t)b * L + c0;
		struct fslot f = fslot_at(scr, (size_t)blockIdx.x * nch + ch, dk, dv, 0);
		float *sv = states + (((size_t)b * nch + ch) * nv + h) * SS, gl;

		__syncthreads();
		cp_tile_f(sv, dv, S, lds, dk, dv);
		if (!n)
			continue;
		ld_tile_f(W, ldw, f.W, dk, GC, dk);
		ld_tile_bf(K, ldk, kn + t0 * nk * dk + (size_t)kh * dk, (size_t)nk * dk, n, dk, dk);
		ld_tile_f(D, lds, f.U, dv, GC, dv);
		if (tid < GC)
			e[tid] = expf(f.G[GC - 1] - f.G[tid]);
		gl = expf(f.G[GC - 1]);
		tile_wait();
		__syncthreads();
		// delta = U - W S
		tc_mm(GC, dv, dk, mm_f(W, ldw, 1), mm_f(S, lds, 1), NULL, NULL, -1.f, 1.f, D, lds,
		      1);
		__syncthreads();
		cp_tile_f(delta_at(scr, aux, blockIdx.x, ch, nch, nv, dk, dv), dv, D, lds, GC, dv);
		// S = Ga_last S + K^T diag(e) delta
		tc_mm(dk, dv, GC, mm_b(K, 1, ldk), mm_f(D, lds, 1), e, NULL, 1.f, gl, S, lds, 1);
	}
}

static __host__ size_t fwd_h_smem(int dk, int dv)
{
	return ((size_t)dk * (dv + 4) + (size_t)GC * (dk + 4) + (size_t)GC * (dv + 4) + GC) *
		       sizeof(float) + (size_t)GC * (dk + 8) * 2;
}

// block (record, value head, chunk): o = diag(Ga) Q S + P delta (delta at delta_at); with aux,
// diag(Ga) Q S out to the backward's tile past delta's, and the flag set that says the tiles are
// this forward's.  Shared memory: O (GC, dv + 4), P (GC, GC + 4), Ga (GC), Q (GC, dk + 8) bf16.
__global__ void __launch_bounds__(NTH, 2) k_gdn_fwd_o(bf16 *o, const float *states,
						   float *scr, float *aux, const bf16 *qn,
						   const int *lens, int L, int nk, int nv, int dk,
						   int dv)
{
	extern __shared__ float sm[];
	const int tid = threadIdx.x, lds = dv + 4, ldg = GC + 4, ldk = dk + 8;
	int nch = (L + GC - 1) / GC, bh = blockIdx.x / nch, ch = blockIdx.x % nch;
	int b = bh / nv, h = bh % nv, kh = h / (nv / nk), c0 = ch * GC, n = chunk_n(lens[b], c0);
	int rows = L - c0 < GC ? L - c0 : GC;
	size_t t0 = (size_t)b * L + c0, od = (size_t)nv * dv;
	float *O = sm, *P = O + GC * lds, *Ga = P + GC * ldg;
	bf16 *Q = (bf16 *)(Ga + GC);
	struct fslot f = fslot_at(scr, blockIdx.x, dk, dv, 0);
	const float *S0 = states + (((size_t)b * nch + ch) * nv + h) * dk * dv;
	const float *D = delta_at(scr, aux, bh, ch, nch, nv, dk, dv);

	if (aux && !blockIdx.x && !tid)	// the tiles are this forward's (stream order)
		*(int *)aux = 1;
	if (!n) {
		FOR_RC(r, j, rows, dv)
			o[(t0 + r) * od + (size_t)h * dv + j] = tobf(0.f);
		return;
	}
	ld_tile_bf(Q, ldk, qn + t0 * nk * dk + (size_t)kh * dk, (size_t)nk * dk, n, dk, dk);
	ld_tile_f(P, ldg, f.P, GC, GC, GC);
	if (tid < GC)
		Ga[tid] = expf(f.G[tid]);
	tile_wait();
	__syncthreads();
	tc_mm(GC, dv, dk, mm_b(Q, ldk, 1), mm_f(S0, dv, 1), NULL, Ga, 1.f, 0.f, O, lds, 1);
	if (aux) {	// diag(Ga) Q S0 out first (its threads are not tc_mm's)
		__syncthreads();
		cp_tile_f((float *)D + (size_t)GC * dv, dv, O, lds, GC, dv);
		__syncthreads();
	}
	tc_mm(GC, dv, GC, mm_f(P, ldg, 1), mm_f(D, dv, 1), NULL, NULL, 1.f, 1.f, O, lds, 1);
	__syncthreads();
	FOR_RC(r, j, rows, dv)
		o[(t0 + r) * od + (size_t)h * dv + j] = tobf(r < n ? O[r * lds + j] : 0.f);
}

static __host__ size_t fwd_o_smem(int dk, int dv)
{
	return ((size_t)GC * (dv + 4) + (size_t)GC * (GC + 4) + GC) * sizeof(float) +
	       (size_t)GC * (dk + 8) * 2;
}

// the backward's state pass: dS at every chunk's end into dst.  Block = slot of the wave's
// (record, value head), head bh = first * grp + slot.
__global__ void __launch_bounds__(NTH, 1) k_gdn_bwd_state(float *dst, const bf16 *dout,
						       const bf16 *qn, const bf16 *kn,
						       const float *beta, const float *g,
						       const int *lens, int L, int nk, int nv,
						       int dk, int dv, int first)
{
	extern __shared__ float sm[];
	struct tl c;
	const int tid = threadIdx.x, lds = dv + 4, ldk = dk + 8, ldg = GC + 4, ldw = dk + 4;
	const int ldo = dv + 8, grp = nv / nk;
	int slot = blockIdx.x, bh = first * grp + slot, b = bh / nv, h = bh % nv, kh = h / grp;
	int len = lens[b], nch = (L + GC - 1) / GC;
	float *dS = tl_carve(&c, sm, dk), *W = dS + (size_t)dk * lds, *dD = c.A;
	bf16 *dO = (bf16 *)(W + (size_t)GC * ldw);
	size_t SS = (size_t)dk * dv;

	for (int x = tid; x < dk * lds; x += NTH)
		dS[x] = 0.f;
	for (int ch = nch - 1; ch >= 0; ch--) {
		int c0 = ch * GC, n = chunk_n(len, c0);
		size_t t0 = (size_t)b * L + c0;
		float *dv_ = dst + ((size_t)slot * nch + ch) * SS;

		__syncthreads();
		FOR_RC(i, j, dk, dv)
			dv_[(size_t)i * dv + j] = dS[i * lds + j];
		if (!n)
			continue;
		ld_tile_bf(dO, ldo, dout + t0 * nv * dv + (size_t)h * dv, (size_t)nv * dv, n, dv, dv);
		tc_local(&c, qn, kn, beta, g, t0, n, nk, nv, dk, kh, h);
		// W = T diag(beta Ga) K
		tc_mm(GC, dk, GC, mm_f(c.T, ldg, 1), mm_b(c.K, ldk, 1), c.bg, NULL, 1.f, 0.f, W,
		      ldw, 1);
		__syncthreads();
		// ddelta = P^T dO + diag(e) K dS, into A and T (spent)
		tc_mm(GC, dv, GC, mm_f(c.P, 1, ldg), mm_b(dO, ldo, 1), NULL, NULL, 1.f, 0.f, dD,
		      lds, 1);
		tc_mm(GC, dv, dk, mm_b(c.K, ldk, 1), mm_f(dS, lds, 1), NULL, c.e, 1.f, 1.f, dD, lds,
		      1);
		__syncthreads();
		// dS = Ga_last dS + Q^T diag(Ga) dO - W^T ddelta (both calls own the same elements)
		tc_mm(dk, dv, GC, mm_b(c.Q, 1, ldk), mm_b(dO, ldo, 1), c.Ga, NULL, 1.f,
		      c.Ga[GC - 1], dS, lds, 1);
		tc_mm(dk, dv, GC, mm_f(W, 1, ldw), mm_f(dD, lds, 1), NULL, NULL, -1.f, 1.f, dS, lds,
		      1);
	}
}

// The backward's state pass after k_gdn_prep (dout given): dS at every chunk's end into dst,
// three products a chunk: ddelta = X + diag(e) K dS, dS = Ga_last dS + Q^T diag(Ga) dO -
// W^T ddelta.  Block = slot of the wave's value heads (as k_gdn_bwd_state), its chunks' slots
// at scr + (slot * nch + chunk); where dv <= dk, each chunk's K dS goes out over its slot's W
// (spent) for k_gdn_bwd_grad.  Shared memory: dS (dk, dv + 4), W (GC, dk + 4), ddelta and K dS
// (GC, dv + 4 each), e and Ga (GC each), K and Q (GC, dk + 8) and dO (GC, dv + 8), bf16.
__global__ void __launch_bounds__(NTH, 1) k_gdn_bwd_h(float *dst, float *scr, const bf16 *dout,
						   const bf16 *qn, const bf16 *kn, const int *lens,
						   int L, int nk, int nv, int dk, int dv, int first)
{
	extern __shared__ float sm[];
	const int tid = threadIdx.x, lds = dv + 4, ldw = dk + 4, ldk = dk + 8, ldo = dv + 8;
	const int grp = nv / nk;
	int slot = blockIdx.x, bh = first * grp + slot, b = bh / nv, h = bh % nv, kh = h / grp;
	int len = lens[b], nch = (L + GC - 1) / GC;
	float *dS = sm, *W = dS + (size_t)dk * lds, *dD = W + (size_t)GC * ldw;
	float *KD = dD + (size_t)GC * lds, *e = KD + (size_t)GC * lds, *Ga = e + GC;
	bf16 *K = (bf16 *)(Ga + GC), *Q = K + (size_t)GC * ldk, *dO = Q + (size_t)GC * ldk;
	size_t SS = (size_t)dk * dv;

	for (int x = tid; x < dk * lds; x += NTH)
		dS[x] = 0.f;
	for (int ch = nch - 1; ch >= 0; ch--) {
		int c0 = ch * GC, n = chunk_n(len, c0);
		size_t t0 = (size_t)b * L + c0;
		struct fslot f = fslot_at(scr, (size_t)slot * nch + ch, dk, dv, 1);
		float *dv_ = dst + ((size_t)slot * nch + ch) * SS, gl;

		__syncthreads();
		cp_tile_f(dv_, dv, dS, lds, dk, dv);
		if (!n)
			continue;
		tl_kq(K, Q, qn, kn, t0, n, nk, dk, kh);
		ld_tile_f(W, ldw, f.W, dk, GC, dk);
		ld_tile_f(dD, lds, f.U, dv, GC, dv);
		ld_tile_bf(dO, ldo, dout + t0 * nv * dv + (size_t)h * dv, (size_t)nv * dv, n, dv, dv);
		if (tid < GC) {
			e[tid] = expf(f.G[GC - 1] - f.G[tid]);
			Ga[tid] = expf(f.G[tid]);
		}
		gl = expf(f.G[GC - 1]);
		tile_wait();
		__syncthreads();
		// ddelta = X + diag(e) K dS; where dv <= dk, K dS out over the slot's W (spent) for
		// the gradient kernel
		tc_mm(GC, dv, dk, mm_b(K, ldk, 1), mm_f(dS, lds, 1), NULL, NULL, 1.f, 0.f, KD, lds,
		      1);
		__syncthreads();
		FOR_RC(r, j, GC, dv) {
			float x = KD[r * lds + j];

			if (dv <= dk)
				f.W[r * dv + j] = x;
			dD[r * lds + j] += e[r] * x;
		}
		__syncthreads();
		// dS = Ga_last dS + Q^T diag(Ga) dO - W^T ddelta (both calls own the same elements)
		tc_mm(dk, dv, GC, mm_b(Q, 1, ldk), mm_b(dO, ldo, 1), Ga, NULL, 1.f, gl, dS, lds, 1);
		tc_mm(dk, dv, GC, mm_f(W, 1, ldw), mm_f(dD, lds, 1), NULL, NULL, -1.f, 1.f, dS, lds,
		      1);
	}
}

static __host__ size_t bwd_h_smem(int dk, int dv)
{
	return ((size_t)dk * (dv + 4) + (size_t)GC * (dk + 4) + (size_t)2 * GC * (dv + 4) + 2 * GC) *
		       sizeof(float) +
	       ((size_t)2 * GC * (dk + 8) + (size_t)GC * (dv + 8)) * 2;
}

// ---- the backward's gradients of a chunk, on the tensor cores ----------------------------------
//
// Block (group of the wave, chunk): group = (record, key head) first + blockIdx.x / nch; the value
// heads of the key head in order, each in quarters of VQ value columns.  The chunk-start state S0
// and dS at its end are read from global memory (states, dst) as product operands; dq and dk sum
// over the value heads in fp32 in the block's own slice of the scratch (acc, after dst), in a
// fixed order (deterministic), and go out as bf16 at the end.  With slots (k_gdn_prep's full
// slots of the wave) a head's local quantities are loaded (tl_load) instead of made (tc_local),
// and so are P^T dO and K dS (k_gdn_bwd_h's, where dv <= dk); with aux (k_gdn_fwd's, where its
// flag is set) so are delta and diag(Ga) Q S0.
// The algebra: test/gdn_chunk_ref.h.

#define VQ 64		// value columns per quarter (a half of the Qwen3.5's 128)
#if VQ > 64
#error "dot_rc takes two columns a lane"
#endif

// the block's shared memory past tl: the quarter's V and dO (bf16, VQ + 8 wide), R (K S0, then
// the products K dS and X = T^T dD), D (Q S0, then delta) and dD (float, VQ + 4 wide; R and D
// adjacent), dW (dk + 4), dP and dT (GC + 4), and the rows' sums
struct gq {
	bf16 *V, *dO;
	float *R, *D, *DD, *dW, *dP, *dT;
	float *qz, *de, *xv, *dG, *db;
};

static __host__ __device__ size_t gq_floats(int dk)
{
	return (size_t)GC * (VQ + 8) + (size_t)3 * GC * (VQ + 4) + (size_t)GC * (dk + 4) +
	       (size_t)2 * GC * (GC + 4) + 5 * GC;
}

static __device__ void gq_carve(struct gq *q, float *p, int dk)
{
	const size_t t = (size_t)GC * (VQ + 4);

	q->V = (bf16 *)p;
	q->dO = q->V + (size_t)GC * (VQ + 8);
	p += (size_t)GC * (VQ + 8);
	q->R = p, q->D = p + t, q->DD = p + 2 * t;
	p += 3 * t;
	q->dW = p;
	p += (size_t)GC * (dk + 4);
	q->dP = p, q->dT = p + GC * (GC + 4);
	p += (size_t)2 * GC * (GC + 4);
	q->qz = p, q->de = p + GC, q->xv = p + 2 * GC, q->dG = p + 3 * GC, q->db = p + 4 * GC;
}

// The row sums of the gradient kernel: row r of the chunk to threads 4r .. 4r + 3, each taking
// the columns j = 4i + (thread % 4), their sums added by quad_sum (every thread calls it).
#define QROW() ((int)(threadIdx.x >> 2))
#define FOR_Q(j, w) for (int j = (int)(threadIdx.x & 3); j < (w); j += 4)

// acc[r] += the dot product of row r of X (float, stride lx) and of Y (bf16, stride ly) over w
// columns, for each of the GC rows
static __device__ void rows_dot(float *acc, const float *X, int lx, const bf16 *Y, int ly, int w)
{
	const int r = QROW();
	float a = 0.f;

	FOR_Q(j, w)
		a += X[r * lx + j] * bf(Y[r * ly + j]);
	a = quad_sum(a);
	if (!(threadIdx.x & 3))
		acc[r] += a;
}

// a (value head, chunk) slot of k_gdn_grad_v's results (gdn_grad.cuh): dW (GC, dk), dP (GC,
// GC), dT (GC, GC), then per half of dk its shares of four rows of GC: q.z, d.e o e (over the
// half's columns of dk), x.v (over the half's value-column tiles), and <S0, dS> (over the
// half's rows; the fourth row's first float)
static __host__ __device__ inline size_t gv_floats(int dk)
{
	return (size_t)GC * dk + (size_t)2 * GC * GC + 8 * GC;
}

// floats of the backward's scratch for per_wave groups: dS at every chunk's end of their value
// heads (dst), then dq and dk in fp32 per chunk (acc), then k_gdn_prep's slot for every chunk
// of their value heads (bwd_slots), then k_gdn_grad_v's (bwd_gv)
static __host__ __device__ size_t bwd_scratch_floats(size_t per_wave, int grp, int nch, int dk,
						     int dv)
{
	return per_wave * nch * ((size_t)grp * dk * dv + (size_t)2 * GC * dk +
				 (size_t)grp * (fslot_floats(dk, dv, 1) + gv_floats(dk)));
}

// where the slots start in that scratch
static __host__ __device__ size_t bwd_slots(size_t per_wave, int grp, int nch, int dk, int dv)
{
	return per_wave * nch * ((size_t)grp * dk * dv + (size_t)2 * GC * dk);
}

static __host__ __device__ size_t bwd_gv(size_t per_wave, int grp, int nch, int dk, int dv)
{
	return bwd_slots(per_wave, grp, nch, dk, dv) +
	       per_wave * nch * grp * fslot_floats(dk, dv, 1);
}

// The accumulators dq, dk (GC x dk floats, row-major, in global memory): where dk allows, a
// lane takes 4 columns and issues every load of its rows before the first store (element by
// element, each store waited on its load's round trip to L2).
#define ACC_V 8		// rows of 4 a thread in flight

// acc[r dk + i] += s[r] X[r lx + i] over GC x w (w <= dk); no barrier
static __device__ void acc_rows(float *acc, int dk, const float *X, int lx, const float *s,
				int w)
{
#ifdef __CUDA_ARCH__
	if (!((dk | w | lx) & 3)) {
		const int c4 = w / 4;

		for (int x0 = threadIdx.x; x0 < GC * c4; x0 += ACC_V * NTH) {
			float4 a[ACC_V];

#pragma unroll
			for (int u = 0; u < ACC_V; u++) {
				int x = x0 + u * NTH;

				if (x < GC * c4)
					a[u] = *(const float4 *)(acc + x / c4 * dk + 4 * (x % c4));
			}
#pragma unroll
			for (int u = 0; u < ACC_V; u++) {
				int x = x0 + u * NTH, r = x / c4, i = 4 * (x % c4);

				if (x < GC * c4) {
					const float4 y = *(const float4 *)(X + r * lx + i);

					a[u].x += s[r] * y.x, a[u].y += s[r] * y.y;
					a[u].z += s[r] * y.z, a[u].w += s[r] * y.w;
					*(float4 *)(acc + r * dk + i) = a[u];
				}
			}
		}
		return;
	}
#endif
	FOR_RC(r, i, GC, w)
		acc[r * dk + i] += s[r] * X[r * lx + i];
}

// out[r os + i] = acc[r dk + i] as bf16 for r < n, 0 for n <= r < rows; no barrier
static __device__ void acc_out(bf16 *out, const float *acc, int rows, int n, size_t os, int dk)
{
#ifdef __CUDA_ARCH__
	if (!((dk | (int)(os & 3)) & 3) && !((unsigned long long)out & 7)) {
		const int c4 = dk / 4;

		for (int x0 = threadIdx.x; x0 < rows * c4; x0 += ACC_V * NTH) {
			float4 a[ACC_V];

#pragma unroll
			for (int u = 0; u < ACC_V; u++) {
				int x = x0 + u * NTH;

				a[u] = make_float4(0.f, 0.f, 0.f, 0.f);
				if (x < rows * c4 && x / c4 < n)
					a[u] = *(const float4 *)(acc + x / c4 * dk + 4 * (x % c4));
			}
#pragma unroll
			for (int u = 0; u < ACC_V; u++) {
				int x = x0 + u * NTH;

				if (x < rows * c4)
					*(uint2 *)(out + x / c4 * os + 4 * (x % c4)) =
						pack4((const float *)&a[u]);
			}
		}
		return;
	}
#endif
	FOR_RC(r, i, rows, dk)
		out[r * os + i] = tobf(r < n ? acc[r * dk + i] : 0.f);
}

__global__ void __launch_bounds__(NTH, 1) k_gdn_bwd_grad(bf16 *dqn, bf16 *dkn, bf16 *dval,
						      bf16 *dbeta, bf16 *dg, const bf16 *dout,
						      const float *states, const float *aux,
						      const float *dst,
						      float *accs, float *slots, const bf16 *qn,
						      const bf16 *kn,
						      const bf16 *v, int vs, const float *beta,
						      const float *g, const int *lens, int L, int nk,
						      int nv, int dk, int dv, int first,
						      float *gv)
{
	extern __shared__ float sm[];
	struct tl c;
	struct gq q;
	const int tid = threadIdx.x, ldk = dk + 8, ldg = GC + 4, lq = VQ + 4, lo = VQ + 8;
	const int ldw = dk + 4, grp = nv / nk;
	int nch = (L + GC - 1) / GC, gi = blockIdx.x / nch, ch = blockIdx.x % nch;
	int bk = first + gi, b = bk / nk, kh = bk % nk, len = lens[b];
	int c0 = ch * GC, n = chunk_n(len, c0), rows = L - c0 < GC ? L - c0 : GC;
	size_t t0 = (size_t)b * L + c0, SS = (size_t)dk * dv;
	float *accq = accs + ((size_t)gi * nch + ch) * 2 * GC * dk, *acck = accq + GC * dk;
	float *U;	// (GC, GC) products in the quarter's V and dO (spent)
	bool fresh = true;	// acc not yet written
	// the forward's delta and diag(Ga) Q S0 of the chunk's first value head, where it left them
	const float *adel = aux && *(const int *)aux ?
		aux + AUX_HEAD + (((size_t)b * nch + ch) * nv + kh * grp) * 2 * GC * dv : NULL;
	// k_gdn_grad_v ran (the sums over the value columns) and k_gdn_grad_k makes dq, dk
	const bool pre = gv && adel;

	gq_carve(&q, tl_carve(&c, sm, dk), dk);
	U = (float *)q.V;
	if (!n) {	// past the record: zero gradients
		for (int x = tid; x < rows * dk; x += NTH) {
			size_t o = (t0 + x / dk) * nk * dk + (size_t)kh * dk + x % dk;

			dqn[o] = tobf(0.f);
			dkn[o] = tobf(0.f);
		}
		for (int x = tid; x < rows * grp * dv; x += NTH) {
			int r = x / (grp * dv), hj = x % (grp * dv);

			dval[(t0 + r) * vs + (size_t)kh * grp * dv + hj] = tobf(0.f);
		}
		for (int x = tid; x < rows * grp; x += NTH) {
			size_t o = (t0 + x / grp) * nv + (size_t)kh * grp + x % grp;

			dbeta[o] = tobf(0.f);
			dg[o] = tobf(0.f);
		}
		return;
	}
	for (int h = kh * grp; h < (kh + 1) * grp; h++) {
		const float *S0 = states + (((size_t)b * nch + ch) * nv + h) * SS;
		const float *dS = dst + (((size_t)gi * grp + h - kh * grp) * nch + ch) * SS;
		float sd = 0.f;

		const float *X = NULL;	// P^T dO, k_gdn_prep's, where it ran
		const float *KD = NULL;	// K dS, k_gdn_bwd_h's (over the slot's W), where it ran
		// the forward's delta and diag(Ga) Q S0 of this head, where it left them
		const float *hd = adel ? adel + (size_t)(h - kh * grp) * 2 * GC * dv : NULL;

		if (slots) {	// k_gdn_prep's (full slots, the wave's value heads in order)
			struct fslot f = fslot_at(slots, ((size_t)gi * grp + h - kh * grp) * nch + ch,
						  dk, dv, 1);

			// K and Q once for the key head's value heads (nothing writes them)
			tl_load(&c, f.P, f.G, f.T, f.A, qn, kn, beta, t0, n, nk, nv, dk, kh, h,
				h == kh * grp);
			X = f.U;
			KD = dv <= dk ? f.W : NULL;
		} else {
			tc_local(&c, qn, kn, beta, g, t0, n, nk, nv, dk, kh, h);
		}
		// k_gdn_grad_v's sums over the value columns (its d.e is d.e o e), and room for
		// M and D + D^T for k_gdn_grad_k (over dP, dT)
		float *gs = pre ? gv + (((size_t)gi * grp + h - kh * grp) * nch + ch) *
					       gv_floats(dk) : NULL;

		if (pre) {
			const float *vec = gs + (size_t)GC * dk + 2 * GC * GC;

			ld_tile_f(q.dW, ldw, gs, dk, GC, dk);
			ld_tile_f(q.dP, ldg, gs + (size_t)GC * dk, GC, GC, GC);
			ld_tile_f(q.dT, ldg, gs + (size_t)GC * dk + GC * GC, GC, GC, GC);
			if (tid < GC) {	// the two halves' shares
				q.qz[tid] = vec[tid] + vec[4 * GC + tid];
				q.de[tid] = vec[GC + tid] + vec[5 * GC + tid];
				q.xv[tid] = vec[2 * GC + tid] + vec[6 * GC + tid];
			}
			sd = vec[3 * GC] + vec[7 * GC];
			tile_wait();
			__syncthreads();
		} else {
			if (tid < GC)
				q.qz[tid] = q.de[tid] = q.xv[tid] = 0.f;
			for (int j0 = 0; j0 < dv; j0 += VQ) {
				int w = dv - j0 < VQ ? dv - j0 : VQ;
				float cq = j0 ? 1.f : 0.f, ca = fresh ? 0.f : 1.f;

				__syncthreads();
				ld_tile_bf(q.dO, lo, dout + t0 * nv * dv + (size_t)h * dv + j0,
					   (size_t)nv * dv, n, w, VQ);
				ld_tile_bf(q.V, lo, v + t0 * vs + (size_t)h * dv + j0, (size_t)vs, n, w, VQ);
				sd = dot_rc(sd, S0 + j0, dS + j0, dv, dk, w);
				if (hd) {	// the forward's: delta into D, diag(Ga) Q S0 into R
					ld_tile_f(q.D, lq, hd + j0, dv, GC, w);
					ld_tile_f(q.R, lq, hd + (size_t)GC * dv + j0, dv, GC, w);
					tile_wait();
					__syncthreads();
					// qz += rows of diag(Ga) Q S0 o dO
					rows_dot(q.qz, q.R, lq, q.dO, lo, w);
				} else {
					// K S0 into R and Q S0 into D in one product: K and Q are one (2 GC,
					// dk) matrix (tl_carve), R and D one (2 GC, lq) one (gq_carve); S0
					// read once
					tc_mm(2 * GC, w, dk, mm_b(c.K, ldk, 1), mm_f(S0 + j0, dv, 1), NULL,
					      NULL, 1.f, 0.f, q.R, lq, 1);
					tile_wait();
					__syncthreads();
					// R = diag(beta) V - diag(beta Ga) K S0; qz += rows of Q S0 o dO
					FOR_RC(r, j, GC, w)
						q.R[r * lq + j] = c.bet[r] * bf(q.V[r * lo + j]) -
								  c.bg[r] * q.R[r * lq + j];
					rows_dot(q.qz, q.D, lq, q.dO, lo, w);
					__syncthreads();
					// delta = T R
					tc_mm(GC, w, GC, mm_f(c.T, ldg, 1), mm_f(q.R, lq, 1), NULL, NULL, 1.f,
					      0.f, q.D, lq, 1);
				}
				__syncthreads();
				// K dS into R (spent); dD = P^T dO (+ diag(e) K dS below)
				if (KD)
					ld_tile_f(q.R, lq, KD + j0, dv, GC, w);
				else
					tc_mm(GC, w, dk, mm_b(c.K, ldk, 1), mm_f(dS + j0, dv, 1), NULL, NULL,
					      1.f, 0.f, q.R, lq, 1);
				if (X)
					ld_tile_f(q.DD, lq, X + j0, dv, GC, w);
				else
					tc_mm(GC, w, GC, mm_f(c.P, 1, ldg), mm_b(q.dO, lo, 1), NULL, NULL,
					      1.f, 0.f, q.DD, lq, 1);
				tile_wait();
				__syncthreads();
				{
					const int r = QROW();
					float d = 0.f;

					FOR_Q(j, w) {
						d += q.R[r * lq + j] * q.D[r * lq + j];
						q.DD[r * lq + j] += c.e[r] * q.R[r * lq + j];
					}
					d = quad_sum(d);
					if (!(tid & 3))
						q.de[r] += d;
				}
				__syncthreads();
				// dP += dO delta^T, dT += dD V^T (all s: the masks come later)
				tc_mm(GC, GC, w, mm_b(q.dO, lo, 1), mm_f(q.D, 1, lq), NULL, NULL, 1.f, cq,
				      q.dP, ldg, 1);
				tc_mm(GC, GC, w, mm_f(q.DD, lq, 1), mm_b(q.V, 1, lo), NULL, NULL, 1.f, cq,
				      q.dT, ldg, 1);
				// dq += diag(Ga) dO S0^T, dk += diag(e) delta dS^T, dW -= dD S0^T
				tc_mm(GC, dk, w, mm_b(q.dO, lo, 1), mm_f(S0 + j0, 1, dv), NULL, c.Ga, 1.f,
				      ca, accq, dk, 1);
				tc_mm(GC, dk, w, mm_f(q.D, lq, 1), mm_f(dS + j0, 1, dv), NULL, c.e, 1.f, ca,
				      acck, dk, 1);
				tc_mm(GC, dk, w, mm_f(q.DD, lq, 1), mm_f(S0 + j0, 1, dv), NULL, NULL, -1.f,
				      cq, q.dW, ldw, 1);
				// X = T^T dD into R (nothing in this phase reads R)
				tc_mm(GC, w, GC, mm_f(c.T, 1, ldg), mm_f(q.DD, lq, 1), NULL, NULL, 1.f, 0.f,
				      q.R, lq, 1);
				fresh = false;
				__syncthreads();
				rows_dot(q.xv, q.R, lq, q.V, lo, w);
				// dv = beta X
				FOR_RC(r, j, GC, w)
					if (c0 + r < L)
						dval[(t0 + r) * vs + (size_t)h * dv + j0 + j] =
							tobf(r < n ? c.bet[r] * q.R[r * lq + j] : 0.f);
			}
			sd = block_sum(sd);	// <S0, dS> (synchronizes)
		}
		// dG: through O (Ga q.Z, dP o P) and S_end (Ga_last <S0,dS>, de o e)
		{
			const int r = QROW();
			float a = 0.f;

			FOR_Q(s, GC)
				a += q.dP[r * ldg + s] * c.P[r * ldg + s] -
				     q.dP[s * ldg + r] * c.P[s * ldg + r];
			a = quad_sum(a);
			if (!(tid & 3))
				q.dG[r] = (hd ? 1.f : c.Ga[r]) * q.qz[r] -
					  q.de[r] * (pre ? 1.f : c.e[r]) + a;
		}
		// X2 = T^T dW (into R, D, dD, spent; pre: k_gdn_grad_k's); U = dW K^T
		if (!pre)
			tc_mm(GC, dk, GC, mm_f(c.T, 1, ldg), mm_f(q.dW, ldw, 1), NULL, NULL, 1.f, 0.f,
			      q.R, ldw, 1);
		tc_mm(GC, GC, dk, mm_f(q.dW, ldw, 1), mm_b(c.K, 1, ldk), NULL, NULL, 1.f, 0.f, U,
		      ldg, 1);
		__syncthreads();
		// M = dP o E (in place), dT = beta_s (dT + Ga_s U), s <= r
		for (int x = tid; x < GC * GC; x += NTH) {
			int r = x / GC, s = x % GC, o = r * ldg + s;

			if (s > r) {
				q.dP[o] = q.dT[o] = 0.f;
				continue;
			}
			q.dP[o] *= expf(c.G[r] - c.G[s]);
			q.dT[o] = c.bet[s] * (q.dT[o] + c.Ga[s] * U[o]);
		}
		{	// dbeta, dG through W (the same phase: neither reads what the other writes);
			// the last row's dG also through S_end first (Ga_last <S0, dS>, de o e)
			const int r = QROW();
			float a = 0.f;

			if (pre)	// (X2 o K) 1 = (T o U) summed over the rows
				FOR_Q(s, GC)
					a += c.T[s * ldg + r] * U[s * ldg + r];
			else
				FOR_Q(i, dk)
					a += q.R[r * ldw + i] * bf(c.K[r * ldk + i]);
			a = quad_sum(a);
			if (!(tid & 3)) {
				if (r == GC - 1) {
					float z = c.Ga[GC - 1] * sd;

					for (int s = 0; s < GC; s++)
						z += q.de[s] * (pre ? 1.f : c.e[s]);
					q.dG[GC - 1] += z;
				}
				q.db[r] = q.xv[r] + c.Ga[r] * a;
				q.dG[r] += c.bet[r] * c.Ga[r] * a;
			}
		}
		__syncthreads();
		// dq += M K, dk += M^T Q (pre: M out for k_gdn_grad_k); dP2 = dT T^T (into U)
		if (pre) {
			cp_tile_f(gs + (size_t)GC * dk, GC, q.dP, ldg, GC, GC);
		} else {
			tc_mm(GC, dk, GC, mm_f(q.dP, ldg, 1), mm_b(c.K, ldk, 1), NULL, NULL, 1.f, 1.f,
			      accq, dk, 1);
			tc_mm(GC, dk, GC, mm_f(q.dP, 1, ldg), mm_b(c.Q, ldk, 1), NULL, NULL, 1.f, 1.f,
			      acck, dk, 1);
		}
		tc_mm(GC, GC, GC, mm_f(q.dT, ldg, 1), mm_f(c.T, 1, ldg), NULL, NULL, 1.f, 0.f, U,
		      ldg, 1);
		__syncthreads();
		// dk += diag(beta Ga) X2; dA = -T^T dP2 into dT (its s < r part is dA's)
		if (!pre)
			acc_rows(acck, dk, q.R, ldw, c.bg, dk);
		tc_mm(GC, GC, GC, mm_f(c.T, 1, ldg), mm_f(U, ldg, 1), NULL, NULL, -1.f, 0.f, q.dT,
		      ldg, 1);
		__syncthreads();
		{	// through A_rs = beta_r KE_rs: dbeta, dG (dT is dA at s < r; A is 0 elsewhere)
			const int r = QROW();
			float a = 0.f, d = 0.f;

			FOR_Q(s, GC) {
				a += q.dT[r * ldg + s] * c.A[r * ldg + s];
				d += q.dT[r * ldg + s] * c.bet[r] * c.A[r * ldg + s] -
				     q.dT[s * ldg + r] * c.bet[s] * c.A[s * ldg + r];
			}
			a = quad_sum(a);
			d = quad_sum(d);
			if (!(tid & 3)) {
				q.db[r] += a;
				q.dG[r] += d;
			}
		}
		__syncthreads();
		// D = dA o beta_r E (0 at s >= r) and D^T into U (spent) as one matrix: D is
		// strictly lower, so each element of D + D^T is one of D's, not a sum
		for (int x = tid; x < GC * GC; x += NTH) {
			int r = x / GC, s = x % GC;

			float d = s < r ? q.dT[r * ldg + s] * c.bet[r] * expf(c.G[r] - c.G[s]) : 0.f;

			if (s <= r)
				U[r * ldg + s] = U[s * ldg + r] = d;
		}
		__syncthreads();
		// dk += (D + D^T) K (pre: D + D^T out for k_gdn_grad_k)
		if (pre)
			cp_tile_f(gs + (size_t)GC * dk + GC * GC, GC, U, ldg, GC, GC);
		else
			tc_mm(GC, dk, GC, mm_f(U, ldg, 1), mm_b(c.K, ldk, 1), NULL, NULL, 1.f, 1.f,
			      acck, dk, 1);
		if (tid < GC && c0 + tid < L) {	// dg = the reverse cumulative sum of dG; dbeta
			int r = tid;
			float a = 0.f;

			for (int s = GC - 1; s >= r; s--)	// each row its own sum, from the end
				a += q.dG[s];
			dbeta[(t0 + r) * nv + h] = tobf(r < n ? q.db[r] : 0.f);
			dg[(t0 + r) * nv + h] = tobf(r < n ? a : 0.f);
		}
	}
	if (pre)	// (k_gdn_grad_k's)
		return;
	__syncthreads();
	acc_out(dqn + t0 * nk * dk + (size_t)kh * dk, accq, rows, n, nk * dk, dk);
	acc_out(dkn + t0 * nk * dk + (size_t)kh * dk, acck, rows, n, nk * dk, dk);
}

static __host__ size_t gq_smem(int dk)
{
	return (tl_floats(dk) + gq_floats(dk)) * sizeof(float);
}

// ---- shared memory per block ------------------------------------------------------------------

static __host__ size_t fwd_smem(int dk, int dv)
{
	return (tl_floats(dk) + (size_t)dk * (dv + 4) + (size_t)2 * GC * (dv + 4)) * sizeof(float);
}

static __host__ size_t state_smem(int dk, int dv)
{
	return (tl_floats(dk) + (size_t)dk * (dv + 4) + (size_t)GC * (dk + 4) +
		(size_t)GC * (dv + 8) / 2) * sizeof(float);
}

#endif
