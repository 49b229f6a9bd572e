/*
 * backend_arena.c: the device-memory arena of backend_arena.h (used by backend_cuda.c).
 */
#include "backend_arena.h"

#include <stdbool.h>
#include <stdlib.h>

#define MIB (1ull << 20)

struct sl_arena_blk {
	char *p;
	size_t size;
	bool free;
	int chunk;
	struct sl_arena_blk *prev, *next;
};

static size_t round_up(size_t n, size_t m)
{
	return (n + m - 1) / m * m;
}

void sl_arena_init(struct sl_arena *a, void *(*get)(void *, size_t), void (*put)(void *, void *),
		   void *ctx, size_t align, size_t chunk, size_t big)
{
	*a = (struct sl_arena){ .get = get, .put = put, .ctx = ctx,
				.align = align ? align : 256, .chunk = chunk ? chunk : 256 * MIB,
				.big = big ? big : 32 * MIB };
}

/* a new chunk for a request of @n bytes, as one free block at the end of the list */
static struct sl_arena_blk *grow(struct sl_arena *a, size_t n)
{
	size_t size = n >= a->big || n > a->chunk ? round_up(n, 2 * MIB) : a->chunk;
	struct sl_arena_blk *b, *t;
	void *p = a->get(a->ctx, size), **ch;

	if (!p && size > n)	/* the whole chunk does not fit: just what is asked */
		p = a->get(a->ctx, size = n);
	if (!p)
		return NULL;
	ch = realloc(a->chunks, (size_t)(a->n_chunks + 1) * sizeof(*ch));
	b = calloc(1, sizeof(*b));
	if (!ch || !b) {
		free(b);
		if (ch)
			a->chunks = ch;
		a->put(a->ctx, p);
		return NULL;
	}
	a->chunks = ch;
	ch[a->n_chunks] = p;
	*b = (struct sl_arena_blk){ .p = p, .size = size, .free = true, .chunk = a->n_chunks++ };
	a->reserved += size;
	for (t = a->head; t && t->next; t = t->next)
		;
	b->prev = t;
	if (t)
		t->next = b;
	else
		a->head = b;
	return b;
}

void *sl_arena_alloc(struct sl_arena *a, size_t bytes)
{
	size_t n = round_up(bytes ? bytes : 1, a->align);
	struct sl_arena_blk *best = NULL;

	for (struct sl_arena_blk *b = a->head; b; b = b->next)	/* best fit */
		if (b->free && b->size >= n && (!best || b->size < best->size))
			best = b;
	if (!best)
		best = grow(a, n);
	if (!best)
		return NULL;
	if (best->size > n) {	/* split: the tail stays free */
		struct sl_arena_blk *t = calloc(1, sizeof(*t));

		if (!t)
			return NULL;
		*t = (struct sl_arena_blk){ .p = best->p + n, .size = best->size - n, .free = true,
					    .chunk = best->chunk, .prev = best,
					    .next = best->next };
		if (best->next)
			best->next->prev = t;
		best->next = t;
		best->size = n;
	}
	best->free = false;
	a->in_use += n;
	if (a->in_use > a->peak)
		a->peak = a->in_use;
	return best->p;
}

/* merges b with its successor when both are free and of one chunk */
static void merge_next(struct sl_arena_blk *b)
{
	struct sl_arena_blk *n = b->next;

	if (!n || !b->free || !n->free || n->chunk != b->chunk)
		return;
	b->size += n->size;
	b->next = n->next;
	if (n->next)
		n->next->prev = b;
	free(n);
}

int sl_arena_free(struct sl_arena *a, void *p)
{
	struct sl_arena_blk *b;

	for (b = a->head; b && b->p != (char *)p; b = b->next)
		;
	if (!b || b->free)
		return -1;
	b->free = true;
	a->in_use -= b->size;
	merge_next(b);
	if (b->prev)
		merge_next(b->prev);
	return 0;
}

void sl_arena_destroy(struct sl_arena *a)
{
	struct sl_arena_blk *b, *n;

	for (b = a->head; b; b = n) {
		n = b->next;
		free(b);
	}
	for (int i = 0; i < a->n_chunks; i++)
		a->put(a->ctx, a->chunks[i]);
	free(a->chunks);
	a->head = NULL;
	a->chunks = NULL;
	a->n_chunks = 0;
	a->in_use = a->reserved = 0;
}
