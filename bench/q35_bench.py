#!/usr/bin/env python3
"""q35_bench.py: the helpers of bench/q35_vs_fsdp2.sh (issue 12), one subcommand each.

  model DIR --preset 4b|smoke [--seed S] [--writer auto|torch|python]
      a random Qwen3.5 hybrid text model (model_type qwen3_5_text,
      Qwen3_5TextForSequenceClassification with num_labels 1: score.weight, no lm_head) as bf16
      safetensors, one file per layer plus one for the embedding and one for the final norm and
      score head, an index, config.json.  With torch the tensors are drawn on the GPU when there
      is one (a 4B model in seconds); without torch, in pure Python (small models only: the
      smoke preset).
  data FILE --config DIR/config.json --records N --seq N [--seed S]
      N records of exactly --seq random token ids in [3, vocab) with a soft label in [0, 1]
  flops DIR --batch B --seq N
      the model FLOPs of one step and per token as shardlm counts them for MFU (src/train.c
      model_flops: 6 x the matrix-multiply parameters per token, embedding and Conv1d excluded,
      the classify head once per record, + sl_model_mixer_flops of src/model_qwen35.c: causal
      attention 3 x 4 hd n_heads n(n+1)/2 per full-attention layer, the gated delta rule 3 x 3 x 2
      dk dv n_v_heads n per linear-attention layer).  The matrix parameters come from config.json
      and are checked against the tensor shapes in the safetensors headers.  Prints JSON.
  shardlm-row --name NAME --run RUNDIR --log LOG --rc RC --flops FLOPS.json --warmup W
      one result row from shardlm's training_metrics.json (tokens/s = median after the warm-up
      steps) and its log (the MFU shardlm printed, to check the formula above against it)
  peer-row --name NAME --log LOG --rc RC --timeout S --flops FLOPS.json [--skip REASON]
      one result row from the FSDP2 peer's last "RESULT {json}" line, or its failure (OOM,
      timeout, exit), or that it was skipped
  table RESULTS.jsonl
      the table (markdown) and the two ratios
Everything prints progress on stderr and results on stdout.
"""
import argparse
import json
import math
import os
import random
import re
import statistics
import struct
import sys

# H100/H200 dense bf16, shardlm's MFU denominator (src/train.c SL_PEAK_FLOPS)
PEAK_FLOPS = 989e12

PRESETS = {
    # issue 12: the Qwen3.5-shaped ~4B model
    "4b": dict(hidden_size=2560, num_hidden_layers=32, num_attention_heads=16,
               num_key_value_heads=4, head_dim=256, linear_num_key_heads=16,
               linear_num_value_heads=32, linear_key_head_dim=128, linear_value_head_dim=128,
               intermediate_size=9216, vocab_size=248320),
    # test/check-gpu-cp.sh: tiny, with a head_dim the cuda context-parallel attention takes
    "cp-tiny": dict(hidden_size=64, num_hidden_layers=4, num_attention_heads=2,
                    num_key_value_heads=1, head_dim=64, linear_num_key_heads=2,
                    linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=24,
                    intermediate_size=96, vocab_size=512),
    # the CPU smoke run: the same structure, tiny (the shape of test/fixtures/qwen35/cls)
    "smoke": dict(hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                  head_dim=32, linear_num_key_heads=2, linear_num_value_heads=4,
                  linear_key_head_dim=16, linear_value_head_dim=24, intermediate_size=96,
                  vocab_size=512),
}

# the 4B's widths over one 3:1 block of layers (bench/kernel_profile.sh: per-kernel times)
PRESETS["4b-block"] = dict(PRESETS["4b"], num_hidden_layers=4)


def say(*a):
    print("[q35_bench]", *a, file=sys.stderr, flush=True)


# ---- the model ------------------------------------------------------------------------------

def q35_config(p):
    L = p["num_hidden_layers"]
    if L % 4:
        raise SystemExit(f"num_hidden_layers {L} is not a multiple of 4 (the 3:1 pattern)")
    # the keys transformers 5.17 writes for this class (test/fixtures/qwen35/cls/config.json)
    cfg = {
        "architectures": ["Qwen3_5TextForSequenceClassification"],
        "model_type": "qwen3_5_text",
        "layer_types": ["linear_attention", "linear_attention", "linear_attention",
                        "full_attention"] * (L // 4),
        "linear_conv_kernel_dim": 4,
        "partial_rotary_factor": 0.25,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000000.0,
                            "partial_rotary_factor": 0.25},
        "attention_bias": False, "attention_dropout": 0.0, "hidden_act": "silu",
        "rms_norm_eps": 1e-6, "max_position_embeddings": 32768, "initializer_range": 0.02,
        "tie_word_embeddings": False, "use_cache": False,
        "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2,
        "id2label": {"0": "LABEL_0"}, "label2id": {"LABEL_0": 0},    # num_labels 1
        "dtype": "bfloat16",
    }
    cfg.update(p)
    return cfg


def q35_tensors(cfg):
    """[(file index, name, shape, init)] in Qwen3_5TextForSequenceClassification's names;
    init: ("normal", std) | ("zeros",) | ("ones",) | ("alog",)"""
    H, I, V = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    nh, nkv, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    nk, nv = cfg["linear_num_key_heads"], cfg["linear_num_value_heads"]
    dk, dv = cfg["linear_key_head_dim"], cfg["linear_value_head_dim"]
    K = cfg["linear_conv_kernel_dim"]
    std = cfg["initializer_range"]
    conv = 2 * nk * dk + nv * dv
    t = [(0, "model.embed_tokens.weight", (V, H), ("normal", std))]
    for l, kind in enumerate(cfg["layer_types"]):
        p, f = f"model.layers.{l}.", l + 1
        # Qwen3_5RMSNorm scales by (1 + weight): zeros are the identity
        t.append((f, p + "input_layernorm.weight", (H,), ("zeros",)))
        t.append((f, p + "post_attention_layernorm.weight", (H,), ("zeros",)))
        if kind == "linear_attention":
            a = p + "linear_attn."
            t += [(f, a + "in_proj_qkv.weight", (conv, H), ("normal", std)),
                  (f, a + "in_proj_z.weight", (nv * dv, H), ("normal", std)),
                  (f, a + "in_proj_b.weight", (nv, H), ("normal", std)),
                  (f, a + "in_proj_a.weight", (nv, H), ("normal", std)),
                  # depthwise Conv1d (C, 1, K); nn.Conv1d's own init has std ~ 1/sqrt(3K)
                  (f, a + "conv1d.weight", (conv, 1, K), ("normal", 1 / math.sqrt(3 * K))),
                  (f, a + "dt_bias", (nv,), ("ones",)),
                  (f, a + "A_log", (nv,), ("alog",)),
                  # Qwen3_5RMSNormGated multiplies by weight itself
                  (f, a + "norm.weight", (dv,), ("ones",)),
                  (f, a + "out_proj.weight", (H, nv * dv), ("normal", std))]
        elif kind == "full_attention":
            a = p + "self_attn."
            t += [(f, a + "q_proj.weight", (2 * nh * hd, H), ("normal", std)),   # query + gate
                  (f, a + "k_proj.weight", (nkv * hd, H), ("normal", std)),
                  (f, a + "v_proj.weight", (nkv * hd, H), ("normal", std)),
                  (f, a + "o_proj.weight", (H, nh * hd), ("normal", std)),
                  (f, a + "q_norm.weight", (hd,), ("zeros",)),
                  (f, a + "k_norm.weight", (hd,), ("zeros",))]
        else:
            raise SystemExit(f"layer_types[{l}] = {kind!r}")
        t += [(f, p + "mlp.gate_proj.weight", (I, H), ("normal", std)),
              (f, p + "mlp.up_proj.weight", (I, H), ("normal", std)),
              (f, p + "mlp.down_proj.weight", (H, I), ("normal", std))]
    last = len(cfg["layer_types"]) + 1
    t.append((last, "model.norm.weight", (H,), ("zeros",)))
    t.append((last, "score.weight", (len(cfg["id2label"]), H), ("normal", std)))
    return t


def numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def write_safetensors(path, items):
    """items: [(name, shape, raw little-endian bf16 bytes-like)], written in that order"""
    header, off = {"__metadata__": {"format": "pt"}}, 0
    for name, shape, raw in items:
        n = len(raw)
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [off, off + n]}
        off += n
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for _, _, raw in items:
            f.write(raw)


class PythonDraw:
    """pure-Python bf16 draws (no torch, no numpy): for small models only"""
    name = "pure python"

    def __init__(self, seed):
        self.r = random.Random(seed)

    def bf16(self, values):
        out = bytearray(2 * len(values))
        for i, v in enumerate(values):
            b = struct.unpack("<I", struct.pack("<f", v))[0]
            b = (b + 0x7FFF + ((b >> 16) & 1)) >> 16       # round to nearest even
            out[2 * i] = b & 0xFF
            out[2 * i + 1] = (b >> 8) & 0xFF
        return bytes(out)

    def draw(self, shape, init):
        n = numel(shape)
        if init[0] == "normal":
            vals = [self.r.gauss(0.0, init[1]) for _ in range(n)]
        elif init[0] == "zeros":
            vals = [0.0] * n
        elif init[0] == "ones":
            vals = [1.0] * n
        else:   # A_log = log(A), A uniform in [1, 16] (transformers draws it from [0.01, 16])
            vals = [math.log(self.r.uniform(1.0, 16.0)) for _ in range(n)]
        return self.bf16(vals)

    def write(self, path, items):
        write_safetensors(path, items)

    @staticmethod
    def nbytes(raw):
        return len(raw)


class TorchDraw:
    """torch draws, on the GPU when there is one; files written by safetensors.torch"""

    def __init__(self, seed, torch):
        from safetensors.torch import save_file
        self.torch, self.save_file = torch, save_file
        self.dev = "cuda" if torch.cuda.is_available() else "cpu"
        self.name = f"torch {torch.__version__} on {self.dev}"
        self.g = torch.Generator(device=self.dev).manual_seed(seed)

    def draw(self, shape, init):
        torch = self.torch
        if init[0] == "normal":
            x = torch.randn(*shape, generator=self.g, device=self.dev).mul_(init[1])
        elif init[0] == "zeros":
            x = torch.zeros(*shape, device=self.dev)
        elif init[0] == "ones":
            x = torch.ones(*shape, device=self.dev)
        else:
            x = torch.empty(*shape, device=self.dev).uniform_(1.0, 16.0, generator=self.g).log_()
        return x.to(torch.bfloat16).contiguous().cpu()

    def write(self, path, items):
        self.save_file({name: x for name, _, x in items}, path, metadata={"format": "pt"})

    @staticmethod
    def nbytes(x):
        return x.numel() * x.element_size()


def cmd_model(a):
    cfg = q35_config(PRESETS[a.preset])
    tensors = q35_tensors(cfg)
    total = sum(numel(s) for _, _, s, _ in tensors)
    drawer = None
    if a.writer in ("auto", "torch"):
        try:
            import torch
            drawer = TorchDraw(a.seed, torch)
        except ImportError:
            if a.writer == "torch":
                raise SystemExit("--writer torch: torch is not importable")
    if drawer is None:
        if total > 50_000_000:
            raise SystemExit(f"{total:,} parameters: too many to draw in pure Python; this needs "
                             "torch (the GPU machine has it)")
        drawer = PythonDraw(a.seed)
    os.makedirs(a.dir, exist_ok=True)
    say(f"writing {a.preset} Qwen3.5 model ({total:,} parameters, bf16) to {a.dir} with "
        f"{drawer.name}")
    n_files = tensors[-1][0] + 1
    weight_map, nbytes = {}, 0
    for k in range(n_files):
        name = f"model-{k + 1:05d}-of-{n_files:05d}.safetensors"
        items = [(tn, shape, drawer.draw(shape, init)) for f, tn, shape, init in tensors if f == k]
        drawer.write(os.path.join(a.dir, name), items)
        for tn, _, raw in items:
            weight_map[tn] = name
            nbytes += drawer.nbytes(raw)
        if k % 8 == 0 or k == n_files - 1:
            say(f"file {k + 1}/{n_files} written")
    with open(os.path.join(a.dir, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": nbytes}, "weight_map": weight_map}, f, indent=1)
    with open(os.path.join(a.dir, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    print(json.dumps({"dir": a.dir, "parameters": total, "bytes": nbytes, "writer": drawer.name}))


def cmd_data(a):
    with open(a.config) as f:
        V = json.load(f)["vocab_size"]
    r = random.Random(a.seed)
    with open(a.file, "w") as f:
        for _ in range(a.records):
            f.write(json.dumps({"input_ids": [r.randrange(3, V) for _ in range(a.seq)],
                                "label": round(r.random(), 3)}) + "\n")
    say(f"{a.records} records of {a.seq} random tokens in [3, {V}) -> {a.file}")


# ---- FLOPs ------------------------------------------------------------------------------------

def layer_kinds(c):
    L = c["num_hidden_layers"]
    if c["model_type"] in ("qwen3", "qwen3_moe"):
        return ["qwen3"] * L
    lt = c.get("layer_types")
    if lt:
        return list(lt)
    iv = c.get("full_attention_interval", 4)
    return ["full_attention" if (l + 1) % iv == 0 else "linear_attention" for l in range(L)]


def matmul_params_config(c):
    """the matrix-multiply parameters of the layers (per token), from config.json alone: what
    src/model.c sl_model_matmul_params counts from the layout, less the embedding and the head"""
    if c["model_type"] not in ("qwen3", "qwen3_5_text"):
        raise SystemExit(f"model_type {c['model_type']}: this benchmark counts qwen3 and "
                         "qwen3_5_text")
    H, I = c["hidden_size"], c["intermediate_size"]
    nh = c["num_attention_heads"]
    nkv = c.get("num_key_value_heads", nh)
    hd = c.get("head_dim") or H // nh
    p = 0
    for kind in layer_kinds(c):
        if kind == "qwen3":
            p += H * nh * hd + 2 * H * nkv * hd + nh * hd * H
        elif kind == "full_attention":      # q_proj carries the output gate: 2 x
            p += 2 * nh * hd * H + 2 * H * nkv * hd + nh * hd * H
        else:
            nk, nv = c.get("linear_num_key_heads", 16), c.get("linear_num_value_heads", 32)
            dk, dv = c.get("linear_key_head_dim", 128), c.get("linear_value_head_dim", 128)
            p += (2 * nk * dk + nv * dv) * H + nv * dv * H + 2 * nv * H + H * nv * dv
        p += 3 * H * I
    return p


def mixer_flops(c, n):
    """src/model_qwen35.c sl_model_mixer_flops for one record of n tokens"""
    nh = c["num_attention_heads"]
    hd = c.get("head_dim") or c["hidden_size"] // nh
    f = 0.0
    for kind in layer_kinds(c):
        if kind == "linear_attention":
            f += 3 * 3 * 2.0 * c.get("linear_key_head_dim", 128) * \
                c.get("linear_value_head_dim", 128) * c.get("linear_num_value_heads", 32) * n
        else:
            f += 3 * 4.0 * hd * nh * n * (n + 1) / 2
    return f


def safetensors_headers(d):
    out = {}
    for fn in sorted(os.listdir(d)):
        if fn.endswith(".safetensors"):
            with open(os.path.join(d, fn), "rb") as f:
                n = struct.unpack("<Q", f.read(8))[0]
                h = json.loads(f.read(n))
            h.pop("__metadata__", None)
            out.update(h)
    return out


def cmd_flops(a):
    with open(os.path.join(a.dir, "config.json")) as f:
        c = json.load(f)
    p = matmul_params_config(c)
    # the independent count: every 2-D tensor of the layers in the files (Conv1d weights are 3-D)
    hdr = safetensors_headers(a.dir)
    p_files = sum(numel(v["shape"]) for k, v in hdr.items()
                  if k.startswith("model.layers.") and len(v["shape"]) == 2)
    if p_files != p:
        raise SystemExit(f"{a.dir}: the layers' matrices hold {p_files:,} parameters, the formula "
                         f"from config.json says {p:,}: the FLOP count would be wrong")
    labels = c.get("num_labels") or len(c.get("id2label") or {0: 0})
    head = labels * c["hidden_size"]
    B, n = a.batch, a.seq
    step = B * (6.0 * p * n + mixer_flops(c, n)) + 6.0 * head * B
    res = {"model_type": c["model_type"], "matmul_params": p, "head_params": head,
           "mixer_flops_per_record": mixer_flops(c, n), "batch": B, "seq": n,
           "flops_per_step": step, "flops_per_token": step / (B * n)}
    say(f"{a.dir}: {p:,} matrix parameters in the layers (config = files), FLOPs/token "
        f"{res['flops_per_token']:.5g} ({6 * p:.5g} matmul, {mixer_flops(c, n) / n:.5g} token "
        f"mixers at {n} tokens)")
    print(json.dumps(res))


# ---- result rows ------------------------------------------------------------------------------

def load_flops(path):
    with open(path) as f:
        return json.load(f)


def cmd_shardlm_row(a):
    fl = load_flops(a.flops)
    row = {"run": a.name, "impl": "shardlm", "batch": fl["batch"], "seq": fl["seq"],
           "flops_per_token": fl["flops_per_token"]}
    mpath = os.path.join(a.run, "training_metrics.json")
    steps = []
    if os.path.exists(mpath):
        with open(mpath) as f:
            steps = [s for s in json.load(f).get("steps", []) if s.get("time_s")]
    if not steps or (a.rc != 0 and len(steps) <= a.warmup):
        why = f"timed out after {a.timeout} s" if a.rc in (124, 137) else f"exit {a.rc}"
        row["status"] = f"failed ({why}, {len(steps)} steps; see {os.path.basename(a.log)})"
        print(json.dumps(row))
        return
    timed = steps[a.warmup:] or steps
    t = statistics.median(s["time_s"] for s in timed)
    tok = statistics.median(s["tokens"] for s in timed)
    row.update(status="ok", steps_timed=len(timed), s_per_step=t, tokens_per_s=tok / t,
               mfu=fl["flops_per_token"] * tok / t / PEAK_FLOPS,
               peak_gb=max(s.get("peak_gpu_bytes", 0) for s in steps) / 1e9,
               loss_last=steps[-1].get("loss"))
    if a.rc != 0:
        why = f"the {a.timeout} s timeout" if a.rc in (124, 137) else f"exit {a.rc}"
        row["status"] = f"ok, {len(steps)} of {a.steps} steps before {why}"
    if tok != fl["batch"] * fl["seq"]:
        row["status"] = f"ok, but {tok} tokens a step, not {fl['batch']} x {fl['seq']}"
    # the MFU shardlm printed itself (cuda backend only): the same FLOP count or not
    logged = []
    with open(a.log, errors="replace") as f:
        for line in f:
            m = re.search(r"step (\d+)/\d+ .* mfu ([0-9.]+)%", line)
            if m and int(m.group(1)) > a.warmup:
                logged.append(float(m.group(2)) / 100)
    if logged:
        row["mfu_logged"] = statistics.median(logged)
    print(json.dumps(row))


def cmd_peer_row(a):
    fl = load_flops(a.flops)
    row = {"run": a.name, "impl": "fsdp2", "batch": a.batch or fl["batch"], "seq": fl["seq"],
           "flops_per_token": fl["flops_per_token"]}
    if a.skip:
        row["status"] = f"skipped ({a.skip})"
        print(json.dumps(row))
        return
    res, kern, text = None, None, ""
    if os.path.exists(a.log):
        with open(a.log, errors="replace") as f:
            text = f.read()
        for line in text.splitlines():
            if line.startswith("RESULT "):
                res = json.loads(line[7:])      # the last one counts
            elif line.startswith("KERNELS "):
                kern = json.loads(line[8:])
    if kern:
        row["gdn_kernels"] = kern.get("verdict")
    if res:
        row.update(res)
        row["run"] = a.name
    timed_out = a.rc in (124, 137)
    if res and res.get("status") == "ok":
        row["mfu"] = fl["flops_per_token"] * res["tokens_per_s"] / PEAK_FLOPS
        notes = []
        if res["steps_done"] < res["steps"]:
            notes.append(f"{res['steps_done']} of {res['steps']} steps" +
                         (f" before the {a.timeout} s timeout" if timed_out else ""))
        if res.get("warmup_only"):
            notes.append("no step after the warm-up: the median includes it")
        if a.rc and not timed_out:
            notes.append(f"exit {a.rc}")
        if notes:
            row["status"] = "ok, " + "; ".join(notes)
    elif res and res.get("status") == "oom":
        row["status"] = f"out of GPU memory ({res.get('where', '?')})"
    elif timed_out:
        row["status"] = f"timed out after {a.timeout} s, no step done"
    elif "OutOfMemoryError" in text or "CUDA out of memory" in text:
        row["status"] = "out of GPU memory"
    else:
        row["status"] = f"failed (exit {a.rc}; see {os.path.basename(a.log)})"
    print(json.dumps(row))


# ---- table ------------------------------------------------------------------------------------

def pct(x):
    return f"{100 * x:.1f}%" if x >= 1e-3 else f"{100 * x:.2g}%"


def cmd_table(a):
    with open(a.results) as f:
        rows = [json.loads(l) for l in f if l.strip()]
    out = ["| run | batch x seq | s/step | tokens/s | MFU | peak GB | GFLOPs/token | status |",
           "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ok = r.get("status") == "ok" or str(r.get("status", "")).startswith("ok,")
        num = (lambda k, f: f.format(r[k]) if ok and r.get(k) is not None else "-")
        mfu = pct(r["mfu"]) if ok and r.get("mfu") is not None else "-"
        if ok and r.get("mfu_logged") is not None:
            mfu += f" (log {pct(r['mfu_logged'])})"
        gf = r["flops_per_token"] / 1e9
        out.append(f"| {r['run']} | {r.get('batch', '-')} x {r.get('seq', '-')} | "
                   f"{num('s_per_step', '{:.3f}')} | {num('tokens_per_s', '{:,.0f}')} | {mfu} | "
                   f"{num('peak_gb', '{:.1f}')} | {f'{gf:.3f}' if gf >= 0.1 else f'{gf:.3g}'} | "
                   f"{r.get('status', '?')} |")

    def get(name):
        r = next((r for r in rows if r["run"] == name), None)
        return r if r and str(r.get("status", "")).startswith("ok") else None

    q, d = get("shardlm q35"), get("shardlm dense")
    peers = [r for r in rows if r.get("impl") == "fsdp2"]
    out.append("")
    peer = next((r for r in peers if str(r.get("status", "")).startswith("ok")), None)
    if q and peer:
        same = peer.get("batch") == q.get("batch")
        x = q["tokens_per_s"] / peer["tokens_per_s"]
        out.append(f"- shardlm q35 / FSDP2 q35 tokens/s: {x:.2f}x"
                   + ("" if same else f" (FSDP2 at batch {peer.get('batch')}, shardlm at "
                                      f"{q.get('batch')})"))
    else:
        if not q:
            why = "no shardlm q35 result"
        elif peers:
            why = "no FSDP2 result: " + "; ".join(f"{r['run']}: {r.get('status')}" for r in peers)
        else:
            why = "FSDP2 not run"
        out.append(f"- shardlm q35 / FSDP2 q35 tokens/s: - ({why})")
    if q and d:
        ratio = q["mfu"] / d["mfu"]
        out.append(f"- shardlm q35 MFU / shardlm dense Qwen3 MFU: {ratio:.2f} (target >= 0.80: "
                   f"{'met' if ratio >= 0.8 else 'NOT met'})")
    else:
        dense_ran = any(r["run"] == "shardlm dense" for r in rows)
        why = ("no shardlm q35 result" if not q else
               "the dense run failed" if dense_ran else "the dense model was not run")
        out.append(f"- shardlm q35 MFU / shardlm dense Qwen3 MFU: - ({why})")
    kern = next((r.get("gdn_kernels") for r in peers if r.get("gdn_kernels")), None)
    ver = next((r for r in peers if r.get("transformers")), {})
    if kern or ver:
        out.append(f"- FSDP2 peer: transformers {ver.get('transformers', '?')}, torch "
                   f"{ver.get('torch', '?')}, {ver.get('model_class', '?')}; Gated DeltaNet "
                   f"kernels: {kern or '?'}")
    print("\n".join(out))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("model")
    s.add_argument("dir")
    s.add_argument("--preset", choices=sorted(PRESETS), default="4b")
    s.add_argument("--seed", type=int, default=1)
    s.add_argument("--writer", choices=("auto", "torch", "python"), default="auto")
    s = sub.add_parser("data")
    s.add_argument("file")
    s.add_argument("--config", required=True)
    s.add_argument("--records", type=int, default=64)
    s.add_argument("--seq", type=int, default=2048)
    s.add_argument("--seed", type=int, default=7)
    s = sub.add_parser("flops")
    s.add_argument("dir")
    s.add_argument("--batch", type=int, required=True)
    s.add_argument("--seq", type=int, required=True)
    s = sub.add_parser("shardlm-row")
    for k in ("--name", "--run", "--log", "--flops"):
        s.add_argument(k, required=True)
    s.add_argument("--rc", type=int, required=True)
    s.add_argument("--warmup", type=int, default=2)
    s.add_argument("--steps", type=int, default=0, help="the steps asked for")
    s.add_argument("--timeout", type=int, default=0)
    s = sub.add_parser("peer-row")
    s.add_argument("--name", required=True)
    s.add_argument("--flops", required=True)
    s.add_argument("--log", default="")
    s.add_argument("--rc", type=int, default=0)
    s.add_argument("--timeout", type=int, default=0)
    s.add_argument("--skip", help="the peer was not run, for this reason")
    s.add_argument("--batch", type=int, default=0, help="the batch asked for")
    s = sub.add_parser("table")
    s.add_argument("results")
    a = ap.parse_args()
    {"model": cmd_model, "data": cmd_data, "flops": cmd_flops, "shardlm-row": cmd_shardlm_row,
     "peer-row": cmd_peer_row, "table": cmd_table}[a.cmd](a)


if __name__ == "__main__":
    main()
