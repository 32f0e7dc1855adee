"""The SLURM path on a real one-node cluster (Debian's slurm-wlm, started by the tests: tests/slurm_cluster.py):
`sbatch -n 2 experiments/slurm_train.sh` trains as one run of two processes and follows the one-process curve;
`scontrol requeue` in mid-run checkpoints, exits 75, requeues and resumes to the same end; a config error is one
line, exit 2, no requeue. Jobs run the tiny digits run of the other tests (tests/train_helpers.TINY)."""

import csv
import os
import re
import subprocess
import sys
import time

import numpy as np
import pytest
import train_helpers as th

SCRIPT = os.path.join(th.ROOT, "experiments", "slurm_train.sh")
SWEEP_SCRIPT = os.path.join(th.ROOT, "experiments", "slurm_sweep.sh")
pytestmark = pytest.mark.xdist_group("slurm")  # one cluster: its tests run in one worker


def _job_env(data_dir) -> dict:
  """What a job's processes need: this Python first on PATH, the tests' settings (XLA flags, cache), one CPU
  device per process, and no virtual devices of the test process's own."""
  env = th.env(1)
  env["PATH"] = f"{os.path.dirname(sys.executable)}:{env.get('PATH', '')}"
  env["PYTHON"] = sys.executable
  env["TFDS_DATA_DIR"] = data_dir
  return env


def _submit(slurm, tmp_path, data_dir, workdir, *args, sbatch=()):
  out = str(tmp_path / "job-%j.out")
  job = slurm.sbatch(
    "-n", "2", f"--output={out}", *sbatch, SCRIPT, th.CONFIG, workdir, *th.TINY, f"--config.data.data_dir={data_dir}",
    *args, env=_job_env(data_dir), cwd=th.ROOT,
  )  # fmt: skip
  return job, out.replace("%j", str(job))


def _losses(workdir, steps=30):
  got = {r["step"]: r["train/loss"] for r in th.read_metrics(workdir) if "train/loss" in r}
  assert sorted(got) == list(range(1, steps + 1)), sorted(got)
  return np.array([got[s] for s in range(1, steps + 1)])


@pytest.mark.slow  # (the requeue test below, in CI, checks all of this too, around its requeue)
def test_sbatch_two_processes_train_as_one_run(slurm, finished_run, data_dir, tmp_path):
  """sbatch -n 2 on one node: two processes of one CPU device each form one run through --multihost alone, train to
  the end with the losses of one process (one device: tests/test_multiprocess.py shows every topology gives the same
  curve), and the job's output is one log."""
  workdir = str(tmp_path / "w")
  job, out = _submit(slurm, tmp_path, data_dir, workdir)
  fields = slurm.wait(job, "COMPLETED", "FAILED", "CANCELLED", "TIMEOUT")
  text = open(out).read()
  assert fields["JobState"] == "COMPLETED" and fields["ExitCode"] == "0:0", text[-3000:]
  assert "2 tasks on 1 nodes" in text and "2 devices, 2 processes" in text, text[-3000:]
  np.testing.assert_allclose(_losses(workdir), _losses(finished_run), rtol=1e-5)
  assert len(re.findall(r" step 30/30 ", text)) == 1 and text.count("checkpoint best (step") == 1, text[-3000:]


def test_requeue_mid_run_checkpoints_exits_75_and_resumes_to_the_same_end(slurm, finished_run, data_dir, tmp_path):
  """sbatch -n 2 on one node, requeued in mid-run: two processes of one CPU device each form one run through
  --multihost alone, checkpoint at the SIGTERM, exit 75, resume in the next allocation and end with the losses of
  the undisturbed one-process run; the job's output is one log."""
  workdir = str(tmp_path / "w")
  job, out = _submit(slurm, tmp_path, data_dir, workdir, "--config.total_steps=30", "--config.log_every=1")
  deadline = time.time() + 300
  while time.time() < deadline and not re.search(r" step 1[2-9]/30 ", open(out).read() if os.path.exists(out) else ""):
    time.sleep(0.2)
  slurm.run("scontrol", "requeue", str(job))
  fields = slurm.wait(job, "COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", timeout=600)
  text = open(out).read()
  assert fields["JobState"] == "COMPLETED" and int(fields["Restarts"]) >= 1, text[-4000:]
  # SLURM signals every task: each checkpoints the same step and exits 75, and process 0 says it once
  stopped = re.findall(r"SIGTERM: stopped at step (\d+), checkpoint \d+ written", text)
  # (srun's own "Exited with exit code 75" line is not always printed: SLURM may end it first on a loaded machine)
  assert len(stopped) == 1, text[-4000:]
  assert text.count("stopping after the step in flight is checkpointed") == 1, text[-4000:]
  assert f"resumed from {workdir}/checkpoints at step {stopped[0]}" in text, text[-4000:]
  assert "Traceback" not in text, text[-4000:]
  assert "2 tasks on 1 nodes" in text and "2 devices, 2 processes" in text, text[-4000:]
  assert len(re.findall(r" step 30/30 ", text)) == 1 and text.count("checkpoint best (step") == 1, text[-4000:]
  np.testing.assert_allclose(_losses(workdir), _losses(finished_run), rtol=1e-5)
  final = [r for r in th.read_metrics(workdir) if r.get("step") == 30 and "eval/accuracy" in r]
  want = [r for r in th.read_metrics(finished_run) if r.get("step") == 30 and "eval/accuracy" in r]
  assert final[-1]["eval/accuracy"] == pytest.approx(want[-1]["eval/accuracy"], abs=1e-6)


def _task_pid(workdir: str, rank: int) -> int:
  """The PID of the job's task `rank` (its vitjax.main process for `workdir`)."""
  for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
      cmd = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
      env = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
    except OSError:
      continue
    if b"vitjax.main" in cmd and f"--workdir={workdir}".encode() in cmd and f"SLURM_PROCID={rank}".encode() in env:
      return int(pid)
  raise LookupError(f"no task {rank} of {workdir}")


@pytest.mark.slow
def test_a_lost_task_stops_the_other_with_one_line_and_the_job_requeues(slurm, data_dir, tmp_path):
  """SIGKILL to task 1 (a node lost): task 0 stops within --peer_timeout with one line and exit 75, the job
  requeues itself and the next allocation resumes from the last checkpoint to the end."""
  workdir = str(tmp_path / "w")
  args = ("--config.total_steps=120", "--config.checkpoint_every=10", "--config.eval_every=40", "--peer_timeout=5")
  job, out = _submit(slurm, tmp_path, data_dir, workdir, *args)
  deadline = time.time() + 300
  while time.time() < deadline and not re.search(r" step 2[2-9]/120 ", open(out).read() if os.path.exists(out) else ""):
    time.sleep(0.2)
  os.kill(_task_pid(workdir, 1), 9)
  fields = slurm.wait(job, "COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", timeout=600)
  text = open(out).read()
  assert fields["JobState"] == "COMPLETED" and int(fields["Restarts"]) >= 1, text[-4000:]
  lost = [line for line in text.splitlines() if "given no sign of life" in line]
  assert len(lost) == 1 and "process 1 of 2 has given no sign of life" in lost[0], text[-4000:]
  resumed = re.search(r"resumed from \S+ at step (\d+)\b", text)
  assert "requeueing" in text and resumed and int(resumed.group(1)) in (10, 20), text[-4000:]
  assert "Traceback" not in text, text[-4000:]
  assert max(r["step"] for r in th.read_metrics(workdir)) == 120


def test_a_config_error_is_one_line_exit_2_and_no_requeue(slurm, data_dir, tmp_path):
  workdir = str(tmp_path / "w")
  job, out = _submit(slurm, tmp_path, data_dir, workdir, "--config.optim.lrr=1")
  fields = slurm.wait(job, "COMPLETED", "FAILED", "CANCELLED", "TIMEOUT")
  text = open(out).read()
  assert fields["JobState"] == "FAILED" and fields["ExitCode"] == "2:0" and fields["Restarts"] == "0", text
  errors = [line for line in text.splitlines() if line.startswith("error")]  # (srun adds its own "srun: error:")
  assert len(errors) == 1 and "--config.optim.lr " in errors[0], text
  assert "requeueing" not in text and not os.path.exists(workdir)


@pytest.mark.slow
def test_a_time_limit_signals_checkpoints_and_the_job_finishes_in_a_later_allocation(slurm, data_dir, tmp_path):
  """--time=2:00 with --signal=TERM@50: before the limit SLURM sends SIGTERM, the tasks checkpoint and exit 75,
  the job requeues itself and finishes in a later allocation (never TIMEOUT)."""
  workdir = str(tmp_path / "w")
  args = ("--config.total_steps=3000", "--config.log_every=100", "--config.eval_every=1000")
  job, out = _submit(
    slurm,
    tmp_path,
    data_dir,
    workdir,
    *args,
    "--config.checkpoint_every=500",
    sbatch=("--time=2:00", "--signal=TERM@50"),
  )
  fields = slurm.wait(job, "COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", timeout=900)
  text = open(out).read()
  assert fields["JobState"] == "COMPLETED" and int(fields["Restarts"]) >= 1, text[-4000:]
  stopped = re.findall(r"SIGTERM: stopped at step (\d+), checkpoint \d+ written", text)
  assert stopped and all(f"at step {s}" in text for s in stopped), text[-4000:]
  assert "Traceback" not in text, text[-4000:]
  assert max(r["step"] for r in th.read_metrics(workdir)) == 3000


def _wait_all(slurm, job: int, timeout: float = 900) -> None:
  """Waits until no task of array job `job` is queued or running, releasing requeued ones held to a later start."""
  deadline = time.time() + timeout
  while time.time() < deadline:
    rows = slurm.run("squeue", "-h", "-j", str(job), "-o", "%i %T %r", check=False).stdout.split("\n")
    rows = [r.split() for r in rows if r.strip()]
    if not rows:
      return
    for task, state, reason in rows:
      if state == "PENDING" and reason == "BeginTime":
        slurm.release(task)
    time.sleep(1)
  raise TimeoutError(f"array job {job} still queued after {timeout:.0f} s")


@pytest.mark.slow
def test_a_sweep_as_a_job_array_shares_one_study_and_counts_each_trial_once(slurm, data_dir, tmp_path, postgres):
  """sbatch --array=0-3 of experiments/slurm_sweep.sh on one PostgreSQL study: the array tasks share 4 trials, one
  task is requeued in mid-trial and its trial resumes from its checkpoint, and the report counts each trial once."""
  config = tmp_path / "sweep_cfg.py"
  config.write_text(
    f"import sys\nsys.path.insert(0, {os.path.join(th.ROOT, 'configs')!r})\n"
    "from vit_digits import get_config  # noqa: F401\nfrom vitjax import sweep\n\n"
    "def get_sweep():\n  return dict(grid=sweep.values('data.valid_seed', [0, 1, 2, 3]), objective='eval/accuracy',"
    " direction='maximize')\n"
  )
  sweep_dir = str(tmp_path / "sweep")
  run = [*th.TINY, f"--config.data.data_dir={data_dir}", "--config.log_every=5", "--config.total_steps=150"]
  run += ["--config.eval_every=50", "--config.checkpoint_every=20"]
  out = str(tmp_path / "sweep-%A_%a.out")
  job = slurm.sbatch(
    "--array=0-3", f"--output={out}", SWEEP_SCRIPT, str(config), sweep_dir, postgres, *run, env=_job_env(data_dir),
    cwd=th.ROOT,
  )  # fmt: skip
  first = os.path.join(sweep_dir, "trial_0000", "checkpoints")
  deadline = time.time() + 300
  while time.time() < deadline and not (os.path.isdir(first) and any(n.isdigit() for n in os.listdir(first))):
    time.sleep(0.2)
  holder = next(t for t in range(4) if " trial 0 on " in _text(out, job, t))  # the task running trial 0
  slurm.run("scontrol", "requeue", f"{job}_{holder}")
  _wait_all(slurm, job)
  logs = {t: _text(out, job, t) for t in range(4)}
  # SLURM signals the task's worker, which checkpoints its trial, queues it again in the study and exits 75
  assert (
    "trial 0: interrupted, queued again (it resumes from step" in logs[holder]
    and "Exited with exit code 75" in logs[holder]
  ), logs[holder]
  assert re.search(r"\(restart 1\)", logs[holder]), logs[holder][-3000:]
  assert all("Traceback" not in text for text in logs.values()), logs
  report = subprocess.run(
    [sys.executable, "-m", "vitjax.sweep", "--mode=report", f"--sweep_dir={sweep_dir}", f"--storage={postgres}"],
    cwd=th.ROOT, env=th.env(), capture_output=True, text=True, timeout=300,
  )  # fmt: skip
  assert report.returncode == 0, report.stderr[-3000:]
  with open(os.path.join(sweep_dir, "trials.csv")) as f:
    rows = list(csv.DictReader(f))
  assert sorted(int(r["trial"]) for r in rows) == [0, 1, 2, 3] and {r["state"] for r in rows} == {"complete"}, rows
  assert "resumed from" in open(os.path.join(sweep_dir, "logs", "trial_0000.log")).read()


def _text(pattern: str, job: int, task: int) -> str:
  path = pattern.replace("%A", str(job)).replace("%a", str(task))
  return open(path).read() if os.path.exists(path) else ""


@pytest.mark.parametrize(
  "env, want",
  [
    ({}, None),  # no SLURM: JAX's choice
    ({"SLURM_JOB_ID": "7", "SLURM_STEP_TASKS_PER_NODE": "1"}, None),  # no GPUs named (CPUs): JAX's choice
    ({"SLURM_JOB_ID": "7", "SLURM_STEP_TASKS_PER_NODE": "2", "CUDA_VISIBLE_DEVICES": "NoDevFiles"}, None),
    # one process per node holding its 8 GPUs (JAX alone would give it GPU 0 only)
    ({"SLURM_JOB_ID": "7", "SLURM_STEP_TASKS_PER_NODE": "1(x4)", "SLURM_NODEID": "2", "SLURM_LOCALID": "0",
      "CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7"}, [0, 1, 2, 3, 4, 5, 6, 7]),
    # --gpus-per-task=1: each task sees its own GPU as device 0 (JAX alone would ask task 3 for device 3)
    ({"SLURM_JOB_ID": "7", "SLURM_STEP_TASKS_PER_NODE": "8", "SLURM_LOCALID": "3", "CUDA_VISIBLE_DEVICES": "3"}, [0]),
    # 8 tasks sharing the node's 8 GPUs: one each, by local rank
    ({"SLURM_JOB_ID": "7", "SLURM_STEP_TASKS_PER_NODE": "8", "SLURM_LOCALID": "5",
      "CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7"}, [5]),
    # 2 tasks sharing 8: four each; the counts per node in SLURM's compressed form
    ({"SLURM_JOB_ID": "7", "SLURM_STEP_TASKS_PER_NODE": "1,2(x2)", "SLURM_NODEID": "1", "SLURM_LOCALID": "1",
      "CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7"}, [4, 5, 6, 7]),
    # the batch script itself (no job step yet): the job's counts; a step's own counts take precedence over them
    ({"SLURM_JOB_ID": "7", "SLURM_TASKS_PER_NODE": "1", "CUDA_VISIBLE_DEVICES": "0,1"}, [0, 1]),
    ({"SLURM_JOB_ID": "7", "SLURM_STEP_TASKS_PER_NODE": "2", "SLURM_TASKS_PER_NODE": "1", "SLURM_LOCALID": "1",
      "CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7"}, [4, 5, 6, 7]),
    # GPUs named by UUID (and MIG instances) count as GPUs too
    ({"SLURM_JOB_ID": "7", "SLURM_STEP_TASKS_PER_NODE": "1", "CUDA_VISIBLE_DEVICES": "GPU-5d1e,MIG-9f3a"}, [0, 1]),
    # a node index past the counts (a malformed spec): JAX's choice
    ({"SLURM_JOB_ID": "7", "SLURM_STEP_TASKS_PER_NODE": "1(x2)", "SLURM_NODEID": "2", "CUDA_VISIBLE_DEVICES": "0"},
     None),
  ],
)  # fmt: skip
def test_each_slurm_layout_gets_the_gpus_it_was_given(env, want):
  """The GPU layouts of the SLURM guide, without GPUs: what vitjax.distributed passes jax.distributed as the
  process's local devices."""
  from vitjax.distributed import local_gpus

  assert local_gpus(env) == want
