/*
 * shard: parameter units, fp32 master weights, AdamW moments and compute buffers (see shard.h).
 * One rank holds whole units here; the all-gather / reduce-scatter of the distributed issue plug
 * in where the compute weights are produced and where the gradients are reduced.
 */
#include "shard.h"

#include <math.h>
#include <stdlib.h>

#include "log.h"
#include "optim.h"

static const void *unit_weights(void *ctx, int unit)
{
	struct sl_shard *s = ctx;

	return s->u[unit].w;
}

static void *unit_grads(void *ctx, int unit)
{
	struct sl_shard *s = ctx;

	return s->u[unit].g;
}

int sl_shard_create(struct sl_shard *s, struct sl_backend *be, const struct sl_layout *lay,
		    float *const *units)
{
	struct sl_backend *b = be;

	s->be = be;
	s->lay = lay;
	s->n_units = lay->n_units;
	s->u = calloc(lay->n_units, sizeof(*s->u));
	if (!s->u)
		return -1;
	for (int i = 0; i < lay->n_units; i++) {
		struct sl_shard_unit *u = &s->u[i];
		size_t n = lay->unit_numel[i];

		u->numel = n;
		u->master = b->alloc(b, n * sizeof(float));
		u->m = b->alloc(b, n * sizeof(float));
		u->v = b->alloc(b, n * sizeof(float));
		u->grad32 = b->alloc(b, n * sizeof(float));
		u->w = b->alloc(b, n * b->elt);
		u->g = b->alloc(b, n * b->elt);
		b->upload(b, u->master, units[i], n * sizeof(float));
		b->to_compute(b, u->w, u->master, n);
	}
	s->d_sumsq = b->alloc(b, sizeof(double));
	s->src = (struct sl_unit_source){ .ctx = s, .weights = unit_weights, .grads = unit_grads };
	return 0;
}

void sl_shard_destroy(struct sl_shard *s)
{
	struct sl_backend *b = s->be;

	if (!s->u)
		return;
	for (int i = 0; i < s->n_units; i++) {
		struct sl_shard_unit *u = &s->u[i];

		b->free(b, u->master);
		b->free(b, u->m);
		b->free(b, u->v);
		b->free(b, u->grad32);
		b->free(b, u->w);
		b->free(b, u->g);
	}
	b->free(b, s->d_sumsq);
	free(s->u);
	s->u = NULL;
}

void sl_shard_zero_grads(struct sl_shard *s)
{
	for (int i = 0; i < s->n_units; i++)
		s->be->zero(s->be, s->u[i].g, s->u[i].numel * s->be->elt);
}

int sl_shard_optim_step(struct sl_shard *s, const struct sl_optim_hparams *h, double *grad_norm)
{
	struct sl_backend *b = s->be;
	const struct sl_layout *lay = s->lay;
	double sumsq = 0, part;

	for (int i = 0; i < s->n_units; i++) {
		struct sl_shard_unit *u = &s->u[i];

		b->to_f32(b, u->grad32, u->g, u->numel);
		b->sumsq_f32(b, s->d_sumsq, u->grad32, u->numel);
		b->download(b, &part, s->d_sumsq, sizeof(part));
		sumsq += part;
	}
	*grad_norm = sqrt(sumsq);
	if (!isfinite(*grad_norm))
		return 1;

	struct sl_adamw_args a = {
		.beta1 = h->beta1, .beta2 = h->beta2, .eps = h->eps,
		.bc1 = 1.0 - pow(h->beta1, h->step), .bc2 = 1.0 - pow(h->beta2, h->step),
		.grad_scale = sl_clip_scale(*grad_norm, h->clip),
	};
	/* one update per tensor: learning rate and decay differ between tensors of a unit */
	for (int t = 0; t < lay->n_tensors; t++) {
		const struct sl_tensor_info *ti = &lay->t[t];
		struct sl_shard_unit *u = &s->u[ti->unit];
		size_t off = ti->offset;

		a.lr = h->lr * (ti->head ? h->head_lr_mult : 1.0);
		a.weight_decay = ti->decay ? h->weight_decay : 0.0;
		b->adamw_f32(b, u->master + off, u->m + off, u->v + off, u->grad32 + off,
			     (char *)u->w + off * b->elt, ti->numel, &a);
	}
	return 0;
}

void sl_shard_get_master(struct sl_shard *s, int unit, float *host)
{
	s->be->download(s->be, host, s->u[unit].master, s->u[unit].numel * sizeof(float));
}
