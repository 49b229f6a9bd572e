#!/usr/bin/env python3
# Writes the damaged and hostile inputs of test/bad/ and their table EXPECT (KIND, FILE, the
# error text test_bad.sh asserts, an extended regex).  Kinds, i.e. what test_bad.sh runs:
#   yaml       shardlm config FILE
#   jsonl      shardlm train on the test model with data.train FILE
#   configjson shardlm train with a model dir whose config.json is FILE
#   st         shardlm train with a model dir whose model.safetensors is FILE
#   tokenizer  shardlm tokenize --tokenizer FILE
# The HDF5 checkpoint cases are made at test time from a fresh checkpoint (test_bad.sh), since
# they need one written by this build; they are listed in EXPECT as kind ckpt.
# usage: make-bad.py [DIR]   (default: this script's folder)
import json
import os
import struct
import sys

out = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
cases = []


def case(kind, name, data, expect):
    if data is not None:
        if isinstance(data, str):
            data = data.encode()
        with open(os.path.join(out, name), "wb") as f:
            f.write(data)
    cases.append((kind, name, expect))


# ---- YAML configs
case("yaml", "alias.yaml", "base: &b {lr: 1.0e-5}\noptim: *b\n", "anchors and aliases .* are not supported")
lol = "a: &a [x, x, x, x, x, x, x, x, x]\n"
for i, n in enumerate("bcdefghi"):
    prev = "abcdefghi"[i]
    lol += "%s: &%s [*%s, *%s, *%s, *%s, *%s, *%s, *%s, *%s, *%s]\n" % ((n, n) + (prev,) * 9)
case("yaml", "billion-laughs.yaml", lol, "anchors and aliases .* are not supported")
case("yaml", "unclosed-flow.yaml", "model: {path: /x\ntrain: {batch: 2}\n", "YAML syntax error")
case("yaml", "tab-indent.yaml", "train:\n\tbatch: 2\n", "YAML syntax error")
case("yaml", "unknown-key.yaml", "train: {bacth: 2}\n", "train.bacth: unknown key; did you mean .train.batch.?")
case("yaml", "bad-int.yaml", "train: {batch: many}\n", "train.batch: expected an integer")
case("yaml", "huge-int.yaml", "train: {batch: 99999999999999999999999}\n", "train.batch: 9+ does not fit in a 32-bit integer")
case("yaml", "two-docs.yaml", "train: {batch: 2}\n---\ntrain: {batch: 3}\n", "a second YAML document")
case("yaml", "include-self.yaml", "include: [include-self.yaml]\n", "include: include cycle: .*include-self.yaml -> .*include-self.yaml")
case("yaml", "include-missing.yaml", "include: [no-such-file.yaml]\n", "include: cannot open '.*/no-such-file.yaml'")
case("yaml", "scalar-top.yaml", "just a string\n", "expected a mapping of sections")
case("yaml", "binary.yaml", bytes(range(256)) * 4, "YAML syntax error: control characters are not allowed")
case("yaml", "deep-nesting.yaml", "train: {batch: " + "[" * 20000 + "]" * 20000 + "}\n",
     "train.batch: expected an integer")
case("yaml", "nul-byte.yaml", b"train: {batch: 2\x00}\n", "YAML syntax error: control characters are not allowed")

# ---- JSONL records (the test model: vocabulary 61)
case("jsonl", "not-json.jsonl", '{"input_ids": [1, 2], "label": 0.5}\n{input_ids: [1]}\n', ":2: invalid JSON")
case("jsonl", "array-record.jsonl", "[1, 2, 3]\n", ":1: a record must be a JSON object")
case("jsonl", "id-past-vocab.jsonl", '{"input_ids": [1, 61], "label": 0.5}\n', ":1: \"input_ids\"\\[1\\] = 61 is outside the vocabulary \\[0, 61\\)")
case("jsonl", "negative-id.jsonl", '{"input_ids": [1, -4], "label": 0.5}\n', ":1: \"input_ids\"\\[1\\] = -4 is negative")
case("jsonl", "label-range.jsonl", '{"input_ids": [1, 2], "label": 5}\n', ":1: label 5 .* outside \\[0,1\\]")
case("jsonl", "label-string.jsonl", '{"input_ids": [1, 2], "label": "high"}\n', ":1: label in field .label. is a string, not a number in \\[0,1\\]")
case("jsonl", "duplicate-key.jsonl", '{"input_ids": [1, 2], "label": 0.5, "label": 0.1}\n', ":1: invalid JSON at column 43: duplicate object key")
case("jsonl", "deep-nesting.jsonl", '{"input_ids": [1], "label": 0.5, "x": ' + "[" * 100000 + "]" * 100000 + "}\n", ":1: invalid JSON at column [0-9]+: maximum parsing depth reached")
case("jsonl", "invalid-utf8.jsonl", b'{"input_ids": [1], "label": 0.5, "note": "\xff\xfe"}\n', ":1: invalid JSON .*unable to decode byte 0xff")
case("jsonl", "nul-byte.jsonl", b'{"input_ids": [1, 2], "label": 0.5}\x00\n', ":1: invalid JSON at column 36")
case("jsonl", "ids-not-ints.jsonl", '{"input_ids": [1, "two"], "label": 0.5}\n', ":1: \"input_ids\"\\[1\\] is a string, not an integer token id")
case("jsonl", "huge-number.jsonl", '{"input_ids": [1, 1e400], "label": 0.5}\n', ":1: invalid JSON .*real number overflow")
case("jsonl", "empty.jsonl", "", "empty.jsonl: no records \\(the file is empty\\)")
case("jsonl", "blank-lines.jsonl", "\n\n   \n\t\n", "blank-lines.jsonl: no records")
case("jsonl", "no-ids-no-text.jsonl", '{"label": 0.5}\n', ":1: record has neither \"input_ids\" nor text")

# ---- config.json (next to the test model's weights)
good = {"architectures": ["Qwen3ForSequenceClassification"], "model_type": "qwen3", "vocab_size": 61,
        "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
        "max_position_embeddings": 4096, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
        "tie_word_embeddings": False, "num_labels": 1, "pad_token_id": 0, "bos_token_id": 60,
        "eos_token_id": 60}


def cj(name, expect, **change):
    d = dict(good)
    for k, v in change.items():
        if v is None:
            d.pop(k, None)
        else:
            d[k] = v
    case("configjson", name, json.dumps(d, indent=1), expect)


case("configjson", "cfg-not-json.json", '{"model_type": "qwen3",', "config.json:1:23: config.json is not valid JSON")
case("configjson", "cfg-array.json", "[]", "config.json must be a JSON object")
cj("cfg-no-model-type.json", "required key model_type is missing", model_type=None)
cj("cfg-unknown-type.json", "model_type .bert. is not supported", model_type="bert")
cj("cfg-negative-hidden.json", "key hidden_size must be positive \\(is -64\\)", hidden_size=-64)
cj("cfg-huge-sizes.json", "more than any model shardlm can train", hidden_size=2147483646,
   vocab_size=2147483647, intermediate_size=2147483647)
cj("cfg-kv-heads.json", "must be a multiple of num_key_value_heads", num_key_value_heads=3)
cj("cfg-odd-head-dim.json", "head_dim \\(15\\) must be even", head_dim=15)
cj("cfg-float-layers.json", "key num_hidden_layers must be an integer", num_hidden_layers=2.5)
cj("cfg-wrong-shapes.json", "model.embed_tokens.weight has shape \\[61, 64\\], config.json says \\[61, 32\\]",
   hidden_size=32)

# ---- safetensors (next to the good config.json)


def st(tensors, meta=True):
    hdr, data = {}, b""
    for name, (dt, shape, off, raw) in tensors.items():
        if off is None:
            off = [len(data), len(data) + len(raw)]
        hdr[name] = {"dtype": dt, "shape": shape, "data_offsets": off}
        data += raw
    if meta:
        hdr["__metadata__"] = {"format": "pt"}
    h = json.dumps(hdr).encode()
    return struct.pack("<Q", len(h)) + h + data


emb = ("F32", [61, 64], None, b"\0" * 61 * 64 * 4)
case("st", "st-empty.safetensors", b"", "file is 0 bytes, shorter than the 8-byte header length")
case("st", "st-short.safetensors", b"\x10\0\0", "file is 3 bytes, shorter than the 8-byte header length")
case("st", "st-header-huge.safetensors", struct.pack("<Q", 1 << 62) + b"{}", "header length 4611686018427387904 is absurd")
case("st", "st-header-past-eof.safetensors", struct.pack("<Q", 4096) + b'{"a": 1}', "header length 4096 goes beyond the end of the file")
case("st", "st-header-not-json.safetensors", struct.pack("<Q", 8) + b"not json", "header is not valid JSON")
case("st", "st-offsets-past-end.safetensors",
     st({"model.embed_tokens.weight": ("F32", [61, 64], [0, 61 * 64 * 4 + 8], b"\0" * 61 * 64 * 4)}),
     "data_offsets \\[0, 15624\\] go beyond the data \\(15616 bytes\\)")
case("st", "st-offsets-reversed.safetensors",
     st({"model.embed_tokens.weight": ("F32", [1, 1], [8, 4], b"\0" * 8)}), "end before they begin")
case("st", "st-size-mismatch.safetensors",
     st({"model.embed_tokens.weight": ("F32", [61, 64], None, b"\0" * 100)}), "hold 100 bytes, but shape")
case("st", "st-shape-overflow.safetensors",
     st({"model.embed_tokens.weight": ("F32", [1 << 40, 1 << 40], None, b"")}), "shape overflows")
case("st", "st-overlap.safetensors",
     st({"a": ("F32", [2], [0, 8], b""), "b": ("F32", [2], [4, 12], b"\0" * 12)}), "tensors a \\[0, 8\\] and b \\[4, 12\\] overlap")
case("st", "st-missing-tensors.safetensors", st({"model.embed_tokens.weight": emb}),
     "is missing from the checkpoint \\(and [0-9]+ more\\)")
case("st", "st-wrong-shape.safetensors",
     st({"model.embed_tokens.weight": ("F32", [64, 61], None, b"\0" * 61 * 64 * 4)}),
     "has shape \\[64, 61\\], config.json says \\[61, 64\\]")
case("st", "st-unknown-dtype.safetensors",
     st({"model.embed_tokens.weight": ("Q4", [61, 64], None, b"\0" * 61 * 32)}), "has dtype Q4; shardlm reads F32, BF16 and F16")

# ---- tokenizer.json
bl = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": True}


def tok(name, expect, model=None, **extra):
    d = {"version": "1.0", "added_tokens": [], "normalizer": None, "pre_tokenizer": bl,
         "post_processor": None, "decoder": bl,
         "model": model if model is not None else
         {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": [["a", "b"]]}}
    d.update(extra)
    case("tokenizer", name, json.dumps(d), expect)


case("tokenizer", "tok-not-json.json", '{"model": {"type": "BPE"', ":1:24: the tokenizer is not valid JSON")
case("tokenizer", "tok-empty.json", "", "tok-empty.json:1:0: the tokenizer is not valid JSON")
tok("tok-no-model.json", 'model needs a "vocab" object and a "merges" array', model={})
tok("tok-wordpiece.json", "model type \"WordPiece\" is not supported", model={"type": "WordPiece", "vocab": {"a": 0}})
tok("tok-huge-id.json", "needs an integer id in \\[0, 16777215\\]",
    model={"type": "BPE", "vocab": {"a": 2147483647}, "merges": []})
tok("tok-added-huge-id.json", "id in \\[0, 16777215\\]",
    added_tokens=[{"id": 2147483647, "content": "<x>", "special": True}])
tok("tok-bad-regex.json", "regex /\\(unclosed/ does not compile",
    pre_tokenizer={"type": "Split", "pattern": {"Regex": "(unclosed"}, "behavior": "Isolated",
                   "invert": False})
tok("tok-merge-unknown.json", 'merges\\[0\\] names token "zz", which is not in the vocab',
    model={"type": "BPE", "vocab": {"a": 0, "b": 1}, "merges": [["a", "zz"]]})
case("tokenizer", "tok-deep.json", "[" * 100000 + "]" * 100000, "the tokenizer is not valid JSON: maximum parsing depth reached")

with open(os.path.join(out, "EXPECT"), "w") as f:
    f.write("# KIND\tFILE\tERROR TEXT (grep -E), written by make-bad.py; see test_bad.sh\n")
    for kind, name, expect in cases:
        f.write("%s\t%s\t%s\n" % (kind, name, expect))
    for name, expect in [
            ("ckpt-truncated-rank", "rank-00000.h5: (cannot be opened as HDF5|.* cannot be read)"),
            ("ckpt-missing-rank", "rank-00000.h5: missing \\(index.h5 lists it\\)"),
            ("ckpt-empty-index", "index.h5: cannot be opened as HDF5"),
            ("ckpt-garbage-rank", "rank-00000.h5: cannot be opened as HDF5"),
            ("ckpt-flipped-bytes", "rank-00000.h5: /master/unit-0001 checksum mismatch"),
            ("ckpt-swapped-ranks", "is step 2, shard 1 of 2.*expects step 2, shard 0 of 2.*belongs to another checkpoint"),
            ("ckpt-other-step", "is step 1, shard 0 of 1.*expects step 2.*belongs to another checkpoint"),
            ("ckpt-other-model", "index.h5: unit 0: [0-9]+ elements in 1 shards of [0-9]+, the model has [0-9]+"),
            ("ckpt-bigger-rank-file", "rank-00000.h5: /master/unit-0000 has [0-9]+ elements, index.h5 says [0-9]+")]:
        f.write("ckpt\t%s\t%s\n" % (name, expect))
