/*
 * test_gradcheck: the model's backward (model.c over the cpu backends) against central finite
 * differences of its own loss, in double, for every parameter of a tiny Qwen3 classifier, with and
 * without attention biases.  Also: gradient accumulation over micro-batches, activation
 * checkpointing (identical gradients), padding invariance, and the fp32 backend against the
 * double one.  All of it twice: with the last layer run on the head's rows only (the default),
 * and whole: SHARDLM_PRUNE_LAST=2 (the default; classify's attention with only those rows as
 * queries), 1 (the attention on every row) and 0.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define VOCAB 23
#define MAXT 32
#define MAXB 4

#include "fdbatch.h"

static void check_same(const double *a, const double *b, size_t n, double rel, const char *what)
{
	double worst = 0;
	int bad = 0;

	for (size_t i = 0; i < n; i++) {
		double d = fabs(a[i] - b[i]);

		if (d > worst)
			worst = d;
		if (d > rel * fabs(b[i]) + 1e-300 && bad++ < 5)
			CHECK(0, "%s: element %zu: %.17g vs %.17g", what, i, a[i], b[i]);
	}
	CHECK(bad == 0, "%s: %d elements differ (max abs diff %g)", what, bad, worst);
}

static void run_config(bool bias)
{
	struct sl_model_config mc;
	struct env e, ec, e32;
	struct hbatch hb[2], hb2;
	const int lensA[3] = { 5, 2, 7 }, lensB[2] = { 3, 6 };
	const float labA[3] = { 0.2f, 0.9f, 0.55f }, labB[2] = { 0.7f, 0.05f };
	const float scale = 1.0f / 3;
	float sA[3], sC[3], s32[3], s1;
	double *gA, *gB, *gAB, *gC, *g32, lossA, lossC, loss32, gmax = 0;
	size_t N;
	char what[64];

	qwen3_config(&mc, "qwen3", 2, bias);
	env_init(&e, &mc, sl_backend_cpu64_create(), false);
	if (!e.m)
		return;
	N = e.lay.total_numel;
	gA = calloc(N, sizeof(double));
	gB = calloc(N, sizeof(double));
	gAB = calloc(N, sizeof(double));
	gC = calloc(N, sizeof(double));
	g32 = calloc(N, sizeof(double));

	rng_state = 777;
	make_batch(&hb[0], 3, lensA, labA);
	make_batch(&hb[1], 2, lensB, labB);

	/* loss against the BCE of the returned scores, and the hooks */
	zero_grads(&e);
	e.n_fwd_release = e.n_bwd_release = 0;
	lossA = run_step(&e, &hb[0], scale, sA);
	CHECK(e.n_fwd_release == e.lay.n_units && e.n_bwd_release == e.lay.n_units,
	      "release hooks: %d fwd, %d bwd for %d units", e.n_fwd_release, e.n_bwd_release,
	      e.lay.n_units);
	{
		double ref = 0;

		for (int b = 0; b < 3; b++) {
			double z = sA[b], y = labA[b];

			ref += log(1 + exp(z)) - z * y;
		}
		CHECK_CLOSE(lossA, scale * ref, 1e-6, 1e-9);
	}
	get_grads(&e, gA);

	/* every parameter against finite differences */
	snprintf(what, sizeof(what), "bias=%d batch A", bias);
	check_fd(&e, &hb[0], 1, scale, gA, 1, what);

	/* accumulation: A then B into the same grads is gA + gB, and matches d(LA + LB) */
	zero_grads(&e);
	run_step(&e, &hb[1], scale, NULL);
	get_grads(&e, gB);
	zero_grads(&e);
	run_step(&e, &hb[0], scale, NULL);
	run_step(&e, &hb[1], scale, NULL);
	get_grads(&e, gAB);
	for (size_t i = 0; i < N; i++)
		gB[i] += gA[i];
	snprintf(what, sizeof(what), "bias=%d accum A+B", bias);
	check_same(gAB, gB, N, 1e-12, what);
	check_fd(&e, hb, 2, scale, gAB, 5, what);

	/* activation checkpointing: identical loss, scores and gradients */
	env_init(&ec, &mc, sl_backend_cpu64_create(), true);
	zero_grads(&ec);
	lossC = run_step(&ec, &hb[0], scale, sC);
	get_grads(&ec, gC);
	CHECK(lossC == lossA, "checkpointed loss %.17g vs %.17g", lossC, lossA);
	for (int b = 0; b < 3; b++)
		CHECK(sC[b] == sA[b], "checkpointed score %d: %.9g vs %.9g", b, sC[b], sA[b]);
	snprintf(what, sizeof(what), "bias=%d checkpointing", bias);
	check_same(gC, gA, N, 0, what);
	env_destroy(&ec);

	/* padding: each record alone scores as inside the batch */
	for (int b = 0; b < 3; b++) {
		struct hbatch one;
		int len = lensA[b];

		make_batch(&one, 1, &len, &labA[b]);
		memcpy(one.ids, &hb[0].ids[b * hb[0].L], len * sizeof(int32_t));
		CHECK(score_only(&e, &one, &s1) == 0, "%s", "");
		CHECK_CLOSE(s1, sA[b], 1e-12, 1e-14);
	}
	/* padded ids change nothing, to the bit */
	hb2 = hb[0];
	for (int b = 0; b < 3; b++)
		for (int t = lensA[b]; t < hb2.L; t++)
			hb2.ids[b * hb2.L + t] = (hb2.ids[b * hb2.L + t] + 1 + b) % VOCAB;
	zero_grads(&e);
	CHECK(run_step(&e, &hb2, scale, sC) == lossA, "%s", "");
	get_grads(&e, gC);
	for (int b = 0; b < 3; b++)
		CHECK(sC[b] == sA[b], "padded ids changed score %d", b);
	snprintf(what, sizeof(what), "bias=%d padded ids", bias);
	check_same(gC, gA, N, 0, what);

	/* the fp32 backend agrees with the double one: fp32's rounding over two layers' backward
	 * leaves the worst element at 0.7-0.95e-4 of (|g| + 1e-3 max|g|) with the attention on
	 * every row, 1.5e-4 with it on the head's rows (SHARDLM_PRUNE_LAST unset or 2: the rows'
	 * q|k|v and every token's k|v sum in another order) */
	env_init(&e32, &mc, sl_backend_cpu_create(), false);
	zero_grads(&e32);
	loss32 = run_step(&e32, &hb[0], scale, s32);
	get_grads(&e32, g32);
	CHECK_CLOSE(loss32, lossA, 1e-5, 1e-6);
	for (int b = 0; b < 3; b++)
		CHECK_CLOSE(s32[b], sA[b], 1e-4, 1e-5);
	for (size_t i = 0; i < N; i++)
		gmax = fmax(gmax, fabs(gA[i]));
	{
		const char *pl = getenv("SHARDLM_PRUNE_LAST");
		const double bound = !pl || !strcmp(pl, "2") ? 2e-4 : 1e-4;
		double worst = 0;

		for (size_t i = 0; i < N; i++) {
			double d = fabs(g32[i] - gA[i]) / (fabs(gA[i]) + 1e-3 * gmax);

			worst = fmax(worst, d);
			if (d > bound)
				CHECK(0, "bias=%d fp32 grad %zu: %.9g vs %.9g", bias, i, g32[i],
				      gA[i]);

		}
		printf("bias=%d fp32 vs fp64: worst grad |d| / (|g| + 1e-3 max|g|) = %.2e\n", bias,
		       worst);
	}
	env_destroy(&e32);
	env_destroy(&e);
	free(gA);
	free(gB);
	free(gAB);
	free(gC);
	free(g32);
	free_config(&mc);
}

/*
 * task sft: the causal-LM head (untied, or tied to the embedding) against finite differences;
 * the loss against a direct computation of the targets' cross-entropies from logits that the test
 * computes itself from the final hidden states is left to the Hugging Face parity test.  Chunked
 * logits (3 rows per chunk) give the same loss and gradients as one chunk.
 */
static void run_sft(bool tied)
{
	struct sl_model_config mc;
	struct env e;
	struct hbatch hb[2];
	const int lensA[3] = { 5, 2, 7 }, lensB[2] = { 3, 6 };
	const float lab[3] = { 0 };
	const float scale = 1.0f / 9;
	double *g1, *g2, l1, l2;
	size_t N;
	char what[64];

	qwen3_config(&mc, "qwen3", 2, true);
	mc.tie_word_embeddings = tied;
	env_init_task(&e, &mc, sl_backend_cpu64_create(), false, 1);
	CHECK(sl_model_is_lm(e.m), "%s", "");
	CHECK((sl_layout_find(&e.lay, "lm_head.weight") != NULL) == !tied, "%s", "");
	CHECK(sl_layout_find(&e.lay, "score.weight") == NULL, "%s", "");
	N = e.lay.total_numel;
	g1 = calloc(N, sizeof(double));
	g2 = calloc(N, sizeof(double));
	rng_state = 4242;
	make_batch(&hb[0], 3, lensA, lab);
	make_batch(&hb[1], 2, lensB, lab);
	make_targets(&hb[0]);
	make_targets(&hb[1]);

	zero_grads(&e);
	e.n_fwd_release = e.n_bwd_release = 0;
	l1 = run_step(&e, &hb[0], scale, NULL);
	CHECK(l1 > 0, "sft loss %g", l1);
	get_grads(&e, g1);
	snprintf(what, sizeof(what), "sft tied=%d", tied);
	check_fd(&e, &hb[0], 1, scale, g1, 1, what);

	/* two micro-batches accumulate */
	zero_grads(&e);
	run_step(&e, &hb[0], scale, NULL);
	run_step(&e, &hb[1], scale, NULL);
	get_grads(&e, g2);
	snprintf(what, sizeof(what), "sft tied=%d accum", tied);
	check_fd(&e, hb, 2, scale, g2, 3, what);

	/* chunks of 3 rows: the same loss and gradients */
	sl_model_set_lm_chunk(e.m, 3);
	zero_grads(&e);
	l2 = run_step(&e, &hb[0], scale, NULL);
	get_grads(&e, g2);
	CHECK_CLOSE(l2, l1, 1e-13, 1e-15);
	snprintf(what, sizeof(what), "sft tied=%d chunked", tied);
	check_same(g2, g1, N, 1e-11, what);
	env_destroy(&e);
	free(g1);
	free(g2);
	free_config(&mc);
}

/* layout: HF names, fused groups contiguous, offsets aligned, units as model.h says */
static void check_layout(void)
{
	struct sl_model_config mc;
	struct sl_layout lay;
	const struct sl_tensor_info *q, *k, *v, *gt, *up, *sc, *bq, *bk, *bv;

	qwen3_config(&mc, "qwen3", 2, true);
	CHECK(sl_model_layout(&mc, 0, &lay) == 0, "%s", "");
	CHECK(lay.n_units == 4, "%s", "");
	q = sl_layout_find(&lay, "model.layers.1.self_attn.q_proj.weight");
	k = sl_layout_find(&lay, "model.layers.1.self_attn.k_proj.weight");
	v = sl_layout_find(&lay, "model.layers.1.self_attn.v_proj.weight");
	bq = sl_layout_find(&lay, "model.layers.1.self_attn.q_proj.bias");
	bk = sl_layout_find(&lay, "model.layers.1.self_attn.k_proj.bias");
	bv = sl_layout_find(&lay, "model.layers.1.self_attn.v_proj.bias");
	gt = sl_layout_find(&lay, "model.layers.1.mlp.gate_proj.weight");
	up = sl_layout_find(&lay, "model.layers.1.mlp.up_proj.weight");
	sc = sl_layout_find(&lay, "score.weight");
	CHECK(q && k && v && bq && bk && bv && gt && up && sc, "%s", "");
	if (!(q && k && v && bq && bk && bv && gt && up && sc))
		return;
	CHECK(q->unit == 2 && q->shape[0] == 32 && q->shape[1] == 12, "%s", "");
	CHECK(k->offset == q->offset + q->numel && v->offset == k->offset + k->numel, "%s", "");
	CHECK(bk->offset == bq->offset + bq->numel && bv->offset == bk->offset + bk->numel,
	      "bias group");
	CHECK(up->offset == gt->offset + gt->numel && up->shape[0] == 20, "%s", "");
	CHECK(sc->unit == 3 && sc->head && sc->optional && sc->decay &&
	      sc->init == SL_INIT_NORMAL, "score.weight flags");
	CHECK(sl_layout_find(&lay, "model.embed_tokens.weight")->unit == 0, "%s", "");
	CHECK(!sl_layout_find(&lay, "model.layers.1.self_attn.q_norm.weight")->decay, "%s", "");
	CHECK(sl_layout_find(&lay, "model.layers.1.self_attn.q_norm.weight")->numel == 8, "%s", "");
	{
		size_t total = 0;

		for (int u = 0; u < lay.n_units; u++) {
			CHECK(lay.unit_numel[u] % 16 == 0, "%s", "");
			total += lay.unit_numel[u];
		}
		CHECK(total == lay.total_numel, "%s", "");
	}
	for (int i = 0; i < lay.n_tensors; i++) {
		const struct sl_tensor_info *t = &lay.t[i];

		CHECK(t->offset + t->numel <= lay.unit_numel[t->unit], "%s", "");
		if (i && lay.t[i - 1].unit == t->unit)
			CHECK(t->offset >= lay.t[i - 1].offset + lay.t[i - 1].numel, "%s", "");
		if (t != k && t != v && t != bk && t != bv && t != up &&
		    !strstr(t->name, "k_proj") && !strstr(t->name, "v_proj") &&
		    !strstr(t->name, "up_proj"))
			CHECK(t->offset % 16 == 0, "%s at %zu", t->name, t->offset);
	}
	/* 2 layers x (q,k,v,o,gate,up,down) + score */
	CHECK(sl_model_matmul_params(&mc, &lay) ==
	      2.0 * (64 * 12 + 12 * 32 + 3 * 20 * 12) + 12, "%g",
	      sl_model_matmul_params(&mc, &lay));
	sl_layout_free(&lay);
	free_config(&mc);
}

int main(void)
{
	check_layout();
	/* the last layer on the head's rows only (model.c's default: classify's attention with
	 * just those rows as queries; these sft batches have at most half their tokens as
	 * targets), then with the attention on every row, then the whole last layer */
	for (int prune = 2; prune >= 0; prune--) {
		char v[2] = { (char)('0' + prune), 0 };

		setenv("SHARDLM_PRUNE_LAST", v, 1);
		printf("== SHARDLM_PRUNE_LAST=%d\n", prune);
		run_config(false);
		run_config(true);
		run_sft(false);
		run_sft(true);
	}
	return test_exit("test_gradcheck");
}
