/*
 * fuzz_tokenizer: the tokenizer.json loader (sl_tokenizer_load) on arbitrary bytes; a tokenizer
 * it accepts then encodes and decodes a fixed text, so a loaded-but-inconsistent table shows.
 */
#include "fuzz_common.h"

#include <stdlib.h>
#include <string.h>

#include "tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static const char text[] = "Hello, world! <|im_end|> 123 caf\xc3\xa9\n\n  x";
	struct sl_tokenizer *t;
	int32_t *ids = NULL;
	size_t cap = 0;
	char path[64], *out = NULL;
	size_t out_len;
	int rc = fuzz_memfile(data, size, path, sizeof(path)), n;

	if (rc < 0)
		return 0;
	t = sl_tokenizer_load(path);
	if (t) {
		n = sl_tokenizer_encode(t, text, sizeof(text) - 1, false, &ids, &cap);
		if (n > 0 && sl_tokenizer_decode(t, ids, n, &out, &out_len) == 0)
			free(out);
		free(ids);
		sl_tokenizer_free(t);
	}
	unlink(path);
	return 0;
}
