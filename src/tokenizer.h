/*
 * tokenizer: byte-level BPE from a Hugging Face tokenizer.json, with the ids Hugging Face
 * tokenizers gives (Tokenizer.encode(text, add_special_tokens=False).ids).
 *
 * Pipeline, as HF runs it: added tokens are cut out of the raw text (leftmost-longest; the
 * non-normalized ones first, the normalized ones after normalization), the rest is normalized
 * (NFC etc. through utf8proc), pre-tokenized (Split regexes through PCRE2, ByteLevel), and each
 * pre-token is merged by BPE rank.  Decoding maps the byte-level alphabet back to bytes.
 * A loaded tokenizer is read-only except for its pre-token cache (striped locks), so any number
 * of threads may encode with one tokenizer at once.
 */
#ifndef SL_TOKENIZER_H
#define SL_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct sl_tokenizer;

/*
 * Loads @path: a tokenizer.json, or a directory holding one (a model dir).  NULL after an
 * error printed through sl_error naming the file.
 */
struct sl_tokenizer *sl_tokenizer_load(const char *path);
void sl_tokenizer_free(struct sl_tokenizer *tok);

/*
 * Encodes @len bytes of UTF-8 @text into *ids (capacity *cap ids; grown with realloc, the
 * caller frees).  @split_special: special added tokens written in the text are plain text (HF's
 * encode_special_tokens); non-special added tokens are still recognized.  Returns the number of
 * ids, or a negative errno after sl_error (invalid UTF-8: -EILSEQ, naming the byte offset).
 */
int sl_tokenizer_encode(struct sl_tokenizer *tok, const char *text, size_t len,
			bool split_special, int32_t **ids, size_t *cap);

/*
 * Decodes @n ids into *out (NUL-terminated, *out_len bytes, malloc'ed; the caller frees), as
 * HF's decode(ids, skip_special_tokens=False): invalid UTF-8 becomes U+FFFD.  Negative errno
 * for an id outside the vocabulary.
 */
int sl_tokenizer_decode(const struct sl_tokenizer *tok, const int32_t *ids, size_t n,
			char **out, size_t *out_len);

/* The id of a token (an added token's content or a vocabulary entry), or -1. */
int32_t sl_tokenizer_token_to_id(const struct sl_tokenizer *tok, const char *token);
/*
 * The number of bytes token @id stands for in the (normalized) text it came from: its decoded
 * bytes, before decode's repair of invalid UTF-8; -1 for an id outside the vocabulary.  Sums
 * over an encoding map tokens back to byte offsets (chat.c's loss masks).
 */
int sl_tokenizer_token_bytes(const struct sl_tokenizer *tok, int32_t id);
/* One past the largest id (the embedding rows the model needs at least). */
int sl_tokenizer_vocab_size(const struct sl_tokenizer *tok);
/* The tokenizer.json that was loaded. */
const char *sl_tokenizer_path(const struct sl_tokenizer *tok);
/* A 64-bit hash of the tokenizer.json bytes (cache keys, provenance). */
uint64_t sl_tokenizer_hash(const struct sl_tokenizer *tok);
/* How many pre-tokens went through BPE (cache misses) since loading: tests and benchmarks. */
uint64_t sl_tokenizer_bpe_count(const struct sl_tokenizer *tok);

/* An sl_tokenize_fn (data.h) over sl_tokenizer_encode: @ctx is the tokenizer. */
int sl_tokenizer_encode_cb(void *ctx, const char *text, size_t len, int32_t **ids,
			   size_t *cap);

/* A 64-bit hash of bytes (not cryptographic; cache keys). */
uint64_t sl_hash64(const void *p, size_t n, uint64_t seed);

/* shardlm tokenize --tokenizer PATH [--split-special]: JSONL on stdin, id arrays on stdout */
int sl_cmd_tokenize(int argc, char **argv);

#endif
