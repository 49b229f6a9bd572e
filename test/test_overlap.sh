#!/bin/sh
# SHARDLM_OPT_OVERLAP=1: AdamW on the backend's side stream, under the next step's forward, which
# waits for each unit's update only where it reads the unit; and each unit's sum of squares (the
# gradient norm) there as soon as its gradient is reduced, under the rest of the backward.  On
# the cpu backend the side stream runs its work only when an event recorded after it is waited
# for: the latest a GPU could ever run it, so a read of a unit before its update (weights,
# gradients living in the layers' activations, a checkpoint or the export) gives other numbers.
# Each overlapped run also runs with SHARDLM_CPU_SIDE=now, the side work run when issued, the
# earliest: a sum of squares issued before the gradient is whole gives another norm.  Every run
# here must repeat the run without the overlap bit for bit: losses and gradient norms of every
# step, and the exported fp32 weights (cmp):
#  - 1 rank, accum 1: gradients in the compute type, held in the layers' activations; an
#    evaluation between steps;
#  - 1 rank, accum 2 (fp32 accumulators, the norm's sums issued at the last micro-batch);
#    activation checkpointing;
#  - 2 ranks (FSDP: all-gathers of the updated shards), accum 1 and 2;
#  - the tiny Qwen3-MoE sft fixture (expert units), 1 rank; the tiny Qwen3.5-MoE hybrid (Gated
#    DeltaNet and gated attention layers, its own activations), 1 rank; context parallel 2;
#  - a run stopped after step 3 with a checkpoint and resumed to step 6 (the checkpoint written
#    while the update may still be running);
#  - with the updates issued as the next forward comes to them (SHARDLM_OPT_AHEAD=1: each unit's
#    when the forward reads the unit before it; the Qwen3-MoE's expert units come in the
#    forward's order, not the layout's) in launches of at most 1024 elements
#    (SHARDLM_OPT_CHUNK): 1 rank with an evaluation, the MoE, 2 ranks, the resumed run.
. "${top_srcdir:-$(dirname "$0")/..}/test/lib.sh"

if ! command -v "${MPIRUN:-mpirun}" >/dev/null 2>&1; then
	echo "no mpirun: skipped"; exit 77
fi
MPIRUN=${MPIRUN:-mpirun}
FIX="$top_srcdir/test/fixtures/moe"
tiny_fsdp_inputs "$T"
head -n 8 "$T/data.jsonl" >"$T/valid.jsonl"
cat >"$T/base.yaml" <<YAML
model: {path: $T/model}
backend: cpu
data: {train: $T/data.jsonl, valid: $T/valid.jsonl, max_state: 32, seed: 3}
train: {steps: 6, eval_every: 2, batch: 4, accum: 1}
optim: {lr: 3.0e-3, schedule: constant, warmup: 1, weight_decay: 0.1, clip: 1.0}
checkpoint: {every: 0}
export: {dtype: fp32}
run: {log_every: 1}
YAML
# no evaluation, whose forward would wait for the update before the checkpoint is written
grep -v "^data:" "$T/base.yaml" >"$T/noeval.yaml"
echo "data: {train: $T/data.jsonl, max_state: 32, seed: 3}" >>"$T/noeval.yaml"
# sft_yaml NAME MODEL RECORDS MAX_STATE STEPS: an sft config on the cpu backend
sft_yaml() {
	cat >"$T/$1.yaml" <<YAML
model: {path: $2}
task: sft
backend: cpu
data: {train: $3, shuffle: false, length_sort: false, max_state: $4}
train: {steps: $5, eval_every: 0, batch: 2, accum: 1}
optim: {lr: 1.0e-3, warmup: 1, weight_decay: 0.1, clip: 1.0}
checkpoint: {every: 0}
export: {dtype: fp32}
run: {log_every: 1}
YAML
}
sft_yaml moe "$FIX/sft" "$FIX/sft_records.jsonl" 64 4
sft_yaml q35 "$top_srcdir/test/fixtures/q35moe/text" "$top_srcdir/test/fixtures/q35moe/records.jsonl" \
	256 3

# run NAME OVERLAP NP CONFIG [--set ...]; OVERLAP: 0, 1, or now (1 with SHARDLM_CPU_SIDE=now)
run() {
	name=$1 ov=$2 np=$3 cfg=$4 side=
	shift 4
	ok
	[ "$ov" = now ] && ov=1 side=now
	launch="$MPIRUN -np $np --oversubscribe -x SHARDLM_OPT_OVERLAP -x SHARDLM_CPU_SIDE
		-x SHARDLM_OPT_AHEAD -x SHARDLM_OPT_CHUNK -x SHARDLM_OPT_BWD"
	[ "$np" = 1 ] && launch=
	if ! SHARDLM_OPT_OVERLAP=$ov SHARDLM_CPU_SIDE=$side $launch "$SHARDLM" train "$T/$cfg.yaml" \
		--set run.dir="$T/$name" "$@" >"$T/$name.out" 2>&1; then
		fail "$name: exited non-zero"; tail -n 20 "$T/$name.out" >&2
		return
	fi
	ok
	if [ "$ov" = 1 ] && ! grep -q "AdamW on a side stream" "$T/$name.out"; then
		fail "$name: the log does not say the optimizer overlaps"
	fi
}

# same A B [FIRST]: B's losses and gradient norms equal A's from step FIRST (default 1) on, and
# the exported weights are the same bytes
same() {
	ok
	python3 - "$T/$1/training_metrics.json" "$T/$2/training_metrics.json" "${3:-1}" <<'PY' ||
import json, sys
a = json.load(open(sys.argv[1]))["steps"]
b = json.load(open(sys.argv[2]))["steps"]
first = int(sys.argv[3])
a = [s for s in a if s["step"] >= first]
b = [s for s in b if s["step"] >= first]
assert len(a) == len(b) >= 3, (len(a), len(b))
for x, y in zip(a, b):
    assert x["step"] == y["step"], (x, y)
    for key in ("loss", "grad_norm"):
        assert x[key] == y[key], (key, x["step"], x[key], y[key])
assert a[-1]["loss"] != a[0]["loss"]
PY
	fail "$2: the losses or gradient norms differ from $1's"
	ok
	n=0
	for f in "$T/$1/model/"*.safetensors; do
		n=$((n + 1))
		cmp -s "$f" "$T/$2/model/$(basename "$f")" ||
			fail "$2: exported $(basename "$f") differs from $1's"
	done
	[ "$n" -gt 0 ] || fail "$1: no exported weights"
}

# case NAME NP CONFIG [--set ...]: without, overlapped (side work late), overlapped (early)
case_() {
	cn=$1
	shift
	run "$cn" 0 "$@"
	run "${cn}_ov" 1 "$@"
	run "${cn}_now" now "$@"
	same "$cn" "${cn}_ov"
	same "$cn" "${cn}_now"
}

case_ one 1 base
grep -q "eval" "$T/one_ov/training_metrics.json" || fail "one_ov: no evaluation between steps"
ok
grep -q "sums of squares there too" "$T/one_ov.out" || fail "one_ov: the norm is not overlapped"
case_ acc2 1 base --set train.batch=2 --set train.accum=2
case_ ac 1 base --set train.activation_checkpointing=true
case_ fsdp 2 base --set train.batch=2
case_ fsdp2 2 base --set train.batch=1 --set train.accum=2
case_ moe 1 moe
case_ q35 1 q35
case_ cp 2 base --set parallel.context=2 --set train.batch=2
# stopped after step 3 with a checkpoint, then resumed to step 6 (no evaluation)
run res 0 1 noeval
run res_ov 1 1 noeval --set train.steps=3 --set checkpoint.every=3
run res_ov 1 1 noeval --set checkpoint.every=3
grep -q "resuming from" "$T/res_ov.out" || fail "res_ov: the second run did not resume"
same res res_ov 4
# the updates issued as the forward comes to them, a unit ahead, in pieces
export SHARDLM_OPT_AHEAD=1 SHARDLM_OPT_CHUNK=1000
case_ ahead 1 base
case_ moe_ahead 1 moe
case_ fsdp_ahead 2 base --set train.batch=2
run res_ah 1 1 noeval --set train.steps=3 --set checkpoint.every=3
run res_ah 1 1 noeval --set checkpoint.every=3
same res res_ah 4
unset SHARDLM_OPT_AHEAD SHARDLM_OPT_CHUNK
# without clipping, each unit's update issued as soon as its gradient is done (one rank, one
# micro-batch; the default where the overlap is, SHARDLM_OPT_BWD=0 turns it off): the same bits
# as the run without any overlap, the side work run late or early; a unit's update that ran
# before a later unit's backward had read its weights would give other numbers in the "now" runs
export SHARDLM_OPT_BWD=1	# the default, set for the runs below
bwd_case() {
	case_ "$@"
	ok
	grep -q "issued as soon as its gradient is done" "$T/${1}_ov.out" ||
		fail "${1}_ov: the log does not say the updates run in the backward"
}
bwd_case bwd 1 base --set optim.clip=0
bwd_case bwd_ac 1 base --set optim.clip=0 --set train.activation_checkpointing=true
bwd_case bwd_moe 1 moe --set optim.clip=0
bwd_case bwd_q35 1 q35 --set optim.clip=0
run res_bwd 0 1 noeval --set optim.clip=0
run res_bwd_ov 1 1 noeval --set optim.clip=0 --set train.steps=3 --set checkpoint.every=3
run res_bwd_ov 1 1 noeval --set optim.clip=0 --set checkpoint.every=3
same res_bwd res_bwd_ov 4
# a non-finite gradient: every unit's (as a NaN loss gives) skips the step as without the
# overlap, bit for bit; only the embedding's (the last unit the backward finishes) leaves the
# others updated: the run stops (exit 4) without a checkpoint of that state
export SHARDLM_TEST_NAN_STEP=3
case_ bwd_nan 1 noeval --set optim.clip=0
ok
grep -q "step 3: the loss (nan) or gradient norm (nan) is not finite; skipped the update" \
	"$T/bwd_nan_ov.out" || fail "bwd_nan_ov: no skip warning"
ok
SHARDLM_OPT_OVERLAP=1 SHARDLM_TEST_NAN_PART=1 "$SHARDLM" train "$T/noeval.yaml" \
	--set run.dir="$T/bwd_part" --set optim.clip=0 --set checkpoint.every=2 >"$T/bwd_part.out" 2>&1
rc=$?
[ "$rc" = 4 ] || fail "bwd_part: exit status $rc, not 4: $(tail -n 3 "$T/bwd_part.out")"
ok
grep -q "step 3: the loss (nan) or a gradient is not finite, but the updates issued in the backward" \
	"$T/bwd_part.out" || fail "bwd_part: no stop message"
ok
[ "$(ls "$T/bwd_part/checkpoints")" = step-000002 ] ||
	fail "bwd_part: checkpoints other than step 2's: $(ls "$T/bwd_part/checkpoints")"
[ ! -e "$T/bwd_part/model" ] || fail "bwd_part: a model was exported"
unset SHARDLM_TEST_NAN_STEP
SHARDLM_OPT_BWD=0 run bwd_off 1 1 base --set optim.clip=0
ok
! grep -q "issued as soon as its gradient is done" "$T/bwd_off.out" ||
	fail "bwd_off: SHARDLM_OPT_BWD=0 does not turn the updates in the backward off"
same bwd bwd_off
unset SHARDLM_OPT_BWD
finish
