#!/usr/bin/env bash
# Start a real one-node SLURM cluster (munged, slurmctld, slurmd) on this machine; needs root.
#
# Usage:  scripts/slurm_start.sh [STATE_DIR]
#         eval "$(scripts/slurm_start.sh)"      # or: eval "$(scripts/slurm_start.sh | tail -1)"
#
# STATE_DIR defaults to $SLURM_CLUSTER_DIR, else /tmp/steer_hydra-slurm. It holds slurm.conf, the
# controller state, the slurmd spool, pid files and logs (slurmctld.log, slurmd.log, munged.log).
# Progress goes to stderr; stdout gets exactly one line, the last: `export SLURM_CONF=<STATE_DIR>/slurm.conf`.
# Every SLURM client (srun, sbatch, squeue, sinfo, scancel) needs that SLURM_CONF.
#
# Installs slurm-wlm and munge with apt-get when slurmctld is missing, creates /etc/munge/munge.key when
# absent, starts `munged --force` when no munged answers (recorded in STATE_DIR/munged.pid so that
# scripts/slurm_stop.sh stops it again), writes slurm.conf (node = `hostname -s` at 127.0.0.1, CPUs =
# max(nproc, 2), RealMemory = 90% of MemTotal, one partition `debug`), starts the daemons and waits until
# `srun -N1 hostname` answers. Idempotent: with the cluster up and slurm.conf unchanged it only checks the
# node and prints the export line; a changed slurm.conf restarts the daemons. Jobs recovered from the saved
# state (a cluster that died without slurm_stop.sh) are cancelled. On failure it prints the daemons' log
# tails to stderr and exits 1. No accounting: `sacct` answers "Slurm accounting storage is disabled"
# (submitit then warns and reports job state UNKNOWN, but its results still arrive).
#
# Environment: SLURM_CLUSTER_DIR (state dir), SLURM_START_TIMEOUT (seconds to wait for the node, default 60),
# SLURM_CLUSTER_NAME (default steer_hydra), SLURMCTLD_PORT / SLURMD_PORT (default 6817 / 6818).
# Stop with: scripts/slurm_stop.sh [STATE_DIR]
set -euo pipefail

log() { printf 'slurm_start: %s\n' "$*" >&2; }

dir="${1:-${SLURM_CLUSTER_DIR:-/tmp/steer_hydra-slurm}}"
timeout_s="${SLURM_START_TIMEOUT:-60}"
cluster="${SLURM_CLUSTER_NAME:-steer_hydra}"
ctld_port="${SLURMCTLD_PORT:-6817}"
slurmd_port="${SLURMD_PORT:-6818}"

if [[ "${EUID}" -ne 0 ]]; then
    log "must run as root (SlurmUser=root, munged)"
    exit 1
fi
export PATH="${PATH}:/usr/sbin:/sbin"

mkdir -p "${dir}"
dir="$(cd "${dir}" && pwd)"
conf="${dir}/slurm.conf"
export SLURM_CONF="${conf}"

# pid_alive NAME PIDFILE: the pid in PIDFILE runs a process whose command name is NAME.
pid_alive() {
    local name="$1" pidfile="$2" pid stat
    [[ -s "${pidfile}" ]] || return 1
    pid="$(tr -dc '0-9' <"${pidfile}")"
    [[ -n "${pid}" ]] || return 1
    [[ "$(cat "/proc/${pid}/comm" 2>/dev/null)" == "${name}" ]] || return 1
    stat="$(cat "/proc/${pid}/stat" 2>/dev/null)" || return 1
    stat="${stat##*) }"
    [[ "${stat:0:1}" != "Z" ]] # a zombie is not running (PID 1 may reap it late)
}

show_logs() {
    local f
    for f in "${dir}/slurmctld.log" "${dir}/slurmd.log" "${dir}/munged.log"; do
        if [[ -f "${f}" ]]; then
            printf -- '----- tail of %s -----\n' "${f}" >&2
            tail -n 30 "${f}" >&2 || true
        fi
    done
}

fail() {
    log "FAILED: $*"
    show_logs
    exit 1
}

# 1. packages
if ! command -v slurmctld >/dev/null 2>&1; then
    log "installing slurm-wlm munge with apt-get"
    export DEBIAN_FRONTEND=noninteractive
    if ! apt-get install -y -qq slurm-wlm munge >"${dir}/apt.log" 2>&1; then
        apt-get update -qq >>"${dir}/apt.log" 2>&1 || true
        apt-get install -y -qq slurm-wlm munge >>"${dir}/apt.log" 2>&1 \
            || { tail -n 20 "${dir}/apt.log" >&2; fail "apt-get install slurm-wlm munge"; }
    fi
fi

# 2. munge
key=/etc/munge/munge.key
if [[ ! -s "${key}" ]]; then
    log "creating ${key}"
    mkdir -p /etc/munge
    chmod 700 /etc/munge
    dd if=/dev/urandom of="${key}" bs=1024 count=1 status=none
    chmod 400 "${key}"
    if id munge >/dev/null 2>&1; then
        chown munge:munge /etc/munge "${key}"
    fi
fi

munge_ok() { munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1; }

if ! munge_ok; then
    log "starting munged"
    mkdir -p /run/munge /var/lib/munge /var/log/munge
    rm -f /run/munge/munged.pid
    munged --force --log-file="${dir}/munged.log" --pid-file=/run/munge/munged.pid \
        || fail "munged did not start"
    for _ in $(seq 1 50); do
        munge_ok && break
        sleep 0.1
    done
    munge_ok || fail "munged does not answer"
    cp /run/munge/munged.pid "${dir}/munged.pid"
fi

# 3. slurm.conf
host="$(hostname -s)"
cpus="$(nproc)"
((cpus >= 2)) || cpus=2
mem_mb="$(awk '/^MemTotal:/ { printf "%d", $2 / 1024 * 0.9 }' /proc/meminfo)"
((mem_mb >= 1000)) || mem_mb=1000
mkdir -p "${dir}/state" "${dir}/slurmd"

cat >"${conf}.new" <<EOF
# One-node SLURM cluster written by scripts/slurm_start.sh; state, pids and logs live in ${dir}.
ClusterName=${cluster}
SlurmctldHost=${host}(127.0.0.1)
SlurmctldPort=${ctld_port}
SlurmdPort=${slurmd_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc=${dir}/jobcomp.log
SlurmdParameters=config_overrides
ReturnToService=2
StateSaveLocation=${dir}/state
SlurmdSpoolDir=${dir}/slurmd
SlurmctldPidFile=${dir}/slurmctld.pid
SlurmdPidFile=${dir}/slurmd.pid
SlurmctldLogFile=${dir}/slurmctld.log
SlurmdLogFile=${dir}/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
SlurmctldTimeout=30
SlurmdTimeout=30
MessageTimeout=10
InactiveLimit=0
KillWait=5
MinJobAge=300
WaitTime=0
SchedulerParameters=batch_sched_delay=0
NodeName=${host} NodeAddr=127.0.0.1 CPUs=${cpus} RealMemory=${mem_mb} State=UNKNOWN
PartitionName=debug Nodes=${host} Default=YES State=UP MaxTime=INFINITE
EOF

ctld_up=0
slurmd_up=0
pid_alive slurmctld "${dir}/slurmctld.pid" && ctld_up=1
pid_alive slurmd "${dir}/slurmd.pid" && slurmd_up=1

if [[ -f "${conf}" ]] && cmp -s "${conf}" "${conf}.new"; then
    rm -f "${conf}.new"
else
    if ((ctld_up || slurmd_up)); then
        log "slurm.conf changed: restarting the daemons"
        "$(dirname "$0")/slurm_stop.sh" --keep-munge "${dir}" >&2
        ctld_up=0
        slurmd_up=0
    fi
    mv "${conf}.new" "${conf}"
fi

# 4. daemons
started=0
if ((!ctld_up)); then
    log "starting slurmctld"
    rm -f "${dir}/slurmctld.pid"
    slurmctld -f "${conf}" || fail "slurmctld did not start"
    started=1
    # Jobs recovered from the saved state are ghosts of a cluster that died without slurm_stop.sh (which
    # cancels every job): cancel them. Keeping the saved state keeps job ids growing across restarts.
    ghosts=""
    ghost_end=$((SECONDS + 10))
    while ((SECONDS < ghost_end)); do
        if ghosts="$(timeout 3 squeue -h -o '%i' 2>/dev/null)"; then
            break
        fi
        ghosts=""
        if ((SECONDS > ghost_end - 7)) && ! pid_alive slurmctld "${dir}/slurmctld.pid"; then
            break # it died: the wait below reports it
        fi
        sleep 0.2
    done
    if [[ -n "${ghosts}" ]]; then
        log "cancelling jobs left from an earlier run: $(echo "${ghosts}" | tr '\n' ' ')"
        # shellcheck disable=SC2086 # one job id per word
        scancel ${ghosts} 2>/dev/null || true
    fi
fi
if ((!slurmd_up)); then
    log "starting slurmd"
    rm -f "${dir}/slurmd.pid"
    slurmd -f "${conf}" || fail "slurmd did not start"
    started=1
fi

# 5. wait for the node
deadline=$((SECONDS + timeout_s))
grace_end=$((SECONDS + 3))
ready=0
while ((SECONDS < deadline)); do
    if ((SECONDS > grace_end)); then # the daemons write their pid files a moment after forking
        pid_alive slurmctld "${dir}/slurmctld.pid" || fail "slurmctld is not running"
        pid_alive slurmd "${dir}/slurmd.pid" || fail "slurmd is not running"
    fi
    state="$(timeout 5 sinfo -h -n "${host}" -o "%T" 2>/dev/null | head -n 1 || true)"
    case "${state}" in
        *drain* | *DRAIN*)
            scontrol update NodeName="${host}" State=RESUME >/dev/null 2>&1 || true
            ;;
        idle* | mixed* | allocated* | completing*)
            if ((!started)); then
                ready=1
                break
            fi
            if timeout 20 srun -N1 -n1 -t 1 hostname </dev/null >/dev/null 2>&1; then
                ready=1
                break
            fi
            ;;
    esac
    sleep 1
done
((ready)) || fail "node ${host} not ready after ${timeout_s}s (last sinfo state: '${state:-none}')"

log "cluster up: node ${host} (${cpus} CPUs, ${mem_mb} MB), partition debug, state in ${dir}"
echo "export SLURM_CONF=${conf}"
