/*
 * data: JSONL records -> one pool of token ids, the step sampler, and padded host batches.
 *
 * Owns reading and validating records (jansson, one json_loadb per line, "FILE:LINE: why"
 * errors), the max_state length filter, the order records are trained in (see the sampler comment
 * in data.h, which this file implements exactly) and right-padding a micro-batch.  Text records
 * need a tokenizer callback (sl_data_opts.tokenize); the tokenizer itself lives elsewhere.
 * With sl_data_opts.tokenizer set, text records are tokenized by OpenMP threads (and split
 * across ranks by sl_data_tokenize_part) into a binary cache file reused by later runs.
 */
#define _GNU_SOURCE
#include "data.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "log.h"
#include "tokenizer.h"

/* bad lines printed under on_error: skip before we only count them */
#define SHOW_SKIPPED 5
/* one record line; a longer one is refused before it is parsed (or, read, kept in memory) */
#define MAX_RECORD_BYTES ((size_t)256 << 20)

/* ---- loading ------------------------------------------------------------------------------ */

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

static const char *json_type_name(const json_t *j)
{
	switch (json_typeof(j)) {
	case JSON_OBJECT:
		return "an object";
	case JSON_ARRAY:
		return "an array";
	case JSON_STRING:
		return "a string";
	case JSON_INTEGER:
		return "an integer";
	case JSON_REAL:
		return "a number";
	case JSON_TRUE:
	case JSON_FALSE:
		return "a boolean";
	case JSON_NULL:
		return "null";
	}
	return "a JSON value";
}

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
		/* chat records are rendered by load_text, which has the tokenizer */
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

static bool blank(const char *s, size_t n)
{
	size_t i;

	for (i = 0; i < n; i++)
		if (s[i] != ' ' && s[i] != '\t' && s[i] != '\r' && s[i] != '\n')
			return false;
	return true;
}

static int no_records(const struct sl_dataset *ds, const struct sl_data_opts *o)
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

static int load_text(struct sl_dataset *ds, const char *path, const struct sl_data_opts *o);

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
		rc = load_text(ds, path, o);
		if (rc < 0) {
			free(ds->rec);
			free(ds->pool);
			free(ds->mask_pool);
			ds->rec = NULL;
			ds->pool = NULL;
			ds->mask_pool = NULL;
			ds->n = 0;
			ds->pool_len = 0;
		}
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
		rc = no_records(ds, o);
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
	if (rc < 0) {
		/* the counts stay: a caller may still report them */
		free(ds->rec);
		free(ds->pool);
		free(ds->mask_pool);
		ds->rec = NULL;
		ds->pool = NULL;
		ds->mask_pool = NULL;
		ds->n = 0;
		ds->pool_len = 0;
	}
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

/* ---- text records: parallel tokenization and the tokenization cache ----------------------- */

/*
 * Cache file (native byte order; little-endian on every machine we run on):
 *   struct cache_hdr, then int64 off[n+1] (into ids), int64 line[n], float label[n] (NaN: no
 *   label), uint32 ids[n_ids], and with flags & CACHE_MASKS (task: sft) uint8 mask[n_ids].
 * Part files have the same layout (their part/nparts set).  Every record that parsed is kept,
 * before the max_state, label and vocabulary checks, so a cache serves training and scoring
 * and any max_state; those checks run on every load.
 */
#define CACHE_MAGIC "SLTOKC\r\n"
#define CACHE_VERSION 1
#define PROGRESS_EVERY_S 10.0
#define CACHE_MASKS 1u			/* loss masks follow the ids */

struct cache_hdr {
	char magic[8];
	uint32_t version;
	uint32_t part, nparts;		/* 0, 1 for the complete cache */
	uint32_t flags;			/* CACHE_MASKS */
	uint64_t key;
	uint64_t n;			/* records */
	uint64_t n_ids;
	uint64_t skipped;		/* bad lines skipped (on_error: skip) */
	uint64_t reserved[2];
};

struct tok_result {
	uint64_t n, n_ids, skipped;
	int64_t *off;			/* (n+1) */
	int64_t *line;			/* (n) */
	float *label;			/* (n) */
	uint32_t *ids;			/* (n_ids) */
	uint8_t *mask;			/* (n_ids) sft; else NULL */
};

/* a cache's record offsets never go back (the first and last are checked by the caller) */
static bool offsets_rise(const int64_t *off, uint64_t n)
{
	for (uint64_t i = 0; i < n; i++)
		if (off[i + 1] < off[i])
			return false;
	return true;
}

static void tok_result_free(struct tok_result *r)
{
	free(r->off);
	free(r->line);
	free(r->label);
	free(r->ids);
	free(r->mask);
	memset(r, 0, sizeof(*r));
}

struct mapped {
	const char *p;
	size_t n;
};

static int map_file(const char *path, struct mapped *m)
{
	struct stat st;
	int fd = open(path, O_RDONLY);

	m->p = NULL;
	m->n = 0;
	if (fd < 0 || fstat(fd, &st)) {
		int e = errno;

		sl_error("%s: cannot open the data file: %s", path, strerror(e));
		if (fd >= 0)
			close(fd);
		return -e;
	}
	m->n = st.st_size;
	if (m->n) {
		void *p = mmap(NULL, m->n, PROT_READ, MAP_PRIVATE, fd, 0);

		if (p == MAP_FAILED) {
			int e = errno;

			sl_error("%s: cannot map the data file: %s", path, strerror(e));
			close(fd);
			return -e;
		}
		m->p = p;
	}
	close(fd);
	return 0;
}

static void unmap_file(struct mapped *m)
{
	if (m->p)
		munmap((void *)m->p, m->n);
	m->p = NULL;
}

static uint64_t cache_key(const struct mapped *m, const struct sl_data_opts *o)
{
	const char *tf = o->text_field && *o->text_field ? o->text_field : "text";
	const char *lf = o->label_field && *o->label_field ? o->label_field : "label";
	uint64_t h = sl_hash64(m->p ? m->p : "", m->n, CACHE_VERSION);

	h = sl_hash64(&h, sizeof(h), sl_tokenizer_hash(o->tokenizer));
	h = sl_hash64(tf, strlen(tf) + 1, h);
	h = sl_hash64(lf, strlen(lf) + 1, h);
	h = sl_hash64(o->skip_errors ? "skip" : "fail", 4, h);
	/* sft: the task, keep_reasoning and the chat template (classify keys stay as they were) */
	if (o->sft)
		h = sl_hash64(&(uint64_t){ sl_data_sft_key(o) }, sizeof(uint64_t), h);
	return h;
}

static int mkdir_p(const char *dir)
{
	char tmp[SL_PATH_MAX];
	char *p;

	snprintf(tmp, sizeof(tmp), "%s", dir);
	for (p = tmp + 1; *p; p++) {
		if (*p != '/')
			continue;
		*p = 0;
		if (mkdir(tmp, 0777) && errno != EEXIST)
			return -errno;
		*p = '/';
	}
	if (mkdir(tmp, 0777) && errno != EEXIST)
		return -errno;
	return 0;
}

static int cache_dir(const struct sl_data_opts *o, char *buf, size_t n)
{
	const char *e;
	int rc;

	if (o->cache_dir && *o->cache_dir)
		snprintf(buf, n, "%s", o->cache_dir);
	else if ((e = getenv("SHARDLM_CACHE_DIR")) && *e)
		snprintf(buf, n, "%s", e);
	else if ((e = getenv("XDG_CACHE_HOME")) && *e)
		snprintf(buf, n, "%s/shardlm", e);
	else if ((e = getenv("HOME")) && *e)
		snprintf(buf, n, "%s/.cache/shardlm", e);
	else
		snprintf(buf, n, "/tmp/shardlm-cache");
	rc = mkdir_p(buf);
	if (rc)
		sl_warn("%s: cannot create the tokenization cache directory: %s; tokenizing "
			"without a cache (set SHARDLM_CACHE_DIR)", buf, strerror(-rc));
	return rc;
}

/* "<dir>/<data file name>-<key>" */
static int cache_stem(const char *path, const struct mapped *m, const struct sl_data_opts *o,
		      char *buf, size_t n)
{
	char dir[SL_PATH_MAX];
	const char *base = strrchr(path, '/');
	int rc = cache_dir(o, dir, sizeof(dir));

	if (rc)
		return rc;
	base = base ? base + 1 : path;
	snprintf(buf, n, "%.3000s/%.900s-%016" PRIx64, dir, base, cache_key(m, o));
	return 0;
}

int sl_data_cache_path(const char *path, const struct sl_data_opts *o, char *buf, size_t n)
{
	struct mapped m;
	char stem[SL_PATH_MAX];
	int rc = map_file(path, &m);

	if (rc)
		return rc;
	rc = cache_stem(path, &m, o, stem, sizeof(stem));
	unmap_file(&m);
	if (!rc)
		snprintf(buf, n, "%s.tok", stem);
	return rc;
}

/* what one line gave: ids and a label, or an error message */
struct line_res {
	int32_t *ids;
	uint8_t *mask;			/* sft */
	int n;
	float label;
	char *err;
	bool blank;
};

static char *msgf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static char *msgf(const char *fmt, ...)
{
	char *s = NULL;
	va_list ap;

	va_start(ap, fmt);
	if (vasprintf(&s, fmt, ap) < 0)
		s = NULL;
	va_end(ap);
	return s ? s : strdup("out of memory");
}

/* the record's ids and label (NaN when absent); thread-safe */
static void parse_record(const struct sl_data_opts *o, const char *tf, const char *lf,
			 const char *buf, size_t len, struct line_res *r)
{
	json_error_t jerr;
	json_t *root, *j;
	size_t cap = 0, i;
	int rc;

	r->label = NAN;
	if (len > MAX_RECORD_BYTES) {
		r->err = msgf("the line is longer than %zu MB, the limit for one record: is the "
			      "file JSONL (one record per line)?", MAX_RECORD_BYTES >> 20);
		return;
	}
	root = json_loadb(buf, len, JSON_DECODE_ANY | JSON_REJECT_DUPLICATES, &jerr);
	if (!root) {
		r->err = msgf("invalid JSON at column %d: %s%s", jerr.column, jerr.text,
			      strstr(jerr.text, "decode") ? " (the text is not valid UTF-8; fix "
			      "the file's encoding)" : "");
		return;
	}
	if (!json_is_object(root)) {
		r->err = msgf("a record must be a JSON object, not %s", json_type_name(root));
		goto out_put;
	}
	/* pre-tokenized ids win over a chat, a chat over text */
	if (!json_object_get(root, "input_ids")) {
		rc = sl_data_chat_record(o, root, &r->ids, &r->mask, &cap, &r->n, &r->err);
		if (rc <= 0)
			goto out_put;
	}
	if ((j = json_object_get(root, "input_ids"))) {
		json_t *e;

		if (!json_is_array(j) || !json_array_size(j) || json_array_size(j) > INT32_MAX) {
			r->err = msgf("\"input_ids\" must be a non-empty array of token ids");
			goto out_put;
		}
		r->ids = malloc(json_array_size(j) * sizeof(*r->ids));
		if (!r->ids) {
			r->err = msgf("out of memory");
			goto out_put;
		}
		json_array_foreach(j, i, e) {
			json_int_t v = json_is_integer(e) ? json_integer_value(e) : -1;

			if (v < 0 || v > INT32_MAX) {
				r->err = msgf("\"input_ids\"[%zu] is not a token id (an integer >= 0)",
					      i);
				goto out_put;
			}
			r->ids[i] = (int32_t)v;
		}
		r->n = (int)json_array_size(j);
	} else if ((j = json_object_get(root, tf))) {
		int n;

		if (!json_is_string(j)) {
			r->err = msgf("field '%s' is %s, not a string", tf, json_type_name(j));
			goto out_put;
		}
		n = sl_tokenizer_encode(o->tokenizer, json_string_value(j), json_string_length(j),
					false, &r->ids, &cap);
		if (n < 0) {
			r->err = msgf("cannot tokenize the text in field '%s'", tf);
			goto out_put;
		}
		if (n == 0) {
			r->err = msgf("the text in field '%s' is empty (no tokens)", tf);
			goto out_put;
		}
		r->n = n;
	} else {
		r->err = msgf("record has neither \"input_ids\" nor text in field '%s'%s", tf,
			      o->sft ? " nor chat \"messages\" / \"conversations\"" : "");
		goto out_put;
	}
	if (o->sft) {
		r->mask = malloc(r->n);
		if (!r->mask) {
			r->err = msgf("out of memory");
			goto out_put;
		}
		if (json_object_get(root, "input_ids")) {
			sl_data_loss_mask(root, r->n, r->mask, &r->err);
		} else {
			memset(r->mask, 1, r->n);
			r->mask[0] = 0;
		}
		goto out_put;		/* SFT reads no label */
	}
	j = json_object_get(root, lf);
	if (j && !json_is_null(j)) {
		double y;

		if (!json_is_number(j)) {
			r->err = msgf("label in field '%s' is %s, not a number in [0,1]", lf,
				      json_type_name(j));
			goto out_put;
		}
		y = json_number_value(j);
		if (!(y >= 0.0 && y <= 1.0)) {
			r->err = msgf("label %g in field '%s' is outside [0,1]", y, lf);
			goto out_put;
		}
		r->label = (float)y;
	}
out_put:
	if (r->err) {
		free(r->ids);
		free(r->mask);
		r->ids = NULL;
		r->mask = NULL;
		r->n = 0;
	}
	json_decref(root);
}

/*
 * Tokenizes the lines that start in bytes [lo, hi) of @m into @res, with OpenMP threads.
 * Bad lines: fatal (printed "FILE:LINE: why") or, with skip_errors, counted.
 */
static int tokenize_range(const char *path, const struct mapped *m, size_t lo, size_t hi,
			  const struct sl_data_opts *o, struct tok_result *res)
{
	const char *tf = o->text_field && *o->text_field ? o->text_field : "text";
	const char *lf = o->label_field && *o->label_field ? o->label_field : "label";
	size_t *start = NULL, *end = NULL, nl = 0, cap = 0, p, i;
	long first_line = 1, done = 0;
	struct line_res *lr = NULL;
	double t0 = sl_now(), last = t0;
	int shown = 0, rc = 0;
	uint64_t k, o_ids;

	memset(res, 0, sizeof(*res));
	/* a line belongs to the range its first byte is in */
	if (lo > 0) {
		const char *q = memchr(m->p + lo - 1, '\n', m->n - (lo - 1));

		lo = q ? (size_t)(q - m->p) + 1 : m->n;
	}
	if (hi < m->n && hi > 0) {
		const char *q = memchr(m->p + hi - 1, '\n', m->n - (hi - 1));

		hi = q ? (size_t)(q - m->p) + 1 : m->n;
	}
	for (p = 0; p < lo;) {
		const char *q = memchr(m->p + p, '\n', lo - p);

		if (!q)
			break;
		first_line++;
		p = q - m->p + 1;
	}
	for (p = lo; p < hi;) {
		const char *q = memchr(m->p + p, '\n', hi - p);
		size_t e = q ? (size_t)(q - m->p) : hi;

		if (nl == cap) {
			size_t c = cap ? cap * 2 : 4096;
			size_t *a = realloc(start, c * sizeof(*a)), *b;

			if (!a)
				goto out_nomem;
			start = a;
			b = realloc(end, c * sizeof(*b));
			if (!b)
				goto out_nomem;
			end = b;
			cap = c;
		}
		start[nl] = p;
		end[nl++] = e;
		p = e + 1;
	}
	lr = calloc(nl ? nl : 1, sizeof(*lr));
	if (!lr)
		goto out_nomem;

#pragma omp parallel for schedule(dynamic, 4)
	for (i = 0; i < nl; i++) {
		const char *s = m->p + start[i];
		size_t n = end[i] - start[i];

		/* an editor's UTF-8 byte-order mark is no part of the first record */
		if (start[i] == 0 && n >= 3 && !memcmp(s, "\xef\xbb\xbf", 3)) {
			s += 3;
			n -= 3;
		}
		if (blank(s, n))
			lr[i].blank = true;
		else
			parse_record(o, tf, lf, s, n, &lr[i]);
		if (o->progress) {
			long d = __atomic_add_fetch(&done, 1, __ATOMIC_RELAXED);
#ifdef _OPENMP
			if (omp_get_thread_num() == 0) {
#else
			{
#endif
				double now = sl_now();

				if (now - last >= PROGRESS_EVERY_S) {
					double rate = d / (now - t0);

					last = now;
					sl_log("tokenizing %s: %ld/%zu records, %.0f records/s, "
					       "ETA %.0f s", path, d, nl, rate,
					       rate > 0 ? (nl - d) / rate : 0.0);
				}
			}
		}
	}

	/* in line order: the first bad line stops it, or every bad line is counted */
	for (i = 0; i < nl; i++) {
		if (!lr[i].err) {
			if (!lr[i].blank) {
				res->n++;
				res->n_ids += lr[i].n;
			}
			continue;
		}
		if (!o->skip_errors) {
			sl_error("%s:%ld: %s", path, first_line + (long)i, lr[i].err);
			rc = -EINVAL;
			goto out_free;
		}
		res->skipped++;
		if (shown < SHOW_SKIPPED)
			sl_warn("%s:%ld: %s (line skipped)", path, first_line + (long)i, lr[i].err);
		else if (shown == SHOW_SKIPPED)
			sl_warn("%s: further bad lines are skipped without being shown", path);
		shown++;
	}
	res->off = malloc((res->n + 1) * sizeof(*res->off));
	res->line = malloc((res->n + 1) * sizeof(*res->line));
	res->label = malloc((res->n + 1) * sizeof(*res->label));
	res->ids = malloc((res->n_ids + 1) * sizeof(*res->ids));
	if (o->sft)
		res->mask = malloc(res->n_ids + 1);
	if (!res->off || !res->line || !res->label || !res->ids || (o->sft && !res->mask))
		goto out_nomem;
	for (i = 0, k = 0, o_ids = 0; i < nl; i++) {
		if (lr[i].err || lr[i].blank)
			continue;
		res->off[k] = o_ids;
		res->line[k] = first_line + (long)i;
		res->label[k] = lr[i].label;
		memcpy(res->ids + o_ids, lr[i].ids, lr[i].n * sizeof(*res->ids));
		if (res->mask)
			memcpy(res->mask + o_ids, lr[i].mask, lr[i].n);
		o_ids += lr[i].n;
		k++;
	}
	res->off[k] = o_ids;
	if (o->progress && nl)
		sl_log("tokenized %s: %zu records, %" PRIu64 " tokens in %.1f s", path, nl,
		       res->n_ids, sl_now() - t0);
	goto out_free;

out_nomem:
	sl_error("%s: out of memory tokenizing the data", path);
	rc = -ENOMEM;
out_free:
	if (lr)
		for (i = 0; i < nl; i++) {
			free(lr[i].ids);
			free(lr[i].mask);
			free(lr[i].err);
		}
	free(lr);
	free(start);
	free(end);
	if (rc)
		tok_result_free(res);
	return rc;
}

static int write_all(FILE *f, const void *p, size_t n)
{
	return fwrite(p, 1, n, f) == n ? 0 : -EIO;
}

/* atomically: a temporary file renamed into place (ranks racing write the same bytes) */
static int cache_write(const char *file, const struct tok_result *r, uint64_t key, int part,
		       int nparts)
{
	struct cache_hdr h = { .version = CACHE_VERSION, .part = part, .nparts = nparts,
			       .flags = r->mask ? CACHE_MASKS : 0, .key = key, .n = r->n,
			       .n_ids = r->n_ids, .skipped = r->skipped };
	char tmp[SL_PATH_MAX + 64];
	FILE *f;
	int rc;

	memcpy(h.magic, CACHE_MAGIC, 8);
	snprintf(tmp, sizeof(tmp), "%s.tmp-%ld", file, (long)getpid());
	f = fopen(tmp, "wb");
	if (!f) {
		sl_warn("%s: cannot write the tokenization cache: %s", tmp, strerror(errno));
		return -errno;
	}
	rc = write_all(f, &h, sizeof(h));
	if (!rc)
		rc = write_all(f, r->off, (r->n + 1) * sizeof(*r->off));
	if (!rc)
		rc = write_all(f, r->line, r->n * sizeof(*r->line));
	if (!rc)
		rc = write_all(f, r->label, r->n * sizeof(*r->label));
	if (!rc)
		rc = write_all(f, r->ids, r->n_ids * sizeof(*r->ids));
	if (!rc && r->mask)
		rc = write_all(f, r->mask, r->n_ids);
	if (fclose(f))
		rc = -EIO;
	if (!rc && rename(tmp, file))
		rc = -errno;
	if (rc) {
		sl_warn("%s: cannot write the tokenization cache: %s", file, strerror(-rc));
		unlink(tmp);
	}
	return rc;
}

/* 0 and @r filled, 1 when absent or stale (not an error), negative on a broken file */
static int cache_read(const char *file, uint64_t key, int part, int nparts,
		      struct tok_result *r)
{
	struct cache_hdr h;
	struct stat st;
	FILE *f = fopen(file, "rb");
	int rc = 1;

	memset(r, 0, sizeof(*r));
	if (!f)
		return 1;
	if (fstat(fileno(f), &st) || fread(&h, sizeof(h), 1, f) != 1 ||
	    memcmp(h.magic, CACHE_MAGIC, 8) || h.version != CACHE_VERSION || h.key != key ||
	    h.part != (uint32_t)part || h.nparts != (uint32_t)nparts ||
	    h.n > ((uint64_t)1 << 40) || h.n_ids > ((uint64_t)1 << 44) || (h.flags & ~CACHE_MASKS) ||
	    (uint64_t)st.st_size != sizeof(h) + (h.n + 1) * 8 + h.n * 8 + h.n * 4 + h.n_ids * 4 +
	    (h.flags & CACHE_MASKS ? h.n_ids : 0))
		goto out_close;
	r->n = h.n;
	r->n_ids = h.n_ids;
	r->skipped = h.skipped;
	r->off = malloc((h.n + 1) * sizeof(*r->off));
	r->line = malloc((h.n + 1) * sizeof(*r->line));
	r->label = malloc((h.n + 1) * sizeof(*r->label));
	r->ids = malloc((h.n_ids + 1) * sizeof(*r->ids));
	if (h.flags & CACHE_MASKS)
		r->mask = malloc(h.n_ids + 1);
	rc = -EIO;
	if (!r->off || !r->line || !r->label || !r->ids || (h.flags & CACHE_MASKS && !r->mask) ||
	    fread(r->off, 8, h.n + 1, f) != h.n + 1 || fread(r->line, 8, h.n, f) != h.n ||
	    fread(r->label, 4, h.n, f) != h.n || fread(r->ids, 4, h.n_ids, f) != h.n_ids ||
	    (r->mask && fread(r->mask, 1, h.n_ids, f) != h.n_ids) ||
	    r->off[0] != 0 || (uint64_t)r->off[h.n] != h.n_ids || !offsets_rise(r->off, h.n)) {
		sl_warn("%s: the tokenization cache is unreadable; tokenizing again", file);
		tok_result_free(r);
		rc = 1;
		goto out_close;
	}
	rc = 0;
out_close:
	fclose(f);
	return rc;
}

int sl_data_tokenize_part(const char *path, const struct sl_data_opts *o, int part, int nparts)
{
	char stem[SL_PATH_MAX], file[SL_PATH_MAX + 64];
	struct tok_result r;
	struct mapped m;
	uint64_t key;
	int rc;

	if (!o->tokenizer || nparts < 1 || part < 0 || part >= nparts) {
		sl_error("%s: tokenize part %d of %d needs a tokenizer and 0 <= part < parts", path,
			 part, nparts);
		return -EINVAL;
	}
	rc = map_file(path, &m);
	if (rc)
		return rc;
	key = cache_key(&m, o);
	rc = cache_stem(path, &m, o, stem, sizeof(stem));
	if (rc) {
		sl_error("%s: the tokenization cache directory is needed to split tokenization "
			 "across ranks; set SHARDLM_CACHE_DIR to a directory all ranks share", path);
		goto out_unmap;
	}
	snprintf(file, sizeof(file), "%s.tok", stem);
	if (access(file, R_OK) == 0)
		goto out_unmap;		/* complete already (validated when loaded) */
	snprintf(file, sizeof(file), "%s.part-%05d-of-%05d", stem, part, nparts);
	rc = cache_read(file, key, part, nparts, &r);
	if (rc == 0) {
		tok_result_free(&r);
		goto out_unmap;
	}
	rc = tokenize_range(path, &m, m.n / nparts * part + (m.n % nparts) * part / nparts,
			    part + 1 == nparts ? m.n :
			    m.n / nparts * (part + 1) + (m.n % nparts) * (part + 1) / nparts, o, &r);
	if (!rc) {
		rc = cache_write(file, &r, key, part, nparts);
		tok_result_free(&r);
	}
out_unmap:
	unmap_file(&m);
	return rc;
}

/* parts 0..n-1 of some complete set, concatenated; 1 when there is none */
static int merge_parts(const char *stem, uint64_t key, struct tok_result *out)
{
	char file[SL_PATH_MAX + 64], *dir, *base;
	struct tok_result *pr = NULL;
	int nparts = 0, p, rc = 1;
	uint64_t k, n = 0, nid = 0, so = 0, sl = 0;
	struct dirent *de;
	DIR *d;

	/* find "<stem>.part-00000-of-N" */
	snprintf(file, sizeof(file), "%s", stem);
	base = strrchr(file, '/');
	*base++ = 0;
	dir = file;
	d = opendir(dir);
	if (!d)
		return 1;
	while ((de = readdir(d))) {
		size_t bl = strlen(base);
		int np;

		if (!strncmp(de->d_name, base, bl) &&
		    sscanf(de->d_name + bl, ".part-00000-of-%5d", &np) == 1 && np > 0 &&
		    strlen(de->d_name + bl) == strlen(".part-00000-of-00000"))
			nparts = np;
	}
	closedir(d);
	if (!nparts)
		return 1;
	pr = calloc(nparts, sizeof(*pr));
	if (!pr)
		return -ENOMEM;
	for (p = 0; p < nparts; p++) {
		snprintf(file, sizeof(file), "%s.part-%05d-of-%05d", stem, p, nparts);
		if (cache_read(file, key, p, nparts, &pr[p]))
			goto out_free;
		n += pr[p].n;
		nid += pr[p].n_ids;
	}
	memset(out, 0, sizeof(*out));
	out->n = n;
	out->n_ids = nid;
	out->off = malloc((n + 1) * sizeof(*out->off));
	out->line = malloc((n + 1) * sizeof(*out->line));
	out->label = malloc((n + 1) * sizeof(*out->label));
	out->ids = malloc((nid + 1) * sizeof(*out->ids));
	if (pr[0].mask)
		out->mask = malloc(nid + 1);
	if (!out->off || !out->line || !out->label || !out->ids || (pr[0].mask && !out->mask)) {
		tok_result_free(out);
		rc = -ENOMEM;
		goto out_free;
	}
	for (p = 0; p < nparts; p++) {
		for (k = 0; k < pr[p].n; k++)
			out->off[so + k] = pr[p].off[k] + sl;
		memcpy(out->line + so, pr[p].line, pr[p].n * sizeof(*out->line));
		memcpy(out->label + so, pr[p].label, pr[p].n * sizeof(*out->label));
		memcpy(out->ids + sl, pr[p].ids, pr[p].n_ids * sizeof(*out->ids));
		if (out->mask) {
			if (!pr[p].mask) {
				tok_result_free(out);
				rc = 1;
				goto out_free;
			}
			memcpy(out->mask + sl, pr[p].mask, pr[p].n_ids);
		}
		out->skipped += pr[p].skipped;
		so += pr[p].n;
		sl += pr[p].n_ids;
	}
	out->off[n] = nid;
	rc = 0;
out_free:
	for (p = 0; p < nparts; p++)
		tok_result_free(&pr[p]);
	free(pr);
	return rc;
}

/* the dataset from tokenized records: label, vocabulary and max_state checks */
static int load_from_result(struct sl_dataset *ds, const struct tok_result *r,
			    const struct sl_data_opts *o)
{
	const char *lf = o->label_field && *o->label_field ? o->label_field : "label";
	uint64_t i, k;
	int shown = 0, rc = 0;
	size_t pool = 0;

	ds->skipped = r->skipped;
	ds->rec = malloc((r->n + 1) * sizeof(*ds->rec));
	ds->pool = malloc((r->n_ids + 1) * sizeof(*ds->pool));
	if (o->sft)
		ds->mask_pool = malloc(r->n_ids + 1);
	if (!ds->rec || !ds->pool || (o->sft && !ds->mask_pool)) {
		sl_error("%s: out of memory for %" PRIu64 " records", ds->path, r->n);
		return -ENOMEM;
	}
	for (i = 0; i < r->n; i++) {
		int64_t len = r->off[i + 1] - r->off[i];
		const char *why = NULL;
		char msg[256];

		if (o->sft && !r->mask) {
			sl_error("%s: the tokenization cache has no loss masks; delete it", ds->path);
			return -EINVAL;
		}
		if (o->need_label && !o->sft && isnan(r->label[i])) {
			snprintf(msg, sizeof(msg), "record has no label in field '%s'; training "
				 "needs a number in [0,1]", lf);
			why = msg;
		}
		for (k = 0; !why && o->vocab > 0 && k < (uint64_t)len; k++) {
			if (r->ids[r->off[i] + k] >= (uint32_t)o->vocab) {
				snprintf(msg, sizeof(msg), "token id %u is outside the vocabulary "
					 "[0, %d); does the tokenizer belong to this model?",
					 r->ids[r->off[i] + k], o->vocab);
				why = msg;
			}
		}
		if (why) {
			if (!o->skip_errors) {
				sl_error("%s:%" PRId64 ": %s", ds->path, r->line[i], why);
				return -EINVAL;
			}
			ds->skipped++;
			if (shown++ < SHOW_SKIPPED)
				sl_warn("%s:%" PRId64 ": %s (line skipped)", ds->path, r->line[i],
					why);
			continue;
		}
		ds->total++;
		if (o->max_state > 0 && len > o->max_state) {
			ds->dropped++;
			continue;
		}
		if (o->sft && !sl_data_has_target(r->mask + r->off[i], (int)len)) {
			ds->no_target++;
			continue;
		}
		memcpy(ds->pool + pool, r->ids + r->off[i], len * sizeof(*ds->pool));
		if (o->sft)
			memcpy(ds->mask_pool + pool, r->mask + r->off[i], len);
		ds->rec[ds->n].ids = NULL;
		ds->rec[ds->n].len = (int)len;
		ds->rec[ds->n].label = r->label[i];
		ds->rec[ds->n].line = (long)r->line[i];
		/* the offset, until the pool is final */
		ds->rec[ds->n].ids = (const int32_t *)(uintptr_t)pool;
		pool += len;
		ds->n++;
	}
	if (ds->n == 0)
		return no_records(ds, o);
	ds->pool_len = pool;
	for (i = 0; i < (uint64_t)ds->n; i++) {
		uintptr_t off = (uintptr_t)ds->rec[i].ids;

		ds->rec[i].ids = ds->pool + off;
		ds->rec[i].mask = ds->mask_pool ? ds->mask_pool + off : NULL;
	}
	return rc;
}

static int load_text(struct sl_dataset *ds, const char *path, const struct sl_data_opts *o)
{
	char stem[SL_PATH_MAX], file[SL_PATH_MAX + 64];
	struct tok_result r;
	struct mapped m;
	bool have_dir;
	uint64_t key;
	int rc;

	rc = map_file(path, &m);
	if (rc)
		return rc;
	key = cache_key(&m, o);
	have_dir = cache_stem(path, &m, o, stem, sizeof(stem)) == 0;
	snprintf(file, sizeof(file), "%s.tok", stem);
	rc = have_dir ? cache_read(file, key, 0, 1, &r) : 1;
	if (rc == 0) {
		ds->from_cache = true;
	} else if (have_dir && (rc = merge_parts(stem, key, &r)) == 0) {
		cache_write(file, &r, key, 0, 1);
	} else if (rc >= 0) {
		rc = tokenize_range(path, &m, 0, m.n, o, &r);
		if (!rc && have_dir)
			cache_write(file, &r, key, 0, 1);
	}
	unmap_file(&m);
	if (rc)
		return rc;
	if (o->progress && ds->from_cache)
		sl_log("%s: %" PRIu64 " tokenized records from the cache %s", path, r.n, file);
	rc = load_from_result(ds, &r, o);
	tok_result_free(&r);
	return rc;
}
