// gemm.cu: the backend's matrix multiplies through cuBLASLt, bf16 in and out, fp32 compute.
//
// backend.h is row-major; cuBLASLt is column-major.  A row-major (R, C) matrix is the column-major
// (C, R) one, so every product is computed transposed and no transpose is ever materialized:
//   out(T,N) = x(T,K) w(N,K)^T      ->  out^T (N,T) = w^T x^T   : op(A=w)=T, op(B=x)=N
//   dx(T,K)  = dout(T,N) w(N,K)     ->  dx^T  (K,T) = w   dout^T : N, N
//   dw(N,K) += dout^T(N,T) x(T,K)   ->  dw^T  (K,N) = x   dout   : N, T (beta 1)
// Descriptors, layouts and the heuristic's algorithm are cached per shape, transposes, epilogue
// and pointer alignment, so a step's matmuls cost no heuristic queries after the first.
#include <cstring>

#include "common.cuh"

struct gemm_key {
	int ta, tb, m, n, k, lda, ldb, ldc, bias, align;
};

struct gemm_entry {
	struct gemm_key key;
	cublasLtMatmulDesc_t desc;
	cublasLtMatrixLayout_t a, b, c;
	cublasLtMatmulAlgo_t algo;
};

void sl_cuda_gemm_cache_free(struct sl_cuda *c)
{
	for (int i = 0; i < c->n_gemms; i++) {
		struct gemm_entry *e = &c->gemms[i];

		cublasLtMatrixLayoutDestroy(e->a);
		cublasLtMatrixLayoutDestroy(e->b);
		cublasLtMatrixLayoutDestroy(e->c);
		cublasLtMatmulDescDestroy(e->desc);
	}
	free(c->gemms);
	c->gemms = NULL;
	c->n_gemms = c->cap_gemms = 0;
}

static int align_of(const void *p)
{
	uintptr_t a = (uintptr_t)p;
	int al = 256;

	while (al > 2 && a % al)
		al /= 2;
	return al;
}

static struct gemm_entry *gemm_get(struct sl_cuda *c, const struct gemm_key *key)
{
	struct gemm_entry *e;
	cublasLtMatmulPreference_t pref;
	cublasLtMatmulHeuristicResult_t res;
	cublasOperation_t ta = key->ta ? CUBLAS_OP_T : CUBLAS_OP_N;
	cublasOperation_t tb = key->tb ? CUBLAS_OP_T : CUBLAS_OP_N;
	uint32_t al = key->align;
	int nres = 0;

	for (int i = 0; i < c->n_gemms; i++)
		if (!memcmp(&c->gemms[i].key, key, sizeof(*key)))
			return &c->gemms[i];
	if (c->n_gemms == c->cap_gemms) {
		int cap = c->cap_gemms ? 2 * c->cap_gemms : 64;
		void *p = realloc(c->gemms, (size_t)cap * sizeof(*c->gemms));

		if (!p) {
			fprintf(stderr, "cuda: out of host memory (gemm cache)\n");
			abort();
		}
		c->gemms = (struct gemm_entry *)p;
		c->cap_gemms = cap;
	}
	e = &c->gemms[c->n_gemms];
	memset(e, 0, sizeof(*e));
	e->key = *key;
	CUBLAS_CHECK(cublasLtMatmulDescCreate(&e->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
	CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(e->desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta,
						    sizeof(ta)));
	CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(e->desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb,
						    sizeof(tb)));
	if (key->bias) {
		cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
		cudaDataType_t bt = CUDA_R_16BF;

		CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(e->desc, CUBLASLT_MATMUL_DESC_EPILOGUE,
							    &epi, sizeof(epi)));
		CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(e->desc,
			CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof(bt)));
	}
	CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&e->a, CUDA_R_16BF, key->ta ? key->k : key->m,
						key->ta ? key->m : key->k, key->lda));
	CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&e->b, CUDA_R_16BF, key->tb ? key->n : key->k,
						key->tb ? key->k : key->n, key->ldb));
	CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&e->c, CUDA_R_16BF, key->m, key->n, key->ldc));
	CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
	CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref,
		CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &c->ws_bytes, sizeof(c->ws_bytes)));
	CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref,
		CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al, sizeof(al)));
	CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref,
		CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al, sizeof(al)));
	CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref,
		CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al, sizeof(al)));
	CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref,
		CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al, sizeof(al)));
	CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(c->lt, e->desc, e->a, e->b, e->c, e->c, pref, 1,
						    &res, &nres));
	cublasLtMatmulPreferenceDestroy(pref);
	if (nres < 1) {
		fprintf(stderr, "cuda: cuBLASLt has no algorithm for m %d n %d k %d (op %c%c, ld %d "
			"%d %d, align %d)\n", key->m, key->n, key->k, key->ta ? 'T' : 'N',
			key->tb ? 'T' : 'N', key->lda, key->ldb, key->ldc, key->align);
		abort();
	}
	e->algo = res.algo;
	c->n_gemms++;
	return e;
}

// D(m,n) = op(A) op(B) (+ bias(m)) + beta C, column-major; C and D share a layout (C: D when
// NULL)
static void gemm_cd(struct sl_cuda *c, int ta, int tb, int m, int n, int k, const void *A,
		    int lda, const void *B, int ldb, const void *Cin, void *C, int ldc, float beta,
		    const void *bias)
{
	struct gemm_key key = { ta, tb, m, n, k, lda, ldb, ldc, bias != NULL, 0 };
	struct gemm_entry *e;
	float alpha = 1.f;
	int al = align_of(A);

	if (m <= 0 || n <= 0)
		return;
	if (k <= 0) {	// empty sum: C = beta C (+ bias); never happens in the model
		fprintf(stderr, "cuda: gemm with k = 0\n");
		abort();
	}
	al = align_of(B) < al ? align_of(B) : al;
	al = align_of(C) < al ? align_of(C) : al;
	if (Cin)
		al = align_of(Cin) < al ? align_of(Cin) : al;
	key.align = al;
	e = gemm_get(c, &key);
	if (bias)
		CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(e->desc,
			CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
	CUBLAS_CHECK(cublasLtMatmul(c->lt, e->desc, &alpha, A, e->a, B, e->b, &beta,
				    Cin ? Cin : C, e->c, C, e->c, &e->algo, c->ws, c->ws_bytes,
				    c->stream));
}

// C(m,n) = op(A) op(B) (+ bias(m)) + beta C, column-major
static void gemm(struct sl_cuda *c, int ta, int tb, int m, int n, int k, const void *A, int lda,
		 const void *B, int ldb, void *C, int ldc, float beta, const void *bias)
{
	gemm_cd(c, ta, tb, m, n, k, A, lda, B, ldb, NULL, C, ldc, beta, bias);
}

extern "C" void sl_cuda_matmul_fwd(struct sl_cuda *c, void *out, const void *x, const void *w,
				   const void *bias, int T, int K, int N)
{
	gemm(c, 1, 0, N, T, K, w, K, x, K, out, N, 0.f, bias);
}

// the residual in cuBLASLt's C input, the sum in D: one rounding, no separate add
extern "C" void sl_cuda_matmul_fwd_res(struct sl_cuda *c, void *out, const void *x, const void *w,
				       const void *res, int T, int K, int N)
{
	gemm_cd(c, 1, 0, N, T, K, w, K, x, K, res, out, N, 1.f, NULL);
}

extern "C" void sl_cuda_matmul_bwd(struct sl_cuda *c, void *dx, void *dw, void *dbias,
				   const void *dout, const void *x, const void *w, int T, int K,
				   int N, int accumulate)
{
	if (T <= 0 || N <= 0)
		return;
	if (dx)
		gemm(c, 0, 0, K, T, N, w, K, dout, N, dx, K, accumulate ? 1.f : 0.f, NULL);
	gemm(c, 0, 1, K, N, T, x, K, dout, N, dw, K, 1.f, NULL);
	if (dbias)
		sl_cuda_bias_grad(c, dbias, dout, T, N);
}
