#!/bin/bash
# kernel_profile.sh: where a shardlm training step spends its GPU time, kernel by kernel, on one
# block of layers of the benchmark shapes, under Nsight Compute (the GPU machine has ncu but no
# nsys).  On the GPU machine, after `source .devbundle/env.sh` (bundle: src/shardlm, test/mkmodel):
#   bash bench/kernel_profile.sh [OUTDIR]
# MODELS (default "q35 dense"): q35 = bench/q35_bench.py's 4b-block preset (the Qwen3.5 4B's
# widths, 3 Gated DeltaNet layers + 1 gated attention layer, vocab 248320); dense = the Qwen3 4B
# shape of train_vs_fsdp2.sh (hidden 2560, 32/8 heads of 128, intermediate 9728, vocab 151936)
# with LAYERS (4) layers; moe = issue 8's Qwen3-MoE (bench/moe_model.py: hidden 2048, 64 experts
# top 8, moe_intermediate 768, 32/4 heads of 128, vocab 151936) with LAYERS layers, task sft on
# batch 2 x 4096.  Task classify (q35, dense), backend cuda, batch BATCH (4) x SEQ (2048), STEPS
# (2) steps, no activation checkpointing.  ncu times each kernel of the last step alone (the
# trainer's NVTX range "step STEPS"; ALL_STEPS=1: every step, the total divided by STEPS;
# --clock-control none, the clocks left as they are; kernels serialized, so overlap is not
# shown): gpu__time_duration per launch, summed by kernel function, biggest first, then the
# shares by kind (GEMM, attention, delta rule, optimizer, communication, rest).  Prints one
# table per model; raw CSV and logs in OUTDIR.  NCU_ARGS: more ncu options (e.g. "--cache-control
# none": caches not flushed before each kernel, closer to the kernel's time in the step).
set -u
OUT=${1:-/tmp/kernel-profile}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/.." && pwd)
MODELS=${MODELS:-q35 dense}
LAYERS=${LAYERS:-4}
BATCH=${BATCH:-4}
SEQ=${SEQ:-2048}
STEPS=${STEPS:-2}
SHARDLM=${SHARDLM:-$(command -v shardlm || echo "$ROOT/src/shardlm")}
MKMODEL=${MKMODEL:-$(command -v mkmodel || echo "$ROOT/test/mkmodel")}
NCU=${NCU:-$(command -v ncu || echo /usr/local/cuda/bin/ncu)}
T=$(mktemp -d /tmp/kprof-XXXXXX)
trap 'rm -rf "$T"' EXIT
PY="python3 $HERE/q35_bench.py"

for m in $MODELS; do
	case $m in
	q35)
		$PY model "$T/$m" --preset 4b-block >"$OUT/model-$m.log" 2>&1 ;;
	dense)
		"$MKMODEL" --out "$T/$m" --vocab 151936 --hidden 2560 --layers "$LAYERS" --heads 32 \
			--kv-heads 8 --head-dim 128 --intermediate 9728 --seed 1 --dtype bf16 \
			>"$OUT/model-$m.log" 2>&1 ;;
	moe)
		python3 "$HERE/moe_model.py" "$T/$m" "$T/$m.jsonl" --layers "$LAYERS" \
			--records $((2 * STEPS)) >"$OUT/model-$m.log" 2>&1 ;;
	*)
		echo "kernel_profile.sh: MODELS: unknown model $m (q35, dense or moe)" >&2
		exit 2 ;;
	esac || { tail -3 "$OUT/model-$m.log" >&2; exit 1; }
	task=classify b=$BATCH n=$SEQ
	if [ "$m" = moe ]; then
		task=sft b=2 n=4096
	else
		$PY data "$T/$m.jsonl" --config "$T/$m/config.json" --records $((BATCH * STEPS)) \
			--seq "$SEQ" 2>>"$OUT/model-$m.log" || exit 1
	fi
	cat >"$T/$m.yaml" <<YAML
model: {path: $T/$m}
task: $task
backend: cuda
data: {train: $T/$m.jsonl, max_state: $n, seed: 1}
train: {batch: $b, accum: 1, steps: $STEPS, eval_every: 0, activation_checkpointing: false}
checkpoint: {every: 0}
export: {final: false}
gpu_log: {every_s: 0}
run: {dir: $T/run-$m, log_every: 1}
YAML
	# the last step alone (the trainer's NVTX range "step N"); ALL_STEPS=1: every step
	filt=(--nvtx --nvtx-include "step $STEPS/") div=1
	[ "${ALL_STEPS:-0}" = 1 ] && filt=() div=$STEPS
	"$NCU" --clock-control none ${NCU_ARGS:-} "${filt[@]}" --metrics gpu__time_duration.sum --csv \
		--page raw --print-kernel-base function "$SHARDLM" train "$T/$m.yaml" \
		>"$OUT/ncu-$m.csv" 2>"$OUT/ncu-$m.log"
	echo "== $m: ncu exit $? ($(grep -c . "$OUT/ncu-$m.csv") lines)"
	python3 - "$OUT/ncu-$m.csv" "$div" <<'PY'
import csv, sys
rows = [r for r in csv.reader(open(sys.argv[1])) if r]
start = next(i for i, r in enumerate(rows) if "Kernel Name" in r)
head, units = rows[start], rows[start + 1]
kn, tc = head.index("Kernel Name"), head.index("gpu__time_duration.sum")
scale = {"ns": 1e-6, "nsecond": 1e-6, "us": 1e-3, "usecond": 1e-3, "ms": 1.0,
         "msecond": 1.0, "s": 1e3, "second": 1e3}[units[tc]]
tot, cnt = {}, {}
for r in rows[start + 2:]:
    try:
        ms = float(r[tc].replace(",", "")) * scale
    except (ValueError, IndexError):
        continue
    tot[r[kn]] = tot.get(r[kn], 0) + ms
    cnt[r[kn]] = cnt.get(r[kn], 0) + 1
steps = int(sys.argv[2])
all_ms = sum(tot.values())
print(f"{'kernel':60s} {'launches':>8s} {'ms/step':>9s} {'share':>6s}")
for k in sorted(tot, key=tot.get, reverse=True)[:30]:
    print(f"{k[:60]:60s} {cnt[k] // steps:8d} {tot[k] / steps:9.2f} {100 * tot[k] / all_ms:5.1f}%")
print(f"{'all kernels':60s} {sum(cnt.values()) // steps:8d} {all_ms / steps:9.2f}")
# shares by kind: cuBLASLt's GEMMs, the attention (flash kernels and D), the delta rule, the
# optimizer (AdamW and the gradient norm), communication (NCCL), everything else
def kind(k):
    if k.startswith(("nvjet", "sm90_xmma", "cutlass", "gemm", "Kernel2")) or "gemm" in k:
        return "GEMM"
    if k.startswith(("k_fa_", "k_attn")):
        return "attention"
    if k.startswith("k_gdn"):
        return "delta rule"
    if k.startswith(("k_adamw", "k_sumsq")):
        return "optimizer"
    if k.startswith("nccl"):
        return "communication"
    return "rest"
by = {}
for k, v in tot.items():
    by[kind(k)] = by.get(kind(k), 0) + v
print("by kind: " + ", ".join(f"{n} {v / steps:.1f} ms ({100 * v / all_ms:.1f}%)"
                              for n, v in sorted(by.items(), key=lambda e: -e[1])))
PY
done
