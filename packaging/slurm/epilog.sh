#!/bin/bash
# packfs Slurm epilog (slurm.conf: Epilog=...). Runs as root after a job: unmounts what the
# prolog mounted (also mounts whose daemon died), removes the staged copies and the job's
# directory. Idempotent, and always exits 0: a failing epilog drains the node, and a mount that
# is already gone is not the node's fault.
SCRIPT=epilog
. "$(dirname "$0")/common.sh" || exit 0
check_job_id
read_settings

jobdir=$(job_dir)
# Every packfs mount under the job's directory, from the kernel's table (a stale mount cannot
# be listed with ls).
while read -r mnt; do
    "$PACKFS" umount --if-mounted "$mnt" >/dev/null 2>&1 ||
        "$PACKFS" umount --if-mounted --lazy "$mnt" 2>&1 | while read -r l; do say "$l"; done
done < <(awk -v dir="$jobdir/" '$0 ~ / - fuse\.packfs / && index($5, dir) == 1 { print $5 }' /proc/self/mountinfo)

# --one-file-system: never descend into a mount that is still there.
rm -rf --one-file-system "${STAGE_ROOT:?}/$SLURM_JOB_ID" 2>/dev/null
rm -rf --one-file-system "$jobdir" 2>/dev/null
if [ -n "$LOG_ROOT" ]; then
    # Logs stay for the admin; they are small.
    :
fi
exit 0
