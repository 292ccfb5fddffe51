# Shared by the packfs Slurm scripts (sourced; not run on its own). Slurm runs prologs and
# epilogs without a search path: everything is called by its full path or with this PATH.
PATH=/usr/sbin:/usr/bin:/sbin:/bin
export PATH

CONF=${PACKFS_SLURM_CONF:-/etc/packfs/slurm.conf}
PACKFS=/usr/bin/packfs
MOUNT_ROOT=/tmp/packfs
STAGE_ROOT=/dev/shm/packfs
LOG_ROOT=
ON_ERROR=continue
PEER_KEY=
SCONTROL=scontrol
JOB_NODES=
JOB_NODES_ERROR=

say() {
    # To syslog when there is one (slurmd's log otherwise gets stderr).
    if [ -S /dev/log ]; then
        logger -t "packfs-${SCRIPT:-slurm}" -- "job ${SLURM_JOB_ID:-?}: $*" 2>/dev/null || true
    fi
    echo "packfs-${SCRIPT:-slurm}: job ${SLURM_JOB_ID:-?}: $*" >&2
}

# The settings of the config file (KEY=VALUE lines; only the known keys are taken).
read_settings() {
    [ -r "$CONF" ] || return 0
    local line key value
    while IFS= read -r line || [ -n "$line" ]; do
        case "$line" in
            PACKFS=*|MOUNT_ROOT=*|STAGE_ROOT=*|LOG_ROOT=*|ON_ERROR=*|PEER_KEY=*|SCONTROL=*)
                key=${line%%=*}
                value=${line#*=}
                printf -v "$key" '%s' "$value"
                ;;
        esac
    done < "$CONF"
}

# Prints `NAME WHEN INDEX STAGE OPTIONS...` for every dataset line.
datasets() {
    [ -r "$CONF" ] || return 0
    local word rest
    while read -r word rest || [ -n "$word" ]; do
        [ "$word" = dataset ] && printf '%s\n' "$rest"
    done < "$CONF"
}

# Whether dataset NAME with rule WHEN is for this job.
wanted() {
    local name=$1 when=$2 p
    case "$when" in
        always) return 0 ;;
        partition=*)
            local IFS=,
            for p in ${when#partition=}; do
                [ "$p" = "${SLURM_JOB_PARTITION:-}" ] && return 0
            done
            return 1
            ;;
        request)
            # sbatch --extra=packfs=imagenet+coco (other --extra text around it is fine).
            local extra=${SLURM_JOB_EXTRA:-} req
            req=$(printf '%s' "$extra" | sed -n 's/.*packfs=\([A-Za-z0-9_.+-]*\).*/\1/p')
            local IFS=+
            for p in $req; do
                [ "$p" = "$name" ] && return 0
            done
            return 1
            ;;
    esac
    return 1
}

# Makes DIR (and its parents) root's, mode 0755, or checks the one there: a real directory of
# root's that nobody else can write in. Another user of the node could have made /dev/shm/packfs
# first (it is world-writable /dev/shm), to own where root stages or mounts; packfs refuses such a
# stage itself, this says so once and plainly.
root_dir() {
    local dir=$1 mode
    if [ -L "$dir" ]; then
        say "$dir is a symbolic link: remove it (root's directories here are never links)"
        return 1
    fi
    [ -d "$dir" ] || mkdir -p -m 0755 "$dir" || { say "cannot create $dir"; return 1; }
    mode=$(stat -c %a "$dir")
    if [ "$(stat -c %u "$dir")" != 0 ] || [ $((8#$mode & 8#022)) -ne 0 ]; then
        say "$dir belongs to uid $(stat -c %u "$dir") with mode $mode: another user could" \
            "redirect what root puts there; remove it (rm -rf $dir) and let the next job make it"
        return 1
    fi
}

job_dir() {
    printf '%s/%s' "$MOUNT_ROOT" "$SLURM_JOB_ID"
}

check_job_id() {
    case "${SLURM_JOB_ID:-}" in
        ''|*[!0-9_]*) say "SLURM_JOB_ID is missing or not a number: nothing to do"; exit 0 ;;
    esac
}

# The job's nodes, one per line in SLURM_NODEID's order, as Slurm expands its node list: into
# JOB_NODES, once per run however many datasets ask; why not into JOB_NODES_ERROR. Called outside
# a command substitution, so what it sets stays set.
expand_job_nodes() {
    [ -n "$JOB_NODES$JOB_NODES_ERROR" ] && return 0
    local out
    if out=$("$SCONTROL" show hostnames "${SLURM_JOB_NODELIST:-}" 2>&1) && [ -n "$out" ]; then
        JOB_NODES=$out
    else
        JOB_NODES_ERROR="cannot expand the job's node list with $SCONTROL show hostnames: $out (set SCONTROL in $CONF)"
    fi
}

# This node's place in the job as "K N": its position in JOB_NODES and the number of nodes.
# Why not, on stderr.
node_place() {
    local k=0 me=-1 node
    if [ -z "$JOB_NODES" ]; then
        echo "$JOB_NODES_ERROR" >&2
        return 1
    fi
    while read -r node; do
        [ -n "$node" ] || continue
        [ "$node" = "${SLURMD_NODENAME:-}" ] && me=$k
        k=$((k + 1))
    done <<< "$JOB_NODES"
    if [ "$me" -lt 0 ]; then
        echo "this node (${SLURMD_NODENAME:-?}) is not in the job's node list" >&2
        return 1
    fi
    printf '%s %s\n' "$me" "$k"
}

# The port the job's nodes serve dataset number I (0-3 among the job's `peers` datasets, in the
# config's order, the same on every node) on: 11000 + (JOBID mod 5440) x 4 + I, as `packfs mount
# --peers slurm` computes it for I = 0. Unique per job and dataset among jobs fewer than 5440
# apart, and below Linux's ephemeral ports (32768 and up), which outgoing connections take.
peer_port() {
    echo $((11000 + SLURM_JOB_ID % 5440 * 4 + $1))
}

# Writes dataset NAME's node list for peers (DIR/NAME.peers: host:port, in share order, the port
# of the job's I-th `peers` dataset) and the job's secret (DIR/peer-secret: derived from
# PEER_KEY and the job id, so every node of the job derives the same one and no other job can).
# Why not, on stderr.
peer_files() {
    local dir=$1 name=$2 i=$3 owner
    if [ "$i" -ge 4 ]; then
        echo "a job may have 4 peers datasets (each has a port of its own): this is its $((i + 1))th" >&2
        return 1
    fi
    if [ -z "$PEER_KEY" ]; then
        echo "no PEER_KEY in $CONF (a key of root's, the same on every node, like munge's)" >&2
        return 1
    fi
    if [ -L "$PEER_KEY" ] || [ ! -f "$PEER_KEY" ]; then
        echo "PEER_KEY $PEER_KEY is not a regular file" >&2
        return 1
    fi
    owner=$(stat -c '%u %a' "$PEER_KEY")
    case "$owner" in
        '0 600'|'0 400') ;;
        *) echo "PEER_KEY $PEER_KEY has owner and mode $owner: make it root's, 0600" >&2; return 1 ;;
    esac
    if [ -z "$JOB_NODES" ]; then
        echo "$JOB_NODES_ERROR" >&2
        return 1
    fi
    (
        umask 077
        printf '%s\n' "$JOB_NODES" | sed -e '/^$/d' -e "s/\$/:$(peer_port "$i")/" > "$dir/$name.peers" &&
            { cat "$PEER_KEY"; printf '\npackfs peers of job %s\n' "$SLURM_JOB_ID"; } |
            sha256sum | cut -d' ' -f1 > "$dir/peer-secret"
    )
}
