"""Which devices each sweep worker gets (GPUs or CPU cores), and how a trial process is pinned to them (launch.py).

Also how a worker tells whether another worker's process is still alive.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys

from vitjax.errors import ConfigError


def device_groups(workers: int, per_worker: int | None) -> list[tuple[str, list[int]]]:
  """Each worker's devices: ("gpu", CUDA ids) or ("cpu", cores).

  GPUs are those of CUDA_VISIBLE_DEVICES, or nvidia-smi's; without GPUs (or with JAX_PLATFORMS=cpu) each worker gets its
  share of this process's cores.
  """
  if workers < 1:
    raise ConfigError(f"--workers={workers}: give at least 1")
  if per_worker is not None and per_worker < 1:
    raise ConfigError(f"--devices_per_worker={per_worker}: give at least 1")
  gpus = _gpus()
  kind, pool = ("gpu", gpus) if gpus else ("cpu", sorted(os.sched_getaffinity(0)))
  per = per_worker or max(1, len(pool) // workers)
  if workers * per > len(pool):
    what = "GPUs" if kind == "gpu" else "CPU cores"
    raise ConfigError(
      f"--workers={workers} x --devices_per_worker={per} needs {workers * per} {what}; this machine has "
      f"{len(pool)}: lower --workers or --devices_per_worker"
    )
  return [(kind, pool[i * per : (i + 1) * per]) for i in range(workers)]


def _gpus() -> list[str]:
  if os.environ.get("JAX_PLATFORMS", "").split(",")[0] in ("cpu", "tpu"):
    return []
  visible = os.environ.get("CUDA_VISIBLE_DEVICES")
  if visible is not None:
    return [x.strip() for x in visible.split(",") if x.strip() and x.strip() != "-1"]  # indices, GPU-UUIDs, MIG-...
  try:
    out = subprocess.run(
      ["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"], capture_output=True, text=True, timeout=30
    )
  except (OSError, subprocess.TimeoutExpired):
    return []
  return out.stdout.split() if out.returncode == 0 else []


def describe_devices(group) -> str:
  """A worker's devices ("gpu" or "cpu", ids) in words: "GPU 0", "CPU cores 4-7".

  Ids that are not a run of integers are listed with commas ("GPUs 0,1": CUDA ids are strings).
  """
  kind, ids = group
  ints = all(isinstance(i, int) for i in ids)
  contiguous = ints and ids == list(range(ids[0], ids[-1] + 1))
  ranges = f"{ids[0]}" if len(ids) == 1 else f"{ids[0]}-{ids[-1]}" if contiguous else ",".join(map(str, ids))
  return f"{'GPU' if kind == 'gpu' else 'CPU core'}{'s' if len(ids) > 1 else ''} {ranges}"


LAUNCH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "launch.py")


def launch_command(cmd: list[str], cores: list[int] | None) -> list[str]:
  """`cmd` as started through launch.py: pinned to `cores` (None: not pinned), SIGTERM when the sweep's process dies.

  The trial then checkpoints and stops instead of training on, orphaned. launch.py sets both in the new process
  before it execs `cmd`, where a `preexec_fn` would run Python in a fork of the sweep's multithreaded process.
  """
  return [sys.executable, "-I", "-S", LAUNCH, str(os.getpid()), ",".join(map(str, cores or [])), "--", *cmd]


def owner_record() -> dict:
  """This process as the owner of the trial it claims, what owner_gone checks.

  Returns:
    dict: {"host", "pid", "start": its start time from /proc, None where unreadable}.
  """
  return {"host": socket.gethostname(), "pid": os.getpid(), "start": _start_time(os.getpid())}


def _start_time(pid: int) -> str | None:
  try:
    with open(f"/proc/{pid}/stat") as f:
      return f.read().rsplit(")", 1)[1].split()[19]
  except (OSError, IndexError):
    return None


def owner_gone(owner: dict | None) -> bool:
  """Whether a trial's worker process, on this host, is gone (other hosts: the heartbeat decides)."""
  if not owner or owner.get("host") != socket.gethostname() or owner.get("pid") == os.getpid():
    return False
  try:
    os.kill(owner["pid"], 0)
  except ProcessLookupError:
    return True
  except PermissionError:
    return False
  return owner.get("start") is not None and _start_time(owner["pid"]) not in (None, owner["start"])
