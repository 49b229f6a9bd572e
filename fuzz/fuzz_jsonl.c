/*
 * fuzz_jsonl: the JSONL record parser (sl_data_load) on arbitrary bytes: pre-tokenized ids,
 * text through a byte tokenizer, labels, loss masks, chat messages, blank and oversized lines.
 */
#include "fuzz_common.h"

#include <stdlib.h>
#include <string.h>

#include "data.h"

/* one id per byte: enough to exercise the text path without a real tokenizer */
static int byte_tokenize(void *ctx, const char *text, size_t len, int32_t **ids, size_t *cap)
{
	if (*cap < len + 1) {
		int32_t *p = realloc(*ids, (len + 1) * sizeof(**ids));

		if (!p)
			return -1;
		*ids = p;
		*cap = len + 1;
	}
	for (size_t i = 0; i < len; i++)
		(*ids)[i] = (unsigned char)text[i];
	return (int)len;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct sl_data_opts o = { .max_state = 64, .vocab = 300, .tokenize = byte_tokenize };
	struct sl_dataset ds;
	char path[64];
	int rc;

	if (size == 0)
		return 0;
	/* the first byte picks the options; the rest is the file */
	o.need_label = data[0] & 1;
	o.skip_errors = data[0] & 2;
	if (data[0] & 4)
		o.max_state = 0;
	rc = fuzz_memfile(data + 1, size - 1, path, sizeof(path));
	if (rc < 0)
		return 0;
	if (sl_data_load(&ds, path, &o) == 0)
		sl_data_free(&ds);
	unlink(path);
	return 0;
}
