#!/usr/bin/env python3
"""Writes the demo's pre-tokenized records (conf/demo/train.jsonl, valid.jsonl).

A learnable soft-label task for the tiny demo model (vocab 512): each record draws its tokens
from the "low" half [3, 256) with a record-specific probability q, and its label is the fraction
of low tokens it actually holds, so the model has to count over the record.  Deterministic.
    python3 conf/demo/make_demo_data.py conf/demo
"""
import json
import random
import sys

out = sys.argv[1] if len(sys.argv) > 1 else "."
rng = random.Random(2026)


def record():
    n = rng.randint(8, 48)
    q = rng.choice([0.1, 0.25, 0.5, 0.75, 0.9])
    ids = [rng.randrange(3, 256) if rng.random() < q else rng.randrange(256, 512) for _ in range(n)]
    low = sum(1 for t in ids if t < 256)
    return {"input_ids": ids, "label": round(low / n, 4)}


for name, n in (("train", 480), ("valid", 64)):
    with open(f"{out}/{name}.jsonl", "w") as f:
        for _ in range(n):
            f.write(json.dumps(record(), separators=(",", ":")) + "\n")
