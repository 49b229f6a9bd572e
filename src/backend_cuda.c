/*
 * backend_cuda: the cuda backend (bf16 compute, float stats) over the launchers of cuda/.
 *
 * Owns device memory as an arena (backend_arena.c): alloc() carves blocks from chunks it
 * cudaMallocs when nothing free fits (so only setup, while buffers are first made, reaches
 * cudaMalloc), free() returns a block to the arena and merges it with free neighbours; the step
 * loop's alloc/free pairs reuse blocks.  Bytes in use and their peak are tracked for the
 * trainer's peak_gpu_bytes.  Every op runs on the context's one stream, in issue order; download() and sync() wait for it.  The
 * offload transfers (upload_async, download_async) run on two copy streams with events, between
 * device buffers and host_alloc()'s pinned memory.
 */
#include "sl_build.h"

#ifdef SL_HAVE_CUDA

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "backend_arena.h"
#include "sl_cuda.h"

#define ARENA_ALIGN 256			/* cuBLASLt's and vector loads' best alignment */

struct cuda_priv {
	struct sl_cuda *c;
	struct sl_arena arena;		/* backend_arena.h: chunks from cudaMalloc */
	/* backend_cuda_gdn.c: the chunked rule's passes (0: one kernel, 1: the state walked in shared
	 * memory, 2: in registers, 3: in registers, the forward's walk making its output too) */
	int gdn_fwd_split, gdn_bwd_split;
};

static struct cuda_priv *P(struct sl_backend *be)
{
	return be->priv;
}

static struct sl_cuda *C(struct sl_backend *be)
{
	return P(be)->c;
}

/* ---- memory ------------------------------------------------------------------------------ */

static void oom(const char *what, size_t bytes)
{
	fprintf(stderr, "cuda backend: out of memory (%s, %zu bytes)\n", what, bytes);
	abort();
}

static void *chunk_get(void *ctx, size_t bytes)
{
	return sl_cuda_malloc(ctx, bytes);
}

static void chunk_put(void *ctx, void *p)
{
	sl_cuda_free(ctx, p);
}

static void *cuda_alloc(struct sl_backend *be, size_t bytes)
{
	struct cuda_priv *pr = P(be);
	void *p = sl_arena_alloc(&pr->arena, bytes);

	if (!p)
		oom("alloc", bytes);
	sl_cuda_memset0(pr->c, p, (bytes ? bytes + ARENA_ALIGN - 1 : ARENA_ALIGN) / ARENA_ALIGN *
			ARENA_ALIGN);
	return p;
}

static void cuda_free(struct sl_backend *be, void *p)
{
	/* memory may still be read by queued kernels; a later alloc's work is queued after them */
	if (p && sl_arena_free(&P(be)->arena, p)) {
		fprintf(stderr, "cuda backend: free of %p, which is free already or was never "
			"given out\n", p);
		abort();
	}
}

static void cuda_zero(struct sl_backend *be, void *p, size_t bytes)
{
	sl_cuda_memset0(C(be), p, bytes);
}

static void cuda_upload(struct sl_backend *be, void *dst, const void *src, size_t bytes)
{
	sl_cuda_upload(C(be), dst, src, bytes);
}

static void cuda_download(struct sl_backend *be, void *dst, const void *src, size_t bytes)
{
	sl_cuda_download(C(be), dst, src, bytes);
}

static void cuda_sync(struct sl_backend *be)
{
	sl_cuda_sync(C(be));
}

static void cuda_step_range(struct sl_backend *be, int step)
{
	sl_cuda_step_range(C(be), step);
}

static void cuda_to_compute(struct sl_backend *be, void *dst, const float *src, size_t n)
{
	sl_cuda_f32_to_bf16(C(be), dst, src, n);
}

static void cuda_to_f32(struct sl_backend *be, float *dst, const void *src, size_t n)
{
	sl_cuda_bf16_to_f32(C(be), dst, src, n);
}

/* ---- asynchronous host transfers (parallel.offload) --------------------------------------- */

/* pinned, so copies run at full PCIe speed and asynchronously; zeroed on all threads (pinning
 * tens of GB is the slow part; first touch spreads the pages) */
static void *cuda_host_alloc(struct sl_backend *be, size_t bytes)
{
	char *p = sl_cuda_host_alloc(C(be), bytes);
	const size_t chunk = 64u << 20;

	if (!p) {
		fprintf(stderr, "cuda backend: out of pinned host memory (%zu bytes); `shardlm "
			"plan` shows what the job needs\n", bytes);
		abort();
	}
#pragma omp parallel for schedule(static)
	for (size_t o = 0; o < bytes; o += chunk)
		memset(p + o, 0, bytes - o < chunk ? bytes - o : chunk);
	return p;
}

static void cuda_host_free(struct sl_backend *be, void *p)
{
	sl_cuda_host_free(C(be), p);
}

static void *cuda_event_create(struct sl_backend *be)
{
	return sl_cuda_event_create(C(be));
}

static void cuda_event_destroy(struct sl_backend *be, void *ev)
{
	sl_cuda_event_destroy(C(be), ev);
}

static void cuda_upload_async(struct sl_backend *be, void *dst, const void *src, size_t bytes,
			      bool after_compute, void *done)
{
	sl_cuda_copy_async(C(be), dst, src, bytes, 1, after_compute, done);
}

static void cuda_download_async(struct sl_backend *be, void *dst, const void *src, size_t bytes,
				bool after_compute, void *done)
{
	sl_cuda_copy_async(C(be), dst, src, bytes, 0, after_compute, done);
}

static void cuda_wait_event(struct sl_backend *be, void *ev)
{
	sl_cuda_wait_event(C(be), ev);
}

static void cuda_sync_event(struct sl_backend *be, void *ev)
{
	sl_cuda_sync_event(C(be), ev);
}

static void cuda_side_begin(struct sl_backend *be)
{
	sl_cuda_side_begin(C(be));
}

static void cuda_side_end(struct sl_backend *be)
{
	sl_cuda_side_end(C(be));
}

static void cuda_record_event(struct sl_backend *be, void *ev)
{
	sl_cuda_record_event(C(be), ev);
}

/* ---- ops --------------------------------------------------------------------------------- */

static void cuda_embedding_fwd(struct sl_backend *be, void *out, const int32_t *ids,
			       const void *table, int T, int H)
{
	sl_cuda_embedding_fwd(C(be), out, ids, table, T, H);
}

static void cuda_embedding_bwd(struct sl_backend *be, void *dtable, const int32_t *ids,
			       const void *dout, int T, int H)
{
	sl_cuda_embedding_bwd(C(be), dtable, ids, dout, T, H);
}

static void cuda_rmsnorm_fwd(struct sl_backend *be, void *out, void *rstd, const void *x,
			     const void *w, int T, int H, float eps)
{
	sl_cuda_rmsnorm_fwd(C(be), out, rstd, x, w, T, H, eps);
}

static void cuda_rmsnorm_bwd(struct sl_backend *be, void *dx, void *dw, const void *dout,
			     const void *x, const void *w, const void *rstd, int T, int H,
			     bool accumulate)
{
	sl_cuda_rmsnorm_bwd(C(be), dx, dw, dout, x, w, rstd, T, H, accumulate);
}

static void cuda_matmul_fwd(struct sl_backend *be, void *out, const void *x, const void *w,
			    const void *bias, int T, int K, int N)
{
	sl_cuda_matmul_fwd(C(be), out, x, w, bias, T, K, N);
}

static void cuda_matmul_fwd_res(struct sl_backend *be, void *out, const void *x, const void *w,
				const void *res, int T, int K, int N)
{
	sl_cuda_matmul_fwd_res(C(be), out, x, w, res, T, K, N);
}

static void cuda_matmul_bwd(struct sl_backend *be, void *dx, void *dw, void *dbias,
			    const void *dout, const void *x, const void *w, int T, int K, int N,
			    bool accumulate)
{
	sl_cuda_matmul_bwd(C(be), dx, dw, dbias, dout, x, w, T, K, N, accumulate);
}

static void cuda_add(struct sl_backend *be, void *y, const void *x, size_t n)
{
	sl_cuda_add(C(be), y, x, n);
}

static void cuda_add_f32(struct sl_backend *be, float *y, const float *x, size_t n)
{
	sl_cuda_add_f32(C(be), y, x, n);
}

static void cuda_qk_norm_rope_fwd(struct sl_backend *be, void *out, void *rstd, const void *qkv,
				  const void *q_norm_w, const void *k_norm_w, int T, int L,
				  const int32_t *pos, int nh, int nkv, int hd, float eps, float theta)
{
	sl_cuda_qk_norm_rope_fwd(C(be), out, rstd, qkv, q_norm_w, k_norm_w, T, L, pos, nh, nkv, hd,
				 eps, theta);
}

static void cuda_qk_norm_rope_bwd(struct sl_backend *be, void *dqkv, void *dq_norm_w,
				  void *dk_norm_w, const void *dout, const void *qkv,
				  const void *q_norm_w, const void *k_norm_w, const void *rstd,
				  int T, int L, const int32_t *pos, int nh, int nkv, int hd, float eps,
				  float theta)
{
	sl_cuda_qk_norm_rope_bwd(C(be), dqkv, dq_norm_w, dk_norm_w, dout, qkv, q_norm_w, k_norm_w,
				 rstd, T, L, pos, nh, nkv, hd, eps, theta);
}

static void cuda_attention_fwd(struct sl_backend *be, void *out, void *lse, const void *qkv,
			       const int32_t *lens, const int32_t *pos, int B, int L, int nh,
			       int nkv, int hd)
{
	sl_cuda_attention_fwd(C(be), out, lse, qkv, lens, pos, B, L, nh, nkv, hd);
}

static void cuda_attention_bwd(struct sl_backend *be, void *dqkv, const void *dout,
			       const void *out, const void *lse, const void *qkv,
			       const int32_t *lens, const int32_t *pos, int B, int L, int nh,
			       int nkv, int hd)
{
	sl_cuda_attention_bwd(C(be), dqkv, dout, out, lse, qkv, lens, pos, B, L, nh, nkv, hd);
}

static void cuda_swiglu_fwd(struct sl_backend *be, void *h, const void *gu, int T, int I)
{
	sl_cuda_swiglu_fwd(C(be), h, gu, T, I);
}

static void cuda_swiglu_bwd(struct sl_backend *be, void *dgu, const void *dh, const void *gu,
			    int T, int I)
{
	sl_cuda_swiglu_bwd(C(be), dgu, dh, gu, T, I);
}

static void cuda_gather_rows(struct sl_backend *be, void *out, const void *x, const int32_t *idx,
			     int n, int H)
{
	sl_cuda_gather_rows(C(be), out, x, idx, n, H);
}

static void cuda_scatter_add_rows(struct sl_backend *be, void *dx, const void *dout,
				  const int32_t *idx, int n, int H)
{
	sl_cuda_scatter_add_rows(C(be), dx, dout, idx, n, H);
}

static void cuda_copy_cols(struct sl_backend *be, void *dst, int dst_w, int dst_off,
			   const void *src, int src_w, int src_off, int T, int n, bool add)
{
	sl_cuda_copy_cols(C(be), dst, dst_w, dst_off, src, src_w, src_off, T, n, add);
}

static void cuda_cp_attention_fwd(struct sl_backend *be, void *out, void *lse, const void *qkv,
				  const void *kv, const int32_t *gidx, const int32_t *pos,
				  const int32_t *lens, int B, int Lc, int L, int nh, int nkv,
				  int hd, int me, int ncp, int part)
{
	sl_cuda_cp_attention_fwd(C(be), out, lse, qkv, kv, gidx, pos, lens, B, Lc, L, nh, nkv, hd,
				 me, ncp, part);
}

static void cuda_cp_attention_bwd(struct sl_backend *be, void *dqkv, void *dkv, const void *dout,
				  const void *out, const void *lse, const void *qkv,
				  const void *kv, const int32_t *gidx, const int32_t *pos,
				  const int32_t *lens, int B, int Lc, int L, int nh, int nkv,
				  int hd)
{
	sl_cuda_cp_attention_bwd(C(be), dqkv, dkv, dout, out, lse, qkv, kv, gidx, pos, lens, B,
				 Lc, L, nh, nkv, hd);
}

static bool cuda_cp_attention_takes(int hd)
{
	return sl_cuda_cp_attention_supported(hd);
}

static void cuda_bce_fwd_bwd(struct sl_backend *be, double *loss_sum, void *dlogits,
			     const void *logits, const float *labels, int n, float scale)
{
	sl_cuda_bce_fwd_bwd(C(be), loss_sum, dlogits, logits, labels, n, scale);
}

static void cuda_ce_fwd_bwd(struct sl_backend *be, double *loss_sum, float *row_loss,
			    void *dlogits, const void *logits, const int32_t *targets, int n, int V,
			    float scale)
{
	sl_cuda_ce_fwd_bwd(C(be), loss_sum, row_loss, dlogits, logits, targets, n, V, scale);
}

static void cuda_sumsq_f32(struct sl_backend *be, double *out, const float *g, size_t n)
{
	sl_cuda_sumsq_f32(C(be), out, g, n);
}

static void cuda_adamw_f32(struct sl_backend *be, float *p, float *m, float *v, const float *grad,
			   void *w_out, size_t n, const struct sl_adamw_args *a)
{
	sl_cuda_adamw_f32(C(be), p, m, v, grad, w_out, n, a->lr, a->beta1, a->beta2, a->eps,
			  a->weight_decay, a->bc1, a->bc2, a->grad_scale, a->gate);
}

static void cuda_sumsq_c(struct sl_backend *be, double *out, const void *g, size_t n)
{
	sl_cuda_sumsq_bf16(C(be), out, g, n);
}

static void cuda_adamw_c(struct sl_backend *be, float *p, float *m, float *v, const void *grad,
			 void *w_out, size_t n, const struct sl_adamw_args *a)
{
	sl_cuda_adamw_bf16g(C(be), p, m, v, grad, w_out, n, a->lr, a->beta1, a->beta2, a->eps,
			    a->weight_decay, a->bc1, a->bc2, a->grad_scale, a->gate);
}

/* ---- mixture of experts (cuda/moe.cu) ---------------------------------------------------- */

static void cuda_moe_route_fwd(struct sl_backend *be, void *p, int32_t *topi, void *topw,
			       const void *logits, int T, int E, int k, bool norm)
{
	sl_cuda_moe_route_fwd(C(be), p, topi, topw, logits, T, E, k, norm);
}

static void cuda_moe_route_bwd(struct sl_backend *be, void *dlogits, const void *dtopw,
			       const void *p, const int32_t *topi, const void *topw,
			       const void *aux_g, const int32_t *lens, int B, int L, int E, int k,
			       bool norm)
{
	sl_cuda_moe_route_bwd(C(be), dlogits, dtopw, p, topi, topw, aux_g, lens, B, L, E, k, norm);
}

static void cuda_moe_aux_stats(struct sl_backend *be, double *stats, const void *p,
			       const int32_t *topi, const int32_t *lens, int B, int L, int E, int k)
{
	sl_cuda_moe_aux_stats(C(be), stats, p, topi, lens, B, L, E, k);
}

static void cuda_moe_permute(struct sl_backend *be, int32_t *rows, int32_t *slot, int32_t *offs,
			     const int32_t *topi, int T, int E, int k)
{
	sl_cuda_moe_permute(C(be), rows, slot, offs, topi, T, E, k);
}

static void cuda_moe_gemm_fwd(struct sl_backend *be, void *out, const void *x, const void *w,
			      const int32_t *offs, const int *h_offs, int E, int K, int N,
			      size_t ws)
{
	sl_cuda_moe_gemm_fwd(C(be), out, x, w, offs, h_offs, E, K, N, ws);
}

static void cuda_moe_gemm_bwd(struct sl_backend *be, void *dx, void *dw, const void *dout,
			      const void *x, const void *w, const int32_t *offs, const int *h_offs,
			      int E, int K, int N, size_t ws, bool dw_set)
{
	sl_cuda_moe_gemm_bwd(C(be), dx, dw, dout, x, w, offs, h_offs, E, K, N, ws, dw_set);
}

static void cuda_moe_combine_fwd(struct sl_backend *be, void *out, const void *y,
				 const void *topw, const int32_t *slot, int T, int k, int H)
{
	sl_cuda_moe_combine_fwd(C(be), out, y, topw, slot, T, k, H);
}

static void cuda_moe_combine_bwd(struct sl_backend *be, void *dy, void *dtopw, const void *dout,
				 const void *y, const void *topw, const int32_t *slot, int T,
				 int k, int H)
{
	sl_cuda_moe_combine_bwd(C(be), dy, dtopw, dout, y, topw, slot, T, k, H);
}
/* the Qwen3.5 hybrid's ops */
#include "backend_cuda_gdn.c"
#include "backend_cuda_q35moe.c"

static void cuda_destroy(struct sl_backend *be)
{
	struct cuda_priv *pr = P(be);

	sl_cuda_sync(pr->c);
	sl_arena_destroy(&pr->arena);
	sl_cuda_destroy(pr->c);
	free(pr);
	free(be);
}

void sl_backend_cuda_set_deterministic(struct sl_backend *be, bool on)
{
	sl_cuda_set_deterministic(C(be), on);
}

struct sl_backend *sl_backend_cuda_create(int device)
{
	struct sl_backend *be = calloc(1, sizeof(*be));
	struct cuda_priv *pr = calloc(1, sizeof(*pr));

	if (!be || !pr) {
		fprintf(stderr, "cuda backend: out of host memory\n");
		goto out_free;
	}
	pr->c = sl_cuda_create(device);
	if (!pr->c) {
		fprintf(stderr, "cuda backend: cannot use GPU %d\n", device);
		goto out_free;
	}
	sl_arena_init(&pr->arena, chunk_get, chunk_put, pr->c, ARENA_ALIGN, 0, 0);
	be->name = "cuda";
	be->elt = 2;		/* bf16 */
	be->align = ARENA_ALIGN;
	be->stat_elt = 4;	/* float */
	be->priv = pr;
	be->alloc = cuda_alloc;
	be->free = cuda_free;
	be->zero = cuda_zero;
	be->upload = cuda_upload;
	be->download = cuda_download;
	be->sync = cuda_sync;
	be->step_range = cuda_step_range;
	be->to_compute = cuda_to_compute;
	be->to_f32 = cuda_to_f32;
	be->embedding_fwd = cuda_embedding_fwd;
	be->embedding_bwd = cuda_embedding_bwd;
	be->rmsnorm_fwd = cuda_rmsnorm_fwd;
	be->rmsnorm_bwd = cuda_rmsnorm_bwd;
	be->matmul_fwd = cuda_matmul_fwd;
	be->matmul_fwd_res = cuda_matmul_fwd_res;
	be->matmul_bwd = cuda_matmul_bwd;
	be->add = cuda_add;
	be->add_f32 = cuda_add_f32;
	be->qk_norm_rope_fwd = cuda_qk_norm_rope_fwd;
	be->qk_norm_rope_bwd = cuda_qk_norm_rope_bwd;
	be->attention_fwd = cuda_attention_fwd;
	be->attention_bwd = cuda_attention_bwd;
	be->swiglu_fwd = cuda_swiglu_fwd;
	be->swiglu_bwd = cuda_swiglu_bwd;
	be->gather_rows = cuda_gather_rows;
	be->scatter_add_rows = cuda_scatter_add_rows;
	be->copy_cols = cuda_copy_cols;
	be->cp_attention_fwd = cuda_cp_attention_fwd;
	be->cp_attention_bwd = cuda_cp_attention_bwd;
	be->cp_attention_takes = cuda_cp_attention_takes;
	be->bce_fwd_bwd = cuda_bce_fwd_bwd;
	be->ce_fwd_bwd = cuda_ce_fwd_bwd;
	be->sumsq_f32 = cuda_sumsq_f32;
	be->adamw_f32 = cuda_adamw_f32;
	be->sumsq_c = cuda_sumsq_c;
	be->adamw_c = cuda_adamw_c;
	be->event_create = cuda_event_create;
	be->event_destroy = cuda_event_destroy;
	be->upload_async = cuda_upload_async;
	be->download_async = cuda_download_async;
	be->wait_event = cuda_wait_event;
	be->sync_event = cuda_sync_event;
	be->side_begin = cuda_side_begin;
	be->side_end = cuda_side_end;
	be->record_event = cuda_record_event;
	be->host_alloc = cuda_host_alloc;
	be->host_free = cuda_host_free;
	be->moe_route_fwd = cuda_moe_route_fwd;
	be->moe_route_bwd = cuda_moe_route_bwd;
	be->moe_aux_stats = cuda_moe_aux_stats;
	be->moe_permute = cuda_moe_permute;
	be->moe_gemm_fwd = cuda_moe_gemm_fwd;
	be->moe_gemm_bwd = cuda_moe_gemm_bwd;
	/* opt-in (SHARDLM_MOE_DW_SET=1) until its kernels have run on a GPU (test_cuda_ops) */
	be->moe_dw_set = getenv("SHARDLM_MOE_DW_SET") && strcmp(getenv("SHARDLM_MOE_DW_SET"), "0");
	be->moe_combine_fwd = cuda_moe_combine_fwd;
	be->moe_combine_bwd = cuda_moe_combine_bwd;
	if (cuda_gdn_init(be)) {
		cuda_destroy(be);
		return NULL;
	}
	cuda_q35moe_init(be);
	be->destroy = cuda_destroy;
	return be;

out_free:
	free(pr);
	free(be);
	return NULL;
}

size_t sl_backend_cuda_peak_bytes(struct sl_backend *be)
{
	return P(be)->arena.peak + sl_cuda_fixed_bytes(C(be));
}

void sl_backend_cuda_reset_peak(struct sl_backend *be)
{
	P(be)->arena.peak = P(be)->arena.in_use;
}

size_t sl_backend_cuda_reserved_bytes(struct sl_backend *be)
{
	return P(be)->arena.reserved + sl_cuda_fixed_bytes(C(be));
}

void *sl_backend_cuda_stream(struct sl_backend *be)
{
	return sl_cuda_stream(C(be));
}

#endif /* SL_HAVE_CUDA */
