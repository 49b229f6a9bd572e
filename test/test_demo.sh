#!/bin/sh
# The demo end to end: the bundled records train the tiny model, the loss goes down, and the run
# directory holds what DESIGN.md §3 says.
. "${top_srcdir:-$(dirname "$0")/..}/test/lib.sh"

MODEL="$T/tiny"
"$top_builddir/test/mkmodel" --out "$MODEL" --vocab 512 --hidden 64 --layers 2 --heads 4 \
	--kv-heads 2 --head-dim 16 --intermediate 128 --seed 1 >/dev/null || fail "mkmodel"
cd "$top_srcdir" || exit 1
expect_ok "demo trains" "$SHARDLM" train conf/demo.yaml --set model.path="$MODEL" \
	--set run.dir="$T/run"
cp "$T/out" "$T/train.out"
R="$T/run"
for f in config.yaml provenance.json train.log training_metrics.json model/config.json \
	model/model.safetensors; do
	[ -s "$R/$f" ] || fail "run directory lacks $f"
done
grep -q "dropped 0 of 480 records that exceed the training context (max_state 48)" "$R/train.log" ||
	fail "no dropped-records line"
grep -Eq '^\[[0-9][0-9]:[0-9][0-9]\] ' "$R/train.log" || fail "log lines lack [mm:ss]"
grep -Eq '^\[[0-9:]+\] step 120/120 ' "$R/train.log" || fail "no final step line"
tail -n 1 "$R/train.log" | grep -q "the job ran" || fail "last line does not say how long"
# loss goes down: mean of the last 20 steps well below the first 10 (python3 only for reading)
python3 - "$R/training_metrics.json" <<'PY' || fail "loss did not go down"
import json, sys
m = json.load(open(sys.argv[1]))
loss = [s["loss"] for s in m["steps"]]
first, last = sum(loss[:10]) / 10, sum(loss[-20:]) / 20
print(f"loss first 10 {first:.4f}, last 20 {last:.4f}")
ev = [e["loss"] for e in m["eval"]]
print("eval", ev)
keys = {"world", "batch", "accum", "records_per_step", "epoch_records", "dropped_records",
        "total_records", "params", "max_state", "start_unix", "start_local"}
assert keys <= set(m["run"]), keys - set(m["run"])
for s in m["steps"]:
    assert {"step", "time_s", "end_unix", "loss", "lr", "grad_norm", "records", "tokens",
            "padded_tokens", "peak_gpu_bytes"} <= set(s)
    assert s["records"] == 16
assert len(m["steps"]) == 120
assert last < first - 0.01 and ev[-1] < ev[0], (first, last, ev)
PY
# the written config reads back to the same resolved values
expect_ok "config.yaml reloads" "$SHARDLM" config "$R/config.yaml"
"$SHARDLM" config conf/demo.yaml --set model.path="$MODEL" --set run.dir="$T/run" \
	>"$T/a.txt" 2>&1
tail -n +2 "$T/a.txt" >"$T/a.tab"
tail -n +2 "$T/out" >"$T/b.tab"
cmp -s "$T/a.tab" "$T/b.tab" || { fail "config.yaml differs from the resolved config";
	diff "$T/a.tab" "$T/b.tab" >&2; }
# scoring with the exported model
expect_ok "score" "$SHARDLM" score conf/demo.yaml --set run.dir="$R" \
	--data conf/demo/valid.jsonl
[ "$(grep -c '"prob"' "$T/out")" = 64 ] || fail "score did not print 64 lines"

# the README demo's text path: the real Qwen3 tokenizer, a model with its vocabulary, 3 steps on
# two ranks (tokenized once into a cache in the test's folder)
TOK=$("$top_srcdir/tools/fetch-tokenizer" qwen3 "$T/tokenizers") || fail "fetch-tokenizer"
"$top_builddir/test/mkmodel" --out "$T/text-model" --vocab 151936 --hidden 32 --layers 1 \
	--heads 2 --kv-heads 1 --head-dim 16 --intermediate 64 --seed 2 >/dev/null || fail "mkmodel"
cp "$TOK" "$T/text-model/"
if [ -n "${MPIRUN:-}" ]; then
	expect_ok "text demo on 2 ranks" env SHARDLM_CACHE_DIR="$T/cache" "$MPIRUN" -np 2 \
		--oversubscribe "$SHARDLM" train conf/demo-text.yaml --set model.path="$T/text-model" \
		--set run.dir="$T/text-run" --set train.batch=8 --set train.steps=3 \
		--set checkpoint.every=0
	grep -q "dropped 164 of 320 records that exceed the training context (max_state 512)" \
		"$T/text-run/train.log" || fail "text demo: no dropped-records line"
	grep -Eq "step 3/3 " "$T/text-run/train.log" || fail "text demo: no step 3"
	ls "$T/cache"/filings-train.jsonl-*.tok >/dev/null 2>&1 || fail "no tokenization cache"
fi
finish
