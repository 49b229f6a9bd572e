/*
 * test_moe_parity: the CPU trainer's Qwen3-MoE against Hugging Face transformers.
 *
 * test/fixtures/moe/reference.json was computed by transformers 5.17 in float64
 * (test/fixtures/moe/gen_moe_fixture.py) on a tiny random Qwen3MoeForSequenceClassification
 * (3 layers, layer 1 dense through mlp_only_layers, 8 experts top 2, norm_topk_prob,
 * router_aux_loss_coef 0.1) saved with per-expert tensor names (cls/) and fused ones
 * (cls_fused/).  Checked:
 *  1. both layouts load to the same parameters; the config's MoE keys are read;
 *  2. the initial scores, per-layer expert token counts and load-balancing loss (all four records
 *     in one padded micro-batch: padding must change nothing);
 *  3. `shardlm train`, 3 AdamW steps of one micro-batch of all four records (loss = mean BCE +
 *     coef * aux as the fixture defines it; clipping, cosine schedule, head_lr_mult) against the
 *     reference losses and gradient norms, and the expert counts in training_metrics.json; the
 *     same for SFT on a Qwen3MoeForCausalLM (sft/, and sft_fused/ with fused expert tensors)
 *     against transformers' loss with output_router_logits (CE mean + coef * aux, padding
 *     masked by the attention mask);
 *  4. `shardlm score` with the exported model (per-expert names) against the reference scores.
 * Tolerance: 5e-4 relative on losses and norms (the bar; fp32 here against float64 with
 * transformers' float32 routing), 1e-4 on scores.  Skipped (77) while the fixture is absent.
 */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "parity_util.h"

#define REL_LOSS 5e-4
#define REL_SCORE 1e-4

static char fix[4096], tmp[4096], shardlm[4096];

struct counts {
	int64_t *counts;	/* (2 x 8) */
	double *aux;
};

/* the scoring batch's expert counts (n_moe x E) and aux loss */
static void expert_counts(struct sl_model *m, void *arg)
{
	struct counts *k = arg;
	int nl = 0, ne = 0;
	const int64_t *c = m ? sl_model_expert_counts(m, &nl, &ne, k->aux) : NULL;

	CHECK(c && nl == 2 && ne == 8, "expert counts of %d layers x %d experts", nl, ne);
	if (c && nl == 2 && ne == 8)
		memcpy(k->counts, c, 16 * sizeof(*c));
}

/* scores of all records in one padded micro-batch; counts (n_moe x E) and aux of that batch */
static void scores_of(struct loaded *l, const struct sl_dataset *ds, float *out, int64_t *counts,
		      double *aux)
{
	struct counts k = { counts, aux };

	CHECK(run_lib(sl_backend_cpu_create(), l, ds, out, NULL, expert_counts, &k) == 0);
}

/*
 * `shardlm train` (task @task) on @model with one micro-batch of all four @records for the
 * reference's 3 steps: losses and gradient norms within REL_LOSS, the first step's expert token
 * summary from the reference's initial counts.
 */
static void train_and_check(const char *name, const char *task, const char *model,
			    const char *records, json_t *rc)
{
	json_t *tr = json_object_get(rc, "train"), *counts0 = json_object_get(rc, "expert_counts0");
	char cfg[8192], yaml[16384], optim[1024], p[8192];

	snprintf(cfg, sizeof(cfg), "%s/%s.yaml", tmp, name);
	optim_yaml(optim, sizeof(optim), tr);
	snprintf(yaml, sizeof(yaml),
		 "model: {path: %s/%s}\ntask: %s\nbackend: cpu\n"
		 "data: {train: %s/%s, shuffle: false, length_sort: false, max_state: 64}\n"
		 "train: {batch: 4, accum: 1, steps: %d, eval_every: 0}\n%s"
		 "checkpoint: {every: 0}\nexport: {dtype: fp32}\nrun: {dir: %s/run-%s, log_every: 1}\n",
		 fix, model, task, fix, records, (int)json_integer_value(json_object_get(tr, "steps")),
		 optim, tmp, name);
	write_text(cfg, yaml);
	snprintf(p, sizeof(p), "%s/%s.out", tmp, name);
	run_train(shardlm, cfg, 1, p, name);

	json_t *tm, *steps;
	snprintf(p, sizeof(p), "%s/run-%s", tmp, name);
	steps = load_steps(p, &tm, name);
	for (int i = 0; i < 3 && i < (int)json_array_size(steps); i++) {
		json_t *st = json_array_get(steps, i);
		json_t *et = json_object_get(st, "expert_tokens");

		check_step(st, rc, i, REL_LOSS, false, name);
		CHECK(json_integer_value(json_object_get(st, "records")) == 4);
		CHECK(json_is_object(et) && json_array_size(json_object_get(et, "min")) == 2 &&
		      json_array_size(json_object_get(et, "max")) == 2 &&
		      json_array_size(json_object_get(et, "total")) == 2,
		      "%s step %d: expert_tokens {min, max, total} per MoE layer", name, i + 1);
		/* the first step routes as the initial model does */
		for (int k = 0; i == 0 && k < 2; k++) {
			long long mn = -1, mx = -1, tot = 0;

			for (int e = 0; e < 8; e++) {
				long long c = json_integer_value(json_array_get(
					json_array_get(counts0, k), e));

				mn = mn < 0 || c < mn ? c : mn;
				mx = c > mx ? c : mx;
				tot += c;
			}
			CHECK(json_integer_value(json_array_get(json_object_get(et, "min"), k)) ==
			      mn && json_integer_value(json_array_get(json_object_get(et, "max"),
			      k)) == mx && json_integer_value(json_array_get(
			      json_object_get(et, "total"), k)) == tot,
			      "%s step 1 layer %d: min %lld max %lld total %lld", name, k, mn, mx,
			      tot);
		}
	}
	json_decref(tm);
}

static void check_same_params(struct loaded *a, struct loaded *b)
{
	size_t diff = 0;

	CHECK(a->lay.n_units == b->lay.n_units && a->lay.total_numel == b->lay.total_numel);
	for (int u = 0; u < a->lay.n_units && u < b->lay.n_units; u++)
		for (size_t i = 0; i < a->lay.unit_numel[u]; i++)
			diff += a->units[u][i] != b->units[u][i];
	CHECK(diff == 0, "%zu parameters differ between the per-expert and fused files", diff);
}

int main(void)
{
	json_error_t jerr;
	char p[8192], cmd[65536];
	struct sl_dataset ds = { 0 };
	struct sl_data_opts o = { .text_field = "text", .label_field = "label", .need_label = true,
				  .vocab = 96 };
	struct loaded cls = { 0 }, fused = { 0 }, sft = { 0 };
	int64_t counts[16];
	double aux = NAN;
	float s[4];

	snprintf(fix, sizeof(fix), "%s/test/fixtures/moe", test_srcdir());
	snprintf(shardlm, sizeof(shardlm), "%s/src/shardlm", test_builddir());
	snprintf(p, sizeof(p), "%s/reference.json", fix);
	if (access(p, R_OK)) {
		printf("SKIP: %s is absent (run test/fixtures/moe/gen_moe_fixture.py)\n", p);
		return 77;
	}
	snprintf(tmp, sizeof(tmp), "/tmp/sl-moe-parity-XXXXXX");
	if (!mkdtemp(tmp))
		return 99;
	json_t *ref = json_load_file(p, 0, &jerr);
	CHECK(ref, "cannot read %s", p);
	if (!ref)
		return test_exit("test_moe_parity");
	json_t *rc = json_object_get(ref, "cls");
	double coef = json_number_value(json_object_get(rc, "router_aux_loss_coef"));

	CHECK(!strcmp(json_string_value(json_object_get(rc, "aux_variant")), "logits"),
	      "the fixture's transformers feeds something else than logits to the aux loss");
	snprintf(p, sizeof(p), "%s/cls_records.jsonl", fix);
	CHECK(sl_data_load(&ds, p, &o) == 0);
	CHECK(ds.n == 4);

	/* 1. both layouts, the config */
	snprintf(p, sizeof(p), "%s/cls", fix);
	CHECK(load(&cls, p) == 0);
	snprintf(p, sizeof(p), "%s/cls_fused", fix);
	CHECK(load(&fused, p) == 0);
	CHECK(cls.n_init == 0 && fused.n_init == 0 && cls.n_unused == 0,
	      "initialized %d / %d, unused %d", cls.n_init, fused.n_init, cls.n_unused);
	check_same_params(&cls, &fused);
	CHECK(!strcmp(cls.mc.model_type, "qwen3_moe") && cls.mc.n_experts == 8 &&
	      cls.mc.top_k == 2 && cls.mc.moe_intermediate == 20 && cls.mc.norm_topk_prob &&
	      fabs(cls.mc.router_aux_loss_coef - coef) < 1e-12 && cls.mc.head_dim == 16);
	CHECK(cls.mc.mlp_kind[0] == SL_MLP_MOE && cls.mc.mlp_kind[1] == SL_MLP_DENSE &&
	      cls.mc.mlp_kind[2] == SL_MLP_MOE);
	snprintf(p, sizeof(p), "%s/sft", fix);
	CHECK(load(&sft, p) == 0);
	CHECK(sft.n_init == 1 && sft.n_unused == 1, "causal-LM checkpoint: score.weight "
	      "initialized (%d), lm_head.weight unused (%d)", sft.n_init, sft.n_unused);

	/* 2. initial scores, counts, aux */
	scores_of(&cls, &ds, s, counts, &aux);
	double loss = 0;
	for (int i = 0; i < 4; i++) {
		CHECK_CLOSE(track(s[i], num_at(json_object_get(rc, "scores0"), i)),
			    num_at(json_object_get(rc, "scores0"), i), REL_SCORE, 1e-6);
		loss += bce(s[i], ds.rec[i].label) / 4;
	}
	CHECK_CLOSE(track(aux, json_number_value(json_object_get(rc, "aux0"))),
		    json_number_value(json_object_get(rc, "aux0")), REL_SCORE, 0);
	CHECK_CLOSE(loss + coef * aux, json_number_value(json_object_get(rc, "loss0")),
		    REL_SCORE, 0);
	for (int i = 0; i < 2; i++)
		for (int e = 0; e < 8; e++)
			CHECK(counts[i * 8 + e] == json_integer_value(json_array_get(
				json_array_get(json_object_get(rc, "expert_counts0"), i), e)),
			      "layer %d expert %d: %lld tokens", i, e, (long long)counts[i * 8 + e]);

	/* 3. three AdamW steps through `shardlm train`, one micro-batch per step */
	train_and_check("cls", "classify", "cls", "cls_records.jsonl", rc);
	/* SFT, both layouts: CE mean over targets + coef * aux with padding masked */
	train_and_check("sft", "sft", "sft", "sft_records.jsonl", json_object_get(ref, "sft"));
	train_and_check("sft_fused", "sft", "sft_fused", "sft_records.jsonl",
			json_object_get(ref, "sft"));
	char cfg[8192];
	int rcode;

	snprintf(cfg, sizeof(cfg), "%s/cls.yaml", tmp);

	/* 4. the exported model scores as transformers' model after the same 3 steps */
	snprintf(cmd, sizeof(cmd), "%s score %s --data %s/cls_records.jsonl > %s/scores.jsonl "
		 "2> %s/score.err", shardlm, cfg, fix, tmp, tmp);
	rcode = system(cmd);
	CHECK(rcode == 0, "shardlm score failed (%d); see %s/score.err", rcode, tmp);
	snprintf(p, sizeof(p), "%s/scores.jsonl", tmp);
	check_score_file(p, json_object_get(rc, "scores3"), 4, REL_LOSS, 1e-5, false,
			 "scores after 3 steps");

	printf("largest relative difference from transformers (scores, aux, losses, grad norms): "
	       "%.3g\n", worst);
	test_remove_dir(tmp);
	json_decref(ref);
	unload(&cls);
	unload(&fused);
	unload(&sft);
	sl_data_free(&ds);
	return test_exit("test_moe_parity");
}
