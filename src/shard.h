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
 * backend's host_alloc: pinned on cuda) and runs AdamW on the host, overlapped with the GPU
 * (offload.c): each unit's reduced gradient shard leaves for the host on a copy stream as soon
 * as the unit's backward is done; earlier micro-batches of a step accumulate on the device (when
 * the planner found room: opts.accum_on_device) or on the host; a worker thread adds them up and
 * sums their squares as they arrive; once the global norm is known the worker updates unit after
 * unit in forward order and uploads each unit's new compute weights, and the next forward waits
 * only for the unit it needs.  parallel.offload: params also keeps the compute-precision shard
 * on the host only and streams each unit into a pool of prefetch + 2 device slots, `prefetch`
 * units ahead of use in the forward and in the backward.
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
	size_t numel;			/* elements of the unit as this rank uses it: the layout's,
					 * or its experts' part of an experts' unit */
	size_t base;			/* where that part starts in the layout's unit (0, or
					 * expert group index * numel) */
	struct sl_comm *comm;		/* the ranks sharing the unit: the shard group, or for
					 * an experts' unit split over an expert group the ranks
					 * of the shard group holding the same experts; NULL: one */
	int S, rank;			/* comm's size (1 without one) and this rank's index */
	size_t padded;			/* numel rounded up to a multiple of S */
	size_t shard;			/* padded / S: elements this rank owns */
	size_t off;			/* the first owned element in the layout's unit:
					 * base + rank * shard */
	size_t count;			/* owned elements that are not padding (<= shard) */
	float *master;			/* (shard) f32; host memory with offload */
	float *m, *v;			/* (shard) f32 AdamW moments; host with offload */
	float *grad32;			/* (shard) f32 gradient accumulated over the step; host
					 * with offload; NULL with host_lean (d_acc holds it) */
	void *gradc;			/* grad_direct: (shard) the gradient in the compute type,
					 * where the backward writes it; else NULL */
	bool grad_lent;			/* grad32 or gradc is memory the trainer lent
					 * (opts.grad_room) */
	void *w_shard;			/* (shard) compute precision copy of master; host with
					 * offload: params */
	int wslot;			/* gather slot holding the full unit, or -1 */
	bool grads_seen;		/* a micro-batch already reduced into grad32 */
	/* offload (offload.c) */
	void *w_host;			/* (shard) compute precision, host: what AdamW writes;
					 * with offload: params the same buffer as w_shard */
	float *d_acc;			/* (shard) f32 device accumulator of earlier
					 * micro-batches (opts.accum_on_device), else NULL */
	bool acc_dev;			/* this step accumulates in d_acc */
	void *ev_g;			/* d_acc's download to grad32 */
	void *ev_w;			/* w_host's upload to w_shard (offload: optimizer) */
	bool w_wait;			/* the compute stream must still wait for ev_w */
	unsigned long w_gen;		/* == shard's w_gen when w_host holds the newest update */
	double sumsq;			/* sum of grad32^2 once the step's gradients are in */
	void *ev_opt;			/* overlap_optimizer: the unit's AdamW done (side stream) */
	bool opt_wait;			/* the compute stream must still wait for ev_opt */
	bool opt_pending;		/* overlap_optimizer: its update is still to be issued */
	int fwd_pos;			/* its place in the forward's order of units, or -1 */
	bool sq_side;			/* this step's sum of squares is on the side stream */
};

struct sl_shard_slot {
	void *buf;			/* cap elements, compute precision */
	size_t cap;			/* the largest unit (padded) it can hold */
	int unit;			/* unit whose full weights/grads it holds, -1 none */
	bool in_use;
	unsigned long last_use;
	void *ev;			/* offload: params: its upload from the host */
	bool pending;			/* the compute stream must still wait for ev */
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
	float *g32_full;		/* f32 scratch: the unit's gradient on its way into the
					 * reduce-scatter, at most g32_elems (SL_SHARD_RS_STAGE
					 * bytes): larger units go through it in pieces */
	size_t g32_elems;
	float *rs_out;			/* (max shard) f32 scratch: its reduced shard; NULL
					 * until needed when a step has one micro-batch */
	size_t max_shard;		/* the largest unit shard */
	/*
	 * One rank holds every unit whole (no shard group, no replicas), a step has one
	 * micro-batch, the state is on the device and the backend has sumsq_c and adamw_c: the
	 * backward writes each unit's gradient straight into its own buffer (gradc, in the compute
	 * type), which the norm and AdamW read; no gradient slots, no fp32 copy.  The update is
	 * the same: the fp32 copy would hold the same values.
	 */
	bool grad_direct;
	size_t grad_elt;		/* bytes per gradient element: 4, or the compute type's */
	double *d_sumsq;		/* (n_units) device scratch: each unit's sum of squares */
	double *h_sumsq;		/* (n_units) their host copy */
	enum sl_offload offload;
	bool host_state;		/* master, m, v, grad32 in host memory */
	bool host_params;		/* w_shard in host memory too */
	void *d_wstage;			/* (max shard) compute, device: offload params staging
					 * before the all-gather (S > 1) */
	int prefetch;			/* units uploaded ahead (offload: params, S = 1) */
	bool accum_dev;			/* offload: accumulate micro-batches on the device */
	bool lean;			/* opts.host_lean (implies accum_dev) */
	int accum;			/* opts.accum */
	bool mb_last;			/* this micro-batch is the step's last (or unknown) */
	bool bwd;			/* in a backward pass (prefetch direction) */
	bool grads_pending;		/* gradients sent since the last optimizer step */
	unsigned long w_gen;		/* optimizer updates so far (offload) */
	struct sl_offload_engine *off;	/* the offload engine, NULL without offload */
	unsigned long tick;
	size_t *shard_sizes;		/* (n_units) for checkpoints */
	size_t *shard_starts;		/* (n_units) each unit's off, for checkpoints */
	size_t *shard_counts;		/* (n_units) each unit's count */
	struct sl_unit_source src;	/* what the model reads units through */
	/*
	 * opts.overlap_optimizer: AdamW runs on the backend's side stream, unit after unit in
	 * the order the forward reads them (fwd_order, learnt from the first forward), and the
	 * next forward waits only for the unit it reads (ev_opt); a host read or write of the
	 * state first waits for all of it (sl_shard_settle).  The updates are issued as the next
	 * forward comes to them: opt_ahead units beyond the one it reads (each after what the
	 * compute stream has been given so far; -1: all of them at the optimizer step), in
	 * launches of at most opt_chunk elements (0: one a run of tensors) so that the compute
	 * stream's blocks, of higher priority, find free SMs between them.
	 */
	bool overlap_opt;
	int opt_last;			/* the last unit updated on the side stream, or -1 */
	int opt_ahead;
	size_t opt_chunk;
	int opt_npending;		/* units whose update is still to be issued */
	int *fwd_order;			/* (n_units) units in the forward's order; n_fwd known */
	int n_fwd;
	bool fwd_known;			/* a backward has run: fwd_order is complete */
	struct sl_optim_hparams opt_h;	/* the pending updates' hyperparameters */
	struct sl_adamw_args opt_a;	/* and their step-wide arguments (norm, clip scale) */
	/* overlap_optimizer, no replicas: each unit's sum of squares runs on the side stream as
	 * soon as its backward's gradient is reduced, the step's end waits for the last one */
	bool sq_overlap;
	void *ev_sq;			/* the latest of them */
	bool sq_pending;		/* issued since the last wait for ev_sq */
	/* with grad_direct and sq_overlap (one rank, one micro-batch) and no clipping (optim.clip
	 * 0: the update needs no norm), each unit's update is issued on the side stream as soon
	 * as the backward has its gradient, skipped on the device if the unit's sum of squares
	 * is not finite (early_step: this step's were; SHARDLM_OPT_BWD=0: off) */
	bool early_on, early_step;
	int early_poison;		/* sl_shard_early_update's poison (tests) */
};

/*
 * The reduce-scatter's fp32 staging: a unit whose fp32 gradient is larger goes through it in
 * rounds, each taking the same piece of every rank's shard (a vocabulary-sized embedding would
 * otherwise size it: 5 GB for the 27B hybrid's).
 */
#define SL_SHARD_RS_STAGE ((size_t)512 << 20)

struct sl_shard_opts {
	struct sl_comm *shard_comm;	/* may be NULL (one rank) */
	struct sl_comm *replica_comm;	/* may be NULL */
	/*
	 * Expert parallelism (parallel.expert = P > 1): this rank runs experts [q E/P, (q+1) E/P)
	 * of every MoE layer (q = expert_index) and holds only those of each experts' unit
	 * (layout.unit_experts), sharded over expert_comm: the ranks of its shard group with the
	 * same q.  The shard group must hold whole expert groups (every q equally often).
	 */
	int expert_groups;		/* P; 0 or 1: none */
	int expert_index;		/* q */
	struct sl_comm *expert_comm;	/* may be NULL when it would have one rank */
	bool reshard_after_forward;
	int prefetch;			/* units ahead (sizes the slot pool) */
	enum sl_offload offload;	/* parallel.offload */
	bool accum_on_device;		/* offload, accum > 1: earlier micro-batches' gradients
					 * accumulate in fp32 on the device (the planner's call) */
	int accum;			/* micro-batches per step, 0 = unknown (offload sizes
					 * its host accumulation buffers up front when > 1) */
	/*
	 * Optional: memory unit u's gradient accumulator may live in, instead of a block of its
	 * own (NULL, or fewer than the shard's bytes: none): memory nothing uses from the end of
	 * the unit's backward in a step to the next step's forward (a layer's activations).  Used
	 * only when every step has one micro-batch (accum 1) and the optimizer state is on the
	 * device; the gradient is then born in the backward and dies in the optimizer step.
	 * @during: the memory must be free from the unit's first src.grads (grad_direct, where
	 * the backward writes the gradient itself), not only from its release_bwd.
	 */
	void *(*grad_room)(void *ctx, int unit, bool during, size_t *bytes);
	void *grad_room_ctx;
	bool no_grad_direct;		/* tests: the fp32 path even where grad_direct applies */
	/*
	 * AdamW on the backend's side stream (backend.h side_begin), under the next step's
	 * forward, which waits for each unit's update only where it reads the unit's weights;
	 * without replicas the gradient norm's sums of squares too, unit by unit under the rest of
	 * the backward.  Ignored with offload (which overlaps its own way) or a backend without a
	 * side stream.  optimizer_ahead N > 0: each unit's update is issued only when the next
	 * forward reads the unit N places before it (0: all at the optimizer step);
	 * optimizer_chunk: at most so many elements a launch (0: no limit).
	 */
	bool overlap_optimizer;
	int optimizer_ahead;
	size_t optimizer_chunk;
	bool host_lean;			/* offload: optimizer on a host too small for the usual
					 * layout: gradients stay on the device (fp32, summed
					 * there) and stream through a small host ring during
					 * the update, which writes the bf16 copy into a ring
					 * too: the host holds master, m and v only */
};

int sl_shard_create(struct sl_shard *s, struct sl_backend *be, const struct sl_layout *lay,
		    const struct sl_shard_opts *o);
void sl_shard_destroy(struct sl_shard *s);
/*
 * overlap_optimizer: the compute stream waits for everything on the side stream (the last
 * optimizer step, the sums of squares issued since; the state functions below and the next
 * optimizer step do this themselves); else nothing.
 */
void sl_shard_settle(struct sl_shard *s);

/* Take this rank's slice of unit u from the whole unit in host memory (the layout's
 * unit_numel[u] floats). */
void sl_shard_load_unit(struct sl_shard *s, int u, const float *full);
/* This rank's state of unit u to / from host memory (shard floats each; m, v may be NULL). */
void sl_shard_get_state(struct sl_shard *s, int u, float *master, float *m, float *v);
void sl_shard_set_state(struct sl_shard *s, int u, const float *master, const float *m,
			const float *v);
/*
 * The whole unit u's master weights (the layout's unit_numel[u] floats, every expert of an
 * experts' unit) at shard-group rank @root (host); other ranks pass NULL.  Collective over the
 * shard group.
 */
int sl_shard_gather_unit(struct sl_shard *s, int u, float *full, int root);

/* Start an optimizer step: zero the gradient accumulators. */
void sl_shard_begin_step(struct sl_shard *s);
/*
 * The next micro-batch is the step's last (@last) or not.  Optional: without it every
 * micro-batch is treated as possibly the last (offload then accumulates on the host).
 */
void sl_shard_begin_micro(struct sl_shard *s, bool last);
/* the step's optimizer hyperparameters before its backward: with early_on (and no clipping)
 * the units' updates are issued as their gradients are done.  poison (tests): 1 a NaN into
 * each unit's gradient as the backward finishes it, 2 into unit 0's only, 0 none */
void sl_shard_early_update(struct sl_shard *s, const struct sl_optim_hparams *h, int poison);
/* a NaN as the first element of a compute-type buffer (bf16, f32 or f64) */
void sl_shard_poison(struct sl_backend *be, void *dst);
/* Wait until the offload worker is idle: host state and compute weights are current. */
void sl_shard_drain(struct sl_shard *s);

/* offload: where the host's time went, totals since the start (all 0 without offload) */
struct sl_offload_stats {
	double adam_s;			/* the worker's AdamW (and bf16 copy) */
	double grad_s;			/* the worker's gradient sums and sums of squares */
	double wait_s;			/* the model waiting in weights() for an update */
	int updates;			/* optimizer updates started */
};
void sl_offload_stats(struct sl_shard *s, struct sl_offload_stats *st);

/*
 * Finish the step: replica all-reduce (HSDP), global gradient norm (*grad_norm, before
 * clipping), clipping, AdamW on the master shards, new compute weights.  Returns 0, or 1 when the
 * gradient norm is not finite (nothing updated), or 2 when the updates issued in the backward
 * (early_step) ran for some units and were skipped for others, whose gradients were not finite
 * (the step is half taken).  Collective.  With offload or
 * overlap_optimizer the update runs on in the background after the return; whatever reads the
 * weights or the state waits for it.
 */
int sl_shard_optim_step(struct sl_shard *s, const struct sl_optim_hparams *h, double *grad_norm);

/*
 * Unit @ui's AdamW updates on shard @u as runs: tensors of the unit (in the layout's order) whose
 * parts of the shard lie back to back and share the head and decay flags (so the learning rate
 * and weight decay) make one update, e.g. a layer's experts one instead of three an expert.
 * AdamW is element-wise: a run gives every element what its tensor's own update would.
 * For each run, @a's lr and weight_decay are set from @h and the run's flags, then
 * @fn(ctx, k, n, a): elements [k, k + n) of the shard.
 */
void sl_shard_update_runs(const struct sl_layout *lay, const struct sl_shard_unit *u, int ui,
			  const struct sl_optim_hparams *h, struct sl_adamw_args *a,
			  void (*fn)(void *ctx, size_t k, size_t n, const struct sl_adamw_args *a),
			  void *ctx);

/*
 * The sizes (elements) of a pool of n unit slots, into caps[0..n): a pool holds at most n units at
 * once, so its slots take the n largest of the units' padded sizes (@padded, n_units of them),
 * largest first; more slots than units repeat the smallest.  caps has room for max(n, n_units).
 * shard.c allocates its pools at these sizes and the planner counts them.
 */
void sl_shard_pool_caps(const size_t *padded, int n_units, int n, size_t *caps);

/*
 * The free slot of @pool (n slots) for a unit of @need elements: the smallest that holds it, of
 * those an empty one, else the least recently used; NULL when none is free and large enough.
 * (sl_shard_pick_slot's smallest-that-fits keeps the large slots for the large units, a
 * vocabulary-sized embedding or head next to layers a fraction of it; offload.c's prefetch
 * picks with it too.)
 */
struct sl_shard_slot *sl_shard_pick_slot(struct sl_shard_slot *pool, int n, size_t need);

#endif
