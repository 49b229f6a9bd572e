#!/bin/bash
# mpirun-guard.sh ARGS...: runs "${SL_MPIRUN:-mpirun} ARGS..." for the test suite (test/Makefile.am
# points MPIRUN here) and returns its exit status, forwarding INT, TERM, HUP, USR1 and USR2 to it.
#
# One thing more: Debian 12's Open MPI 4.1 (with PMIx 4.2) now and then never returns after
# every rank has exited: mpirun waits forever on a mutex inside PMIx_server_finalize, its ranks
# left unreaped (seen once in CI, test_fsdp.sh's 8-rank run; the whole suite then waited for
# timed.sh's 1200 s).  The guard looks every 5 s; once all of mpirun's children have been
# zombies for 30 s, it reads their exit statuses from /proc (a zombie's /proc/PID/stat keeps
# its waitpid status), says so on stderr, kills mpirun and exits 0 if every rank exited 0,
# else 1.  A job whose ranks are still alive is never touched (timed.sh deals with real hangs).
mpirun=${SL_MPIRUN:-mpirun}
"$mpirun" "$@" &
m=$!
for s in INT TERM HUP USR1 USR2; do
	trap "kill -$s $m 2>/dev/null" "$s"
done

# zombies: the exit statuses of mpirun's children, one a line, if every one is a zombie;
# nothing (and status 1) if it has none or any is alive
zombies() {
	local kids p st f n=0
	kids=$(pgrep -P "$m") || return 1
	for p in $kids; do
		st=$(cat "/proc/$p/stat" 2>/dev/null) || return 1
		f=${st##*) }			# the fields after the command name
		set -- $f
		[ "$1" = Z ] || return 1
		shift 49
		echo "$p $1"			# field 52: the status waitpid would return
		n=$((n + 1))
	done
	[ "$n" -gt 0 ]
}

stuck=0
while :; do
	sleep 5 &
	s=$!
	which=
	wait -n -p which "$m" "$s"
	rc=$?
	if [ "$which" = "$m" ]; then
		kill "$s" 2>/dev/null
		exit "$rc"
	fi
	kill "$s" 2>/dev/null
	wait "$s" 2>/dev/null
	[ "$which" = "$s" ] || continue		# a forwarded signal woke the wait
	if z=$(zombies); then
		stuck=$((stuck + 5))
	else
		stuck=0
	fi
	[ "$stuck" -ge 30 ] || continue
	bad=0
	while read -r p w; do
		[ "$w" = 0 ] || bad=1
		echo "mpirun-guard: rank process $p exited with wait status $w" >&2
	done <<<"$z"
	echo "mpirun-guard: every rank exited but $mpirun (pid $m) has not returned for" \
		"$stuck s (Open MPI's PMIx finalize hang); killed it; ranks' verdict: exit $bad" >&2
	kill -KILL "$m" 2>/dev/null
	wait "$m" 2>/dev/null
	exit "$bad"
done
