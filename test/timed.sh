#!/bin/bash
# timed.sh CMD...: the test harness's runner (LOG_COMPILER).  Runs CMD in a session of its own;
# if it is still running after SL_TEST_TIMEOUT seconds (default 1200), prints the session's
# processes and each shardlm process's thread stacks (gdb, when installed) to the test's log,
# kills the session and exits 124, so that a hung test fails with the place it hung instead of
# stopping the whole suite.
limit=${SL_TEST_TIMEOUT:-1200}

setsid "$@" &
pid=$!

dump_and_kill() {
	echo "timed.sh: '$*' still running after $limit s: its processes" >&2
	ps -o pid,ppid,stat,etime,args -s "$pid" >&2
	for p in $(pgrep -s "$pid" | head -n 40); do
		case $(cat "/proc/$p/comm" 2>/dev/null) in
		''|sh|bash|dash|sleep|ps|timeout|python3) continue ;;
		esac
		echo "---- stacks of process $p: $(tr '\0' ' ' <"/proc/$p/cmdline" |
			cut -c1-200)" >&2
		if command -v gdb >/dev/null 2>&1; then
			timeout 60 gdb -p "$p" -batch -nx -ex "thread apply all bt 30" 2>&1 |
				grep -E '^(#|Thread)' | head -n 120 >&2
		else
			cat "/proc/$p/stack" >&2 2>/dev/null
		fi
	done
	pkill -TERM -s "$pid"
	sleep 5
	pkill -KILL -s "$pid"
}

(
	trap 'kill "$s" 2>/dev/null; exit 0' TERM
	sleep "$limit" &
	s=$!
	wait "$s"
	touch "/tmp/sl-timed-$pid"
	dump_and_kill "$@"
) &
watcher=$!

wait "$pid"
rc=$?
if [ -e "/tmp/sl-timed-$pid" ]; then
	wait "$watcher" 2>/dev/null	# the stacks printed and the session killed
else
	kill "$watcher" 2>/dev/null
	wait "$watcher" 2>/dev/null
fi
if [ -e "/tmp/sl-timed-$pid" ]; then
	rm -f "/tmp/sl-timed-$pid"
	echo "timed.sh: killed after $limit s" >&2
	exit 124
fi
exit "$rc"
