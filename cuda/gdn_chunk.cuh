// gdn_chunk.cuh: the chunked gated delta rule's kernels (gdn_chunk.cu has the launchers and the
// overview).  Device code only, with what it needs from common.cuh (bf16, bf(), tobf(), block_sum)
// defined by the includer: gdn_chunk.cu, and test/test_gdn_chunk.c, which runs these very kernels
// on the host, a block's threads as cooperative fibers, against the cpu backend (nothing here may
// be C++ only).
#ifndef SL_GDN_CHUNK_CUH
#define SL_GDN_CHUNK_CUH

#define GC 64		// positions per chunk (GDN_CHUNK)
#define NTH 256		// threads per block: 4 per chunk position (the forward substitution)
#define VF 32		// value columns per block in the sequential passes
#define VG 16		// value columns per tile in the gradient kernel
#define DKMAX 128	// key dim bound of the chunked kernels (dq, dk accumulate in registers)
#define OWN (GC * DKMAX / NTH)

// the chunk's local quantities in shared memory (row-major, k and q rows of ld = dk + 2)
struct cl {
	bf16 *K, *Q;			// (GC, dk): 0 past the record
	float *bet, *G, *Ga, *e;	// (GC): beta, cumsum(g), exp(G), exp(G_last - G)
	float *KE, *P, *T;		// (GC, GC): E o k.k^T (s < r), E o q.k^T (s <= r),
					// (I + A)^-1
};

static __host__ __device__ size_t cl_floats(int dk)
{
	return (size_t)GC * (dk + 2) + 4 * GC + 3 * GC * GC;	// two bf16 (GC, dk + 2) = one float
}

static __device__ float *cl_carve(struct cl *c, float *p, int dk)
{
	c->K = (bf16 *)p;
	c->Q = c->K + (size_t)GC * (dk + 2);
	p += (size_t)GC * (dk + 2);
	c->bet = p, c->G = p + GC, c->Ga = p + 2 * GC, c->e = p + 3 * GC;
	p += 4 * GC;
	c->KE = p, c->P = p + GC * GC, c->T = p + 2 * GC * GC;
	return p + 3 * GC * GC;
}

// load chunk rows [t0, t0 + n) of key head kh (value head h for beta, g), zeros past n; then G,
// Ga, e, KE, P and T.  Starts and ends with every thread past a barrier.
static __device__ void chunk_local(const struct cl *c, const bf16 *qn, const bf16 *kn,
				   const float *beta, const float *g, size_t t0, int n, int nk,
				   int nv, int dk, int kh, int h)
{
	const int tid = threadIdx.x, ld = dk + 2;

	__syncthreads();
	for (int x = tid; x < GC * dk; x += NTH) {
		int r = x / dk, i = x % dk;
		size_t o = (t0 + r) * nk * dk + (size_t)kh * dk + i;

		c->K[r * ld + i] = r < n ? kn[o] : tobf(0.f);
		c->Q[r * ld + i] = r < n ? qn[o] : tobf(0.f);
	}
	if (tid < GC) {
		c->bet[tid] = tid < n ? beta[(t0 + tid) * nv + h] : 0.f;
		c->G[tid] = tid < n ? g[(t0 + tid) * nv + h] : 0.f;
	}
	__syncthreads();
	if (!tid)
		for (int r = 1; r < GC; r++)
			c->G[r] += c->G[r - 1];
	__syncthreads();
	if (tid < GC) {
		c->Ga[tid] = expf(c->G[tid]);
		c->e[tid] = expf(c->G[GC - 1] - c->G[tid]);
	}
	for (int x = tid; x < GC * GC; x += NTH) {
		int r = x / GC, s = x % GC;
		float kk = 0.f, qk = 0.f, E = 0.f;

		if (s <= r) {
			for (int i = 0; i < dk; i++) {
				float ks = bf(c->K[s * ld + i]);

				kk += bf(c->K[r * ld + i]) * ks;
				qk += bf(c->Q[r * ld + i]) * ks;
			}
			E = expf(c->G[r] - c->G[s]);
		}
		c->KE[x] = s < r ? E * kk : 0.f;
		c->P[x] = E * qk;
	}
	__syncthreads();
	// T = (I + A)^-1, A_rs = beta_r KE_rs: column j by the 4 threads 4j..4j+3 (one warp holds
	// 8 columns), row after row; T_sj = 0 for s < j is written before it is read
	{
		int j = tid >> 2, part = tid & 3;

		for (int r = 0; r < GC; r++) {
			float a = 0.f;

			for (int s = part; s < r; s += 4)
				a += c->KE[r * GC + s] * c->T[s * GC + j];
			a += __shfl_xor_sync(0xffffffffu, a, 1);
			a += __shfl_xor_sync(0xffffffffu, a, 2);
			if (!part)
				c->T[r * GC + j] = r < j ? 0.f : r == j ? 1.f : -c->bet[r] * a;
			__syncwarp();
		}
	}
	__syncthreads();
}

static __device__ __forceinline__ int chunk_n(int len, int c0)
{
	int n = len - c0;

	return n < 0 ? 0 : n > GC ? GC : n;
}

// ---- forward ---------------------------------------------------------------------------------

__global__ void __launch_bounds__(NTH) k_chunk_fwd(bf16 *o, float *states, const bf16 *qn,
						   const bf16 *kn, const bf16 *v, int vs,
						   const float *beta, const float *g,
						   const int *lens, int L, int nk, int nv, int dk,
						   int dv, int ntile)
{
	extern __shared__ float sm[];
	struct cl c;
	const int tid = threadIdx.x, ld = dk + 2, lt = VF + 1;
	int bh = blockIdx.x / ntile, j0 = blockIdx.x % ntile * VF, b = bh / nv, h = bh % nv;
	int kh = h / (nv / nk), len = lens[b], nch = (L + GC - 1) / GC;
	int w = dv - j0 < VF ? dv - j0 : VF;
	float *S = cl_carve(&c, sm, dk), *R = S + (size_t)dk * lt, *D = R + GC * lt;
	size_t SS = (size_t)dk * dv;

	for (int x = tid; x < dk * lt; x += NTH)
		S[x] = 0.f;
	for (int ch = 0; ch < nch; ch++) {
		int c0 = ch * GC, n = chunk_n(len, c0);
		size_t t0 = (size_t)b * L + c0;
		float *sv = states + (((size_t)b * nch + ch) * nv + h) * SS;

		__syncthreads();
		for (int x = tid; x < dk * VF; x += NTH) {
			int i = x / VF, jj = x % VF;

			if (jj < w)
				sv[(size_t)i * dv + j0 + jj] = S[i * lt + jj];
		}
		if (!n) {
			for (int x = tid; x < GC * VF; x += NTH) {
				int r = x / VF, jj = x % VF;

				if (c0 + r < L && jj < w)
					o[(t0 + r) * nv * dv + (size_t)h * dv + j0 + jj] =
						tobf(0.f);
			}
			continue;
		}
		chunk_local(&c, qn, kn, beta, g, t0, n, nk, nv, dk, kh, h);
		// R = diag(beta) (V - diag(Ga) K S)
		for (int x = tid; x < GC * VF; x += NTH) {
			int r = x / VF, jj = x % VF;
			float a = 0.f;

			if (r < n && jj < w) {
				for (int i = 0; i < dk; i++)
					a += bf(c.K[r * ld + i]) * S[i * lt + jj];
				a = c.bet[r] * (bf(v[(t0 + r) * vs + (size_t)h * dv + j0 + jj]) -
						c.Ga[r] * a);
			}
			R[r * lt + jj] = a;
		}
		__syncthreads();
		// delta = T R
		for (int x = tid; x < GC * VF; x += NTH) {
			int r = x / VF, jj = x % VF;
			float a = 0.f;

			for (int s = 0; s <= r; s++)
				a += c.T[r * GC + s] * R[s * lt + jj];
			D[r * lt + jj] = a;
		}
		__syncthreads();
		// O = diag(Ga) Q S + P delta
		for (int x = tid; x < GC * VF; x += NTH) {
			int r = x / VF, jj = x % VF;
			float a = 0.f, p = 0.f;

			if (c0 + r >= L || jj >= w)
				continue;
			if (r < n) {
				for (int i = 0; i < dk; i++)
					a += bf(c.Q[r * ld + i]) * S[i * lt + jj];
				for (int s = 0; s <= r; s++)
					p += c.P[r * GC + s] * D[s * lt + jj];
				a = c.Ga[r] * a + p;
			}
			o[(t0 + r) * nv * dv + (size_t)h * dv + j0 + jj] = tobf(a);
		}
		__syncthreads();
		// S = Ga_last S + K^T diag(e) delta
		for (int x = tid; x < dk * VF; x += NTH) {
			int i = x / VF, jj = x % VF;
			float a = 0.f;

			for (int s = 0; s < GC; s++)
				a += bf(c.K[s * ld + i]) * c.e[s] * D[s * lt + jj];
			S[i * lt + jj] = c.Ga[GC - 1] * S[i * lt + jj] + a;
		}
	}
}

// ---- backward: dS at every chunk's end ---------------------------------------------------------

// block (slot, tile): slot = the wave's (record, value head) number, head bh = first * grp + slot
__global__ void __launch_bounds__(NTH) k_chunk_bwd_state(float *dst, const bf16 *dout,
							 const bf16 *qn, const bf16 *kn,
							 const float *beta, const float *g,
							 const int *lens, int L, int nk, int nv,
							 int dk, int dv, int ntile, int first)
{
	extern __shared__ float sm[];
	struct cl c;
	const int tid = threadIdx.x, ld = dk + 2, lt = VF + 1, grp = nv / nk;
	int slot = blockIdx.x / ntile, j0 = blockIdx.x % ntile * VF;
	int bh = first * grp + slot, b = bh / nv, h = bh % nv, kh = h / grp, len = lens[b];
	int nch = (L + GC - 1) / GC, w = dv - j0 < VF ? dv - j0 : VF;
	float *dS = cl_carve(&c, sm, dk), *dO = dS + (size_t)dk * lt, *DD = dO + GC * lt;
	float *Y = DD + GC * lt;
	size_t SS = (size_t)dk * dv;

	for (int x = tid; x < dk * lt; x += NTH)
		dS[x] = 0.f;
	for (int ch = nch - 1; ch >= 0; ch--) {
		int c0 = ch * GC, n = chunk_n(len, c0);
		size_t t0 = (size_t)b * L + c0;
		float *dv_ = dst + ((size_t)slot * nch + ch) * SS;

		__syncthreads();
		for (int x = tid; x < dk * VF; x += NTH) {
			int i = x / VF, jj = x % VF;

			if (jj < w)
				dv_[(size_t)i * dv + j0 + jj] = dS[i * lt + jj];
		}
		if (!n)
			continue;
		for (int x = tid; x < GC * VF; x += NTH) {
			int r = x / VF, jj = x % VF;

			dO[r * lt + jj] = r < n && jj < w ?
				bf(dout[(t0 + r) * nv * dv + (size_t)h * dv + j0 + jj]) : 0.f;
		}
		chunk_local(&c, qn, kn, beta, g, t0, n, nk, nv, dk, kh, h);
		// ddelta = P^T dO + diag(e) K dS
		for (int x = tid; x < GC * VF; x += NTH) {
			int s = x / VF, jj = x % VF;
			float a = 0.f, kd = 0.f;

			for (int r = s; r < GC; r++)
				a += c.P[r * GC + s] * dO[r * lt + jj];
			for (int i = 0; i < dk; i++)
				kd += bf(c.K[s * ld + i]) * dS[i * lt + jj];
			DD[s * lt + jj] = a + c.e[s] * kd;
		}
		__syncthreads();
		// Y = diag(beta Ga) T^T ddelta
		for (int x = tid; x < GC * VF; x += NTH) {
			int s = x / VF, jj = x % VF;
			float a = 0.f;

			for (int r = s; r < GC; r++)
				a += c.T[r * GC + s] * DD[r * lt + jj];
			Y[s * lt + jj] = c.bet[s] * c.Ga[s] * a;
		}
		__syncthreads();
		// dS = Ga_last dS + Q^T diag(Ga) dO - K^T Y
		for (int x = tid; x < dk * VF; x += NTH) {
			int i = x / VF, jj = x % VF;
			float a = 0.f;

			for (int r = 0; r < GC; r++)
				a += bf(c.Q[r * ld + i]) * c.Ga[r] * dO[r * lt + jj] -
				     bf(c.K[r * ld + i]) * Y[r * lt + jj];
			dS[i * lt + jj] = c.Ga[GC - 1] * dS[i * lt + jj] + a;
		}
	}
}

// ---- backward: the gradients of a chunk --------------------------------------------------------

static __host__ __device__ size_t grad_tile_floats(int dk)
{
	size_t tiles = (size_t)2 * dk * (VG + 1) + (size_t)7 * GC * (VG + 1);
	size_t x2 = (size_t)GC * (dk + 1);

	return tiles > x2 ? tiles : x2;
}

static __host__ size_t grad_smem(int dk)
{
	return (cl_floats(dk) + (size_t)GC * (dk + 1) + 2 * GC * GC + 5 * GC +
		grad_tile_floats(dk)) * sizeof(float);
}

// block (group of the wave, chunk): group = (record, key head) first + blockIdx.x / nch
__global__ void __launch_bounds__(NTH) k_chunk_bwd_grad(bf16 *dqn, bf16 *dkn, bf16 *dval,
							bf16 *dbeta, bf16 *dg, const bf16 *dout,
							const float *states, const float *dst,
							const bf16 *qn, const bf16 *kn,
							const bf16 *v, int vs, const float *beta,
							const float *g, const int *lens, int L,
							int nk, int nv, int dk, int dv, int first)
{
	extern __shared__ float sm[];
	struct cl c;
	const int tid = threadIdx.x, ld = dk + 2, lt = VG + 1, grp = nv / nk;
	int nch = (L + GC - 1) / GC, gi = blockIdx.x / nch, ch = blockIdx.x % nch;
	int bk = first + gi, b = bk / nk, kh = bk % nk, len = lens[b];
	int c0 = ch * GC, n = chunk_n(len, c0), rows = L - c0 < GC ? L - c0 : GC;
	size_t t0 = (size_t)b * L + c0, SS = (size_t)dk * dv;
	float *dW = cl_carve(&c, sm, dk), *dP = dW + (size_t)GC * (dk + 1), *dT = dP + GC * GC;
	float *qz = dT + GC * GC, *de = qz + GC, *xv = de + GC, *dG = xv + GC, *db = dG + GC;
	float *tl = db + GC;
	// the tile buffers (value columns j0..j0+VG-1) and, after the tiles, X2 = T^T dW
	float *S0t = tl, *dSt = S0t + (size_t)dk * lt, *dOt = dSt + (size_t)dk * lt;
	float *Vt = dOt + GC * lt, *Xt = Vt + GC * lt, *Dt = Xt + GC * lt, *DDt = Dt + GC * lt;
	float *KdSt = DDt + GC * lt, *QZt = KdSt + GC * lt, *X2 = tl;
	float rq[OWN], rk[OWN];

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
#pragma unroll
	for (int m = 0; m < OWN; m++)
		rq[m] = rk[m] = 0.f;
	for (int h = kh * grp; h < (kh + 1) * grp; h++) {
		const float *S0 = states + (((size_t)b * nch + ch) * nv + h) * SS;
		const float *dS = dst + (((size_t)gi * grp + h - kh * grp) * nch + ch) * SS;
		float sd = 0.f;

		chunk_local(&c, qn, kn, beta, g, t0, n, nk, nv, dk, kh, h);
		for (int x = tid; x < GC * dk; x += NTH)
			dW[(x / dk) * (dk + 1) + x % dk] = 0.f;
		for (int x = tid; x < GC * GC; x += NTH)
			dP[x] = dT[x] = 0.f;
		if (tid < GC)
			qz[tid] = de[tid] = xv[tid] = 0.f;
		for (int j0 = 0; j0 < dv; j0 += VG) {
			int w = dv - j0 < VG ? dv - j0 : VG;

			__syncthreads();
			for (int x = tid; x < dk * VG; x += NTH) {
				int i = x / VG, jj = x % VG;
				float s0 = 0.f, ds = 0.f;

				if (jj < w) {
					s0 = S0[(size_t)i * dv + j0 + jj];
					ds = dS[(size_t)i * dv + j0 + jj];
				}
				S0t[i * lt + jj] = s0;
				dSt[i * lt + jj] = ds;
				sd += s0 * ds;
			}
			for (int x = tid; x < GC * VG; x += NTH) {
				int r = x / VG, jj = x % VG;
				bool ok = r < n && jj < w;
				size_t t = t0 + r, hj = (size_t)h * dv + j0 + jj;

				dOt[r * lt + jj] = ok ? bf(dout[t * nv * dv + hj]) : 0.f;
				Vt[r * lt + jj] = ok ? bf(v[t * vs + hj]) : 0.f;
			}
			__syncthreads();
			// R = diag(beta)(V - diag(Ga) K S0) into Xt; K dS; (Q S0) o dO
			for (int x = tid; x < GC * VG; x += NTH) {
				int r = x / VG, jj = x % VG;
				float ks = 0.f, kd = 0.f, qs = 0.f;

				for (int i = 0; i < dk; i++) {
					float kk = bf(c.K[r * ld + i]);

					ks += kk * S0t[i * lt + jj];
					kd += kk * dSt[i * lt + jj];
					qs += bf(c.Q[r * ld + i]) * S0t[i * lt + jj];
				}
				Xt[r * lt + jj] = c.bet[r] * (Vt[r * lt + jj] - c.Ga[r] * ks);
				KdSt[r * lt + jj] = kd;
				QZt[r * lt + jj] = qs * dOt[r * lt + jj];
			}
			__syncthreads();
			// delta = T R, ddelta = P^T dO + diag(e) K dS
			for (int x = tid; x < GC * VG; x += NTH) {
				int r = x / VG, jj = x % VG;
				float a = 0.f, d = 0.f;

				for (int s = 0; s <= r; s++)
					a += c.T[r * GC + s] * Xt[s * lt + jj];
				for (int s = r; s < GC; s++)
					d += c.P[s * GC + r] * dOt[s * lt + jj];
				Dt[r * lt + jj] = a;
				DDt[r * lt + jj] = d + c.e[r] * KdSt[r * lt + jj];
			}
			__syncthreads();
			// the tile's sums over its value columns
			for (int x = tid; x < GC * GC; x += NTH) {
				int r = x / GC, s = x % GC;
				float p = 0.f, t = 0.f;

				if (s > r)
					continue;
				for (int jj = 0; jj < VG; jj++) {
					p += dOt[r * lt + jj] * Dt[s * lt + jj];
					t += DDt[r * lt + jj] * Vt[s * lt + jj];
				}
				dP[x] += p;
				dT[x] += t;
			}
#pragma unroll
			for (int m = 0; m < OWN; m++) {
				int x = tid + m * NTH, r = x / dk, i = x % dk;
				float z = 0.f, y = 0.f, wv = 0.f;

				if (x >= GC * dk)
					break;
				for (int jj = 0; jj < VG; jj++) {
					z += dOt[r * lt + jj] * S0t[i * lt + jj];
					y += Dt[r * lt + jj] * dSt[i * lt + jj];
					wv += DDt[r * lt + jj] * S0t[i * lt + jj];
				}
				rq[m] += c.Ga[r] * z;
				rk[m] += c.e[r] * y;
				dW[r * (dk + 1) + i] -= wv;
			}
			__syncthreads();
			// dXu = T^T ddelta into Xt (R is spent); dv = beta dXu
			for (int x = tid; x < GC * VG; x += NTH) {
				int r = x / VG, jj = x % VG;
				float a = 0.f;

				for (int s = r; s < GC; s++)
					a += c.T[s * GC + r] * DDt[s * lt + jj];
				Xt[r * lt + jj] = a;
				if (c0 + r < L && jj < w)
					dval[(t0 + r) * vs + (size_t)h * dv + j0 + jj] =
						tobf(r < n ? c.bet[r] * a : 0.f);
			}
			__syncthreads();
			if (tid < GC) {
				int r = tid;
				float a = 0.f, d = 0.f, u = 0.f;

				for (int jj = 0; jj < VG; jj++) {
					a += QZt[r * lt + jj];
					d += KdSt[r * lt + jj] * Dt[r * lt + jj];
					u += Xt[r * lt + jj] * Vt[r * lt + jj];
				}
				qz[r] += a;
				de[r] += d;
				xv[r] += u;
			}
		}
		sd = block_sum(sd);	// <S0, dS> (synchronizes)
		// dG: through O (Ga q.Z, dP o P) and S_end (Ga_last <S0,dS>, de o e)
		if (tid < GC) {
			int r = tid;
			float a = c.Ga[r] * qz[r] - de[r] * c.e[r];

			for (int s = 0; s < GC; s++)
				a += dP[r * GC + s] * c.P[r * GC + s] -
				     dP[s * GC + r] * c.P[s * GC + r];
			dG[r] = a;
		}
		// X2 = T^T dW (the tile buffers are spent)
		for (int x = tid; x < GC * dk; x += NTH) {
			int s = x / dk, i = x % dk;
			float a = 0.f;

			for (int r = s; r < GC; r++)
				a += c.T[r * GC + s] * dW[r * (dk + 1) + i];
			X2[s * (dk + 1) + i] = a;
		}
		__syncthreads();
		if (!tid) {
			float a = c.Ga[GC - 1] * sd;

			for (int s = 0; s < GC; s++)
				a += de[s] * c.e[s];
			dG[GC - 1] += a;
		}
		// M = dP o E (in place); dT = beta_s (dT + Ga_s dW K^T), s <= r
		for (int x = tid; x < GC * GC; x += NTH) {
			int r = x / GC, s = x % GC;
			float a = 0.f;

			if (s > r) {
				dP[x] = dT[x] = 0.f;
				continue;
			}
			dP[x] *= expf(c.G[r] - c.G[s]);
			for (int i = 0; i < dk; i++)
				a += dW[r * (dk + 1) + i] * bf(c.K[s * ld + i]);
			dT[x] = c.bet[s] * (dT[x] + c.Ga[s] * a);
		}
		__syncthreads();
		if (tid < GC) {	// dbeta, dG through W
			int r = tid;
			float a = 0.f;

			for (int i = 0; i < dk; i++)
				a += X2[r * (dk + 1) + i] * bf(c.K[r * ld + i]);
			db[r] = xv[r] + c.Ga[r] * a;
			dG[r] += c.bet[r] * c.Ga[r] * a;
		}
#pragma unroll
		for (int m = 0; m < OWN; m++) {	// dq += M K, dk += M^T Q + diag(beta Ga) X2
			int x = tid + m * NTH, r = x / dk, i = x % dk;
			float a = 0.f, bb = 0.f;

			if (x >= GC * dk)
				break;
			for (int s = 0; s < GC; s++) {
				a += dP[r * GC + s] * bf(c.K[s * ld + i]);
				bb += dP[s * GC + r] * bf(c.Q[s * ld + i]);
			}
			rq[m] += a;
			rk[m] += bb + c.bet[r] * c.Ga[r] * X2[r * (dk + 1) + i];
		}
		__syncthreads();
		// dA = -T^T (dT T^T), s < r: dT T^T into dP, then dA into dT
		for (int x = tid; x < GC * GC; x += NTH) {
			int r = x / GC, s = x % GC;
			float a = 0.f;

			for (int y = 0; y <= s; y++)
				a += dT[r * GC + y] * c.T[s * GC + y];
			dP[x] = a;
		}
		__syncthreads();
		for (int x = tid; x < GC * GC; x += NTH) {
			int r = x / GC, s = x % GC;
			float a = 0.f;

			for (int y = r; y < GC && s < r; y++)
				a -= c.T[y * GC + r] * dP[y * GC + s];
			dT[x] = a;
		}
		__syncthreads();
		if (tid < GC) {	// through A_rs = beta_r KE_rs: dbeta, dG
			int r = tid;
			float a = 0.f, d = 0.f;

			for (int s = 0; s < GC; s++) {
				a += dT[r * GC + s] * c.KE[r * GC + s];
				d += dT[r * GC + s] * c.bet[r] * c.KE[r * GC + s] -
				     dT[s * GC + r] * c.bet[s] * c.KE[s * GC + r];
			}
			db[r] += a;
			dG[r] += d;
		}
		__syncthreads();
		for (int x = tid; x < GC * GC; x += NTH) {	// D = dA o beta_r E
			int r = x / GC, s = x % GC;

			if (s < r)
				dT[x] *= c.bet[r] * expf(c.G[r] - c.G[s]);
		}
		__syncthreads();
#pragma unroll
		for (int m = 0; m < OWN; m++) {	// dk += (D + D^T) K
			int x = tid + m * NTH, r = x / dk, i = x % dk;
			float a = 0.f;

			if (x >= GC * dk)
				break;
			for (int s = 0; s < GC; s++)
				a += (dT[r * GC + s] + dT[s * GC + r]) * bf(c.K[s * ld + i]);
			rk[m] += a;
		}
		if (!tid) {	// dg = the reverse cumulative sum of dG; dbeta
			float a = 0.f;

			for (int r = GC - 1; r >= 0; r--) {
				a += dG[r];
				if (c0 + r >= L)
					continue;
				dbeta[(t0 + r) * nv + h] = tobf(r < n ? db[r] : 0.f);
				dg[(t0 + r) * nv + h] = tobf(r < n ? a : 0.f);
			}
		}
	}
#pragma unroll
	for (int m = 0; m < OWN; m++) {
		int x = tid + m * NTH, r = x / dk, i = x % dk;
		size_t o = (t0 + r) * nk * dk + (size_t)kh * dk + i;

		if (x >= GC * dk)
			break;
		if (r >= rows)
			continue;
		dqn[o] = tobf(r < n ? rq[m] : 0.f);
		dkn[o] = tobf(r < n ? rk[m] : 0.f);
	}
}

// ---- shared memory per block ------------------------------------------------------------------

static __host__ size_t fwd_smem(int dk)
{
	return (cl_floats(dk) + (size_t)dk * (VF + 1) + 2 * GC * (VF + 1)) * sizeof(float);
}

static __host__ size_t state_smem(int dk)
{
	return (cl_floats(dk) + (size_t)dk * (VF + 1) + 3 * GC * (VF + 1)) * sizeof(float);
}

#endif
