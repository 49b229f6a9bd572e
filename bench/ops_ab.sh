#!/bin/bash
# ops_ab.sh: the kernels' timings under environment variants, alternating in one call (the GPU
# machine; test/test_cuda_ops in PATH or TEST_CUDA_OPS).  Each round runs `test_cuda_ops SEED
# --bench-only` once per variant, so drift and clocks hit every variant alike; the same SEED gives
# every run the same random expert loads.  A variant is "-" (the defaults) or VAR=VALUE[,VAR=VALUE];
# TEST_CUDA_OPS=PATH in a variant runs that program (another build's kernels, side by side).
# Prints, per timed line (attention, the 4B's GEMMs, the experts' matmuls, AdamW), the ms of
# each run, variants side by side.
#   usage: bench/ops_ab.sh [-r ROUNDS] [-s SEED] [-o OUTDIR] VARIANT...
#   e.g.   bench/ops_ab.sh -r 2 - SHARDLM_FA_BWD_DQ=fused SHARDLM_MOE_GEMM=wg
set -u
rounds=2 seed=7 out=${TMPDIR:-/tmp}/ops_ab
while getopts r:s:o: opt; do
	case $opt in
	r) rounds=$OPTARG ;;
	s) seed=$OPTARG ;;
	o) out=$OPTARG ;;
	*) exit 2 ;;
	esac
done
shift $((OPTIND - 1))
[ $# -gt 0 ] || set -- -
prog=${TEST_CUDA_OPS:-$(command -v test_cuda_ops || echo test/test_cuda_ops)}
[ -x "$prog" ] || { echo "ops_ab.sh: no test_cuda_ops (set TEST_CUDA_OPS)" >&2; exit 1; }
mkdir -p "$out"

for r in $(seq 1 "$rounds"); do
	i=0
	for v in "$@"; do
		i=$((i + 1))
		envs=()
		[ "$v" = - ] || IFS=, read -r -a envs <<<"$v"
		bin=$prog
		for e in "${envs[@]}"; do [ "${e#TEST_CUDA_OPS=}" = "$e" ] || bin=${e#TEST_CUDA_OPS=}; done
		if ! env "${envs[@]}" "$bin" "$seed" --bench-only >"$out/v$i-r$r.log" 2>&1; then
			echo "ops_ab.sh: variant '$v' round $r failed: $(tail -n 3 "$out/v$i-r$r.log")" >&2
		fi
	done
done

# the table: one row per timed line (its text before ':'), ms of each variant's runs
python3 - "$out" "$rounds" "$@" <<'PY'
import re, sys
out, rounds, variants = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
rows, order = {}, []
for i, v in enumerate(variants, 1):
    for r in range(1, rounds + 1):
        try:
            text = open(f"{out}/v{i}-r{r}.log").read()
        except OSError:
            continue
        for line in text.splitlines():
            m = re.match(r"\s+(\S.*?): ([0-9.]+) ms", line)
            if not m:
                continue
            k = m.group(1)
            if k not in rows:
                rows[k] = {}
                order.append(k)
            rows[k].setdefault(v, []).append(m.group(2))
print("| timed (ms) | " + " | ".join(variants) + " |")
print("|---|" + "---|" * len(variants))
for k in order:
    print(f"| {k} | " + " | ".join(", ".join(rows[k].get(v, ["-"])) for v in variants) + " |")
PY
