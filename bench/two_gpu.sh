#!/bin/bash
# Two GPUs of one host (nvidia-h200-x2), NCCL between them: the tiny model's losses with FSDP over
# 2 GPUs against 1 GPU (same records per step), and the Qwen3-4B shape at the same per-GPU batch
# on 1 and 2 GPUs (weak scaling).  After `source .devbundle/env.sh` with shardlm and mkmodel.
set -u
T=$(mktemp -d /tmp/two-XXXXXX)
export OMP_NUM_THREADS=8
python3 - "$T" <<'PY'
import json, random, sys
t = sys.argv[1]; r = random.Random(3)
with open(f"{t}/tiny.jsonl", "w") as f:
    for i in range(256):
        n = r.randint(16, 200); ids = [r.randrange(3, 512) for _ in range(n)]
        f.write(json.dumps({"input_ids": ids, "label": round(sum(x < 256 for x in ids) / n, 4)}) + "\n")
with open(f"{t}/big.jsonl", "w") as f:
    for i in range(64):
        f.write(json.dumps({"input_ids": [r.randrange(3, 151936) for _ in range(2048)], "label": round(r.random(), 3)}) + "\n")
PY
mkmodel --out "$T/tiny" --vocab 512 --hidden 128 --layers 2 --heads 4 --kv-heads 2 \
	--head-dim 64 --intermediate 256 --seed 1 >/dev/null
cat >"$T/tiny.yaml" <<YAML
model: {path: $T/tiny}
backend: cuda
data: {train: $T/tiny.jsonl, max_state: 256, seed: 1}
train: {batch: 8, accum: 2, steps: 30, eval_every: 0}
optim: {lr: 1.0e-3, warmup: 5}
checkpoint: {every: 0}
YAML
shardlm train "$T/tiny.yaml" --set run.dir="$T/g1" >"$T/g1.log" 2>&1
mpirun -np 2 shardlm train "$T/tiny.yaml" --set train.batch=4 --set run.dir="$T/g2" >"$T/g2.log" 2>&1
grep -h "collectives through" "$T/g2.log" | head -1
python3 - "$T" <<'PY'
import json, sys
t = sys.argv[1]
a = [s["loss"] for s in json.load(open(f"{t}/g1/training_metrics.json"))["steps"]]
b = [s["loss"] for s in json.load(open(f"{t}/g2/training_metrics.json"))["steps"]]
r = max(abs(x - y) / abs(x) for x, y in zip(a, b))
print(f"tiny, FSDP over 2 GPUs (NCCL) vs 1 GPU: {len(b)} steps, worst relative loss difference {r:.2e}")
PY
mkmodel --out "$T/q4b" --vocab 151936 --hidden 2560 --layers 36 --heads 32 --kv-heads 8 \
	--head-dim 128 --intermediate 9728 --seed 1 --dtype bf16 >/dev/null
cat >"$T/q4b.yaml" <<YAML
model: {path: $T/q4b}
backend: cuda
data: {train: $T/big.jsonl, max_state: 2048, seed: 1}
train: {batch: 4, accum: 1, steps: 6, eval_every: 0}
checkpoint: {every: 0}
run: {log_every: 1}
YAML
shardlm train "$T/q4b.yaml" --set run.dir="$T/b1" >"$T/b1.log" 2>&1
mpirun -np 2 shardlm train "$T/q4b.yaml" --set run.dir="$T/b2" >"$T/b2.log" 2>&1
echo "4B, batch 4 per GPU:"
grep -h "step 6/6" "$T/b1.log" "$T/b2.log"
grep -hiE "error|abort" "$T"/*.log | head -5
