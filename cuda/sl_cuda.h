/*
 * sl_cuda.h: the only header through which C code reaches cuda/ (extern "C" launchers).
 *
 * Compute buffers are bf16 (2 bytes an element), stat buffers (RMSNorm rstd, attention lse) float,
 * ids/lens/indices int32.  Every launcher is asynchronous on the context's stream unless it says
 * otherwise; semantics are those of the matching op in src/backend.h.  Errors print and abort.
 */
#ifndef SL_CUDA_H
#define SL_CUDA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Versions of the CUDA runtime, driver, cuBLAS(Lt) and NCCL, as "cuda 13.0 (driver 13.0) ...". */
void sl_cuda_versions(char *buf, size_t n);
/* Number of visible GPUs (0 when there is no driver or device). */
int sl_cuda_device_count(void);
/* The PCI bus id of @device ("0000:41:00.0"), for the GPU log.  0 or -1. */
int sl_cuda_pci_bus_id(int device, char *buf, int n);
/* Total memory of @device in bytes (0 when unknown). */
size_t sl_cuda_device_memory(int device);
size_t sl_cuda_device_used(void);	/* the current device's used bytes (cudaMemGetInfo) */

/* ---- context: device, stream, cuBLASLt handle, 32 MB workspace, 64 MB reduction scratch
 * (grown once by the chunked delta rule's backward) ---- */
struct sl_cuda;
struct sl_cuda *sl_cuda_create(int device);	/* NULL + message when there is no such device */
void sl_cuda_destroy(struct sl_cuda *c);
void *sl_cuda_stream(struct sl_cuda *c);	/* the cudaStream_t every launcher runs on */
/* train.deterministic: off (the default) lets opt-in kernels that add with atomics run */
void sl_cuda_set_deterministic(struct sl_cuda *c, bool on);
/* the side stream (backend.h side_begin): launches go to it until side_end; it first waits for the
 * compute stream's issued work; record_event records @ev on the stream launches go to */
void sl_cuda_side_begin(struct sl_cuda *c);
void sl_cuda_side_end(struct sl_cuda *c);
void sl_cuda_record_event(struct sl_cuda *c, void *ev);
size_t sl_cuda_fixed_bytes(struct sl_cuda *c);	/* device bytes the context holds itself */
void *sl_cuda_malloc(struct sl_cuda *c, size_t bytes);	/* cudaMalloc; NULL + message */
void sl_cuda_free(struct sl_cuda *c, void *p);
void sl_cuda_memset0(struct sl_cuda *c, void *p, size_t bytes);
/* synchronous copies (host buffers are free to reuse on return) */
void sl_cuda_upload(struct sl_cuda *c, void *dst, const void *src, size_t bytes);
void sl_cuda_download(struct sl_cuda *c, void *dst, const void *src, size_t bytes);
void sl_cuda_sync(struct sl_cuda *c);
/* closes the open NVTX range "step N" (if any) and, for step > 0, opens "step <step>" */
void sl_cuda_step_range(struct sl_cuda *c, int step);

/* ---- asynchronous host transfers (copy.cu; backend.h's upload_async and friends) ---- */
/* page-locked host memory (cudaHostAlloc), not zeroed; NULL + message when it cannot be had */
void *sl_cuda_host_alloc(struct sl_cuda *c, size_t bytes);
void sl_cuda_host_free(struct sl_cuda *c, void *p);
void *sl_cuda_event_create(struct sl_cuda *c);
void sl_cuda_event_destroy(struct sl_cuda *c, void *ev);
/* a copy on the upload (@to_device) or download stream; after the compute stream's issued work
 * when @after_compute; records @done (a cudaEvent_t from sl_cuda_event_create, or NULL) */
void sl_cuda_copy_async(struct sl_cuda *c, void *dst, const void *src, size_t bytes,
			int to_device, int after_compute, void *done);
void sl_cuda_wait_event(struct sl_cuda *c, void *ev);	/* the compute stream waits for @ev */
void sl_cuda_sync_event(struct sl_cuda *c, void *ev);	/* the host waits for @ev */
void sl_cuda_timer_start(struct sl_cuda *c);
double sl_cuda_timer_stop(struct sl_cuda *c);	/* ms since timer_start, waits for the stream */

/* ---- ops (see src/backend.h) ---- */
void sl_cuda_f32_to_bf16(struct sl_cuda *c, void *dst, const float *src, size_t n);
void sl_cuda_bf16_to_f32(struct sl_cuda *c, float *dst, const void *src, size_t n);
void sl_cuda_add(struct sl_cuda *c, void *y, const void *x, size_t n);
void sl_cuda_add_f32(struct sl_cuda *c, float *y, const float *x, size_t n);
void sl_cuda_embedding_fwd(struct sl_cuda *c, void *out, const int *ids, const void *table,
			   int T, int H);
void sl_cuda_embedding_bwd(struct sl_cuda *c, void *dtable, const int *ids, const void *dout,
			   int T, int H);
void sl_cuda_rmsnorm_fwd(struct sl_cuda *c, void *out, float *rstd, const void *x, const void *w,
			 int T, int H, float eps);
void sl_cuda_rmsnorm_bwd(struct sl_cuda *c, void *dx, void *dw, const void *dout, const void *x,
			 const void *w, const float *rstd, int T, int H, int accumulate);
void sl_cuda_matmul_fwd(struct sl_cuda *c, void *out, const void *x, const void *w,
			const void *bias, int T, int K, int N);
void sl_cuda_matmul_fwd_res(struct sl_cuda *c, void *out, const void *x, const void *w,
			    const void *res, int T, int K, int N);
void sl_cuda_matmul_bwd(struct sl_cuda *c, void *dx, void *dw, void *dbias, const void *dout,
			const void *x, const void *w, int T, int K, int N, int accumulate);
void sl_cuda_qk_norm_rope_fwd(struct sl_cuda *c, void *out, float *rstd, const void *qkv,
			      const void *qw, const void *kw, int T, int L, const int32_t *pos,
			      int nh, int nkv, int hd, float eps, float theta);
void sl_cuda_qk_norm_rope_bwd(struct sl_cuda *c, void *dqkv, void *dqw, void *dkw,
			      const void *dout, const void *qkv, const void *qw, const void *kw,
			      const float *rstd, int T, int L, const int32_t *pos, int nh, int nkv,
			      int hd, float eps, float theta);
void sl_cuda_attention_fwd(struct sl_cuda *c, void *out, float *lse, const void *qkv,
			   const int *lens, const int *pos, int B, int L, int nh, int nkv, int hd);
void sl_cuda_attention_bwd(struct sl_cuda *c, void *dqkv, const void *dout, const void *out,
			   const float *lse, const void *qkv, const int *lens, const int *pos, int B,
			   int L, int nh, int nkv, int hd);
/* context parallel (backend.h's cp_attention_fwd / _bwd): head_dim 64, 128 or 256 only */
int sl_cuda_cp_attention_supported(int hd);
void sl_cuda_cp_attention_fwd(struct sl_cuda *c, void *out, float *lse, const void *qkv,
			      const void *kv, const int *gidx, const int *pos, const int *lens,
			      int B, int Lc, int L, int nh, int nkv, int hd, int me, int C,
			      int part);
void sl_cuda_cp_attention_bwd(struct sl_cuda *c, void *dqkv, void *dkv, const void *dout,
			      const void *out, const float *lse, const void *qkv, const void *kv,
			      const int *gidx, const int *pos, const int *lens, int B, int Lc,
			      int L, int nh, int nkv, int hd);
void sl_cuda_copy_cols(struct sl_cuda *c, void *dst, int dst_w, int dst_off, const void *src,
		       int src_w, int src_off, int T, int n, bool add);
void sl_cuda_swiglu_fwd(struct sl_cuda *c, void *h, const void *gu, int T, int I);
void sl_cuda_swiglu_bwd(struct sl_cuda *c, void *dgu, const void *dh, const void *gu, int T,
			int I);
void sl_cuda_gather_rows(struct sl_cuda *c, void *out, const void *x, const int *idx, int n,
			 int H);
void sl_cuda_scatter_add_rows(struct sl_cuda *c, void *dx, const void *dout, const int *idx,
			      int n, int H);
void sl_cuda_bce_fwd_bwd(struct sl_cuda *c, double *loss_sum, void *dlogits, const void *logits,
			 const float *labels, int n, float scale);
void sl_cuda_ce_fwd_bwd(struct sl_cuda *c, double *loss_sum, float *row_loss, void *dlogits,
			const void *logits, const int32_t *targets, int n, int V, float scale);
void sl_cuda_sumsq_f32(struct sl_cuda *c, double *out, const float *g, size_t n);
void sl_cuda_adamw_f32(struct sl_cuda *c, float *p, float *m, float *v, const float *grad,
		       void *w_out, size_t n, float lr, float beta1, float beta2, float eps,
		       float wd, float bc1, float bc2, float grad_scale, const double *gate);
/* the same two with bf16 gradients */
void sl_cuda_sumsq_bf16(struct sl_cuda *c, double *out, const void *g, size_t n);
void sl_cuda_adamw_bf16g(struct sl_cuda *c, float *p, float *m, float *v, const void *grad,
			 void *w_out, size_t n, float lr, float beta1, float beta2, float eps,
			 float wd, float bc1, float bc2, float grad_scale,
			 const double *gate);

/* ---- mixture of experts (moe.cu; routing values float, experts' k at most 32) ---- */
void sl_cuda_moe_route_fwd(struct sl_cuda *c, float *p, int *topi, float *topw,
			   const void *logits, int T, int E, int k, int norm);
void sl_cuda_moe_route_bwd(struct sl_cuda *c, void *dlogits, const float *dtopw, const float *p,
			   const int *topi, const float *topw, const float *aux_g, const int *lens,
			   int B, int L, int E, int k, int norm);
void sl_cuda_moe_aux_stats(struct sl_cuda *c, double *stats, const float *p, const int *topi,
			   const int *lens, int B, int L, int E, int k);
void sl_cuda_moe_permute(struct sl_cuda *c, int *rows, int *slot, int *offs, const int *topi,
			 int T, int E, int k);
void sl_cuda_moe_gemm_fwd(struct sl_cuda *c, void *out, const void *x, const void *w,
			  const int *d_offs, const int *h_offs, int E, int K, int N, size_t ws);
void sl_cuda_moe_gemm_bwd(struct sl_cuda *c, void *dx, void *dw, const void *dout, const void *x,
			  const void *w, const int *d_offs, const int *h_offs, int E, int K, int N,
			  size_t ws, bool dw_set);
void sl_cuda_moe_combine_fwd(struct sl_cuda *c, void *out, const void *y, const float *topw,
			     const int *slot, int T, int k, int H);
void sl_cuda_moe_combine_bwd(struct sl_cuda *c, void *dy, float *dtopw, const void *dout,
			     const void *y, const float *topw, const int *slot, int T, int k,
			     int H);
/* ---- the Qwen3.5 hybrid (gdn.cu): beta, g, rqk, states and the rstds are float (stat) ---- */
void sl_cuda_conv1d_silu_fwd(struct sl_cuda *c, void *out, void *pre, const void *x, int xs,
			     const void *w, int T, int L, int C, int K, const void *halo);
void sl_cuda_conv1d_silu_bwd(struct sl_cuda *c, void *dx, int xs, void *dw, const void *dout,
			     const void *x, const void *pre, const void *w, int T, int L, int C,
			     int K, const void *halo, void *dhalo);
void sl_cuda_gdn_prep_fwd(struct sl_cuda *c, void *qn, void *kn, float *rqk, float *beta,
			  float *g, const void *qkv, const void *ab, int abs, const void *A_log,
			  const void *dt_bias, int T, int nk, int nv, int dk, int dv);
void sl_cuda_gdn_prep_bwd(struct sl_cuda *c, void *dqkv, void *dab, int abs, void *dA_log,
			  void *ddt_bias, const void *dqn, const void *dkn, const void *dbeta,
			  const void *dg, const void *qkv, const void *ab, const float *rqk,
			  const float *beta, const float *g, const void *A_log,
			  const void *dt_bias, int T, int nk, int nv, int dk, int dv);
void sl_cuda_gdn_rule_fwd(struct sl_cuda *c, void *o, float *states, const void *qn,
			  const void *kn, const void *v, int vs, const float *beta, const float *g,
			  const int *lens, int B, int L, int rs, int nk, int nv, int dk, int dv,
			  const float *s0, float *s_end);
void sl_cuda_gdn_rule_bwd(struct sl_cuda *c, void *dqn, void *dkn, void *dval, void *dbeta,
			  void *dg, const void *dout, const float *states, const void *qn,
			  const void *kn, const void *v, int vs, const float *beta, const float *g,
			  const int *lens, int B, int L, int rs, int nk, int nv, int dk, int dv,
			  const float *ds_end, float *ds0);
/* the chunked gated delta rule (gdn_chunk.cu): the same contract as sl_cuda_gdn_rule_fwd/_bwd
 * for whole records (rs = L, no start or end state: the caller keeps the recurrence otherwise);
 * sl_cuda_gdn_chunk_fits says whether it takes the shape (key dim <= 128, shared memory, scratch
 * for one group of the backward, which it grows to that where it can).
 * Where split is set the forward runs in three passes (when the scratch holds every chunk's
 * slot; else in one kernel) and the backward's state pass in two (else one kernel); the passes
 * over the chunks hold the state in shared memory (split 1) or, where the shape allows, in
 * registers (cuda/gdn_walk.cuh; split 2: the forward's output by a pass of its own, 3: by the
 * walk); with either, where dv <= dk and the forward left its tiles in aux, the backward's
 * gradients hold their sums in registers too (cuda/gdn_grad.cuh). */
int sl_cuda_gdn_chunk_fits(struct sl_cuda *c, int dk, int dv, int L, int nk, int nv);
/* aux: room (sl_cuda_gdn_chunk_aux floats; NULL: none) where the forward leaves every chunk's
 * delta and diag(Ga) Q S0 for the backward, with a flag saying so (the caller zeroes its first 4
 * bytes where it runs the recurrence instead) */
size_t sl_cuda_gdn_chunk_aux(size_t chunks, int nv, int dv);	/* chunks: B ceil(L/64) */
void sl_cuda_gdn_chunk_fwd(struct sl_cuda *c, void *o, float *states, float *aux, const void *qn,
			   const void *kn, const void *v, int vs, const float *beta, const float *g,
			   const int *lens, int B, int L, int nk, int nv, int dk, int dv, int split);
void sl_cuda_gdn_chunk_bwd(struct sl_cuda *c, void *dqn, void *dkn, void *dval, void *dbeta,
			   void *dg, const void *dout, const float *states, const float *aux,
			   const void *qn, const void *kn, const void *v, int vs, const float *beta,
			   const float *g, const int *lens, int B, int L, int nk, int nv, int dk,
			   int dv, int split);
/* C = alpha diag(rs) A diag(sk) B + cb C on the chunked rule's tensor-core product (tc_mm.cuh),
 * one block, operands in device memory with any strides (bf16 where abf / bbf, else float),
 * copied into shared memory first when sh is 1 (A) or 2 (A and B) */
void sl_cuda_tc_mm_test(struct sl_cuda *c, int M, int N, int K, const void *A, int ars, int acs,
			int abf, const void *B, int brs, int bcs, int bbf, const float *sk,
			const float *rs, float alpha, float cb, float *C, int crs, int ccs, int sh);
void sl_cuda_gated_rmsnorm_fwd(struct sl_cuda *c, void *out, float *rstd, const void *x,
			       const void *z, int zs, const void *w, int T, int nh, int d,
			       float eps);
void sl_cuda_gated_rmsnorm_bwd(struct sl_cuda *c, void *dx, void *dz, int zs, void *dw,
			       const void *dout, const void *x, const void *z, const void *w,
			       const float *rstd, int T, int nh, int d, float eps);
void sl_cuda_gattn_qk_fwd(struct sl_cuda *c, void *out, void *gate, float *rstd,
			  const void *qgkv, const void *qw, const void *kw, int T, int L,
			  const int *pos, int nh, int nkv, int hd, int rot, float eps,
			  float theta);
void sl_cuda_gattn_qk_bwd(struct sl_cuda *c, void *dqgkv, void *dqw, void *dkw, const void *dout,
			  const void *dgate, const void *qgkv, const void *qw, const void *kw,
			  const float *rstd, int T, int L, const int *pos, int nh, int nkv, int hd,
			  int rot, float eps, float theta);
void sl_cuda_sigmoid_mul_fwd(struct sl_cuda *c, void *y, const void *x, const void *gate,
			     size_t n);
void sl_cuda_sigmoid_mul_bwd(struct sl_cuda *c, void *dx, void *dgate, const void *dy,
			     const void *x, const void *gate, size_t n);
/* the Qwen3.5-MoE shared expert's gate (q35moe.cu) */
void sl_cuda_row_gate_fwd(struct sl_cuda *c, void *out, const void *y, const void *gate, int T,
			  int H);
void sl_cuda_row_gate_bwd(struct sl_cuda *c, void *dy, void *dgate, const void *dout,
			  const void *y, const void *gate, int T, int H);

#ifdef __cplusplus
}
#endif

#endif
