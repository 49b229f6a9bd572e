#!/bin/sh
# check-gpu-overlap.sh (check-gpu.sh runs it on the GPU machine): SHARDLM_OPT_OVERLAP=1 (AdamW on
# the cuda backend's side stream, under the next step's forward) against the same run without it,
# both with train.deterministic: true: the losses and gradient norms of all 10 steps and the
# exported fp32 weights must be the same bits, for task sft with one micro-batch a step (the
# gradients in the layers' activations; untied and tied head), two micro-batches (fp32
# accumulators), and the Qwen3-MoE fixture; also with the updates issued as the next forward
# comes to them, in pieces (SHARDLM_OPT_AHEAD=1 SHARDLM_OPT_CHUNK=4096); and, without
# clipping and with one micro-batch, each unit's update issued as the backward finishes its
# gradient (SHARDLM_OPT_BWD=1) against the run with neither.  A repeat of the run
# without it must give the same bits too (else the comparison would mean nothing).  The cpu test (test_overlap.sh) is the
# strict one for the ordering; this one runs the streams, events and priorities for real.
. "${top_srcdir:-$(dirname "$0")/..}/test/lib.sh"
export NCCL_NVLS_ENABLE=0 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
[ -x "$SHARDLM" ] || SHARDLM=$(command -v shardlm)
FIX="$top_srcdir/test/fixtures"

# run NAME OVERLAP MODEL RECORDS BATCH ACCUM [AHEAD CHUNK]
run() {
	ok
	cat >"$T/$1.yaml" <<YAML
model: {path: $FIX/$3}
task: sft
backend: cuda
data: {train: $FIX/$4, max_state: 64, shuffle: false, length_sort: false}
train: {batch: $5, accum: $6, steps: 10, eval_every: 0, deterministic: true}
optim: {lr: 2.0e-3, warmup: 2, weight_decay: 0.1, clip: ${CLIP:-1.0}}
checkpoint: {every: 0}
export: {dtype: fp32}
run: {dir: $T/$1, log_every: 5}
YAML
	if ! SHARDLM_OPT_OVERLAP=$2 SHARDLM_OPT_AHEAD=${7:-0} SHARDLM_OPT_CHUNK=${8:-0} \
		SHARDLM_OPT_BWD=${BWD:-0} \
		"$SHARDLM" train "$T/$1.yaml" >"$T/$1.out" 2>&1; then
		fail "$1: exited non-zero"; tail -n 20 "$T/$1.out" >&2
	fi
}

same() {
	ok
	python3 - "$T/$1/training_metrics.json" "$T/$2/training_metrics.json" <<'PY' ||
import json, sys
a = json.load(open(sys.argv[1]))["steps"]
b = json.load(open(sys.argv[2]))["steps"]
assert len(a) == len(b) == 10, (len(a), len(b))
for x, y in zip(a, b):
    for key in ("loss", "grad_norm"):
        assert x[key] == y[key], (key, x["step"], x[key], y[key])
print(f"{sys.argv[2].split('/')[-2]}: the same bits as {sys.argv[1].split('/')[-2]} "
      f"(loss {a[0]['loss']:.4f} -> {a[-1]['loss']:.4f})")
PY
	fail "$2: losses or gradient norms differ from $1's"
	for f in "$T/$1/model/"*.safetensors; do
		cmp -s "$f" "$T/$2/model/$(basename "$f")" ||
			fail "$2: exported $(basename "$f") differs from $1's"
	done
}

for m in "untied1 sft/untied sft/records.jsonl 4 1" "tied1 hf/lm sft/records.jsonl 4 1" \
	 "untied2 sft/untied sft/records.jsonl 2 2" "moe1 moe/sft moe/sft_records.jsonl 4 1"; do
	set -- $m
	run "$1" 0 "$2" "$3" "$4" "$5"
	run "$1-again" 0 "$2" "$3" "$4" "$5"
	run "$1-ov" 1 "$2" "$3" "$4" "$5"
	run "$1-ah" 1 "$2" "$3" "$4" "$5" 1 4096
	same "$1" "$1-again"
	same "$1" "$1-ov"
	same "$1" "$1-ah"
	ok
	grep -q "AdamW on a side stream" "$T/$1-ov/train.log" || fail "$1-ov: no overlap"
	[ "$5" = 1 ] || continue
	CLIP=0 run "$1-c0" 0 "$2" "$3" "$4" "$5"
	CLIP=0 BWD=1 run "$1-bwd" 1 "$2" "$3" "$4" "$5"
	same "$1-c0" "$1-bwd"
	ok
	grep -q "issued as soon as its gradient is done" "$T/$1-bwd/train.log" ||
		fail "$1-bwd: the updates do not run in the backward"
done
finish
