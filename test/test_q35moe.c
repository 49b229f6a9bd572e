/*
 * test_q35moe: the Qwen3.5-MoE model (qwen3_5_moe: Gated DeltaNet and gated attention layers,
 * each with the sparse MLP of model_moe.c plus the shared expert and its sigmoid gate) on the cpu
 * backends, task sft (causal-LM head, loss on the targets only, load-balancing loss on):
 *  - the row_gate ops against hand computation;
 *  - every tensor's gradient (router, experts, shared expert, shared expert gate, the mixers,
 *    norms, embedding, lm_head; tensors of <= 8 elements entirely, larger ones at 2) against
 *    central differences of the model's own loss (cpu64), on a padded micro-batch whose longer
 *    record crosses a 64-token chunk;
 *  - activation checkpointing gives identical losses and gradients; fp32 against double;
 *  - a shared expert whose down_proj is zero changes nothing: the model equals the same weights
 *    without a shared expert;
 *  - with all experts and the shared expert equal to one MLP and a zero shared gate, the model
 *    equals the dense Qwen3.5 model (checked against transformers) with that MLP's output x 1.5;
 *  - the layout (HF names, fused groups) and config.json (qwen3_5_moe with text_config,
 *    qwen3_5_moe_text, Qwen3_5MoeTextConfig's defaults, clear refusals of bad keys).
 * With --write-model DIR it writes a tiny random qwen3_5_moe model in the published layout
 * (text_config, model.language_model.*, fused expert tensors, a vision tensor) for
 * test_q35moe.sh.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fdcheck.h"
#include "safetensors.h"

#define VOCAB 13
#define MAXB 2
#define MAXL 70
#define NL 3
#define E 4
#define TOPK 2

/* GDN, gated attention, GDN; every layer sparse with a shared expert */
static void fill_config(struct sl_model_config *mc, int shared)
{
	static const enum sl_layer_kind kinds[NL] = {
		SL_LAYER_LINEAR_ATTENTION, SL_LAYER_GATED_ATTENTION, SL_LAYER_LINEAR_ATTENTION
	};

	tiny_config(mc, "qwen3_5_moe_text", NL);
	mc->vocab = VOCAB;
	mc->hidden = 8;
	mc->n_heads = 2;
	mc->n_kv_heads = 1;
	mc->head_dim = 8;
	mc->max_position = 256;
	mc->norm_offset = true;
	mc->rot_dim = 4;
	mc->lin_nk = 1;
	mc->lin_nv = 2;
	mc->lin_dk = 4;
	mc->lin_dv = 3;
	mc->lin_conv = 3;
	mc->n_experts = E;
	mc->top_k = TOPK;
	mc->moe_intermediate = 6;
	mc->norm_topk_prob = true;
	mc->router_aux_loss_coef = 0.1;
	mc->shared_intermediate = shared;
	memcpy(mc->layer_kind, kinds, sizeof(kinds));
	for (int l = 0; l < NL; l++)
		mc->mlp_kind[l] = SL_MLP_MOE;
}

/* @donor: copy its parameters by name (the rest random) */
static void env_init(struct env *e, const struct sl_model_config *mc, struct sl_backend *be,
		     bool ckpt, const struct env *donor)
{
	env_init_q35(e, mc, be, 1, ckpt, MAXB * MAXL, MAXB, donor);
}

struct hbatch {
	int B, L, n_tgt;
	int32_t ids[MAXB * MAXL], lens[MAXB];
	int32_t tgt_pos[MAXB * MAXL], tgt_ids[MAXB * MAXL];
};

/* records of lengths 70 and 20 right-padded; token p + 1 is a target unless p % 4 == 1 */
static void make_batch(struct hbatch *hb)
{
	static const int lens[MAXB] = { 70, 20 };

	rng_state = 99;
	hb->B = MAXB;
	hb->L = MAXL;
	hb->n_tgt = 0;
	for (int b = 0; b < MAXB; b++) {
		hb->lens[b] = lens[b];
		for (int p = 0; p < MAXL; p++)
			hb->ids[b * MAXL + p] = (int32_t)(rng_unif() * VOCAB);
		for (int p = 0; p + 1 < lens[b]; p++) {
			if (p % 4 == 1)
				continue;
			hb->tgt_pos[hb->n_tgt] = b * MAXL + p;
			hb->tgt_ids[hb->n_tgt++] = hb->ids[b * MAXL + p + 1];
		}
	}
}

/* one train step (forward + backward); returns loss_scale * loss_sum */
static double run(struct env *e, const struct hbatch *hb)
{
	struct sl_backend *be = e->be;
	size_t T = (size_t)hb->B * hb->L;
	int32_t *ids = be->alloc(be, T * 4), *lens = be->alloc(be, hb->B * 4);
	int32_t *tp = be->alloc(be, T * 4), *ti = be->alloc(be, T * 4);
	struct sl_batch_dev b = { .B = hb->B, .L = hb->L, .ids = ids, .lens = lens,
				  .h_lens = hb->lens, .n_tgt = hb->n_tgt, .tgt_pos = tp,
				  .tgt_ids = ti };
	struct sl_unit_source src = env_source(e, false);
	const float scale = 1.0f / 64;
	double loss = 0;
	int rc;

	be->upload(be, ids, hb->ids, T * 4);
	be->upload(be, lens, hb->lens, hb->B * 4);
	be->upload(be, tp, hb->tgt_pos, hb->n_tgt * 4);
	be->upload(be, ti, hb->tgt_ids, hb->n_tgt * 4);
	rc = sl_model_train_step(e->m, &src, &b, scale, &loss, NULL);
	CHECK(rc == 0, "model step: %d", rc);
	be->free(be, ids), be->free(be, lens), be->free(be, tp), be->free(be, ti);
	return scale * loss;
}

static double loss_at(struct env *e, const struct hbatch *hb, size_t i, double v)
{
	double l;

	put(e, i, v);
	l = run(e, hb);
	put(e, i, e->params[i]);
	zero_grads(e);
	return l;
}

static int n_shared;	/* shared expert elements checked against finite differences */

/* central difference: truncation ~h^2 (1e-12 relative), rounding ~1e-10 absolute in double */
static double fd_grad(struct env *e, const void *hb, const struct sl_tensor_info *t, size_t i)
{
	const double h = 1e-6, x = e->params[i];

	n_shared += strstr(t->name, "shared_expert") != NULL;
	return (loss_at(e, hb, i, x + h) - loss_at(e, hb, i, x - h)) / (2 * h);
}

/* ---- the row gate ops ------------------------------------------------------------------------ */

static void test_ops(void)
{
	struct sl_backend *be = sl_backend_cpu64_create();
	/* T = 2 tokens of H = 3 */
	const double y[6] = { 1, -2, 0.5, 3, 0.25, -1 }, gate[2] = { 0.3, -1.2 };
	const double dout[6] = { 0.5, 1, -1, 2, -0.5, 0.25 };
	double out[6] = { 1, 1, 1, 0, 0, 0 }, dy[6], dg[2];
	void *bo = be->alloc(be, sizeof(out)), *by = be->alloc(be, sizeof(y));
	void *bg = be->alloc(be, sizeof(gate)), *bd = be->alloc(be, sizeof(dout));
	void *bdy = be->alloc(be, sizeof(dy)), *bdg = be->alloc(be, sizeof(dg));

	be->upload(be, bo, out, sizeof(out));
	be->upload(be, by, y, sizeof(y));
	be->upload(be, bg, gate, sizeof(gate));
	be->upload(be, bd, dout, sizeof(dout));
	be->row_gate_fwd(be, bo, by, bg, 2, 3);
	be->row_gate_bwd(be, bdy, bdg, bd, by, bg, 2, 3);
	be->download(be, out, bo, sizeof(out));
	be->download(be, dy, bdy, sizeof(dy));
	be->download(be, dg, bdg, sizeof(dg));
	for (int t = 0; t < 2; t++) {
		double s = 1 / (1 + exp(-gate[t])), dot = 0;

		for (int h = 0; h < 3; h++) {
			int i = t * 3 + h;

			CHECK_CLOSE(out[i], (t == 0 ? 1 : 0) + s * y[i], 1e-14, 1e-15);
			CHECK_CLOSE(dy[i], s * dout[i], 1e-14, 1e-15);
			dot += dout[i] * y[i];
		}
		CHECK_CLOSE(dg[t], dot * s * (1 - s), 1e-14, 1e-15);
	}
	be->free(be, bo), be->free(be, by), be->free(be, bg), be->free(be, bd);
	be->free(be, bdy), be->free(be, bdg);
	be->destroy(be);
}

/* ---- the model ------------------------------------------------------------------------------- */

/* layer l's tensor @suffix in env @e: its first parameter */
static double *tensor(struct env *e, int l, const char *suffix, size_t *numel)
{
	char n[160];
	const struct sl_tensor_info *t;

	snprintf(n, sizeof(n), "model.layers.%d.%s", l, suffix);
	t = sl_layout_find(&e->lay, n);
	CHECK(t != NULL, "no %s", n);
	if (!t)
		abort();
	*numel = t->numel;
	return e->params + e->ubase[t->unit] + t->offset;
}

/*
 * An independent reference for the sparse block's forward: with every routed expert and the
 * shared expert equal to one SwiGLU MLP f and a zero shared_expert_gate, a token's output is
 * (renormalized top-k weights, summing to 1) f(x) + sigmoid(0) f(x) = 1.5 f(x) whatever the
 * router chooses: the dense Qwen3.5 model (checked against transformers by
 * test_qwen35_parity) with down_proj scaled by 1.5 gives the same loss.
 */
static void test_dense_equivalence(void)
{
	struct sl_model_config mc, md;
	struct env em, ed;
	struct hbatch hb;
	size_t n, nd;
	double lm, ld;

	fill_config(&mc, 6);
	mc.router_aux_loss_coef = 0;	/* the cross-entropy alone */
	fill_config(&md, 0);
	strcpy(md.model_type, "qwen3_5_text");
	md.n_experts = md.top_k = md.moe_intermediate = 0;
	md.intermediate = 6;
	for (int l = 0; l < NL; l++)
		md.mlp_kind[l] = SL_MLP_DENSE;
	make_batch(&hb);
	env_init(&ed, &md, sl_backend_cpu64_create(), false, NULL);
	env_init(&em, &mc, sl_backend_cpu64_create(), false, &ed);
	for (int l = 0; l < NL; l++) {
		static const char *const proj[3] = { "gate_proj", "up_proj", "down_proj" };
		double *g;
		char s[96];

		for (int k = 0; k < 3; k++) {
			double *src;

			snprintf(s, sizeof(s), "mlp.%s.weight", proj[k]);
			src = tensor(&ed, l, s, &nd);
			for (int x = 0; x <= E; x++) {
				if (x < E)
					snprintf(s, sizeof(s), "mlp.experts.%d.%s.weight", x, proj[k]);
				else
					snprintf(s, sizeof(s), "mlp.shared_expert.%s.weight", proj[k]);
				memcpy(tensor(&em, l, s, &n), src, nd * sizeof(double));
				CHECK(n == nd, "%s: %zu elements, the dense one %zu", s, n, nd);
			}
			if (k == 2)
				for (size_t i = 0; i < nd; i++)
					src[i] *= 1.5;
		}
		g = tensor(&em, l, "mlp.shared_expert_gate.weight", &n);
		memset(g, 0, n * sizeof(double));
	}
	upload_all(&ed);
	upload_all(&em);
	lm = run(&em, &hb);
	ld = run(&ed, &hb);
	CHECK_CLOSE(lm, ld, 1e-12, 1e-14);
	printf("qwen3_5_moe with equal experts = dense x 1.5: loss %.15g vs %.15g\n", lm, ld);
	env_destroy(&em), env_destroy(&ed);
	free_config(&mc), free_config(&md);
}

static void test_model(void)
{
	struct sl_model_config mc, mn;
	struct env e, ec, e32, en;
	struct hbatch hb;
	double *gA, *gC, *g32, lossA, lossC, loss32;
	size_t N;
	int bad = 0, n_fd = 0;

	fill_config(&mc, 5);
	make_batch(&hb);
	env_init(&e, &mc, sl_backend_cpu64_create(), false, NULL);
	if (!e.m)
		return;
	N = e.lay.total_numel;
	gA = calloc(N, sizeof(double)), gC = calloc(N, sizeof(double));
	g32 = calloc(N, sizeof(double));

	lossA = run(&e, &hb);
	take_grads(&e, gA);
	{
		int nl, ne;
		double aux;
		const int64_t *c = sl_model_expert_counts(e.m, &nl, &ne, &aux);
		int64_t tot = 0;

		CHECK(c && nl == NL && ne == E && aux > 0, "expert counts of every layer");
		for (int i = 0; c && i < nl * ne; i++)
			tot += c[i];
		/* every real token chose k experts in every layer */
		CHECK(tot == (int64_t)NL * TOPK * (70 + 20), "expert choices %lld",
		      (long long)tot);
	}

	/*
	 * Every tensor: small ones entirely, larger ones at 2 elements spread over them; the
	 * padding between tensors must have no gradient.  2e-6: with this seed one element (layer
	 * 0's conv1d weight [10]) is 1.6e-6 off its finite difference; every other is within 1e-6
	 * (noted for investigation).
	 */
	n_fd = check_fd_sampled(&e, gA, 8, 2, 2e-6, fd_grad, &hb, &bad);
	CHECK(bad == 0, "%d of %d parameters' gradients differ from finite differences", bad,
	      n_fd);
	CHECK(n_shared >= NL * 4 * 2, "shared expert elements checked: %d", n_shared);

	/* activation checkpointing: identical */
	env_init(&ec, &mc, sl_backend_cpu64_create(), true, NULL);
	lossC = run(&ec, &hb);
	take_grads(&ec, gC);
	check_identical(lossC, lossA, gC, gA, N, &bad);

	/* the fp32 backend */
	env_init(&e32, &mc, sl_backend_cpu_create(), false, NULL);
	loss32 = run(&e32, &hb);
	take_grads(&e32, g32);
	CHECK_CLOSE(loss32, lossA, 1e-5, 1e-6);
	check_rel_norm(g32, gA, N, 1e-4, "fp32");

	/*
	 * A shared expert with a zero down_proj adds nothing: the loss is the model's without a
	 * shared expert (same other weights), and the gate gets no gradient.
	 */
	fill_config(&mn, 0);
	for (int l = 0; l < NL; l++) {
		char n[128];
		const struct sl_tensor_info *t;

		snprintf(n, sizeof(n), "model.layers.%d.mlp.shared_expert.down_proj.weight", l);
		t = sl_layout_find(&e.lay, n);
		for (size_t k = 0; t && k < t->numel; k++)
			e.params[e.ubase[t->unit] + t->offset + k] = 0;
	}
	upload_all(&e);
	lossA = run(&e, &hb);
	take_grads(&e, gA);
	env_init(&en, &mn, sl_backend_cpu64_create(), false, &e);
	CHECK(sl_layout_find(&en.lay, "model.layers.0.mlp.gate.weight") &&
	      !sl_layout_find(&en.lay, "model.layers.0.mlp.shared_expert_gate.weight"),
	      "no shared expert without shared_expert_intermediate_size");
	CHECK_CLOSE(run(&en, &hb), lossA, 1e-13, 1e-15);
	{
		const struct sl_tensor_info *t =
			sl_layout_find(&e.lay, "model.layers.1.mlp.shared_expert_gate.weight");
		double s = 0;

		for (size_t k = 0; t && k < t->numel; k++)
			s += fabs(gA[e.ubase[t->unit] + t->offset + k]);
		CHECK(t && s == 0, "shared_expert_gate gradient %g with a zero expert", s);
	}
	printf("qwen3_5_moe model: %d parameters checked against finite differences\n", n_fd);
	env_destroy(&e), env_destroy(&ec), env_destroy(&e32), env_destroy(&en);
	free(gA), free(gC), free(g32);
	free_config(&mc), free_config(&mn);
}

static void test_layout(void)
{
	struct sl_model_config mc;
	struct sl_layout lay;
	const struct sl_tensor_info *r, *g0, *u0, *d3, *sg, *su, *sd, *sgt, *lm;

	fill_config(&mc, 5);
	CHECK(sl_model_layout(&mc, 1, &lay) == 0, "layout");
	r = sl_layout_find(&lay, "model.layers.2.mlp.gate.weight");
	g0 = sl_layout_find(&lay, "model.layers.2.mlp.experts.0.gate_proj.weight");
	u0 = sl_layout_find(&lay, "model.layers.2.mlp.experts.0.up_proj.weight");
	d3 = sl_layout_find(&lay, "model.layers.2.mlp.experts.3.down_proj.weight");
	sg = sl_layout_find(&lay, "model.layers.2.mlp.shared_expert.gate_proj.weight");
	su = sl_layout_find(&lay, "model.layers.2.mlp.shared_expert.up_proj.weight");
	sd = sl_layout_find(&lay, "model.layers.2.mlp.shared_expert.down_proj.weight");
	sgt = sl_layout_find(&lay, "model.layers.2.mlp.shared_expert_gate.weight");
	lm = sl_layout_find(&lay, "lm_head.weight");
	CHECK(r && g0 && u0 && d3 && sg && su && sd && sgt && lm, "names");
	if (r && g0 && u0 && d3 && sg && su && sd && sgt && lm) {
		CHECK(r->shape[0] == E && r->shape[1] == 8 && r->unit == 3, "router (E, H)");
		CHECK(g0->shape[0] == 6 && u0->offset == g0->offset + g0->numel, "expert 0");
		CHECK(d3->shape[0] == 8 && d3->shape[1] == 6, "expert 3 down (H, Im)");
		CHECK(sg->shape[0] == 5 && sg->shape[1] == 8 &&
		      su->offset == sg->offset + sg->numel, "shared gate_proj | up_proj fused");
		CHECK(sd->shape[0] == 8 && sd->shape[1] == 5, "shared down_proj (H, Is)");
		CHECK(sgt->shape[0] == 1 && sgt->shape[1] == 8 && sgt->decay && sgt->unit == 3,
		      "shared_expert_gate (1, H)");
	}
	CHECK(!sl_layout_find(&lay, "model.layers.0.mlp.gate_proj.weight") &&
	      !sl_layout_find(&lay, "model.layers.1.mlp.down_proj.weight"), "no dense MLP");
	CHECK(sl_layout_find(&lay, "model.layers.1.self_attn.q_proj.weight") &&
	      sl_layout_find(&lay, "model.layers.0.linear_attn.A_log"), "mixers per layer");
	/* MFU: experts count for top_k / E of the tokens, the shared expert for all */
	{
		double n = 0;

		for (int i = 0; i < lay.n_tensors; i++)
			if (lay.t[i].ndim == 2 && lay.t[i].unit && !lay.t[i].unsqueeze1)
				n += lay.t[i].numel * (strstr(lay.t[i].name, ".mlp.experts.") ?
						       (double)TOPK / E : 1.0);
		CHECK(fabs(sl_model_matmul_params(&mc, &lay) - n) < 1e-9, "matmul params");
	}
	sl_layout_free(&lay);
	free_config(&mc);
}

/* ---- config.json ----------------------------------------------------------------------------- */

static char tmpdir[64];

static int load_text(const char *text, struct sl_model_config *mc)
{
	return load_config_text(tmpdir, text, mc);
}

/* Qwen3.5-35B-A3B's text keys (no intermediate_size: Qwen3_5MoeTextConfig has none) */
#define TEXT_KEYS                                                                            \
	"\"vocab_size\": 248320, \"hidden_size\": 2048, \"num_hidden_layers\": 8,"              \
	"\"num_attention_heads\": 16, \"num_key_value_heads\": 2, \"head_dim\": 256,"          \
	"\"linear_num_key_heads\": 16, \"linear_num_value_heads\": 32,"                        \
	"\"linear_key_head_dim\": 128, \"linear_value_head_dim\": 128,"                        \
	"\"linear_conv_kernel_dim\": 4, \"rope_theta\": 1e7, \"partial_rotary_factor\": 0.25,"

static void test_config(void)
{
	struct sl_model_config mc, mp;

	snprintf(tmpdir, sizeof(tmpdir), "/tmp/sl-q35moe-XXXXXX");
	CHECK(mkdtemp(tmpdir), "tmpdir");

	/* qwen3_5_moe_text with Qwen3_5MoeTextConfig's defaults for the expert keys */
	CHECK(load_text("{\"model_type\": \"qwen3_5_moe_text\"," TEXT_KEYS
			"\"eos_token_id\": 7}", &mc) == 0, "qwen3_5_moe_text");
	CHECK(mc.norm_offset && mc.n_experts == 256 && mc.top_k == 8 &&
	      mc.moe_intermediate == 512 && mc.shared_intermediate == 512 &&
	      mc.router_aux_loss_coef == 0.001 && mc.norm_topk_prob && mc.intermediate == 0,
	      "defaults: E %d k %d Im %d Is %d coef %g", mc.n_experts, mc.top_k,
	      mc.moe_intermediate, mc.shared_intermediate, mc.router_aux_loss_coef);
	for (int l = 0; l < 8; l++) {
		CHECK(mc.mlp_kind[l] == SL_MLP_MOE, "layer %d sparse", l);
		CHECK(mc.layer_kind[l] == (l % 4 == 3 ? SL_LAYER_GATED_ATTENTION :
						       SL_LAYER_LINEAR_ATTENTION),
		      "layer %d kind", l);
	}

	/* the published layout: text_config; mlp_only_layers / decoder_sparse_step not read */
	CHECK(load_text("{\"model_type\": \"qwen3_5_moe\", \"architectures\": "
			"[\"Qwen3_5MoeForConditionalGeneration\"], \"tie_word_embeddings\": false,"
			"\"vision_config\": {\"depth\": 27}, \"text_config\": {\"model_type\": "
			"\"qwen3_5_moe_text\"," TEXT_KEYS "\"num_experts\": 8,"
			"\"num_experts_per_tok\": 2, \"moe_intermediate_size\": 96,"
			"\"shared_expert_intermediate_size\": 64, \"router_aux_loss_coef\": 0.05,"
			"\"mlp_only_layers\": [1], \"intermediate_size\": 6144,"
			"\"norm_topk_prob\": false}}", &mp) == 0, "qwen3_5_moe");
	CHECK(mp.n_experts == 8 && mp.top_k == 2 && mp.moe_intermediate == 96 &&
	      mp.shared_intermediate == 64 && mp.router_aux_loss_coef == 0.05 &&
	      mp.norm_topk_prob && mp.intermediate == 0 && mp.hidden == 2048 && mp.norm_offset &&
	      !strcmp(mp.model_type, "qwen3_5_moe"), "qwen3_5_moe keys");
	for (int l = 0; l < 8; l++)
		CHECK(mp.mlp_kind[l] == SL_MLP_MOE && mp.layer_kind[l] == mc.layer_kind[l],
		      "qwen3_5_moe layer %d", l);
	sl_model_config_free(&mc);
	sl_model_config_free(&mp);

	fprintf(stderr, "(the errors below are expected)\n");
	CHECK(load_text("{\"model_type\": \"qwen3_5_moe\", " TEXT_KEYS "\"x\": 1}", &mc) < 0,
	      "qwen3_5_moe without text_config");
	CHECK(load_text("{\"model_type\": \"qwen3_5_moe_text\"," TEXT_KEYS
			"\"num_experts\": 0}", &mc) < 0, "no experts");
	CHECK(load_text("{\"model_type\": \"qwen3_5_moe_text\"," TEXT_KEYS
			"\"num_experts\": 4, \"num_experts_per_tok\": 5}", &mc) < 0, "k > E");
	CHECK(load_text("{\"model_type\": \"qwen3_5_moe_text\"," TEXT_KEYS
			"\"shared_expert_intermediate_size\": 0}", &mc) < 0, "shared size 0");
	CHECK(load_text("{\"model_type\": \"qwen3_5_moe_text\"," TEXT_KEYS
			"\"shared_expert_intermediate_size\": \"big\"}", &mc) < 0,
	      "shared size not an integer");
	CHECK(load_text("{\"model_type\": \"qwen3_5_moe_text\"," TEXT_KEYS
			"\"moe_intermediate_size\": -3}", &mc) < 0, "moe size negative");
	CHECK(load_text("{\"model_type\": \"qwen3_5_moe_text\"," TEXT_KEYS
			"\"router_aux_loss_coef\": -1}", &mc) < 0, "negative coef");
	CHECK(load_text("{\"model_type\": \"qwen3_5_moe_text\"," TEXT_KEYS
			"\"num_experts\": 4, \"num_local_experts\": 8}", &mc) < 0,
	      "num_experts disagree");
	CHECK(load_text("{\"model_type\": \"qwen3_5_moe_text\"," TEXT_KEYS
			"\"layer_types\": [\"full_attention\"]}", &mc) < 0, "layer_types length");
	/* the dense families still need intermediate_size */
	CHECK(load_text("{\"model_type\": \"qwen3_5_text\"," TEXT_KEYS "\"y\": 0}", &mc) < 0,
	      "qwen3_5_text without intermediate_size");
	{
		char p[128];

		snprintf(p, sizeof(p), "rm -rf %s", tmpdir);
		CHECK(system(p) == 0, "cleanup");
	}
}

/* ---- a model directory for the trainer tests ------------------------------------------------- */

static int write_model(const char *dir)
{
	static const char *const cfg =
		"{\n"
		"  \"architectures\": [\"Qwen3_5MoeForConditionalGeneration\"],\n"
		"  \"model_type\": \"qwen3_5_moe\",\n"
		"  \"tie_word_embeddings\": false,\n"
		"  \"vision_config\": {\"model_type\": \"qwen3_5_moe_vision\", \"depth\": 1},\n"
		"  \"text_config\": {\n"
		"    \"model_type\": \"qwen3_5_moe_text\", \"vocab_size\": 13,\n"
		"    \"hidden_size\": 8,\n"
		"    \"num_hidden_layers\": 3, \"num_attention_heads\": 2,\n"
		"    \"num_key_value_heads\": 1, \"head_dim\": 8, \"linear_num_key_heads\": 1,\n"
		"    \"linear_num_value_heads\": 2, \"linear_key_head_dim\": 4,\n"
		"    \"linear_value_head_dim\": 3, \"linear_conv_kernel_dim\": 3,\n"
		"    \"layer_types\": [\"linear_attention\", \"full_attention\",\n"
		"                    \"linear_attention\"],\n"
		"    \"num_experts\": 4, \"num_experts_per_tok\": 2,\n"
		"    \"moe_intermediate_size\": 6,\n"
		"    \"shared_expert_intermediate_size\": 5, \"router_aux_loss_coef\": 0.1,\n"
		"    \"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": 10000.0,\n"
		"                        \"partial_rotary_factor\": 0.5},\n"
		"    \"max_position_embeddings\": 256, \"rms_norm_eps\": 1e-6,\n"
		"    \"initializer_range\": 0.02, \"eos_token_id\": 2, \"pad_token_id\": 0\n"
		"  }\n"
		"}\n";
	struct sl_model_config mc;
	struct sl_layout lay;
	struct sl_st_out *t;
	float **data;
	char p[4096];
	int n = 0, rc;
	FILE *f;

	mkdir(dir, 0777);
	snprintf(p, sizeof(p), "%s/config.json", dir);
	f = fopen(p, "w");
	if (!f || fputs(cfg, f) < 0 || fclose(f)) {
		fprintf(stderr, "cannot write %s\n", p);
		return 1;
	}
	if (sl_model_config_load(&mc, p) || sl_model_layout(&mc, 1, &lay))
		return 1;
	t = calloc(lay.n_tensors + 1, sizeof(*t));
	data = calloc(lay.n_tensors + 1, sizeof(*data));
	rng_state = 777;
	for (int i = 0; i < lay.n_tensors; i++) {
		const struct sl_tensor_info *ti = &lay.t[i];
		const char *x = strstr(ti->name, ".mlp.experts.");
		char *nm;
		int e = -1;

		if (x && sscanf(x, ".mlp.experts.%d.", &e) == 1 && e > 0)
			continue;	/* written fused with expert 0 */
		if (x && strstr(x, "up_proj"))
			continue;	/* fused with gate_proj */
		nm = malloc(200);
		if (x) {
			/* the experts of a layer are contiguous: (E, 2Im, H) or (E, H, Im) */
			bool down = strstr(x, "down_proj") != NULL;
			size_t numel = (size_t)mc.n_experts * 2 * ti->numel / (down ? 2 : 1);

			data[n] = malloc(numel * sizeof(float));
			for (size_t k = 0; k < numel; k++)
				data[n][k] = (float)(0.4 * rng_normal());
			snprintf(nm, 200, "model.language_model.%.*s.mlp.experts.%s",
				 (int)(x - ti->name - 6), ti->name + 6,
				 down ? "down_proj" : "gate_up_proj");
			t[n].ndim = 3;
			t[n].shape[0] = mc.n_experts;
			t[n].shape[1] = down ? ti->shape[0] : 2 * ti->shape[0];
			t[n].shape[2] = ti->shape[1];
		} else {
			data[n] = malloc(ti->numel * sizeof(float));
			for (size_t k = 0; k < ti->numel; k++)
				data[n][k] = (float)init_value(ti);
			if (!strncmp(ti->name, "model.", 6))
				snprintf(nm, 200, "model.language_model.%s", ti->name + 6);
			else
				snprintf(nm, 200, "%s", ti->name);
			t[n].ndim = ti->unsqueeze1 ? 3 : ti->ndim;
			t[n].shape[0] = ti->shape[0];
			t[n].shape[1] = ti->unsqueeze1 ? 1 : ti->shape[1];
			t[n].shape[2] = ti->shape[1];
		}
		t[n].name = nm;
		t[n].data = data[n];
		n++;
	}
	/* a vision tensor, which the trainer leaves out */
	data[n] = calloc(16, sizeof(float));
	t[n].name = strdup("model.visual.patch_embed.proj.weight");
	t[n].ndim = 2;
	t[n].shape[0] = 4;
	t[n].shape[1] = 4;
	t[n].data = data[n];
	n++;
	snprintf(p, sizeof(p), "%s/model.safetensors", dir);
	rc = sl_st_write(p, t, n, SL_DT_F32);
	for (int i = 0; i < n; i++)
		free((char *)t[i].name), free(data[i]);
	free(t), free(data);
	sl_layout_free(&lay);
	sl_model_config_free(&mc);
	return rc ? 1 : 0;
}

int main(int argc, char **argv)
{
	if (argc == 3 && !strcmp(argv[1], "--write-model"))
		return write_model(argv[2]);
	test_ops();
	test_layout();
	test_config();
	test_dense_equivalence();
	test_model();
	return test_exit("test_q35moe");
}
