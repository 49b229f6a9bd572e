/*
 * test_hf_parity: the CPU trainer against Hugging Face transformers.
 *
 * The reference values in test/fixtures/hf/reference.json were computed by transformers 5.17 in
 * float64 (test/fixtures/hf/gen_hf_fixture.py) on tiny random models it saved:
 *  - cls/: Qwen3ForSequenceClassification, fp32, head_dim != hidden/heads, GQA, hub-style
 *    rope_theta.  Checked: the initial scores and mean BCE, then `shardlm train` for 3 AdamW steps
 *    (two micro-batches of padded records, clipping that bites, cosine schedule with warmup,
 *    head_lr_mult 2) against the reference losses and gradient norms, and `shardlm score` with the
 *    exported model against the reference scores after those steps.
 *  - lm/: Qwen3ForCausalLM, bf16, attention_bias, tied embeddings, rope_parameters.  It has no
 *    score.weight: it must load with a freshly initialized head, whose scores must equal that
 *    head applied to transformers' final hidden state at each record's last token.
 * Tolerance: 1e-4 relative.
 */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend.h"
#include "data.h"
#include "model.h"
#include "safetensors.h"
#include "testutil.h"

#define REL 1e-4

static double worst;	/* the largest relative difference seen, for the log */

static double track(double got, double want)
{
	double r = fabs(got - want) / fmax(fabs(want), 1e-12);

	if (r > worst)
		worst = r;
	return got;
}

static char fix[4096], tmp[4096], shardlm[4096];

struct loaded {
	struct sl_model_config mc;
	struct sl_layout lay;
	float **units;
	int n_init;
	bool *init;
};

static void unload(struct loaded *l)
{
	for (int u = 0; u < l->lay.n_units; u++)
		free(l->units[u]);
	free(l->units);
	free(l->init);
	sl_layout_free(&l->lay);
	sl_model_config_free(&l->mc);
}

static int load(struct loaded *l, const char *dir)
{
	struct sl_weights w;
	char p[8192];
	int n_unused = 0;

	snprintf(p, sizeof(p), "%s/config.json", dir);
	if (sl_model_config_load(&l->mc, p) || sl_model_layout(&l->mc, 0, &l->lay) ||
	    sl_weights_open(&w, dir))
		return -1;
	l->units = calloc(l->lay.n_units, sizeof(float *));
	l->init = calloc(l->lay.n_tensors, sizeof(bool));
	for (int u = 0; u < l->lay.n_units; u++)
		l->units[u] = calloc(l->lay.unit_numel[u], sizeof(float));
	if (sl_weights_load_layout(&w, &l->lay, l->units, l->mc.initializer_range, 1234, l->init,
				   &l->n_init, &n_unused))
		return -1;
	sl_weights_close(&w);
	return 0;
}

struct src_ctx {
	void **w, **g;
};

static const void *src_w(void *ctx, int u)
{
	return ((struct src_ctx *)ctx)->w[u];
}

static void *src_g(void *ctx, int u)
{
	return ((struct src_ctx *)ctx)->g[u];
}

/* logits of the fixture's records through the library (forward only) */
static void scores_of(struct loaded *l, const struct sl_dataset *ds, float *out)
{
	struct sl_backend *be = sl_backend_cpu_create();
	struct src_ctx ctx = { calloc(l->lay.n_units, sizeof(void *)),
			       calloc(l->lay.n_units, sizeof(void *)) };
	struct sl_unit_source src = { .ctx = &ctx, .weights = src_w, .grads = src_g };
	struct sl_host_batch hb;
	int idx[16], L = 0;

	for (int u = 0; u < l->lay.n_units; u++) {
		ctx.w[u] = be->alloc(be, l->lay.unit_numel[u] * be->elt);
		ctx.g[u] = be->alloc(be, l->lay.unit_numel[u] * be->elt);
		be->upload(be, ctx.w[u], l->units[u], l->lay.unit_numel[u] * sizeof(float));
	}
	for (int i = 0; i < ds->n; i++) {
		idx[i] = i;
		if (ds->rec[i].len > L)
			L = ds->rec[i].len;
	}
	/* all records in one padded micro-batch: padding must not change any score */
	sl_host_batch_alloc(&hb, ds->n, L);
	sl_host_batch_fill(&hb, ds, idx, ds->n, 0);
	struct sl_model *m = sl_model_create(&l->mc, &l->lay, be, ds->n * L, ds->n, false);
	int32_t *d_ids = be->alloc(be, ds->n * L * 4), *d_lens = be->alloc(be, ds->n * 4);
	int32_t *d_last = be->alloc(be, ds->n * 4);
	be->upload(be, d_ids, hb.ids, ds->n * L * 4);
	be->upload(be, d_lens, hb.lens, ds->n * 4);
	be->upload(be, d_last, hb.last, ds->n * 4);
	struct sl_batch_dev b = { .B = ds->n, .L = L, .ids = d_ids, .lens = d_lens,
				  .last = d_last, .labels = NULL, .h_lens = hb.lens };
	sl_model_score(m, &src, &b, out);
	sl_model_destroy(m);
	be->free(be, d_ids);
	be->free(be, d_lens);
	be->free(be, d_last);
	for (int u = 0; u < l->lay.n_units; u++) {
		be->free(be, ctx.w[u]);
		be->free(be, ctx.g[u]);
	}
	free(ctx.w);
	free(ctx.g);
	sl_host_batch_free(&hb);
	be->destroy(be);
}

static double num_at(json_t *arr, int i)
{
	return json_number_value(json_array_get(arr, i));
}

static double bce(double z, double y)
{
	return fmax(z, 0) - z * y + log1p(exp(-fabs(z)));
}

int main(void)
{
	json_error_t jerr;
	char p[8192], cmd[16384];
	struct sl_dataset ds = { 0 };
	struct sl_data_opts o = { .text_field = "text", .label_field = "label", .need_label = true,
				  .vocab = 96 };
	struct loaded cls = { 0 }, lm = { 0 };
	float s[4];

	snprintf(fix, sizeof(fix), "%s/test/fixtures/hf", test_srcdir());
	snprintf(shardlm, sizeof(shardlm), "%s/src/shardlm", test_builddir());
	snprintf(tmp, sizeof(tmp), "/tmp/sl-hf-parity-XXXXXX");
	if (!mkdtemp(tmp))
		return 99;
	snprintf(p, sizeof(p), "%s/reference.json", fix);
	json_t *ref = json_load_file(p, 0, &jerr);
	CHECK(ref, "cannot read %s", p);
	if (!ref)
		return test_exit("test_hf_parity");
	json_t *rc = json_object_get(ref, "cls");
	json_t *tr = json_object_get(rc, "train");

	snprintf(p, sizeof(p), "%s/records.jsonl", fix);
	CHECK(sl_data_load(&ds, p, &o) == 0);
	CHECK(ds.n == 4);

	/* 1. initial scores and loss of the classification model */
	snprintf(p, sizeof(p), "%s/cls", fix);
	CHECK(load(&cls, p) == 0);
	CHECK(cls.n_init == 0, "cls has score.weight: nothing should be initialized");
	scores_of(&cls, &ds, s);
	double loss = 0;
	for (int i = 0; i < 4; i++) {
		CHECK_CLOSE(track(s[i], num_at(json_object_get(rc, "scores0"), i)),
			    num_at(json_object_get(rc, "scores0"), i), REL, 1e-6);
		loss += bce(s[i], ds.rec[i].label) / 4;
	}
	CHECK_CLOSE(loss, json_number_value(json_object_get(rc, "loss0")), REL, 0);

	/* 2. three AdamW steps through `shardlm train` */
	char cfg[8192], yaml[16384];
	snprintf(cfg, sizeof(cfg), "%s/parity.yaml", tmp);
	snprintf(yaml, sizeof(yaml),
		 "model: {path: %s/cls}\ntask: classify\nbackend: cpu\n"
		 "data: {train: %s/records.jsonl, shuffle: false, length_sort: false, max_state: 64}\n"
		 "train: {batch: 2, accum: 2, steps: %d, eval_every: 0}\n"
		 "optim: {lr: %.17g, schedule: cosine, warmup: %d, min_lr: %.17g, betas: [%.17g, %.17g],"
		 " eps: %.17g, weight_decay: %.17g, clip: %.17g, head_lr_mult: %.17g}\n"
		 "checkpoint: {every: 0}\nexport: {dtype: fp32}\nrun: {dir: %s/run, log_every: 1}\n",
		 fix, fix, (int)json_integer_value(json_object_get(tr, "steps")),
		 json_number_value(json_object_get(tr, "lr")),
		 (int)json_integer_value(json_object_get(tr, "warmup")),
		 json_number_value(json_object_get(tr, "min_lr")),
		 num_at(json_object_get(tr, "betas"), 0), num_at(json_object_get(tr, "betas"), 1),
		 json_number_value(json_object_get(tr, "eps")),
		 json_number_value(json_object_get(tr, "weight_decay")),
		 json_number_value(json_object_get(tr, "clip")),
		 json_number_value(json_object_get(tr, "head_lr_mult")), tmp);
	FILE *f = fopen(cfg, "w");
	fputs(yaml, f);
	fclose(f);
	snprintf(cmd, sizeof(cmd), "OMP_NUM_THREADS=1 %s train %s > %s/train.out 2>&1", shardlm,
		 cfg, tmp);
	int rcode = system(cmd);
	CHECK(rcode == 0, "shardlm train failed (%d); see %s/train.out", rcode, tmp);

	snprintf(p, sizeof(p), "%s/run/training_metrics.json", tmp);
	json_t *tm = json_load_file(p, 0, &jerr);
	CHECK(tm, "no %s", p);
	json_t *steps = json_object_get(tm, "steps");
	CHECK(json_array_size(steps) == 3);
	for (int i = 0; i < 3 && i < (int)json_array_size(steps); i++) {
		json_t *st = json_array_get(steps, i);

		track(json_number_value(json_object_get(st, "loss")),
		      num_at(json_object_get(rc, "losses"), i));
		track(json_number_value(json_object_get(st, "grad_norm")),
		      num_at(json_object_get(rc, "grad_norms"), i));
		CHECK_CLOSE(json_number_value(json_object_get(st, "loss")),
			    num_at(json_object_get(rc, "losses"), i), REL, 0);
		CHECK_CLOSE(json_number_value(json_object_get(st, "grad_norm")),
			    num_at(json_object_get(rc, "grad_norms"), i), REL, 0);
		CHECK_CLOSE(json_number_value(json_object_get(st, "lr")),
			    num_at(json_object_get(rc, "lrs"), i), 1e-9, 0);
		CHECK(json_integer_value(json_object_get(st, "records")) == 4);
	}

	/* 3. the exported model scores as transformers' model after the same 3 steps */
	snprintf(cmd, sizeof(cmd), "%s score %s --data %s/records.jsonl > %s/scores.jsonl "
		 "2> %s/score.err", shardlm, cfg, fix, tmp, tmp);
	rcode = system(cmd);
	CHECK(rcode == 0, "shardlm score failed (%d); see %s/score.err", rcode, tmp);
	snprintf(p, sizeof(p), "%s/scores.jsonl", tmp);
	f = fopen(p, "r");
	int n = 0;
	char line[4096];
	while (f && fgets(line, sizeof(line), f)) {
		json_t *j = json_loads(line, 0, &jerr);
		CHECK(j, "bad score line: %s", line);
		if (!j)
			continue;
		int i = json_integer_value(json_object_get(j, "index"));
		double z = json_number_value(json_object_get(j, "score"));
		double pr = json_number_value(json_object_get(j, "prob"));
		CHECK(i == n);
		CHECK_CLOSE(track(z, num_at(json_object_get(rc, "scores3"), i)),
			    num_at(json_object_get(rc, "scores3"), i), REL, 1e-6);
		CHECK_CLOSE(pr, 1 / (1 + exp(-num_at(json_object_get(rc, "scores3"), i))), REL, 0);
		json_decref(j);
		n++;
	}
	if (f)
		fclose(f);
	CHECK(n == 4, "%d score lines", n);

	/* 4. a causal-LM checkpoint gets a new head; scores = head . HF hidden state */
	snprintf(p, sizeof(p), "%s/lm", fix);
	CHECK(load(&lm, p) == 0);
	CHECK(lm.n_init == 1, "exactly score.weight is initialized, got %d", lm.n_init);
	const struct sl_tensor_info *hi = sl_layout_find(&lm.lay, "score.weight");
	CHECK(hi && lm.init[hi - lm.lay.t]);
	if (hi) {
		const float *hw = lm.units[hi->unit] + hi->offset;
		double mean = 0, var = 0;

		for (size_t k = 0; k < hi->numel; k++)
			mean += hw[k] / hi->numel;
		for (size_t k = 0; k < hi->numel; k++)
			var += (hw[k] - mean) * (hw[k] - mean) / hi->numel;
		/* 48 draws: the sample std is within 25% of initializer_range (0.08) */
		CHECK(fabs(sqrt(var) - lm.mc.initializer_range) < 0.25 * lm.mc.initializer_range,
		      "head std %g, initializer_range %g", sqrt(var), lm.mc.initializer_range);
		scores_of(&lm, &ds, s);
		json_t *hl = json_object_get(json_object_get(ref, "lm"), "hidden_last");
		for (int i = 0; i < 4; i++) {
			double want = 0, scale = 0;

			for (int k = 0; k < lm.mc.hidden; k++) {
				double h = num_at(json_array_get(hl, i), k);
				want += hw[k] * h;
				scale += fabs(hw[k] * h);
			}
			/* relative to the sum of magnitudes: the dot product may cancel */
			CHECK(fabs(s[i] - want) <= REL * scale, "lm score %d: %.9g, want %.9g",
			      i, s[i], want);
		}
	}
	CHECK(lm.mc.attention_bias && lm.mc.tie_word_embeddings);

	printf("largest relative difference from transformers (scores, losses, grad norms): "
	       "%.3g\n", worst);
	if (!test_failures) {
		snprintf(cmd, sizeof(cmd), "rm -rf %s", tmp);
		system(cmd);
	}
	json_decref(tm);
	json_decref(ref);
	unload(&cls);
	unload(&lm);
	sl_data_free(&ds);
	return test_exit("test_hf_parity");
}
