#!/usr/bin/env bash
# Stop the one-node SLURM cluster that scripts/slurm_start.sh started (jobs, slurmd, slurmctld, slurmdbd, its
# MariaDB server, its munged).
#
# Usage:  scripts/slurm_stop.sh [--keep-munge] [STATE_DIR]
#
# STATE_DIR defaults to $SLURM_CLUSTER_DIR, else /tmp/steer_hydra-slurm. Cancels the cluster's jobs, stops
# slurmd and slurmctld by the pids in STATE_DIR/slurmd.pid and STATE_DIR/slurmctld.pid (TERM, up to 10 s,
# then KILL), ends any slurmstepd left by that slurmd, then stops slurmdbd (STATE_DIR/slurmdbd.pid, same) and the
# MariaDB server (STATE_DIR/mariadb/mariadbd.pid; TERM, up to 30 s, then KILL), and stops munged only when
# slurm_start.sh started it (STATE_DIR/munged.pid) unless --keep-munge is given. Only processes named in those
# pid files (and the slurmstepd of this cluster) are touched; a system MariaDB or slurmdbd is left alone.
# Leaves slurm.conf, slurmdbd.conf, state, the accounting database and logs in STATE_DIR.
# Exits 0, also when nothing runs.
set -euo pipefail

log() { printf 'slurm_stop: %s\n' "$*" >&2; }

keep_munge=0
if [[ "${1:-}" == "--keep-munge" ]]; then
    keep_munge=1
    shift
fi
dir="${1:-${SLURM_CLUSTER_DIR:-/tmp/steer_hydra-slurm}}"
export PATH="${PATH}:/usr/sbin:/sbin"

if [[ ! -d "${dir}" ]]; then
    log "no state dir ${dir}: nothing to stop"
    exit 0
fi
dir="$(cd "${dir}" && pwd)"
conf="${dir}/slurm.conf"

# alive PID: PID exists and is not a zombie (PID 1 may reap late; a zombie keeps its name in /proc/PID/comm).
alive() {
    local stat
    [[ -n "$1" ]] || return 1
    stat="$(cat "/proc/$1/stat" 2>/dev/null)" || return 1
    stat="${stat##*) }"
    [[ "${stat:0:1}" != "Z" ]]
}

# alive_pid NAME PID: PID is alive and its command name is NAME.
alive_pid() {
    [[ -n "$2" ]] && [[ "$(cat "/proc/$2/comm" 2>/dev/null)" == "$1" ]] && alive "$2"
}

# stop_pid NAME PID [SECONDS]: TERM, wait up to SECONDS (default 10), then KILL and wait up to 5 s more.
stop_pid() {
    local name="$1" pid="$2" wait_s="${3:-10}"
    alive_pid "${name}" "${pid}" || return 0
    log "stopping ${name} (pid ${pid})"
    kill -TERM "${pid}" 2>/dev/null || true
    for _ in $(seq 1 $((wait_s * 10))); do
        alive_pid "${name}" "${pid}" || return 0
        sleep 0.1
    done
    log "${name} (pid ${pid}) ignored TERM for ${wait_s} s: KILL"
    kill -KILL "${pid}" 2>/dev/null || true
    for _ in $(seq 1 50); do
        alive_pid "${name}" "${pid}" || return 0
        sleep 0.1
    done
    log "${name} (pid ${pid}) still there after KILL"
    return 1
}

pid_from() {
    if [[ -s "$1" ]]; then
        tr -dc '0-9' <"$1"
    fi
}

status=0
ctld_pid="$(pid_from "${dir}/slurmctld.pid")"
slurmd_pid="$(pid_from "${dir}/slurmd.pid")"
dbd_pid="$(pid_from "${dir}/slurmdbd.pid")"
db_pid="$(pid_from "${dir}/mariadb/mariadbd.pid")"

# Cancel the jobs first so that their slurmstepd and job processes end cleanly.
if [[ -f "${conf}" ]] && alive_pid slurmctld "${ctld_pid}"; then
    mapfile -t jobs < <(SLURM_CONF="${conf}" timeout 10 squeue -h -o '%i' 2>/dev/null || true)
    if ((${#jobs[@]} > 0)); then
        log "cancelling ${#jobs[@]} job(s)"
        SLURM_CONF="${conf}" timeout 10 scancel "${jobs[@]}" 2>/dev/null || true
        for _ in $(seq 1 20); do
            [[ -z "$(SLURM_CONF="${conf}" timeout 5 squeue -h -o '%i' 2>/dev/null || true)" ]] && break
            sleep 0.5
        done
    fi
fi

stop_pid slurmd "${slurmd_pid}" || status=1

# Left-over steps (scancel could not run, e.g. slurmctld had died): the slurmstepd processes of this cluster
# carry its SLURM_CONF (inherited from slurmd). slurmstepd ignores TERM, so its job processes get TERM (then
# KILL after 5 s) and slurmstepd itself gets KILL.
steps=()
for p in /proc/[0-9]*; do
    [[ "$(cat "${p}/comm" 2>/dev/null)" == "slurmstepd" ]] || continue
    if tr '\0' '\n' 2>/dev/null <"${p}/environ" | grep -qxF "SLURM_CONF=${conf}"; then
        steps+=("${p#/proc/}")
    fi
done
if ((${#steps[@]} > 0)); then
    declare -A parent=() keep=()
    for s in /proc/[0-9]*/stat; do
        line="$(cat "${s}" 2>/dev/null)" || continue
        pid="${s#/proc/}"
        read -r _ ppid _ <<<"${line##*) }"
        parent["${pid%/stat}"]="${ppid}"
    done
    for pid in "${steps[@]}"; do keep["${pid}"]=1; done
    changed=1
    while ((changed)); do
        changed=0
        for pid in "${!parent[@]}"; do
            if [[ -z "${keep[${pid}]:-}" && -n "${keep[${parent[${pid}]}]:-}" ]]; then
                keep["${pid}"]=1
                changed=1
            fi
        done
    done
    for pid in "${steps[@]}"; do unset "keep[${pid}]"; done
    job_pids=("${!keep[@]}")
    log "ending ${#steps[@]} left-over slurmstepd and ${#job_pids[@]} job process(es)"
    if ((${#job_pids[@]} > 0)); then
        kill -TERM "${job_pids[@]}" 2>/dev/null || true
        for _ in $(seq 1 50); do
            left=0
            for pid in "${job_pids[@]}"; do alive "${pid}" && left=1; done
            ((left)) || break
            sleep 0.1
        done
    fi
    kill -KILL "${job_pids[@]}" "${steps[@]}" 2>/dev/null || true
    sleep 0.2
    for pid in "${job_pids[@]}" "${steps[@]}"; do
        if alive "${pid}"; then
            log "process ${pid} still there after KILL"
            status=1
        fi
    done
fi

stop_pid slurmctld "${ctld_pid}" || status=1
rm -f "${dir}/slurmd.pid" "${dir}/slurmctld.pid"

# Accounting after slurmctld, which hands slurmdbd its last job records when it stops.
stop_pid slurmdbd "${dbd_pid}" || status=1
rm -f "${dir}/slurmdbd.pid"
stop_pid mariadbd "${db_pid}" 30 || status=1
rm -f "${dir}/mariadb/mariadbd.pid"

if ((!keep_munge)) && [[ -f "${dir}/munged.pid" ]]; then
    stop_pid munged "$(pid_from "${dir}/munged.pid")" || status=1
    rm -f "${dir}/munged.pid"
fi

if ((status)); then
    log "some processes did not stop"
    exit 1
fi
log "stopped (state and logs kept in ${dir})"
