#!/bin/bash
# moe_vs_fsdp2.sh: shardlm against PyTorch FSDP2 on a Qwen3-MoE SFT step, one H200 (issue 8).
# On the GPU machine, with src/shardlm built with CUDA on the PATH (or SHARDLM=path):
#   bash bench/moe_vs_fsdp2.sh [OUTDIR]
# The shape: hidden 2048, 12 layers, 64 experts top 8 (norm_topk_prob), moe_intermediate 768,
# 32 heads, 4 KV heads, head_dim 128, vocab 151936, untied head, router_aux_loss_coef 0.001 —
# a random bf16 Hugging Face model written here (fused expert tensors, one safetensors file per
# layer; the peer reads only its config.json).  Batch 2 x 4096 random tokens, loss on every
# token, no activation checkpointing, same records for both.  shardlm (task sft, backend cuda)
# then bench/fsdp2_moe_peer.py (eager; add "compile" to PEERS for torch.compile'd layers).
# Prints one table last: tokens/s (median after the warm-up steps), MFU on active parameters,
# peak GB, ratio to FSDP2 eager; the expert load of shardlm's last step.  shardlm runs its
# defaults (optim.clip 1.0); the peer does not clip: SET=optim.clip=0 is the peer's optimizer.
# Environment: STEPS (default 8), PEERS (default "eager"; "" for none), PEER_TIMEOUT s (default
# 600), VARIANTS (default "-": shardlm as it is; a list of entries, each "-" for none or
# NAME=VALUE[,NAME=VALUE...] environment settings, runs shardlm once per entry, e.g.
# "- SHARDLM_MOE_STREAMS=1 SHARDLM_FA_BWD_DQ=fused,SHARDLM_OPT_OVERLAP=1"), ROUNDS (default 1:
# the variants one after another, ROUNDS times, for A/B runs that alternate).  An entry's
# SHARDLM_BIN=PATH runs that shardlm program instead (another build, side by side); SET=KEY=VALUE
# passes --set KEY=VALUE (a config setting: SET=optim.clip=0).
# LAYERS (default 12): fewer layers of the same widths, to fit a smaller GPU (not the issue's
# figure).  KTRACE=PATH/libktrace.so: one more shardlm run (defaults) under bench/ktrace.c's
# kernel trace; bench/ktrace.py's table of the step's GPU time in OUTDIR/ktrace-moe.md.
set -u
OUT=${1:-/tmp/moe-vs-fsdp2}
mkdir -p "$OUT"
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/variant.sh"
STEPS=${STEPS:-8}
PEERS=${PEERS-eager}
PEER_TIMEOUT=${PEER_TIMEOUT:-600}
SHARDLM=${SHARDLM:-shardlm}
B=2
SEQ=4096
T=$(mktemp -d /tmp/mvf-XXXXXX)
trap 'rm -rf "$T"' EXIT   # the model and runs, also when cut off by a timeout
trap 'exit 143' TERM
RES="$OUT/results.jsonl"
: >"$RES"
M="$T/model"

echo "== random Qwen3-MoE model and data in $T"
python3 "$HERE/moe_model.py" "$M" "$T/data.jsonl" --seq "$SEQ" --layers "${LAYERS:-12}" ||
	{ echo "model generation failed" >&2; exit 1; }

cat >"$T/moe.yaml" <<YAML
model: {path: $M}
task: sft
backend: cuda
data: {train: $T/data.jsonl, max_state: $SEQ, seed: 1}
train: {batch: $B, accum: 1, steps: $STEPS, eval_every: 0}
checkpoint: {every: 0}
export: {final: false}
run: {dir: $T/run, log_every: 1}
YAML
# one shardlm run (NAME, then an optional NAME=VALUE environment setting)
shardlm_run() {
	local name=$1 var=${2:-} log
	log="$OUT/$(echo "$name" | tr ' =/,()' '______').log"
	echo "== $name"
	rm -rf "$T/run"
	run_variant "$SHARDLM" "$T/moe.yaml" "$log" "$var"
	echo "$name exit $? (log $log)"
	tail -3 "$log"
	cp "$T/run/training_metrics.json" "${log%.log}_metrics.json" 2>/dev/null
	python3 - "$T/run/training_metrics.json" "$M/config.json" "$B" "$SEQ" "$name" >>"$RES" <<'PY'
import json, statistics, sys
m = json.load(open(sys.argv[1])); c = json.load(open(sys.argv[2]))
B, n = int(sys.argv[3]), int(sys.argv[4])
st = m["steps"][2:] or m["steps"]
t = statistics.median(s["time_s"] for s in st)
tok = statistics.median(s["tokens"] for s in st)
H, nl, nh, nkv, hd = (c[k] for k in ("hidden_size", "num_hidden_layers", "num_attention_heads",
                                     "num_key_value_heads", "head_dim"))
E, k, Im = c["num_experts"], c["num_experts_per_tok"], c["moe_intermediate_size"]
p = nl * (H * nh * hd + 2 * H * nkv * hd + nh * hd * H + E * H + k * 3 * H * Im) + c["vocab_size"] * H
fl = 6 * p + 12.0 * hd * nh * nl * (n + 1) / 2
last = m["steps"][-1].get("expert_tokens", {})
print(json.dumps({"impl": sys.argv[5], "batch": B, "seq": n, "s_per_step": t,
                  "tokens_per_s": tok / t, "mfu": fl * tok / t / 989e12,
                  "peak_gb": max(s.get("peak_gpu_bytes", 0) for s in m["steps"]) / 1e9,
                  "loss": m["steps"][-1]["loss"], "expert_tokens_last": last}))
PY
}

for round in $(seq 1 "${ROUNDS:-1}"); do
	sfx=
	[ "${ROUNDS:-1}" = 1 ] || sfx=" (round $round)"
	for var in ${VARIANTS:--}; do
		if [ "$var" = - ]; then
			shardlm_run "shardlm$sfx"
		else
			shardlm_run "shardlm $var$sfx" "$var"
		fi
	done
done

if [ -n "${KTRACE:-}" ]; then
	rm -rf "$T/run"
	KTRACE_OUT="$OUT/ktrace-moe.csv" CUDA_INJECTION64_PATH=$KTRACE $SHARDLM train "$T/moe.yaml" \
		>"$OUT/shardlm-ktrace.log" 2>&1 &&
		python3 "$HERE/ktrace.py" --gaps 20 "$OUT/ktrace-moe.csv" >"$OUT/ktrace-moe.md" 2>&1
	echo "ktrace: exit $? ($OUT/ktrace-moe.md)"
fi

for peer in $PEERS; do
	flag=""
	[ "$peer" = compile ] && flag=--compile
	echo "== fsdp2 $peer"
	timeout "$PEER_TIMEOUT" torchrun --standalone --nproc_per_node 1 "$HERE/fsdp2_moe_peer.py" \
		--model "$M" --data "$T/data.jsonl" --batch "$B" --seq "$SEQ" --steps "$STEPS" $flag \
		>"$OUT/fsdp2-$peer.log" 2>&1
	echo "fsdp2 $peer exit $? (log $OUT/fsdp2-$peer.log)"
	sed -n 's/^RESULT //p' "$OUT/fsdp2-$peer.log" >>"$RES"
done

python3 - "$RES" <<'PY' | tee "$OUT/table.md"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
base = next((r["tokens_per_s"] for r in rows if r["impl"] == "fsdp2-eager"), None)
print("| Qwen3-MoE 2048x12, 64 experts top 8, batch 2x4096 | s/step | tokens/s | MFU (active) "
      "| peak GB | last loss | vs FSDP2 eager |")
print("|---|---|---|---|---|---|---|")
for r in rows:
    ratio = f"{r['tokens_per_s'] / base:.2f}x" if base else "-"
    loss = f"{r['loss']:.6f}" if "loss" in r else "-"
    print(f"| {r['impl']} | {r['s_per_step']:.4f} | {r['tokens_per_s']:,.0f} | "
          f"{100 * r['mfu']:.1f}% | {r['peak_gb']:.1f} | {loss} | {ratio} |")
for r in rows[:1]:
    if r.get("expert_tokens_last"):
        print(f"\nshardlm last step: loss {r['loss']:.4f}; tokens per expert per layer "
              f"(min / max): {list(zip(r['expert_tokens_last']['min'], r['expert_tokens_last']['max']))}")
PY
rm -rf "$T"
