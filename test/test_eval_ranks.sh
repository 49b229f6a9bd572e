#!/bin/sh
# test_eval_ranks.sh: validation when the ranks hold different numbers of validation records.
# 3 records over 2 ranks (batch 1) give one rank 2 forwards and the other 1; the weights are
# sharded, so the forwards' all-gathers must still pair up (a hang before the fix).  The
# validation losses of 2 ranks must equal one rank's, for task sft and task classify.
. "${top_srcdir:-$(dirname "$0")/..}/test/lib.sh"
MPIRUN=${MPIRUN:-mpirun}
FIX="$top_srcdir/test/fixtures"
head -n 3 "$FIX/sft/records.jsonl" >"$T/valid-sft.jsonl"
head -n 3 "$FIX/hf/records.jsonl" >"$T/valid-classify.jsonl"

# run NAME NP ACCUM TASK MODEL TRAIN VALID
run() {
	ok
	echo "backend: cpu" >"$T/base.yaml"
	if ! timeout 120 "$MPIRUN" -np "$2" --oversubscribe "$SHARDLM" train "$T/base.yaml" \
		--set model.path="$FIX/$5" --set task="$4" \
		--set data.train="$FIX/$6" --set data.valid="$T/$7" --set data.max_state=64 \
		--set train.batch=1 --set train.accum="$3" --set train.steps=2 \
		--set train.eval_every=1 --set checkpoint.every=0 --set export.final=false \
		--set run.dir="$T/$1" >"$T/$1.out" 2>&1; then
		fail "$1: exited non-zero (or hung)"; tail -n 5 "$T/$1.out" >&2
	fi
	grep "eval step" "$T/$1.out" | sed 's/^\[[0-9:]*\] //' >"$T/$1.eval"
}

for task in sft classify; do
	if [ $task = sft ]; then m=sft/untied; d=sft/records.jsonl; else m=hf/cls; d=hf/records.jsonl; fi
	run "$task-1" 1 4 $task $m $d valid-$task.jsonl
	run "$task-2" 2 2 $task $m $d valid-$task.jsonl
	ok
	[ "$(wc -l <"$T/$task-1.eval")" -eq 3 ] || fail "$task: $(wc -l <"$T/$task-1.eval") eval lines"
	ok
	cmp -s "$T/$task-1.eval" "$T/$task-2.eval" ||
		{ fail "$task: 2 ranks validate differently"; diff "$T/$task-1.eval" "$T/$task-2.eval" >&2; }
done
finish
