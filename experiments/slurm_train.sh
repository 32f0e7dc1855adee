#!/bin/bash
# Train one vitjax run under SLURM: one process per task, each holding its task's devices.
#
#   sbatch --nodes=4 --ntasks-per-node=1 --gpus-per-node=8 --cpus-per-task=16 experiments/slurm_train.sh CONFIG WORKDIR
#   sbatch --nodes=2 --ntasks-per-node=8 --gpus-per-task=1 experiments/slurm_train.sh CONFIG WORKDIR   # one per GPU
#   sbatch -n 2 experiments/slurm_train.sh configs/vit_digits.py workdirs/vit_digits      # one node, 2 CPU processes
#   sbatch ... experiments/slurm_train.sh configs/vit_s16_imagenet.py /shared/w/vit_s16 --config.sharding=fsdp
#
# The layout is sbatch's (the script sets none, so the same line works on one node and on many). WORKDIR must be
# on a filesystem every node sees. jax.distributed finds the other processes from SLURM's variables
# (`--multihost` with no address). Every process reads its rows of each global batch, so the curve is that of one
# machine with the same global batch size, and a checkpoint resumes on any node or process count. The log is
# process 0's; the other processes print only their warnings and errors, each line naming its process.
#
# Faults: SLURM sends SIGTERM two minutes before the time limit (--signal) and on `scontrol requeue`; every process
# finishes its step, the step is checkpointed, and they exit 75. A process that dies (a lost node) makes the others
# stop with one line within --peer_timeout (75 too). A process whose grain worker is killed (the out-of-memory
# killer) exits 75 as well, after checkpointing its last step when it runs alone. On 75, or a task killed by a
# signal, the job requeues itself and the same command resumes from the checkpoint; any other status ends the job:
# 0 done, 2 a config or data problem (one "error:" line), 3 the loss diverged, 74 the workdir's disk is full or
# cannot be written.
# PYTHON names the interpreter (default: python, as the job's PATH finds it).
#
#SBATCH --job-name=vitjax
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

echo "$(date '+%F %T') job ${SLURM_JOB_ID:-?} (restart ${SLURM_RESTART_COUNT:-0}): ${SLURM_NTASKS:-?} tasks on ${SLURM_JOB_NUM_NODES:-?} nodes ($SLURM_JOB_NODELIST)"
srun --kill-on-bad-exit=0 "${PYTHON:-python}" -m vitjax.main --config="$config" --workdir="$workdir" --multihost "$@"
rc=$?
echo "$(date '+%F %T') exit status $rc"
# 75: preempted, out of time or a process lost; above 128: a task killed by a signal (srun's status for it)
if [ "$rc" -eq 75 ] || [ "$rc" -gt 128 ]; then
  echo "$(date '+%F %T') requeueing: the same command resumes from the last checkpoint"
  scontrol requeue "$SLURM_JOB_ID"
fi
exit "$rc"
