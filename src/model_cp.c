/*
 * model_cp: context-parallel attention (parallel.context; struct sl_cp_batch in model.h).
 *
 * Every op of a layer but attention is per token, so a rank runs them on its own tokens only.
 * Attention needs the keys and values of whole rows: each layer's local k|v columns are
 * all-gathered over the context group (through struct sl_context_comm, the model knowing no
 * ranks), put back in row order (perm), and the rank's queries attend to them with their global
 * positions (rotary by position in the document, causal and document masks by index in the
 * row).  In the backward the same gather is done again (nothing of it is kept per layer), the
 * rank's share of the k|v gradients of whole rows is put in gathered order (inv) and
 * reduce-scattered, so each rank gets the sum over all queries of the gradients of its own keys
 * and values.
 */
#include <errno.h>
#include <stdio.h>

#include "model_impl.h"

int sl_cp_check(struct sl_model *m, const struct sl_batch_dev *b)
{
	struct sl_backend *be = m->be;
	const struct sl_cp_batch *cp = b->cp;
	const int C = cp->comm ? cp->comm->size : 0;

	if (!be->cp_attention_fwd || !be->cp_attention_bwd || !be->copy_cols) {
		fprintf(stderr, "model: the %s backend has no context-parallel attention\n",
			be->name);
		return -ENOTSUP;
	}
	if (be->cp_attention_takes && !be->cp_attention_takes(m->hd)) {
		fprintf(stderr, "model: the %s backend's context-parallel attention does not take "
			"head_dim %d (set parallel.context: 1)\n", be->name, m->hd);
		return -ENOTSUP;
	}
	if (!cp->comm->kv_all_gather_start || !cp->comm->kv_all_gather_wait) {
		fprintf(stderr, "model: the context group has no split key/value all-gather\n");
		return -EINVAL;
	}
	if (m->moe && !cp->comm->sum_f64) {
		fprintf(stderr, "model: context parallel with mixture-of-experts layers needs the "
			"context group's sum of the routing statistics\n");
		return -EINVAL;
	}
	/* the workspace holds this rank's tokens, the k|v buffers whole rows: C times more */
	if (C < 1 || cp->L % (2 * C) || b->L * C != cp->L ||
	    (m->cp_kv_C && m->cp_kv_C != C)) {
		fprintf(stderr, "model: context-parallel micro-batch of %d rows of %d tokens (%d "
			"here) does not fit %d ranks\n", b->B, cp->L, b->L, C);
		return -EINVAL;
	}
	m->cp_kv_C = C;
	/* the Qwen3.5 family runs its mixers on whole rows (model_qwen35.c) */
	if (m->q35 && sl_q35_cp_init(m))
		return -ENOMEM;
	for (int i = 0; i < 3; i++)
		if (!m->cp_kv[i] &&
		    !(m->cp_kv[i] = sl_model_ws_alloc(m, (size_t)C * m->max_tokens * 2 * m->nkv *
						      m->hd, be->elt)))
			return -ENOMEM;
	return 0;
}

/* m->cp_kv[1] = the k|v of whole rows, in row order, from qkvr's local columns */
static void gather_kv(const struct sl_model *m, const void *qkvr, const struct sl_batch_dev *b)
{
	struct sl_backend *be = m->be;
	const struct sl_cp_batch *cp = b->cp;
	const int Tl = b->B * b->L, KW = 2 * m->nkv * m->hd, C = cp->comm->size;

	be->copy_cols(be, m->cp_kv[2], KW, 0, qkvr, m->Q, m->nh * m->hd, Tl, KW, false);
	cp->comm->kv_all_gather(cp->comm->ctx, m->cp_kv[0], m->cp_kv[2], (size_t)Tl * KW);
	be->gather_rows(be, m->cp_kv[1], m->cp_kv[0], cp->perm, C * Tl, KW);
}

void sl_cp_attend_fwd(const struct sl_model *m, void *out, void *lse, const void *qkvr,
		      const struct sl_batch_dev *b)
{
	struct sl_backend *be = m->be;
	const struct sl_cp_batch *cp = b->cp;
	const int Tl = b->B * b->L, KW = 2 * m->nkv * m->hd, C = cp->comm->size;
	const int me = cp->comm->rank;

	/* the other ranks' keys travel while the queries attend to this rank's own */
	be->copy_cols(be, m->cp_kv[2], KW, 0, qkvr, m->Q, m->nh * m->hd, Tl, KW, false);
	cp->comm->kv_all_gather_start(cp->comm->ctx, m->cp_kv[0], m->cp_kv[2], (size_t)Tl * KW);
	be->zero(be, m->cp_kv[1], (size_t)C * Tl * KW * be->elt);
	be->scatter_add_rows(be, m->cp_kv[1], m->cp_kv[2], cp->inv + (size_t)me * Tl, Tl, KW);
	be->cp_attention_fwd(be, out, lse, qkvr, m->cp_kv[1], cp->gidx, cp->pos, b->lens, b->B,
			     b->L, cp->L, m->nh, m->nkv, m->hd, me, C, 1);
	cp->comm->kv_all_gather_wait(cp->comm->ctx);
	be->gather_rows(be, m->cp_kv[1], m->cp_kv[0], cp->perm, C * Tl, KW);
	be->cp_attention_fwd(be, out, lse, qkvr, m->cp_kv[1], cp->gidx, cp->pos, b->lens, b->B,
			     b->L, cp->L, m->nh, m->nkv, m->hd, me, C, 2);
}

void sl_cp_attend_bwd(const struct sl_model *m, void *dqkvr, const void *dout, const void *out,
		      const void *lse, const void *qkvr, const struct sl_batch_dev *b)
{
	struct sl_backend *be = m->be;
	const struct sl_cp_batch *cp = b->cp;
	const int Tl = b->B * b->L, KW = 2 * m->nkv * m->hd, C = cp->comm->size;

	gather_kv(m, qkvr, b);
	/* dqkvr = dq (k|v columns zero); cp_kv[2] = this rank's share of d(k|v) of whole rows */
	be->cp_attention_bwd(be, dqkvr, m->cp_kv[2], dout, out, lse, qkvr, m->cp_kv[1], cp->gidx,
			     cp->pos, b->lens, b->B, b->L, cp->L, m->nh, m->nkv, m->hd);
	be->gather_rows(be, m->cp_kv[0], m->cp_kv[2], cp->inv, C * Tl, KW);
	cp->comm->kv_reduce_scatter(cp->comm->ctx, m->cp_kv[1], m->cp_kv[0], (size_t)Tl * KW);
	be->copy_cols(be, dqkvr, m->Q, m->nh * m->hd, m->cp_kv[1], KW, 0, Tl, KW, false);
}

void sl_cp_attention_fwd(const struct sl_model *m, int l, const void *w, const struct acts *a,
			 const struct sl_batch_dev *b)
{
	const struct layer_off *lo = &m->lo[l];
	const struct sl_cp_batch *cp = b->cp;

	m->be->qk_norm_rope_fwd(m->be, a->qkvr, a->rstd_qk, a->qkv, at(m, w, lo->qn),
				at(m, w, lo->kn), b->B * b->L, cp->L, cp->pos, m->nh, m->nkv,
				m->hd, m->eps, m->theta);
	sl_cp_attend_fwd(m, a->att, a->lse, a->qkvr, b);
}

void sl_cp_attention_bwd(const struct sl_model *m, int l, const void *w, void *g,
			 const struct acts *a, const struct sl_batch_dev *b)
{
	const struct layer_off *lo = &m->lo[l];
	const struct sl_cp_batch *cp = b->cp;

	/* gb1 = dq|dk|dv from gb2 = d(att) */
	sl_cp_attend_bwd(m, m->gb1, m->gb2, a->att, a->lse, a->qkvr, b);
	m->be->qk_norm_rope_bwd(m->be, m->gb2, at(m, g, lo->qn), at(m, g, lo->kn), m->gb1, a->qkv,
				at(m, w, lo->qn), at(m, w, lo->kn), a->rstd_qk, b->B * b->L, cp->L,
				cp->pos, m->nh, m->nkv, m->hd, m->eps, m->theta);
}
