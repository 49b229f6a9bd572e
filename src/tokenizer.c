/*
 * tokenizer: Hugging Face tokenizer.json (model BPE, byte-level) loading, encoding, decoding.
 *
 * Owns the exact reproduction of HF tokenizers' encode(text, add_special_tokens=False): added
 * tokens (AddedVocabulary::extract_and_normalize), normalizers (utf8proc), pre-tokenizers
 * (Split through PCRE2, ByteLevel) and the BPE model (merges by rank, HF's heap order).  The
 * semantics were read from HF tokenizers' Rust source; no code is taken from it.
 *
 * Speed: ASCII and sub-U+0300 text skips NFC (it is NFC already); merge ranks live in an open
 * addressing table keyed by the id pair; a word merges through a binary heap over a linked list
 * of symbols (O(n log n), so a 100k-byte word is fine); pre-token results are cached in a
 * bounded, lock-striped table.
 */
#define _GNU_SOURCE
#include "tokenizer_impl.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <jansson.h>
#include <pcre2.h>
#include <utf8proc.h>

#include "log.h"

/* ---- hashing ------------------------------------------------------------------------------ */

uint64_t sl_hash64(const void *p, size_t n, uint64_t seed)
{
	const unsigned char *s = p;
	uint64_t h = seed ^ (n * 0x9e3779b97f4a7c15ull), w;

	while (n >= 8) {
		memcpy(&w, s, 8);
		h = (h ^ mix64(w)) * 0x9e3779b97f4a7c15ull;
		h ^= h >> 29;
		s += 8;
		n -= 8;
	}
	w = 0;
	memcpy(&w, s, n);
	h = (h ^ mix64(w ^ ((uint64_t)n << 56))) * 0x9e3779b97f4a7c15ull;
	return mix64(h);
}

/* ---- string -> id table (vocabulary) ------------------------------------------------------ */

int str_map_init(struct str_map *m, size_t expect)
{
	size_t slots = 16;

	while (slots < expect * 2)
		slots *= 2;
	memset(m, 0, sizeof(*m));
	m->mask = slots - 1;
	m->slot = malloc(slots * sizeof(*m->slot));
	m->cap = expect ? expect : 1;
	m->key = malloc(m->cap * sizeof(*m->key));
	m->klen = malloc(m->cap * sizeof(*m->klen));
	m->val = malloc(m->cap * sizeof(*m->val));
	if (!m->slot || !m->key || !m->klen || !m->val)
		return -ENOMEM;
	memset(m->slot, 0xff, slots * sizeof(*m->slot));
	return 0;
}

void str_map_free(struct str_map *m)
{
	free(m->slot);
	free(m->key);
	free(m->klen);
	free(m->val);
}

int32_t str_map_get(const struct str_map *m, const char *k, size_t n)
{
	uint32_t i = (uint32_t)sl_hash64(k, n, 0) & m->mask;
	int32_t e;

	while ((e = m->slot[i]) >= 0) {
		if (m->klen[e] == n && !memcmp(m->key[e], k, n))
			return m->val[e];
		i = (i + 1) & m->mask;
	}
	return -1;
}

/* @k must outlive the map; an existing key gets the new value */
int str_map_put(struct str_map *m, const char *k, size_t n, int32_t v)
{
	uint32_t i = (uint32_t)sl_hash64(k, n, 0) & m->mask;
	int32_t e;

	while ((e = m->slot[i]) >= 0) {
		if (m->klen[e] == n && !memcmp(m->key[e], k, n)) {
			m->val[e] = v;
			return 0;
		}
		i = (i + 1) & m->mask;
	}
	if (m->n == m->cap || (m->n + 1) * 2 > m->mask + 1)
		return -ENOSPC;
	m->key[m->n] = k;
	m->klen[m->n] = n;
	m->val[m->n] = v;
	m->slot[i] = m->n++;
	return 0;
}

/* ---- (id, id) -> (rank, new id) table (merges) -------------------------------------------- */

int pair_map_init(struct pair_map *m, size_t expect)
{
	size_t slots = 16, i;

	while (slots < expect * 2)
		slots *= 2;
	m->mask = slots - 1;
	m->e = malloc(slots * sizeof(*m->e));
	if (!m->e)
		return -ENOMEM;
	for (i = 0; i < slots; i++)
		m->e[i].key = ~0ull;
	return 0;
}

/* a later duplicate overwrites an earlier one, as HF's HashMap collect does */
void pair_map_put(struct pair_map *m, int32_t a, int32_t b, uint32_t rank, int32_t id)
{
	uint64_t k = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
	uint64_t i = mix64(k) & m->mask;

	while (m->e[i].key != ~0ull && m->e[i].key != k)
		i = (i + 1) & m->mask;
	m->e[i].key = k;
	m->e[i].rank = rank;
	m->e[i].new_id = id;
}

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
int normalize(const struct sl_tokenizer *t, const char *s, size_t n, char **out,
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
		return pretokenize(t, 0, s, n, o);
	if (t->n_norm) {
		rc = normalize(t, s, n, &norm, &nn);
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

/* ---- decoding ----------------------------------------------------------------------------- */

int sl_tokenizer_decode(const struct sl_tokenizer *t, const int32_t *ids, size_t n, char **out,
			size_t *out_len)
{
	size_t i, total = 0, o = 0;
	char *raw, *res;

	*out = NULL;
	*out_len = 0;
	for (i = 0; i < n; i++) {
		if (ids[i] < 0 || ids[i] >= t->vocab_size || !t->id_bytes[ids[i]]) {
			sl_error("%s: id %d is not in the vocabulary", t->path, ids[i]);
			return -EINVAL;
		}
		total += t->id_nbytes[ids[i]];
	}
	raw = malloc(total + 1);
	/* each invalid byte may become U+FFFD (3 bytes) */
	res = malloc(total * 3 + 1);
	if (!raw || !res) {
		free(raw);
		free(res);
		return -ENOMEM;
	}
	for (i = 0; i < n; i++) {
		memcpy(raw + o, t->id_bytes[ids[i]], t->id_nbytes[ids[i]]);
		o += t->id_nbytes[ids[i]];
	}
	/* String::from_utf8_lossy */
	for (i = 0, o = 0; i < total;) {
		int32_t cp;
		utf8proc_ssize_t k = utf8proc_iterate((const utf8proc_uint8_t *)raw + i, total - i,
						      &cp);

		if (k > 0) {
			memcpy(res + o, raw + i, k);
			o += k;
			i += k;
		} else {
			/* Rust's from_utf8_lossy: a maximal invalid subpart is one U+FFFD */
			unsigned char b0 = raw[i];
			size_t j = i + 1, need = 0;
			unsigned char lo = 0x80, hi = 0xbf;

			if (b0 >= 0xc2 && b0 <= 0xdf)
				need = 1;
			else if (b0 >= 0xe0 && b0 <= 0xef)
				need = 2;
			else if (b0 >= 0xf0 && b0 <= 0xf4)
				need = 3;
			if (b0 == 0xe0)
				lo = 0xa0;
			else if (b0 == 0xed)
				hi = 0x9f;
			else if (b0 == 0xf0)
				lo = 0x90;
			else if (b0 == 0xf4)
				hi = 0x8f;
			if (need && j < total && (unsigned char)raw[j] >= lo &&
			    (unsigned char)raw[j] <= hi) {
				j++;
				while (j < total && j - i <= need &&
				       ((unsigned char)raw[j] & 0xc0) == 0x80)
					j++;
			}
			memcpy(res + o, "\xef\xbf\xbd", 3);
			o += 3;
			i = j;
		}
	}
	res[o] = 0;
	free(raw);
	*out = res;
	*out_len = o;
	return 0;
}

/* ---- small queries ------------------------------------------------------------------------ */

int32_t sl_tokenizer_token_to_id(const struct sl_tokenizer *t, const char *token)
{
	size_t n = strlen(token);
	int i;

	for (i = 0; i < t->n_added; i++)
		if (t->added[i].len == n && !memcmp(t->added[i].content, token, n))
			return t->added[i].id;
	return str_map_get(&t->vocab, token, n);
}

int sl_tokenizer_token_bytes(const struct sl_tokenizer *t, int32_t id)
{
	if (id < 0 || id >= t->vocab_size || !t->id_bytes[id])
		return -1;
	return (int)t->id_nbytes[id];
}

int sl_tokenizer_vocab_size(const struct sl_tokenizer *t)
{
	return t->vocab_size;
}

const char *sl_tokenizer_path(const struct sl_tokenizer *t)
{
	return t->path;
}

uint64_t sl_tokenizer_hash(const struct sl_tokenizer *t)
{
	return t->hash;
}

uint64_t sl_tokenizer_bpe_count(const struct sl_tokenizer *t)
{
	return __atomic_load_n(&t->bpe_count, __ATOMIC_RELAXED);
}
