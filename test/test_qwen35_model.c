/*
 * test_qwen35_model: a tiny Qwen3.5 hybrid classifier (Gated DeltaNet, Gated DeltaNet, gated
 * attention, Gated DeltaNet) through model.c / model_qwen35.c on the cpu backends:
 *  - every tensor's gradient (small tensors entirely, larger ones at ~8 elements) against
 *    fourth-order central differences of the model's own loss (cpu64), on a padded micro-batch
 *    whose longest record crosses a 64-token chunk;
 *  - activation checkpointing gives identical losses and gradients;
 *  - padding and batch-mates change no record's score (each record scored alone);
 *  - the fp32 backend against the double one;
 *  - the layout (HF names, fused groups, the Conv1d weight's HF shape);
 *  - config.json: qwen3_5_text and qwen3_5 (text_config) parse to the same model, layer_types
 *    and full_attention_interval, partial_rotary_factor spellings, and clear refusals.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fdcheck.h"

#define VOCAB 11
#define MAXB 3
#define MAXL 70

static void fill_config(struct sl_model_config *mc)
{
	static const enum sl_layer_kind kinds[4] = {
		SL_LAYER_LINEAR_ATTENTION, SL_LAYER_LINEAR_ATTENTION, SL_LAYER_GATED_ATTENTION,
		SL_LAYER_LINEAR_ATTENTION
	};

	tiny_config(mc, "qwen3_5_text", 4);
	mc->vocab = VOCAB;
	mc->hidden = 8;
	mc->n_heads = 2;
	mc->n_kv_heads = 1;
	mc->head_dim = 8;
	mc->intermediate = 12;
	mc->max_position = 256;
	mc->norm_offset = true;
	mc->rot_dim = 4;
	mc->lin_nk = 1;
	mc->lin_nv = 2;
	mc->lin_dk = 4;
	mc->lin_dv = 3;
	mc->lin_conv = 3;
	memcpy(mc->layer_kind, kinds, sizeof(kinds));
}

static void env_init(struct env *e, const struct sl_model_config *mc, struct sl_backend *be,
		     bool ckpt)
{
	env_init_q35(e, mc, be, 0, ckpt, MAXB * MAXL, MAXB, NULL);
}

struct hbatch {
	int B, L;
	int32_t ids[MAXB * MAXL], lens[MAXB], last[MAXB];
	float labels[MAXB];
};

/* records @rec of @all (ids of MAXL each) into one padded micro-batch */
static void make_batch(struct hbatch *hb, const struct hbatch *all, const int *rec, int B)
{
	hb->B = B;
	hb->L = 0;
	for (int b = 0; b < B; b++)
		if (all->lens[rec[b]] > hb->L)
			hb->L = all->lens[rec[b]];
	for (int b = 0; b < B; b++) {
		hb->lens[b] = all->lens[rec[b]];
		hb->last[b] = b * hb->L + hb->lens[b] - 1;
		hb->labels[b] = all->labels[rec[b]];
		for (int p = 0; p < hb->L; p++)	/* padding: any valid id */
			hb->ids[b * hb->L + p] = p < hb->lens[b] ? all->ids[rec[b] * MAXL + p] :
								   (p * 7 + b) % VOCAB;
	}
}

/* train step (train = true: forward + backward) or score; returns loss_scale * loss_sum */
static double run(struct env *e, const struct hbatch *hb, bool train, float *scores)
{
	struct sl_backend *be = e->be;
	size_t T = (size_t)hb->B * hb->L;
	int32_t *ids = be->alloc(be, T * 4), *lens = be->alloc(be, hb->B * 4);
	int32_t *last = be->alloc(be, hb->B * 4);
	float *labels = be->alloc(be, hb->B * 4);
	struct sl_batch_dev b = { .B = hb->B, .L = hb->L, .ids = ids, .lens = lens, .last = last,
				  .labels = labels, .h_lens = hb->lens };
	struct sl_unit_source src = env_source(e, false);
	double loss = 0;
	int rc;

	be->upload(be, ids, hb->ids, T * 4);
	be->upload(be, lens, hb->lens, hb->B * 4);
	be->upload(be, last, hb->last, hb->B * 4);
	be->upload(be, labels, hb->labels, hb->B * 4);
	if (train)
		rc = sl_model_train_step(e->m, &src, &b, 0.5f, &loss, scores);
	else
		rc = sl_model_score(e->m, &src, &b, scores);
	CHECK(rc == 0, "model step: %d", rc);
	be->free(be, ids), be->free(be, lens), be->free(be, last), be->free(be, labels);
	return 0.5 * loss;
}

/* the loss (double, from the train step: the scores come back as float) with parameter i at v */
static double loss_at(struct env *e, const struct hbatch *hb, size_t i, double v)
{
	float s[MAXB];
	double l;

	put(e, i, v);
	l = run(e, hb, true, s);
	put(e, i, e->params[i]);
	zero_grads(e);
	return l;
}

/* fourth-order central difference: the layers' curvature makes the plain one too coarse */
static double fd_grad(struct env *e, const void *hb, const struct sl_tensor_info *t, size_t i)
{
	const double h = 1e-6, x = e->params[i];

	return (-loss_at(e, hb, i, x + 2 * h) + 8 * loss_at(e, hb, i, x + h) -
		8 * loss_at(e, hb, i, x - h) + loss_at(e, hb, i, x - 2 * h)) / (12 * h);
}

static void test_model(void)
{
	struct sl_model_config mc;
	struct env e, ec, e32;
	struct hbatch all = { .B = 3 }, hb;
	const int recs[3] = { 0, 1, 2 };
	double *gA, *gC, *g32, lossA, lossC, loss32;
	float sA[MAXB], sC[MAXB], s32[MAXB], s1;
	size_t N;
	int bad = 0, n_fd = 0;

	fill_config(&mc);
	rng_state = 99;
	all.lens[0] = 70, all.lens[1] = 9, all.lens[2] = 33;
	all.labels[0] = 0.2f, all.labels[1] = 0.9f, all.labels[2] = 0.6f;
	for (int i = 0; i < MAXB * MAXL; i++)
		all.ids[i] = (int32_t)(rng_unif() * VOCAB);
	make_batch(&hb, &all, recs, 3);

	env_init(&e, &mc, sl_backend_cpu64_create(), false);
	if (!e.m)
		return;
	N = e.lay.total_numel;
	gA = calloc(N, sizeof(double)), gC = calloc(N, sizeof(double));
	g32 = calloc(N, sizeof(double));

	lossA = run(&e, &hb, true, sA);
	take_grads(&e, gA);
	{
		double ref = 0;

		for (int b = 0; b < 3; b++)
			ref += log1p(exp(sA[b])) - sA[b] * hb.labels[b];
		CHECK_CLOSE(lossA, 0.5 * ref, 1e-6, 1e-9);
	}

	/*
	 * Every tensor: small ones (norms, A_log, dt_bias, ...) entirely, larger ones at about 8
	 * elements spread over them; the padding between tensors must have no gradient.
	 */
	n_fd = check_fd_sampled(&e, gA, 24, 8, 1e-6, fd_grad, &hb, &bad);
	CHECK(bad == 0, "%d of %d parameters' gradients differ from finite differences", bad,
	      n_fd);

	/* each record alone: the same score (padding and batch-mates change nothing) */
	for (int b = 0; b < 3; b++) {
		struct hbatch one;

		make_batch(&one, &all, &recs[b], 1);
		run(&e, &one, false, &s1);
		CHECK_CLOSE(s1, sA[b], 1e-12, 1e-14);
	}

	/* activation checkpointing: identical */
	env_init(&ec, &mc, sl_backend_cpu64_create(), true);
	lossC = run(&ec, &hb, true, sC);
	take_grads(&ec, gC);
	check_identical(lossC, lossA, gC, gA, N, &bad);

	/* the fp32 backend */
	env_init(&e32, &mc, sl_backend_cpu_create(), false);
	loss32 = run(&e32, &hb, true, s32);
	take_grads(&e32, g32);
	CHECK_CLOSE(loss32, lossA, 1e-5, 1e-6);
	check_rel_norm(g32, gA, N, 1e-4, "fp32");
	printf("hybrid model: %d parameters checked against finite differences\n", n_fd);
	env_destroy(&e), env_destroy(&ec), env_destroy(&e32);
	free(gA), free(gC), free(g32);
	free_config(&mc);
}

static void test_layout(void)
{
	struct sl_model_config mc;
	struct sl_layout lay;
	const struct sl_tensor_info *qkv, *z, *b, *a, *cv, *q, *k, *v, *al;

	fill_config(&mc);
	CHECK(sl_model_layout(&mc, 0, &lay) == 0, "layout");
	qkv = sl_layout_find(&lay, "model.layers.0.linear_attn.in_proj_qkv.weight");
	z = sl_layout_find(&lay, "model.layers.0.linear_attn.in_proj_z.weight");
	b = sl_layout_find(&lay, "model.layers.0.linear_attn.in_proj_b.weight");
	a = sl_layout_find(&lay, "model.layers.0.linear_attn.in_proj_a.weight");
	cv = sl_layout_find(&lay, "model.layers.3.linear_attn.conv1d.weight");
	q = sl_layout_find(&lay, "model.layers.2.self_attn.q_proj.weight");
	k = sl_layout_find(&lay, "model.layers.2.self_attn.k_proj.weight");
	v = sl_layout_find(&lay, "model.layers.2.self_attn.v_proj.weight");
	al = sl_layout_find(&lay, "model.layers.1.linear_attn.A_log");
	CHECK(qkv && z && b && a && cv && q && k && v && al, "names");
	if (qkv && z && b && a && cv && q && k && v && al) {
		CHECK(qkv->shape[0] == 2 * 4 + 2 * 3 && qkv->shape[1] == 8, "in_proj_qkv shape");
		CHECK(z->offset == qkv->offset + qkv->numel && b->offset == z->offset + z->numel &&
		      a->offset == b->offset + b->numel, "in_proj_* fused");
		CHECK(cv->unsqueeze1 && cv->shape[0] == 14 && cv->shape[1] == 3 && cv->decay &&
		      cv->unit == 4, "conv1d (C, 1, K) in HF files, decays");
		CHECK(q->shape[0] == 2 * 2 * 8 && k->offset == q->offset + q->numel &&
		      v->offset == k->offset + k->numel, "q_proj carries the gate; q, k, v fused");
		CHECK(!al->decay && al->numel == 2, "A_log");
	}
	CHECK(!sl_layout_find(&lay, "model.layers.2.linear_attn.A_log") &&
	      !sl_layout_find(&lay, "model.layers.0.self_attn.q_proj.weight"), "kinds per layer");
	/* MFU's matmul parameters leave the convolution out */
	{
		double n = 0;

		for (int i = 0; i < lay.n_tensors; i++)
			if (lay.t[i].ndim == 2 && lay.t[i].unit && !lay.t[i].unsqueeze1)
				n += lay.t[i].numel;
		CHECK(sl_model_matmul_params(&mc, &lay) == n, "matmul params");
	}
	/* MFU's mixer FLOPs: 3 Gated DeltaNet layers (18 dk dv nv per token), 1 attention layer */
	CHECK(sl_model_mixer_flops(&mc, 10) == 3 * 18.0 * 4 * 3 * 2 * 10 +
					       12.0 * 8 * 2 * 10 * 11 / 2, "mixer flops");
	sl_layout_free(&lay);
	free_config(&mc);
}

/* ---- config.json ----------------------------------------------------------------------------- */

static char tmpdir[64];

static int load_text(const char *text, struct sl_model_config *mc)
{
	return load_config_text(tmpdir, text, mc);
}

#define TEXT_KEYS                                                                            \
	"\"vocab_size\": 248320, \"hidden_size\": 5120, \"num_hidden_layers\": 8,"              \
	"\"num_attention_heads\": 24, \"num_key_value_heads\": 4, \"head_dim\": 256,"          \
	"\"intermediate_size\": 17408, \"linear_num_key_heads\": 16,"                          \
	"\"linear_num_value_heads\": 48, \"linear_key_head_dim\": 128,"                        \
	"\"linear_value_head_dim\": 128, \"linear_conv_kernel_dim\": 4, \"eos_token_id\": 7,"

static void test_config(void)
{
	struct sl_model_config mc, mp;

	snprintf(tmpdir, sizeof(tmpdir), "/tmp/sl-q35-XXXXXX");
	CHECK(mkdtemp(tmpdir), "tmpdir");

	/* a text config without layer_types: every 4th layer full attention */
	CHECK(load_text("{\"model_type\": \"qwen3_5_text\"," TEXT_KEYS
			"\"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": 1e7,"
			"\"partial_rotary_factor\": 0.25, \"mrope_section\": [11, 11, 10],"
			"\"mrope_interleaved\": true}}", &mc) == 0, "qwen3_5_text");
	CHECK(mc.norm_offset && mc.rot_dim == 64 && mc.lin_nk == 16 && mc.lin_nv == 48 &&
	      mc.lin_dk == 128 && mc.lin_dv == 128 && mc.lin_conv == 4 && mc.rope_theta == 1e7,
	      "qwen3_5_text dims");
	for (int l = 0; l < 8; l++)
		CHECK(mc.layer_kind[l] == (l % 4 == 3 ? SL_LAYER_GATED_ATTENTION :
						       SL_LAYER_LINEAR_ATTENTION), "layer %d kind", l);

	/* the published vision-language layout: the same model from text_config */
	CHECK(load_text("{\"model_type\": \"qwen3_5\", \"architectures\": "
			"[\"Qwen3_5ForConditionalGeneration\"], \"tie_word_embeddings\": false,"
			"\"vision_config\": {\"depth\": 27}, \"text_config\": {\"model_type\": "
			"\"qwen3_5_text\"," TEXT_KEYS "\"partial_rotary_factor\": 0.25,"
			"\"rope_theta\": 1e7, \"layer_types\": [\"linear_attention\","
			"\"linear_attention\", \"linear_attention\", \"full_attention\","
			"\"linear_attention\", \"linear_attention\", \"linear_attention\","
			"\"full_attention\"]}}", &mp) == 0, "qwen3_5");
	CHECK(mp.hidden == mc.hidden && mp.rot_dim == mc.rot_dim && mp.vocab == mc.vocab &&
	      mp.eos_token_id == 7 && mp.rope_theta == 1e7 && mp.norm_offset, "qwen3_5 dims");
	for (int l = 0; l < 8; l++)
		CHECK(mp.layer_kind[l] == mc.layer_kind[l], "qwen3_5 layer %d kind", l);
	sl_model_config_free(&mc);
	sl_model_config_free(&mp);

	fprintf(stderr, "(the errors below are expected)\n");
	CHECK(load_text("{\"model_type\": \"qwen3_5_moe\"}", &mc) < 0,
	      "qwen3_5_moe without text_config");
	CHECK(load_text("{\"model_type\": \"qwen3_5\", " TEXT_KEYS "\"x\": 1}", &mc) < 0,
	      "qwen3_5 without text_config");
	CHECK(load_text("{\"model_type\": \"qwen3_5_text\"," TEXT_KEYS
			"\"layer_types\": [\"sliding_attention\", \"full_attention\"]}", &mc) < 0,
	      "bad layer_types");
	CHECK(load_text("{\"model_type\": \"qwen3_5_text\"," TEXT_KEYS
			"\"partial_rotary_factor\": 0.001}", &mc) < 0, "no rotated dims");
	{
		char p[128];

		snprintf(p, sizeof(p), "rm -rf %s", tmpdir);
		CHECK(system(p) == 0, "cleanup");
	}
}

int main(void)
{
	test_layout();
	test_config();
	test_model();
	return test_exit("test_qwen35_model");
}
