#!/bin/sh
# test_dist.sh: src/dist under mpirun with 1 to 4 ranks, pretended nodes (HSDP 2 x 2 and 2 x 4),
# and a rank that aborts (the whole job must end, naming host and rank).
. "${top_srcdir:-$(dirname "$0")/..}/test/lib.sh"
: "${MPIRUN:=mpirun}"
PROG="$top_builddir/test/test_dist"
# a lost rank would otherwise hang the test forever
run() { timeout 300 $MPIRUN --oversubscribe "$@"; }

for n in 1 2 3 4; do
	expect_ok "np $n" run -np $n "$PROG"
	cat "$T/out"
done
expect_ok "np 4, node size 2" run -np 4 "$PROG" --node-size 2
cat "$T/out"
expect_ok "np 8, node size 4" run -np 8 "$PROG" --node-size 4
cat "$T/out"
expect_ok "np 3, node size 1" run -np 3 "$PROG" --node-size 1
cat "$T/out"

expect_fail "abort" "rank 1: test_dist: deliberate abort" run -np 2 "$PROG" --abort
expect_fail "fatal" "rank 2: test_dist.c:42: NCCL: ncclAllReduce\(x\): unhandled system error" \
	run -np 3 "$PROG" --fatal
finish
