// moe.cu: the mixture-of-experts kernels of the cuda backend (see the moe_* ops of
// src/backend.h; src/backend_cpu_moe.c is their reference).  Routing runs in fp32 on bf16 logits;
// routing values are float.  Reductions run in a fixed order (no atomics): results repeat bit for
// bit.  The grouped matmuls are one cuBLASLt matmul per expert, with the algorithm chosen once per
// shape class and class of row counts (SHARDLM_MOE_GEMM=batched: one cublasGemmGroupedBatchedEx
// call instead, which ran at 40% of a dense matmul's speed on an H200), spread over side streams
// (lt_grouped).
#include <cmath>
#include <cstring>
#include <cublas_v2.h>

#include "common.cuh"

#define MAXK 32		// most experts a token may choose (Qwen3-MoE: 8)

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

#include "permute.cuh"

// ---- combine (combine.cuh) ----------------------------------------------------------------

#include "combine.cuh"

// the 16-byte kernels apply: H a multiple of 8, the row arrays 16-byte aligned
static bool combine_vec(int H, const void *a, const void *b)
{
	return H % 8 == 0 && (uintptr_t)a % 16 == 0 && (uintptr_t)b % 16 == 0;
}

// threads for 8 columns each, whole warps, at most 256
static int combine_threads(int H)
{
	const int n = (H / 8 + 31) / 32 * 32;

	return n < 256 ? n : 256;
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
	const int n = T > 0 ? T * k : 0, nch = (n + PERM_CH - 1) / PERM_CH;
	// each chunk's counts of each expert (then their prefix sums), and each expert's total
	int *cnt = (int *)sl_cuda_scratch(c, ((size_t)E * nch + E) * sizeof(int), "moe_permute");
	int *tot = cnt + (size_t)E * nch;

	if (E > PERM_MAXE) {
		fprintf(stderr, "cuda: %d experts exceed the permutation's %d\n", E, PERM_MAXE);
		abort();
	}
	if (!nch) {
		CUDA_CHECK(cudaMemsetAsync(offs, 0, (size_t)(E + 1) * sizeof(int), c->stream));
		return;
	}
	k_perm_count<<<nch, PERM_CH, E * sizeof(int), c->stream>>>(cnt, topi, n, E, nch);
	CUDA_LAUNCHED();
	k_perm_scan<<<E, 256, 0, c->stream>>>(cnt, tot, nch);
	CUDA_LAUNCHED();
	k_perm_write<<<nch, PERM_CH, (PERM_CH / 32 + 1) * E * sizeof(int), c->stream>>>(
		rows, slot, offs, cnt, tot, topi, n, k, E, nch);
	CUDA_LAUNCHED();
}

extern "C" void sl_cuda_moe_combine_fwd(struct sl_cuda *c, void *out, const void *y,
					const float *topw, const int *slot, int T, int k, int H)
{
	if (T <= 0)
		return;
	if (combine_vec(H, out, y))
		k_combine_fwd8<<<T, combine_threads(H), 0, c->stream>>>((bf16 *)out, (const bf16 *)y,
									 topw, slot, k, H);
	else
		k_combine_fwd<<<T, 256, 0, c->stream>>>((bf16 *)out, (const bf16 *)y, topw, slot, k,
							H);
	CUDA_LAUNCHED();
}

extern "C" void sl_cuda_moe_combine_bwd(struct sl_cuda *c, void *dy, float *dtopw,
					const void *dout, const void *y, const float *topw,
					const int *slot, int T, int k, int H)
{
	if (T <= 0)
		return;
	if (combine_vec(H, dy, y) && (uintptr_t)dout % 16 == 0 && k <= CB)
		k_combine_bwd8<CB><<<T, combine_threads(H), 0, c->stream>>>(
			(bf16 *)dy, dtopw, (const bf16 *)dout, (const bf16 *)y, topw, slot, k, H);
	else if (combine_vec(H, dy, y) && (uintptr_t)dout % 16 == 0)
		k_combine_bwd8<MAXK><<<T, combine_threads(H), 0, c->stream>>>(
			(bf16 *)dy, dtopw, (const bf16 *)dout, (const bf16 *)y, topw, slot, k, H);
	else
		k_combine_bwd<<<T, 256, 0, c->stream>>>((bf16 *)dy, dtopw, (const bf16 *)dout,
							 (const bf16 *)y, topw, slot, k, H);
	CUDA_LAUNCHED();
}

// ---- grouped matmul ----------------------------------------------------------------------

#define GMAX 4096

#define ROW_CLASSES 16	// row-count classes a shape class keeps an algorithm for (row_class)

// one grouped matmul's shape class: a cuBLASLt descriptor, layouts whose row-count dimension is
// set per expert, and the algorithms the heuristic chose: one per class of row counts (asked
// the first time an expert of that class comes), or (SHARDLM_MOE_ALGO=typical) one for a
// typical expert of 1024 rows for every count
struct lt_plan {
	int key[10];		// ta, tb, which_rows, m0, n0, k0, lda, ldb, ldc, beta != 0
	cublasLtMatmulDesc_t desc;
	cublasLtMatrixLayout_t a, b, c;
	cublasLtMatmulAlgo_t algo[ROW_CLASSES];
	signed char have[ROW_CLASSES];	// 0 not asked yet, 1 algo[i] set, -1 none
};

// the class of a row count: counts in (2^(i+3), 2^(i+4)] are class i (class 0 up to 16 rows, the
// last everything over 2^18); the heuristic is asked for the class's largest count
static int row_class(int rows)
{
	int i = 0;

	while (i < ROW_CLASSES - 1 && rows > 16 << i)
		i++;
	return i;
}

#define MAX_PLANS 32
#define MOE_STREAMS 8	// side streams, at most and by default (each an eighth of the workspace)

// a context's cuBLAS handle (on its stream) and the grouped calls' argument arrays
struct moe_gemm {
	struct lt_plan plans[MAX_PLANS];
	int n_plans;
	int evict;		// the slot the next new shape takes once all are used
	int mode;		// 0 cuBLASLt per expert, 1 cublasGemmGroupedBatchedEx
	bool typical;		// one algorithm a shape class (SHARDLM_MOE_ALGO=typical)
	cublasHandle_t h;
	void **ptrs;		// device: 3 * GMAX pointers (A, B, C of each group)
	int *m, *n, *kk, *lda, *ldb, *ldc, *gs;	// host arrays of GMAX
	float *alpha, *beta;
	cublasOperation_t *ta, *tb;
	// the per-expert matmuls spread over side streams (SHARDLM_MOE_STREAMS, default
	// MOE_STREAMS; 1: all on the compute stream), each with its slice of the workspace
	int nside;
	cudaStream_t side[MOE_STREAMS];
	cudaEvent_t fork, join[MOE_STREAMS];
};

void sl_cuda_moe_free(struct sl_cuda *c)
{
	struct moe_gemm *g = c->moe;

	if (!g)
		return;
	for (int i = 0; i < g->n_plans; i++) {
		cublasLtMatrixLayoutDestroy(g->plans[i].a);
		cublasLtMatrixLayoutDestroy(g->plans[i].b);
		cublasLtMatrixLayoutDestroy(g->plans[i].c);
		cublasLtMatmulDescDestroy(g->plans[i].desc);
	}
	for (int i = 0; g->nside > 1 && i < g->nside; i++) {
		cudaStreamDestroy(g->side[i]);
		cudaEventDestroy(g->join[i]);
	}
	if (g->nside > 1)
		cudaEventDestroy(g->fork);
	cublasDestroy(g->h);
	cudaFree(g->ptrs);
	free(g->m);
	free(g->alpha);
	free(g->ta);
	free(g);
	c->moe = NULL;
}

static struct moe_gemm *grouped_init(struct sl_cuda *c)
{
	struct moe_gemm *g = c->moe;

	if (g)
		return g;
	g = (struct moe_gemm *)calloc(1, sizeof(*g));
	if (!g) {
		fprintf(stderr, "cuda: out of host memory (grouped matmul)\n");
		abort();
	}
	CUBLAS_CHECK(cublasCreate(&g->h));
	CUBLAS_CHECK(cublasSetStream(g->h, c->stream));
	CUDA_CHECK(cudaMalloc((void **)&g->ptrs, 3 * GMAX * sizeof(void *)));
	g->m = (int *)calloc(7 * GMAX, sizeof(int));
	g->alpha = (float *)calloc(2 * GMAX, sizeof(float));
	g->ta = (cublasOperation_t *)calloc(2 * GMAX, sizeof(cublasOperation_t));
	if (!g->m || !g->alpha || !g->ta) {
		fprintf(stderr, "cuda: out of host memory (grouped matmul)\n");
		abort();
	}
	g->n = g->m + GMAX;
	g->kk = g->n + GMAX;
	g->lda = g->kk + GMAX;
	g->ldb = g->lda + GMAX;
	g->ldc = g->ldb + GMAX;
	g->gs = g->ldc + GMAX;
	g->beta = g->alpha + GMAX;
	g->tb = g->ta + GMAX;
	g->mode = getenv("SHARDLM_MOE_GEMM") && !strcmp(getenv("SHARDLM_MOE_GEMM"), "batched");
	if (getenv("SHARDLM_MOE_ALGO")) {
		const char *v = getenv("SHARDLM_MOE_ALGO");

		if (strcmp(v, "typical") && strcmp(v, "rows")) {
			fprintf(stderr, "cuda: SHARDLM_MOE_ALGO=%s: want rows or typical\n", v);
			exit(2);
		}
		g->typical = !strcmp(v, "typical");
	}
	g->nside = MOE_STREAMS;
	if (getenv("SHARDLM_MOE_STREAMS")) {
		const char *v = getenv("SHARDLM_MOE_STREAMS");
		char *end;
		long n = strtol(v, &end, 10);

		if (end == v || *end || n < 1 || n > MOE_STREAMS) {
			fprintf(stderr, "cuda: SHARDLM_MOE_STREAMS=%s: want 1 to %d\n", v,
				MOE_STREAMS);
			exit(2);
		}
		g->nside = (int)n;
	}
	for (int i = 0; g->nside > 1 && i < g->nside; i++) {
		CUDA_CHECK(cudaStreamCreateWithPriority(&g->side[i], cudaStreamNonBlocking, c->prio));
		CUDA_CHECK(cudaEventCreateWithFlags(&g->join[i], cudaEventDisableTiming));
	}
	if (g->nside > 1)
		CUDA_CHECK(cudaEventCreateWithFlags(&g->fork, cudaEventDisableTiming));
	c->moe = g;
	return g;
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

static void set_dims(cublasLtMatrixLayout_t l, uint64_t rows, uint64_t cols)
{
	CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_ROWS, &rows,
						      sizeof(rows)));
	CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_COLS, &cols,
						      sizeof(cols)));
}

// the heuristic's first algorithm for the layouts as they are now; false when there is none
static bool heuristic(struct sl_cuda *c, struct lt_plan *p, cublasLtMatmulAlgo_t *algo,
		      size_t wsb)
{
	cublasLtMatmulPreference_t pref;
	cublasLtMatmulHeuristicResult_t res;
	uint32_t al = 16;	// every expert's rows start 16-byte aligned, no more
	int nres = 0;

	CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
	CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref,
		CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb, sizeof(wsb)));
	CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref,
		CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al, sizeof(al)));
	CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref,
		CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al, sizeof(al)));
	CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref,
		CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al, sizeof(al)));
	CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref,
		CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al, sizeof(al)));
	cublasLtMatmulAlgoGetHeuristic(c->lt, p->desc, p->a, p->b, p->c, p->c, pref, 1, &res,
				       &nres);
	cublasLtMatmulPreferenceDestroy(pref);
	if (nres < 1)
		return false;
	*algo = res.algo;
	return true;
}

// (m, n, k) of one expert: the row count replaces the dimension @which_rows names
static void dims(int which_rows, int rows, int m0, int n0, int k0, int *m, int *n, int *k)
{
	*m = which_rows == 0 ? rows : m0;
	*n = which_rows == 1 ? rows : n0;
	*k = which_rows == 2 ? rows : k0;
}

static void plan_dims(struct lt_plan *p, int ta, int tb, int m, int n, int k)
{
	set_dims(p->a, ta ? k : m, ta ? m : k);
	set_dims(p->b, tb ? n : k, tb ? k : n);
	set_dims(p->c, m, n);
}

static struct lt_plan *plan_get(struct moe_gemm *g, const int *key)
{
	struct lt_plan *p;
	cublasOperation_t ta = key[0] ? CUBLAS_OP_T : CUBLAS_OP_N;
	cublasOperation_t tb = key[1] ? CUBLAS_OP_T : CUBLAS_OP_N;

	for (int i = 0; i < g->n_plans; i++)
		if (!memcmp(g->plans[i].key, key, sizeof(g->plans[i].key)))
			return &g->plans[i];
	if (g->n_plans < MAX_PLANS) {
		p = &g->plans[g->n_plans++];
	} else {
		// full (a model has a few shapes a layer; tests sweep many): reuse the slots in
		// turn.  A plan is only read while its own call enqueues its matmuls.
		p = &g->plans[g->evict];
		g->evict = (g->evict + 1) % MAX_PLANS;
		CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(p->a));
		CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(p->b));
		CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(p->c));
		CUBLAS_CHECK(cublasLtMatmulDescDestroy(p->desc));
	}
	memcpy(p->key, key, sizeof(p->key));
	CUBLAS_CHECK(cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
	CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta,
						    sizeof(ta)));
	CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb,
						    sizeof(tb)));
	CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->a, CUDA_R_16BF, 1, 1, key[6]));
	CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->b, CUDA_R_16BF, 1, 1, key[7]));
	CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->c, CUDA_R_16BF, 1, 1, key[8]));
	memset(p->have, 0, sizeof(p->have));
	return p;
}

// the plan's algorithm for an expert of @rows rows (asked of the heuristic the first time its
// class comes; the layouts are left at the class's size); NULL where there is none
static const cublasLtMatmulAlgo_t *plan_algo(struct sl_cuda *c, const struct moe_gemm *g,
					     struct lt_plan *p, int rows)
{
	const int *key = p->key;
	const int i = g->typical ? 0 : row_class(rows);
	int m, n, k;

	if (!p->have[i]) {
		dims(key[2], g->typical ? 1024 : 16 << i, key[3], key[4], key[5], &m, &n, &k);
		plan_dims(p, key[0], key[1], m, n, k);
		p->have[i] = heuristic(c, p, &p->algo[i], c->ws_bytes / MOE_STREAMS) ? 1 : -1;
	}
	return p->have[i] > 0 ? &p->algo[i] : NULL;
}

// the experts with rows, largest first (stable; an expert without rows has nothing to write or
// add) into order; returns how many
int sl_cuda_moe_order(int *order, const int *h_offs, int E)
{
	int ne = 0;

	for (int e = 0; e < E; e++) {
		const int rows = h_offs[e + 1] - h_offs[e];
		int i = ne;

		if (rows <= 0)
			continue;
		ne++;
		while (i > 0 && h_offs[order[i - 1] + 1] - h_offs[order[i - 1]] < rows) {
			order[i] = order[i - 1];
			i--;
		}
		order[i] = e;
	}
	return ne;
}

// moe_mm.cu's kernel for some of the experts (sl_cuda_moe_mm_rows: those under max_rows rows)
extern "C" bool sl_cuda_moe_mm_fits(int form, const void *out, const void *a, const void *b,
				    int E, int K, int N, size_t ws);
extern "C" void sl_cuda_moe_mm_rows(cudaStream_t st, int form, void *out, const void *a,
				    const void *b, const int *h_offs, int E, int K, int N, size_t ws,
				    int max_rows);

#define SMALL_ROWS 1024	// small_rows()'s default

// the experts of fewer rows than this (SHARDLM_MOE_SMALL; 0: none) go to one launch of the
// warpgroup kernel (moe_mm.cu) beside the per-expert cuBLASLt calls of the others, where the
// kernel applies: each of them alone would fill few SMs for a few microseconds, one after the
// other at the rate the host launches them (read once)
static int small_rows(void)
{
	static int v = -1;

	if (v < 0) {
		const char *e = getenv("SHARDLM_MOE_SMALL");
		char *end;
		long n = e && *e ? strtol(e, &end, 10) : SMALL_ROWS;

		if (e && *e && (end == e || *end || n < 0 || n > 1 << 30)) {
			fprintf(stderr, "cuda: SHARDLM_MOE_SMALL=%s: want a row count (0: off)\n",
				e);
			exit(2);
		}
		v = (int)n;
	}
	return v;
}

// the small experts' one launch (small_rows): form and operands of sl_cuda_moe_mm_rows
struct mm_small {
	int form;
	void *out;
	const void *a, *b;
	const int *h_offs;
	int E, K, N, max_rows;
	size_t ws;
};

// one cuBLASLt matmul per expert with rows (with @sm, only those of sm->max_rows rows or more;
// the others in sm's one launch), the plan's algorithm (else this shape's own).  With side
// streams the experts go to them largest first, each to the stream with the fewest rows so far
// (the small experts' matmuls fill few SMs alone), sm's launch last, every stream after the
// compute stream's work so far and the compute stream after all of them; stream s uses
// workspace slice s.  Each expert's matmul is the same whichever stream runs it: the results do
// not depend on the spread.
static void lt_grouped(struct sl_cuda *c, struct moe_gemm *g, const int *h_offs, int E, int ta,
		       int tb, int which_rows, int m0, int n0, int k0, const void *A, size_t sa,
		       size_t ra, int lda, const void *B, size_t sb, size_t rb, int ldb, void *C,
		       size_t sc, size_t rc, int ldc, float beta, const struct mm_small *sm)
{
	int key[10] = { ta, tb, which_rows, m0, n0, k0, lda, ldb, ldc, beta != 0.f };
	struct lt_plan *p = plan_get(g, key);
	// the same budget whatever the streams: the same algorithms, the same results
	const size_t wsb = c->ws_bytes / MOE_STREAMS;
	float alpha = 1.f;
	int order[GMAX], sid[GMAX], ne = 0, nsmall = 0;
	const int na = sl_cuda_moe_order(order, h_offs, E);
	long load[MOE_STREAMS] = { 0 };	// rows given to each stream (0: unused)
	long small = 0;
	bool spread;
	int ss = 0;

	// the experts for cuBLASLt (largest first), and the small ones' rows
	for (int i = 0; i < na; i++) {
		const int rows = h_offs[order[i] + 1] - h_offs[order[i]];

		if (sm && rows < sm->max_rows) {
			small += rows;
			nsmall++;
		} else {
			order[ne++] = order[i];
		}
	}
	spread = g->nside > 1 && ne + (nsmall > 0) > 1;
	for (int i = 0; i < ne; i++) {
		int s = 0;

		for (int j = 1; spread && j < g->nside; j++)
			if (load[j] < load[s])
				s = j;
		sid[i] = s;
		load[s] += h_offs[order[i] + 1] - h_offs[order[i]];
	}
	if (nsmall) {
		for (int j = 1; spread && j < g->nside; j++)
			if (load[j] < load[ss])
				ss = j;
		load[ss] += small;
	}
	if (spread) {
		CUDA_CHECK(cudaEventRecord(g->fork, c->stream));
		for (int s = 0; s < g->nside; s++)
			if (load[s])
				CUDA_CHECK(cudaStreamWaitEvent(g->side[s], g->fork, 0));
	}
	for (int i = 0; i < ne; i++) {
		const int e = order[i], rows = h_offs[e + 1] - h_offs[e];
		size_t o = (size_t)h_offs[e];
		const bf16 *a = (const bf16 *)A + sa * e + ra * o;
		const bf16 *b = (const bf16 *)B + sb * e + rb * o;
		bf16 *cc = (bf16 *)C + sc * e + rc * o;
		cudaStream_t st = spread ? g->side[sid[i]] : c->stream;
		void *ws = (char *)c->ws + (spread ? sid[i] : 0) * wsb;
		const cublasLtMatmulAlgo_t *pa = plan_algo(c, g, p, rows);
		cublasLtMatmulAlgo_t algo;
		cublasStatus_t r = CUBLAS_STATUS_NOT_SUPPORTED;
		int m, n, k;

		dims(which_rows, rows, m0, n0, k0, &m, &n, &k);
		plan_dims(p, ta, tb, m, n, k);
		if (pa)
			r = cublasLtMatmul(c->lt, p->desc, &alpha, a, p->a, b, p->b, &beta, cc,
					   p->c, cc, p->c, pa, ws, wsb, st);
		if (r == CUBLAS_STATUS_SUCCESS)
			continue;
		if (!heuristic(c, p, &algo, wsb)) {
			fprintf(stderr, "cuda: cuBLASLt has no algorithm for an expert's matmul "
				"(m %d n %d k %d)\n", m, n, k);
			abort();
		}
		CUBLAS_CHECK(cublasLtMatmul(c->lt, p->desc, &alpha, a, p->a, b, p->b, &beta, cc,
					    p->c, cc, p->c, &algo, ws, wsb, st));
	}
	if (nsmall)
		sl_cuda_moe_mm_rows(spread ? g->side[ss] : c->stream, sm->form, sm->out, sm->a,
				    sm->b, sm->h_offs, sm->E, sm->K, sm->N, sm->ws, sm->max_rows);
	if (spread)
		for (int s = 0; s < g->nside; s++)
			if (load[s]) {
				CUDA_CHECK(cudaEventRecord(g->join[s], g->side[s]));
				CUDA_CHECK(cudaStreamWaitEvent(c->stream, g->join[s], 0));
			}
}

// column-major C(m,n) = op(A) op(B) + beta C per expert, m/n/k from the expert's row count
static void grouped(struct sl_cuda *c, const int *d_offs, const int *h_offs, int E, int ta,
		    int tb, int which_rows, int m0, int n0, int k0, const void *A, size_t sa,
		    size_t ra, int lda, const void *B, size_t sb, size_t rb, int ldb, void *C,
		    size_t sc, size_t rc, int ldc, float beta, const struct mm_small *sm)
{
	struct moe_gemm *g;

	if (E > GMAX) {
		fprintf(stderr, "cuda: %d experts exceed the grouped matmul's %d\n", E, GMAX);
		abort();
	}
	g = grouped_init(c);
	if (g->mode == 0) {
		lt_grouped(c, g, h_offs, E, ta, tb, which_rows, m0, n0, k0, A, sa, ra, lda, B, sb,
			   rb, ldb, C, sc, rc, ldc, beta, sm);
		return;
	}
	for (int e = 0; e < E; e++) {
		int rows = h_offs[e + 1] - h_offs[e];

		g->m[e] = which_rows == 0 ? rows : m0;
		g->n[e] = which_rows == 1 ? rows : n0;
		g->kk[e] = which_rows == 2 ? rows : k0;
		g->lda[e] = lda;
		g->ldb[e] = ldb;
		g->ldc[e] = ldc;
		g->gs[e] = 1;
		g->alpha[e] = 1.f;
		g->beta[e] = beta;
		g->ta[e] = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
		g->tb[e] = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
	}
	k_group_ptrs<<<(E + 127) / 128, 128, 0, c->stream>>>(g->ptrs, d_offs, (const bf16 *)A,
							      sa, ra, (const bf16 *)B, sb, rb,
							      (bf16 *)C, sc, rc, E);
	CUDA_LAUNCHED();
	CUBLAS_CHECK(cublasGemmGroupedBatchedEx(g->h, g->ta, g->tb, g->m, g->n, g->kk, g->alpha,
						(const void *const *)g->ptrs, CUDA_R_16BF, g->lda,
						(const void *const *)(g->ptrs + GMAX), CUDA_R_16BF,
						g->ldb, g->beta, g->ptrs + 2 * GMAX, CUDA_R_16BF,
						g->ldc, E, g->gs, CUBLAS_COMPUTE_32F));
}

// The grouped call fails ("internal operation failed") on rows that are not 16-byte aligned:
// shapes with K or N not a multiple of 8 (tiny test models) take one cuBLASLt matmul per expert.
static bool aligned(int K, int N, const void *a, const void *b, const void *cc)
{
	return K % 8 == 0 && N % 8 == 0 && (uintptr_t)a % 16 == 0 && (uintptr_t)b % 16 == 0 &&
	       (uintptr_t)cc % 16 == 0;
}

// the one-launch warpgroup kernel (moe_mm.cu; SHARDLM_MOE_GEMM=wg): false where it does not apply
extern "C" bool sl_cuda_moe_mm(struct sl_cuda *c, int form, void *out, const void *a,
			       const void *b, const int *h_offs, int E, int K, int N, size_t ws);

// @sm for lt_grouped: form @form's small experts (small_rows) in one launch of the warpgroup
// kernel, where it applies; else NULL (every expert by cuBLASLt)
static const struct mm_small *small_of(struct mm_small *sm, int form, void *out, const void *a,
				       const void *b, const int *h_offs, int E, int K, int N,
				       size_t ws)
{
	*sm = (struct mm_small){ form, out, a, b, h_offs, E, K, N, small_rows(), ws };
	return sm->max_rows > 0 && sl_cuda_moe_mm_fits(form, out, a, b, E, K, N, ws) ? sm : NULL;
}

// out(rows, N) = x(rows, K) w_e(N, K)^T  ->  out^T (N, rows) = w_e^T-op x^T (see gemm.cu)
extern "C" void sl_cuda_moe_gemm_fwd(struct sl_cuda *c, void *out, const void *x, const void *w,
				     const int *d_offs, const int *h_offs, int E, int K, int N,
				     size_t ws)
{
	struct mm_small sm;

	if (sl_cuda_moe_mm(c, 0, out, x, w, h_offs, E, K, N, ws))
		return;
	if (!aligned(K, N, out, x, w)) {
		for (int e = 0; e < E; e++)
			if (h_offs[e + 1] > h_offs[e])
				sl_cuda_matmul_fwd(c, (bf16 *)out + (size_t)h_offs[e] * N,
						   (const bf16 *)x + (size_t)h_offs[e] * K,
						   (const bf16 *)w + e * ws, NULL,
						   h_offs[e + 1] - h_offs[e], K, N);
		return;
	}
	grouped(c, d_offs, h_offs, E, 1, 0, 1, N, 0, K, w, ws, 0, K, x, 0, K, K, out, 0, N, N,
		0.f, small_of(&sm, 0, out, x, w, h_offs, E, K, N, ws));
}

// @dw_set: zeros for the (N,K) blocks of the experts without rows (the others' are written)
static void zero_empty(struct sl_cuda *c, void *dw, const int *h_offs, int E, int K, int N,
		       size_t ws, bool all)
{
	for (int e = 0; e < E; e++)
		if (all || h_offs[e + 1] <= h_offs[e])
			CUDA_CHECK(cudaMemsetAsync((bf16 *)dw + e * ws, 0,
						   (size_t)N * K * sizeof(bf16), c->stream));
}

extern "C" void sl_cuda_moe_gemm_bwd(struct sl_cuda *c, void *dx, void *dw, const void *dout,
				     const void *x, const void *w, const int *d_offs,
				     const int *h_offs, int E, int K, int N, size_t ws, bool dw_set)
{
	struct mm_small sm;
	const int dwf = dw_set ? 3 : 2;	// moe_mm.cu's form for dw

	if (!aligned(K, N, dout, x, w) || (dx && (uintptr_t)dx % 16) || (uintptr_t)dw % 16) {
		if (dw_set)
			zero_empty(c, dw, h_offs, E, K, N, ws, true);
		for (int e = 0; e < E; e++) {
			size_t o = (size_t)h_offs[e];

			if (h_offs[e + 1] > h_offs[e])
				sl_cuda_matmul_bwd(c, dx ? (bf16 *)dx + o * K : NULL,
						   (bf16 *)dw + e * ws, NULL,
						   (const bf16 *)dout + o * N,
						   (const bf16 *)x + o * K,
						   (const bf16 *)w + e * ws,
						   h_offs[e + 1] - h_offs[e], K, N, 0);
		}
		return;
	}
	if (dw_set)
		zero_empty(c, dw, h_offs, E, K, N, ws, false);
	// each product by the warpgroup kernel where it applies, else by cuBLASLt
	// dx^T (K, rows) = w_e (K, N col-major) dout^T (N, rows)
	if (dx && !sl_cuda_moe_mm(c, 1, dx, dout, w, h_offs, E, K, N, ws))
		grouped(c, d_offs, h_offs, E, 0, 0, 1, K, 0, N, w, ws, 0, K, dout, 0, N, N, dx, 0,
			K, K, 0.f, small_of(&sm, 1, dx, dout, w, h_offs, E, K, N, ws));
	// dw_e^T (K, N) += x^T (K, rows) dout (rows, N)  (= with dw_set)
	if (!sl_cuda_moe_mm(c, dwf, dw, dout, x, h_offs, E, K, N, ws))
		grouped(c, d_offs, h_offs, E, 0, 1, 2, K, N, 0, x, 0, K, K, dout, 0, N, N, dw, ws,
			0, K, dw_set ? 0.f : 1.f, small_of(&sm, dwf, dw, dout, x, h_offs, E, K, N,
							   ws));
}
