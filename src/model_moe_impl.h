/*
 * model_moe_impl.h: the Qwen3-MoE sparse MLP's private state, shared by model_moe.c and
 * model_moe_ep.c (expert parallelism and token dropping).
 */
#ifndef SL_MODEL_MOE_IMPL_H
#define SL_MODEL_MOE_IMPL_H

#include "model_impl.h"

struct moe_ep;

/* what a MoE layer's backward needs from its forward */
struct moe_acts {
	void *logits;		/* (T, E) router logits */
	void *p;		/* (T, E) stat: router probabilities */
	int32_t *topi;		/* (T, k) chosen experts */
	void *topw;		/* (T, k) stat: their routing weights */
	int32_t *rows;		/* (T k) token of each expert-sorted row */
	int32_t *slot;		/* (T k) sorted row of each choice */
	int32_t *offs;		/* (E + 1) first row of each expert */
	int *h_offs;		/* (E + 1) the same on the host */
	void *gu;		/* (T k, 2 Im) experts' gate | up */
	void *act;		/* (T k, Im) silu(gate) * up */
	void *y;		/* (T k, H) experts' outputs, before the routing weights */
	/* the shared expert (Qwen3.5-MoE), NULL without one */
	void *sgu;		/* (T, 2 Is) its gate | up */
	void *sact;		/* (T, Is) silu(gate) * up */
	void *sy;		/* (T, H) its output, before the sigmoid gate */
	void *sgl;		/* (T) shared_expert_gate logits */
};

struct sl_moe {
	int E, k, Im, n_moe;
	int Is;			/* shared expert's intermediate size; 0: none */
	int n_la;		/* activation slots in la */
	bool norm;
	int *index;		/* (nL) the layer's index among MoE layers, -1 for dense ones */
	struct moe_acts *la;	/* (n_la): beside m->acts, or per Qwen3.5 layer slot */
	void *s_h1, *s_h2;	/* (T k, H) scratch */
	void *s_i;		/* (T k, Im) scratch */
	void *s_gu;		/* (T k, 2 Im) scratch */
	void *dlogits;		/* (T, E) */
	void *dtopw;		/* (T, k) stat */
	void *s_sgu, *s_sact;	/* (T, 2 Is), (T, Is) shared expert scratch */
	void *s_sgl;		/* (T) */
	double *stats;		/* (n_moe, 2E) device: choices and probability sums per expert */
	double *h_stats;	/* (n_moe, 2E) host copy */
	int64_t *counts;	/* (n_moe, E) host: tokens per expert, last micro-batch */
	void *aux_g;		/* (E) stat: gradient of the weighted aux loss per p(t, e) */
	void *ones;		/* (T, k) stat: 1 */
	bool aux_on;		/* aux_g applies in this micro-batch's backward */
	double aux;		/* the last micro-batch's aux loss */
	struct moe_ep *ep;	/* dispatch over an expert group / capacity (model_moe_ep.c) */
	/*
	 * Each row's real tokens here (padding is never routed into the statistics): the batch's
	 * lens, or with context parallelism the real tokens of the row's two chunks on this rank
	 * (a prefix of the local row: padding ends a row)
	 */
	const int32_t *lens;	/* (B) device */
	const int32_t *h_lens;	/* (B) host */
	int32_t *cp_lens;	/* (max_records) device, context parallel */
	int32_t *h_cp_lens;	/* (max_records) host */
};

/* model_moe_ep.c: the experts' part of a layer with a dispatch (sl_model_set_moe_dispatch) */
bool sl_moe_ep_on(const struct sl_moe *mo);
/*
 * From ma->h_offs and ma->rows (routed and permuted): send each kept row to the rank owning its
 * expert, run the local experts there, bring the outputs back: ma->y (T k, H) in sorted order,
 * rows of dropped choices 0.
 */
void sl_moe_ep_fwd(struct sl_model *m, int l, const void *w, struct moe_acts *ma, const void *xn2,
		   const struct sl_batch_dev *b, bool full);
/* dy (n = T k, H) sorted rows in: the experts' weight gradients; dx (n, H) sorted rows out */
void sl_moe_ep_bwd(struct sl_model *m, int l, const void *w, void *g, struct moe_acts *ma,
		   const void *dy, void *dx, int n);
/* before a micro-batch's forward: the dropped count starts at 0 */
void sl_moe_ep_begin(struct sl_moe *mo);
void sl_moe_ep_destroy(struct sl_moe *mo);

#endif
