#!/usr/bin/env bash
# Start a real one-node SLURM cluster with accounting (munged, a MariaDB server, slurmdbd, slurmctld, slurmd) on
# this machine; needs root.
#
# Usage:  scripts/slurm_start.sh [STATE_DIR]
#         eval "$(scripts/slurm_start.sh)"      # or: eval "$(scripts/slurm_start.sh | tail -1)"
#
# STATE_DIR defaults to $SLURM_CLUSTER_DIR, else /tmp/steer_hydra-slurm; the `mysql` user must be able to reach it
# (a folder under /tmp is fine, one under /root is not). It holds slurm.conf and slurmdbd.conf (mode 600), the
# controller state (state/), the slurmd spool (slurmd/), the accounting database (mariadb/: data/, mariadbd.sock,
# mariadbd.pid, mariadbd.log; owned by mysql), the database password (slurmdbd.pass, mode 600), pid files and logs
# (slurmctld.log, slurmd.log, slurmdbd.log, munged.log, jobcomp.log).
# Progress goes to stderr; stdout gets exactly one line, the last: `export SLURM_CONF=<STATE_DIR>/slurm.conf`.
# Every SLURM client (srun, sbatch, squeue, sinfo, scancel, sacct, sacctmgr) needs that SLURM_CONF; slurmdbd finds
# slurmdbd.conf beside it.
#
# Installs slurm-wlm and munge when slurmctld is missing, and mariadb-server and slurmdbd when mariadbd or
# slurmdbd is missing (apt-get, non-interactive); creates /etc/munge/munge.key when absent, starts
# `munged --force` when no munged answers (recorded in STATE_DIR/munged.pid so that scripts/slurm_stop.sh stops
# it again). Starts its own MariaDB server (`mariadbd --no-defaults --skip-networking`, datadir, unix socket and
# pid file under STATE_DIR/mariadb, created with mariadb-install-db on first use; the system's /var/lib/mysql and
# /run/mysqld are never used) with a database user `slurm` (random password in STATE_DIR/slurmdbd.pass) for
# the database slurm_acct_db. slurmdbd reaches it through StorageHost=localhost and MYSQL_UNIX_PORT=<that socket>
# (slurmdbd has no socket setting; the password keeps it from ever using another server's socket). Writes
# slurm.conf (node = `hostname -s` at 127.0.0.1, CPUs = max(nproc, 2), RealMemory = 90% of MemTotal, one
# partition `debug`, AccountingStorageType=accounting_storage/slurmdbd, JobAcctGatherType=jobacct_gather/linux)
# and slurmdbd.conf, starts the MariaDB server, then slurmdbd (waits until `sacctmgr list cluster` answers and
# adds the cluster when absent), then slurmctld and slurmd, and waits until `srun -N1 hostname` answers; each
# wait is bounded. Idempotent: with the cluster up and both config files unchanged it only checks the daemons
# and prints the export line; a changed config restarts the daemons (munged stays). Jobs recovered from the saved
# state (a cluster that died without slurm_stop.sh) are cancelled. Job history persists in STATE_DIR/mariadb
# across restarts. On failure it prints the daemons' log tails to stderr and exits 1 (daemons it already started
# keep running: scripts/slurm_stop.sh stops them).
#
# Environment: SLURM_CLUSTER_DIR (state dir), SLURM_START_TIMEOUT (seconds each wait may take, default 60),
# SLURM_CLUSTER_NAME (default steer_hydra), SLURMCTLD_PORT / SLURMD_PORT / SLURMDBD_PORT (default 6817 / 6818 /
# 6819).
# Stop with: scripts/slurm_stop.sh [STATE_DIR]
set -euo pipefail

log() { printf 'slurm_start: %s\n' "$*" >&2; }

dir="${1:-${SLURM_CLUSTER_DIR:-/tmp/steer_hydra-slurm}}"
timeout_s="${SLURM_START_TIMEOUT:-60}"
cluster="${SLURM_CLUSTER_NAME:-steer_hydra}"
ctld_port="${SLURMCTLD_PORT:-6817}"
slurmd_port="${SLURMD_PORT:-6818}"
dbd_port="${SLURMDBD_PORT:-6819}"

if [[ "${EUID}" -ne 0 ]]; then
    log "must run as root (SlurmUser=root, munged)"
    exit 1
fi
export PATH="${PATH}:/usr/sbin:/sbin"

mkdir -p "${dir}"
dir="$(cd "${dir}" && pwd)"
conf="${dir}/slurm.conf"
dbd_conf="${dir}/slurmdbd.conf"
export SLURM_CONF="${conf}"
db_dir="${dir}/mariadb" # owned by mysql: data/, mariadbd.sock, mariadbd.pid, mariadbd.log
db_data="${db_dir}/data"
db_sock="${db_dir}/mariadbd.sock"
db_pid="${db_dir}/mariadbd.pid"
db_log="${db_dir}/mariadbd.log"
pass_file="${dir}/slurmdbd.pass"

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
    for f in "${dir}/slurmctld.log" "${dir}/slurmd.log" "${dir}/slurmdbd.log" "${db_log}" "${dir}/munged.log"; do
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
pkgs=()
command -v slurmctld >/dev/null 2>&1 || pkgs+=(slurm-wlm munge)
if ! command -v slurmdbd >/dev/null 2>&1 || ! command -v mariadbd >/dev/null 2>&1 \
    || ! command -v mariadb-install-db >/dev/null 2>&1; then
    pkgs+=(mariadb-server slurmdbd)
fi
if ((${#pkgs[@]} > 0)); then
    log "installing ${pkgs[*]} with apt-get"
    export DEBIAN_FRONTEND=noninteractive
    if ! apt-get install -y -qq "${pkgs[@]}" >"${dir}/apt.log" 2>&1; then
        apt-get update -qq >>"${dir}/apt.log" 2>&1 || true
        apt-get install -y -qq "${pkgs[@]}" >>"${dir}/apt.log" 2>&1 \
            || { tail -n 20 "${dir}/apt.log" >&2; fail "apt-get install ${pkgs[*]}"; }
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

# 3. slurm.conf and slurmdbd.conf
host="$(hostname -s)"
cpus="$(nproc)"
((cpus >= 2)) || cpus=2
mem_mb="$(awk '/^MemTotal:/ { printf "%d", $2 / 1024 * 0.9 }' /proc/meminfo)"
((mem_mb >= 1000)) || mem_mb=1000
mkdir -p "${dir}/state" "${dir}/slurmd"

# The database password: random, made once, kept so that slurmdbd.conf stays the same across starts.
if [[ ! -s "${pass_file}" ]]; then
    (umask 077 && head -c 18 /dev/urandom | od -An -tx1 | tr -d ' \n' >"${pass_file}.new")
    mv "${pass_file}.new" "${pass_file}"
fi
chmod 600 "${pass_file}"
db_pass="$(tr -dc '0-9a-f' <"${pass_file}")"
[[ -n "${db_pass}" ]] || fail "empty database password in ${pass_file}"

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
JobAcctGatherType=jobacct_gather/linux
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStoragePort=${dbd_port}
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

(
    umask 077
    cat >"${dbd_conf}.new" <<EOF
# slurmdbd of the one-node cluster, written by scripts/slurm_start.sh. Storage is the MariaDB server that script
# starts: StorageHost=localhost and no port means the client library's unix socket, which slurmdbd is started
# with in MYSQL_UNIX_PORT=${db_sock}.
AuthType=auth/munge
DbdHost=localhost
DbdPort=${dbd_port}
SlurmUser=root
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageUser=slurm
StoragePass=${db_pass}
StorageLoc=slurm_acct_db
PidFile=${dir}/slurmdbd.pid
LogFile=${dir}/slurmdbd.log
DebugLevel=info
EOF
)

db_up=0
dbd_up=0
ctld_up=0
slurmd_up=0
pid_alive mariadbd "${db_pid}" && db_up=1
pid_alive slurmdbd "${dir}/slurmdbd.pid" && dbd_up=1
pid_alive slurmctld "${dir}/slurmctld.pid" && ctld_up=1
pid_alive slurmd "${dir}/slurmd.pid" && slurmd_up=1

changed=0
for f in "${conf}" "${dbd_conf}"; do
    if [[ -f "${f}" ]] && cmp -s "${f}" "${f}.new"; then
        rm -f "${f}.new"
    else
        changed=1
    fi
done
if ((changed)); then
    if ((db_up || dbd_up || ctld_up || slurmd_up)); then
        log "slurm.conf or slurmdbd.conf changed: restarting the daemons"
        "$(dirname "$0")/slurm_stop.sh" --keep-munge "${dir}" >&2
        db_up=0
        dbd_up=0
        ctld_up=0
        slurmd_up=0
    fi
    for f in "${conf}" "${dbd_conf}"; do
        if [[ -f "${f}.new" ]]; then
            mv "${f}.new" "${f}"
        fi
    done
fi
chown root:root "${dbd_conf}"
chmod 600 "${dbd_conf}"

# 4. daemons
# wait_for WHAT NAME PIDFILE COMMAND...: run COMMAND (each try bounded by `timeout 5`) until it succeeds, at most
# timeout_s seconds; after a 3 s grace (daemons write their pid file a moment after forking) NAME must be alive.
wait_for() {
    local what="$1" name="$2" pidfile="$3" end grace
    shift 3
    end=$((SECONDS + timeout_s))
    grace=$((SECONDS + 3))
    while ((SECONDS < end)); do
        if timeout 5 "$@" >/dev/null 2>&1; then
            return 0
        fi
        if ((SECONDS > grace)) && ! pid_alive "${name}" "${pidfile}"; then
            fail "${name} is not running"
        fi
        sleep 0.2
    done
    fail "${what} after ${timeout_s}s"
}

# 4a. MariaDB, owned by this script: datadir, socket and pid file under STATE_DIR/mariadb.
db_opts=(--no-defaults --user=mysql --datadir="${db_data}" --innodb-log-file-size=64M --innodb-lock-wait-timeout=900)
db_client=(mariadb --no-defaults --protocol=socket --socket="${db_sock}" --user=root)
if ((!db_up)); then
    id mysql >/dev/null 2>&1 || fail "no mysql user (is mariadb-server installed?)"
    ((${#db_sock} < 108)) || fail "socket path ${db_sock} is too long for a unix socket: use a shorter STATE_DIR"
    mkdir -p "${db_dir}"
    chown mysql:mysql "${db_dir}"
    chmod 750 "${db_dir}"
    if ! runuser -u mysql -- test -w "${db_dir}" 2>/dev/null; then
        fail "the mysql user cannot write ${db_dir}: every folder above it must be searchable by others"
    fi
    if [[ ! -f "${db_data}/.initialised" ]]; then
        log "creating the accounting database in ${db_data}"
        rm -rf "${db_data}"
        if ! mariadb-install-db "${db_opts[@]}" --auth-root-authentication-method=socket --skip-test-db \
            >"${db_dir}/install.log" 2>&1; then
            tail -n 20 "${db_dir}/install.log" >&2
            fail "mariadb-install-db"
        fi
        touch "${db_data}/.initialised"
    fi
    log "starting mariadbd"
    rm -f "${db_pid}"
    setsid mariadbd "${db_opts[@]}" --skip-networking --socket="${db_sock}" --pid-file="${db_pid}" \
        --log-error="${db_log}" </dev/null >/dev/null 2>&1 &
fi
wait_for "mariadbd does not answer on ${db_sock}" mariadbd "${db_pid}" "${db_client[@]}" -e 'SELECT 1'
"${db_client[@]}" <<EOF || fail "cannot set up the database user slurm"
CREATE DATABASE IF NOT EXISTS slurm_acct_db;
CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY '${db_pass}';
ALTER USER 'slurm'@'localhost' IDENTIFIED BY '${db_pass}';
GRANT ALL PRIVILEGES ON slurm_acct_db.* TO 'slurm'@'localhost';
EOF

# 4b. slurmdbd (before slurmctld, which sends it the cluster's jobs), then the cluster's record in it.
if ((!dbd_up)); then
    log "starting slurmdbd"
    rm -f "${dir}/slurmdbd.pid"
    MYSQL_UNIX_PORT="${db_sock}" slurmdbd </dev/null >&2 || fail "slurmdbd did not start"
fi
wait_for "slurmdbd does not answer on port ${dbd_port}" slurmdbd "${dir}/slurmdbd.pid" sacctmgr -n list cluster
if ! timeout 10 sacctmgr -n -P list cluster format=Cluster 2>/dev/null | grep -qxF "${cluster}"; then
    log "adding cluster ${cluster} to the accounting database"
    timeout 10 sacctmgr -i add cluster "${cluster}" >&2 || fail "sacctmgr add cluster ${cluster}"
fi

# 4c. slurmctld and slurmd
started=0
if ((!ctld_up)); then
    log "starting slurmctld"
    rm -f "${dir}/slurmctld.pid"
    slurmctld -f "${conf}" </dev/null >&2 || fail "slurmctld did not start"
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
    slurmd -f "${conf}" </dev/null >&2 || fail "slurmd did not start"
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

log "cluster up: node ${host} (${cpus} CPUs, ${mem_mb} MB), partition debug, accounting by slurmdbd on port ${dbd_port}, state in ${dir}"
echo "export SLURM_CONF=${conf}"
