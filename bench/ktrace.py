#!/usr/bin/env python3
"""ktrace.py: a training step's GPU time from a bench/ktrace.c trace, as the step ran.

    python3 bench/ktrace.py TRACE.csv [--step-kernel REGEX] [--skip N] [--top N]

Steps start where the kernel that starts each step's forward runs (--step-kernel, default
k_embedding_fwd: one launch a micro-batch, so use it with accum 1).  Each whole step after the
first --skip (default 2: warm-up) is a window from its first kernel to the next step's; the last
step is left out (its window has no end).  Printed, as means over the windows: the step's wall
time, the time the GPU ran anything (the union of all records), its idle time, and by kind
(GEMM, attention, optimizer, communication, copies, the rest): the sum of the records'
durations (overlapping records each count) and the wall time at least one of them ran (their
union); by kernel: launches, the sum of their durations and the share of the step's wall time.
With --gaps N: the N largest sums of idle time by the pair of records around each idle
interval (the last to end before it, the first to start after it).

    python3 bench/ktrace.py TRACE.csv --runs REGEX

For a trace of anything else (e.g. `test_cuda_ops SEED --bench-only`, whose timings call each
op a few times in a row): the kernels whose mangled name (template arguments kept, so each
instance apart) matches REGEX, as runs of launches of one kernel less than 3 ms apart, in the
order they ran: launches and the median duration.
"""
import argparse
import re
import statistics
import sys
from collections import defaultdict

KINDS = [("gemm", re.compile(r"nvjet|gemm|cutlass|xmma|cublas", re.I)),
         ("attention", re.compile(r"^k_fa_|flash", re.I)),
         ("optimizer", re.compile(r"adamw|sumsq|grad_norm|clip", re.I)),
         ("communication", re.compile(r"nccl", re.I)),
         ("copies", re.compile(r"^(copy|memset)"))]


def short(name):
    """the function's own name from an Itanium-mangled one (templates and arguments dropped)"""
    if not name.startswith("_Z"):
        return name.split("(")[0]
    s = name[2:]
    nested = s.startswith("N")
    if nested:
        s = s[1:]
        while s[:1] in ("K", "V", "r"):
            s = s[1:]
    parts = []
    while True:
        m = re.match(r"(\d+)", s)
        if not m:
            break
        n = int(m.group(1))
        s = s[m.end():]
        parts.append(s[:n])
        s = s[n:]
        if not nested:
            break
        if s.startswith("I"):  # template arguments of this component: stop here
            break
    return "::".join(parts) if parts else name


def kind_of(name):
    for k, rx in KINDS:
        if rx.search(name):
            return k
    return "rest"


def union_ns(iv):
    tot, cur_s, cur_e = 0, None, None
    for s, e in sorted(iv):
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                tot += cur_e - cur_s
            cur_s, cur_e = s, e
        elif e > cur_e:
            cur_e = e
    if cur_e is not None:
        tot += cur_e - cur_s
    return tot


def runs(trace, rx):
    """--runs: a kernel's launches less than 3 ms apart as one run; its count and median"""
    recs = []
    with open(trace) as f:
        for line in f:
            p = line.rstrip("\n").split(",", 4)
            if len(p) == 5 and p[0] == "K" and rx.search(p[4]):
                name = re.sub(r"Ev.*$", "", p[4])  # the parameters dropped
                recs.append((int(p[1]), int(p[2]), name))
    recs.sort()
    open_runs, done = {}, []
    for s, e, n in recs:
        r = open_runs.get(n)
        if r and s - r[-1][1] < 3_000_000:
            r.append((s, e))
        else:
            if r:
                done.append((r[0][0], n, r))
            open_runs[n] = [(s, e)]
    done += [(r[0][0], n, r) for n, r in open_runs.items()]
    for _, n, r in sorted(done):
        d = [(e - s) / 1000 for s, e in r]
        print(f"{n[:72]:72s} {len(d):4d} launches, median {statistics.median(d):9.1f} us")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("trace")
    ap.add_argument("--step-kernel", default="k_embedding_fwd")
    ap.add_argument("--skip", type=int, default=2)
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--gaps", type=int, default=0)
    ap.add_argument("--runs", default=None)
    a = ap.parse_args()
    if a.runs is not None:
        return runs(a.trace, re.compile(a.runs))
    recs = []
    with open(a.trace) as f:
        for ln, line in enumerate(f, 1):
            p = line.rstrip("\n").split(",", 4)
            if len(p) != 5 or p[0] not in "KCS":
                sys.exit(f"{a.trace}:{ln}: not a ktrace record: {line.strip()[:80]!r}")
            name = short(p[4]) if p[0] == "K" else p[4].split(" ")[0]
            recs.append((int(p[1]), int(p[2]), int(p[3]), name))
    if not recs:
        sys.exit(f"{a.trace}: no records (did the program run with CUDA_INJECTION64_PATH?)")
    rx = re.compile(a.step_kernel)
    starts = sorted(s for s, _, _, n in recs if rx.search(n))
    if len(starts) < a.skip + 2:
        sys.exit(f"{a.trace}: {len(starts)} launches of /{a.step_kernel}/: too few steps for "
                 f"--skip {a.skip} and one whole step after it")
    wins = list(zip(starts[a.skip:-1], starts[a.skip + 1:]))
    nw = len(wins)
    by_name = defaultdict(lambda: [0, 0])
    by_kind = defaultdict(int)
    kind_wall = defaultdict(int)
    gaps = defaultdict(lambda: [0, 0])
    wall = busy = 0
    for w0, w1 in wins:
        wall += w1 - w0
        iv = []
        kiv = defaultdict(list)
        for s, e, _, n in recs:
            s, e = max(s, w0), min(e, w1)
            if e <= s:
                continue
            iv.append((s, e, n))
            by_name[n][0] += 1
            by_name[n][1] += e - s
            by_kind[kind_of(n)] += e - s
            kiv[kind_of(n)].append((s, e))
        busy += union_ns([(s, e) for s, e, _ in iv])
        for k, v in kiv.items():
            kind_wall[k] += union_ns(v)
        # idle intervals: where no record runs; named by the last record to end before and
        # the first to start after
        iv.sort()
        last_e, last_n = None, None
        for s, e, n in iv:
            if last_e is not None and s > last_e:
                g = gaps[(last_n, n)]
                g[0] += 1
                g[1] += s - last_e
            if last_e is None or e > last_e:
                last_e, last_n = e, n
        if last_e is not None and last_e < w1:
            g = gaps[(last_n, "(the next step)")]
            g[0] += 1
            g[1] += w1 - last_e
    ms = lambda ns: ns / nw / 1e6
    print(f"{a.trace}: steps {a.skip + 1} to {a.skip + nw} ({nw} whole steps after "
          f"{a.skip}), means a step")
    print(f"| | ms | share of the step | wall ms (union) |\n|---|---|---|---|")
    print(f"| step (wall) | {ms(wall):.2f} | 100% | |")
    print(f"| GPU running anything | {ms(busy):.2f} | {100 * busy / wall:.1f}% | |")
    print(f"| GPU idle | {ms(wall - busy):.2f} | {100 * (wall - busy) / wall:.1f}% | |")
    for k in [k for k, _ in KINDS] + ["rest"]:
        if by_kind.get(k):
            print(f"| {k} | {ms(by_kind[k]):.2f} | {100 * by_kind[k] / wall:.1f}% | "
                  f"{ms(kind_wall[k]):.2f} |")
    if a.gaps:
        print(f"\n| idle after | idle before | gaps a step | idle ms | us a gap |\n"
              f"|---|---|---|---|---|")
        for (b, f), (c, t) in sorted(gaps.items(), key=lambda kv: -kv[1][1])[:a.gaps]:
            print(f"| {b[:40]} | {f[:40]} | {c / nw:g} | {ms(t):.3f} | {t / c / 1e3:.1f} |")
    print(f"\n| kernel | launches | ms | share | us a launch |\n|---|---|---|---|---|")
    top = sorted(by_name.items(), key=lambda kv: -kv[1][1])[:a.top]
    for n, (c, t) in top:
        print(f"| {n[:60]} | {c / nw:g} | {ms(t):.2f} | {100 * t / wall:.1f}% | "
              f"{t / c / 1e3:.1f} |")


if __name__ == "__main__":
    main()
