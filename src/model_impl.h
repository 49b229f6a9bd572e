/*
 * model_impl.h: the model's private state, shared by model.c and the files that add layer and MLP
 * kinds (model_*.c).  Nothing outside the model module includes it.
 */
#ifndef SL_MODEL_IMPL_H
#define SL_MODEL_IMPL_H

#include "model.h"

/* tensor offsets are multiples of this many elements (64-byte alignment for fp32) */
#define SL_ALIGN 16
#define NO_OFF SIZE_MAX

struct layout_builder {
	struct sl_layout *lay;
	int cap;
	int unit;
	size_t off;		/* next free element in the current unit */
};

/*
 * Appends one tensor to the current unit.  @fused_next: the tensor continues a fused group
 * (k/v after q, up after gate, ...) and must follow its predecessor with no padding.
 */
int sl_layout_add(struct layout_builder *lb, bool fused_next, const char *name, int ndim,
		  int64_t d0, int64_t d1, enum sl_init init);

/* sl_layout_add for decoder layer @l's tensor "model.layers.<l>.<suffix>" */
int sl_layout_add_layer(struct layout_builder *lb, int l, bool fused_next, const char *suffix,
			int ndim, int64_t d0, int64_t d1, enum sl_init init);
/* in a function with layout_builder *lb, layer l and int rc: add the tensor or return the error */
#define LAYER_ADD(...)                                                                       \
	do {                                                                                 \
		if ((rc = sl_layout_add_layer(lb, l, __VA_ARGS__)))                           \
			return rc;                                                           \
	} while (0)

/* a decoder layer's tensors, as element offsets in its unit; NO_OFF when absent */
struct layer_off {
	size_t ln1;	/* (H) */
	size_t wqkv;	/* ((nh + 2 nkv) hd, H) */
	size_t bqkv;	/* ((nh + 2 nkv) hd) */
	size_t wo;	/* (H, nh hd) */
	size_t bo;	/* (H) */
	size_t qn, kn;	/* (hd) */
	size_t ln2;	/* (H) */
	size_t wgu;	/* (2I, H) */
	size_t wd;	/* (H, I) */
	/* MoE layers instead of wgu, wd (model_moe.c) */
	size_t wr;	/* (E, H) router */
	/* the experts, in their own unit (model_moe.c), from expert 0 in steps of wes */
	int xunit;	/* the unit of the layer's experts */
	size_t wegu;	/* expert e's gate (Im, H) then up (Im, H), at wegu + e wes */
	size_t wed;	/* expert e's down (H, Im), at wed + e wes */
	size_t wes;	/* elements from one expert's weights to the next's */
	/* Qwen3.5-MoE's shared expert, in the layer's unit (model_moe.c); NO_OFF without one */
	size_t wsgu;	/* (2Is, H) shared_expert gate_proj | up_proj */
	size_t wsd;	/* (H, Is) shared_expert.down_proj */
	size_t wsg;	/* (1, H) shared_expert_gate */
};

/* what a layer's backward needs from its forward */
struct acts {
	void *xn1;	/* (T, H) input_layernorm output */
	void *rstd1;	/* (T) stat */
	void *qkv;	/* (T, Q) fused q, k, v projection */
	void *qkvr;	/* (T, Q) q, k normed and rotated; v */
	void *rstd_qk;	/* (T, nh + nkv) stat */
	void *att;	/* (T, nh hd) attention output */
	void *lse;	/* (T, nh) stat */
	void *h;	/* (T, H) residual stream after attention */
	void *xn2;	/* (T, H) post_attention_layernorm output */
	void *rstd2;	/* (T) stat */
	void *gu;	/* (T, 2I) gate | up */
	void *act;	/* (T, I) silu(gate) * up */
	void *block;	/* all of the above, carved from one block of this many bytes */
	size_t bytes;
};

struct sl_model {
	struct sl_backend *be;
	int max_tokens, max_records;
	bool ckpt;
	int V, H, nh, nkv, hd, I, Q, nL;	/* Q = (nh + 2 nkv) hd */
	float eps, theta;
	bool bias;
	bool dense_mlp;			/* some layer has the dense MLP */
	double aux_coef;		/* router_aux_loss_coef */

	struct layer_off *lo;		/* (nL) */
	const struct sl_unit_source *src; /* the forward's or backward's (MoE experts' units) */
	size_t norm_off, score_off;	/* in the head unit */

	void **x;		/* (nL + 1) of (T, H): layer inputs; the last, the final hidden */
	struct acts *acts;	/* (nL), or (1) reused by every layer when checkpointing */
	int n_acts;

	void *gx;		/* (T, H) gradient of the residual stream */
	void *gn;		/* (T, H) gradient of a norm's output */
	void *gb1;		/* (T, max(2I, Q)) */
	void *gb2;		/* (T, max(I, Q, nh hd)) */

	/*
	 * The head.  classify: on each record's last token (Bh = max_records rows).  sft: the causal-LM
	 * head on the tokens whose next token is a target (Bh = max_tokens rows), its cross-entropy
	 * in chunks of `chunk` rows, so the (tokens x V) logits never exist whole.
	 */
	bool sft;
	bool tied;		/* sft: the LM head is unit 0's embedding table */
	size_t lm_off;		/* sft, untied: lm_head.weight in the head unit */
	int chunk;		/* sft: rows of logits per chunk */
	void *lg;		/* (chunk, V) sft: logits, then their gradient */
	float *row_loss;	/* (chunk) sft: per-row cross-entropy */
	void *g_embed;		/* sft, tied: unit 0's gradient buffer, from the head to the embedding */

	void *xl;		/* (Bh, H) the head's input rows */
	void *xnf;		/* (Bh, H) after the final norm */
	void *rstdf;		/* (Bh) stat */
	void *logits;		/* (B) */
	void *dlogits;		/* (B) */
	void *gxnf, *gxl;	/* (Bh, H) */

	/*
	 * The last layer on the head's rows only (model.c: prune_rows, layer_fwd_last): its
	 * keys and values are every token's (the head's rows attend to them all), its output
	 * projection, MLP and residual run on just the rows the head reads, which land in xl.
	 * prune_ok: the last layer is a plain Qwen3 layer with a dense MLP and SHARDLM_PRUNE_LAST
	 * is not 0.  Set by each forward: prune_n rows (0: the whole layer) at prune_idx (the
	 * batch's last or tgt_pos).  prune_attn: the attention too has only the head's rows as
	 * queries (classify, one a record: the backend's context-parallel attention with one
	 * query a record at index prune_q[b] = lens[b] - 1, staged in prune_q_host), where
	 * prune_attn_ok (those ops take head_dim, SHARDLM_PRUNE_LAST is not 1); otherwise the
	 * attention runs on every token and its rows are gathered.
	 */
	bool prune_ok, prune_attn_ok, prune_attn;
	int prune_n;
	const int32_t *prune_idx;
	int32_t *prune_q, *prune_q_host;
	double *loss_dev;	/* (1) */
	float *scores_f32;	/* (B) */

	struct sl_moe *moe;	/* mixture-of-experts state; NULL without MoE layers */
	struct sl_q35 *q35;	/* Qwen3.5 hybrid layers' state (model_qwen35.c), else NULL */
	void *cp_kv[3];		/* context parallel (model_cp.c): 3 x (C max_tokens, 2 nkv hd),
				 * allocated by the first such micro-batch */
	int cp_kv_C;		/* the C they were sized for, 0 before */

	void **bufs;		/* everything above that came from be->alloc, to free */
	int n_bufs, cap_bufs;
	size_t ws_bytes;
};


void *sl_model_ws_alloc(struct sl_model *m, size_t n, size_t elt);

/* model_moe.c: the Qwen3-MoE sparse MLP */
struct sl_batch_dev;
int sl_moe_layout(struct layout_builder *lb, const struct sl_model_config *mc, int l);
/* the experts of MoE layer l in the unit being built (one unit per MoE layer's experts) */
int sl_moe_layout_experts(struct layout_builder *lb, const struct sl_model_config *mc, int l);
int sl_moe_offsets(const struct sl_layout *lay, int l, struct layer_off *lo);
int sl_moe_create(struct sl_model *m, const struct sl_model_config *mc);
void sl_moe_destroy(struct sl_model *m);
/* before the first layer of a forward */
void sl_moe_begin(struct sl_model *m);
/* and which of the micro-batch's tokens are real (with context parallel, of this rank's) */
void sl_moe_set_batch(struct sl_model *m, const struct sl_batch_dev *b);
/*
 * Layer l's MLP on a->xn2: xout = a->h + moe(a->xn2).  @full false (the backward's recompute):
 * everything the backward needs, no xout.
 */
void sl_moe_fwd(struct sl_model *m, int l, const void *w, const struct acts *a, void *xout,
		const struct sl_batch_dev *b, bool full);
/*
 * After the last layer: the aux loss and expert counts to the host.  @aux_weight: the aux loss's
 * weight in the loss whose gradient the backward computes (0: none).  Returns the aux loss.
 */
double sl_moe_end_fwd(struct sl_model *m, const struct sl_batch_dev *b, double aux_weight);
/* Layer l's MLP backward: m->gx (gradient of the layer output) in, m->gn (of a->xn2) out */
void sl_moe_bwd(struct sl_model *m, int l, const void *w, void *g, const struct acts *a,
		const struct sl_batch_dev *b);
/*
 * The same on explicit buffers, for layers whose activations are not a struct acts (the Qwen3.5
 * hybrid): @slot picks the MoE activations (the layer, or 0 when checkpointing),
 * xn2 (T, H) the MLP input, h (T, H) the residual.
 */
void sl_moe_mlp_fwd(struct sl_model *m, int l, const void *w, int slot, const void *xn2,
		    const void *h, void *xout, const struct sl_batch_dev *b, bool full);
void sl_moe_mlp_bwd(struct sl_model *m, int l, const void *w, void *g, int slot,
		    const void *xn2, const struct sl_batch_dev *b);

/* ---- model_qwen35.c: the Qwen3.5 hybrid's layers (gated attention, Gated DeltaNet) ---- */
int sl_q35_layout_layer(struct layout_builder *lb, const struct sl_model_config *mc, int l);
int sl_q35_init(struct sl_model *m, const struct sl_model_config *mc,
		const struct sl_layout *lay);
void sl_q35_free(struct sl_model *m);
/* context parallel: the whole rows' mixer state for C ranks (model_qwen35.c) */
int sl_q35_cp_init(struct sl_model *m);
/* layer l of input x (T, H) into xout (T, H); @keep: keep what the backward needs */
void sl_q35_layer_fwd(struct sl_model *m, int l, const void *w, const void *x, void *xout,
		      const struct sl_batch_dev *b, bool keep);
/* m->gx: gradient of the layer's output in, of its input x out; the unit's grads g += */
void sl_q35_layer_bwd(struct sl_model *m, int l, const void *w, void *g, const void *x,
		      const struct sl_batch_dev *b);
/* the final norm's effective weight 1 + w (H), from the head unit's weights */
const void *sl_q35_final_norm(struct sl_model *m, const void *w);
/* model_cp.c: context parallel attention (struct sl_cp_batch) */
int sl_cp_check(struct sl_model *m, const struct sl_batch_dev *b);
/*
 * The attention of the rank's queries (the q heads of qkvr, the attention layout) against the
 * keys and values of whole rows, all-gathered from qkvr's k|v columns over the context group:
 * out, lse; the backward: dqkvr (the q columns dq, the k|v columns the gradients of the rank's
 * own keys and values, summed over every rank's queries) from dout.  Both families use them.
 */
void sl_cp_attend_fwd(const struct sl_model *m, void *out, void *lse, const void *qkvr,
		      const struct sl_batch_dev *b);
void sl_cp_attend_bwd(const struct sl_model *m, void *dqkvr, const void *dout, const void *out,
		      const void *lse, const void *qkvr, const struct sl_batch_dev *b);
/* q/k norm + rotary and attention of layer l: a->qkv in, a->qkvr, a->att, a->lse out */
void sl_cp_attention_fwd(const struct sl_model *m, int l, const void *w, const struct acts *a,
			 const struct sl_batch_dev *b);
/* their backward: m->gb2 (gradient of a->att) in, m->gb2 (of a->qkv) out; q/k norm grads += */
void sl_cp_attention_bwd(const struct sl_model *m, int l, const void *w, void *g,
			 const struct acts *a, const struct sl_batch_dev *b);

/* element @off of a compute-type buffer */
static inline void *at(const struct sl_model *m, const void *base, size_t off)
{
	return (char *)base + off * m->be->elt;
}

static inline const void *at_opt(const struct sl_model *m, const void *base, size_t off)
{
	return off == NO_OFF ? NULL : at(m, base, off);
}

#endif
