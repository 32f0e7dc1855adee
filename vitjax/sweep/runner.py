"""Runs a sweep: one Optuna study on a database, trials claimed by any number of workers on any number of machines.

The study. Its first opener creates it and queues every trial of the sweep (WAITING, trial number = slot 0..N-1,
a grid point's values fixed); later openers wait for that and check the sweep is the same. A worker claims a
WAITING trial with the storage's atomic WAITING -> RUNNING update, so no trial runs twice, and a study never
holds more than `max_trials` slots. Sampled values are drawn when a trial is claimed (so TPE sees the trials that
finished before it).

A trial is an ordinary `python -m vitjax.main` run in SWEEP_DIR/trial_NNNN (its log in SWEEP_DIR/logs/), on the
worker's own devices: CUDA_VISIBLE_DEVICES on GPUs, CPU affinity on CPUs. Its worker follows its metrics.jsonl,
reports each evaluation to Optuna and asks the pruner; a pruned trial gets SIGTERM (it checkpoints, exits 75) and
is told PRUNED. The run's exit status decides the rest: 0 complete (objective: its best evaluation), 75
interrupted (queued again: a copy of the trial, same slot, same directory, resumes from its checkpoint), anything
else failed, with its error line.

Faults. The worker records a heartbeat every `heartbeat` seconds; a RUNNING trial without one for `grace`
seconds, or whose worker on this host is gone, is failed and queued again (by whichever worker notices), and
resumes from its checkpoint. SIGTERM/SIGINT to the sweep: every trial checkpoints and is queued again, exit 75.
A worker with nothing to claim waits while trials run elsewhere, to take over any whose worker dies.
"""

from __future__ import annotations

import ctypes
import fcntl
import json
import math
import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
import warnings

from absl import logging

from vitjax import sweep as sweep_lib
from vitjax.errors import ConfigError
from vitjax.logs import fmt_time

SLOT, OWNER = "trial", "vitjax:owner"  # the trial's slot (a user attribute: its directory), its worker
EXIT_PREEMPTED, EXIT_USER_ERROR = 75, 2
LOCK_WAIT = 400.0  # > vitjax.train.workdir.Lock.STALE: how long a trial waits for a lost run's workdir lock


def _optuna():
  import optuna

  warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
  warnings.filterwarnings("ignore", message=".*Heartbeat of storage is supposed to be used with Study.optimize.*")
  optuna.logging.set_verbosity(optuna.logging.WARNING)
  return optuna


def storage(url: str, heartbeat: int | None = None, grace: int | None = None):
  """Optuna's RDB storage for `url`, with heartbeats (stale trials are queued again) when `heartbeat` is set."""
  optuna = _optuna()
  kwargs = {"connect_args": {"timeout": 60}} if url.startswith("sqlite") else {"pool_pre_ping": True}
  for attempt in range(5):
    try:
      return optuna.storages.RDBStorage(
        url,
        engine_kwargs=kwargs,
        heartbeat_interval=heartbeat,
        grace_period=grace,
        heartbeat_stale_trial_callback=requeue if heartbeat else None,
      )
    except Exception as e:  # sqlalchemy's errors: a bad URL, an unreachable server, a missing driver
      racing = "duplicate key" in str(e) or "already exists" in str(e)
      if not racing or attempt == 4:  # racing: another worker is creating the tables right now
        raise ConfigError(f"--storage={masked(url)}: cannot open it ({_first_line(e)})") from None
      time.sleep(1 + attempt)


def masked(url: str) -> str:
  """The URL without its password."""
  head, sep, tail = url.partition("://")
  if "@" in tail and ":" in tail.split("@", 1)[0]:
    user = tail.split("@", 1)[0].split(":", 1)[0]
    return f"{head}{sep}{user}:***@{tail.split('@', 1)[1]}"
  return url


def _first_line(e: BaseException) -> str:
  text = str(e).strip().splitlines()
  return text[0] if text else type(e).__name__


def study_name(config_arg: str, overrides: list[str]) -> str:
  """The config file's name, its :args and the overrides: 'vit_digits --config.num_epochs=30'."""
  path, _, args = config_arg.partition(":")
  name = os.path.splitext(os.path.basename(path))[0] + (f":{args}" if args else "")
  return " ".join([name, *overrides])


def slot(t) -> int:
  return t.user_attrs.get(SLOT, t.number)


def requeue(study, trial) -> None:
  """Queues a failed-while-running trial again: same slot, parameters and reported evaluations (it resumes from
  its checkpoint in the same directory). Optuna calls it for stale trials; the runner for interrupted ones."""
  optuna = _optuna()
  attrs = {k: v for k, v in trial.system_attrs.items() if k != OWNER}
  attrs["retry_of"] = attrs.get("retry_of", []) + [trial.number]
  study.add_trial(
    optuna.trial.create_trial(
      state=optuna.trial.TrialState.WAITING,
      params=trial.params,
      distributions=trial.distributions,
      user_attrs={k: v for k, v in trial.user_attrs.items() if k != "error"},
      system_attrs=attrs,
      intermediate_values=trial.intermediate_values,
    )
  )


def latest_attempts(trials) -> dict:
  """slot -> the slot's newest attempt (retries are new Optuna trials of the same slot)."""
  out = {}
  for t in sorted(trials, key=lambda t: t.number):
    out[slot(t)] = t
  return out


# ------------------------------------------------------------------------------------------------ the study


def open_study(url: str, name: str, sweep, target: int, heartbeat: int | None = None, grace: int | None = None):
  """Creates the study (and queues its trials) or loads it; returns (study, storage). Checks a loaded study was
  made by the same sweep; tops its slots up to `target` (a rerun with a larger --max_trials)."""
  optuna = _optuna()
  store = storage(url, heartbeat, grace)
  try:
    study = optuna.create_study(
      storage=store, study_name=name, direction=sweep.direction, sampler=make_sampler(sweep), pruner=make_pruner(sweep)
    )
    created = True
  except optuna.exceptions.DuplicatedStudyError:
    study = optuna.load_study(study_name=name, storage=store, sampler=make_sampler(sweep), pruner=make_pruner(sweep))
    created = False
  described = json.loads(json.dumps(sweep.describe()))
  if not created:
    waited = 0.0
    while "sweep" not in study.user_attrs and waited < 30:  # its creator is queueing the trials
      time.sleep(0.5)
      waited += 0.5
    recorded = study.user_attrs.get("sweep")
    if recorded is not None and sweep.grid is not None and "grid_order" not in recorded:  # made before shuffling
      sweep.in_order = True
      described = json.loads(json.dumps(sweep.describe()))
    if recorded is not None and recorded != described:
      raise ConfigError(
        f"the study {name!r} in {masked(url)} was made by a different get_sweep() ({_difference(recorded, described)}); "
        "undo the change, or start a new sweep with another --sweep_dir (and --storage study)"
      )
    if study.direction.name.lower() != sweep.direction:
      raise ConfigError(
        f"the study {name!r} in {masked(url)} is to {study.direction.name.lower()}, not {sweep.direction}"
      )
  have = {slot(t) for t in study.get_trials(deepcopy=False)}
  for i in range(target):
    if i not in have:
      fixed = sweep.point(i) if sweep.grid is not None else {}
      study.add_trial(
        optuna.trial.create_trial(
          state=optuna.trial.TrialState.WAITING, user_attrs={SLOT: i}, system_attrs={"fixed_params": fixed}
        )
      )
  if "sweep" not in study.user_attrs:
    study.set_user_attr("sweep", described)
  return study, store


def _difference(a: dict, b: dict) -> str:
  keys = [k for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
  return "it differs in " + ", ".join(keys)


def make_sampler(sweep, slot: int | None = None):
  """The sweep's sampler; with a seed and a slot, seeded by both, so that machines and reruns draw each trial's
  values from its own stream (the same seed everywhere would draw the same points on every machine)."""
  optuna = _optuna()
  seed = sweep.seed if sweep.seed is None or slot is None else sweep.seed * 100_003 + slot
  if sweep.sampler == "random":
    return optuna.samplers.RandomSampler(seed=seed)
  return optuna.samplers.TPESampler(seed=seed)


def make_pruner(sweep):
  optuna = _optuna()
  return {
    "none": optuna.pruners.NopPruner,
    "median": lambda: optuna.pruners.MedianPruner(n_startup_trials=3, n_warmup_steps=0),
    "halving": optuna.pruners.SuccessiveHalvingPruner,
  }[sweep.pruner]()


# ------------------------------------------------------------------------------------------------ devices


def device_groups(workers: int, per_worker: int | None) -> list[tuple[str, list[int]]]:
  """Each worker's devices: ("gpu", CUDA ids) or ("cpu", cores). GPUs are those of CUDA_VISIBLE_DEVICES, or
  nvidia-smi's; without GPUs (or with JAX_PLATFORMS=cpu) each worker gets its share of this process's cores."""
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
  kind, ids = group
  ints = all(isinstance(i, int) for i in ids)
  contiguous = ints and ids == list(range(ids[0], ids[-1] + 1))
  ranges = f"{ids[0]}" if len(ids) == 1 else f"{ids[0]}-{ids[-1]}" if contiguous else ",".join(map(str, ids))
  return f"{'GPU' if kind == 'gpu' else 'CPU core'}{'s' if len(ids) > 1 else ''} {ranges}"


_PR_SET_PDEATHSIG = 1
_libc = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None


def _child_setup(cores):
  """In the trial's process before exec: SIGTERM when the worker thread's process dies (the trial checkpoints
  and stops instead of training on, orphaned); pinned to the worker's cores."""

  def setup():
    if _libc is not None:
      _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    if cores:
      os.sched_setaffinity(0, cores)

  return setup


# ------------------------------------------------------------------------------------------------ owners


def _owner() -> dict:
  return {"host": socket.gethostname(), "pid": os.getpid(), "start": _start_time(os.getpid())}


def _start_time(pid: int) -> str | None:
  try:
    with open(f"/proc/{pid}/stat") as f:
      return f.read().rsplit(")", 1)[1].split()[19]
  except (OSError, IndexError):
    return None


def _owner_gone(owner: dict | None) -> bool:
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


# ------------------------------------------------------------------------------------------------ the runner


class Runner:
  """Workers (threads, each with its devices) that claim and run the study's trials until none is left."""

  def __init__(self, sweep, study, store, sweep_dir, base_cmd, groups, target, heartbeat, grace, poll=1.0):
    self.sweep, self.study, self.store = sweep, study, store
    self.sweep_dir, self.base_cmd, self.groups, self.target = sweep_dir, base_cmd, groups, target
    self.heartbeat, self.grace, self.poll = heartbeat, grace, poll
    self.stop = threading.Event()
    self.stop_reason = None
    self.procs: dict[int, subprocess.Popen] = {}  # worker index -> its trial's process
    self.lock = threading.RLock()  # signal handlers (main thread) may nest
    self.failed_in_a_row: list[str] = []
    self.user_error = None
    self.waiting_said = False
    self.t0 = time.time()
    self.durations: list[float] = []
    self.guard = _SqliteGuard(store.url)
    self.crashed: list[str] = []  # workers stopped by an error in vitjax.sweep itself

  # ---- the study's state

  def _trials(self, states=None):
    return self.study.get_trials(deepcopy=False, states=states)

  def _counts(self) -> dict:
    optuna = _optuna()
    latest = latest_attempts(t for t in self._trials() if slot(t) < self.target)
    counts = {s.name.lower(): 0 for s in optuna.trial.TrialState}
    for t in latest.values():
      counts[t.state.name.lower()] += 1
    return counts

  def _recover(self) -> None:
    """Fails and queues again the RUNNING trials whose worker is gone: stale heartbeats (any host) or a dead
    process on this host."""
    with self.guard:
      self._recover_unguarded()

  def _recover_unguarded(self) -> None:
    optuna = _optuna()
    optuna.storages.fail_stale_trials(self.study)
    for t in self._trials((optuna.trial.TrialState.RUNNING,)):
      if _owner_gone(t.system_attrs.get(OWNER)):
        try:
          if self.store.set_trial_state_values(t._trial_id, optuna.trial.TrialState.FAIL):
            logging.info("trial %d: its worker (PID %s) is gone: queued again", slot(t), t.system_attrs[OWNER]["pid"])
            requeue(self.study, self.store.get_trial(t._trial_id))
        except optuna.exceptions.UpdateFinishedTrialError:
          pass

  def _claim(self, study=None):
    with self.guard:
      return self._claim_unguarded(study)

  def _claim_unguarded(self, study=None):
    optuna = _optuna()
    study = study or self.study
    trials = study.get_trials(deepcopy=False)  # through `study`: its storage cache then knows the trial
    newest = latest_attempts(trials)
    waiting = [t for t in trials if t.state == optuna.trial.TrialState.WAITING]
    for t in sorted(waiting, key=lambda t: ("retry_of" not in t.system_attrs, t.number)):  # resumes first
      if slot(t) >= self.target:
        continue
      if newest[slot(t)].number != t.number:  # a copy of a slot queued twice (two machines at once): the newest runs
        try:
          self.store.set_trial_user_attr(t._trial_id, "superseded_by", newest[slot(t)].number)
          self.store.set_trial_state_values(t._trial_id, optuna.trial.TrialState.FAIL)
        except optuna.exceptions.UpdateFinishedTrialError:
          pass
        continue
      if self.heartbeat:  # before it is RUNNING: a claimer that dies right after still goes stale
        self.store.record_heartbeat(t._trial_id)
      try:
        if not self.store.set_trial_state_values(t._trial_id, optuna.trial.TrialState.RUNNING):
          continue
      except optuna.exceptions.UpdateFinishedTrialError:
        continue
      self.store.set_trial_system_attr(t._trial_id, OWNER, _owner())
      return optuna.Trial(study, t._trial_id)
    return None

  # ---- workers

  def run(self) -> int:
    """Runs workers until every slot is finished or a stop; returns the exit status (0, 75, 2)."""
    self._recover()
    threads = [threading.Thread(target=self._worker, args=(i,), daemon=True) for i in range(len(self.groups))]
    for th in threads:
      th.start()
    while any(th.is_alive() for th in threads):  # the main thread stays free for signal handlers
      for th in threads:
        th.join(timeout=0.2)
    if self.user_error:
      return EXIT_USER_ERROR
    if self.stop.is_set():
      return EXIT_PREEMPTED
    return 1 if self.crashed else 0

  def request_stop(self, reason: str) -> None:
    self.stop_reason = self.stop_reason or reason
    self.stop.set()
    with self.lock:
      for proc in self.procs.values():
        if proc.poll() is None:
          proc.send_signal(signal.SIGTERM)

  def kill_trials(self) -> None:
    for proc in list(self.procs.values()):
      if proc.poll() is None:
        proc.kill()

  def _worker(self, index: int) -> None:
    optuna = _optuna()
    study = optuna.load_study(
      study_name=self.study.study_name, storage=self.store, sampler=self.study.sampler, pruner=self.study.pruner
    )
    while not self.stop.is_set():
      try:
        trial = self._claim(study)
      except Exception as e:  # the database went away for a moment: say so, try again
        logging.warning("worker %d: the storage failed (%s); retrying in 10 s", index, _first_line(e))
        self.stop.wait(10)
        continue
      if trial is not None:
        self.waiting_said = False
        try:
          study.sampler = make_sampler(self.sweep, slot(self.store.get_trial(trial._trial_id)))
          self._run_trial(index, trial)
        except Exception as e:  # a bug here, or the database lost mid-trial: the trial goes back to the queue
          logging.error("worker %d stopped: %s: %s (its trial is queued again)", index, type(e).__name__, e)
          self.crashed.append(str(e))
          try:
            self._interrupted(trial)
          except Exception:
            pass  # its heartbeat stops: another worker queues it again after --grace
          return
        continue
      self._recover()
      running = self._trials((optuna.trial.TrialState.RUNNING,))
      waiting = [t for t in self._trials((optuna.trial.TrialState.WAITING,)) if slot(t) < self.target]
      if not running and not waiting:
        return
      if not waiting and not self.waiting_said:
        self.waiting_said = True
        logging.info(
          "no trial left to claim: waiting for %d running (on other workers; one whose worker stops sending "
          "heartbeats for %d s is queued again and taken over here)",
          len(running),
          self.grace or 0,
        )
      self.stop.wait(max(self.poll, 2.0))

  def _run_trial(self, index: int, trial) -> None:
    optuna = _optuna()
    frozen = self.store.get_trial(trial._trial_id)
    n = slot(frozen)
    workdir = sweep_lib.trial_dir(self.sweep_dir, n)
    params = self._suggest(trial)
    overrides = [sweep_lib.flag(k, v) for k, v in params.items()]
    cmd = [*self.base_cmd, f"--workdir={workdir}", *overrides]
    trial.set_user_attr("overrides", " ".join(overrides))
    trial.set_user_attr("workdir", workdir)
    retry = " (again, resuming from its checkpoint)" if frozen.system_attrs.get("retry_of") else ""
    logging.info("trial %d%s on %s: %s", n, retry, describe_devices(self.groups[index]), " ".join(overrides))
    reported = set(frozen.intermediate_values)
    wall0 = frozen.user_attrs.get("wall_s", 0.0)
    t0 = time.time()
    log_path = os.path.join(self.sweep_dir, "logs", f"trial_{n:04d}.log")
    os.makedirs(os.path.dirname(log_path), exist_ok=True)
    lock_deadline = time.time() + LOCK_WAIT
    while True:  # a relaunch only while a lost run still holds the workdir's lock
      rc, pruned_at, log_end = self._attempt(index, trial, n, cmd, workdir, log_path, reported)
      line = _error_line(log_path, log_end) if rc not in (0, None) else ""
      if self.stop.is_set() and rc in (EXIT_USER_ERROR, 128 + signal.SIGTERM, 128 + signal.SIGINT, -signal.SIGTERM):
        rc = EXIT_PREEMPTED  # stopped (or waiting for the lock) as the sweep stops: queued again
      if rc == EXIT_USER_ERROR and "is in use" in line and time.time() < lock_deadline:
        logging.info("trial %d: %s; trying again in 15 s", n, line.removeprefix("error: "))
        for _ in range(15):
          if self.heartbeat:
            self.store.record_heartbeat(trial._trial_id)
          self.stop.wait(1)
        continue
      break
    wall = wall0 + time.time() - t0
    trial.set_user_attr("wall_s", round(wall, 1))
    rows = eval_rows(workdir)
    best = best_row(rows, self.sweep.objective, self.sweep.direction == "maximize")
    if best is not None:
      trial.set_user_attr("best_step", best["step"])
    if rows:
      trial.set_user_attr("last_step", rows[-1]["step"])
    if pruned_at is not None:
      trial.study.tell(trial, state=optuna.trial.TrialState.PRUNED, skip_if_finished=True)
      value = self.store.get_trial(trial._trial_id).intermediate_values.get(pruned_at)
      self._finished(n, f"pruned at step {pruned_at} ({self.sweep.objective} {value:.4g})", wall, ok=True)
    elif rc == 0 and best is not None:
      trial.study.tell(trial, best[self.sweep.objective], skip_if_finished=True)
      self._finished(
        n, f"complete: {self.sweep.objective} {best[self.sweep.objective]:.4f} at step {best['step']}", wall, ok=True
      )
    elif rc == EXIT_PREEMPTED:  # interrupted (the sweep's SIGTERM, or the trial's own): queued again
      self._interrupted(trial)
      last = metric_rows(workdir)
      step = last[-1]["step"] if last else None
      logging.info("trial %d: interrupted%s, queued again (it resumes from its checkpoint)", n, _at(step))
    else:
      if rc == 0:
        line = f"no {self.sweep.objective} in its evaluations ({', '.join(_metric_names(rows)) or 'none'})"
      elif not line:
        line = f"exit status {rc}" if rc >= 0 else f"killed by {signal.Signals(-rc).name}"
      trial.set_user_attr("error", line)
      trial.study.tell(trial, state=optuna.trial.TrialState.FAIL, skip_if_finished=True)
      self._finished(n, f"failed: {line} (log: {log_path})", wall, ok=False, user_error=rc in (0, EXIT_USER_ERROR))

  def _interrupted(self, trial) -> None:
    """Fails a trial this worker ran and queues a copy (same slot) to resume it; unless another worker took it
    for stale first, in which case that one queued it."""
    optuna = _optuna()
    with self.guard:
      try:
        won = self.store.set_trial_state_values(trial._trial_id, optuna.trial.TrialState.FAIL)
      except optuna.exceptions.UpdateFinishedTrialError:
        won = False
      if won:
        requeue(self.study, self.store.get_trial(trial._trial_id))

  def _suggest(self, trial) -> dict:
    return {k: _suggest(trial, k, d) for k, d in self.sweep.dims().items()}

  def _attempt(self, index, trial, n, cmd, workdir, log_path, reported):
    """One launch of the trial's run, followed to its end; returns (exit status, step it was pruned at or None,
    where its log ended before it)."""
    kind, ids = self.groups[index]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    if kind == "gpu":
      env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, ids))
    with open(log_path, "a") as log:
      log.write(f"\n=== {time.strftime('%Y-%m-%d %H:%M:%S')} {shlex.join(cmd)}\n")
      log.flush()
      start = log.tell()
      with self.lock:
        if self.stop.is_set():
          return EXIT_PREEMPTED, None, start
        proc = subprocess.Popen(
          cmd,
          stdout=log,
          stderr=subprocess.STDOUT,
          env=env,
          preexec_fn=_child_setup(ids if kind == "cpu" else None),
          start_new_session=True,  # a signal to the sweep's group reaches it once, from the sweep
        )
        self.procs[index] = proc
    pruned_at = None
    beat = 0.0
    follower = _MetricsFollower(workdir)
    try:
      while proc.poll() is None:
        time.sleep(self.poll)
        if self.heartbeat and time.time() - beat >= self.heartbeat:
          self.store.record_heartbeat(trial._trial_id)
          beat = time.time()
        if pruned_at is None:
          pruned_at = self._report(trial, n, follower, reported)
          if pruned_at is not None:
            proc.send_signal(signal.SIGTERM)  # it checkpoints and stops; PRUNED once it has
      if pruned_at is None and proc.returncode == 0:
        self._report(trial, n, follower, reported, prune=False)
    finally:
      with self.lock:
        self.procs.pop(index, None)
    return proc.returncode, pruned_at, start

  def _report(self, trial, n, follower, reported, prune=True):
    """Reports new evaluations to Optuna; returns the step to prune at, or None."""
    for row in _by_step(r for r in follower.new_rows() if _is_eval(r)):
      step, value = row["step"], row.get(self.sweep.objective)
      if step in reported or value is None:
        continue
      trial.report(value, step)
      reported.add(step)
      logging.info("trial %d: step %d | %s %.4f", n, step, self.sweep.objective, value)
      if prune and trial.should_prune():
        return step
    return None

  def _finished(self, n: int, what: str, wall: float, ok: bool, user_error: bool = False) -> None:
    self.durations.append(wall)
    counts = self._counts()
    done = counts["complete"] + counts["pruned"] + counts["fail"]
    left = self.target - done
    rate = sum(self.durations) / len(self.durations) / max(1, len(self.groups))
    eta = f", about {fmt_time(rate * left)} left here" if left and self.durations else ""
    best = ""
    try:
      b = self.study.best_trial
      best = f" | best: trial {slot(b)}, {self.sweep.objective} {b.value:.4f}"
    except ValueError:
      pass
    logging.info(
      "trial %d %s in %s | %d of %d done (%d complete, %d pruned, %d failed), %d running%s%s",
      n,
      what,
      fmt_time(wall),
      done,
      self.target,
      counts["complete"],
      counts["pruned"],
      counts["fail"],
      counts["running"],
      best,
      eta,
    )
    with self.lock:
      self.failed_in_a_row = self.failed_in_a_row + [what] if user_error else []
      if user_error and len(self.failed_in_a_row) >= 3 and not self.stop.is_set():
        self.user_error = what
        self.stop.set()


class _SqliteGuard:
  """Serialises claims and recoveries on a SQLite study (workers in threads or processes of one machine).

  The storage's WAITING -> RUNNING and RUNNING -> FAIL updates are atomic on PostgreSQL and MySQL (SELECT ... FOR
  UPDATE); SQLite has no row locks, so two workers could both read a trial as WAITING and both claim it. An
  flock on a file beside the database closes that gap; elsewhere this does nothing."""

  def __init__(self, url: str):
    self.path = None
    if url.startswith("sqlite:///") and len(url) > len("sqlite:///"):
      self.path = url[len("sqlite:///") :].split("?")[0] + ".claim-lock"
    self.thread_lock = threading.Lock()
    self.fd = None

  def __enter__(self):
    self.thread_lock.acquire()
    if self.path:
      self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
      fcntl.flock(self.fd, fcntl.LOCK_EX)
    return self

  def __exit__(self, *exc):
    if self.fd is not None:
      os.close(self.fd)  # releases the flock
      self.fd = None
    self.thread_lock.release()


def _suggest(trial, name, d):
  if d.kind == "float":
    return trial.suggest_float(name, d.low, d.high, log=d.log, step=d.step)
  if d.kind == "int":
    return trial.suggest_int(name, int(d.low), int(d.high), log=d.log, step=int(d.step or 1))
  return trial.suggest_categorical(name, list(d.choices))


def _at(step) -> str:
  return f" after step {step}" if step is not None else ""


def _metric_names(rows) -> list[str]:
  return sorted({k for r in rows for k in r if k.startswith("eval/")})


def _is_eval(row: dict) -> bool:
  return "source" not in row and any(k.startswith("eval/") for k in row)  # not a --mode=eval row


def metric_rows(workdir: str) -> list[dict]:
  """WORKDIR/metrics.jsonl's rows (a partly written last line is skipped)."""
  return _MetricsFollower(workdir).new_rows()


def eval_rows(workdir: str) -> list[dict]:
  """The evaluations during training in WORKDIR/metrics.jsonl, by step."""
  return _by_step(r for r in metric_rows(workdir) if _is_eval(r))


def _by_step(rows) -> list[dict]:
  out = {r["step"]: r for r in rows}
  return [out[s] for s in sorted(out)]


class _MetricsFollower:
  """Reads the rows a run appends to its metrics.jsonl since the last call (the file is polled every second, so it
  is not read again from the start). A resume replaces the file (rows past its checkpoint dropped, a new inode):
  then it reads the new file from its start."""

  def __init__(self, workdir: str):
    self.path, self.offset, self.inode = os.path.join(workdir, "metrics.jsonl"), 0, None

  def new_rows(self) -> list[dict]:
    try:
      with open(self.path, "rb") as f:
        st = os.fstat(f.fileno())
        if st.st_ino != self.inode or st.st_size < self.offset:
          self.offset, self.inode = 0, st.st_ino
        f.seek(self.offset)
        data = f.read()
    except FileNotFoundError:
      return []
    complete = data[: data.rfind(b"\n") + 1]  # a line still being written waits for the next call
    self.offset += len(complete)
    rows = []
    for line in complete.splitlines():
      try:
        rows.append(json.loads(line))
      except ValueError:
        continue
    return rows


def best_row(rows: list[dict], objective: str, maximize: bool) -> dict | None:
  """The row with the best finite `objective` (the first of equals), or None."""
  scored = [r for r in rows if r.get(objective) is not None and math.isfinite(r[objective])]
  return max(scored, key=lambda r: r[objective] if maximize else -r[objective], default=None)


def _error_line(log_path: str, start: int) -> str:
  """The line that says why a run stopped: its 'error: ...' line, else its last ERROR line, else its last line."""
  try:
    with open(log_path, errors="replace") as f:
      f.seek(start)
      lines = [ln.strip() for ln in f.read().splitlines() if ln.strip()]
  except OSError:
    return ""
  for ln in reversed(lines):
    if ln.startswith("error: "):
      return ln
  for ln in reversed(lines):
    if " ERROR " in ln:
      return ln.split(" ERROR ", 1)[1]
  return lines[-1] if lines else ""
