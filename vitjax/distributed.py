"""Several processes: starting jax.distributed, and noticing a process that is gone.

`initialize` starts jax.distributed from the command line's address, process count and index, or from what JAX
detects (SLURM, Open MPI, Kubernetes, TPU pods).

`PeerWatch` turns the loss of a process into one clear line. When a process dies (SIGKILL, a lost machine), the
others are left in a collective that either fails with a transport error or waits; JAX's own heartbeat then
aborts them with a C++ fatal error and a thread dump. Here each process bumps a counter in the coordination
service's key-value store every second and reads the others' counters; a process whose counter has not moved for
`timeout` seconds, and which did not say it was leaving, is lost: the watch logs one line (which process, since
when, what to do) and ends this process with exit status 75 (rerun every process to resume from the last
checkpoint). It also fires when the coordination service itself is gone (process 0 died). JAX's heartbeat timeout
is set well above `timeout`, so this line comes first.
"""

from __future__ import annotations

import errno
import os
import re
import socket
import sys
import threading
import time

import jax
from absl import logging

from vitjax import logs
from vitjax.errors import EXIT_PREEMPTED, USER_ERRORS, ConfigError, Diverged, InputLost, Preempted

PEER_TIMEOUT_S = 30  # default: a process silent this long is lost
COORDINATOR_WAIT_S = 300  # how long the other processes wait for process 0's coordinator (jax's own default)
_PREFIX = "vitjax/peers"
_LEAVING = (*USER_ERRORS, FileNotFoundError, Preempted, Diverged)  # ways every process stops alike


def _tasks_on_this_node(env) -> int | None:
  """SLURM's count of this job step's tasks on this node; None outside SLURM.

  Read from SLURM_STEP_TASKS_PER_NODE (e.g. '8' or '2(x3),1', in SLURM_STEP_NODELIST's order), with SLURM_NODEID this
  node's index.
  """
  spec = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE")
  if not spec:
    return None
  counts = []
  for part in spec.split(","):
    count, _, times = part.partition("(x")
    counts += [int(count)] * (int(times.rstrip(")")) if times else 1)
  node = int(env.get("SLURM_NODEID", 0))
  return counts[node] if node < len(counts) else None


def local_gpus(env) -> list[int] | None:
  """The GPUs this process takes under SLURM, or None (JAX's own choice).

  The GPUs are indices among those CUDA_VISIBLE_DEVICES shows; None where JAX chooses: CPUs, TPUs, no SLURM, no
  CUDA_VISIBLE_DEVICES.

  JAX, finding SLURM, gives each process the one GPU of its local rank. That is right for one process per GPU on
  GPUs the tasks share, and wrong for the two layouts most used: one process per node (--ntasks-per-node=1
  --gpus-per-node=8) would use one GPU of eight, and one process per GPU bound by SLURM (--gpus-per-task=1, where
  each task sees its GPU as device 0) would ask for a device it cannot see. Here: a task alone on its node, or one
  whose visible GPUs are its own (fewer than the tasks there), takes every GPU it sees; tasks that share the node's
  GPUs take an equal share each, by local rank (one each for as many tasks as GPUs).
  """
  visible = [d for d in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
  if not all(d.strip().isdigit() or d.strip().startswith(("GPU-", "MIG-")) for d in visible):
    return None  # e.g. SLURM's 'NoDevFiles' where the job has no GPUs
  tasks = _tasks_on_this_node(env)
  if "SLURM_JOB_ID" not in env or not visible or tasks is None:
    return None
  if tasks > 1 and len(visible) >= tasks:  # the node's GPUs, shared by its tasks: an equal share each
    share, rank = len(visible) // tasks, int(env.get("SLURM_LOCALID", 0))
    return list(range(rank * share, (rank + 1) * share))
  return list(range(len(visible)))


def initialize(
  coordinator_address=None, num_processes=None, process_id=None, peer_timeout=PEER_TIMEOUT_S, bind_address=None
) -> None:
  """jax.distributed.initialize with the given address, count and index, or, all absent, what JAX detects.

  JAX detects the cluster: SLURM, Open MPI, Kubernetes, TPU pods. ConfigError when neither is there. JAX's heartbeat
  timeout is three times `peer_timeout`, so that PeerWatch reports a lost process before JAX aborts. Process 0 serves
  the coordinator on `bind_address` (HOST:PORT), by default the address given: 127.0.0.1:PORT listens on loopback
  only (JAX alone would listen on every interface); "0.0.0.0:PORT" asks for every interface. While it waits for the
  others it says so every WAIT_LINE_S seconds.
  """
  given = [coordinator_address, num_processes, process_id]
  if any(v is not None for v in given) and any(v is None for v in given):
    raise ConfigError(
      "--multihost: give all of --coordinator_address=HOST:PORT, --num_processes=N and --process_id=I, or none "
      "(under SLURM, Open MPI, Kubernetes or on a TPU pod)"
    )
  if num_processes is not None and not 0 <= process_id < num_processes:
    raise ConfigError(f"--process_id={process_id} must be in [0, --num_processes={num_processes})")
  if peer_timeout < 1:
    raise ConfigError(f"--peer_timeout={peer_timeout} must be at least 1 (seconds)")
  if bind_address is not None and coordinator_address is None:
    raise ConfigError("--coordinator_bind_address is where process 0 serves --coordinator_address: give both")
  if coordinator_address is not None:
    bind_address = bind_address or coordinator_address
    check_coordinator(coordinator_address, process_id, COORDINATOR_WAIT_S, bind_address)
  waiting = _say_while_waiting(process_id, num_processes, bind_address) if process_id == 0 else None
  try:
    jax.distributed.initialize(
      coordinator_address,
      num_processes,
      process_id,
      local_device_ids=local_gpus(os.environ),
      heartbeat_timeout_seconds=max(100, 3 * int(peer_timeout)),
      coordinator_bind_address=bind_address if process_id == 0 else None,
    )
  except ValueError as e:  # no cluster detected and no address given
    raise ConfigError(
      f"--multihost: {str(e).splitlines()[0]}; pass --coordinator_address=HOST:PORT --num_processes=N --process_id=I"
    ) from None
  finally:
    if waiting is not None:
      waiting.set()
  logs.set_process(jax.process_index(), jax.process_count())
  logging.info(  # (process 0's line: the others log their warnings and errors only)
    "process %d of %d: %d local devices, %d in all",
    jax.process_index(),
    jax.process_count(),
    jax.local_device_count(),
    jax.device_count(),
  )


WAIT_LINE_S = 10.0  # how often process 0 says it still waits for the others


def _say_while_waiting(process_id: int, num_processes: int | None, address: str | None) -> threading.Event:
  """A thread that logs, every WAIT_LINE_S seconds until the returned event is set, that process 0 waits."""
  done, start = threading.Event(), time.monotonic()

  def say():
    while not done.wait(WAIT_LINE_S):
      others = f"the other {num_processes - 1} processes" if num_processes else "the other processes"
      logging.info(
        "process %d: waiting for %s at %s (%.0f s; up to %d s)",
        process_id,
        others,
        address or "the detected address",
        time.monotonic() - start,
        COORDINATOR_WAIT_S,
      )

  threading.Thread(target=say, daemon=True, name="vitjax-coordinator-wait").start()
  return done


def _host_port(address: str, flag: str) -> tuple[str, int]:
  m = re.fullmatch(r"(\[[0-9a-fA-F:.]+\]|[^\s:\[\]]+):(\d+)", address)
  if not m or not 0 < int(m[2]) < 65536:
    raise ConfigError(
      f"--{flag}={address} must be HOST:PORT, process 0's host and a free port there, e.g. 10.0.0.1:8476"
    )
  return m[1].strip("[]"), int(m[2])


def check_coordinator(address: str, process_id: int, wait_s: float, bind_address: str | None = None) -> None:
  """ConfigError where jax.distributed.initialize would crash the process rather than raise.

  A malformed address (jax: an IndexError, or a segmentation fault); for process 0, which serves at `bind_address`
  (default: `address`), an address that is not this machine's or a port that something else listens on (a
  segmentation fault); for the others, nothing answering there within `wait_s` seconds (jax aborts the process after
  its own 300 s, silently until then: they say here that they wait).
  """
  host, port = _host_port(address, "coordinator_address")
  if process_id == 0:
    bind_host, bind_port = _host_port(bind_address or address, "coordinator_bind_address")
    try:
      family = socket.AF_INET6 if ":" in bind_host else socket.AF_INET
      socket.create_server((bind_host, bind_port), family=family).close()
    except socket.gaierror as e:
      raise ConfigError(f"--coordinator_address={address}: {bind_host} is no known host ({e.strerror})") from None
    except OSError as e:
      if e.errno == errno.EADDRNOTAVAIL:
        raise ConfigError(
          f"--coordinator_address={address}: {bind_host} is not an address of this machine, where process 0 serves; "
          f"run process 0 there, or pass --coordinator_bind_address=0.0.0.0:{port} to listen on every interface"
        ) from None
      raise ConfigError(
        f"--coordinator_address={address}: process 0 cannot listen on port {bind_port} ({e.strerror}): another "
        "program or run holds it; give every process another port"
      ) from None
    return
  deadline, said = time.monotonic() + wait_s, False
  while True:
    try:
      socket.create_connection((host, port), timeout=5).close()
      return
    except OSError as e:
      if time.monotonic() >= deadline:
        raise ConfigError(
          f"--coordinator_address={address}: nothing answered there in {wait_s:g} s ({e.strerror or e}): start process "
          "0 (--process_id=0) with this address, or give the address it runs at"
        ) from None
      if not said:
        logging.info("process %d: waiting for process 0 at %s (up to %g s)", process_id, address, wait_s)
        said = True
      time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))


def _client():
  from jax._src import distributed  # the coordination service's client: jax has no public handle on it

  return distributed.global_state.client


class PeerWatch:
  """Ends this process with one line when another process of the run is gone (see the module docstring).

  Use as a context manager around the work: entering starts the watch (a daemon thread); leaving stops it and,
  when the work finished or ended the way every process ends it (a user error, preemption, divergence), tells the
  other processes that this one leaves on purpose (they do not count it as lost). InputLost is this process's alone
  (its data worker died): it exits at once (status 75), unannounced, so that the others stop as for a lost process.
  Any other exception first waits
  `timeout` + 5 s for the watch's verdict, so that a collective broken by a dead peer ends with the watch's line
  rather than a traceback. A no-op on one process.
  """

  def __init__(self, timeout: float = PEER_TIMEOUT_S, interval: float = 1.0, exit=os._exit):
    self.timeout, self.interval, self._exit = float(timeout), float(interval), exit
    self._stop = threading.Event()
    self._thread = None

  def __enter__(self) -> PeerWatch:
    if jax.process_count() > 1 and _client() is not None:
      self._thread = threading.Thread(target=self._run, name="vitjax-peer-watch", daemon=True)
      self._thread.start()
    return self

  def __exit__(self, exc_type, exc, tb) -> None:
    if self._thread is None:
      return
    alone = exc_type is not None and issubclass(exc_type, InputLost)  # this process's own input: the others go on
    leaving = exc_type is None or (issubclass(exc_type, _LEAVING) and not alone)
    if not leaving and not alone and issubclass(exc_type, Exception):
      # an unexpected error, often a collective that failed because another process died: give the watch the
      # time to say so (it ends the process); if no process is lost, the error is this process's own
      self._stop.wait(self.timeout + 5)
    self._stop.set()
    self._thread.join()
    if alone:  # its line is said; end now: jax's exit waits at a barrier for the others, which are mid-step
      logging.flush()
      sys.stderr.flush()
      self._exit(EXIT_PREEMPTED)
      return
    if not leaving:
      return  # the others are told nothing, and report this process lost unless they stop too
    try:
      _client().key_value_set(f"{_PREFIX}/left/{jax.process_index()}", "1", allow_overwrite=True)
    except Exception:  # the coordination service is already gone: nobody is left to tell
      pass

  def _run(self) -> None:
    me, n = jax.process_index(), jax.process_count()
    client = _client()
    beats = 0
    seen: dict[int, tuple[str, float]] = {}  # process -> (its last counter, when it changed, on our clock)
    start = time.monotonic()
    while not self._stop.wait(self.interval if beats else 0.0):
      beats += 1
      now = time.monotonic()
      try:
        client.key_value_set(f"{_PREFIX}/alive/{me}", str(beats), allow_overwrite=True)
        alive = dict(client.key_value_dir_get(f"{_PREFIX}/alive/"))
        left = {k.rsplit("/", 1)[-1] for k, _ in client.key_value_dir_get(f"{_PREFIX}/left/")}
      except Exception as e:  # the coordination service (process 0) is unreachable
        if self._stop.is_set():
          return
        self._lost(f"the coordination service at process 0 is unreachable ({' '.join(str(e).split())[:160]})")
        return
      for p in range(n):
        if p == me or str(p) in left:
          continue
        value = alive.get(f"{_PREFIX}/alive/{p}")
        if p not in seen or seen[p][0] != value:
          seen[p] = (value, now)
        silent = now - (seen[p][1] if value is not None else start)
        if silent > self.timeout:
          self._lost(f"process {p} of {n} has given no sign of life for {silent:.0f} s")
          return

  def _lost(self, what: str) -> None:
    n = jax.process_count()
    logging.error(
      "%s: process %d stops without a checkpoint; rerun all %d processes with the same command to resume from "
      "the last checkpoint",
      what,
      jax.process_index(),
      n,
    )
    logging.flush()
    sys.stderr.flush()
    self._exit(EXIT_PREEMPTED)
