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
