# Shell helpers for the script tests (sourced).  A test's exit status is its verdict.
set -u
: "${top_srcdir:=$(cd "$(dirname "$0")/.." && pwd)}"
: "${top_builddir:=$top_srcdir}"
SHARDLM="$top_builddir/src/shardlm"
export OMP_NUM_THREADS=1
failures=0
checks=0
T=$(mktemp -d /tmp/sl-test-XXXXXX)

fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }
ok() { checks=$((checks + 1)); }

# expect_fail NAME PATTERN CMD...: CMD must exit non-zero and print PATTERN (grep -E) on
# stdout or stderr
expect_fail() {
	name=$1 pat=$2
	shift 2
	ok
	if "$@" >"$T/out" 2>&1; then
		fail "$name: exited 0"; cat "$T/out" >&2; return
	fi
	if ! grep -Eq -- "$pat" "$T/out"; then
		fail "$name: output lacks /$pat/"; cat "$T/out" >&2
	fi
}

# expect_ok NAME CMD...
expect_ok() {
	name=$1
	shift
	ok
	if ! "$@" >"$T/out" 2>&1; then
		fail "$name: exited non-zero"; cat "$T/out" >&2
	fi
}

finish() {
	echo "$(basename "$0"): $checks checks, $failures failed"
	[ "$failures" -eq 0 ] && rm -rf "$T"
	[ "$failures" -eq 0 ]
}

# tiny_fsdp_inputs DIR: a tiny random model (hidden 20, head_dim 6, intermediate 36: no unit size
# divides evenly by 3 or 4 ranks) in DIR/model and 48 pre-tokenized records in DIR/data.jsonl
tiny_fsdp_inputs() {
	"$top_builddir/test/mkmodel" --out "$1/model" --vocab 61 --hidden 20 --layers 2 --heads 4 \
		--kv-heads 2 --head-dim 6 --intermediate 36 --seed 5 >/dev/null || fail "mkmodel"
	python3 - "$1/data.jsonl" <<'PY'
import random, sys
r = random.Random(11)
with open(sys.argv[1], "w") as f:
    for i in range(48):
        n = r.randint(3, 17)
        ids = [r.randrange(1, 61) for _ in range(n)]
        f.write('{"input_ids": %s, "label": %.3f}\n' % (ids, sum(t < 30 for t in ids) / n))
PY
}

# close_losses A B TOL N: runs $T/A and $T/B logged N steps each, every loss of B within TOL
# (relative) of A's, with the same tokens per step
close_losses() {
	ok
	python3 - "$T/$1/training_metrics.json" "$T/$2/training_metrics.json" "$3" "$4" <<'PY' ||
import json, sys
a, b = (json.load(open(p))["steps"] for p in sys.argv[1:3])
tol, n = float(sys.argv[3]), int(sys.argv[4])
assert len(a) == len(b) == n, (len(a), len(b))
worst = max(abs(x["loss"] - y["loss"]) / abs(x["loss"]) for x, y in zip(a, b))
print(f"{sys.argv[2].split('/')[-2]} vs {sys.argv[1].split('/')[-2]}: worst relative loss "
      f"difference {worst:.2e}")
assert worst <= tol, ([x["loss"] for x in a], [y["loss"] for y in b])
assert all(x["tokens"] == y["tokens"] for x, y in zip(a, b))
PY
	fail "losses of $2 differ from $1 by more than $3"
}
