/*
 * data_sampler: the order records are trained in (struct sl_sampler).
 *
 * Implements exactly the sampler comment in data.h: each epoch a seeded permutation (xoshiro256**
 * seeded through splitmix64 from (seed, epoch)), cut into length-sorted buckets whose steps are
 * shuffled, the epochs one endless stream of records cut into steps of R = batch * accum * dp,
 * and each step's records dealt to micro-batches.  A step is a pure function of (seed, step).
 */
#define _GNU_SOURCE
#include "data.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"

/* a length-sorted bucket holds this many steps */
#define BUCKET_STEPS 16

/* splitmix64: spreads a seed over xoshiro's state (its authors' recommendation) */
static uint64_t splitmix64(uint64_t *x)
{
	uint64_t z = (*x += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

struct rng {
	uint64_t s[4];
};

static uint64_t rotl(uint64_t x, int k)
{
	return (x << k) | (x >> (64 - k));
}

/* xoshiro256** */
static uint64_t rng_next(struct rng *r)
{
	uint64_t *s = r->s;
	uint64_t out = rotl(s[1] * 5, 7) * 9;
	uint64_t t = s[1] << 17;

	s[2] ^= s[0];
	s[3] ^= s[1];
	s[1] ^= s[2];
	s[0] ^= s[3];
	s[2] ^= t;
	s[3] = rotl(s[3], 45);
	return out;
}

/*
 * Each epoch gets its own generator, a function of (seed, epoch) only, so any step's records can
 * be computed without replaying the epochs before it (resume, eval, tests).
 */
static void rng_seed(struct rng *r, uint64_t seed, uint64_t epoch)
{
	uint64_t x = seed;
	int i;

	x = splitmix64(&x) ^ (epoch * 0xd1b54a32d192ed03ull);
	for (i = 0; i < 4; i++)
		r->s[i] = splitmix64(&x);
}

/* uniform in [0, k), k >= 1: rejection keeps it unbiased (a plain % would favour small values) */
static uint64_t rng_below(struct rng *r, uint64_t k)
{
	uint64_t lim = -k % k;	/* 2^64 mod k: the uneven tail to reject */
	uint64_t x;

	do
		x = rng_next(r);
	while (x < lim);
	return x % k;
}

static void shuffle_ints(struct rng *r, int *a, int n)
{
	int i, j, t;

	for (i = n - 1; i > 0; i--) {
		j = (int)rng_below(r, (uint64_t)i + 1);
		t = a[i];
		a[i] = a[j];
		a[j] = t;
	}
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return (x > y) - (x < y);
}

/* sort idx[0..n) by (length, index) through the keys scratch */
static void sort_by_len(const struct sl_dataset *ds, uint64_t *keys, int *idx, int n)
{
	int i;

	for (i = 0; i < n; i++)
		keys[i] = (uint64_t)ds->rec[idx[i]].len << 32 | (uint32_t)idx[i];
	qsort(keys, n, sizeof(*keys), cmp_u64);
	for (i = 0; i < n; i++)
		idx[i] = (int)(keys[i] & 0xffffffffu);
}

/* Epoch @e's order into @out (n entries), as data.h describes. */
static void build_order(struct sl_sampler *s, long e, int *out)
{
	const struct sl_dataset *ds = s->ds;
	int n = ds->n, R = sl_sampler_records_per_step(s);
	int bucket = R * BUCKET_STEPS;
	int head, m, nfull, i, b;
	int *rest;
	struct rng r;

	for (i = 0; i < n; i++)
		out[i] = i;
	rng_seed(&r, s->seed, (uint64_t)e);
	if (s->shuffle)
		shuffle_ints(&r, out, n);
	if (!s->length_sort)
		return;

	/*
	 * The stream puts epoch e at record e*n; the first records up to the next multiple of R
	 * finish the previous epoch's last step, so buckets and steps start after them and every
	 * step of the epoch stays one length-sorted chunk.
	 */
	head = (int)((R - (uint64_t)e % R * (uint64_t)(n % R) % R) % R);
	if (head > n)
		head = n;
	rest = out + head;
	m = n - head;
	for (b = 0; b < m; b += bucket)
		sort_by_len(ds, s->keys, rest + b, m - b < bucket ? m - b : bucket);
	if (!s->shuffle)
		return;

	/* shuffle the full steps; a partial last one stays last to run into the next epoch */
	nfull = m / R;
	if (nfull < 2)
		return;
	for (i = 0; i < nfull; i++)
		s->perm[i] = i;
	shuffle_ints(&r, s->perm, nfull);
	for (i = 0; i < nfull; i++)
		memcpy(s->scratch + (size_t)i * R, rest + (size_t)s->perm[i] * R, R * sizeof(int));
	memcpy(rest, s->scratch, (size_t)nfull * R * sizeof(int));
}

/* Epoch @e's order, from the two-slot cache (slot 1 is the most recently used). */
static const int *epoch_order(struct sl_sampler *s, long e)
{
	long te;
	int *t;

	if (s->cached_epoch == e)
		return s->order;
	if (s->cached_epoch2 != e) {
		build_order(s, e, s->order2);
		s->cached_epoch2 = e;
	}
	t = s->order;
	s->order = s->order2;
	s->order2 = t;
	te = s->cached_epoch;
	s->cached_epoch = s->cached_epoch2;
	s->cached_epoch2 = te;
	return s->order;
}

/* step @step's R records, sorted by (length, index), into s->step_idx */
static void build_step(struct sl_sampler *s, long step)
{
	int n = s->ds->n, R = sl_sampler_records_per_step(s), i;
	int64_t q = (int64_t)step * R;

	if (s->cached_step == step)
		return;
	for (i = 0; i < R; i++, q++)
		s->step_idx[i] = epoch_order(s, (long)(q / n))[q % n];
	sort_by_len(s->ds, s->keys, s->step_idx, R);
	s->cached_step = step;
}

int sl_sampler_init(struct sl_sampler *s, const struct sl_dataset *ds, int batch, int accum,
		    int dp, bool shuffle, bool length_sort, uint64_t seed)
{
	long R;
	int n = ds->n;

	memset(s, 0, sizeof(*s));
	if (batch < 1 || accum < 1 || dp < 1) {
		sl_error("sampler: batch %d, accum %d, data-parallel ranks %d must all be >= 1",
			 batch, accum, dp);
		return -EINVAL;
	}
	R = (long)batch * accum * dp;
	/* a bucket (R * 16 records) must fit an int */
	if (R > INT32_MAX / BUCKET_STEPS) {
		sl_error("sampler: %ld records per step (batch %d x accum %d x %d ranks) is too "
			 "many", R, batch, accum, dp);
		return -EINVAL;
	}
	if (n < 1) {
		sl_error("%s: no records to sample from", ds->path);
		return -EINVAL;
	}
	s->ds = ds;
	s->batch = batch;
	s->accum = accum;
	s->dp = dp;
	s->shuffle = shuffle;
	s->length_sort = length_sort;
	s->seed = seed;
	s->cached_epoch = -1;
	s->cached_epoch2 = -1;
	s->cached_step = -1;
	s->order = malloc(n * sizeof(int));
	s->order2 = malloc(n * sizeof(int));
	s->step_idx = malloc(R * sizeof(int));
	s->keys = malloc((n > R ? n : R) * sizeof(uint64_t));
	s->scratch = malloc(n * sizeof(int));
	s->perm = malloc((n / R + 1) * sizeof(int));
	if (!s->order || !s->order2 || !s->step_idx || !s->keys || !s->scratch || !s->perm) {
		sl_error("sampler: out of memory for %d records", n);
		sl_sampler_free(s);
		return -ENOMEM;
	}
	return 0;
}

void sl_sampler_free(struct sl_sampler *s)
{
	free(s->order);
	free(s->order2);
	free(s->step_idx);
	free(s->keys);
	free(s->scratch);
	free(s->perm);
	memset(s, 0, sizeof(*s));
}

int sl_sampler_records_per_step(const struct sl_sampler *s)
{
	return s->batch * s->accum * s->dp;
}

long sl_sampler_steps_per_epoch(const struct sl_sampler *s)
{
	long R = sl_sampler_records_per_step(s);

	return (s->ds->n + R - 1) / R;
}

long sl_sampler_epoch_of(const struct sl_sampler *s, long step)
{
	return (long)((int64_t)step * sl_sampler_records_per_step(s) / s->ds->n);
}

int sl_sampler_step(struct sl_sampler *s, long step, int *idx)
{
	int R = sl_sampler_records_per_step(s);

	if (step < 0) {
		sl_error("sampler: step %ld is negative", step);
		return -EINVAL;
	}
	build_step(s, step);
	memcpy(idx, s->step_idx, R * sizeof(int));
	return R;
}

int sl_sampler_microbatch(struct sl_sampler *s, long step, int a, int r, int *idx)
{
	int k = a * s->dp + r;

	if (step < 0 || a < 0 || a >= s->accum || r < 0 || r >= s->dp) {
		sl_error("sampler: micro-batch (step %ld, accum %d, rank %d) is out of range "
			 "(accum %d, %d ranks)", step, a, r, s->accum, s->dp);
		return -EINVAL;
	}
	build_step(s, step);
	memcpy(idx, s->step_idx + (size_t)k * s->batch, s->batch * sizeof(int));
	return s->batch;
}
