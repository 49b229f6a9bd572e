/*
 * test_tokenizer QWEN3_TOKENIZER_JSON LLAMA3_TOKENIZER_JSON (run by test_tokenizer.sh, which
 * fetches both): parity with Hugging Face tokenizers on the committed goldens
 * (test/fixtures/tokenizer, made by gen_goldens.py with tokenizers 0.23), decoding round trips,
 * a 100k-character word, errors of broken tokenizer files, the text cache (reuse, ranks' parts,
 * skip counts) and invalid UTF-8 named by file:line.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>
#include <utf8proc.h>

#include "data.h"
#include "log.h"
#include "testutil.h"
#include "tokenizer.h"

static char tmpdir[256];

/* every line of a JSONL file, parsed */
static json_t *read_jsonl(const char *path)
{
	json_t *arr = json_array();
	char *line = NULL;
	size_t cap = 0;
	FILE *f = fopen(path, "r");

	CHECK(f, "cannot open %s", path);
	if (!f)
		return arr;
	while (getline(&line, &cap, f) > 0) {
		json_error_t e;
		json_t *j = json_loads(line, JSON_DECODE_ANY | JSON_ALLOW_NUL, &e);

		CHECK(j, "%s: %s", path, e.text);
		if (j)
			json_array_append_new(arr, j);
	}
	free(line);
	fclose(f);
	return arr;
}

static char *fixture(const char *name)
{
	static char buf[8][1024];
	static int k;

	k = (k + 1) % 8;
	snprintf(buf[k], sizeof(buf[k]), "%s/test/fixtures/tokenizer/%s", test_srcdir(), name);
	return buf[k];
}

/* encode every string of @texts and compare with @golden; returns mismatches */
static int parity(struct sl_tokenizer *tok, json_t *texts, json_t *golden, bool split,
		  const char *what)
{
	size_t i, n = json_array_size(golden), cap = 0;
	int32_t *ids = NULL;
	int bad = 0;

	CHECK(n > 0 && n <= json_array_size(texts), "%s: %zu goldens", what, n);
	for (i = 0; i < n; i++) {
		json_t *s = json_array_get(texts, i), *g = json_array_get(golden, i);
		int k, m = sl_tokenizer_encode(tok, json_string_value(s), json_string_length(s),
					       split, &ids, &cap);
		bool same = m == (int)json_array_size(g);

		for (k = 0; same && k < m; k++)
			same = ids[k] == json_integer_value(json_array_get(g, k));
		if (!same) {
			if (bad < 5)
				fprintf(stderr, "%s: line %zu differs from Hugging Face (%d ids, "
					"expected %zu): %.80s\n", what, i + 1, m,
					json_array_size(g), json_string_value(s));
			bad++;
		}
	}
	CHECK(bad == 0, "%s: %d of %zu differ from Hugging Face tokenizers", what, bad, n);
	printf("%s: %zu of %zu identical to Hugging Face\n", what, n - bad, n);
	free(ids);
	return bad;
}

/* decode(encode(s)): the original (no normalizer) or Hugging Face's own decode (NFC) */
static void round_trip(struct sl_tokenizer *tok, json_t *texts, json_t *expect, const char *what)
{
	size_t i, cap = 0, n = json_array_size(texts);
	int32_t *ids = NULL;
	int bad = 0;

	for (i = 0; i < n; i++) {
		json_t *s = json_array_get(texts, i);
		json_t *e = expect ? json_array_get(expect, i) : s;
		char *out = NULL;
		size_t len = 0;
		int m = sl_tokenizer_encode(tok, json_string_value(s), json_string_length(s), false,
					    &ids, &cap);

		if (m < 0 || sl_tokenizer_decode(tok, ids, m, &out, &len) ||
		    len != json_string_length(e) || memcmp(out, json_string_value(e), len)) {
			if (bad < 5)
				fprintf(stderr, "%s: line %zu does not round-trip: %.80s\n", what,
					i + 1, json_string_value(s));
			bad++;
		}
		free(out);
	}
	CHECK(bad == 0, "%s: %d of %zu do not round-trip", what, bad, n);
	free(ids);
}

static void test_parity(const char *qwen, const char *llama)
{
	struct sl_tokenizer *q = sl_tokenizer_load(qwen), *l = sl_tokenizer_load(llama);
	json_t *corpus = read_jsonl(fixture("corpus.jsonl")), *docs = read_jsonl(fixture("docs.jsonl"));
	json_t *g;

	CHECK(q && l, "the Qwen3 and Llama 3 tokenizers load");
	if (!q || !l)
		goto out;
	CHECK(json_array_size(corpus) >= 2000 && json_array_size(docs) >= 200, "corpus sizes");
	CHECK(sl_tokenizer_vocab_size(q) == 151669, "Qwen3 ids: %d", sl_tokenizer_vocab_size(q));
	CHECK(sl_tokenizer_token_to_id(q, "<|im_end|>") == 151645, "<|im_end|> id");
	CHECK(sl_tokenizer_token_to_id(q, "<|endoftext|>") == 151643, "<|endoftext|> id");
	CHECK(sl_tokenizer_token_to_id(q, "no such token") == -1, "unknown token");

	g = read_jsonl(fixture("qwen3-corpus.ids.jsonl"));
	parity(q, corpus, g, false, "qwen3 corpus");
	json_decref(g);
	g = read_jsonl(fixture("qwen3-corpus-split.ids.jsonl"));
	parity(q, corpus, g, true, "qwen3 corpus --split-special");
	json_decref(g);
	g = read_jsonl(fixture("qwen3-docs.ids.jsonl"));
	parity(q, docs, g, false, "qwen3 documents");
	json_decref(g);
	g = read_jsonl(fixture("llama3-corpus.ids.jsonl"));
	parity(l, corpus, g, false, "llama3 corpus");
	json_decref(g);
	g = read_jsonl(fixture("llama3-docs.ids.jsonl"));
	parity(l, docs, g, false, "llama3 documents");
	json_decref(g);

	/* Qwen3 normalizes (NFC): its round trip is HF's decode; Llama 3's is the text itself */
	g = read_jsonl(fixture("qwen3-corpus.decoded.jsonl"));
	round_trip(q, corpus, g, "qwen3 decode");
	json_decref(g);
	round_trip(l, corpus, NULL, "llama3 decode");
	round_trip(l, docs, NULL, "llama3 decode documents");

	/* one 100k-character word: merges by heap, not quadratic; exact decode */
	{
		size_t n = 100000, i, cap = 0, len;
		char *w = malloc(n + 1), *out = NULL;
		int32_t *ids = NULL;
		double t0;
		int m;
		uint64_t x = 1;

		for (i = 0; i < n; i++) {
			x = x * 6364136223846793005ull + 1442695040888963407ull;
			w[i] = (char)('a' + (x >> 33) % 26);
		}
		w[n] = 0;
		t0 = sl_now();
		m = sl_tokenizer_encode(q, w, n, false, &ids, &cap);
		CHECK(m > 10000, "100k word: %d ids", m);
		CHECK(sl_now() - t0 < 5.0, "100k word took %.2f s", sl_now() - t0);
		CHECK(m > 0 && !sl_tokenizer_decode(q, ids, m, &out, &len) && len == n &&
		      !memcmp(out, w, n), "100k word round-trips");
		memset(w, 'a', n);
		t0 = sl_now();
		m = sl_tokenizer_encode(q, w, n, false, &ids, &cap);
		CHECK(m > 0 && sl_now() - t0 < 5.0, "100k 'a's: %d ids in %.2f s", m,
		      sl_now() - t0);
		free(out);
		free(ids);
		free(w);
	}
	/* invalid UTF-8 is refused */
	{
		int32_t *ids = NULL;
		size_t cap = 0;

		CHECK(sl_tokenizer_encode(q, "ab\xff", 3, false, &ids, &cap) == -EILSEQ,
		      "invalid UTF-8");
		free(ids);
	}
out:
	json_decref(corpus);
	json_decref(docs);
	sl_tokenizer_free(q);
	sl_tokenizer_free(l);
}

/* sl_tokenizer_load(@json) must fail and print every string of @want */
static void expect_load_error(const char *name, const char *json, const char *want1,
			      const char *want2)
{
	char path[512], err[512], msg[4096] = "";
	struct sl_tokenizer *t;
	int fd, saved;
	FILE *f;
	size_t n;

	snprintf(path, sizeof(path), "%s/%s.json", tmpdir, name);
	snprintf(err, sizeof(err), "%s/%s.err", tmpdir, name);
	f = fopen(path, "w");
	fputs(json, f);
	fclose(f);
	fflush(stderr);
	saved = dup(2);
	fd = open(err, O_WRONLY | O_CREAT | O_TRUNC, 0644);
	dup2(fd, 2);
	t = sl_tokenizer_load(path);
	fflush(stderr);
	dup2(saved, 2);
	close(saved);
	close(fd);
	f = fopen(err, "r");
	n = fread(msg, 1, sizeof(msg) - 1, f);
	msg[n] = 0;
	fclose(f);
	CHECK(!t, "%s: loaded", name);
	sl_tokenizer_free(t);
	CHECK(strstr(msg, path), "%s: the error names the file: %s", name, msg);
	CHECK(strstr(msg, want1), "%s: the error says '%s': %s", name, want1, msg);
	CHECK(!want2 || strstr(msg, want2), "%s: the error says '%s': %s", name, want2, msg);
}

#define MINI_VOCAB "{\"a\": 0, \"b\": 1, \"ab\": 2}"

static void test_bad_files(void)
{
	expect_load_error("broken", "{\"model\": {\"type\": \"BPE\", ", "not valid JSON", NULL);
	expect_load_error("nomodel", "{\"version\": \"1.0\", \"added_tokens\": []}",
			  "no \"model\"", NULL);
	expect_load_error("unigram", "{\"model\": {\"type\": \"Unigram\", \"vocab\": []}}",
			  "\"Unigram\" is not supported", "BPE");
	expect_load_error("badmerge", "{\"model\": {\"type\": \"BPE\", \"vocab\": " MINI_VOCAB
			  ", \"merges\": [\"a b\", \"a zz\"]}}", "merges[1]", "\"zz\"");
	expect_load_error("badmerge2", "{\"model\": {\"type\": \"BPE\", \"vocab\": " MINI_VOCAB
			  ", \"merges\": [[\"b\", \"a\"]]}}", "\"ba\"", "not in the vocab");
	expect_load_error("badregex", "{\"model\": {\"type\": \"BPE\", \"vocab\": " MINI_VOCAB
			  ", \"merges\": []}, \"pre_tokenizer\": {\"type\": \"Split\", "
			  "\"pattern\": {\"Regex\": \"(a\"}, \"behavior\": \"Isolated\"}}",
			  "does not compile", NULL);
	expect_load_error("empty", "", "not valid JSON", NULL);
	{
		/* a tiny tokenizer, both merge spellings, loads and merges */
		char path[512];
		struct sl_tokenizer *t;
		int32_t *ids = NULL;
		size_t cap = 0;
		FILE *f;

		snprintf(path, sizeof(path), "%s/mini.json", tmpdir);
		f = fopen(path, "w");
		fputs("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"ab\": 2, "
		      "\"abab\": 3}, \"merges\": [\"a b\", [\"ab\", \"ab\"]]}}", f);
		fclose(f);
		t = sl_tokenizer_load(path);
		CHECK(t, "mini tokenizer loads");
		if (t) {
			int n = sl_tokenizer_encode(t, "ababa", 5, false, &ids, &cap);

			CHECK(n == 2 && ids[0] == 3 && ids[1] == 0, "mini: ababa -> [3, 0] (%d)", n);
		}
		free(ids);
		sl_tokenizer_free(t);
	}
}

static void write_file(const char *path, const char *s)
{
	FILE *f = fopen(path, "w");

	fputs(s, f);
	fclose(f);
}

static bool same_data(const struct sl_dataset *a, const struct sl_dataset *b)
{
	int i;

	if (a->n != b->n || a->pool_len != b->pool_len || a->total != b->total ||
	    a->dropped != b->dropped || a->skipped != b->skipped)
		return false;
	for (i = 0; i < a->n; i++)
		if (a->rec[i].len != b->rec[i].len || a->rec[i].line != b->rec[i].line ||
		    !(a->rec[i].label == b->rec[i].label) ||
		    memcmp(a->rec[i].ids, b->rec[i].ids, a->rec[i].len * sizeof(int32_t)))
			return false;
	return true;
}

static void test_cache(const char *qwen)
{
	struct sl_tokenizer *t = sl_tokenizer_load(qwen), *t2;
	struct sl_dataset d1, d2, d3;
	struct sl_data_opts o = { .need_label = true, .max_state = 4000 };
	char data[512], cdir[512], cdir2[512], cache[1024], bad[512], msg[4096] = "";
	int32_t *ids = NULL;
	size_t cap = 0;
	int p, rc, fd, saved;
	FILE *f;
	size_t n;

	CHECK(t, "tokenizer loads");
	if (!t)
		return;
	snprintf(data, sizeof(data), "%s/filings.jsonl", tmpdir);
	snprintf(cdir, sizeof(cdir), "%s/cache", tmpdir);
	snprintf(cdir2, sizeof(cdir2), "%s/cache2", tmpdir);
	/* the bundled sample, as the demo trains on it */
	{
		char src[1024], cmd[2200];

		snprintf(src, sizeof(src), "%s/conf/demo/filings-valid.jsonl", test_srcdir());
		snprintf(cmd, sizeof(cmd), "cp '%s' '%s'", src, data);
		CHECK(system(cmd) == 0, "copy %s", src);
	}
	o.tokenizer = t;
	o.cache_dir = cdir;
	rc = sl_data_load(&d1, data, &o);
	CHECK(rc == 0 && d1.n > 50 && !d1.from_cache, "first load tokenizes (%d, %d)", rc, d1.n);
	CHECK(sl_data_cache_path(data, &o, cache, sizeof(cache)) == 0 && access(cache, R_OK) == 0,
	      "the cache file exists: %s", cache);
	/* the same ids as encoding the text directly */
	if (rc == 0) {
		json_t *recs = read_jsonl(data), *r = json_array_get(recs, 0);
		int m = sl_tokenizer_encode(t, json_string_value(json_object_get(r, "text")),
					    json_string_length(json_object_get(r, "text")), false,
					    &ids, &cap);

		CHECK(m == d1.rec[0].len && !memcmp(ids, d1.rec[0].ids, m * sizeof(*ids)),
		      "record 1's ids are the tokenizer's");
		CHECK(d1.rec[0].label == (float)json_number_value(json_object_get(r, "label")),
		      "record 1's label");
		json_decref(recs);
	}

	/* a later run (a fresh tokenizer, so nothing is in memory) reads the cache: no BPE */
	t2 = sl_tokenizer_load(qwen);
	o.tokenizer = t2;
	rc = sl_data_load(&d2, data, &o);
	CHECK(rc == 0 && d2.from_cache, "second load reads the cache");
	CHECK(sl_tokenizer_bpe_count(t2) == 0, "second load ran BPE %llu times",
	      (unsigned long long)sl_tokenizer_bpe_count(t2));
	CHECK(rc == 0 && same_data(&d1, &d2), "cached records are identical");
	sl_data_free(&d2);

	/* another max_state uses the same cache */
	o.max_state = 1000;
	rc = sl_data_load(&d2, data, &o);
	CHECK(rc == 0 && d2.from_cache && d2.dropped > 0 && d2.n + d2.dropped == d1.n,
	      "max_state 1000 from the cache: %d kept, %ld dropped", d2.n, d2.dropped);
	sl_data_free(&d2);
	o.max_state = 4000;

	/* three ranks' parts, then the merge gives the same dataset */
	o.cache_dir = cdir2;
	for (p = 0; p < 3; p++)
		CHECK(sl_data_tokenize_part(data, &o, p, 3) == 0, "part %d of 3", p);
	rc = sl_data_load(&d3, data, &o);
	CHECK(rc == 0 && !d3.from_cache && same_data(&d1, &d3), "parts merge to the same records");
	sl_data_free(&d3);
	rc = sl_data_load(&d3, data, &o);
	CHECK(rc == 0 && d3.from_cache && same_data(&d1, &d3), "merged cache reused");
	sl_data_free(&d3);
	/* a changed data file is a new key: tokenized again */
	f = fopen(data, "a");
	fputs("{\"text\": \"one more filing\", \"label\": 0.5}\n", f);
	fclose(f);
	rc = sl_data_load(&d3, data, &o);
	CHECK(rc == 0 && !d3.from_cache && d3.n == d1.n + 1, "changed data is tokenized again");
	sl_data_free(&d3);
	sl_data_free(&d1);

	/* invalid UTF-8 on line 3: FILE:3 named; with skip, counted */
	snprintf(bad, sizeof(bad), "%s/bad.jsonl", tmpdir);
	write_file(bad, "{\"text\": \"fine\", \"label\": 0.1}\n\n"
		   "{\"text\": \"bad \xff\xfe here\", \"label\": 0.2}\n"
		   "{\"text\": \"also fine\", \"label\": 0.3}\n");
	o.cache_dir = cdir;
	fflush(stderr);
	saved = dup(2);
	snprintf(cache, sizeof(cache), "%s/bad.err", tmpdir);
	fd = open(cache, O_WRONLY | O_CREAT | O_TRUNC, 0644);
	dup2(fd, 2);
	rc = sl_data_load(&d3, bad, &o);
	fflush(stderr);
	dup2(saved, 2);
	close(saved);
	close(fd);
	f = fopen(cache, "r");
	n = fread(msg, 1, sizeof(msg) - 1, f);
	msg[n] = 0;
	fclose(f);
	snprintf(cache, sizeof(cache), "%s:3:", bad);
	CHECK(rc < 0 && strstr(msg, cache) && strstr(msg, "UTF-8"),
	      "invalid UTF-8 names FILE:3: %s", msg);
	o.skip_errors = true;
	rc = sl_data_load(&d3, bad, &o);
	CHECK(rc == 0 && d3.n == 2 && d3.skipped == 1 && d3.rec[1].line == 4,
	      "skip: 2 kept, 1 skipped (%d, %d, %ld)", rc, d3.n, d3.skipped);
	sl_data_free(&d3);

	free(ids);
	sl_tokenizer_free(t2);
	sl_tokenizer_free(t);
}

int main(int argc, char **argv)
{
	char cmd[512];

	if (argc != 3) {
		fprintf(stderr, "usage: test_tokenizer QWEN3_TOKENIZER_JSON LLAMA3_TOKENIZER_JSON\n");
		return 2;
	}
	sl_log_init();
	snprintf(tmpdir, sizeof(tmpdir), "/tmp/sl-tok-XXXXXX");
	if (!mkdtemp(tmpdir))
		return 2;
	test_parity(argv[1], argv[2]);
	test_bad_files();
	test_cache(argv[1]);
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmpdir);
	if (system(cmd))
		fprintf(stderr, "cannot remove %s\n", tmpdir);
	return test_exit("test_tokenizer");
}
