/*
 * tokenizer_bpe.c: the BPE model over one pre-token (HF's Word::merge_all: merges by rank
 * through a binary heap over a linked list of symbols), and the bounded, lock-striped cache
 * of pre-token results in front of it.
 */
#define _GNU_SOURCE
#include "tokenizer_impl.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include <utf8proc.h>

struct sym {
	int32_t id;
	int32_t prev, next;		/* -1 = none */
	uint32_t len;			/* bytes; 0 = merged away */
};

struct merge {
	uint32_t rank;
	int32_t pos;
	int32_t new_id;
};

static inline bool merge_less(const struct merge *a, const struct merge *b)
{
	return a->rank != b->rank ? a->rank < b->rank : a->pos < b->pos;
}

static void heap_push(struct merge *h, size_t *n, struct merge m)
{
	size_t i = (*n)++;

	while (i) {
		size_t p = (i - 1) / 2;

		if (!merge_less(&m, &h[p]))
			break;
		h[i] = h[p];
		i = p;
	}
	h[i] = m;
}

static struct merge heap_pop(struct merge *h, size_t *n)
{
	struct merge top = h[0], last = h[--(*n)];
	size_t i = 0;

	for (;;) {
		size_t c = 2 * i + 1;

		if (c >= *n)
			break;
		if (c + 1 < *n && merge_less(&h[c + 1], &h[c]))
			c++;
		if (!merge_less(&h[c], &last))
			break;
		h[i] = h[c];
		i = c;
	}
	if (*n)
		h[i] = last;
	return top;
}

/* the alphabet spelling of a byte word, for whole-word vocabulary lookups */
static size_t map_word(const struct sl_tokenizer *t, const char *w, size_t n, char *buf)
{
	size_t i, o = 0;

	for (i = 0; i < n; i++) {
		unsigned char b = w[i];

		memcpy(buf + o, t->byte_chr[b], t->byte_chr_len[b]);
		o += t->byte_chr_len[b];
	}
	return o;
}

/*
 * BPE of one pre-token: HF's Word::merge_all.  Lowest rank first, leftmost among equal ranks;
 * a queued merge whose pair has changed since is dropped.
 */
static int bpe_word(struct sl_tokenizer *t, const char *w, size_t n, struct out *o)
{
	struct sym sbuf[64], *s = sbuf;
	struct merge hbuf[3 * 64], *h = hbuf;	/* pushes <= 3 per symbol */
	size_t ns = 0, nh = 0, i;
	int rc = 0;

	__atomic_add_fetch(&t->bpe_count, 1, __ATOMIC_RELAXED);
	if (t->ignore_merges) {
		char mbuf[512], *mb = n * 2 <= sizeof(mbuf) ? mbuf : malloc(n * 2);
		int32_t id;
		size_t mn;

		if (!mb)
			return -ENOMEM;
		mn = t->byte_level ? map_word(t, w, n, mb) : (memcpy(mb, w, n), n);
		id = str_map_get(&t->vocab, mb, mn);
		if (mb != mbuf)
			free(mb);
		if (id >= 0)
			return out_push(o, &id, 1);
	}
	if (n > 64) {
		s = malloc(n * sizeof(*s));
		h = malloc(3 * n * sizeof(*h));
		if (!s || !h) {
			rc = -ENOMEM;
			goto out_free;
		}
	}
	/* the initial symbols: one per byte (byte level) or per character */
	for (i = 0; i < n;) {
		int32_t id;
		uint32_t k;

		if (t->byte_level) {
			id = t->byte_id[(unsigned char)w[i]];
			k = 1;
		} else {
			int32_t cp;
			utf8proc_ssize_t kk = utf8proc_iterate((const utf8proc_uint8_t *)w + i,
							       n - i, &cp);

			k = kk > 0 ? (uint32_t)kk : 1;
			id = str_map_get(&t->vocab, w + i, k);
		}
		i += k;
		if (id < 0) {
			/* no unk token: HF drops what the vocabulary cannot spell */
			if (ns)
				s[ns - 1].len += k;
			continue;
		}
		s[ns].id = id;
		s[ns].len = k;
		s[ns].prev = (int32_t)ns - 1;
		s[ns].next = (int32_t)ns + 1;
		ns++;
	}
	if (!ns)
		goto out_free;
	s[ns - 1].next = -1;
	for (i = 0; i + 1 < ns; i++) {
		const struct pair_entry *pe = pair_map_get(&t->merges, s[i].id, s[i + 1].id);

		if (pe)
			heap_push(h, &nh, (struct merge){ pe->rank, (int32_t)i, pe->new_id });
	}
	while (nh) {
		struct merge m = heap_pop(h, &nh);
		struct sym *a = &s[m.pos], *b;
		const struct pair_entry *pe;

		if (!a->len || a->next < 0)
			continue;
		b = &s[a->next];
		pe = pair_map_get(&t->merges, a->id, b->id);
		if (!pe || pe->new_id != m.new_id)
			continue;
		a->id = m.new_id;
		a->len += b->len;
		b->len = 0;
		a->next = b->next;
		if (b->next >= 0)
			s[b->next].prev = m.pos;
		if (a->prev >= 0) {
			pe = pair_map_get(&t->merges, s[a->prev].id, a->id);
			if (pe)
				heap_push(h, &nh, (struct merge){ pe->rank, a->prev, pe->new_id });
		}
		if (a->next >= 0) {
			pe = pair_map_get(&t->merges, a->id, s[a->next].id);
			if (pe)
				heap_push(h, &nh, (struct merge){ pe->rank, m.pos, pe->new_id });
		}
	}
	for (i = 0; i < ns; i = s[i].next < 0 ? ns : (size_t)s[i].next) {
		rc = out_push(o, &s[i].id, 1);
		if (rc)
			break;
	}
out_free:
	if (s != sbuf)
		free(s);
	if (h != hbuf)
		free(h);
	return rc;
}

int tok_word(struct sl_tokenizer *t, const char *w, size_t n, struct out *o)
{
	struct cache_stripe *cs;
	struct cache_entry *e;
	uint64_t hsh;
	size_t start;
	uint32_t i;
	int rc;

	if (!n)
		return 0;
	if (n > CACHE_MAX_WORD)
		return bpe_word(t, w, n, o);
	hsh = sl_hash64(w, n, 0x5741);
	cs = &t->cache[hsh % CACHE_STRIPES];
	i = (uint32_t)(hsh >> 20) & (CACHE_SLOTS - 1);
	pthread_mutex_lock(&cs->lock);
	if (cs->slot) {
		for (;;) {
			e = &cs->slot[i];
			if (!e->blob)
				break;
			if (e->h == hsh && e->len == n && !memcmp(e->blob, w, n)) {
				rc = out_push(o, (const int32_t *)(e->blob + ((n + 3) & ~3u)),
					      e->nids);
				pthread_mutex_unlock(&cs->lock);
				return rc;
			}
			i = (i + 1) & (CACHE_SLOTS - 1);
		}
	}
	pthread_mutex_unlock(&cs->lock);

	start = o->n;
	rc = bpe_word(t, w, n, o);
	if (rc)
		return rc;

	pthread_mutex_lock(&cs->lock);
	if (!cs->slot)
		cs->slot = calloc(CACHE_SLOTS, sizeof(*cs->slot));
	if (cs->slot && cs->used >= CACHE_SLOTS / 2) {
		/* full: start over (bounded memory; the hot words come back quickly) */
		for (i = 0; i < CACHE_SLOTS; i++) {
			free(cs->slot[i].blob);
			cs->slot[i].blob = NULL;
		}
		cs->used = 0;
	}
	if (cs->slot) {
		size_t nids = o->n - start, pad = (n + 3) & ~3u;
		char *blob = malloc(pad + nids * sizeof(int32_t));

		i = (uint32_t)(hsh >> 20) & (CACHE_SLOTS - 1);
		while (cs->slot[i].blob &&
		       !(cs->slot[i].h == hsh && cs->slot[i].len == n &&
			 !memcmp(cs->slot[i].blob, w, n)))
			i = (i + 1) & (CACHE_SLOTS - 1);
		if (blob && !cs->slot[i].blob) {
			memcpy(blob, w, n);
			memcpy(blob + pad, *o->ids + start, nids * sizeof(int32_t));
			cs->slot[i] = (struct cache_entry){ hsh, (uint32_t)n, (uint32_t)nids, blob };
			cs->used++;
		} else {
			free(blob);
		}
	}
	pthread_mutex_unlock(&cs->lock);
	return 0;
}
