#!/bin/sh
# Damaged and hostile inputs (test/bad/, made by test/bad/make-bad.py; HDF5 checkpoints damaged
# here from a fresh one): each must end its command with a non-zero status below 128 (no crash,
# no signal), the error text test/bad/EXPECT gives, and no sanitizer report.
. "${top_srcdir:-$(dirname "$0")/..}/test/lib.sh"

B="$top_srcdir/test/bad"
# single-rank runs without mpirun: no helper daemon per run (twice as fast under ASan)
OMPI_MCA_ess_singleton_isolated=1
export OMPI_MCA_ess_singleton_isolated
# a copy: a rebuild of src/shardlm while the test runs cannot pull it from under it
cp "$SHARDLM" "$T/shardlm" || fail "no $SHARDLM: build it first"
SHARDLM="$T/shardlm"
MODEL="$T/model"
"$top_builddir/test/mkmodel" --out "$MODEL" --vocab 61 --hidden 64 --layers 2 --heads 4 \
	--kv-heads 2 --head-dim 16 --intermediate 128 --seed 5 >/dev/null || fail "mkmodel"
printf '{"input_ids": [1, 2, 3], "label": 0.5}\n{"input_ids": [4, 5], "label": 0.25}\n' \
	>"$T/good.jsonl"
cat >"$T/base.yaml" <<YAML
model: {path: $MODEL}
backend: cpu
data: {train: $T/good.jsonl, max_state: 16}
train: {steps: 2, batch: 1, accum: 1, eval_every: 0}
checkpoint: {every: 1, keep: 3}
export: {dtype: fp32}
YAML

# check NAME PATTERN CMD...: non-zero, below 128, PATTERN printed, no sanitizer report
check() {
	name=$1 pat=$2
	shift 2
	ok
	timeout 120 "$@" >"$T/out" 2>&1 </dev/null
	rc=$?
	if [ "$rc" = 0 ]; then
		fail "$name: exited 0"
	elif [ "$rc" -ge 124 ]; then
		fail "$name: exit status $rc (a crash, a signal or a timeout)"
	elif grep -Eq "ERROR: (Address|Leak)Sanitizer|runtime error:" "$T/out"; then
		fail "$name: a sanitizer report"
	elif ! grep -Eq -- "$pat" "$T/out"; then
		fail "$name: the output lacks /$pat/"
	else
		return 0
	fi
	tail -n 15 "$T/out" >&2
}

train() {	# NAME [--set ...]: one rank, its own run dir
	n=$1
	shift
	"$SHARDLM" train "$T/base.yaml" --set run.dir="$T/run-$n" "$@"
}

grep -v '^#' "$B/EXPECT" | while IFS='	' read -r kind file pat; do
	case $kind in
	yaml)
		check "$file" "$pat" "$SHARDLM" config "$B/$file" ;;
	jsonl)
		check "$file" "$pat" "$SHARDLM" train "$T/base.yaml" --set run.dir="$T/run-$file" \
			--set data.train="$B/$file" ;;
	configjson)
		d="$T/m-$file"
		mkdir -p "$d"
		cp "$B/$file" "$d/config.json"
		ln -sf "$MODEL/model.safetensors" "$d/model.safetensors"
		check "$file" "$pat" "$SHARDLM" train "$T/base.yaml" --set run.dir="$T/run-$file" \
			--set model.path="$d" ;;
	st)
		d="$T/m-$file"
		mkdir -p "$d"
		cp "$MODEL/config.json" "$d/config.json"
		cp "$B/$file" "$d/model.safetensors"
		check "$file" "$pat" "$SHARDLM" train "$T/base.yaml" --set run.dir="$T/run-$file" \
			--set model.path="$d" ;;
	tokenizer)
		echo '"hello world"' >"$T/in.jsonl"
		check "$file" "$pat" sh -c '"$1" tokenize --tokenizer "$2" <"$3"' sh "$SHARDLM" \
			"$B/$file" "$T/in.jsonl" ;;
	ckpt)
		;;	# below
	*)
		fail "EXPECT: unknown kind '$kind'" ;;
	esac
	echo "$checks $failures" >"$T/count"
done
read -r checks failures <"$T/count"

# ---- HDF5 checkpoints: a good 2-step run (checkpoints at steps 1 and 2), another model's, then
# each case a copy of the run with one thing damaged; the run then resumes from step 2.
train good >"$T/good.out" 2>&1 || fail "the good run failed: $(tail -n 5 "$T/good.out")"
"$top_builddir/test/mkmodel" --out "$T/model2" --vocab 61 --hidden 32 --layers 2 --heads 4 \
	--kv-heads 2 --head-dim 8 --intermediate 64 --seed 6 >/dev/null || fail "mkmodel 2"
train other --set model.path="$T/model2" >"$T/other.out" 2>&1 || fail "the other model's run failed"
S=checkpoints/step-000002
damage() {	# NAME
	r="$T/run-ck-$1"
	rm -rf "$r"
	cp -r "$T/run-good" "$r"
	case $1 in
	ckpt-truncated-rank)
		f="$r/$S/rank-00000.h5"
		head -c $(($(wc -c <"$f") / 2)) "$f" >"$f.t" && mv "$f.t" "$f" ;;
	ckpt-missing-rank)
		rm "$r/$S/rank-00000.h5" ;;
	ckpt-empty-index)
		: >"$r/$S/index.h5" ;;
	ckpt-garbage-rank)
		head -c 65536 /dev/urandom >"$r/$S/rank-00000.h5" ;;
	ckpt-flipped-bytes)
		# bytes inside unit 1's master weights (h5dump tells where they are)
		f="$r/$S/rank-00000.h5"
		off=$(h5dump -p -H -d /master/unit-0001 "$f" | awk '/OFFSET/ { print $2; exit }')
		python3 -c 'import sys; p, o = sys.argv[1], int(sys.argv[2]); b = bytearray(open(p, "rb").read())
for i in range(o + 64, o + 128): b[i] ^= 0x5a
open(p, "wb").write(b)' "$f" "${off:-0}" ;;
	ckpt-swapped-ranks)
		# one rank here; write the run with two so that there are two files to swap
		;;
	ckpt-other-step)
		cp "$r/checkpoints/step-000001/rank-00000.h5" "$r/$S/rank-00000.h5" ;;
	ckpt-other-model)
		rm -rf "$r/$S" && cp -r "$T/run-other/$S" "$r/$S" ;;
	ckpt-bigger-rank-file)
		cp "$T/run-other/$S/rank-00000.h5" "$r/$S/rank-00000.h5" ;;
	esac
}
grep '^ckpt	' "$B/EXPECT" | while IFS='	' read -r kind name pat; do
	[ "$name" = ckpt-swapped-ranks ] && continue
	damage "$name"
	check "$name" "$pat" "$SHARDLM" train "$T/base.yaml" --set run.dir="$T/run-ck-$name" \
		--set train.steps=4
	echo "$checks $failures" >"$T/count"
done
read -r checks failures <"$T/count"
# two rank files to swap: a 2-rank run
if command -v "${MPIRUN:-mpirun}" >/dev/null 2>&1; then
	"${MPIRUN:-mpirun}" -np 2 --oversubscribe "$SHARDLM" train "$T/base.yaml" \
		--set run.dir="$T/run-ck-ckpt-swapped-ranks" >"$T/two.out" 2>&1 ||
		fail "the 2-rank run failed: $(tail -n 5 "$T/two.out")"
	d="$T/run-ck-ckpt-swapped-ranks/$S"
	mv "$d/rank-00000.h5" "$d/x.h5" && mv "$d/rank-00001.h5" "$d/rank-00000.h5" &&
		mv "$d/x.h5" "$d/rank-00001.h5"
	check ckpt-swapped-ranks "$(grep '^ckpt	ckpt-swapped-ranks	' "$B/EXPECT" | cut -f3)" \
		"$SHARDLM" train "$T/base.yaml" --set run.dir="$T/run-ck-ckpt-swapped-ranks" \
		--set train.steps=4
fi
finish
