#!/usr/bin/env python3
"""moe_model.py: the random Qwen3-MoE of issue 8's benchmark, written on the GPU machine (torch).

    python3 bench/moe_model.py MODEL_DIR DATA_JSONL [--layers N] [--records R] [--seq S]

Hidden 2048, N layers (12), 64 experts top 8 (norm_topk_prob), moe_intermediate 768, 32 heads,
4 KV heads, head_dim 128, vocab 151936, untied head, router_aux_loss_coef 0.001; random bf16
weights (seed 1) with the fused expert tensors newer transformers save, one safetensors file per
layer.  DATA_JSONL: R (32) pre-tokenized records of S (4096) random tokens, loss on every token
but the first (seed 7).  Used by moe_vs_fsdp2.sh and kernel_profile.sh (MODELS=moe)."""
import argparse
import json, os, random, sys
import torch
from safetensors.torch import save_file

ap = argparse.ArgumentParser()
ap.add_argument("model")
ap.add_argument("data")
ap.add_argument("--layers", type=int, default=12)
ap.add_argument("--records", type=int, default=32)
ap.add_argument("--seq", type=int, default=4096)
args = ap.parse_args()
d, data = args.model, args.data
os.makedirs(d, exist_ok=True)
H, L, E, K, Im, nh, nkv, hd, V = 2048, args.layers, 64, 8, 768, 32, 4, 128, 151936
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
    for i in range(args.records):
        f.write(json.dumps({"input_ids": [r.randrange(3, 151000) for _ in range(args.seq)],
                            "loss_mask": [0] + [1] * (args.seq - 1)}) + "\n")
