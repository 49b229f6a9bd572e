#!/usr/bin/env python3
# Cuts the real Qwen3 tokenizer.json (tools/fetch-tokenizer qwen3) down to its first 4000 vocabulary
# entries and the merges among them, added tokens renumbered after them: a small tokenizer for
# fuzz_bpe with Qwen3's normalizer, pre-tokenizer regex and byte-level alphabet.
# usage: make-bpe-tokenizer.py QWEN3_TOKENIZER_JSON OUT_JSON
import json
import sys

N = 4000
t = json.load(open(sys.argv[1], encoding="utf-8"))
vocab = {k: v for k, v in t["model"]["vocab"].items() if v < N}
merges = []
for m in t["model"]["merges"]:
    a, b = m if isinstance(m, list) else m.split(" ", 1)
    if a in vocab and b in vocab and a + b in vocab:
        merges.append([a, b])
t["model"]["vocab"] = vocab
t["model"]["merges"] = merges
for i, a in enumerate(t["added_tokens"]):
    a["id"] = N + i
t.pop("post_processor", None)
json.dump(t, open(sys.argv[2], "w", encoding="utf-8"), ensure_ascii=False)
