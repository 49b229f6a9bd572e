/*
 * fuzz_bpe: the BPE encoder (sl_tokenizer_encode) on arbitrary text with a real byte-level BPE
 * tokenizer: $SL_FUZZ_TOKENIZER, else fuzz/bpe-tokenizer.json (a cut-down Qwen3 tokenizer made
 * by make-bpe-tokenizer.py).  The first byte picks split_special; decoding what was encoded
 * must give back ASCII text (byte-level BPE is lossless; NFC leaves ASCII alone).
 */
#include "fuzz_common.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer.h"

static struct sl_tokenizer *tok;

#define SL_FUZZ_INIT 1	/* replay.c: call LLVMFuzzerInitialize */

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	const char *p = getenv("SL_FUZZ_TOKENIZER");

	tok = sl_tokenizer_load(p ? p : SL_FUZZ_DIR "/bpe-tokenizer.json");
	if (!tok)
		abort();
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	int32_t *ids = NULL;
	size_t cap = 0, out_len;
	char *out = NULL;
	int n;

	if (size == 0)
		return 0;
	n = sl_tokenizer_encode(tok, (const char *)data + 1, size - 1, data[0] & 1, &ids, &cap);
	if (n >= 0 && sl_tokenizer_decode(tok, ids, n, &out, &out_len) == 0) {
		bool ascii = true;

		for (size_t i = 1; i < size; i++)
			ascii = ascii && data[i] < 0x80;
		if (ascii && (out_len != size - 1 || memcmp(out, data + 1, out_len) != 0))
			abort();
		free(out);
	}
	free(ids);
	return 0;
}
