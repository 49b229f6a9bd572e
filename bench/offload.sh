#!/bin/sh
# bench/offload.sh MODEL_DIR_4B [MODEL_DIR_8B]: the offload measurements of issue 6 on one GPU
# (an H200, 16 cores, 128 GB host memory), in one call.  SKELETON: it needs the CUDA backend in
# `train` (backend: cuda) and its peak_gpu_bytes; run it there and put the numbers in
# bench/RESULTS.md.  What it runs:
#   1. planner vs measured peak GPU memory (within 10%) for three configs of the 4B shape
#      (hidden 2560, 36 layers, 32/8 heads, intermediate 9728): no offload + checkpointing,
#      offload optimizer, offload params; peak = training_metrics.json steps[].peak_gpu_bytes;
#   2. the host's copy bandwidth (a 4 GiB memcpy, all cores) and the CPU AdamW alone
#      (bytes moved per step: 28 per parameter: read p, m, v, g, write p, m, v) -> % of copy
#      bandwidth (target >= 70%) and T_adam;
#   3. the first user's step shape (batch 4 x accum 4 x 2048 tokens) on the 4B shape: on-GPU
#      optimizer state vs offload: optimizer (target: <= on-GPU step + T_adam) and offload: params;
#      tokens/s against PyTorch FSDP2 CPUOffloadPolicy (7.7 s/step, ~1,060 tokens/s at batch 4 x
#      2048, accum 1, measured before issue 6): target >= 5x;
#   4. the 8B shape (hidden 4096, 36 layers, 32/8 heads, intermediate 12288) with offload:
#      optimizer: trains, or `shardlm plan --host-mem 128` says why not beforehand.
set -eu
m4=${1:?usage: bench/offload.sh MODEL_DIR_4B [MODEL_DIR_8B]}
m8=${2:-}
shardlm=${SHARDLM:-shardlm}
here=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:-$here/bench/offload-$(date +%Y%m%d-%H%M%S)}
mkdir -p "$out"
data=$out/filings.jsonl
python3 "$here/tools/gen-filings.py" --n 4000 --seed 5 >"$data"

conf() { # conf NAME MODEL BATCH ACCUM OFFLOAD CKPT STEPS
	cat >"$out/$1.yaml" <<YAML
model: {path: $2}
backend: cuda
data: {train: $data, max_state: 2048, length_sort: false}
train: {batch: $3, accum: $4, steps: $7, activation_checkpointing: $6, eval_every: 0}
parallel: {offload: $5}
checkpoint: {every: 0}
run: {dir: $out/$1, log_every: 1}
YAML
}

# 1. planner vs measured
for c in "none true" "optimizer false" "params false"; do
	set -- $c
	conf "peak-$1-$2" "$m4" 1 1 "$1" "$2" 5
	$shardlm plan "$out/peak-$1-$2.yaml" --gpu-mem 141 --host-mem 128 >"$out/peak-$1-$2.plan" || true
	$shardlm train "$out/peak-$1-$2.yaml" --fresh >"$out/peak-$1-$2.log" 2>&1
done

# 2. copy bandwidth and CPU AdamW alone: TODO a small driver (bench/adamw_host.c) timing
#    sl_adamw_elem over the 4B shape's 4.0 B parameters split per unit, OMP_NUM_THREADS=16,
#    against memcpy of the same bytes.

# 3. step time: on-GPU state (ckpt on to fit), offload optimizer, offload params
conf step-gpu "$m4" 4 4 none true 12
conf step-opt "$m4" 4 4 optimizer true 12
conf step-par "$m4" 4 4 params true 12
conf fsdp2-shape "$m4" 4 1 params true 12
for r in step-gpu step-opt step-par fsdp2-shape; do
	$shardlm train "$out/$r.yaml" --fresh >"$out/$r.log" 2>&1 || echo "$r failed" >&2
done
"$here/tools/shardlm-epoch" "$out"/step-* "$out"/fsdp2-shape --warmup 2 >"$out/epoch.txt" || true

# 4. the 8B shape with optimizer offload on 128 GB of host memory
if [ -n "$m8" ]; then
	conf 8b-opt "$m8" 4 4 optimizer true 5
	if $shardlm plan "$out/8b-opt.yaml" --gpu-mem 141 --host-mem 128 >"$out/8b-opt.plan"; then
		$shardlm train "$out/8b-opt.yaml" --fresh >"$out/8b-opt.log" 2>&1
	fi
fi
echo "results in $out"
