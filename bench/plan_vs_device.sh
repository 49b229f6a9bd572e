#!/bin/bash
# plan_vs_device.sh [OUTDIR]: `shardlm plan` against the GPU memory the whole process used, as the
# driver reports it (nvidia-smi memory.used sampled every 100 ms during training: the CUDA
# context, cuBLAS/NCCL workspaces and any fragmentation included), on one GPU (issue 6).
# bench/offload.sh compares the planner with the cuda backend's own peak count; this compares it
# with the device.  The Qwen3-1.7B layer shape (hidden 2048, 16/8 heads, intermediate 6144, vocab
# 151936; 14 layers instead of 28 to keep it short; random weights, mkmodel), batch 4 x 2048, 3
# steps, in three placements: on-GPU state, on-GPU with activation checkpointing, offload:
# optimizer.  About 2 minutes.  Columns: the plan (with its CUDA-context estimate); what the
# trainer counts (training_metrics.json: peak_gpu_bytes, the arena's peak in use + fixed
# workspaces; reserved_gpu_bytes, the arena's chunks; device_used_bytes, cudaMemGetInfo at a
# step's end); nvidia-smi's peak.
# MODEL=q35: the Qwen3.5 4B's widths instead, one block of 3 Gated DeltaNet + 1 gated attention
# layers (bench/q35_bench.py's 4b-block preset, vocab 248320), which also checks the planner's
# count of the chunked delta rule's backward scratch.
# Programs: SHARDLM / MKMODEL, else PATH, else the build tree.  Prints a table last.
set -u
HERE=$(cd "$(dirname "$0")/.." && pwd)
OUT=${1:-/tmp/plan-vs-device}
mkdir -p "$OUT"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export SHARDLM_HOST_MEM=${SHARDLM_HOST_MEM:-128GB}
SHARDLM=${SHARDLM:-$(command -v shardlm || echo "$HERE/src/shardlm")}
MKMODEL=${MKMODEL:-$(command -v mkmodel || echo "$HERE/test/mkmodel")}
command -v nvidia-smi >/dev/null || { echo "plan_vs_device.sh: no nvidia-smi" >&2; exit 1; }
GPU_GB=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1 |
	awk '{printf "%.0f", $1 * 1048576 / 1e9}')
T=$(mktemp -d /tmp/pvd-XXXXXX)
trap 'rm -rf "$T"' EXIT

MODEL=${MODEL:-dense}
VOCAB=151936
[ "$MODEL" = q35 ] && VOCAB=248320
python3 - "$T/data.jsonl" "$VOCAB" <<'PY'
import json, random, sys
r = random.Random(7)
with open(sys.argv[1], "w") as f:
    for i in range(16):
        f.write(json.dumps({"input_ids": [r.randrange(3, int(sys.argv[2])) for _ in range(2048)],
                            "label": round(r.random(), 3)}) + "\n")
PY
if [ "$MODEL" = q35 ]; then
	python3 "$HERE/bench/q35_bench.py" model "$T/m" --preset 4b-block >"$OUT/model.log" 2>&1 ||
		{ echo "q35_bench.py model failed (see $OUT/model.log)" >&2; exit 1; }
else
	"$MKMODEL" --out "$T/m" --vocab 151936 --hidden 2048 --layers 14 --heads 16 --kv-heads 8 \
		--head-dim 128 --intermediate 6144 --seed 1 --dtype bf16 >/dev/null ||
		{ echo "mkmodel failed" >&2; exit 1; }
fi

echo "| run | offload | ckpt | plan GiB | peak (arena) | reserved | device used | nvidia-smi peak | plan vs smi |" \
	>"$OUT/table.md"
echo "|---|---|---|---|---|---|---|---|---|" >>"$OUT/table.md"
for c in "gpu none false" "gpu-ckpt none true" "opt optimizer false"; do
	set -- $c
	cat >"$T/$1.yaml" <<YAML
model: {path: $T/m}
backend: cuda
data: {train: $T/data.jsonl, max_state: 2048, seed: 1}
train: {batch: 4, accum: 1, steps: 3, activation_checkpointing: $3, eval_every: 0}
parallel: {offload: $2}
checkpoint: {every: 0}
run: {dir: $T/run-$1, log_every: 1}
export: {final: false}
YAML
	"$SHARDLM" plan "$T/$1.yaml" --gpu-mem "$GPU_GB" --host-mem 128 >"$OUT/$1.plan" 2>&1
	base=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | head -1)
	nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 100 \
		>"$OUT/$1.mem" 2>/dev/null &
	smi=$!
	timeout 300 "$SHARDLM" train "$T/$1.yaml" --fresh >"$OUT/$1.log" 2>&1 ||
		echo "$1: shardlm train failed (see $OUT/$1.log)" >&2
	kill "$smi" 2>/dev/null
	wait "$smi" 2>/dev/null
	python3 - "$OUT/$1.plan" "$OUT/$1.mem" "$base" "$1" "$2" "$3" \
		"$T/run-$1/training_metrics.json" >>"$OUT/table.md" <<'PY'
import json, re, sys
plan, mem, base, name, off, ck, mf = sys.argv[1:]
try:
    st = json.load(open(mf))["steps"]
except (OSError, ValueError):
    st = []
g = lambda k: max((s.get(k, 0) for s in st), default=0) / 2**30
tot = re.search(r"^  total\s+[0-9.]+\s+([0-9]+)", open(plan).read(), re.M)
used = [int(x) for x in open(mem).read().split() if x.isdigit()]
peak = (max(used) - int(base)) * 1048576 if used else 0
p = int(tot.group(1)) if tot else 0
rel = "%+.1f%%" % (100.0 * (p - peak) / peak) if peak and p else "-"
print("| %s | %s | %s | %.2f | %.2f | %.2f | %.2f | %.2f | %s |" % (
    name, off, ck, p / 2**30, g("peak_gpu_bytes"), g("reserved_gpu_bytes"),
    g("device_used_bytes"), peak / 2**30, rel))
PY
done
cat "$OUT/table.md"
