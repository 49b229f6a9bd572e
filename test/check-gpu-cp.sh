#!/bin/sh
# check-gpu-cp.sh (check-gpu.sh runs it on the GPU machine): context parallelism on the cuda
# backend.  Two ranks share the one GPU (the host-staged communicator carries the key/value
# all-gather, the gradient reduce-scatter and the Qwen3.5 chunk-to-chunk rows).
#  - a tiny Qwen3 (mkmodel: hidden 128, 2 layers, 2 query heads of 64 sharing 1 kv head; the cuda
#    context-parallel attention takes head_dim 64, 128 and 256): classify and sft (targets in
#    runs of 300 tokens), sft also packed (data.pack): parallel.context 2 on 2 ranks against 1
#    rank, both cuda: every loss within 1%, the same tokens per step; and against the cpu
#    backend's single rank: within 3% (bf16);
#  - a tiny Qwen3.5 hybrid (bench/q35_bench.py's cp-tiny: 3 Gated DeltaNet layers and 1 gated
#    attention layer of head_dim 64), classify: the same two comparisons;
#  - a head_dim the cuda attention does not take (32) is refused with a message.
# Records of 333 to 2048 tokens, batch 2, 4 AdamW steps (the cpu runs take most of the time).
. "${top_srcdir:-$(dirname "$0")/..}/test/lib.sh"
export NCCL_NVLS_ENABLE=0 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
[ -x "$SHARDLM" ] || SHARDLM=$(command -v shardlm)
MPIRUN=${MPIRUN:-mpirun}
MK="$top_builddir/test/mkmodel --vocab 61 --hidden 128 --layers 2 --heads 2 --kv-heads 1"
MK="$MK --intermediate 96 --max-pos 8192"
$MK --head-dim 64 --out "$T/cls" --seed 7 >/dev/null || fail "mkmodel cls"
$MK --head-dim 64 --out "$T/lm" --seed 8 --no-score >/dev/null || fail "mkmodel lm"
$MK --head-dim 32 --out "$T/hd32" --seed 9 >/dev/null || fail "mkmodel hd32"
python3 "$top_srcdir/bench/q35_bench.py" model "$T/q35" --preset cp-tiny --writer python \
	>/dev/null 2>&1 || fail "q35_bench.py model cp-tiny"
python3 - "$T" <<'PY'
import random, sys
r = random.Random(5)
with open(sys.argv[1] + "/cls.jsonl", "w") as f, open(sys.argv[1] + "/lm.jsonl", "w") as g:
    for n in [2048, 333, 1500, 700] * 2:
        ids = [r.randrange(3, 61) for _ in range(n)]
        f.write('{"input_ids": %s, "label": %.3f}\n' % (ids, sum(t < 30 for t in ids) / n))
        mask = [0] + [(i // 300) % 2 for i in range(1, n)]
        g.write('{"input_ids": %s, "loss_mask": %s}\n' % (ids, mask))
PY

# run NAME NP BACKEND MODEL TASK [--set ...]
run() {
	name=$1 np=$2 backend=$3 model=$4 task=$5
	shift 5
	ok
	cat >"$T/$name.yaml" <<YAML
model: {path: $T/$model}
task: $task
backend: $backend
data: {train: $T/$([ "$task" = sft ] && echo lm || echo cls).jsonl, max_state: 2048,
       shuffle: false}
train: {batch: 2, steps: 4, eval_every: 0}
optim: {lr: 1.0e-3, warmup: 1, weight_decay: 0.1, clip: 1.0}
checkpoint: {every: 0}
export: {final: false}
run: {dir: $T/$name, log_every: 1}
YAML
	if ! OMP_NUM_THREADS=$((8 / np)) timeout 300 "$MPIRUN" -np "$np" --oversubscribe "$SHARDLM" train \
		"$T/$name.yaml" "$@" >"$T/$name.out" 2>&1; then
		fail "$name: exited non-zero"; tail -n 20 "$T/$name.out" >&2
	fi
}

for c in "cls cls classify" "lm lm sft" "pk lm sft --set data.pack=true" "q35 q35 classify"; do
	# shellcheck disable=SC2086
	set -- $c
	tag=$1 model=$2 task=$3
	shift 3
	run $tag-cpu 1 cpu $model $task "$@"
	run $tag-cuda 1 cuda $model $task "$@"
	run $tag-cuda-cp2 2 cuda $model $task --set parallel.context=2 "$@"
	grep -q "context" "$T/$tag-cuda-cp2.out" ||
		fail "$tag-cuda-cp2: the log does not print the context groups"
	close_losses $tag-cuda $tag-cuda-cp2 0.01 4
	close_losses $tag-cpu $tag-cuda-cp2 0.03 4
done

# a head_dim the cuda context-parallel attention does not take: a message, no crash
ok
cat >"$T/hd32.yaml" <<YAML
model: {path: $T/hd32}
task: classify
backend: cuda
data: {train: $T/cls.jsonl, max_state: 2048, shuffle: false}
train: {batch: 2, steps: 1, eval_every: 0}
checkpoint: {every: 0}
export: {final: false}
run: {dir: $T/hd32run}
YAML
if timeout 120 "$MPIRUN" -np 2 --oversubscribe "$SHARDLM" train "$T/hd32.yaml" \
	--set parallel.context=2 >"$T/hd32.out" 2>&1; then
	fail "hd32: context parallel with head_dim 32 on cuda ran"
elif ! grep -q "does not take head_dim 32" "$T/hd32.out"; then
	fail "hd32: no message about the head_dim"; tail -n 5 "$T/hd32.out" >&2
fi
finish
