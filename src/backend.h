/*
 * backend: the table of every numeric op the model needs.
 *
 * A backend owns memory ("device" buffers: host memory for the cpu backend, GPU memory for cuda)
 * and computes on it.  Backends are leaves: they know no model, shard, data or MPI.  The model
 * (model.c) is written once against this table.
 *
 * Element types.  Every floating buffer an op reads or writes is of the backend's compute type
 * (`elt` bytes per element: float for the cpu backend, double for its gradient-check build, bf16
 * for cuda), except
 *   - "stat" buffers (RMSNorm reciprocal std, attention log-sum-exp): `stat_elt` bytes each,
 *   - "f32" buffers (master weights, optimizer moments, fp32 gradients): float,
 *   - ids / lens / index buffers: int32_t.
 * Row-major everywhere.  T = B*L tokens of a micro-batch of B records right-padded to L tokens;
 * lens[b] in [1, L] is record b's true length; token t of the batch is position t % L of record t / L.
 * Ops never read padded positions' inputs for real positions' outputs (causality + masks), so
 * padding changes no result.
 *
 * "+=" marks outputs that accumulate into what the buffer holds; every other output is overwritten.
 */
#ifndef SL_BACKEND_H
#define SL_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct sl_backend;

struct sl_adamw_args {
	float lr;		/* this tensor group's learning rate */
	float beta1, beta2, eps;
	float weight_decay;	/* already 0 for tensors that do not decay */
	float bc1, bc2;		/* bias corrections 1 - beta^step */
	float grad_scale;	/* multiplies the gradient first (clipping) */
	/* NULL, or a double in device memory read when the update runs: not finite, and the
	 * update writes nothing (a unit's own sum of squares, the update issued before the
	 * step's norm is known) */
	const double *gate;
};

struct sl_backend {
	const char *name;
	size_t elt;		/* bytes per compute element */
	size_t stat_elt;	/* bytes per stat element */
	size_t align;		/* alloc's granularity: every block's size rounds up to it */
	void *priv;

	/* memory */
	void *(*alloc)(struct sl_backend *be, size_t bytes);	/* zeroed; aborts on failure */
	void (*free)(struct sl_backend *be, void *p);
	void (*zero)(struct sl_backend *be, void *p, size_t bytes);
	void (*upload)(struct sl_backend *be, void *dst, const void *host_src, size_t bytes);
	void (*download)(struct sl_backend *be, void *host_dst, const void *src, size_t bytes);
	void (*sync)(struct sl_backend *be);
	/* optional (NULL: nothing to do): a profiler's named range "step N" around the work issued
	 * from now on, closing the previous one; step 0 closes it (the cuda backend: an NVTX
	 * push/pop range, for `ncu --nvtx --nvtx-include "step N/"`) */
	void (*step_range)(struct sl_backend *be, int step);
	/* device compute buffer <-> device f32 buffer, n elements */
	void (*to_compute)(struct sl_backend *be, void *dst, const float *src, size_t n);
	void (*to_f32)(struct sl_backend *be, float *dst, const void *src, size_t n);

	/* out(T,H) = table[ids[t]] ; table (V,H) */
	void (*embedding_fwd)(struct sl_backend *be, void *out, const int32_t *ids,
			      const void *table, int T, int H);
	/* dtable(V,H) += scatter of dout(T,H) by ids */
	void (*embedding_bwd)(struct sl_backend *be, void *dtable, const int32_t *ids,
			      const void *dout, int T, int H);

	/* out(T,H) = x * rstd * w ; rstd(T) stat = 1/sqrt(mean(x^2) + eps) */
	void (*rmsnorm_fwd)(struct sl_backend *be, void *out, void *rstd, const void *x,
			    const void *w, int T, int H, float eps);
	/* dx(T,H) (= or += per accumulate), dw(H) += */
	void (*rmsnorm_bwd)(struct sl_backend *be, void *dx, void *dw, const void *dout,
			    const void *x, const void *w, const void *rstd, int T, int H,
			    bool accumulate);

	/* out(T,N) = x(T,K) . w(N,K)^T (+ bias(N) when non-NULL) */
	void (*matmul_fwd)(struct sl_backend *be, void *out, const void *x, const void *w,
			   const void *bias, int T, int K, int N);
	/* out(T,N) = x(T,K) w(N,K)^T + res(T,N), one rounding (a residual connection); out and
	 * res are different buffers */
	void (*matmul_fwd_res)(struct sl_backend *be, void *out, const void *x, const void *w,
			       const void *res, int T, int K, int N);
	/* dx(T,K) (= or += per accumulate; skipped when NULL), dw(N,K) +=, dbias(N) += when non-NULL */
	void (*matmul_bwd)(struct sl_backend *be, void *dx, void *dw, void *dbias,
			   const void *dout, const void *x, const void *w, int T, int K, int N,
			   bool accumulate);

	/* y(n) += x(n) */
	void (*add)(struct sl_backend *be, void *y, const void *x, size_t n);
	/* y(n) += x(n), f32 buffers (gradient shards accumulated over micro-batches) */
	void (*add_f32)(struct sl_backend *be, float *y, const float *x, size_t n);

	/*
	 * Packed rows (data.pack): pos(T) int32 gives each token's position in its document
	 * (documents lie back to back in a row, positions restart at 0 for each); NULL means one
	 * document per row, position t % L.  Rotary embeddings use pos; attention lets token i see
	 * only keys j with i - pos[i] <= j <= i (its own document).
	 *
	 * Per-head RMSNorm of q and k followed by rotary embedding (HF rotate_half convention:
	 * pairs (i, i + hd/2), inv_freq_i = theta^(-2i/hd), position pos[t] or t % L), on the fused projection
	 * qkv(T, (nh + 2*nkv)*hd) laid out per token as [q heads | k heads | v heads].
	 * out gets the normed + rotated q and k and the unchanged v; rstd(T, nh + nkv) stat.
	 */
	void (*qk_norm_rope_fwd)(struct sl_backend *be, void *out, void *rstd, const void *qkv,
				 const void *q_norm_w, const void *k_norm_w, int T, int L,
				 const int32_t *pos, int nh, int nkv, int hd, float eps, float theta);
	/* dqkv(T,(nh+2nkv)hd) = from dout (same layout); dq_norm_w(hd) +=, dk_norm_w(hd) += */
	void (*qk_norm_rope_bwd)(struct sl_backend *be, void *dqkv, void *dq_norm_w,
				 void *dk_norm_w, const void *dout, const void *qkv,
				 const void *q_norm_w, const void *k_norm_w, const void *rstd,
				 int T, int L, const int32_t *pos, int nh, int nkv, int hd, float eps,
				 float theta);

	/*
	 * Causal grouped-query attention per record, scale 1/sqrt(hd), on qkv(T,(nh+2nkv)hd) as
	 * laid out above (query head h uses kv head h / (nh/nkv)); keys at positions >= lens[b]
	 * are masked, and, with pos, keys of earlier documents; out(T, nh*hd), rows of padded
	 * positions written as zeros.
	 * lse(T, nh) stat: log-sum-exp of each query's scores (for the backward).
	 */
	void (*attention_fwd)(struct sl_backend *be, void *out, void *lse, const void *qkv,
			      const int32_t *lens, const int32_t *pos, int B, int L, int nh,
			      int nkv, int hd);
	/* dqkv(T,(nh+2nkv)hd) = gradients of q, k, v (overwritten) */
	void (*attention_bwd)(struct sl_backend *be, void *dqkv, const void *dout,
			      const void *out, const void *lse, const void *qkv,
			      const int32_t *lens, const int32_t *pos, int B, int L, int nh,
			      int nkv, int hd);

	/* gu(T, 2I) = [gate | up] per token; h(T, I) = silu(gate) * up */
	void (*swiglu_fwd)(struct sl_backend *be, void *h, const void *gu, int T, int I);
	/* dgu(T, 2I) = from dh(T, I) */
	void (*swiglu_bwd)(struct sl_backend *be, void *dgu, const void *dh, const void *gu,
			   int T, int I);

	/* out(n, H) = x(idx[i], :) */
	void (*gather_rows)(struct sl_backend *be, void *out, const void *x, const int32_t *idx,
			    int n, int H);
	/* dx(idx[i], :) += dout(i, :); the idx[i] distinct (a row of dx is added to at most once:
	 * the callers' target and last-token rows), so the rows may be added in parallel */
	void (*scatter_add_rows)(struct sl_backend *be, void *dx, const void *dout,
				 const int32_t *idx, int n, int H);

	/*
	 * BCE with logits against soft labels, n records: loss_sum(1) double = sum_i bce(logit_i, y_i)
	 * (computed stably); dlogits(n) = scale * (sigmoid(logit_i) - y_i).  labels f32.
	 */
	void (*bce_fwd_bwd)(struct sl_backend *be, double *loss_sum, void *dlogits,
			    const void *logits, const float *labels, int n, float scale);

	/* f32 helpers for the optimizer (device buffers) */
	/* out(1) double (device) = sum of g(n)^2, accumulated in double */
	void (*sumsq_f32)(struct sl_backend *be, double *out, const float *g, size_t n);
	/*
	 * In place over n elements, as torch.optim.AdamW (decoupled decay):
	 *   g = grad_scale*grad; p -= lr*wd*p; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
	 *   p -= lr * (m/bc1) / (sqrt(v/bc2) + eps)
	 * and, when w_out is non-NULL, w_out(n) compute = p.
	 */
	void (*adamw_f32)(struct sl_backend *be, float *p, float *m, float *v, const float *grad,
			  void *w_out, size_t n, const struct sl_adamw_args *a);
	/*
	 * The same two with the gradient in the compute type, each element rounded to f32 first
	 * (as to_f32 would: the results equal the f32 ops' on the converted gradient).  Optional.
	 */
	void (*sumsq_c)(struct sl_backend *be, double *out, const void *g, size_t n);
	void (*adamw_c)(struct sl_backend *be, float *p, float *m, float *v, const void *grad,
			void *w_out, size_t n, const struct sl_adamw_args *a);

	/* ---- sft: the causal-LM head ---- */
	/*
	 * Cross-entropy of n rows of logits(n, V) against targets(n): row_loss(n) f32 =
	 * logsumexp(row) - row[target], with the softmax computed in f32 or wider;
	 * loss_sum(1) double += their sum, added in a fixed order (no atomics);
	 * dlogits(n, V) = scale * (softmax(row) - onehot(target)).  dlogits may be logits (in place).
	 */
	void (*ce_fwd_bwd)(struct sl_backend *be, double *loss_sum, float *row_loss, void *dlogits,
			   const void *logits, const int32_t *targets, int n, int V, float scale);

	/*
	 * Asynchronous host transfers (issue 6, parallel.offload); all optional (NULL: shard copies
	 * synchronously).  Copies run on copy streams beside the compute stream that runs the ops
	 * above, between device buffers and host_alloc() memory; copies of one direction run in
	 * the order they were issued.  An event stands for its latest record: waiting on it waits
	 * for the copy that recorded it last before the wait was issued (an event never recorded
	 * is complete).  The copies and sync_event may be called from another thread than the one
	 * issuing the ops (shard's offload worker): the backend serializes them.
	 */
	void *(*event_create)(struct sl_backend *be);
	void (*event_destroy)(struct sl_backend *be, void *ev);
	/*
	 * dst (device) = host_src, bytes; when @after_compute, only after every op issued so far on
	 * the compute stream (the destination may still be read by them).  Records @done (or NULL).
	 */
	void (*upload_async)(struct sl_backend *be, void *dst, const void *host_src, size_t bytes,
			     bool after_compute, void *done);
	/* host_dst = src (device), when @after_compute only after every op issued so far on the
	 * compute stream (what wrote src); @done.  A copy without it still runs after the
	 * downloads issued before it: a 0-byte one with it orders later ones after that point. */
	void (*download_async)(struct sl_backend *be, void *host_dst, const void *src,
			       size_t bytes, bool after_compute, void *done);
	/* ops issued after this on the compute stream wait for @ev (the host does not wait) */
	void (*wait_event)(struct sl_backend *be, void *ev);
	/* the host waits for @ev */
	void (*sync_event)(struct sl_backend *be, void *ev);
	/*
	 * Optional (NULL: none; needs the events above): a side stream, of lower priority than the
	 * compute stream, for work that may run under what is issued after it (shard's AdamW under
	 * the next forward).  side_begin: the ops issued until side_end run on the side stream,
	 * after everything issued so far on the compute stream; only adamw_f32, adamw_c,
	 * sumsq_f32, sumsq_c and record_event may be issued in between.  The compute stream does not wait for the side
	 * stream (sync() neither) unless told to through an event.  record_event: @ev records the
	 * point the stream ops are being issued to (side or compute) has reached.
	 */
	void (*side_begin)(struct sl_backend *be);
	void (*side_end)(struct sl_backend *be);
	void (*record_event)(struct sl_backend *be, void *ev);

	/*
	 * ---- Mixture of experts (Qwen3-MoE, model_moe.c) ----
	 * T tokens each choose k of E experts.  "Choice" t*k + j is token t's j-th expert.  Routing
	 * values (probabilities, weights and their gradients) are stat buffers.
	 *
	 * Router: p(T,E) = softmax(logits(T,E)) computed in fp32 or wider; per token the k largest
	 * p in descending order (ties: the lower expert first), topi(T,k) int32 their experts,
	 * topw(T,k) their p, divided by their sum when @norm.
	 */
	void (*moe_route_fwd)(struct sl_backend *be, void *p, int32_t *topi, void *topw,
			      const void *logits, int T, int E, int k, bool norm);
	/*
	 * dlogits(T,E) compute = the gradient through the renormalization (when @norm) and the
	 * softmax of dtopw(T,k) plus, for real tokens (position t % L < lens[t / L]; T = B*L), of
	 * aux_g(E) (stat; NULL: none) added to the gradient of every p(t,e).
	 */
	void (*moe_route_bwd)(struct sl_backend *be, void *dlogits, const void *dtopw,
			      const void *p, const int32_t *topi, const void *topw, const void *aux_g,
			      const int32_t *lens, int B, int L, int E, int k, bool norm);
	/*
	 * Load-balancing statistics over real tokens: stats(2E) double += [number of choices of
	 * each expert | sum over tokens of p(t,e)].
	 */
	void (*moe_aux_stats)(struct sl_backend *be, double *stats, const void *p,
			      const int32_t *topi, const int32_t *lens, int B, int L, int E, int k);
	/*
	 * Stable counting sort of the T*k choices by expert: offs(E+1) int32 = where each expert's
	 * rows start (offs[E] = T*k); rows(T*k) int32 = the token of each sorted row (within an
	 * expert in token order); slot(T*k) int32 = the sorted row of each choice.
	 */
	void (*moe_permute)(struct sl_backend *be, int32_t *rows, int32_t *slot, int32_t *offs,
			    const int32_t *topi, int T, int E, int k);
	/*
	 * Grouped matmul over experts: for each e, the rows offs[e] .. offs[e+1] of
	 * out(M,N) = x(M,K) . w_e(N,K)^T, w_e = w + e * ws elements (ws >= N K, a multiple of 8:
	 * an expert's weights sit between its other tensors).  The row offsets (E+1) are given
	 * twice, on the device (@offs, moe_permute's) and on the host (@h_offs).
	 */
	void (*moe_gemm_fwd)(struct sl_backend *be, void *out, const void *x, const void *w,
			     const int32_t *offs, const int *h_offs, int E, int K, int N,
			     size_t ws);
	/* its backward: dx(M,K) = dout . w_e (overwritten; skipped when NULL), dw_e += (same
	 * stride ws); @dw_set: dw_e = instead, every expert's (N,K) block written (zeros for an
	 * expert without rows), so dw needs no zeroing first */
	void (*moe_gemm_bwd)(struct sl_backend *be, void *dx, void *dw, const void *dout,
			     const void *x, const void *w, const int32_t *offs, const int *h_offs,
			     int E, int K, int N, size_t ws, bool dw_set);
	/* a model may take dw_set (and not zero the experts' gradients first) */
	bool moe_dw_set;
	/* out(T,H) = sum_j topw(t,j) * y(slot(t*k+j), :) */
	void (*moe_combine_fwd)(struct sl_backend *be, void *out, const void *y, const void *topw,
				const int32_t *slot, int T, int k, int H);
	/* dy(T*k,H): row slot(t*k+j) = topw(t,j) dout(t,:);  dtopw(T,k) = dout(t,:) . that row of y */
	void (*moe_combine_bwd)(struct sl_backend *be, void *dy, void *dtopw, const void *dout,
				const void *y, const void *topw, const int32_t *slot, int T, int k,
				int H);

	/*
	 * ---- Qwen3.5 hybrid (issue 12): Gated DeltaNet and gated full attention ----
	 * Every op below works per record: position p = t % L of record t / L (the delta rule: see
	 * rs); nothing crosses records but the convolution's halo and the rule's s0 / s_end.  Rows
	 * of x with a stride take the stride in elements (xs, zs, abs, vs).
	 */

	/*
	 * Causal depthwise convolution over each record's positions, then SiLU, on the first C
	 * columns of x (T rows of stride xs): pre(t,c) = sum_{j<K} x(t-K+1+j, c) w(c, j), where a
	 * position before the record's start reads the record's halo: NULL, zeros; else halo
	 * (T/L records of K-1 rows of stride xs), row i holding position i-K+1 (context parallel:
	 * the previous chunk's last inputs).  out(T,C) = silu(pre); pre(T,C) is kept for the
	 * backward.
	 */
	void (*conv1d_silu_fwd)(struct sl_backend *be, void *out, void *pre, const void *x, int xs,
				const void *w, int T, int L, int C, int K, const void *halo);
	/*
	 * dx (T rows of stride xs, its first C columns overwritten), dw(C,K) += (over the halo's
	 * terms too); from dout(T,C); dhalo (as halo; NULL: not wanted): its first C columns
	 * overwritten with the gradient of the halo.
	 */
	void (*conv1d_silu_bwd)(struct sl_backend *be, void *dx, int xs, void *dw, const void *dout,
				const void *x, const void *pre, const void *w, int T, int L, int C,
				int K, const void *halo, void *dhalo);

	/*
	 * Gated DeltaNet inputs, per token, from qkv(T, 2 nk dk + nv dv) = [q heads | k heads | v]
	 * and ab (T rows of stride abs: b(nv) then a(nv)):
	 *   qn(T, nk dk) = l2norm(q) / sqrt(dk), kn(T, nk dk) = l2norm(k), l2norm(x) =
	 *   x / sqrt(sum x^2 + 1e-6), rqk(T, 2 nk) stat = those reciprocal norms (q heads, k heads);
	 *   beta(T, nv) stat = sigmoid(b); g(T, nv) stat = -exp(A_log) softplus(a + dt_bias) (the
	 *   log decay: stat precision, as its sums over positions set the state's decay).
	 */
	void (*gdn_prep_fwd)(struct sl_backend *be, void *qn, void *kn, void *rqk, void *beta,
			     void *g, const void *qkv, const void *ab, int abs, const void *A_log,
			     const void *dt_bias, int T, int nk, int nv, int dk, int dv);
	/*
	 * dqkv: its q and k columns (the first 2 nk dk) overwritten; dab: b and a overwritten;
	 * dA_log(nv) +=, ddt_bias(nv) += ; from dqn, dkn (T, nk dk), dbeta, dg (T, nv; compute
	 * type) and beta, g (stat).
	 */
	void (*gdn_prep_bwd)(struct sl_backend *be, void *dqkv, void *dab, int abs, void *dA_log,
			     void *ddt_bias, const void *dqn, const void *dkn, const void *dbeta,
			     const void *dg, const void *qkv, const void *ab, const void *rqk,
			     const void *beta, const void *g, const void *A_log,
			     const void *dt_bias, int T, int nk, int nv, int dk, int dv);
	/*
	 * Floats past the B ceil(L/64) nv dk dv of states (rs = L) that gdn_rule_fwd may fill
	 * for gdn_rule_bwd (NULL: none), for chunks = B ceil(L/64) or more: a caller with rs = L
	 * gives states that much more room and hands the backward what the forward left there.
	 * A caller may clear it before it sizes any states (the backend then leaves and reads
	 * nothing there: the trainer does so where the memory plan has no room).
	 */
	size_t (*gdn_states_extra)(struct sl_backend *be, size_t chunks, int nv, int dk, int dv);
	/*
	 * The gated delta rule per record and value head h (key head h / (nv / nk)), state
	 * S(dk, dv) = s0 (NULL: 0) at each record's start, for positions p < lens[b]:
	 *   S = exp(g) S;  S += k (beta (v - S^T k))^T;  o = S^T q
	 * with q = qn, k = kn, v at v (rows of stride vs, head h at h dv).  Position p of record b
	 * is row b rs + p of every per-token array (rs >= L: the record stride; L for contiguous
	 * records, more for one chunk of each of B context-parallel rows).  o(rows, nv dv): rows of
	 * padded positions (lens[b] <= p < L) zero; rows past L untouched.  beta, g stat (as
	 * gdn_prep_fwd writes them).  states(B, ceil(L/64), nv, dk, dv) stat: S at the start of
	 * every 64-position chunk, for the backward.  s0, s_end (B, nv, dk, dv) stat: the state
	 * before position 0 (NULL: zero) and after the last position p < lens[b] (NULL: not
	 * written), so a row cut into chunks can pass its state on (context parallel).
	 */
	void (*gdn_rule_fwd)(struct sl_backend *be, void *o, void *states, const void *qn,
			     const void *kn, const void *v, int vs, const void *beta,
			     const void *g, const int32_t *lens, int B, int L, int rs, int nk,
			     int nv, int dk, int dv, const void *s0, void *s_end);
	/*
	 * dqn, dkn (rows, nk dk), dval (stride vs, nv dv columns), dbeta, dg (rows, nv; compute
	 * type): overwritten on the rows of positions p < L.  ds_end (B, nv, dk, dv) stat: the
	 * gradient of the forward's s_end (NULL: zero); ds0 (same shape; NULL: not wanted): out,
	 * the gradient of s0.  The forward's s0 is read back from states.
	 */
	void (*gdn_rule_bwd)(struct sl_backend *be, void *dqn, void *dkn, void *dval, void *dbeta,
			     void *dg, const void *dout, const void *states, const void *qn,
			     const void *kn, const void *v, int vs, const void *beta,
			     const void *g, const int32_t *lens, int B, int L, int rs, int nk,
			     int nv, int dk, int dv, const void *ds_end, void *ds0);

	/*
	 * Gated RMSNorm over each head's d values: x(T, nh d), z (T rows of stride zs, head h at
	 * h d): out = w * x * r * silu(z), r = 1/sqrt(mean(x^2) + eps); rstd(T, nh) stat.
	 */
	void (*gated_rmsnorm_fwd)(struct sl_backend *be, void *out, void *rstd, const void *x,
				  const void *z, int zs, const void *w, int T, int nh, int d,
				  float eps);
	/* dx(T, nh d) =, dz (stride zs) =, dw(d) += */
	void (*gated_rmsnorm_bwd)(struct sl_backend *be, void *dx, void *dz, int zs, void *dw,
				  const void *dout, const void *x, const void *z, const void *w,
				  const void *rstd, int T, int nh, int d, float eps);

	/*
	 * The gated attention's q/k: qgkv(T, (2 nh + 2 nkv) hd) per token [q0 g0 q1 g1 ... |
	 * k heads | v heads] (Hugging Face's q_proj rows: per head hd query then hd gate values).
	 * out(T, (nh + 2 nkv) hd): RMSNorm of each q and k head with weights qw / kw (hd), then the
	 * rotary embedding on its first rot dims (rotate_half over rot: pairs (i, i + rot/2),
	 * inv_freq_i = theta^(-2i/rot), position pos[t] (NULL: t % L; pos[t] < L), the other
	 * hd - rot dims unrotated; v copied: the attention_fwd layout.  gate(T, nh hd) = the gate
	 * halves; rstd(T, nh + nkv).
	 */
	void (*gattn_qk_fwd)(struct sl_backend *be, void *out, void *gate, void *rstd,
			     const void *qgkv, const void *qw, const void *kw, int T, int L,
			     const int32_t *pos, int nh, int nkv, int hd, int rot, float eps,
			     float theta);
	/* dqgkv =, dqw(hd) +=, dkw(hd) += ; from dout (attention layout) and dgate(T, nh hd) */
	void (*gattn_qk_bwd)(struct sl_backend *be, void *dqgkv, void *dqw, void *dkw,
			     const void *dout, const void *dgate, const void *qgkv, const void *qw,
			     const void *kw, const void *rstd, int T, int L, const int32_t *pos,
			     int nh, int nkv, int hd, int rot, float eps, float theta);
	/* y(n) = x(n) * sigmoid(gate(n)) */
	void (*sigmoid_mul_fwd)(struct sl_backend *be, void *y, const void *x, const void *gate,
				size_t n);
	/* dx(n) =, dgate(n) = */
	void (*sigmoid_mul_bwd)(struct sl_backend *be, void *dx, void *dgate, const void *dy,
				const void *x, const void *gate, size_t n);
	/* ---- end of Qwen3.5 hybrid ---- */

	/*
	 * ---- Context parallel (parallel.context, model_cp.c); NULL: not supported ----
	 * A rank holds Tl = B*Lc tokens of B rows (Lc per row, not contiguous in the row); the keys
	 * and values of the whole rows come as kv(B*L, 2*nkv*hd) = [k heads | v heads] per token.
	 * gidx(Tl) int32: each local token's index in its row (0..L-1); pos(Tl) int32: its
	 * position in its document (gidx itself for one document per row).  Local query t of row
	 * b = t / Lc sees keys j with gidx[t] - pos[t] <= j <= gidx[t], j < lens[b]; queries at
	 * gidx >= lens[b] are padding (zero output).
	 *
	 * dst(T, dst_w) columns [dst_off, dst_off + n) = (or += with @add) src(T, src_w) columns
	 * [src_off, src_off + n).
	 */
	void (*copy_cols)(struct sl_backend *be, void *dst, int dst_w, int dst_off, const void *src,
			  int src_w, int src_off, int T, int n, bool add);
	/*
	 * out(Tl, nh*hd), lse(Tl, nh) stat, from the q heads of qkv(Tl, (nh+2nkv)hd) and kv.
	 * @part splits the keys by the rank of C holding their chunk (chunk c of L/(2C) tokens
	 * is rank c's for c < C, else rank 2C-1-c's), so attention can start on a rank's own keys
	 * while the others' arrive: 0 every key; 1 only rank @me's keys (only they need be in
	 * kv); 2 only the other ranks' keys, merged into out and lse (which hold part 1's).
	 */
	void (*cp_attention_fwd)(struct sl_backend *be, void *out, void *lse, const void *qkv,
				 const void *kv, const int32_t *gidx, const int32_t *pos,
				 const int32_t *lens, int B, int Lc, int L, int nh, int nkv, int hd,
				 int me, int C, int part);
	/*
	 * dqkv(Tl, (nh+2nkv)hd): the q columns get dq, the k and v columns zeros (overwritten);
	 * dkv(B*L, 2*nkv*hd) = this rank's queries' share of the gradients of kv (overwritten).
	 */
	void (*cp_attention_bwd)(struct sl_backend *be, void *dqkv, void *dkv, const void *dout,
				 const void *out, const void *lse, const void *qkv, const void *kv,
				 const int32_t *gidx, const int32_t *pos, const int32_t *lens, int B,
				 int Lc, int L, int nh, int nkv, int hd);
	/* whether cp_attention_fwd / _bwd take head_dim @hd (NULL: every head_dim) */
	bool (*cp_attention_takes)(int hd);

	/*
	 * ---- Qwen3.5-MoE shared expert (model_moe.c); NULL: not supported ----
	 * out(T,H) += sigmoid(gate(t)) * y(T,H): each token's shared-expert output scaled by its
	 * scalar gate, the (T, 1) output of shared_expert_gate (compute type).
	 */
	void (*row_gate_fwd)(struct sl_backend *be, void *out, const void *y, const void *gate,
			     int T, int H);
	/* dy(T,H) = sigmoid(gate) dout; dgate(T) = s (1 - s) sum_h dout y (both overwritten) */
	void (*row_gate_bwd)(struct sl_backend *be, void *dy, void *dgate, const void *dout,
			     const void *y, const void *gate, int T, int H);
	/* ---- end of Qwen3.5-MoE ---- */

	/*
	 * Optional (NULL: malloc/free): host memory the backend copies to and from fastest (pinned
	 * memory on cuda), for the host-resident state of parallel.offload.  Zeroed; aborts on
	 * failure, as alloc().
	 */
	void *(*host_alloc)(struct sl_backend *be, size_t bytes);
	void (*host_free)(struct sl_backend *be, void *p);

	void (*destroy)(struct sl_backend *be);
};

/* cpu backend: fp32, OpenBLAS + OpenMP.  Returns NULL on failure. */
struct sl_backend *sl_backend_cpu_create(void);
/* The same backend built with double compute elements (gradient-check tests only). */
struct sl_backend *sl_backend_cpu64_create(void);

/*
 * cuda backend (built with CUDA only): bf16 compute elements, float stats, on GPU @device (an
 * index among the visible ones).  Returns NULL, with a message, when the device cannot be used.
 * Device memory comes from an arena: cudaMalloc happens only when alloc() finds no free block,
 * so the step loop's buffers, allocated at setup, cost none.
 */
struct sl_backend *sl_backend_cuda_create(int device);
/* train.deterministic on a cuda backend: the opt-in kernels that add with atomics stay off */
void sl_backend_cuda_set_deterministic(struct sl_backend *be, bool on);
/* Peak bytes of device memory handed out by alloc() (plus the backend's fixed workspaces). */
size_t sl_backend_cuda_peak_bytes(struct sl_backend *be);
/* Restart the peak from what is in use now (e.g. at the start of every step). */
void sl_backend_cuda_reset_peak(struct sl_backend *be);
/* Bytes taken from the driver (arena chunks + workspaces), >= the peak. */
size_t sl_backend_cuda_reserved_bytes(struct sl_backend *be);
/* The cudaStream_t (as void *) every op runs on, for events and a communication stream. */
void *sl_backend_cuda_stream(struct sl_backend *be);

#endif
