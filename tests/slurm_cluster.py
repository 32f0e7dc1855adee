"""A real one-node SLURM cluster for the tests, from Debian's slurm-wlm: slurmctld and slurmd in the foreground,
in a temporary folder, on free ports, the node at 127.0.0.1 under this machine's hostname. No munge, systemd,
cgroups or accounting (auth/none, proctrack/linuxproc, task/none): it starts in a few seconds and is stopped by
PID. Jobs run as the user who starts it (root, where slurmd must run to launch them).

    cluster = Cluster.start(folder)        # or the `slurm` fixture (tests/conftest.py)
    job = cluster.sbatch("-n", "2", "--output=...", "script.sh", "arg", env=...)
    cluster.wait(job, "COMPLETED")
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time

PROGRAMS = ("slurmctld", "slurmd", "sbatch", "scontrol", "squeue")
PACKAGES = "slurm-wlm"


def missing() -> str | None:
  """Why a cluster cannot start here (a line naming what to install), or None."""
  absent = [p for p in PROGRAMS if shutil.which(p) is None and not os.path.exists(f"/usr/sbin/{p}")]
  if absent:
    return f"needs SLURM's {', '.join(absent)}: apt-get install {PACKAGES}"
  if os.geteuid() != 0:
    return "slurmd launches jobs as root: run the SLURM tests as root"
  return None


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _program(name: str) -> str:
  return shutil.which(name) or f"/usr/sbin/{name}"


class Cluster:
  """A running cluster: its folder, the environment its commands need (SLURM_CONF), and its daemons."""

  def __init__(self, folder: str, procs: list[subprocess.Popen]):
    self.folder, self.procs = folder, procs
    self.env = {**os.environ, "SLURM_CONF": os.path.join(folder, "slurm.conf")}

  @classmethod
  def start(cls, folder: str, cpus: int | None = None, timeout: float = 60) -> Cluster:
    host = socket.gethostname()
    for sub in ("state", "spool"):
      os.makedirs(os.path.join(folder, sub), exist_ok=True)
    conf = f"""\
ClusterName=vitjaxtest
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
AuthType=auth/none
CredType=cred/none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
StateSaveLocation={folder}/state
SlurmdSpoolDir={folder}/spool
SlurmctldPidFile={folder}/slurmctld.pid
SlurmdPidFile={folder}/slurmd.pid
SlurmctldLogFile={folder}/slurmctld.log
SlurmdLogFile={folder}/slurmd.log
SlurmUser=root
ReturnToService=2
MpiDefault=none
KillWait=30
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
NodeName={host} NodeAddr=127.0.0.1 CPUs={cpus or os.cpu_count()} State=UNKNOWN
PartitionName=debug Nodes={host} Default=YES MaxTime=INFINITE State=UP
"""
    path = os.path.join(folder, "slurm.conf")
    with open(path, "w") as f:
      f.write(conf)
    procs = []
    for daemon in ("slurmctld", "slurmd"):
      log = open(os.path.join(folder, f"{daemon}.out"), "w")  # noqa: SIM115 (open while the daemon runs)
      procs.append(subprocess.Popen([_program(daemon), "-D", "-f", path], stdout=log, stderr=subprocess.STDOUT))
    cluster = cls(folder, procs)
    deadline = time.time() + timeout
    while time.time() < deadline:
      out = cluster.run("sinfo", "-h", "-o", "%t", check=False).stdout.strip()
      if out in ("idle", "mix", "alloc"):
        return cluster
      if any(p.poll() is not None for p in procs):
        break
      time.sleep(0.5)
    logs = "".join(open(os.path.join(folder, f"{d}.out")).read()[-1000:] for d in ("slurmctld", "slurmd"))
    cluster.stop()
    raise RuntimeError(f"the test SLURM cluster did not start in {timeout:.0f} s:\n{logs}")

  def run(self, *args, check=True, env=None) -> subprocess.CompletedProcess:
    proc = subprocess.run(args, env={**self.env, **(env or {})}, capture_output=True, text=True, timeout=60)
    if check and proc.returncode:
      raise RuntimeError(f"{' '.join(args)}: exit {proc.returncode}: {proc.stderr.strip()}")
    return proc

  def sbatch(self, *args, env=None, cwd=None) -> int:
    """Submits a batch job; its id. `env` is the job's environment (sbatch passes it on)."""
    proc = subprocess.run(
      ["sbatch", "--parsable", *args], env={**self.env, **(env or {})}, cwd=cwd, capture_output=True, text=True
    )
    if proc.returncode:
      raise RuntimeError(f"sbatch {' '.join(args)}: exit {proc.returncode}: {proc.stderr.strip()}")
    return int(proc.stdout.strip().split(";")[0])

  def job(self, job: int) -> dict:
    """scontrol's fields of a job (JobState, ExitCode, Restarts, BeginTime, ...), or {} once it is forgotten."""
    proc = self.run("scontrol", "show", "job", "-o", str(job), check=False)
    fields = {}
    for word in proc.stdout.split():
      key, _, value = word.partition("=")
      fields.setdefault(key, value)
    return fields

  def wait(self, job: int, *states: str, timeout: float = 600, hurry: bool = True) -> dict:
    """Waits until the job is in one of `states`; its fields. With `hurry`, a requeued job held until a later
    BeginTime (SLURM holds one about two minutes) is released at once."""
    deadline = time.time() + timeout
    while time.time() < deadline:
      fields = self.job(job)
      if fields.get("JobState") in states:
        return fields
      if hurry and fields.get("JobState") == "PENDING" and fields.get("Reason") == "BeginTime":
        self.run("scontrol", "update", f"JobId={job}", "StartTime=now", check=False)
      time.sleep(1)
    raise TimeoutError(f"job {job} not in {states} after {timeout:.0f} s: {self.job(job)}")

  def stop(self) -> None:
    """Cancels what runs and stops the daemons by PID."""
    self.run("scancel", "--full", "--user", str(os.getuid()), check=False) if shutil.which("scancel") else None
    for p in reversed(self.procs):
      if p.poll() is None:
        p.terminate()
    for p in self.procs:
      try:
        p.wait(timeout=20)
      except subprocess.TimeoutExpired:
        p.kill()
