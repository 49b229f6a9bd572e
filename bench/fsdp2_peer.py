#!/usr/bin/env python3
"""fsdp2_peer.py: the PyTorch FSDP2 peer of shardlm's benchmark (issue 5).

World 1 through torchrun with one process:
  torchrun --standalone --nproc_per_node 1 bench/fsdp2_peer.py --model DIR --data FILE --batch 4
Hugging Face Qwen3ForSequenceClassification built from DIR's config.json with random weights (the
checkpoint's values do not matter for speed, and initializing skips reading gigabytes), SDPA
attention, fully_shard per decoder layer and on the root with MixedPrecisionPolicy(param_dtype=bf16,
reduce_dtype=fp32), fused AdamW, BCE-with-logits on soft labels, batch x seq tokens from the same
JSONL records shardlm trains on (input_ids and label), no activation checkpointing.  --compile
torch.compile's each decoder layer before it is sharded.  --cpu-offload (issue 6) shards with
CPUOffloadPolicy(pin_memory=True): fp32 parameters, gradients and AdamW state in pinned host memory,
the optimizer step on the CPU (fused AdamW where torch has it for the CPU, else foreach).

Prints one JSON line: tokens/s (median over the steps after --warmup), MFU by DESIGN.md's formula
(6 x matmul parameters, head included, embedding excluded, + causal attention 12 hd n_heads layers
(n+1)/2 per token, over 989 TFLOP/s), peak memory (torch.cuda.max_memory_allocated).
"""
import argparse
import json
import os
import statistics
import time

import torch
import torch.distributed as dist


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True, help="HF model dir (config.json is all that is read)")
    ap.add_argument("--data", required=True, help="JSONL with input_ids and label")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--cpu-offload", action="store_true")
    ap.add_argument("--lr", type=float, default=1e-5)
    a = ap.parse_args()

    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard
    from transformers import AutoConfig, Qwen3ForSequenceClassification

    rank = int(os.environ.get("RANK", 0))
    local = int(os.environ.get("LOCAL_RANK", 0))
    torch.cuda.set_device(local)
    dist.init_process_group("nccl")
    torch.manual_seed(0)

    cfg = AutoConfig.from_pretrained(a.model)
    cfg.num_labels = 1
    if cfg.pad_token_id is None:
        cfg.pad_token_id = 0
    cfg._attn_implementation = "sdpa"
    with torch.device("cuda"):
        model = Qwen3ForSequenceClassification._from_config(cfg, attn_implementation="sdpa")
    model.float()   # fp32 master weights whatever dtype config.json names; FSDP2 casts to bf16
    model.config.use_cache = False
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    kw = {"mp_policy": mp}
    if a.cpu_offload:
        kw["offload_policy"] = CPUOffloadPolicy(pin_memory=True)
    layers = model.model.layers
    for i in range(len(layers)):
        layer = layers[i]
        if a.compile:
            # compiled first, then sharded: the FSDP hooks stay outside the compiled region
            layer = torch.compile(layer)
            layers.register_module(str(i), layer)
        fully_shard(layer, **kw)
    fully_shard(model, **kw)
    try:
        opt = torch.optim.AdamW(model.parameters(), lr=a.lr, betas=(0.9, 0.95), eps=1e-8,
                                weight_decay=0.1, fused=True)
    except (RuntimeError, ValueError) as e:
        if not a.cpu_offload:
            raise
        print(f"fused AdamW unavailable on the CPU ({e}); foreach", flush=True)
        opt = torch.optim.AdamW(model.parameters(), lr=a.lr, betas=(0.9, 0.95), eps=1e-8,
                                weight_decay=0.1, foreach=True)

    recs = []
    with open(a.data) as f:
        for line in f:
            r = json.loads(line)
            ids = r["input_ids"][: a.seq]
            if len(ids) == a.seq:
                recs.append((ids, float(r["label"])))
    if len(recs) < a.batch:
        raise SystemExit(f"{a.data}: fewer than {a.batch} records of {a.seq} tokens")
    lossf = torch.nn.BCEWithLogitsLoss()
    times = []
    for step in range(a.steps):
        chunk = [recs[(step * a.batch + k) % len(recs)] for k in range(a.batch)]
        ids = torch.tensor([c[0] for c in chunk], dtype=torch.long, device="cuda")
        lab = torch.tensor([c[1] for c in chunk], dtype=torch.float32, device="cuda")
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        logits = model(input_ids=ids).logits.squeeze(-1).float()
        loss = lossf(logits, lab)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        lv = loss.item()
        torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        times.append(dt)
        if rank == 0:
            print(f"step {step + 1}/{a.steps} loss {lv:.4f} s {dt:.3f}", flush=True)

    H, nl, nh, nkv = cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads, cfg.num_key_value_heads
    hd = getattr(cfg, "head_dim", None) or H // nh
    I = cfg.intermediate_size
    p = nl * (H * nh * hd + 2 * H * nkv * hd + nh * hd * H + 3 * H * I) + H * 1
    n = a.seq
    flops_tok = 6 * p + 12.0 * hd * nh * nl * (n + 1) / 2
    med = statistics.median(times[a.warmup:] if len(times) > a.warmup else times)
    tps = a.batch * a.seq / med
    impl = "fsdp2-compile" if a.compile else "fsdp2-eager"
    if a.cpu_offload:
        impl = "fsdp2-cpu-offload"
    out = {"impl": impl, "batch": a.batch, "seq": a.seq,
           "s_per_step": med, "tokens_per_s": tps, "mfu": flops_tok * tps / 989e12,
           "peak_gb": torch.cuda.max_memory_allocated() / 1e9, "steps": a.steps,
           "torch": torch.__version__}
    if rank == 0:
        print("RESULT " + json.dumps(out), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
