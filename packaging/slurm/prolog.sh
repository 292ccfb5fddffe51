#!/bin/bash
# packfs Slurm prolog (slurm.conf: Prolog=/usr/share/doc/packfs/examples/slurm/prolog.sh, or a
# copy of it in /etc/slurm). Runs as root on each node of a job before it starts: mounts the
# datasets /etc/packfs/slurm.conf gives this job at MOUNT_ROOT/JOBID/NAME, owned by the job's
# user and visible to that user only. `packfs mount` returns once a mount answers.
SCRIPT=prolog
. "$(dirname "$0")/common.sh" || exit 0
check_job_id
read_settings

uid=${SLURM_JOB_UID:?SLURM_JOB_UID is not set}
gid=${SLURM_JOB_GID:-$(id -g "$uid" 2>/dev/null || echo "$uid")}
jobdir=$(job_dir)
status=0

root_dir "$MOUNT_ROOT" || exit 0
# Made by root inside a root-owned MOUNT_ROOT, given to the user last: nobody can plant a link.
mkdir -p -m 0700 "$jobdir" || { say "cannot create $jobdir"; exit 0; }

# The stage options of dataset NAME for STAGE (eager, lazy; share: this node's share of the
# images, eager; peers: the share, and the others read from the nodes that stage them), into args.
stage_args() {
    local name=$1 stage=$2 dir=$STAGE_ROOT/$SLURM_JOB_ID place why
    case "$stage" in
        eager|lazy)
            args+=(--stage "$dir/$name" --stage-mode "$stage")
            return
            ;;
    esac
    expand_job_nodes
    if ! place=$(node_place 2>&1); then
        say "mounting $name without staging: $place"
        return
    fi
    args+=(--stage "$dir/$name" --stage-mode eager --stage-share "${place% *}/${place#* }")
    if [ "$stage" = peers ]; then
        peer_datasets=$((peer_datasets + 1))
        if why=$(peer_files "$dir" "$name" $((peer_datasets - 1)) 2>&1); then
            args+=(--peers "@$dir/$name.peers" --peer-secret "$dir/peer-secret")
        else
            say "$name: staging this node's share without peers: $why"
        fi
    fi
}

peer_datasets=0
while read -r name when index stage options; do
    [ -n "$name" ] || continue
    wanted "$name" "$when" || continue
    mnt=$jobdir/$name
    mkdir -p "$mnt"
    args=(mount --allow-other --uid "$uid" --gid "$gid")
    if [ -n "$LOG_ROOT" ] && root_dir "$LOG_ROOT"; then
        args+=(--log-file "$LOG_ROOT/$SLURM_JOB_ID.$name.log")
    fi
    case "$stage" in
        eager|lazy|share|peers)
            # Root's stage, in root's own STAGE_ROOT: the job's user reads it through the mount.
            if root_dir "$STAGE_ROOT" && mkdir -p -m 0700 "$STAGE_ROOT/$SLURM_JOB_ID"; then
                stage_args "$name" "$stage"
            else
                say "mounting $name without staging"
            fi
            ;;
    esac
    # shellcheck disable=SC2206 # the options are words, as in the config file
    args+=($options "$index" "$mnt")
    if out=$("$PACKFS" "${args[@]}" 2>&1); then
        say "mounted $name at $mnt"
        rm -f "$mnt.error"
    else
        say "cannot mount $name ($index): $out"
        printf 'packfs could not mount %s for this job on %s:\n%s\n' \
            "$index" "${SLURMD_NODENAME:-$(hostname)}" "$out" > "$mnt.error"
        [ "$ON_ERROR" = fail ] && status=1
    fi
done < <(datasets)

chown "$uid:$gid" "$jobdir"
exit $status
