/*
 * tokenizer_impl.h: the tokenizer's private state (struct sl_tokenizer, its tables and
 * limits) and the helpers its files share (tokenizer.c and tokenizer_*.c).  Nothing outside
 * the tokenizer module includes it.
 */
#ifndef SL_TOKENIZER_IMPL_H
#define SL_TOKENIZER_IMPL_H

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <jansson.h>
#include <pcre2.h>

#include "tokenizer.h"

/* words longer than this are not cached (HF: the same bound) */
#define CACHE_MAX_WORD 256
#define CACHE_STRIPES 64
#define CACHE_SLOTS 4096		/* per stripe, a power of two */
#define MAX_STEPS 16			/* normalizers / pre-tokenizers in a sequence */
/* token ids size per-id tables: bound them (the largest real vocabularies are ~1M) */
#define MAX_TOKEN_ID ((1 << 24) - 1)

/* ---- hashing ------------------------------------------------------------------------------ */

static inline uint64_t mix64(uint64_t x)
{
	x ^= x >> 33;
	x *= 0xff51afd7ed558ccdull;
	x ^= x >> 33;
	x *= 0xc4ceb9fe1a85ec53ull;
	x ^= x >> 33;
	return x;
}

/* ---- string -> id table (vocabulary) ------------------------------------------------------ */

struct str_map {
	uint32_t mask;			/* slots - 1 */
	int32_t *slot;			/* (slots) entry index or -1 */
	const char **key;		/* (n) */
	uint32_t *klen;			/* (n) */
	int32_t *val;			/* (n) */
	uint32_t n, cap;
};

/* ---- (id, id) -> (rank, new id) table (merges) -------------------------------------------- */

struct pair_entry {
	uint64_t key;			/* a << 32 | b; ~0 = empty */
	uint32_t rank;
	int32_t new_id;
};

struct pair_map {
	uint64_t mask;
	struct pair_entry *e;
};

static inline const struct pair_entry *pair_map_get(const struct pair_map *m, int32_t a,
						    int32_t b)
{
	uint64_t k = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
	uint64_t i = mix64(k) & m->mask;

	for (;;) {
		const struct pair_entry *e = &m->e[i];

		if (e->key == k)
			return e;
		if (e->key == ~0ull)
			return NULL;
		i = (i + 1) & m->mask;
	}
}

/* ---- the tokenizer ------------------------------------------------------------------------ */

enum norm_kind { NORM_NFC, NORM_NFD, NORM_NFKC, NORM_NFKD };

enum split_behavior {
	SPLIT_REMOVED, SPLIT_ISOLATED, SPLIT_MERGED_PREV, SPLIT_MERGED_NEXT, SPLIT_CONTIGUOUS
};

struct pretok {
	bool byte_level;		/* ByteLevel (else Split) */
	bool add_prefix_space;		/* ByteLevel */
	enum split_behavior behavior;	/* Split; ByteLevel's regex: Isolated */
	bool invert;
	pcre2_code *re;			/* NULL: ByteLevel without its regex */
	bool jit;
};

struct added {
	char *content;
	size_t len;
	int32_t id;
	bool special, single_word, lstrip, rstrip, normalized;
};

/* added tokens of one kind, indexed by first byte, longest first */
struct added_set {
	int n;
	int *idx;			/* (n) into tok->added, by (first byte, length desc) */
	int start[257];			/* first byte b's tokens: idx[start[b] .. start[b+1]) */
};

struct cache_entry {
	uint64_t h;
	uint32_t len, nids;
	char *blob;			/* len bytes of word, then nids int32 ids */
};

struct cache_stripe {
	pthread_mutex_t lock;
	uint32_t used;
	struct cache_entry *slot;	/* (CACHE_SLOTS) */
};

struct sl_tokenizer {
	char path[4096];
	uint64_t hash;			/* of the file's bytes */
	char *vocab_arena;		/* vocabulary strings, NUL-separated */
	struct str_map vocab;
	int n_vocab;			/* model vocabulary entries */
	int vocab_size;			/* max id + 1, added tokens included */
	const char **id_str;		/* (vocab_size) the token's string (mapped alphabet) or NULL */
	uint32_t *id_len;		/* (vocab_size) */
	char **id_bytes;		/* (vocab_size) decoded bytes */
	uint32_t *id_nbytes;		/* (vocab_size) */
	struct pair_map merges;
	bool ignore_merges;
	bool byte_level;		/* a ByteLevel pre-tokenizer maps bytes to the alphabet */
	bool decoder_byte_level;
	int32_t byte_id[256];		/* the id of each byte's alphabet character, or -1 */
	char byte_chr[256][3];		/* bytes_to_unicode: each byte's character in UTF-8 */
	uint8_t byte_chr_len[256];
	int16_t chr_byte[512];		/* the inverse: character -> byte, or -1 */
	int n_norm;
	enum norm_kind norm[MAX_STEPS];
	int n_pre;
	struct pretok pre[MAX_STEPS];
	int n_added;
	struct added *added;
	struct added_set raw_set, norm_set;
	struct cache_stripe cache[CACHE_STRIPES];
	uint64_t bpe_count;		/* atomic */
};

/* ---- encoding ----------------------------------------------------------------------------- */

struct out {
	int32_t **ids;
	size_t *cap;
	size_t n;
};

static inline int out_push(struct out *o, const int32_t *ids, size_t n)
{
	if (o->n + n > *o->cap) {
		size_t cap = *o->cap ? *o->cap : 256;
		int32_t *p;

		while (cap < o->n + n)
			cap *= 2;
		p = realloc(*o->ids, cap * sizeof(*p));
		if (!p)
			return -ENOMEM;
		*o->ids = p;
		*o->cap = cap;
	}
	memcpy(*o->ids + o->n, ids, n * sizeof(*ids));
	o->n += n;
	return 0;
}

/* ---- loading ------------------------------------------------------------------------------ */

static inline const char *jstr(json_t *o, const char *key)
{
	json_t *j = json_object_get(o, key);

	return json_is_string(j) ? json_string_value(j) : NULL;
}

static inline bool jbool(json_t *o, const char *key, bool dflt)
{
	json_t *j = json_object_get(o, key);

	return json_is_boolean(j) ? json_is_true(j) : dflt;
}

/* ---- what the files share ----------------------------------------------------------------- */

/* the vocabulary and merge tables (tokenizer.c) */
int str_map_init(struct str_map *m, size_t expect);
void str_map_free(struct str_map *m);
int32_t str_map_get(const struct str_map *m, const char *k, size_t n);
int str_map_put(struct str_map *m, const char *k, size_t n, int32_t v);
int pair_map_init(struct pair_map *m, size_t expect);
void pair_map_put(struct pair_map *m, int32_t a, int32_t b, uint32_t rank, int32_t id);

/* a "pre_tokenizer" object of tokenizer.json, appended to t->pre (tokenizer_pretok.c) */
int load_pretok(struct sl_tokenizer *t, json_t *n);
/* pre-tokenizer @step and the ones after it over s[0, n), then BPE (tokenizer_pretok.c) */
int tok_pretokenize(struct sl_tokenizer *t, int step, const char *s, size_t n, struct out *o);
/* one pre-token's ids, from the cache or BPE (tokenizer_bpe.c) */
int tok_word(struct sl_tokenizer *t, const char *w, size_t n, struct out *o);
/* *out = normalized copy (malloc'ed), or NULL when @s is already normal (tokenizer_encode.c) */
int tok_normalize(const struct sl_tokenizer *t, const char *s, size_t n, char **out,
		  size_t *out_n);

#endif
