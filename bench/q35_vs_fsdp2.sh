#!/bin/bash
# q35_vs_fsdp2.sh: shardlm on a Qwen3.5-shaped hybrid model of ~4B against PyTorch FSDP2 with
# transformers' implementation, and against shardlm's own dense Qwen3 4B MFU, one H200, one call
# (issue 12).  On the GPU machine, after `source .devbundle/env.sh` (bundle: src/shardlm and
# test/mkmodel; found on the PATH first, then in this tree's build):
#   bash bench/q35_vs_fsdp2.sh [OUTDIR]
# 1. A random Qwen3.5 text model (bench/q35_bench.py model: model_type qwen3_5_text, hidden 2560,
#    32 layers = 8 x (3 linear_attention + 1 full_attention), 16 attention heads of 256 with 4 KV
#    heads (partial rotary 0.25, output gate), Gated DeltaNet 16 key / 32 value heads of 128,
#    conv kernel 4, intermediate 9216, vocab 248320, untied, score head num_labels 1; 4.2B
#    parameters) drawn on the GPU and written as bf16 safetensors; 64 records of 2048 random
#    tokens with soft labels.
# 2. shardlm, task classify, backend cuda, batch 4 x 2048, accum 1, no activation checkpointing,
#    STEPS steps.
# 3. The dense Qwen3 4B shape of train_vs_fsdp2.sh (hidden 2560, 36 layers, 32/8 heads of 128,
#    intermediate 9728, vocab 151936; mkmodel, in the background meanwhile), the same job: the
#    reference MFU (target: the hybrid's MFU at least 80% of it).
# 4. bench/fsdp2_q35_peer.py: transformers' Qwen3_5TextForSequenceClassification on the same
#    weights and records under FSDP2 (world 1, bf16 params, fp32 reduce, fused AdamW, SDPA); the
#    machine has no flash-linear-attention / causal-conv1d, so transformers runs its pure-PyTorch
#    fallback kernels (the peer prints what it found).  Under `timeout PEER_TIMEOUT`; out of memory
#    at batch 4 it is run again at PEER_RETRY_BATCH; an OOM or a timeout is a row of the table.
# Tokens/s is the median step time after the WARMUP steps; MFU for every run is computed here from
# one FLOP count per model (bench/q35_bench.py flops: shardlm's own formula, linear-attention
# FLOPs included; printed as GFLOPs/token) over 989 TFLOP/s, and shardlm's logged MFU is shown
# beside it as a check.  Prints one table last (also OUTDIR/table.md); logs and JSON in OUTDIR.
# Environment: STEPS (6), WARMUP (2), PEER_STEPS (STEPS), PEER_TIMEOUT s (240), PEER_RETRY_BATCH
# (2; empty: no retry), SHARDLM_TIMEOUT s per shardlm run (180), BUDGET s for the whole script
# (480: a peer run gets at most what is left of it less 10 s, and none under 60 s), PEER=0 skips
# the peer, DENSE=0 skips the dense reference, SHARDLM and MKMODEL (program paths), VARIANTS
# (default "-": the hybrid run as it is; a list of NAME=VALUE environment settings, "-" for none,
# runs the hybrid once per entry, e.g. "- SHARDLM_GDN_KERNEL=chunked-fused").
# SMOKE=1: the same pipeline on a tiny model, backend cpu, 128-token records (the peer only where
# torch with CUDA is importable): for checking the script without a GPU.
set -u
OUT=${1:-/tmp/q35-vs-fsdp2}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/.." && pwd)
PY="python3 $HERE/q35_bench.py"
SMOKE=${SMOKE:-0}
STEPS=${STEPS:-6}
WARMUP=${WARMUP:-2}
PEER_STEPS=${PEER_STEPS:-$STEPS}
PEER_TIMEOUT=${PEER_TIMEOUT:-240}
PEER_RETRY_BATCH=${PEER_RETRY_BATCH-2}
SHARDLM_TIMEOUT=${SHARDLM_TIMEOUT:-180}
BUDGET=${BUDGET:-480}
PEER=${PEER:-1}
DENSE=${DENSE:-1}
B=4
if [ "$SMOKE" = 1 ]; then
	PRESET=smoke SEQ=128 BACKEND=cpu
	DENSE_ARGS="--vocab 512 --hidden 64 --layers 2 --heads 4 --kv-heads 2 --head-dim 16"
	DENSE_ARGS="$DENSE_ARGS --intermediate 128"
	export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
else
	PRESET=4b SEQ=2048 BACKEND=cuda
	DENSE_ARGS="--vocab 151936 --hidden 2560 --layers 36 --heads 32 --kv-heads 8 --head-dim 128"
	DENSE_ARGS="$DENSE_ARGS --intermediate 9728"
fi

# a program from the PATH (the bundle) first, then from this tree's build
find_prog() {
	command -v "$1" 2>/dev/null && return
	[ -x "$ROOT/$2" ] && echo "$ROOT/$2" && return
	return 1
}
SHARDLM=${SHARDLM:-$(find_prog shardlm src/shardlm)} ||
	{ echo "no shardlm on the PATH or in $ROOT/src" >&2; exit 1; }
MKMODEL=${MKMODEL:-$(find_prog mkmodel test/mkmodel)} || MKMODEL=""

T=$(mktemp -d /tmp/q35vf-XXXXXX)
RES="$OUT/results.jsonl"
: >"$RES"
trap 'rm -rf "$T"' EXIT
t0=$(date +%s)
stamp() { echo "== [$(($(date +%s) - t0)) s] $*"; }
left() { echo $((BUDGET - ($(date +%s) - t0))); }
stamp "shardlm $SHARDLM, mkmodel ${MKMODEL:-none}; work dir $T; logs in $OUT"

# the dense reference model meanwhile (mkmodel draws on the CPU: minutes for 4B)
if [ "$DENSE" = 1 ] && [ -n "$MKMODEL" ]; then
	# shellcheck disable=SC2086
	"$MKMODEL" --out "$T/dense" $DENSE_ARGS --seed 1 --dtype bf16 >"$OUT/mkmodel-dense.log" 2>&1 &
	MKPID=$!
fi

stamp "random Qwen3.5 model ($PRESET) and data"
$PY model "$T/q35" --preset "$PRESET" >"$OUT/model-q35.json" 2>"$OUT/model-q35.log" ||
	{ cat "$OUT/model-q35.log" >&2; echo "the model generation failed" >&2; exit 1; }
$PY data "$T/q35.jsonl" --config "$T/q35/config.json" --records 64 --seq "$SEQ" \
	2>>"$OUT/model-q35.log"
cp "$T/q35/config.json" "$OUT/config-q35.json"
$PY flops "$T/q35" --batch "$B" --seq "$SEQ" >"$OUT/flops-q35.json" 2>>"$OUT/model-q35.log" ||
	{ tail -2 "$OUT/model-q35.log" >&2; exit 1; }
tail -1 "$OUT/model-q35.log"

# shardlm_run NAME KIND [NAME=VALUE]: one shardlm training run of model KIND (q35 or dense, with
# that environment setting) and its result row
shardlm_run() {
	local name=$1 kind=$2 var=${3:-} tag=${1// /-}
	local model=$T/$2 data=$T/$2.jsonl
	tag=${tag//=/-}
	cat >"$T/$tag.yaml" <<YAML
model: {path: $model}
task: classify
backend: $BACKEND
data: {train: $data, max_state: $SEQ, seed: 1}
train: {batch: $B, accum: 1, steps: $STEPS, eval_every: 0, activation_checkpointing: false}
checkpoint: {every: 0}
export: {final: false}
gpu_log: {every_s: 0}
run: {dir: $T/run-$tag, log_every: 1}
YAML
	stamp "$name (timeout $SHARDLM_TIMEOUT s)"
	timeout -k 15 "$SHARDLM_TIMEOUT" env ${var:+"$var"} "$SHARDLM" train "$T/$tag.yaml" \
		>"$OUT/$tag.log" 2>&1
	local rc=$?
	cp "$T/run-$tag/training_metrics.json" "$OUT/$tag-metrics.json" 2>/dev/null
	$PY shardlm-row --name "$name" --run "$T/run-$tag" --log "$OUT/$tag.log" --rc $rc \
		--flops "$OUT/flops-$kind.json" --warmup "$WARMUP" --steps "$STEPS" \
		--timeout "$SHARDLM_TIMEOUT" >>"$RES"
	echo "exit $rc; $(grep -E "step $STEPS/$STEPS" "$OUT/$tag.log" | tail -1)"
	rm -rf "$T/run-$tag"
}

for var in ${VARIANTS:--}; do
	if [ "$var" = - ]; then
		shardlm_run "shardlm q35" q35
	else
		shardlm_run "shardlm q35 $var" q35 "$var"
	fi
done

if [ "$DENSE" = 1 ]; then
	if [ -z "$MKMODEL" ]; then
		echo "no mkmodel on the PATH or in $ROOT/test: no dense reference" >&2
	elif ! wait "$MKPID"; then
		echo "mkmodel failed: $(tail -1 "$OUT/mkmodel-dense.log")" >&2
	else
		$PY data "$T/dense.jsonl" --config "$T/dense/config.json" --records 64 --seq "$SEQ" \
			2>/dev/null
		if $PY flops "$T/dense" --batch "$B" --seq "$SEQ" >"$OUT/flops-dense.json" \
			2>"$OUT/flops-dense.log"; then
			tail -1 "$OUT/flops-dense.log"
			shardlm_run "shardlm dense" dense
		else
			cat "$OUT/flops-dense.log" >&2
		fi
		rm -rf "$T/dense"
	fi
fi

# peer_run BATCH: the FSDP2 peer and its row; fails when the peer ran out of GPU memory
peer_run() {
	local b=$1 log="$OUT/fsdp2-q35-b$1.log" rc to l
	l=$(left)
	to=$((l - 10))
	[ "$to" -gt "$PEER_TIMEOUT" ] && to=$PEER_TIMEOUT
	if [ "$to" -lt 60 ]; then
		$PY peer-row --name "fsdp2 q35 b$b" --batch "$b" --flops "$OUT/flops-q35.json" \
			--skip "$l s of the ${BUDGET} s budget left" >>"$RES"
		return 0
	fi
	stamp "FSDP2 q35, batch $b (timeout $to s)"
	PYTORCH_CUDA_ALLOC_CONF=${PYTORCH_CUDA_ALLOC_CONF:-expandable_segments:True} \
		timeout -k 10 "$to" torchrun --standalone --nproc_per_node 1 \
		"$HERE/fsdp2_q35_peer.py" --model "$T/q35" --data "$T/q35.jsonl" --batch "$b" \
		--seq "$SEQ" --steps "$PEER_STEPS" --warmup "$WARMUP" \
		--time-budget $((to - 15)) >"$log" 2>&1
	rc=$?
	grep -E "^\[fsdp2_q35_peer\] (KERNELS|step|stopping|loaded)" "$log" | cut -c1-300
	$PY peer-row --name "fsdp2 q35 b$b" --batch "$b" --log "$log" --rc $rc --timeout "$to" \
		--flops "$OUT/flops-q35.json" >>"$RES"
	echo "exit $rc: $(tail -1 "$RES" |
		python3 -c "import json, sys; print(json.load(sys.stdin)['status'])")"
	! tail -1 "$RES" | grep -q '"status": "out of GPU memory'
}

if [ "$PEER" != 1 ]; then
	$PY peer-row --name "fsdp2 q35" --flops "$OUT/flops-q35.json" --skip "PEER=$PEER" >>"$RES"
elif ! python3 -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" \
	2>/dev/null; then
	echo "no torch with CUDA here: the FSDP2 peer is skipped"
	$PY peer-row --name "fsdp2 q35" --flops "$OUT/flops-q35.json" \
		--skip "no torch with CUDA here" >>"$RES"
elif ! peer_run "$B" && [ -n "$PEER_RETRY_BATCH" ] && [ "$PEER_RETRY_BATCH" != "$B" ]; then
	peer_run "$PEER_RETRY_BATCH"
fi

stamp "done"
{
	$PY table "$RES"
	[ "$SMOKE" = 1 ] && echo "- SMOKE: a tiny model on the cpu backend; MFU and the ratios say" \
		"nothing here (the MFU is over the H200's 989 TFLOP/s)"
} | tee "$OUT/table.md"
