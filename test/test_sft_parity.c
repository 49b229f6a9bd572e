/*
 * test_sft_parity: `shardlm train` with task sft against Hugging Face transformers.
 *
 * test/fixtures/sft/reference.json comes from transformers 5.17 in float64
 * (test/fixtures/sft/gen_sft_fixture.py): the initial loss and 3 AdamW steps (clip that bites,
 * cosine schedule with warmup, head_lr_mult 2) of a Qwen3ForCausalLM on 4 pre-tokenized records
 * with loss masks, the loss being the mean cross-entropy over every target token of the step.
 * Cases: an untied fp32 model (lm_head.weight, head_lr_mult applies) and the tied, biased bf16
 * model of test/fixtures/hf/lm.  Each runs as 2 micro-batches on one rank and as 1 micro-batch
 * on each of 2 ranks (the normalization spans micro-batches and ranks), and packed (data.pack:
 * several records in one row, attention confined to each), on the cpu backend.
 * The losses, gradient norms and learning rates must match within 1e-4 relative; the export is a
 * *ForCausalLM with the head as the source had it.
 */
#include <jansson.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "parity_util.h"

#define REL 1e-4

struct sft_case {
	const char *name;
	const char *model;	/* relative to test/fixtures */
	const char *records;	/* relative to test/fixtures */
	const char *ref;	/* reference file, relative to test/fixtures */
	const char *key;	/* its object */
	int np, batch, accum;
	bool tied;
	bool pack;		/* data.pack: records share rows (the loss must not change) */
	int padded;		/* padded tokens per step, by hand (records of 7, 13, 4, 9
				 * tokens; rows of up to 13); 0 = not checked */
};

static const struct sft_case cases[] = {
	{ "untied", "sft/untied", "sft/records.jsonl", "sft/reference.json", "untied", 1, 2, 2,
	  false },
	{ "untied-2ranks", "sft/untied", "sft/records.jsonl", "sft/reference.json", "untied", 2,
	  1, 2, false },
	{ "tied", "hf/lm", "sft/records.jsonl", "sft/reference.json", "tied", 1, 2, 2, true },
	{ "tied-2ranks", "hf/lm", "sft/records.jsonl", "sft/reference.json", "tied", 2, 2, 1,
	  true },
	/* one rank, one micro-batch a step: the gradients where the backward writes them
	 * (shard.c grad_direct), in layers' activations; tied: the embedding's is written from
	 * the head's backward on, while every layer's activations are still needed */
	{ "untied-direct", "sft/untied", "sft/records.jsonl", "sft/reference.json", "untied", 1,
	  4, 1, false },
	{ "tied-direct", "hf/lm", "sft/records.jsonl", "sft/reference.json", "tied", 1, 4, 1,
	  true },
	/* rows 13 | 9+4 | 7: 3 x 13 - 33 = 6 padded (unpacked: 4 x 13 - 33 = 19) */
	{ "untied-packed", "sft/untied", "sft/records.jsonl", "sft/reference.json", "untied", 1,
	  4, 1, false, true, 6 },
	/* rank 0 gets 4+7 in one row (0 padded), rank 1 13 | 9 (4 padded) */
	{ "tied-packed-2ranks", "hf/lm", "sft/records.jsonl", "sft/reference.json", "tied", 2, 2,
	  1, true, true, 4 },
};

static void run_case(const struct sft_case *k, const char *fix, const char *shardlm,
		     const char *tmp)
{
	char p[8192], cfg[8192], yaml[16384], cmd[24576], run[8192], optim[1024];
	json_error_t jerr;
	json_t *ref, *rc, *tr, *tm, *steps, *cj;
	int st;

	snprintf(p, sizeof(p), "%s/%s", fix, k->ref);
	ref = json_load_file(p, 0, &jerr);
	CHECK(ref, "cannot read %s", p);
	if (!ref)
		return;
	rc = json_object_get(ref, k->key);
	tr = json_object_get(rc, "train");
	snprintf(run, sizeof(run), "%s/run-%s", tmp, k->name);
	snprintf(cfg, sizeof(cfg), "%s/%s.yaml", tmp, k->name);
	optim_yaml(optim, sizeof(optim), tr);
	snprintf(yaml, sizeof(yaml),
		 "model: {path: %s/%s}\ntask: sft\nbackend: cpu\n"
		 "data: {train: %s/%s, shuffle: false, length_sort: false, max_state: 64, pack: %s}\n"
		 "train: {batch: %d, accum: %d, steps: %d, eval_every: 0}\n%s"
		 "checkpoint: {every: 0}\nexport: {dtype: fp32}\nrun: {dir: %s, log_every: 1}\n",
		 fix, k->model, fix, k->records, k->pack ? "true" : "false", k->batch, k->accum,
		 (int)json_integer_value(json_object_get(tr, "steps")), optim, run);
	write_text(cfg, yaml);
	snprintf(p, sizeof(p), "%s/%s.out", tmp, k->name);
	run_train(shardlm, cfg, k->np, p, k->name);

	steps = load_steps(run, &tm, k->name);
	for (int i = 0; i < 3 && i < (int)json_array_size(steps); i++) {
		json_t *s = json_array_get(steps, i);

		check_step(s, rc, i, REL, true, k->name);
		CHECK(!k->padded ||
		      json_integer_value(json_object_get(s, "padded_tokens")) == k->padded,
		      "%s step %d: %lld padded tokens, want %d", k->name, i + 1,
		      (long long)json_integer_value(json_object_get(s, "padded_tokens")), k->padded);
		check_targets(s, rc, i, k->name);
	}
	cj = export_config(run, "Qwen3ForCausalLM", k->name);
	if (cj) {
		CHECK(json_is_true(json_object_get(cj, "tie_word_embeddings")) == k->tied,
		      "%s: tie_word_embeddings changed", k->name);
		CHECK(!json_object_get(cj, "num_labels"), "%s: num_labels in an LM export",
		      k->name);
		json_decref(cj);
	}
	snprintf(cmd, sizeof(cmd), "cat %s/model/model*.safetensors | grep -c lm_head.weight "
		 ">/dev/null 2>&1", run);
	st = system(cmd);
	CHECK((st == 0) == !k->tied, "%s: lm_head.weight %s in the export", k->name,
	      st == 0 ? "present" : "absent");
	json_decref(tm);
	json_decref(ref);
}

int main(void)
{
	char fix[4096], shardlm[4096], tmp[64], p[8192];

	snprintf(fix, sizeof(fix), "%s/test/fixtures", test_srcdir());
	snprintf(shardlm, sizeof(shardlm), "%s/src/shardlm", test_builddir());
	snprintf(p, sizeof(p), "%s/sft/reference.json", fix);
	if (access(p, R_OK)) {
		printf("SKIP: %s is absent (make it with gen_sft_fixture.py)\n", p);
		return 77;
	}
	snprintf(tmp, sizeof(tmp), "/tmp/sl-sft-parity-XXXXXX");
	if (!mkdtemp(tmp))
		return 99;
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
		run_case(&cases[i], fix, shardlm, tmp);
	printf("largest relative difference from transformers (losses, grad norms): %.3g\n",
	       worst);
	test_remove_dir(tmp);
	return test_exit("test_sft_parity");
}
