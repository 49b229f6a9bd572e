/*
 * train_batch: a micro-batch on the device: the backend's copy of a host batch (data.h) and, for
 * sft, its targets (positions and token ids); used by the step loop and the validation.
 */
#define _GNU_SOURCE
#include "sl_build.h"
#include "train_impl.h"

#include <stdlib.h>

void dev_batch_alloc(struct sl_backend *be, struct dev_batch *d, int max_B, int max_L)
{
	size_t T = (size_t)max_B * max_L;

	d->ids = be->alloc(be, T * sizeof(int32_t));
	d->lens = be->alloc(be, max_B * sizeof(int32_t));
	d->last = be->alloc(be, max_B * sizeof(int32_t));
	d->labels = be->alloc(be, max_B * sizeof(float));
	d->tgt_pos = be->alloc(be, T * sizeof(int32_t));
	d->tgt_ids = be->alloc(be, T * sizeof(int32_t));
	d->pos = be->alloc(be, T * sizeof(int32_t));
	d->h_tgt = malloc(2 * T * sizeof(int32_t));
	if (!d->h_tgt)
		sl_dist_abort("out of host memory for a micro-batch's targets");
}

void dev_batch_free(struct sl_backend *be, struct dev_batch *d)
{
	if (!d->ids)
		return;
	be->free(be, d->ids);
	be->free(be, d->lens);
	be->free(be, d->last);
	be->free(be, d->labels);
	be->free(be, d->tgt_pos);
	be->free(be, d->tgt_ids);
	be->free(be, d->pos);
	free(d->h_tgt);
	d->ids = NULL;
}

const struct sl_batch_dev *dev_batch_upload(struct sl_backend *be, struct dev_batch *d,
					    const struct sl_host_batch *hb)
{
	be->upload(be, d->ids, hb->ids, (size_t)hb->B * hb->L * sizeof(int32_t));
	be->upload(be, d->lens, hb->lens, hb->B * sizeof(int32_t));
	be->upload(be, d->last, hb->last, hb->B * sizeof(int32_t));
	be->upload(be, d->labels, hb->labels, hb->B * sizeof(float));
	d->view = (struct sl_batch_dev){ .B = hb->B, .L = hb->L, .ids = d->ids, .lens = d->lens,
					 .last = d->last, .labels = d->labels,
					 .h_lens = hb->lens };
	if (hb->packed) {
		be->upload(be, d->pos, hb->pos, (size_t)hb->B * hb->L * sizeof(int32_t));
		d->view.pos = d->pos;
	}
	return &d->view;
}

/*
 * sft: the batch's targets from its mask: token t of the batch (rows of L tokens, packed or not)
 * is a target when its mask says so, predicted from the logits at t - 1 (a record's first token
 * never is one, so t - 1 is in the same record).  Uploads them into the device batch; returns
 * their number.
 */
int dev_batch_targets(struct sl_backend *be, struct dev_batch *d,
		      const struct sl_host_batch *hb)
{
	size_t T = (size_t)hb->max_B * hb->max_L;
	int32_t *pos = d->h_tgt, *ids = d->h_tgt + T;
	int k = 0;

	for (int b = 0; b < hb->B; b++)
		for (int p = 1; p < hb->lens[b]; p++) {
			size_t t = (size_t)b * hb->L + p;

			if (hb->mask[t]) {
				pos[k] = (int32_t)t - 1;
				ids[k++] = hb->ids[t];
			}
		}
	if (k) {
		be->upload(be, d->tgt_pos, pos, k * sizeof(int32_t));
		be->upload(be, d->tgt_ids, ids, k * sizeof(int32_t));
	}
	d->view.n_tgt = k;
	d->view.tgt_pos = d->tgt_pos;
	d->view.tgt_ids = d->tgt_ids;
	return k;
}
