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

#include "parity_util.h"

#define REL 1e-4

static char fix[4096], tmp[4096], shardlm[4096];

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
	run_lib(sl_backend_cpu_create(), &cls, &ds, s, NULL, NULL, NULL);
	double loss = 0;
	for (int i = 0; i < 4; i++) {
		CHECK_CLOSE(track(s[i], num_at(json_object_get(rc, "scores0"), i)),
			    num_at(json_object_get(rc, "scores0"), i), REL, 1e-6);
		loss += bce(s[i], ds.rec[i].label) / 4;
	}
	CHECK_CLOSE(loss, json_number_value(json_object_get(rc, "loss0")), REL, 0);

	/* 2. three AdamW steps through `shardlm train` */
	char cfg[8192], yaml[16384], optim[1024];
	snprintf(cfg, sizeof(cfg), "%s/parity.yaml", tmp);
	optim_yaml(optim, sizeof(optim), tr);
	snprintf(yaml, sizeof(yaml),
		 "model: {path: %s/cls}\ntask: classify\nbackend: cpu\n"
		 "data: {train: %s/records.jsonl, shuffle: false, length_sort: false, max_state: 64}\n"
		 "train: {batch: 2, accum: 2, steps: %d, eval_every: 0}\n%s"
		 "checkpoint: {every: 0}\nexport: {dtype: fp32}\nrun: {dir: %s/run, log_every: 1}\n",
		 fix, fix, (int)json_integer_value(json_object_get(tr, "steps")), optim, tmp);
	write_text(cfg, yaml);
	snprintf(p, sizeof(p), "%s/train.out", tmp);
	run_train(shardlm, cfg, 1, p, "cls");

	json_t *tm, *steps;
	snprintf(p, sizeof(p), "%s/run", tmp);
	steps = load_steps(p, &tm, "cls");
	for (int i = 0; i < 3 && i < (int)json_array_size(steps); i++) {
		json_t *st = json_array_get(steps, i);

		check_step(st, rc, i, REL, true, "cls");
		CHECK(json_integer_value(json_object_get(st, "records")) == 4);
	}

	/* 3. the exported model scores as transformers' model after the same 3 steps */
	snprintf(cmd, sizeof(cmd), "%s score %s --data %s/records.jsonl > %s/scores.jsonl "
		 "2> %s/score.err", shardlm, cfg, fix, tmp, tmp);
	int rcode = system(cmd);
	CHECK(rcode == 0, "shardlm score failed (%d); see %s/score.err", rcode, tmp);
	snprintf(p, sizeof(p), "%s/scores.jsonl", tmp);
	check_score_file(p, json_object_get(rc, "scores3"), 4, REL, 1e-6, true,
			 "scores after 3 steps");

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
		run_lib(sl_backend_cpu_create(), &lm, &ds, s, NULL, NULL, NULL);
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
	test_remove_dir(tmp);
	json_decref(tm);
	json_decref(ref);
	unload(&cls);
	unload(&lm);
	sl_data_free(&ds);
	return test_exit("test_hf_parity");
}
