#!/bin/sh
# The sbatch scripts run for real: a one-node Slurm cluster (munge, slurmctld, slurmd; see
# ../shared/notes/local-slurm.md) is started here, the CPU variants (the --gpus lines dropped) of
# slurm/train.slurm and slurm/marlowe/8gpu.slurm train the tiny model on NRANKS ranks (default 2)
# through srun --mpi=pmix, and their logs and training_metrics.json are checked.  The daemons are
# stopped, by their pids, however the test ends.  Needs root; skips (77) where Slurm cannot run.
. "${top_srcdir:-$(dirname "$0")/..}/test/lib.sh"

NRANKS=${NRANKS:-2}
TIMEOUT=${SLURM_TEST_TIMEOUT:-90}	# seconds for both jobs together
. "$top_srcdir/test/slurm-lib.sh"
echo "one-node Slurm up on $HOST ($(sinfo -V)); jobs on $NRANKS ranks"

# the jobs: the tiny model on the demo's records, CPU backend, from a scratch folder
MODEL="$T/tiny"
"$top_builddir/test/mkmodel" --out "$MODEL" --vocab 512 --hidden 64 --layers 2 --heads 4 \
	--kv-heads 2 --head-dim 16 --intermediate 128 --seed 1 >/dev/null || fail "mkmodel"
J="$T/job"
mkdir -p "$J/logs"
# the jobs run a copy: a rebuild of src/shardlm while they queue cannot pull it from under them
cp "$SHARDLM" "$T/shardlm" || fail "no $SHARDLM: build it first"
SHARDLM="$T/shardlm"
sed '/^#SBATCH --gpus/d' "$top_srcdir/slurm/train.slurm" >"$J/train-cpu.slurm"
sed '/^#SBATCH --gpus/d' "$top_srcdir/slurm/marlowe/8gpu.slurm" >"$J/8gpu-cpu.slurm"
grep -q '^#SBATCH --gpus' "$J/train-cpu.slurm" && fail "the CPU variant still asks for GPUs"
# --signal: the scripts ask for USR1 900 s before the limit, which a 5-minute job is already past
# when it starts; the notice would stop it after a checkpoint (test_slurm_kill.sh tests that)
submit() {	# NAME SCRIPT: prints the job id
	(cd "$J" && CONF="$top_srcdir/conf/test-tiny.yaml" RUN="$J/runs/$1" SHARDLM="$SHARDLM" \
		BATCH=4 ACCUM=1 \
		SET="model.path=$MODEL data.train=$top_srcdir/conf/demo/train.jsonl data.valid=$top_srcdir/conf/demo/valid.jsonl gpu_log.file=$J/logs/gpu-%j-%h.csv" \
		sbatch --parsable --job-name="$1" --ntasks-per-node="$NRANKS" --cpus-per-task=1 \
		--mem=1000M --time=5 --signal=USR1@10 --mail-type=NONE "$2")
}
id1=$(submit generic train-cpu.slurm) || fail "sbatch slurm/train.slurm"
id2=$(submit marlowe8 8gpu-cpu.slurm) || fail "sbatch slurm/marlowe/8gpu.slurm"
end=$(($(date +%s) + TIMEOUT))
while [ "$(date +%s)" -lt "$end" ]; do
	[ -z "$(squeue -h -j "$id1,$id2" -o %i 2>/dev/null)" ] && break
	sleep 1
done
if [ -n "$(squeue -h -j "$id1,$id2" -o %i 2>/dev/null)" ]; then
	fail "jobs still running after ${TIMEOUT}s: cancelled"
	scancel "$id1" "$id2"
	sleep 2
fi

check_job() {	# NAME ID
	name=$1 id=$2 out="$J/logs/$1-$2.out" run="$J/runs/$1"
	ok
	info=$(scontrol show job "$id" -o 2>/dev/null)
	case $info in
	*JobState=COMPLETED*ExitCode=0:0*) ;;
	*) fail "$name: job $id did not complete: $(echo "$info" | grep -o 'JobState=[A-Z_]* Reason=[^ ]* .*ExitCode=[0-9:]*')" ;;
	esac
	[ -s "$out" ] || { fail "$name: no job output $out"; return; }
	echo "--- $name (job $id): the first and last lines of its output"
	head -n 2 "$out"
	tail -n 3 "$out"
	grep -q "^job $id on $HOST: $NRANKS ranks, 1 threads each: " "$out" ||
		fail "$name: no start line with $NRANKS ranks"
	grep -Eq '\] step 8/8 ' "$out" || fail "$name: no final step line"
	grep -q 'the job ran' "$out" || fail "$name: the trainer's last line is missing"
	tail -n 1 "$out" | grep -Eq "^total runtime: 0:0[0-9]:[0-9][0-9] \(job $id, exit status 0\)$" ||
		fail "$name: the last line is not the total runtime: $(tail -n 1 "$out")"
	[ -s "$run/train.log" ] || fail "$name: no $run/train.log"
	python3 - "$run/training_metrics.json" "$NRANKS" <<'PY' || fail "$name: training_metrics.json"
import json, sys
m = json.load(open(sys.argv[1]))
n = int(sys.argv[2])
assert m["run"]["world"] == n, m["run"]
assert m["run"]["records_per_step"] == 4 * n, m["run"]
assert [s["step"] for s in m["steps"]] == list(range(1, 9)), [s["step"] for s in m["steps"]]
assert all(s["records"] == 4 * n for s in m["steps"])
assert len(m["eval"]) >= 2
PY
	# the workflow's next command reads the run
	"$top_builddir/tools/shardlm-epoch" --json "$run" >"$T/epoch.json" 2>&1 ||
		fail "$name: shardlm-epoch on the run: $(cat "$T/epoch.json")"
	grep -q "\"world\": $NRANKS" "$T/epoch.json" || fail "$name: shardlm-epoch world"
	if [ "$failures" -gt 0 ]; then
		echo "--- $out" >&2
		cat "$out" >&2
	fi
}
check_job generic "$id1"
check_job marlowe8 "$id2"
if [ "$failures" -gt 0 ]; then
	tail -n 20 "$D/ctld.log" "$D/d.log" >&2
fi
stop_daemons
finish
