#!/bin/sh
# check-gpu-offload.sh (check-gpu.sh runs it on the GPU machine): parallel.offload on the cuda
# backend trains to the same losses as on-GPU optimizer state, within 1e-5 relative over 20 steps
# of a tiny random model: offload optimizer (micro-batches adding up on the GPU, and on the host,
# and the lean host layout),
# offload params (prefetch 2), accum 1 and 2, and 2 ranks sharing the GPU (MPI staged).  The host
# AdamW is the GPU kernel's arithmetic, the bf16 copy the same rounding, so the losses agree to
# the last bit but for the order of the gradient norm's double sum.
. "${top_srcdir:-$(dirname "$0")/..}/test/lib.sh"
export NCCL_NVLS_ENABLE=0 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
MPIRUN=${MPIRUN:-mpirun}
[ -x "$SHARDLM" ] || SHARDLM=$(command -v shardlm)
MKMODEL="$top_builddir/test/mkmodel"
[ -x "$MKMODEL" ] || MKMODEL=$(command -v mkmodel)
"$MKMODEL" --out "$T/model" --vocab 512 --hidden 64 --layers 2 --heads 4 --kv-heads 2 \
	--head-dim 16 --intermediate 128 --seed 5 >/dev/null || { fail "mkmodel"; finish; exit 1; }
python3 - "$T/data.jsonl" <<'PY'
import random, sys
r = random.Random(11)
with open(sys.argv[1], "w") as f:
    for i in range(96):
        n = r.randint(20, 120)
        ids = [r.randrange(1, 512) for _ in range(n)]
        f.write('{"input_ids": %s, "label": %.3f}\n' % (ids, sum(t < 256 for t in ids) / n))
PY
cat >"$T/base.yaml" <<YAML
model: {path: $T/model}
backend: cuda
data: {train: $T/data.jsonl, max_state: 128, seed: 3}
train: {steps: 20, eval_every: 0}
optim: {lr: 3.0e-3, warmup: 2, weight_decay: 0.1, clip: 1.0}
checkpoint: {every: 10, keep: 1}
YAML

# run NAME NP BATCH ACCUM OFFLOAD [HOST_ACCUM [LEAN [NO_GRAD_ROOM]]]: 12 records per step
run() {
	ok
	if ! SHARDLM_TEST_HOST_ACCUM=${6:-} SHARDLM_TEST_HOST_LEAN=${7:-} \
		SHARDLM_TEST_NO_GRAD_ROOM=${8:-} "$MPIRUN" -np "$2" --oversubscribe \
		-x SHARDLM_TEST_HOST_ACCUM -x SHARDLM_TEST_HOST_LEAN -x SHARDLM_TEST_NO_GRAD_ROOM \
		"$SHARDLM" train "$T/base.yaml" --set run.dir="$T/$1" \
		--set train.batch="$3" --set train.accum="$4" --set parallel.offload="$5" \
		--set parallel.prefetch=2 >"$T/$1.out" 2>&1; then
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
print(f"{sys.argv[2].split('/')[-2]}: worst relative loss difference {worst:.2e}")
assert worst <= 1e-5, (a, b)
assert min(a[-5:]) < a[0]
PY
	fail "losses of $2 differ from $1 by more than 1e-5"
}

run none 1 6 2 none
run opt 1 6 2 optimizer
run hopt 1 6 2 optimizer 1
run par 1 6 2 params
run none1 1 12 1 none
run opt1 1 12 1 optimizer
run par1 1 12 1 params
run none2r 2 3 2 none
run opt2r 2 3 2 optimizer
run lean 1 6 2 optimizer "" 1
run lean1 1 12 1 optimizer "" 1
# one micro-batch a step: bf16 gradients where the backward writes them, in the layers'
# activations (1 rank), fp32 shards reduce-scattered into them (2 ranks); against the fp32
# accumulators of their own
run plain1 1 12 1 none "" "" 1
run none2r1 2 6 1 none
run plain2r1 2 6 1 none "" "" 1
close none opt
close none hopt
close none par
close none1 opt1
close none1 par1
close none2r opt2r
close none lean
close none1 lean1
close plain1 none1
close plain2r1 none2r1
ok
grep -q "no fp32 copy" "$T/none1/train.log" && grep -q "compute-type gradient shards" \
	"$T/none1/train.log" || fail "none1: the log does not show the direct, lent gradients"
ok
grep -q "fp32 gradient shards" "$T/none2r1/train.log" ||
	fail "none2r1: the log does not show fp32 gradient shards in the activations"
ok
! grep -q "gradients: " "$T/plain1/train.log" || fail "plain1: gradients lent or direct"
grep -q "micro-batches add up on the GPU" "$T/opt/train.log" || fail "opt: not accumulating on the GPU"
grep -q "host accumulation" "$T/hopt/train.log" || fail "hopt: not accumulating on the host"
finish
