#!/bin/bash
# GPU smoke run and first numbers (one call on the H200 machine, after `source .devbundle/env.sh`
# with shardlm, shardlm-util and mkmodel in the bundle):
#  1. the tiny model: 50 steps on the cuda backend against the fp32 cpu backend (every step's
#     loss within 2% relative), and 2 ranks sharing the GPU (staged collectives) against 1 rank;
#  2. the trainer's GPU log reduced by shardlm-util; the TensorBoard events read back by
#     TensorBoard's own reader;
#  3. the Qwen3-4B shape (random bf16 weights), batch 4 x 2048 tokens: s/step, tokens/s, MFU,
#     peak memory.
# Prints a table last.  Usage: bench/gpu_smoke.sh [OUTDIR]
set -u
OUT=${1:-/tmp/gpu-smoke}
mkdir -p "$OUT"
T=$(mktemp -d /tmp/smoke-XXXXXX)
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-8}
python3 - "$T" <<'PY'
import json, random, sys
t = sys.argv[1]
r = random.Random(3)
with open(f"{t}/tiny.jsonl", "w") as f:
    for i in range(256):
        n = r.randint(16, 200)
        ids = [r.randrange(3, 512) for _ in range(n)]
        f.write(json.dumps({"input_ids": ids, "label": round(sum(x < 256 for x in ids) / n, 4)}) + "\n")
with open(f"{t}/big.jsonl", "w") as f:
    for i in range(64):
        ids = [r.randrange(3, 151936) for _ in range(2048)]
        f.write(json.dumps({"input_ids": ids, "label": round(r.random(), 3)}) + "\n")
PY
mkmodel --out "$T/tiny" --vocab 512 --hidden 128 --layers 2 --heads 4 --kv-heads 2 \
	--head-dim 64 --intermediate 256 --seed 1 >/dev/null
cat >"$T/tiny.yaml" <<YAML
model: {path: $T/tiny}
data: {train: $T/tiny.jsonl, max_state: 256, seed: 1}
train: {batch: 8, accum: 2, steps: 50, eval_every: 0}
optim: {lr: 1.0e-3, warmup: 5}
checkpoint: {every: 0}
gpu_log: {every_s: 0.5, file: $T/gpu-%j-%h.csv}
YAML
shardlm train "$T/tiny.yaml" --set backend=cpu --set run.dir="$T/cpu" >"$OUT/cpu.log" 2>&1
shardlm train "$T/tiny.yaml" --set backend=cuda --set run.dir="$T/cuda" >"$OUT/cuda.log" 2>&1
mpirun -np 2 --oversubscribe shardlm train "$T/tiny.yaml" --set backend=cuda \
	--set train.batch=4 --set run.dir="$T/cuda2" >"$OUT/cuda2.log" 2>&1
python3 - "$T" <<'PY' | tee "$OUT/tiny.txt"
import json, sys
t = sys.argv[1]
L = {k: [s["loss"] for s in json.load(open(f"{t}/{k}/training_metrics.json"))["steps"]]
     for k in ("cpu", "cuda", "cuda2")}
rel = max(abs(a - b) / abs(a) for a, b in zip(L["cpu"], L["cuda"]))
rel2 = max(abs(a - b) / abs(a) for a, b in zip(L["cuda"], L["cuda2"]))
print(f"tiny 50 steps: cuda vs cpu worst rel loss diff {rel:.2e} ({'ok' if rel <= 0.02 else 'FAIL'}); "
      f"2 ranks on 1 GPU vs 1 rank {rel2:.2e} ({'ok' if rel2 <= 0.02 else 'FAIL'}); "
      f"loss {L['cuda'][0]:.4f} -> {L['cuda'][-1]:.4f}")
PY
shardlm-util "$T"/gpu-*.csv --from-first-step "$T/cuda" >"$OUT/util.txt" 2>&1
python3 - "$T/cuda/tb" <<'PY' >"$OUT/tb.txt" 2>&1
import sys
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
ea = EventAccumulator(sys.argv[1]); ea.Reload()
tags = ea.Tags()["scalars"]
loss = ea.Scalars("train/loss")
print("tensorboard tags:", tags, "train/loss steps", len(loss), "first", loss[0].value, "last", loss[-1].value)
PY
mkmodel --out "$T/q4b" --vocab 151936 --hidden 2560 --layers 36 --heads 32 --kv-heads 8 \
	--head-dim 128 --intermediate 9728 --seed 1 --dtype bf16 >/dev/null
cat >"$T/q4b.yaml" <<YAML
model: {path: $T/q4b}
backend: cuda
data: {train: $T/big.jsonl, max_state: 2048, seed: 1}
train: {batch: 4, accum: 1, steps: 8, eval_every: 0}
checkpoint: {every: 0}
export: {dtype: bf16}
run: {dir: $T/q4b-run, log_every: 1}
YAML
shardlm train "$T/q4b.yaml" >"$OUT/q4b.log" 2>&1
grep -E "step [0-9]+/8" "$OUT/q4b.log" | tail -4
echo "==== summary"
cat "$OUT/tiny.txt"
tail -n 4 "$OUT/util.txt"
cat "$OUT/tb.txt" | tail -1
grep -E "step 8/8" "$OUT/q4b.log"
grep -iE "error|abort" "$OUT"/*.log | head -5
rm -rf "$T"
