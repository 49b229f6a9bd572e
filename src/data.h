/*
 * data: training records and the order they are trained in.
 *
 * Reads JSONL (jansson) with a text field (tokenized by the tokenizer module) or pre-tokenized
 * "input_ids", and a soft label in [0,1] (classify); for task sft, chat records ("messages",
 * ShareGPT "conversations", rendered by chat.c) and a loss mask per record instead of the label
 * (data_chat.c); drops records longer than data.max_state with a count (and, for sft, records
 * without a target with another); errors name file:line (data.on_error: fail) or are counted
 * (skip).
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

struct sl_chat;

struct sl_record {
	const int32_t *ids;		/* (len) into the dataset's pool */
	const uint8_t *mask;		/* (len) 1 = token t is a target, predicted from the logits
					 * at t-1; NULL for classify records */
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
	long no_target;			/* sft: records without a target token, dropped */
	int32_t *pool;
	uint8_t *mask_pool;		/* (pool_len) sft: the records' loss masks; else NULL */
	size_t pool_len;
	bool from_cache;		/* text: read from a complete cache, nothing tokenized */
};

/*
 * Turns @text (@len bytes of UTF-8) into token ids: writes them to *ids, whose capacity is *cap
 * ids (grow both with realloc as needed; the loader owns and frees the buffer).  Returns the
 * number of ids, or a negative value after printing why through sl_error.
 */
typedef int (*sl_tokenize_fn)(void *ctx, const char *text, size_t len, int32_t **ids,
			      size_t *cap);

struct sl_data_opts {
	const char *text_field;		/* NULL = "text" */
	const char *label_field;	/* NULL = "label" */
	int max_state;			/* 0 = no limit */
	bool need_label;		/* training: a label is required; scoring: optional */
	bool skip_errors;		/* on_error: skip */
	int vocab;			/* ids must be in [0, vocab); <= 0 = unchecked */
	/* NULL until the tokenizer module lands: a text record is then an error */
	sl_tokenize_fn tokenize;
	void *tokenize_ctx;
	/*
	 * Text records through this tokenizer, with the tokenization cache and OpenMP threads
	 * (tokenize / tokenize_ctx are then unused).  The cache is one binary file per (data file
	 * bytes, tokenizer.json bytes, text_field, label_field, on_error) in cache_dir; see
	 * sl_data_cache_path.
	 */
	struct sl_tokenizer *tokenizer;
	const char *cache_dir;		/* NULL: $SHARDLM_CACHE_DIR, else $XDG_CACHE_HOME/shardlm,
					 * else ~/.cache/shardlm */
	bool progress;			/* log records/s and ETA while tokenizing (rank 0) */
	/*
	 * task: sft.  Every record gets a loss mask: chat records ("messages" or ShareGPT
	 * "conversations", rendered by @chat through the tokenizer: see chat.h), pre-tokenized
	 * "input_ids" with "loss_mask" (0/1, mask[0] 0; without it every token but the first is
	 * a target), text records (every token but the first).  Labels are not read.  Records
	 * with no target are dropped and counted in no_target.  The cache key includes sft,
	 * keep_reasoning and the template's hash.
	 */
	bool sft;
	bool keep_reasoning;		/* data.keep_reasoning: see chat.h */
	const struct sl_chat *chat;	/* the model's chat template; NULL when it has none */
};

/*
 * Errors ("FILE:LINE: why") go through sl_error; returns negative on failure.  With skip_errors
 * a bad line is counted in ds->skipped (the first few are printed with sl_warn) and loading goes
 * on; the caller prints the skipped and dropped counts.  A file with no record left is an error.
 */
int sl_data_load(struct sl_dataset *ds, const char *path, const struct sl_data_opts *o);
void sl_data_free(struct sl_dataset *ds);

/*
 * Tokenization split across ranks (o->tokenizer set): rank @part of @nparts tokenizes the lines
 * that start in its 1/nparts of the file's bytes (with OpenMP threads) and writes a part file
 * next to the cache.  Nothing to do (returns 0) when the complete cache exists already.  After
 * a barrier, sl_data_load on every rank merges the complete set of parts into the cache file
 * and loads it; a single rank needs no part call (sl_data_load tokenizes what is missing).
 * Errors of a bad line ("FILE:LINE: why") are printed by the rank that owns the line.
 */
int sl_data_tokenize_part(const char *path, const struct sl_data_opts *o, int part, int nparts);
/* The cache file for @path under @o into @buf (the directory is created); negative on error. */
int sl_data_cache_path(const char *path, const struct sl_data_opts *o, char *buf, size_t n);
/* The longest kept record, in tokens (0 for an empty dataset). */
int sl_data_max_len(const struct sl_dataset *ds);

/*
 * Step sampler.  Records per step R = batch * accum * dp.  Each epoch is a seeded permutation of
 * the dataset (identity when shuffle is off); with length_sort the permutation is cut into buckets
 * of R * 16 records, each sorted by length and cut into steps, and the steps' order shuffled (when
 * shuffle is on).  Inside a step the records are sorted by length and dealt to micro-batches:
 * micro-batch k (k = a * dp + r: accumulation index a, data-parallel rank r) gets records
 * [k*batch, (k+1)*batch) of the sorted step.  A step past the end of an epoch continues in the
 * next (the last partial step of an epoch is filled from the next epoch).
 *
 * Precisely: the epochs' orders, concatenated, are one endless stream of records, and step s
 * (0-based) is stream records [s*R, (s+1)*R); a step therefore depends on R, never on how R is
 * split into batch, accum and dp, and a dataset smaller than R still fills every step (a record
 * may then occur twice in one step).  Epoch e's order is built from its permutation P_e (Fisher-
 * Yates driven by xoshiro256** seeded through splitmix64 from (seed, e)): its first o_e records,
 * o_e = min(n, (-e*n) mod R), complete the step the previous epoch left partial; with length_sort
 * the rest is cut into buckets of R*16, each sorted by (length, record index), then cut into steps
 * of R; with shuffle the epoch's full steps are shuffled across all its buckets (a partial last
 * step, if any, stays last: it continues into the next epoch).  The first epoch has o_0 = 0, so
 * without shuffle and length_sort the stream is the file order, epoch after epoch.  "Sorted by
 * length" always means by (length, record index), a total order, so any sort routine gives the
 * same result.  A step is a pure function of (seed, step): resuming needs only the step number.
 */
struct sl_sampler {
	const struct sl_dataset *ds;
	int batch, accum, dp;
	bool shuffle, length_sort;
	uint64_t seed;
	/* private */
	long cached_epoch;		/* -1 = none */
	int *order;			/* (n) the cached epoch's order */
	long cached_epoch2;		/* a second slot: a step may straddle two epochs */
	int *order2;			/* (n) */
	long cached_step;		/* the step whose sorted records are in step_idx; -1 = none */
	int *step_idx;			/* (R) */
	uint64_t *keys;			/* (max(n, R)) sort scratch: length << 32 | index */
	int *scratch;			/* (n) */
	int *perm;			/* (n / R + 1) the order of an epoch's full steps */
};

int sl_sampler_init(struct sl_sampler *s, const struct sl_dataset *ds, int batch, int accum,
		    int dp, bool shuffle, bool length_sort, uint64_t seed);
void sl_sampler_free(struct sl_sampler *s);
int sl_sampler_records_per_step(const struct sl_sampler *s);
/* Steps in one epoch (ceil(n / R)). */
long sl_sampler_steps_per_epoch(const struct sl_sampler *s);
/*
 * The record indices of micro-batch (a, r) of optimizer step @step (0-based) in @idx (batch
 * entries; returns how many: always batch, since the stream wraps into the next epoch, or a
 * negative value for an (a, r) or step out of range).
 */
int sl_sampler_microbatch(struct sl_sampler *s, long step, int a, int r, int *idx);
/* All R records of step @step, sorted by (length, index), in @idx (R entries); returns R. */
int sl_sampler_step(struct sl_sampler *s, long step, int *idx);
/* The epoch (0-based) that stream record 0 of step @step belongs to. */
long sl_sampler_epoch_of(const struct sl_sampler *s, long step);

/* Sort record indices idx[0..n) longest first (ties by index), for scoring in batches. */
void sl_data_sort_longest_first(const struct sl_dataset *ds, int *idx, int n);

/* A padded micro-batch on the host. */
struct sl_host_batch {
	int B, L;
	int32_t *ids;			/* (B*L), padding = pad_id */
	int32_t *lens;			/* (B) */
	int32_t *last;			/* (B) b*L + lens[b]-1 */
	float *labels;			/* (B) */
	uint8_t *mask;			/* (B*L) the records' loss masks, 0 at padding (and for
					 * records without one) */
	long targets;			/* sum of mask */
	long tokens;			/* sum of lens */
	long padded_tokens;		/* B*L - tokens */
	int max_B, max_L;		/* capacity */
	bool packed;			/* rows hold several records (sl_host_batch_pack) */
	int32_t *pos;			/* (max_B*max_L) packed: each token's position in its
					 * record; allocated by the first sl_host_batch_pack */
	int n_rec;			/* records in the batch (B when not packed) */
};
/* Build the padded batch of records idx[0..n) (L = longest); buffers sized for max_B x max_L. */
int sl_host_batch_alloc(struct sl_host_batch *hb, int max_B, int max_L);
/* Returns 0, or -EINVAL (printed) when n > max_B or a record is longer than max_L. */
int sl_host_batch_fill(struct sl_host_batch *hb, const struct sl_dataset *ds, const int *idx,
		       int n, int32_t pad_id);
void sl_host_batch_free(struct sl_host_batch *hb);

/*
 * data.pack (data_pack.c): the records idx[0..n) packed into as few rows of at most @row_len
 * tokens as first-fit over the records longest first gives (ties by position in idx, so the
 * packing is a function of the batch): each row holds whole records back to back, pos restarts at
 * 0 for each record, masks come along; lens[row] = tokens used, last/labels are per record (n),
 * in row order.  row_len <= max_L.  Returns 0 or -EINVAL/-ENOMEM (printed).
 */
int sl_host_batch_pack(struct sl_host_batch *hb, const struct sl_dataset *ds, const int *idx,
		       int n, int32_t pad_id, int row_len);

/*
 * data_chat.c, SFT records (for data_tokenize.c).  sl_data_chat_record: a chat record's ids
 * and loss mask (*n tokens in *ids / *mask, capacity *cap, grown with realloc): 0, 1 when @record
 * is no chat record, negative with *err (malloc'ed).  sl_data_loss_mask: the "loss_mask" of a record
 * whose @n ids are read, into @mask (without one: every token a target but the first); 0, or
 * negative with *err.  Both thread-safe.
 */
struct json_t;
int sl_data_chat_record(const struct sl_data_opts *o, struct json_t *record, int32_t **ids,
			uint8_t **mask, size_t *cap, int *n, char **err);
int sl_data_loss_mask(struct json_t *record, int n, uint8_t *mask, char **err);
/* 1 when mask[0..n) has a target */
bool sl_data_has_target(const uint8_t *mask, int n);
/* a 64-bit summary of what shapes an SFT tokenization (sft, keep_reasoning, the template) */
uint64_t sl_data_sft_key(const struct sl_data_opts *o);

#endif
