/*
 * model_moe: the Qwen3-MoE sparse MLP (Hugging Face Qwen3MoeSparseMoeBlock), forward and backward
 * against struct sl_backend, and its part of the parameter layout.
 *
 * A token's router logits (E) go through a softmax; its k most probable experts get the token,
 * weighted by their probabilities (renormalized to sum 1 with norm_topk_prob).  The choices are
 * sorted by expert (a stable counting sort), the tokens gathered in that order so every expert's
 * rows are contiguous, the experts' SwiGLU MLPs run as grouped matmuls over those row ranges, and
 * the outputs are summed back per token with the routing weights.  The row ranges reach the host
 * once per layer (one sync): the grouped matmul needs them there.
 *
 * Layout: in the layer's unit after post_attention_layernorm, mlp.gate.weight (E, H).  The
 * experts have a unit of their own (after the head unit, one per MoE layer), expert by expert:
 * gate_proj and up_proj (Im, H) back to back, then down_proj (H, Im), so the experts of one
 * expert-parallel rank are one contiguous range of the unit: with parallel.expert P > 1 a rank
 * holds and shards only its E / P experts (shard.c), the grouped matmuls step from one expert to
 * the next by the stride wes.  The tensors keep Hugging Face's per-expert names.
 *
 * With a dispatch (expert parallelism, an expert capacity: model_moe_ep.c) the gathered rows go
 * to the ranks owning their experts instead, and come back as ma->y; the rest is the same.
 *
 * Qwen3.5-MoE adds a shared expert to every sparse block: a SwiGLU MLP on every token (its gate
 * and up projections fused, mlp.shared_expert.*) whose output is scaled per token by
 * sigmoid(mlp.shared_expert_gate(x)) (a (1, H) linear) and added to the routed experts' sum.
 *
 * The load-balancing loss is transformers' load_balancing_loss_func with the attention mask:
 * over every MoE layer and real token together (its concatenation of all layers' logits),
 * f_e = share of the k-choices that went to expert e, P_e = mean probability of e,
 * aux = E * sum_e f_e P_e.  Only P carries a gradient: d aux / d p(t,e) = E f_e / N for each of
 * the N (layer, real token) rows.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model_moe_impl.h"

/* ---- layout ------------------------------------------------------------------------------ */

int sl_moe_layout(struct layout_builder *lb, const struct sl_model_config *mc, int l)
{
	const int64_t H = mc->hidden, Is = mc->shared_intermediate;
	int rc;

	/* the router; the experts follow in their own unit (sl_moe_layout_experts) */
	LAYER_ADD(false, "mlp.gate.weight", 2, mc->n_experts, H, SL_INIT_NORMAL);
	if (Is <= 0)
		return 0;
	/*
	 * Qwen3.5-MoE: the shared expert (every token, every rank: in the layer's unit), its gate
	 * and up projections fused as the dense MLP's
	 */
	LAYER_ADD(false, "mlp.shared_expert.gate_proj.weight", 2, Is, H, SL_INIT_NORMAL);
	LAYER_ADD(true, "mlp.shared_expert.up_proj.weight", 2, Is, H, SL_INIT_NORMAL);
	LAYER_ADD(false, "mlp.shared_expert.down_proj.weight", 2, H, Is, SL_INIT_NORMAL);
	LAYER_ADD(false, "mlp.shared_expert_gate.weight", 2, 1, H, SL_INIT_NORMAL);
	return 0;
}

int sl_moe_layout_experts(struct layout_builder *lb, const struct sl_model_config *mc, int l)
{
	const int64_t H = mc->hidden, Im = mc->moe_intermediate;
	char n[160];
	int rc = 0;

	for (int e = 0; e < mc->n_experts && !rc; e++) {
		snprintf(n, sizeof(n), "model.layers.%d.mlp.experts.%d.gate_proj.weight", l, e);
		rc = sl_layout_add(lb, false, n, 2, Im, H, SL_INIT_NORMAL);
		snprintf(n, sizeof(n), "model.layers.%d.mlp.experts.%d.up_proj.weight", l, e);
		rc = rc ? rc : sl_layout_add(lb, true, n, 2, Im, H, SL_INIT_NORMAL);
		snprintf(n, sizeof(n), "model.layers.%d.mlp.experts.%d.down_proj.weight", l, e);
		rc = rc ? rc : sl_layout_add(lb, false, n, 2, H, Im, SL_INIT_NORMAL);
	}
	return rc;
}

/* tensor @fmt (with @e) of layer l, in unit @unit (-1: any unit) */
static const struct sl_tensor_info *find(const struct sl_layout *lay, int l, int unit,
					 const char *fmt, int e)
{
	char s[96], n[160];
	const struct sl_tensor_info *ti;

	snprintf(s, sizeof(s), fmt, e);
	snprintf(n, sizeof(n), "model.layers.%d.%s", l, s);
	ti = sl_layout_find(lay, n);
	if (!ti || (unit >= 0 && ti->unit != unit)) {
		fprintf(stderr, "model: layout has no tensor %s in unit %d\n", n, unit);
		return NULL;
	}
	return ti;
}

static const char *shared_name(char *n, size_t len, int l, const char *what)
{
	snprintf(n, len, "model.layers.%d.mlp.%s.weight", l, what);
	return n;
}

int sl_moe_offsets(const struct sl_layout *lay, int l, struct layer_off *lo)
{
	const struct sl_tensor_info *r = find(lay, l, 1 + l, "mlp.gate.weight%.0d", 0), *g0, *d0;
	size_t gsz, dsz;
	char n[160];
	int E, xu;

	g0 = find(lay, l, -1, "mlp.experts.%d.gate_proj.weight", 0);
	d0 = find(lay, l, -1, "mlp.experts.%d.down_proj.weight", 0);
	if (!r || !g0 || !d0)
		return -EINVAL;
	E = (int)r->shape[0];
	xu = g0->unit;
	if (!lay->unit_experts || lay->unit_experts[xu] != E) {
		fprintf(stderr, "model: layer %d's experts are not in an expert unit\n", l);
		return -EINVAL;
	}
	gsz = g0->numel;
	dsz = d0->numel;
	lo->wr = r->offset;
	lo->xunit = xu;
	lo->wegu = g0->offset;
	lo->wed = d0->offset;
	lo->wes = lay->unit_numel[xu] / E;
	lo->wsgu = lo->wsd = lo->wsg = NO_OFF;
	if (sl_layout_find(lay, shared_name(n, sizeof(n), l, "shared_expert.gate_proj"))) {
		const struct sl_tensor_info *sg, *su, *sd, *sgt;

		sg = find(lay, l, 1 + l, "mlp.shared_expert.gate_proj.weight%.0d", 0);
		su = find(lay, l, 1 + l, "mlp.shared_expert.up_proj.weight%.0d", 0);
		sd = find(lay, l, 1 + l, "mlp.shared_expert.down_proj.weight%.0d", 0);
		sgt = find(lay, l, 1 + l, "mlp.shared_expert_gate.weight%.0d", 0);

		if (!sg || !su || !sd || !sgt)
			return -EINVAL;
		if (su->offset != sg->offset + sg->numel) {
			fprintf(stderr, "model: layer %d: the shared expert's up_proj does not "
				"follow its gate_proj contiguously\n", l);
			return -EINVAL;
		}
		lo->wsgu = sg->offset;
		lo->wsd = sd->offset;
		lo->wsg = sgt->offset;
	}
	/* the grouped matmuls index experts by stride: every expert must sit where they look */
	for (int e = 0; e < E; e++) {
		const struct sl_tensor_info *g = find(lay, l, xu, "mlp.experts.%d.gate_proj.weight", e);
		const struct sl_tensor_info *u = find(lay, l, xu, "mlp.experts.%d.up_proj.weight", e);
		const struct sl_tensor_info *d = find(lay, l, xu, "mlp.experts.%d.down_proj.weight", e);

		if (!g || !u || !d)
			return -EINVAL;
		if (g->offset != lo->wegu + lo->wes * e || u->offset != g->offset + gsz ||
		    u->numel != gsz || d->offset != lo->wed + lo->wes * e || d->numel != dsz ||
		    lo->wes * E != lay->unit_numel[xu] || lo->wes % 8) {
			fprintf(stderr, "model: layer %d: expert %d's weights are not laid out "
				"contiguously\n", l, e);
			return -EINVAL;
		}
	}
	return 0;
}

/* ---- workspace --------------------------------------------------------------------------- */

static int alloc_acts(struct sl_model *m, struct sl_moe *mo, struct moe_acts *a)
{
	const size_t T = (size_t)m->max_tokens, n = T * mo->k, e = m->be->elt;
	const size_t s = m->be->stat_elt, E = (size_t)mo->E;

	a->logits = sl_model_ws_alloc(m, T * E, e);
	a->p = sl_model_ws_alloc(m, T * E, s);
	a->topi = sl_model_ws_alloc(m, T * mo->k, sizeof(int32_t));
	a->topw = sl_model_ws_alloc(m, T * mo->k, s);
	a->rows = sl_model_ws_alloc(m, n, sizeof(int32_t));
	a->slot = sl_model_ws_alloc(m, n, sizeof(int32_t));
	a->offs = sl_model_ws_alloc(m, E + 1, sizeof(int32_t));
	a->gu = sl_model_ws_alloc(m, n * 2 * mo->Im, e);
	a->act = sl_model_ws_alloc(m, n * mo->Im, e);
	a->y = sl_model_ws_alloc(m, n * m->H, e);
	a->h_offs = calloc(E + 1, sizeof(*a->h_offs));
	if (!a->y || !a->h_offs)
		return -ENOMEM;
	if (!mo->Is)
		return 0;
	a->sgu = sl_model_ws_alloc(m, T * 2 * mo->Is, e);
	a->sact = sl_model_ws_alloc(m, T * mo->Is, e);
	a->sy = sl_model_ws_alloc(m, T * m->H, e);
	a->sgl = sl_model_ws_alloc(m, T, e);
	return a->sgl ? 0 : -ENOMEM;
}

int sl_moe_create(struct sl_model *m, const struct sl_model_config *mc)
{
	struct sl_moe *mo;
	struct sl_backend *be = m->be;
	size_t T = (size_t)m->max_tokens, n;
	int n_moe = 0;

	for (int l = 0; l < m->nL; l++)
		n_moe += sl_layer_is_moe(mc, l);
	if (!n_moe)
		return 0;
	if (!be->moe_route_fwd) {
		fprintf(stderr, "model: the %s backend has no mixture-of-experts ops\n", be->name);
		return -EINVAL;
	}
	if (mc->shared_intermediate > 0 && !be->row_gate_fwd) {
		fprintf(stderr, "model: the %s backend has no shared-expert gate op\n", be->name);
		return -EINVAL;
	}
	mo = calloc(1, sizeof(*mo));
	if (!mo)
		return -ENOMEM;
	m->moe = mo;
	mo->E = mc->n_experts;
	mo->k = mc->top_k;
	mo->Im = mc->moe_intermediate;
	mo->norm = mc->norm_topk_prob;
	mo->Is = mc->shared_intermediate > 0 ? mc->shared_intermediate : 0;
	mo->n_moe = n_moe;
	/* the Qwen3.5 layers keep their own activations: one slot per layer, or one reused */
	mo->n_la = m->q35 ? (m->ckpt ? 1 : m->nL) : m->n_acts;
	mo->index = calloc((size_t)m->nL, sizeof(*mo->index));
	mo->la = calloc((size_t)mo->n_la, sizeof(*mo->la));
	mo->h_stats = calloc((size_t)n_moe * 2 * mo->E, sizeof(*mo->h_stats));
	mo->counts = calloc((size_t)n_moe * mo->E, sizeof(*mo->counts));
	mo->h_cp_lens = calloc((size_t)m->max_records, sizeof(*mo->h_cp_lens));
	mo->cp_lens = be->alloc(be, (size_t)m->max_records * sizeof(int32_t));
	if (!mo->index || !mo->la || !mo->h_stats || !mo->counts || !mo->h_cp_lens ||
	    !mo->cp_lens)
		return -ENOMEM;
	n_moe = 0;
	for (int l = 0; l < m->nL; l++)
		mo->index[l] = sl_layer_is_moe(mc, l) ? n_moe++ : -1;
	for (int i = 0; i < mo->n_la; i++)
		if (alloc_acts(m, mo, &mo->la[i]))
			return -ENOMEM;
	n = T * mo->k;
	mo->s_h1 = sl_model_ws_alloc(m, n * m->H, be->elt);
	mo->s_h2 = sl_model_ws_alloc(m, n * m->H, be->elt);
	mo->s_i = sl_model_ws_alloc(m, n * mo->Im, be->elt);
	mo->s_gu = sl_model_ws_alloc(m, n * 2 * mo->Im, be->elt);
	mo->dlogits = sl_model_ws_alloc(m, T * mo->E, be->elt);
	mo->dtopw = sl_model_ws_alloc(m, T * mo->k, be->stat_elt);
	mo->stats = sl_model_ws_alloc(m, (size_t)mo->n_moe * 2 * mo->E, sizeof(double));
	mo->aux_g = sl_model_ws_alloc(m, (size_t)mo->E, be->stat_elt);
	mo->ones = sl_model_ws_alloc(m, n, be->stat_elt);
	if (!mo->ones)
		return -ENOMEM;
	if (mo->Is) {
		mo->s_sgu = sl_model_ws_alloc(m, T * 2 * mo->Is, be->elt);
		mo->s_sact = sl_model_ws_alloc(m, T * mo->Is, be->elt);
		mo->s_sgl = sl_model_ws_alloc(m, T, be->elt);
		if (!mo->s_sgl)
			return -ENOMEM;
	}
	{
		void *h = malloc(n * be->stat_elt);

		if (!h)
			return -ENOMEM;
		for (size_t i = 0; i < n; i++) {
			if (be->stat_elt == sizeof(float))
				((float *)h)[i] = 1.0f;
			else
				((double *)h)[i] = 1.0;
		}
		be->upload(be, mo->ones, h, n * be->stat_elt);
		free(h);
	}
	return 0;
}

void sl_moe_destroy(struct sl_model *m)
{
	struct sl_moe *mo = m->moe;

	if (!mo)
		return;
	sl_moe_ep_destroy(mo);
	for (int i = 0; mo->la && i < mo->n_la; i++)
		free(mo->la[i].h_offs);
	free(mo->la);
	free(mo->index);
	free(mo->h_stats);
	free(mo->counts);
	if (mo->cp_lens)
		m->be->free(m->be, mo->cp_lens);
	free(mo->h_cp_lens);
	free(mo);
	m->moe = NULL;
}

void sl_moe_set_batch(struct sl_model *m, const struct sl_batch_dev *b)
{
	struct sl_moe *mo = m->moe;
	const struct sl_cp_batch *cp = b->cp;
	int Lh, i, j;

	if (!mo)
		return;
	mo->lens = b->lens;
	mo->h_lens = b->h_lens;
	if (!cp)
		return;
	/* this rank's chunks i and j = 2C-1-i of Lh tokens each, padding only at a row's end */
	Lh = cp->L / (2 * cp->comm->size);
	i = cp->comm->rank;
	j = 2 * cp->comm->size - 1 - i;
	for (int r = 0; r < b->B; r++) {
		int a = b->h_lens[r] - i * Lh, c = b->h_lens[r] - j * Lh;

		mo->h_cp_lens[r] = (a < 0 ? 0 : a > Lh ? Lh : a) + (c < 0 ? 0 : c > Lh ? Lh : c);
	}
	m->be->upload(m->be, mo->cp_lens, mo->h_cp_lens, (size_t)b->B * sizeof(int32_t));
	mo->lens = mo->cp_lens;
	mo->h_lens = mo->h_cp_lens;
}

/* ---- forward ----------------------------------------------------------------------------- */

void sl_moe_begin(struct sl_model *m)
{
	struct sl_moe *mo = m->moe;

	sl_moe_ep_begin(mo);
	if (mo)
		m->be->zero(m->be, mo->stats, (size_t)mo->n_moe * 2 * mo->E * sizeof(double));
}

/*
 * Qwen3.5-MoE's shared expert: sy = down(silu(gate(x)) * up(x)) on every token, sgl = its gate's
 * logit; everything its backward needs (the recompute of a checkpointed layer included).
 */
static void shared_fwd(struct sl_model *m, const struct layer_off *lo, const void *w,
		       struct moe_acts *ma, const void *xn2, int T)
{
	struct sl_backend *be = m->be;
	const int H = m->H, Is = m->moe->Is;

	be->matmul_fwd(be, ma->sgu, xn2, at(m, w, lo->wsgu), NULL, T, H, 2 * Is);
	be->swiglu_fwd(be, ma->sact, ma->sgu, T, Is);
	be->matmul_fwd(be, ma->sy, ma->sact, at(m, w, lo->wsd), NULL, T, Is, H);
	be->matmul_fwd(be, ma->sgl, xn2, at(m, w, lo->wsg), NULL, T, H, 1);
}

void sl_moe_fwd(struct sl_model *m, int l, const void *w, const struct acts *a, void *xout,
		const struct sl_batch_dev *b, bool full)
{
	sl_moe_mlp_fwd(m, l, w, (int)(a - m->acts), a->xn2, a->h, xout, b, full);
}

void sl_moe_mlp_fwd(struct sl_model *m, int l, const void *w, int slot, const void *xn2,
		    const void *h, void *xout, const struct sl_batch_dev *b, bool full)
{
	struct sl_backend *be = m->be;
	struct sl_moe *mo = m->moe;
	const struct layer_off *lo = &m->lo[l];
	struct moe_acts *ma = &mo->la[slot];
	const int T = b->B * b->L, H = m->H, E = mo->E, k = mo->k, n = T * k;
	const void *xw;

	if (lo->wsgu != NO_OFF)
		shared_fwd(m, lo, w, ma, xn2, T);
	be->matmul_fwd(be, ma->logits, xn2, at(m, w, lo->wr), NULL, T, H, E);
	be->moe_route_fwd(be, ma->p, ma->topi, ma->topw, ma->logits, T, E, k, mo->norm);
	be->moe_permute(be, ma->rows, ma->slot, ma->offs, ma->topi, T, E, k);
	if (full)	/* not again in the backward's recompute */
		be->moe_aux_stats(be, mo->stats + (size_t)mo->index[l] * 2 * E, ma->p, ma->topi,
				  mo->lens, b->B, b->L, E, k);
	be->download(be, ma->h_offs, ma->offs, (size_t)(E + 1) * sizeof(int32_t));
	be->sync(be);

	xw = m->src->weights(m->src->ctx, lo->xunit);
	if (sl_moe_ep_on(mo)) {
		sl_moe_ep_fwd(m, l, xw, ma, xn2, b, full);
		goto combine;
	}
	be->gather_rows(be, mo->s_h1, xn2, ma->rows, n, H);
	be->moe_gemm_fwd(be, ma->gu, mo->s_h1, at(m, xw, lo->wegu), ma->offs, ma->h_offs, E, H,
			 2 * mo->Im, lo->wes);
	be->swiglu_fwd(be, ma->act, ma->gu, n, mo->Im);
	be->moe_gemm_fwd(be, ma->y, ma->act, at(m, xw, lo->wed), ma->offs, ma->h_offs, E, mo->Im,
			 H, lo->wes);
combine:
	if (m->src->release_fwd)
		m->src->release_fwd(m->src->ctx, lo->xunit);
	if (!full)
		return;
	be->moe_combine_fwd(be, xout, ma->y, ma->topw, ma->slot, T, k, H);
	be->add(be, xout, h, (size_t)T * H);
	if (lo->wsgu != NO_OFF)
		be->row_gate_fwd(be, xout, ma->sy, ma->sgl, T, H);
}

double sl_moe_end_fwd(struct sl_model *m, const struct sl_batch_dev *b, double aux_weight)
{
	struct sl_backend *be = m->be;
	struct sl_moe *mo = m->moe;
	const int E = mo ? mo->E : 0;
	double n_real = 0, N, aux = 0;
	float gf[4096];
	double gd[4096];

	if (!mo)
		return 0;
	be->download(be, mo->h_stats, mo->stats, (size_t)mo->n_moe * 2 * E * sizeof(double));
	be->sync(be);
	/* the counts are this rank's tokens' (the trainer sums them over ranks) */
	for (int i = 0; i < mo->n_moe; i++)
		for (int e = 0; e < E; e++)
			mo->counts[(size_t)i * E + e] = (int64_t)mo->h_stats[(size_t)i * 2 * E + e];
	/* context parallel: the loss is the whole rows', whose tokens the group shares */
	if (b->cp)
		b->cp->comm->sum_f64(b->cp->comm->ctx, mo->h_stats, (size_t)mo->n_moe * 2 * E);
	/* b->h_lens: the rows' real tokens (with context parallel, all of the rows') */
	for (int r = 0; r < b->B; r++)
		n_real += b->h_lens[r];
	N = n_real * mo->n_moe;
	for (int e = 0; e < E; e++) {
		double c = 0, p = 0;

		for (int i = 0; i < mo->n_moe; i++) {
			c += mo->h_stats[(size_t)i * 2 * E + e];
			p += mo->h_stats[(size_t)i * 2 * E + E + e];
		}
		aux += (c / N) * (p / N);
		gd[e] = aux_weight * E * (c / N) / N;
		gf[e] = (float)gd[e];
	}
	aux *= E;
	mo->aux = aux;
	mo->aux_on = aux_weight != 0;
	if (mo->aux_on)
		be->upload(be, mo->aux_g, be->stat_elt == sizeof(float) ? (void *)gf : (void *)gd,
			   (size_t)E * be->stat_elt);
	return aux;
}

/* ---- backward ---------------------------------------------------------------------------- */

void sl_moe_bwd(struct sl_model *m, int l, const void *w, void *g, const struct acts *a,
		const struct sl_batch_dev *b)
{
	sl_moe_mlp_bwd(m, l, w, g, (int)(a - m->acts), a->xn2, b);
}

/* the shared expert's backward: m->gx in, its input gradient added to m->gn */
static void shared_bwd(struct sl_model *m, const struct layer_off *lo, const void *w, void *g,
		       struct moe_acts *ma, const void *xn2, int T)
{
	struct sl_backend *be = m->be;
	struct sl_moe *mo = m->moe;
	const int H = m->H, Is = mo->Is;

	/* s_h1 (T k >= T rows) is free again once the routed experts are done */
	be->row_gate_bwd(be, mo->s_h1, mo->s_sgl, m->gx, ma->sy, ma->sgl, T, H);
	be->matmul_bwd(be, mo->s_sact, at(m, g, lo->wsd), NULL, mo->s_h1, ma->sact,
		       at(m, w, lo->wsd), T, Is, H, false);
	be->swiglu_bwd(be, mo->s_sgu, mo->s_sact, ma->sgu, T, Is);
	be->matmul_bwd(be, m->gn, at(m, g, lo->wsgu), NULL, mo->s_sgu, xn2, at(m, w, lo->wsgu),
		       T, H, 2 * Is, true);
	be->matmul_bwd(be, m->gn, at(m, g, lo->wsg), NULL, mo->s_sgl, xn2, at(m, w, lo->wsg), T,
		       H, 1, true);
}

void sl_moe_mlp_bwd(struct sl_model *m, int l, const void *w, void *g, int slot,
		    const void *xn2, const struct sl_batch_dev *b)
{
	struct sl_backend *be = m->be;
	struct sl_moe *mo = m->moe;
	const struct layer_off *lo = &m->lo[l];
	struct moe_acts *ma = &mo->la[slot];
	const int T = b->B * b->L, H = m->H, E = mo->E, k = mo->k, n = T * k, Im = mo->Im;
	const void *xw = m->src->weights(m->src->ctx, lo->xunit);
	/* without a dispatch the two grouped backward matmuls write every expert's gate, up and
	 * down blocks, which make up the experts' unit: no zeroing first */
	const bool set = be->moe_dw_set && m->src->grads_set && !sl_moe_ep_on(mo) &&
			 lo->wes == (size_t)3 * Im * H;
	void *xg = set ? m->src->grads_set(m->src->ctx, lo->xunit) :
			 m->src->grads(m->src->ctx, lo->xunit);

	/* out = sum_j w_j y_j: to the experts' outputs and the routing weights */
	be->moe_combine_bwd(be, mo->s_h1, mo->dtopw, m->gx, ma->y, ma->topw, ma->slot, T, k, H);
	if (sl_moe_ep_on(mo)) {
		sl_moe_ep_bwd(m, l, xw, xg, ma, mo->s_h1, mo->s_h2, n);
		goto unpermute;
	}
	be->moe_gemm_bwd(be, mo->s_i, at(m, xg, lo->wed), mo->s_h1, ma->act, at(m, xw, lo->wed),
			 ma->offs, ma->h_offs, E, Im, H, lo->wes, set);
	be->swiglu_bwd(be, mo->s_gu, mo->s_i, ma->gu, n, Im);
	/* the gathered input again (s_h1's gradient is spent) rather than a copy per layer */
	be->gather_rows(be, mo->s_h1, xn2, ma->rows, n, H);
	be->moe_gemm_bwd(be, mo->s_h2, at(m, xg, lo->wegu), mo->s_gu, mo->s_h1,
			 at(m, xw, lo->wegu), ma->offs, ma->h_offs, E, H, 2 * Im, lo->wes, set);
unpermute:
	/* the experts' gradients are complete for this micro-batch */
	if (m->src->release_bwd)
		m->src->release_bwd(m->src->ctx, lo->xunit);
	/* un-permute: each token sums its k rows (a combine with weights 1: no atomics) */
	be->moe_combine_fwd(be, m->gn, mo->s_h2, mo->ones, ma->slot, T, k, H);
	/* the router: routing weights and the aux loss through the softmax to the logits */
	be->moe_route_bwd(be, mo->dlogits, mo->dtopw, ma->p, ma->topi, ma->topw,
			  mo->aux_on ? mo->aux_g : NULL, mo->lens, b->B, b->L, E, k, mo->norm);
	be->matmul_bwd(be, m->gn, at(m, g, lo->wr), NULL, mo->dlogits, xn2, at(m, w, lo->wr),
		       T, H, E, true);
	if (lo->wsgu != NO_OFF)
		shared_bwd(m, lo, w, g, ma, xn2, T);
}

const int64_t *sl_model_expert_counts(const struct sl_model *m, int *n_layers, int *n_experts,
				      double *aux)
{
	if (!m->moe)
		return NULL;
	*n_layers = m->moe->n_moe;
	*n_experts = m->moe->E;
	if (aux)
		*aux = m->moe->aux;
	return m->moe->counts;
}
