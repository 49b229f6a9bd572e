// gdn_walk.cuh: the passes over a record's chunks of the chunked gated delta rule (the split
// forward's, which may make each chunk's output on the way, and the backward's), with the state
// in registers.  Included by gdn_chunk.cu after
// gdn_chunk.cuh (GPU only: the emulator of test_gdn_chunk runs gdn_chunk.cuh's k_gdn_fwd_h and
// k_gdn_bwd_h, the same sums block-wide through tc_mm; test_cuda_qwen35 holds these to the cpu).
//
// The value columns of the state are independent of each other in the delta rule, so warp w of
// the block (record, value head) owns columns [16 w, 16 w + 16) of the dk x dv state, all dk
// rows, for the whole walk: S^T (16 x dk) as the accumulators of m16n8k8 tiles, lane (g, t)
// holding S(8 j + 2 t + {0, 1}, 16 w + g + {0, 8}) of n-tile j.  With the k slots of an mma
// taken in pairs (slot t <-> k0 + 2 t, slot t + 4 <-> k0 + 2 t + 1, as tc_mm does), a warp's
// accumulators of an (M = 16) x (N = 8 j) product are also the A operand of a product over
// those N as k: the chunk's two products run on registers, each warp on its own columns, with
// no barrier between them.  Only the chunk's tiles (W, K, Q, dO: the same for every warp) pass
// through shared memory, the next chunk's copied (cp.async) while this one multiplies.  tf32
// operands (bf16 ones exact), fp32 sums, as tc_mm.
//
// Against k_gdn_fwd_h / k_gdn_bwd_h (the state in shared memory, each product shared by the
// block's warps with a barrier between products), the same products with the operands and
// rounding of the same kind: a product's sums in another order.
#ifndef SL_GDN_WALK_CUH
#define SL_GDN_WALK_CUH

#define WK_C 16			// value columns per warp
#define WK_NJ (DKMAX / 8)	// n-tiles of the key dim, at most

// whether the register walks take the shape: dk a multiple of 8 up to DKMAX, a warp for each
// 16 value columns
static __host__ __device__ inline bool walk_fits(int dk, int dv)
{
	return dk > 0 && dk % 8 == 0 && dk <= DKMAX && dv > 0 && dv <= WK_C * (NTH / 32);
}

// row strides: the bf16 tiles (ldmatrix rows 16-byte aligned, consecutive rows in distinct banks
// for dk a multiple of 8), W in the forward (pairs of a row: dk + 8) and the backward (single
// elements of two rows: dk + 4), dO (dv rounded up to the warps' columns, + 8)
static __host__ __device__ inline int wk_ldk(int dk) { return dk + 8; }
static __host__ __device__ inline int wk_ldo(int dv) { return (dv + WK_C - 1) / WK_C * WK_C + 8; }

#ifdef __CUDA_ARCH__
// accumulator tiles to zero
template <int N>
static __device__ __forceinline__ void wk_zero(float (&x)[N][4])
{
#pragma unroll
	for (int i = 0; i < N; i++)
		x[i][0] = x[i][1] = x[i][2] = x[i][3] = 0.f;
}

// a bf16 pair (low: the first) as two tf32 registers (exact)
static __device__ __forceinline__ void wk_bf2(unsigned p, unsigned *lo, unsigned *hi)
{
	*lo = p << 16;
	*hi = p & 0xffff0000u;
}

// the state's elements of this lane out to a row-major (dk, dv) matrix at s: S^T's n-tile j
static __device__ __forceinline__ void wk_store_state(float *s, const float (&S)[WK_NJ][4],
						      int dk, int dv, int col, int t)
{
#pragma unroll
	for (int j = 0; j < WK_NJ; j++) {
		if (8 * j >= dk)
			break;
		float *p = s + (size_t)(8 * j + 2 * t) * dv + col;

		if (col < dv)
			p[0] = S[j][0], p[dv] = S[j][1];
		if (col + 8 < dv)
			p[8] = S[j][2], p[dv + 8] = S[j][3];
	}
}

// a (GC, dv) matrix's elements for this lane's accumulators of M (16 value columns) x N (GC
// positions), M^T's n-tile m: x[m] = (p(8m + 2t, col), p(8m + 2t + 1, col), the same at col + 8)
static __device__ __forceinline__ void wk_load_cols(float (&x)[GC / 8][4], const float *p, int dv,
						    int col, int t)
{
#pragma unroll
	for (int m = 0; m < GC / 8; m++) {
		const float *q = p + (size_t)(8 * m + 2 * t) * dv + col;

		x[m][0] = col < dv ? q[0] : 0.f;
		x[m][1] = col < dv ? q[dv] : 0.f;
		x[m][2] = col + 8 < dv ? q[8] : 0.f;
		x[m][3] = col + 8 < dv ? q[dv + 8] : 0.f;
	}
}

static __device__ __forceinline__ void wk_store_cols(float *p, const float (&x)[GC / 8][4], int dv,
						     int col, int t)
{
#pragma unroll
	for (int m = 0; m < GC / 8; m++) {
		float *q = p + (size_t)(8 * m + 2 * t) * dv + col;

		if (col < dv)
			q[0] = x[m][0], q[dv] = x[m][1];
		if (col + 8 < dv)
			q[8] = x[m][2], q[dv + 8] = x[m][3];
	}
}

// the A operand (k-step over the accumulators' columns) from an accumulator tile, times s
static __device__ __forceinline__ void wk_afrag(unsigned *a, const float *c, float s0, float s1)
{
	a[0] = mm_tf32(c[0] * s0);
	a[1] = mm_tf32(c[2] * s0);
	a[2] = mm_tf32(c[1] * s1);
	a[3] = mm_tf32(c[3] * s1);
}

// four B operands (k-step x 8 columns) from a bf16 tile p (row stride ld) by one ldmatrix: the 8
// x 8 blocks at rows r0 + 8q (RW) or columns c0 + 8q (else), columns c0 / rows r0.  TR: each
// block transposed (the mma's k along the tile's rows), else as it lies (k along its columns)
template <bool TR, bool RW>
static __device__ __forceinline__ void wk_ldb4(unsigned (&bb)[4][2], const bf16 *p, int ld, int r0,
					       int c0)
{
	const int lane = threadIdx.x & 31, q = lane >> 3;
	const uint32_t a = smem_u32(p + (r0 + (RW ? 8 * q : 0) + (lane & 7)) * ld + c0 +
				    (RW ? 0 : 8 * q));
	uint32_t r[4];

	if (TR)
		ldsm4t(r, a);
	else
		ldsm4(r, a);
#pragma unroll
	for (int i = 0; i < 4; i++)
		wk_bf2(r[i], &bb[i][0], &bb[i][1]);
}

#endif

// ---- the forward's walk ------------------------------------------------------------------------

// a chunk's tiles: W (GC, dk + 8) floats, G (GC) floats, K (GC, dk + 8) bf16; where the walk
// makes the output (fo) also Q (GC, dk + 8) bf16 and P (GC, GC + 8) floats
#define WK_LDP (GC + 8)

static __host__ __device__ inline size_t wk_fbuf_floats(int dk, bool fo)
{
	return (size_t)GC * wk_ldk(dk) + GC + (size_t)GC * wk_ldk(dk) / 2 +
	       (fo ? (size_t)GC * wk_ldk(dk) / 2 + (size_t)GC * WK_LDP : 0);
}

static __host__ size_t walk_fwd_smem(int dk, bool fo)
{
	return 2 * wk_fbuf_floats(dk, fo) * sizeof(float);
}

// Block (record, value head), after k_gdn_prep: the chunk-start states out, delta = U - W S,
// S = Ga_last S + K^T diag(e) delta.  o NULL: delta to delta_at (over U, or the backward's tile
// where aux) for k_gdn_fwd_o.  o given: the chunk's output too, o = diag(Ga) Q S + P delta (in
// k_gdn_fwd_o's place), and with aux, delta and diag(Ga) Q S out to the backward's tiles and
// their flag set.
__global__ void __launch_bounds__(NTH, 1) k_gdn_walk_fwd(bf16 *o, float *states, float *scr,
						      float *aux, const bf16 *qn, const bf16 *kn,
						      const int *lens, int L, int nk, int nv,
						      int dk, int dv)
{
#ifdef __CUDA_ARCH__
	extern __shared__ float sm[];
	const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
	const int ldk = wk_ldk(dk), nch = (L + GC - 1) / GC, col = WK_C * warp + g;
	const bool fo = o != NULL;
	const size_t nb = wk_fbuf_floats(dk, fo), od = (size_t)nv * dv;
	int b = blockIdx.x / nv, h = blockIdx.x % nv, kh = h / (nv / nk), len = lens[b];
	const size_t SS = (size_t)dk * dv;
	float S[WK_NJ][4];

	if (fo && aux && !blockIdx.x && !tid)	// the tiles are this forward's (stream order)
		*(int *)aux = 1;
	wk_zero(S);

	// chunk ch's tiles into buffer ch & 1 (a commit group of their own, empty past the record)
	auto fetch = [&](int ch) {
		int n = ch < nch ? chunk_n(len, ch * GC) : 0;

		if (n) {
			float *W = sm + (ch & 1) * nb, *G = W + (size_t)GC * ldk;
			bf16 *K = (bf16 *)(G + GC), *Q = K + (size_t)GC * ldk;
			struct fslot f = fslot_at(scr, (size_t)blockIdx.x * nch + ch, dk, dv, 0);
			size_t kq = ((size_t)b * L + ch * GC) * nk * dk + (size_t)kh * dk;

			ld_tile_f(W, ldk, f.W, dk, GC, dk);
			ld_tile_f(G, GC, f.G, GC, 1, GC);
			ld_tile_bf(K, ldk, kn + kq, (size_t)nk * dk, n, dk, dk);
			if (fo) {
				ld_tile_bf(Q, ldk, qn + kq, (size_t)nk * dk, n, dk, dk);
				ld_tile_f((float *)(Q + (size_t)GC * ldk), WK_LDP, f.P, GC, GC, GC);
			}
		}
		cp_commit();
	};

	fetch(0);
	for (int ch = 0; ch < nch; ch++) {
		int n = chunk_n(len, ch * GC), c0 = ch * GC;
		const float *W = sm + (ch & 1) * nb, *G = W + (size_t)GC * ldk;
		const bf16 *K = (const bf16 *)(G + GC), *Q = K + (size_t)GC * ldk;
		const float *Pt = (const float *)(Q + (size_t)GC * ldk);
		const struct fslot f = fslot_at(scr, (size_t)blockIdx.x * nch + ch, dk, dv, 0);
		float *dt = delta_at(scr, aux, blockIdx.x, ch, nch, nv, dk, dv);
		bf16 *oc = fo ? o + ((size_t)b * L + c0) * od + (size_t)h * dv : NULL;
		float D[GC / 8][4], P[GC / 8][4], O[GC / 8][4];

		if (warp * WK_C < dv)
			wk_store_state(states + (((size_t)b * nch + ch) * nv + h) * SS, S, dk, dv,
				       col, t);
		fetch(ch + 1);
		if (!n) {	// past the record: zero output rows
			if (fo && warp * WK_C < dv)
				for (int r = 0; r < GC && c0 + r < L; r++) {
					if (col < dv)
						oc[(size_t)r * od + col] = tobf(0.f);
					if (col + 8 < dv)
						oc[(size_t)r * od + col + 8] = tobf(0.f);
				}
			continue;
		}
		if (warp * WK_C < dv)	// U's elements of this lane, in flight during the wait
			wk_load_cols(D, f.U, dv, col, t);
		cp_wait1();
		__syncthreads();
		if (warp * WK_C < dv) {
			const float gl = expf(G[GC - 1]);

			// P = S^T W^T (16 x GC): k-steps over dk, B = W^T from W's rows in pairs;
			// fo: O = S^T Q^T the same way, B = Q^T by ldmatrix
			wk_zero(P);
			wk_zero(O);
#pragma unroll
			for (int j = 0; j < WK_NJ; j++) {
				unsigned a[4];

				if (8 * j >= dk)
					break;
				wk_afrag(a, S[j], 1.f, 1.f);
#pragma unroll
				for (int m = 0; m < GC / 8; m++) {
					float2 w = *(const float2 *)(W + (8 * m + g) * ldk + 8 * j +
								     2 * t);
					unsigned bb[2] = {mm_tf32(w.x), mm_tf32(w.y)};

					mm_mma(P[m], a, bb);
				}
				if (fo)
#pragma unroll
					for (int m0 = 0; m0 < GC / 8; m0 += 4) {
						unsigned bb[4][2];

						wk_ldb4<false, true>(bb, Q, ldk, 8 * m0, 8 * j);
#pragma unroll
						for (int q = 0; q < 4; q++)
							mm_mma(O[m0 + q], a, bb[q]);
					}
			}
			// delta^T = U^T - P
#pragma unroll
			for (int m = 0; m < GC / 8; m++)
#pragma unroll
				for (int x = 0; x < 4; x++)
					D[m][x] -= P[m][x];
			if (!fo || aux)
				wk_store_cols(dt, D, dv, col, t);
			if (fo) {	// O = diag(Ga) Q S (out where aux) + P delta: O^T += delta^T P^T
#pragma unroll
				for (int m = 0; m < GC / 8; m++) {
					float a0 = expf(G[8 * m + 2 * t]), a1 = expf(G[8 * m + 2 * t + 1]);

					O[m][0] *= a0, O[m][1] *= a1, O[m][2] *= a0, O[m][3] *= a1;
				}
				if (aux)
					wk_store_cols(dt + (size_t)GC * dv, O, dv, col, t);
#pragma unroll
				for (int m = 0; m < GC / 8; m++) {	// k-step: positions 8m ..
					unsigned a[4];

					wk_afrag(a, D[m], 1.f, 1.f);
#pragma unroll
					for (int r = m; r < GC / 8; r++) {	// P is 0 past s > r
						float2 p = *(const float2 *)(Pt + (8 * r + g) * WK_LDP +
									     8 * m + 2 * t);
						unsigned bb[2] = {mm_tf32(p.x), mm_tf32(p.y)};

						mm_mma(O[r], a, bb);
					}
				}
#pragma unroll
				for (int m = 0; m < GC / 8; m++) {
					int r = 8 * m + 2 * t;
					bf16 *q = oc + (size_t)r * od + col;

					if (c0 + r < L && col < dv)
						q[0] = tobf(O[m][0]);
					if (c0 + r + 1 < L && col < dv)
						q[od] = tobf(O[m][1]);
					if (c0 + r < L && col + 8 < dv)
						q[8] = tobf(O[m][2]);
					if (c0 + r + 1 < L && col + 8 < dv)
						q[od + 8] = tobf(O[m][3]);
				}
			}
			// the update's A operands: delta^T times e (k-steps: positions 8m ..)
			unsigned A[GC / 8][4];

#pragma unroll
			for (int m = 0; m < GC / 8; m++) {
				float e0 = expf(G[GC - 1] - G[8 * m + 2 * t]);
				float e1 = expf(G[GC - 1] - G[8 * m + 2 * t + 1]);

				wk_afrag(A[m], D[m], e0, e1);
			}
			// S^T = Ga_last S^T + (delta^T diag(e)) K: B = K by ldmatrix.trans, four
			// k-steps a load
#pragma unroll
			for (int j = 0; j < WK_NJ; j++) {
				if (8 * j >= dk)
					break;
#pragma unroll
				for (int x = 0; x < 4; x++)
					S[j][x] *= gl;
#pragma unroll
				for (int m0 = 0; m0 < GC / 8; m0 += 4) {
					unsigned bb[4][2];

					wk_ldb4<true, true>(bb, K, ldk, 8 * m0, 8 * j);
#pragma unroll
					for (int q = 0; q < 4; q++)
						mm_mma(S[j], A[m0 + q], bb[q]);
				}
			}
		}
		__syncthreads();	// the buffer free for chunk ch + 2's copies
	}
	cp_wait_all();
#endif
}

// ---- the backward's walk -----------------------------------------------------------------------

// a chunk's tiles: W (GC, dk + 4) floats, G (GC) floats, K and Q (GC, dk + 8) and dO (GC,
// wk_ldo(dv)) bf16
static __host__ __device__ inline size_t wk_bbuf_floats(int dk, int dv)
{
	return (size_t)GC * (dk + 4) + GC + (size_t)GC * wk_ldk(dk) +
	       (size_t)GC * wk_ldo(dv) / 2;
}

static __host__ size_t walk_bwd_smem(int dk, int dv)
{
	return 2 * wk_bbuf_floats(dk, dv) * sizeof(float);
}

// Block = slot of the wave's value heads (as k_gdn_bwd_h), after k_gdn_prep's full slots: dS at
// every chunk's end into dst; KD = K dS; ddelta = X + diag(e) KD; dS = Ga_last dS + Q^T
// diag(Ga) dO - W^T ddelta.  For the gradients: where aux is given with its flag set (the
// forward's tiles, for k_gdn_grad_v), ddelta over the slot's X; else KD over the slot's W where
// dv <= dk (for k_gdn_bwd_grad's own loop).
__global__ void __launch_bounds__(NTH, 1) k_gdn_walk_bwd(float *dst, float *scr, const bf16 *dout,
						      const bf16 *qn, const bf16 *kn,
						      const float *aux, const int *lens, int L,
						      int nk, int nv, int dk, int dv, int first)
{
#ifdef __CUDA_ARCH__
	const bool dd = aux && *(const int *)aux;	// ddelta out (else KD)
	extern __shared__ float sm[];
	const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
	const int ldk = wk_ldk(dk), ldw = dk + 4, ldo = wk_ldo(dv), grp = nv / nk;
	const int col = WK_C * warp + g, nch = (L + GC - 1) / GC;
	int slot = blockIdx.x, bh = first * grp + slot, b = bh / nv, h = bh % nv, kh = h / grp;
	int len = lens[b];
	const size_t SS = (size_t)dk * dv;
	float dS[WK_NJ][4];

	wk_zero(dS);

	auto fetch = [&](int ch) {
		int n = ch >= 0 ? chunk_n(len, ch * GC) : 0;

		if (n) {
			float *W = sm + (ch & 1) * wk_bbuf_floats(dk, dv), *G = W + (size_t)GC * ldw;
			bf16 *K = (bf16 *)(G + GC), *Q = K + (size_t)GC * ldk, *dO = Q + (size_t)GC * ldk;
			struct fslot f = fslot_at(scr, (size_t)slot * nch + ch, dk, dv, 1);
			size_t t0 = (size_t)b * L + ch * GC;

			ld_tile_f(W, ldw, f.W, dk, GC, dk);
			ld_tile_f(G, GC, f.G, GC, 1, GC);
			tl_kq(K, Q, qn, kn, t0, n, nk, dk, kh);
			ld_tile_bf(dO, ldo, dout + t0 * nv * dv + (size_t)h * dv, (size_t)nv * dv, n,
				   dv, ldo - 8);
		}
		cp_commit();
	};

	fetch(nch - 1);
	for (int ch = nch - 1; ch >= 0; ch--) {
		int n = chunk_n(len, ch * GC);
		float *W = sm + (ch & 1) * wk_bbuf_floats(dk, dv), *G = W + (size_t)GC * ldw;
		const bf16 *K = (const bf16 *)(G + GC), *Q = K + (size_t)GC * ldk;
		const bf16 *dO = Q + (size_t)GC * ldk;
		const struct fslot f = fslot_at(scr, (size_t)slot * nch + ch, dk, dv, 1);
		float X[GC / 8][4], KD[GC / 8][4];

		if (warp * WK_C < dv)
			wk_store_state(dst + ((size_t)slot * nch + ch) * SS, dS, dk, dv, col, t);
		fetch(ch - 1);
		if (!n)
			continue;
		if (warp * WK_C < dv)	// X = P^T dO (k_gdn_prep's), in flight during the wait
			wk_load_cols(X, f.U, dv, col, t);
		cp_wait1();
		__syncthreads();
		if (warp * WK_C < dv) {
			const float gl = expf(G[GC - 1]);

			// KD^T = dS^T K^T (16 x GC): k-steps over dk, B = K^T by ldmatrix, four
			// n-tiles (positions) a load
			wk_zero(KD);
#pragma unroll
			for (int j = 0; j < WK_NJ; j++) {
				unsigned a[4];

				if (8 * j >= dk)
					break;
				wk_afrag(a, dS[j], 1.f, 1.f);
#pragma unroll
				for (int m0 = 0; m0 < GC / 8; m0 += 4) {
					unsigned bb[4][2];

					wk_ldb4<false, true>(bb, K, ldk, 8 * m0, 8 * j);
#pragma unroll
					for (int q = 0; q < 4; q++)
						mm_mma(KD[m0 + q], a, bb[q]);
				}
			}
			if (!dd && dv <= dk)	// over the slot's W (in shared memory here)
				wk_store_cols(f.W, KD, dv, col, t);
			// ddelta^T = X^T + KD^T diag(e), as A operands times -1 (k-steps: positions)
			unsigned A[GC / 8][4];

#pragma unroll
			for (int m = 0; m < GC / 8; m++) {
				float e0 = expf(G[GC - 1] - G[8 * m + 2 * t]);
				float e1 = expf(G[GC - 1] - G[8 * m + 2 * t + 1]);

				X[m][0] += e0 * KD[m][0], X[m][1] += e1 * KD[m][1];
				X[m][2] += e0 * KD[m][2], X[m][3] += e1 * KD[m][3];
				wk_afrag(A[m], X[m], -1.f, -1.f);
			}
			if (dd)	// over the slot's X (this lane's own elements)
				wk_store_cols(f.U, X, dv, col, t);
#pragma unroll
			for (int j = 0; j < WK_NJ; j++) {
				if (8 * j >= dk)
					break;
#pragma unroll
				for (int x = 0; x < 4; x++)
					dS[j][x] *= gl;
			}
			// dS^T += (dO^T diag(Ga)) Q: A = dO^T by ldmatrix.trans (two k-steps a load),
			// B = Q by ldmatrix.trans (four n-tiles a load)
#pragma unroll
			for (int m = 0; m < GC / 8; m += 2) {
				uint32_t o[4];
				unsigned ao[2][4];

				ldsm4t(o, smem_u32(dO + (8 * (m + (lane >> 4)) + (lane & 7)) * ldo +
						   WK_C * warp + 8 * ((lane >> 3) & 1)));
#pragma unroll
				for (int u = 0; u < 2; u++) {
					float s0 = expf(G[8 * (m + u) + 2 * t]);
					float s1 = expf(G[8 * (m + u) + 2 * t + 1]);
					unsigned l0, h0, l1, h1;

					wk_bf2(o[2 * u], &l0, &h0);
					wk_bf2(o[2 * u + 1], &l1, &h1);
					ao[u][0] = mm_tf32(__uint_as_float(l0) * s0);
					ao[u][1] = mm_tf32(__uint_as_float(l1) * s0);
					ao[u][2] = mm_tf32(__uint_as_float(h0) * s1);
					ao[u][3] = mm_tf32(__uint_as_float(h1) * s1);
				}
#pragma unroll
				for (int j0 = 0; j0 < WK_NJ; j0 += 4) {
					if (8 * j0 >= dk)
						break;
#pragma unroll
					for (int u = 0; u < 2; u++) {
						unsigned bb[4][2];

						wk_ldb4<true, false>(bb, Q, ldk, 8 * (m + u), 8 * j0);
#pragma unroll
						for (int q = 0; q < 4; q++) {
							if (8 * (j0 + q) >= dk)
								break;
							mm_mma(dS[j0 + q], ao[u], bb[q]);
						}
					}
				}
			}
			// dS^T -= ddelta^T W: B = W (positions x dk), two rows' elements a lane
#pragma unroll
			for (int m = 0; m < GC / 8; m++)
#pragma unroll
				for (int j = 0; j < WK_NJ; j++) {
					if (8 * j >= dk)
						break;
					const float *w = W + (8 * m + 2 * t) * ldw + 8 * j + g;
					unsigned bb[2] = {mm_tf32(w[0]), mm_tf32(w[ldw])};

					mm_mma(dS[j], A[m], bb);
				}
		}
		__syncthreads();	// the buffer free for chunk ch - 2's copies
	}
	cp_wait_all();
#endif
}

#endif
