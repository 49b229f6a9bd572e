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
 *
 * Files: tokenizer.c (this one: hashing, the vocabulary and merge tables, decoding, the small
 * queries), tokenizer_load.c (reading tokenizer.json), tokenizer_pretok.c (the pre-tokenizers),
 * tokenizer_bpe.c (BPE of one pre-token, the cache), tokenizer_encode.c (added tokens,
 * normalization, sl_tokenizer_encode); tokenizer_impl.h holds what they share.
 */
#define _GNU_SOURCE
#include "tokenizer_impl.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

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
