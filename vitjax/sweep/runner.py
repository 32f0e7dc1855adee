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

import fcntl
import heapq
import os
import shlex
import signal
import subprocess
import threading
import time

from absl import logging

from vitjax import paths
from vitjax import sweep as sweep_lib
from vitjax.logs import fmt_time
from vitjax.sweep.devices import describe_devices, launch_command, owner_gone, owner_record
from vitjax.sweep.metrics import (
  MetricsFollower,
  best_row,
  by_step,
  error_line,
  eval_rows,
  is_eval,
  metric_names,
)
from vitjax.sweep.study import (
  OWNER,
  first_line,
  latest_attempts,
  make_sampler,
  optuna_module,
  requeue,
  slot,
)

EXIT_PREEMPTED, EXIT_USER_ERROR = 75, 2
LOCK_WAIT = 400.0  # > vitjax.train.workdir.Lock.STALE: how long a trial waits for a lost run's workdir lock


# ------------------------------------------------------------------------------------------------ the study


# ------------------------------------------------------------------------------------------------ devices


# ------------------------------------------------------------------------------------------------ owners


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
    self.running_since: dict[int, float] = {}  # worker index -> when its trial started (less an earlier attempt's time)
    self.guard = _SqliteGuard(store.url)
    self.crashed: list[str] = []  # workers stopped by an error in vitjax.sweep itself

  # ---- the study's state

  def _trials(self, states=None):
    return self.study.get_trials(deepcopy=False, states=states)

  def _counts(self) -> dict:
    optuna = optuna_module()
    latest = latest_attempts(t for t in self._trials() if slot(t) < self.target)
    counts = {s.name.lower(): 0 for s in optuna.trial.TrialState}
    for t in latest.values():
      counts[t.state.name.lower()] += 1
    return counts

  def _recover(self) -> None:
    """Fails and queues again the RUNNING trials whose worker is gone.

    Stale heartbeats (any host) or a dead process on this host.
    """
    with self.guard:
      self._recover_unguarded()

  def _recover_unguarded(self) -> None:
    optuna = optuna_module()
    optuna.storages.fail_stale_trials(self.study)
    for t in self._trials((optuna.trial.TrialState.RUNNING,)):
      if owner_gone(t.system_attrs.get(OWNER)):
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
    optuna = optuna_module()
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
      self.store.set_trial_system_attr(t._trial_id, OWNER, owner_record())
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
    """Asks the sweep to stop: every running trial gets SIGTERM (it checkpoints and exits).

    Keeps the first `reason` given and sets the stop event.
    """
    self.stop_reason = self.stop_reason or reason
    self.stop.set()
    with self.lock:
      for proc in self.procs.values():
        if proc.poll() is None:
          proc.send_signal(signal.SIGTERM)

  def kill_trials(self) -> None:
    """Kills (SIGKILL) every trial process still running."""
    for proc in list(self.procs.values()):
      if proc.poll() is None:
        proc.kill()

  def _worker(self, index: int) -> None:
    optuna = optuna_module()
    study = optuna.load_study(
      study_name=self.study.study_name, storage=self.store, sampler=self.study.sampler, pruner=self.study.pruner
    )
    while not self.stop.is_set():
      try:
        trial = self._claim(study)
      except Exception as e:  # the database went away for a moment: say so, try again
        logging.warning("worker %d: the storage failed (%s); retrying in 10 s", index, first_line(e))
        self.stop.wait(10)
        continue
      if trial is not None:
        self.waiting_said = False
        try:
          study.sampler = make_sampler(self.sweep, slot(self.store.get_trial(trial._trial_id)))
          self._run_trial(index, trial)
        except Exception as e:  # a bug here, or the database lost mid-trial: the trial goes back to the queue
          self.running_since.pop(index, None)
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
    """Runs one trial to its end: its command, its log, and its result told to the study.

    Long: each way a trial ends (complete, interrupted, pruned, failed) is handled where the study is told.
    """
    optuna = optuna_module()
    frozen = self.store.get_trial(trial._trial_id)
    n = slot(frozen)
    workdir = sweep_lib.trial_dir(self.sweep_dir, n)
    params = self._suggest(trial)
    overrides = [sweep_lib.flag(k, v) for k, v in params.items()]
    # W&B (config.trackers with "wandb") names the run by its trial and groups the sweep's trials
    named = [
      f"--config.wandb.name=trial_{n:04d}",
      f"--config.wandb.group={os.path.basename(os.path.normpath(self.sweep_dir))}",
    ]
    cmd = [*self.base_cmd, f"--workdir={workdir}", *overrides, *named]
    trial.set_user_attr("overrides", " ".join(overrides))
    trial.set_user_attr("workdir", workdir)
    retry = " (again, resuming from its checkpoint)" if frozen.system_attrs.get("retry_of") else ""
    logging.info("trial %d%s on %s: %s", n, retry, describe_devices(self.groups[index]), " ".join(overrides))
    reported = set(frozen.intermediate_values)
    wall0 = frozen.user_attrs.get("wall_s", 0.0)
    t0 = time.time()
    self.running_since[index] = t0 - wall0
    log_path = os.path.join(self.sweep_dir, "logs", f"trial_{n:04d}.log")
    os.makedirs(os.path.dirname(log_path), exist_ok=True)
    lock_deadline = time.time() + LOCK_WAIT
    while True:  # a relaunch only while a lost run still holds the workdir's lock
      rc, pruned_at, log_end = self._attempt(index, trial, n, cmd, workdir, log_path, reported)
      line = error_line(log_path, log_end) if rc not in (0, None) else ""
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
    self.running_since.pop(index, None)
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
      from vitjax.models.checkpoints import latest_step  # (orbax: not at the sweep's start)

      step = latest_step(workdir)  # (not its last metrics row: none is written at the step a signal stops)
      resumes = f"it resumes from step {step}" if step is not None else "it starts again: nothing was checkpointed"
      logging.info("trial %d: interrupted, queued again (%s)", n, resumes)
    else:
      if rc == 0:
        line = f"no {self.sweep.objective} in its evaluations ({', '.join(metric_names(rows)) or 'none'})"
      elif not line:
        line = f"exit status {rc}" if rc >= 0 else f"killed by {signal.Signals(-rc).name}"
      trial.set_user_attr("error", line)
      trial.study.tell(trial, state=optuna.trial.TrialState.FAIL, skip_if_finished=True)
      self._finished(n, f"failed: {line} (log: {log_path})", wall, ok=False, user_error=rc in (0, EXIT_USER_ERROR))

  def _interrupted(self, trial) -> None:
    """Fails a trial this worker ran and queues a copy (same slot) to resume it.

    Unless another worker took it for stale first, in which case that one queued it.
    """
    optuna = optuna_module()
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
    """One launch of the trial's run, followed to its end.

    Returns (exit status, step it was pruned at or None, where its log ended before it).
    """
    kind, ids = self.groups[index]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    if kind == "gpu":
      env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, ids))
    with paths.appending(log_path) as log:
      log.write(f"\n=== {time.strftime('%Y-%m-%d %H:%M:%S')} {shlex.join(cmd)}\n")
      log.flush()
      start = log.tell()
      with self.lock:
        if self.stop.is_set():
          return EXIT_PREEMPTED, None, start
        proc = subprocess.Popen(  # no preexec_fn: unsafe in this multithreaded process (launch.py says why)
          launch_command(cmd, ids if kind == "cpu" else None),
          stdout=log,
          stderr=subprocess.STDOUT,
          env=env,
          start_new_session=True,  # a signal to the sweep's group reaches it once, from the sweep
        )
        self.procs[index] = proc
    pruned_at = None
    beat = 0.0
    follower = MetricsFollower(workdir)
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
    for row in by_step(r for r in follower.new_rows() if is_eval(r)):
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
    now = time.time()
    mean = sum(self.durations) / len(self.durations)
    eta = time_left(mean, left, len(self.groups), [now - t for t in list(self.running_since.values())])
    eta = f", about {fmt_time(eta)} left here" if left > 0 else ""
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


def time_left(mean: float, left: int, workers: int, elapsed: list[float]) -> float:
  """Seconds until the last of `left` unfinished trials ends, each taking `mean` seconds, on `workers` workers.

  min(left, workers) run at once, so the rounds still needed times `mean`, less what the running trials have already
  run (`elapsed`, one per running trial): each worker takes the next trial as its current one ends, a running trial
  ending after `mean` less its elapsed time (never before now).
  """
  if left <= 0:
    return 0.0
  ends = [max(0.0, mean - e) for e in elapsed]  # when each running trial ends, from now
  ends += [0.0] * (max(1, min(left, workers)) - len(ends))  # the workers free now
  heapq.heapify(ends)
  for _ in range(left - len(elapsed)):  # a trial not yet started takes the worker that is free first
    heapq.heappush(ends, heapq.heappop(ends) + mean)
  return float(max(ends))


class _SqliteGuard:
  """Serialises claims and recoveries on a SQLite study (workers in threads or processes of one machine).

  The storage's WAITING -> RUNNING and RUNNING -> FAIL updates are atomic on PostgreSQL and MySQL (SELECT ... FOR
  UPDATE); SQLite has no row locks, so two workers could both read a trial as WAITING and both claim it. An
  flock on a file beside the database closes that gap; elsewhere this does nothing.
  """

  def __init__(self, url: str):
    self.path = None
    if url.startswith("sqlite:///") and len(url) > len("sqlite:///"):
      self.path = url[len("sqlite:///") :].split("?")[0] + ".claim-lock"
    self.thread_lock = threading.Lock()
    self.fd = None

  def __enter__(self):
    self.thread_lock.acquire()
    if self.path:
      self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
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
