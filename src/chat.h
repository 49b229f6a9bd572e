/*
 * chat: a model's chat template, recognized and rendered in C, tokenized with a loss mask.
 *
 * The template (chat_template.jinja beside tokenizer.json, else tokenizer_config.json's
 * "chat_template") is recognized by its exact text among the templates this file knows (a table:
 * name, length, hash); there is no Jinja interpreter.  Each known template has a renderer that
 * does exactly what the template does with add_generation_prompt false, so that the ids equal
 * Hugging Face's apply_chat_template(messages, tools=..., tokenize=True).  An unknown template
 * loads (pre-tokenized and text data still train) but refuses to render, naming the file and
 * the templates that are known.
 *
 * Tokenization follows HF: the text between the special tokens the template emits is encoded as
 * one chunk (so a message's text merges with template text around it exactly as in HF).  Two
 * departures, both deliberate:
 *  - special tokens are recognized only where the template emits them: "<|im_end|>" written
 *    inside a message is plain text (HF would make it the special token and let data forge turn
 *    boundaries).  Non-special added tokens (<think>, <tool_call>, ...) are recognized anywhere,
 *    as HF does, so content holding them still matches HF's ids.
 *  - keep_reasoning (data.keep_reasoning) keeps the <think> block of assistant turns before the
 *    last user query, which the Qwen3 template drops.
 *
 * Loss mask: mask[t] = 1 when token t is a target (predicted by the logits at t-1).  The targets
 * of an assistant turn are its bytes after "<|im_start|>assistant\n" through its "<|im_end|>"
 * (the reasoning block included, the "\n" after <|im_end|> not).  A token is a target when it
 * ends inside that byte span: a token straddling the start (the "\n" after "assistant" merged
 * with newlines that open the content) counts, since it is the first thing the model writes.
 * mask[0] is always 0.
 */
#ifndef SL_CHAT_H
#define SL_CHAT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

struct sl_tokenizer;
struct sl_chat;

/*
 * Loads the chat template beside @path (a model or tokenizer directory, or a file in one, such
 * as its tokenizer.json).  0 with *out set, or with *out NULL when the directory has none;
 * negative after sl_error for an unreadable or malformed file.  An unknown template is loaded
 * with sl_chat_known() false.
 */
int sl_chat_load(const char *path, struct sl_chat **out);
void sl_chat_free(struct sl_chat *ct);
/* Whether a renderer knows this template. */
bool sl_chat_known(const struct sl_chat *ct);
/* The known template's name ("qwen3"), or "unknown". */
const char *sl_chat_name(const struct sl_chat *ct);
/* A 64-bit hash of the template text (cache keys). */
uint64_t sl_chat_hash(const struct sl_chat *ct);
/*
 * Why @ct cannot render (unknown template: its file, size and hash, the known templates, what
 * to do) into @buf.
 */
void sl_chat_refusal(const struct sl_chat *ct, char *buf, size_t n);

/*
 * A chat record's messages: "messages" [{role, content, ...}] as is, or ShareGPT
 * "conversations" [{from, value}] turned into messages (human/user -> user, gpt/assistant/model/
 * chatgpt -> assistant, system, tool/function/observation/ipython -> tool); "tools" (an array,
 * or a string holding one) in *tools, NULL when absent.  Both are new references.  0, 1 when
 * the record is no chat record, negative with *err (malloc'ed) when it is a malformed one.
 */
int sl_chat_record(json_t *record, json_t **messages, json_t **tools, char **err);

/*
 * Renders @messages (JSON array of {role, content, reasoning_content?, tool_calls?}) with
 * @tools (JSON array or NULL) into *text (malloc'ed, NUL-terminated, *len bytes).  0, or
 * negative with *err (malloc'ed: which message and why).  Thread-safe; prints nothing.
 */
int sl_chat_render(const struct sl_chat *ct, json_t *messages, json_t *tools,
		   bool keep_reasoning, char **text, size_t *len, char **err);

/*
 * Renders and tokenizes: *ids and *mask (capacity *cap each, grown with realloc; the caller
 * frees).  Returns the number of tokens, or negative with *err (malloc'ed).  Thread-safe.
 */
int sl_chat_encode(const struct sl_chat *ct, struct sl_tokenizer *tok, json_t *messages,
		   json_t *tools, bool keep_reasoning, int32_t **ids, uint8_t **mask, size_t *cap,
		   char **err);

/* Python's json.dumps(x, ensure_ascii=False) of @j (transformers' tojson) into *out. */
int sl_chat_tojson(json_t *j, char **out, size_t *len);

#endif
