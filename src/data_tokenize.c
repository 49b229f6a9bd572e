/*
 * data_tokenize: text records (and, for task sft, chat records) tokenized on OpenMP threads.
 *
 * Owns parsing one record line on any thread (jansson; errors come back as messages), and
 * tokenizing the lines of a byte range of the mapped data file into a struct tok_result, in line
 * order: the first bad line is fatal ("FILE:LINE: why"), or with on_error: skip every bad line is
 * counted.  data_cache.c calls it for a whole file or one rank's part and caches the result.
 */
#define _GNU_SOURCE
#include "data_impl.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "log.h"
#include "tokenizer.h"

/* seconds between progress lines while tokenizing (o->progress) */
#define PROGRESS_EVERY_S 10.0

/* what one line gave: ids and a label, or an error message */
struct line_res {
	int32_t *ids;
	uint8_t *mask;			/* sft */
	int n;
	float label;
	char *err;
	bool blank;
};

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
		r->err = sl_msgf("the line is longer than %zu MB, the limit for one record: is the "
			         "file JSONL (one record per line)?", MAX_RECORD_BYTES >> 20);
		return;
	}
	root = json_loadb(buf, len, JSON_DECODE_ANY | JSON_REJECT_DUPLICATES, &jerr);
	if (!root) {
		r->err = sl_msgf("invalid JSON at column %d: %s%s", jerr.column, jerr.text,
			         strstr(jerr.text, "decode") ? " (the text is not valid UTF-8; fix "
			         "the file's encoding)" : "");
		return;
	}
	if (!json_is_object(root)) {
		r->err = sl_msgf("a record must be a JSON object, not %s", json_type_name(root));
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
			r->err = sl_msgf("\"input_ids\" must be a non-empty array of token ids");
			goto out_put;
		}
		r->ids = malloc(json_array_size(j) * sizeof(*r->ids));
		if (!r->ids) {
			r->err = sl_msgf("out of memory");
			goto out_put;
		}
		json_array_foreach(j, i, e) {
			json_int_t v = json_is_integer(e) ? json_integer_value(e) : -1;

			if (v < 0 || v > INT32_MAX) {
				r->err = sl_msgf("\"input_ids\"[%zu] is not a token id (an integer >= 0)",
					         i);
				goto out_put;
			}
			r->ids[i] = (int32_t)v;
		}
		r->n = (int)json_array_size(j);
	} else if ((j = json_object_get(root, tf))) {
		int n;

		if (!json_is_string(j)) {
			r->err = sl_msgf("field '%s' is %s, not a string", tf, json_type_name(j));
			goto out_put;
		}
		n = sl_tokenizer_encode(o->tokenizer, json_string_value(j), json_string_length(j),
					false, &r->ids, &cap);
		if (n < 0) {
			r->err = sl_msgf("cannot tokenize the text in field '%s'", tf);
			goto out_put;
		}
		if (n == 0) {
			r->err = sl_msgf("the text in field '%s' is empty (no tokens)", tf);
			goto out_put;
		}
		r->n = n;
	} else {
		r->err = sl_msgf("record has neither \"input_ids\" nor text in field '%s'%s", tf,
			         o->sft ? " nor chat \"messages\" / \"conversations\"" : "");
		goto out_put;
	}
	if (o->sft) {
		r->mask = malloc(r->n);
		if (!r->mask) {
			r->err = sl_msgf("out of memory");
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
			r->err = sl_msgf("label in field '%s' is %s, not a number in [0,1]", lf,
				         json_type_name(j));
			goto out_put;
		}
		y = json_number_value(j);
		if (!(y >= 0.0 && y <= 1.0)) {
			r->err = sl_msgf("label %g in field '%s' is outside [0,1]", y, lf);
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
int data_tokenize_range(const char *path, const struct mapped *m, size_t lo, size_t hi,
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
		data_tok_result_free(res);
	return rc;
}
