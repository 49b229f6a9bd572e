/*
 * data: training records and the order they are trained in.
 *
 * Reads JSONL (jansson) with a text field (tokenized by the tokenizer module, later) or
 * pre-tokenized "input_ids", and a soft label in [0,1]; drops records longer than data.max_state
 * with a count; errors name file:line (data.on_error: fail) or are counted (skip).
 * The sampler picks each optimizer step's records globally (seeded, length-sorted buckets, epochs)
 * and splits them into micro-batches per data-parallel rank, so a step trains on the same records
 * whatever the world size.  Knows no model or backend.
 */
#ifndef SL_DATA_H
#define SL_DATA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "config.h"

struct sl_record {
	const int32_t *ids;		/* (len) into the dataset's pool */
	int len;
	float label;			/* NaN when the data has no labels (scoring) */
	long line;			/* 1-based line in the file */
};

struct sl_dataset {
	char path[SL_PATH_MAX];
	int n;				/* records kept */
	struct sl_record *rec;		/* (n) */
	long total;			/* records read (kept + dropped) */
	long dropped;			/* longer than max_state */
	long skipped;			/* bad lines skipped (on_error: skip) */
	int32_t *pool;
	size_t pool_len;
};

struct sl_data_opts {
	const char *text_field;
	const char *label_field;
	int max_state;			/* 0 = no limit */
	bool need_label;		/* training: a label is required; scoring: optional */
	bool skip_errors;		/* on_error: skip */
	int vocab;			/* ids must be in [0, vocab) */
};

/* Errors (file:line: why) go through sl_error; returns negative on failure. */
int sl_data_load(struct sl_dataset *ds, const char *path, const struct sl_data_opts *o);
void sl_data_free(struct sl_dataset *ds);

/*
 * Step sampler.  Records per step R = batch * accum * dp.  Each epoch is a seeded permutation of
 * the dataset (identity when shuffle is off); with length_sort the permutation is cut into buckets
 * of R * 16 records, each sorted by length and cut into steps, and the steps' order shuffled (when
 * shuffle is on).  Inside a step the records are sorted by length and dealt to micro-batches:
 * micro-batch k (k = a * dp + r: accumulation index a, data-parallel rank r) gets records
 * [k*batch, (k+1)*batch) of the sorted step.  A step past the end of an epoch continues in the
 * next (the last partial step of an epoch is filled from the next epoch).
 */
struct sl_sampler {
	const struct sl_dataset *ds;
	int batch, accum, dp;
	bool shuffle, length_sort;
	uint64_t seed;
	/* private */
	int cached_epoch;
	int *order;			/* (n) the cached epoch's order */
};

int sl_sampler_init(struct sl_sampler *s, const struct sl_dataset *ds, int batch, int accum,
		    int dp, bool shuffle, bool length_sort, uint64_t seed);
void sl_sampler_free(struct sl_sampler *s);
int sl_sampler_records_per_step(const struct sl_sampler *s);
/* Steps in one epoch (ceil(n / R)). */
long sl_sampler_steps_per_epoch(const struct sl_sampler *s);
/*
 * The record indices of micro-batch (a, r) of optimizer step @step (0-based) in @idx (batch
 * entries; returns how many, fewer than batch only when the dataset is smaller than a step).
 */
int sl_sampler_microbatch(struct sl_sampler *s, long step, int a, int r, int *idx);

/* A padded micro-batch on the host. */
struct sl_host_batch {
	int B, L;
	int32_t *ids;			/* (B*L), padding = pad_id */
	int32_t *lens;			/* (B) */
	int32_t *last;			/* (B) b*L + lens[b]-1 */
	float *labels;			/* (B) */
	long tokens;			/* sum of lens */
	long padded_tokens;		/* B*L - tokens */
};
/* Build the padded batch of records idx[0..n) (L = longest); buffers sized for max_B x max_L. */
int sl_host_batch_alloc(struct sl_host_batch *hb, int max_B, int max_L);
void sl_host_batch_fill(struct sl_host_batch *hb, const struct sl_dataset *ds, const int *idx,
			int n, int32_t pad_id);
void sl_host_batch_free(struct sl_host_batch *hb);

#endif
