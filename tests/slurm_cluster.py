"""A real one-node SLURM cluster for the tests, from Debian's slurm-wlm: munged, slurmctld and slurmd in the
foreground, in a temporary folder, on free ports, stopped by PID. Every listener is on loopback: the daemons bind
to the address their hostname resolves to (CommunicationParameters=NoCtldInAddrAny,NoInAddrAny), this machine's
hostname where it resolves to a loopback address, else `localhost` in a UTS namespace of their own; the node is
at that address. Messages are authenticated by MUNGE (auth/munge, cred/munge) with a munged of the cluster's own:
its own key (mode 0400), its socket in a folder only the cluster's user can enter (0700). No systemd, cgroups or
accounting (proctrack/linuxproc, task/none): it starts in a few seconds. Jobs run as the user who starts it (root,
where slurmd must run to launch them).

    cluster = Cluster.start(folder)        # or the `slurm` fixture (tests/conftest.py)
    job = cluster.sbatch("-n", "2", "--output=...", "script.sh", "arg", env=...)
    cluster.wait(job, "COMPLETED")
"""

from __future__ import annotations

import ipaddress
import os
import shutil
import socket
import subprocess
import time

PROGRAMS = ("slurmctld", "slurmd", "sbatch", "scontrol", "squeue", "munged")
PACKAGES = "slurm-wlm munge"
# a daemon's command in a UTS namespace whose hostname is `localhost` (where this machine's does not resolve to a
# loopback address): SLURM binds to what the hostname resolves to, and names the node by it
IN_LOCALHOST_NAMESPACE = ("unshare", "--uts", "sh", "-c", 'hostname localhost && exec "$@"', "sh")


def _ipv4(name: str) -> str | None:
  try:
    return socket.getaddrinfo(name, None, socket.AF_INET, socket.SOCK_STREAM)[0][4][0]
  except (OSError, IndexError):
    return None


def _node() -> tuple[str, str, tuple[str, ...]] | str:
  """(the node's name, its loopback address, the daemons' command prefix), or why there is none."""
  host = socket.gethostname()
  addr = _ipv4(host)
  if addr and ipaddress.ip_address(addr).is_loopback:
    return host, addr, ()
  local = _ipv4("localhost")
  if not (local and ipaddress.ip_address(local).is_loopback):
    return f"localhost resolves to {local}, not a loopback address"
  try:
    proc = subprocess.run([*IN_LOCALHOST_NAMESPACE, "true"], capture_output=True, text=True, timeout=30)
  except (OSError, subprocess.TimeoutExpired) as e:
    proc = subprocess.CompletedProcess(e, 1, "", str(e))
  if proc.returncode:
    return (
      f"this machine's hostname {host} resolves to {addr}, not a loopback address, and the daemons cannot have"
      f" a hostname of their own (unshare --uts: {proc.stderr.strip()}): add '127.0.1.1 {host}' to /etc/hosts"
    )
  return "localhost", local, IN_LOCALHOST_NAMESPACE


def missing() -> str | None:
  """Why a cluster cannot start here (a line naming what to install), or None."""
  absent = [p for p in PROGRAMS if shutil.which(p) is None and not os.path.exists(f"/usr/sbin/{p}")]
  if absent:
    return f"needs SLURM's {', '.join(absent)}: apt-get install {PACKAGES}"
  if os.geteuid() != 0:
    return "slurmd launches jobs as root: run the SLURM tests as root"
  node = _node()
  return f"the test SLURM cluster listens on loopback only: {node}" if isinstance(node, str) else None


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _program(name: str) -> str:
  return shutil.which(name) or f"/usr/sbin/{name}"


def start_munged(folder: str, timeout: float = 30) -> tuple[subprocess.Popen, str]:
  """A munged of its own in `folder` (created 0700): a new key (0400), its socket, PID, log and seed files there.
  The daemon and its socket's path. (munged asks that everyone may reach its socket; --force lets it start in a
  folder only this user can enter, so that no other local user can have a credential of it.)"""
  os.makedirs(folder, mode=0o700, exist_ok=True)
  os.chmod(folder, 0o700)
  key, sock = os.path.join(folder, "munge.key"), os.path.join(folder, "munge.socket")
  fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o400)
  with os.fdopen(fd, "wb") as f:
    f.write(os.urandom(128))  # (what `mungekey` writes: 1024 random bits)
  files = {f"--{n}-file": os.path.join(folder, f"munged.{n}") for n in ("pid", "log", "seed")}
  cmd = [_program("munged"), "--foreground", "--force", f"--socket={sock}", f"--key-file={key}"]
  cmd += [f"{flag}={path}" for flag, path in files.items()]
  log = open(os.path.join(folder, "munged.out"), "w")  # noqa: SIM115 (open while the daemon runs)
  proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
  deadline = time.time() + timeout
  while not os.path.exists(sock):
    if proc.poll() is not None or time.time() > deadline:
      proc.kill()
      proc.wait()
      out = "".join(open(p).read()[-1000:] for p in (log.name, files["--log-file"]) if os.path.exists(p))
      raise RuntimeError(f"munged did not start in {timeout:.0f} s:\n{out}")
    time.sleep(0.05)
  return proc, sock


class Cluster:
  """A running cluster: its folder, the environment its commands need (SLURM_CONF), and its daemons (munged,
  slurmctld, slurmd)."""

  def __init__(self, folder: str, procs: list[subprocess.Popen]):
    self.folder, self.procs = folder, procs
    self.env = {**os.environ, "SLURM_CONF": os.path.join(folder, "slurm.conf")}

  @classmethod
  def start(cls, folder: str, cpus: int | None = None, timeout: float = 60) -> Cluster:
    node = _node()
    if isinstance(node, str):
      raise RuntimeError(f"the test SLURM cluster listens on loopback only: {node}")
    host, addr, prefix = node
    for sub in ("state", "spool"):
      os.makedirs(os.path.join(folder, sub), exist_ok=True)
    munged, munge_socket = start_munged(os.path.join(folder, "munge"))
    conf = f"""\
ClusterName=vitjaxtest
SlurmctldHost={host}({addr})
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
CommunicationParameters=NoCtldInAddrAny,NoInAddrAny
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={munge_socket}
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
NodeName={host} NodeAddr={addr} CPUs={cpus or os.cpu_count()} State=UNKNOWN
PartitionName=debug Nodes={host} Default=YES MaxTime=INFINITE State=UP
"""
    path = os.path.join(folder, "slurm.conf")
    with open(path, "w") as f:
      f.write(conf)
    procs = [munged]
    for daemon in ("slurmctld", "slurmd"):
      log = open(os.path.join(folder, f"{daemon}.out"), "w")  # noqa: SIM115 (open while the daemon runs)
      cmd = [*prefix, _program(daemon), "-D", "-f", path]
      procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT))
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

  def job(self, job: int | str) -> dict:
    """scontrol's fields of a job (JobState, ExitCode, Restarts, EligibleTime, ...), or {} once it is forgotten."""
    proc = self.run("scontrol", "show", "job", "-o", str(job), check=False)
    fields = {}
    for word in proc.stdout.split():
      key, _, value = word.partition("=")
      fields.setdefault(key, value)
    return fields

  def release(self, job: int | str) -> None:
    """Starts a requeued job that SLURM holds until a later BeginTime (about two minutes) in 2 s, not at once:
    released at once, it was relaunched in the second of its requeue and slurmd refused the new credential ("Job
    credential revoked", the job FAILED; with cred/munge). Once: a job due to begin within 5 s is left as it is."""
    begin = self.job(job).get("EligibleTime", "")
    try:
      due = time.mktime(time.strptime(begin, "%Y-%m-%dT%H:%M:%S"))
    except ValueError:
      return
    if due > time.time() + 5:
      self.run("scontrol", "update", f"JobId={job}", "StartTime=now+2", check=False)

  def wait(self, job: int, *states: str, timeout: float = 600, hurry: bool = True) -> dict:
    """Waits until the job is in one of `states`; its fields. With `hurry`, a requeued job held until a later
    BeginTime (SLURM holds one about two minutes) is released (`release`)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
      fields = self.job(job)
      if fields.get("JobState") in states:
        return fields
      if hurry and fields.get("JobState") == "PENDING" and fields.get("Reason") == "BeginTime":
        self.release(job)
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
