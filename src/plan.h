/*
 * plan: `shardlm plan` and the memory check `train` runs before it loads anything.
 *
 * Predicts the bytes each GPU and each node's host memory hold for a config, by category, from
 * the model's config.json alone (no weights), counting the buffers shard.c, model.c and the
 * backends allocate, the same way they allocate them (one count per buffer, rounded to the
 * backend allocator's alignment).  Reports GiB (2^30 bytes); memory sizes given by the user are
 * GB (10^9 bytes) unless written with a GiB suffix.
 */
#ifndef SL_PLAN_H
#define SL_PLAN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#include "config.h"
#include "model.h"

enum sl_plan_cat {
	SL_PLAN_WEIGHTS,	/* compute-precision shard copy + gathered units in flight */
	SL_PLAN_GRADS,		/* unit gradient buffers in flight + fp32 shard accumulators */
	SL_PLAN_OPTIM,		/* fp32 master weights + AdamW m, v (shards) */
	SL_PLAN_ACTS,		/* activations kept for the backward + backward scratch */
	SL_PLAN_COMM,		/* reduce-scatter scratch, offload staging */
	SL_PLAN_WORKSPACE,	/* backend workspaces (cuBLASLt, reduction scratch) */
	SL_PLAN_HEAD,		/* head / loss buffers and the device batch */
	SL_PLAN_RUNTIME,	/* CUDA context (an estimate; outside the allocator) */
	SL_PLAN_CKPT,		/* host: checkpoint staging (transient, while one is written) */
	SL_PLAN_N
};

struct sl_plan_opts {
	int gpus;			/* ranks of the job, one per GPU */
	int node_size;			/* ranks per node; 0 = parallel.node_size, else min(gpus, 8) */
	double gpu_mem;			/* bytes per GPU; 0 = not checked */
	double host_mem;		/* bytes per node; 0 = not checked */
	/* overrides of the config, for the advice (-1 = as configured) */
	int offload;			/* enum sl_offload */
	int ckpt;			/* activation checkpointing 0/1 */
	bool force_lean;		/* plan offload optimizer's lean host layout (tests) */
	bool no_gdn_aux;		/* plan without the delta rule's saved forward tiles */
};

struct sl_plan {
	/* what was planned */
	int gpus, node_size, S;		/* ranks, per node, per shard group */
	bool cuda;
	size_t elt, stat_elt;		/* compute and stat element bytes */
	enum sl_offload offload;
	bool ckpt;
	int batch, seq;			/* records per micro-batch, tokens each (data.max_state) */
	int C;				/* parallel.context: the model holds 1/C of each row */
	size_t params;			/* P: elements of every unit (layout, padded) */
	size_t shard_elems;		/* sum over units of this rank's shard */
	size_t max_padded, max_shard;	/* largest unit (padded) and shard, elements */
	bool grad_direct;		/* gradients in the compute type, no slots (shard.c) */
	size_t lent_grads;		/* bytes of layers' gradients held in their activations
					 * (not in dev[SL_PLAN_GRADS]) */
	int n_wslots;			/* gathered units in flight */
	bool accum_dev;			/* offload, accum > 1: micro-batches add up on the GPU */
	bool lean;			/* offload optimizer with gradients kept on the GPU, the
					 * host holding master, m, v only (shard's host_lean):
					 * chosen when the usual host layout does not fit */
	bool gdn_aux;			/* cuda, Gated DeltaNet: each layer keeps the forward's
					 * delta and Q S0 tiles for the backward (the backend's
					 * gdn_states_extra); dropped when only that does not fit */
	bool gdn_aux_dropped;		/* they would not fit: the run goes without */
	/* bytes */
	size_t dev[SL_PLAN_N];		/* per GPU ("device" memory: host memory on cpu) */
	size_t dev_total;
	size_t host[SL_PLAN_N];		/* per rank, host memory (offloaded state) */
	size_t host_rank, host_node;	/* per rank and per node, the cpu backend's device too */
	double gpu_mem, host_mem;	/* limits checked, 0 = none */
	bool gpu_fits, host_fits;
};

/* Plan @c for model @mc / @lay with @o.  0, or -1 with a message. */
int sl_plan_compute(const struct sl_config *c, const struct sl_model_config *mc,
		    const struct sl_layout *lay, const struct sl_plan_opts *o, struct sl_plan *p);

/* Whether @p fits both limits it was given. */
bool sl_plan_fits(const struct sl_plan *p);

/* The table, the verdict and, when it does not fit, the settings that would (text). */
void sl_plan_print(const struct sl_plan *p, const struct sl_config *c,
		   const struct sl_model_config *mc, const struct sl_layout *lay,
		   const struct sl_plan_opts *o, FILE *out);

/*
 * `train`'s check, before anything is loaded: reads the model's config.json, plans for @world
 * ranks, @node_size per node, against @gpu_bytes per GPU (0: unknown, GPU part skipped) and this
 * node's physical memory.  0 when it fits, -1 (with the reason and what to change) when not.
 * *accum_dev, *lean: the plan's sl_plan.accum_dev and sl_plan.lean, for shard; *gdn_aux: 1
 * where the plan keeps the Gated DeltaNet forward's tiles for the backward (sl_plan.gdn_aux),
 * -1 where it dropped them to fit, 0 where there are none.
 */
int sl_plan_check_job(const struct sl_config *c, int world, int node_size, double gpu_bytes,
		      bool *accum_dev, bool *lean, int *gdn_aux);

/* "80", "80GB" (10^9) or "74.5GiB" (2^30) -> bytes; -1 when malformed. */
double sl_plan_parse_mem(const char *s);

int sl_cmd_plan(int argc, char **argv);

#endif
