/*
 * shard: parameter units, their fp32 master weights and AdamW moments, and the buffers the model
 * computes with.
 *
 * Each unit of the layout (model.h) is one flat buffer.  This rank keeps the fp32 master slice of
 * every unit and its AdamW moments; the compute-precision full unit is what the model reads and the
 * unit's compute-precision gradient buffer is where its backward accumulates.  With one rank the
 * slice is the whole unit and "gathering" is a cast; the distributed issue adds the all-gather,
 * the reduce-scatter and padding to the shard group size behind the same interface.
 */
#ifndef SL_SHARD_H
#define SL_SHARD_H

#include <stdbool.h>
#include <stddef.h>

#include "backend.h"
#include "model.h"

struct sl_optim_hparams {
	double lr;			/* this step's learning rate (schedule applied) */
	double head_lr_mult;
	double beta1, beta2, eps;
	double weight_decay;
	double clip;			/* 0 = off */
	int step;			/* 1-based, for the bias corrections */
};

struct sl_shard_unit {
	size_t numel;			/* elements of the full unit */
	float *master;			/* (numel) f32, backend memory */
	float *m, *v;			/* (numel) f32 AdamW moments */
	float *grad32;			/* (numel) f32 gradient, reduced */
	void *w;			/* (numel) compute precision, the full unit */
	void *g;			/* (numel) compute precision gradient accumulator */
};

struct sl_shard {
	struct sl_backend *be;
	const struct sl_layout *lay;
	int n_units;
	struct sl_shard_unit *u;
	struct sl_unit_source src;	/* what the model reads units through */
	double *d_sumsq;		/* (1) device scratch */
};

/* Create from host fp32 units (units[u]: lay->unit_numel[u] elements). */
int sl_shard_create(struct sl_shard *s, struct sl_backend *be, const struct sl_layout *lay,
		    float *const *units);
void sl_shard_destroy(struct sl_shard *s);

/* Zero every gradient accumulator (start of an optimizer step). */
void sl_shard_zero_grads(struct sl_shard *s);

/*
 * Finish the step: gradients to f32, global norm (returned in *grad_norm, before clipping),
 * clipping, AdamW on the master weights, new compute weights.  Returns 0, or a positive value
 * when the gradient norm is not finite (no update made).
 */
int sl_shard_optim_step(struct sl_shard *s, const struct sl_optim_hparams *h, double *grad_norm);

/* Download the master weights of unit u into host memory (numel floats). */
void sl_shard_get_master(struct sl_shard *s, int unit, float *host);

#endif
