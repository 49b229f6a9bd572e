/*
 * tokenizer_load.c: reading a Hugging Face tokenizer.json into struct sl_tokenizer: the BPE
 * model (vocabulary and merges), the normalizers, the decoder, the added tokens, the per-id
 * strings and bytes, GPT-2's byte alphabet; sl_tokenizer_load and sl_tokenizer_free.  What
 * is not supported or not consistent is an error naming the file.  The pre-tokenizers are
 * read by tokenizer_pretok.c.
 */
#define _GNU_SOURCE
#include "tokenizer_impl.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <jansson.h>
#include <pcre2.h>
#include <utf8proc.h>

#include "log.h"

/* GPT-2's bytes_to_unicode: printable Latin-1 bytes stand for themselves, the rest for 256+k */
static void build_byte_alphabet(struct sl_tokenizer *t)
{
	int b, k = 0;

	for (b = 0; b < 512; b++)
		t->chr_byte[b] = -1;
	for (b = 0; b < 256; b++) {
		int32_t cp;

		if ((b >= '!' && b <= '~') || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff))
			cp = b;
		else
			cp = 256 + k++;
		t->byte_chr_len[b] = (uint8_t)utf8proc_encode_char(cp, (utf8proc_uint8_t *)
								   t->byte_chr[b]);
		t->chr_byte[cp] = (int16_t)b;
	}
}

/* the byte a character of the alphabet stands for, or -1 */
static int alphabet_byte(const struct sl_tokenizer *t, int32_t cp)
{
	return cp >= 0 && cp < 512 ? t->chr_byte[cp] : -1;
}

/* ---- loading ------------------------------------------------------------------------------ */

static char *read_file(const char *path, size_t *n)
{
	FILE *f = fopen(path, "rb");
	char *buf = NULL;
	long sz;

	if (!f)
		return NULL;
	if (fseek(f, 0, SEEK_END) || (sz = ftell(f)) < 0 || fseek(f, 0, SEEK_SET))
		goto out_close;
	buf = malloc(sz + 1);
	if (!buf)
		goto out_close;
	if (fread(buf, 1, sz, f) != (size_t)sz) {
		free(buf);
		buf = NULL;
		goto out_close;
	}
	buf[sz] = 0;
	*n = sz;
out_close:
	fclose(f);
	return buf;
}

static int load_normalizer(struct sl_tokenizer *t, json_t *n)
{
	const char *type;
	size_t i;
	json_t *e;

	if (!n || json_is_null(n))
		return 0;
	type = jstr(n, "type");
	if (!type) {
		sl_error("%s: \"normalizer\" has no \"type\"", t->path);
		return -EINVAL;
	}
	if (!strcmp(type, "Sequence")) {
		json_array_foreach(json_object_get(n, "normalizers"), i, e)
			if (load_normalizer(t, e))
				return -EINVAL;
		return 0;
	}
	if (t->n_norm == MAX_STEPS) {
		sl_error("%s: more than %d normalizers", t->path, MAX_STEPS);
		return -EINVAL;
	}
	if (!strcmp(type, "NFC"))
		t->norm[t->n_norm++] = NORM_NFC;
	else if (!strcmp(type, "NFD"))
		t->norm[t->n_norm++] = NORM_NFD;
	else if (!strcmp(type, "NFKC"))
		t->norm[t->n_norm++] = NORM_NFKC;
	else if (!strcmp(type, "NFKD"))
		t->norm[t->n_norm++] = NORM_NFKD;
	else {
		sl_error("%s: normalizer \"%s\" is not supported (supported: NFC, NFD, NFKC, NFKD, "
			 "Sequence); byte-level BPE tokenizers need no other", t->path, type);
		return -EINVAL;
	}
	return 0;
}

static int cmp_added(const void *a, const void *b, void *ctx)
{
	const struct added *ad = ctx;
	const struct added *x = &ad[*(const int *)a], *y = &ad[*(const int *)b];
	unsigned char fx = x->content[0], fy = y->content[0];

	if (fx != fy)
		return fx - fy;
	if (x->len != y->len)
		return x->len > y->len ? -1 : 1;
	return 0;
}

static int build_added_set(struct sl_tokenizer *t, struct added_set *s, bool normalized)
{
	int i, b, k = 0;

	s->idx = malloc((t->n_added + 1) * sizeof(int));
	if (!s->idx)
		return -ENOMEM;
	for (i = 0; i < t->n_added; i++)
		if (t->added[i].normalized == normalized && t->added[i].len)
			s->idx[k++] = i;
	s->n = k;
	qsort_r(s->idx, k, sizeof(int), cmp_added, t->added);
	for (b = 0, i = 0; b <= 256; b++) {
		while (i < k && (unsigned char)t->added[s->idx[i]].content[0] < b)
			i++;
		s->start[b] = i;
	}
	return 0;
}

static int load_added(struct sl_tokenizer *t, json_t *arr)
{
	size_t i;
	json_t *e;

	if (!arr || json_is_null(arr))
		return 0;
	if (!json_is_array(arr)) {
		sl_error("%s: \"added_tokens\" must be an array", t->path);
		return -EINVAL;
	}
	t->added = calloc(json_array_size(arr) + 1, sizeof(*t->added));
	if (!t->added)
		return -ENOMEM;
	json_array_foreach(arr, i, e) {
		struct added *a = &t->added[t->n_added];
		json_t *c = json_object_get(e, "content"), *id = json_object_get(e, "id");
		int k;

		if (!json_is_string(c) || !json_is_integer(id) || json_integer_value(id) < 0 ||
		    json_integer_value(id) > MAX_TOKEN_ID) {
			sl_error("%s: added_tokens[%zu] needs a string \"content\" and an id in [0, "
				 "%d]", t->path, i, MAX_TOKEN_ID);
			return -EINVAL;
		}
		a->special = jbool(e, "special", false);
		a->single_word = jbool(e, "single_word", false);
		a->lstrip = jbool(e, "lstrip", false);
		a->rstrip = jbool(e, "rstrip", false);
		a->normalized = jbool(e, "normalized", !a->special);
		a->id = (int32_t)json_integer_value(id);
		/* a token added twice keeps its last settings, as HF does */
		for (k = 0; k < t->n_added; k++)
			if (t->added[k].len == json_string_length(c) &&
			    !memcmp(t->added[k].content, json_string_value(c), t->added[k].len))
				break;
		if (k < t->n_added) {
			free(t->added[k].content);
			a = &t->added[k];
			a->content = NULL;
			a->special = jbool(e, "special", false);
			a->single_word = jbool(e, "single_word", false);
			a->lstrip = jbool(e, "lstrip", false);
			a->rstrip = jbool(e, "rstrip", false);
			a->normalized = jbool(e, "normalized", !a->special);
			a->id = (int32_t)json_integer_value(id);
		} else {
			t->n_added++;
		}
		/* normalized tokens are matched in their normalized form */
		if (a->normalized && t->n_norm) {
			if (tok_normalize(t, json_string_value(c), json_string_length(c),
					  &a->content, &a->len))
				return -EINVAL;
		}
		if (!a->content) {
			a->len = json_string_length(c);
			a->content = malloc(a->len + 1);
			if (!a->content)
				return -ENOMEM;
			memcpy(a->content, json_string_value(c), a->len + 1);
		}
	}
	if (build_added_set(t, &t->raw_set, false) || build_added_set(t, &t->norm_set, true))
		return -ENOMEM;
	return 0;
}

/* "a b" or ["a", "b"] */
static int merge_parts(json_t *m, const char **a, size_t *na, const char **b, size_t *nb)
{
	if (json_is_string(m)) {
		const char *s = json_string_value(m), *sp = strchr(s, ' ');

		if (!sp || strchr(sp + 1, ' '))
			return -1;
		*a = s;
		*na = sp - s;
		*b = sp + 1;
		*nb = json_string_length(m) - *na - 1;
		return 0;
	}
	if (json_is_array(m) && json_array_size(m) == 2 &&
	    json_is_string(json_array_get(m, 0)) && json_is_string(json_array_get(m, 1))) {
		*a = json_string_value(json_array_get(m, 0));
		*na = json_string_length(json_array_get(m, 0));
		*b = json_string_value(json_array_get(m, 1));
		*nb = json_string_length(json_array_get(m, 1));
		return 0;
	}
	return -1;
}

static int load_model(struct sl_tokenizer *t, json_t *model)
{
	json_t *vocab, *merges, *v, *m;
	const char *type, *key;
	size_t arena = 0, i;
	char *ap;
	char cat[1024];

	if (!model || !json_is_object(model)) {
		sl_error("%s: no \"model\" object; is this a Hugging Face tokenizer.json?", t->path);
		return -EINVAL;
	}
	type = jstr(model, "type");
	if (type && strcmp(type, "BPE")) {
		sl_error("%s: model type \"%s\" is not supported: shardlm reads byte-level BPE "
			 "tokenizers (\"type\": \"BPE\")", t->path, type);
		return -EINVAL;
	}
	vocab = json_object_get(model, "vocab");
	merges = json_object_get(model, "merges");
	if (!json_is_object(vocab) || !json_is_array(merges)) {
		sl_error("%s: model needs a \"vocab\" object and a \"merges\" array (BPE)", t->path);
		return -EINVAL;
	}
	if (!json_is_null(json_object_get(model, "dropout")) &&
	    json_object_get(model, "dropout")) {
		sl_error("%s: BPE dropout is set; shardlm encodes deterministically (set \"dropout\": "
			 "null)", t->path);
		return -EINVAL;
	}
	if ((jstr(model, "continuing_subword_prefix") &&
	     *jstr(model, "continuing_subword_prefix")) ||
	    (jstr(model, "end_of_word_suffix") && *jstr(model, "end_of_word_suffix"))) {
		sl_error("%s: continuing_subword_prefix / end_of_word_suffix are not supported "
			 "(byte-level BPE has none)", t->path);
		return -EINVAL;
	}
	if (jbool(model, "byte_fallback", false)) {
		sl_error("%s: byte_fallback BPE is not supported (byte-level BPE needs none)",
			 t->path);
		return -EINVAL;
	}
	t->ignore_merges = jbool(model, "ignore_merges", false);

	json_object_foreach(vocab, key, v)
		arena += strlen(key) + 1;
	t->vocab_arena = malloc(arena + 1);
	if (!t->vocab_arena || str_map_init(&t->vocab, json_object_size(vocab) + 1))
		return -ENOMEM;
	ap = t->vocab_arena;
	json_object_foreach(vocab, key, v) {
		size_t n = strlen(key);

		if (!json_is_integer(v) || json_integer_value(v) < 0 ||
		    json_integer_value(v) > MAX_TOKEN_ID) {
			sl_error("%s: vocab entry \"%s\" needs an integer id in [0, %d]", t->path,
				 key, MAX_TOKEN_ID);
			return -EINVAL;
		}
		memcpy(ap, key, n + 1);
		str_map_put(&t->vocab, ap, n, (int32_t)json_integer_value(v));
		if (json_integer_value(v) >= t->vocab_size)
			t->vocab_size = (int)json_integer_value(v) + 1;
		ap += n + 1;
	}
	t->n_vocab = (int)json_object_size(vocab);

	if (pair_map_init(&t->merges, json_array_size(merges) + 1))
		return -ENOMEM;
	json_array_foreach(merges, i, m) {
		const char *a, *b;
		size_t na, nb;
		int32_t ia, ib, in;

		if (merge_parts(m, &a, &na, &b, &nb)) {
			sl_error("%s: merges[%zu] is neither \"A B\" nor [\"A\", \"B\"]", t->path, i);
			return -EINVAL;
		}
		ia = str_map_get(&t->vocab, a, na);
		ib = str_map_get(&t->vocab, b, nb);
		if (ia < 0 || ib < 0) {
			sl_error("%s: merges[%zu] names token \"%.*s\", which is not in the vocab; "
				 "the file is inconsistent (re-download it)", t->path, i,
				 ia < 0 ? (int)na : (int)nb, ia < 0 ? a : b);
			return -EINVAL;
		}
		if (na + nb >= sizeof(cat)) {
			sl_error("%s: merges[%zu] makes a %zu-byte token, too long", t->path, i,
				 na + nb);
			return -EINVAL;
		}
		memcpy(cat, a, na);
		memcpy(cat + na, b, nb);
		in = str_map_get(&t->vocab, cat, na + nb);
		if (in < 0) {
			sl_error("%s: merges[%zu] (\"%.*s\" + \"%.*s\") makes \"%.*s\", which is not "
				 "in the vocab; the file is inconsistent", t->path, i, (int)na, a,
				 (int)nb, b, (int)(na + nb), cat);
			return -EINVAL;
		}
		pair_map_put(&t->merges, ia, ib, (uint32_t)i, in);
	}
	return 0;
}

/* per-id strings and decoded bytes, after the vocabulary and the added tokens are known */
static int build_id_tables(struct sl_tokenizer *t)
{
	uint32_t e;
	int i, b;

	for (i = 0; i < t->n_added; i++)
		if (t->added[i].id >= t->vocab_size)
			t->vocab_size = t->added[i].id + 1;
	t->id_str = calloc(t->vocab_size, sizeof(*t->id_str));
	t->id_len = calloc(t->vocab_size, sizeof(*t->id_len));
	t->id_bytes = calloc(t->vocab_size, sizeof(*t->id_bytes));
	t->id_nbytes = calloc(t->vocab_size, sizeof(*t->id_nbytes));
	if (!t->id_str || !t->id_len || !t->id_bytes || !t->id_nbytes)
		return -ENOMEM;
	for (e = 0; e < t->vocab.n; e++) {
		t->id_str[t->vocab.val[e]] = t->vocab.key[e];
		t->id_len[t->vocab.val[e]] = t->vocab.klen[e];
	}
	/* an added token's content wins over a vocabulary string of the same id */
	for (i = 0; i < t->n_added; i++) {
		t->id_str[t->added[i].id] = t->added[i].content;
		t->id_len[t->added[i].id] = t->added[i].len;
	}
	for (i = 0; i < t->vocab_size; i++) {
		const char *s = t->id_str[i];
		size_t n = t->id_len[i], o = 0;
		utf8proc_ssize_t k;
		int32_t cp;
		char *out;

		if (!s)
			continue;
		out = malloc(n + 1);
		if (!out)
			return -ENOMEM;
		if (t->decoder_byte_level) {
			/* HF: a token with any character outside the alphabet decodes as its text */
			const char *p = s;

			while (p < s + n) {
				k = utf8proc_iterate((const utf8proc_uint8_t *)p, s + n - p, &cp);
				if (k <= 0 || (b = alphabet_byte(t, cp)) < 0)
					break;
				out[o++] = (char)b;
				p += k;
			}
			if (p < s + n) {
				memcpy(out, s, n);
				o = n;
			}
		} else {
			memcpy(out, s, n);
			o = n;
		}
		t->id_bytes[i] = out;
		t->id_nbytes[i] = o;
	}
	for (b = 0; b < 256; b++)
		t->byte_id[b] = str_map_get(&t->vocab, t->byte_chr[b], t->byte_chr_len[b]);
	return 0;
}

static int load_decoder(struct sl_tokenizer *t, json_t *d)
{
	const char *type;

	if (!d || json_is_null(d))
		return 0;
	type = jstr(d, "type");
	if (type && !strcmp(type, "ByteLevel")) {
		t->decoder_byte_level = true;
		return 0;
	}
	if (type && !strcmp(type, "Sequence")) {
		size_t i;
		json_t *e;

		json_array_foreach(json_object_get(d, "decoders"), i, e)
			if (load_decoder(t, e))
				return -EINVAL;
		return 0;
	}
	sl_error("%s: decoder \"%s\" is not supported (byte-level BPE decodes with ByteLevel)",
		 t->path, type ? type : "(no type)");
	return -EINVAL;
}

struct sl_tokenizer *sl_tokenizer_load(const char *path)
{
	struct sl_tokenizer *t;
	json_error_t jerr;
	json_t *root = NULL;
	struct stat st;
	char *buf;
	size_t n;
	int i;

	t = calloc(1, sizeof(*t));
	if (!t) {
		sl_error("%s: out of memory", path);
		return NULL;
	}
	if (!stat(path, &st) && S_ISDIR(st.st_mode))
		snprintf(t->path, sizeof(t->path), "%s/tokenizer.json", path);
	else
		snprintf(t->path, sizeof(t->path), "%s", path);
	for (i = 0; i < CACHE_STRIPES; i++)
		pthread_mutex_init(&t->cache[i].lock, NULL);
	build_byte_alphabet(t);

	buf = read_file(t->path, &n);
	if (!buf) {
		sl_error("%s: cannot read the tokenizer: %s; give a tokenizer.json or a model "
			 "directory holding one", t->path, strerror(errno ? errno : EIO));
		goto out_free;
	}
	t->hash = sl_hash64(buf, n, 0x746f6b656e697a65ull);
	root = json_loadb(buf, n, 0, &jerr);
	free(buf);
	if (!root) {
		sl_error("%s:%d:%d: the tokenizer is not valid JSON: %s", t->path, jerr.line,
			 jerr.column, jerr.text);
		goto out_free;
	}
	if (!json_is_object(root)) {
		sl_error("%s: the tokenizer must be a JSON object", t->path);
		goto out_free;
	}
	if (load_model(t, json_object_get(root, "model")) ||
	    load_normalizer(t, json_object_get(root, "normalizer")) ||
	    load_pretok(t, json_object_get(root, "pre_tokenizer")) ||
	    load_decoder(t, json_object_get(root, "decoder")) ||
	    load_added(t, json_object_get(root, "added_tokens")) ||
	    build_id_tables(t))
		goto out_free;
	if (t->byte_level) {
		for (i = 0; i < 256; i++) {
			if (t->byte_id[i] < 0) {
				sl_error("%s: byte 0x%02x's character is not in the vocab; a byte-level "
					 "BPE vocab holds all 256", t->path, i);
				goto out_free;
			}
		}
	}
	json_decref(root);
	return t;

out_free:
	json_decref(root);
	sl_tokenizer_free(t);
	return NULL;
}

void sl_tokenizer_free(struct sl_tokenizer *t)
{
	int i, j;

	if (!t)
		return;
	for (i = 0; i < CACHE_STRIPES; i++) {
		if (t->cache[i].slot)
			for (j = 0; j < CACHE_SLOTS; j++)
				free(t->cache[i].slot[j].blob);
		free(t->cache[i].slot);
		pthread_mutex_destroy(&t->cache[i].lock);
	}
	for (i = 0; i < t->n_pre; i++)
		pcre2_code_free(t->pre[i].re);
	for (i = 0; i < t->n_added; i++)
		free(t->added[i].content);
	free(t->added);
	free(t->raw_set.idx);
	free(t->norm_set.idx);
	if (t->id_bytes)
		for (i = 0; i < t->vocab_size; i++)
			free(t->id_bytes[i]);
	free(t->id_bytes);
	free(t->id_nbytes);
	free(t->id_str);
	free(t->id_len);
	free(t->merges.e);
	str_map_free(&t->vocab);
	free(t->vocab_arena);
	free(t);
}
