#!/bin/sh
# check-gpu-q35moe.sh (check-gpu.sh runs it on the GPU machine): task sft of a tiny Qwen3.5-MoE
# model (test_q35moe --write-model: the published qwen3_5_moe layout, Gated DeltaNet and gated
# attention layers, 4 experts top-2 and the gated shared expert) on the cuda backend against the
# cpu backend (the fp32 reference, checked against finite differences by test_q35moe and against
# transformers by test_q35moe_parity): 20 AdamW steps, the loss of every step within 3% relative
# (bf16), with and without activation checkpointing.
. "${top_srcdir:-$(dirname "$0")/..}/test/lib.sh"
export NCCL_NVLS_ENABLE=0 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
[ -x "$SHARDLM" ] || SHARDLM=$(command -v shardlm)

"$top_builddir/test/test_q35moe" --write-model "$T/model" || { fail "write model"; finish; exit 1; }
python3 - "$T/data.jsonl" <<'PY'
import random, sys
r = random.Random(5)
with open(sys.argv[1], "w") as f:
    for n in (70, 9, 33, 100, 5, 41, 66, 12):
        ids = [r.randrange(1, 13) for _ in range(n)]
        mask = [0] + [int(r.random() < 0.7) for _ in range(n - 1)]
        f.write('{"input_ids": %s, "loss_mask": %s}\n' % (ids, mask))
PY

# run NAME BACKEND CKPT
run() {
	ok
	cat >"$T/$1.yaml" <<YAML
model: {path: $T/model}
task: sft
backend: $2
data: {train: $T/data.jsonl, max_state: 128, shuffle: false, length_sort: false}
train: {batch: 2, accum: 2, steps: 20, eval_every: 0, activation_checkpointing: $3}
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
finish
