#!/bin/bash
# A batch job that mounts its own dataset, with no prolog and no root (needs fusermount3 on the
# nodes and /dev/fuse mode 0666, as the fuse3 package sets it). One mount per node.
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=4
#SBATCH --gres=gpu:4
set -euo pipefail
INDEX=/gpfs/datasets/imagenet/train.packfs-index
MNT=/tmp/$USER-$SLURM_JOB_ID/imagenet
# Made on each node by mktemp (0700, a name nobody can make first): packfs refuses a stage
# directory another user owns, and /dev/shm/$USER-$SLURM_JOB_ID is a name anyone could take.
STAGE_GLOB="/dev/shm/packfs-$SLURM_JOB_ID.*"

# Unmount on every node whatever happens (a failed mount on one node, the training, scancel or
# the time limit, as long as the batch script gets to run its trap).
cleanup() {
    srun --ntasks-per-node=1 --ntasks="$SLURM_JOB_NUM_NODES" bash -c \
        "packfs umount --if-mounted $MNT; rm -rf --one-file-system $STAGE_GLOB /tmp/$USER-$SLURM_JOB_ID"
}
trap cleanup EXIT
# One mount per node; each returns once its mount answers, or fails with the reason.
srun --ntasks-per-node=1 --ntasks="$SLURM_JOB_NUM_NODES" bash -c \
    "mkdir -p $MNT && packfs mount --stage \$(mktemp -d /dev/shm/packfs-$SLURM_JOB_ID.XXXXXX) $INDEX $MNT"

srun python train.py --data "$MNT/train"
