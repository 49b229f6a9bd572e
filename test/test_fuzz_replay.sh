#!/bin/sh
# The fuzzers' committed corpora (fuzz/corpus/HARNESS/, regressions included) run once through
# each harness, built without libFuzzer (replay_HARNESS, sanitizers in the sanitizer build):
# every input must run to the end with no sanitizer report.
. "${top_srcdir:-$(dirname "$0")/..}/test/lib.sh"

for h in jsonl safetensors config tokenizer bpe; do
	ok
	dir="$top_srcdir/fuzz/corpus/$h"
	set -- "$dir"/*
	[ -e "$1" ] || { fail "$h: no corpus in $dir"; continue; }
	# a scratch working directory: config inputs may include relative files
	if ! (cd "$T" && "$top_builddir/test/replay_$h" "$@") >"$T/$h.out" 2>&1; then
		fail "$h: the replay failed"
		grep -A 12 -E "ERROR: |runtime error:" "$T/$h.out" | head -n 30 >&2
	elif grep -Eq "ERROR: (Address|Leak)Sanitizer|runtime error:" "$T/$h.out"; then
		fail "$h: a sanitizer report"
		grep -A 12 -E "ERROR: |runtime error:" "$T/$h.out" | head -n 30 >&2
	else
		echo "$h: $(tail -n 1 "$T/$h.out")"
	fi
done
finish
