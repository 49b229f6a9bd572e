/*
 * shard: fully sharded parameters (FSDP / ZeRO-3).
 *
 * Each unit of the layout (model.h) is one flat buffer padded to a multiple of the shard group's
 * size S; the rank with index r in its shard group owns elements [r * shard, (r + 1) * shard) and
 * keeps their fp32 master weights, AdamW moments and fp32 gradient accumulator.  The model reads a
 * unit through struct sl_unit_source: weights(u) all-gathers the compute-precision unit into a
 * gather slot (again in the backward when parallel.reshard_after_forward), and when a unit's
 * backward is done its gradient is reduce-scattered (in fp32, precision.reduce) into the shard's
 * accumulator.  With HSDP the accumulators are then summed over the replica group.  The optimizer
 * and the global gradient norm run on shards.  Knows the communicators and the backend, no data.
 *
 * parallel.offload: optimizer keeps master, m, v and the gradient accumulator in host memory (the
 * backend's host_alloc: pinned on cuda): each unit's reduced gradient shard is downloaded when
 * its backward ends (added on the host for later micro-batches), AdamW runs on the host (the cpu
 * backend's arithmetic, adamw_math.h) and each updated shard goes back up as compute weights.
 * parallel.offload: params also keeps the compute-precision shard copy on the host and uploads a
 * unit (its shard, then all-gathered) into a pool of prefetch + 2 device slots ahead of use.
 */
#ifndef SL_SHARD_H
#define SL_SHARD_H

#include <stdbool.h>
#include <stddef.h>

#include "backend.h"
#include "config.h"
#include "dist.h"
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
	size_t numel;			/* elements of the unit (layout) */
	size_t padded;			/* numel rounded up to a multiple of S */
	size_t shard;			/* padded / S: elements this rank owns */
	size_t off;			/* first owned element: shard index * shard */
	float *master;			/* (shard) f32; host memory with offload */
	float *m, *v;			/* (shard) f32 AdamW moments; host with offload */
	float *grad32;			/* (shard) f32 gradient accumulated over the step; host
					 * with offload */
	void *w_shard;			/* (shard) compute precision copy of master; host with
					 * offload: params */
	int wslot;			/* gather slot holding the full unit, or -1 */
	bool grads_seen;		/* a micro-batch already reduced into grad32 */
};

struct sl_shard_slot {
	void *buf;			/* (max padded) compute precision */
	int unit;			/* unit whose full weights/grads it holds, -1 none */
	bool in_use;
	unsigned long last_use;
};

struct sl_shard {
	struct sl_backend *be;
	const struct sl_layout *lay;
	int n_units;
	struct sl_shard_unit *u;
	struct sl_comm *shard_comm;	/* NULL or size 1: one rank holds whole units */
	struct sl_comm *replica_comm;	/* NULL or size 1: no replicas (FSDP) */
	int S, shard_rank;
	bool reshard_after_forward;
	enum sl_comm_dtype compute_dtype;
	int n_wslots, n_gslots;
	struct sl_shard_slot *wslots, *gslots;
	float *g32_full;		/* (max padded) f32 scratch: the unit's gradient */
	float *rs_out;			/* (max shard) f32 scratch: its reduced shard */
	double *d_sumsq;		/* (1) device scratch */
	enum sl_offload offload;
	bool host_state;		/* master, m, v, grad32 in host memory */
	bool host_params;		/* w_shard in host memory too */
	float *h_scratch;		/* (max shard) f32 host: a later micro-batch's gradient */
	void *d_wstage;			/* (max shard) compute, device: offload params staging */
	unsigned long tick;
	size_t *shard_sizes;		/* (n_units) for checkpoints */
	struct sl_unit_source src;	/* what the model reads units through */
};

struct sl_shard_opts {
	struct sl_comm *shard_comm;	/* may be NULL (one rank) */
	struct sl_comm *replica_comm;	/* may be NULL */
	bool reshard_after_forward;
	int prefetch;			/* units ahead (sizes the slot pool) */
	enum sl_offload offload;	/* parallel.offload */
};

int sl_shard_create(struct sl_shard *s, struct sl_backend *be, const struct sl_layout *lay,
		    const struct sl_shard_opts *o);
void sl_shard_destroy(struct sl_shard *s);

/* Take this rank's slice of unit u from the whole unit in host memory (numel floats). */
void sl_shard_load_unit(struct sl_shard *s, int u, const float *full);
/* This rank's state of unit u to / from host memory (shard floats each; m, v may be NULL). */
void sl_shard_get_state(struct sl_shard *s, int u, float *master, float *m, float *v);
void sl_shard_set_state(struct sl_shard *s, int u, const float *master, const float *m,
			const float *v);
/*
 * The whole unit u's master weights (numel floats) at shard-group rank @root (host); other ranks
 * pass NULL.  Collective over the shard group.
 */
int sl_shard_gather_unit(struct sl_shard *s, int u, float *full, int root);

/* Start an optimizer step: zero the gradient accumulators. */
void sl_shard_begin_step(struct sl_shard *s);

/*
 * Finish the step: replica all-reduce (HSDP), global gradient norm (*grad_norm, before
 * clipping), clipping, AdamW on the master shards, new compute weights.  Returns 0, or 1 when the
 * gradient norm is not finite (nothing updated).  Collective.
 */
int sl_shard_optim_step(struct sl_shard *s, const struct sl_optim_hparams *h, double *grad_norm);

#endif
