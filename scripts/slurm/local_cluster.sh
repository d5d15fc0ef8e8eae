#!/usr/bin/env bash
# local_cluster.sh -- a real, throw-away Slurm cluster on this one machine.
#
#   scripts/slurm/local_cluster.sh up [NODES]   # NODES = 1 or 2 (default 2)
#   scripts/slurm/local_cluster.sh down
#   scripts/slurm/local_cluster.sh status
#   scripts/slurm/local_cluster.sh on NODE CMD...   # run CMD as if on NODE (e.g. a torchrun agent per node)
#
# Used by the `slurm`-marked tests and by CI (as root) to run multi-node jobs
# for real: sbatch/srun/squeue/scontrol from this (the host) shell, with
# SLURM_CONF pointing at the generated slurm.conf (`up` prints it and writes
# `export SLURM_CONF=...` to $STATE_DIR/env, so `source "$STATE_DIR/env"`).
#
# Layout (everything is created by `up` and removed again by `down`):
#
#   host netns   munged (own key + socket in $STATE_DIR/munge, as user munge)
#                slurmctld, hostname "slurmctl" (own UTS namespace)
#                bridge lslurm0 10.213.0.1/24  <- the only addresses we use
#   netns lslurm-node1   slurmd, hostname node1, eth0 10.213.0.11 (veth)
#   netns lslurm-node2   slurmd, hostname node2, eth0 10.213.0.12 (veth)
#
# Why namespaces rather than several slurmd on 127.0.0.1: multi-node code
# (Lightning's SLURMEnvironment, torch.distributed) takes MASTER_ADDR from the
# first host of SLURM_NODELIST, and needs `hostname` and that name to resolve,
# inside every node, to an address the other nodes can reach.  So each node
# gets its own network namespace (own address), UTS namespace (own hostname)
# and mount namespace (its own /etc/hosts, bind-mounted, naming all nodes and
# the controller).  Jobs inherit all three from slurmd.  The filesystem is
# shared, so absolute paths (e.g. /work/main/.venv/bin/python) work in jobs.
#
# Notes:
#  * Namespaces are entered with `nsenter --net=/run/netns/X`, not
#    `ip netns exec` (which remounts /sys; slurmd then fails on cgroups).
#  * Nothing needs systemd and nothing system-wide is touched: /etc/munge,
#    /etc/slurm and any system munged/slurmd are left alone (own ports, own
#    munge socket and key).
#  * `down` stops only processes this script started (PIDs in $STATE_DIR/pids,
#    checked against their command line) plus whatever still runs inside its
#    node namespaces (job steps), then deletes namespaces, bridge and state.
#  * MinJobAge is 4 s: finished jobs vanish from squeue/scontrol after ~4 s
#    (there is no accounting database, so no sacct).
#
#  * `on NODE CMD...` runs CMD in NODE's network, UTS and mount namespaces, as
#    its job steps run, without Slurm: how multi-node torchrun is tried here
#    (scripts/torchrun/train.sh on node1 and node2, rendezvous at node1:PORT).
#
# Environment knobs: LOCAL_SLURM_DIR (state dir, default /tmp/project-local-slurm),
# LOCAL_SLURM_SUBNET (first three octets, default 10.213.0), LOCAL_SLURM_CPUS
# (CPUs per node, default 3: the Slurm tutorial's 3 processes per node; they
# share the machine's cores), LOCAL_SLURM_CRED_EXPIRE (seconds, default 10;
# this is also how long a requeued job waits before it may start again).
set -Eeuo pipefail

STATE_DIR=${LOCAL_SLURM_DIR:-/tmp/project-local-slurm}
SUBNET=${LOCAL_SLURM_SUBNET:-10.213.0}
CPUS_PER_NODE=${LOCAL_SLURM_CPUS:-3}
CRED_EXPIRE=${LOCAL_SLURM_CRED_EXPIRE:-10}
UP_TIMEOUT=${LOCAL_SLURM_UP_TIMEOUT:-60}

BRIDGE=lslurm0
NETNS_PREFIX=lslurm-           # netns lslurm-node1, lslurm-node2
VETH_PREFIX=lslurm-v           # host side veth lslurm-v1, lslurm-v2
CTLD_HOST=slurmctl
CTLD_ADDR=$SUBNET.1
CTLD_PORT=16817                # not 6817, so a system slurmctld can coexist
SLURMD_PORT=6818               # inside the node namespaces: no clash possible
MARKER=.local-slurm-cluster    # only a dir holding this file is ever rm -rf'd

SLURM_CONF_FILE=$STATE_DIR/slurm.conf
MUNGE_DIR=$STATE_DIR/munge
MUNGE_SOCKET=$MUNGE_DIR/munge.socket
PID_DIR=$STATE_DIR/pids
LOG_DIR=$STATE_DIR/log

log() { echo "local_cluster: $*" >&2; }
die() { log "error: $*"; exit 1; }

node_names() { local i; for ((i = 1; i <= $1; i++)); do echo "node$i"; done; }
node_addr() { echo "$SUBNET.$((10 + ${1#node}))"; }

# --------------------------------------------------------------- preflight --

require_root() {
    [[ $(id -u) -eq 0 ]] || { echo "local_cluster: '$1' needs root (run: sudo $0 $1)" >&2; exit 1; }
}

require_tools() {
    local tool
    for tool in slurmctld slurmd munged sinfo scontrol; do
        command -v "$tool" >/dev/null ||
            die "$tool not installed: run \`make system-deps\` as root (scripts/system-deps.sh)"
    done
    for tool in ip nsenter unshare setpriv; do
        command -v "$tool" >/dev/null ||
            die "$tool not found: run \`make system-deps\` as root (needs iproute2, util-linux)"
    done
    id munge >/dev/null 2>&1 || die "no 'munge' user: run \`make system-deps\` as root"
}

# ----------------------------------------------------------- process helpers --

# pid_alive NAME: the PID recorded for NAME is alive and still ours (its command
# line mentions our state dir, so a recycled PID is never mistaken for it).
pid_alive() {
    local file=$PID_DIR/$1.pid pid
    [[ -f $file ]] || return 1
    pid=$(<"$file")
    [[ -r /proc/$pid/cmdline ]] && tr '\0' ' ' <"/proc/$pid/cmdline" | grep -qF -- "$STATE_DIR"
}

# started_alive NAME: the process launched as NAME has not exited (for use right
# after launch, when it may not have exec'd into the daemon yet).
started_alive() { running "$(<"$PID_DIR/$1.pid")"; }

# launch NAME CMD...: start CMD detached (own session, stdio to the log dir)
# and record its PID.  CMD must exec its way to the daemon (no extra fork).
launch() {
    local name=$1; shift
    setsid "$@" </dev/null >>"$LOG_DIR/$name.out" 2>&1 &
    echo $! >"$PID_DIR/$name.pid"
}

# running PID: the process exists and is not a zombie (exited slurmstepds are
# reparented to PID 1, which in some containers/VMs never reaps them).
running() {
    local state
    state=$(awk '/^State:/ {print $2}' "/proc/$1/status" 2>/dev/null) || return 1
    [[ -n $state && $state != Z && $state != X ]]
}

# stop_pids GRACE PID...: SIGTERM, wait up to GRACE seconds, then SIGKILL.
stop_pids() {
    local grace=$1 pid i alive; shift
    (($#)) || return 0
    kill -TERM "$@" 2>/dev/null || true
    for ((i = 0; i < grace * 10; i++)); do
        alive=0
        for pid; do running "$pid" && alive=1; done
        ((alive)) || return 0
        sleep 0.1
    done
    kill -KILL "$@" 2>/dev/null || true
}

stop_named() {
    local name=$1
    if pid_alive "$name"; then
        stop_pids 5 "$(<"$PID_DIR/$name.pid")"
    fi
    rm -f "$PID_DIR/$name.pid"
}

# wait_for SECONDS NAME CMD...: poll CMD until it succeeds; give up early if
# the daemon recorded as NAME has died.
wait_for() {
    local secs=$1 name=$2 i; shift 2
    for ((i = 0; i < secs * 5; i++)); do
        "$@" >/dev/null 2>&1 && return 0
        started_alive "$name" || { log "$name exited during start-up"; return 1; }
        sleep 0.2
    done
    log "timed out after ${secs}s waiting for $name"
    return 1
}

# ------------------------------------------------------------------ network --

bridge_filtered() { [[ $(cat /proc/sys/net/bridge/bridge-nf-call-iptables 2>/dev/null) == 1 ]]; }

setup_network() {
    local nodes=$1 node n
    if ip -4 addr show | grep -qF " $SUBNET."; then
        die "addresses in $SUBNET.0/24 already in use on this host; set LOCAL_SLURM_SUBNET (e.g. 10.214.0)"
    fi
    [[ -d /run/netns ]] || touch "$STATE_DIR/created-run-netns"
    ip link add "$BRIDGE" type bridge
    ip addr add "$CTLD_ADDR/24" dev "$BRIDGE"
    ip link set "$BRIDGE" up
    # With br_netfilter loaded (e.g. by Docker, which also sets FORWARD to DROP)
    # node-to-node traffic on the bridge goes through iptables' FORWARD chain.
    if bridge_filtered && command -v iptables >/dev/null; then
        iptables -I FORWARD 1 -i "$BRIDGE" -o "$BRIDGE" -j ACCEPT
        touch "$STATE_DIR/iptables-rule"
    fi
    for node in $(node_names "$nodes"); do
        n=${node#node}
        ip netns add "$NETNS_PREFIX$node"
        ip link add "$VETH_PREFIX$n" type veth peer name "${VETH_PREFIX}p$n"
        ip link set "${VETH_PREFIX}p$n" netns "$NETNS_PREFIX$node"
        ip link set "$VETH_PREFIX$n" master "$BRIDGE" up
        ip -n "$NETNS_PREFIX$node" link set "${VETH_PREFIX}p$n" name eth0
        ip -n "$NETNS_PREFIX$node" addr add "$(node_addr "$node")/24" dev eth0
        ip -n "$NETNS_PREFIX$node" link set eth0 up
        ip -n "$NETNS_PREFIX$node" link set lo up
    done
}

# PIDs of everything running inside our node namespaces (slurmd, job steps).
netns_pids() {
    local ns
    for ns in $(our_netns); do ip netns pids "$ns" 2>/dev/null || true; done
}

our_netns() { ip netns list 2>/dev/null | awk -v p="$NETNS_PREFIX" 'index($1, p) == 1 {print $1}'; }

teardown_network() {
    local ns link
    for ns in $(our_netns); do ip netns delete "$ns" 2>/dev/null || true; done
    for link in $(ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | cut -d@ -f1 | grep "^$VETH_PREFIX" || true); do
        ip link delete "$link" 2>/dev/null || true
    done
    if [[ -f $STATE_DIR/iptables-rule ]]; then
        iptables -D FORWARD -i "$BRIDGE" -o "$BRIDGE" -j ACCEPT 2>/dev/null || true
    fi
    ip link show "$BRIDGE" >/dev/null 2>&1 && ip link delete "$BRIDGE"
    # `ip netns add` turns /run/netns into a mount point; undo that if we made
    # it and nobody else has put a namespace there since.
    if [[ -f $STATE_DIR/created-run-netns && -d /run/netns && -z $(ls -A /run/netns) ]]; then
        umount /run/netns 2>/dev/null || true
        rmdir /run/netns 2>/dev/null || true
    fi
    return 0
}

# ------------------------------------------------------------------- config --

write_config() {
    local nodes=$1 node
    mkdir -p "$PID_DIR" "$LOG_DIR" "$STATE_DIR/ctld" "$STATE_DIR/spool"
    for node in $(node_names "$nodes"); do mkdir -p "$STATE_DIR/spool/$node"; done

    # /etc/hosts as seen inside every node (bind-mounted over the real one).
    {
        echo "127.0.0.1 localhost"
        echo "::1 localhost ip6-localhost ip6-loopback"
        echo "$CTLD_ADDR $CTLD_HOST"
        for node in $(node_names "$nodes"); do echo "$(node_addr "$node") $node"; done
    } >"$STATE_DIR/hosts"

    cat >"$SLURM_CONF_FILE" <<EOF
# Generated by scripts/slurm/local_cluster.sh -- do not edit (rewritten on 'up').
ClusterName=local
SlurmctldHost=$CTLD_HOST($CTLD_ADDR)
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$MUNGE_SOCKET,cred_expire=$CRED_EXPIRE
StateSaveLocation=$STATE_DIR/ctld
SlurmdSpoolDir=$STATE_DIR/spool/%n
SlurmctldPidFile=$STATE_DIR/slurmctld.pid
SlurmdPidFile=$STATE_DIR/spool/%n/slurmd.pid
SlurmctldLogFile=$LOG_DIR/slurmctld.log
SlurmdLogFile=$LOG_DIR/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
# No cgroups, no accounting, no MPI: plain processes on a shared filesystem.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SwitchType=switch/none
MpiDefault=none
MailProg=/bin/true
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
# Fast turn-around for tests: start batch jobs at once, look at pending jobs
# (e.g. requeued ones whose BeginTime has passed) every second.
SchedulerParameters=batch_sched_delay=0,sched_interval=1,bf_interval=1
MinJobAge=4
# A task stopped with SIGTERM (a requeue, scancel) writes its checkpoint before it exits: SIGKILL comes only after
# Slurm's default wait, so a slow moment of the machine cannot cut that write short.
KillWait=30
Waittime=0
InactiveLimit=0
SlurmdTimeout=30
SlurmctldTimeout=30
ReturnToService=2
JobRequeue=1
# Trust the CPU counts below, whatever slurmd detects.
SlurmdParameters=config_overrides
EOF
    for node in $(node_names "$nodes"); do
        echo "NodeName=$node NodeHostname=$node NodeAddr=$(node_addr "$node") CPUs=$CPUS_PER_NODE State=UNKNOWN"
    done >>"$SLURM_CONF_FILE"
    echo "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP" >>"$SLURM_CONF_FILE"
    chmod 644 "$SLURM_CONF_FILE" "$STATE_DIR/hosts"

    {
        echo "export SLURM_CONF=$SLURM_CONF_FILE"
        echo "export LOCAL_SLURM_NODES=$nodes"
        echo "export LOCAL_SLURM_DIR=$STATE_DIR"
    } >"$STATE_DIR/env"
}

# ------------------------------------------------------------------ daemons --

start_munge() {
    # Own key and socket: independent of (and invisible to) any system munged.
    # munged insists on strict ownership/permissions of these paths.
    mkdir -p "$MUNGE_DIR"
    dd if=/dev/urandom of="$MUNGE_DIR/munge.key" bs=1024 count=1 status=none
    chown -R munge:munge "$MUNGE_DIR"
    chmod 755 "$MUNGE_DIR"        # clients (any user) must reach the socket
    chmod 400 "$MUNGE_DIR/munge.key"
    launch munged setpriv --reuid=munge --regid=munge --init-groups \
        munged --foreground --socket="$MUNGE_SOCKET" --key-file="$MUNGE_DIR/munge.key" \
        --pid-file="$MUNGE_DIR/munged.pid" --log-file="$MUNGE_DIR/munged.log" \
        --seed-file="$MUNGE_DIR/munged.seed"
    wait_for 10 munged test -S "$MUNGE_SOCKET" || return 1
}

start_slurmctld() {
    # Own UTS namespace so that its hostname matches SlurmctldHost.
    # shellcheck disable=SC2016  # $0/$1 are expanded by the inner sh
    launch slurmctld unshare --uts sh -c \
        'hostname "$0" && exec slurmctld -D -i -f "$1"' "$CTLD_HOST" "$SLURM_CONF_FILE"
    wait_for 20 slurmctld scontrol ping || return 1
}

start_slurmd() {
    local node=$1
    # Network namespace (own address) + mount namespace (own /etc/hosts)
    # + UTS namespace (own hostname); job steps inherit all three.
    # shellcheck disable=SC2016  # $0..$2 are expanded by the inner sh
    launch "slurmd-$node" nsenter --net="/run/netns/$NETNS_PREFIX$node" \
        unshare --mount --uts --propagation private sh -c \
        'mount --bind "$1" /etc/hosts && hostname "$0" && exec slurmd -D -N "$0" -f "$2"' \
        "$node" "$STATE_DIR/hosts" "$SLURM_CONF_FILE"
}

idle_count() { sinfo -h -N -o '%N %T' 2>/dev/null | awk '$2 == "idle"' | sort -u | wc -l; }

wait_nodes_idle() {
    local nodes=$1 i node
    for ((i = 0; i < UP_TIMEOUT * 5; i++)); do
        (($(idle_count) >= nodes)) && return 0
        for node in $(node_names "$nodes"); do
            started_alive "slurmd-$node" || { log "slurmd on $node exited during start-up"; return 1; }
        done
        sleep 0.2
    done
    log "timed out after ${UP_TIMEOUT}s waiting for $nodes idle node(s); sinfo says:"
    sinfo -N >&2 2>&1 || true
    return 1
}

dump_logs() {
    local f
    # The daemons run in the foreground, so their stdout/stderr (*.out) hold
    # everything their log files do, plus errors from before those opened.
    for f in "$LOG_DIR"/*.out; do
        [[ -s $f ]] || continue
        echo "----- tail of $f -----" >&2
        tail -n 30 "$f" >&2
    done
}

# ----------------------------------------------------------------- commands --

# Refuse to use (and later rm -rf) a non-empty directory we did not create.
check_state_dir() {
    if [[ -d $STATE_DIR && ! -f $STATE_DIR/$MARKER && -n $(ls -A "$STATE_DIR") ]]; then
        die "$STATE_DIR exists and was not made by this script; not touching it (set LOCAL_SLURM_DIR)"
    fi
}

is_up() {
    local name
    [[ -f $STATE_DIR/env && -f $STATE_DIR/nodes ]] || return 1
    for name in munged slurmctld $(node_names "$(<"$STATE_DIR/nodes")" | sed 's/^/slurmd-/'); do
        pid_alive "$name" || return 1
    done
    SLURM_CONF=$SLURM_CONF_FILE scontrol ping >/dev/null 2>&1
}

cmd_status() {
    if is_up; then
        log "up ($(<"$STATE_DIR/nodes") node(s)); source $STATE_DIR/env"
        SLURM_CONF=$SLURM_CONF_FILE sinfo -N >&2 || true
        return 0
    fi
    log "down"
    return 1
}

cmd_up() {
    local nodes=${1:-2} node start=$SECONDS
    [[ $nodes == 1 || $nodes == 2 ]] || die "NODES must be 1 or 2 (got '$nodes')"
    [[ $CPUS_PER_NODE =~ ^[1-9][0-9]*$ ]] || die "LOCAL_SLURM_CPUS must be a positive integer"
    [[ $CRED_EXPIRE =~ ^[0-9]+$ ]] || die "LOCAL_SLURM_CRED_EXPIRE must be a number of seconds"
    require_root up
    require_tools
    check_state_dir

    if is_up; then
        if [[ $(<"$STATE_DIR/nodes") == "$nodes" ]]; then
            log "already up with $nodes node(s)"
            cat "$STATE_DIR/env"
            return 0
        fi
        log "up with $(<"$STATE_DIR/nodes") node(s); restarting with $nodes"
    fi
    cmd_down >/dev/null 2>&1 || true

    mkdir -p "$STATE_DIR"
    touch "$STATE_DIR/$MARKER"
    echo "$nodes" >"$STATE_DIR/nodes"
    export SLURM_CONF=$SLURM_CONF_FILE

    # On any failure: show the logs, then take down whatever did come up.
    trap 'log "bring-up failed"; dump_logs; cmd_down >/dev/null 2>&1 || true; exit 1' ERR
    write_config "$nodes"
    setup_network "$nodes"
    start_munge
    start_slurmctld
    for node in $(node_names "$nodes"); do start_slurmd "$node"; done
    wait_nodes_idle "$nodes"
    trap - ERR

    log "up: $nodes idle node(s) in $((SECONDS - start))s; run: source $STATE_DIR/env"
    cat "$STATE_DIR/env"
}

cmd_down() {
    require_root down
    check_state_dir
    # Nodes first (slurmd, then whatever job steps remain in their namespaces),
    # then the controller, then munge.
    local pids=() name
    for name in slurmd-node1 slurmd-node2; do
        pid_alive "$name" && pids+=("$(<"$PID_DIR/$name.pid")")
        rm -f "$PID_DIR/$name.pid"
    done
    # shellcheck disable=SC2207
    pids+=($(netns_pids))
    stop_pids 2 "${pids[@]}"
    stop_named slurmctld
    stop_named munged
    teardown_network
    if [[ -f $STATE_DIR/$MARKER ]]; then
        rm -rf "$STATE_DIR"
    elif [[ -d $STATE_DIR ]]; then
        rmdir "$STATE_DIR" 2>/dev/null || true   # empty: made by `mkdir` of a caller
    fi
    log "down"
}

# on NODE CMD...: CMD as NODE's job steps run (its address, hostname and /etc/hosts), in this directory and
# environment, without Slurm.
cmd_on() {
    local node=${1:-}
    (($# >= 2)) || usage
    shift
    require_root on
    [[ -e /run/netns/$NETNS_PREFIX$node ]] || die "no node '$node' here: bring the cluster up first (make slurm-up)"
    # shellcheck disable=SC2016  # $0, $1 and $@ are expanded by the inner sh
    exec nsenter --net="/run/netns/$NETNS_PREFIX$node" unshare --mount --uts --propagation private sh -c \
        'mount --bind "$1" /etc/hosts && hostname "$0" && shift && exec "$@"' "$node" "$STATE_DIR/hosts" "$@"
}

usage() {
    sed -n '2,7p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
}

main() {
    case ${1:-} in
        up) shift; cmd_up "$@" ;;
        down) cmd_down ;;
        status) cmd_status ;;
        on) shift; cmd_on "$@" ;;
        *) usage ;;
    esac
}

main "$@"
