/*
 * moe_step: time the model's SFT forward + backward of one micro-batch on the cuda backend at a
 * Qwen3-MoE shape (no optimizer, no sharding: the model and its MoE ops alone), and the share of
 * that time each MoE op takes at one layer.  A development tool for issue 8's benchmark
 * (bench/moe_vs_fsdp2.sh measures the whole trainer).
 *   moe_step [B L [layers [experts [k [ops]]]]]     defaults 2 4096 12 64 8
 * The shape otherwise: hidden 2048, moe_intermediate 768, 32 heads, 4 KV heads, head_dim 128,
 * vocab 151936, every token a target.  Prints ms per step and tokens/s (median of 5 after 2);
 * with a sixth argument, instead each MoE op of one layer alone (ms per call).
 * Needs only the backends and the model (no MPI, HDF5 or JSON), e.g. from the source tree:
 *   nvcc -O3 -arch=sm_90 -c cuda/{context,ops,attention,gemm,moe,copy}.cu  (one -o each)
 *   gcc -O2 -fopenmp -DSL_HAVE_CUDA -Isrc -Icuda -I/usr/local/cuda/include -c src/backend_cpu.c
 *       src/backend_cpu_async.c src/backend_cuda.c src/model.c src/model_moe.c bench/moe_step.c
 *   gcc -fopenmp *.o -L/usr/local/cuda/lib64 -lcublasLt -lcublas -lcudart -lopenblas -lstdc++ -lm
 * (an empty sl_build.h on the include path; backend_cuda.c reads SL_HAVE_CUDA from it).
 * Measured on one H200 (2026-11-29): 206.2 ms a step at the defaults, 39.7k tokens/s forward +
 * backward (218.7 ms with SHARDLM_MOE_GEMM=batched).  Per layer the grouped matmuls run at
 * 310-430 TFLOP/s (cuBLASLt per expert; 280-370 batched) against 850 for one dense matmul of
 * the same size, and take ~4.9 of the MoE layer's ~6.8 ms: they are where the time is.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend.h"
#include "model.h"

static double now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static uint64_t rng = 88172645463325252ull;

static double rnorm(void)
{
	double u1, u2;

	rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
	u1 = ((rng >> 11) + 0.5) / 9007199254740992.0;
	rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
	u2 = ((rng >> 11) + 0.5) / 9007199254740992.0;
	return sqrt(-2 * log(u1)) * cos(2 * M_PI * u2);
}

struct src {
	void **w, **g;
};

static const void *w_of(void *c, int u)
{
	return ((struct src *)c)->w[u];
}

static void *g_of(void *c, int u)
{
	return ((struct src *)c)->g[u];
}

static int cmp_d(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

#define TIME(name, reps, stmt)                                                          \
	do {                                                                            \
		double t0;                                                              \
		stmt;                                                                   \
		be->sync(be);                                                           \
		t0 = now_ms();                                                          \
		for (int r_ = 0; r_ < (reps); r_++)                                     \
			stmt;                                                           \
		be->sync(be);                                                           \
		printf("%-28s %9.3f ms\n", name, (now_ms() - t0) / (reps));             \
	} while (0)

/* each MoE op of one layer alone, at T tokens (buffers hold random bf16 bits) */
static int op_times(struct sl_backend *be, int T, int E, int k, int H, int Im)
{
	size_t n = (size_t)T * k;
	void *x = be->alloc(be, (size_t)T * H * 2), *z = be->alloc(be, (size_t)T * E * 2);
	void *wr = be->alloc(be, (size_t)E * H * 2), *p = be->alloc(be, (size_t)T * E * 4);
	int32_t *ti = be->alloc(be, n * 4), *rows = be->alloc(be, n * 4);
	int32_t *slot = be->alloc(be, n * 4), *offs = be->alloc(be, (E + 1) * 4);
	void *tw = be->alloc(be, n * 4), *dtw = be->alloc(be, n * 4);
	void *xp = be->alloc(be, n * H * 2), *gu = be->alloc(be, n * 2 * Im * 2);
	void *act = be->alloc(be, n * Im * 2), *y = be->alloc(be, n * H * 2);
	void *wgu = be->alloc(be, (size_t)E * 2 * Im * H * 2), *wd = be->alloc(be, (size_t)E * H * Im * 2);
	void *dwgu = be->alloc(be, (size_t)E * 2 * Im * H * 2), *dwd = be->alloc(be, (size_t)E * H * Im * 2);
	void *out = be->alloc(be, (size_t)T * H * 2);
	int32_t *lens = be->alloc(be, 4);
	double *st = be->alloc(be, 2 * E * 8);
	int *h = calloc(E + 1, sizeof(int)), L = T;
	float *f = malloc((size_t)T * E * 4);

	for (size_t i = 0; i < (size_t)T * E; i++)
		f[i] = (float)rnorm();
	be->upload(be, p, f, (size_t)T * E * 4);
	be->to_compute(be, z, p, (size_t)T * E);
	be->upload(be, lens, &L, 4);
	TIME("router matmul", 10, be->matmul_fwd(be, z, x, wr, NULL, T, H, E));
	be->to_compute(be, z, p, (size_t)T * E);
	TIME("moe_route_fwd", 10, be->moe_route_fwd(be, p, ti, tw, z, T, E, k, true));
	TIME("moe_permute", 10, be->moe_permute(be, rows, slot, offs, ti, T, E, k));
	be->download(be, h, offs, (E + 1) * 4);
	TIME("moe_aux_stats", 10, be->moe_aux_stats(be, st, p, ti, lens, 1, T, E, k));
	TIME("offsets to host (sync)", 10, be->download(be, h, offs, (E + 1) * 4));
	TIME("gather_rows", 10, be->gather_rows(be, xp, x, rows, (int)n, H));
	TIME("moe_gemm_fwd gate_up", 10, be->moe_gemm_fwd(be, gu, xp, wgu, offs, h, E, H, 2 * Im,
								 (size_t)2 * Im * H));
	TIME("swiglu_fwd", 10, be->swiglu_fwd(be, act, gu, (int)n, Im));
	TIME("moe_gemm_fwd down", 10, be->moe_gemm_fwd(be, y, act, wd, offs, h, E, Im, H,
							     (size_t)H * Im));
	TIME("moe_combine_fwd", 10, be->moe_combine_fwd(be, out, y, tw, slot, T, k, H));
	TIME("moe_combine_bwd", 10, be->moe_combine_bwd(be, xp, dtw, out, y, tw, slot, T, k, H));
	TIME("moe_gemm_bwd down", 5, be->moe_gemm_bwd(be, act, dwd, xp, act, wd, offs, h, E, Im,
							   H, (size_t)H * Im, false));
	TIME("swiglu_bwd", 10, be->swiglu_bwd(be, gu, act, gu, (int)n, Im));
	TIME("moe_gemm_bwd gate_up", 5, be->moe_gemm_bwd(be, xp, dwgu, gu, y, wgu, offs, h, E, H,
							2 * Im, (size_t)2 * Im * H, false));
	TIME("un-permute (combine)", 10, be->moe_combine_fwd(be, out, xp, tw, slot, T, k, H));
	TIME("moe_route_bwd", 10, be->moe_route_bwd(be, z, dtw, p, ti, tw, NULL, lens, 1, T, E, k,
						     true));
	TIME("dense matmul T x 2048 x 12288", 5, be->matmul_fwd(be, y, x, wgu, NULL, T, H, 12 * Im));
	return 0;
}

int main(int argc, char **argv)
{
	int B = argc > 1 ? atoi(argv[1]) : 2, L = argc > 2 ? atoi(argv[2]) : 4096;
	int nl = argc > 3 ? atoi(argv[3]) : 12, E = argc > 4 ? atoi(argv[4]) : 64;
	int k = argc > 5 ? atoi(argv[5]) : 8, T = B * L;
	struct sl_model_config mc = { 0 };
	struct sl_layout lay;
	struct sl_backend *be = sl_backend_cuda_create(0);
	struct src s;
	struct sl_unit_source us = { &s, w_of, g_of, NULL, NULL, NULL };
	int32_t *ids = malloc(T * 4), *lens = malloc(B * 4), *tp = malloc(T * 4), *ti = malloc(T * 4);
	double t[7], loss;

	static float rnd[65521];

	if (!be)
		return 77;
	for (int i = 0; i < 65521; i++)
		rnd[i] = (float)(0.02 * rnorm());
	if (argc > 6)
		return op_times(be, B * L, E, k, 2048, 768);
	strcpy(mc.model_type, "qwen3_moe");
	mc.vocab = 151936;
	mc.hidden = 2048;
	mc.n_layers = nl;
	mc.n_heads = 32;
	mc.n_kv_heads = 4;
	mc.head_dim = 128;
	mc.intermediate = 6144;
	mc.max_position = 40960;
	mc.rms_eps = 1e-6;
	mc.rope_theta = 1e6;
	mc.initializer_range = 0.02;
	mc.pad_token_id = mc.bos_token_id = mc.eos_token_id = -1;
	mc.num_labels = 1;
	mc.layer_kind = calloc(nl, sizeof(*mc.layer_kind));
	mc.mlp_kind = calloc(nl, sizeof(*mc.mlp_kind));
	for (int l = 0; l < nl; l++)
		mc.mlp_kind[l] = SL_MLP_MOE;
	mc.n_experts = E;
	mc.top_k = k;
	mc.moe_intermediate = 768;
	mc.norm_topk_prob = true;
	mc.router_aux_loss_coef = 0.001;
	if (sl_model_layout(&mc, 1, &lay))
		return 1;
	s.w = calloc(lay.n_units, sizeof(void *));
	s.g = calloc(lay.n_units, sizeof(void *));
	for (int u = 0; u < lay.n_units; u++) {
		size_t n = lay.unit_numel[u];
		float *h = malloc(n * 4);
		float *d = be->alloc(be, n * 4);

		for (size_t i = 0; i < n; i++)
			h[i] = rnd[i % 65521];
		for (int i = 0; i < lay.n_tensors; i++)
			if (lay.t[i].unit == u && lay.t[i].ndim == 1)
				for (size_t j = 0; j < lay.t[i].numel; j++)
					h[lay.t[i].offset + j] = 1;
		be->upload(be, d, h, n * 4);
		s.w[u] = be->alloc(be, n * be->elt);
		s.g[u] = be->alloc(be, n * be->elt);
		be->to_compute(be, s.w[u], d, n);
		be->free(be, d);
		free(h);
	}
	for (int i = 0; i < T; i++) {
		ids[i] = (int32_t)(3 + (i * 7919u) % 150000);
		tp[i] = i;
		ti[i] = ids[(i + 1) % T];
	}
	for (int b = 0; b < B; b++)
		lens[b] = L;
	struct sl_model *m = sl_model_create(&mc, &lay, be, T, B, false);
	int32_t *d_ids = be->alloc(be, T * 4), *d_lens = be->alloc(be, B * 4);
	int32_t *d_tp = be->alloc(be, T * 4), *d_ti = be->alloc(be, T * 4);
	int32_t *d_last = be->alloc(be, B * 4);

	if (!m)
		return 1;
	be->upload(be, d_ids, ids, T * 4);
	be->upload(be, d_lens, lens, B * 4);
	be->upload(be, d_tp, tp, (T - 1) * 4);
	be->upload(be, d_ti, ti, (T - 1) * 4);
	struct sl_batch_dev bd = { .B = B, .L = L, .ids = d_ids, .lens = d_lens, .last = d_last,
				   .h_lens = lens, .n_tgt = T - 1, .tgt_pos = d_tp,
				   .tgt_ids = d_ti };

	for (int i = 0; i < 7; i++) {
		double t0 = now_ms();

		if (sl_model_train_step(m, &us, &bd, 1.0f / (T - 1), &loss, NULL))
			return 1;
		be->sync(be);
		t[i] = now_ms() - t0;
		printf("step %d: %.1f ms, loss %.4f\n", i + 1, t[i], loss / (T - 1));
	}
	qsort(t + 2, 5, sizeof(double), cmp_d);
	printf("B %d L %d layers %d E %d k %d: median %.1f ms, %.0f tokens/s (forward + backward)\n",
	       B, L, nl, E, k, t[4], T / (t[4] / 1e3));
	printf("workspace %.2f GB, peak %.2f GB\n", sl_model_workspace_bytes(m) / 1e9,
	       sl_backend_cuda_peak_bytes(be) / 1e9);
	return 0;
}
