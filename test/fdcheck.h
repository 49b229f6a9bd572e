/*
 * fdcheck.h: the finite-difference gradient harness of the model tests (test_gradcheck,
 * test_moe_gradcheck, test_qwen35_model, test_q35moe): a tiny model's parameters on the host in
 * double, its units on a backend, a unit source over them, and the checks of analytic gradients
 * against central differences of the model's own loss; also the tiny configs and config.json
 * text they load.  The classifier micro-batches of test_gradcheck and test_moe_gradcheck are in
 * fdbatch.h.
 */
#ifndef SL_FDCHECK_H
#define SL_FDCHECK_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "model.h"
#include "testrng.h"
#include "testutil.h"

/*
 * What every tiny test model shares: @model_type, @n_layers (layer and MLP kinds all 0 until the
 * test sets them), rms_eps 1e-6, rope_theta 10000, initializer_range 0.02, no special tokens,
 * one label.  The test sets the sizes.
 */
static inline void tiny_config(struct sl_model_config *mc, const char *model_type, int n_layers)
{
	memset(mc, 0, sizeof(*mc));
	strcpy(mc->model_type, model_type);
	mc->n_layers = n_layers;
	mc->rms_eps = 1e-6;
	mc->rope_theta = 10000;
	mc->initializer_range = 0.02;
	mc->pad_token_id = mc->bos_token_id = mc->eos_token_id = -1;
	mc->num_labels = 1;
	mc->layer_kind = calloc(n_layers, sizeof(*mc->layer_kind));
	mc->mlp_kind = calloc(n_layers, sizeof(*mc->mlp_kind));
}

static inline void free_config(struct sl_model_config *mc)
{
	free(mc->layer_kind);
	free(mc->mlp_kind);
}

/* @text written as @dir/config.json and loaded into @mc; the loader's status */
static inline int load_config_text(const char *dir, const char *text,
				   struct sl_model_config *mc)
{
	char p[512];
	FILE *f;

	snprintf(p, sizeof(p), "%s/config.json", dir);
	f = fopen(p, "w");
	fputs(text, f);
	fclose(f);
	return sl_model_config_load(mc, p);
}

/* ---- an environment: parameters on the host in double, units on a backend -------------------- */

struct env {
	struct sl_backend *be;
	struct sl_layout lay;
	struct sl_model *m;
	size_t *ubase;		/* (n_units) offset of each unit in params */
	double *params;		/* (total_numel) the parameters, padding 0 */
	void **w;		/* (n_units) device weights */
	void **g;		/* (n_units) device grads */
	void **gsink;		/* (n_units) grads nobody reads (finite differences) */
	bool sink;		/* the source hands out gsink instead of g */
	int n_fwd_release, n_bwd_release;
};

static inline const void *src_weights(void *ctx, int u)
{
	return ((struct env *)ctx)->w[u];
}

static inline void *src_grads(void *ctx, int u)
{
	struct env *e = ctx;

	return e->sink ? e->gsink[u] : e->g[u];
}

static inline void src_release_fwd(void *ctx, int u)
{
	((struct env *)ctx)->n_fwd_release++;
}

static inline void src_release_bwd(void *ctx, int u)
{
	((struct env *)ctx)->n_bwd_release++;
}

/* the unit source over @e; @hooks: count the release calls */
static inline struct sl_unit_source env_source(struct env *e, bool hooks)
{
	return (struct sl_unit_source){ e, src_weights, src_grads,
					hooks ? src_release_fwd : NULL,
					hooks ? src_release_bwd : NULL, NULL };
}

/* element @off of unit @u set to @v on the backend (the host copy unchanged) */
static inline void put_elt(struct env *e, int u, size_t off, double v)
{
	float f = (float)v;

	e->be->upload(e->be, (char *)e->w[u] + off * e->be->elt,
		      e->be->elt == sizeof(double) ? (const void *)&v : (const void *)&f,
		      e->be->elt);
}

/* element @i of all the parameters set to @v on the backend */
static inline void put(struct env *e, size_t i, double v)
{
	int u = 0;

	while (u + 1 < e->lay.n_units && e->ubase[u + 1] <= i)
		u++;
	put_elt(e, u, i - e->ubase[u], v);
}

/* the host parameters to the backend, in its compute type */
static inline void upload_all(struct env *e)
{
	for (int u = 0; u < e->lay.n_units; u++) {
		size_t n = e->lay.unit_numel[u];
		char *h = malloc(n * e->be->elt);

		for (size_t i = 0; i < n; i++) {
			double v = e->params[e->ubase[u] + i];

			if (e->be->elt == sizeof(double))
				((double *)h)[i] = v;
			else
				((float *)h)[i] = (float)v;
		}
		e->be->upload(e->be, e->w[u], h, n * e->be->elt);
		free(h);
	}
}

static inline void zero_grads(struct env *e)
{
	for (int u = 0; u < e->lay.n_units; u++)
		e->be->zero(e->be, e->g[u], e->lay.unit_numel[u] * e->be->elt);
}

/* all gradients as one double vector (total_numel) */
static inline void get_grads(struct env *e, double *out)
{
	size_t elt = e->be->elt;

	for (int u = 0; u < e->lay.n_units; u++) {
		size_t n = e->lay.unit_numel[u];
		char *h = malloc(n * elt);

		e->be->download(e->be, h, e->g[u], n * elt);
		for (size_t i = 0; i < n; i++)
			out[e->ubase[u] + i] = elt == sizeof(double) ? ((double *)h)[i] :
								       ((float *)h)[i];
		free(h);
	}
}

/* get_grads, then the gradients zeroed for the next step */
static inline void take_grads(struct env *e, double *out)
{
	get_grads(e, out);
	zero_grads(e);
}

/* the layout of @mc for @task on @be, and zero host parameters; the test fills them */
static inline void env_layout(struct env *e, const struct sl_model_config *mc,
			      struct sl_backend *be, int task)
{
	int rc;

	memset(e, 0, sizeof(*e));
	e->be = be;
	rc = sl_model_layout(mc, task, &e->lay);
	CHECK(rc == 0, "layout: %d", rc);
	e->ubase = calloc(e->lay.n_units, sizeof(*e->ubase));
	for (int u = 1; u < e->lay.n_units; u++)
		e->ubase[u] = e->ubase[u - 1] + e->lay.unit_numel[u - 1];
	e->params = calloc(e->lay.total_numel, sizeof(double));
}

/* the units on the backend from the host parameters, and the model (NULL on failure) */
static inline void env_create(struct env *e, const struct sl_model_config *mc, bool ckpt,
			      int max_tokens, int max_b)
{
	struct sl_backend *be = e->be;

	e->w = calloc(e->lay.n_units, sizeof(void *));
	e->g = calloc(e->lay.n_units, sizeof(void *));
	e->gsink = calloc(e->lay.n_units, sizeof(void *));
	for (int u = 0; u < e->lay.n_units; u++) {
		e->w[u] = be->alloc(be, e->lay.unit_numel[u] * be->elt);
		e->g[u] = be->alloc(be, e->lay.unit_numel[u] * be->elt);
		e->gsink[u] = be->alloc(be, e->lay.unit_numel[u] * be->elt);
	}
	upload_all(e);
	e->m = sl_model_create(mc, &e->lay, be, max_tokens, max_b, ckpt);
	CHECK(e->m != NULL, "model");
}

/* everything but the backend */
static inline void env_free(struct env *e)
{
	sl_model_destroy(e->m);
	for (int u = 0; u < e->lay.n_units; u++) {
		e->be->free(e->be, e->w[u]);
		e->be->free(e->be, e->g[u]);
		e->be->free(e->be, e->gsink[u]);
	}
	free(e->w);
	free(e->g);
	free(e->gsink);
	free(e->params);
	free(e->ubase);
	sl_layout_free(&e->lay);
}

/* env_free and the backend too */
static inline void env_destroy(struct env *e)
{
	struct sl_backend *be = e->be;

	env_free(e);
	be->destroy(be);
}

/* a parameter's random value by its name and init kind, as the Qwen3.5 HF fixtures perturb them */
static inline double init_value(const struct sl_tensor_info *t)
{
	if (strstr(t->name, "A_log"))
		return log(0.2 + rng_unif());
	if (strstr(t->name, "mlp.gate.weight"))	/* routing with margins */
		return 1.5 * rng_normal();
	if (t->init == SL_INIT_ONES)
		return 1 + 0.2 * rng_normal();
	if (t->init == SL_INIT_ZEROS)
		return 0.2 * rng_normal();
	return 0.4 * rng_normal();
}

/*
 * The Qwen3.5 tests' environment: parameters from init_value() (seed 12345), those that @donor
 * (if any) has by name copied from it.
 */
static inline void env_init_q35(struct env *e, const struct sl_model_config *mc,
				struct sl_backend *be, int task, bool ckpt, int max_tokens,
				int max_b, const struct env *donor)
{
	env_layout(e, mc, be, task);
	rng_state = 12345;
	for (int i = 0; i < e->lay.n_tensors; i++) {
		const struct sl_tensor_info *t = &e->lay.t[i], *d;
		double *q = e->params + e->ubase[t->unit] + t->offset;

		for (size_t k = 0; k < t->numel; k++)
			q[k] = init_value(t);
		if (donor && (d = sl_layout_find(&donor->lay, t->name)))
			memcpy(q, donor->params + donor->ubase[d->unit] + d->offset,
			       t->numel * sizeof(double));
	}
	env_create(e, mc, ckpt, max_tokens, max_b);
}

/* the tensor holding parameter @i and *off, @i's element in it; NULL for padding */
static inline const struct sl_tensor_info *param_tensor(const struct env *e, size_t i,
							size_t *off)
{
	for (int k = 0; k < e->lay.n_tensors; k++) {
		const struct sl_tensor_info *t = &e->lay.t[k];
		size_t base = e->ubase[t->unit] + t->offset;

		if (i >= base && i < base + t->numel) {
			*off = i - base;
			return t;
		}
	}
	return NULL;
}

/*
 * Analytic gradient @g against @fd(e, @arg, tensor, i) at every element of the tensors of at most
 * @whole elements and at @per elements spread over each larger one; padding between tensors
 * must have no gradient (one check each).  Returns the number of elements compared; *bad counts
 * those off by more than @rel |fd| + 1e-8 (the first 10 printed), for the caller to check.
 */
static inline int check_fd_sampled(struct env *e, const double *g, size_t whole, size_t per,
				   double rel,
				   double (*fd)(struct env *, const void *,
						const struct sl_tensor_info *, size_t),
				   const void *arg, int *bad)
{
	int n_fd = 0;

	for (size_t i = 0; i < e->lay.total_numel; i++) {
		size_t off = 0;
		const struct sl_tensor_info *t = param_tensor(e, i, &off);
		double f, d;

		if (!t) {
			CHECK(g[i] == 0, "padding element %zu has gradient %g", i, g[i]);
			continue;
		}
		if (t->numel > whole && off % (t->numel / per) != (size_t)(t->numel / per) / 2)
			continue;
		f = fd(e, arg, t, i);
		n_fd++;
		d = fabs(f - g[i]);
		if (d > rel * fabs(f) + 1e-8 && (*bad)++ < 10)
			fprintf(stderr, "%s[%zu]: analytic %.10g, finite difference %.10g\n",
				t->name, off, g[i], f);
	}
	return n_fd;
}

/*
 * Activation checkpointing changes nothing: loss @lc and gradients @gc (n) to the bit those of the
 * plain step, @l and @g; *bad counts the differing gradients (the first 10 fail a check each).
 */
static inline void check_identical(double lc, double l, const double *gc, const double *g,
				   size_t n, int *bad)
{
	CHECK(lc == l, "checkpointed loss %.17g vs %.17g", lc, l);
	for (size_t i = 0; i < n; i++)
		if (gc[i] != g[i] && (*bad)++ < 10)
			CHECK(0, "checkpointed gradient %zu: %.17g vs %.17g", i, gc[i], g[i]);
}

/* @g against @ref (n) in norm: |g - ref| / |ref| < @tol (one check) */
static inline void check_rel_norm(const double *g, const double *ref, size_t n, double tol,
				  const char *what)
{
	double num = 0, den = 0;

	for (size_t i = 0; i < n; i++) {
		num += (g[i] - ref[i]) * (g[i] - ref[i]);
		den += ref[i] * ref[i];
	}
	CHECK(sqrt(num / den) < tol, "%s: gradients off by %g (relative norm)", what,
	      sqrt(num / den));
}

#endif
