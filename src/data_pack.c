/*
 * data_pack: packing a micro-batch's records into shared rows (data.pack: true).
 *
 * Records of different lengths padded to the longest waste the padding's compute; packed, several
 * records share a row back to back, each with positions restarting at 0, and the backends confine
 * attention to each record (backend.h, pos).  The loss of a record does not change: its tokens see
 * the same context at the same positions.  Rows are filled first-fit over the records longest
 * first, a deterministic function of the batch.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "data.h"
#include "log.h"

struct order_ctx {
	const struct sl_dataset *ds;
	const int *idx;
};

/* longest first; ties by position in the batch */
static int cmp_len_desc(const void *a, const void *b, void *arg)
{
	const struct order_ctx *c = arg;
	int x = *(const int *)a, y = *(const int *)b;
	int lx = c->ds->rec[c->idx[x]].len, ly = c->ds->rec[c->idx[y]].len;

	return lx != ly ? ly - lx : x - y;
}

int sl_host_batch_pack(struct sl_host_batch *hb, const struct sl_dataset *ds, const int *idx,
		       int n, int32_t pad_id, int row_len)
{
	int *ord, *row_of, *off, *fill, rows = 0, L = 0, k, t;
	struct order_ctx ctx = { ds, idx };

	if (n < 0 || n > hb->max_B || row_len < 1 || row_len > hb->max_L) {
		sl_error("host batch: packing %d records into rows of %d tokens, room for %d x %d",
			 n, row_len, hb->max_B, hb->max_L);
		return -EINVAL;
	}
	if (!hb->pos) {
		hb->pos = malloc((size_t)hb->max_B * hb->max_L * sizeof(*hb->pos));
		if (!hb->pos) {
			sl_error("host batch: out of memory for packed positions");
			return -ENOMEM;
		}
	}
	ord = malloc(4 * (size_t)(n > 0 ? n : 1) * sizeof(int));
	if (!ord) {
		sl_error("host batch: out of memory packing %d records", n);
		return -ENOMEM;
	}
	row_of = ord + n;
	off = row_of + n;
	fill = off + n;
	for (k = 0; k < n; k++) {
		if (idx[k] < 0 || idx[k] >= ds->n || ds->rec[idx[k]].len > row_len) {
			sl_error("host batch: record %d (of %d) does not fit a %d-token row", idx[k],
				 ds->n, row_len);
			free(ord);
			return -EINVAL;
		}
		ord[k] = k;
	}
	qsort_r(ord, n, sizeof(int), cmp_len_desc, &ctx);
	for (k = 0; k < n; k++) {
		int i = ord[k], len = ds->rec[idx[i]].len, r;

		for (r = 0; r < rows && fill[r] + len > row_len; r++)
			;
		if (r == rows)
			fill[rows++] = 0;
		row_of[i] = r;
		off[i] = fill[r];
		fill[r] += len;
	}
	for (int r = 0; r < rows; r++)
		L = fill[r] > L ? fill[r] : L;

	hb->B = rows;
	hb->L = L;
	hb->n_rec = n;
	hb->packed = true;
	hb->tokens = 0;
	hb->targets = 0;
	for (int r = 0; r < rows; r++) {
		for (t = fill[r]; t < L; t++) {
			hb->ids[(size_t)r * L + t] = pad_id;
			hb->mask[(size_t)r * L + t] = 0;
			hb->pos[(size_t)r * L + t] = 0;
		}
		hb->lens[r] = fill[r];
		hb->tokens += fill[r];
	}
	/* records in row order, each row's records by offset */
	k = 0;
	for (int r = 0; r < rows; r++) {
		for (int i = 0; i < n; i++) {
			const struct sl_record *rec = &ds->rec[idx[i]];
			size_t base = (size_t)r * L + off[i];

			if (row_of[i] != r)
				continue;
			memcpy(hb->ids + base, rec->ids, rec->len * sizeof(*hb->ids));
			for (t = 0; t < rec->len; t++) {
				hb->pos[base + t] = t;
				hb->mask[base + t] = rec->mask ? rec->mask[t] : 0;
				hb->targets += hb->mask[base + t];
			}
			hb->last[k] = (int32_t)(base + rec->len - 1);
			hb->labels[k++] = rec->label;
		}
	}
	hb->padded_tokens = (long)rows * L - hb->tokens;
	free(ord);
	return 0;
}
