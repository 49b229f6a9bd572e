#!/bin/sh
# parallel.offload and the memory planner, on the CPU backend:
#  - offload: optimizer and offload: params train to the same losses as on-device optimizer
#    state (1e-5 relative over 20 steps) on 1 and 2 ranks, accum 1 and accum 2 with the
#    micro-batches adding up on the device (the planner's choice when there is room) and on the
#    host (SHARDLM_TEST_HOST_ACCUM), params with prefetch 1 and 2, and offload optimizer's lean
#    host layout (SHARDLM_TEST_HOST_LEAN: gradients kept on the device, streamed in the update).  The cpu backend's copies run
#    on a thread of their own, delayed (SHARDLM_CPU_COPY_DELAY_US) so that a buffer reused
#    before its copy is done gives wrong losses;
#  - `shardlm plan` verdicts and exit status for the 27B shape (fixture config.json, no weights);
#  - `train` refuses a config that cannot fit this machine's memory before it loads anything
#    (the 27B fixture has no weights: reaching the loader would fail differently).
. "${top_srcdir:-$(dirname "$0")/..}/test/lib.sh"

if ! command -v "${MPIRUN:-mpirun}" >/dev/null 2>&1; then
	echo "no mpirun: skipped"; exit 77
fi
MPIRUN=${MPIRUN:-mpirun}
MODEL="$T/model"
FIX="$top_srcdir/test/fixtures/plan/qwen3-27b"
tiny_fsdp_inputs "$T"
cat >"$T/base.yaml" <<YAML
model: {path: $MODEL}
backend: cpu
data: {train: $T/data.jsonl, max_state: 32, seed: 3}
train: {steps: 20, eval_every: 0, accum: 2}
optim: {lr: 3.0e-3, warmup: 2, weight_decay: 0.1, clip: 1.0}
checkpoint: {every: 10, keep: 2}
export: {dtype: fp32}
YAML

# run NAME NP BATCH OFFLOAD [ACCUM [PREFETCH]]: 12 records per step whatever NP and ACCUM
run() {
	ok
	acc=${5:-2}
	if ! SHARDLM_CPU_COPY_DELAY_US=300 "$MPIRUN" -np "$2" --oversubscribe \
		-x SHARDLM_CPU_COPY_DELAY_US -x SHARDLM_TEST_HOST_ACCUM -x SHARDLM_TEST_HOST_LEAN \
		"$SHARDLM" train \
		"$T/base.yaml" --set run.dir="$T/$1" --set train.batch="$(($3 * 2 / acc))" \
		--set train.accum="$acc" --set parallel.offload="$4" \
		--set parallel.prefetch="${6:-1}" >"$T/$1.out" 2>&1; then
		fail "$1: exited non-zero"; tail -n 20 "$T/$1.out" >&2
	fi
}

# close A B: every loss of run B within 1e-5 (relative) of run A's, 20 steps, and it learns
close() {
	ok
	python3 - "$T/$1/training_metrics.json" "$T/$2/training_metrics.json" <<'PY' ||
import json, sys
a = [s["loss"] for s in json.load(open(sys.argv[1]))["steps"]]
b = [s["loss"] for s in json.load(open(sys.argv[2]))["steps"]]
assert len(a) == len(b) == 20, (len(a), len(b))
worst = max(abs(x - y) / abs(x) for x, y in zip(a, b))
print(f"{sys.argv[2].split('/')[-2]}: worst relative loss difference {worst:.2e}")
assert worst <= 1e-5, (a, b)
assert min(a[-5:]) < a[0]
PY
	fail "losses of $2 differ from $1 by more than 1e-5"
}

export SHARDLM_TEST_HOST_ACCUM= SHARDLM_TEST_HOST_LEAN=
run none1 1 6 none
run opt1 1 6 optimizer
run par1 1 6 params 2 2
run none2 2 3 none
run par2 2 3 params
# 2 ranks, offload optimizer with the micro-batches adding up on the host
export SHARDLM_TEST_HOST_ACCUM=1
run opt2 2 3 optimizer
export SHARDLM_TEST_HOST_ACCUM=
for x in opt1 par1; do close none1 $x; done
for x in opt2 par2; do close none2 $x; done
close none1 none2
# accum 1: one micro-batch per step
run none1a1 1 6 none 1
run opt1a1 1 6 optimizer 1
close none1a1 opt1a1
# the lean host layout (gradients stay on the device, streamed in the update): accum 2 and 1
export SHARDLM_TEST_HOST_LEAN=1
run lean2 2 3 optimizer
run lean1a1 1 6 optimizer 1
close none2 lean2
close none1a1 lean1a1
grep -q "lean host" "$T/lean2/train.log" || fail "lean2: the log does not say lean host"
grep -q "host accumulation" "$T/opt2/train.log" ||
	{ fail "opt2: the log does not say that micro-batches add up on the host"; }
grep -q "micro-batches add up on the GPU" "$T/opt1/train.log" ||
	{ fail "opt1: the log does not say that micro-batches add up on the GPU"; }

# `shardlm plan` on the 27B shape: exit 0 fits, 1 does not, with the advice
cat >"$T/27b.yaml" <<YAML
model: {path: $FIX}
backend: cuda
data: {max_state: 2048}
train: {batch: 1}
YAML
ok
"$SHARDLM" plan "$T/27b.yaml" >"$T/p.out" 2>&1
[ $? = 1 ] || fail "plan 1 x 80 GB, no offload: expected exit 1"
grep -q "DOES NOT FIT" "$T/p.out" && grep -q "parallel.offload: params" "$T/p.out" &&
	grep -q "GiB (2^30 bytes)" "$T/p.out" || { fail "plan output"; cat "$T/p.out" >&2; }
expect_ok "plan params offload fits" "$SHARDLM" plan "$T/27b.yaml" --set parallel.offload=params
expect_ok "plan 141 GB optimizer offload fits" "$SHARDLM" plan "$T/27b.yaml" --gpu-mem 141 \
	--set parallel.offload=optimizer
expect_fail "plan 8 x 80 GB FSDP" "train.activation_checkpointing: true" "$SHARDLM" plan \
	"$T/27b.yaml" --gpus 8
expect_fail "plan bad --gpu-mem" "expected a size" "$SHARDLM" plan "$T/27b.yaml" --gpu-mem x

# train refuses before loading: the cpu backend's 27B needs ~550 GiB of host memory
cat >"$T/27b-cpu.yaml" <<YAML
model: {path: $FIX}
backend: cpu
data: {train: $T/data.jsonl, max_state: 2048}
train: {batch: 1}
YAML
expect_fail "train refuses an unfittable config" "does not fit in memory.*refused before" \
	"$SHARDLM" train "$T/27b-cpu.yaml" --set run.dir="$T/big"
ok
grep -qi "safetensors" "$T/out" && fail "train reached the weights before refusing"
[ -e "$T/big" ] && fail "train made the run directory before refusing"
finish
