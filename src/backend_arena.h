/*
 * backend_arena.h: a device-memory arena for a backend (the cuda one): blocks carved from chunks
 * taken from the driver through a callback, best fit, freed blocks merged with free neighbours of
 * their chunk.  Knows nothing of CUDA, so that its policy is tested on the host (test_arena).
 *
 * Policy: a request of at least @big bytes gets a chunk of its own size (rounded to 2 MiB) when
 * no free block fits; smaller ones share chunks of @chunk bytes.  (Carving every request from
 * 256 MiB chunks let requests of 32-256 MiB strand the chunks' tails: on the H200 the device used
 * 10-20% more than the bytes in use.)
 */
#ifndef SL_BACKEND_ARENA_H
#define SL_BACKEND_ARENA_H

#include <stddef.h>

struct sl_arena_blk;

struct sl_arena {
	void *(*get)(void *ctx, size_t bytes);	/* a chunk from the driver; NULL: none */
	void (*put)(void *ctx, void *p);	/* gives a chunk back */
	void *ctx;
	size_t align;			/* every block's size and offset: a multiple of this */
	size_t chunk;			/* the shared chunks' size */
	size_t big;			/* requests of at least this get chunks of their own */
	struct sl_arena_blk *head;	/* every block, in chunk then address order */
	void **chunks;
	int n_chunks;
	size_t in_use, peak;		/* bytes in blocks given out; their high-water mark */
	size_t reserved;		/* bytes in chunks */
};

/* An empty arena; sizes 0 take the defaults (256 B, 256 MiB, 32 MiB). */
void sl_arena_init(struct sl_arena *a, void *(*get)(void *, size_t), void (*put)(void *, void *),
		   void *ctx, size_t align, size_t chunk, size_t big);
/* A block of at least @bytes (0: one alignment unit); NULL when the driver has no room. */
void *sl_arena_alloc(struct sl_arena *a, size_t bytes);
/* 0, or -1 when @p is no block of this arena or is free already (nothing changes then). */
int sl_arena_free(struct sl_arena *a, void *p);
/* Every chunk back to the driver. */
void sl_arena_destroy(struct sl_arena *a);

#endif
