#!/bin/bash
# bench/offload.sh [OUTDIR]: the offload measurements of issue 6 on one H200 (16 cores, 128 GB host
# memory), in one call of about 6-8 minutes.  Run from a build configured with CUDA (or with
# SHARDLM, MKMODEL, ADAMW_HOST pointing at the programs; otherwise found in PATH, then in the
# build tree: src/shardlm, test/mkmodel, test/adamw_host: `make && make -C test mkmodel adamw_host`).
#   1. the host's copy bandwidth and the CPU AdamW alone (test/adamw_host, all 16 cores): bytes
#      moved per second against the copy bandwidth measured in the same run (target >= 70%), and
#      T_adam, its time for one step of the 4B shape;
#   2. the first user's step shape (batch 4 x accum 4 x 2048 tokens) on the 4B shape (hidden 2560,
#      36 layers, 32/8 heads, intermediate 9728; random weights made here with mkmodel): on-GPU
#      optimizer state against offload: optimizer (target: offloaded step <= on-GPU step +
#      T_adam; the share of T_adam the schedule hides);
#   3. batch 4 x 2048, accum 1: shardlm offload: params and offload: optimizer against PyTorch
#      FSDP2 with CPUOffloadPolicy(pin_memory=True) (bench/fsdp2_peer.py --cpu-offload) in the same
#      run (target >= 5x its tokens/s);
#   4. the planner against the measured peak GPU memory (target within 10%) for every run above
#      plus one with activation checkpointing: `shardlm plan` total minus its CUDA-context
#      estimate against training_metrics.json's peak_gpu_bytes (the arena's peak + workspaces);
#   5. the Qwen3-8B shape (hidden 4096, 36 layers, 32/8 heads, intermediate 12288) with offload:
#      optimizer: `shardlm plan --host-mem 128` first; trained (3 steps) only when it fits.
# Prints a short table last (also OUTDIR/table.md); every log stays in OUTDIR.
# Environment: STEPS (default 6), THREADS (default: the machine's cores), PEER_TIMEOUT (s, 240),
# EIGHT_B=0 skips part 5 (its model alone is 16 GB to write: about 2.5 minutes in all).
START=$(date +%s)
set -u
HERE=$(cd "$(dirname "$0")/.." && pwd)
OUT=${1:-/tmp/offload-bench}
mkdir -p "$OUT"
STEPS=${STEPS:-6}
THREADS=${THREADS:-$(nproc)}
PEER_TIMEOUT=${PEER_TIMEOUT:-240}
export OMP_NUM_THREADS=$THREADS OMP_PROC_BIND=false
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# a Firecracker machine reads a small MemTotal until its memory has grown: the check uses this
export SHARDLM_HOST_MEM=${SHARDLM_HOST_MEM:-128GB}

find_prog() { # find_prog VAR NAME BUILD_PATH
	eval "v=\${$1:-}"
	if [ -z "$v" ]; then
		v=$(command -v "$2" 2>/dev/null || true)
		[ -n "$v" ] || v="$HERE/$3"
	fi
	[ -x "$v" ] || { echo "offload.sh: $2 not found (set $1)" >&2; exit 1; }
	eval "$1=\$v"
}
find_prog SHARDLM shardlm src/shardlm
find_prog MKMODEL mkmodel test/mkmodel
find_prog ADAMW_HOST adamw_host test/adamw_host
T=$(mktemp -d /tmp/offload-XXXXXX)
trap 'rm -rf "$T"' EXIT
RES="$OUT/results.jsonl"
: >"$RES"
echo "offload.sh: $SHARDLM, $THREADS threads, $(nproc) cores, host memory" \
	"$(awk '/MemTotal/ {printf "%.0f GB", $2 * 1024 / 1e9}' /proc/meminfo), logs in $OUT"

# 128 records of 2048 random token ids: the same file for shardlm and the FSDP2 peer
python3 - "$T/data.jsonl" <<'PY'
import json, random, sys
r = random.Random(7)
with open(sys.argv[1], "w") as f:
    for i in range(128):
        f.write(json.dumps({"input_ids": [r.randrange(3, 151936) for _ in range(2048)],
                            "label": round(r.random(), 3)}) + "\n")
PY

# ---- 1. copy bandwidth and the CPU AdamW alone ------------------------------------------------
M4="$T/m4"
"$MKMODEL" --out "$M4" --vocab 151936 --hidden 2560 --layers 36 --heads 32 --kv-heads 8 \
	--head-dim 128 --intermediate 9728 --seed 1 --dtype bf16 >/dev/null ||
	{ echo "mkmodel 4b failed" >&2; exit 1; }
P4=$(python3 -c "
import json; c = json.load(open('$M4/config.json'))
H, L, nh, nkv, hd, I, V = (c[k] for k in ('hidden_size', 'num_hidden_layers', 'num_attention_heads',
    'num_key_value_heads', 'head_dim', 'intermediate_size', 'vocab_size'))
layer = H * (nh + 2 * nkv) * hd + nh * hd * H + 3 * H * I + 2 * H + 2 * hd
print(V * H + L * layer + H + H)")
echo "4B shape: $P4 parameters"
# 2e9 parameters (36 GB of state) measured; T_adam scaled to the 4B count (bandwidth bound)
"$ADAMW_HOST" --params 2e9 --units 36 --reps 3 --copy-gib 4 --step-params "$P4" \
	>"$OUT/adamw_host.txt" 2>&1
cat "$OUT/adamw_host.txt"
python3 - "$OUT/adamw_host.txt" >>"$RES" <<'PY'
import json, re, sys
t = open(sys.argv[1]).read()
g = lambda k: float(re.search(k + r" ([0-9.]+)", t).group(1))
print(json.dumps({"kind": "adamw", "copy_gbs": g("copy_gbs"), "adamw_gbs": g("adamw_gbs"),
                  "t_adam": float(re.search(r"T_adam ([0-9.]+)", t).group(1))}))
PY

# ---- shardlm runs ----------------------------------------------------------------------------
conf() { # conf NAME MODEL BATCH ACCUM OFFLOAD CKPT STEPS
	cat >"$T/$1.yaml" <<YAML
model: {path: $2}
backend: cuda
data: {train: $T/data.jsonl, max_state: 2048, seed: 1}
train: {batch: $3, accum: $4, steps: $7, activation_checkpointing: $6, eval_every: 0}
parallel: {offload: $5}
checkpoint: {every: 0}
run: {dir: $T/run-$1, log_every: 1}
export: {final: false}
YAML
}

# run NAME MODEL BATCH ACCUM OFFLOAD CKPT STEPS: plan, train, one result line
run() {
	name=$1
	conf "$@"
	"$SHARDLM" plan "$T/$name.yaml" --gpu-mem 141 --host-mem 128 >"$OUT/$name.plan" 2>&1
	# export.final: false: the final export (8 GB written) is not what is measured
	timeout 420 "$SHARDLM" train "$T/$name.yaml" --fresh >"$OUT/$name.log" 2>&1 ||
		echo "$name: shardlm train failed (see $OUT/$name.log)" >&2
	python3 - "$T/run-$name/training_metrics.json" "$OUT/$name.plan" "$name" "$3" "$4" \
		"$5" "$6" >>"$RES" <<'PY'
import json, re, statistics, sys
mf, plan, name, batch, accum, off, ck = sys.argv[1:]
try:
    st = json.load(open(mf))["steps"]
except (OSError, ValueError):
    st = []
p = open(plan).read()
tot = re.search(r"^  total\s+[0-9.]+\s+([0-9]+)", p, re.M)
ctx = re.search(r"^  CUDA context \(estimate\)\s+[0-9.]+\s+([0-9]+)", p, re.M)
planned = (int(tot.group(1)) - (int(ctx.group(1)) if ctx else 0)) if tot else 0
rest = st[2:] or st
t = statistics.median(s["time_s"] for s in rest) if rest else 0
tok = statistics.median(s["tokens"] for s in rest) if rest else 0
peak = max((s.get("peak_gpu_bytes", 0) for s in st), default=0)
print(json.dumps({"kind": "run", "name": name, "batch": int(batch), "accum": int(accum),
                  "offload": off, "ckpt": ck == "true", "steps": len(st), "s_per_step": t,
                  "mean_s_per_step": statistics.mean(s["time_s"] for s in rest) if rest else 0,
                  "tokens_per_s": tok / t if t else 0, "peak": peak, "planned": planned,
                  "losses": [s["loss"] for s in st]}))
PY
	grep -E "^\[[0-9:]+\] offload" "$OUT/$name.log"
	rm -rf "$T/run-$name"
}

# 2. the step shape: on-GPU state against offload: optimizer (no checkpointing: both fit)
run step-gpu "$M4" 4 4 none false "$STEPS"
run step-opt "$M4" 4 4 optimizer false "$STEPS"
# 3. batch 4, accum 1: the FSDP2 CPUOffloadPolicy comparison
run b4-par "$M4" 4 1 params false "$STEPS"
run b4-opt "$M4" 4 1 optimizer false "$STEPS"
# 4. one more planner point: checkpointing on
run b4-gpu-ckpt "$M4" 4 1 none true 3

timeout "$PEER_TIMEOUT" torchrun --standalone --nproc_per_node 1 "$HERE/bench/fsdp2_peer.py" \
	--model "$M4" --data "$T/data.jsonl" --batch 4 --steps 5 --warmup 2 --cpu-offload \
	>"$OUT/fsdp2-cpu-offload.log" 2>&1 || echo "fsdp2 peer failed (see $OUT/fsdp2-cpu-offload.log)" >&2
sed -n 's/^RESULT //p' "$OUT/fsdp2-cpu-offload.log" |
	python3 -c "import json,sys
for l in sys.stdin: d=json.loads(l); d['kind']='peer'; print(json.dumps(d))" >>"$RES"
rm -rf "$M4"

# ---- 5. the 8B shape: the planner's verdict first ---------------------------------------------
M8="$T/m8"
mkdir -p "$M8"
python3 - "$M8/config.json" <<'PY'
import json, sys
json.dump({"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 151936,
           "hidden_size": 4096, "num_hidden_layers": 36, "num_attention_heads": 32,
           "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 12288,
           "max_position_embeddings": 40960, "rms_norm_eps": 1e-6, "rope_theta": 1000000,
           "attention_bias": False, "tie_word_embeddings": False, "torch_dtype": "bfloat16"},
          open(sys.argv[1], "w"), indent=1)
PY
conf 8b-opt "$M8" 4 4 optimizer false 3
if [ "${EIGHT_B:-1}" = 0 ]; then
	verdict="not run (EIGHT_B=0); planned: $("$SHARDLM" plan "$T/8b-opt.yaml" --gpu-mem 141 \
		--host-mem 128 | grep -E '^host:|^GPU:|lean' | tr '\n' ' ')"
elif "$SHARDLM" plan "$T/8b-opt.yaml" --gpu-mem 141 --host-mem 128 >"$OUT/8b-opt.plan" 2>&1; then
	verdict=fits
	rm -rf "$M8"
	"$MKMODEL" --out "$M8" --vocab 151936 --hidden 4096 --layers 36 --heads 32 --kv-heads 8 \
		--head-dim 128 --intermediate 12288 --seed 1 --dtype bf16 >/dev/null
	run 8b-opt "$M8" 4 4 optimizer false 3
else
	verdict="does not fit: $(grep -E '^host:|^GPU:' "$OUT/8b-opt.plan" | tr '\n' ' ')"
fi
echo "8B with offload: optimizer on 128 GB: $verdict"
python3 -c "import json,sys; print(json.dumps({'kind': '8b', 'verdict': sys.argv[1]}))" \
	"$verdict" >>"$RES"
rm -rf "$M8"

echo "offload.sh: $(($(date +%s) - START)) s"

# ---- the table --------------------------------------------------------------------------------
python3 - "$RES" <<'PY' | tee "$OUT/table.md"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
runs = {r["name"]: r for r in rows if r["kind"] == "run"}
ad = next((r for r in rows if r["kind"] == "adamw"), None)
peer = next((r for r in rows if r["kind"] == "peer"), None)
gib = lambda b: b / 2**30
print("| run | batch x accum | offload | ckpt | s/step | tokens/s | peak GiB | plan GiB | plan vs peak |")
print("|---|---|---|---|---|---|---|---|---|")
for r in runs.values():
    d = 100 * (r["planned"] - r["peak"]) / r["peak"] if r["peak"] else float("nan")
    print(f"| {r['name']} | {r['batch']} x {r['accum']} | {r['offload']} | {'on' if r['ckpt'] else 'off'} "
          f"| {r['s_per_step']:.3f} | {r['tokens_per_s']:,.0f} | {gib(r['peak']):.2f} | "
          f"{gib(r['planned']):.2f} | {d:+.1f}% |")
if peer:
    print(f"| FSDP2 CPUOffloadPolicy | {peer['batch']} x 1 | params (pinned) | off | "
          f"{peer['s_per_step']:.3f} | {peer['tokens_per_s']:,.0f} | {peer['peak_gb'] * 1e9 / 2**30:.2f} | - | - |")
print()
if ad:
    print(f"CPU AdamW alone: {ad['adamw_gbs']:.1f} GB/s moved, copy bandwidth {ad['copy_gbs']:.1f} GB/s "
          f"-> {100 * ad['adamw_gbs'] / ad['copy_gbs']:.0f}% (target >= 70%); T_adam {ad['t_adam']:.3f} s "
          f"per step of the 4B shape")
g, o = runs.get("step-gpu"), runs.get("step-opt")
if ad and g and o and g["s_per_step"] and o["s_per_step"]:
    extra = o["s_per_step"] - g["s_per_step"]
    hidden = 1 - extra / ad["t_adam"]
    print(f"step 4 x 4: on-GPU {g['s_per_step']:.3f} s, offload optimizer {o['s_per_step']:.3f} s "
          f"(+{extra:.3f} s; bound on-GPU + T_adam = {g['s_per_step'] + ad['t_adam']:.3f} s: "
          f"{'met' if o['s_per_step'] <= g['s_per_step'] + ad['t_adam'] else 'NOT met'}); "
          f"the schedule hides {100 * hidden:.0f}% of T_adam")
    la, lb = g["losses"], o["losses"]
    if la and len(la) == len(lb):
        print("losses on-GPU vs offload, worst relative difference: "
              f"{max(abs(x - y) / abs(x) for x, y in zip(la, lb)):.2e}")
if peer:
    for n in ("b4-par", "b4-opt"):
        r = runs.get(n)
        if r and r["tokens_per_s"]:
            x = r["tokens_per_s"] / peer["tokens_per_s"]
            print(f"{n}: {x:.1f}x FSDP2 CPUOffloadPolicy's tokens/s (target >= 5x)")
for r in rows:
    if r["kind"] == "8b":
        print(f"8B, offload optimizer, 128 GB host: {r['verdict']}")
PY
