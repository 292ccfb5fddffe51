#!/bin/bash
# packfs Slurm task prolog (slurm.conf: TaskProlog=...). Runs as the job's user before each
# task; what it prints as `export NAME=VALUE` lands in the task's environment:
# PACKFS_<NAME>=MOUNT_ROOT/JOBID/NAME for every dataset the prolog mounted.
SCRIPT=task-prolog
. "$(dirname "$0")/common.sh" 2>/dev/null || exit 0
check_job_id 2>/dev/null
read_settings
jobdir=$(job_dir)
for mnt in "$jobdir"/*; do
    [ -d "$mnt" ] || continue
    name=$(basename "$mnt" | tr 'a-z.-' 'A-Z__')
    echo "export PACKFS_$name=$mnt"
done
exit 0
