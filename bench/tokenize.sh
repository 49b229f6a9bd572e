#!/bin/sh
# bench/tokenize.sh TOKENIZER_JSON [N_DOCS]: tokens/s of `shardlm tokenize` against Hugging Face
# tokenizers (Python), both on one CPU core, on the same N_DOCS (default 2000) synthetic filings
# (tools/gen-filings.py --seed 5).  HF: TOKENIZERS_PARALLELISM=false, one encode() per document,
# no encode_batch; the timed loop excludes loading.  shardlm: the whole command (JSONL parsing
# and output included, loading not: `shardlm tokenize --stats`).  Best of 3 each.
# Needs python3 with `tokenizers`, and shardlm on PATH (or SHARDLM=path).
set -eu
tok=${1:?usage: bench/tokenize.sh TOKENIZER_JSON [N_DOCS]}
n=${2:-2000}
shardlm=${SHARDLM:-shardlm}
here=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d "${TMPDIR:-/tmp}/bench-tok.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
pin=""
command -v taskset >/dev/null 2>&1 && pin="taskset -c 0"
export TOKENIZERS_PARALLELISM=false RAYON_NUM_THREADS=1 OMP_NUM_THREADS=1
python3 "$here/tools/gen-filings.py" --n "$n" --seed 5 >"$tmp/docs.jsonl"

$pin python3 - "$tok" "$tmp/docs.jsonl" >"$tmp/hf.txt" <<'PY'
import json, sys, time
from tokenizers import Tokenizer
t = Tokenizer.from_file(sys.argv[1])
docs = [json.loads(l)["text"] for l in open(sys.argv[2], encoding="utf-8")]
best, ntok = 1e9, 0
for _ in range(3):
    t0 = time.perf_counter()
    ntok = sum(len(t.encode(d, add_special_tokens=False).ids) for d in docs)
    best = min(best, time.perf_counter() - t0)
print(ntok, best)
PY

# best of 3; --stats times reading, JSON parsing, encoding and writing, not loading
best=0
for i in 1 2 3; do
	$pin "$shardlm" tokenize --stats --tokenizer "$tok" <"$tmp/docs.jsonl" >"$tmp/out.jsonl" \
		2>"$tmp/stats.txt"
	r=$(sed -n 's/.* \([0-9]*\) tokens\/s.*/\1/p' "$tmp/stats.txt")
	best=$(echo "$r $best" | awk '{print ($1 > $2 ? $1 : $2)}')
done
cat "$tmp/stats.txt" >&2
hf=$(cat "$tmp/hf.txt")
same=$(python3 - "$tok" "$tmp/docs.jsonl" "$tmp/out.jsonl" <<'PY'
import json, sys
from tokenizers import Tokenizer
t = Tokenizer.from_file(sys.argv[1])
docs = [json.loads(l)["text"] for l in open(sys.argv[2], encoding="utf-8")]
mine = [json.loads(l) for l in open(sys.argv[3])]
print("identical" if all(t.encode(d, add_special_tokens=False).ids == m
                         for d, m in zip(docs, mine)) and len(docs) == len(mine) else "DIFFERENT")
PY
)
echo "$hf $best $same $n $(date -u +%Y-%m-%d) $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')" |
awk '{printf "docs=%s tokens=%s ids_vs_hf=%s date=%s\n", $5, $1, $4, $6;
      printf "hf_tokenizers_1thread: %.0f tokens/s (%.3f s)\n", $1 / $2, $2;
      printf "shardlm_tokenize_1thread: %.0f tokens/s\n", $3;
      cpu = ""; for (i = 7; i <= NF; i++) cpu = cpu " " $i; printf "cpu:%s\n", cpu}'
