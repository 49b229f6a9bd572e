/*
 * offload: parallel.offload's engine inside shard (shard.c calls it; nothing else does).
 *
 * Owns the host worker thread, the gradient staging ring and the events that order the copy
 * streams against the compute stream; see offload.c for the schedule.
 */
#ifndef SL_OFFLOAD_H
#define SL_OFFLOAD_H

#include <stdbool.h>
#include <stddef.h>

#include "shard.h"

struct sl_offload_engine;

/* Start the engine for @s (after its units' state is allocated).  0 or -1. */
int sl_offload_create(struct sl_shard *s, size_t max_shard);
/* Drain, stop the worker, free what create allocated. */
void sl_offload_destroy(struct sl_shard *s);

/* Before the model reads unit @u's compute weights: its newest update is on the device. */
void sl_offload_await(struct sl_shard *s, int u);
/* offload: params: upload unit @u into @slot (the compute stream waits at sl_offload_use). */
void sl_offload_fill_slot(struct sl_shard *s, struct sl_shard_slot *slot, int u);
/* The compute stream waits for @slot's upload. */
void sl_offload_use(struct sl_shard *s, struct sl_shard_slot *slot);
/* offload: params: upload up to `prefetch` units after @u in direction @dir (+1 / -1). */
void sl_offload_prefetch(struct sl_shard *s, int u, int dir);
/* Unit @u's backward is done, its gradient (compute type) in @gbuf: off to the host. */
void sl_offload_release_grads(struct sl_shard *s, int u, const void *gbuf);
/* The worker is idle and every copy it waits for is done. */
void sl_offload_drain(struct sl_shard *s);
/* sl_shard_optim_step with offload. */
int sl_offload_optim_step(struct sl_shard *s, const struct sl_optim_hparams *h,
			  double *grad_norm);
/* Unit @u's master shard changed (loaded): make its compute copies from it. */
void sl_offload_refresh(struct sl_shard *s, int u);

/* shard.c's helpers the engine shares */
void sl_shard_reduce_to(struct sl_shard *s, int u, const void *gbuf, float *dst);
bool sl_shard_part(const struct sl_tensor_info *ti, const struct sl_shard_unit *u, size_t *lo,
		   size_t *hi);
void *sl_shard_host_alloc(struct sl_backend *b, size_t bytes);	/* zeroed; aborts when out */
void sl_shard_host_free(struct sl_backend *b, void *p);

#endif
