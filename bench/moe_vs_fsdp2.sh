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
# peak GB, ratio to FSDP2 eager; the expert load of shardlm's last step.
# Environment: STEPS (default 8), PEERS (default "eager"), PEER_TIMEOUT s (default 600).
set -u
OUT=${1:-/tmp/moe-vs-fsdp2}
mkdir -p "$OUT"
HERE=$(cd "$(dirname "$0")" && pwd)
STEPS=${STEPS:-8}
PEERS=${PEERS:-eager}
PEER_TIMEOUT=${PEER_TIMEOUT:-600}
SHARDLM=${SHARDLM:-shardlm}
B=2
SEQ=4096
T=$(mktemp -d /tmp/mvf-XXXXXX)
RES="$OUT/results.jsonl"
: >"$RES"
M="$T/model"

echo "== random Qwen3-MoE model and data in $T"
python3 - "$M" "$T/data.jsonl" <<'PY' || { echo "model generation failed" >&2; exit 1; }
import json, os, random, sys
import torch
from safetensors.torch import save_file

d, data = sys.argv[1], sys.argv[2]
os.makedirs(d, exist_ok=True)
H, L, E, K, Im, nh, nkv, hd, V = 2048, 12, 64, 8, 768, 32, 4, 128, 151936
cfg = {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
       "vocab_size": V, "hidden_size": H, "intermediate_size": 6144, "num_hidden_layers": L,
       "num_attention_heads": nh, "num_key_value_heads": nkv, "head_dim": hd,
       "moe_intermediate_size": Im, "num_experts": E, "num_experts_per_tok": K,
       "norm_topk_prob": True, "decoder_sparse_step": 1, "mlp_only_layers": [],
       "router_aux_loss_coef": 0.001, "output_router_logits": False, "rms_norm_eps": 1e-6,
       "rope_theta": 1000000.0, "max_position_embeddings": 40960, "attention_bias": False,
       "tie_word_embeddings": False, "use_sliding_window": False, "sliding_window": None,
       "hidden_act": "silu", "initializer_range": 0.02, "bos_token_id": 151643,
       "eos_token_id": 151645, "torch_dtype": "bfloat16"}
json.dump(cfg, open(os.path.join(d, "config.json"), "w"), indent=2)
g = torch.Generator(device="cuda").manual_seed(1)


def rnd(*shape):
    return (0.02 * torch.randn(*shape, generator=g, device="cuda")).to(torch.bfloat16).cpu()


def ones(n):
    return torch.ones(n, dtype=torch.bfloat16)


weight_map, total = {}, 0
n_files = L + 2


def put(i, tensors):
    global total
    name = f"model-{i + 1:05d}-of-{n_files:05d}.safetensors"
    save_file(tensors, os.path.join(d, name), metadata={"format": "pt"})
    for k, v in tensors.items():
        weight_map[k] = name
        total += v.numel() * 2


put(0, {"model.embed_tokens.weight": rnd(V, H)})
for l in range(L):
    p = f"model.layers.{l}."
    put(l + 1, {p + "input_layernorm.weight": ones(H),
                p + "post_attention_layernorm.weight": ones(H),
                p + "self_attn.q_proj.weight": rnd(nh * hd, H),
                p + "self_attn.k_proj.weight": rnd(nkv * hd, H),
                p + "self_attn.v_proj.weight": rnd(nkv * hd, H),
                p + "self_attn.o_proj.weight": rnd(H, nh * hd),
                p + "self_attn.q_norm.weight": ones(hd),
                p + "self_attn.k_norm.weight": ones(hd),
                p + "mlp.gate.weight": rnd(E, H),
                p + "mlp.experts.gate_up_proj": rnd(E, 2 * Im, H),
                p + "mlp.experts.down_proj": rnd(E, H, Im)})
    print(f"layer {l} written", flush=True)
put(L + 1, {"model.norm.weight": ones(H), "lm_head.weight": rnd(V, H)})
json.dump({"metadata": {"total_size": total}, "weight_map": weight_map},
          open(os.path.join(d, "model.safetensors.index.json"), "w"), indent=1)

r = random.Random(7)
with open(data, "w") as f:
    for i in range(32):
        f.write(json.dumps({"input_ids": [r.randrange(3, 151000) for _ in range(4096)],
                            "loss_mask": [0] + [1] * 4095}) + "\n")
PY

cat >"$T/moe.yaml" <<YAML
model: {path: $M}
task: sft
backend: cuda
data: {train: $T/data.jsonl, max_state: $SEQ, seed: 1}
train: {batch: $B, accum: 1, steps: $STEPS, eval_every: 0}
checkpoint: {every: 0}
export: {dtype: bf16}
run: {dir: $T/run, log_every: 1}
YAML
echo "== shardlm"
"$SHARDLM" train "$T/moe.yaml" >"$OUT/shardlm.log" 2>&1
echo "shardlm exit $? (log $OUT/shardlm.log)"
tail -3 "$OUT/shardlm.log"
cp "$T/run/training_metrics.json" "$OUT/shardlm_metrics.json" 2>/dev/null
python3 - "$T/run/training_metrics.json" "$M/config.json" "$B" "$SEQ" >>"$RES" <<'PY'
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
print(json.dumps({"impl": "shardlm", "batch": B, "seq": n, "s_per_step": t,
                  "tokens_per_s": tok / t, "mfu": fl * tok / t / 989e12,
                  "peak_gb": max(s.get("peak_gpu_bytes", 0) for s in m["steps"]) / 1e9,
                  "loss": m["steps"][-1]["loss"], "expert_tokens_last": last}))
PY

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
      "| peak GB | vs FSDP2 eager |")
print("|---|---|---|---|---|---|")
for r in rows:
    ratio = f"{r['tokens_per_s'] / base:.2f}x" if base else "-"
    print(f"| {r['impl']} | {r['s_per_step']:.3f} | {r['tokens_per_s']:,.0f} | "
          f"{100 * r['mfu']:.1f}% | {r['peak_gb']:.1f} | {ratio} |")
for r in rows:
    if r.get("expert_tokens_last"):
        print(f"\nshardlm last step: loss {r['loss']:.4f}; tokens per expert per layer "
              f"(min / max): {list(zip(r['expert_tokens_last']['min'], r['expert_tokens_last']['max']))}")
PY
rm -rf "$T"
