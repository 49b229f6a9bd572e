// moe.cu: the mixture-of-experts kernels of the cuda backend (see the moe_* ops of
// src/backend.h; src/backend_cpu_moe.c is their reference).  Routing runs in fp32 on bf16 logits;
// routing values are float.  Reductions run in a fixed order (no atomics): results repeat bit for
// bit.  The grouped matmuls are one cublasGemmGroupedBatchedEx call each, one group per expert.
#include <cmath>
#include <cublas_v2.h>

#include "common.cuh"

#define MAXK 32		// most experts a token may choose (Qwen3-MoE: 8)

static __device__ __forceinline__ float warp_sum(float v)
{
	for (int o = 16; o; o >>= 1)
		v += __shfl_xor_sync(0xffffffffu, v, o);
	return v;
}

static __device__ __forceinline__ float warp_max(float v)
{
	for (int o = 16; o; o >>= 1)
		v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
	return v;
}

// ---- router ------------------------------------------------------------------------------

// one warp per token: softmax over E, then k rounds of a warp argmax (ties: lower expert)
__global__ void k_route_fwd(float *p, int *topi, float *topw, const bf16 *z, int T, int E, int k,
			    int norm)
{
	int t = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x & 31;
	int chosen[MAXK];
	float val[MAXK], s = 0.f, mx = -INFINITY, sum = 0.f;

	if (t >= T)
		return;
	z += (size_t)t * E;
	p += (size_t)t * E;
	for (int e = lane; e < E; e += 32)
		mx = fmaxf(mx, bf(z[e]));
	mx = warp_max(mx);
	for (int e = lane; e < E; e += 32)
		sum += expf(bf(z[e]) - mx);
	sum = warp_sum(sum);
	for (int e = lane; e < E; e += 32)
		p[e] = expf(bf(z[e]) - mx) / sum;
	for (int j = 0; j < k; j++) {
		float bv = -1.f;
		int bi = E;

		for (int e = lane; e < E; e += 32) {
			bool taken = false;
			float v = p[e];

			for (int i = 0; i < j; i++)
				taken |= chosen[i] == e;
			if (!taken && (v > bv || (v == bv && e < bi))) {
				bv = v;
				bi = e;
			}
		}
		for (int o = 16; o; o >>= 1) {
			float ov = __shfl_xor_sync(0xffffffffu, bv, o);
			int oi = __shfl_xor_sync(0xffffffffu, bi, o);

			if (ov > bv || (ov == bv && oi < bi)) {
				bv = ov;
				bi = oi;
			}
		}
		chosen[j] = bi;
		val[j] = bv;
		s += bv;
	}
	if (lane < k) {
		float v = 0.f;
		int c = 0;

		for (int j = 0; j < k; j++)	// registers: no dynamic indexing by lane
			if (j == lane) {
				v = val[j];
				c = chosen[j];
			}
		topi[(size_t)t * k + lane] = c;
		topw[(size_t)t * k + lane] = norm ? v / s : v;
	}
}

// one warp per token: dp = aux_g (real tokens) + the routing weights' gradient, then the softmax
__global__ void k_route_bwd(bf16 *dz, const float *dw, const float *p, const int *topi,
			    const float *w, const float *aux_g, const int *lens, int B, int L,
			    int E, int k, int norm)
{
	int t = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x & 31;
	float dpj[MAXK], s = 0.f, dot = 0.f, c = 0.f;
	bool real;

	if (t >= B * L)
		return;
	real = aux_g && t % L < lens[t / L];
	p += (size_t)t * E;
	for (int j = 0; j < k; j++) {
		s += p[topi[(size_t)t * k + j]];
		dot += dw[(size_t)t * k + j] * w[(size_t)t * k + j];
	}
	for (int j = 0; j < k; j++) {
		float g = dw[(size_t)t * k + j];

		dpj[j] = norm ? (g - dot) / s : g;
	}
	// c = sum_e p_e dp_e
	for (int e = lane; real && e < E; e += 32)
		c += p[e] * aux_g[e];
	c = warp_sum(c);
	for (int j = 0; j < k; j++)
		c += p[topi[(size_t)t * k + j]] * dpj[j];
	for (int e = lane; e < E; e += 32) {
		float dp = real ? aux_g[e] : 0.f;

		for (int j = 0; j < k; j++)
			if (topi[(size_t)t * k + j] == e)
				dp += dpj[j];
		dz[(size_t)t * E + e] = tobf(p[e] * (dp - c));
	}
}

// one block per expert: its choices and probability sum over real tokens, in double
__global__ void k_aux_stats(double *stats, const float *p, const int *topi, const int *lens, int B,
			    int L, int E, int k)
{
	__shared__ double sh[2][256];
	int e = blockIdx.x;
	double n = 0, ps = 0;

	for (int t = threadIdx.x; t < B * L; t += blockDim.x) {
		if (t % L >= lens[t / L])
			continue;
		for (int j = 0; j < k; j++)
			n += topi[(size_t)t * k + j] == e;
		ps += p[(size_t)t * E + e];
	}
	sh[0][threadIdx.x] = n;
	sh[1][threadIdx.x] = ps;
	__syncthreads();
	for (int o = blockDim.x / 2; o; o >>= 1) {
		if (threadIdx.x < o) {
			sh[0][threadIdx.x] += sh[0][threadIdx.x + o];
			sh[1][threadIdx.x] += sh[1][threadIdx.x + o];
		}
		__syncthreads();
	}
	if (!threadIdx.x) {
		stats[e] += sh[0][0];
		stats[E + e] += sh[1][0];
	}
}

// ---- permutation -------------------------------------------------------------------------

// choices of expert e before index i within a block's chunk: a block-wide exclusive scan of flags
static __device__ int block_scan(int flag, int *total)
{
	__shared__ int warp_tot[32];
	int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
	unsigned m = __ballot_sync(0xffffffffu, flag);
	int before = __popc(m & ((1u << lane) - 1)), off = 0;

	__syncthreads();
	if (!lane)
		warp_tot[wid] = __popc(m);
	__syncthreads();
	for (int i = 0; i < wid; i++)
		off += warp_tot[i];
	*total = 0;
	for (int i = 0; i < nw; i++)
		*total += warp_tot[i];
	return off + before;
}

// pass 1 (@write 0): counts(E) of each expert; pass 2: rows and slots from offs.  One block per
// expert walks every choice in order, so each expert's rows keep token order.
__global__ void k_permute(int *counts, int *rows, int *slot, const int *offs, const int *topi,
			  int n, int k, int write)
{
	int e = blockIdx.x, base = write ? offs[e] : 0;

	for (int i0 = 0; i0 < n; i0 += blockDim.x) {
		int i = i0 + threadIdx.x, tot;
		int flag = i < n && topi[i] == e;
		int pos = block_scan(flag, &tot);

		if (write && flag) {
			rows[base + pos] = i / k;
			slot[i] = base + pos;
		}
		base += tot;
	}
	if (!write && !threadIdx.x)
		counts[e] = base;
}

// offs(E+1) = exclusive prefix sums of counts; one thread (E is small)
__global__ void k_offsets(int *offs, const int *counts, int E)
{
	int s = 0;

	for (int e = 0; e < E; e++) {
		offs[e] = s;
		s += counts[e];
	}
	offs[E] = s;
}

// ---- combine -----------------------------------------------------------------------------

__global__ void k_combine_fwd(bf16 *out, const bf16 *y, const float *w, const int *slot, int k,
			      int H)
{
	int t = blockIdx.x;

	for (int h = threadIdx.x; h < H; h += blockDim.x) {
		float acc = 0.f;

		for (int j = 0; j < k; j++)
			acc += w[(size_t)t * k + j] * bf(y[(size_t)slot[(size_t)t * k + j] * H + h]);
		out[(size_t)t * H + h] = tobf(acc);
	}
}

__global__ void k_combine_bwd(bf16 *dy, float *dw, const bf16 *g, const bf16 *y, const float *w,
			      const int *slot, int k, int H)
{
	__shared__ float sh[32];
	int t = blockIdx.x, lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
	int nw = blockDim.x >> 5;

	for (int j = 0; j < k; j++) {
		size_t r = (size_t)slot[(size_t)t * k + j];
		float wj = w[(size_t)t * k + j], dot = 0.f;

		for (int h = threadIdx.x; h < H; h += blockDim.x) {
			float gv = bf(g[(size_t)t * H + h]);

			dot += gv * bf(y[r * H + h]);
			dy[r * H + h] = tobf(wj * gv);
		}
		dot = warp_sum(dot);
		__syncthreads();
		if (!lane)
			sh[wid] = dot;
		__syncthreads();
		if (!threadIdx.x) {
			float s = 0.f;

			for (int i = 0; i < nw; i++)
				s += sh[i];
			dw[(size_t)t * k + j] = s;
		}
	}
}

// ---- launchers ---------------------------------------------------------------------------

static void need_k(int k)
{
	if (k > MAXK) {
		fprintf(stderr, "cuda: num_experts_per_tok %d exceeds the kernels' %d\n", k, MAXK);
		abort();
	}
}

extern "C" void sl_cuda_moe_route_fwd(struct sl_cuda *c, float *p, int *topi, float *topw,
				      const void *logits, int T, int E, int k, int norm)
{
	need_k(k);
	if (T <= 0)
		return;
	k_route_fwd<<<(T + 7) / 8, 256, 0, c->stream>>>(p, topi, topw, (const bf16 *)logits, T, E,
							 k, norm);
	CUDA_LAUNCHED();
}

extern "C" void sl_cuda_moe_route_bwd(struct sl_cuda *c, void *dlogits, const float *dtopw,
				      const float *p, const int *topi, const float *topw,
				      const float *aux_g, const int *lens, int B, int L, int E,
				      int k, int norm)
{
	need_k(k);
	if (B * L <= 0)
		return;
	k_route_bwd<<<(B * L + 7) / 8, 256, 0, c->stream>>>((bf16 *)dlogits, dtopw, p, topi, topw,
							     aux_g, lens, B, L, E, k, norm);
	CUDA_LAUNCHED();
}

extern "C" void sl_cuda_moe_aux_stats(struct sl_cuda *c, double *stats, const float *p,
				      const int *topi, const int *lens, int B, int L, int E, int k)
{
	k_aux_stats<<<E, 256, 0, c->stream>>>(stats, p, topi, lens, B, L, E, k);
	CUDA_LAUNCHED();
}

extern "C" void sl_cuda_moe_permute(struct sl_cuda *c, int *rows, int *slot, int *offs,
				    const int *topi, int T, int E, int k)
{
	// counts go to the tail of rows' neighbour: offs holds E+1 ints, counts need E of scratch
	int *counts = (int *)sl_cuda_scratch(c, (size_t)E * sizeof(int), "moe_permute");

	k_permute<<<E, 1024, 0, c->stream>>>(counts, rows, slot, offs, topi, T * k, k, 0);
	CUDA_LAUNCHED();
	k_offsets<<<1, 1, 0, c->stream>>>(offs, counts, E);
	CUDA_LAUNCHED();
	k_permute<<<E, 1024, 0, c->stream>>>(counts, rows, slot, offs, topi, T * k, k, 1);
	CUDA_LAUNCHED();
}

extern "C" void sl_cuda_moe_combine_fwd(struct sl_cuda *c, void *out, const void *y,
					const float *topw, const int *slot, int T, int k, int H)
{
	if (T <= 0)
		return;
	k_combine_fwd<<<T, 256, 0, c->stream>>>((bf16 *)out, (const bf16 *)y, topw, slot, k, H);
	CUDA_LAUNCHED();
}

extern "C" void sl_cuda_moe_combine_bwd(struct sl_cuda *c, void *dy, float *dtopw,
					const void *dout, const void *y, const float *topw,
					const int *slot, int T, int k, int H)
{
	if (T <= 0)
		return;
	k_combine_bwd<<<T, 256, 0, c->stream>>>((bf16 *)dy, dtopw, (const bf16 *)dout,
						 (const bf16 *)y, topw, slot, k, H);
	CUDA_LAUNCHED();
}

// ---- grouped matmul ----------------------------------------------------------------------

// One cuBLAS handle and pointer-array buffer for the process's context (one GPU per rank).
static struct {
	struct sl_cuda *c;
	cublasHandle_t h;
	void **ptrs;		// device: 3 * GMAX pointers
	int *m, *n, *kk, *lda, *ldb, *ldc, *gs;	// host arrays of GMAX
	float *alpha, *beta;
	cublasOperation_t *ta, *tb;
} G;

#define GMAX 4096

static void grouped_init(struct sl_cuda *c)
{
	if (G.c == c)
		return;
	if (G.c) {
		fprintf(stderr, "cuda: the grouped matmul serves one context per process\n");
		abort();
	}
	CUBLAS_CHECK(cublasCreate(&G.h));
	CUBLAS_CHECK(cublasSetStream(G.h, c->stream));
	CUDA_CHECK(cudaMalloc((void **)&G.ptrs, 3 * GMAX * sizeof(void *)));
	G.m = (int *)calloc(7 * GMAX, sizeof(int));
	G.alpha = (float *)calloc(2 * GMAX, sizeof(float));
	G.ta = (cublasOperation_t *)calloc(2 * GMAX, sizeof(cublasOperation_t));
	if (!G.m || !G.alpha || !G.ta) {
		fprintf(stderr, "cuda: out of host memory (grouped matmul)\n");
		abort();
	}
	G.n = G.m + GMAX;
	G.kk = G.n + GMAX;
	G.lda = G.kk + GMAX;
	G.ldb = G.lda + GMAX;
	G.ldc = G.ldb + GMAX;
	G.gs = G.ldc + GMAX;
	G.beta = G.alpha + GMAX;
	G.tb = G.ta + GMAX;
	G.c = c;
}

// pointers of expert e: A = a + sa*e + ra*offs[e], B and C alike (element strides, bf16)
__global__ void k_group_ptrs(void **ptrs, const int *offs, const bf16 *a, size_t sa, size_t ra,
			     const bf16 *b, size_t sb, size_t rb, bf16 *cc, size_t sc, size_t rc,
			     int E)
{
	int e = blockIdx.x * blockDim.x + threadIdx.x;

	if (e >= E)
		return;
	ptrs[e] = (void *)(a + sa * e + ra * offs[e]);
	ptrs[GMAX + e] = (void *)(b + sb * e + rb * offs[e]);
	ptrs[2 * GMAX + e] = (void *)(cc + sc * e + rc * offs[e]);
}

// column-major C(m,n) = op(A) op(B) + beta C per expert, m/n/k from the expert's row count
static void grouped(struct sl_cuda *c, const int *d_offs, const int *h_offs, int E, int ta,
		    int tb, int which_rows, int m0, int n0, int k0, const void *A, size_t sa,
		    size_t ra, int lda, const void *B, size_t sb, size_t rb, int ldb, void *C,
		    size_t sc, size_t rc, int ldc, float beta)
{
	if (E > GMAX) {
		fprintf(stderr, "cuda: %d experts exceed the grouped matmul's %d\n", E, GMAX);
		abort();
	}
	grouped_init(c);
	for (int e = 0; e < E; e++) {
		int rows = h_offs[e + 1] - h_offs[e];

		G.m[e] = which_rows == 0 ? rows : m0;
		G.n[e] = which_rows == 1 ? rows : n0;
		G.kk[e] = which_rows == 2 ? rows : k0;
		G.lda[e] = lda;
		G.ldb[e] = ldb;
		G.ldc[e] = ldc;
		G.gs[e] = 1;
		G.alpha[e] = 1.f;
		G.beta[e] = beta;
		G.ta[e] = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
		G.tb[e] = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
	}
	k_group_ptrs<<<(E + 127) / 128, 128, 0, c->stream>>>(G.ptrs, d_offs, (const bf16 *)A, sa,
							      ra, (const bf16 *)B, sb, rb, (bf16 *)C,
							      sc, rc, E);
	CUDA_LAUNCHED();
	CUBLAS_CHECK(cublasGemmGroupedBatchedEx(G.h, G.ta, G.tb, G.m, G.n, G.kk, G.alpha,
						(const void *const *)G.ptrs, CUDA_R_16BF, G.lda,
						(const void *const *)(G.ptrs + GMAX), CUDA_R_16BF,
						G.ldb, G.beta, G.ptrs + 2 * GMAX, CUDA_R_16BF,
						G.ldc, E, G.gs, CUBLAS_COMPUTE_32F));
}

// out(rows, N) = x(rows, K) w_e(N, K)^T  ->  out^T (N, rows) = w_e^T-op x^T (see gemm.cu)
extern "C" void sl_cuda_moe_gemm_fwd(struct sl_cuda *c, void *out, const void *x, const void *w,
				     const int *d_offs, const int *h_offs, int E, int K, int N)
{
	grouped(c, d_offs, h_offs, E, 1, 0, 1, N, 0, K, w, (size_t)N * K, 0, K, x, 0, K, K, out,
		0, N, N, 0.f);
}

extern "C" void sl_cuda_moe_gemm_bwd(struct sl_cuda *c, void *dx, void *dw, const void *dout,
				     const void *x, const void *w, const int *d_offs,
				     const int *h_offs, int E, int K, int N)
{
	// dx^T (K, rows) = w_e (K, N col-major) dout^T (N, rows)
	if (dx)
		grouped(c, d_offs, h_offs, E, 0, 0, 1, K, 0, N, w, (size_t)N * K, 0, K, dout, 0, N,
			N, dx, 0, K, K, 0.f);
	// dw_e^T (K, N) += x^T (K, rows) dout (rows, N)
	grouped(c, d_offs, h_offs, E, 0, 1, 2, K, N, 0, x, 0, K, K, dout, 0, N, N, dw,
		(size_t)N * K, 0, K, 1.f);
}
