/*
 * chat: chat templates recognized by content and rendered in C; tokens and loss masks.
 *
 * Owns the table of known templates, one renderer per template (written from the template's
 * text, following Jinja's semantics as transformers configures it: trim_blocks, lstrip_blocks,
 * tojson = json.dumps(ensure_ascii=False)), the ShareGPT role table, and the mapping of the
 * rendered text's target byte spans onto tokens.  See chat.h for the two departures from HF.
 */
#define _GNU_SOURCE
#include "chat.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "chat_impl.h"
#include "jsonutil.h"
#include "log.h"
#include "tokenizer.h"

static void msgs_free(struct msg *m, int n)
{
	int i;

	for (i = 0; m && i < n; i++)
		free(m[i].calls);
	free(m);
}

/* JSON messages -> struct msg (pointing into the JSON); NULL with *err */
static struct msg *parse_messages(json_t *messages, int *count, char **err)
{
	size_t n = json_array_size(messages), i, k;
	struct msg *m;
	json_t *e;

	if (!json_is_array(messages) || n == 0) {
		*err = sl_msgf("\"messages\" must be a non-empty array of {\"role\", \"content\"}");
		return NULL;
	}
	m = calloc(n, sizeof(*m));
	if (!m) {
		*err = sl_msgf("out of memory");
		return NULL;
	}
	json_array_foreach(messages, i, e) {
		json_t *role = json_object_get(e, "role"), *c, *rc, *tc, *call;
		int r;

		if (!json_is_object(e)) {
			*err = sl_msgf("messages[%zu] is %s, not an object {\"role\", \"content\"}", i,
				       json_type_name(e));
			goto out_free;
		}
		if (!json_is_string(role)) {
			*err = sl_msgf("messages[%zu] has %s \"role\"; give one of system, user, "
				       "assistant, tool", i, role ? json_type_name(role) : "no");
			goto out_free;
		}
		for (r = 0; r < 4; r++)
			if (!strcmp(json_string_value(role), sl_chat_role_names[r]))
				break;
		if (r == 4) {
			*err = sl_msgf("messages[%zu] has role \"%s\"; the template renders system, "
				       "user, assistant and tool turns only", i,
				       json_string_value(role));
			goto out_free;
		}
		m[i].role = r;
		c = json_object_get(e, "content");
		if (!json_is_string(c)) {
			*err = sl_msgf("messages[%zu] (%s) has %s \"content\"; it must be a string (use "
				       "\"\" for none)", i, sl_chat_role_names[r],
				       c ? json_type_name(c) : "no");
			goto out_free;
		}
		m[i].content = json_string_value(c);
		m[i].content_len = json_string_length(c);
		rc = json_object_get(e, "reasoning_content");
		if (rc && !json_is_null(rc)) {
			if (!json_is_string(rc)) {
				*err = sl_msgf("messages[%zu].reasoning_content is %s, not a string", i,
					       json_type_name(rc));
				goto out_free;
			}
			m[i].reasoning = json_string_value(rc);
			m[i].reasoning_len = json_string_length(rc);
		}
		tc = json_object_get(e, "tool_calls");
		/* the template reads tool calls of assistant turns only (null or [] = none) */
		if (r != ROLE_ASSISTANT || !tc || json_is_null(tc))
			continue;
		if (!json_is_array(tc)) {
			*err = sl_msgf("messages[%zu].tool_calls is %s, not an array", i,
				       json_type_name(tc));
			goto out_free;
		}
		m[i].calls = calloc(json_array_size(tc) + 1, sizeof(*m[i].calls));
		if (!m[i].calls) {
			*err = sl_msgf("out of memory");
			goto out_free;
		}
		json_array_foreach(tc, k, call) {
			json_t *f = json_object_get(call, "function"), *name, *args;

			if (!json_is_object(call)) {
				*err = sl_msgf("messages[%zu].tool_calls[%zu] is %s, not an object", i, k,
					       json_type_name(call));
				goto out_free;
			}
			/* {% if tool_call.function %}: a non-empty object replaces the call */
			if (json_is_object(f) && json_object_size(f))
				call = f;
			name = json_object_get(call, "name");
			args = json_object_get(call, "arguments");
			if (!json_is_string(name) || !args) {
				*err = sl_msgf("messages[%zu].tool_calls[%zu] needs a string "
					       "\"name\" and \"arguments\" (in \"function\" or "
					       "beside it)", i, k);
				goto out_free;
			}
			m[i].calls[k].name = json_string_value(name);
			m[i].calls[k].args = args;
		}
		m[i].n_calls = (int)json_array_size(tc);
	}
	*count = (int)n;
	return m;

out_free:
	msgs_free(m, (int)n);
	return NULL;
}

/* ---- the table of known templates ---------------------------------------------------------- */

struct known {
	const char *name;
	size_t len;			/* of the template text, a trailing newline removed */
	uint64_t hash;			/* sl_hash64(text, len, 0) */
	const char *const *specials;	/* the special tokens the renderer emits */
	void (*render)(struct render *r, const struct msg *m, int n, json_t *tools,
		       bool keep_reasoning);
};

static const struct known known_templates[] = {
	/* Qwen3 (dense and MoE: Qwen3-0.6B ... Qwen3-235B-A22B), thinking with tools */
	{ "qwen3", 4116, UINT64_C(0x9ebb70c810526bd1), sl_chat_qwen3_specials, sl_chat_qwen3_render },
};

#define N_KNOWN (sizeof(known_templates) / sizeof(known_templates[0]))

struct sl_chat {
	char file[4200];		/* where the template came from */
	char *text;
	size_t len;
	uint64_t hash;
	const struct known *known;	/* NULL: unknown */
};

static char *slurp(const char *path, size_t *n)
{
	FILE *f = fopen(path, "rb");
	char *buf = NULL;
	long sz;

	if (!f)
		return NULL;
	if (fseek(f, 0, SEEK_END) == 0 && (sz = ftell(f)) >= 0 && fseek(f, 0, SEEK_SET) == 0) {
		buf = malloc(sz + 1);
		if (buf && fread(buf, 1, sz, f) == (size_t)sz) {
			buf[sz] = 0;
			*n = sz;
		} else {
			free(buf);
			buf = NULL;
		}
	}
	fclose(f);
	return buf;
}

/* the directory of @path: itself when it is one, else the one holding it */
static void dir_of(const char *path, char *buf, size_t n)
{
	struct stat st;
	char *slash;

	snprintf(buf, n, "%s", path);
	if (stat(path, &st) == 0 && S_ISDIR(st.st_mode))
		return;
	slash = strrchr(buf, '/');
	if (slash)
		*slash = 0;
	else
		snprintf(buf, n, ".");
}

int sl_chat_load(const char *path, struct sl_chat **out)
{
	char dir[4096], file[4200];
	struct sl_chat *ct;
	json_error_t jerr;
	json_t *cfg = NULL, *t;
	size_t n = 0, i;
	char *text;

	*out = NULL;
	dir_of(path, dir, sizeof(dir));
	snprintf(file, sizeof(file), "%s/chat_template.jinja", dir);
	text = slurp(file, &n);
	if (!text) {
		snprintf(file, sizeof(file), "%s/tokenizer_config.json", dir);
		cfg = json_load_file(file, 0, &jerr);
		if (!cfg) {
			FILE *f = fopen(file, "r");

			if (!f)
				return 0;	/* no template: only chat records need one */
			fclose(f);
			sl_error("%s:%d: invalid JSON: %s", file, jerr.line, jerr.text);
			return -EINVAL;
		}
		t = json_object_get(cfg, "chat_template");
		if (json_is_array(t)) {
			/* named templates [{name, template}]: the "default" one is the chat's */
			json_t *e, *pick = NULL;

			json_array_foreach(t, i, e)
				if (json_is_string(json_object_get(e, "name")) &&
				    !strcmp(json_string_value(json_object_get(e, "name")), "default"))
					pick = json_object_get(e, "template");
			t = pick;
		}
		if (!t || json_is_null(t)) {
			json_decref(cfg);
			return 0;
		}
		if (!json_is_string(t)) {
			sl_error("%s: \"chat_template\" is %s; expected the template's text", file,
				 json_type_name(t));
			json_decref(cfg);
			return -EINVAL;
		}
		n = json_string_length(t);
		text = malloc(n + 1);
		if (text)
			memcpy(text, json_string_value(t), n + 1);
		json_decref(cfg);
	}
	ct = calloc(1, sizeof(*ct));
	if (!text || !ct) {
		free(text);
		free(ct);
		sl_error("%s: out of memory", file);
		return -ENOMEM;
	}
	/* Jinja drops one trailing newline of a template (keep_trailing_newline is off) */
	if (n && text[n - 1] == '\n')
		text[--n] = 0;
	snprintf(ct->file, sizeof(ct->file), "%s", file);
	ct->text = text;
	ct->len = n;
	ct->hash = sl_hash64(text, n, 0);
	for (i = 0; i < N_KNOWN; i++)
		if (known_templates[i].len == n && known_templates[i].hash == ct->hash)
			ct->known = &known_templates[i];
	*out = ct;
	return 0;
}

void sl_chat_free(struct sl_chat *ct)
{
	if (!ct)
		return;
	free(ct->text);
	free(ct);
}

bool sl_chat_known(const struct sl_chat *ct)
{
	return ct && ct->known;
}

const char *sl_chat_name(const struct sl_chat *ct)
{
	return ct && ct->known ? ct->known->name : "unknown";
}

uint64_t sl_chat_hash(const struct sl_chat *ct)
{
	return ct ? ct->hash : 0;
}

void sl_chat_refusal(const struct sl_chat *ct, char *buf, size_t n)
{
	size_t o, i;

	if (!ct) {
		snprintf(buf, n, "the model has no chat template (no chat_template.jinja, no "
			 "\"chat_template\" in tokenizer_config.json); give pre-tokenized "
			 "\"input_ids\" with \"loss_mask\"");
		return;
	}
	o = snprintf(buf, n, "%s: its chat template (%zu bytes, hash %016" PRIx64 ") is not one "
		     "shardlm renders (known:", ct->file, ct->len, ct->hash);
	for (i = 0; i < N_KNOWN && o < n; i++)
		o += snprintf(buf + o, n - o, " %s", known_templates[i].name);
	if (o < n)
		snprintf(buf + o, n - o, "); rendering it another way would train on a format the "
			 "model does not use: give pre-tokenized \"input_ids\" with \"loss_mask\", or "
			 "add a renderer for it to src/chat.c");
}

/* ---- records ------------------------------------------------------------------------------- */

/* ShareGPT "from" -> role; the usual spellings (FastChat, LLaMA-Factory, glaive, ...) */
static const struct {
	const char *from, *role;
} sharegpt_roles[] = {
	{ "system", "system" },
	{ "human", "user" }, { "user", "user" },
	{ "gpt", "assistant" }, { "assistant", "assistant" }, { "model", "assistant" },
	{ "chatgpt", "assistant" },
	{ "tool", "tool" }, { "function", "tool" }, { "observation", "tool" },
	{ "ipython", "tool" },
};

#define N_SHAREGPT (sizeof(sharegpt_roles) / sizeof(sharegpt_roles[0]))

static json_t *sharegpt_messages(json_t *conv, char **err)
{
	json_t *out = json_array(), *e;
	size_t i, k;

	if (!out) {
		*err = sl_msgf("out of memory");
		return NULL;
	}
	if (!json_is_array(conv) || !json_array_size(conv)) {
		*err = sl_msgf("\"conversations\" must be a non-empty array of {\"from\", \"value\"}");
		goto out_put;
	}
	json_array_foreach(conv, i, e) {
		json_t *from = json_object_get(e, "from"), *value = json_object_get(e, "value");

		if (!json_is_object(e)) {
			*err = sl_msgf("conversations[%zu] is %s, not an object {\"from\", \"value\"}",
				       i, json_type_name(e));
			goto out_put;
		}
		if (!json_is_string(from)) {
			*err = sl_msgf("conversations[%zu] has %s \"from\"; give human, gpt, system or "
				       "observation (tool)", i, from ? json_type_name(from) : "no");
			goto out_put;
		}
		for (k = 0; k < N_SHAREGPT; k++)
			if (!strcmp(json_string_value(from), sharegpt_roles[k].from))
				break;
		if (k == N_SHAREGPT) {
			*err = sl_msgf("conversations[%zu].from is \"%s\", not a ShareGPT role "
				       "shardlm knows (system; human, user; gpt, assistant, model, "
				       "chatgpt; tool, function, observation, ipython)", i,
				       json_string_value(from));
			goto out_put;
		}
		if (!json_is_string(value)) {
			*err = sl_msgf("conversations[%zu] has %s \"value\"; it must be a string", i,
				       value ? json_type_name(value) : "no");
			goto out_put;
		}
		if (json_array_append_new(out, json_pack("{s:s,s:O}", "role",
							 sharegpt_roles[k].role, "content",
							 value))) {
			*err = sl_msgf("out of memory");
			goto out_put;
		}
	}
	return out;

out_put:
	json_decref(out);
	return NULL;
}

int sl_chat_record(json_t *record, json_t **messages, json_t **tools, char **err)
{
	json_t *m = json_object_get(record, "messages");
	json_t *c = json_object_get(record, "conversations");
	json_t *t = json_object_get(record, "tools");

	*messages = NULL;
	*tools = NULL;
	*err = NULL;
	if (!m && !c)
		return 1;
	if (m && c) {
		*err = sl_msgf("the record has both \"messages\" and \"conversations\"; give one");
		return -EINVAL;
	}
	if (t && json_is_string(t)) {
		/* LLaMA-Factory keeps the tools as a JSON text */
		json_error_t jerr;

		t = json_loads(json_string_value(t), 0, &jerr);
		if (!t || !json_is_array(t)) {
			*err = sl_msgf("\"tools\" is a string but not a JSON array of tools%s%s",
				       t ? "" : ": ", t ? "" : jerr.text);
			json_decref(t);
			return -EINVAL;
		}
	} else if (t && json_is_null(t)) {
		t = NULL;
	} else if (t) {
		if (!json_is_array(t)) {
			*err = sl_msgf("\"tools\" is %s; give an array of tool definitions",
				       json_type_name(t));
			return -EINVAL;
		}
		json_incref(t);
	}
	if (m) {
		json_incref(m);
	} else {
		m = sharegpt_messages(c, err);
		if (!m) {
			json_decref(t);
			return -EINVAL;
		}
	}
	*messages = m;
	*tools = t;
	return 0;
}

/* ---- rendering and tokenizing -------------------------------------------------------------- */

static int do_render(const struct sl_chat *ct, json_t *messages, json_t *tools,
		     bool keep_reasoning, struct render *r, char **err)
{
	struct msg *m;
	int n = 0;

	memset(r, 0, sizeof(*r));
	*err = NULL;
	if (!sl_chat_known(ct)) {
		char buf[1024];

		sl_chat_refusal(ct, buf, sizeof(buf));
		*err = strdup(buf);
		return -ENOTSUP;
	}
	if (tools && !json_is_array(tools)) {
		*err = sl_msgf("\"tools\" is %s; give an array of tool definitions",
			       json_type_name(tools));
		return -EINVAL;
	}
	m = parse_messages(messages, &n, err);
	if (!m)
		return -EINVAL;
	ct->known->render(r, m, n, tools, keep_reasoning);
	msgs_free(m, n);
	if (r->err || r->text.oom) {
		*err = r->err ? r->err : sl_msgf("out of memory rendering the chat");
		r->err = NULL;
		sl_chat_render_clear(r);
		return -EINVAL;
	}
	return 0;
}

int sl_chat_render(const struct sl_chat *ct, json_t *messages, json_t *tools,
		   bool keep_reasoning, char **text, size_t *len, char **err)
{
	struct render r;
	int rc = do_render(ct, messages, tools, keep_reasoning, &r, err);

	if (rc)
		return rc;
	*text = r.text.s ? r.text.s : strdup("");
	*len = r.text.n;
	r.text.s = NULL;
	sl_chat_render_clear(&r);
	return *text ? 0 : -ENOMEM;
}

static bool reserve(int32_t **ids, uint8_t **mask, size_t *cap, size_t need)
{
	size_t c = *cap ? *cap : 256;
	void *p;

	if (need <= *cap && *ids && *mask)
		return true;
	while (c < need)
		c *= 2;
	p = realloc(*ids, c * sizeof(**ids));
	if (!p)
		return false;
	*ids = p;
	p = realloc(*mask, c);
	if (!p)
		return false;
	*mask = p;
	*cap = c;
	return true;
}

static bool ascii(const char *s, size_t n)
{
	size_t i;

	for (i = 0; i < n; i++)
		if ((unsigned char)s[i] >= 0x80)
			return false;
	return true;
}

int sl_chat_encode(const struct sl_chat *ct, struct sl_tokenizer *tok, json_t *messages,
		   json_t *tools, bool keep_reasoning, int32_t **ids, uint8_t **mask, size_t *cap,
		   char **err)
{
	int32_t special_id[8], *chunk = NULL;
	size_t chunk_cap = 0, n = 0;
	struct render r;
	int rc, i, s, p = 0;

	rc = do_render(ct, messages, tools, keep_reasoning, &r, err);
	if (rc)
		return rc;
	for (i = 0; ct->known->specials[i]; i++) {
		special_id[i] = sl_tokenizer_token_to_id(tok, ct->known->specials[i]);
		if (special_id[i] < 0) {
			*err = sl_msgf("the tokenizer %s has no token %s, which the %s chat template "
				       "emits", sl_tokenizer_path(tok), ct->known->specials[i],
				       ct->known->name);
			rc = -EINVAL;
			goto out_free;
		}
	}
	/*
	 * A target starts inside a text chunk only after template text ("assistant\n"): bytes
	 * the normalizer keeps, so token ends counted in normalized bytes match there.
	 */
	for (i = 0, s = 0; i < r.ntgt; i++) {
		while (s < r.nseg && r.seg[s].start + r.seg[s].len <= r.tgt[i].start)
			s++;
		if (s < r.nseg && r.seg[s].special < 0 && r.seg[s].start < r.tgt[i].start &&
		    !ascii(r.text.s + r.seg[s].start, r.tgt[i].start - r.seg[s].start)) {
			*err = sl_msgf("internal error: a target starts after non-ASCII template text");
			rc = -EINVAL;
			goto out_free;
		}
	}
	for (s = 0; s < r.nseg; s++) {
		const struct seg *g = &r.seg[s];
		size_t cum = 0;
		int k, got;

		if (g->special >= 0) {
			if (!reserve(ids, mask, cap, n + 1))
				goto out_nomem;
			(*ids)[n] = special_id[g->special];
			n++;
			got = 1;
		} else {
			got = sl_tokenizer_encode(tok, r.text.s + g->start, g->len, true, &chunk,
						  &chunk_cap);
			if (got < 0) {
				*err = sl_msgf("cannot tokenize the rendered chat");
				rc = got;
				goto out_free;
			}
			if (!reserve(ids, mask, cap, n + got))
				goto out_nomem;
			memcpy(*ids + n, chunk, got * sizeof(*chunk));
			n += got;
		}
		/* each token's end in the rendered text; a target when it ends inside a span */
		for (k = 0; k < got; k++) {
			size_t t = n - got + k, end;

			if (g->special >= 0) {
				end = g->start + g->len;
			} else {
				int b = sl_tokenizer_token_bytes(tok, (*ids)[t]);

				cum += b > 0 ? b : 0;
				end = g->start + (k == got - 1 || cum > g->len ? g->len : cum);
			}
			while (p < r.ntgt && r.tgt[p].end < end)
				p++;
			(*mask)[t] = t > 0 && p < r.ntgt && r.tgt[p].start < end &&
				     end <= r.tgt[p].end;
		}
	}
	if (n > INT32_MAX) {
		*err = sl_msgf("the conversation makes more than %d tokens", INT32_MAX);
		rc = -E2BIG;
		goto out_free;
	}
	rc = (int)n;
	goto out_free;

out_nomem:
	*err = sl_msgf("out of memory tokenizing the chat");
	rc = -ENOMEM;
out_free:
	free(chunk);
	sl_chat_render_clear(&r);
	return rc;
}
