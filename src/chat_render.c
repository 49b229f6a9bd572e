/*
 * chat_render: the pieces every chat renderer uses: a growing buffer, transformers' tojson
 * filter (Python's json.dumps(x, ensure_ascii=False)) and the rendered-text builder, which
 * records where the template emits special tokens and where targets start and end.
 */
#define _GNU_SOURCE
#include "chat_impl.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *const sl_chat_role_names[] = { "system", "user", "assistant", "tool" };

void sl_chat_put(struct sbuf *b, const char *s, size_t n)
{
	if (b->oom)
		return;
	if (b->n + n + 1 > b->cap) {
		size_t c = b->cap ? b->cap : 256;
		char *p;

		while (c < b->n + n + 1)
			c *= 2;
		p = realloc(b->s, c);
		if (!p) {
			b->oom = true;
			return;
		}
		b->s = p;
		b->cap = c;
	}
	memcpy(b->s + b->n, s, n);
	b->n += n;
	b->s[b->n] = 0;
}

static void sb_puts(struct sbuf *b, const char *s)
{
	sl_chat_put(b, s, strlen(s));
}

/* ---- tojson: Python's json.dumps(x, ensure_ascii=False) ----------------------------------- */

static void dump_string(struct sbuf *b, const char *s, size_t n)
{
	size_t i, run = 0;

	sl_chat_put(b, "\"", 1);
	for (i = 0; i < n; i++) {
		unsigned char c = s[i];
		char esc[8];

		if (c >= 0x20 && c != '"' && c != '\\')
			continue;
		sl_chat_put(b, s + run, i - run);
		run = i + 1;
		switch (c) {
		case '"':
			sl_chat_put(b, "\\\"", 2);
			break;
		case '\\':
			sl_chat_put(b, "\\\\", 2);
			break;
		case '\n':
			sl_chat_put(b, "\\n", 2);
			break;
		case '\r':
			sl_chat_put(b, "\\r", 2);
			break;
		case '\t':
			sl_chat_put(b, "\\t", 2);
			break;
		case '\b':
			sl_chat_put(b, "\\b", 2);
			break;
		case '\f':
			sl_chat_put(b, "\\f", 2);
			break;
		default:
			snprintf(esc, sizeof(esc), "\\u%04x", c);
			sl_chat_put(b, esc, 6);
		}
	}
	sl_chat_put(b, s + run, n - run);
	sl_chat_put(b, "\"", 1);
}

/*
 * repr(float): the shortest digits that read back as @x (the correctly rounded p-digit decimal
 * for the smallest p that round-trips), fixed notation when the decimal point falls within
 * -4 < decpt <= 16, else d.ddde+XX.
 */
static void dump_real(struct sbuf *b, double x)
{
	char e[40], digits[24], out[64];
	int p, nd = 0, exp10, decpt, i, o = 0;
	const char *q;

	if (isnan(x) || isinf(x)) {
		sb_puts(b, isnan(x) ? "NaN" : x < 0 ? "-Infinity" : "Infinity");
		return;
	}
	if (x == 0) {
		sb_puts(b, signbit(x) ? "-0.0" : "0.0");
		return;
	}
	for (p = 1; p <= 17; p++) {
		snprintf(e, sizeof(e), "%.*e", p - 1, x);
		if (strtod(e, NULL) == x)
			break;
	}
	q = e;
	if (*q == '-')
		out[o++] = *q++;
	for (; *q && *q != 'e'; q++)
		if (*q >= '0' && *q <= '9')
			digits[nd++] = *q;
	exp10 = atoi(q + 1);
	while (nd > 1 && digits[nd - 1] == '0')
		nd--;
	decpt = exp10 + 1;
	if (decpt <= -4 || decpt > 16) {
		out[o++] = digits[0];
		if (nd > 1) {
			out[o++] = '.';
			memcpy(out + o, digits + 1, nd - 1);
			o += nd - 1;
		}
		o += snprintf(out + o, sizeof(out) - o, "e%c%02d", exp10 < 0 ? '-' : '+',
			      abs(exp10));
	} else if (decpt <= 0) {
		out[o++] = '0';
		out[o++] = '.';
		for (i = 0; i < -decpt; i++)
			out[o++] = '0';
		memcpy(out + o, digits, nd);
		o += nd;
	} else if (decpt < nd) {
		memcpy(out + o, digits, decpt);
		o += decpt;
		out[o++] = '.';
		memcpy(out + o, digits + decpt, nd - decpt);
		o += nd - decpt;
	} else {
		memcpy(out + o, digits, nd);
		o += nd;
		for (i = nd; i < decpt; i++)
			out[o++] = '0';
		out[o++] = '.';
		out[o++] = '0';
	}
	sl_chat_put(b, out, o);
}

void sl_chat_dump_json(struct sbuf *b, json_t *j)
{
	const char *k;
	json_t *v;
	size_t i;
	bool first = true;
	char num[32];

	switch (json_typeof(j)) {
	case JSON_OBJECT:
		sl_chat_put(b, "{", 1);
		/* jansson keeps insertion order, as Python's dicts do */
		json_object_foreach(j, k, v) {
			if (!first)
				sl_chat_put(b, ", ", 2);
			first = false;
			dump_string(b, k, strlen(k));
			sl_chat_put(b, ": ", 2);
			sl_chat_dump_json(b, v);
		}
		sl_chat_put(b, "}", 1);
		break;
	case JSON_ARRAY:
		sl_chat_put(b, "[", 1);
		json_array_foreach(j, i, v) {
			if (i)
				sl_chat_put(b, ", ", 2);
			sl_chat_dump_json(b, v);
		}
		sl_chat_put(b, "]", 1);
		break;
	case JSON_STRING:
		dump_string(b, json_string_value(j), json_string_length(j));
		break;
	case JSON_INTEGER:
		snprintf(num, sizeof(num), "%" JSON_INTEGER_FORMAT, json_integer_value(j));
		sb_puts(b, num);
		break;
	case JSON_REAL:
		dump_real(b, json_real_value(j));
		break;
	case JSON_TRUE:
		sb_puts(b, "true");
		break;
	case JSON_FALSE:
		sb_puts(b, "false");
		break;
	case JSON_NULL:
		sb_puts(b, "null");
		break;
	}
}

int sl_chat_tojson(json_t *j, char **out, size_t *len)
{
	struct sbuf b = { 0 };

	sl_chat_dump_json(&b, j);
	if (b.oom || !b.s) {
		free(b.s);
		return -ENOMEM;
	}
	*out = b.s;
	*len = b.n;
	return 0;
}

/* ---- the rendered text --------------------------------------------------------------------- */

static bool grow(void **p, int *cap, int n, size_t elem)
{
	void *q;
	int c;

	if (n < *cap)
		return true;
	c = *cap ? 2 * *cap : 16;
	q = realloc(*p, (size_t)c * elem);
	if (!q)
		return false;
	*p = q;
	*cap = c;
	return true;
}

void sl_chat_text(struct render *r, const char *s, size_t n)
{
	struct seg *last = r->nseg ? &r->seg[r->nseg - 1] : NULL;

	if (!n)
		return;
	if (!last || last->special >= 0) {
		if (!grow((void **)&r->seg, &r->seg_cap, r->nseg, sizeof(*r->seg))) {
			r->text.oom = true;
			return;
		}
		last = &r->seg[r->nseg++];
		last->start = r->text.n;
		last->len = 0;
		last->special = -1;
	}
	sl_chat_put(&r->text, s, n);
	last->len += n;
}

void sl_chat_str(struct render *r, const char *s)
{
	sl_chat_text(r, s, strlen(s));
}

void sl_chat_special(struct render *r, int which, const char *content)
{
	struct seg *g;

	if (!grow((void **)&r->seg, &r->seg_cap, r->nseg, sizeof(*r->seg))) {
		r->text.oom = true;
		return;
	}
	g = &r->seg[r->nseg++];
	g->start = r->text.n;
	g->len = strlen(content);
	g->special = which;
	sl_chat_put(&r->text, content, g->len);
}

void sl_chat_target_begin(struct render *r)
{
	if (!grow((void **)&r->tgt, &r->tgt_cap, r->ntgt, sizeof(*r->tgt))) {
		r->text.oom = true;
		return;
	}
	r->tgt[r->ntgt].start = r->text.n;
	r->tgt[r->ntgt++].end = r->text.n;
}

void sl_chat_target_end(struct render *r)
{
	if (r->ntgt)
		r->tgt[r->ntgt - 1].end = r->text.n;
}

void sl_chat_render_clear(struct render *r)
{
	free(r->text.s);
	free(r->seg);
	free(r->tgt);
	free(r->err);
	memset(r, 0, sizeof(*r));
}

