#!/bin/sh
# Reliability of `shardlm train` on 2 ranks (CPU backend, mpirun):
#  - SIGUSR1 while the ranks start, and mid-run: the ranks stop after one agreed step with a
#    complete checkpoint and exit 3;
#    the restarted run resumes from it and repeats the uninterrupted run's losses bit for bit;
#  - SIGKILL of rank 1: the job ends, mpirun naming the rank and host, well within
#    parallel.timeout_s; a stopped (hung) rank: the watchdog aborts the job naming its host/rank;
#  - SHARDLM_TEST_NAN_STEP (a test-only knob): the poisoned step is skipped and counted; a run of
#    train.max_bad_steps of them stops with exit 4 and a checkpoint of the last good step;
#  - too little disk for checkpoint.keep + 1 checkpoints: a clear error before training.
. "${top_srcdir:-$(dirname "$0")/..}/test/lib.sh"

if ! command -v "${MPIRUN:-mpirun}" >/dev/null 2>&1; then
	echo "no mpirun: skipped"; exit 77
fi
MPIRUN=${MPIRUN:-mpirun}
MODEL="$T/model"
"$top_builddir/test/mkmodel" --out "$MODEL" --vocab 61 --hidden 64 --layers 2 --heads 4 \
	--kv-heads 2 --head-dim 16 --intermediate 128 --seed 5 >/dev/null || fail "mkmodel"
python3 - "$T/data.jsonl" <<'PY'
import random, sys
r = random.Random(11)
with open(sys.argv[1], "w") as f:
    for i in range(96):
        n = r.randint(20, 60)
        ids = [r.randrange(1, 61) for _ in range(n)]
        f.write('{"input_ids": %s, "label": %.3f}\n' % (ids, sum(t < 30 for t in ids) / n))
PY
cat >"$T/base.yaml" <<YAML
model: {path: $MODEL}
backend: cpu
data: {train: $T/data.jsonl, max_state: 64, seed: 3}
train: {steps: 200, eval_every: 0, batch: 4, accum: 2}
optim: {lr: 3.0e-3, warmup: 2}
checkpoint: {every: 0, keep: 2}
run: {log_every: 1}
export: {dtype: fp32}
YAML

train() {	# NAME [--set ...]: 2 ranks in the background, pid in $pid
	name=$1
	shift
	"$MPIRUN" -np 2 --oversubscribe "$SHARDLM" train "$T/base.yaml" --set run.dir="$T/$name" \
		"$@" >"$T/$name.out" 2>&1 &
	pid=$!
}

rank1() {	# NAME: the pid of that run's last-started rank process (not mpirun's, nor a wrapper's)
	pgrep -f "^$SHARDLM train $T/base.yaml --set run.dir=$T/$1( |\$)" | sort -n | tail -n 1
}

wait_step() {	# NAME STEP: until the log shows that step (60 s at most)
	for i in $(seq 1 1200); do
		grep -q "\] step $2/" "$T/$1/train.log" 2>/dev/null && return 0
		kill -0 "$pid" 2>/dev/null || return 1
		sleep 0.05
	done
	return 1
}

losses() {
	python3 -c 'import json,sys; [print(repr(s["loss"])) for s in json.load(open(sys.argv[1]))["steps"]]' \
		"$T/$1/training_metrics.json"
}

# --- SIGUSR1 while the ranks start (before MPI_Init): caught, the run stops after step 1 with a
# checkpoint and exit 3 (SHARDLM_TEST_USR1_AT_START raises it right after the handlers go in)
ok
SHARDLM_TEST_USR1_AT_START=1 train early --set train.steps=10
wait "$pid"
rc=$?
[ "$rc" = 3 ] || fail "SIGUSR1 at start: exit status $rc, not 3: $(tail -n 5 "$T/early.out")"
grep -q "SIGUSR1: stopped after step 1 with checkpoint step-000001" "$T/early/train.log" ||
	fail "SIGUSR1 at start: no stop after step 1: $(tail -n 3 "$T/early/train.log")"

# --- SIGUSR1: checkpoint, exit 3, resume bit for bit
ok
train full
wait "$pid" || fail "the uninterrupted run failed: $(tail -n 5 "$T/full.out")"
ok
train usr1
if wait_step usr1 10; then
	kill -USR1 "$pid"	# mpirun forwards SIGUSR1 to the ranks
	wait "$pid"
	rc=$?
	[ "$rc" = 3 ] || fail "SIGUSR1: exit status $rc, not 3: $(tail -n 5 "$T/usr1.out")"
	grep -q "SIGUSR1: stopped after step [0-9]* with checkpoint step-" "$T/usr1/train.log" ||
		fail "SIGUSR1: no stop line in the log"
	n=$(ls "$T/usr1/checkpoints" | wc -l)
	[ "$n" = 1 ] && [ -f "$T/usr1/checkpoints/"step-*/COMPLETE ] ||
		fail "SIGUSR1: not one complete checkpoint: $(ls "$T/usr1/checkpoints")"
	"$MPIRUN" -np 2 --oversubscribe "$SHARDLM" train "$T/base.yaml" \
		--set run.dir="$T/usr1" >"$T/usr1-2.out" 2>&1 || fail "SIGUSR1: the resumed run failed"
	grep -q "resuming from" "$T/usr1-2.out" || fail "SIGUSR1: the second run did not resume"
	losses full >"$T/a"
	losses usr1 >"$T/b"
	cmp -s "$T/a" "$T/b" || fail "SIGUSR1: the resumed losses differ from the uninterrupted run's"
	[ "$(wc -l <"$T/b")" = 200 ] || fail "SIGUSR1: $(wc -l <"$T/b") steps, not 200"
else
	fail "SIGUSR1: the run never reached step 10: $(tail -n 5 "$T/usr1.out")"
	kill "$pid" 2>/dev/null
fi

# --- SIGKILL of rank 1 under mpirun: the job ends, naming the rank and host
ok
train kill --set parallel.timeout_s=20
if wait_step kill 5; then
	t0=$(date +%s)
	victim=$(rank1 kill)
	kill -9 "$victim"
	wait "$pid"
	rc=$?
	took=$(($(date +%s) - t0))
	[ "$rc" != 0 ] || fail "SIGKILL: the job exited 0"
	[ "$took" -lt 20 ] || fail "SIGKILL: the job took ${took}s to end (parallel.timeout_s 20)"
	grep -Eq "rank 1 .* on node $(hostname -s)" "$T/kill.out" ||
		fail "SIGKILL: no message naming rank 1 and the host: $(tail -n 8 "$T/kill.out")"
else
	fail "SIGKILL: the run never reached step 5"
	kill "$pid" 2>/dev/null
fi

# --- a hung rank (SIGSTOP): the watchdog aborts within parallel.timeout_s
ok
train hang --set parallel.timeout_s=4
if wait_step hang 5; then
	t0=$(date +%s)
	victim=$(rank1 hang)
	kill -STOP "$victim"
	wait "$pid"
	rc=$?
	took=$(($(date +%s) - t0))
	kill -9 "$victim" 2>/dev/null
	[ "$rc" != 0 ] || fail "hang: the job exited 0"
	[ "$took" -lt 30 ] || fail "hang: the job took ${took}s to end (parallel.timeout_s 4)"
	# the stop lands in a step or in the signal check between two (both armed, train_step.c)
	grep -Eq "rank [01]: error: no progress in 4 s during (the signal check after )?step [0-9]+ \(a rank died or hangs" \
		"$T/hang.out" || fail "hang: no watchdog message: $(grep -m 3 'error' "$T/hang.out")"
else
	fail "hang: the run never reached step 5"
	kill "$pid" 2>/dev/null
fi

# --- an injected NaN step is skipped and counted
ok
SHARDLM_TEST_NAN_STEP=5 train nan --set train.steps=10
wait "$pid" || fail "nan: exited non-zero: $(tail -n 5 "$T/nan.out")"
grep -q "step 5: the loss (nan) or gradient norm (nan) is not finite; skipped the update" \
	"$T/nan.out" || fail "nan: no skip warning"
grep -Eq "step 5 skipped: its 16 record\(s\) are lines [0-9,]+ of " "$T/nan/train.log" ||
	fail "nan: the step's records are not logged"
python3 - "$T/nan/training_metrics.json" <<'PY' || fail "nan: training_metrics.json"
import json, sys
m = json.load(open(sys.argv[1]))
assert m["run"]["skipped_steps"] == 1, m["run"]
s = {x["step"]: x for x in m["steps"]}
assert len(s) == 10 and s[5].get("skipped") is True and s[5]["loss"] is None, s[5]
assert not any(x.get("skipped") for k, x in s.items() if k != 5)
PY

# --- the same on one rank with one micro-batch a step: the NaN lands in the gradient the
# backward wrote in place (shard.c grad_direct)
ok
SHARDLM_TEST_NAN_STEP=3 "$SHARDLM" train "$T/base.yaml" --set run.dir="$T/nan1" \
	--set train.steps=5 --set train.batch=8 --set train.accum=1 >"$T/nan1.out" 2>&1 ||
	fail "nan1: exited non-zero: $(tail -n 5 "$T/nan1.out")"
grep -q "no fp32 copy" "$T/nan1/train.log" || fail "nan1: the gradients are not direct"
grep -q "step 3: the loss (nan) or gradient norm (nan) is not finite; skipped the update" \
	"$T/nan1.out" || fail "nan1: no skip warning"

# --- train.max_bad_steps in a row: exit 4, a checkpoint of the last good step (3)
ok
SHARDLM_TEST_NAN_STEP=4-9 train bad --set train.steps=10 --set train.max_bad_steps=3
wait "$pid"
rc=$?
[ "$rc" = 4 ] || fail "max_bad_steps: exit status $rc, not 4"
grep -q "3 steps in a row with a non-finite loss or gradient (train.max_bad_steps 3); stopping after step 6" \
	"$T/bad.out" || fail "max_bad_steps: no stop message"
[ -f "$T/bad/checkpoints/step-000003/COMPLETE" ] && [ "$(ls "$T/bad/checkpoints")" = step-000003 ] ||
	fail "max_bad_steps: not one checkpoint of step 3: $(ls "$T/bad/checkpoints")"
if command -v h5dump >/dev/null 2>&1; then
	h5dump -a /step "$T/bad/checkpoints/step-000003/index.h5" | grep -q "(0): 3" ||
		fail "max_bad_steps: the checkpoint's step attribute is not 3"
fi

# --- storage: room for checkpoint.keep + 1 checkpoints is checked before training
expect_fail "storage" "checkpoints need .* GB \(checkpoint.keep 100000000 \+ 1 being written.*--set checkpoint.keep=N" \
	"$SHARDLM" train "$T/base.yaml" --set run.dir="$T/disk" --set checkpoint.every=5 \
	--set checkpoint.keep=100000000
grep -q "\] step 1/" "$T/out" && fail "storage: training started"
mkdir -p "$T/ro/checkpoints"
chmod 555 "$T/ro/checkpoints"
if [ "$(id -u)" != 0 ]; then
	expect_fail "read-only" "the checkpoint directory is not writable" \
		"$SHARDLM" train "$T/base.yaml" --set run.dir="$T/ro" --set checkpoint.every=5
fi
chmod 755 "$T/ro/checkpoints"
finish
