/*
 * data: JSONL records -> one pool of token ids (sl_data_load), read line by line.
 *
 * Owns reading and validating records (jansson, one json_loadb per line, "FILE:LINE: why"
 * errors) and the max_state length filter.  Text records need a tokenizer callback
 * (sl_data_opts.tokenize); the tokenizer itself lives elsewhere.  With sl_data_opts.tokenizer
 * set, sl_data_load hands the file to data_cache.c instead: text records tokenized by OpenMP
 * threads (data_tokenize.c, split across ranks by sl_data_tokenize_part) into a binary cache file
 * reused by later runs.  The order records are trained in is data_sampler.c; padded host batches
 * data_batch.c, packed ones data_pack.c; SFT records data_chat.c.
 */
#define _GNU_SOURCE
#include "data_impl.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "log.h"

struct loader {
	struct sl_dataset *ds;
	const struct sl_data_opts *o;
	const char *text_field;
	const char *label_field;
	long line;			/* 1-based line being read */
	int shown;			/* bad lines printed so far (skip mode) */
	size_t rec_cap;
	size_t pool_cap;		/* int32 entries */
	/*
	 * The pool moves when realloc grows it, so records remember their offset while loading and
	 * get their pointers once the pool is final.
	 */
	size_t *off;			/* (rec_cap) */
	int32_t *tok;			/* tokenizer output buffer */
	size_t tok_cap;
	uint8_t *msk;			/* sft: the record's loss mask */
	size_t msk_cap;
	size_t mask_cap;		/* of ds->mask_pool */
};

/*
 * A bad line: fatal (sl_error, negative return) unless on_error is skip, where it is counted and
 * the first few are shown as warnings (return 1: line skipped).
 */
static int bad(struct loader *ld, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int bad(struct loader *ld, const char *fmt, ...)
{
	char msg[1024];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);

	if (!ld->o->skip_errors) {
		sl_error("%s:%ld: %s", ld->ds->path, ld->line, msg);
		return -EINVAL;
	}
	ld->ds->skipped++;
	if (ld->shown < SHOW_SKIPPED)
		sl_warn("%s:%ld: %s (line skipped)", ld->ds->path, ld->line, msg);
	else if (ld->shown == SHOW_SKIPPED)
		sl_warn("%s: further bad lines are skipped without being shown", ld->ds->path);
	ld->shown++;
	return 1;
}

static int pool_reserve(struct loader *ld, size_t more)
{
	struct sl_dataset *ds = ld->ds;
	size_t need = ds->pool_len + more, cap = ld->pool_cap;
	int32_t *p;

	if (need <= cap)
		return 0;
	if (cap < 4096)
		cap = 4096;
	while (cap < need)
		cap *= 2;
	p = realloc(ds->pool, cap * sizeof(*p));
	if (!p) {
		sl_error("%s: out of memory for %zu token ids", ds->path, cap);
		return -ENOMEM;
	}
	ds->pool = p;
	ld->pool_cap = cap;
	if (ld->o->sft) {
		uint8_t *m = realloc(ds->mask_pool, cap);

		if (!m) {
			sl_error("%s: out of memory for %zu loss mask entries", ds->path, cap);
			return -ENOMEM;
		}
		ds->mask_pool = m;
		ld->mask_cap = cap;
	}
	return 0;
}

static int rec_reserve(struct loader *ld)
{
	struct sl_dataset *ds = ld->ds;
	size_t cap = ld->rec_cap ? 2 * ld->rec_cap : 1024;
	struct sl_record *r;
	size_t *off;

	if ((size_t)ds->n < ld->rec_cap)
		return 0;
	if (cap > INT32_MAX) {
		sl_error("%s: more than %d records", ds->path, INT32_MAX);
		return -EINVAL;
	}
	r = realloc(ds->rec, cap * sizeof(*r));
	if (!r)
		goto out_nomem;
	ds->rec = r;
	off = realloc(ld->off, cap * sizeof(*off));
	if (!off)
		goto out_nomem;
	ld->off = off;
	ld->rec_cap = cap;
	return 0;

out_nomem:
	sl_error("%s: out of memory for %zu records", ds->path, cap);
	return -ENOMEM;
}

/* label -> *label; 0, or bad()'s verdict */
static int read_label(struct loader *ld, json_t *root, float *label)
{
	json_t *j = json_object_get(root, ld->label_field);
	double y;

	*label = NAN;
	if (!j || json_is_null(j)) {
		if (!ld->o->need_label)
			return 0;
		return bad(ld, "record has no label in field '%s'; training needs a number in [0,1]",
			   ld->label_field);
	}
	if (json_is_boolean(j))
		return bad(ld, "label in field '%s' is a boolean (%s); give a number in [0,1]",
			   ld->label_field, json_is_true(j) ? "true" : "false");
	if (!json_is_number(j))
		return bad(ld, "label in field '%s' is %s, not a number in [0,1]",
			   ld->label_field, json_type_name(j));
	y = json_number_value(j);
	if (!(y >= 0.0 && y <= 1.0))
		return bad(ld, "label %g in field '%s' is outside [0,1]", y, ld->label_field);
	*label = (float)y;
	return 0;
}

/*
 * "input_ids" -> *ids (pointing into ld->tok, the staging buffer), *len.  Validates every id
 * before anything reaches the pool, so a bad line leaves no trace.
 */
static int read_input_ids(struct loader *ld, json_t *arr, const int32_t **ids, int *len)
{
	long vocab = ld->o->vocab;
	size_t n = json_array_size(arr), i;
	json_t *e;

	if (!json_is_array(arr))
		return bad(ld, "\"input_ids\" is %s; give an array of token ids",
			   json_type_name(arr));
	if (n == 0)
		return bad(ld, "\"input_ids\" is empty; a record needs at least one token");
	if (n > INT32_MAX)
		return bad(ld, "\"input_ids\" has %zu ids, too many", n);
	if (n > ld->tok_cap) {
		int32_t *t = realloc(ld->tok, n * sizeof(*t));

		if (!t) {
			sl_error("%s:%ld: out of memory", ld->ds->path, ld->line);
			return -ENOMEM;
		}
		ld->tok = t;
		ld->tok_cap = n;
	}
	json_array_foreach(arr, i, e) {
		json_int_t v;

		if (!json_is_integer(e))
			return bad(ld, "\"input_ids\"[%zu] is %s, not an integer token id", i,
				   json_type_name(e));
		v = json_integer_value(e);
		if (v < 0)
			return bad(ld, "\"input_ids\"[%zu] = %" JSON_INTEGER_FORMAT
				   " is negative", i, v);
		if ((vocab > 0 && v >= vocab) || v > INT32_MAX)
			return bad(ld, "\"input_ids\"[%zu] = %" JSON_INTEGER_FORMAT " is outside "
				   "the vocabulary [0, %ld); was the data tokenized for another "
				   "model?", i, v, vocab > 0 ? vocab : (long)INT32_MAX + 1);
		ld->tok[i] = (int32_t)v;
	}
	*ids = ld->tok;
	*len = (int)n;
	return 0;
}

static int read_text(struct loader *ld, json_t *j, const int32_t **ids, int *len)
{
	const struct sl_data_opts *o = ld->o;
	int n;

	if (!json_is_string(j))
		return bad(ld, "field '%s' is %s, not a string", ld->text_field,
			   json_type_name(j));
	if (!o->tokenize)
		return bad(ld, "record has text in field '%s' but no tokenizer is available yet; "
			   "give pre-tokenized \"input_ids\"", ld->text_field);
	n = o->tokenize(o->tokenize_ctx, json_string_value(j), json_string_length(j), &ld->tok,
			&ld->tok_cap);
	if (n < 0)
		return bad(ld, "cannot tokenize the text in field '%s'", ld->text_field);
	if (n == 0)
		return bad(ld, "the text in field '%s' is empty (no tokens)", ld->text_field);
	*ids = ld->tok;
	*len = n;
	return 0;
}

/* sft: the record's loss mask into ld->msk; @pretokenized: it may carry "loss_mask" */
static int read_mask(struct loader *ld, json_t *root, bool pretokenized, int len)
{
	char *err = NULL;
	int rc;

	if ((size_t)len > ld->msk_cap) {
		uint8_t *m = realloc(ld->msk, len);

		if (!m) {
			sl_error("%s:%ld: out of memory", ld->ds->path, ld->line);
			return -ENOMEM;
		}
		ld->msk = m;
		ld->msk_cap = len;
	}
	if (!pretokenized) {
		memset(ld->msk, 1, len);
		ld->msk[0] = 0;
		return 0;
	}
	if (sl_data_loss_mask(root, len, ld->msk, &err) == 0)
		return 0;
	rc = bad(ld, "%s", err);
	free(err);
	return rc;
}

/* One non-blank line: 0 kept or dropped, 1 skipped, negative fatal. */
static int load_line(struct loader *ld, const char *buf, size_t n)
{
	struct sl_dataset *ds = ld->ds;
	const int32_t *ids = NULL;
	json_error_t jerr;
	json_t *root, *j;
	struct sl_record *r;
	float label;
	int len = 0, rc;

	/* a duplicated key would make the record mean whichever copy the parser kept */
	root = json_loadb(buf, n, JSON_DECODE_ANY | JSON_REJECT_DUPLICATES, &jerr);
	if (!root)
		return bad(ld, "invalid JSON at column %d: %s", jerr.column, jerr.text);
	if (!json_is_object(root)) {
		rc = bad(ld, "a record must be a JSON object, not %s", json_type_name(root));
		goto out_put;
	}

	j = json_object_get(root, "input_ids");
	if (j) {
		rc = read_input_ids(ld, j, &ids, &len);
	} else if ((j = json_object_get(root, ld->text_field))) {
		rc = read_text(ld, j, &ids, &len);
	} else if (json_object_get(root, "messages") || json_object_get(root, "conversations")) {
		/* chat records are rendered by data_load_text, which has the tokenizer */
		rc = bad(ld, "a chat record needs the model's tokenizer.json and chat template (and "
			 "task: sft); give pre-tokenized \"input_ids\" and \"loss_mask\"");
	} else {
		rc = bad(ld, "record has neither \"input_ids\" nor text in field '%s'",
			 ld->text_field);
	}
	if (rc)
		goto out_put;
	if (ld->o->sft) {
		label = NAN;
		rc = read_mask(ld, root, j == json_object_get(root, "input_ids"), len);
	} else {
		rc = read_label(ld, root, &label);
	}
	if (rc)
		goto out_put;

	ds->total++;
	if (ld->o->max_state > 0 && len > ld->o->max_state) {
		ds->dropped++;
		goto out_put;
	}
	if (ld->o->sft && !sl_data_has_target(ld->msk, len)) {
		ds->no_target++;
		goto out_put;
	}
	rc = rec_reserve(ld);
	if (rc)
		goto out_put;
	rc = pool_reserve(ld, len);
	if (rc)
		goto out_put;
	memcpy(ds->pool + ds->pool_len, ids, len * sizeof(*ids));
	if (ld->o->sft)
		memcpy(ds->mask_pool + ds->pool_len, ld->msk, len);
	ld->off[ds->n] = ds->pool_len;
	ds->pool_len += len;
	r = &ds->rec[ds->n++];
	r->ids = NULL;
	r->len = len;
	r->label = label;
	r->line = ld->line;

out_put:
	json_decref(root);
	return rc;
}

int data_no_records(const struct sl_dataset *ds, const struct sl_data_opts *o)
{
	if (ds->total == 0 && ds->skipped == 0)
		sl_error("%s: no records (the file is empty); give one JSON object per line",
			 ds->path);
	else if (ds->total == 0)
		sl_error("%s: no records left: all %ld lines were bad and skipped", ds->path,
			 ds->skipped);
	else if (ds->no_target)
		sl_error("%s: no records left: of %ld, %ld exceed max_state %d tokens and %ld have "
			 "no target token (no assistant turn, or an all-zero loss_mask)", ds->path,
			 ds->total, ds->dropped, o->max_state, ds->no_target);
	else
		sl_error("%s: no records left: all %ld exceed max_state %d tokens; raise "
			 "data.max_state", ds->path, ds->total, o->max_state);
	return -EINVAL;
}

/*
 * getline(), except that the buffer stops growing at MAX_RECORD_BYTES: a longer line's whole
 * length is returned with only its start kept, for the caller to refuse.
 */
static ssize_t read_line(FILE *f, char **line, size_t *cap)
{
	size_t n = 0, total = 0;
	int c;

	while ((c = getc_unlocked(f)) != EOF) {
		if (++total <= MAX_RECORD_BYTES) {
			if (n + 2 > *cap) {
				size_t nc = *cap ? 2 * *cap : 4096;
				char *p;

				if (nc > MAX_RECORD_BYTES + 2)
					nc = MAX_RECORD_BYTES + 2;
				p = realloc(*line, nc);
				if (!p)
					return -1;
				*line = p;
				*cap = nc;
			}
			(*line)[n++] = (char)c;
		}
		if (c == '\n')
			break;
	}
	if (total == 0)
		return -1;
	(*line)[n] = '\0';
	return (ssize_t)total;
}

/* a failed load: no records, but the counts stay (a caller may still report them) */
static void drop_records(struct sl_dataset *ds)
{
	free(ds->rec);
	free(ds->pool);
	free(ds->mask_pool);
	ds->rec = NULL;
	ds->pool = NULL;
	ds->mask_pool = NULL;
	ds->n = 0;
	ds->pool_len = 0;
}

int sl_data_load(struct sl_dataset *ds, const char *path, const struct sl_data_opts *o)
{
	struct loader ld = { .ds = ds, .o = o };
	char *line = NULL;
	size_t cap = 0;
	ssize_t got;
	FILE *f;
	int rc = 0, i;

	memset(ds, 0, sizeof(*ds));
	snprintf(ds->path, sizeof(ds->path), "%s", path);
	if (o->tokenizer) {
		rc = data_load_text(ds, path, o);
		if (rc < 0)
			drop_records(ds);
		return rc;
	}
	ld.text_field = o->text_field && *o->text_field ? o->text_field : "text";
	ld.label_field = o->label_field && *o->label_field ? o->label_field : "label";

	f = fopen(path, "r");
	if (!f) {
		rc = -errno;
		sl_error("%s: cannot open the data file: %s", path, strerror(errno));
		return rc;
	}
	while ((got = read_line(f, &line, &cap)) >= 0) {
		char *s = line;
		size_t n = got;

		ld.line++;
		if (n > MAX_RECORD_BYTES) {
			rc = bad(&ld, "the line is longer than %zu MB, the limit for one record: "
				 "is the file JSONL (one record per line)?", MAX_RECORD_BYTES >> 20);
			if (rc < 0)
				goto out_free;
			continue;
		}
		/* an editor's UTF-8 byte-order mark is no part of the first record */
		if (ld.line == 1 && n >= 3 && !memcmp(s, "\xef\xbb\xbf", 3)) {
			s += 3;
			n -= 3;
		}
		if (blank(s, n))
			continue;
		rc = load_line(&ld, s, n);
		if (rc < 0)
			goto out_free;
	}
	if (ferror(f)) {
		rc = -EIO;
		sl_error("%s: read error after line %ld: %s", path, ld.line, strerror(errno));
		goto out_free;
	}
	if (ds->n == 0) {
		rc = data_no_records(ds, o);
		goto out_free;
	}

	/* the pool is final now: give back the doubling slack, then point records into it */
	if (ds->pool_len < ld.pool_cap) {
		int32_t *p = realloc(ds->pool, ds->pool_len * sizeof(*p));

		if (p)
			ds->pool = p;
	}
	if (ds->mask_pool && ds->pool_len < ld.mask_cap) {
		uint8_t *m = realloc(ds->mask_pool, ds->pool_len);

		if (m)
			ds->mask_pool = m;
	}
	for (i = 0; i < ds->n; i++) {
		ds->rec[i].ids = ds->pool + ld.off[i];
		ds->rec[i].mask = ds->mask_pool ? ds->mask_pool + ld.off[i] : NULL;
	}
	rc = 0;

out_free:
	free(line);
	free(ld.off);
	free(ld.tok);
	free(ld.msk);
	fclose(f);
	if (rc < 0)
		drop_records(ds);
	return rc;
}

void sl_data_free(struct sl_dataset *ds)
{
	free(ds->rec);
	free(ds->pool);
	free(ds->mask_pool);
	memset(ds, 0, sizeof(*ds));
}

int sl_data_max_len(const struct sl_dataset *ds)
{
	int i, m = 0;

	for (i = 0; i < ds->n; i++)
		if (ds->rec[i].len > m)
			m = ds->rec[i].len;
	return m;
}
