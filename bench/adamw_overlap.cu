// adamw_overlap.cu: does AdamW hide under a forward's matmuls when it is given SMs of its own?
// A probe for the AdamW overlap's design (issue 5): the dense 4B layer's four forward matmuls
// (T = 8192 tokens: qkv, o, gate_up, down) for LAYERS layers on one stream, and AdamW over those
// layers' parameters (28 bytes each: fp32 p, m, v read and written, bf16 gradient read, bf16
// copy written) on another:
//   gemm     the matmuls alone (all SMs)
//   adamw    AdamW alone (a grid over all SMs)
//   seq      one after the other
//   lowprio  both at once, AdamW on a low-priority stream with a full grid (the trainer's
//            overlap as it is: AdamW's blocks start where the matmuls leave room)
//   pin K    both at once, AdamW as K blocks of 1024 threads holding 120 KB of shared memory
//            each (one an SM: no matmul block fits beside one), launched first on a
//            high-priority stream; the matmuls' algorithms chosen by cuBLASLt for SMs - K
//            (CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET)
//   adamw K  AdamW alone on K such blocks (what K SMs move)
// Milliseconds per round, median of ROUNDS; "saved" is seq minus the concurrent time.
// Build (here, no GPU needed):
//   nvcc -O3 -std=c++17 -arch=sm_90 -o bench/adamw_overlap bench/adamw_overlap.cu -lcublasLt
// Run on the GPU machine: bench/adamw_overlap [LAYERS [ROUNDS]]
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "probe_check.h"

#define PIN_SMEM (120 << 10)

// AdamW's traffic as the trainer's k_adamw4 has it (fp32 p, m, v in and out, a bf16 gradient
// in, a bf16 copy out) with about its arithmetic (not its exact rounding), four elements a
// thread, grid-stride
__global__ void __launch_bounds__(1024) k_adam(float4 *p, float4 *m, float4 *v,
					       const uint2 *g, uint2 *wo, size_t n4)
{
	extern __shared__ char hold[];	// only held, so that no matmul block fits beside

	(void)hold;
	const float decay = 1.f - 3e-5f, w1 = 0.1f, b2 = 0.95f, w2 = 0.05f, bc2s = 0.5f,
		    step = -3e-4f, eps = 1e-8f;

	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n4;
	     i += (size_t)gridDim.x * blockDim.x) {
		float4 P = p[i], M = m[i], V = v[i];
		uint2 G = g[i];
		float pf[4] = { P.x, P.y, P.z, P.w }, mf[4] = { M.x, M.y, M.z, M.w };
		float vf[4] = { V.x, V.y, V.z, V.w };
		float gf[4] = { __uint_as_float(G.x << 16), __uint_as_float(G.x & 0xffff0000u),
				__uint_as_float(G.y << 16), __uint_as_float(G.y & 0xffff0000u) };
		__nv_bfloat162 o[2];

#pragma unroll
		for (int k = 0; k < 4; k++) {
			float mi = mf[k] + w1 * (gf[k] - mf[k]);
			float vi = vf[k] * b2 + w2 * gf[k] * gf[k];

			pf[k] = pf[k] * decay + step * mi / (sqrtf(vi) / bc2s + eps);
			mf[k] = mi;
			vf[k] = vi;
		}
		p[i] = make_float4(pf[0], pf[1], pf[2], pf[3]);
		m[i] = make_float4(mf[0], mf[1], mf[2], mf[3]);
		v[i] = make_float4(vf[0], vf[1], vf[2], vf[3]);
		o[0] = __floats2bfloat162_rn(pf[0], pf[1]);
		o[1] = __floats2bfloat162_rn(pf[2], pf[3]);
		wo[i] = *(uint2 *)o;
	}
}

struct mm {
	int n, k;
	cublasLtMatmulDesc_t d;
	cublasLtMatrixLayout_t a, b, c;
	cublasLtMatmulAlgo_t algo[2];	// all SMs, the target
};

static cublasLtHandle_t lt;
static void *ws;
static const size_t WS = 64 << 20;
static int T = 8192;

static void pick(mm &x, int slot, int sms)
{
	cublasLtMatmulPreference_t pref;
	cublasLtMatmulHeuristicResult_t r;
	int nr = 0;

	CB(cublasLtMatmulDescSetAttribute(x.d, CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET, &sms,
					  sizeof(sms)));
	CB(cublasLtMatmulPreferenceCreate(&pref));
	CB(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &WS,
						sizeof(WS)));
	CB(cublasLtMatmulAlgoGetHeuristic(lt, x.d, x.a, x.b, x.c, x.c, pref, 1, &r, &nr));
	if (nr < 1) {
		fprintf(stderr, "no algorithm\n");
		exit(1);
	}
	x.algo[slot] = r.algo;
	cublasLtMatmulPreferenceDestroy(pref);
}

static void mk(mm &x, int n, int k)
{
	cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;

	x.n = n, x.k = k;
	CB(cublasLtMatmulDescCreate(&x.d, CUBLAS_COMPUTE_32F, CUDA_R_32F));
	CB(cublasLtMatmulDescSetAttribute(x.d, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
	CB(cublasLtMatmulDescSetAttribute(x.d, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
	CB(cublasLtMatrixLayoutCreate(&x.a, CUDA_R_16BF, k, n, k));
	CB(cublasLtMatrixLayoutCreate(&x.b, CUDA_R_16BF, k, T, k));
	CB(cublasLtMatrixLayoutCreate(&x.c, CUDA_R_16BF, n, T, n));
}

int main(int argc, char **argv)
{
	const int L = argc > 1 ? atoi(argv[1]) : 8, R = argc > 2 ? atoi(argv[2]) : 5;
	const int H = 2560, I = 9728, QKV = (32 + 16) * 128, O = 32 * 128;
	const size_t per_layer = (size_t)H * QKV + (size_t)O * H + (size_t)H * 2 * I + (size_t)I * H;
	const size_t np = per_layer * L, n4 = np / 4;
	cudaDeviceProp prop;
	int lo, hi, sms;

	CK(cudaGetDeviceProperties(&prop, 0));
	sms = prop.multiProcessorCount;
	CK(cudaDeviceGetStreamPriorityRange(&lo, &hi));
	CB(cublasLtCreate(&lt));
	CK(cudaMalloc(&ws, WS));
	mm g[4];
	mk(g[0], QKV, H);
	mk(g[1], H, O);
	mk(g[2], 2 * I, H);
	mk(g[3], H, I);
	void *x, *w, *y;
	CK(cudaMalloc(&x, (size_t)T * I * 2));
	CK(cudaMalloc(&w, (size_t)2 * I * H * 2));
	CK(cudaMalloc(&y, (size_t)T * 2 * I * 2));
	CK(cudaMemset(x, 0x3c, (size_t)T * I * 2));
	CK(cudaMemset(w, 0x3a, (size_t)2 * I * H * 2));
	float4 *p, *m, *v;
	uint2 *gr, *wo;
	CK(cudaMalloc(&p, np * 4));
	CK(cudaMalloc(&m, np * 4));
	CK(cudaMalloc(&v, np * 4));
	CK(cudaMalloc(&gr, np * 2));
	CK(cudaMalloc(&wo, np * 2));
	CK(cudaMemset(p, 0, np * 4));
	CK(cudaMemset(m, 0, np * 4));
	CK(cudaMemset(v, 0, np * 4));
	CK(cudaMemset(gr, 0x3c, np * 2));
	CK(cudaFuncSetAttribute(k_adam, cudaFuncAttributeMaxDynamicSharedMemorySize, PIN_SMEM));
	cudaStream_t sg, slo, shi;
	CK(cudaStreamCreateWithPriority(&sg, cudaStreamNonBlocking, hi));
	CK(cudaStreamCreateWithPriority(&slo, cudaStreamNonBlocking, lo));
	CK(cudaStreamCreateWithPriority(&shi, cudaStreamNonBlocking, hi));
	cudaEvent_t e0, e1, ej;
	CK(cudaEventCreate(&e0));
	CK(cudaEventCreate(&e1));
	CK(cudaEventCreate(&ej));
	printf("%s, %d SMs; %d layers: %.2f GFLOP of matmuls, %zu M parameters (%.2f GB of "
	       "AdamW traffic)\n", prop.name, sms, L,
	       2.0 * T * per_layer * L / 1e9, np >> 20, 28.0 * np / 1e9);

	auto gemms = [&](int slot) {
		const float al = 1.f, be = 0.f;

		for (int l = 0; l < L; l++)
			for (int i = 0; i < 4; i++)
				CB(cublasLtMatmul(lt, g[i].d, &al, w, g[i].a, x, g[i].b, &be, y,
						  g[i].c, y, g[i].c, &g[i].algo[slot], ws, WS, sg));
	};
	auto adam = [&](cudaStream_t s, int blocks, int thr, size_t sm) {
		k_adam<<<blocks, thr, sm, s>>>(p, m, v, gr, wo, n4);
		CK(cudaGetLastError());
	};
	const int full = (int)std::min<size_t>((n4 + 255) / 256, (size_t)sms * 8);
	// time fn over R rounds (after one warm-up): every stream forks from and joins sg
	auto timed = [&](const char *name, auto fn) {
		std::vector<float> t;

		for (int r = 0; r <= R; r++) {
			float ms;

			CK(cudaEventRecord(e0, sg));
			CK(cudaStreamWaitEvent(slo, e0, 0));
			CK(cudaStreamWaitEvent(shi, e0, 0));
			fn();
			CK(cudaEventRecord(ej, slo));
			CK(cudaStreamWaitEvent(sg, ej, 0));
			CK(cudaEventRecord(ej, shi));
			CK(cudaStreamWaitEvent(sg, ej, 0));
			CK(cudaEventRecord(e1, sg));
			CK(cudaEventSynchronize(e1));
			CK(cudaEventElapsedTime(&ms, e0, e1));
			if (r)
				t.push_back(ms);
		}
		std::sort(t.begin(), t.end());
		printf("  %-14s %8.3f ms (min %.3f, max %.3f)\n", name, t[t.size() / 2], t[0],
		       t.back());
		return t[t.size() / 2];
	};

	for (int i = 0; i < 4; i++)
		pick(g[i], 0, sms);
	const float tg = timed("gemm", [&] { gemms(0); });
	const float ta = timed("adamw", [&] { adam(slo, full, 256, 0); });
	const float ts = timed("seq", [&] { gemms(0); adam(sg, full, 256, 0); });
	const float tl = timed("lowprio", [&] { gemms(0); adam(slo, full, 256, 0); });
	printf("  adamw alone at %.0f GB/s; lowprio saves %.3f ms of %.3f\n", 28.0 * np / ta / 1e6,
	       ts - tl, ta);
	const int ks[] = { 8, 16, 24, 32, 48 };
	for (int k : ks) {
		char nm[32];

		for (int i = 0; i < 4; i++)
			pick(g[i], 1, sms - k);
		snprintf(nm, sizeof(nm), "adamw %d", k);
		const float tk = timed(nm, [&] { adam(shi, k, 1024, PIN_SMEM); });
		snprintf(nm, sizeof(nm), "gemm at %d", sms - k);
		timed(nm, [&] { gemms(1); });
		snprintf(nm, sizeof(nm), "pin %d", k);
		const float tp = timed(nm, [&] { adam(shi, k, 1024, PIN_SMEM); gemms(1); });
		printf("  %d SMs move %.0f GB/s (%.1f a SM); pin %d saves %.3f ms of %.3f\n", k,
		       28.0 * np / tk / 1e6, 28.0 * np / tk / 1e6 / k, k, ts - tp, ta);
	}
	printf("gemm %.3f adamw %.3f seq %.3f lowprio %.3f\n", tg, ta, ts, tl);
	return 0;
}
