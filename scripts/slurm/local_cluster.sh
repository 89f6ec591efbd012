#!/usr/bin/env bash
# A real one-node SLURM cluster on this machine (DESIGN.md §9), for trying ft's batch script and
# for tests/slurm/test_slurm.sh. Debian 12's slurm-wlm 22.05 + munge; run as root.
#   scripts/slurm/local_cluster.sh [start]   # install if missing, configure, start, wait until idle
#   scripts/slurm/local_cluster.sh stop      # stop slurmd, slurmctld and munged
#   scripts/slurm/local_cluster.sh status    # daemons and sinfo
# Idempotent: `start` installs only what is missing, rewrites /etc/slurm/slurm.conf only when
# its content changes (and then restarts slurmctld and slurmd, which read it only at start-up),
# and starts only the daemons that are not running. There is no systemd here: the daemons are
# started by hand and found again through their pid files (stopped by pid, never by name).
#
# What it owns: /etc/slurm/slurm.conf (marked by its first line; a slurm.conf written by anyone
# else is left alone unless FT_SLURM_FORCE=1), state in /var/spool/slurmctld and
# /var/spool/slurmd, logs in /var/log/slurm/ (slurmctld.log, slurmd.log) and /var/log/munge/.
#
# The node is `hostname -s` with CPUs=8 whatever the machine has (SlurmdParameters=
# config_overrides makes slurmd trust slurm.conf over the hardware), so `srun -n 8` fits on a
# 2-core machine. No cgroups (ProctrackType=proctrack/linuxproc, TaskPlugin=task/none: tasks are
# not bound to CPUs), no accounting database.
#
# MPI: MpiDefault=pmix. Debian's slurm-wlm-basic-plugins ships mpi_pmix.so (-> mpi_pmix_v4.so,
# built against Debian's libpmix2 4.2), and Debian's Open MPI 4.1 is built against that same
# external PMIx (ompi_info: "MCA pmix: ext3x"), so `srun` starts MPI ranks directly with no extra
# package; `srun --mpi=list` shows pmix, pmix_v4, pmi2, cray_shasta and none.
set -euo pipefail

conf_dir=/etc/slurm
conf=$conf_dir/slurm.conf
log_dir=/var/log/slurm
marker="# Written by ft scripts/slurm/local_cluster.sh; rewritten on every start."
node=$(hostname -s)
cpus=${FT_SLURM_CPUS:-8}

say() { echo "local_cluster: $*"; }
die() { echo "local_cluster: error: $*" >&2; exit 1; }

[[ $(id -u) == 0 ]] || die "run as root (slurmctld and slurmd run as root here)"

# Pid from a pid file if that process is alive and is the named program; empty otherwise.
running_pid() {
  local pidfile=$1 name=$2 pid
  [[ -r $pidfile ]] || return 0
  pid=$(tr -dc '0-9' < "$pidfile")
  [[ -n $pid && -d /proc/$pid && $(cat "/proc/$pid/comm" 2>/dev/null) == "$name" ]] && echo "$pid"
  return 0
}

stop_daemon() {
  local pidfile=$1 name=$2 pid
  pid=$(running_pid "$pidfile" "$name")
  [[ -n $pid ]] || return 0
  kill -TERM "$pid"
  for _ in $(seq 100); do [[ -d /proc/$pid ]] || break; sleep 0.1; done
  [[ -d /proc/$pid ]] && { say "$name ($pid) did not stop in 10 s; killing it"; kill -KILL "$pid"; }
  say "stopped $name ($pid)"
}

# Starts a daemon (it forks into the background) and waits up to 10 s for its pid file.
start_daemon() {
  local pidfile=$1 name=$2 pid=""
  shift 2
  "$@"
  for _ in $(seq 100); do
    pid=$(running_pid "$pidfile" "$name")
    [[ -n $pid ]] && break
    sleep 0.1
  done
  [[ -n $pid ]] || die "$name did not start; see its log under /var/log"
  say "started $name ($pid)"
}

install_packages() {
  local missing=()
  for f in /usr/sbin/slurmctld /usr/sbin/slurmd /usr/bin/srun /usr/bin/sbatch /usr/sbin/munged \
           /usr/lib/x86_64-linux-gnu/slurm-wlm/mpi_pmix.so; do
    [[ -e $f ]] || missing+=("$f")
  done
  ((${#missing[@]} == 0)) && return 0
  say "installing slurm-wlm and munge (missing: ${missing[*]})"
  apt-get update -qq
  # Recommends would add slurm-wlm-plugins (IPMI, HDF5, InfluxDB, ...): not needed here.
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    slurm-wlm slurm-wlm-basic-plugins munge > /dev/null
}

write_conf() {  # prints "changed" when the file was (re)written
  local new
  if [[ -e $conf ]] && ! head -1 "$conf" | grep -qF "$marker" && [[ ${FT_SLURM_FORCE:-0} != 1 ]]; then
    die "$conf exists and was not written by this script; move it away or set FT_SLURM_FORCE=1"
  fi
  mkdir -p "$conf_dir"
  new=$(mktemp)
  cat > "$new" <<EOF
$marker
# One-node cluster for ft (DESIGN.md §9). Edit the script, not this file.
ClusterName=ft
SlurmctldHost=$node
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
MpiDefault=pmix
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
ReturnToService=2
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile=$log_dir/slurmctld.log
SlurmdLogFile=$log_dir/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
# No accounting, no cgroups.
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
# Short timeouts: a one-node test cluster should fail fast rather than wait.
SlurmctldTimeout=30
SlurmdTimeout=60
InactiveLimit=0
KillWait=30
MinJobAge=300
NodeName=$node NodeAddr=127.0.0.1 CPUs=$cpus State=UNKNOWN
PartitionName=debug Nodes=$node Default=YES MaxTime=INFINITE State=UP
EOF
  if [[ -e $conf ]] && cmp -s "$new" "$conf"; then
    rm -f "$new"
  else
    install -m 0644 "$new" "$conf"
    rm -f "$new"
    echo changed
  fi
}

start_munge() {
  if [[ ! -s /etc/munge/munge.key ]]; then
    say "creating /etc/munge/munge.key"
    mungekey --create --keyfile=/etc/munge/munge.key
  fi
  chown munge:munge /etc/munge/munge.key && chmod 0400 /etc/munge/munge.key
  install -d -o munge -g munge -m 0755 /run/munge
  install -d -o munge -g munge -m 0700 /var/log/munge /var/lib/munge
  if [[ -z $(running_pid /run/munge/munged.pid munged) ]]; then
    start_daemon /run/munge/munged.pid munged runuser -u munge -- /usr/sbin/munged
  fi
  munge -n | unmunge > /dev/null || die "munge does not work (see /var/log/munge/munged.log)"
}

start() {
  local t0=$SECONDS changed
  install_packages
  changed=$(write_conf)
  install -d -m 0755 /var/spool/slurmctld /var/spool/slurmd "$log_dir"
  start_munge
  if [[ -n $changed ]]; then
    say "wrote $conf"
    # slurmctld and slurmd read slurm.conf only when they start.
    stop_daemon /run/slurmd.pid slurmd
    stop_daemon /run/slurmctld.pid slurmctld
  fi
  if [[ -z $(running_pid /run/slurmctld.pid slurmctld) ]]; then
    start_daemon /run/slurmctld.pid slurmctld slurmctld
  fi
  if [[ -z $(running_pid /run/slurmd.pid slurmd) ]]; then
    start_daemon /run/slurmd.pid slurmd slurmd
  fi
  # Wait for the node to register and become idle (or busy, if jobs are already running).
  local state=""
  for _ in $(seq 120); do
    state=$(sinfo -h -N -n "$node" -o %T 2>/dev/null | head -1 || true)
    case $state in
      idle|mixed|allocated) break ;;
      down|drained|draining|drain) scontrol update NodeName="$node" State=RESUME 2> /dev/null || true ;;
    esac
    sleep 0.5
  done
  case $state in
    idle|mixed|allocated) ;;
    *) die "node $node is '${state:-unknown}' after 60 s; see $log_dir/slurmctld.log and $log_dir/slurmd.log" ;;
  esac
  # A restarted slurmctld may report the node idle from its saved state before slurmd has
  # registered: one tiny job step proves munge, slurmctld and slurmd all work.
  [[ $state == allocated ]] || timeout 60 srun --job-name=local_cluster_check --time=1 -n 1 true ||
    die "a test job step (srun -n 1 true) failed; see $log_dir/slurmctld.log and $log_dir/slurmd.log"
  say "node $node is $state ($cpus CPUs, MpiDefault=pmix); ready in $((SECONDS - t0)) s"
}

stop() {
  stop_daemon /run/slurmd.pid slurmd
  stop_daemon /run/slurmctld.pid slurmctld
  stop_daemon /run/munge/munged.pid munged
}

status() {
  local name pid
  for name in munge/munged slurmctld slurmd; do
    pid=$(running_pid "/run/$name.pid" "${name#*/}")
    if [[ -n $pid ]]; then echo "${name#*/}: running ($pid)"; else echo "${name#*/}: not running"; fi
  done
  [[ -n $(running_pid /run/slurmctld.pid slurmctld) ]] && sinfo
  return 0
}

case ${1:-start} in
  start) start ;;
  stop) stop ;;
  status) status ;;
  *) echo "usage: $0 [start|stop|status]" >&2; exit 2 ;;
esac
