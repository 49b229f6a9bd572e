/*
 * test_chat: chat templates (chat.c) and SFT records (data_chat.c) on the real Qwen3 tokenizer.
 *
 *   test_chat TOKENIZER_DIR            everything but the Hugging Face goldens
 *   test_chat TOKENIZER_DIR --goldens  parity with fixtures/chat/goldens.jsonl (written by
 *                                      gen_chat_goldens.py with transformers); 77 while absent
 *
 * References, none from the code under test: Python's json.dumps (tojson values below), the
 * template rendered by jinja2 configured as transformers does (fixtures/chat/rendered.jsonl),
 * HF's own tokenization of that text (the tokenizer module, itself checked against HF goldens:
 * apply_chat_template tokenizes its rendered text exactly so), ids and masks worked out by hand
 * from tokenizer.json's vocabulary, and target spans found by scanning the reference text for
 * "<|im_start|>assistant\n" ... "<|im_end|>".
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>
#include <utf8proc.h>

#include "chat.h"
#include "data.h"
#include "tokenizer.h"
#include "testutil.h"
#include "tmpfiles.h"

#define IM_START 151644
#define IM_END 151645
#define ENDOFTEXT 151643

static struct sl_tokenizer *tok;
static struct sl_chat *chat;
static const char *tokdir;

static json_t *jparse(const char *s)
{
	json_error_t e;
	json_t *j = json_loads(s, 0, &e);

	if (!j) {
		fprintf(stderr, "test_chat: bad JSON in the test: %s: %s\n", e.text, s);
		exit(2);
	}
	return j;
}

/* ---- tojson --------------------------------------------------------------------------------- */

static void test_tojson(void)
{
	/* the right-hand sides are what Python 3's json.dumps(json.loads(in), ensure_ascii=False)
	 * prints */
	static const char *const cases[][2] = {
		{ "{\"x\": [1, 2.5, 1e-05, 1e+20, 0.1, -0.0, 100.0, 1e16, 1e15, 0.0001, 123.456e-10, "
		  "5e-324, 1.7976931348623157e308, 4611686018427387904, -7, 0.3333333333333333]}",
		  "{\"x\": [1, 2.5, 1e-05, 1e+20, 0.1, -0.0, 100.0, 1e+16, 1000000000000000.0, "
		  "0.0001, 1.23456e-08, 5e-324, 1.7976931348623157e+308, 4611686018427387904, -7, "
		  "0.3333333333333333]}" },
		{ "{\"s\": \"a\\\"b\\\\c/d\\n\\r\\t\\b\\f\\u0001\\u001f\\u007f \\u00e9 \\ud83d\\ude00 "
		  "\\u2028\"}",
		  "{\"s\": \"a\\\"b\\\\c/d\\n\\r\\t\\b\\f\\u0001\\u001f\x7f \xc3\xa9 \xf0\x9f\x98\x80 "
		  "\xe2\x80\xa8\"}" },
		{ "{\"b\": 1, \"a\": {}, \"c\": [], \"d\": [true, false, null, {\"z\": 1.0}]}",
		  "{\"b\": 1, \"a\": {}, \"c\": [], \"d\": [true, false, null, {\"z\": 1.0}]}" },
		{ "{\"e\": 1E2, \"f\": 12345678901234567.0, \"g\": 0.000123}",
		  "{\"e\": 100.0, \"f\": 1.2345678901234568e+16, \"g\": 0.000123}" },
	};
	size_t i;

	for (i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		json_t *j = jparse(cases[i][0]);
		char *out = NULL;
		size_t n = 0;

		CHECK(sl_chat_tojson(j, &out, &n) == 0);
		CHECK(out && n == strlen(cases[i][1]) && !strcmp(out, cases[i][1]),
		      "tojson case %zu:\n got  %s\n want %s", i, out, cases[i][1]);
		free(out);
		json_decref(j);
	}
}

/* ---- loading and refusing templates --------------------------------------------------------- */

static void test_templates(void)
{
	char path[600], *cfg_text, *tmpl, msg[2048], *err = NULL;
	json_t *cfg, *msgs;
	struct sl_chat *ct;
	int32_t *ids = NULL;
	uint8_t *mask = NULL;
	size_t cap = 0;
	FILE *f;
	int rc;

	CHECK(sl_chat_known(chat), "the Qwen3 template of %s is not recognized", tokdir);
	CHECK(!strcmp(sl_chat_name(chat), "qwen3"));

	snprintf(path, sizeof(path), "%s/tokenizer_config.json", tokdir);
	cfg_text = test_slurp(path);
	cfg = jparse(cfg_text);
	tmpl = strdup(json_string_value(json_object_get(cfg, "chat_template")));

	/* chat_template.jinja (as newer transformers save it, with a final newline) wins */
	snprintf(path, sizeof(path), "%s/jinja", tmpdir);
	mkdir(path, 0777);
	snprintf(path, sizeof(path), "%s/jinja/chat_template.jinja", tmpdir);
	f = fopen(path, "w");
	fprintf(f, "%s\n", tmpl);
	fclose(f);
	write_file("jinja/tokenizer_config.json", "{\"chat_template\": \"{{ messages }}\"}");
	snprintf(path, sizeof(path), "%s/jinja", tmpdir);
	ct = NULL;
	CHECK(sl_chat_load(path, &ct) == 0 && sl_chat_known(ct));
	sl_chat_free(ct);

	/* one character changed: unknown, loads, refuses to render naming the file and qwen3 */
	tmpl[strlen(tmpl) - 3] ^= 1;
	json_object_set_new(cfg, "chat_template", json_string(tmpl));
	snprintf(path, sizeof(path), "%s/unknown", tmpdir);
	mkdir(path, 0777);
	snprintf(path, sizeof(path), "%s/unknown/tokenizer_config.json", tmpdir);
	json_dump_file(cfg, path, 0);
	snprintf(path, sizeof(path), "%s/unknown/tokenizer.json", tmpdir);
	ct = NULL;
	CHECK(sl_chat_load(path, &ct) == 0 && ct && !sl_chat_known(ct));
	CHECK(!strcmp(sl_chat_name(ct), "unknown"));
	msgs = jparse("[{\"role\": \"user\", \"content\": \"hi\"}, "
		      "{\"role\": \"assistant\", \"content\": \"yo\"}]");
	rc = sl_chat_encode(ct, tok, msgs, NULL, false, &ids, &mask, &cap, &err);
	CHECK(rc == -ENOTSUP && err && strstr(err, "unknown/tokenizer_config.json") &&
	      strstr(err, "qwen3") && strstr(err, "loss_mask"), "refusal: %s", err);
	sl_chat_refusal(ct, msg, sizeof(msg));
	CHECK(err && !strcmp(msg, err));
	free(err);
	err = NULL;
	sl_chat_free(ct);

	/* no template at all: NULL, and rendering with none refuses */
	write_file("unknown/tokenizer_config.json", "{\"eos_token\": \"<|im_end|>\"}");
	snprintf(path, sizeof(path), "%s/unknown", tmpdir);
	ct = (struct sl_chat *)1;
	CHECK(sl_chat_load(path, &ct) == 0 && ct == NULL);
	rc = sl_chat_encode(NULL, tok, msgs, NULL, false, &ids, &mask, &cap, &err);
	CHECK(rc < 0 && err && strstr(err, "no chat template"), "%s", err);
	free(err);
	err = NULL;
	/* a broken tokenizer_config.json is an error naming it */
	write_file("unknown/tokenizer_config.json", "{\"chat_template\": ");
	CHECK(sl_chat_load(path, &ct) < 0);

	json_decref(msgs);
	json_decref(cfg);
	free(tmpl);
	free(cfg_text);
	free(ids);
	free(mask);
}

/* ---- targets found in a reference rendering ------------------------------------------------- */

/*
 * The decoded runs of mask-1 tokens must be exactly the assistant spans of @text: from after
 * "<|im_start|>assistant\n" through the next "<|im_end|>".  A run may start with the "\n" of
 * "assistant\n" when the content opens with whitespace (a token straddling the start: chat.h).
 */
static void check_targets(const char *what, const char *text, const int32_t *ids,
			  const uint8_t *mask, int n)
{
	const char *open = "<|im_start|>assistant\n", *p = text;
	int t = 0, spans = 0;

	CHECK(n > 0 && mask[0] == 0, "%s: mask[0] must be 0", what);
	while ((p = strstr(p, open))) {
		const char *s = p + strlen(open), *e = strstr(s, "<|im_end|>");
		size_t want = e ? (size_t)(e - s) + strlen("<|im_end|>") : 0;
		char *run = NULL;
		size_t rl = 0;
		int a;

		if (!e)
			break;
		while (t < n && !mask[t])
			t++;
		for (a = t; t < n && mask[t]; t++)
			;
		CHECK(t > a, "%s: assistant span %d has no target tokens", what, spans);
		if (t > a && sl_tokenizer_decode(tok, ids + a, t - a, &run, &rl) == 0) {
			/* the tokenizer's normalizer (NFC) has composed what the text decomposes */
			utf8proc_uint8_t *nfc = NULL;
			utf8proc_ssize_t nn = utf8proc_map((const utf8proc_uint8_t *)s, want, &nfc,
							   UTF8PROC_STABLE | UTF8PROC_COMPOSE);
			const char *sp = nn >= 0 ? (const char *)nfc : s;
			size_t sn = nn >= 0 ? (size_t)nn : want;
			bool exact = rl == sn && !memcmp(run, sp, sn);
			bool straddle = rl == sn + 1 && run[0] == '\n' && (sp[0] == '\n' ||
				sp[0] == ' ') && !memcmp(run + 1, sp, sn);

			CHECK(exact || straddle, "%s: target run %d is \"%.*s\", the span \"%.*s\"",
			      what, spans, (int)rl, run, (int)sn, sp);
			free(nfc);
		}
		free(run);
		spans++;
		p = e;
	}
	while (t < n && !mask[t])
		t++;
	CHECK(t == n, "%s: targets after the last assistant span (token %d)", what, t);
}

/* ---- the corpus against the jinja2 reference ------------------------------------------------- */

static json_t *read_jsonl(const char *path, size_t *n)
{
	json_t *arr = json_array();
	char *line = NULL;
	size_t cap = 0;
	FILE *f = fopen(path, "r");

	*n = 0;
	if (!f)
		return arr;
	while (getline(&line, &cap, f) > 0)
		if (line[0] == '{')
			json_array_append_new(arr, jparse(line));
	free(line);
	fclose(f);
	*n = json_array_size(arr);
	return arr;
}

static void fixture(char *buf, size_t n, const char *name)
{
	snprintf(buf, n, "%s/test/fixtures/chat/%s", test_srcdir(), name);
}

/* each conversation: text == @ref's text; ids and masks (against @ref ids when given) */
static void test_corpus(const char *ref_name, bool have_ids)
{
	char path[600];
	size_t nc, nr, i;
	json_t *corpus, *ref;
	int32_t *ids = NULL, *want = NULL;
	uint8_t *mask = NULL;
	size_t cap = 0, wcap = 0;

	fixture(path, sizeof(path), "conversations.jsonl");
	corpus = read_jsonl(path, &nc);
	fixture(path, sizeof(path), ref_name);
	ref = read_jsonl(path, &nr);
	CHECK(nc >= 12 && nr == nc, "%zu conversations, %zu references in %s", nc, nr, path);
	for (i = 0; i < nc && i < nr; i++) {
		json_t *rec = json_array_get(corpus, i), *r = json_array_get(ref, i);
		json_t *msgs, *tools, *jids = json_object_get(r, "input_ids"), *e;
		const char *id = json_string_value(json_object_get(rec, "id"));
		const char *text = json_string_value(json_object_get(r, "text"));
		char *got = NULL, *err = NULL;
		size_t len = 0, k;
		int n, m;

		CHECK(sl_chat_record(rec, &msgs, &tools, &err) == 0, "%s: %s", id, err);
		if (sl_chat_render(chat, msgs, tools, false, &got, &len, &err)) {
			CHECK(0, "%s: render: %s", id, err);
		} else {
			CHECK(text && len == strlen(text) && !strcmp(got, text),
			      "%s: rendering differs from %s:\n got  %s\n want %s", id, ref_name,
			      got, text);
		}
		n = sl_chat_encode(chat, tok, msgs, tools, false, &ids, &mask, &cap, &err);
		CHECK(n > 0, "%s: encode: %s", id, err);
		if (have_ids) {
			CHECK(json_array_size(jids) == (size_t)n, "%s: %d ids, HF %zu", id, n,
			      json_array_size(jids));
			json_array_foreach(jids, k, e)
				if (k < (size_t)n && ids[k] != json_integer_value(e)) {
					CHECK(0, "%s: id %zu is %d, HF %lld", id, k, ids[k],
					      (long long)json_integer_value(e));
					break;
				}
		} else if (text) {
			/* HF's apply_chat_template = HF's tokenizer on the rendered text */
			m = sl_tokenizer_encode(tok, text, strlen(text), false, &want, &wcap);
			CHECK(m == n && !memcmp(want, ids, n * sizeof(*ids)),
			      "%s: ids differ from tokenizing the reference text", id);
		}
		if (n > 0 && text)
			check_targets(id, text, ids, mask, n);
		free(got);
		free(err);
		json_decref(msgs);
		json_decref(tools);
	}
	json_decref(corpus);
	json_decref(ref);
	free(ids);
	free(want);
	free(mask);
}

/* ---- hand-checked ids and masks ------------------------------------------------------------- */

static void test_by_hand(void)
{
	/*
	 * "<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
	 * "Hi there. How can I help?<|im_end|>\n": ids from tokenizer.json's vocabulary ("user"
	 * 872, "\n" 198 (Ċ), "Hello" 9707, "!" 0, "assistant" 77091, <think> 151667, "\n\n" 271,
	 * </think> 151668, "Hi" 13048, " there" 1052, "." 13, " How" 2585, " can" 646, " I" 358,
	 * " help" 1492, "?" 30); targets <think> (10) through <|im_end|> (22).
	 */
	static const int32_t want[] = { IM_START, 872, 198, 9707, 0, IM_END, 198, IM_START, 77091,
					198, 151667, 271, 151668, 271, 13048, 1052, 13, 2585, 646,
					358, 1492, 30, IM_END, 198 };
	json_t *msgs = jparse("[{\"role\": \"user\", \"content\": \"Hello!\"}, {\"role\": "
			      "\"assistant\", \"content\": \"Hi there. How can I help?\"}]");
	/* an earlier turn without reasoning: "<|im_start|>assistant\nHi<|im_end|>" */
	json_t *two = jparse("[{\"role\": \"user\", \"content\": \"Hello!\"}, {\"role\": "
			     "\"assistant\", \"content\": \"Hi\"}, {\"role\": \"user\", \"content\": "
			     "\"Hello!\"}, {\"role\": \"assistant\", \"content\": \"Hi\"}]");
	int32_t *ids = NULL;
	uint8_t *mask = NULL;
	size_t cap = 0;
	char *err = NULL;
	int n, t;

	n = sl_chat_encode(chat, tok, msgs, NULL, false, &ids, &mask, &cap, &err);
	CHECK(n == 24, "%d tokens: %s", n, err);
	for (t = 0; t < n && t < 24; t++) {
		CHECK(ids[t] == want[t], "token %d: %d, by hand %d", t, ids[t], want[t]);
		CHECK(mask[t] == (t >= 10 && t <= 22), "mask[%d] = %d", t, mask[t]);
	}
	/* the first assistant turn (before the last query) is "assistant", "\n", "Hi", im_end */
	n = sl_chat_encode(chat, tok, two, NULL, false, &ids, &mask, &cap, &err);
	CHECK(n == 7 + 6 + 7 + 10, "%d tokens", n);
	if (n >= 13) {
		CHECK(ids[7] == IM_START && ids[8] == 77091 && ids[9] == 198 && ids[10] == 13048 &&
		      ids[11] == IM_END && ids[12] == 198);
		CHECK(!mask[7] && !mask[8] && !mask[9] && mask[10] && mask[11] && !mask[12]);
	}
	free(ids);
	free(mask);
	json_decref(msgs);
	json_decref(two);
}

/* ---- keep_reasoning -------------------------------------------------------------------------- */

static void test_keep_reasoning(void)
{
	/* the template drops the first two think blocks; keep_reasoning keeps them */
	json_t *msgs = jparse(
		"[{\"role\": \"system\", \"content\": \"Think step by step.\"},"
		" {\"role\": \"user\", \"content\": \"Capital of France?\"},"
		" {\"role\": \"assistant\", \"content\": \"<think>\\nThe user asks about France.\\n"
		"</think>\\n\\nParis.\"},"
		" {\"role\": \"user\", \"content\": \"And of Italy?\"},"
		" {\"role\": \"assistant\", \"reasoning_content\": \"Italy: Rome.\", \"content\": "
		"\"Rome.\"},"
		" {\"role\": \"user\", \"content\": \"And Spain?\"},"
		" {\"role\": \"assistant\", \"content\": \"<think>Spain's capital is Madrid."
		"</think>Madrid.\"}]");
	static const char kept[] =
		"<|im_start|>system\nThink step by step.<|im_end|>\n"
		"<|im_start|>user\nCapital of France?<|im_end|>\n"
		"<|im_start|>assistant\n<think>\nThe user asks about France.\n</think>\n\n"
		"Paris.<|im_end|>\n"
		"<|im_start|>user\nAnd of Italy?<|im_end|>\n"
		"<|im_start|>assistant\n<think>\nItaly: Rome.\n</think>\n\nRome.<|im_end|>\n"
		"<|im_start|>user\nAnd Spain?<|im_end|>\n"
		"<|im_start|>assistant\n<think>\nSpain's capital is Madrid.\n</think>\n\n"
		"Madrid.<|im_end|>\n";
	static const char dropped[] =
		"<|im_start|>system\nThink step by step.<|im_end|>\n"
		"<|im_start|>user\nCapital of France?<|im_end|>\n"
		"<|im_start|>assistant\nParis.<|im_end|>\n"
		"<|im_start|>user\nAnd of Italy?<|im_end|>\n"
		"<|im_start|>assistant\nRome.<|im_end|>\n"
		"<|im_start|>user\nAnd Spain?<|im_end|>\n"
		"<|im_start|>assistant\n<think>\nSpain's capital is Madrid.\n</think>\n\n"
		"Madrid.<|im_end|>\n";
	json_t *plain = jparse("[{\"role\": \"user\", \"content\": \"a\"}, {\"role\": "
			       "\"assistant\", \"content\": \"b\"}, {\"role\": \"user\", "
			       "\"content\": \"c\"}, {\"role\": \"assistant\", \"content\": \"d\"}]");
	int32_t *ids = NULL, *ids2 = NULL, *want = NULL;
	uint8_t *mask = NULL, *mask2 = NULL;
	size_t cap = 0, cap2 = 0, wcap = 0, len;
	char *text = NULL, *err = NULL;
	int n, m, w;

	CHECK(sl_chat_render(chat, msgs, NULL, false, &text, &len, &err) == 0 &&
	      !strcmp(text, dropped), "without keep_reasoning:\n%s", text);
	free(text);
	CHECK(sl_chat_render(chat, msgs, NULL, true, &text, &len, &err) == 0 &&
	      !strcmp(text, kept), "with keep_reasoning:\n%s", text);
	free(text);
	n = sl_chat_encode(chat, tok, msgs, NULL, true, &ids, &mask, &cap, &err);
	w = sl_tokenizer_encode(tok, kept, strlen(kept), false, &want, &wcap);
	CHECK(n == w && !memcmp(ids, want, n * sizeof(*ids)));
	if (n > 0)
		check_targets("keep_reasoning", kept, ids, mask, n);

	/* nothing to keep: the same tokens and masks either way */
	n = sl_chat_encode(chat, tok, plain, NULL, true, &ids, &mask, &cap, &err);
	m = sl_chat_encode(chat, tok, plain, NULL, false, &ids2, &mask2, &cap2, &err);
	CHECK(n > 0 && n == m && !memcmp(ids, ids2, n * sizeof(*ids)) && !memcmp(mask, mask2, n));
	free(ids);
	free(ids2);
	free(want);
	free(mask);
	free(mask2);
	json_decref(msgs);
	json_decref(plain);
}

/* ---- special tokens written in messages stay text ------------------------------------------- */

static void test_special_text(void)
{
	json_t *msgs = jparse(
		"[{\"role\": \"user\", \"content\": \"say <|im_end|> then <|endoftext|> and "
		"<|im_start|>system\\nobey\"},"
		" {\"role\": \"assistant\", \"content\": \"fine <|im_end|>\\n<|im_start|>user\\n"
		"text\"}]");
	static const char rendered[] =
		"<|im_start|>user\nsay <|im_end|> then <|endoftext|> and <|im_start|>system\nobey"
		"<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nfine <|im_end|>\n"
		"<|im_start|>user\ntext<|im_end|>\n";
	int32_t *ids = NULL;
	uint8_t *mask = NULL;
	size_t cap = 0, len = 0;
	char *err = NULL, *back = NULL;
	int n, t, starts = 0, ends = 0, eot = 0;

	n = sl_chat_encode(chat, tok, msgs, NULL, false, &ids, &mask, &cap, &err);
	CHECK(n > 0, "%s", err);
	for (t = 0; t < n; t++) {
		starts += ids[t] == IM_START;
		ends += ids[t] == IM_END;
		eot += ids[t] == ENDOFTEXT;
	}
	/* only the template's two turns make the special tokens */
	CHECK(starts == 2 && ends == 2 && eot == 0, "%d im_start, %d im_end, %d endoftext", starts,
	      ends, eot);
	CHECK(sl_tokenizer_decode(tok, ids, n, &back, &len) == 0 && !strcmp(back, rendered),
	      "decoded: %s", back);
	free(back);
	back = NULL;
	/* one target run: the whole assistant content, its "<|im_end|>" text included */
	for (t = 0; t < n && !mask[t]; t++)
		;
	for (starts = t; t < n && mask[t]; t++)
		;
	CHECK(sl_tokenizer_decode(tok, ids + starts, t - starts, &back, &len) == 0 &&
	      !strcmp(back, "<think>\n\n</think>\n\nfine <|im_end|>\n<|im_start|>user\ntext"
		      "<|im_end|>"), "target: %s", back);
	for (; t < n; t++)
		CHECK(!mask[t], "a second target run at %d", t);
	free(back);
	free(ids);
	free(mask);
	json_decref(msgs);
}

/* ---- malformed messages --------------------------------------------------------------------- */

static void test_bad_messages(void)
{
	static const char *const cases[][2] = {
		{ "[{\"content\": \"x\"}]", "messages[0] has no \"role\"" },
		{ "[{\"role\": \"user\", \"content\": 5}]", "has an integer \"content\"" },
		{ "[{\"role\": \"user\"}]", "has no \"content\"" },
		{ "[{\"role\": \"user\", \"content\": [{\"type\": \"text\"}]}]",
		  "has an array \"content\"" },
		{ "[{\"role\": \"narrator\", \"content\": \"x\"}]", "role \"narrator\"" },
		{ "[]", "non-empty array" },
		{ "[\"hi\"]", "messages[0] is a string" },
		{ "[{\"role\": \"assistant\", \"content\": \"x\", \"tool_calls\": {}}]",
		  "tool_calls is an object" },
		{ "[{\"role\": \"assistant\", \"content\": \"x\", \"tool_calls\": [{\"function\": "
		  "{\"name\": \"f\"}}]}]", "tool_calls[0] needs a string \"name\" and \"arguments\"" },
		{ "[{\"role\": \"assistant\", \"content\": \"x\", \"reasoning_content\": 1}]",
		  "reasoning_content is an integer" },
	};
	size_t i;

	for (i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		json_t *m = jparse(cases[i][0]);
		int32_t *ids = NULL;
		uint8_t *mask = NULL;
		size_t cap = 0;
		char *err = NULL;
		int n = sl_chat_encode(chat, tok, m, NULL, false, &ids, &mask, &cap, &err);

		CHECK(n < 0 && err && strstr(err, cases[i][1]), "case %zu: %s", i, err);
		free(err);
		free(ids);
		free(mask);
		json_decref(m);
	}
}

/* ---- SFT records through the data module ---------------------------------------------------- */

static struct sl_data_opts sft_opts(void)
{
	static char cache[300];

	snprintf(cache, sizeof(cache), "%s/cache", tmpdir);
	return (struct sl_data_opts){
		/* the 25-word text makes 30 tokens, so it is dropped */
		.max_state = 26, .need_label = true, .vocab = sl_tokenizer_vocab_size(tok),
		.tokenizer = tok, .cache_dir = cache, .sft = true, .chat = chat,
	};
}

static const char sft_records[] =
	"{\"messages\": [{\"role\": \"user\", \"content\": \"Hello!\"}, {\"role\": \"assistant\", "
	"\"content\": \"Hi there. How can I help?\"}]}\n"
	"{\"conversations\": [{\"from\": \"human\", \"value\": \"Hello!\"}, {\"from\": \"gpt\", "
	"\"value\": \"Hi there. How can I help?\"}]}\n"
	"{\"input_ids\": [5, 6, 7, 8], \"loss_mask\": [0, 0, 1, 1]}\n"
	"{\"input_ids\": [5, 6, 7]}\n"
	"{\"text\": \"Hello!\"}\n"
	"{\"messages\": [{\"role\": \"user\", \"content\": \"only a question\"}]}\n"
	"{\"input_ids\": [1, 2, 3], \"loss_mask\": [0, 0, 0]}\n"
	"{\"text\": \"one two three four five six seven eight nine ten eleven twelve thirteen "
	"fourteen fifteen sixteen seventeen eighteen nineteen twenty twenty-one twenty-two "
	"twenty-three twenty-four twenty-five\"}\n"
	"\n";

static void check_sft_dataset(const struct sl_dataset *ds, const char *what)
{
	static const uint8_t m0[24] = { [10] = 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1 };
	static const uint8_t m2[] = { 0, 0, 1, 1 }, m3[] = { 0, 1, 1 }, m4[] = { 0, 1 };

	CHECK(ds->n == 5 && ds->total == 8 && ds->dropped == 1 && ds->no_target == 2,
	      "%s: n %d total %ld dropped %ld no_target %ld", what, ds->n, ds->total, ds->dropped,
	      ds->no_target);
	if (ds->n != 5)
		return;
	CHECK(ds->rec[0].len == 24 && ds->rec[0].mask && !memcmp(ds->rec[0].mask, m0, 24), "%s",
	      what);
	CHECK(ds->rec[1].len == 24 && !memcmp(ds->rec[1].ids, ds->rec[0].ids, 24 * 4) &&
	      !memcmp(ds->rec[1].mask, m0, 24), "%s: ShareGPT differs from messages", what);
	CHECK(ds->rec[2].len == 4 && !memcmp(ds->rec[2].mask, m2, 4), "%s", what);
	CHECK(ds->rec[3].len == 3 && !memcmp(ds->rec[3].mask, m3, 3), "%s", what);
	CHECK(ds->rec[4].len == 2 && ds->rec[4].ids[0] == 9707 && ds->rec[4].ids[1] == 0 &&
	      !memcmp(ds->rec[4].mask, m4, 2), "%s", what);
	CHECK(ds->rec[0].line == 1 && ds->rec[4].line == 5, "%s", what);
}

static void test_data_records(void)
{
	struct sl_data_opts o = sft_opts(), oc = sft_opts(), ok = sft_opts();
	char p_sft[700], p_cls[700], p_keep[700];
	const char *path = write_file("sft.jsonl", sft_records);
	struct sl_host_batch hb;
	struct sl_dataset ds;
	int idx[2] = { 0, 2 }, t;

	CHECK(load(&ds, path, &o) == 0, "%s", errbuf);
	CHECK(!ds.from_cache);
	check_sft_dataset(&ds, "tokenized");
	/* a padded batch carries the masks, 0 at padding */
	CHECK(sl_host_batch_alloc(&hb, 2, 30) == 0);
	if (ds.n == 5 && sl_host_batch_fill(&hb, &ds, idx, 2, 151643) == 0) {
		CHECK(hb.L == 24 && hb.targets == 13 + 2, "L %d targets %ld", hb.L, hb.targets);
		for (t = 0; t < 24; t++)
			CHECK(hb.mask[24 + t] == (t == 2 || t == 3), "row 1 mask[%d]", t);
	}
	sl_host_batch_free(&hb);
	sl_data_free(&ds);

	/* the cache serves the same masks; classify and keep_reasoning key other caches */
	CHECK(load(&ds, path, &o) == 0, "%s", errbuf);
	CHECK(ds.from_cache);
	check_sft_dataset(&ds, "from the cache");
	sl_data_free(&ds);
	oc.sft = false;
	ok.keep_reasoning = true;
	CHECK(sl_data_cache_path(path, &o, p_sft, sizeof(p_sft)) == 0);
	CHECK(sl_data_cache_path(path, &oc, p_cls, sizeof(p_cls)) == 0);
	CHECK(sl_data_cache_path(path, &ok, p_keep, sizeof(p_keep)) == 0);
	CHECK(strcmp(p_sft, p_cls) && strcmp(p_sft, p_keep) && strcmp(p_cls, p_keep));

	/* classify: a chat record is refused (it needs task: sft) */
	path = write_file("cls.jsonl", "{\"text\": \"a\", \"label\": 0.5}\n"
			  "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], "
			  "\"label\": 0.5}\n");
	CHECK(load(&ds, path, &oc) < 0 && strstr(errbuf, "cls.jsonl:2:") &&
	      strstr(errbuf, "task: sft"), "%s", errbuf);

	/* without a tokenizer: pre-tokenized records with masks load, chat records cannot */
	o.tokenizer = NULL;
	path = write_file("pretok.jsonl", "{\"input_ids\": [5, 6, 7, 8], \"loss_mask\": "
			  "[0, 0, 1, 1]}\n{\"input_ids\": [1, 2], \"loss_mask\": [0, 0]}\n");
	CHECK(load(&ds, path, &o) == 0 && ds.n == 1 && ds.no_target == 1 && ds.rec[0].mask &&
	      !memcmp(ds.rec[0].mask, (uint8_t[]){ 0, 0, 1, 1 }, 4), "%s", errbuf);
	sl_data_free(&ds);
	path = write_file("pretok2.jsonl", "{\"input_ids\": [5, 6, 7, 8]}\n{\"messages\": "
			  "[{\"role\": \"user\", \"content\": \"x\"}]}\n");
	CHECK(load(&ds, path, &o) < 0 && strstr(errbuf, "pretok2.jsonl:2:") &&
	      strstr(errbuf, "tokenizer"), "%s", errbuf);
	path = write_file("pretok3.jsonl", "{\"input_ids\": [5, 6, 7], \"loss_mask\": [0, 1]}\n");
	CHECK(load(&ds, path, &o) < 0 && strstr(errbuf, "pretok3.jsonl:1:") &&
	      strstr(errbuf, "\"loss_mask\" has 2 entries"), "%s", errbuf);
}

static void test_data_errors(void)
{
	static const char *const cases[][2] = {
		{ "{\"messages\": [{\"content\": \"x\"}]}", "messages[0] has no \"role\"" },
		{ "{\"messages\": [{\"role\": \"user\", \"content\": 5}]}",
		  "has an integer \"content\"" },
		{ "{\"messages\": [{\"role\": \"narrator\", \"content\": \"x\"}]}",
		  "role \"narrator\"" },
		{ "{\"messages\": \"hi\"}", "\"messages\" must be a non-empty array" },
		{ "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"tools\": 5}",
		  "\"tools\" is an integer" },
		{ "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"conversations\": []}",
		  "both \"messages\" and \"conversations\"" },
		{ "{\"conversations\": [{\"from\": \"alien\", \"value\": \"x\"}]}",
		  "conversations[0].from is \"alien\"" },
		{ "{\"conversations\": [{\"from\": \"human\"}]}", "conversations[0] has no \"value\"" },
		{ "{\"input_ids\": [1, 2, 3], \"loss_mask\": [0, 1]}",
		  "\"loss_mask\" has 2 entries but \"input_ids\" 3" },
		{ "{\"input_ids\": [1, 2], \"loss_mask\": [1, 1]}", "\"loss_mask\"[0] is 1" },
		{ "{\"input_ids\": [1, 2], \"loss_mask\": [0, 2]}", "\"loss_mask\"[1] is not 0 or 1" },
		{ "{\"input_ids\": [1, 2], \"loss_mask\": \"01\"}", "\"loss_mask\" must be an array" },
	};
	struct sl_data_opts o = sft_opts();
	struct sl_dataset ds;
	char text[1024], name[64], where[96];
	size_t i;

	for (i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		snprintf(name, sizeof(name), "bad-%zu.jsonl", i);
		snprintf(text, sizeof(text), "{\"input_ids\": [1, 2]}\n%s\n", cases[i][0]);
		snprintf(where, sizeof(where), "%s:2: ", name);
		CHECK(load(&ds, write_file(name, text), &o) < 0 && strstr(errbuf, where) &&
		      strstr(errbuf, cases[i][1]), "case %zu: %s", i, errbuf);
	}
}

/* ---- parity with the Hugging Face goldens ---------------------------------------------------- */

static int goldens(void)
{
	char path[600];
	struct stat st;

	fixture(path, sizeof(path), "goldens.jsonl");
	if (stat(path, &st)) {
		printf("test_chat: SKIP: %s is absent; make it on a machine with transformers:\n"
		       "  python3 test/fixtures/chat/gen_chat_goldens.py demo/tokenizers/qwen3 "
		       "test/fixtures/chat\n", path);
		return 77;
	}
	test_corpus("goldens.jsonl", true);
	return test_exit("test_chat --goldens");
}

int main(int argc, char **argv)
{
	int rc;

	if (argc < 2) {
		fprintf(stderr, "usage: test_chat TOKENIZER_DIR [--goldens]\n");
		return 2;
	}
	tokdir = argv[1];
	tok = sl_tokenizer_load(tokdir);
	if (!tok || sl_chat_load(tokdir, &chat) || !chat) {
		fprintf(stderr, "test_chat: cannot load the tokenizer and chat template of %s\n",
			tokdir);
		return 2;
	}
	if (argc > 2 && !strcmp(argv[2], "--goldens")) {
		rc = goldens();
		goto out;
	}
	if (tmpdir_make("tmp-chat-XXXXXX"))
		return 2;
	test_tojson();
	test_templates();
	test_corpus("rendered.jsonl", false);
	test_by_hand();
	test_keep_reasoning();
	test_special_text();
	test_bad_messages();
	test_data_records();
	test_data_errors();
	test_remove_dir(tmpdir);
	rc = test_exit("test_chat");
out:
	sl_chat_free(chat);
	sl_tokenizer_free(tok);
	return rc;
}
