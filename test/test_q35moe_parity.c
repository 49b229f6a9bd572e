/*
 * test_q35moe_parity: `shardlm train` with task sft on the Qwen3.5 family against Hugging Face
 * transformers 5.17 in float64 (issue 12, item 4: the MoE variant).
 *
 * test/fixtures/q35moe/reference.json and the models beside it come from
 * test/fixtures/q35moe/gen_q35moe_fixture.py: a tiny random Qwen3_5MoeForCausalLM (text/: 3 Gated
 * DeltaNet layers and 1 gated attention layer, each with 8 routed experts top-2 and the shared
 * expert with its sigmoid gate, router_aux_loss_coef 0.05), the same weights in the published
 * qwen3_5_moe layout (pub/: text_config, model.language_model.*, a vision tower), and a dense
 * Qwen3_5ForCausalLM (dense/); 4 pre-tokenized records of 150, 70, 5 and 33 tokens (longer and
 * shorter than one 64-token chunk) with loss masks.  The reference loss of a step is the mean
 * target cross-entropy plus coef * the load-balancing loss over all four records' real tokens
 * and every layer, which is shardlm's loss when one micro-batch holds the step (the MoE cases
 * run batch 4; the dense ones, without an aux loss, also as 2 micro-batches and on 2 ranks).
 * 3 AdamW steps (clip that bites on step 1, cosine schedule with warmup, head_lr_mult 2): the
 * losses, gradient norms and learning rates must match within 1e-4 relative on the fp32 cpu
 * backend; the export must be the family's *ForCausalLM.  Skipped (77) while the fixture is
 * absent; the dense cases are skipped alone when the reference has no "dense" object.
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

struct pcase {
	const char *name;
	const char *model;	/* relative to test/fixtures/q35moe */
	const char *key;	/* the reference's object */
	const char *arch;	/* the export's architecture */
	int np, batch, accum;
	bool ckpt;		/* train.activation_checkpointing */
};

static const struct pcase cases[] = {
	{ "moe-text", "text", "moe", "Qwen3_5MoeForCausalLM", 1, 4, 1, false },
	{ "moe-pub", "pub", "moe", "Qwen3_5MoeForCausalLM", 1, 4, 1, false },
	{ "moe-ckpt", "text", "moe", "Qwen3_5MoeForCausalLM", 1, 4, 1, true },
	{ "dense", "dense", "dense", "Qwen3_5ForCausalLM", 1, 2, 2, false },
	{ "dense-2ranks", "dense", "dense", "Qwen3_5ForCausalLM", 2, 1, 2, false },
};

static void run_case(const struct pcase *k, json_t *ref, const char *fix, const char *shardlm,
		     const char *tmp)
{
	char p[8448], cfg[256], yaml[16384], cmd[24576], run[192], optim[1024];
	json_t *rc = json_object_get(ref, k->key), *tr, *tm, *steps;

	if (!rc) {
		printf("%s: the reference has no \"%s\" (its generator failed there): skipped\n",
		       k->name, k->key);
		return;
	}
	tr = json_object_get(rc, "train");
	snprintf(run, sizeof(run), "%s/run-%s", tmp, k->name);
	snprintf(cfg, sizeof(cfg), "%s/%s.yaml", tmp, k->name);
	optim_yaml(optim, sizeof(optim), tr);
	snprintf(yaml, sizeof(yaml),
		 "model: {path: %s/%s}\ntask: sft\nbackend: cpu\n"
		 "data: {train: %s/records.jsonl, shuffle: false, length_sort: false, "
		 "max_state: 256}\n"
		 "train: {batch: %d, accum: %d, steps: %d, eval_every: 0, "
		 "activation_checkpointing: %s}\n%s"
		 "checkpoint: {every: 0}\nexport: {dtype: fp32}\nrun: {dir: %s, log_every: 1}\n",
		 fix, k->model, fix, k->batch, k->accum,
		 (int)json_integer_value(json_object_get(tr, "steps")), k->ckpt ? "true" : "false",
		 optim, run);
	write_text(cfg, yaml);
	snprintf(p, sizeof(p), "%s/%s.out", tmp, k->name);
	run_train(shardlm, cfg, k->np, p, k->name);

	steps = load_steps(run, &tm, k->name);
	for (int i = 0; i < 3 && i < (int)json_array_size(steps); i++) {
		json_t *s = json_array_get(steps, i);

		check_step(s, rc, i, REL, true, k->name);
		check_targets(s, rc, i, k->name);
	}
	printf("%s: losses %s\n", k->name, tm ? "compared" : "missing");
	json_decref(export_config(run, k->arch, k->name));
	if (!strcmp(k->model, "pub")) {
		snprintf(cmd, sizeof(cmd), "grep -q 'vision tower' %s/%s.out", tmp, k->name);
		CHECK(system(cmd) == 0, "%s: the log does not say the vision tower is left out",
		      k->name);
	}
	json_decref(tm);
}

int main(void)
{
	char fix[4096], shardlm[4096], tmp[64], p[8192];
	json_error_t jerr;
	json_t *ref;

	snprintf(fix, sizeof(fix), "%s/test/fixtures/q35moe", test_srcdir());
	snprintf(shardlm, sizeof(shardlm), "%s/src/shardlm", test_builddir());
	snprintf(p, sizeof(p), "%s/reference.json", fix);
	if (access(p, R_OK)) {
		printf("SKIP: %s is absent (make it on a machine with transformers 5.17: python3 "
		       "test/fixtures/q35moe/gen_q35moe_fixture.py test/fixtures/q35moe)\n", p);
		return 77;
	}
	ref = json_load_file(p, 0, &jerr);
	CHECK(ref, "cannot read %s: %s", p, jerr.text);
	if (!ref)
		return test_exit("test_q35moe_parity");
	snprintf(tmp, sizeof(tmp), "/tmp/sl-q35moe-parity-XXXXXX");
	if (!mkdtemp(tmp))
		return 99;
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
		run_case(&cases[i], ref, fix, shardlm, tmp);
	printf("largest relative difference from transformers (losses, grad norms): %.3g\n",
	       worst);
	json_decref(ref);
	test_remove_dir(tmp);
	return test_exit("test_q35moe_parity");
}
