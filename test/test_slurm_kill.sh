#!/bin/sh
# A lost rank under Slurm: slurm/train.slurm (its CPU variant) trains on 2 ranks through
# srun --mpi=pmix on the one-node Slurm of slurm-lib.sh; SIGKILL of the rank-1 task must end the
# job well within parallel.timeout_s (srun --kill-on-bad-exit: Slurm notices, not our watchdog),
# srun's message naming the task and the node.  Skips (77) where Slurm cannot run.
. "${top_srcdir:-$(dirname "$0")/..}/test/lib.sh"

SLURM_PORT=26837		# not test_slurm.sh's
. "$top_srcdir/test/slurm-lib.sh"
echo "one-node Slurm up on $HOST ($(sinfo -V))"

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
J="$T/job"
mkdir -p "$J/logs"
cp "$SHARDLM" "$T/shardlm" || fail "no $SHARDLM: build it first"
sed '/^#SBATCH --gpus/d' "$top_srcdir/slurm/train.slurm" >"$J/train-cpu.slurm"
RUN="$J/runs/kill"
id=$(cd "$J" && CONF="$top_srcdir/conf/test-tiny.yaml" RUN="$RUN" SHARDLM="$T/shardlm" \
	BATCH=4 ACCUM=2 \
	SET="model.path=$MODEL data.train=$T/data.jsonl data.valid= train.steps=100000 train.eval_every=0 checkpoint.every=0 run.log_every=1 parallel.timeout_s=20 gpu_log.file=$J/logs/gpu-%j-%h.csv" \
	sbatch --parsable --job-name=kill --ntasks-per-node=2 --cpus-per-task=1 --mem=1000M \
	--time=5 --mail-type=NONE train-cpu.slurm) || fail "sbatch"
out="$J/logs/kill-$id.out"

# rank 1's task, once the job trains
victim=
for i in $(seq 1 240); do
	if grep -q "\] step 5/" "$RUN/train.log" 2>/dev/null; then
		for p in $(pgrep -f "$T/shardlm train"); do
			tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx SLURM_PROCID=1 &&
				victim=$p
		done
		break
	fi
	sleep 0.5
done
if [ -z "$victim" ]; then
	fail "the job never trained (or no rank-1 task): $(tail -n 5 "$out" 2>/dev/null)"
	scancel "$id"
else
	t0=$(date +%s)
	kill -9 "$victim"
	while [ -n "$(squeue -h -j "$id" -o %i 2>/dev/null)" ] && [ $(($(date +%s) - t0)) -lt 90 ]; do
		sleep 0.5
	done
	took=$(($(date +%s) - t0))
	ok
	[ "$took" -lt 20 ] || fail "the job took ${took}s to end after the kill (parallel.timeout_s 20)"
	ok
	grep -Eq "srun: error: $HOST: task 1: Killed" "$out" ||
		fail "no srun message naming task 1 and $HOST: $(tail -n 8 "$out")"
	ok
	scontrol show job "$id" -o 2>/dev/null | grep -q "JobState=FAILED" ||
		fail "job state: $(scontrol show job "$id" -o | grep -o 'JobState=[A-Z]*')"
	grep -q "no progress in" "$out" && fail "our watchdog, not Slurm, ended the job"
	echo "the job ended ${took}s after rank 1 was killed; its output ends:"
	tail -n 4 "$out"
fi
stop_daemons
finish
