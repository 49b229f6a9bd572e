#!/bin/sh
# The tools on fixtures (test/fixtures/tools) against values computed by hand below: the epoch
# projector's medians, hours, GPU-hours and ranking; the utilization reducer's averages and peaks
# over shardlm's GPU logs of two nodes and a real nvidia-smi CSV; --json keys; the errors; a plot.
. "${top_srcdir:-$(dirname "$0")/..}/test/lib.sh"

EPOCH="$top_builddir/tools/shardlm-epoch"
UTIL="$top_builddir/tools/shardlm-util"
PLOT="$top_builddir/tools/shardlm-plot"
F="$top_srcdir/test/fixtures/tools"

# check_json NAME FILE PYTHON-ASSERTIONS: j is the parsed JSON (python3 only reads it)
check_json() {
	ok
	if ! python3 -c "
import json, sys
j = json.load(open(sys.argv[1]))
def close(a, b): return abs(a - b) <= 1e-9 * max(1, abs(b))
$3
" "$2" >"$T/py.out" 2>&1; then
		fail "$1"; cat "$T/py.out" "$2" >&2
	fi
}

# --- shardlm-epoch ---------------------------------------------------------------------------
# run-a: world 8, 16 records/step, 54000 records; s/step of steps 6..10 = 6, 6.2, 5.8, 6.4, 6.0
#   -> median 6.0; hours = 54000/16 * 6.0 / 3600 = 5.625; GPU-h = 45; peak 71234000000 B = 71.234
# run-missing-step: world 1, 16/step; step 7 missing; steps 6, 8, 9, 10 = 20, 22, 21, 25
#   -> median (21 + 22)/2 = 21.5; hours = 3375 * 21.5 / 3600 = 20.15625 = GPU-h; peak 79.5
# run-partial: world 8, 32/step, died at step 8 of 100; steps 6..8 = 9.0, 9.6, 9.3 -> 9.3;
#   hours = 54000/32 * 9.3 / 3600 = 4.359375; GPU-h = 34.875; peak 60
# ranking: partial 4.359375 (-22.5% against run-a), run-a 5.625, missing-step 20.15625 (+258.3%)
expect_ok "epoch json" "$EPOCH" --json "$F/run-a" "$F/run-missing-step" "$F/run-partial"
cp "$T/out" "$T/epoch.json"
check_json "epoch json values" "$T/epoch.json" '
keys = ["run", "steps", "s_per_step", "peak_gpu_gb", "records_per_step", "epoch_records",
        "epoch_hours", "epoch_gpu_hours", "world"]
assert all(sorted(r) == sorted(keys) for r in j), [list(r) for r in j]
assert [r["run"].rsplit("/", 1)[1] for r in j] == ["run-partial", "run-a", "run-missing-step"]
p, a, m = j
assert a["steps"] == 10 and a["world"] == 8 and a["records_per_step"] == 16
assert a["epoch_records"] == 54000
assert close(a["s_per_step"], 6.0) and close(a["epoch_hours"], 5.625)
assert close(a["epoch_gpu_hours"], 45.0) and close(a["peak_gpu_gb"], 71.234)
assert m["steps"] == 9 and close(m["s_per_step"], 21.5)
assert close(m["epoch_hours"], 20.15625) and close(m["epoch_gpu_hours"], 20.15625)
assert close(m["peak_gpu_gb"], 79.5) and m["world"] == 1
assert p["steps"] == 8 and close(p["s_per_step"], 9.3) and p["records_per_step"] == 32
assert close(p["epoch_hours"], 4.359375) and close(p["epoch_gpu_hours"], 34.875)
'
expect_ok "epoch table" "$EPOCH" "$F/run-a" "$F/run-missing-step" "$F/run-partial"
cp "$T/out" "$T/epoch.txt"
grep -Eq '^1 +[^ ]*run-partial +8 +9\.300 +60\.00 +32 +54000 +4\.36 +34\.9 +8 +-22\.5%$' \
	"$T/epoch.txt" || fail "table: run-partial row"
grep -Eq '^2 +[^ ]*run-a +10 +6\.000 +71\.23 +16 +54000 +5\.62 +45\.0 +8 +first$' \
	"$T/epoch.txt" || fail "table: run-a row"
grep -Eq '^3 +[^ ]*run-missing-step +9 +21\.500 +79\.50 +16 +54000 +20\.16 +20\.2 +1 +\+258\.3%$' \
	"$T/epoch.txt" || fail "table: run-missing-step row"
grep -q 'GB = 1e9 bytes' "$T/epoch.txt" || fail "table: GB not defined in the header"
grep -q 'run-missing-step: missing steps 7$' "$T/epoch.txt" || fail "no missing-step note"
grep -q 'run-partial: partial run: 8 of 100 steps recorded' "$T/epoch.txt" ||
	fail "no partial-run note"
# --per-step 32 on run-a: 54000/32 * 6 / 3600 = 2.8125; --warmup 0: median of all ten step
# times (5.8 6 6 6.2 6.4 7 7.5 8 9 30) = (6.4 + 7)/2 = 6.7
expect_ok "epoch --per-step" "$EPOCH" --json --per-step 32 "$F/run-a"
cp "$T/out" "$T/ps.json"
check_json "--per-step 32" "$T/ps.json" '
assert j[0]["records_per_step"] == 32 and close(j[0]["epoch_hours"], 2.8125)
assert close(j[0]["epoch_gpu_hours"], 22.5)'
expect_ok "epoch --warmup 0" "$EPOCH" --json --warmup 0 "$F/run-a"
cp "$T/out" "$T/w0.json"
check_json "--warmup 0" "$T/w0.json" 'assert close(j[0]["s_per_step"], 6.7)'
# run-short: 3 steps (4, 2, 3 s) <= warm-up 5: median of all = 3; 800/8 * 3 / 3600 h, world 2
expect_ok "epoch short run" "$EPOCH" "$F/run-short"
grep -q 'only 3 steps (warm-up is 5): median over all of them' "$T/out" || fail "no short-run note"
expect_ok "epoch short run json" "$EPOCH" --json "$F/run-short"
cp "$T/out" "$T/short.json"
check_json "short run" "$T/short.json" '
assert close(j[0]["s_per_step"], 3.0) and close(j[0]["epoch_hours"], 100 * 3 / 3600)
assert close(j[0]["epoch_gpu_hours"], 2 * 100 * 3 / 3600)'
# the json file itself works as well as its directory
expect_ok "epoch on the file" "$EPOCH" "$F/run-a/training_metrics.json"
# errors name the file and exit non-zero
expect_fail "epoch empty metrics" "run-empty/training_metrics.json: empty file" \
	"$EPOCH" "$F/run-empty"
expect_fail "epoch invalid json" "run-bad/training_metrics.json:3:[0-9]+: invalid JSON" \
	"$EPOCH" "$F/run-bad"
expect_fail "epoch missing run" "nope: No such file or directory" "$EPOCH" "$F/nope"
mkdir -p "$T/norun"
expect_fail "epoch dir without metrics" "norun/training_metrics.json: No such file" \
	"$EPOCH" "$T/norun"
expect_fail "epoch bad --warmup" "--warmup 'x'" "$EPOCH" --warmup x "$F/run-a"
# one bad run among good ones: the good ones are reported, the status says something failed
ok
if "$EPOCH" "$F/run-a" "$F/run-empty" >"$T/mixed" 2>&1; then
	fail "epoch: a bad run among good ones exited 0"
fi
grep -q 'run-a' "$T/mixed" || fail "epoch: the good run was not reported"

# --- shardlm-util -----------------------------------------------------------------------------
# node07 GPU 0: 0 50 90 100 %, peak 71000 MiB; GPU 1: 0 40 80 96 %, 70500 MiB; node08 GPU 0:
#   2 60 70 82 %, 66000 MiB -> averages 60, 54, 53.5; overall 670/12; peak 100 %, 71000 MiB
expect_ok "util two nodes" "$UTIL" --json "$F/gpu-123456-node07.csv" "$F/gpu-123456-node08.csv"
cp "$T/out" "$T/util.json"
check_json "util two nodes values" "$T/util.json" '
assert sorted(j) == sorted(["avg_util", "peak_util", "peak_mem_mib", "samples", "gpus"]), list(j)
assert close(j["avg_util"], 670 / 12) and j["peak_util"] == 100
assert j["peak_mem_mib"] == 71000 and j["samples"] == 12
g = [(x["host"], x["index"], x["avg_util"], x["peak_util"], x["peak_mem_mib"]) for x in j["gpus"]]
assert g == [("node07", 0, 60, 100, 71000), ("node07", 1, 54, 96, 70500),
             ("node08", 0, 53.5, 82, 66000)], g
assert all({"index", "avg_util", "peak_util", "peak_mem_mib"} <= set(x) for x in j["gpus"])'
# --from-first-step run-a: its first step began at 16:05:00 +0100 (end_unix - time_s), so the
# 16:04:45 samples go: GPU averages (50+90+100)/3 = 80, (40+80+96)/3 = 72, (60+70+82)/3;
# overall 668/9.  The run's UTC offset converts the log's local times: any TZ gives the same.
for tz in UTC America/New_York Asia/Tokyo; do
	expect_ok "util from first step ($tz)" env TZ=$tz "$UTIL" --json \
		--from-first-step "$F/run-a" "$F/gpu-123456-node07.csv" "$F/gpu-123456-node08.csv"
	cp "$T/out" "$T/util1.json"
	check_json "util from first step values ($tz)" "$T/util1.json" '
assert j["samples"] == 9 and close(j["avg_util"], 668 / 9), j
g = [(x["index"], x["avg_util"], x["peak_util"], x["samples"]) for x in j["gpus"]]
assert g[0] == (0, 80, 100, 3) and g[1] == (1, 72, 96, 3), g
assert g[2][0] == 0 and close(g[2][1], 212 / 3) and g[2][3] == 3, g'
done
expect_ok "util table" "$UTIL" --from-first-step "$F/run-a" "$F/gpu-123456-node07.csv" \
	"$F/gpu-123456-node08.csv"
grep -Eq '^all +9 +74\.2% +100% +71000$' "$T/out" || { fail "util table: overall row"; cat "$T/out"; }
grep -q 'left out 3 samples taken before the first step began' "$T/out" ||
	fail "util table: dropped-samples note"
# nvidia-smi's own CSV (units in values, no host column, one [N/A] value skipped): GPU 0
# 87 91 95 % -> 91, peak 95, 1250 MiB; GPU 1 13 0 20 % -> 11, peak 20, 2050 MiB; all 306/6 = 51
expect_ok "util nvidia-smi" "$UTIL" --json "$F/nvidia-smi.csv"
cp "$T/out" "$T/nv.json"
check_json "util nvidia-smi values" "$T/nv.json" '
assert close(j["avg_util"], 51) and j["peak_util"] == 95 and j["peak_mem_mib"] == 2050
assert j["samples"] == 6
g = [(x["index"], x["avg_util"], x["peak_util"], x["peak_mem_mib"]) for x in j["gpus"]]
assert g == [(0, 91, 95, 1250), (1, 11, 20, 2050)], g'
# --format=csv,nounits works too
sed 's/ MiB//; s/ %$//' "$F/nvidia-smi.csv" >"$T/nounits.csv"
expect_ok "util nounits" "$UTIL" --json "$T/nounits.csv"
cp "$T/out" "$T/nu.json"
check_json "util nounits values" "$T/nu.json" 'assert close(j["avg_util"], 51) and j["samples"] == 6'
expect_fail "util empty log" "empty.csv: empty log" "$UTIL" "$F/empty.csv"
expect_fail "util header only" "header-only.csv: a header but no samples" "$UTIL" \
	"$F/header-only.csv"
expect_fail "util bad line" "bad-line.csv:3: 3 columns where the header has 4" "$UTIL" \
	"$F/bad-line.csv"
printf '2026/11/29 16:05:01.123, 0, 1234 MiB, 87 %%\n' >"$T/nohdr.csv"
expect_fail "util no header" "nohdr.csv:1: a sample before any header" "$UTIL" "$T/nohdr.csv"
printf 'timestamp, index, memory.used [MiB], utilization.gpu [%%]\nyesterday, 0, 1 MiB, 2 %%\n' \
	>"$T/badts.csv"
expect_fail "util bad timestamp" "badts.csv:2: bad timestamp 'yesterday'" "$UTIL" "$T/badts.csv"
expect_fail "util missing file" "nope.csv: No such file" "$UTIL" "$F/nope.csv"
expect_fail "util --from-first-step bad run" "run-empty/training_metrics.json: empty file" \
	"$UTIL" --from-first-step "$F/run-empty" "$F/nvidia-smi.csv"

# --- shardlm-plot -----------------------------------------------------------------------------
if command -v gnuplot >/dev/null 2>&1; then
	expect_ok "plot svg" "$PLOT" "$F/run-a" "$F/run-missing-step" "$F/run-partial" \
		-o "$T/it's a plot.svg"
	grep -q '<svg' "$T/it's a plot.svg" 2>/dev/null || fail "plot: no SVG written"
	grep -q 'run-missing-step' "$T/it's a plot.svg" 2>/dev/null || fail "plot: no run title"
	expect_ok "plot png" "$PLOT" "$F/run-a" -o "$T/p.png"
	[ "$(head -c 4 "$T/p.png" | od -An -c | tr -d ' ')" = '211PNG' ] || fail "plot: no PNG"
else
	echo "gnuplot not installed: plot output not checked (install gnuplot-nox)"
fi
expect_fail "plot without gnuplot" "cannot run gnuplot.*gnuplot-nox" env PATH=/nonexistent \
	"$PLOT" "$F/run-a" -o "$T/x.svg"
expect_fail "plot bad extension" "must end in .svg or .png" "$PLOT" "$F/run-a" -o "$T/x.pdf"
expect_fail "plot bad run" "run-bad/training_metrics.json:3" "$PLOT" "$F/run-bad" -o "$T/x.svg"
finish
