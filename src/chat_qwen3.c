/*
 * chat_qwen3: the Qwen3 chat template (Qwen3 dense and MoE), rendered as its Jinja text does
 * with add_generation_prompt false.  Written from the template (tokenizer_config.json of the
 * Qwen3 releases); comments quote the template where its logic is subtle.
 */
#define _GNU_SOURCE
#include "chat_impl.h"

#include <stdlib.h>
#include <string.h>

enum { QWEN3_IM_START, QWEN3_IM_END };
const char *const sl_chat_qwen3_specials[] = { "<|im_start|>", "<|im_end|>", NULL };

static const char qwen3_tools_head[] =
	"# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
	"You are provided with function signatures within <tools></tools> XML tags:\n<tools>";
static const char qwen3_tools_tail[] =
	"\n</tools>\n\nFor each function call, return a json object with function name and "
	"arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": "
	"<function-name>, \"arguments\": <args-json-object>}\n</tool_call>";

static void qwen3_turn(struct render *r, const char *role, struct str content)
{
	sl_chat_special(r, QWEN3_IM_START, "<|im_start|>");
	sl_chat_str(r, role);
	sl_chat_str(r, "\n");
	sl_chat_text(r, content.s, content.n);
	sl_chat_special(r, QWEN3_IM_END, "<|im_end|>");
	sl_chat_str(r, "\n");
}

static void qwen3_assistant(struct render *r, const struct msg *m, bool after_query, bool last,
			    bool keep_reasoning)
{
	struct str content = { m->content, m->content_len }, reasoning = { "", 0 };
	const char *cut;
	int k;

	if (m->reasoning) {
		reasoning = (struct str){ m->reasoning, m->reasoning_len };
	} else if ((cut = find(content, "</think>"))) {
		/* content.split('</think>')[-1].lstrip('\n') */
		const char *after = find_last(content, "</think>") + strlen("</think>");
		/* content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') */
		struct str head = rstrip_nl((struct str){ content.s, cut - content.s });
		const char *open = find_last(head, "<think>");

		if (open)
			head = (struct str){ open + 7, head.s + head.n - (open + 7) };
		reasoning = lstrip_nl(head);
		content = lstrip_nl((struct str){ after, content.s + content.n - after });
	}
	sl_chat_special(r, QWEN3_IM_START, "<|im_start|>");
	sl_chat_str(r, "assistant\n");
	sl_chat_target_begin(r);
	/*
	 * The template shows the think block only after the last user query (always on the last
	 * turn); keep_reasoning shows every non-empty one (the departure chat.h documents).
	 */
	if ((after_query && (last || reasoning.n)) || (keep_reasoning && reasoning.n)) {
		struct str rs = lstrip_nl(rstrip_nl(reasoning)), shown = lstrip_nl(content);

		sl_chat_str(r, "<think>\n");
		sl_chat_text(r, rs.s, rs.n);
		sl_chat_str(r, "\n</think>\n\n");
		sl_chat_text(r, shown.s, shown.n);
	} else {
		sl_chat_text(r, content.s, content.n);
	}
	/* "\n" before the first call when `content` (not the stripped text shown) is non-empty */
	for (k = 0; k < m->n_calls; k++) {
		const struct call *c = &m->calls[k];

		if (k || content.n)
			sl_chat_str(r, "\n");
		sl_chat_str(r, "<tool_call>\n{\"name\": \"");
		sl_chat_str(r, c->name);
		sl_chat_str(r, "\", \"arguments\": ");
		if (json_is_string(c->args)) {
			sl_chat_text(r, json_string_value(c->args), json_string_length(c->args));
		} else {
			struct sbuf b = { 0 };

			sl_chat_dump_json(&b, c->args);
			if (b.oom)
				r->text.oom = true;
			else
				sl_chat_text(r, b.s, b.n);
			free(b.s);
		}
		sl_chat_str(r, "}\n</tool_call>");
	}
	sl_chat_special(r, QWEN3_IM_END, "<|im_end|>");
	sl_chat_target_end(r);
	sl_chat_str(r, "\n");
}

void sl_chat_qwen3_render(struct render *r, const struct msg *m, int n, json_t *tools,
			 bool keep_reasoning)
{
	int i, last_query = n - 1;
	size_t k;
	json_t *t;

	if (json_array_size(tools)) {
		sl_chat_special(r, QWEN3_IM_START, "<|im_start|>");
		sl_chat_str(r, "system\n");
		if (m[0].role == ROLE_SYSTEM) {
			sl_chat_text(r, m[0].content, m[0].content_len);
			sl_chat_str(r, "\n\n");
		}
		sl_chat_str(r, qwen3_tools_head);
		json_array_foreach(tools, k, t) {
			struct sbuf b = { 0 };

			sl_chat_str(r, "\n");
			sl_chat_dump_json(&b, t);
			if (b.oom)
				r->text.oom = true;
			else
				sl_chat_text(r, b.s, b.n);
			free(b.s);
		}
		sl_chat_str(r, qwen3_tools_tail);
		sl_chat_special(r, QWEN3_IM_END, "<|im_end|>");
		sl_chat_str(r, "\n");
	} else if (m[0].role == ROLE_SYSTEM) {
		qwen3_turn(r, "system", (struct str){ m[0].content, m[0].content_len });
	}
	/* the last user turn that is not a wrapped tool response (ns.last_query_index) */
	for (i = n - 1; i >= 0; i--) {
		struct str c = { m[i].content, m[i].content_len };

		if (m[i].role == ROLE_USER &&
		    !(starts_with(c, "<tool_response>") && ends_with(c, "</tool_response>"))) {
			last_query = i;
			break;
		}
	}
	for (i = 0; i < n; i++) {
		struct str c = { m[i].content, m[i].content_len };

		switch (m[i].role) {
		case ROLE_SYSTEM:
		case ROLE_USER:
			/* the first system turn went out above; a later one renders like a user's */
			if (m[i].role == ROLE_USER || i > 0)
				qwen3_turn(r, sl_chat_role_names[m[i].role], c);
			break;
		case ROLE_ASSISTANT:
			qwen3_assistant(r, &m[i], i > last_query, i == n - 1, keep_reasoning);
			break;
		case ROLE_TOOL:
			if (i == 0 || m[i - 1].role != ROLE_TOOL) {
				sl_chat_special(r, QWEN3_IM_START, "<|im_start|>");
				sl_chat_str(r, "user");
			}
			sl_chat_str(r, "\n<tool_response>\n");
			sl_chat_text(r, c.s, c.n);
			sl_chat_str(r, "\n</tool_response>");
			if (i == n - 1 || m[i + 1].role != ROLE_TOOL) {
				sl_chat_special(r, QWEN3_IM_END, "<|im_end|>");
				sl_chat_str(r, "\n");
			}
			break;
		}
	}
}

