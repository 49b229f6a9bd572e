// gemm_algos.cu: is cuBLASLt's first heuristic algorithm the fastest for the dense 4B layer's
// matmuls?  A probe for issue 5 (cuda/gemm.cu takes the heuristic's first answer per shape).
// The twelve matmuls of a Qwen3-4B decoder layer at T tokens (forward qkv, o, gate_up, down;
// their input and weight gradients), laid out as cuda/gemm.cu lays them (row-major operands as
// column-major transposes, bf16 in and out, fp32 compute, 32 MB workspace, 256-byte alignment,
// beta 1 where the trainer adds: the o and down forward's residual, every weight gradient):
//   1. each matmul alone: every algorithm the heuristic offers (up to 32) timed, ms per call as
//      the median of ROUNDS batches of 10 calls; the first answer against the fastest;
//   2. the layer as the trainer runs it: the twelve in order, LAYERS times, with every matmul on
//      the heuristic's first algorithm, then with every matmul on the fastest of part 1,
//      alternating, ROUNDS rounds each (the operands random, so the GPU draws its real power).
// Build (here, no GPU needed):
//   nvcc -O3 -std=c++17 -arch=sm_90 -o bench/gemm_algos bench/gemm_algos.cu -lcublasLt
// Run on the GPU machine: bench/gemm_algos [T [LAYERS [ROUNDS]]]
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "probe_check.h"

static const size_t WS = 32u << 20;

// values near N(0, 0.05): a hash of the index, so the tensor cores see real bits
__global__ void fill(__nv_bfloat16 *p, size_t n, unsigned seed)
{
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
	     i += (size_t)gridDim.x * blockDim.x) {
		unsigned h = (unsigned)i * 2654435761u ^ seed;

		h ^= h >> 15;
		h *= 2246822519u;
		h ^= h >> 13;
		p[i] = __float2bfloat16(((float)(h & 0xffff) / 65536.f - 0.5f) * 0.17f);
	}
}

struct mm {
	const char *name;
	int ta, tb, m, n, k;
	float beta;
	const void *A, *B;
	void *C;
	int lda, ldb, ldc;
	cublasLtMatmulDesc_t desc;
	cublasLtMatrixLayout_t la, lb, lc;
	std::vector<cublasLtMatmulHeuristicResult_t> algos;
	int best;
	double t_first, t_best;
};

static cublasLtHandle_t lt;
static void *ws;
static cudaStream_t st;

static void run(mm &g, const cublasLtMatmulAlgo_t *algo)
{
	const float one = 1.f;

	CB(cublasLtMatmul(lt, g.desc, &one, g.A, g.la, g.B, g.lb, &g.beta, g.C, g.lc, g.C, g.lc,
			  algo, ws, WS, st));
}

static void setup(mm &g)
{
	cublasOperation_t ta = g.ta ? CUBLAS_OP_T : CUBLAS_OP_N, tb = g.tb ? CUBLAS_OP_T : CUBLAS_OP_N;
	cublasLtMatmulPreference_t pref;
	uint32_t al = 256;
	int nres = 0;

	CB(cublasLtMatmulDescCreate(&g.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
	CB(cublasLtMatmulDescSetAttribute(g.desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
	CB(cublasLtMatmulDescSetAttribute(g.desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
	CB(cublasLtMatrixLayoutCreate(&g.la, CUDA_R_16BF, g.ta ? g.k : g.m, g.ta ? g.m : g.k, g.lda));
	CB(cublasLtMatrixLayoutCreate(&g.lb, CUDA_R_16BF, g.tb ? g.n : g.k, g.tb ? g.k : g.n, g.ldb));
	CB(cublasLtMatrixLayoutCreate(&g.lc, CUDA_R_16BF, g.m, g.n, g.ldc));
	CB(cublasLtMatmulPreferenceCreate(&pref));
	CB(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &WS,
						sizeof(WS)));
	CB(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al,
						sizeof(al)));
	CB(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al,
						sizeof(al)));
	CB(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al,
						sizeof(al)));
	CB(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al,
						sizeof(al)));
	g.algos.resize(32);
	CB(cublasLtMatmulAlgoGetHeuristic(lt, g.desc, g.la, g.lb, g.lc, g.lc, pref, 32,
					  g.algos.data(), &nres));
	g.algos.resize(nres);
	cublasLtMatmulPreferenceDestroy(pref);
}

// ms per call: median over rounds of 10 calls
static double time_algo(mm &g, const cublasLtMatmulAlgo_t *algo, int rounds)
{
	cudaEvent_t a, b;
	std::vector<double> v;

	CK(cudaEventCreate(&a));
	CK(cudaEventCreate(&b));
	run(g, algo);
	run(g, algo);
	for (int r = 0; r < rounds; r++) {
		float ms;

		CK(cudaEventRecord(a, st));
		for (int i = 0; i < 10; i++)
			run(g, algo);
		CK(cudaEventRecord(b, st));
		CK(cudaEventSynchronize(b));
		CK(cudaEventElapsedTime(&ms, a, b));
		v.push_back(ms / 10);
	}
	cudaEventDestroy(a);
	cudaEventDestroy(b);
	std::sort(v.begin(), v.end());
	return v[v.size() / 2];
}

int main(int argc, char **argv)
{
	const int T = argc > 1 ? atoi(argv[1]) : 8192, LAYERS = argc > 2 ? atoi(argv[2]) : 8;
	const int ROUNDS = argc > 3 ? atoi(argv[3]) : 5;
	const int H = 2560, Q = 6144, AO = 4096, I = 9728;	// Qwen3-4B: hidden, qkv, attn out, ffn
	const size_t big = (size_t)T * 2 * I;		// the largest activation (gate_up)
	__nv_bfloat16 *x, *y, *w, *dw;

	CK(cudaMalloc(&x, big * 2));
	CK(cudaMalloc(&y, big * 2));
	CK(cudaMalloc(&w, (size_t)2 * I * H * 2));
	CK(cudaMalloc(&dw, (size_t)2 * I * H * 2));
	CK(cudaMalloc(&ws, WS));
	fill<<<1024, 256>>>(x, big, 1);
	fill<<<1024, 256>>>(y, big, 2);
	fill<<<1024, 256>>>(w, (size_t)2 * I * H, 3);
	fill<<<1024, 256>>>(dw, (size_t)2 * I * H, 4);
	CK(cudaStreamCreate(&st));
	CB(cublasLtCreate(&lt));
	cudaDeviceProp prop;
	CK(cudaGetDeviceProperties(&prop, 0));
	printf("%s, T %d, layers %d, rounds %d\n", prop.name, T, LAYERS, ROUNDS);

	// (K, N) of the four weights (row-major out(T, N) = x(T, K) w(N, K)^T), as gemm.cu calls them
	struct { const char *n; int K, N; float rb; } W[4] = {
		{ "qkv", H, Q, 0.f }, { "o", AO, H, 1.f }, { "gate_up", H, 2 * I, 0.f }, { "down", I, H, 1.f } };
	std::vector<mm> g;
	for (int i = 0; i < 4; i++) {	// forward: op(A=w)=T, op(B=x)=N, m N, n T, k K
		mm f = {};
		f.name = W[i].n; f.ta = 1; f.tb = 0; f.m = W[i].N; f.n = T; f.k = W[i].K; f.beta = W[i].rb;
		f.A = w; f.lda = W[i].K; f.B = x; f.ldb = W[i].K; f.C = y; f.ldc = W[i].N;
		g.push_back(f);
	}
	for (int i = 3; i >= 0; i--) {	// backward, the layer's last matmul first
		mm d = {}, u = {};
		// input gradient: m K, n T, k N (w, dout)
		d.name = W[i].n; d.ta = 0; d.tb = 0; d.m = W[i].K; d.n = T; d.k = W[i].N; d.beta = 0.f;
		d.A = w; d.lda = W[i].K; d.B = y; d.ldb = W[i].N; d.C = x; d.ldc = W[i].K;
		// weight gradient: m K, n N, k T (x, dout), added into dw
		u.name = W[i].n; u.ta = 0; u.tb = 1; u.m = W[i].K; u.n = W[i].N; u.k = T; u.beta = 1.f;
		u.A = x; u.lda = W[i].K; u.B = y; u.ldb = W[i].N; u.C = dw; u.ldc = W[i].K;
		g.push_back(d);
		g.push_back(u);
	}
	const char *kind[12] = { "fwd", "fwd", "fwd", "fwd", "dgrad", "wgrad", "dgrad", "wgrad",
				 "dgrad", "wgrad", "dgrad", "wgrad" };

	printf("\n%-8s %-6s %6s %6s %6s %5s %9s %9s %5s %8s\n", "matmul", "kind", "m", "n", "k",
	       "algos", "first ms", "best ms", "best", "gain");
	double sf = 0, sb = 0, flops = 0;
	for (size_t i = 0; i < g.size(); i++) {
		mm &e = g[i];
		setup(e);
		e.best = 0;
		e.t_first = e.t_best = time_algo(e, &e.algos[0].algo, ROUNDS);
		for (size_t a = 1; a < e.algos.size(); a++) {
			double t = time_algo(e, &e.algos[a].algo, ROUNDS);

			if (t < e.t_best) {
				e.t_best = t;
				e.best = (int)a;
			}
		}
		// the first answer again (a late clock change would show here)
		e.t_first = std::min(e.t_first, time_algo(e, &e.algos[0].algo, ROUNDS));
		const double f = 2.0 * e.m * e.n * e.k;
		flops += f;
		sf += e.t_first;
		sb += e.t_best;
		printf("%-8s %-6s %6d %6d %6d %5zu %9.3f %9.3f %5d %7.1f%%   (%.0f / %.0f TFLOP/s)\n",
		       e.name, kind[i], e.m, e.n, e.k, e.algos.size(), e.t_first, e.t_best, e.best,
		       100.0 * (e.t_first - e.t_best) / e.t_first, f / e.t_first / 1e9,
		       f / e.t_best / 1e9);
	}
	printf("%-8s %-6s %27s %9.3f %9.3f %13.1f%%   (%.0f / %.0f TFLOP/s)\n", "layer", "sum", "",
	       sf, sb, 100.0 * (sf - sb) / sf, flops / sf / 1e9, flops / sb / 1e9);

	// the layer sequence, LAYERS times, first answers against the fastest, alternating
	cudaEvent_t a, b;
	CK(cudaEventCreate(&a));
	CK(cudaEventCreate(&b));
	std::vector<double> tf, tb;
	for (int r = 0; r < ROUNDS + 1; r++)
		for (int which = 0; which < 2; which++) {
			float ms;

			CK(cudaEventRecord(a, st));
			for (int l = 0; l < LAYERS; l++)
				for (auto &e : g)
					run(e, &e.algos[which ? e.best : 0].algo);
			CK(cudaEventRecord(b, st));
			CK(cudaEventSynchronize(b));
			CK(cudaEventElapsedTime(&ms, a, b));
			if (r > 0)	// the first round warms up
				(which ? tb : tf).push_back(ms);
		}
	std::sort(tf.begin(), tf.end());
	std::sort(tb.begin(), tb.end());
	printf("\n%d layers in sequence, ms (median of %d, alternating): first answers %.2f, "
	       "fastest %.2f (%.1f%%)\n", LAYERS, ROUNDS, tf[tf.size() / 2], tb[tb.size() / 2],
	       100.0 * (tf[tf.size() / 2] - tb[tb.size() / 2]) / tf[tf.size() / 2]);
	return 0;
}
