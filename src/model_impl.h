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

	void *xl;		/* (B, H) last-token hidden states */
	void *xnf;		/* (B, H) after the final norm */
	void *rstdf;		/* (B) stat */
	void *logits;		/* (B) */
	void *dlogits;		/* (B) */
	void *gxnf, *gxl;	/* (B, H) */
	double *loss_dev;	/* (1) */
	float *scores_f32;	/* (B) */

	struct sl_q35 *q35;	/* Qwen3.5 hybrid layers' state (model_qwen35.c), else NULL */

	void **bufs;		/* everything above that came from be->alloc, to free */
	int n_bufs, cap_bufs;
	size_t ws_bytes;
};


void *sl_model_ws_alloc(struct sl_model *m, size_t n, size_t elt);

/* builds a struct sl_layout unit by unit (model.c) */
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

/* ---- model_qwen35.c: the Qwen3.5 hybrid's layers (gated attention, Gated DeltaNet) ---- */
int sl_q35_layout_layer(struct layout_builder *lb, const struct sl_model_config *mc, int l);
int sl_q35_init(struct sl_model *m, const struct sl_model_config *mc,
		const struct sl_layout *lay);
void sl_q35_free(struct sl_model *m);
/* layer l of input x (T, H) into xout (T, H); @keep: keep what the backward needs */
void sl_q35_layer_fwd(struct sl_model *m, int l, const void *w, const void *x, void *xout,
		      const struct sl_batch_dev *b, bool keep);
/* m->gx: gradient of the layer's output in, of its input x out; the unit's grads g += */
void sl_q35_layer_bwd(struct sl_model *m, int l, const void *w, void *g, const void *x,
		      const struct sl_batch_dev *b);
/* the final norm's effective weight 1 + w (H), from the head unit's weights */
const void *sl_q35_final_norm(struct sl_model *m, const void *w);

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
