#!/usr/bin/env python3
"""fsdp2_moe_peer.py: the PyTorch FSDP2 peer of shardlm's Qwen3-MoE SFT benchmark (issue 8).

World 1 through torchrun with one process:
  torchrun --standalone --nproc_per_node 1 bench/fsdp2_moe_peer.py --model DIR --data FILE \
      --batch 2 --seq 4096
Hugging Face Qwen3MoeForCausalLM built from DIR's config.json with random weights (the values do
not matter for speed), SDPA attention, transformers' default experts implementation (grouped_mm),
fully_shard per decoder layer and on the root with MixedPrecisionPolicy(param_dtype=bf16,
reduce_dtype=fp32), fp32 master weights, fused AdamW, the SFT loss transformers computes with
labels (input_ids where loss_mask is 1, else -100) and output_router_logits=True (cross-entropy
mean over the targets + router_aux_loss_coef x the load-balancing loss), no activation
checkpointing.  --compile torch.compile's each decoder layer before it is sharded.

Prints "RESULT {json}": tokens/s (median over the steps after --warmup), MFU on active parameters
(DESIGN.md's formula: 6 x the matmul parameters a token uses, the head included, the embedding
excluded, each MoE layer's experts counted k/E, + causal attention 12 hd n_heads layers (n+1)/2,
over 989 TFLOP/s), peak memory (torch.cuda.max_memory_allocated).
"""
import argparse
import json
import os
import statistics
import time

import torch
import torch.distributed as dist


def active_matmul_params(cfg):
    H, nl, nh, nkv = cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads, \
        cfg.num_key_value_heads
    hd = getattr(cfg, "head_dim", None) or H // nh
    E = getattr(cfg, "num_experts", None) or getattr(cfg, "num_local_experts")
    k, Im, I = cfg.num_experts_per_tok, cfg.moe_intermediate_size, cfg.intermediate_size
    only = set(getattr(cfg, "mlp_only_layers", None) or [])
    step = getattr(cfg, "decoder_sparse_step", 1) or 1
    p = 0
    for layer in range(nl):
        p += H * nh * hd + 2 * H * nkv * hd + nh * hd * H
        if layer not in only and E > 0 and (layer + 1) % step == 0:
            p += E * H + k * 3 * H * Im
        else:
            p += 3 * H * I
    return p + cfg.vocab_size * H, hd   # + lm_head


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True, help="HF model dir (config.json is all that is read)")
    ap.add_argument("--data", required=True, help="JSONL with input_ids and loss_mask")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seq", type=int, default=4096)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--lr", type=float, default=1e-5)
    a = ap.parse_args()

    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from transformers import AutoConfig, Qwen3MoeForCausalLM

    rank = int(os.environ.get("RANK", 0))
    local = int(os.environ.get("LOCAL_RANK", 0))
    torch.cuda.set_device(local)
    dist.init_process_group("nccl")
    torch.manual_seed(0)

    cfg = AutoConfig.from_pretrained(a.model)
    cfg._attn_implementation = "sdpa"
    cfg.output_router_logits = True
    cfg.use_cache = False
    with torch.device("cuda"):
        model = Qwen3MoeForCausalLM._from_config(cfg, attn_implementation="sdpa")
    model.float()   # fp32 master weights; FSDP2 casts to bf16 for compute
    model.config.use_cache = False
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    layers = model.model.layers
    for i in range(len(layers)):
        layer = layers[i]
        if a.compile:
            layer = torch.compile(layer)
            layers.register_module(str(i), layer)
        fully_shard(layer, mp_policy=mp)
    fully_shard(model, mp_policy=mp)
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, betas=(0.9, 0.95), eps=1e-8,
                            weight_decay=0.1, fused=True)

    recs = []
    with open(a.data) as f:
        for line in f:
            r = json.loads(line)
            ids = r["input_ids"][: a.seq]
            mask = r.get("loss_mask", [1] * len(ids))[: a.seq]
            if len(ids) == a.seq:
                recs.append((ids, [t if m else -100 for t, m in zip(ids, mask)]))
    if len(recs) < a.batch:
        raise SystemExit(f"{a.data}: fewer than {a.batch} records of {a.seq} tokens")
    times = []
    for step in range(a.steps):
        chunk = [recs[(step * a.batch + k) % len(recs)] for k in range(a.batch)]
        ids = torch.tensor([c[0] for c in chunk], dtype=torch.long, device="cuda")
        lab = torch.tensor([c[1] for c in chunk], dtype=torch.long, device="cuda")
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = model(input_ids=ids, labels=lab, output_router_logits=True)
        out.loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        lv = out.loss.item()
        torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        times.append(dt)
        if rank == 0:
            print(f"step {step + 1}/{a.steps} loss {lv:.4f} aux {float(out.aux_loss):.4f} "
                  f"s {dt:.3f}", flush=True)

    p, hd = active_matmul_params(cfg)
    n = a.seq
    flops_tok = 6 * p + 12.0 * hd * cfg.num_attention_heads * cfg.num_hidden_layers * (n + 1) / 2
    med = statistics.median(times[a.warmup:] if len(times) > a.warmup else times)
    tps = a.batch * a.seq / med
    res = {"impl": "fsdp2-compile" if a.compile else "fsdp2-eager", "batch": a.batch,
           "seq": a.seq, "s_per_step": med, "tokens_per_s": tps, "mfu": flops_tok * tps / 989e12,
           "peak_gb": torch.cuda.max_memory_allocated() / 1e9, "steps": a.steps,
           "experts": getattr(cfg, "_experts_implementation", None), "torch": torch.__version__}
    if rank == 0:
        print("RESULT " + json.dumps(res), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
