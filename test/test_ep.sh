#!/bin/sh
# Expert parallelism on the cpu backend (mpirun --oversubscribe), tiny Qwen3-MoE fixtures
# (test/fixtures/moe: 8 experts, top 2, MoE layers 0 and 2):
#  - parallel.expert 2 on 2 ranks (classify), 4 on 4 ranks (classify, sft) and 2 on 4 ranks (two
#    expert groups, with the backward's recompute) give the single-rank losses and gradient norms
#    (1e-5 relative) over 3 steps; the single-rank run takes the same micro-batches (accum =
#    ranks), as the load-balancing loss is per micro-batch.  The experts' loads are uneven
#    (asserted on the per-expert counts);
#  - context parallel with MoE layers (context 2 on 2 ranks) and context 2 x expert 2 on 4 ranks
#    (classify, and sft with the backward's recompute) give the single-rank losses;
#  - each rank holds only its experts (the log), and the exported model gathers every expert from
#    the ranks holding it: the one-rank run's export (1e-4 of each tensor's largest element);
#  - a run resumes from a checkpoint of another parallel.expert (4 -> 2 ranks);
#  - parallel.capacity_factor 1: the step-1 dropped count equals the hand calculation from
#    transformers' expert counts (reference.json expert_counts0) and the capacity
#    ceil(cf * 27 real tokens * 2 / 8) = 7; on 2 expert-parallel ranks the same as one rank with
#    the same micro-batches; a capacity no expert reaches drops nothing and keeps the losses, a
#    capacity 1 changes them;
#  - bad layouts: experts not divisible by parallel.expert, parallel.expert not dividing the
#    ranks, a dense model, the cuda backend.
. "${top_srcdir:-$(dirname "$0")/..}/test/lib.sh"

if ! command -v "${MPIRUN:-mpirun}" >/dev/null 2>&1; then
	echo "no mpirun: skipped"; exit 77
fi
MPIRUN=${MPIRUN:-mpirun}
FIX="$top_srcdir/test/fixtures/moe"
for t in cls sft; do
	task=classify
	[ $t = sft ] && task=sft
	cat >"$T/$t.yaml" <<YAML
model: {path: $FIX/$t}
task: $task
backend: cpu
data: {train: $FIX/${t}_records.jsonl, shuffle: false, length_sort: false, max_state: 64}
train: {steps: 3, eval_every: 0}
optim: {lr: 1.0e-3, warmup: 1, weight_decay: 0.1, clip: 1.0}
checkpoint: {every: 0}
export: {dtype: fp32}
run: {log_every: 1}
YAML
done

# run NAME CONFIG NP BATCH ACCUM [--set ...] (one rank without mpirun: faster)
run() {
	name=$1 cfg=$2 np=$3 b=$4 acc=$5
	shift 5
	ok
	launch="$MPIRUN -np $np --oversubscribe"
	[ "$np" = 1 ] && launch=
	if ! $launch "$SHARDLM" train "$T/$cfg.yaml" \
		--set run.dir="$T/$name" --set train.batch="$b" --set train.accum="$acc" "$@" \
		>"$T/$name.out" 2>&1; then
		fail "$name: exited non-zero"; tail -n 20 "$T/$name.out" >&2
	fi
}

# same A B: B's losses and gradient norms within 1e-5 (relative) of A's, and the same
# per-expert counts and dropped counts
same() {
	ok
	python3 - "$T/$1/training_metrics.json" "$T/$2/training_metrics.json" <<'PY' ||
import json, sys
a = json.load(open(sys.argv[1]))["steps"]
b = json.load(open(sys.argv[2]))["steps"]
assert len(a) == len(b) == 3, (len(a), len(b))
worst = 0
for x, y in zip(a, b):
    for key in ("loss", "grad_norm"):
        worst = max(worst, abs(x[key] - y[key]) / abs(x[key]))
    assert x["expert_tokens"]["per_expert"] == y["expert_tokens"]["per_expert"], (x, y)
    assert x.get("dropped_tokens") == y.get("dropped_tokens"), (x, y)
print(f"{sys.argv[2].split('/')[-2]}: worst relative loss / grad norm difference {worst:.2e}")
assert worst <= 1e-5, (a, b)
PY
	fail "$2 differs from $1"
}

# uneven NAME P: the step-1 loads of the P expert-parallel ranks (E / P experts each) differ
uneven() {
	ok
	python3 - "$T/$1/training_metrics.json" "$2" <<'PY' ||
import json, sys
p = int(sys.argv[2])
for l, c in enumerate(json.load(open(sys.argv[1]))["steps"][0]["expert_tokens"]["per_expert"]):
    n = len(c) // p
    loads = [sum(c[r * n:(r + 1) * n]) for r in range(p)]
    print(f"moe layer {l}: per-expert {c}, per-rank {loads}")
    assert max(loads) > min(loads), loads
PY
	fail "$1: expert loads are even"
}

run cls1x2 cls 1 2 2
run clsep2 cls 2 2 1 --set parallel.expert=2
same cls1x2 clsep2
for t in cls sft; do
	run ${t}1x4 $t 1 1 4
	run ${t}ep4 $t 4 1 1 --set parallel.expert=4 --set checkpoint.every=2
	same ${t}1x4 ${t}ep4
	uneven ${t}ep4 4
done
# a checkpoint maps every expert from the rank holding it: resume clsep4's step 2 with 2
# expert-parallel ranks (the same one-record micro-batches: the load-balancing loss is per
# micro-batch)
cp -r "$T/clsep4" "$T/clsep4r"
rm -rf "$T/clsep4r/checkpoints/step-000003"
run clsep4r cls 2 1 2 --set parallel.expert=2 --set checkpoint.every=2
ok
grep -q "resuming from .*step-000002" "$T/clsep4r/train.log" || fail "clsep4r did not resume"
same clsep4 clsep4r
run clsep2x2 cls 4 1 1 --set parallel.expert=2 --set train.activation_checkpointing=true
same cls1x4 clsep2x2
# context parallel with MoE layers: each row's tokens over 2 ranks (one data-parallel rank), and
# context 2 x expert 2 on 4 ranks (2 data-parallel ranks), the routing statistics of the
# load-balancing loss summed over the context group
run clscp2 cls 2 2 2 --set parallel.context=2
same cls1x2 clscp2
run clscp2ep2 cls 4 2 1 --set parallel.context=2 --set parallel.expert=2
same cls1x2 clscp2ep2
run sftcp2ep2 sft 4 1 2 --set parallel.context=2 --set parallel.expert=2 \
	--set train.activation_checkpointing=true
same sft1x4 sftcp2ep2
# the second user's recipe layout (conf/layouts/moe-sft-32.yaml), scaled to 4 ranks
{ echo "include: [$top_srcdir/conf/layouts/moe-sft-32.yaml]"; cat "$T/sft.yaml"; } \
	>"$T/recipe.yaml"
run sftrecipe recipe 4 1 2 --set parallel.context=2 --set parallel.expert=2
same sft1x4 sftrecipe
ok
grep -q "4 rank(s) = 2 data-parallel x 2 context" "$T/sftrecipe/train.log" ||
	fail "sftrecipe: the log does not show the mesh"
expect_fail "expert groups across HSDP nodes" "each node's 2 rank\\(s\\) must hold whole expert groups" \
	$MPIRUN -np 4 --oversubscribe "$SHARDLM" train "$T/sft.yaml" --set run.dir="$T/bad5" \
	--set parallel.expert=2 --set parallel.context=2 --set parallel.shard_group=node \
	--set parallel.node_size=2
ok
grep -q "experts: each rank holds 2 of the 8 experts of every MoE layer (.*over the 1 rank(s)" \
	"$T/clsep4/train.log" || fail "clsep4: the log does not show 2 experts per rank"
ok
grep -q "experts: each rank holds 4 of the 8 experts of every MoE layer (.*over the 2 rank(s)" \
	"$T/clsep2x2/train.log" || fail "clsep2x2: the log does not show 4 experts over 2 ranks"
# the exported models (every expert gathered from the ranks holding it) are the one-rank run's
ok
PYTHONPATH="$top_srcdir/test" python3 - "$T/cls1x4/model" "$T/clsep4/model" "$T/clsep2x2/model" \
	<<'PY' ||
import sys
from safetensors_f32 import load

ref = load(sys.argv[1])
assert any(".mlp.experts.7.down_proj" in k for k in ref), sorted(ref)[:5]
for d in sys.argv[2:]:
    got = load(d)
    assert sorted(got) == sorted(ref), (d, set(got) ^ set(ref))
    worst, at = 0, None
    for k, r in ref.items():
        scale = max(abs(x) for x in r) or 1
        diff = max(abs(x - y) for x, y in zip(r, got[k])) / scale
        if diff > worst:
            worst, at = diff, k
    # AdamW's steps (lr 1e-3) turn rounding-level gradient differences in near-zero elements
    # into ~1e-5 weight differences; a misplaced expert would differ by the weights themselves
    print(f"{d}: {len(got)} tensors, worst difference {worst:.2e} of the tensor's largest ({at})")
    assert worst <= 1e-4, (d, worst, at)
PY
fail "an expert-parallel run's export differs from the one-rank run's"
ok
grep -q "mesh: 2 rank(s) = 2 data-parallel x 1 context; 1 expert group(s) of 2 rank(s), 4 expert" \
	"$T/clsep2/train.log" || fail "clsep2: the log does not show the mesh"
grep -q "2 expert group(s) of 2 rank(s)" "$T/clsep2x2/train.log" ||
	fail "clsep2x2: the log does not show 2 expert groups"

# capacity: one micro-batch of the 4 records (5 + 11 + 3 + 8 = 27 real tokens)
run cap1 cls 1 4 1 --set parallel.capacity_factor=1
ok
python3 - "$T/cap1/training_metrics.json" "$FIX/reference.json" <<'PY' ||
import json, math, sys
got = json.load(open(sys.argv[1]))["steps"][0]["dropped_tokens"]
counts = json.load(open(sys.argv[2]))["cls"]["expert_counts0"]
cap = math.ceil(1.0 * 27 * 2 / 8)
want = sum(max(0, c - cap) for layer in counts for c in layer)
print(f"capacity {cap}: dropped {got}, by hand {want}")
assert want > 0 and got == want, (got, want)
PY
fail "cap1: dropped tokens differ from the hand calculation"
run cap1x2 cls 1 2 2 --set parallel.capacity_factor=1
run capep2 cls 2 2 1 --set parallel.capacity_factor=1 --set parallel.expert=2 \
	--set train.activation_checkpointing=true
same cap1x2 capep2
run cap8 cls 1 2 2 --set parallel.capacity_factor=8
ok
python3 - "$T/cap8/training_metrics.json" "$T/cls1x2/training_metrics.json" \
	"$T/cap1x2/training_metrics.json" <<'PY' ||
import json, sys
a, b, c = (json.load(open(p))["steps"] for p in sys.argv[1:])
assert all(s["dropped_tokens"] == 0 for s in a), a
assert all("dropped_tokens" not in s for s in b), b
assert all(abs(x["loss"] - y["loss"]) <= 1e-5 * abs(y["loss"]) for x, y in zip(a, b)), (a, b)
assert abs(c[0]["loss"] - b[0]["loss"]) > 1e-3, "dropping choices left the loss alone"
PY
fail "cap8: a capacity no expert reaches changes the run"

# bad layouts (one rank)
expect_fail "experts % expert" "parallel.expert 3 must divide the model's 8 experts" \
	"$SHARDLM" train "$T/cls.yaml" --set run.dir="$T/bad1" --set parallel.expert=3
expect_fail "dp % expert" "parallel.expert 2 must divide the 1 data-parallel ranks" \
	"$SHARDLM" train "$T/cls.yaml" --set run.dir="$T/bad2" --set parallel.expert=2
"$top_builddir/test/mkmodel" --out "$T/dense" --vocab 96 --hidden 16 --layers 1 --heads 2 \
	--kv-heads 1 --head-dim 8 --intermediate 24 --seed 5 >/dev/null || fail "mkmodel"
expect_fail "dense" "parallel.capacity_factor applies to mixture-of-experts models" \
	"$SHARDLM" train "$T/cls.yaml" --set run.dir="$T/bad4" --set model.path="$T/dense" \
	--set parallel.capacity_factor=1
finish
