/*
 * model_qwen35: the Qwen3.5 hybrid's decoder layers (transformers' modeling_qwen3_5.py), written
 * against struct sl_backend like model.c, which dispatches here when the config says
 * norm_offset (model_type qwen3_5 / qwen3_5_text).
 *
 * Both kinds share the Qwen3 residual structure, x' = x + mixer(norm(x)); x'' = x' +
 * mlp(norm(x')), with Qwen3.5's RMSNorm, which scales by (1 + weight): the effective weight is
 * formed in a scratch buffer before each norm (its gradient is the weight's gradient).
 *  - full_attention (SL_LAYER_GATED_ATTENTION): q_proj gives per head hd query values and hd
 *    gate values; q/k RMSNorm, rotary embedding on the first rot_dim dims of each head, causal
 *    GQA attention, output * sigmoid(gate), o_proj.  q_proj, k_proj, v_proj are one fused GEMM.
 *  - linear_attention (SL_LAYER_LINEAR_ATTENTION, Gated DeltaNet): in_proj_qkv, in_proj_z,
 *    in_proj_b, in_proj_a as one fused GEMM; causal depthwise conv + SiLU on the qkv part;
 *    l2-normed q (scaled by dk^-1/2) and k, beta = sigmoid(b), g = -exp(A_log) softplus(a +
 *    dt_bias); the gated delta rule; gated RMSNorm with z; out_proj.
 * Qwen3.5-MoE (qwen3_5_moe): the MLP of every layer is model_moe.c's sparse block with its
 * shared expert instead of the dense SwiGLU.
 * With activation checkpointing only each layer's input is kept; the backward recomputes the
 * layer first.
 * Context parallel (parallel.context, struct sl_cp_batch): every op but the mixers' sequence
 * work is per token; the gated attention attends through model_cp.c, the Gated DeltaNet passes
 * its state and convolution edge rows from chunk to chunk (see below).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model_impl.h"

/* a layer's tensors as element offsets in its unit; NO_OFF where the kind has none */
struct q35_off {
	enum sl_layer_kind kind;
	bool moe;		/* the sparse MLP (model_moe.c, offsets in m->lo[l]) */
	size_t ln1, ln2;	/* (H) */
	size_t wgu;		/* (2I, H) dense MLP */
	size_t wd;		/* (H, I) dense MLP */
	size_t wqgkv;		/* attention: ((2 nh + 2 nkv) hd, H) q_proj | k_proj | v_proj */
	size_t wo;		/* attention: (H, nh hd) */
	size_t qn, kn;		/* attention: (hd) */
	size_t win;		/* GDN: (P, H) in_proj_qkv | in_proj_z | in_proj_b | in_proj_a */
	size_t conv;		/* GDN: (Cc, K) */
	size_t dt_bias, A_log;	/* GDN: (nv) */
	size_t gnorm;		/* GDN: (dv) */
	size_t wout;		/* GDN: (H, nv dv) */
};

/* what a layer's backward needs from its forward; the comments give (attention | GDN) shapes */
struct q35_acts {
	void *xn1, *rstd1;	/* (T, H), (T) */
	void *proj;		/* (T, Pa) | (T, P): the fused input projection */
	void *cpre, *c;		/* GDN (T, Cc): conv pre-activation and output */
	void *qn, *kn, *rqk;	/* GDN (T, nk dk) x 2, (T, 2 nk) stat */
	void *beta, *g;		/* GDN (T, nv) stat */
	void *states;		/* GDN (T/64 + B, nv, dk, dv) stat: chunk-start states */
	void *qkvr, *gate, *lse;	/* attention (T, (nh + 2 nkv) hd), (T, nh hd), (T, nh) */
	void *o;		/* (T, nh hd) attention | (T, nv dv) delta rule output */
	void *rstd_o;		/* (T, nh + nkv) q/k norms | (T, nv) gated norm */
	void *y;		/* (T, nh hd) gated | (T, nv dv) gated-normed */
	void *h, *xn2, *rstd2;	/* (T, H), (T, H), (T) */
	void *gu, *act;		/* (T, 2I), (T, I) dense MLP; NULL with the sparse one */
};

struct sl_q35 {
	int nk, nv, dk, dv, K;
	int Cc;			/* conv channels 2 nk dk + nv dv */
	int P;			/* GDN projection width Cc + nv dv + 2 nv */
	int Pa;			/* attention projection width (2 nh + 2 nkv) hd */
	int rot;
	struct q35_off *lo;	/* (nL) */
	struct q35_acts *acts;	/* (nL), or one per kind when checkpointing */
	void *ones;		/* (max(H, hd)) */
	void *wn1, *wn2, *wqn, *wkn, *wfin;	/* effective norm weights 1 + w */
	/* gradient scratch */
	void *gproj;		/* (T, max(P, Pa)) */
	void *gc;		/* (T, Cc) */
	void *gqn, *gkn;	/* (T, nk dk) */
	void *gbeta, *gg;	/* (T, nv) */
	void *go, *gy;		/* (T, max(nv dv, nh hd)) */
	void *gqkvr, *ggate;	/* (T, (nh + 2 nkv) hd), (T, nh hd) */
	/* context parallel, made at the first context-parallel micro-batch (NULL before and
	 * without): the Gated DeltaNet states and the convolution edge rows passed on */
	void *cp_s[2];		/* (B, nv, dk, dv) stat */
	void *cp_e[4];		/* (2B, K-1, P): tails, halo, and two received */
};

/* ---- layout -------------------------------------------------------------------------------- */

int sl_q35_layout_layer(struct layout_builder *lb, const struct sl_model_config *mc, int l)
{
	const int64_t H = mc->hidden, hd = mc->head_dim, I = mc->intermediate;
	const int64_t nh = mc->n_heads, nkv = mc->n_kv_heads;
	const int64_t nk = mc->lin_nk, nv = mc->lin_nv, dk = mc->lin_dk, dv = mc->lin_dv;
	const int64_t Cc = 2 * nk * dk + nv * dv;
	int rc = 0;

	if (!mc->norm_offset || mc->rot_dim < 2 || nk < 1 || nv % nk) {
		fprintf(stderr, "model: layer %d: not a Qwen3.5 config\n", l);
		return -EINVAL;
	}
	/* zero-centred norms: (1 + w), so "ones" is zeros */
	LAYER_ADD(false, "input_layernorm.weight", 1, H, 0, SL_INIT_ZEROS);
	if (mc->layer_kind[l] == SL_LAYER_GATED_ATTENTION) {
		LAYER_ADD(false, "self_attn.q_proj.weight", 2, 2 * nh * hd, H, SL_INIT_NORMAL);
		LAYER_ADD(true, "self_attn.k_proj.weight", 2, nkv * hd, H, SL_INIT_NORMAL);
		LAYER_ADD(true, "self_attn.v_proj.weight", 2, nkv * hd, H, SL_INIT_NORMAL);
		LAYER_ADD(false, "self_attn.o_proj.weight", 2, H, nh * hd, SL_INIT_NORMAL);
		LAYER_ADD(false, "self_attn.q_norm.weight", 1, hd, 0, SL_INIT_ZEROS);
		LAYER_ADD(false, "self_attn.k_norm.weight", 1, hd, 0, SL_INIT_ZEROS);
	} else if (mc->layer_kind[l] == SL_LAYER_LINEAR_ATTENTION) {
		LAYER_ADD(false, "linear_attn.in_proj_qkv.weight", 2, Cc, H, SL_INIT_NORMAL);
		LAYER_ADD(true, "linear_attn.in_proj_z.weight", 2, nv * dv, H, SL_INIT_NORMAL);
		LAYER_ADD(true, "linear_attn.in_proj_b.weight", 2, nv, H, SL_INIT_NORMAL);
		LAYER_ADD(true, "linear_attn.in_proj_a.weight", 2, nv, H, SL_INIT_NORMAL);
		LAYER_ADD(false, "linear_attn.conv1d.weight", 2, Cc, mc->lin_conv, SL_INIT_NORMAL);
		lb->lay->t[lb->lay->n_tensors - 1].unsqueeze1 = true;
		LAYER_ADD(false, "linear_attn.dt_bias", 1, nv, 0, SL_INIT_ONES);
		LAYER_ADD(false, "linear_attn.A_log", 1, nv, 0, SL_INIT_ZEROS);
		LAYER_ADD(false, "linear_attn.norm.weight", 1, dv, 0, SL_INIT_ONES);
		LAYER_ADD(false, "linear_attn.out_proj.weight", 2, H, nv * dv, SL_INIT_NORMAL);
	} else {
		fprintf(stderr, "model: layer %d: kind %d is not a Qwen3.5 layer\n", l,
			mc->layer_kind[l]);
		return -EINVAL;
	}
	LAYER_ADD(false, "post_attention_layernorm.weight", 1, H, 0, SL_INIT_ZEROS);
	if (sl_layer_is_moe(mc, l))	/* Qwen3.5-MoE: router, experts, shared expert */
		return sl_moe_layout(lb, mc, l);
	LAYER_ADD(false, "mlp.gate_proj.weight", 2, I, H, SL_INIT_NORMAL);
	LAYER_ADD(true, "mlp.up_proj.weight", 2, I, H, SL_INIT_NORMAL);
	LAYER_ADD(false, "mlp.down_proj.weight", 2, H, I, SL_INIT_NORMAL);
	return rc;
}

/* ---- setup --------------------------------------------------------------------------------- */

/*
 * Offset of layer l's tensor @suffix in its unit; with @after (not NO_OFF) it must start there
 * (the next member of a fused group).
 */
static int off_of(const struct sl_layout *lay, int l, const char *suffix, size_t after,
		  size_t *off, size_t *end)
{
	char n[160];
	const struct sl_tensor_info *ti;

	snprintf(n, sizeof(n), "model.layers.%d.%s", l, suffix);
	ti = sl_layout_find(lay, n);
	if (!ti || ti->unit != 1 + l || (after != NO_OFF && ti->offset != after)) {
		fprintf(stderr, "model: layout has no %s in unit %d%s\n", n, 1 + l,
			after != NO_OFF ? " right after its fused predecessor" : "");
		return -EINVAL;
	}
	*off = ti->offset;
	if (end)
		*end = ti->offset + ti->numel;
	return 0;
}

static int q35_offsets(const struct sl_layout *lay, int l, enum sl_layer_kind kind, bool moe,
		       struct q35_off *o)
{
	size_t e, dummy;
	int rc;

	memset(o, 0xff, sizeof(*o));	/* NO_OFF everywhere */
	o->kind = kind;
	o->moe = moe;
	rc = off_of(lay, l, "input_layernorm.weight", NO_OFF, &o->ln1, NULL);
	rc = rc ? rc : off_of(lay, l, "post_attention_layernorm.weight", NO_OFF, &o->ln2, NULL);
	if (!moe) {
		rc = rc ? rc : off_of(lay, l, "mlp.gate_proj.weight", NO_OFF, &o->wgu, &e);
		rc = rc ? rc : off_of(lay, l, "mlp.up_proj.weight", e, &dummy, NULL);
		rc = rc ? rc : off_of(lay, l, "mlp.down_proj.weight", NO_OFF, &o->wd, NULL);
	}
	if (rc)
		return rc;
	if (kind == SL_LAYER_GATED_ATTENTION) {
		rc = off_of(lay, l, "self_attn.q_proj.weight", NO_OFF, &o->wqgkv, &e);
		rc = rc ? rc : off_of(lay, l, "self_attn.k_proj.weight", e, &dummy, &e);
		rc = rc ? rc : off_of(lay, l, "self_attn.v_proj.weight", e, &dummy, NULL);
		rc = rc ? rc : off_of(lay, l, "self_attn.o_proj.weight", NO_OFF, &o->wo, NULL);
		rc = rc ? rc : off_of(lay, l, "self_attn.q_norm.weight", NO_OFF, &o->qn, NULL);
		rc = rc ? rc : off_of(lay, l, "self_attn.k_norm.weight", NO_OFF, &o->kn, NULL);
		return rc;
	}
	rc = off_of(lay, l, "linear_attn.in_proj_qkv.weight", NO_OFF, &o->win, &e);
	rc = rc ? rc : off_of(lay, l, "linear_attn.in_proj_z.weight", e, &dummy, &e);
	rc = rc ? rc : off_of(lay, l, "linear_attn.in_proj_b.weight", e, &dummy, &e);
	rc = rc ? rc : off_of(lay, l, "linear_attn.in_proj_a.weight", e, &dummy, NULL);
	rc = rc ? rc : off_of(lay, l, "linear_attn.conv1d.weight", NO_OFF, &o->conv, NULL);
	rc = rc ? rc : off_of(lay, l, "linear_attn.dt_bias", NO_OFF, &o->dt_bias, NULL);
	rc = rc ? rc : off_of(lay, l, "linear_attn.A_log", NO_OFF, &o->A_log, NULL);
	rc = rc ? rc : off_of(lay, l, "linear_attn.norm.weight", NO_OFF, &o->gnorm, NULL);
	rc = rc ? rc : off_of(lay, l, "linear_attn.out_proj.weight", NO_OFF, &o->wout, NULL);
	return rc;
}

static size_t zmax(size_t a, size_t b)
{
	return a > b ? a : b;
}

static int alloc_q35_acts(struct sl_model *m, struct q35_acts *a, enum sl_layer_kind kind,
			  bool dense)
{
	struct sl_q35 *q = m->q35;
	const size_t T = m->max_tokens, B = m->max_records, e = m->be->elt, s = m->be->stat_elt;

	a->xn1 = sl_model_ws_alloc(m, T * m->H, e);
	a->rstd1 = sl_model_ws_alloc(m, T, s);
	if (kind == SL_LAYER_GATED_ATTENTION) {
		a->proj = sl_model_ws_alloc(m, T * q->Pa, e);
		a->qkvr = sl_model_ws_alloc(m, T * m->Q, e);
		a->gate = sl_model_ws_alloc(m, T * m->nh * m->hd, e);
		a->lse = sl_model_ws_alloc(m, T * m->nh, s);
		a->o = sl_model_ws_alloc(m, T * m->nh * m->hd, e);
		a->rstd_o = sl_model_ws_alloc(m, T * (m->nh + m->nkv), s);
		a->y = sl_model_ws_alloc(m, T * m->nh * m->hd, e);
	} else {
		a->proj = sl_model_ws_alloc(m, T * q->P, e);
		a->cpre = sl_model_ws_alloc(m, T * q->Cc, e);
		a->c = sl_model_ws_alloc(m, T * q->Cc, e);
		a->qn = sl_model_ws_alloc(m, T * q->nk * q->dk, e);
		a->kn = sl_model_ws_alloc(m, T * q->nk * q->dk, e);
		a->rqk = sl_model_ws_alloc(m, T * 2 * q->nk, s);
		a->beta = sl_model_ws_alloc(m, T * q->nv, s);
		a->g = sl_model_ws_alloc(m, T * q->nv, s);
		/*
		 * B records of L tokens have at most ceil(L/64) <= L/64 + 1 chunks each; under
		 * context parallel a record is 2 chunks of L/2, so T / 64 + 2B in all
		 */
		/* and the backend's room past them (for at most T / 64 + B chunks) */
		a->states = sl_model_ws_alloc(m, (T / 64 + 2 * B) * q->nv * q->dk * q->dv +
					      (m->be->gdn_states_extra ?
					       m->be->gdn_states_extra(m->be, T / 64 + B, q->nv,
								       q->dk, q->dv) : 0), s);
		a->o = sl_model_ws_alloc(m, T * q->nv * q->dv, e);
		a->rstd_o = sl_model_ws_alloc(m, T * q->nv, s);
		a->y = sl_model_ws_alloc(m, T * q->nv * q->dv, e);
	}
	a->h = sl_model_ws_alloc(m, T * m->H, e);
	a->xn2 = sl_model_ws_alloc(m, T * m->H, e);
	a->rstd2 = sl_model_ws_alloc(m, T, s);
	if (!dense)	/* the sparse MLP keeps its own (model_moe.c) */
		return a->rstd2 ? 0 : -ENOMEM;
	a->gu = sl_model_ws_alloc(m, T * 2 * m->I, e);
	a->act = sl_model_ws_alloc(m, T * m->I, e);
	return a->act ? 0 : -ENOMEM;
}

/* the backward's gradient scratch of q for T tokens */
static int alloc_scratch(struct sl_model *m, struct sl_q35 *q, size_t T)
{
	const size_t e = m->be->elt, vw = zmax((size_t)q->nv * q->dv, (size_t)m->nh * m->hd);

	q->gproj = sl_model_ws_alloc(m, T * zmax(q->P, q->Pa), e);
	q->gc = sl_model_ws_alloc(m, T * q->Cc, e);
	q->gqn = sl_model_ws_alloc(m, T * q->nk * q->dk, e);
	q->gkn = sl_model_ws_alloc(m, T * q->nk * q->dk, e);
	q->gbeta = sl_model_ws_alloc(m, T * q->nv, e);
	q->gg = sl_model_ws_alloc(m, T * q->nv, e);
	q->go = sl_model_ws_alloc(m, T * vw, e);
	q->gy = sl_model_ws_alloc(m, T * vw, e);
	q->gqkvr = sl_model_ws_alloc(m, T * m->Q, e);
	q->ggate = sl_model_ws_alloc(m, T * m->nh * m->hd, e);
	return q->ggate ? 0 : -ENOMEM;
}

int sl_q35_init(struct sl_model *m, const struct sl_model_config *mc,
		const struct sl_layout *lay)
{
	struct sl_backend *be = m->be;
	struct sl_q35 *q;
	const size_t T = m->max_tokens, e = be->elt;
	size_t n1 = zmax(m->H, m->hd);
	bool any_dense = false;
	float *ones;
	void *ones32;

	if (!be->gdn_rule_fwd || !be->gattn_qk_fwd) {
		fprintf(stderr, "model: the %s backend has no Qwen3.5 ops yet\n", be->name);
		return -EINVAL;
	}
	q = calloc(1, sizeof(*q));
	if (!q)
		return -ENOMEM;
	m->q35 = q;
	q->nk = mc->lin_nk;
	q->nv = mc->lin_nv;
	q->dk = mc->lin_dk;
	q->dv = mc->lin_dv;
	q->K = mc->lin_conv;
	q->Cc = 2 * q->nk * q->dk + q->nv * q->dv;
	q->P = q->Cc + q->nv * q->dv + 2 * q->nv;
	q->Pa = (2 * m->nh + 2 * m->nkv) * m->hd;
	q->rot = mc->rot_dim;
	q->lo = calloc(m->nL, sizeof(*q->lo));
	q->acts = calloc(zmax(m->nL, 2), sizeof(*q->acts));
	if (!q->lo || !q->acts)
		return -ENOMEM;
	for (int l = 0; l < m->nL; l++) {
		bool moe = sl_layer_is_moe(mc, l);

		if (q35_offsets(lay, l, mc->layer_kind[l], moe, &q->lo[l]) ||
		    (moe && sl_moe_offsets(lay, l, &m->lo[l])))
			return -EINVAL;
		any_dense |= !moe;
	}
	if (m->ckpt) {
		if (alloc_q35_acts(m, &q->acts[0], SL_LAYER_GATED_ATTENTION, any_dense) ||
		    alloc_q35_acts(m, &q->acts[1], SL_LAYER_LINEAR_ATTENTION, any_dense))
			return -ENOMEM;
	} else {
		for (int l = 0; l < m->nL; l++)
			if (alloc_q35_acts(m, &q->acts[l], mc->layer_kind[l],
					   !sl_layer_is_moe(mc, l)))
				return -ENOMEM;
	}
	q->ones = sl_model_ws_alloc(m, n1, e);
	q->wn1 = sl_model_ws_alloc(m, m->H, e);
	q->wn2 = sl_model_ws_alloc(m, m->H, e);
	q->wfin = sl_model_ws_alloc(m, m->H, e);
	q->wqn = sl_model_ws_alloc(m, m->hd, e);
	q->wkn = sl_model_ws_alloc(m, m->hd, e);
	if (alloc_scratch(m, q, T))
		return -ENOMEM;
	/* ones in the compute type, through an f32 device buffer */
	ones = malloc(n1 * sizeof(float));
	ones32 = be->alloc(be, n1 * sizeof(float));
	if (!ones)
		abort();
	for (size_t i = 0; i < n1; i++)
		ones[i] = 1.0f;
	be->upload(be, ones32, ones, n1 * sizeof(float));
	be->to_compute(be, q->ones, ones32, n1);
	be->sync(be);
	be->free(be, ones32);
	free(ones);
	return 0;
}

void sl_q35_free(struct sl_model *m)
{
	if (!m->q35)
		return;
	free(m->q35->lo);
	free(m->q35->acts);
	free(m->q35);
	m->q35 = NULL;
}

/*
 * Context parallel (sl_cp_check calls this at the first context-parallel micro-batch): the
 * gated attention layers attend with model_cp.c's whole rows' k|v buffers; the Gated DeltaNet
 * layers pass their states and convolution edge rows from chunk to chunk through these.
 */
int sl_q35_cp_init(struct sl_model *m)
{
	struct sl_q35 *q = m->q35;
	const size_t e = m->be->elt, s = m->be->stat_elt, B = m->max_records;

	if (q->cp_s[0])
		return 0;
	for (int i = 0; i < 2; i++)
		q->cp_s[i] = sl_model_ws_alloc(m, B * q->nv * q->dk * q->dv, s);
	for (int i = 0; i < 4; i++)
		q->cp_e[i] = sl_model_ws_alloc(m, 2 * B * (q->K - 1) * q->P, e);
	return q->cp_e[3] ? 0 : -ENOMEM;
}

/* dst(n) = 1 + w(n): Qwen3.5's RMSNorm scale */
static void *eff_weight(const struct sl_model *m, void *dst, const void *w, size_t n)
{
	struct sl_backend *be = m->be;

	be->zero(be, dst, n * be->elt);
	be->add(be, dst, w, n);
	be->add(be, dst, m->q35->ones, n);
	return dst;
}

const void *sl_q35_final_norm(struct sl_model *m, const void *w)
{
	return eff_weight(m, m->q35->wfin, at(m, w, m->norm_off), m->H);
}

static struct q35_acts *acts_for(const struct sl_model *m, int l, bool keep)
{
	struct sl_q35 *q = m->q35;

	(void)keep;	/* every layer has its own activations unless checkpointing */
	if (m->ckpt)
		return &q->acts[q->lo[l].kind == SL_LAYER_GATED_ATTENTION ? 0 : 1];
	return &q->acts[l];
}

/* the sparse MLP's activations of layer l (one slot reused when checkpointing) */
static int moe_slot(const struct sl_model *m, int l)
{
	return m->ckpt ? 0 : l;
}

/* ---- forward ------------------------------------------------------------------------------- */

/* context parallel: rotary by position in the row, the rank's queries against whole rows' keys */
/* a->h = x + the gated attention of a->xn1 */
static void gated_attn_fwd(const struct sl_model *m, const struct q35_off *lo, const void *w,
			   struct q35_acts *a, const void *x, const struct sl_batch_dev *b)
{
	struct sl_backend *be = m->be;
	struct sl_q35 *q = m->q35;
	const struct sl_cp_batch *cp = b->cp;
	const int T = b->B * b->L;

	be->matmul_fwd(be, a->proj, a->xn1, at(m, w, lo->wqgkv), NULL, T, m->H, q->Pa);
	be->gattn_qk_fwd(be, a->qkvr, a->gate, a->rstd_o, a->proj,
			 eff_weight(m, q->wqn, at(m, w, lo->qn), m->hd),
			 eff_weight(m, q->wkn, at(m, w, lo->kn), m->hd), T, cp ? cp->L : b->L,
			 cp ? cp->pos : NULL, m->nh, m->nkv, m->hd, q->rot, m->eps, m->theta);
	/* packed rows are refused for this family (train.c): b->pos is NULL */
	if (cp)
		sl_cp_attend_fwd(m, a->o, a->lse, a->qkvr, b);
	else
		be->attention_fwd(be, a->o, a->lse, a->qkvr, b->lens, b->pos, b->B, b->L, m->nh,
				  m->nkv, m->hd);
	be->sigmoid_mul_fwd(be, a->y, a->o, a->gate, (size_t)T * m->nh * m->hd);
	be->matmul_fwd_res(be, a->h, a->y, at(m, w, lo->wo), x, T, m->nh * m->hd, m->H);
}

/*
 * Context parallel, Gated DeltaNet: the rank runs its own two chunks of each row (chunk rank,
 * "A", and chunk 2C-1-rank, "B", of L/(2C) tokens each; as 2B records for the per-token ops and
 * the convolution).  The convolution reads the K-1 rows before each chunk (its halo) from the
 * rank holding the previous chunk, and the delta rule's state passes from chunk to chunk: chunk
 * A of rank 0 starts from zero, hands its last state to rank 1's chunk A, ..., rank C-1 goes on
 * with its own chunk B (chunk C), which hands its state to rank C-2's chunk B, ..., rank 0's
 * chunk B (the last).  The backward passes the state's gradient the other way.  Every rank thus
 * does its own tokens' work only; the recurrence waits for its state, the rest runs in parallel.
 */

/* the last K-1 rows of each of the 2B chunks of x (rows of P) into q->cp_e[0] */
static void cp_tails(const struct sl_model *m, const void *x, int Lh, int B2)
{
	struct sl_backend *be = m->be;
	struct sl_q35 *q = m->q35;
	const int E = (q->K - 1) * q->P;

	be->copy_cols(be, q->cp_e[0], E, 0, x, Lh * q->P, (Lh - q->K + 1) * q->P, B2, E, false);
}

/*
 * dst (2B, K-1, P) = each chunk's rows from the neighbour chunk's: chunk A of a row from
 * @from_a's chunk A, chunk B from @from_b's chunk B (NULL: zero), with rank C-1's chunk B
 * (chunk C) taking its own chunk A's (@own).  Buffers hold the 2B chunks' rows as B rows of
 * 2 (K-1) P: A's then B's.
 */
static void cp_pick(const struct sl_model *m, void *dst, const void *from_a, const void *from_b,
		    const void *own, int own_col, int dst_col, int B)
{
	struct sl_backend *be = m->be;
	struct sl_q35 *q = m->q35;
	const int E = (q->K - 1) * q->P;

	be->zero(be, dst, (size_t)2 * B * E * be->elt);
	if (from_a)
		be->copy_cols(be, dst, 2 * E, 0, from_a, 2 * E, 0, B, E, false);
	if (from_b)
		be->copy_cols(be, dst, 2 * E, E, from_b, 2 * E, E, B, E, false);
	if (own)
		be->copy_cols(be, dst, 2 * E, dst_col * E, own, 2 * E, own_col * E, B, E, false);
}

/* the convolution's halo of the rank's chunks (from a->proj) in q->cp_e[1] */
static const void *cp_halo(const struct sl_model *m, const struct q35_acts *a,
			   const struct sl_batch_dev *b)
{
	struct sl_q35 *q = m->q35;
	const struct sl_context_comm *cc = b->cp->comm;
	const int r = cc->rank, C = cc->size, B = b->B, Lh = b->L / 2;
	const size_t bytes = (size_t)2 * B * (q->K - 1) * q->P * m->be->elt;

	if (Lh < q->K - 1) {	/* context.c pads rows to SL_CP_MIN_CHUNK tokens a chunk */
		fprintf(stderr, "model: context-parallel chunks of %d tokens are shorter than the "
			"convolution's %d edge rows\n", Lh, q->K - 1);
		abort();
	}
	cp_tails(m, a->proj, Lh, 2 * B);
	/* chunk A's edge rows go up to rank r+1's chunk A, chunk B's down to rank r-1's chunk B */
	cc->sendrecv(cc->ctx, q->cp_e[0], r + 1 < C ? r + 1 : -1, q->cp_e[2], r - 1, bytes);
	cc->sendrecv(cc->ctx, q->cp_e[0], r - 1, q->cp_e[3], r + 1 < C ? r + 1 : -1, bytes);
	cp_pick(m, q->cp_e[1], r > 0 ? q->cp_e[2] : NULL, r + 1 < C ? q->cp_e[3] : NULL,
		r + 1 == C ? q->cp_e[0] : NULL, 0, 1, B);
	return q->cp_e[1];
}

/*
 * The backward's halo gradient (q->cp_e[0], from the convolution's backward) goes back to the
 * ranks whose rows it is, and what comes back is added to the last K-1 rows of each chunk of
 * q->gproj
 */
static void cp_halo_grad(const struct sl_model *m, const struct sl_batch_dev *b)
{
	struct sl_backend *be = m->be;
	struct sl_q35 *q = m->q35;
	const struct sl_context_comm *cc = b->cp->comm;
	const int r = cc->rank, C = cc->size, B = b->B, Lh = b->L / 2, E = (q->K - 1) * q->P;
	const size_t bytes = (size_t)2 * B * E * be->elt;

	/* chunk A's halo came from rank r-1's chunk A, chunk B's from rank r+1's chunk B */
	cc->sendrecv(cc->ctx, q->cp_e[0], r - 1, q->cp_e[3], r + 1 < C ? r + 1 : -1, bytes);
	cc->sendrecv(cc->ctx, q->cp_e[0], r + 1 < C ? r + 1 : -1, q->cp_e[2], r - 1, bytes);
	cp_pick(m, q->cp_e[1], r + 1 < C ? q->cp_e[3] : NULL, r > 0 ? q->cp_e[2] : NULL,
		r + 1 == C ? q->cp_e[0] : NULL, 1, 0, B);
	be->copy_cols(be, q->gproj, Lh * q->P, (Lh - q->K + 1) * q->P, q->cp_e[1], E, 0, 2 * B, E,
		      true);
}

/* the delta rule's arguments for chunk @h (0: A, 1: B) of the rank's rows */
struct rule_args {
	void *o, *states;
	const void *qn, *kn, *v, *beta, *g;
	const int32_t *lens;
	int B, L, rs;
};

static struct rule_args rule_args(const struct sl_model *m, const struct q35_acts *a,
				  const struct sl_batch_dev *b, int h, void *o, const void *v)
{
	struct sl_q35 *q = m->q35;
	const size_t e = m->be->elt, s = m->be->stat_elt;
	const int Lh = b->cp ? b->L / 2 : b->L, nch = (Lh + 63) / 64;
	const size_t off = (size_t)h * Lh;	/* the chunk's first row */
	struct rule_args r = {
		.o = (char *)o + off * q->nv * q->dv * e,
		.states = (char *)a->states + (size_t)h * b->B * nch * q->nv * q->dk * q->dv * s,
		.qn = (char *)a->qn + off * q->nk * q->dk * e,
		.kn = (char *)a->kn + off * q->nk * q->dk * e,
		.v = (const char *)v + off * q->Cc * e,
		.beta = (char *)a->beta + off * q->nv * s,
		.g = (char *)a->g + off * q->nv * s,
		.lens = b->cp ? b->cp->clens + (size_t)h * b->B : b->lens,
		.B = b->B, .L = Lh, .rs = b->L,
	};
	return r;
}

static void rule_fwd(const struct sl_model *m, const struct q35_acts *a,
		     const struct sl_batch_dev *b, int h, const void *s0, void *s_end)
{
	struct sl_q35 *q = m->q35;
	const void *v = (char *)a->c + (size_t)2 * q->nk * q->dk * m->be->elt;
	struct rule_args r = rule_args(m, a, b, h, a->o, v);

	m->be->gdn_rule_fwd(m->be, r.o, r.states, r.qn, r.kn, r.v, q->Cc, r.beta, r.g, r.lens,
			    r.B, r.L, r.rs, q->nk, q->nv, q->dk, q->dv, s0, s_end);
}

static void rule_bwd(const struct sl_model *m, const struct q35_acts *a,
		     const struct sl_batch_dev *b, int h, const void *ds_end, void *ds0)
{
	struct sl_backend *be = m->be;
	struct sl_q35 *q = m->q35;
	const size_t e = be->elt, koff = (size_t)2 * q->nk * q->dk * e;
	/* r.o: the output's gradient (q->go) at the chunk */
	struct rule_args r = rule_args(m, a, b, h, q->go, (char *)a->c + koff);
	const size_t off = (size_t)h * r.L;	/* the chunk's first row */

	be->gdn_rule_bwd(be, (char *)q->gqn + off * q->nk * q->dk * e,
			 (char *)q->gkn + off * q->nk * q->dk * e, (char *)q->gc + koff + off *
			 q->Cc * e, (char *)q->gbeta + off * q->nv * e,
			 (char *)q->gg + off * q->nv * e, r.o, r.states, r.qn, r.kn, r.v, q->Cc,
			 r.beta, r.g, r.lens, r.B, r.L, r.rs, q->nk, q->nv, q->dk, q->dv, ds_end,
			 ds0);
}

/*
 * The delta rule over the rank's rows (@bwd: its backward).  Under context parallel chunk by
 * chunk: the state passes in row order (chunk A, chunk r, from rank r-1's chunk A and on to rank
 * r+1's; then chunk B, chunk 2C-1-r, from rank r+1's chunk B and on to rank r-1's, rank C-1
 * going on with its own chunk A's), its gradient the other way (chunk B first).  Both take the
 * same steps: from rank r-1, the first chunk, to and from rank r+1, the second, to rank r-1.
 */
static void gdn_relay(const struct sl_model *m, const struct q35_acts *a,
		      const struct sl_batch_dev *b, bool bwd)
{
	struct sl_q35 *q = m->q35;
	void (*step)(const struct sl_model *, const struct q35_acts *, const struct sl_batch_dev *,
		     int, const void *, void *) = bwd ? rule_bwd : rule_fwd;
	const struct sl_context_comm *cc;
	void *X = q->cp_s[0], *Y = q->cp_s[1];
	const int first = bwd ? 1 : 0;
	size_t bytes;
	int r, C;

	if (!b->cp) {
		step(m, a, b, 0, NULL, NULL);
		return;
	}
	cc = b->cp->comm;
	r = cc->rank;
	C = cc->size;
	bytes = (size_t)b->B * q->nv * q->dk * q->dv * m->be->stat_elt;
	cc->sendrecv(cc->ctx, NULL, -1, X, r - 1, bytes);
	step(m, a, b, first, r > 0 ? X : NULL, Y);
	if (r + 1 < C) {
		cc->sendrecv(cc->ctx, Y, r + 1, X, r + 1, bytes);
		step(m, a, b, 1 - first, X, Y);
	} else {	/* chunks C-1 and C are both this rank's */
		step(m, a, b, 1 - first, Y, X);
		Y = X;
	}
	cc->sendrecv(cc->ctx, Y, r - 1, NULL, -1, bytes);
}

/* a->h = x + the Gated DeltaNet of a->xn1 */
static void gdn_fwd(const struct sl_model *m, const struct q35_off *lo, const void *w,
		    struct q35_acts *a, const void *x, const struct sl_batch_dev *b)
{
	struct sl_backend *be = m->be;
	struct sl_q35 *q = m->q35;
	const int T = b->B * b->L, vd = q->nv * q->dv;
	char *proj = a->proj;

	be->matmul_fwd(be, a->proj, a->xn1, at(m, w, lo->win), NULL, T, m->H, q->P);
	/* context parallel: 2B records of L/2 (the rank's two chunks of each row) */
	be->conv1d_silu_fwd(be, a->c, a->cpre, a->proj, q->P, at(m, w, lo->conv), T,
			    b->cp ? b->L / 2 : b->L, q->Cc, q->K, b->cp ? cp_halo(m, a, b) : NULL);
	be->gdn_prep_fwd(be, a->qn, a->kn, a->rqk, a->beta, a->g, a->c,
			 proj + (size_t)(q->Cc + vd) * be->elt, q->P, at(m, w, lo->A_log),
			 at(m, w, lo->dt_bias), T, q->nk, q->nv, q->dk, q->dv);
	gdn_relay(m, a, b, false);
	be->gated_rmsnorm_fwd(be, a->y, a->rstd_o, a->o, proj + (size_t)q->Cc * be->elt, q->P,
			      at(m, w, lo->gnorm), T, q->nv, q->dv, m->eps);
	be->matmul_fwd_res(be, a->h, a->y, at(m, w, lo->wout), x, T, vd, m->H);
}

/* @full: also the MLP's down projection and the output (the backward's recompute needs neither) */
static void layer_fwd(struct sl_model *m, int l, const void *w, struct q35_acts *a, const void *x,
		      void *xout, const struct sl_batch_dev *b, bool full)
{
	struct sl_backend *be = m->be;
	struct sl_q35 *q = m->q35;
	const struct q35_off *lo = &q->lo[l];
	const int T = b->B * b->L, H = m->H;

	be->rmsnorm_fwd(be, a->xn1, a->rstd1, x, eff_weight(m, q->wn1, at(m, w, lo->ln1), H), T,
			H, m->eps);
	if (lo->kind == SL_LAYER_GATED_ATTENTION)
		gated_attn_fwd(m, lo, w, a, x, b);
	else
		gdn_fwd(m, lo, w, a, x, b);
	be->rmsnorm_fwd(be, a->xn2, a->rstd2, a->h, eff_weight(m, q->wn2, at(m, w, lo->ln2), H),
			T, H, m->eps);
	if (lo->moe) {
		sl_moe_mlp_fwd(m, l, w, moe_slot(m, l), a->xn2, a->h, xout, b, full);
		return;
	}
	be->matmul_fwd(be, a->gu, a->xn2, at(m, w, lo->wgu), NULL, T, H, 2 * m->I);
	be->swiglu_fwd(be, a->act, a->gu, T, m->I);
	if (!full)
		return;
	be->matmul_fwd_res(be, xout, a->act, at(m, w, lo->wd), a->h, T, m->I, H);
}

void sl_q35_layer_fwd(struct sl_model *m, int l, const void *w, const void *x, void *xout,
		      const struct sl_batch_dev *b, bool keep)
{
	layer_fwd(m, l, w, acts_for(m, l, keep), x, xout, b, true);
}

/* ---- backward ------------------------------------------------------------------------------ */

/* m->gx: gradient of the mixer's output (the residual h) in; m->gn: of xn1 out */
static void gated_attn_bwd(struct sl_model *m, const struct q35_off *lo, const void *w, void *g,
			   struct q35_acts *a, const struct sl_batch_dev *b)
{
	struct sl_backend *be = m->be;
	struct sl_q35 *q = m->q35;
	const struct sl_cp_batch *cp = b->cp;
	const int T = b->B * b->L, nd = m->nh * m->hd;

	be->matmul_bwd(be, q->gy, at(m, g, lo->wo), NULL, m->gx, a->y, at(m, w, lo->wo), T, nd,
		       m->H, false);
	be->sigmoid_mul_bwd(be, q->go, q->ggate, q->gy, a->o, a->gate, (size_t)T * nd);
	if (cp)
		sl_cp_attend_bwd(m, q->gqkvr, q->go, a->o, a->lse, a->qkvr, b);
	else
		be->attention_bwd(be, q->gqkvr, q->go, a->o, a->lse, a->qkvr, b->lens, b->pos,
				  b->B, b->L, m->nh, m->nkv, m->hd);
	be->gattn_qk_bwd(be, q->gproj, at(m, g, lo->qn), at(m, g, lo->kn), q->gqkvr, q->ggate,
			 a->proj, eff_weight(m, q->wqn, at(m, w, lo->qn), m->hd),
			 eff_weight(m, q->wkn, at(m, w, lo->kn), m->hd), a->rstd_o, T,
			 cp ? cp->L : b->L, cp ? cp->pos : NULL, m->nh, m->nkv, m->hd, q->rot,
			 m->eps, m->theta);
	be->matmul_bwd(be, m->gn, at(m, g, lo->wqgkv), NULL, q->gproj, a->xn1,
		       at(m, w, lo->wqgkv), T, m->H, q->Pa, false);
}

static void gdn_bwd(struct sl_model *m, const struct q35_off *lo, const void *w, void *g,
		    struct q35_acts *a, const struct sl_batch_dev *b)
{
	struct sl_backend *be = m->be;
	struct sl_q35 *q = m->q35;
	const int T = b->B * b->L, vd = q->nv * q->dv;
	const size_t e = be->elt;
	char *proj = a->proj, *gproj = q->gproj;
	const void *halo = NULL;

	be->matmul_bwd(be, q->gy, at(m, g, lo->wout), NULL, m->gx, a->y, at(m, w, lo->wout), T,
		       vd, m->H, false);
	be->gated_rmsnorm_bwd(be, q->go, gproj + (size_t)q->Cc * e, q->P, at(m, g, lo->gnorm),
			      q->gy, a->o, proj + (size_t)q->Cc * e, at(m, w, lo->gnorm),
			      a->rstd_o, T, q->nv, q->dv, m->eps);
	gdn_relay(m, a, b, true);
	be->gdn_prep_bwd(be, q->gc, gproj + (size_t)(q->Cc + vd) * e, q->P,
			 at(m, g, lo->A_log), at(m, g, lo->dt_bias), q->gqn, q->gkn, q->gbeta,
			 q->gg, a->c, proj + (size_t)(q->Cc + vd) * e, a->rqk, a->beta, a->g,
			 at(m, w, lo->A_log), at(m, w, lo->dt_bias), T, q->nk, q->nv, q->dk,
			 q->dv);
	if (b->cp) {	/* the halo again (nothing of it is kept), and room for its gradient */
		halo = cp_halo(m, a, b);
		be->zero(be, q->cp_e[0], (size_t)2 * b->B * (q->K - 1) * q->P * e);
	}
	be->conv1d_silu_bwd(be, q->gproj, q->P, at(m, g, lo->conv), q->gc, a->proj, a->cpre,
			    at(m, w, lo->conv), T, b->cp ? b->L / 2 : b->L, q->Cc, q->K, halo,
			    b->cp ? q->cp_e[0] : NULL);
	if (b->cp)
		cp_halo_grad(m, b);
	be->matmul_bwd(be, m->gn, at(m, g, lo->win), NULL, q->gproj, a->xn1, at(m, w, lo->win),
		       T, m->H, q->P, false);
}

void sl_q35_layer_bwd(struct sl_model *m, int l, const void *w, void *g, const void *x,
		      const struct sl_batch_dev *b)
{
	struct sl_backend *be = m->be;
	struct sl_q35 *q = m->q35;
	const struct q35_off *lo = &q->lo[l];
	struct q35_acts *a = acts_for(m, l, true);
	const int T = b->B * b->L, H = m->H;

	if (m->ckpt)
		layer_fwd(m, l, w, a, x, NULL, b, false);

	/* MLP: x' = h + down(act); the residual passes gx through to h unchanged */
	if (lo->moe) {
		sl_moe_mlp_bwd(m, l, w, g, moe_slot(m, l), a->xn2, b);
	} else {
		be->matmul_bwd(be, m->gb2, at(m, g, lo->wd), NULL, m->gx, a->act,
			       at(m, w, lo->wd), T, m->I, H, false);
		be->swiglu_bwd(be, m->gb1, m->gb2, a->gu, T, m->I);
		be->matmul_bwd(be, m->gn, at(m, g, lo->wgu), NULL, m->gb1, a->xn2,
			       at(m, w, lo->wgu), T, H, 2 * m->I, false);
	}
	be->rmsnorm_bwd(be, m->gx, at(m, g, lo->ln2), m->gn, a->h,
			eff_weight(m, q->wn2, at(m, w, lo->ln2), H), a->rstd2, T, H, true);

	if (lo->kind == SL_LAYER_GATED_ATTENTION)
		gated_attn_bwd(m, lo, w, g, a, b);
	else
		gdn_bwd(m, lo, w, g, a, b);
	be->rmsnorm_bwd(be, m->gx, at(m, g, lo->ln1), m->gn, x,
			eff_weight(m, q->wn1, at(m, w, lo->ln1), H), a->rstd1, T, H, true);
}

double sl_model_mixer_flops(const struct sl_model_config *mc, double n)
{
	double f = 0;

	for (int l = 0; l < mc->n_layers; l++) {
		if (mc->layer_kind && mc->layer_kind[l] == SL_LAYER_LINEAR_ATTENTION)
			f += 3 * 3 * 2.0 * mc->lin_dk * mc->lin_dv * mc->lin_nv * n;
		else
			f += 3 * 4.0 * mc->head_dim * mc->n_heads * n * (n + 1) / 2;
	}
	return f;
}
