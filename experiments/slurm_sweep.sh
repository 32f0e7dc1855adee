#!/bin/bash
# A hyperparameter sweep on a SLURM cluster as a job array: every array task is one sweep worker on one study in
# one PostgreSQL database (Optuna's storage), so the tasks share the trials, whatever their number and whenever
# they start (vitjax.sweep; docs/guides/sweeps.md, "Many machines").
#
#   sbatch --array=0-7 --gpus-per-task=1 experiments/slurm_sweep.sh CONFIG SWEEP_DIR postgresql://USER:PASS@DBHOST/vitjax
#   sbatch --array=0-3 experiments/slurm_sweep.sh configs/vit_digits.py /shared/sweeps/vit_digits URL --config.num_epochs=30
#
# SWEEP_DIR must be on a filesystem every node sees: a trial a stopped task leaves resumes from its checkpoint in
# another task. Each task runs one trial at a time (--workers=1) on the devices SLURM gives it. A task that is
# preempted, reaches its time limit (SIGTERM from --signal) or is requeued checkpoints its trial and exits 75; the
# script then requeues that array task, and its trial is taken up again from its checkpoint (by this task or
# another). The report (python -m vitjax.sweep --mode=report --sweep_dir=SWEEP_DIR --storage=URL) counts every
# trial once. PYTHON names the interpreter (default: python).
#
#SBATCH --job-name=vitjax-sweep
#SBATCH --ntasks=1
#SBATCH --time=24:00:00
#SBATCH --signal=TERM@120
#SBATCH --requeue
#SBATCH --open-mode=append
#SBATCH --output=slurm-vitjax-sweep-%A_%a.out

set -uo pipefail
if [ $# -lt 3 ]; then
  echo "usage: sbatch --array=0-N $0 CONFIG SWEEP_DIR POSTGRESQL_URL [--config.FIELD=VALUE ...]" >&2
  exit 2
fi
config=$1
sweep_dir=$2
storage=$3
shift 3

task="${SLURM_ARRAY_JOB_ID:-${SLURM_JOB_ID:-?}}_${SLURM_ARRAY_TASK_ID:-0}"
echo "$(date '+%F %T') sweep worker $task (restart ${SLURM_RESTART_COUNT:-0}) on $(hostname)"
srun "${PYTHON:-python}" -m vitjax.sweep --config="$config" --sweep_dir="$sweep_dir" --storage="$storage" --workers=1 "$@"
rc=$?
echo "$(date '+%F %T') exit status $rc"
if [ "$rc" -eq 75 ] || [ "$rc" -gt 128 ]; then
  echo "$(date '+%F %T') requeueing: the study takes the trial up again from its checkpoint"
  scontrol requeue "$task"
fi
exit "$rc"
