#!/bin/sh
# check-gpu-q35moe.sh (check-gpu.sh runs it on the GPU machine): task sft of the tiny Qwen3.5-MoE
# model of test/fixtures/q35moe/text (transformers' own random Qwen3_5MoeForCausalLM: Gated
# DeltaNet and gated attention layers, 8 experts top-2, the gated shared expert, the
# load-balancing loss) on its 4 records, on the cuda backend against the cpu backend (the fp32
# reference, checked against transformers by test_q35moe_parity and against finite differences
# by test_q35moe): 20 AdamW steps, the loss of every step within 3% relative (bf16), with and
# without activation checkpointing, and without the delta rule's saved forward tiles (the plan's
# way out where they do not fit: SHARDLM_TEST_NO_GDN_AUX takes it, and the log says so).
# Q35MOE_TOPK=N runs the same model with N experts per token instead (N = 8: every token takes
# every expert, so that no near-tie in a top-k choice can route differently in bf16).
. "${top_srcdir:-$(dirname "$0")/..}/test/lib.sh"
export NCCL_NVLS_ENABLE=0 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
[ -x "$SHARDLM" ] || SHARDLM=$(command -v shardlm)
FIX="$top_srcdir/test/fixtures/q35moe"

mkdir -p "$T/model"
cp "$FIX/text/config.json" "$FIX/text/model.safetensors" "$T/model/" ||
	{ fail "the fixture $FIX/text"; finish; exit 1; }
cp "$FIX/records.jsonl" "$T/data.jsonl"
if [ -n "${Q35MOE_TOPK:-}" ]; then
	sed -i "s/\"num_experts_per_tok\": [0-9]*/\"num_experts_per_tok\": $Q35MOE_TOPK/" \
		"$T/model/config.json"
fi

# run NAME BACKEND CKPT [ENV=VALUE]
run() {
	ok
	cat >"$T/$1.yaml" <<YAML
model: {path: $T/model}
task: sft
backend: $2
data: {train: $T/data.jsonl, max_state: 256, shuffle: false, length_sort: false}
train: {batch: 2, accum: 2, steps: 20, eval_every: 0, activation_checkpointing: $3}
optim: {lr: 2.0e-3, warmup: 2, weight_decay: 0.1, clip: 1.0}
checkpoint: {every: 0}
run: {dir: $T/$1, log_every: 5}
YAML
	if ! env OMP_NUM_THREADS=4 ${4:-} "$SHARDLM" train "$T/$1.yaml" >"$T/$1.out" 2>&1; then
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
assert worst <= 0.03, (a, b)
assert a[-1] < a[0]
PY
	fail "losses of $2 differ from $1 by more than 3%"
}

run cpu cpu false
run cuda cuda false
close cpu cuda
run cuda-ckpt cuda true
close cpu cuda-ckpt
run cuda-noaux cuda false SHARDLM_TEST_NO_GDN_AUX=1
close cpu cuda-noaux
ok
grep -q "go without the forward's saved delta" "$T/cuda-noaux/train.log" ||
	fail "cuda-noaux: train.log does not say the saved tiles were dropped"
ok
! grep -q "go without the forward's saved delta" "$T/cuda/train.log" ||
	fail "cuda: train.log says the saved tiles were dropped"
finish
