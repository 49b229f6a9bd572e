#!/usr/bin/env python3
"""fsdp2_q35_peer.py: the PyTorch FSDP2 peer of shardlm's Qwen3.5 hybrid benchmark (issue 12).

World 1 through torchrun with one process:
  torchrun --standalone --nproc_per_node 1 bench/fsdp2_q35_peer.py --model DIR --data FILE \
      --batch 4 --seq 2048 --steps 6
transformers' Qwen3_5TextForSequenceClassification (num_labels 1) built from DIR's config.json and
loaded with DIR's weights (the same bf16 safetensors shardlm trains; every tensor must be used and
every parameter loaded), fp32 master weights, SDPA attention, fully_shard per decoder layer and on
the root with MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32), fused AdamW,
BCE-with-logits on the soft labels, batch x seq tokens from the same JSONL records (input_ids,
label), no activation checkpointing, use_cache=False.  Should a transformers lack that class, the
text model (Qwen3_5TextModel) plus a bias-free linear score head on the last token stands in, and
RESULT says so (model_class).

The Gated DeltaNet layers run whatever transformers picks: without flash-linear-attention and
causal-conv1d (the GPU machine has neither) that is its pure-PyTorch fallback
(torch_chunk_gated_delta_rule in fp32, F.conv1d).  What was found is printed ("KERNELS {json}")
and put in RESULT (gdn_kernels).

Prints "RESULT {json}" after every step (the last one counts; a run killed by a timeout still
leaves its steps): tokens/s from the median step time after --warmup, peak memory
(torch.cuda.max_memory_allocated, counted from after the weights are loaded), the losses.  An
out-of-memory step ends the run with status "oom".  --time-budget S stops stepping (after the
warm-up plus one step) once the next step would end past S seconds from the start.  MFU is left to
bench/q35_bench.py, which counts the FLOPs for both trainers the same way.
"""
import argparse
import importlib.util
import json
import os
import statistics
import sys
import time
from types import SimpleNamespace

import torch
import torch.distributed as dist

T_START = time.perf_counter()


def say(*a):
    print("[fsdp2_q35_peer]", *a, flush=True)


def describe(f):
    if f is None:
        return None
    return f"{getattr(f, '__module__', '?')}.{getattr(f, '__qualname__', type(f).__name__)}"


def kernel_facts(mq, model):
    """what the Gated DeltaNet layers can call: the optional packages, the module's own flags,
    the functions the first layer holds (versions that bind them at construction) or the
    module's (versions that call module functions)"""
    f = {p: importlib.util.find_spec(p) is not None for p in ("fla", "causal_conv1d", "kernels")}
    if hasattr(mq, "is_fast_path_available"):
        f["is_fast_path_available"] = bool(mq.is_fast_path_available)
    try:
        from transformers.utils import is_flash_linear_attention_available
        f["is_flash_linear_attention_available"] = bool(is_flash_linear_attention_available())
    except ImportError:
        pass
    try:
        from transformers.utils import is_causal_conv1d_available
        f["is_causal_conv1d_available"] = bool(is_causal_conv1d_available())
    except ImportError:
        pass
    gdn = next((m for m in model.modules() if type(m).__name__.endswith("GatedDeltaNet")), None)
    f["gdn_class"] = type(gdn).__name__ if gdn is not None else None
    for attr, mod_name in (("chunk_gated_delta_rule", "torch_chunk_gated_delta_rule"),
                           ("causal_conv1d_fn", "causal_conv1d_fn")):
        if gdn is not None and hasattr(gdn, attr):
            f[attr] = describe(getattr(gdn, attr)) or "None (the layer falls back to torch)"
        else:
            f[attr] = describe(getattr(mq, mod_name, None))
    fast = f["fla"] or f["causal_conv1d"] or f.get("is_fast_path_available") or \
        f.get("is_flash_linear_attention_available") or \
        "fla." in str(f.get("chunk_gated_delta_rule")) or \
        "causal_conv1d." in str(f.get("causal_conv1d_fn"))
    if fast:
        verdict = "fast kernels may be in use (see the facts)"
    else:
        verdict = ("transformers' pure-PyTorch fallback (torch_chunk_gated_delta_rule in fp32, "
                   "F.conv1d): no flash-linear-attention, no causal-conv1d")
        if f["kernels"]:
            verdict += "; the hub 'kernels' package is installed but the machine has no network"
    f["verdict"] = verdict
    return f


class TextModelWithScore(torch.nn.Module):
    """stand-in for Qwen3_5TextForSequenceClassification: the text model, a score head on the
    last token (the records have no padding), the same parameter names"""

    def __init__(self, body, cfg):
        super().__init__()
        self.model = body
        self.score = torch.nn.Linear(cfg.hidden_size, cfg.num_labels, bias=False)

    def forward(self, input_ids, use_cache=False):
        h = self.model(input_ids=input_ids, use_cache=False).last_hidden_state
        return SimpleNamespace(logits=self.score(h[:, -1]))


def build(cfg):
    import transformers.models.qwen3_5.modeling_qwen3_5 as mq
    cls = getattr(mq, "Qwen3_5TextForSequenceClassification", None)
    with torch.device("cuda"):
        if cls is not None:
            model = cls._from_config(cfg, attn_implementation="sdpa")
            name = cls.__name__
        else:
            body = mq.Qwen3_5TextModel._from_config(cfg, attn_implementation="sdpa")
            model = TextModelWithScore(body, cfg)
            name = "Qwen3_5TextModel + linear score head (no Qwen3_5TextForSequenceClassification)"
    return mq, model, name


def load_weights(model, d):
    """every tensor of the checkpoint into the fp32 model, each shard through the GPU"""
    from safetensors.torch import load_file
    want = set(model.state_dict().keys())
    loaded, unexpected = set(), set()
    files = sorted(f for f in os.listdir(d) if f.endswith(".safetensors"))
    if not files:
        raise SystemExit(f"{d}: no .safetensors files")
    for fn in files:
        sd = load_file(os.path.join(d, fn), device="cuda")
        unexpected |= set(sd) - want
        sd = {k: v for k, v in sd.items() if k in want}
        model.load_state_dict(sd, strict=False)
        loaded |= set(sd)
        del sd
    missing = want - loaded
    if missing or unexpected:
        raise SystemExit(f"{d}: checkpoint and model disagree: missing {sorted(missing)[:6]} "
                         f"({len(missing)}), unexpected {sorted(unexpected)[:6]} "
                         f"({len(unexpected)})")
    say(f"loaded {len(loaded)} tensors from {len(files)} files")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True, help="HF model dir (config.json, safetensors)")
    ap.add_argument("--data", required=True, help="JSONL with input_ids and label")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--time-budget", type=float, default=0, help="seconds from the start; 0: none")
    ap.add_argument("--lr", type=float, default=1e-5)
    a = ap.parse_args()

    import transformers
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from transformers import AutoConfig

    rank = int(os.environ.get("RANK", 0))
    local = int(os.environ.get("LOCAL_RANK", 0))
    torch.cuda.set_device(local)
    dist.init_process_group("nccl")
    torch.manual_seed(0)
    oom_error = getattr(torch, "OutOfMemoryError", torch.cuda.OutOfMemoryError)
    say(f"torch {torch.__version__}, transformers {transformers.__version__}, "
        f"PYTORCH_CUDA_ALLOC_CONF={os.environ.get('PYTORCH_CUDA_ALLOC_CONF', '')}")

    cfg = AutoConfig.from_pretrained(a.model)
    if cfg.model_type != "qwen3_5_text":
        raise SystemExit(f"{a.model}: model_type {cfg.model_type}, expected qwen3_5_text")
    cfg.num_labels = 1
    if cfg.pad_token_id is None:
        cfg.pad_token_id = 0
    cfg.use_cache = False
    cfg._attn_implementation = "sdpa"
    mq, model, model_class = build(cfg)
    model.float()   # fp32 master weights whatever dtype config.json names; FSDP2 casts to bf16
    if getattr(model, "config", None) is not None:
        model.config.use_cache = False
    load_weights(model, a.model)
    facts = kernel_facts(mq, model)
    say("KERNELS " + json.dumps(facts))
    print("KERNELS " + json.dumps(facts), flush=True)

    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for layer in model.model.layers:
        fully_shard(layer, mp_policy=mp)
    fully_shard(model, mp_policy=mp)
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, betas=(0.9, 0.95), eps=1e-8,
                            weight_decay=0.1, fused=True)

    recs = []
    with open(a.data) as f:
        for line in f:
            r = json.loads(line)
            ids = r["input_ids"][: a.seq]
            if len(ids) == a.seq:
                recs.append((ids, float(r["label"])))
    if len(recs) < a.batch:
        raise SystemExit(f"{a.data}: fewer than {a.batch} records of {a.seq} tokens")
    if any(min(ids) <= cfg.pad_token_id for ids, _ in recs):
        # the classification head takes the last token that is not padding
        raise SystemExit(f"{a.data}: token ids <= pad_token_id {cfg.pad_token_id}")
    say(f"{len(recs)} records; setup took {time.perf_counter() - T_START:.1f} s")

    lossf = torch.nn.BCEWithLogitsLoss()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    times, losses = [], []
    base = {"impl": "fsdp2", "batch": a.batch, "seq": a.seq, "steps": a.steps,
            "warmup": a.warmup, "model_class": model_class, "gdn_kernels": facts["verdict"],
            "torch": torch.__version__, "transformers": transformers.__version__}

    def result(status, **kw):
        out = dict(base, status=status, steps_done=len(times), losses=losses, **kw)
        if times:
            timed = times[a.warmup:] if len(times) > a.warmup else times
            med = statistics.median(timed)
            out.update(s_per_step=med, tokens_per_s=a.batch * a.seq / med,
                       steps_timed=len(timed), warmup_only=len(times) <= a.warmup)
        out["peak_gb"] = torch.cuda.max_memory_allocated() / 1e9
        if rank == 0:
            print("RESULT " + json.dumps(out), flush=True)

    for step in range(a.steps):
        chunk = [recs[(step * a.batch + k) % len(recs)] for k in range(a.batch)]
        ids = torch.tensor([c[0] for c in chunk], dtype=torch.long, device="cuda")
        lab = torch.tensor([c[1] for c in chunk], dtype=torch.float32, device="cuda")
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        try:
            logits = model(input_ids=ids, use_cache=False).logits.squeeze(-1).float()
            loss = lossf(logits, lab)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            lv = loss.item()
            torch.cuda.synchronize()
        except oom_error as e:
            say(f"step {step + 1}: out of GPU memory: {str(e).splitlines()[0][:200]}")
            where = f"step {step + 1} of batch {a.batch} x {a.seq}"
            del e
            result("oom", where=where)
            dist.destroy_process_group()
            sys.exit(3)
        dt = time.perf_counter() - t0
        times.append(dt)
        losses.append(lv)
        say(f"step {step + 1}/{a.steps} loss {lv:.4f} s {dt:.3f} "
            f"peak {torch.cuda.max_memory_allocated() / 1e9:.1f} GB")
        result("ok")
        elapsed = time.perf_counter() - T_START
        if a.time_budget and len(times) > a.warmup and elapsed + dt > a.time_budget and \
                step + 1 < a.steps:
            say(f"stopping after {step + 1} steps: the next would end past the "
                f"{a.time_budget:.0f} s budget")
            break
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
