/*
 * parity_util.h: what the Hugging Face parity tests share (test_hf_parity, test_moe_parity,
 * test_sft_parity, test_qwen35_parity, test_q35moe_parity): reading reference.json, loading a
 * fixture model, running the library on the fixture's records, running `shardlm train` and
 * `shardlm score`, and comparing what they log with the reference.
 */
#ifndef SL_PARITY_UTIL_H
#define SL_PARITY_UTIL_H

#include <jansson.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "data.h"
#include "model.h"
#include "safetensors.h"
#include "testutil.h"

static double worst;	/* the largest relative difference from the reference, for the log */

/* @got, its relative difference from @want counted into worst */
static inline double track(double got, double want)
{
	double r = fabs(got - want) / fmax(fabs(want), 1e-12);

	if (r > worst)
		worst = r;
	return got;
}

static inline double num_at(json_t *arr, int i)
{
	return json_number_value(json_array_get(arr, i));
}

/* binary cross-entropy of logit @z against label @y */
static inline double bce(double z, double y)
{
	return fmax(z, 0) - z * y + log1p(exp(-fabs(z)));
}

/* ---- a fixture model in host memory ---------------------------------------------------------- */

struct loaded {
	struct sl_model_config mc;
	struct sl_layout lay;
	float **units;		/* (n_units) each unit's parameters */
	int n_init;		/* tensors initialized (absent from the files) */
	int n_unused;		/* tensors of the files left unused */
	bool *init;		/* (n_tensors) tensor i was initialized */
};

static inline void unload(struct loaded *l)
{
	for (int u = 0; u < l->lay.n_units; u++)
		free(l->units[u]);
	free(l->units);
	free(l->init);
	sl_layout_free(&l->lay);
	sl_model_config_free(&l->mc);
}

/* the classifier (task 0) layout of the model in @dir, its weights loaded; 0 or -1 */
static inline int load(struct loaded *l, const char *dir)
{
	struct sl_weights w;
	char p[8192];

	snprintf(p, sizeof(p), "%s/config.json", dir);
	if (sl_model_config_load(&l->mc, p) || sl_model_layout(&l->mc, 0, &l->lay) ||
	    sl_weights_open(&w, dir))
		return -1;
	l->units = calloc(l->lay.n_units, sizeof(float *));
	l->init = calloc(l->lay.n_tensors, sizeof(bool));
	for (int u = 0; u < l->lay.n_units; u++)
		l->units[u] = calloc(l->lay.unit_numel[u], sizeof(float));
	if (sl_weights_load_layout(&w, &l->lay, l->units, l->mc.initializer_range, 1234, l->init,
				   &l->n_init, &l->n_unused))
		return -1;
	sl_weights_close(&w);
	return 0;
}

/* ---- the library on the fixture's records ---------------------------------------------------- */

struct src_ctx {
	void **w, **g;
};

static inline const void *src_w(void *ctx, int u)
{
	return ((struct src_ctx *)ctx)->w[u];
}

static inline void *src_g(void *ctx, int u)
{
	return ((struct src_ctx *)ctx)->g[u];
}

/*
 * The records of @ds all in one padded micro-batch (padding must change no score) through @l on
 * @be (destroyed here): the logits in @out (forward only), or with @grads non-NULL one training
 * step (the mean BCE) and its gradients unit by unit (float, malloc'd).  @probe, if given, sees
 * the model (NULL if it could not be made) after the step.  Returns 0, the step's error, or 1
 * when there was no model.
 */
static inline int run_lib(struct sl_backend *be, struct loaded *l, const struct sl_dataset *ds,
			  float *out, float **grads, void (*probe)(struct sl_model *, void *),
			  void *arg)
{
	struct src_ctx ctx = { calloc(l->lay.n_units, sizeof(void *)),
			       calloc(l->lay.n_units, sizeof(void *)) };
	struct sl_unit_source src = { .ctx = &ctx, .weights = src_w, .grads = src_g };
	struct sl_host_batch hb;
	int n = ds->n, L = 0, rc = 1;
	int *idx = calloc(n, sizeof(int));
	float *labels = calloc(n, sizeof(float));
	double loss;

	for (int u = 0; u < l->lay.n_units; u++) {
		float *f = be->alloc(be, l->lay.unit_numel[u] * sizeof(float));

		ctx.w[u] = be->alloc(be, l->lay.unit_numel[u] * be->elt);
		ctx.g[u] = be->alloc(be, l->lay.unit_numel[u] * be->elt);
		be->upload(be, f, l->units[u], l->lay.unit_numel[u] * sizeof(float));
		be->to_compute(be, ctx.w[u], f, l->lay.unit_numel[u]);
		be->free(be, f);
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

	be->upload(be, d_ids, hb.ids, n * L * 4);
	be->upload(be, d_lens, hb.lens, n * 4);
	be->upload(be, d_last, hb.last, n * 4);
	be->upload(be, d_lab, labels, n * 4);
	struct sl_batch_dev b = { .B = n, .L = L, .ids = d_ids, .lens = d_lens, .last = d_last,
				  .labels = grads ? d_lab : NULL, .h_lens = hb.lens };
	if (m && grads)
		rc = sl_model_train_step(m, &src, &b, 1.0f / n, &loss, out);
	else if (m)
		rc = sl_model_score(m, &src, &b, out);
	if (probe)
		probe(m, arg);
	for (int u = 0; grads && u < l->lay.n_units; u++) {
		float *f = be->alloc(be, l->lay.unit_numel[u] * sizeof(float));

		grads[u] = malloc(l->lay.unit_numel[u] * sizeof(float));
		be->to_f32(be, f, ctx.g[u], l->lay.unit_numel[u]);
		be->download(be, grads[u], f, l->lay.unit_numel[u] * sizeof(float));
		be->free(be, f);
	}
	sl_model_destroy(m);
	be->free(be, d_ids), be->free(be, d_lens), be->free(be, d_last), be->free(be, d_lab);
	for (int u = 0; u < l->lay.n_units; u++) {
		be->free(be, ctx.w[u]);
		be->free(be, ctx.g[u]);
	}
	free(ctx.w), free(ctx.g), free(idx), free(labels);
	sl_host_batch_free(&hb);
	be->destroy(be);
	return rc;
}

/* ---- the trainer ----------------------------------------------------------------------------- */

/* the config's optim line from the reference's "train" object @tr (the fixture's optimizer) */
static inline void optim_yaml(char *buf, size_t n, json_t *tr)
{
	snprintf(buf, n, "optim: {lr: %.17g, schedule: cosine, warmup: %d, min_lr: %.17g, "
		 "betas: [%.17g, %.17g], eps: %.17g, weight_decay: %.17g, clip: %.17g, "
		 "head_lr_mult: %.17g}\n",
		 json_number_value(json_object_get(tr, "lr")),
		 (int)json_integer_value(json_object_get(tr, "warmup")),
		 json_number_value(json_object_get(tr, "min_lr")),
		 num_at(json_object_get(tr, "betas"), 0), num_at(json_object_get(tr, "betas"), 1),
		 json_number_value(json_object_get(tr, "eps")),
		 json_number_value(json_object_get(tr, "weight_decay")),
		 json_number_value(json_object_get(tr, "clip")),
		 json_number_value(json_object_get(tr, "head_lr_mult")));
}

static inline void write_text(const char *path, const char *text)
{
	FILE *f = fopen(path, "w");

	fputs(text, f);
	fclose(f);
}

/*
 * `shardlm train @cfg` on one thread, on @np ranks (mpirun) if > 1, its output in @log: it must
 * succeed (one check)
 */
static inline void run_train(const char *shardlm, const char *cfg, int np, const char *log,
			     const char *name)
{
	char cmd[24576];
	int st;

	if (np > 1)
		snprintf(cmd, sizeof(cmd), "OMP_NUM_THREADS=1 %s -np %d --oversubscribe %s train "
			 "%s > %s 2>&1", getenv("MPIRUN") ? getenv("MPIRUN") : "mpirun", np,
			 shardlm, cfg, log);
	else
		snprintf(cmd, sizeof(cmd), "OMP_NUM_THREADS=1 %s train %s > %s 2>&1", shardlm, cfg,
			 log);
	st = system(cmd);
	CHECK(st == 0, "%s: shardlm train failed (%d); see %s", name, st, log);
}

/* training_metrics.json of the run in @run (*tm, for the caller to json_decref): its 3 steps */
static inline json_t *load_steps(const char *run, json_t **tm, const char *name)
{
	char p[8448];
	json_error_t jerr;
	json_t *steps;

	snprintf(p, sizeof(p), "%s/training_metrics.json", run);
	*tm = json_load_file(p, 0, &jerr);
	CHECK(*tm, "%s: no %s", name, p);
	steps = json_object_get(*tm, "steps");
	CHECK(json_array_size(steps) == 3, "%s: %zu steps", name, json_array_size(steps));
	return steps;
}

/*
 * Step @i of training_metrics.json (@st) against the reference @rc: loss and gradient norm
 * within @rel relative, and with @lr the learning rate within 1e-9.
 */
static inline void check_step(json_t *st, json_t *rc, int i, double rel, bool lr,
			      const char *name)
{
	double loss = json_number_value(json_object_get(st, "loss"));
	double gn = json_number_value(json_object_get(st, "grad_norm"));
	double wl = num_at(json_object_get(rc, "losses"), i);
	double wg = num_at(json_object_get(rc, "grad_norms"), i);

	track(loss, wl);
	track(gn, wg);
	CHECK(fabs(loss - wl) <= rel * fabs(wl), "%s step %d: loss %.9g, transformers %.9g", name,
	      i + 1, loss, wl);
	CHECK(fabs(gn - wg) <= rel * fabs(wg), "%s step %d: grad norm %.9g, transformers %.9g",
	      name, i + 1, gn, wg);
	if (lr)
		CHECK_CLOSE(json_number_value(json_object_get(st, "lr")),
			    num_at(json_object_get(rc, "lrs"), i), 1e-9, 0);
}

/* step @i (@st) of an sft run trained on as many targets as the reference's @rc */
static inline void check_targets(json_t *st, json_t *rc, int i, const char *name)
{
	CHECK(json_integer_value(json_object_get(st, "targets")) ==
	      json_integer_value(json_object_get(rc, "targets")),
	      "%s step %d: %lld targets", name, i + 1,
	      (long long)json_integer_value(json_object_get(st, "targets")));
}

/* the lines of `shardlm score` in @path against the reference logits @want (@n of them) */
static inline void check_score_file(const char *path, json_t *want, int n_want, double rel,
				    double abs_, bool prob, const char *what)
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
			    num_at(want, i), rel, abs_);
		if (prob)
			CHECK_CLOSE(json_number_value(json_object_get(j, "prob")),
				    1 / (1 + exp(-num_at(want, i))), rel, 0);
		json_decref(j);
		n++;
	}
	if (f)
		fclose(f);
	CHECK(n == n_want, "%s: %d score lines", what, n);
}

/* the exported model's config.json under @run (checked: present, architecture @arch) or NULL */
static inline json_t *export_config(const char *run, const char *arch, const char *name)
{
	char p[8448];
	json_error_t jerr;
	json_t *cj;

	snprintf(p, sizeof(p), "%s/model/config.json", run);
	cj = json_load_file(p, 0, &jerr);
	CHECK(cj, "%s: no exported %s", name, p);
	if (cj) {
		const char *a = json_string_value(
			json_array_get(json_object_get(cj, "architectures"), 0));

		CHECK(a && !strcmp(a, arch), "%s: exported as %s", name, a ? a : "?");
	}
	return cj;
}

#endif
