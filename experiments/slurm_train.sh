#!/bin/bash
# Train one vitjax run on N nodes x K GPUs under SLURM: one process per node, holding its node's K GPUs.
#
#   sbatch --nodes=4 --gpus-per-node=8 experiments/slurm_train.sh CONFIG WORKDIR [--config.FIELD=VALUE ...]
#   sbatch --nodes=2 --gpus-per-node=8 experiments/slurm_train.sh configs/vit_s16_imagenet.py /shared/w/vit_s16 \
#     --config.sharding=fsdp --config.mesh="(('data', 2), ('fsdp', 8))"
#
# WORKDIR must be on a filesystem every node sees. jax.distributed finds the other processes from SLURM's
# variables (`--multihost` with no address). Every process reads its rows of each global batch, so the curve is
# that of one machine with the same global batch size, and a checkpoint resumes on any node count.
#
# Faults: SLURM sends SIGTERM two minutes before the time limit (--signal); every process finishes its step, the
# step is checkpointed, and they exit 75. A node that dies makes the others stop with one line within
# --peer_timeout (exit 75 too). On 75 the job requeues itself and the same command resumes from the checkpoint;
# any other status (0: done, 2: a config or data problem, 3: the loss diverged) ends the job.
#
#SBATCH --job-name=vitjax
#SBATCH --ntasks-per-node=1
#SBATCH --cpus-per-task=16
#SBATCH --time=24:00:00
#SBATCH --signal=TERM@120
#SBATCH --requeue
#SBATCH --open-mode=append
#SBATCH --output=slurm-vitjax-%j.out

set -uo pipefail
if [ $# -lt 2 ]; then
  echo "usage: sbatch --nodes=N --gpus-per-node=K $0 CONFIG WORKDIR [--config.FIELD=VALUE ...]" >&2
  exit 2
fi
config=$1
workdir=$2
shift 2

echo "$(date '+%F %T') job ${SLURM_JOB_ID:-?} (restart ${SLURM_RESTART_COUNT:-0}) on ${SLURM_JOB_NUM_NODES:-?} nodes: $SLURM_JOB_NODELIST"
srun --kill-on-bad-exit=0 python -m vitjax.main --config="$config" --workdir="$workdir" --multihost "$@"
rc=$?
echo "$(date '+%F %T') exit status $rc"
if [ "$rc" -eq 75 ]; then
  scontrol requeue "$SLURM_JOB_ID"  # preempted or a node lost: the same command resumes from the checkpoint
fi
exit "$rc"
