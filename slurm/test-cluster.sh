#!/usr/bin/env bash
# A real, single-host Slurm test cluster for hpctrain's tests and for trying
# things by hand: two virtual nodes n1, n2 (2 CPUs, 4000 MB, 2 fake GPUs each)
# run by two slurmd on this host, one slurmctld, munge for auth, and accounting
# (slurmdbd on a MariaDB of its own), so that `sacct` answers as on real sites.
# The GPUs are fake (symlinks to /dev/null, scheduling only) but typed, with core
# affinity: nodes print `Gres=gpu:tesla:2(S:0)` as production clusters do.
# TaskPlugin=task/affinity binds each task to its CPUs; MaxArraySize is
# Slurm's default (1001). Partitions: debug (default, all nodes), short (n1,
# 10 min) and urgent (all nodes, a higher PriorityTier): an urgent job that
# needs a node preempts debug's jobs (PreemptMode=REQUEUE, GraceTime=20 s on
# debug: SIGTERM, then 20 s later the requeue).
#
#   slurm/test-cluster.sh start    install packages if missing, write config, start daemons
#   slurm/test-cluster.sh stop     stop the daemons this script started (by PID file)
#   slurm/test-cluster.sh status   daemons + sinfo; exit 0 if the cluster is up, 1 otherwise
#
# Needs root (writes /etc/slurm/slurm.conf so that plain sbatch/squeue/... work
# from any shell, and appends n1/n2 to /etc/hosts). State lives in
# $HPCTRAIN_SLURM_DIR (default /tmp/hpctrain-slurm) and is kept across
# stop/start, so job ids keep increasing. Remove that directory by hand (while
# stopped) for a truly fresh cluster.
#
# No systemd: all daemons are started directly. Measured facts behind the
# config: /work/shared/notes/slurm-test-cluster.md (in the dev environment).
set -euo pipefail

STATE_DIR="$(realpath -m "${HPCTRAIN_SLURM_DIR:-/tmp/hpctrain-slurm}")"
CPUS="${HPCTRAIN_TEST_CPUS:-2}"  # CPUs each virtual node declares (render_slurm_conf)
CONF_DIR=/etc/slurm
SLURM_CONF_FILE="$CONF_DIR/slurm.conf"
GRES_CONF_FILE="$CONF_DIR/gres.conf"
MARKER="# hpctrain-test-cluster"
NODES=(n1 n2)
PACKAGES=(slurmctld slurmd slurm-client munge slurmdbd mariadb-server)
DB_PORT=13306      # MariaDB on 127.0.0.1 only (not the default 3306: a system MariaDB may use it)
DBD_PORT=16819     # slurmdbd on 127.0.0.1
DB_PASS=hpctrain-test  # a throwaway local test database, reachable only from this host
START_TIMEOUT_S="${HPCTRAIN_SLURM_START_TIMEOUT:-60}"
STOP_TIMEOUT_S=20

log() { echo "test-cluster: $*" >&2; }
die() { log "ERROR: $*"; exit 1; }

# ---------------------------------------------------------------- processes

# pid_alive PID COMM: true if PID exists, is not a zombie, and its comm is COMM.
# (kill -0 alone is not enough: zombies linger here for seconds, and PIDs get reused.)
pid_alive() {
    local pid="$1" comm="$2" stat state
    [[ "$pid" =~ ^[0-9]+$ ]] || return 1
    [[ -r "/proc/$pid/stat" ]] || return 1
    stat="$(cat "/proc/$pid/stat" 2>/dev/null)" || return 1
    # field 3 follows "(comm) "; comm itself may contain spaces/parens.
    state="${stat##*) }"
    state="${state%% *}"
    [[ "$state" != "Z" && "$state" != "X" ]] || return 1
    [[ "$(cat "/proc/$pid/comm" 2>/dev/null)" == "$comm" ]]
}

# read_pid FILE: print the pid in FILE (empty if missing/garbage).
read_pid() {
    local f="$1" pid=""
    if [[ -r "$f" ]]; then read -r pid <"$f" 2>/dev/null || true; fi
    if [[ "$pid" =~ ^[0-9]+$ ]]; then echo "$pid"; fi
}

# pidfile_alive FILE COMM: true if the pid in FILE is a live COMM process.
pidfile_alive() {
    local pid
    pid="$(read_pid "$1")"
    [[ -n "$pid" ]] && pid_alive "$pid" "$2"
}

# wait_pidfile FILE COMM TIMEOUT: wait until FILE names a live COMM process.
wait_pidfile() {
    local f="$1" comm="$2" timeout="$3" t=0
    while ! pidfile_alive "$f" "$comm"; do
        ((t >= timeout * 10)) && return 1
        sleep 0.1
        t=$((t + 1))
    done
}

# stop_pidfile FILE COMM: SIGTERM the process named in FILE (only if it is COMM),
# wait until it is really gone, SIGKILL after STOP_TIMEOUT_S, remove FILE.
stop_pidfile() {
    local f="$1" comm="$2" pid t=0
    pid="$(read_pid "$f")"
    if [[ -n "$pid" ]] && pid_alive "$pid" "$comm"; then
        log "stopping $comm (pid $pid)"
        kill -TERM "$pid" 2>/dev/null || true
        while pid_alive "$pid" "$comm"; do
            if ((t >= STOP_TIMEOUT_S * 10)); then
                log "$comm (pid $pid) still alive after ${STOP_TIMEOUT_S}s: SIGKILL"
                kill -KILL "$pid" 2>/dev/null || true
                t=0
                while pid_alive "$pid" "$comm" && ((t < 50)); do sleep 0.1; t=$((t + 1)); done
                break
            fi
            sleep 0.1
            t=$((t + 1))
        done
    fi
    rm -f "$f"
}

# ------------------------------------------------------------------- setup

require_root() {
    [[ "$(id -u)" == 0 ]] || die "must run as root (writes /etc/slurm, /etc/hosts, starts daemons)"
}

install_packages() {
    local missing=() p
    for p in "${PACKAGES[@]}"; do
        if [[ "$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)" != *"ok installed"* ]]; then
            missing+=("$p")
        fi
    done
    ((${#missing[@]} == 0)) && return 0
    log "installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${PACKAGES[@]}" >/dev/null
}

ensure_hosts() {
    local n
    for n in "${NODES[@]}"; do
        if ! grep -Eq "^[[:space:]]*127\.0\.0\.1([[:space:]].*)?[[:space:]]$n([[:space:]]|\$)" /etc/hosts; then
            # Append only (/etc/hosts may be a bind mount: never rewrite it).
            if [[ -s /etc/hosts && "$(tail -c1 /etc/hosts | od -An -c | tr -d ' ')" != '\n' ]]; then
                echo >>/etc/hosts
            fi
            echo "127.0.0.1 $n" >>/etc/hosts
            log "added '127.0.0.1 $n' to /etc/hosts"
        fi
    done
}

make_dirs() {
    local n
    mkdir -p "$STATE_DIR"/{state,log,dev}
    for n in "${NODES[@]}"; do mkdir -p "$STATE_DIR/spool/slurmd-$n"; done
    # Fake GPUs: gres/gpu needs File= naming a character device; /dev/null symlinks do.
    ln -sfn /dev/null "$STATE_DIR/dev/nvidia0"
    ln -sfn /dev/null "$STATE_DIR/dev/nvidia1"
}

render_slurm_conf() {
    local host
    host="$(hostname -s)"
    cat <<EOF
$MARKER state_dir=$STATE_DIR
# Written by hpctrain slurm/test-cluster.sh -- do not edit; it is rewritten on start.
ClusterName=hpctrain-test
SlurmctldHost=$host(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# Without this a requeued job waits ~121 s (Reason=BeginTime).
AuthInfo=cred_expire=5
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=2,bf_interval=1
# a cancelled job step gets SIGKILL 5 s after SIGTERM (default 30 s): nodes leave COMPLETING sooner
KillWait=5
ProctrackType=proctrack/linuxproc
# binds each task to its CPUs, as production sites do (srun must then be given its CPU count)
TaskPlugin=task/affinity
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
# Without this each job takes a whole node.
DefMemPerCPU=500
# Allows declaring more CPUs/memory than the host has.
SlurmdParameters=config_overrides
ReturnToService=2
# Refuse at submit (like many real sites) jobs that break partition limits
# (e.g. -p short --time=20), instead of leaving them pending forever.
EnforcePartLimits=ALL
MailProg=/bin/true
MpiDefault=none
# Slurm's default: the largest array index is 1000 (sweeps beyond it are split into several arrays)
MaxArraySize=1001
GresTypes=gpu
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStoragePort=$DBD_PORT
# GPUs in sacct's AllocTRES (gres/gpu=N), as GPU sites account them: what GPU-hours are computed from
AccountingStorageTRES=gres/gpu
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/filetxt
JobCompLoc=$STATE_DIR/jobcomp.txt
StateSaveLocation=$STATE_DIR/state
SlurmctldPidFile=$STATE_DIR/slurmctld.pid
SlurmctldLogFile=$STATE_DIR/log/slurmctld.log
SlurmdPidFile=$STATE_DIR/slurmd-%n.pid
SlurmdSpoolDir=$STATE_DIR/spool/slurmd-%n
SlurmdLogFile=$STATE_DIR/log/slurmd-%n.log
# CPUs per virtual node: HPCTRAIN_TEST_CPUS (default 2, the host's); more, declared through config_overrides, lets
# many light jobs run at once (benchmarks/pull_grid.py's 64 workers: HPCTRAIN_TEST_CPUS=32), memory to match
NodeName=n[1-2] NodeHostname=$host NodeAddr=127.0.0.1 Port=[17001-17002] CPUs=$CPUS Sockets=1 CoresPerSocket=$CPUS ThreadsPerCore=1 RealMemory=$((CPUS * 2000)) Gres=gpu:tesla:2 State=UNKNOWN
# Preemption as production sites run it: a job of a higher tier requeues debug's jobs, which first get
# SIGTERM and GraceTime seconds to checkpoint (debug and short are tier 1: they never preempt each other)
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP PriorityTier=1 GraceTime=20
PartitionName=short Nodes=n1 Default=NO MaxTime=10 State=UP PriorityTier=1
PartitionName=urgent Nodes=ALL Default=NO MaxTime=INFINITE State=UP PriorityTier=2
EOF
}

render_gres_conf() {
    cat <<EOF
$MARKER state_dir=$STATE_DIR
# Fake GPUs (scheduling only, no CUDA): symlinks to /dev/null.
AutoDetect=off
# A type and core affinity, so that nodes print gpu:tesla:2(S:0) as real clusters do.
# A type and core affinity, so that nodes print gpu:tesla:2(S:0) as production clusters do.
NodeName=n[1-2] Name=gpu Type=tesla File=$STATE_DIR/dev/nvidia[0-1] Cores=0-1
EOF
}

render_slurmdbd_conf() {
    cat <<EOF
$MARKER state_dir=$STATE_DIR
AuthType=auth/munge
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort=$DBD_PORT
SlurmUser=root
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$DB_PORT
StorageUser=slurm
StoragePass=$DB_PASS
StorageLoc=slurm_acct_db
PidFile=$STATE_DIR/slurmdbd.pid
LogFile=$STATE_DIR/log/slurmdbd.log
EOF
}

# install_conf DEST CONTENT: back up a foreign DEST once, write CONTENT if it differs.
# Returns 0 if the file changed, 1 if it was already up to date.
install_conf() {
    local dest="$1" content="$2" tmp first=""
    mkdir -p "$(dirname "$dest")"
    [[ -r "$dest" ]] && { IFS= read -r first <"$dest" || true; }
    if [[ -e "$dest" && "$first" != "$MARKER"* ]]; then
        if [[ ! -e "$dest.pre-hpctrain" ]]; then
            cp -a "$dest" "$dest.pre-hpctrain"
            log "backed up existing $dest to $dest.pre-hpctrain"
        fi
    fi
    if [[ -e "$dest" ]] && [[ "$(cat "$dest")" == "$content" ]]; then
        return 1
    fi
    tmp="$(mktemp "$dest.XXXXXX")"
    printf '%s\n' "$content" >"$tmp"
    chmod 0644 "$tmp"
    mv -f "$tmp" "$dest"
    return 0
}

# Refuse to clobber the config of a cluster that runs from another state dir.
check_other_cluster() {
    local other
    [[ -r "$SLURM_CONF_FILE" ]] || return 0
    other="$(head -n1 "$SLURM_CONF_FILE" | sed -n "s|^$MARKER state_dir=||p")"
    if [[ -n "$other" && "$other" != "$STATE_DIR" ]] && pidfile_alive "$other/slurmctld.pid" slurmctld; then
        die "a test cluster from state dir $other is running; stop it first (HPCTRAIN_SLURM_DIR=$other $0 stop)"
    fi
}

# ------------------------------------------------------------------ daemons

start_munge() {
    if munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
        return 0  # already working (ours from an earlier start, or the system's)
    fi
    log "starting munged"
    install -d -o munge -g munge -m 0755 /run/munge
    local pid
    pid="$(read_pid /run/munge/munged.pid)"
    if [[ -n "$pid" ]] && pid_alive "$pid" munged; then
        die "munged (pid $pid) runs but 'munge -n | unmunge' fails"
    fi
    # --force: start even if a stale socket/lock from a dead munged is left.
    # 9>&-: daemons must not inherit the lock fd (else the next start/stop blocks forever).
    runuser -u munge -- /usr/sbin/munged --force 9>&-
    wait_pidfile /run/munge/munged.pid munged 10 || die "munged did not start"
    # Remember that we started it, so that stop stops it (and only then).
    cp /run/munge/munged.pid "$STATE_DIR/munged.pid"
    local t=0
    until munge -n 2>/dev/null | unmunge >/dev/null 2>&1; do
        ((t >= 50)) && die "munged started but 'munge -n | unmunge' fails"
        sleep 0.1
        t=$((t + 1))
    done
}

# MariaDB with its data in the state dir, on 127.0.0.1:$DB_PORT, for slurmdbd only.
start_mariadb() {
    local dir="$STATE_DIR/mariadb" t=0  # owned by mysql: data, socket, pid file and log
    pidfile_alive "$dir/mysqld.pid" mariadbd && return 0
    install -d -o mysql -g mysql "$dir"
    if [[ ! -d "$dir/data/mysql" ]]; then
        log "initialising the accounting database in $dir/data"
        mariadb-install-db --user=mysql --datadir="$dir/data" --auth-root-authentication-method=socket \
            --skip-test-db >"$STATE_DIR/log/mariadb-install.log" 2>&1 ||
            die "mariadb-install-db failed; see $STATE_DIR/log/mariadb-install.log"
    fi
    log "starting mariadbd (127.0.0.1:$DB_PORT)"
    rm -f "$dir/mysqld.pid"
    runuser -u mysql -- /usr/sbin/mariadbd --no-defaults --datadir="$dir/data" --socket="$dir/mysqld.sock" \
        --pid-file="$dir/mysqld.pid" --bind-address=127.0.0.1 --port="$DB_PORT" --skip-name-resolve \
        --innodb-buffer-pool-size=32M --log-error="$dir/mariadbd.log" 9>&- </dev/null >/dev/null 2>&1 &
    until mariadb --socket="$dir/mysqld.sock" -e 'select 1' >/dev/null 2>&1; do
        ((t >= 300)) && die "mariadbd did not start; see $dir/mariadbd.log"
        sleep 0.1
        t=$((t + 1))
    done
    mariadb --socket="$dir/mysqld.sock" -e "CREATE DATABASE IF NOT EXISTS slurm_acct_db;
        CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY '$DB_PASS';
        GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';" || die "cannot create the accounting database"
}

start_slurmdbd() {
    local t=0
    if ! pidfile_alive "$STATE_DIR/slurmdbd.pid" slurmdbd; then
        log "starting slurmdbd (127.0.0.1:$DBD_PORT)"
        rm -f "$STATE_DIR/slurmdbd.pid"
        /usr/sbin/slurmdbd 9>&-
        wait_pidfile "$STATE_DIR/slurmdbd.pid" slurmdbd 15 ||
            die "slurmdbd did not start; see $STATE_DIR/log/slurmdbd.log"
    fi
    # The cluster must be known to the database before slurmctld registers with it.
    until sacctmgr -n -P show cluster format=cluster >/dev/null 2>&1; do
        ((t >= 150)) && die "slurmdbd does not answer; see $STATE_DIR/log/slurmdbd.log"
        sleep 0.1
        t=$((t + 1))
    done
    if ! sacctmgr -n -P show cluster format=cluster 2>/dev/null | grep -qx hpctrain-test; then
        sacctmgr -i add cluster hpctrain-test >/dev/null || die "sacctmgr add cluster failed"
    fi
}

start_slurmctld() {
    pidfile_alive "$STATE_DIR/slurmctld.pid" slurmctld && return 0
    log "starting slurmctld (state kept in $STATE_DIR/state)"
    rm -f "$STATE_DIR/slurmctld.pid"
    # No -c: recover saved state, so job ids keep increasing across restarts.
    /usr/sbin/slurmctld -f "$SLURM_CONF_FILE" 9>&-
    wait_pidfile "$STATE_DIR/slurmctld.pid" slurmctld 15 ||
        die "slurmctld did not start; see $STATE_DIR/log/slurmctld.log"
    cancel_recovered_jobs
}

# A fresh controller recovers the jobs of the cluster's last life (a session's tests or benchmarks cut
# short): they would hold the nodes while the next test run waits for its own. Cancel them before any
# node registers.
cancel_recovered_jobs() {
    local ids="" t=0
    while ((t < 20)); do
        if ids=$(squeue -h -o %A 2>/dev/null); then break; fi
        sleep 0.5
        t=$((t + 1))
    done
    ids=$(echo "$ids" | sort -u | tr '\n' ' ')
    [[ -n "${ids// /}" ]] || return 0
    log "cancelling jobs recovered from this cluster's last run: $ids"
    # shellcheck disable=SC2086
    scancel $ids >/dev/null 2>&1 || true
}

start_slurmd() {
    local n="$1"
    pidfile_alive "$STATE_DIR/slurmd-$n.pid" slurmd && return 0
    log "starting slurmd -N $n"
    rm -f "$STATE_DIR/slurmd-$n.pid"
    /usr/sbin/slurmd -f "$SLURM_CONF_FILE" -N "$n" 9>&-
    wait_pidfile "$STATE_DIR/slurmd-$n.pid" slurmd 15 ||
        die "slurmd -N $n did not start; see $STATE_DIR/log/slurmd-$n.log"
}

stop_slurm_daemons() {
    local n
    for n in "${NODES[@]}"; do stop_pidfile "$STATE_DIR/slurmd-$n.pid" slurmd; done
    stop_pidfile "$STATE_DIR/slurmctld.pid" slurmctld
    stop_pidfile "$STATE_DIR/slurmdbd.pid" slurmdbd
    stop_pidfile "$STATE_DIR/mariadb/mysqld.pid" mariadbd
}

# slurmd_registered_since NODE EPOCH: true if NODE's slurmd registered at or after EPOCH.
# (After a restart slurmctld shows the saved state, "idle" included, before slurmd registers.)
slurmd_registered_since() {
    local ts
    ts="$(scontrol -o show node "$1" 2>/dev/null | grep -o 'SlurmdStartTime=[^ ]*' || true)"
    ts="${ts#SlurmdStartTime=}"
    [[ -n "$ts" && "$ts" != None ]] || return 1
    (($(date -d "$ts" +%s 2>/dev/null || echo 0) >= $2))
}

# wait_nodes_up [EPOCH [NODE...]]: wait until every node is usable and each NODE named (the ones whose
# slurmd was just started) registered since EPOCH; resume nodes left drained/down by old state.
wait_nodes_up() {
    local since="${1:-0}" deadline=$((SECONDS + START_TIMEOUT_S)) out n st ok
    local -A fresh=()
    shift || true
    for n in "$@"; do fresh[$n]=1; done
    while :; do
        out="$(sinfo -h -N -o '%N %t' 2>/dev/null | sort -u || true)"
        ok=1
        for n in "${NODES[@]}"; do
            st="$(awk -v n="$n" '$1 == n {print $2; exit}' <<<"$out")"
            case "$st" in
                idle | mix | alloc | comp)
                    if ((since > 0)) && [[ -n "${fresh[$n]:-}" ]] && ! slurmd_registered_since "$n" "$since"; then
                        ok=0
                    fi
                    ;;
                drain | drng | drain\* | down | inval | fail | failg)
                    ok=0
                    log "node $n is '$st': resuming"
                    scontrol update nodename="$n" state=resume >/dev/null 2>&1 || true
                    ;;
                *) ok=0 ;;
            esac
        done
        ((ok)) && return 0
        if ((SECONDS >= deadline)); then
            log "nodes not up after ${START_TIMEOUT_S}s:"
            echo "$out" >&2
            return 1
        fi
        sleep 0.5
    done
}

# ---------------------------------------------------------------- commands

cmd_start() {
    require_root
    local t0=$SECONDS changed=0
    install_packages
    mkdir -p "$STATE_DIR"
    exec 9>"$STATE_DIR/.lock"
    flock -w 120 9 || die "another start/stop holds $STATE_DIR/.lock"  # serialize concurrent starts/stops
    check_other_cluster
    make_dirs
    ensure_hosts
    install_conf "$SLURM_CONF_FILE" "$(render_slurm_conf)" && changed=1
    install_conf "$GRES_CONF_FILE" "$(render_gres_conf)" && changed=1
    install_conf "$CONF_DIR/slurmdbd.conf" "$(render_slurmdbd_conf)" && changed=1
    chmod 0600 "$CONF_DIR/slurmdbd.conf"  # slurmdbd refuses a readable one (it holds the DB password)
    if ((changed)) && pidfile_alive "$STATE_DIR/slurmctld.pid" slurmctld; then
        log "config changed: restarting slurm daemons (state is kept)"
        stop_slurm_daemons
    fi
    start_munge
    start_mariadb
    start_slurmdbd
    start_slurmctld
    local n since=0 started=()
    for n in "${NODES[@]}"; do
        if ! pidfile_alive "$STATE_DIR/slurmd-$n.pid" slurmd; then
            # Slurm's timestamps have 1 s resolution: allow for rounding.
            ((since > 0)) || since=$(($(date +%s) - 1))
            start_slurmd "$n"
            started+=("$n")
        fi
    done
    wait_nodes_up "$since" "${started[@]}" || die "cluster did not come up; logs in $STATE_DIR/log"
    echo "test-cluster: up in $((SECONDS - t0))s: nodes ${NODES[*]} (2 CPUs, 4000 MB, gpu:tesla:2(S:0) each)," \
        "partitions debug (default) + short + urgent (preempts debug: requeue, 20 s grace), accounting (sacct);" \
        "state $STATE_DIR"
}

cmd_stop() {
    require_root
    if [[ ! -d "$STATE_DIR" ]]; then
        log "nothing to stop ($STATE_DIR does not exist)"
        return 0
    fi
    exec 9>"$STATE_DIR/.lock"
    flock -w 120 9 || die "another start/stop holds $STATE_DIR/.lock"
    stop_slurm_daemons
    if [[ -e "$STATE_DIR/munged.pid" ]]; then
        stop_pidfile "$STATE_DIR/munged.pid" munged
    fi
    echo "test-cluster: stopped (state kept in $STATE_DIR)"
}

cmd_status() {
    local up=0 n pid
    show() {  # show LABEL PIDFILE COMM
        pid="$(read_pid "$2")"
        if [[ -n "$pid" ]] && pid_alive "$pid" "$3"; then
            printf '  %-16s running (pid %s)\n' "$1" "$pid"
        else
            printf '  %-16s not running\n' "$1"
            return 1
        fi
    }
    echo "state dir: $STATE_DIR"
    echo "daemons:"
    if [[ -e "$STATE_DIR/munged.pid" ]]; then
        show "munged (ours)" "$STATE_DIR/munged.pid" munged || up=1
    elif munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
        printf '  %-16s running (not started by this script)\n' munged
    else
        printf '  %-16s not running\n' munged
        up=1
    fi
    show mariadbd "$STATE_DIR/mariadb/mysqld.pid" mariadbd || up=1
    show slurmdbd "$STATE_DIR/slurmdbd.pid" slurmdbd || up=1
    show slurmctld "$STATE_DIR/slurmctld.pid" slurmctld || up=1
    for n in "${NODES[@]}"; do show "slurmd -N $n" "$STATE_DIR/slurmd-$n.pid" slurmd || up=1; done
    echo "sinfo:"
    if ! pidfile_alive "$STATE_DIR/slurmctld.pid" slurmctld; then
        echo "  (slurmctld not running)"
    elif ! sinfo 2>&1 | sed 's/^/  /'; then
        up=1
    fi
    if ((up == 0)); then
        local out st
        out="$(sinfo -h -N -o '%N %t' 2>/dev/null || true)"
        for n in "${NODES[@]}"; do
            st="$(awk -v n="$n" '$1 == n {print $2; exit}' <<<"$out")"
            case "$st" in idle | mix | alloc | comp) ;; *) up=1 ;; esac
        done
    fi
    if ((up == 0)); then echo "cluster: UP"; else echo "cluster: DOWN"; fi
    return "$up"
}

case "${1:-}" in
    start) cmd_start ;;
    stop) cmd_stop ;;
    status) cmd_status ;;
    *)
        echo "usage: $0 start|stop|status   (state dir: \$HPCTRAIN_SLURM_DIR, default /tmp/hpctrain-slurm)" >&2
        exit 2
        ;;
esac
