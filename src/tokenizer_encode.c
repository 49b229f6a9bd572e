/*
 * tokenizer_encode.c: sl_tokenizer_encode: UTF-8 validation, the added tokens cut out of
 * the text (HF's AddedVocabulary: leftmost-longest, single_word, lstrip/rstrip; the
 * non-normalized ones first, the normalized ones after normalization), normalization
 * through utf8proc, and the rest handed to the pre-tokenizers (tokenizer_pretok.c).
 */
#define _GNU_SOURCE
#include "tokenizer_impl.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <utf8proc.h>

#include "log.h"

/* is text already NFC/NFD: every character below U+0300 has no decomposition or combining */
static bool below_0300(const char *s, size_t n)
{
	size_t i;

	for (i = 0; i < n; i++) {
		unsigned char c = s[i];

		if (c < 0x80)
			continue;
		/* U+0080..U+02FF are C2..CB lead bytes */
		if (c < 0xc2 || c > 0xcb)
			return false;
		i++;
	}
	return true;
}

static bool ascii_only(const char *s, size_t n)
{
	size_t i;

	for (i = 0; i < n; i++)
		if ((unsigned char)s[i] >= 0x80)
			return false;
	return true;
}

/* *out = normalized copy (malloc'ed), or NULL when @s is already normal */
int tok_normalize(const struct sl_tokenizer *t, const char *s, size_t n, char **out,
		  size_t *out_n)
{
	char *cur = NULL;
	size_t cur_n = n;
	int i;

	*out = NULL;
	*out_n = n;
	for (i = 0; i < t->n_norm; i++) {
		utf8proc_option_t opt = UTF8PROC_STABLE;
		utf8proc_uint8_t *r = NULL;
		utf8proc_ssize_t rn;
		const char *src = cur ? cur : s;

		/* NFC of text below U+0300 is itself; NFKC/NFD/NFKD: only ASCII is safe */
		if (t->norm[i] == NORM_NFC ? below_0300(src, cur_n) : ascii_only(src, cur_n))
			continue;
		switch (t->norm[i]) {
		case NORM_NFC:
			opt |= UTF8PROC_COMPOSE;
			break;
		case NORM_NFD:
			opt |= UTF8PROC_DECOMPOSE;
			break;
		case NORM_NFKC:
			opt |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT;
			break;
		case NORM_NFKD:
			opt |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT;
			break;
		}
		rn = utf8proc_map((const utf8proc_uint8_t *)src, cur_n, &r, opt);
		if (rn < 0) {
			sl_error("%s: normalization failed: %s", t->path, utf8proc_errmsg(rn));
			free(cur);
			return -EINVAL;
		}
		free(cur);
		cur = (char *)r;
		cur_n = rn;
	}
	if (cur && !(cur_n == n && !memcmp(cur, s, n))) {
		*out = cur;
		*out_n = cur_n;
	} else {
		free(cur);
	}
	return 0;
}

static bool is_ws(int32_t c)
{
	return (c >= 9 && c <= 13) || c == 0x20 || c == 0x85 || c == 0xa0 || c == 0x1680 ||
	       (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 || c == 0x202f ||
	       c == 0x205f || c == 0x3000;
}

/* Rust regex's \w: alphabetic, marks, decimal digits, connector punctuation, join controls */
static bool is_word_char(int32_t c)
{
	utf8proc_category_t k = utf8proc_category(c);

	return (k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_ME) ||
	       k == UTF8PROC_CATEGORY_ND || k == UTF8PROC_CATEGORY_NL ||
	       k == UTF8PROC_CATEGORY_PC || c == 0x200c || c == 0x200d;
}

/* the code point that ends at s[n] (n > 0) */
static int32_t last_char(const char *s, size_t n)
{
	size_t i = n - 1;
	int32_t cp = -1;

	while (i > 0 && ((unsigned char)s[i] & 0xc0) == 0x80)
		i--;
	utf8proc_iterate((const utf8proc_uint8_t *)s + i, n - i, &cp);
	return cp;
}

static int text_piece(struct sl_tokenizer *t, const char *s, size_t n, bool split_special,
		      bool normalized_stage, struct out *o);

/*
 * HF's AddedVocabulary::find_matches over one piece with one token set: leftmost-longest
 * matches, skipped (but consumed) when special and split_special, or when single_word fails;
 * lstrip/rstrip widen the match over whitespace.
 */
static int split_added(struct sl_tokenizer *t, const struct added_set *set, const char *s,
		       size_t n, bool split_special, bool normalized_stage, struct out *o)
{
	size_t at = 0, done = 0;
	int rc;

	if (set->n)
		while (at < n) {
			unsigned char c = s[at];
			const struct added *a = NULL;
			size_t start, stop;
			int k;

			for (k = set->start[c]; k < set->start[c + 1]; k++) {
				const struct added *x = &t->added[set->idx[k]];

				if (x->len <= n - at && !memcmp(s + at, x->content, x->len)) {
					a = x;
					break;
				}
			}
			if (!a) {
				at++;
				continue;
			}
			start = at;
			stop = at + a->len;
			at = stop;
			if (split_special && a->special)
				continue;
			if (a->single_word) {
				int32_t nx = -1;

				if (stop < n)
					utf8proc_iterate((const utf8proc_uint8_t *)s + stop, n - stop,
							 &nx);
				if ((start > 0 && is_word_char(last_char(s, start))) ||
				    (stop < n && is_word_char(nx)))
					continue;
			}
			if (a->lstrip) {
				size_t ns = start;

				while (ns > 0 && is_ws(last_char(s, ns))) {
					size_t j = ns - 1;

					while (j > 0 && ((unsigned char)s[j] & 0xc0) == 0x80)
						j--;
					ns = j;
				}
				start = ns > done ? ns : done;
			}
			if (a->rstrip) {
				while (stop < n) {
					int32_t cp;
					utf8proc_ssize_t k2 = utf8proc_iterate(
						(const utf8proc_uint8_t *)s + stop, n - stop, &cp);

					if (k2 <= 0 || !is_ws(cp))
						break;
					stop += k2;
				}
			}
			if (start > done) {
				rc = text_piece(t, s + done, start - done, split_special,
						normalized_stage, o);
				if (rc)
					return rc;
			}
			rc = out_push(o, &a->id, 1);
			if (rc)
				return rc;
			done = stop;
			if (at < stop)
				at = stop;
		}
	if (done < n)
		return text_piece(t, s + done, n - done, split_special, normalized_stage, o);
	return 0;
}

/* text between raw added tokens: normalize, cut normalized added tokens, pre-tokenize */
static int text_piece(struct sl_tokenizer *t, const char *s, size_t n, bool split_special,
		      bool normalized_stage, struct out *o)
{
	char *norm = NULL;
	size_t nn;
	int rc;

	if (normalized_stage)
		return tok_pretokenize(t, 0, s, n, o);
	if (t->n_norm) {
		rc = tok_normalize(t, s, n, &norm, &nn);
		if (rc)
			return rc;
		if (norm) {
			s = norm;
			n = nn;
		}
	}
	rc = split_added(t, &t->norm_set, s, n, split_special, true, o);
	free(norm);
	return rc;
}

/* the first invalid byte's offset, or -1 */
static long utf8_invalid_at(const char *s, size_t n)
{
	size_t i = 0;

	while (i < n) {
		int32_t cp;
		utf8proc_ssize_t k;

		if ((unsigned char)s[i] < 0x80) {
			i++;
			continue;
		}
		k = utf8proc_iterate((const utf8proc_uint8_t *)s + i, n - i, &cp);
		if (k <= 0)
			return (long)i;
		i += k;
	}
	return -1;
}

int sl_tokenizer_encode(struct sl_tokenizer *t, const char *text, size_t len,
			bool split_special, int32_t **ids, size_t *cap)
{
	struct out o = { ids, cap, 0 };
	long bad = utf8_invalid_at(text, len);
	int rc;

	if (bad >= 0) {
		sl_error("the text is not valid UTF-8 (byte 0x%02x at offset %ld); fix the data's "
			 "encoding", (unsigned char)text[bad], bad);
		return -EILSEQ;
	}
	if (!len)
		return 0;
	rc = split_added(t, &t->raw_set, text, len, split_special, false, &o);
	if (rc == -ENOMEM)
		sl_error("%s: out of memory encoding a %zu-byte text", t->path, len);
	if (rc)
		return rc;
	if (o.n > INT32_MAX) {
		sl_error("a %zu-byte text makes more than %d tokens", len, INT32_MAX);
		return -E2BIG;
	}
	return (int)o.n;
}

int sl_tokenizer_encode_cb(void *ctx, const char *text, size_t len, int32_t **ids, size_t *cap)
{
	return sl_tokenizer_encode(ctx, text, len, false, ids, cap);
}
