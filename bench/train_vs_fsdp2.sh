#!/bin/bash
# train_vs_fsdp2.sh: shardlm against PyTorch FSDP2 (world 1) on one GPU, in one call (issue 5).
# On the GPU machine, after `source .devbundle/env.sh` (bundle: src/shardlm, test/mkmodel and,
# for the op time shares, test/test_cuda_ops):
#   bash bench/train_vs_fsdp2.sh [OUTDIR]
# For the Qwen3-4B shape (batch 4) and the Qwen3-1.7B shape (batch 8), x 2048 random tokens:
# makes the random bf16 HF model (mkmodel), trains it with shardlm (backend cuda) and with
# bench/fsdp2_peer.py (eager, then each decoder layer torch.compile'd), same records, no
# activation checkpointing; prints one table last: tokens/s (median over the steps after the
# warm-up), MFU (DESIGN.md's formula), peak GB, ratio to FSDP2 eager.  Also the per-layer GEMM and
# attention times of test_cuda_ops --bench at the 4B shape.  shardlm runs its defaults (optim.clip
# 1.0); the peer does not clip, so SET=optim.clip=0 (below) is the same optimizer as the peer's.
# Environment: STEPS (default 8), SHAPES (default "4b 1.7b"), PEERS (default "eager compile";
# "none": shardlm alone), PEER_TIMEOUT seconds per peer run (default 300), OPS (default 1; 0
# leaves out test_cuda_ops --bench), VARIANTS (default "-": shardlm as it is; a list of entries,
# each "-" for none or NAME=VALUE[,NAME=VALUE...] environment settings, runs shardlm once per
# entry, e.g. "- SHARDLM_FA_WGMMA=1 SHARDLM_FA_BWD_DQ=fused,SHARDLM_OPT_OVERLAP=1"), ROUNDS
# (default 1: the variants one after another, ROUNDS times, for A/B runs that alternate); an
# entry's SHARDLM_BIN=PATH runs that shardlm program instead (another build, side by side), and
# SET=KEY=VALUE passes --set KEY=VALUE (a config setting, e.g. SET=optim.clip=0).
# LAYERS: that many layers instead of the shape's (to fit a smaller GPU; not the issue's figures).
# KTRACE=PATH/libktrace.so (test/, built where CUPTI is): one more shardlm run per shape, with
# the defaults, under that kernel trace; bench/ktrace.py's table of the step's GPU time as it ran
# (kinds, idle time, kernels) in OUTDIR/ktrace-SHAPE.md (not counted in the speed table).
set -u
OUT=${1:-/tmp/train-vs-fsdp2}
mkdir -p "$OUT"
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/variant.sh"
STEPS=${STEPS:-8}
SHAPES=${SHAPES:-"4b 1.7b"}
PEERS=${PEERS:-"eager compile"}
[ "$PEERS" = none ] && PEERS=
PEER_TIMEOUT=${PEER_TIMEOUT:-300}
T=$(mktemp -d /tmp/tvf-XXXXXX)
trap 'rm -rf "$T"' EXIT   # the models and runs (tens of GB), also when cut off by a timeout
trap 'exit 143' TERM
RES="$OUT/results.jsonl"
: >"$RES"

# 64 records of 2048 random token ids (the same file for both trainers)
python3 - "$T/data.jsonl" <<'PY'
import json, random, sys
r = random.Random(7)
with open(sys.argv[1], "w") as f:
    for i in range(64):
        f.write(json.dumps({"input_ids": [r.randrange(3, 151936) for _ in range(2048)],
                            "label": round(r.random(), 3)}) + "\n")
PY

if [ "${OPS:-1}" != 0 ] && command -v test_cuda_ops >/dev/null; then
	test_cuda_ops --bench >"$OUT/ops_bench.txt" 2>&1
	grep -E "attention_(fwd|bwd) 4x2048|per layer" "$OUT/ops_bench.txt"
fi

for shape in $SHAPES; do
	case $shape in
	4b) args="--hidden 2560 --layers ${LAYERS:-36} --heads 32 --kv-heads 8 --intermediate 9728"; B=4 ;;
	1.7b) args="--hidden 2048 --layers ${LAYERS:-28} --heads 16 --kv-heads 8 --intermediate 6144"; B=8 ;;
	*) echo "unknown shape $shape" >&2; continue ;;
	esac
	M="$T/m-$shape"
	# shellcheck disable=SC2086
	mkmodel --out "$M" --vocab 151936 --head-dim 128 $args --seed 1 --dtype bf16 >/dev/null ||
		{ echo "mkmodel $shape failed" >&2; continue; }
	cat >"$T/$shape.yaml" <<YAML
model: {path: $M}
backend: cuda
data: {train: $T/data.jsonl, max_state: 2048, seed: 1}
train: {batch: $B, accum: 1, steps: $STEPS, eval_every: 0}
checkpoint: {every: 0}
export: {final: false}
run: {dir: $T/run-$shape, log_every: 1}
YAML
	if [ -n "${KTRACE:-}" ]; then
		KTRACE_OUT="$OUT/ktrace-$shape.csv" CUDA_INJECTION64_PATH=$KTRACE ${SHARDLM:-shardlm} \
			train "$T/$shape.yaml" >"$OUT/shardlm-$shape-ktrace.log" 2>&1 &&
			python3 "$HERE/ktrace.py" --gaps 20 "$OUT/ktrace-$shape.csv" >"$OUT/ktrace-$shape.md" 2>&1
		echo "ktrace $shape: exit $? ($OUT/ktrace-$shape.md)"
		rm -rf "$T/run-$shape"
	fi
	for round in $(seq 1 "${ROUNDS:-1}"); do
	for var in ${VARIANTS:--}; do
	impl=shardlm; log="$OUT/shardlm-$shape"
	if [ "$var" != - ]; then
		impl="shardlm $var"; log="$log-$(echo "$var" | tr '=/,' '___')"
	fi
	[ "${ROUNDS:-1}" = 1 ] || { impl="$impl (round $round)"; log="$log-r$round"; }
	log="$log.log"
	run_variant "${SHARDLM:-shardlm}" "$T/$shape.yaml" "$log" "$var"
	python3 - "$T/run-$shape/training_metrics.json" "$M/config.json" "$shape" "$B" "$impl" \
		>>"$RES" <<'PY'
import json, statistics, sys
m = json.load(open(sys.argv[1])); c = json.load(open(sys.argv[2]))
st = m["steps"][2:] or m["steps"]
t = statistics.median(s["time_s"] for s in st)
tok = statistics.median(s["tokens"] for s in st)
H, nl, nh, nkv, I = (c[k] for k in ("hidden_size", "num_hidden_layers", "num_attention_heads",
                                    "num_key_value_heads", "intermediate_size"))
hd = c.get("head_dim") or H // nh
p = nl * (H * nh * hd + 2 * H * nkv * hd + nh * hd * H + 3 * H * I) + H
n = 2048
fl = 6 * p + 12.0 * hd * nh * nl * (n + 1) / 2
print(json.dumps({"shape": sys.argv[3], "impl": sys.argv[5], "batch": int(sys.argv[4]),
                  "s_per_step": t, "tokens_per_s": tok / t, "mfu": fl * tok / t / 989e12,
                  "peak_gb": max(s.get("peak_gpu_bytes", 0) for s in m["steps"]) / 1e9,
                  "loss": m["steps"][-1]["loss"]}))
PY
	rm -rf "$T/run-$shape"
	done
	done
	for peer in $PEERS; do
		flag=""
		[ "$peer" = compile ] && flag=--compile
		timeout "$PEER_TIMEOUT" torchrun --standalone --nproc_per_node 1 "$HERE/fsdp2_peer.py" \
			--model "$M" --data "$T/data.jsonl" --batch "$B" --steps "$STEPS" $flag \
			>"$OUT/fsdp2-$peer-$shape.log" 2>&1
		sed -n 's/^RESULT //p' "$OUT/fsdp2-$peer-$shape.log" |
			python3 -c "import json,sys
for l in sys.stdin: d=json.loads(l); d['shape']='$shape'; print(json.dumps(d))" >>"$RES"
	done
	rm -rf "$M"
done

python3 - "$RES" <<'PY' | tee "$OUT/table.md"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
print("| shape | batch | trainer | s/step | tokens/s | MFU | peak GB | last loss | vs FSDP2 eager |")
print("|---|---|---|---|---|---|---|---|---|")
for shape in dict.fromkeys(r["shape"] for r in rows):
    base = next((r["tokens_per_s"] for r in rows if r["shape"] == shape and r["impl"] == "fsdp2-eager"), None)
    for r in rows:
        if r["shape"] != shape:
            continue
        ratio = f"{r['tokens_per_s'] / base:.2f}x" if base else "-"
        loss = f"{r['loss']:.6f}" if "loss" in r else "-"
        print(f"| {shape} | {r['batch']} | {r['impl']} | {r['s_per_step']:.4f} | "
              f"{r['tokens_per_s']:,.0f} | {100 * r['mfu']:.1f}% | {r['peak_gb']:.1f} | {loss} | "
              f"{ratio} |")
PY
rm -rf "$T"
