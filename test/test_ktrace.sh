#!/bin/bash
# bench/ktrace.py on a hand-made trace: step windows from the step kernel's launches, records
# clipped to their window, overlap counted once in the busy time, kinds by name, mangled names
# shortened, a trace with too few steps or a bad line refused.  (bench/ktrace.c itself needs a
# GPU: the step benchmarks' KTRACE= runs use it.)
top_srcdir=${top_srcdir:-$(cd "$(dirname "$0")/.." && pwd)}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fail=0
check() { # DESCRIPTION, then a command that must succeed
	local d=$1; shift
	if "$@"; then echo "ok: $d"; else echo "FAIL: $d"; fail=1; fi
}
E=_Z15k_embedding_fwdP13__nv_bfloat16PKiPKS_ii
# times in ms (x 1e6 ns): steps start at 0, 10 and 20 (the third has no end: left out)
while read -r k s e st n; do
	echo "$k,$((s * 100000)),$((e * 100000)),$st,$n"
done >"$T/t.csv" <<REC
K 0 10 7 $E
K 10 50 7 nvjet_sm90_tst_256x128
K 40 60 13 _Z7k_adamwPfS_S_PKti
K 60 70 7 _Z8k_fa_fwdILi128EEvPKv
K 100 110 7 $E
K 110 190 7 nvjet_sm90_tst_256x128
C 120 130 9 copy1 4096
K 195 205 7 _ZN2sl8k_rest_aEv
K 200 210 7 $E
REC
python3 "$top_srcdir/bench/ktrace.py" "$T/t.csv" --skip 0 >"$T/out" 2>&1
st=$?
cat "$T/out"
check "exit status 0" [ "$st" = 0 ]
# by hand: wall 10 ms a step; busy (7 + 9.5) / 2; GEMM (4 + 8) / 2; the straddling kernel
# 0.5 ms in the second window; the embedding 1 ms a step
for want in "| step (wall) | 10.00 | 100% |" "| GPU running anything | 8.25 | 82.5% |" \
	"| GPU idle | 1.75 | 17.5% |" "| gemm | 6.00 | 60.0% |" "| attention | 0.50 | 5.0% |" \
	"| optimizer | 1.00 | 10.0% |" "| copies | 0.50 | 5.0% |" "| rest | 1.25 | 12.5% |" \
	"| nvjet_sm90_tst_256x128 | 1 | 6.00 | 60.0% | 6000.0 |" \
	"| k_embedding_fwd | 1 | 1.00 | 10.0% | 1000.0 |" "| k_adamw | 0.5 | 1.00 | 10.0% | 2000.0 |" \
	"| sl::k_rest_a | 0.5 | 0.25 | 2.5% | 500.0 |" "| k_fa_fwd | 0.5 | 0.50 | 5.0% | 1000.0 |"; do
	check "line: $want" grep -qF -- "$want" "$T/out"
done
# two steps' launches cannot give a whole step after skipping 2
python3 "$top_srcdir/bench/ktrace.py" "$T/t.csv" >"$T/out2" 2>&1
st=$?
check "too few steps: non-zero exit" [ "$st" != 0 ]
check "too few steps: says why" grep -q "too few steps" "$T/out2"
printf 'K,1,2\n' >"$T/bad.csv"
python3 "$top_srcdir/bench/ktrace.py" "$T/bad.csv" >"$T/out3" 2>&1
st=$?
check "bad line: non-zero exit naming the line" \
	bash -c "[ $st != 0 ] && grep -q 'bad.csv:1: not a ktrace record' '$T/out3'"
# --runs: a kernel instance's launches under 3 ms apart are one run (median by hand: 0.3 ms of
# 0.1, 0.3 and 0.5; then 0.7 ms alone, 5 ms later); template arguments keep instances apart;
# kernels the pattern does not match are left out
D1=_Z9k_fa_dkdvILi128ELb0ELi1EEvP13__nv_bfloat16
D2=_Z9k_fa_dkdvILi128ELb0ELi2EEvP13__nv_bfloat16
while read -r s e n; do
	echo "K,$((s * 100000)),$((e * 100000)),7,$n"
done >"$T/r.csv" <<REC
0 1 $D1
10 13 $D1
20 25 $D1
22 26 $D2
30 31 _Z5k_otherv
80 87 $D1
REC
python3 "$top_srcdir/bench/ktrace.py" "$T/r.csv" --runs 'k_fa_dkdv' >"$T/out4" 2>&1
st=$?
cat "$T/out4"
check "--runs: exit status 0" [ "$st" = 0 ]
check "--runs: three runs, in order" bash -c "[ \$(wc -l <'$T/out4') = 3 ] &&
	sed -n 1p '$T/out4' | grep -q '_Z9k_fa_dkdvILi128ELb0ELi1E .* 3 launches, median  *300.0 us' &&
	sed -n 2p '$T/out4' | grep -q '_Z9k_fa_dkdvILi128ELb0ELi2E .* 1 launches, median  *400.0 us' &&
	sed -n 3p '$T/out4' | grep -q '_Z9k_fa_dkdvILi128ELb0ELi1E .* 1 launches, median  *700.0 us'"
exit $fail
