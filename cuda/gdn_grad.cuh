// gdn_grad.cuh: the chunked gated delta rule's backward gradients with their sums in registers
// (k_gdn_grad_v, k_gdn_grad_k, around k_gdn_bwd_grad's 64 x 64 part).  Included by gdn_chunk.cu
// after gdn_walk.cuh; GPU only (test_gdn_chunk runs k_gdn_bwd_grad's part on the host given
// what these make, made there in double; test_cuda_qwen35 holds the three to the cpu).
//
// k_gdn_bwd_grad alone makes every gradient of a chunk in one block of 8 warps sharing each
// product, one block an SM (227 kB of shared memory), with a barrier between products and its
// dq, dk accumulators in global memory.  Most of its products sum over the value columns j of
// a (value head, chunk) with the result GC x dk or GC x GC:
//   dq  += diag(Ga) dO S0^T       dk += diag(e) delta dS^T       dW = -dD S0^T
//   dP   = dO delta^T              dT  = dD V^T
// with dD = X + diag(e) K dS (the backward's walk leaves it in the slot), and, per column, dv =
// diag(beta) T^T dD, and the rows' sums q.z = (diag(Ga) Q S0 o dO) 1, d.e = (K dS o delta) 1,
// x.v = (T^T dD o V) 1 and <S0, dS>.  k_gdn_grad_v: block (group of the wave, chunk, half of
// dk) walks its key head's value heads and their value columns in tiles of GV_TW, the next
// tiles copied (cp.async, three stages) while this one multiplies: each warp holds its share of
// those products as m16n8k8 accumulators for the whole walk (rows 16 (w % 4) .., its n-tiles
// of the half, and of dP (half 0) or dT (half 1)), with two barriers a tile (the tile in, the
// stage free).  The dq, dk sums over the key head's value heads go to k_gdn_bwd_grad's
// accumulators (acc); dW, dP, dT and the rows' sums of each value head to a slot of the scratch
// (gv), from which k_gdn_bwd_grad does the GC x GC part (dbeta, dg, and M, D + D^T into gv) and
// k_gdn_grad_k the dq, dk terms through it.  tf32 operands (bf16 ones exact), fp32 sums, with
// the k slots of an mma paired (slot t <-> k0 + 2 t, t + 4 <-> k0 + 2 t + 1) so that each
// operand pair is one 8-byte load.  Products with a triangular factor (T, M) skip the k-steps
// of its zeros (exact).
#ifndef SL_GDN_GRAD_CUH
#define SL_GDN_GRAD_CUH

#define GV_TW 32		// value columns a tile
#define GV_LD (GV_TW + 8)	// row stride of a tile, floats or bf16 (pairs of a row in distinct
				// banks across a half warp)
#define GV_LDT (GC + 4)		// T's row stride (T^T's elements, two rows a lane, distinct banks)

// whether the shape takes them: dk a multiple of 8 up to DKMAX (each half of it at most GC rows
// of S0); dv <= dk, the shapes checked on the H200 so far (the kernels themselves need it no
// longer since the walk leaves them ddelta rather than K dS in a slot's W)
static __host__ __device__ inline bool grad_fits(int dk, int dv)
{
	return dk > 0 && dk % 8 == 0 && dk <= DKMAX && dv > 0 && dv <= dk;
}

// a stage of the pipeline: S0 and dS (the half's rows), delta, dD (GC rows) as floats, dO and V
// as bf16, each GC x GV_LD; a value head's: T (GC, GV_LDT), G and beta (GC); the key head's K
// and Q, the half's columns (GC, GC + 8) bf16; the rows' sums of the two warps of a row (3, 2,
// GC)
#define GV_STAGES 3
#define GV_BUF (5 * GC * GV_LD)
#define GV_HEAD (GC * GV_LDT + 2 * GC)
#define GV_LDK (GC + 8)

static __host__ size_t grad_v_smem(void)
{
	return ((size_t)GV_STAGES * (GV_BUF + GV_HEAD) + GC * GV_LDK + 6 * GC) * sizeof(float);
}

#ifdef __CUDA_ARCH__
// rows [0, R) x GV_TW columns of dst (floats, stride GV_LD): (r, j) = src[r ss + j] for r < n
// and j < w, else 0, by cp.async (16 bytes where four columns are in or out together and the
// source allows)
static __device__ __forceinline__ void gv_ld(float *dst, const float *src, size_t ss, int R, int n,
					     int w)
{
	const bool al = !(ss & 3) && !((unsigned long long)src & 15);

	for (int x = threadIdx.x; x < R * (GV_TW / 4); x += NTH) {
		int r = x / (GV_TW / 4), j = 4 * (x % (GV_TW / 4));
		uint32_t d = smem_u32(dst + r * GV_LD + j);
		const float *s = src + r * ss + j;

		if (al && (r >= n || j >= w || j + 4 <= w)) {
			bool ok = r < n && j < w;

			cp_async16(d, ok ? s : src, ok);
		} else {
			for (int u = 0; u < 4; u++) {
				bool ok = r < n && j + u < w;

				cp_async4(d + 4 * u, ok ? s + u : src, ok);
			}
		}
	}
}

// block (group first + gi of the wave, chunk ch, half hf of dk) of k_gdn_grad_v / _k: its
// record b, key head kh, first row c0 (t0 of all), the chunk's rows in the record n, and the
// half's n-tiles of dk [j0h, j0h + nh) (nh 0 for half 1 where dk is 8)
struct gvb {
	int hf, gi, ch, b, kh, c0, n, j0h, nh;
	size_t t0;
};

static __device__ __forceinline__ struct gvb gv_block(const int *lens, int L, int nk, int dk,
						      int first)
{
	const int nch = (L + GC - 1) / GC, gc = blockIdx.x >> 1, NH = (dk / 8 + 1) / 2;
	struct gvb k;

	k.hf = blockIdx.x & 1, k.gi = gc / nch, k.ch = gc % nch;
	k.b = (first + k.gi) / nk, k.kh = (first + k.gi) % nk;
	k.c0 = k.ch * GC, k.n = chunk_n(lens[k.b], k.c0);
	k.j0h = k.hf * NH, k.nh = dk / 8 - k.j0h < NH ? dk / 8 - k.j0h : NH;
	k.t0 = (size_t)k.b * L + k.c0;
	return k;
}

// a value head's T (stride GV_LDT), then G and beta (GC each) by cp.async
static __device__ __forceinline__ void gv_ld_head(float *T, const struct fslot *f,
						  const float *beta, size_t t0, int n, int nv, int h)
{
	float *G = T + GC * GV_LDT;
	const int r = threadIdx.x;

	ld_tile_f(T, GV_LDT, f->T, GC, GC, GC);
	ld_tile_f(G, GC, f->G, GC, 1, GC);
	if (r < GC)
		cp_async4(smem_u32(G + GC + r), beta + (r < n ? (t0 + r) * nv + h : 0), r < n);
}

// the key head's K and Q, columns [8 j0h, 8 (j0h + nh)), into (GC, GV_LDK) bf16 tiles
static __device__ __forceinline__ void gv_ld_kq(bf16 *Kh, bf16 *Qh, const bf16 *kn,
						const bf16 *qn, size_t t0, int n, int nk, int dk,
						int kh, int j0h, int nh)
{
	const size_t o = t0 * nk * dk + (size_t)kh * dk + 8 * j0h;

	ld_tile_bf(Kh, GV_LDK, kn + o, (size_t)nk * dk, n, 8 * nh, GC);
	ld_tile_bf(Qh, GV_LDK, qn + o, (size_t)nk * dk, n, 8 * nh, GC);
}

// the dot products of rows ra, rb of this lane's accumulators (n-tiles wn + 2 u of the half) and
// of a bf16 (GC, GV_LDK) tile of the half's columns, over the lane's columns
static __device__ __forceinline__ void gv_rowdot(float *da, float *db, const float (&Y)[4][4],
						 const bf16 *K, int ra, int rb, int wn, int nh,
						 int t)
{
	float a = 0.f, b = 0.f;

#pragma unroll
	for (int u = 0; u < 4; u++) {
		const int jl = wn + 2 * u, i = 8 * jl + 2 * t;

		if (jl < nh) {
			unsigned p = *(const unsigned *)(K + ra * GV_LDK + i), l, h;
			unsigned q = *(const unsigned *)(K + rb * GV_LDK + i);

			wk_bf2(p, &l, &h);
			a += Y[u][0] * __uint_as_float(l) + Y[u][1] * __uint_as_float(h);
			wk_bf2(q, &l, &h);
			b += Y[u][2] * __uint_as_float(l) + Y[u][3] * __uint_as_float(h);
		}
	}
	*da = a, *db = b;
}
#endif

// Block (group first + gi of the wave, chunk ch, half hf of dk) = blockIdx.x / 2 / nch, .. %
// nch, blockIdx.x % 2, after the backward's walk (dst; ddelta over the slots' X), with
// k_gdn_prep's full slots of the wave and the forward's delta tiles (aux, flag set: else it
// returns, and k_gdn_bwd_grad makes it all itself).  Writes acc's columns of the half (dq, dk:
// the key head's value heads summed in order), gv's slots (dW's columns of the half; dP or dT;
// the half's shares of the rows' sums) and dval's columns of the tiles of its parity.  The rows'
// sums come from the accumulators: diag(Ga) Q S0 o dO summed over the columns is (Q o dq_h) 1,
// diag(e) (K dS o delta) 1 is (K o dk_h) 1, with dq_h, dk_h the value head's share of the dq,
// dk sums (the difference of the running sums' dot products before and after it).
__global__ void __launch_bounds__(NTH, 1) k_gdn_grad_v(float *gv, float *acc, bf16 *dval,
						    const float *dst, const float *slots,
						    const float *states, const float *aux,
						    const bf16 *qn, const bf16 *kn,
						    const bf16 *dout, const bf16 *v, int vs,
						    const float *beta, const int *lens, int L,
						    int nk, int nv, int dk, int dv, int first)
{
#ifdef __CUDA_ARCH__
	extern __shared__ float sm[];
	const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
	const int wm = warp & 3, wn = warp >> 2, ra = 16 * wm + g, rb = ra + 8, grp = nv / nk;
	const int nch = (L + GC - 1) / GC, nt = (dv + GV_TW - 1) / GV_TW, total = grp * nt;
	const struct gvb blk = gv_block(lens, L, nk, dk, first);
	const int hf = blk.hf, gi = blk.gi, ch = blk.ch, b = blk.b, kh = blk.kh, c0 = blk.c0;
	const int n = blk.n, j0h = blk.j0h, nh = blk.nh;
	const size_t t0 = blk.t0, SS = (size_t)dk * dv;
	float *HB = sm + GV_STAGES * GV_BUF, *rs = HB + GV_STAGES * GV_HEAD + GC * GV_LDK;
	bf16 *Kh = (bf16 *)(HB + GV_STAGES * GV_HEAD), *Qh = Kh + GC * GV_LDK;

	if (!aux || !*(const int *)aux || !n)
		return;

	const float *adel = aux + AUX_HEAD + (((size_t)b * nch + ch) * nv + kh * grp) * 2 * GC * dv;
	// dq, dk (Y1, Y2: over the key head's value heads), dW (Y3) of the warp's n-tiles of the
	// half, dP or dT (PT: n-tiles 4 wn ..), the rows' partial sums
	float Y1[4][4], Y2[4][4], Y3[4][4], PT[4][4];
	float sdp = 0.f, xva = 0.f, xvb = 0.f, qpa = 0.f, qpb = 0.f, kpa = 0.f, kpb = 0.f;
	float gaa = 0.f, gab = 0.f, ea = 0.f, eb = 0.f;

	wk_zero(Y1);
	wk_zero(Y2);

	// tile tau (value head tau / nt, columns (tau % nt) GV_TW ..) into stage tau % GV_STAGES,
	// with the value head's T, G and beta at its first tile (head buffer hg % GV_STAGES), K and
	// Q with tile 0 (a commit group a tile, empty past the last)
	auto fetch = [&](int tau) {
		if (tau < total) {
			const int hg = tau / nt, j0 = tau % nt * GV_TW, h = kh * grp + hg;
			const int w = dv - j0 < GV_TW ? dv - j0 : GV_TW;
			const size_t slot = ((size_t)gi * grp + hg) * nch + ch;
			const struct fslot f = fslot_at((float *)slots, slot, dk, dv, 1);
			float *B = sm + tau % GV_STAGES * GV_BUF;
			bf16 *dO = (bf16 *)(B + 4 * GC * GV_LD), *V = dO + GC * GV_LD;
			const size_t r0 = (size_t)8 * j0h * dv + j0;	// the half's first row

			gv_ld(B, states + (((size_t)b * nch + ch) * nv + h) * SS + r0, dv, 8 * nh,
			      8 * nh, w);
			gv_ld(B + GC * GV_LD, dst + slot * SS + r0, dv, 8 * nh, 8 * nh, w);
			gv_ld(B + 2 * GC * GV_LD, adel + (size_t)hg * 2 * GC * dv + j0, dv, GC, n, w);
			gv_ld(B + 3 * GC * GV_LD, f.U + j0, dv, GC, n, w);
			ld_tile_bf(dO, GV_LD, dout + t0 * nv * dv + (size_t)h * dv + j0,
				   (size_t)nv * dv, n, w, GV_TW);
			ld_tile_bf(V, GV_LD, v + t0 * vs + (size_t)h * dv + j0, (size_t)vs, n, w,
				   GV_TW);
			if (!j0)
				gv_ld_head(HB + hg % GV_STAGES * GV_HEAD, &f, beta, t0, n, nv, h);
			if (!tau)
				gv_ld_kq(Kh, Qh, kn, qn, t0, n, nk, dk, kh, j0h, nh);
		}
		cp_commit();
	};

	for (int x = 0; x < GV_STAGES - 1; x++)
		fetch(x);
	for (int tau = 0; tau < total; tau++) {
		const int hg = tau / nt, jt = tau % nt, j0 = jt * GV_TW, h = kh * grp + hg;
		const size_t slot = ((size_t)gi * grp + hg) * nch + ch;
		const float *B = sm + tau % GV_STAGES * GV_BUF, *S0 = B, *dS = B + GC * GV_LD;
		const float *DL = B + 2 * GC * GV_LD, *DD = B + 3 * GC * GV_LD;
		const bf16 *dO = (const bf16 *)(B + 4 * GC * GV_LD), *V = dO + GC * GV_LD;
		const float *T = HB + hg % GV_STAGES * GV_HEAD, *G = T + GC * GV_LDT, *bet = G + GC;

		fetch(tau + GV_STAGES - 1);
		cp_wait2();
		__syncthreads();
		if (!jt) {	// the value head's first tile
			wk_zero(Y3);
			wk_zero(PT);
			sdp = xva = xvb = 0.f;
			gaa = expf(G[ra]), gab = expf(G[rb]);
			ea = expf(G[GC - 1] - G[ra]), eb = expf(G[GC - 1] - G[rb]);
		}
		// the sums over the tile's columns: k-steps of 8 columns, the pairs (k, k + 1)
#pragma unroll
		for (int ks = 0; ks < GV_TW / 8; ks++) {
			const int k = 8 * ks + 2 * t;
			unsigned ao[4], aq[4], ad[4], aD[4], l0, h0, l1, h1;
			const float2 d0 = *(const float2 *)(DL + ra * GV_LD + k);
			const float2 d1 = *(const float2 *)(DL + rb * GV_LD + k);
			const float2 x0 = *(const float2 *)(DD + ra * GV_LD + k);
			const float2 x1 = *(const float2 *)(DD + rb * GV_LD + k);

			wk_bf2(*(const unsigned *)(dO + ra * GV_LD + k), &l0, &h0);
			wk_bf2(*(const unsigned *)(dO + rb * GV_LD + k), &l1, &h1);
			ao[0] = l0, ao[1] = l1, ao[2] = h0, ao[3] = h1;	// dO, exact
			aq[0] = mm_tf32(__uint_as_float(l0) * gaa);	// diag(Ga) dO
			aq[1] = mm_tf32(__uint_as_float(l1) * gab);
			aq[2] = mm_tf32(__uint_as_float(h0) * gaa);
			aq[3] = mm_tf32(__uint_as_float(h1) * gab);
			ad[0] = mm_tf32(d0.x * ea), ad[1] = mm_tf32(d1.x * eb);	// diag(e) delta
			ad[2] = mm_tf32(d0.y * ea), ad[3] = mm_tf32(d1.y * eb);
			aD[0] = mm_tf32(x0.x), aD[1] = mm_tf32(x1.x);		// dD
			aD[2] = mm_tf32(x0.y), aD[3] = mm_tf32(x1.y);
#pragma unroll
			for (int u = 0; u < 4; u++) {	// the half's n-tiles wn, wn + 2, ..
				const int jl = wn + 2 * u;

				if (jl < nh) {
					const float2 s = *(const float2 *)(S0 + (8 * jl + g) * GV_LD + k);
					const float2 q = *(const float2 *)(dS + (8 * jl + g) * GV_LD + k);
					unsigned bs[2] = {mm_tf32(s.x), mm_tf32(s.y)};
					unsigned bq[2] = {mm_tf32(q.x), mm_tf32(q.y)};

					mm_mma(Y1[u], aq, bs);
					mm_mma(Y3[u], aD, bs);
					mm_mma(Y2[u], ad, bq);
					if (!wm)	// <S0, dS>: each element once, by warps 0 and 4
						sdp += s.x * q.x + s.y * q.y;
				}
			}
#pragma unroll
			for (int u = 0; u < 4; u++) {	// positions s: n-tiles 4 wn ..
				const int s = 8 * (4 * wn + u) + g;
				unsigned bb[2];

				if (!hf) {	// dP += dO delta^T
					const float2 d = *(const float2 *)(DL + s * GV_LD + k);

					bb[0] = mm_tf32(d.x), bb[1] = mm_tf32(d.y);
					mm_mma(PT[u], ao, bb);
				} else {	// dT += dD V^T
					wk_bf2(*(const unsigned *)(V + s * GV_LD + k), &bb[0], &bb[1]);
					mm_mma(PT[u], aD, bb);
				}
			}
		}
		if ((jt & 1) == hf) {	// this tile's dv = diag(beta) T^T dD, x.v
			float Xv[2][4];

			wk_zero(Xv);
			for (int ks = 2 * wm; ks < GC / 8; ks++) {	// s >= 16 wm: T(s, r) for r >= 16 wm
				const int s = 8 * ks + 2 * t;
				unsigned a[4] = {mm_tf32(T[s * GV_LDT + ra]), mm_tf32(T[s * GV_LDT + rb]),
						 mm_tf32(T[(s + 1) * GV_LDT + ra]),
						 mm_tf32(T[(s + 1) * GV_LDT + rb])};

#pragma unroll
				for (int q = 0; q < 2; q++) {
					const int jc = 8 * (2 * wn + q) + g;
					unsigned bb[2] = {mm_tf32(DD[s * GV_LD + jc]),
							  mm_tf32(DD[(s + 1) * GV_LD + jc])};

					mm_mma(Xv[q], a, bb);
				}
			}
#pragma unroll
			for (int q = 0; q < 2; q++) {
				const int jc = 8 * (2 * wn + q) + 2 * t;

#pragma unroll
				for (int hi = 0; hi < 2; hi++) {
					const int r = hi ? rb : ra;
					const float y0 = Xv[q][2 * hi], y1 = Xv[q][2 * hi + 1];
					const float p = y0 * bf(V[r * GV_LD + jc]) +
							y1 * bf(V[r * GV_LD + jc + 1]);
					bf16 *o = dval + (t0 + r) * vs + (size_t)h * dv + j0 + jc;

					if (hi)
						xvb += p;
					else
						xva += p;
					if (c0 + r < L && j0 + jc < dv)
						o[0] = tobf(r < n ? bet[r] * y0 : 0.f);
					if (c0 + r < L && j0 + jc + 1 < dv)
						o[1] = tobf(r < n ? bet[r] * y1 : 0.f);
				}
			}
		}
		if (jt == nt - 1) {	// the value head's dW (columns of the half), dP or dT, sums
			float *gs = gv + slot * gv_floats(dk), *pt = gs + (size_t)GC * dk + hf * GC * GC;
			float *vec = gs + (size_t)GC * dk + 2 * GC * GC + hf * 4 * GC;
			float qa, qb, ka, kb, s;

#pragma unroll
			for (int u = 0; u < 4; u++) {
				const int jl = wn + 2 * u, i = 8 * (j0h + jl) + 2 * t;

				if (jl < nh) {
					*(float2 *)(gs + ra * dk + i) = make_float2(-Y3[u][0], -Y3[u][1]);
					*(float2 *)(gs + rb * dk + i) = make_float2(-Y3[u][2], -Y3[u][3]);
				}
			}
#pragma unroll
			for (int u = 0; u < 4; u++) {
				const int c = 8 * (4 * wn + u) + 2 * t;

				*(float2 *)(pt + ra * GC + c) = make_float2(PT[u][0], PT[u][1]);
				*(float2 *)(pt + rb * GC + c) = make_float2(PT[u][2], PT[u][3]);
			}
			// q.z and d.e o e: this value head's share of Q o dq and K o dk
			gv_rowdot(&qa, &qb, Y1, Qh, ra, rb, wn, nh, t);
			gv_rowdot(&ka, &kb, Y2, Kh, ra, rb, wn, nh, t);
			{
				float d[6] = {qa - qpa, qb - qpb, ka - kpa, kb - kpb, xva, xvb};

				qpa = qa, qpb = qb, kpa = ka, kpb = kb;
#pragma unroll
				for (int x = 0; x < 6; x++)
					d[x] = quad_sum(d[x]);
				if (!t)
#pragma unroll
					for (int x = 0; x < 3; x++) {
						rs[(2 * x + wn) * GC + ra] = d[2 * x];
						rs[(2 * x + wn) * GC + rb] = d[2 * x + 1];
					}
			}
			s = block_sum(sdp);	// (its barriers publish rs)
			if (tid < GC)
#pragma unroll
				for (int x = 0; x < 3; x++)
					vec[x * GC + tid] = rs[2 * x * GC + tid] +
							    rs[(2 * x + 1) * GC + tid];
			if (!tid)
				vec[3 * GC] = s;
		}
		__syncthreads();	// the stage free for tile tau + GV_STAGES's copies
	}
	{	// dq, dk: the columns of the half
		float *aq = acc + ((size_t)gi * nch + ch) * 2 * GC * dk, *ak = aq + (size_t)GC * dk;

#pragma unroll
		for (int u = 0; u < 4; u++) {
			const int jl = wn + 2 * u, i = 8 * (j0h + jl) + 2 * t;

			if (jl < nh) {
				*(float2 *)(aq + ra * dk + i) = make_float2(Y1[u][0], Y1[u][1]);
				*(float2 *)(aq + rb * dk + i) = make_float2(Y1[u][2], Y1[u][3]);
				*(float2 *)(ak + ra * dk + i) = make_float2(Y2[u][0], Y2[u][1]);
				*(float2 *)(ak + rb * dk + i) = make_float2(Y2[u][2], Y2[u][3]);
			}
		}
	}
	cp_wait_all();
#endif
}

// ---- dq and dk through the GC x GC part ---------------------------------------------------------
//
// k_gdn_bwd_grad (given gv) leaves M = dP o E and D + D^T of each value head over its dP and dT
// in gv; what they and X2 = T^T dW give dq and dk is a sum over the chunk's positions s with a
// GC x dk result:
//   dq += M K        dk += M^T Q + (D + D^T) K + diag(beta Ga) T^T dW
// Block (group, chunk, half of dk) as k_gdn_grad_v's: each warp holds its dq, dk tiles (those
// of k_gdn_grad_v's accumulators) from k_gdn_grad_v's sums in acc, adds the value heads' terms
// in order (the next head's operands copied meanwhile) and writes dq, dk as bf16.  M is lower
// triangular and T^T upper: their products skip the k-steps that are zero.

#define GV_LDM (GC + 8)		// M and D + D^T (pairs of a row; M^T's elements 2-way)
// a value head's operands: M, D + D^T (GC, GV_LDM), dW's half, T (GC, GV_LDT), G, beta (GC)
#define GK_BUF (2 * GC * GV_LDM + 2 * GC * GV_LDT + 2 * GC)

static __host__ size_t grad_k_smem(void)
{
	return ((size_t)2 * GK_BUF + GC * GV_LDK) * sizeof(float);
}

#ifdef __CUDA_ARCH__
// a bf16 as the bits of a tf32 (exact)
static __device__ __forceinline__ unsigned gv_bft(const bf16 *p)
{
	return (unsigned)*(const unsigned short *)p << 16;
}
#endif

__global__ void __launch_bounds__(NTH, 1) k_gdn_grad_k(bf16 *dqn, bf16 *dkn, const float *gv,
						    const float *acc, const float *slots,
						    const float *aux, const bf16 *qn,
						    const bf16 *kn, const float *beta,
						    const int *lens, int L, int nk, int nv, int dk,
						    int dv, int first)
{
#ifdef __CUDA_ARCH__
	extern __shared__ float sm[];
	const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
	const int wm = warp & 3, wn = warp >> 2, ra = 16 * wm + g, rb = ra + 8, grp = nv / nk;
	const int nch = (L + GC - 1) / GC;
	const struct gvb blk = gv_block(lens, L, nk, dk, first);
	const int gi = blk.gi, ch = blk.ch, kh = blk.kh, c0 = blk.c0, n = blk.n, j0h = blk.j0h;
	const int nh = blk.nh;
	const size_t t0 = blk.t0;
	bf16 *Kh = (bf16 *)(sm + 2 * GK_BUF), *Qh = Kh + GC * GV_LDK;
	float Dq[4][4], Dk[4][4];

	if (!aux || !*(const int *)aux || !n)
		return;

	// value head hg's operands into buffer hg & 1, K and Q with head 0 (a commit group each)
	auto fetch = [&](int hg) {
		if (hg < grp) {
			const size_t slot = ((size_t)gi * grp + hg) * nch + ch;
			const struct fslot f = fslot_at((float *)slots, slot, dk, dv, 1);
			const float *gs = gv + slot * gv_floats(dk);
			float *M = sm + (hg & 1) * GK_BUF, *D = M + GC * GV_LDM, *W = D + GC * GV_LDM;

			ld_tile_f(M, GV_LDM, gs + (size_t)GC * dk, GC, GC, GC);
			ld_tile_f(D, GV_LDM, gs + (size_t)GC * dk + GC * GC, GC, GC, GC);
			ld_tile_f(W, GV_LDT, gs + 8 * j0h, dk, GC, 8 * nh);
			gv_ld_head(W + GC * GV_LDT, &f, beta, t0, n, nv, kh * grp + hg);
			if (!hg)
				gv_ld_kq(Kh, Qh, kn, qn, t0, n, nk, dk, kh, j0h, nh);
		}
		cp_commit();
	};

	fetch(0);
	{	// k_gdn_grad_v's sums: the warp's tiles of the half
		const float *aq = acc + ((size_t)gi * nch + ch) * 2 * GC * dk;
		const float *ak = aq + (size_t)GC * dk;

#pragma unroll
		for (int u = 0; u < 4; u++) {
			const int jl = wn + 2 * u, i = 8 * (j0h + jl) + 2 * t;
			float2 a = make_float2(0.f, 0.f), c = a, p = a, q = a;

			if (jl < nh) {
				a = *(const float2 *)(aq + ra * dk + i);
				c = *(const float2 *)(aq + rb * dk + i);
				p = *(const float2 *)(ak + ra * dk + i);
				q = *(const float2 *)(ak + rb * dk + i);
			}
			Dq[u][0] = a.x, Dq[u][1] = a.y, Dq[u][2] = c.x, Dq[u][3] = c.y;
			Dk[u][0] = p.x, Dk[u][1] = p.y, Dk[u][2] = q.x, Dk[u][3] = q.y;
		}
	}
	for (int hg = 0; hg < grp; hg++) {
		const float *M = sm + (hg & 1) * GK_BUF, *D = M + GC * GV_LDM, *W = D + GC * GV_LDM;
		const float *T = W + GC * GV_LDT, *G = T + GC * GV_LDT, *bet = G + GC;

		fetch(hg + 1);
		cp_wait1();
		__syncthreads();
		const float bga = bet[ra] * expf(G[ra]), bgb = bet[rb] * expf(G[rb]);

		// dq += M K: k-steps s <= r
		for (int ks = 0; ks <= 2 * wm + 1; ks++) {
			const int k = 8 * ks + 2 * t;
			const float2 m0 = *(const float2 *)(M + ra * GV_LDM + k);
			const float2 m1 = *(const float2 *)(M + rb * GV_LDM + k);
			unsigned a[4] = {mm_tf32(m0.x), mm_tf32(m1.x), mm_tf32(m0.y), mm_tf32(m1.y)};

#pragma unroll
			for (int u = 0; u < 4; u++) {
				const int c = 8 * (wn + 2 * u) + g;

				if (wn + 2 * u < nh) {
					unsigned bb[2] = {gv_bft(Kh + k * GV_LDK + c),
							  gv_bft(Kh + (k + 1) * GV_LDK + c)};

					mm_mma(Dq[u], a, bb);
				}
			}
		}
		// dk += (D + D^T) K, and over s >= r: M^T Q, diag(beta Ga) T^T dW
#pragma unroll 2
		for (int ks = 0; ks < GC / 8; ks++) {
			const int k = 8 * ks + 2 * t;
			const float2 d0 = *(const float2 *)(D + ra * GV_LDM + k);
			const float2 d1 = *(const float2 *)(D + rb * GV_LDM + k);
			unsigned a[4] = {mm_tf32(d0.x), mm_tf32(d1.x), mm_tf32(d0.y), mm_tf32(d1.y)};
			unsigned am[4], at[4];
			const bool up = ks >= 2 * wm;

			if (up) {
				am[0] = mm_tf32(M[k * GV_LDM + ra]);
				am[1] = mm_tf32(M[k * GV_LDM + rb]);
				am[2] = mm_tf32(M[(k + 1) * GV_LDM + ra]);
				am[3] = mm_tf32(M[(k + 1) * GV_LDM + rb]);
				at[0] = mm_tf32(bga * T[k * GV_LDT + ra]);
				at[1] = mm_tf32(bgb * T[k * GV_LDT + rb]);
				at[2] = mm_tf32(bga * T[(k + 1) * GV_LDT + ra]);
				at[3] = mm_tf32(bgb * T[(k + 1) * GV_LDT + rb]);
			}
#pragma unroll
			for (int u = 0; u < 4; u++) {
				const int c = 8 * (wn + 2 * u) + g;

				if (wn + 2 * u < nh) {
					unsigned bk[2] = {gv_bft(Kh + k * GV_LDK + c),
							  gv_bft(Kh + (k + 1) * GV_LDK + c)};

					mm_mma(Dk[u], a, bk);
					if (up) {
						unsigned bq[2] = {gv_bft(Qh + k * GV_LDK + c),
								  gv_bft(Qh + (k + 1) * GV_LDK + c)};
						unsigned bw[2] = {mm_tf32(W[k * GV_LDT + c]),
								  mm_tf32(W[(k + 1) * GV_LDT + c])};

						mm_mma(Dk[u], am, bq);
						mm_mma(Dk[u], at, bw);
					}
				}
			}
		}
		__syncthreads();	// the buffer free for head hg + 2's copies
	}
	// out as bf16: the record's rows (0 past its end)
#pragma unroll
	for (int u = 0; u < 4; u++) {
		const int jl = wn + 2 * u, i = 8 * (j0h + jl) + 2 * t;

		if (jl >= nh)
			continue;
#pragma unroll
		for (int hi = 0; hi < 2; hi++) {
			const int r = hi ? rb : ra;
			const size_t o = (t0 + r) * nk * dk + (size_t)kh * dk + i;

			if (c0 + r >= L)
				continue;
			dqn[o] = tobf(r < n ? Dq[u][2 * hi] : 0.f);
			dqn[o + 1] = tobf(r < n ? Dq[u][2 * hi + 1] : 0.f);
			dkn[o] = tobf(r < n ? Dk[u][2 * hi] : 0.f);
			dkn[o + 1] = tobf(r < n ? Dk[u][2 * hi + 1] : 0.f);
		}
	}
	cp_wait_all();
#endif
}

#endif
