/*
 * context: context parallel on the host side (parallel.context = C).
 *
 * The mesh: rank = dp_index * C + context_index (context innermost); data-parallel ranks =
 * world / C, and the C ranks of a context group train the same micro-batches.  For each
 * micro-batch this module cuts every row of the host batch into 2C chunks, keeps chunks
 * context_index and 2C-1-context_index, builds what the model needs to run attention over the
 * whole rows (struct sl_cp_batch: indices in the row, document positions, the gather orders),
 * the rank's sft targets (from the full rows: a local token's target may be another rank's
 * token) or classify head rows (only the rank holding a record's last token has it), and
 * uploads them.  It gives the model the context group's collectives through struct
 * sl_context_comm.  Knows dist, data and the backend; no model internals.
 */
#ifndef SL_CONTEXT_H
#define SL_CONTEXT_H

#include <stdbool.h>
#include <stdint.h>

#include "backend.h"
#include "config.h"
#include "data.h"
#include "dist.h"
#include "model.h"

struct sl_cp {
	struct sl_backend *be;
	struct sl_comm comm;		/* the context group */
	struct sl_context_comm cc;	/* what the model calls */
	enum sl_comm_dtype dt;		/* the backend's compute type */
	int C, rank;			/* group size, this rank's context index */
	int max_B, max_L;		/* capacity; max_L a multiple of 2C */
	/* device (B*Lc per-token buffers sized max_B*max_L; perm/inv max_B*max_L) */
	int32_t *ids, *lens, *clens, *last, *gidx, *pos, *perm, *inv, *tgt_pos, *tgt_ids;
	float *labels;
	/* host staging of the same */
	int32_t *h_ids, *h_last, *h_gidx, *h_pos, *h_perm, *h_inv, *h_tgt_pos, *h_tgt_ids;
	float *h_labels;
	int32_t *h_last_rec;		/* (max_B) classify: the record (row) of each head row */
	int32_t *h_clens;		/* (2 max_B) */
	struct sl_cp_batch cpb;
	struct sl_batch_dev view;
};

/*
 * Config checks that need the world size: parallel.context divides the world, and the backend
 * has context-parallel attention (cpu only in this version).  Prints the error naming the config
 * file and key; returns negative.
 */
int sl_cp_check_config(const struct sl_config *c, int world);
/*
 * The padded row length of rows of up to @L tokens: a multiple of 2C, and (C > 1) at least
 * SL_CP_MIN_CHUNK tokens per chunk, so a chunk's convolution edge rows (Qwen3.5: K - 1 = 3)
 * come from the one chunk before it.  plan.c counts the same.
 */
#define SL_CP_MIN_CHUNK 4
int sl_cp_row_len(int L, int C);
/*
 * The context group of @d's rank (collective over the world) and buffers for micro-batches of
 * up to max_B rows of max_L tokens.  Returns negative on failure.
 */
int sl_cp_create(struct sl_cp *cp, struct sl_backend *be, const struct sl_dist *d, int C,
		 enum sl_comm_kind kind, const struct sl_comm_copy *copy, int max_B, int max_L);
void sl_cp_destroy(struct sl_cp *cp);
/*
 * This rank's part of host batch @hb (padded with @pad to a multiple of 2C), uploaded; @lm: also
 * its sft targets.  The returned view lives until the next call.
 */
const struct sl_batch_dev *sl_cp_upload(struct sl_cp *cp, const struct sl_host_batch *hb,
					int32_t pad, bool lm);

#endif
