# A one-node Slurm cluster for script tests (sourced after lib.sh): munge (reused when one works),
# slurmctld and slurmd on ports $SLURM_PORT and $SLURM_PORT + 1 (default 26817), state under
# $T/slurm, stopped by their pids however the test ends (stop_daemons).  Skips the test (77)
# where Slurm cannot run here.  Sets SLURM_CONF and HOST.
PATH=$PATH:/usr/sbin:/sbin
D="$T/slurm"
SLURM_PORT=${SLURM_PORT:-26817}
started_munged=

skip() {
	echo "SKIP: $*"
	rm -rf "$T"
	exit 77
}

stop_daemons() {
	for f in "$D/slurmd.pid" "$D/slurmctld.pid" ${started_munged:+"$started_munged"}; do
		[ -s "$f" ] || continue
		pid=$(cat "$f")
		kill "$pid" 2>/dev/null || continue
		for i in 1 2 3 4 5 6 7 8 9 10; do
			kill -0 "$pid" 2>/dev/null || break
			sleep 0.5
		done
		kill -9 "$pid" 2>/dev/null
	done
	rm -f "$D/slurmd.pid" "$D/slurmctld.pid"
	started_munged=
}
trap 'stop_daemons' EXIT
trap 'stop_daemons; exit 1' INT TERM

[ "$(id -u)" = 0 ] || skip "starting slurmctld, slurmd and munged needs root"
for p in munge munged slurmctld slurmd sbatch squeue scontrol sinfo srun; do
	command -v $p >/dev/null 2>&1 ||
		skip "$p not installed (install-deps installs slurmd slurmctld slurm-client munge)"
done
HOST=$(hostname -s)

# munge: reuse a working one, else start our own
if ! munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
	mkdir -p /etc/munge /run/munge /var/log/munge /var/lib/munge
	[ -f /etc/munge/munge.key ] ||
		dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key 2>/dev/null
	chown -R munge: /etc/munge /run/munge /var/log/munge /var/lib/munge
	chmod 400 /etc/munge/munge.key
	munged --force || skip "munged did not start"
	started_munged=/run/munge/munged.pid
	for i in 1 2 3 4 5 6 7 8 9 10; do
		munge -n 2>/dev/null | unmunge >/dev/null 2>&1 && break
		sleep 0.5
	done
	munge -n | unmunge >/dev/null 2>&1 || skip "munge does not work here"
fi

# the node line as slurmd sees this machine (CPUs, sockets, memory), ports of our own
mkdir -p "$D/state" "$D/spool"
node=$(slurmd -C 2>/dev/null | head -n 1)
case $node in NodeName=*) ;; *) skip "slurmd -C failed: $node" ;; esac
cat >"$D/slurm.conf" <<CONF
ClusterName=shardlmtest
SlurmctldHost=$HOST
SlurmctldPort=$SLURM_PORT
SlurmdPort=$((SLURM_PORT + 1))
AuthType=auth/munge
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$D/state
SlurmdSpoolDir=$D/spool
SlurmctldPidFile=$D/slurmctld.pid
SlurmdPidFile=$D/slurmd.pid
SlurmctldLogFile=$D/ctld.log
SlurmdLogFile=$D/d.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SchedulerType=sched/builtin
SelectType=select/cons_tres
ReturnToService=2
MailProg=/bin/true
$node State=UNKNOWN
PartitionName=debug Nodes=$HOST Default=YES MaxTime=INFINITE State=UP
CONF
export SLURM_CONF="$D/slurm.conf"
slurmctld -f "$SLURM_CONF" || skip "slurmctld did not start (see $D/ctld.log)"
slurmd -f "$SLURM_CONF" || skip "slurmd did not start (see $D/d.log)"
state=
for i in $(seq 1 60); do
	state=$(sinfo -h -n "$HOST" -o %t 2>/dev/null)
	[ "$state" = idle ] && break
	sleep 0.5
done
if [ "$state" != idle ]; then
	tail -n 5 "$D/ctld.log" "$D/d.log" >&2
	skip "the node did not come up idle (state '$state')"
fi
srun --mpi=list 2>&1 | grep -q pmix || skip "Slurm here has no pmix MPI plugin (slurm-wlm-basic-plugins)"
