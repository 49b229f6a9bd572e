#!/bin/sh
# The exported model loads in Hugging Face transformers and scores as `shardlm score` does
# (run by check-gpu.sh where Python has transformers).  Trains the parity fixture's model 3 steps
# on 2 ranks (so the export is sharded over 2 safetensors files, bf16), scores the records with
# shardlm, then with transformers: each record alone and all of them in one padded batch.
set -u
: "${top_srcdir:=$(cd "$(dirname "$0")/.." && pwd)}"
SHARDLM=${SHARDLM:-${top_builddir:-$top_srcdir}/src/shardlm}
FIX="$top_srcdir/test/fixtures/hf"
T=$(mktemp -d /tmp/sl-export-XXXXXX)
cat >"$T/c.yaml" <<YAML
model: {path: $FIX/cls}
backend: cpu
data: {train: $FIX/records.jsonl, max_state: 64}
train: {batch: 1, accum: 2, steps: 3, eval_every: 0}
optim: {lr: 1.0e-3, warmup: 1}
checkpoint: {every: 0}
run: {dir: $T/run}
YAML
OMP_NUM_THREADS=1 ${MPIRUN:-mpirun} -np 2 --oversubscribe "$SHARDLM" train "$T/c.yaml" \
	>"$T/train.out" 2>&1 || { tail "$T/train.out"; exit 1; }
ls "$T/run/model"
"$SHARDLM" score "$T/c.yaml" --data "$FIX/records.jsonl" >"$T/scores.jsonl" || exit 1
python3 "$FIX/check_export.py" "$T/run/model" "$FIX/records.jsonl" "$T/scores.jsonl" || exit 1
rm -rf "$T"
