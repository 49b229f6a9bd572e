/*
 * data_batch: padded micro-batches on the host (struct sl_host_batch), and the longest-first
 * order of records for scoring in batches.
 *
 * A micro-batch's records right-padded with pad_id to the longest of them, one record a row, the
 * loss masks beside the ids (0 at padding).  Packing several records into a row is data_pack.c.
 */
#define _GNU_SOURCE
#include "data.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"

int sl_host_batch_alloc(struct sl_host_batch *hb, int max_B, int max_L)
{
	memset(hb, 0, sizeof(*hb));
	if (max_B < 1 || max_L < 1) {
		sl_error("host batch: %d records x %d tokens is empty", max_B, max_L);
		return -EINVAL;
	}
	hb->ids = malloc((size_t)max_B * max_L * sizeof(*hb->ids));
	hb->lens = malloc(max_B * sizeof(*hb->lens));
	hb->last = malloc(max_B * sizeof(*hb->last));
	hb->labels = malloc(max_B * sizeof(*hb->labels));
	hb->mask = malloc((size_t)max_B * max_L);
	if (!hb->ids || !hb->lens || !hb->last || !hb->labels || !hb->mask) {
		sl_error("host batch: out of memory for %d records x %d tokens", max_B, max_L);
		sl_host_batch_free(hb);
		return -ENOMEM;
	}
	hb->max_B = max_B;
	hb->max_L = max_L;
	return 0;
}

int sl_host_batch_fill(struct sl_host_batch *hb, const struct sl_dataset *ds, const int *idx,
		       int n, int32_t pad_id)
{
	int b, t, L = 0;

	if (n < 0 || n > hb->max_B) {
		sl_error("host batch: %d records, room for %d", n, hb->max_B);
		return -EINVAL;
	}
	for (b = 0; b < n; b++) {
		if (idx[b] < 0 || idx[b] >= ds->n) {
			sl_error("host batch: record %d of a %d-record dataset", idx[b], ds->n);
			return -EINVAL;
		}
		if (ds->rec[idx[b]].len > L)
			L = ds->rec[idx[b]].len;
	}
	if (L > hb->max_L) {
		sl_error("host batch: a %d-token record, room for %d", L, hb->max_L);
		return -EINVAL;
	}

	hb->B = n;
	hb->L = L;
	hb->n_rec = n;
	hb->packed = false;
	hb->tokens = 0;
	hb->targets = 0;
	for (b = 0; b < n; b++) {
		const struct sl_record *r = &ds->rec[idx[b]];
		int32_t *row = hb->ids + (size_t)b * L;
		uint8_t *mrow = hb->mask + (size_t)b * L;

		memcpy(row, r->ids, r->len * sizeof(*row));
		for (t = r->len; t < L; t++)
			row[t] = pad_id;
		memset(mrow, 0, L);
		if (r->mask)
			for (t = 0; t < r->len; t++)
				hb->targets += mrow[t] = r->mask[t];
		hb->lens[b] = r->len;
		hb->last[b] = b * L + r->len - 1;
		hb->labels[b] = r->label;
		hb->tokens += r->len;
	}
	hb->padded_tokens = (long)n * L - hb->tokens;
	return 0;
}

void sl_host_batch_free(struct sl_host_batch *hb)
{
	free(hb->ids);
	free(hb->lens);
	free(hb->last);
	free(hb->labels);
	free(hb->mask);
	free(hb->pos);
	memset(hb, 0, sizeof(*hb));
}

static int cmp_longest_first(const void *a, const void *b, void *arg)
{
	const struct sl_dataset *ds = arg;
	int x = *(const int *)a, y = *(const int *)b;

	if (ds->rec[x].len != ds->rec[y].len)
		return ds->rec[y].len - ds->rec[x].len;
	return x - y;
}

void sl_data_sort_longest_first(const struct sl_dataset *ds, int *idx, int n)
{
	qsort_r(idx, n, sizeof(int), cmp_longest_first, (void *)ds);
}
