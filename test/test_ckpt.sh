#!/bin/sh
# HDF5 checkpoints (src/ckpt.c) through test_ckpt's hand-made layout:
#  - written by 1, 2, 3, 4 ranks, read back by every world size 1..4 (resharding), every element
#    of every rank's shard checked, padding read as 0; HSDP (only the first replica writes);
#  - h5dump -d /master/NAME index.h5 prints each whole tensor (from another working directory,
#    and after the checkpoint folder moved); h5ls -r lists every parameter with its shape;
#  - a truncated rank file, one altered byte, a missing rank file: errors naming the file;
#  - a writer SIGKILLed mid-checkpoint, or rank 0 killed before COMPLETE: the previous complete
#    checkpoint is found and read; keep pruning; a full disk leaves the previous one untouched.
. "${top_srcdir:-$(dirname "$0")/..}/test/lib.sh"

if ! command -v "${MPIRUN:-mpirun}" >/dev/null 2>&1; then
	echo "no mpirun: skipped"; exit 77
fi
MPIRUN=${MPIRUN:-mpirun}
TC="$top_builddir/test/test_ckpt"

mpi() {
	np=$1
	shift
	$MPIRUN -np "$np" --oversubscribe -x OMP_NUM_THREADS=1 "$TC" "$@"
}

# checkpoints written by each world size, read back by each
for w in 1 2 3 4; do
	expect_ok "write np$w" mpi "$w" write "$T/w$w" 10
	for r in 1 2 3 4; do
		expect_ok "np$w -> np$r" mpi "$r" read "$T/w$w" --step 10
	done
done
expect_ok "write np3 weights only" mpi 3 write "$T/wo" 5 --no-opt
expect_ok "weights-only read np2" mpi 2 read "$T/wo" --no-opt --step 5
expect_fail "moments from a weights-only checkpoint" "index.h5: holds no optimizer state" \
	mpi 2 read "$T/wo"

# HSDP: 4 ranks, shard groups of 2; ranks 2 and 3 write nothing
expect_ok "HSDP write 2x2" mpi 4 write "$T/hsdp" 7 --shard-size 2
ok
[ "$(cd "$T/hsdp/step-000007" && ls rank-*.h5 | tr '\n' ' ')" = "rank-00000.h5 rank-00001.h5 " ] ||
	fail "HSDP wrote $(ls "$T/hsdp/step-000007")"
expect_ok "HSDP read 2x2" mpi 4 read "$T/hsdp" --shard-size 2 --step 7
expect_ok "HSDP read np3" mpi 3 read "$T/hsdp" --step 7
expect_ok "HSDP read 2x1" mpi 2 read "$T/hsdp" --shard-size 1 --step 7

# h5dump / h5ls on the index, from elsewhere and after the folder moved; a config over 64 KB
expect_ok "write np3 big config" mpi 3 write "$T/big" 3 --big-config
IDX="$T/big/step-000003/index.h5"
mkdir -p "$T/elsewhere"
"$TC" names >"$T/names"
for moved in no yes; do
	if [ "$moved" = yes ]; then
		mv "$T/big/step-000003" "$T/moved"
		IDX="$T/moved/index.h5"
		expect_ok "read the moved folder" mpi 2 read "$T/none" --dir "$T/moved" --step 3 \
			--big-config
	fi
	while read -r path _ _; do
		name=${path#/master/}
		for set in 0 1 2; do
			g=$(echo master m v | cut -d' ' -f$((set + 1)))
			ok
			if ! (cd "$T/elsewhere" && h5dump -m %.9g -d "/$g/$name" "$IDX") >"$T/dump" 2>&1 ||
			   ! "$TC" dumpcheck "$name" $set 3 <"$T/dump" >"$T/dc" 2>&1; then
				fail "h5dump /$g/$name (moved: $moved)"; cat "$T/dump" "$T/dc" >&2
			fi
		done
	done <"$T/names"
done
h5ls -r "$IDX" | sed 's/  */ /g' >"$T/ls"
while read -r line; do
	ok
	grep -Fqx "$line" "$T/ls" || { fail "h5ls -r lacks '$line'"; cat "$T/ls" >&2; }
done <"$T/names"
ok
h5dump -A -a /config "$IDX" | grep -q "padding to pass 64 KB" || fail "config attribute not shown"

# damaged rank files: never read silently
cp -r "$T/w3" "$T/trunc"
F="$T/trunc/step-000010/rank-00001.h5"
truncate -s $(($(stat -c %s "$F") - 200)) "$F"
expect_fail "truncated rank file" "step-000010/rank-00001.h5: .*(truncated|damaged)" \
	mpi 2 read "$T/trunc"
cp -r "$T/w3" "$T/flip"
F="$T/flip/step-000010/rank-00002.h5"
expect_ok "flip a data byte" "$TC" flip "$F" /m/unit-0001
expect_fail "altered byte" \
	"step-000010/rank-00002.h5: /m/unit-0001 checksum mismatch: the file was altered or damaged" \
	mpi 3 read "$T/flip"
cp -r "$T/w3" "$T/gone"
rm "$T/gone/step-000010/rank-00000.h5"
expect_fail "missing rank file" "step-000010/rank-00000.h5: missing" mpi 4 read "$T/gone"

# crashes mid-checkpoint: the previous complete one stays the latest, and it reads
expect_ok "crash: step 10" mpi 3 write "$T/crash" 10
ok
if mpi 3 write "$T/crash" 20 --crash file:1 >"$T/out" 2>&1; then
	fail "the killed writer's job exited 0"
fi
ok
[ -d "$T/crash/step-000020" ] && [ ! -e "$T/crash/step-000020/COMPLETE" ] ||
	fail "no incomplete step-000020 after the kill"
expect_ok "latest after a killed writer" "$TC" latest "$T/crash"
grep -q "^10 " "$T/out" || fail "latest after a killed writer: $(cat "$T/out")"
expect_ok "resume after a killed writer" mpi 2 read "$T/crash" --step 10
ok
mpi 3 write "$T/crash" 30 --crash index >"$T/out" 2>&1 && fail "the killed rank 0's job exited 0"
ok
[ -e "$T/crash/step-000030/index.h5" ] && [ ! -e "$T/crash/step-000030/COMPLETE" ] ||
	fail "step-000030 should have index.h5 and no COMPLETE"
expect_ok "latest after rank 0 died" "$TC" latest "$T/crash"
grep -q "^10 " "$T/out" || fail "latest after rank 0 died: $(cat "$T/out")"
expect_ok "resume after rank 0 died" mpi 4 read "$T/crash" --step 10
# the incomplete step 30 is rewritten in place; the incomplete step 20 is older than it: pruned
expect_ok "rewrite step 30" mpi 2 write "$T/crash" 30 --keep 2
ok
[ "$(ls "$T/crash" | tr '\n' ' ')" = "step-000010 step-000030 " ] ||
	fail "after step 30: $(ls "$T/crash")"
expect_fail "a complete step is not overwritten" "step-000030: already holds a complete" \
	mpi 2 write "$T/crash" 30

# keep: only the newest complete ones stay, never one still being written
for s in 1 2 3 4 5; do
	expect_ok "keep: step $s" mpi 2 write "$T/keep" $s --keep 2
done
ok
[ "$(ls "$T/keep" | tr '\n' ' ')" = "step-000004 step-000005 " ] || fail "keep 2: $(ls "$T/keep")"
expect_ok "keep 1" mpi 1 write "$T/keep" 6 --keep 1
ok
[ "$(ls "$T/keep" | tr '\n' ' ')" = "step-000006 " ] || fail "keep 1: $(ls "$T/keep")"
expect_ok "latest of none" "$TC" latest "$T/nothing-here"
grep -qx none "$T/out" || fail "latest of a missing root: $(cat "$T/out")"

# a full disk (a small tmpfs, where this user may mount one), first for the rank files, then
# for rank 0's index.h5: an error on every rank, the previous checkpoint byte-identical and
# readable, no step directory left
FS="$T/fs"
mkdir -p "$FS"
if mount -t tmpfs -o size=2m tmpfs "$FS" 2>/dev/null; then
	trap 'umount "$FS" 2>/dev/null' EXIT
	expect_ok "full: step 1" mpi 3 write "$FS/r" 1 --big-config --keep 1
	(cd "$FS/r/step-000001" && cksum ./*) >"$T/sums"
	# leave $1 KB free
	fill() {
		rm -f "$FS/filler"
		fallocate -l $((($(df -k --output=avail "$FS" | tail -1) - $1) * 1024)) "$FS/filler"
	}
	fill 40
	# (--expect-fail: test_ckpt exits 0 when sl_ckpt_write failed on every rank)
	expect_ok "disk full for the rank files" mpi 3 write "$FS/r" 2 --big-config --keep 1 \
		--expect-fail
	grep -Eq "rank-0000[0-2].h5.tmp: cannot reserve .*No space left" "$T/out" ||
		{ fail "disk full for the rank files: no error"; cat "$T/out" >&2; }
	fill 500	# the rank files fit (3 x ~110 KB reserved), index.h5 (~700 KB) does not
	expect_ok "disk full for index.h5" mpi 3 write "$FS/r" 2 --big-config --keep 1 \
		--expect-fail
	grep -Eq "index.h5.tmp: cannot reserve .*No space left" "$T/out" ||
		{ fail "disk full for index.h5: no error"; cat "$T/out" >&2; }
	rm -f "$FS/filler"
	ok
	[ "$(ls "$FS/r")" = step-000001 ] || fail "after the failed writes: $(ls "$FS/r")"
	ok
	(cd "$FS/r/step-000001" && cksum ./*) | cmp -s - "$T/sums" || fail "step 1 changed"
	expect_ok "the previous checkpoint still reads" mpi 2 read "$FS/r" --step 1 --big-config
	umount "$FS" || fail "umount $FS"
	trap - EXIT
else
	echo "cannot mount a small tmpfs here: the full-disk checks are skipped"
fi

finish
