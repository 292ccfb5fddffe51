#!/bin/bash
# A batch job that mounts its own dataset, with no prolog and no root (needs fusermount3 on the
# nodes and /dev/fuse mode 0666, as the fuse3 package sets it). One mount per node.
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=4
#SBATCH --gres=gpu:4
set -euo pipefail
INDEX=/gpfs/datasets/imagenet/train.packfs-index
MNT=/tmp/$USER-$SLURM_JOB_ID/imagenet

# Unmount on every node whatever happens (a failed mount on one node, the training, scancel or
# the time limit, as long as the batch script gets to run its trap). The staged copy goes with
# the mount.
cleanup() {
    srun --ntasks-per-node=1 --ntasks="$SLURM_JOB_NUM_NODES" bash -c \
        "packfs umount --if-mounted $MNT; rmdir $MNT /tmp/$USER-$SLURM_JOB_ID 2>/dev/null || true"
}
trap cleanup EXIT
# One mount per node; each returns once its mount answers, or fails with the reason. --stage-in:
# packfs makes the stage directory, private to you, under /dev/shm (or the node's NVMe).
srun --ntasks-per-node=1 --ntasks="$SLURM_JOB_NUM_NODES" bash -c \
    "mkdir -p $MNT && packfs mount --stage-in /dev/shm $INDEX $MNT"

srun python train.py --data "$MNT/train"
