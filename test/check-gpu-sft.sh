#!/bin/sh
# check-gpu-sft.sh (check-gpu.sh runs it on the GPU machine): task sft on the cuda backend against
# the cpu backend (the fp32 reference, itself checked against transformers by test_sft_parity and
# test_moe_parity): 20 AdamW steps on the fixtures' tiny models and records, the loss of every step
# within 2% relative (bf16), for an untied and a tied head, packed rows, and the Qwen3-MoE model
# (per-expert and fused checkpoints) with its load-balancing loss; and with one micro-batch a
# step (the gradients where the backward writes them, in layers' activations), untied and tied.
. "${top_srcdir:-$(dirname "$0")/..}/test/lib.sh"
export NCCL_NVLS_ENABLE=0 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
[ -x "$SHARDLM" ] || SHARDLM=$(command -v shardlm)
FIX="$top_srcdir/test/fixtures"

# run NAME BACKEND MODEL RECORDS PACK [BATCH ACCUM]
run() {
	ok
	cat >"$T/$1.yaml" <<YAML
model: {path: $FIX/$3}
task: sft
backend: $2
data: {train: $FIX/$4, max_state: 64, shuffle: false, length_sort: false, pack: $5}
train: {batch: ${6:-2}, accum: ${7:-2}, steps: 20, eval_every: 0}
optim: {lr: 2.0e-3, warmup: 2, weight_decay: 0.1, clip: 1.0}
checkpoint: {every: 0}
run: {dir: $T/$1, log_every: 5}
YAML
	if ! OMP_NUM_THREADS=4 "$SHARDLM" train "$T/$1.yaml" >"$T/$1.out" 2>&1; then
		fail "$1: exited non-zero"; tail -n 20 "$T/$1.out" >&2
	fi
}

close() {
	ok
	python3 - "$T/$1/training_metrics.json" "$T/$2/training_metrics.json" <<'PY' ||
import json, sys
a = [s["loss"] for s in json.load(open(sys.argv[1]))["steps"]]
b = [s["loss"] for s in json.load(open(sys.argv[2]))["steps"]]
assert len(a) == len(b) == 20, (len(a), len(b))
worst = max(abs(x - y) / abs(x) for x, y in zip(a, b))
print(f"{sys.argv[2].split('/')[-2]} vs {sys.argv[1].split('/')[-2]}: worst relative loss "
      f"difference {worst:.2e} (loss {a[0]:.4f} -> {a[-1]:.4f})")
assert worst <= 0.02, (a, b)
assert a[-1] < a[0]
PY
	fail "losses of $2 differ from $1 by more than 2%"
}

for m in "untied sft/untied sft/records.jsonl false" "tied hf/lm sft/records.jsonl false" \
	 "packed sft/untied sft/records.jsonl true" "moe moe/sft moe/sft_records.jsonl false" \
	 "moefused moe/sft_fused moe/sft_records.jsonl false" \
	 "moepacked moe/sft moe/sft_records.jsonl true" \
	 "untied1 sft/untied sft/records.jsonl false 4 1" "tied1 hf/lm sft/records.jsonl false 4 1"; do
	set -- $m
	run "$1-cpu" cpu "$2" "$3" "$4" "${5:-}" "${6:-}"
	run "$1-cuda" cuda "$2" "$3" "$4" "${5:-}" "${6:-}"
	close "$1-cpu" "$1-cuda"
done
ok
grep -q "no fp32 copy" "$T/tied1-cuda/train.log" || fail "tied1-cuda: gradients not direct"
finish
