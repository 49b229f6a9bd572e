/*
 * test_qwen35_parity: the CPU trainer against Hugging Face transformers on the Qwen3.5 hybrid.
 *
 * The reference values in test/fixtures/qwen35/reference.json were computed by transformers 5.17
 * in float64 (test/fixtures/qwen35/gen_qwen35_fixture.py) on a tiny random
 * Qwen3_5TextForSequenceClassification (3 Gated DeltaNet layers + 1 gated attention layer,
 * separate key/value head counts and dims, partial rotary) it saved in cls/, and the same weights
 * in the published qwen3_5 layout (text_config, model.language_model.*, a vision tower) in pub/.
 * Records of 150, 70, 5 and 33 tokens: longer and shorter than one 64-token chunk.  Checked: the
 * initial scores and mean BCE (all records in one padded micro-batch), every tensor's gradient
 * norm of the first step, pub/ scoring as cls/ (library and `shardlm score --model`, whose log
 * says the vision tower is not loaded), then `shardlm train` for 3 AdamW steps (two micro-batches
 * of padded records, clipping, cosine schedule with warmup, head_lr_mult 2) against the reference
 * losses and gradient norms, and `shardlm score` of the exported model against the final scores.
 * Tolerance: 1e-4 relative for the fp32 cpu backend; the double build (library path) must agree
 * with the float64 reference to 1e-6 (scores) and 1e-5 (gradients).  The reference trains with
 * lr 1e-4: at 1e-3 three steps of this tiny random hybrid amplify float32 rounding past 1e-4.
 * Skipped (77) while the fixture is absent.
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
#define NREC 4

static double worst;

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
};

static void unload(struct loaded *l)
{
	for (int u = 0; u < l->lay.n_units; u++)
		free(l->units[u]);
	free(l->units);
	sl_layout_free(&l->lay);
	sl_model_config_free(&l->mc);
}

static int load(struct loaded *l, const char *dir)
{
	struct sl_weights w;
	char p[8192];

	snprintf(p, sizeof(p), "%s/config.json", dir);
	if (sl_model_config_load(&l->mc, p) || sl_model_layout(&l->mc, 0, &l->lay) ||
	    sl_weights_open(&w, dir))
		return -1;
	l->units = calloc(l->lay.n_units, sizeof(float *));
	for (int u = 0; u < l->lay.n_units; u++)
		l->units[u] = calloc(l->lay.unit_numel[u], sizeof(float));
	if (sl_weights_load_layout(&w, &l->lay, l->units, l->mc.initializer_range, 1234, NULL,
				   &l->n_init, NULL))
		return -1;
	sl_weights_close(&w);
	return 0;
}

/* float host data <-> compute-type device buffers (float or double) */
static void to_dev(struct sl_backend *be, void *dst, const float *src, size_t n)
{
	float *f = be->alloc(be, n * sizeof(float));

	be->upload(be, f, src, n * sizeof(float));
	be->to_compute(be, dst, f, n);
	be->free(be, f);
}

static void from_dev(struct sl_backend *be, float *dst, const void *src, size_t n)
{
	float *f = be->alloc(be, n * sizeof(float));

	be->to_f32(be, f, src, n);
	be->download(be, dst, f, n * sizeof(float));
	be->free(be, f);
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

/*
 * Logits of the fixture's records, all in one padded micro-batch (forward only), and with
 * @grads non-NULL one training step over them (mean BCE): the gradients, unit by unit (float).
 * @be (destroyed here): the fp32 cpu backend or its double build.
 */
static void run_lib(struct sl_backend *be, struct loaded *l, const struct sl_dataset *ds,
		    float *out, float **grads)
{
	struct src_ctx ctx = { calloc(l->lay.n_units, sizeof(void *)),
			       calloc(l->lay.n_units, sizeof(void *)) };
	struct sl_unit_source src = { .ctx = &ctx, .weights = src_w, .grads = src_g };
	struct sl_host_batch hb;
	int idx[NREC], L = 0, n = ds->n;
	float labels[NREC];
	double loss;

	for (int u = 0; u < l->lay.n_units; u++) {
		ctx.w[u] = be->alloc(be, l->lay.unit_numel[u] * be->elt);
		ctx.g[u] = be->alloc(be, l->lay.unit_numel[u] * be->elt);
		to_dev(be, ctx.w[u], l->units[u], l->lay.unit_numel[u]);
	}
	for (int i = 0; i < n; i++) {
		idx[i] = i;
		labels[i] = ds->rec[i].label;
		if (ds->rec[i].len > L)
			L = ds->rec[i].len;
	}
	sl_host_batch_alloc(&hb, n, L);
	sl_host_batch_fill(&hb, ds, idx, n, 0);
	struct sl_model *m = sl_model_create(&l->mc, &l->lay, be, n * L, n, false);
	int32_t *d_ids = be->alloc(be, n * L * 4), *d_lens = be->alloc(be, n * 4);
	int32_t *d_last = be->alloc(be, n * 4);
	float *d_lab = be->alloc(be, n * 4);

	CHECK(m, "model");
	be->upload(be, d_ids, hb.ids, n * L * 4);
	be->upload(be, d_lens, hb.lens, n * 4);
	be->upload(be, d_last, hb.last, n * 4);
	be->upload(be, d_lab, labels, n * 4);
	struct sl_batch_dev b = { .B = n, .L = L, .ids = d_ids, .lens = d_lens, .last = d_last,
				  .labels = grads ? d_lab : NULL, .h_lens = hb.lens };
	if (m && grads)
		sl_model_train_step(m, &src, &b, 1.0f / n, &loss, out);
	else if (m)
		sl_model_score(m, &src, &b, out);
	for (int u = 0; grads && u < l->lay.n_units; u++) {
		grads[u] = malloc(l->lay.unit_numel[u] * sizeof(float));
		from_dev(be, grads[u], ctx.g[u], l->lay.unit_numel[u]);
	}
	sl_model_destroy(m);
	be->free(be, d_ids), be->free(be, d_lens), be->free(be, d_last), be->free(be, d_lab);
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

/* runs @cmd; its output in @out (a file under tmp) */
static int sh(const char *cmd)
{
	return system(cmd);
}

/* the score lines of @path against @want (NREC) */
static void check_score_file(const char *path, json_t *want, const char *what)
{
	json_error_t jerr;
	char line[4096];
	FILE *f = fopen(path, "r");
	int n = 0;

	while (f && fgets(line, sizeof(line), f)) {
		json_t *j = json_loads(line, 0, &jerr);
		int i;

		CHECK(j, "%s: bad score line: %s", what, line);
		if (!j)
			continue;
		i = json_integer_value(json_object_get(j, "index"));
		CHECK(i == n, "%s: index", what);
		CHECK_CLOSE(track(json_number_value(json_object_get(j, "score")), num_at(want, i)),
			    num_at(want, i), REL, 1e-6);
		json_decref(j);
		n++;
	}
	if (f)
		fclose(f);
	CHECK(n == NREC, "%s: %d score lines", what, n);
}

/*
 * One training step's gradients on @be against the reference's per-tensor norms (tolerance
 * @tol relative) and, when present, each tensor's first gradient elements (@tol relative to the
 * largest of them).
 */
static void check_grads(struct sl_backend *be, struct loaded *l, const struct sl_dataset *ds,
			json_t *rc, double tol, const char *what)
{
	json_t *gn = json_object_get(rc, "grad_norms0"), *g8 = json_object_get(rc, "grad_first8_0");
	float **grads = calloc(l->lay.n_units, sizeof(float *)), s[NREC];
	double worst_norm = 0;
	const char *name;
	json_t *v;
	int n = 0;

	run_lib(be, l, ds, s, grads);
	json_object_foreach(gn, name, v) {
		const struct sl_tensor_info *ti = sl_layout_find(&l->lay, name);
		double ss = 0, want = json_number_value(v), big = 0;
		json_t *first = json_object_get(g8, name);
		const float *g;

		CHECK(ti, "reference tensor %s is not in the layout", name);
		if (!ti)
			continue;
		g = grads[ti->unit] + ti->offset;
		for (size_t k = 0; k < ti->numel; k++)
			ss += (double)g[k] * g[k];
		worst_norm = fmax(worst_norm, fabs(sqrt(ss) - want) / want);
		CHECK(fabs(sqrt(ss) - want) <= tol * want + 1e-9,
		      "%s: gradient norm of %s: %.9g, transformers %.9g", what, name, sqrt(ss), want);
		for (size_t k = 0; k < json_array_size(first); k++)
			big = fmax(big, fabs(num_at(first, k)));
		for (size_t k = 0; k < json_array_size(first) && k < ti->numel; k++)
			CHECK(fabs(g[k] - num_at(first, k)) <= tol * big + 1e-9,
			      "%s: gradient %s[%zu]: %.9g, transformers %.9g", what, name, k, g[k],
			      num_at(first, k));
		n++;
	}
	CHECK(n == l->lay.n_tensors, "%d reference gradient norms, %d tensors", n,
	      l->lay.n_tensors);
	printf("%s build: largest relative difference of a tensor's gradient norm: %.3g\n", what,
	       worst_norm);
	for (int u = 0; u < l->lay.n_units; u++)
		free(grads[u]);
	free(grads);
}

int main(void)
{
	json_error_t jerr;
	char p[8192], cmd[32768], cfg[8192], yaml[16384];
	struct sl_dataset ds = { 0 };
	struct sl_data_opts o = { .text_field = "text", .label_field = "label", .need_label = true,
				  .vocab = 128 };
	struct loaded cls = { 0 }, pub = { 0 };
	float s[NREC], sp[NREC];
	json_t *ref, *rc, *tr, *tm = NULL;
	double loss = 0;
	int rcode;

	snprintf(fix, sizeof(fix), "%s/test/fixtures/qwen35", test_srcdir());
	snprintf(p, sizeof(p), "%s/reference.json", fix);
	if (access(p, R_OK)) {
		printf("test_qwen35_parity: SKIP: %s is absent (generate it on the GPU machine: "
		       "python3 test/fixtures/qwen35/gen_qwen35_fixture.py OUT, then copy OUT/* "
		       "to test/fixtures/qwen35/)\n", p);
		return 77;
	}
	snprintf(shardlm, sizeof(shardlm), "%s/src/shardlm", test_builddir());
	snprintf(tmp, sizeof(tmp), "/tmp/sl-q35-parity-XXXXXX");
	if (!mkdtemp(tmp))
		return 99;
	ref = json_load_file(p, 0, &jerr);
	CHECK(ref, "cannot read %s", p);
	if (!ref)
		return test_exit("test_qwen35_parity");
	rc = json_object_get(ref, "cls");
	tr = json_object_get(rc, "train");

	snprintf(p, sizeof(p), "%s/records.jsonl", fix);
	CHECK(sl_data_load(&ds, p, &o) == 0, "records");
	CHECK(ds.n == NREC, "%d records", ds.n);
	if (ds.n != NREC)
		return test_exit("test_qwen35_parity");

	/* 1. initial scores, loss and per-tensor gradient norms */
	snprintf(p, sizeof(p), "%s/cls", fix);
	CHECK(load(&cls, p) == 0, "load cls");
	CHECK(cls.n_init == 0, "cls has score.weight: nothing should be initialized");
	CHECK(!strcmp(cls.mc.model_type, "qwen3_5_text") && cls.mc.norm_offset, "qwen3_5_text");
	run_lib(sl_backend_cpu_create(), &cls, &ds, s, NULL);
	for (int i = 0; i < NREC; i++) {
		double want = num_at(json_object_get(rc, "scores0"), i);

		CHECK_CLOSE(track(s[i], want), want, REL, 1e-6);
		loss += bce(s[i], ds.rec[i].label) / NREC;
	}
	CHECK_CLOSE(loss, json_number_value(json_object_get(rc, "loss0")), REL, 0);
	check_grads(sl_backend_cpu_create(), &cls, &ds, rc, REL, "fp32");
	/*
	 * The double build against the float64 reference: agreement to about 1e-7 (transformers
	 * keeps a float32 cast in the decay), so any difference in the math shows (the fp32 checks
	 * leave room for float rounding, which the hybrid amplifies).  Fixtures of generator v1 (float32 inside transformers) lack
	 * grad_first8_0 and get the fp32 tolerance.
	 */
	{
		bool exact = json_object_get(rc, "grad_first8_0") != NULL;
		/* transformers still rounds A_log and a to float32 where it forms the decay */
		double tol = exact ? 1e-6 : REL;
		float s64[NREC];

		double w64 = 0;

		run_lib(sl_backend_cpu64_create(), &cls, &ds, s64, NULL);
		for (int i = 0; i < NREC; i++) {
			double want = num_at(json_object_get(rc, "scores0"), i);

			w64 = fmax(w64, fabs(s64[i] - want) / fabs(want));

			CHECK(fabs(s64[i] - want) <= tol * fabs(want) + 1e-8,
			      "double build score %d: %.9g, transformers %.9g", i, s64[i], want);
		}
		printf("double build: largest relative difference of a score: %.3g\n", w64);
		check_grads(sl_backend_cpu64_create(), &cls, &ds, rc, exact ? 1e-5 : REL, "double");
	}

	/* 2. the published qwen3_5 layout loads to the same model */
	snprintf(p, sizeof(p), "%s/pub", fix);
	CHECK(load(&pub, p) == 0, "load pub");
	CHECK(!strcmp(pub.mc.model_type, "qwen3_5") && pub.n_init == 0, "qwen3_5, complete");
	run_lib(sl_backend_cpu_create(), &pub, &ds, sp, NULL);
	for (int i = 0; i < NREC; i++)
		CHECK_CLOSE(sp[i], s[i], 1e-6, 1e-7);

	/* 3. three AdamW steps through `shardlm train`, then the exported model */
	snprintf(cfg, sizeof(cfg), "%s/parity.yaml", tmp);
	snprintf(yaml, sizeof(yaml),
		 "model: {path: %s/cls}\ntask: classify\nbackend: cpu\n"
		 "data: {train: %s/records.jsonl, shuffle: false, length_sort: false, "
		 "max_state: 256}\n"
		 "train: {batch: 2, accum: 2, steps: %d, eval_every: 0}\n"
		 "optim: {lr: %.17g, schedule: cosine, warmup: %d, min_lr: %.17g, betas: [%.17g, "
		 "%.17g], eps: %.17g, weight_decay: %.17g, clip: %.17g, head_lr_mult: %.17g}\n"
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

	/* pub/ through `shardlm score --model`: the same scores, the vision tower logged */
	snprintf(cmd, sizeof(cmd), "OMP_NUM_THREADS=1 %s score %s --data %s/records.jsonl "
		 "--model %s/pub > %s/pub.jsonl 2> %s/pub.err", shardlm, cfg, fix, fix, tmp, tmp);
	rcode = sh(cmd);
	CHECK(rcode == 0, "shardlm score --model pub failed (%d); see %s/pub.err", rcode, tmp);
	snprintf(p, sizeof(p), "%s/pub.jsonl", tmp);
	check_score_file(p, json_object_get(rc, "scores0"), "pub scores");
	snprintf(cmd, sizeof(cmd), "grep -q 'vision tower' %s/pub.err %s/pub.jsonl", tmp, tmp);
	CHECK(sh(cmd) == 0, "the log says the vision tower is not loaded (see %s/pub.err)", tmp);

	snprintf(cmd, sizeof(cmd), "OMP_NUM_THREADS=1 %s train %s > %s/train.out 2>&1", shardlm,
		 cfg, tmp);
	rcode = sh(cmd);
	CHECK(rcode == 0, "shardlm train failed (%d); see %s/train.out", rcode, tmp);
	snprintf(p, sizeof(p), "%s/run/training_metrics.json", tmp);
	tm = json_load_file(p, 0, &jerr);
	CHECK(tm, "no %s", p);
	json_t *steps = json_object_get(tm, "steps");
	CHECK(json_array_size(steps) == 3, "3 steps");
	for (int i = 0; i < 3 && i < (int)json_array_size(steps); i++) {
		json_t *st = json_array_get(steps, i);
		double l = json_number_value(json_object_get(st, "loss"));
		double g = json_number_value(json_object_get(st, "grad_norm"));

		CHECK_CLOSE(track(l, num_at(json_object_get(rc, "losses"), i)),
			    num_at(json_object_get(rc, "losses"), i), REL, 0);
		CHECK_CLOSE(track(g, num_at(json_object_get(rc, "grad_norms"), i)),
			    num_at(json_object_get(rc, "grad_norms"), i), REL, 0);
		CHECK_CLOSE(json_number_value(json_object_get(st, "lr")),
			    num_at(json_object_get(rc, "lrs"), i), 1e-9, 0);
		CHECK(json_integer_value(json_object_get(st, "records")) == NREC, "records");
	}
	snprintf(cmd, sizeof(cmd), "OMP_NUM_THREADS=1 %s score %s --data %s/records.jsonl > "
		 "%s/scores.jsonl 2> %s/score.err", shardlm, cfg, fix, tmp, tmp);
	rcode = sh(cmd);
	CHECK(rcode == 0, "shardlm score failed (%d); see %s/score.err", rcode, tmp);
	snprintf(p, sizeof(p), "%s/scores.jsonl", tmp);
	check_score_file(p, json_object_get(rc, "scores3"), "scores after 3 steps");

	/* the export: a Qwen3_5TextForSequenceClassification with HF's (C, 1, K) conv weights */
	{
		json_t *cj;
		struct sl_weights w;
		const struct sl_st_tensor *cv;

		snprintf(p, sizeof(p), "%s/run/model/config.json", tmp);
		cj = json_load_file(p, 0, &jerr);
		CHECK(cj && !strcmp(json_string_value(json_object_get(cj, "model_type")),
				    "qwen3_5_text") &&
		      !strcmp(json_string_value(json_array_get(json_object_get(cj, "architectures"),
							       0)),
			      "Qwen3_5TextForSequenceClassification"), "exported config %s", p);
		json_decref(cj);
		snprintf(p, sizeof(p), "%s/run/model", tmp);
		CHECK(sl_weights_open(&w, p) == 0, "exported weights");
		cv = sl_weights_find(&w, "model.layers.0.linear_attn.conv1d.weight");
		CHECK(cv && cv->ndim == 3 && cv->shape[1] == 1 &&
		      cv->shape[2] == cls.mc.lin_conv, "exported conv1d weight is (C, 1, K)");
		sl_weights_close(&w);
	}

	printf("largest relative difference from transformers (scores, losses, grad norms): "
	       "%.3g\n", worst);
	if (!test_failures) {
		snprintf(cmd, sizeof(cmd), "rm -rf %s", tmp);
		sh(cmd);
	}
	json_decref(tm);
	json_decref(ref);
	unload(&cls);
	unload(&pub);
	sl_data_free(&ds);
	return test_exit("test_qwen35_parity");
}
