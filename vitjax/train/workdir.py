"""The workdir's own files, and the rules that keep one run's record whole.

    config.json           the config of the first start, written once
    config_history.jsonl  each later start whose config differed: step, time, fields with old and new values
    task.json             what prediction needs (Task.describe)
    metrics.jsonl         one row per logged step and per evaluation; a resume drops the rows past its step
    train_time.json       the training seconds at each saved step: what max_train_minutes has spent at a resume
    lock                  the process training in it (host, PID, start): one writer per workdir
    checkpoints/          vitjax.train.checkpoints writes them, vitjax.models.checkpoints reads them

A resumed run compares its config with the workdir's (config.json plus the history). A field that changes the
experiment (model, data, optimizer, schedule, seed, batch size, steps, ...) is refused unless
--allow_config_change; bookkeeping fields (vitjax.config.BOOKKEEPING: cadences, budget, evaluation, layout, paths) change
freely. Either way the change is appended to config_history.jsonl; config.json is not rewritten while the
workdir holds a checkpoint (see start_fresh for one without). The run's config, what trained its latest checkpoints
and what a resume, --mode=eval and vitjax.load read, is therefore config.json with the history's changes applied
(vitjax.config.effective_config); vitjax.config.config_source() names it so in a log line.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import socket
import time

import jax
import ml_collections as mlc
from absl import logging

from vitjax import config as config_lib
from vitjax import paths
from vitjax.errors import ConfigError
from vitjax.logs import plural
from vitjax.mesh import all_agree

# ------------------------------------------------------------------------------------------- files


class Untouched:
  """Puts a workdir back as it was when a run fails its checks after it took the lock.

  Entries it created at the top level (a tokenizer, an empty checkpoints/) are removed, and the workdir itself if the
  run created it. WORKDIR/corrupt/ (steps set aside) is never removed. Process 0 acts; the others only create the
  directory.
  """

  KEEP = ("corrupt", "lock")

  def __init__(self, workdir: str):
    self.workdir = workdir = os.path.abspath(workdir)
    self.existed = os.path.isdir(workdir)
    self.before = set(os.listdir(workdir)) if self.existed else set()
    self.missing = paths.missing_folders(workdir)

  def create(self) -> None:
    """Creates the workdir (and its parents) if it does not exist."""
    os.makedirs(self.workdir, exist_ok=True)

  def restore(self) -> None:
    """On process 0: removes what was created in the workdir since, and the workdir if this run created it.

    The top-level entries created since are removed, except KEEP's; the workdir itself only if it is then empty, and
    then the parents this run created, while they are empty.
    """
    if jax.process_index() != 0 or not os.path.isdir(self.workdir):
      return
    for name in set(os.listdir(self.workdir)) - self.before - set(self.KEEP):
      path = os.path.join(self.workdir, name)
      shutil.rmtree(path) if os.path.isdir(path) and not os.path.islink(path) else os.remove(path)
    paths.remove_empty(self.missing)


def write_json(workdir: str, name: str, obj) -> None:
  """WORKDIR/name, written atomically by process 0."""
  if jax.process_index() != 0:
    return
  os.makedirs(workdir, exist_ok=True)
  paths.write_text(os.path.join(workdir, name), obj if isinstance(obj, str) else json.dumps(obj, indent=2))


FOLDERS = ("checkpoints", "tb", "corrupt", "averaged")  # what a run (or vitjax.average) keeps in a workdir as folders


def check_recordable(workdir: str, what: str) -> None:
  """ConfigError, before any work, when `what` ("an evaluation", ...) could not record its result in the run's folder.

  `workdir` is an existing run's; read-only, or not the user's, it fails here rather than after the work.
  """
  fix = f"{what} records its result there: fix its permissions, or copy the run (cp -r {workdir} COPY) and give COPY"
  paths.refuse_links(workdir, FOLDERS)
  paths.check_writable(workdir, "workdir", folder=True, fix=fix)


def check_path(workdir: str) -> None:
  """A workdir must be a writable folder, or not exist yet, and hold no file where a run keeps a folder.

  Leaves nothing behind (it probes with a temporary file).
  """
  paths.refuse_links(workdir, FOLDERS)
  paths.check_writable(workdir, "workdir", folder=True)
  if os.path.exists(os.path.join(workdir, "sweep.json")):
    raise ConfigError(
      f"--workdir={workdir} is a sweep's folder (it holds sweep.json); give the run a workdir of its own"
    )
  for name in FOLDERS:
    path = os.path.join(workdir, name)
    if os.path.lexists(path) and not os.path.isdir(path):
      raise ConfigError(
        f"--workdir={workdir}: {path} is a file, but the run keeps a folder there; move it away or use another --workdir"
      )


# ------------------------------------------------------------------------------------ a workdir that fills up


def _size(path: str) -> int:
  total = 0
  for root, _, files in os.walk(path):
    for name in files:
      try:
        total += os.path.getsize(os.path.join(root, name))
      except OSError:
        pass
  return total


def _mb(n: int) -> str:
  return f"{n / 2**20:.1f} MiB"


def unwritable(workdir: str, why: str, checkpoints: str) -> str:
  """After a failed write: removes the half-written steps and says, in one line, what happened and what to do.

  The half-written steps are orbax's *.orbax-checkpoint-tmp* folders. The line gives what happened, the free space, a
  checkpoint's size, the last good step and what to do.
  """
  steps = []
  if os.path.isdir(checkpoints):
    for name in os.listdir(checkpoints):
      path = os.path.join(checkpoints, name)
      if "orbax-checkpoint-tmp" in name:
        shutil.rmtree(path, ignore_errors=True)
      elif name.isdigit() and os.path.isdir(path):
        steps.append(int(name))
  good = max(steps) if steps else None
  size = _size(os.path.join(checkpoints, str(good))) if good is not None else None
  try:
    usage = shutil.disk_usage(workdir)
    space = f"{_mb(usage.free)} free of {_mb(usage.total)}"
  except OSError:
    space = "free space unknown"
  kept = f"checkpoint {good} is intact" if good is not None else "no checkpoint was written yet"
  each = f"; a checkpoint takes {_mb(size)}" if size else ""
  fix = "make it writable" if "read-only" in why else "free space (or lower --config.keep_checkpoints)"
  return (
    f"cannot write the workdir {workdir}: {why} ({space}{each}); the half-written step was removed and {kept}; "
    f"{fix}, then rerun the same command to resume"
  )


# ------------------------------------------------------------------------------------ the config


def as_dict(config) -> dict:
  """The config as a plain dict: a ConfigDict through its JSON form (JSON-able), anything else through dict()."""
  return json.loads(config.to_json_best_effort()) if isinstance(config, mlc.ConfigDict) else dict(config)


def config_changes(workdir: str, config) -> dict:
  """{field: (value in the workdir, value now)} for every field that differs.

  A field one side lacks counts as None, so a field added since the run started, with None (unset) as its default,
  changes nothing.
  """
  old = config_lib.effective_config(workdir)
  if old is None:
    return {}
  old, new = config_lib.flatten(old), config_lib.flatten(as_dict(config))
  return {k: (old.get(k), new.get(k)) for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)}


def check_config_change(workdir: str, config, allow: bool) -> dict:
  """The changes of a resumed run's config; ConfigError for experiment changes unless allowed. Writes nothing."""
  changes = config_changes(workdir, config)
  experiment = {k: v for k, v in changes.items() if not config_lib.is_bookkeeping(k)}
  if experiment and not allow:
    listed = "; ".join(f"{k}: {old!r} there, {new!r} now" for k, (old, new) in experiment.items())
    raise ConfigError(
      f"workdir {workdir} holds checkpoints trained with another config ({listed}). Rerun without these changes, "
      f"use a new --workdir (--config.init_from={workdir} starts from its weights), or pass --allow_config_change "
      "to continue this run with them (recorded in config_history.jsonl)"
    )
  return changes


def start_fresh(workdir: str, config) -> None:
  """A run's first step: writes config.json.

  A workdir that has one but no checkpoint (its run stopped before its first) starts over: its config.json,
  config_history.jsonl, train_time.json and training rows of metrics.jsonl are replaced.
  """
  if jax.process_index() != 0:
    return
  if os.path.exists(os.path.join(workdir, "config.json")):
    dropped = drop_metrics_after(workdir, 0)
    for name in ("config_history.jsonl", TRAIN_TIME):
      if os.path.exists(os.path.join(workdir, name)):
        os.remove(os.path.join(workdir, name))
    logging.warning(
      "%s has no checkpoint (its run stopped before its first): starting over at step 0 with this config%s",
      workdir,
      f" ({plural(dropped, 'metrics row')} dropped)" if dropped else "",
    )
  write_json(workdir, "config.json", config.to_json_best_effort(indent=2))


def record_config_change(workdir: str, step: int, changes: dict) -> None:
  """Appends a start's changes to config_history.jsonl (process 0)."""
  if not changes or jax.process_index() != 0:
    return
  row = {
    "step": int(step),
    "time": time.strftime("%Y-%m-%d %H:%M:%S"),
    "changes": {k: [old, new] for k, (old, new) in changes.items()},
    "experiment_fields": sorted(k for k in changes if not config_lib.is_bookkeeping(k)),
  }
  with paths.appending(os.path.join(workdir, "config_history.jsonl")) as f:
    f.write(json.dumps(row) + "\n")
  logging.info("config changes recorded in config_history.jsonl: %s", ", ".join(changes))


# ------------------------------------------------------------------------------------- metrics


TRAIN_TIME = "train_time.json"


def _train_times(workdir: str) -> dict:
  try:
    times = config_lib.read_json(workdir, TRAIN_TIME)
  except ConfigError:  # (written atomically: only a hand-edited file)
    return {}
  return times if isinstance(times, dict) else {}


def record_train_time(workdir: str, step: int, seconds: float) -> None:
  """Before `step` is saved: the run's training seconds at it, in WORKDIR/train_time.json (process 0).

  Written before the save, so that every saved step has its time whatever kills the run. The times of later steps (a
  killed session's, whose checkpoints are gone) are dropped.
  """
  if jax.process_index() != 0:
    return
  times = {k: v for k, v in _train_times(workdir).items() if k.isdigit() and int(k) < step}
  write_json(workdir, TRAIN_TIME, {**times, str(int(step)): float(seconds)})


def train_seconds(workdir: str, step: int) -> float:
  """Wall-clock seconds the run's training sessions spent up to `step`: what max_train_minutes has used before a resume.

  The time recorded when `step` was saved (record_train_time); for a workdir written before that record existed, the
  last "train/elapsed_s" of metrics.jsonl at or before it (which misses the time after that row); 0 without one.
  """
  recorded = _train_times(workdir).get(str(int(step)))
  if isinstance(recorded, (int, float)):
    return float(recorded)
  path = os.path.join(workdir, "metrics.jsonl")
  spent = 0.0
  if os.path.exists(path):
    with open(path) as f:
      for line in f:
        try:
          row = json.loads(line)
        except ValueError:  # a row cut short by a kill
          continue
        if "train/elapsed_s" in row and row.get("step", 0) <= step and "source" not in row:
          spent = float(row["train/elapsed_s"])
  return spent


def drop_metrics_after(workdir: str, step: int) -> int:
  """Drops training and evaluation rows past `step` from metrics.jsonl; returns how many.

  A resume from `step` writes them again. Rows of `--mode=eval` (with a "source") are kept.
  """
  path = os.path.join(workdir, "metrics.jsonl")
  if jax.process_index() != 0 or not os.path.exists(path):
    return 0
  with open(path) as f:
    lines = [line for line in f if line.strip()]
  keep = []
  for line in lines:
    try:
      row = json.loads(line)
    except ValueError:  # a row cut short by a kill
      continue
    if row.get("step", 0) <= step or "source" in row:
      keep.append(line if line.endswith("\n") else line + "\n")
  if len(keep) != len(lines):
    with paths.replacing(path, "w", encoding="utf-8") as f:
      f.writelines(keep)
  return len(lines) - len(keep)


# ---------------------------------------------------------------------------------------- the lock


class Lock:
  """One writer per workdir: WORKDIR/lock, held with flock by the training process (process 0) and naming it.

  A second run stops at once with the holder's host and PID. The kernel releases a flock when its process dies
  (SIGKILL included), so a lock left by a dead run is taken over, with a warning. Where flock does not reach
  across hosts (some network filesystems), a lock naming another host is honoured while its holder keeps it
  fresh (the holder touches it every HEARTBEAT seconds) and taken over once it is STALE seconds old.
  """

  HEARTBEAT, STALE = 30.0, 300.0

  def __init__(self, workdir: str):
    self.path = os.path.join(workdir, "lock")
    self.fd = None  # process 0's open lock file
    self.acquired = False  # on every process, once process 0 holds the lock
    self.created = False
    self.previous: bytes | None = None
    self.previous_mtime = None
    self.touched = 0.0

  def acquire(self) -> None:
    """Takes the lock (process 0; the others wait for its verdict) or raises ConfigError naming the holder."""
    error = None
    if jax.process_index() == 0:
      try:
        self._acquire()
      except ConfigError as e:
        error = e
    if not all_agree(error is None):
      raise error or ConfigError(f"{self.path}: process 0 could not take the workdir's lock")
    self.acquired = True

  def _acquire(self) -> None:
    self.created = not os.path.exists(self.path)
    if not self.created:
      with open(self.path, "rb") as f:
        self.previous = f.read()
      self.previous_mtime = os.stat(self.path).st_mtime_ns
    while True:
      fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
      try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
      except BlockingIOError:
        os.close(fd)
        raise ConfigError(f"workdir {os.path.dirname(self.path)} is in use: {self._holder()}") from None
      try:
        if os.stat(self.path).st_ino == os.fstat(fd).st_ino:
          break  # the file at the path is the one locked (not one its holder unlinked as we opened it)
      except FileNotFoundError:
        pass
      self._close(fd)
    holder = self._read_holder()
    here = socket.gethostname()
    if holder and holder.get("host") != here:
      age = time.time() - os.stat(self.path).st_mtime
      if age < self.STALE:
        self._close(fd)
        raise ConfigError(f"workdir {os.path.dirname(self.path)} is in use: {self._holder(f'{age:.0f} s ago')}")
    if holder:
      logging.warning(
        "took over the lock of PID %s on %s (started %s): that run is gone",
        holder.get("pid"),
        holder.get("host"),
        holder.get("started"),
      )
    os.ftruncate(fd, 0)
    os.pwrite(
      fd, json.dumps({"host": here, "pid": os.getpid(), "started": time.strftime("%Y-%m-%d %H:%M:%S")}).encode(), 0
    )
    self.fd, self.touched = fd, time.time()

  def _read_holder(self) -> dict | None:
    try:
      with open(self.path) as f:
        return json.loads(f.read() or "null")
    except (OSError, ValueError):
      return None

  def _holder(self, seen: str = "") -> str:
    h = self._read_holder() or {}
    seen = f", last seen {seen}" if seen else ""
    return (
      f"PID {h.get('pid', '?')} on {h.get('host', '?')} has trained there since {h.get('started', '?')}{seen} "
      f"(its lock: {self.path}); wait for it to end, stop it, or use another --workdir"
    )

  def _close(self, fd) -> None:
    fcntl.flock(fd, fcntl.LOCK_UN)
    os.close(fd)

  def touch(self) -> None:
    """The heartbeat: refreshes the lock's time every HEARTBEAT seconds (cheap to call every step)."""
    if self.fd is not None and time.time() - self.touched >= self.HEARTBEAT:
      os.utime(self.path)
      self.touched = time.time()

  def release(self, restore: bool = False) -> None:
    """Removes the lock; restore=True (a run that failed before writing anything) puts back what was there."""
    self.acquired = False
    if self.fd is None:
      return
    if restore and not self.created:
      os.ftruncate(self.fd, 0)
      os.pwrite(self.fd, self.previous or b"", 0)
      os.utime(self.path, ns=(self.previous_mtime, self.previous_mtime))
      self._close(self.fd)
    else:  # unlinked while held: a run that waited on this file sees it gone and opens the new one (_acquire)
      os.remove(self.path)
      self._close(self.fd)
    self.fd = None
