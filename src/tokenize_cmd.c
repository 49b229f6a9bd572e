/*
 * tokenize_cmd: `shardlm tokenize --tokenizer PATH [--split-special]`.
 *
 * Owns the command only: JSONL on stdin (each line a JSON string or an object with "text"),
 * one JSON array of ids per line on stdout, in order, exactly HF's
 * Tokenizer.encode(text, add_special_tokens=False).ids.  Errors name "<stdin>:LINE".
 * --chat: each line a chat record ("messages" or "conversations", optional "tools"), rendered
 * with the model's chat template (chat.c) into {"input_ids": [...], "loss_mask": [...]}.
 */
#include "tokenizer.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "chat.h"
#include "log.h"

static void usage(FILE *f)
{
	fprintf(f, "usage: shardlm tokenize --tokenizer PATH [--split-special] [--stats]\n"
		"       shardlm tokenize --tokenizer PATH --chat [--keep-reasoning]\n"
		"  stdin: JSONL, each line a JSON string or an object with \"text\"\n"
		"  stdout: one JSON array of token ids per line (Hugging Face's\n"
		"          encode(text, add_special_tokens=False).ids)\n"
		"  PATH: a tokenizer.json or a model directory holding one\n"
		"  --split-special: special tokens written in the text are plain text\n"
		"  --stats: print lines, tokens and tokens/s (loading excluded) on stderr\n"
		"  --chat: each line a chat record (\"messages\" or \"conversations\", \"tools\"),\n"
		"          rendered with the chat template beside PATH; out: one line\n"
		"          {\"input_ids\": [...], \"loss_mask\": [...]} per record (1 = a target)\n"
		"  --keep-reasoning: keep earlier assistant turns' reasoning (data.keep_reasoning)\n");
}

/* ids as "[1,2,3]\n" into buf (room for n * 11 + 3 bytes) */
static size_t format_ids(char *buf, const int32_t *ids, int n)
{
	size_t o = 0;
	int i;

	buf[o++] = '[';
	for (i = 0; i < n; i++) {
		char tmp[12];
		uint32_t v = (uint32_t)ids[i];
		int k = 0;

		if (i)
			buf[o++] = ',';
		do {
			tmp[k++] = (char)('0' + v % 10);
			v /= 10;
		} while (v);
		while (k)
			buf[o++] = tmp[--k];
	}
	buf[o++] = ']';
	buf[o++] = '\n';
	return o;
}

/* --chat: one record per line to {"input_ids":[...],"loss_mask":[...]} */
static int tokenize_chat(struct sl_tokenizer *tok, const char *path, bool keep_reasoning)
{
	struct sl_chat *ct = NULL;
	int32_t *ids = NULL;
	uint8_t *mask = NULL;
	size_t cap = 0, lcap = 0;
	char *line = NULL, buf[2048];
	long lineno = 0;
	ssize_t got;
	int rc = 1, i, n;

	if (sl_chat_load(path, &ct))
		return 1;
	if (!sl_chat_known(ct)) {
		sl_chat_refusal(ct, buf, sizeof(buf));
		sl_error("tokenize --chat: %s", buf);
		goto out_free;
	}
	while ((got = getline(&line, &lcap, stdin)) >= 0) {
		json_t *root, *msgs = NULL, *tools = NULL;
		json_error_t jerr;
		char *err = NULL;

		lineno++;
		root = json_loadb(line, got, 0, &jerr);
		if (!root) {
			sl_error("<stdin>:%ld: invalid JSON at column %d: %s", lineno, jerr.column,
				 jerr.text);
			goto out_free;
		}
		n = sl_chat_record(root, &msgs, &tools, &err);
		if (n == 1)
			err = strdup("not a chat record: give \"messages\" or \"conversations\"");
		else if (n == 0)
			n = sl_chat_encode(ct, tok, msgs, tools, keep_reasoning, &ids, &mask, &cap,
					   &err);
		json_decref(msgs);
		json_decref(tools);
		json_decref(root);
		if (err || n < 0) {
			sl_error("<stdin>:%ld: %s", lineno, err ? err : "cannot render");
			free(err);
			goto out_free;
		}
		fputs("{\"input_ids\":[", stdout);
		for (i = 0; i < n; i++)
			printf(i ? ",%d" : "%d", ids[i]);
		fputs("],\"loss_mask\":[", stdout);
		for (i = 0; i < n; i++)
			fputs(i ? (mask[i] ? ",1" : ",0") : (mask[i] ? "1" : "0"), stdout);
		fputs("]}\n", stdout);
	}
	if (fflush(stdout)) {
		sl_error("tokenize: cannot write to stdout: %s", strerror(errno));
		goto out_free;
	}
	rc = 0;
out_free:
	free(line);
	free(ids);
	free(mask);
	sl_chat_free(ct);
	return rc;
}

int sl_cmd_tokenize(int argc, char **argv)
{
	const char *path = NULL;
	bool split_special = false, stats = false, chat = false, keep_reasoning = false;
	double t_load, t0;
	long ntok = 0;
	struct sl_tokenizer *tok;
	int32_t *ids = NULL;
	size_t cap = 0, lcap = 0, ocap = 0;
	char *line = NULL, *obuf = NULL;
	long lineno = 0;
	ssize_t got;
	int i, rc = 0;

	sl_log_to_stderr(true);
	for (i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--tokenizer") && i + 1 < argc) {
			path = argv[++i];
		} else if (!strncmp(argv[i], "--tokenizer=", 12)) {
			path = argv[i] + 12;
		} else if (!strcmp(argv[i], "--split-special")) {
			split_special = true;
		} else if (!strcmp(argv[i], "--stats")) {
			stats = true;
		} else if (!strcmp(argv[i], "--chat")) {
			chat = true;
		} else if (!strcmp(argv[i], "--keep-reasoning")) {
			keep_reasoning = true;
		} else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
			usage(stdout);
			return 0;
		} else {
			sl_error("tokenize: unknown argument '%s'", argv[i]);
			usage(stderr);
			return 2;
		}
	}
	if (!path) {
		sl_error("tokenize: --tokenizer PATH is required (a tokenizer.json or a model dir)");
		usage(stderr);
		return 2;
	}
	t0 = sl_now();
	tok = sl_tokenizer_load(path);
	if (!tok)
		return 1;
	t_load = sl_now() - t0;
	t0 = sl_now();
	if (chat) {
		rc = tokenize_chat(tok, path, keep_reasoning);
		sl_tokenizer_free(tok);
		return rc;
	}

	while ((got = getline(&line, &lcap, stdin)) >= 0) {
		json_error_t jerr;
		json_t *root, *j;
		size_t need;
		int n;

		lineno++;
		while (got > 0 && (line[got - 1] == '\n' || line[got - 1] == '\r'))
			got--;
		root = json_loadb(line, got, JSON_DECODE_ANY | JSON_ALLOW_NUL, &jerr);
		if (!root) {
			sl_error("<stdin>:%ld: invalid JSON at column %d: %s; give a JSON string or "
				 "an object with \"text\"", lineno, jerr.column, jerr.text);
			rc = 1;
			break;
		}
		j = json_is_object(root) ? json_object_get(root, "text") : root;
		if (!json_is_string(j)) {
			sl_error("<stdin>:%ld: %s; give a JSON string or an object with a string "
				 "\"text\"", lineno, json_is_object(root) ?
				 "the object has no string \"text\"" : "not a string");
			json_decref(root);
			rc = 1;
			break;
		}
		n = sl_tokenizer_encode(tok, json_string_value(j), json_string_length(j),
					split_special, &ids, &cap);
		json_decref(root);
		if (n < 0) {
			sl_error("<stdin>:%ld: cannot tokenize this line", lineno);
			rc = 1;
			break;
		}
		need = (size_t)n * 11 + 3;
		if (need > ocap) {
			char *p = realloc(obuf, need);

			if (!p) {
				sl_error("tokenize: out of memory");
				rc = 1;
				break;
			}
			obuf = p;
			ocap = need;
		}
		ntok += n;
		need = format_ids(obuf, ids, n);
		if (fwrite(obuf, 1, need, stdout) != need) {
			sl_error("tokenize: cannot write to stdout: %s", strerror(errno));
			rc = 1;
			break;
		}
	}
	if (fflush(stdout)) {
		sl_error("tokenize: cannot write to stdout: %s", strerror(errno));
		rc = 1;
	}
	if (stats && !rc) {
		double dt = sl_now() - t0;

		fprintf(stderr, "tokenize: %ld lines, %ld tokens in %.3f s: %.0f tokens/s (reading, "
			"JSON and output included; loading the tokenizer took %.3f s)\n", lineno,
			ntok, dt, dt > 0 ? ntok / dt : 0.0, t_load);
	}
	free(obuf);
	free(line);
	free(ids);
	sl_tokenizer_free(tok);
	return rc;
}
