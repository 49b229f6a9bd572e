#!/bin/sh
# Context parallel (parallel.context, src/context.c, src/model_cp.c) on the CPU backend: a tiny
# model (hidden 32, 2 layers, 2 query heads sharing 1 kv head) on records of up to 4096 tokens
# trains with the single-rank losses and gradient norms (1e-5 relative, two AdamW steps) on
# context groups of 2 and 4 ranks and on a 2 data-parallel x 2 context mesh, for classify and for
# sft, unpacked and packed (data.pack), and the validation losses (and Brier score, correlation)
# before and after; bad meshes fail with a clear message.
. "${top_srcdir:-$(dirname "$0")/..}/test/lib.sh"

if ! command -v "${MPIRUN:-mpirun}" >/dev/null 2>&1; then
	echo "no mpirun: skipped"; exit 77
fi
MPIRUN=${MPIRUN:-mpirun}
MK="$top_builddir/test/mkmodel --vocab 61 --hidden 32 --layers 2 --heads 2 --kv-heads 1"
MK="$MK --head-dim 4 --intermediate 48 --max-pos 8192"
$MK --out "$T/cls" --seed 7 >/dev/null || fail "mkmodel cls"
$MK --out "$T/lm" --seed 8 --no-score >/dev/null || fail "mkmodel lm"
# 2 records a step (length-sorted: 333 and 700 tokens, then 1500 and 4096), their last tokens
# and targets in chunks of different ranks; sft targets in runs of 300 tokens; packed, the first
# step's records share a row.  AdamW with eps 1 is nearly SGD (the update a smooth function of
# the gradient, no sign(g) of a first step): step 2's loss checks step 1's gradients.
python3 - "$T" <<'PY'
import random, sys
r = random.Random(5)
lens = [4096, 333, 1500, 700]
with open(sys.argv[1] + "/cls.jsonl", "w") as f, open(sys.argv[1] + "/lm.jsonl", "w") as g:
    for n in lens:
        ids = [r.randrange(1, 61) for _ in range(n)]
        f.write('{"input_ids": %s, "label": %.3f}\n' % (ids, sum(t < 30 for t in ids) / n))
        mask = [0] + [(i // 300) % 2 for i in range(1, n)]
        g.write('{"input_ids": %s, "loss_mask": %s}\n' % (ids, mask))
# validation: 4 records (scored / evaluated before and after training; the same number of
# micro-batches on each data-parallel rank of the 2 x 2 mesh, each with targets)
with open(sys.argv[1] + "/cls-valid.jsonl", "w") as f, \
     open(sys.argv[1] + "/lm-valid.jsonl", "w") as g:
    for n in (700, 250, 401, 330):
        ids = [r.randrange(1, 61) for _ in range(n)]
        f.write('{"input_ids": %s, "label": %.3f}\n' % (ids, sum(t < 30 for t in ids) / n))
        mask = [0] + [(i // 200) % 2 for i in range(1, n)]
        g.write('{"input_ids": %s, "loss_mask": %s}\n' % (ids, mask))
PY
for task in cls lm; do
	cat >"$T/$task.yaml" <<YAML
model: {path: $T/$task}
backend: cpu
task: $([ $task = cls ] && echo classify || echo sft)
data: {train: $T/$task.jsonl, valid: $T/$task-valid.jsonl, max_state: 4096, seed: 3,
       shuffle: false}
train: {steps: 2, eval_every: 0}
optim: {lr: 1.0, eps: 1.0, warmup: 1, schedule: constant, weight_decay: 0, clip: 0}
checkpoint: {every: 0}
export: {dtype: fp32}
YAML
done

# run NAME NP CONFIG [--set ...]
run() {
	name=$1 np=$2 cfg=$3
	shift 3
	ok
	if ! "$MPIRUN" -np "$np" --oversubscribe "$SHARDLM" train "$T/$cfg.yaml" \
		--set run.dir="$T/$name" "$@" >"$T/$name.out" 2>&1; then
		fail "$name: exited non-zero"; tail -n 20 "$T/$name.out" >&2
	fi
}

# same A B MODEL: B's losses, gradient norms and validation statistics within 1e-5 (relative) of
# A's, the same records and tokens counted per step, and B's weight updates from MODEL's initial
# weights within 1e-5
same() {
	ok
	python3 - "$T/$1/training_metrics.json" "$T/$2/training_metrics.json" <<'PY' ||
import json, sys
a = json.load(open(sys.argv[1]))["steps"]
b = json.load(open(sys.argv[2]))["steps"]
ea = json.load(open(sys.argv[1]))["eval"]
eb = json.load(open(sys.argv[2]))["eval"]
assert len(a) == len(b) == 2, (len(a), len(b))
assert len(ea) == len(eb) == 2, (ea, eb)
worst = 0
for x, y in zip(a, b):
    assert (x["records"], x["tokens"]) == (y["records"], y["tokens"]), (x, y)
    for k in ("loss", "grad_norm"):
        worst = max(worst, abs(x[k] - y[k]) / abs(x[k]))
for x, y in zip(ea, eb):
    assert x.keys() == y.keys() and x["step"] == y["step"], (x, y)
    for k in x:
        if isinstance(x[k], float):
            worst = max(worst, abs(x[k] - y[k]) / abs(x[k]))
print(f"{sys.argv[2].split('/')[-2]}: worst relative loss / grad_norm / validation difference {worst:.2e}")
assert worst <= 1e-5, (a, b, ea, eb)
PY
	fail "$2 differs from $1"
	# the trained weights: B's change from the initial model within 1e-5 of A's
	ok
	PYTHONPATH="$top_srcdir/test" python3 - "$T/$1/model" "$T/$2/model" "$T/$3" <<'PY' ||
import math, sys
from safetensors_f32 import load

a, b, w0 = load(sys.argv[1]), load(sys.argv[2]), load(sys.argv[3])
assert a.keys() == b.keys() and a, (sorted(a), sorted(b))
da = db = 0.0
for k in a:
    da += sum((x - z) ** 2 for x, z in zip(a[k], w0[k]))
    db += sum((y - x) ** 2 for x, y in zip(a[k], b[k]))
rel = math.sqrt(db / da)
print(f"{sys.argv[2].split('/')[-2]}: weight updates differ by {rel:.2e} (relative)")
assert da > 0 and rel <= 1e-5
PY
	fail "$2's trained weights differ from $1's"
}

run c1 1 cls --set train.batch=2 --set train.accum=1
run c2 2 cls --set train.batch=2 --set train.accum=1 --set parallel.context=2
run c4 4 cls --set train.batch=1 --set train.accum=2 --set parallel.context=4
same c1 c2 cls
same c1 c4 cls
grep -q "mesh: 4 rank(s) = 1 data-parallel x 4 context" "$T/c4/train.log" ||
	fail "c4: the log does not print the mesh"

run l1 1 lm --set train.batch=2 --set train.accum=1
run l4 4 lm --set train.batch=2 --set train.accum=1 --set parallel.context=4
run l22 4 lm --set train.batch=1 --set train.accum=1 --set parallel.context=2
same l1 l4 lm
same l1 l22 lm
grep -q "2 data-parallel x 2 context" "$T/l22/train.log" || fail "l22: mesh not 2 x 2"
grep -q "batch 1 x accum 1 x 2 data-parallel" "$T/l22/train.log" ||
	fail "l22: records per step not counted over 2 data-parallel ranks"

run p1 1 lm --set train.batch=2 --set train.accum=1 --set data.pack=true
run p2 2 lm --set train.batch=2 --set train.accum=1 --set data.pack=true --set parallel.context=2
same p1 p2 lm

# bad meshes
expect_fail "context 3 of 2 ranks" "parallel.context 3 does not divide the 2 rank" \
	"$MPIRUN" -np 2 --oversubscribe "$SHARDLM" train "$T/cls.yaml" --set run.dir="$T/bad1" \
	--set parallel.context=3
[ ! -e "$T/bad1" ] || fail "a refused job made its run directory"
finish
