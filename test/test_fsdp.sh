#!/bin/sh
# Fully sharded data parallel training over MPI ranks on the CPU backend:
#  - the same losses (1e-5 relative) for 1, 2, 3, 4 ranks (uneven shard sizes) and for a 2 x 4
#    HSDP layout on 8 ranks, the records of each step being the same whatever the world size;
#  - a run resumed from its step-4 checkpoint repeats the uninterrupted run's losses bit for bit
#    (same world size), and within 1e-5 on another world size;
#  - the checkpoint's index.h5 shows each parameter whole (h5dump), equal to the exported model.
. "${top_srcdir:-$(dirname "$0")/..}/test/lib.sh"

if ! command -v "${MPIRUN:-mpirun}" >/dev/null 2>&1; then
	echo "no mpirun: skipped"; exit 77
fi
MPIRUN=${MPIRUN:-mpirun}
MODEL="$T/model"
tiny_fsdp_inputs "$T"
cat >"$T/base.yaml" <<YAML
model: {path: $MODEL}
backend: cpu
data: {train: $T/data.jsonl, max_state: 32, seed: 3}
train: {steps: 8, eval_every: 0}
optim: {lr: 3.0e-3, warmup: 2, weight_decay: 0.1, clip: 1.0}
checkpoint: {every: 4, keep: 3}
export: {dtype: fp32}
YAML

# run NAME NP BATCH ACCUM [--set ...]: 24 records per step whatever NP
run() {
	name=$1 np=$2 b=$3 acc=$4
	shift 4
	ok
	if ! "$MPIRUN" -np "$np" --oversubscribe "$SHARDLM" train "$T/base.yaml" \
		--set run.dir="$T/$name" --set train.batch="$b" --set train.accum="$acc" "$@" \
		>"$T/$name.out" 2>&1; then
		fail "$name: exited non-zero"; tail -n 20 "$T/$name.out" >&2
	fi
}

# losses NAME: one loss per line, all digits
losses() {
	python3 -c 'import json,sys; [print(repr(s["loss"])) for s in json.load(open(sys.argv[1]))["steps"]]' \
		"$T/$1/training_metrics.json"
}

# close A B TOL: every loss of run B within TOL (relative) of run A's
close() {
	ok
	python3 - "$T/$1/training_metrics.json" "$T/$2/training_metrics.json" "$3" <<'PY' ||
import json, sys
a = [s["loss"] for s in json.load(open(sys.argv[1]))["steps"]]
b = [s["loss"] for s in json.load(open(sys.argv[2]))["steps"]]
tol = float(sys.argv[3])
assert len(a) == len(b) == 8, (len(a), len(b))
worst = max(abs(x - y) / abs(x) for x, y in zip(a, b))
print(f"{sys.argv[2].split('/')[-2]}: worst relative loss difference {worst:.2e}")
assert worst <= tol, (a, b)
assert a[-1] < a[0]
PY
	fail "losses of $2 differ from $1 by more than $3"
}

run np1 1 12 2
run np2 2 6 2
run np3 3 4 2
run np4 4 6 1
run hsdp8 8 3 1 --set parallel.shard_group=node --set parallel.node_size=4
run fsdp8 8 3 1
# the reduce-scatter's fp32 staging smaller than every unit (10 elements): each unit goes
# through it in rounds (shard.c sl_shard_reduce_to), uneven shards, accum 2 and 1
export SHARDLM_TEST_RS_STAGE=10
run stage3 3 4 2
run stage4 4 6 1
unset SHARDLM_TEST_RS_STAGE
for r in np2 np3 np4 hsdp8 fsdp8 stage3 stage4; do close np1 $r 1e-5; done
grep -q "2 replica" "$T/hsdp8/train.log" || fail "hsdp8: log does not show 2 replicas"
grep -q "4 rank(s) per shard group" "$T/hsdp8/train.log" || fail "hsdp8: shard group not 4"

# one micro-batch a step: the layers' gradients live in their activations (shard.c grad_room);
# on one rank in the compute type, where the backward writes them (grad_direct).  The same
# losses and gradient norms, bit for bit, as through fp32 accumulators in blocks of their own
# (SHARDLM_TEST_NO_GRAD_ROOM), on 1 rank and on 2 (reduce-scattered into the lent memory).
norms() {
	python3 -c 'import json,sys; [print(repr(s["loss"]), repr(s["grad_norm"])) for s in json.load(open(sys.argv[1]))["steps"]]' \
		"$T/$1/training_metrics.json"
}
run lend1 1 24 1
run lend2 2 12 1
export SHARDLM_TEST_NO_GRAD_ROOM=1
run nolend1 1 24 1
run nolend2 2 12 1
unset SHARDLM_TEST_NO_GRAD_ROOM
close np1 lend1 1e-5
close np1 lend2 1e-5
ok
grep -q "gradients: 2 unit(s)' compute-type gradient shards" "$T/lend1/train.log" &&
	grep -q "no fp32 copy" "$T/lend1/train.log" ||
	fail "lend1: the log does not show the direct gradients in the layers' activations"
ok
grep -q "gradients: 2 unit(s)' fp32 gradient shards" "$T/lend2/train.log" &&
	! grep -q "no fp32 copy" "$T/lend2/train.log" ||
	fail "lend2: the log does not show fp32 gradient shards in the layers' activations"
ok
! grep -q "gradients: " "$T/nolend1/train.log" || fail "nolend1: gradients lent or direct"
for n in 1 2; do
	ok
	norms lend$n >"$T/l1.txt"
	norms nolend$n >"$T/l0.txt"
	cmp -s "$T/l1.txt" "$T/l0.txt" || { fail "lend$n: lent gradients change the run";
		paste "$T/l1.txt" "$T/l0.txt" >&2; }
done

# resume: drop the step-8 checkpoint and what followed step 4, start again
ok
[ -f "$T/np2/checkpoints/step-000004/COMPLETE" ] || fail "np2: no complete step-4 checkpoint"
[ -f "$T/np2/checkpoints/step-000008/COMPLETE" ] || fail "np2: no complete step-8 checkpoint"
cp -r "$T/np2" "$T/np2r"
cp -r "$T/np2" "$T/np3r"
rm -rf "$T/np2r/checkpoints/step-000008" "$T/np3r/checkpoints/step-000008"
run np2r 2 6 2
grep -q "resuming from .*step-000004" "$T/np2r/train.log" || fail "np2r did not resume"
losses np2 >"$T/a.txt"
losses np2r >"$T/b.txt"
ok
cmp -s "$T/a.txt" "$T/b.txt" || { fail "resumed losses are not bit-identical";
	paste "$T/a.txt" "$T/b.txt" >&2; }
run np3r 3 4 2
close np2 np3r 1e-5

# a change that is not allowed on resume is refused, naming the key
cp -r "$T/np2r" "$T/np2x"
rm -rf "$T/np2x/checkpoints/step-000008"
expect_fail "resume with another lr" "optim.lr" "$MPIRUN" -np 2 --oversubscribe "$SHARDLM" \
	train "$T/base.yaml" --set run.dir="$T/np2x" --set train.batch=6 --set train.accum=2 \
	--set optim.lr=1e-3

# the index shows each parameter whole, equal to the exported model (same final weights)
IDX="$T/np3/checkpoints/step-000008/index.h5"
ok
if command -v h5dump >/dev/null 2>&1; then
	h5dump -d "/master/model.layers.1.mlp.down_proj.weight" "$IDX" >"$T/dump.txt" 2>&1 ||
		fail "h5dump failed"
	python3 - "$T/dump.txt" "$T/np3/model/model.safetensors.index.json" "$T/np3/model" <<'PY' ||
import json, re, struct, sys, os
text = open(sys.argv[1]).read()
assert "DATASPACE  SIMPLE { ( 20, 36 ) / ( 20, 36 ) }" in text, text[:400]
data = text[text.index("DATA {"):]
vals = [float(v) for v in re.findall(r"-?\d+\.\d+(?:e[-+]\d+)?|-?\d+e[-+]\d+", data.split("}")[0])]
name = "model.layers.1.mlp.down_proj.weight"
d = sys.argv[3]
fname = json.load(open(sys.argv[2]))["weight_map"][name] if os.path.exists(sys.argv[2]) else "model.safetensors"
raw = open(os.path.join(d, fname), "rb").read()
hl = struct.unpack("<Q", raw[:8])[0]
hdr = json.loads(raw[8:8 + hl])
b, e = hdr[name]["data_offsets"]
w = struct.unpack("<%df" % ((e - b) // 4), raw[8 + hl + b:8 + hl + e])
assert len(vals) == len(w) == 720, (len(vals), len(w))
# h5dump prints about 6 significant digits
worst = max(abs(x - y) / (abs(y) + 1e-12) for x, y in zip(vals, w))
assert worst <= 1e-5, worst
print("h5dump matches the exported weight; max difference", worst)
PY
	fail "h5dump of the index differs from the exported model"
fi

# `shardlm export` of the final checkpoint (3 ranks wrote it) gives the exported model's tensors,
# and scoring with the checkpoint gives the scores of the exported model
expect_ok "export a checkpoint" "$SHARDLM" export "$T/np3/checkpoints/step-000008" --out "$T/exp"
ok
python3 - "$T/np3/model" "$T/exp" <<'PY' || fail "export of the checkpoint differs from the run's export"
import json, os, struct, sys
def tensors(d):
    out = {}
    for f in os.listdir(d):
        if not f.endswith(".safetensors"):
            continue
        raw = open(os.path.join(d, f), "rb").read()
        hl = struct.unpack("<Q", raw[:8])[0]
        for k, v in json.loads(raw[8:8 + hl]).items():
            if k == "__metadata__":
                continue
            b, e = v["data_offsets"]
            out[k] = (v["shape"], raw[8 + hl + b:8 + hl + e])
    return out
a, b = tensors(sys.argv[1]), tensors(sys.argv[2])
assert a.keys() == b.keys() and len(a) > 0, (sorted(a), sorted(b))
for k in a:
    assert a[k] == b[k], k
print(len(a), "tensors identical")
PY
expect_ok "score with the exported model" "$SHARDLM" score "$T/base.yaml" --set run.dir="$T/np3" \
	--data "$T/data.jsonl"
grep '"index"' "$T/out" >"$T/s1.jsonl"
expect_ok "score with the checkpoint" "$SHARDLM" score "$T/base.yaml" --set run.dir="$T/np3" \
	--data "$T/data.jsonl" --model "$T/np3/checkpoints/step-000008"
grep '"index"' "$T/out" >"$T/s2.jsonl"
ok
[ "$(wc -l <"$T/s1.jsonl")" = 48 ] && cmp -s "$T/s1.jsonl" "$T/s2.jsonl" ||
	fail "scores from the checkpoint differ from the exported model's"
finish
