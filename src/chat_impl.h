/*
 * chat_impl.h: what chat.c, chat_render.c and the template renderers (chat_qwen3.c) share:
 * the rendered-text builder (text, template-emitted special tokens, target spans), validated
 * messages, tojson, and the Python string methods templates use.  Private to the chat module.
 */
#ifndef SL_CHAT_IMPL_H
#define SL_CHAT_IMPL_H

#include <stdbool.h>
#include <stddef.h>
#include <string.h>

#include <jansson.h>

struct sbuf {
	char *s;
	size_t n, cap;
	bool oom;
};

struct seg {
	size_t start, len;
	int special;			/* index into the template's specials, -1 = text */
};

struct span {
	size_t start, end;		/* bytes [start, end) of the rendered text */
};

struct render {
	struct sbuf text;
	struct seg *seg;
	int nseg, seg_cap;
	struct span *tgt;
	int ntgt, tgt_cap;
	char *err;			/* the first error (malloc'ed) */
};

enum role { ROLE_SYSTEM, ROLE_USER, ROLE_ASSISTANT, ROLE_TOOL };

extern const char *const sl_chat_role_names[];	/* (4) by enum role */

struct call {
	const char *name;
	json_t *args;			/* a string (emitted as is) or any JSON (tojson) */
};

struct msg {
	enum role role;
	const char *content;
	size_t content_len;
	const char *reasoning;		/* reasoning_content, NULL when absent or null */
	size_t reasoning_len;
	struct call *calls;
	int n_calls;
};

/* buffers */
void sl_chat_put(struct sbuf *b, const char *s, size_t n);
/* Python's json.dumps(j, ensure_ascii=False), appended */
void sl_chat_dump_json(struct sbuf *b, json_t *j);

/* the builder: text, a special token the template emits, a target span's start and end */
void sl_chat_text(struct render *r, const char *s, size_t n);
void sl_chat_str(struct render *r, const char *s);
void sl_chat_special(struct render *r, int which, const char *content);
void sl_chat_target_begin(struct render *r);
void sl_chat_target_end(struct render *r);
void sl_chat_render_clear(struct render *r);

/* ---- Python string methods over (pointer, length) ------------------------------------------ */

struct str {
	const char *s;
	size_t n;
};

static inline struct str lstrip_nl(struct str x)
{
	while (x.n && x.s[0] == '\n') {
		x.s++;
		x.n--;
	}
	return x;
}

static inline struct str rstrip_nl(struct str x)
{
	while (x.n && x.s[x.n - 1] == '\n')
		x.n--;
	return x;
}

static inline const char *find(struct str x, const char *needle)
{
	return memmem(x.s, x.n, needle, strlen(needle));
}

static inline const char *find_last(struct str x, const char *needle)
{
	size_t nl = strlen(needle), i;

	if (x.n < nl)
		return NULL;
	for (i = x.n - nl + 1; i-- > 0;)
		if (!memcmp(x.s + i, needle, nl))
			return x.s + i;
	return NULL;
}

static inline bool starts_with(struct str x, const char *p)
{
	size_t n = strlen(p);

	return x.n >= n && !memcmp(x.s, p, n);
}

static inline bool ends_with(struct str x, const char *p)
{
	size_t n = strlen(p);

	return x.n >= n && !memcmp(x.s + x.n - n, p, n);
}

/* ---- renderers of known templates ---------------------------------------------------------- */

/* the Qwen3 template (chat_qwen3.c); its special tokens: <|im_start|>, <|im_end|> */
extern const char *const sl_chat_qwen3_specials[];
void sl_chat_qwen3_render(struct render *r, const struct msg *m, int n, json_t *tools,
			  bool keep_reasoning);

#endif
