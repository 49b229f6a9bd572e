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
};

struct sl_model {
	struct sl_backend *be;
	int max_tokens, max_records;
	bool ckpt;
	int V, H, nh, nkv, hd, I, Q, nL;	/* Q = (nh + 2 nkv) hd */
	float eps, theta;
	bool bias;

	struct layer_off *lo;		/* (nL) */
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
	double *loss_dev;	/* (1) */
	float *scores_f32;	/* (B) */

	void **bufs;		/* everything above that came from be->alloc, to free */
	int n_bufs, cap_bufs;
	size_t ws_bytes;
};


void *sl_model_ws_alloc(struct sl_model *m, size_t n, size_t elt);

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
