#!/bin/bash
# packfs Slurm task prolog (slurm.conf: TaskProlog=...). Runs as the job's user before each
# task; what it prints as `export NAME=VALUE` lands in the task's environment, `print TEXT` on
# the task's output:
# - PACKFS_<NAME>=MOUNT_ROOT/JOBID/NAME for every dataset the prolog mounted and that answers;
# - for one that failed (the prolog left NAME.error) or whose mount is gone: no variable (a
#   script that reads it fails at once, not on an empty directory), its name in
#   PACKFS_FAILED (space-separated), and why, printed once per node (by task 0 of the node).
SCRIPT=task-prolog
. "$(dirname "$0")/common.sh" 2>/dev/null || exit 0
check_job_id 2>/dev/null
read_settings
jobdir=$(job_dir)
failed=
for mnt in "$jobdir"/*; do
    # NAME (a mountpoint) or NAME.error (a failed one, whose directory may be gone): one name.
    case "$mnt" in
        *.error) mnt=${mnt%.error} ;;
        *) [ -d "$mnt" ] || continue ;;
    esac
    name=$(basename "$mnt")
    var=PACKFS_$(printf '%s' "$name" | tr 'a-z.-' 'A-Z__')
    case " $failed " in *" $name "*) continue ;; esac
    if [ ! -e "$mnt.error" ] && awk -v m="$mnt" '$5 == m && / - fuse\.packfs / { found = 1 } END { exit !found }' /proc/self/mountinfo; then
        echo "export $var=$mnt"
        continue
    fi
    failed="${failed:+$failed }$name"
    echo "unset $var"
    if [ "${SLURM_LOCALID:-0}" = 0 ]; then
        if [ -r "$mnt.error" ]; then
            while IFS= read -r line; do echo "print packfs: $line"; done < "$mnt.error"
        else
            echo "print packfs: $name is not mounted at $mnt on ${SLURMD_NODENAME:-$(hostname)}"
        fi
    fi
done
[ -n "$failed" ] && echo "export PACKFS_FAILED=\"$failed\""
exit 0
