/*
 * tokenizer_pretok.c: the pre-tokenizers (Split, ByteLevel, a Sequence of them): reading
 * them from tokenizer.json (Oniguruma regexes made PCRE2's), and cutting text into
 * pre-tokens with HF's split behaviors; each pre-token goes on to tokenizer_bpe.c.
 */
#define _GNU_SOURCE
#include "tokenizer_impl.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>
#include <pcre2.h>

#include "log.h"

/* ---- loading ------------------------------------------------------------------------------ */

/*
 * Oniguruma (HF's regex engine) reads \s as Unicode White_Space; PCRE2's \s adds U+180E, which
 * has not been a space since Unicode 6.3.  So \s and \S become explicit White_Space classes.
 */
#define WS_CLASS "\\t-\\r\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}" \
	"\\x{202F}\\x{205F}\\x{3000}"

static char *onig_compatible(const char *pat, size_t n)
{
	size_t cap = n * 4 + 256, o = 0, i;
	char *out = malloc(cap);
	int in_class = 0;

	if (!out)
		return NULL;
	for (i = 0; i < n; i++) {
		char c = pat[i];

		if (o + sizeof(WS_CLASS) + 8 > cap) {
			char *p;

			cap *= 2;
			p = realloc(out, cap);
			if (!p) {
				free(out);
				return NULL;
			}
			out = p;
		}
		if (c == '\\' && i + 1 < n) {
			char d = pat[i + 1];

			if (d == 's' || (d == 'S' && !in_class)) {
				o += sprintf(out + o, "%s%s%s", in_class ? "" : (d == 's' ? "[" : "[^"),
					     WS_CLASS, in_class ? "" : "]");
			} else {
				out[o++] = c;
				out[o++] = d;
			}
			i++;
			continue;
		}
		if (c == '[' && !in_class) {
			in_class = 1;
			out[o++] = c;
			/* a ']' or '^]' right after the opening bracket is a literal */
			if (i + 1 < n && pat[i + 1] == '^')
				out[o++] = pat[++i];
			if (i + 1 < n && pat[i + 1] == ']')
				out[o++] = pat[++i];
			continue;
		}
		if (c == ']' && in_class)
			in_class = 0;
		out[o++] = c;
	}
	out[o] = 0;
	return out;
}

static int compile_regex(struct sl_tokenizer *t, struct pretok *p, const char *pat, size_t n,
			 bool literal)
{
	PCRE2_SIZE off;
	int err;
	char *src = literal ? strndup(pat, n) : onig_compatible(pat, n);

	if (!src)
		return -ENOMEM;
	p->re = pcre2_compile((PCRE2_SPTR)src, PCRE2_ZERO_TERMINATED,
			      PCRE2_UTF | PCRE2_UCP | PCRE2_NO_UTF_CHECK |
			      (literal ? PCRE2_LITERAL : 0), &err, &off, NULL);
	free(src);
	if (!p->re) {
		PCRE2_UCHAR msg[256];

		pcre2_get_error_message(err, msg, sizeof(msg));
		sl_error("%s: pre-tokenizer regex /%.*s/ does not compile (PCRE2, at offset %zu): "
			 "%s", t->path, (int)n, pat, (size_t)off, (char *)msg);
		return -EINVAL;
	}
	p->jit = pcre2_jit_compile(p->re, PCRE2_JIT_COMPLETE) == 0;
	return 0;
}

/* GPT-2's pattern, which ByteLevel with use_regex applies */
static const char gpt2_pattern[] =
	"'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

int load_pretok(struct sl_tokenizer *t, json_t *n)
{
	const char *type, *beh;
	struct pretok *p;
	size_t i;
	json_t *e, *pat;

	if (!n || json_is_null(n))
		return 0;
	type = jstr(n, "type");
	if (!type) {
		sl_error("%s: \"pre_tokenizer\" has no \"type\"", t->path);
		return -EINVAL;
	}
	if (!strcmp(type, "Sequence")) {
		json_array_foreach(json_object_get(n, "pretokenizers"), i, e)
			if (load_pretok(t, e))
				return -EINVAL;
		return 0;
	}
	if (t->n_pre == MAX_STEPS) {
		sl_error("%s: more than %d pre-tokenizers", t->path, MAX_STEPS);
		return -EINVAL;
	}
	if (t->byte_level) {
		sl_error("%s: pre-tokenizer \"%s\" after ByteLevel is not supported (ByteLevel must "
			 "come last)", t->path, type);
		return -EINVAL;
	}
	p = &t->pre[t->n_pre];
	memset(p, 0, sizeof(*p));
	if (!strcmp(type, "ByteLevel")) {
		p->byte_level = true;
		p->add_prefix_space = jbool(n, "add_prefix_space", true);
		p->behavior = SPLIT_ISOLATED;
		if (jbool(n, "use_regex", true) &&
		    compile_regex(t, p, gpt2_pattern, strlen(gpt2_pattern), false))
			return -EINVAL;
		t->byte_level = true;
	} else if (!strcmp(type, "Split")) {
		const char *s;

		pat = json_object_get(n, "pattern");
		beh = jstr(n, "behavior");
		p->invert = jbool(n, "invert", false);
		if (!beh || !strcmp(beh, "Isolated"))
			p->behavior = SPLIT_ISOLATED;
		else if (!strcmp(beh, "Removed"))
			p->behavior = SPLIT_REMOVED;
		else if (!strcmp(beh, "MergedWithPrevious"))
			p->behavior = SPLIT_MERGED_PREV;
		else if (!strcmp(beh, "MergedWithNext"))
			p->behavior = SPLIT_MERGED_NEXT;
		else if (!strcmp(beh, "Contiguous"))
			p->behavior = SPLIT_CONTIGUOUS;
		else {
			sl_error("%s: Split behavior \"%s\" is unknown (Removed, Isolated, "
				 "MergedWithPrevious, MergedWithNext, Contiguous)", t->path, beh);
			return -EINVAL;
		}
		if ((s = jstr(pat, "Regex"))) {
			if (compile_regex(t, p, s, json_string_length(json_object_get(pat, "Regex")),
					  false))
				return -EINVAL;
		} else if ((s = jstr(pat, "String"))) {
			if (compile_regex(t, p, s,
					  json_string_length(json_object_get(pat, "String")), true))
				return -EINVAL;
		} else {
			sl_error("%s: Split pre-tokenizer needs \"pattern\": {\"Regex\": ...} or "
				 "{\"String\": ...}", t->path);
			return -EINVAL;
		}
	} else {
		sl_error("%s: pre-tokenizer \"%s\" is not supported (supported: Split, ByteLevel, "
			 "Sequence of them)", t->path, type);
		return -EINVAL;
	}
	t->n_pre++;
	return 0;
}

/* ---- splitting ---------------------------------------------------------------------------- */

/* a piece that a pre-tokenizer step produced goes to the next step */
static int emit(struct sl_tokenizer *t, int step, const char *s, size_t n, struct out *o)
{
	if (!n)
		return 0;
	return tok_pretokenize(t, step + 1, s, n, o);
}

struct span {
	size_t a, b;
	bool match;
};

static int regex_spans(const struct pretok *p, const char *s, size_t n, struct span **sp,
		       size_t *nsp, size_t *cap, bool stream, struct sl_tokenizer *t, int step,
		       struct out *o)
{
	pcre2_match_data *md = pcre2_match_data_create(1, NULL);
	size_t prev = 0, at = 0;
	int rc = 0;

	if (!md)
		return -ENOMEM;
	*nsp = 0;
	while (at <= n) {
		PCRE2_SIZE *ov;
		size_t ms, me;
		int r;

		if (p->jit)
			r = pcre2_jit_match(p->re, (PCRE2_SPTR)s, n, at, 0, md, NULL);
		else
			r = pcre2_match(p->re, (PCRE2_SPTR)s, n, at, PCRE2_NO_UTF_CHECK, md, NULL);
		if (r == PCRE2_ERROR_JIT_STACKLIMIT)
			r = pcre2_match(p->re, (PCRE2_SPTR)s, n, at, PCRE2_NO_UTF_CHECK |
					PCRE2_NO_JIT, md, NULL);
		if (r == PCRE2_ERROR_NOMATCH)
			break;
		if (r < 0) {
			PCRE2_UCHAR msg[256];

			pcre2_get_error_message(r, msg, sizeof(msg));
			sl_error("%s: pre-tokenizer regex failed: %s", t->path, (char *)msg);
			rc = -EINVAL;
			goto out_free;
		}
		ov = pcre2_get_ovector_pointer(md);
		ms = ov[0];
		me = ov[1];
		{
			struct span parts[2] = { { prev, ms, false }, { ms, me, true } };
			int k;

			for (k = 0; k < 2; k++) {
				if (parts[k].a == parts[k].b)
					continue;
				if (stream) {
					/* Isolated, not inverted: both kinds go on as they are */
					rc = emit(t, step, s + parts[k].a, parts[k].b - parts[k].a, o);
					if (rc)
						goto out_free;
					continue;
				}
				if (*nsp == *cap) {
					size_t c = *cap ? *cap * 2 : 64;
					struct span *q = realloc(*sp, c * sizeof(*q));

					if (!q) {
						rc = -ENOMEM;
						goto out_free;
					}
					*sp = q;
					*cap = c;
				}
				(*sp)[(*nsp)++] = parts[k];
			}
		}
		prev = me;
		if (me > at) {
			at = me;
		} else {
			/* an empty match: step over one character */
			if (at >= n)
				break;
			at++;
			while (at < n && ((unsigned char)s[at] & 0xc0) == 0x80)
				at++;
		}
	}
	if (prev < n) {
		if (stream) {
			rc = emit(t, step, s + prev, n - prev, o);
		} else {
			if (*nsp == *cap) {
				size_t c = *cap ? *cap * 2 : 64;
				struct span *q = realloc(*sp, c * sizeof(*q));

				if (!q) {
					rc = -ENOMEM;
					goto out_free;
				}
				*sp = q;
				*cap = c;
			}
			(*sp)[(*nsp)++] = (struct span){ prev, n, false };
		}
	}
out_free:
	pcre2_match_data_free(md);
	return rc;
}

/* HF's SplitDelimiterBehavior over the spans of one piece */
static int apply_split(struct sl_tokenizer *t, int step, const struct pretok *p, const char *s,
		       struct span *sp, size_t nsp, struct out *o)
{
	size_t i, k = 0;
	bool prev_match = false;
	int rc = 0;

	if (p->invert)
		for (i = 0; i < nsp; i++)
			sp[i].match = !sp[i].match;
	switch (p->behavior) {
	case SPLIT_ISOLATED:
		k = nsp;
		break;
	case SPLIT_REMOVED:
		for (i = 0; i < nsp; i++)
			if (!sp[i].match)
				sp[k++] = sp[i];
		break;
	case SPLIT_MERGED_PREV:
		for (i = 0; i < nsp; i++) {
			bool m = sp[i].match;

			if (m && !prev_match && k)
				sp[k - 1].b = sp[i].b;
			else
				sp[k++] = sp[i];
			prev_match = m;
		}
		break;
	case SPLIT_MERGED_NEXT:
		/* from the right: a match joins the piece after it */
		for (i = nsp; i-- > 0;) {
			bool m = sp[i].match;

			if (m && !prev_match && k)
				sp[nsp - k].a = sp[i].a;
			else
				sp[nsp - ++k] = sp[i];
			prev_match = m;
		}
		memmove(sp, sp + nsp - k, k * sizeof(*sp));
		break;
	case SPLIT_CONTIGUOUS:
		for (i = 0; i < nsp; i++) {
			bool m = sp[i].match;

			if (m == prev_match && k)
				sp[k - 1].b = sp[i].b;
			else
				sp[k++] = sp[i];
			prev_match = m;
		}
		break;
	}
	for (i = 0; i < k && !rc; i++)
		rc = emit(t, step, s + sp[i].a, sp[i].b - sp[i].a, o);
	return rc;
}

int tok_pretokenize(struct sl_tokenizer *t, int step, const char *s, size_t n, struct out *o)
{
	const struct pretok *p;
	struct span *sp = NULL;
	size_t nsp = 0, cap = 0;
	char *pre = NULL;
	bool stream;
	int rc;

	if (step == t->n_pre)
		return tok_word(t, s, n, o);
	p = &t->pre[step];
	if (p->byte_level && p->add_prefix_space && s[0] != ' ') {
		pre = malloc(n + 1);
		if (!pre)
			return -ENOMEM;
		pre[0] = ' ';
		memcpy(pre + 1, s, n);
		s = pre;
		n++;
	}
	if (!p->re) {
		rc = emit(t, step, s, n, o);
		goto out_free;
	}
	stream = p->behavior == SPLIT_ISOLATED && !p->invert;
	rc = regex_spans(p, s, n, &sp, &nsp, &cap, stream, t, step, o);
	if (!rc && !stream)
		rc = apply_split(t, step, p, s, sp, nsp, o);
out_free:
	free(sp);
	free(pre);
	return rc;
}
