/*
 * model: the Qwen3 dense classification model (Hugging Face Qwen3ForSequenceClassification).
 *
 * Owns the parameter layout (units, HF names, offsets inside a unit) and the forward and backward
 * pass of one micro-batch, written once against struct sl_backend: no arithmetic on buffers here,
 * every element size comes from the backend, so the same code runs on the fp32 and double cpu
 * backends and on the bf16 cuda one.  With activation checkpointing only each layer's input is
 * kept through the forward; the backward recomputes the layer (same ops, same inputs, so the same
 * values) right before differentiating it.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model_impl.h"


static size_t align_up(size_t n)
{
	return (n + SL_ALIGN - 1) / SL_ALIGN * SL_ALIGN;
}

/* ---- layout ------------------------------------------------------------------------------ */

int sl_layout_add(struct layout_builder *lb, bool fused_next, const char *name, int ndim,
		  int64_t d0, int64_t d1, enum sl_init init)
{
	struct sl_layout *lay = lb->lay;
	struct sl_tensor_info *ti;

	if (lay->n_tensors == lb->cap) {
		int cap = lb->cap ? 2 * lb->cap : 64;
		struct sl_tensor_info *t = realloc(lay->t, (size_t)cap * sizeof(*t));

		if (!t)
			return -ENOMEM;
		lay->t = t;
		lb->cap = cap;
	}
	if (!fused_next)
		lb->off = align_up(lb->off);
	ti = &lay->t[lay->n_tensors++];
	memset(ti, 0, sizeof(*ti));
	snprintf(ti->name, sizeof(ti->name), "%s", name);
	ti->unit = lb->unit;
	ti->offset = lb->off;
	ti->ndim = ndim;
	ti->shape[0] = d0;
	ti->shape[1] = ndim == 2 ? d1 : 0;
	ti->numel = (size_t)d0 * (ndim == 2 ? (size_t)d1 : 1);
	ti->decay = ndim >= 2;
	ti->init = init;
	lb->off += ti->numel;
	return 0;
}

int sl_layout_add_layer(struct layout_builder *lb, int l, bool fused_next, const char *suffix,
			int ndim, int64_t d0, int64_t d1, enum sl_init init)
{
	char n[160];

	snprintf(n, sizeof(n), "model.layers.%d.%s", l, suffix);
	return sl_layout_add(lb, fused_next, n, ndim, d0, d1, init);
}

static void lb_end_unit(struct layout_builder *lb)
{
	lb->lay->unit_numel[lb->unit] = align_up(lb->off);
	lb->lay->total_numel += lb->lay->unit_numel[lb->unit];
	lb->unit++;
	lb->off = 0;
}

static int layout_layer(struct layout_builder *lb, const struct sl_model_config *mc, int l)
{
	const int64_t H = mc->hidden, hd = mc->head_dim, I = mc->intermediate;
	const int64_t qd = (int64_t)mc->n_heads * hd, kvd = (int64_t)mc->n_kv_heads * hd;
	int rc = 0;

	LAYER_ADD(false, "input_layernorm.weight", 1, H, 0, SL_INIT_ONES);
	LAYER_ADD(false, "self_attn.q_proj.weight", 2, qd, H, SL_INIT_NORMAL);
	LAYER_ADD(true, "self_attn.k_proj.weight", 2, kvd, H, SL_INIT_NORMAL);
	LAYER_ADD(true, "self_attn.v_proj.weight", 2, kvd, H, SL_INIT_NORMAL);
	if (mc->attention_bias) {
		LAYER_ADD(false, "self_attn.q_proj.bias", 1, qd, 0, SL_INIT_ZEROS);
		LAYER_ADD(true, "self_attn.k_proj.bias", 1, kvd, 0, SL_INIT_ZEROS);
		LAYER_ADD(true, "self_attn.v_proj.bias", 1, kvd, 0, SL_INIT_ZEROS);
	}
	LAYER_ADD(false, "self_attn.o_proj.weight", 2, H, qd, SL_INIT_NORMAL);
	if (mc->attention_bias)
		LAYER_ADD(false, "self_attn.o_proj.bias", 1, H, 0, SL_INIT_ZEROS);
	LAYER_ADD(false, "self_attn.q_norm.weight", 1, hd, 0, SL_INIT_ONES);
	LAYER_ADD(false, "self_attn.k_norm.weight", 1, hd, 0, SL_INIT_ONES);
	LAYER_ADD(false, "post_attention_layernorm.weight", 1, H, 0, SL_INIT_ONES);
	if (sl_layer_is_moe(mc, l))
		return sl_moe_layout(lb, mc, l);
	LAYER_ADD(false, "mlp.gate_proj.weight", 2, I, H, SL_INIT_NORMAL);
	LAYER_ADD(true, "mlp.up_proj.weight", 2, I, H, SL_INIT_NORMAL);
	LAYER_ADD(false, "mlp.down_proj.weight", 2, H, I, SL_INIT_NORMAL);
	return rc;
}

int sl_model_layout(const struct sl_model_config *mc, int task, struct sl_layout *lay)
{
	struct layout_builder lb = { .lay = lay };
	struct sl_tensor_info *head;
	int rc;

	memset(lay, 0, sizeof(*lay));
	if (task != 0 && task != 1) {
		fprintf(stderr, "model: unknown task %d\n", task);
		return -EINVAL;
	}
	if (mc->n_layers < 0 || mc->num_labels < 1 || mc->head_dim % 2) {
		fprintf(stderr, "model: bad config (layers %d, num_labels %d, head_dim %d)\n",
			mc->n_layers, mc->num_labels, mc->head_dim);
		return -EINVAL;
	}
	/* embedding, layers, head, then the experts of each MoE layer (model_moe.c) */
	lay->n_units = mc->n_layers + 2;
	for (int l = 0; l < mc->n_layers; l++)
		lay->n_units += sl_layer_is_moe(mc, l);
	lay->unit_numel = calloc((size_t)lay->n_units, sizeof(*lay->unit_numel));
	lay->unit_experts = calloc((size_t)lay->n_units, sizeof(*lay->unit_experts));
	if (!lay->unit_numel || !lay->unit_experts) {
		sl_layout_free(lay);
		return -ENOMEM;
	}

	rc = sl_layout_add(&lb, false, "model.embed_tokens.weight", 2, mc->vocab, mc->hidden,
		    SL_INIT_NORMAL);
	if (rc)
		goto out_free_layout;
	lb_end_unit(&lb);
	for (int l = 0; l < mc->n_layers; l++) {
		/* configs built in code may leave layer_kind NULL: all Qwen3 layers then */
		rc = !mc->layer_kind || mc->layer_kind[l] == SL_LAYER_FULL_ATTENTION ?
			     layout_layer(&lb, mc, l) : sl_q35_layout_layer(&lb, mc, l);
		if (rc)
			goto out_free_layout;
		lb_end_unit(&lb);
	}
	rc = sl_layout_add(&lb, false, "model.norm.weight", 1, mc->hidden, 0, SL_INIT_ONES);
	if (rc)
		goto out_free_layout;
	if (task == 0) {
		/* a causal-LM checkpoint has no score head: it starts freshly initialized */
		rc = sl_layout_add(&lb, false, "score.weight", 2, mc->num_labels, mc->hidden,
			    SL_INIT_NORMAL);
		if (rc)
			goto out_free_layout;
		head = &lay->t[lay->n_tensors - 1];
		head->head = true;
		head->optional = true;
	} else if (!mc->tie_word_embeddings) {
		/* tied: the head is the embedding table of unit 0, no tensor of its own */
		rc = sl_layout_add(&lb, false, "lm_head.weight", 2, mc->vocab, mc->hidden,
			    SL_INIT_NORMAL);
		if (rc)
			goto out_free_layout;
		lay->t[lay->n_tensors - 1].head = true;
	}
	lb_end_unit(&lb);
	for (int l = 0; l < mc->n_layers; l++) {
		if (!sl_layer_is_moe(mc, l))
			continue;
		lay->unit_experts[lb.unit] = mc->n_experts;
		rc = sl_moe_layout_experts(&lb, mc, l);
		if (rc)
			goto out_free_layout;
		lb_end_unit(&lb);
	}
	return 0;

out_free_layout:
	sl_layout_free(lay);
	return rc;
}

void sl_layout_free(struct sl_layout *lay)
{
	free(lay->t);
	free(lay->unit_numel);
	free(lay->unit_experts);
	memset(lay, 0, sizeof(*lay));
}

const struct sl_tensor_info *sl_layout_find(const struct sl_layout *lay, const char *name)
{
	for (int i = 0; i < lay->n_tensors; i++)
		if (!strcmp(lay->t[i].name, name))
			return &lay->t[i];
	return NULL;
}

double sl_model_matmul_params(const struct sl_model_config *mc, const struct sl_layout *lay)
{
	double n = 0;

	/* a token multiplies by top_k of the n_experts experts: count the active ones */
	for (int i = 0; i < lay->n_tensors; i++)
		/* active parameters: an expert's matrices count for top_k / n_experts of the
		 * tokens; a Conv1d weight is no matrix multiply */
		if (lay->t[i].ndim == 2 && lay->t[i].unit != 0 && !lay->t[i].unsqueeze1)
			n += (double)lay->t[i].numel * (strstr(lay->t[i].name, ".mlp.experts.") ?
				(double)mc->top_k / mc->n_experts : 1.0);
	return n;
}

/* ---- model ------------------------------------------------------------------------------- */

void *sl_model_ws_alloc(struct sl_model *m, size_t n, size_t elt)
{
	void *p;

	if (m->n_bufs == m->cap_bufs) {
		int cap = m->cap_bufs ? 2 * m->cap_bufs : 64;
		void **b = realloc(m->bufs, (size_t)cap * sizeof(*b));

		if (!b)
			return NULL;
		m->bufs = b;
		m->cap_bufs = cap;
	}
	p = m->be->alloc(m->be, n * elt);
	m->bufs[m->n_bufs++] = p;
	m->ws_bytes += n * elt;
	return p;
}

static const struct sl_tensor_info *find_layer_tensor(const struct sl_layout *lay, int l,
						      const char *suffix)
{
	char n[160];
	const struct sl_tensor_info *ti;

	snprintf(n, sizeof(n), "model.layers.%d.%s", l, suffix);
	ti = sl_layout_find(lay, n);
	if (!ti)
		fprintf(stderr, "model: layout has no tensor %s\n", n);
	else if (ti->unit != 1 + l)
		fprintf(stderr, "model: tensor %s is in unit %d, expected %d\n", n, ti->unit,
			1 + l);
	return ti && ti->unit == 1 + l ? ti : NULL;
}

/* offset of the first tensor of a fused group, checking the others follow it without a gap */
static int fused_off(const struct sl_layout *lay, int l, const char *const *names, int n,
		     size_t *off)
{
	size_t next = 0;

	for (int i = 0; i < n; i++) {
		const struct sl_tensor_info *ti = find_layer_tensor(lay, l, names[i]);

		if (!ti)
			return -EINVAL;
		if (i == 0) {
			*off = ti->offset;
		} else if (ti->offset != next) {
			fprintf(stderr, "model: layer %d: %s does not follow %s contiguously\n", l,
				names[i], names[i - 1]);
			return -EINVAL;
		}
		next = ti->offset + ti->numel;
	}
	return 0;
}

static int layer_offsets(const struct sl_layout *lay, int l, bool bias, bool moe,
			 struct layer_off *lo)
{
	static const char *const wqkv[] = { "self_attn.q_proj.weight", "self_attn.k_proj.weight",
					    "self_attn.v_proj.weight" };
	static const char *const bqkv[] = { "self_attn.q_proj.bias", "self_attn.k_proj.bias",
					    "self_attn.v_proj.bias" };
	static const char *const wgu[] = { "mlp.gate_proj.weight", "mlp.up_proj.weight" };
	static const char *const ln1[] = { "input_layernorm.weight" };
	static const char *const wo[] = { "self_attn.o_proj.weight" };
	static const char *const bo[] = { "self_attn.o_proj.bias" };
	static const char *const qn[] = { "self_attn.q_norm.weight" };
	static const char *const kn[] = { "self_attn.k_norm.weight" };
	static const char *const ln2[] = { "post_attention_layernorm.weight" };
	static const char *const wd[] = { "mlp.down_proj.weight" };
	int rc;

	lo->bqkv = lo->bo = lo->wr = lo->wegu = lo->wed = lo->wgu = lo->wd = NO_OFF;
	rc = fused_off(lay, l, wqkv, 3, &lo->wqkv);
	if (moe)
		rc = rc ? rc : sl_moe_offsets(lay, l, lo);
	else
		rc = rc ? rc : fused_off(lay, l, wgu, 2, &lo->wgu);
	rc = rc ? rc : fused_off(lay, l, ln1, 1, &lo->ln1);
	rc = rc ? rc : fused_off(lay, l, wo, 1, &lo->wo);
	rc = rc ? rc : fused_off(lay, l, qn, 1, &lo->qn);
	rc = rc ? rc : fused_off(lay, l, kn, 1, &lo->kn);
	rc = rc ? rc : fused_off(lay, l, ln2, 1, &lo->ln2);
	if (!moe)
		rc = rc ? rc : fused_off(lay, l, wd, 1, &lo->wd);
	if (bias) {
		rc = rc ? rc : fused_off(lay, l, bqkv, 3, &lo->bqkv);
		rc = rc ? rc : fused_off(lay, l, bo, 1, &lo->bo);
	}
	return rc;
}

/*
 * A layer's activations, carved from one block (a->block, a->bytes) so that the block, dead
 * from the end of the layer's backward to the next forward, can hold the layer unit's reduced
 * gradient (sl_model_grad_room).  Each part rounds up to the backend's granularity, as a block
 * of its own would (plan.c counts them so).
 */
static void *carve(char *base, size_t *at, size_t n, size_t elt, size_t align)
{
	void *p = base ? base + *at : NULL;

	*at += (n * elt + align - 1) / align * align;
	return p;
}

static int alloc_acts(struct sl_model *m, struct acts *a, size_t T)
{
	const size_t e = m->be->elt, s = m->be->stat_elt, al = m->be->align;
	const bool mlp = m->dense_mlp;	/* all MLPs sparse: no dense activations */
	char *b = NULL;			/* the first pass sizes the block */

	for (int pass = 0; pass < 2; pass++) {
		size_t at = 0;

		a->xn1 = carve(b, &at, T * m->H, e, al);
		a->rstd1 = carve(b, &at, T, s, al);
		a->qkv = carve(b, &at, T * m->Q, e, al);
		a->qkvr = carve(b, &at, T * m->Q, e, al);
		a->rstd_qk = carve(b, &at, T * (m->nh + m->nkv), s, al);
		a->att = carve(b, &at, T * m->nh * m->hd, e, al);
		a->lse = carve(b, &at, T * m->nh, s, al);
		a->h = carve(b, &at, T * m->H, e, al);
		a->xn2 = carve(b, &at, T * m->H, e, al);
		a->rstd2 = carve(b, &at, T, s, al);
		a->gu = mlp ? carve(b, &at, T * 2 * m->I, e, al) : NULL;
		a->act = mlp ? carve(b, &at, T * m->I, e, al) : NULL;
		if (pass == 0 && !(b = a->block = sl_model_ws_alloc(m, a->bytes = at, 1)))
			return -ENOMEM;
	}
	return 0;
}

static size_t zmax(size_t a, size_t b)
{
	return a > b ? a : b;
}

struct sl_model *sl_model_create(const struct sl_model_config *mc, const struct sl_layout *lay,
				 struct sl_backend *be, int max_tokens, int max_records,
				 bool activation_checkpointing)
{
	struct sl_model *m;
	const struct sl_tensor_info *norm, *score, *lm;
	size_t T = (size_t)max_tokens, B = (size_t)max_records;

	if (max_tokens < 1 || max_records < 1 || mc->n_kv_heads < 1 ||
	    mc->n_heads % mc->n_kv_heads || mc->head_dim % 2) {
		fprintf(stderr, "model: bad shapes (tokens %d, records %d, heads %d/%d, hd %d)\n",
			max_tokens, max_records, mc->n_heads, mc->n_kv_heads, mc->head_dim);
		return NULL;
	}
	{
		int nu = mc->n_layers + 2;

		for (int l = 0; l < mc->n_layers; l++)
			nu += sl_layer_is_moe(mc, l);
		if (lay->n_units != nu) {
			fprintf(stderr, "model: layout has %d units, the config's %d layers need %d\n",
				lay->n_units, mc->n_layers, nu);
			return NULL;
		}
	}
	m = calloc(1, sizeof(*m));
	if (!m)
		return NULL;
	m->be = be;
	m->max_tokens = max_tokens;
	m->max_records = max_records;
	m->ckpt = activation_checkpointing;
	m->V = mc->vocab;
	m->H = mc->hidden;
	m->nh = mc->n_heads;
	m->nkv = mc->n_kv_heads;
	m->hd = mc->head_dim;
	m->I = mc->intermediate;
	m->Q = (m->nh + 2 * m->nkv) * m->hd;
	m->nL = mc->n_layers;
	m->eps = (float)mc->rms_eps;
	m->theta = (float)mc->rope_theta;
	m->bias = mc->attention_bias;
	m->aux_coef = mc->router_aux_loss_coef;

	m->lo = calloc((size_t)m->nL + 1, sizeof(*m->lo));
	m->x = calloc((size_t)m->nL + 1, sizeof(*m->x));
	m->n_acts = m->ckpt ? 1 : m->nL;
	m->acts = calloc((size_t)m->n_acts + 1, sizeof(*m->acts));
	if (!m->lo || !m->x || !m->acts)
		goto out_free_model;
	if (mc->norm_offset) {
		if (sl_q35_init(m, mc, lay))
			goto out_free_model;
		m->n_acts = 0;
	}
	for (int l = 0; l < m->nL && !m->q35; l++) {
		if (layer_offsets(lay, l, m->bias, sl_layer_is_moe(mc, l), &m->lo[l]))
			goto out_free_model;
		m->dense_mlp |= !sl_layer_is_moe(mc, l);
	}
	{
		const char *e = getenv("SHARDLM_PRUNE_LAST");

		m->prune_ok = !m->q35 && m->nL > 0 && m->lo[m->nL - 1].wgu != NO_OFF &&
			!(e && !strcmp(e, "0"));
		m->prune_attn_ok = m->prune_ok && !(e && !strcmp(e, "1")) &&
			be->cp_attention_fwd && be->cp_attention_bwd &&
			(!be->cp_attention_takes || be->cp_attention_takes(m->hd));
	}
	norm = sl_layout_find(lay, "model.norm.weight");
	score = sl_layout_find(lay, "score.weight");
	lm = sl_layout_find(lay, "lm_head.weight");
	m->sft = !score;
	m->tied = m->sft && !lm;
	if (!norm || norm->unit != m->nL + 1 || (score && score->unit != m->nL + 1) ||
	    (lm && lm->unit != m->nL + 1) || (m->tied && !mc->tie_word_embeddings)) {
		fprintf(stderr, "model: layout lacks model.norm.weight and score.weight or "
			"lm_head.weight in unit %d\n", m->nL + 1);
		goto out_free_model;
	}
	if (!m->sft && mc->num_labels != 1) {
		fprintf(stderr, "model: the classification head needs num_labels 1, not %d\n",
			mc->num_labels);
		goto out_free_model;
	}
	m->norm_off = norm->offset;
	m->score_off = score ? score->offset : NO_OFF;
	m->lm_off = lm ? lm->offset : NO_OFF;
	if (m->sft) {
		/* the head sees up to every token; logits in chunks of at most ~256 MiB */
		size_t rows = ((size_t)256 << 20) / ((size_t)m->V * be->elt);

		B = T;
		m->chunk = (int)(rows < 64 ? 64 : rows > T ? T : rows);
		m->lg = sl_model_ws_alloc(m, (size_t)m->chunk * m->V, be->elt);
		m->row_loss = sl_model_ws_alloc(m, (size_t)m->chunk, sizeof(float));
	}

	for (int l = 0; l <= m->nL; l++)
		if (!(m->x[l] = sl_model_ws_alloc(m, T * m->H, be->elt)))
			goto out_free_model;
	for (int i = 0; i < m->n_acts; i++)
		if (alloc_acts(m, &m->acts[i], T))
			goto out_free_model;
	m->gx = sl_model_ws_alloc(m, T * m->H, be->elt);
	m->gn = sl_model_ws_alloc(m, T * m->H, be->elt);
	m->gb1 = sl_model_ws_alloc(m, T * zmax(2 * (size_t)m->I, m->Q), be->elt);
	m->gb2 = sl_model_ws_alloc(m, T * zmax(zmax(m->I, m->Q), (size_t)m->nh * m->hd), be->elt);
	m->xl = sl_model_ws_alloc(m, B * m->H, be->elt);
	m->xnf = sl_model_ws_alloc(m, B * m->H, be->elt);
	m->rstdf = sl_model_ws_alloc(m, B, be->stat_elt);
	m->logits = sl_model_ws_alloc(m, B, be->elt);
	m->dlogits = sl_model_ws_alloc(m, B, be->elt);
	m->gxnf = sl_model_ws_alloc(m, B * m->H, be->elt);
	m->gxl = sl_model_ws_alloc(m, B * m->H, be->elt);
	m->loss_dev = sl_model_ws_alloc(m, 1, sizeof(double));
	m->scores_f32 = sl_model_ws_alloc(m, B, sizeof(float));
	m->prune_q = sl_model_ws_alloc(m, B, sizeof(int32_t));
	m->prune_q_host = malloc(B * sizeof(int32_t));
	if (!m->scores_f32 || !m->prune_q || !m->prune_q_host || sl_moe_create(m, mc))
		goto out_free_model;
	return m;

out_free_model:
	sl_model_destroy(m);
	return NULL;
}

void sl_model_destroy(struct sl_model *m)
{
	if (!m)
		return;
	sl_moe_destroy(m);
	sl_q35_free(m);
	for (int i = 0; i < m->n_bufs; i++)
		m->be->free(m->be, m->bufs[i]);
	free(m->bufs);
	free(m->acts);
	free(m->x);
	free(m->lo);
	free(m->prune_q_host);
	free(m);
}

size_t sl_model_workspace_bytes(const struct sl_model *m)
{
	return m->ws_bytes;
}

static int check_batch(const struct sl_model *m, const struct sl_batch_dev *b, bool train)
{
	if (b->B < 1 || b->L < 1 || b->B > m->max_records ||
	    (size_t)b->B * b->L > (size_t)m->max_tokens) {
		fprintf(stderr, "model: micro-batch of %d x %d tokens exceeds the workspace "
			"(%d records, %d tokens)\n", b->B, b->L, m->max_records, m->max_tokens);
		return -EINVAL;
	}
	if (train && !m->sft && !b->labels) {
		fprintf(stderr, "model: training micro-batch without labels\n");
		return -EINVAL;
	}
	if (m->sft && (b->n_tgt < 0 || b->n_tgt > b->B * b->L || (b->n_tgt && !b->tgt_pos))) {
		fprintf(stderr, "model: sft micro-batch with %d targets for %d x %d tokens\n",
			b->n_tgt, b->B, b->L);
		return -EINVAL;
	}
	return 0;
}

/* classify: the head's rows, one per record whose last token is in the micro-batch */
static int head_rows(const struct sl_batch_dev *b)
{
	return b->cp ? b->cp->n_last : b->B;
}

static void release(void (*hook)(void *, int), void *ctx, int unit)
{
	if (hook)
		hook(ctx, unit);
}

/* elements from a scratch buffer's start to where its next part may begin (8-aligned) */
static size_t part_at(size_t n)
{
	return (n + 7) / 8 * 8;
}

/*
 * The last layer's attention part with the head's rows as its only queries (m->prune_attn): every
 * token's k|v (projection, k norm, rotary), the n rows' q|k|v (the context-parallel attention
 * reads the q heads of (n, Q) rows), then the rows' attention against every token's keys.  Kept
 * for the backward: a->xn1 (every token); in a->qkv, a->qkvr and a->rstd_qk every token's k|v
 * (T, KW) and its rstd (T, nkv), then the rows' q|k|v (n, Q) and rstd (n, nh + nkv); the rows'
 * attention output in a->att (n, A) and a->lse (n, nh).  Scratch: m->gb1 (the rows' inputs).
 */
struct rows_part {
	void *kv, *kvr, *rk, *qkv, *qkvr, *rq;
};

static struct rows_part rows_part(const struct sl_model *m, const struct acts *a, int T)
{
	const size_t e = m->be->elt, s = m->be->stat_elt, KW = 2 * (size_t)m->nkv * m->hd;
	const size_t o = part_at(T * KW) * e;

	return (struct rows_part){
		.kv = a->qkv, .kvr = a->qkvr, .rk = a->rstd_qk,
		.qkv = (char *)a->qkv + o, .qkvr = (char *)a->qkvr + o,
		.rq = (char *)a->rstd_qk + part_at((size_t)T * m->nkv) * s,
	};
}

static void attention_rows_fwd(const struct sl_model *m, int l, const void *w,
			       const struct acts *a, const void *x, const struct sl_batch_dev *b)
{
	struct sl_backend *be = m->be;
	const struct layer_off *lo = &m->lo[l];
	const int T = b->B * b->L, H = m->H, n = m->prune_n, A = m->nh * m->hd;
	const int KW = 2 * m->nkv * m->hd;
	const struct rows_part r = rows_part(m, a, T);
	const size_t kvw = lo->wqkv + (size_t)A * H;	/* k_proj's rows, then v_proj's */

	be->rmsnorm_fwd(be, a->xn1, a->rstd1, x, at(m, w, lo->ln1), T, H, m->eps);
	be->matmul_fwd(be, r.kv, a->xn1, at(m, w, kvw),
		       lo->bqkv == NO_OFF ? NULL : at(m, w, lo->bqkv + A), T, H, KW);
	be->gather_rows(be, m->gb1, a->xn1, m->prune_idx, n, H);
	be->matmul_fwd(be, r.qkv, m->gb1, at(m, w, lo->wqkv), at_opt(m, w, lo->bqkv), n, H, m->Q);
	be->qk_norm_rope_fwd(be, r.kvr, r.rk, r.kv, at(m, w, lo->qn), at(m, w, lo->kn), T, b->L,
			     NULL, 0, m->nkv, m->hd, m->eps, m->theta);
	be->qk_norm_rope_fwd(be, r.qkvr, r.rq, r.qkv, at(m, w, lo->qn), at(m, w, lo->kn), n,
			     b->L, m->prune_q, m->nh, m->nkv, m->hd, m->eps, m->theta);
	be->cp_attention_fwd(be, a->att, a->lse, r.qkvr, r.kvr, m->prune_q, m->prune_q, b->lens,
			     b->B, 1, b->L, m->nh, m->nkv, m->hd, 0, 1, 0);
}

/*
 * attention_rows_fwd's backward: m->gn's first prune_n rows = the gradient of the rows'
 * attention output in; grads g of the unit +=, m->gx += the gradient of x.  Scratch: m->gb2
 * (every token's d(k|v) and the rows' d(q|k|v), then the rows' inputs and their gradient),
 * m->gb1 (the same before the norms), m->gn.
 */
static void attention_rows_bwd(const struct sl_model *m, int l, const void *w, void *g,
			       const struct acts *a, const void *x, const struct sl_batch_dev *b)
{
	struct sl_backend *be = m->be;
	const struct layer_off *lo = &m->lo[l];
	const int T = b->B * b->L, H = m->H, n = m->prune_n, A = m->nh * m->hd;
	const int KW = 2 * m->nkv * m->hd;
	const size_t e = be->elt, kvw = lo->wqkv + (size_t)A * H;
	const struct rows_part r = rows_part(m, a, T);
	void *dkv = m->gb2, *dq = (char *)m->gb2 + part_at((size_t)T * KW) * e;
	void *dqn = m->gb1, *dkvn = (char *)m->gb1 + part_at((size_t)n * m->Q) * e;
	void *xr = m->gb2, *dxr = (char *)m->gb2 + part_at((size_t)n * H) * e;

	/* dq: the rows' d(q|k|v) (k|v columns zero); dkv: every token's d(k|v) */
	be->cp_attention_bwd(be, dq, dkv, m->gn, a->att, a->lse, r.qkvr, r.kvr, m->prune_q,
			     m->prune_q, b->lens, b->B, 1, b->L, m->nh, m->nkv, m->hd);
	be->qk_norm_rope_bwd(be, dqn, at(m, g, lo->qn), at(m, g, lo->kn), dq, r.qkv,
			     at(m, w, lo->qn), at(m, w, lo->kn), r.rq, n, b->L, m->prune_q, m->nh,
			     m->nkv, m->hd, m->eps, m->theta);
	be->qk_norm_rope_bwd(be, dkvn, at(m, g, lo->qn), at(m, g, lo->kn), dkv, r.kv,
			     at(m, w, lo->qn), at(m, w, lo->kn), r.rk, T, b->L, NULL, 0, m->nkv,
			     m->hd, m->eps, m->theta);
	/* every token's input gradient from k|v, the rows' from their q|k|v added at their rows */
	be->matmul_bwd(be, m->gn, at(m, g, kvw), lo->bqkv == NO_OFF ? NULL : at(m, g, lo->bqkv + A),
		       dkvn, a->xn1, at(m, w, kvw), T, H, KW, false);
	be->gather_rows(be, xr, a->xn1, m->prune_idx, n, H);
	be->matmul_bwd(be, dxr, at(m, g, lo->wqkv), lo->bqkv == NO_OFF ? NULL : at(m, g, lo->bqkv),
		       dqn, xr, at(m, w, lo->wqkv), n, H, m->Q, false);
	be->scatter_add_rows(be, m->gn, dxr, m->prune_idx, n, H);
	be->rmsnorm_bwd(be, m->gx, at(m, g, lo->ln1), m->gn, x, at(m, w, lo->ln1), a->rstd1, T, H,
			true);
}

/* decoder layer l's input norm, q/k/v projection, q/k norm, rotary and attention: a->att */
static void attention_part_fwd(const struct sl_model *m, int l, const void *w,
			       const struct acts *a, const void *x, const struct sl_batch_dev *b)
{
	struct sl_backend *be = m->be;
	const struct layer_off *lo = &m->lo[l];
	const int T = b->B * b->L, H = m->H;

	be->rmsnorm_fwd(be, a->xn1, a->rstd1, x, at(m, w, lo->ln1), T, H, m->eps);
	be->matmul_fwd(be, a->qkv, a->xn1, at(m, w, lo->wqkv), at_opt(m, w, lo->bqkv), T, H, m->Q);
	if (b->cp) {
		sl_cp_attention_fwd(m, l, w, a, b);
		return;
	}
	be->qk_norm_rope_fwd(be, a->qkvr, a->rstd_qk, a->qkv, at(m, w, lo->qn), at(m, w, lo->kn),
			     T, b->L, b->pos, m->nh, m->nkv, m->hd, m->eps, m->theta);
	be->attention_fwd(be, a->att, a->lse, a->qkvr, b->lens, b->pos, b->B, b->L, m->nh, m->nkv,
			  m->hd);
}

/*
 * attention_part_fwd's backward: m->gb2 = the gradient of a->att in; grads g of the unit +=,
 * m->gx += the gradient of x (m->gb1, m->gb2, m->gn used)
 */
static void attention_part_bwd(const struct sl_model *m, int l, const void *w, void *g,
			       const struct acts *a, const void *x, const struct sl_batch_dev *b)
{
	struct sl_backend *be = m->be;
	const struct layer_off *lo = &m->lo[l];
	const int T = b->B * b->L, H = m->H;
	void *gbqkv = lo->bqkv == NO_OFF ? NULL : at(m, g, lo->bqkv);

	if (b->cp) {
		sl_cp_attention_bwd(m, l, w, g, a, b);
	} else {
		be->attention_bwd(be, m->gb1, m->gb2, a->att, a->lse, a->qkvr, b->lens, b->pos,
				  b->B, b->L, m->nh, m->nkv, m->hd);
		be->qk_norm_rope_bwd(be, m->gb2, at(m, g, lo->qn), at(m, g, lo->kn), m->gb1,
				     a->qkv, at(m, w, lo->qn), at(m, w, lo->kn), a->rstd_qk, T,
				     b->L, b->pos, m->nh, m->nkv, m->hd, m->eps, m->theta);
	}
	be->matmul_bwd(be, m->gn, at(m, g, lo->wqkv), gbqkv, m->gb2, a->xn1, at(m, w, lo->wqkv),
		       T, H, m->Q, false);
	be->rmsnorm_bwd(be, m->gx, at(m, g, lo->ln1), m->gn, x, at(m, w, lo->ln1), a->rstd1, T, H,
			true);
}

/*
 * Decoder layer l on input x (T, H) with unit weights w.  @full: also produce the layer output
 * xout; the backward's recompute stops before the down projection, which it does not need.
 */
static void layer_fwd(const struct sl_model *m, int l, const void *w, const struct acts *a,
		      const void *x, void *xout, const struct sl_batch_dev *b, bool full)
{
	struct sl_backend *be = m->be;
	const struct layer_off *lo = &m->lo[l];
	const int T = b->B * b->L, H = m->H;

	attention_part_fwd(m, l, w, a, x, b);
	if (lo->bo != NO_OFF) {
		be->matmul_fwd(be, a->h, a->att, at(m, w, lo->wo), at(m, w, lo->bo), T,
			       m->nh * m->hd, H);
		be->add(be, a->h, x, (size_t)T * H);
	} else {
		be->matmul_fwd_res(be, a->h, a->att, at(m, w, lo->wo), x, T, m->nh * m->hd, H);
	}
	be->rmsnorm_fwd(be, a->xn2, a->rstd2, a->h, at(m, w, lo->ln2), T, H, m->eps);
	if (lo->wr != NO_OFF) {
		sl_moe_fwd((struct sl_model *)m, l, w, a, xout, b, full);
		return;
	}
	be->matmul_fwd(be, a->gu, a->xn2, at(m, w, lo->wgu), NULL, T, H, 2 * m->I);
	be->swiglu_fwd(be, a->act, a->gu, T, m->I);
	if (!full)
		return;
	be->matmul_fwd_res(be, xout, a->act, at(m, w, lo->wd), a->h, T, m->I, H);
}

/* m->gx: gradient of the layer's output in, of its input x out; grads g of its unit += */
static void layer_bwd(const struct sl_model *m, int l, const void *w, void *g,
		      const struct acts *a, const void *x, const struct sl_batch_dev *b)
{
	struct sl_backend *be = m->be;
	const struct layer_off *lo = &m->lo[l];
	const int T = b->B * b->L, H = m->H;
	void *gbo = lo->bo == NO_OFF ? NULL : at(m, g, lo->bo);

	/* MLP: x' = h + down(act); the residual passes gx through to h unchanged */
	if (lo->wr != NO_OFF) {
		sl_moe_bwd((struct sl_model *)m, l, w, g, a, b);
	} else {
		be->matmul_bwd(be, m->gb2, at(m, g, lo->wd), NULL, m->gx, a->act,
			       at(m, w, lo->wd), T, m->I, H, false);
		be->swiglu_bwd(be, m->gb1, m->gb2, a->gu, T, m->I);
		be->matmul_bwd(be, m->gn, at(m, g, lo->wgu), NULL, m->gb1, a->xn2,
			       at(m, w, lo->wgu), T, H, 2 * m->I, false);
	}
	be->rmsnorm_bwd(be, m->gx, at(m, g, lo->ln2), m->gn, a->h, at(m, w, lo->ln2), a->rstd2,
			T, H, true);

	/* attention: h = x + o_proj(att) */
	be->matmul_bwd(be, m->gb2, at(m, g, lo->wo), gbo, m->gx, a->att, at(m, w, lo->wo), T,
		       m->nh * m->hd, H, false);
	attention_part_bwd(m, l, w, g, a, x, b);
}

/*
 * The last layer on the head's rows (struct sl_model's prune_n): nothing after it reads the
 * other rows, so only the attention (whose keys and values are every token's) runs on all T,
 * or with m->prune_attn just the keys' and values' part of it (attention_rows_fwd), and the
 * output projection, the MLP and the residual on the prune_n rows, the layer's output rows
 * going to m->xl, the head's input.  Scratch: the rows' attention output in m->gb1 (the
 * backward's, free in the forward) unless a->att holds just them, their input x in m->xl until
 * the output replaces it.
 */
static void layer_fwd_last(const struct sl_model *m, int l, const void *w, const struct acts *a,
			   const void *x, const struct sl_batch_dev *b, bool full)
{
	struct sl_backend *be = m->be;
	const struct layer_off *lo = &m->lo[l];
	const int H = m->H, n = m->prune_n, A = m->nh * m->hd;
	const void *att = m->prune_attn ? a->att : m->gb1;	/* the rows' attention output */

	if (m->prune_attn) {
		attention_rows_fwd(m, l, w, a, x, b);
	} else {
		attention_part_fwd(m, l, w, a, x, b);
		be->gather_rows(be, m->gb1, a->att, m->prune_idx, n, A);
	}
	be->gather_rows(be, m->xl, x, m->prune_idx, n, H);
	if (lo->bo != NO_OFF) {
		be->matmul_fwd(be, a->h, att, at(m, w, lo->wo), at(m, w, lo->bo), n, A, H);
		be->add(be, a->h, m->xl, (size_t)n * H);
	} else {
		be->matmul_fwd_res(be, a->h, att, at(m, w, lo->wo), m->xl, n, A, H);
	}
	be->rmsnorm_fwd(be, a->xn2, a->rstd2, a->h, at(m, w, lo->ln2), n, H, m->eps);
	be->matmul_fwd(be, a->gu, a->xn2, at(m, w, lo->wgu), NULL, n, H, 2 * m->I);
	be->swiglu_fwd(be, a->act, a->gu, n, m->I);
	if (full)
		be->matmul_fwd_res(be, m->xl, a->act, at(m, w, lo->wd), a->h, n, m->I, H);
}

/* layer_fwd_last's backward: m->gxl = the gradient of its output rows in, m->gx out */
static void layer_bwd_last(const struct sl_model *m, int l, const void *w, void *g,
			   const struct acts *a, const void *x, const struct sl_batch_dev *b)
{
	struct sl_backend *be = m->be;
	const struct layer_off *lo = &m->lo[l];
	const int T = b->B * b->L, H = m->H, n = m->prune_n, A = m->nh * m->hd;
	void *gbo = lo->bo == NO_OFF ? NULL : at(m, g, lo->bo);

	be->matmul_bwd(be, m->gb2, at(m, g, lo->wd), NULL, m->gxl, a->act, at(m, w, lo->wd), n,
		       m->I, H, false);
	be->swiglu_bwd(be, m->gb1, m->gb2, a->gu, n, m->I);
	be->matmul_bwd(be, m->gn, at(m, g, lo->wgu), NULL, m->gb1, a->xn2, at(m, w, lo->wgu), n,
		       H, 2 * m->I, false);
	be->rmsnorm_bwd(be, m->gxl, at(m, g, lo->ln2), m->gn, a->h, at(m, w, lo->ln2), a->rstd2,
			n, H, true);
	if (m->prune_attn) {
		/* the rows' attention output is a->att's first rows; its gradient to m->gn */
		be->matmul_bwd(be, m->gn, at(m, g, lo->wo), gbo, m->gxl, a->att, at(m, w, lo->wo),
			       n, A, H, false);
	} else {
		/* the rows' attention output again (prune_rows checked that n x A fits m->gn) */
		be->gather_rows(be, m->gn, a->att, m->prune_idx, n, A);
		be->matmul_bwd(be, m->gb1, at(m, g, lo->wo), gbo, m->gxl, m->gn, at(m, w, lo->wo),
			       n, A, H, false);
		/* back to every token: the other rows' gradients are zero */
		be->zero(be, m->gb2, (size_t)T * A * be->elt);
		be->scatter_add_rows(be, m->gb2, m->gb1, m->prune_idx, n, A);
	}
	be->zero(be, m->gx, (size_t)T * H * be->elt);
	be->scatter_add_rows(be, m->gx, m->gxl, m->prune_idx, n, H);
	if (m->prune_attn)
		attention_rows_bwd(m, l, w, g, a, x, b);
	else
		attention_part_bwd(m, l, w, g, a, x, b);
}

/*
 * Whether this micro-batch's forward runs the last layer on the head's rows (m->prune_n, 0 if
 * not): a plain last layer (prune_ok), whole rows here (no context parallel), rows the head
 * reads: each record's last token (classify) or the targets' (sft, when at most half the
 * tokens: otherwise the gathers would cost about what they save), and room for their
 * attention output in m->gn.
 */
static void prune_rows(struct sl_model *m, const struct sl_batch_dev *b)
{
	const size_t T = (size_t)b->B * b->L;
	const int n = m->sft ? b->n_tgt : b->B;
	const size_t A = (size_t)m->nh * m->hd, KW = 2 * (size_t)m->nkv * m->hd, H = m->H;
	const size_t Tm = (size_t)m->max_tokens;

	m->prune_n = 0;
	m->prune_attn = false;
	m->prune_idx = m->sft ? b->tgt_pos : b->last;
	if (!m->prune_ok || b->cp || n < 1 || (m->sft && (size_t)n > T / 2) ||
	    (size_t)n * A > T * m->H)
		return;
	m->prune_n = n;
	/* attention_rows_fwd's and _bwd's parts of the acts and scratch (sized as in
	 * sl_model_create and alloc_acts) */
	if (!m->prune_attn_ok || m->sft || !b->h_lens || b->pos ||
	    part_at(T * KW) + (size_t)n * m->Q > Tm * m->Q ||
	    part_at(T * m->nkv) + (size_t)n * (m->nh + m->nkv) > Tm * (m->nh + m->nkv) ||
	    part_at((size_t)n * m->Q) + T * KW > Tm * zmax(2 * (size_t)m->I, m->Q) ||
	    part_at(T * KW) + (size_t)n * m->Q > Tm * zmax(zmax(m->I, m->Q), A) ||
	    part_at((size_t)n * H) + (size_t)n * H > Tm * zmax(zmax(m->I, m->Q), A))
		return;
	for (int r = 0; r < n; r++)
		m->prune_q_host[r] = b->h_lens[r] - 1;
	m->be->upload(m->be, m->prune_q, m->prune_q_host, (size_t)n * sizeof(int32_t));
	m->prune_attn = true;
}

void *sl_model_grad_room(struct sl_model *m, int unit, bool during, size_t *bytes)
{
	/*
	 * The backward runs the layers last to first: after unit 1 + l's backward, layer l's
	 * activations are dead; while it runs, layer l + 1's are (unit l's gradient, the
	 * embedding's for l = 0, but a tied embedding's takes the head's from the start)
	 */
	const int l = during ? unit : unit - 1;

	*bytes = 0;
	/* one set per layer: not with checkpointing, nor for Qwen3.5 (its own, n_acts 0) */
	if (m->ckpt || m->n_acts != m->nL || l < 0 || l >= m->nL ||
	    (during && unit == 0 && m->tied))
		return NULL;
	*bytes = m->acts[l].bytes;
	return m->acts[l].block;
}

static const struct acts *acts_of(const struct sl_model *m, int l, bool keep)
{
	return keep && !m->ckpt ? &m->acts[l] : &m->acts[0];
}

/* the final norm's effective weight (Qwen3.5 scales by 1 + w) */
static const void *final_norm_w(struct sl_model *m, const void *w)
{
	return m->q35 ? sl_q35_final_norm(m, w) : at(m, w, m->norm_off);
}

/* embedding, layers, final norm and head: m->logits (B).  @keep: keep what the backward needs */
static void forward(struct sl_model *m, const struct sl_unit_source *src,
		    const struct sl_batch_dev *b, bool keep, double aux_weight, double *aux)
{
	struct sl_backend *be = m->be;
	const int T = b->B * b->L, H = m->H, uh = m->nL + 1;
	const void *w;

	m->src = src;		/* the MoE layers fetch their experts' units themselves */
	sl_moe_begin(m);
	sl_moe_set_batch(m, b);
	w = src->weights(src->ctx, 0);
	be->embedding_fwd(be, m->x[0], b->ids, w, T, H);
	release(src->release_fwd, src->ctx, 0);

	prune_rows(m, b);
	for (int l = 0; l < m->nL; l++) {
		w = src->weights(src->ctx, 1 + l);
		if (m->q35)
			sl_q35_layer_fwd(m, l, w, m->x[l], m->x[l + 1], b, keep);
		else if (l == m->nL - 1 && m->prune_n)
			layer_fwd_last(m, l, w, acts_of(m, l, keep), m->x[l], b, true);
		else
			layer_fwd(m, l, w, acts_of(m, l, keep), m->x[l], m->x[l + 1], b, true);
		release(src->release_fwd, src->ctx, 1 + l);
	}
	*aux = sl_moe_end_fwd(m, b, aux_weight);
	if (m->sft)
		return;

	/* the head reads only each record's last token: normalize just those B rows */
	w = src->weights(src->ctx, uh);
	if (!m->prune_n)
		be->gather_rows(be, m->xl, m->x[m->nL], b->last, head_rows(b), H);
	be->rmsnorm_fwd(be, m->xnf, m->rstdf, m->xl, final_norm_w(m, w), head_rows(b), H, m->eps);
	be->matmul_fwd(be, m->logits, m->xnf, at(m, w, m->score_off), NULL, head_rows(b), H, 1);
	release(src->release_fwd, src->ctx, uh);
}

/*
 * The causal-LM head on the n_tgt tokens whose next token is a target: final norm of just those
 * rows, then per chunk the logits, their cross-entropy and gradient (in place), and, when
 * training, the chunk's input gradient and the head's weight gradient; m->loss_dev = the sum of
 * the targets' cross-entropies.  Training leaves m->gx = the gradient of the last layer's output
 * and, with tied embeddings, holds unit 0 (weights and gradient buffer m->g_embed) for the
 * embedding's backward to finish.
 */
static void lm_head(struct sl_model *m, const struct sl_unit_source *src,
		    const struct sl_batch_dev *b, float scale, bool train)
{
	struct sl_backend *be = m->be;
	const int n = b->n_tgt, H = m->H, uh = m->nL + 1;
	const void *w = src->weights(src->ctx, uh), *wl;
	void *g = train ? src->grads(src->ctx, uh) : NULL, *gl = NULL;

	if (m->tied) {
		wl = src->weights(src->ctx, 0);
		if (train)
			gl = m->g_embed = src->grads(src->ctx, 0);
	} else {
		wl = at(m, w, m->lm_off);
		gl = train ? at(m, g, m->lm_off) : NULL;
	}
	be->zero(be, m->loss_dev, sizeof(double));
	if (n) {
		if (!m->prune_n)
			be->gather_rows(be, m->xl, m->x[m->nL], b->tgt_pos, n, H);
		be->rmsnorm_fwd(be, m->xnf, m->rstdf, m->xl, final_norm_w(m, w), n, H, m->eps);
	}
	for (int c0 = 0; c0 < n; c0 += m->chunk) {
		int cn = n - c0 < m->chunk ? n - c0 : m->chunk;
		const void *xc = at(m, m->xnf, (size_t)c0 * H);

		be->matmul_fwd(be, m->lg, xc, wl, NULL, cn, H, m->V);
		be->ce_fwd_bwd(be, m->loss_dev, m->row_loss, m->lg, m->lg, b->tgt_ids + c0, cn,
			       m->V, scale);
		if (train)
			be->matmul_bwd(be, at(m, m->gxnf, (size_t)c0 * H), gl, NULL, m->lg, xc, wl,
				       cn, H, m->V, false);
	}
	if (!train) {
		release(src->release_fwd, src->ctx, uh);
		if (m->tied)
			release(src->release_fwd, src->ctx, 0);
		return;
	}
	if (n)
		be->rmsnorm_bwd(be, m->gxl, at(m, g, m->norm_off), m->gxnf, m->xl,
				final_norm_w(m, w), m->rstdf, n, H, false);
	release(src->release_bwd, src->ctx, uh);
	if (m->prune_n)
		return;		/* the last layer takes m->gxl as it is */
	be->zero(be, m->gx, (size_t)b->B * b->L * H * be->elt);
	if (n)
		be->scatter_add_rows(be, m->gx, m->gxl, b->tgt_pos, n, H);
}

static void download_scores(struct sl_model *m, int B, float *scores)
{
	struct sl_backend *be = m->be;

	be->to_f32(be, m->scores_f32, m->logits, (size_t)B);
	be->download(be, scores, m->scores_f32, (size_t)B * sizeof(float));
}

int sl_model_train_step(struct sl_model *m, const struct sl_unit_source *src,
			const struct sl_batch_dev *b, float loss_scale, double *loss_sum,
			float *scores)
{
	struct sl_backend *be = m->be;
	const int T = b->B * b->L, H = m->H, uh = m->nL + 1;
	const void *w;
	void *g;
	double aux;
	int aux_n, rc = check_batch(m, b, true);

	if (!rc && b->cp)
		rc = sl_cp_check(m, b);
	if (rc)
		return rc;
	if (m->sft && scores) {
		fprintf(stderr, "model: the causal-LM head has no scores\n");
		return -EINVAL;
	}
	/* the aux loss's weight: coef per record (classify) or target (sft); see model.h */
	aux_n = m->sft ? b->n_tgt : b->B;
	if (m->moe && b->cp && m->sft) {
		/* context parallel: the targets of the whole rows, which the ranks share */
		double n = b->n_tgt;

		b->cp->comm->sum_f64(b->cp->comm->ctx, &n, 1);
		aux_n = (int)n;
	}
	forward(m, src, b, true, m->aux_coef * loss_scale * aux_n, &aux);

	if (m->sft) {
		lm_head(m, src, b, loss_scale, true);
	} else {
		w = src->weights(src->ctx, uh);
		g = src->grads(src->ctx, uh);
		const int nr = head_rows(b);

		be->bce_fwd_bwd(be, m->loss_dev, m->dlogits, m->logits, b->labels, nr,
				loss_scale);
		be->matmul_bwd(be, m->gxnf, at(m, g, m->score_off), NULL, m->dlogits, m->xnf,
			       at(m, w, m->score_off), nr, H, 1, false);
		be->rmsnorm_bwd(be, m->gxl, at(m, g, m->norm_off), m->gxnf, m->xl,
				final_norm_w(m, w), m->rstdf, nr, H, false);
		release(src->release_bwd, src->ctx, uh);
		if (!m->prune_n) {
			be->zero(be, m->gx, (size_t)T * H * be->elt);
			be->scatter_add_rows(be, m->gx, m->gxl, b->last, nr, H);
		}
	}

	for (int l = m->nL - 1; l >= 0; l--) {
		const struct acts *a = acts_of(m, l, true);

		w = src->weights(src->ctx, 1 + l);
		g = src->grads(src->ctx, 1 + l);
		if (m->q35) {
			sl_q35_layer_bwd(m, l, w, g, m->x[l], b);
			release(src->release_bwd, src->ctx, 1 + l);
			continue;
		}
		if (l == m->nL - 1 && m->prune_n) {
			if (m->ckpt)
				layer_fwd_last(m, l, w, a, m->x[l], b, false);
			layer_bwd_last(m, l, w, g, a, m->x[l], b);
		} else {
			if (m->ckpt)
				layer_fwd(m, l, w, a, m->x[l], NULL, b, false);
			layer_bwd(m, l, w, g, a, m->x[l], b);
		}
		release(src->release_bwd, src->ctx, 1 + l);
	}

	/* tied embeddings: the head's gradient is already in unit 0's buffer; add to it */
	g = m->sft && m->tied ? m->g_embed : src->grads(src->ctx, 0);
	be->embedding_bwd(be, g, b->ids, m->gx, T, H);
	release(src->release_bwd, src->ctx, 0);

	if (scores)
		download_scores(m, head_rows(b), scores);
	be->download(be, loss_sum, m->loss_dev, sizeof(double));
	be->sync(be);
	/* the aux loss once per micro-batch: by the first rank of a context group */
	if (!b->cp || b->cp->comm->rank == 0)
		*loss_sum += m->aux_coef * aux * aux_n;
	return 0;
}

int sl_model_lm_loss(struct sl_model *m, const struct sl_unit_source *src,
		     const struct sl_batch_dev *b, double *loss_sum)
{
	double aux;
	int rc = check_batch(m, b, false);

	if (!rc && !m->sft) {
		fprintf(stderr, "model: the classification head has no language-model loss\n");
		rc = -EINVAL;
	}
	if (!rc && b->cp)
		rc = sl_cp_check(m, b);
	if (rc)
		return rc;
	forward(m, src, b, false, 0, &aux);
	lm_head(m, src, b, 0.0f, false);
	m->be->download(m->be, loss_sum, m->loss_dev, sizeof(double));
	m->be->sync(m->be);
	return 0;
}

void sl_model_set_lm_chunk(struct sl_model *m, int rows)
{
	if (m->sft && rows >= 1 && rows < m->chunk)
		m->chunk = rows;
}

bool sl_model_is_lm(const struct sl_model *m)
{
	return m->sft;
}

int sl_model_score(struct sl_model *m, const struct sl_unit_source *src,
		   const struct sl_batch_dev *b, float *scores)
{
	int rc = check_batch(m, b, false);
	double aux;

	if (!rc && m->sft) {
		fprintf(stderr, "model: the causal-LM head has no scores\n");
		rc = -EINVAL;
	}
	if (!rc && b->cp)
		rc = sl_cp_check(m, b);
	if (rc)
		return rc;
	forward(m, src, b, false, 0, &aux);
	download_scores(m, head_rows(b), scores);
	m->be->sync(m->be);
	return 0;
}
