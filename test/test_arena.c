/*
 * test_arena: the device-memory arena of src/backend_arena.c (the cuda backend's allocator) on a
 * pretend driver that hands out address ranges without memory behind them: the bytes it reserves
 * against the bytes in use (requests of 32-256 MiB get chunks of their own rather than stranding
 * the tails of 256 MiB chunks), best fit and merging, alignment, bad frees, a full driver, and
 * every chunk given back.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "backend_arena.h"
#include "testutil.h"

#define MIB (1ull << 20)

struct driver {
	uintptr_t next;		/* the next address handed out */
	size_t cap, out;	/* bytes it may hand out; bytes out now */
	int chunks;		/* chunks out now */
};

static void *get(void *ctx, size_t bytes)
{
	struct driver *d = ctx;
	void *p;

	if (d->out + bytes > d->cap)
		return NULL;
	p = (void *)d->next;
	d->next += bytes + 4096;	/* chunks are not adjacent */
	d->out += bytes;
	d->chunks++;
	return p;
}

static size_t last_put;

static void put(void *ctx, void *p)
{
	struct driver *d = ctx;

	(void)p;
	d->chunks--;
	last_put++;
}

int main(void)
{
	struct driver d = { .next = (uintptr_t)1 << 40, .cap = SIZE_MAX / 2 };
	struct sl_arena a;
	void *p[64];

	/* ten 100 MiB requests: ten chunks of 100 MiB, not five of 256 */
	sl_arena_init(&a, get, put, &d, 256, 0, 0);
	for (int i = 0; i < 10; i++)
		p[i] = sl_arena_alloc(&a, 100 * MIB);
	CHECK(a.in_use == 1000 * MIB, "in use %zu", a.in_use);
	CHECK(a.reserved == 1000 * MIB, "reserved %zu MiB for 1000 MiB of 100 MiB requests",
	      a.reserved / MIB);
	/* small requests share one 256 MiB chunk */
	for (int i = 10; i < 40; i++)
		p[i] = sl_arena_alloc(&a, 1 * MIB + 3);
	CHECK(a.reserved == 1256 * MIB, "reserved %zu MiB after 30 small requests",
	      a.reserved / MIB);
	for (int i = 10; i < 40; i++)
		CHECK(((uintptr_t)p[i] - ((uintptr_t)1 << 40)) % 256 == 0, "alignment of %p", p[i]);
	CHECK(a.in_use == 1000 * MIB + 30 * (MIB + 256), "in use %zu", a.in_use);
	/* a freed run merges: two neighbouring 1 MiB blocks hold a 2 MiB request, no growth */
	CHECK(sl_arena_free(&a, p[11]) == 0 && sl_arena_free(&a, p[12]) == 0, "free");
	{
		size_t r = a.reserved;
		void *q = sl_arena_alloc(&a, 2 * MIB + 256);

		CHECK(q == p[11], "the merged blocks are reused: %p, expected %p", q, p[11]);
		CHECK(a.reserved == r, "no new chunk for a request that fits a merged block");
	}
	/* best fit: a freed 100 MiB block takes a 90 MiB request rather than a new chunk */
	CHECK(sl_arena_free(&a, p[3]) == 0, "free 100 MiB");
	{
		size_t r = a.reserved;

		CHECK(sl_arena_alloc(&a, 90 * MIB) == p[3], "best fit into the freed block");
		CHECK(a.reserved == r, "reserved grew");
	}
	/* bad frees change nothing */
	{
		size_t u;

		CHECK(sl_arena_free(&a, p[13]) == 0, "free");
		u = a.in_use;
		CHECK(sl_arena_free(&a, p[13]) == -1, "a block freed twice");
		CHECK(sl_arena_free(&a, (char *)p[14] + 256) == -1, "inside a block: not a block");
		CHECK(sl_arena_free(&a, (void *)16) == -1, "an address never given out");
		CHECK(a.in_use == u, "in use moved on a bad free");
	}
	CHECK(a.peak == 1000 * MIB + 30 * (MIB + 256), "peak %zu", a.peak);
	sl_arena_destroy(&a);
	CHECK(d.chunks == 0, "%d chunks not given back", d.chunks);

	/* a driver with 100 MiB left: a small request gets just its size, a big one nothing */
	d = (struct driver){ .next = (uintptr_t)1 << 40, .cap = 100 * MIB };
	sl_arena_init(&a, get, put, &d, 256, 0, 0);
	CHECK(sl_arena_alloc(&a, MIB) != NULL, "a small request when the chunk does not fit");
	CHECK(a.reserved == MIB, "reserved %zu", a.reserved);
	CHECK(sl_arena_alloc(&a, 200 * MIB) == NULL, "more than the driver has");
	CHECK(a.in_use == MIB, "in use %zu after a failed request", a.in_use);
	sl_arena_destroy(&a);
	CHECK(d.chunks == 0, "%d chunks not given back", d.chunks);
	return test_exit("test_arena");
}
