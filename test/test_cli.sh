#!/bin/sh
# The command line: every bad input gives a clear error naming where and what, a non-zero exit,
# and never touches good output.
. "${top_srcdir:-$(dirname "$0")/..}/test/lib.sh"

MODEL="$T/model"
"$top_builddir/test/mkmodel" --out "$MODEL" --vocab 64 --hidden 16 --layers 1 --heads 2 \
	--kv-heads 1 --head-dim 8 --intermediate 24 --seed 3 >/dev/null || fail "mkmodel"
printf '{"input_ids":[1,2,3],"label":0.5}\n{"input_ids":[4,5],"label":0.25}\n' >"$T/ok.jsonl"
cat >"$T/base.yaml" <<YAML
model: {path: $MODEL}
backend: cpu
data: {train: $T/ok.jsonl}
train: {batch: 1, accum: 2, steps: 2}
checkpoint: {every: 0}
run: {dir: $T/run}
YAML

expect_fail "no command" "usage" "$SHARDLM"
expect_fail "unknown command" "unknown command 'frobnicate'" "$SHARDLM" frobnicate
expect_fail "no config" "no config file" "$SHARDLM" train
expect_fail "missing config file" "nope.yaml" "$SHARDLM" train "$T/nope.yaml"
expect_fail "unknown option" "unknown option --bogus" "$SHARDLM" train "$T/base.yaml" --bogus
expect_fail "bad --set" "KEY=VALUE" "$SHARDLM" train "$T/base.yaml" --set train.batch

printf 'model: {path: x}\ntrain:\n  bach: 2\n' >"$T/typo.yaml"
expect_fail "typo key" "typo.yaml:3:3.*did you mean .*train.batch" "$SHARDLM" config "$T/typo.yaml"
expect_fail "wrong type via --set" "train.batch" "$SHARDLM" config "$T/base.yaml" --set train.batch=two
expect_ok "config validates" "$SHARDLM" config "$T/base.yaml" --set train.batch=3
grep -Eq 'train\.batch +3' "$T/out" || fail "config table lacks train.batch 3"

expect_fail "cuda refused" "backend: cuda" "$SHARDLM" train "$T/base.yaml" --set backend=cuda
expect_fail "missing model dir" "$T/nomodel" "$SHARDLM" train "$T/base.yaml" \
	--set model.path="$T/nomodel" --set run.dir="$T/r1"

printf '{"input_ids":[1,2,3],"label":0.5}\n{"input_ids":[4,5],"label":1.5}\n' >"$T/bad.jsonl"
expect_fail "label out of range" "bad.jsonl:2" "$SHARDLM" train "$T/base.yaml" \
	--set data.train="$T/bad.jsonl" --set run.dir="$T/r2"
printf '{"input_ids":[1,2,3],"label":0.5}\n{"input_ids":[4,99],"label":0.5}\n' >"$T/oov.jsonl"
expect_fail "id out of vocab" "oov.jsonl:2" "$SHARDLM" train "$T/base.yaml" \
	--set data.train="$T/oov.jsonl" --set run.dir="$T/r3"
printf '{"text":"hello","label":0.5}\n' >"$T/text.jsonl"
expect_fail "text needs tokenizer" "text.jsonl:1.*tokenizer" "$SHARDLM" train "$T/base.yaml" \
	--set data.train="$T/text.jsonl" --set run.dir="$T/r4"
printf '{"input_ids":[1,2,3],"label":0.5}\n{"input_ids":[4,5],"label":1.5}\n{"input_ids":[6],"label":0.1}\n' >"$T/skip.jsonl"
expect_ok "on_error skip" "$SHARDLM" train "$T/base.yaml" --set data.train="$T/skip.jsonl" \
	--set data.on_error=skip --set run.dir="$T/r5"
grep -q "skipped 1 bad line" "$T/out" || fail "skip count not reported"

# a damaged weights file
cp -r "$MODEL" "$T/broken"
head -c 100 "$MODEL/model.safetensors" >"$T/broken/model.safetensors"
expect_fail "truncated safetensors" "broken/model.safetensors" "$SHARDLM" train "$T/base.yaml" \
	--set model.path="$T/broken" --set run.dir="$T/r6"

# a run directory is never overwritten
expect_ok "first run" "$SHARDLM" train "$T/base.yaml"
cp "$T/run/training_metrics.json" "$T/metrics.before"
expect_fail "existing run refused" "--fresh" "$SHARDLM" train "$T/base.yaml"
cmp -s "$T/run/training_metrics.json" "$T/metrics.before" || fail "existing run was touched"
expect_ok "--fresh moves aside" "$SHARDLM" train "$T/base.yaml" --fresh
[ -f "$T/run.old-1/training_metrics.json" ] || fail "old run not kept as run.old-1"
cmp -s "$T/run.old-1/training_metrics.json" "$T/metrics.before" || fail "old run changed"

expect_fail "score needs --data" "--data" "$SHARDLM" score "$T/base.yaml"
expect_ok "score" "$SHARDLM" score "$T/base.yaml" --data "$T/ok.jsonl"
[ "$(grep -c '"index"' "$T/out")" = 2 ] || fail "score printed $(grep -c index "$T/out") lines"

if [ -n "${MPIRUN:-}" ] && command -v "$MPIRUN" >/dev/null 2>&1; then
	expect_ok "two ranks train" "$MPIRUN" -np 2 --oversubscribe \
		"$SHARDLM" train "$T/base.yaml" --set run.dir="$T/r7"
	expect_fail "score refuses several ranks" "one rank" "$MPIRUN" -np 2 --oversubscribe \
		"$SHARDLM" score "$T/base.yaml" --data "$T/ok.jsonl"
	expect_fail "node_size must divide the world" "node_size 3 does not divide" "$MPIRUN" \
		-np 2 --oversubscribe "$SHARDLM" train "$T/base.yaml" --set run.dir="$T/r8" \
		--set parallel.node_size=3
fi
finish
