/*
 * context: context parallel on the host side (see context.h).
 */
#include "context.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"

int sl_cp_check_config(const struct sl_config *c, int world)
{
	int C = c->parallel.context;

	if (C <= 1)
		return 0;
	if (world % C) {
		sl_error("%s: parallel.context %d does not divide the %d rank(s) of the job; the "
			 "world must be a multiple of it (data-parallel ranks = world / context)",
			 c->source, C, world);
		return -EINVAL;
	}
	return 0;
}

int sl_cp_row_len(int L, int C)
{
	int n = (L + 2 * C - 1) / (2 * C) * (2 * C);

	return C > 1 && n < 2 * C * SL_CP_MIN_CHUNK ? 2 * C * SL_CP_MIN_CHUNK : n;
}

static void cp_all_gather(void *ctx, void *recv, const void *send, size_t count)
{
	struct sl_cp *cp = ctx;

	if (sl_comm_all_gather(&cp->comm, recv, send, count, cp->dt))
		sl_dist_abort("context parallel: the key/value all-gather failed");
}

/* the other ranks' keys travel while this rank's queries attend to its own (dist.h) */
static void cp_all_gather_start(void *ctx, void *recv, const void *send, size_t count)
{
	struct sl_cp *cp = ctx;

	if (sl_comm_all_gather_start(&cp->comm, recv, send, count, cp->dt))
		sl_dist_abort("context parallel: the key/value all-gather failed");
}

static void cp_all_gather_wait(void *ctx)
{
	struct sl_cp *cp = ctx;

	if (sl_comm_wait(&cp->comm))
		sl_dist_abort("context parallel: the key/value all-gather failed");
}

static void cp_reduce_scatter(void *ctx, void *recv, const void *send, size_t count)
{
	struct sl_cp *cp = ctx;

	if (sl_comm_reduce_scatter(&cp->comm, recv, send, count, cp->dt))
		sl_dist_abort("context parallel: the key/value gradient reduce-scatter failed");
}

static void cp_sum_f64(void *ctx, double *buf, size_t n)
{
	struct sl_cp *cp = ctx;

	if (MPI_Allreduce(MPI_IN_PLACE, buf, (int)n, MPI_DOUBLE, MPI_SUM, cp->comm.mpi) !=
	    MPI_SUCCESS)
		sl_dist_abort("context parallel: the routing statistics' sum failed");
}

static void cp_sendrecv(void *ctx, const void *send, int to, void *recv, int from, size_t bytes)
{
	struct sl_cp *cp = ctx;

	if (sl_comm_sendrecv(&cp->comm, send, to, recv, from, bytes))
		sl_dist_abort("context parallel: passing rows between chunks failed");
}

int sl_cp_create(struct sl_cp *cp, struct sl_backend *be, const struct sl_dist *d, int C,
		 enum sl_comm_kind kind, const struct sl_comm_copy *copy, int max_B, int max_L)
{
	size_t T;

	memset(cp, 0, sizeof(*cp));
	cp->be = be;
	cp->C = C;
	cp->rank = d->rank % C;
	cp->max_B = max_B;
	cp->max_L = sl_cp_row_len(max_L, C);
	cp->dt = be->elt == 8 ? SL_COMM_F64 : be->elt == 2 ? SL_COMM_BF16 : SL_COMM_F32;
	if (sl_comm_create(&cp->comm, MPI_COMM_WORLD, d->rank / C, cp->rank, kind, copy))
		return -1;
	cp->cc = (struct sl_context_comm){ .ctx = cp, .kv_all_gather = cp_all_gather,
					   .kv_all_gather_start = cp_all_gather_start,
					   .kv_all_gather_wait = cp_all_gather_wait,
					   .kv_reduce_scatter = cp_reduce_scatter,
					   .sum_f64 = cp_sum_f64, .sendrecv = cp_sendrecv,
					   .rank = cp->comm.rank, .size = cp->comm.size };
	T = (size_t)max_B * cp->max_L;
	cp->ids = be->alloc(be, T * sizeof(int32_t));
	cp->gidx = be->alloc(be, T * sizeof(int32_t));
	cp->pos = be->alloc(be, T * sizeof(int32_t));
	cp->perm = be->alloc(be, T * sizeof(int32_t));
	cp->inv = be->alloc(be, T * sizeof(int32_t));
	cp->tgt_pos = be->alloc(be, T * sizeof(int32_t));
	cp->tgt_ids = be->alloc(be, T * sizeof(int32_t));
	cp->lens = be->alloc(be, max_B * sizeof(int32_t));
	cp->clens = be->alloc(be, 2 * max_B * sizeof(int32_t));
	cp->last = be->alloc(be, max_B * sizeof(int32_t));
	cp->labels = be->alloc(be, max_B * sizeof(float));
	cp->h_ids = malloc(7 * T * sizeof(int32_t));
	cp->h_last = malloc(max_B * sizeof(int32_t));
	cp->h_labels = malloc(max_B * sizeof(float));
	cp->h_last_rec = malloc(max_B * sizeof(int32_t));
	cp->h_clens = malloc(2 * max_B * sizeof(int32_t));
	if (!cp->h_ids || !cp->h_last || !cp->h_labels || !cp->h_last_rec || !cp->h_clens) {
		sl_error("context parallel: out of host memory for %d x %d tokens", max_B,
			 cp->max_L);
		sl_cp_destroy(cp);
		return -ENOMEM;
	}
	cp->h_gidx = cp->h_ids + T;
	cp->h_pos = cp->h_gidx + T;
	cp->h_perm = cp->h_pos + T;
	cp->h_inv = cp->h_perm + T;
	cp->h_tgt_pos = cp->h_inv + T;
	cp->h_tgt_ids = cp->h_tgt_pos + T;
	return 0;
}

void sl_cp_destroy(struct sl_cp *cp)
{
	struct sl_backend *be = cp->be;

	if (!be)
		return;
	be->free(be, cp->ids);
	be->free(be, cp->gidx);
	be->free(be, cp->pos);
	be->free(be, cp->perm);
	be->free(be, cp->inv);
	be->free(be, cp->tgt_pos);
	be->free(be, cp->tgt_ids);
	be->free(be, cp->lens);
	be->free(be, cp->clens);
	be->free(be, cp->last);
	be->free(be, cp->labels);
	free(cp->h_ids);
	free(cp->h_last);
	free(cp->h_labels);
	free(cp->h_last_rec);
	free(cp->h_clens);
	sl_comm_destroy(&cp->comm);
	cp->be = NULL;
}

/* context rank holding chunk k of 2C, and where the chunk starts among that rank's Lc tokens */
static void chunk_owner(int C, int k, int ch, int *rank, int *off)
{
	*rank = k < C ? k : 2 * C - 1 - k;
	*off = k < C ? 0 : ch;
}

const struct sl_batch_dev *sl_cp_upload(struct sl_cp *cp, const struct sl_host_batch *hb,
					int32_t pad, bool lm)
{
	struct sl_backend *be = cp->be;
	const int C = cp->C, B = hb->B, L = sl_cp_row_len(hb->L, C), Lc = L / C, ch = L / (2 * C);
	const size_t Tl = (size_t)B * Lc;
	int n_last = 0, n_tgt = 0;

	if (B > cp->max_B || L > cp->max_L)
		sl_dist_abort("internal error: a context-parallel micro-batch exceeds its buffers");
	for (int b = 0; b < B; b++) {
		for (int h = 0; h < 2; h++) {
			int start = (h ? 2 * C - 1 - cp->rank : cp->rank) * ch;
			int n = hb->lens[b] - start;

			cp->h_clens[h * B + b] = n < 0 ? 0 : n > ch ? ch : n;
		}
		for (int g = 0; g < L; g++) {
			size_t src = (size_t)b * hb->L + g;
			int k = g / ch, r, off;
			size_t row;

			chunk_owner(C, k, ch, &r, &off);
			row = (size_t)r * Tl + (size_t)b * Lc + off + g % ch;
			cp->h_perm[(size_t)b * L + g] = (int32_t)row;
			cp->h_inv[row] = (int32_t)((size_t)b * L + g);
			if (r != cp->rank)
				continue;
			row -= (size_t)r * Tl;
			cp->h_ids[row] = g < hb->L ? hb->ids[src] : pad;
			cp->h_gidx[row] = g;
			/* rotary position and the document's first key; padding: any valid one */
			cp->h_pos[row] = g >= hb->lens[b] ? 0 : hb->packed ? hb->pos[src] : g;
			/* sft: token g + 1 is a target predicted here (the same document) */
			if (lm && g + 1 < hb->lens[b] && hb->mask[src + 1]) {
				cp->h_tgt_pos[n_tgt] = (int32_t)row;
				cp->h_tgt_ids[n_tgt++] = hb->ids[src + 1];
			}
			if (!lm && !hb->packed && g == hb->lens[b] - 1) {
				cp->h_last[n_last] = (int32_t)row;
				cp->h_last_rec[n_last] = b;
				cp->h_labels[n_last++] = hb->labels[b];
			}
		}
	}
	be->upload(be, cp->ids, cp->h_ids, Tl * sizeof(int32_t));
	be->upload(be, cp->gidx, cp->h_gidx, Tl * sizeof(int32_t));
	be->upload(be, cp->pos, cp->h_pos, Tl * sizeof(int32_t));
	be->upload(be, cp->perm, cp->h_perm, (size_t)B * L * sizeof(int32_t));
	be->upload(be, cp->inv, cp->h_inv, (size_t)B * L * sizeof(int32_t));
	be->upload(be, cp->lens, hb->lens, B * sizeof(int32_t));
	be->upload(be, cp->clens, cp->h_clens, 2 * B * sizeof(int32_t));
	if (n_last) {
		be->upload(be, cp->last, cp->h_last, n_last * sizeof(int32_t));
		be->upload(be, cp->labels, cp->h_labels, n_last * sizeof(float));
	}
	if (n_tgt) {
		be->upload(be, cp->tgt_pos, cp->h_tgt_pos, n_tgt * sizeof(int32_t));
		be->upload(be, cp->tgt_ids, cp->h_tgt_ids, n_tgt * sizeof(int32_t));
	}
	cp->cpb = (struct sl_cp_batch){ .comm = &cp->cc, .L = L, .gidx = cp->gidx, .pos = cp->pos,
					.perm = cp->perm, .inv = cp->inv, .clens = cp->clens,
					.n_last = n_last };
	cp->view = (struct sl_batch_dev){ .B = B, .L = Lc, .ids = cp->ids, .lens = cp->lens,
					  .last = cp->last, .labels = cp->labels,
					  .h_lens = hb->lens, .n_tgt = n_tgt, .tgt_pos = cp->tgt_pos,
					  .tgt_ids = cp->tgt_ids, .cp = &cp->cpb };
	return &cp->view;
}
