/*
 * data_impl.h: what the data module's files share: data.c (the line-by-line loader),
 * data_tokenize.c (text records tokenized on OpenMP threads) and data_cache.c (the tokenization
 * cache and the dataset built from it).  Nothing outside the data module includes it.
 */
#ifndef SL_DATA_IMPL_H
#define SL_DATA_IMPL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "data.h"
#include "jsonutil.h"

/* bad lines printed under on_error: skip before we only count them */
#define SHOW_SKIPPED 5
/* one record line; a longer one is refused before it is parsed (or, read, kept in memory) */
#define MAX_RECORD_BYTES ((size_t)256 << 20)

static inline bool blank(const char *s, size_t n)
{
	size_t i;

	for (i = 0; i < n; i++)
		if (s[i] != ' ' && s[i] != '\t' && s[i] != '\r' && s[i] != '\n')
			return false;
	return true;
}

/* text records tokenized, in line order: what data_tokenize.c makes and the cache holds */
struct tok_result {
	uint64_t n, n_ids, skipped;
	int64_t *off;			/* (n+1) */
	int64_t *line;			/* (n) */
	float *label;			/* (n) */
	uint32_t *ids;			/* (n_ids) */
	uint8_t *mask;			/* (n_ids) sft; else NULL */
};

/* a data file mapped read-only */
struct mapped {
	const char *p;
	size_t n;
};

/* data.c: the error for a file with no record left; returns -EINVAL */
int data_no_records(const struct sl_dataset *ds, const struct sl_data_opts *o);
/* data_cache.c: sl_data_load of text records through o->tokenizer and the cache */
int data_load_text(struct sl_dataset *ds, const char *path, const struct sl_data_opts *o);
void data_tok_result_free(struct tok_result *r);
/* data_tokenize.c: the lines that start in bytes [lo, hi) of @m into @res (see there) */
int data_tokenize_range(const char *path, const struct mapped *m, size_t lo, size_t hi,
			const struct sl_data_opts *o, struct tok_result *res);

#endif
