"""The train loop: a config in, a trained, checkpointed, evaluated model out.

In the order of a run, one section each below: set-up (check the config, data and workdir; nothing is written before
they pass), restore (lock the workdir; build the data, evaluators, model and initial state, or restore the newest
intact checkpoint; a failure here puts the workdir back as it was), the steps (the step, the data, the guard and the
hooks: progress, evaluations, checkpoints), the end (the final evaluation, the result). It goes on or stops with one
line: Preempted (SIGTERM/SIGINT, after checkpointing; InputLost, a dead data worker, after checkpointing the last step
trained), Diverged (a non-finite step), ConfigError (input to fix). What the run says besides its progress is in
vitjax.train.notes, the evaluations during training in vitjax.train.evaluations, --mode=eval in
vitjax.train.checkpoint_eval.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time

import jax
import ml_collections as mlc
from absl import logging

from vitjax import config as config_lib
from vitjax import durations, evaluators, tasks
from vitjax import mesh as mesh_lib
from vitjax.errors import USER_ERRORS, ConfigError, InputLost, Preempted, WorkdirUnwritable, lost_worker, write_failure
from vitjax.logs import plural
from vitjax.mesh import agree
from vitjax.tasks import distill
from vitjax.train import checkpoints as ckpt_lib
from vitjax.train import notes, optim, trackers
from vitjax.train import state as state_lib
from vitjax.train import workdir as workdir_lib
from vitjax.train.checkpoint_eval import best_result, evaluate
from vitjax.train.evaluations import Evaluations
from vitjax.train.guard import NonfiniteGuard
from vitjax.train.preemption import StopRequest
from vitjax.train.prefetch import prefetch
from vitjax.train.reporting import Profiler, Reporter
from vitjax.train.step import make_train_step

__all__ = ["check_config", "evaluate", "train"]

# ------------------------------------------------------------------------------------ set-up


def check_config(config) -> None:
  """The trainer's own settings (the task checks its data and batch sizes; setup() the model)."""
  config_lib.check(config)
  optim.check(config)
  if config.sharding not in mesh_lib.PRESETS:
    raise ConfigError(f"config.sharding={config.sharding!r}: use one of {', '.join(mesh_lib.PRESETS)}")
  durations.check(config)
  if not isinstance(config.seed, int) or config.seed < 0:  # numpy's and grain's seeds
    raise ConfigError(f"seed={config.seed!r} must be a whole number, 0 or more (e.g. --config.seed=1)")
  for key, example in (("keep_checkpoints", 3), ("max_nonfinite_skips", 10)):
    if config[key] < 1:
      raise ConfigError(f"{key}={config[key]} must be at least 1 (e.g. --config.{key}={example})")
  p = config.profile_steps
  if p is not None and (len(p) != 2 or not 1 <= p[0] <= p[1]):
    raise ConfigError(f"profile_steps={tuple(p)}: give (first, last) steps, 1 <= first <= last, e.g. (10, 12)")
  if config.on_nonfinite not in ("stop", "skip"):
    raise ConfigError(f"on_nonfinite={config.on_nonfinite!r}: use 'stop' or 'skip'")
  if config.max_train_minutes is not None and config.max_train_minutes <= 0:
    raise ConfigError(f"max_train_minutes={config.max_train_minutes} must be positive (or None: no budget)")
  if config.model.get("dtype") is not None:  # it fought compute_dtype silently, one way or the other
    raise ConfigError(
      f"config.model.dtype={config.model.dtype!r}: the run's compute dtype is config.compute_dtype (float32, "
      "bfloat16 or auto); remove model.dtype and set --config.compute_dtype"
    )
  trackers.check(config)
  distill.check(config)


def train(config: mlc.ConfigDict, workdir: str, allow_config_change: bool = False) -> dict:
  """Trains (resuming from WORKDIR's newest intact checkpoint if any), evaluates, checkpoints.

  Returns the result as evaluate() does: {"step", "checkpoint": "best", "split", "weights"} and the best step's metrics.
  Raises ConfigError / DatasetNotPreparedError before writing anything if the config, data or workdir cannot work;
  Preempted or Diverged when it stops early (see the module docstring); WorkdirUnwritable when the workdir's disk fills
  up (or is read-only) during training.
  """
  workdir = os.path.abspath(workdir)
  with StopRequest() as stop:  # from the start: a signal during setup or compilation stops cleanly too
    try:
      return _checked_train(config, workdir, allow_config_change, stop)
    except Exception as e:  # a full disk (or quota, or read-only filesystem): one line, exit status 74
      why = None if isinstance(e, USER_ERRORS) else write_failure(e)  # (a check's own line says it already)
      if why is None:
        raise
      raise WorkdirUnwritable(
        workdir_lib.unwritable(workdir, why, os.path.join(workdir, ckpt_lib.CHECKPOINTS))
      ) from None


def _checked_train(config, workdir, allow_config_change, stop) -> dict:
  evaluators.complete(config)  # every entry's options, as config.json records them (a command line's are already)
  check_config(config)
  workdir_lib.check_path(workdir)
  layout = mesh_lib.Layout.of(config)  # config.mesh, resolved once: the task and setup() share it
  task = tasks.get(config, workdir, layout=layout)
  task.check()
  lock = workdir_lib.Lock(workdir)
  run = None
  try:
    run, state, start, data_state, changes = _open(config, workdir, task, allow_config_change, lock, stop)
    done = _finished(run, start)
    if done is not None:
      return done
    if stop.requested():
      raise Preempted(f"{stop.name} before the first step: nothing new to checkpoint; rerun the same command")
    return _train(run, state, start, data_state, changes)
  except Preempted as e:
    if run is not None:  # the checkpoint the line names is written before the line says so
      run.ckpts.close()
    (logging.warning if isinstance(e, InputLost) else logging.info)("%s", e)
    raise
  finally:
    if run is not None:
      run.ckpts.close()  # waits for the writes in flight, whatever ended the run
    lock.release()


# ------------------------------------------------------------------------------------ restore


def _open(config, workdir: str, task, allow_config_change: bool, lock, stop):
  """Locks the workdir and builds the run: its data, evaluators, model and state, restored where it has checkpoints.

  Returns (run, state, start step, data position, config changes). Anything that fails here puts the workdir back as
  it was (corrupt steps set aside stay set aside).
  """
  untouched = workdir_lib.Untouched(workdir)
  ckpts = None
  try:
    untouched.create()
    lock.acquire()  # a second writer stops here, before it reads or writes anything
    resuming = ckpt_lib.has_checkpoints(workdir)
    changes = workdir_lib.check_config_change(workdir, config, allow_config_change) if resuming else {}
    data = task.train_input()
    plan = durations.resolve(config, data.steps_per_epoch, data.examples_per_step)
    steps_of = lambda what, every: durations.steps(what, every, data.steps_per_epoch, data.examples_per_step)
    evals = evaluators.plan(config, task, steps_of, workdir)
    exp = state_lib.setup(config, task, plan.total, data.steps_per_epoch, warmup=plan.warmup)
    teacher = distill.load(config, task, evaluators.best_mode)  # config.distill's, or None
    if resuming:
      ckpts = _checkpoints(config, workdir)
      start, state, data_state = ckpts.restore("latest", exp.abstract_state)
      _restore_data(data, data_state, workdir)
    else:  # builds the initial state (and checks config.init_from) before it writes anything
      start, state, data_state = 0, state_lib.initial_state(exp), None
      ckpts = _checkpoints(config, workdir)
    if start >= plan.total and any(not config_lib.is_bookkeeping(k) for k in changes):
      raise ConfigError(
        f"the run is at step {start}; total steps {plan.total} is not beyond it: raise --config.total_steps "
        "(or --config.num_epochs) to train longer"
      )
  except BaseException:
    if ckpts is not None:
      ckpts.close()
    lock.release(restore=True)
    untouched.restore()
    raise
  # the budget counts the earlier sessions' training time too: a stopped and resumed run ends where one would have
  spent = workdir_lib.train_seconds(workdir, start) if start else 0.0
  run = _Run(config, workdir, task, data, exp, plan, evals, ckpts, lock, stop, spent, teacher)
  return run, state, start, data_state, changes


def _finished(run, start: int) -> dict | None:
  """The run's result where nothing is left to train (it is complete, or its max_train_minutes is spent); else None."""
  config, total, budget = run.config, run.plan.total, run.config.max_train_minutes
  if start >= total:
    logging.info("the run in %s is complete (step %d of %d): nothing to train", run.workdir, start, total)
  elif budget and run.spent >= 60 * budget:
    logging.info(
      "the run in %s has spent its max_train_minutes=%g (step %d): nothing to train; raise it to go on",
      run.workdir,
      budget,
      start,
    )
  else:
    return None
  return best_result(config, run.ckpts, run.evals)


def _restore_data(data, data_state: str, workdir: str) -> None:
  """Puts the training batches where the checkpoint left them.

  A position this pipeline cannot take is a ConfigError (a checkpoint of an older data pipeline, or data that changed
  under the run).
  """
  try:
    data.restore(data_state)
  except (ValueError, KeyError, TypeError) as e:
    raise ConfigError(
      f"the checkpoint in {workdir} cannot resume this run's training data ({e}); the data changed or the "
      f"checkpoint is from another data pipeline: use a new --workdir with --config.init_from={workdir}"
    ) from None


def _checkpoints(config, workdir: str) -> ckpt_lib.Checkpoints:
  return ckpt_lib.Checkpoints(workdir, config.best, evaluators.best_mode(config), keep=config.keep_checkpoints)


@dataclasses.dataclass
class _Run:
  """What the training phases share, once every check has passed and the workdir is locked."""

  config: mlc.ConfigDict
  workdir: str
  task: tasks.Task
  data: tasks.TrainInput
  exp: state_lib.Experiment
  plan: durations.Durations
  evals: tuple[evaluators.Evaluator, ...]
  ckpts: ckpt_lib.Checkpoints
  lock: workdir_lib.Lock
  stop: StopRequest
  spent: float  # seconds of training before this session (the metrics' train/elapsed_s at the resumed step)
  teacher: distill.Teacher | None = None  # config.distill's, whose variables the step takes beside the batch


# ------------------------------------------------------------------------------------ the steps


def _train(run: _Run, state, start: int, data_state, changes: dict) -> dict:
  """train() after every check: the workdir is locked and from here on written."""
  config, exp, ckpts, plan = run.config, run.exp, run.ckpts, run.plan
  teacher = run.teacher
  shardings = (exp.state_sharding, exp.batch_sharding)
  if teacher is not None:
    shardings += (jax.tree.map(lambda a: a.sharding, teacher.variables),)
  train_step = jax.jit(
    make_train_step(exp.model, exp.tx, exp.schedule, config, run.task, exp.state_sharding.params, teacher),
    in_shardings=shardings,
    out_shardings=(exp.state_sharding, None),
    donate_argnums=0,
  )
  if teacher is not None:  # its variables: an argument of the program, not constants compiled into it
    jitted = train_step
    train_step = lambda state, batch: jitted(state, batch, teacher.variables)
  _begin(run, state, start, changes)
  reporter = Reporter(
    run.workdir,
    plan.total,
    plan.log_every,
    run.data.examples_per_step,
    budget=60 * config.max_train_minutes if config.max_train_minutes else None,
    purge_step=start + 1,
    spent=run.spent,
    config=config,
    evaluators=run.evals,
    resumed=bool(start),
  )
  evaluations = Evaluations(run, reporter)
  try:
    with jax.set_mesh(exp.mesh):
      if start and evaluations.best.due(start, plan.total) and ckpts.metrics(start) is None:
        logging.info("step %d was saved without its evaluation (interrupted): evaluating it now", start)
        due = tuple(e for e in run.evals if e.due(start, plan.total))
        evaluations.run(start, state, data_state, due, resave=True)
      _steps(run, train_step, state, start, reporter, evaluations)
  finally:
    reporter.close()
  ckpts.wait()
  logging.info("done: checkpoints in %s (best: step %s)", ckpts.directory, ckpts.best_step())
  return best_result(config, ckpts, run.evals)


def _begin(run: _Run, state, start: int, changes: dict) -> None:
  """The workdir's bookkeeping (a resume's record, or a fresh start) and the run's opening lines (notes)."""
  config = run.config
  if start:
    dropped = workdir_lib.drop_metrics_after(run.workdir, start)
    trained_with = config_lib.read_config(run.workdir) if changes else None  # before this start's changes
    workdir_lib.record_config_change(run.workdir, start, changes)
    logging.info(
      "resumed from %s at step %d%s",
      run.ckpts.directory,
      start,
      f" ({plural(dropped, 'metrics row')} past it dropped)" if dropped else "",
    )
    if any(not config_lib.is_bookkeeping(k) for k in changes):
      notes.schedule_change(run, trained_with, start)
    if "init_from" in changes:
      logging.warning(
        "config.init_from=%r is new, but the run resumes its own checkpoint of step %d: init_from is read only at a "
        "fresh start; give a new --workdir to start from it",
        config.init_from,
        start,
      )
  else:
    workdir_lib.start_fresh(run.workdir, config)
  workdir_lib.write_json(run.workdir, "task.json", run.task.describe())
  notes.opening(config, run.exp, run.data, run.plan, run.evals, state, start)


def _steps(run: _Run, train_step, state, start: int, reporter: Reporter, evaluations) -> None:
  """The training steps from start + 1: progress, evaluations, checkpoints; Preempted on a signal.

  The reporter is told of each step, of the time spent waiting for input, and of the time spent in evaluations and
  saves (not training time: its speeds leave it out).
  """
  config, plan, ckpts, stop = run.config, run.plan, run.ckpts, run.stop
  profiler = Profiler(run.workdir, config.profile_steps)
  guard = NonfiniteGuard(config, ckpts)
  total = plan.total
  metrics = data_state = None  # the last trained step's (bound once a step has run)
  with contextlib.closing(prefetch(run.data, run.task, run.exp.batch_sharding)) as batches:  # (closing: its thread)
    for step in range(start + 1, total + 1):
      waiting = time.perf_counter()
      try:
        batch, data_state = next(batches)
      except RuntimeError as e:  # a grain worker died: keep the steps trained, stop with one line
        why = lost_worker(e)
        if why is None:
          raise
        saved = ckpts.latest_step() or 0  # (0: none)
        if step - 1 > saved and jax.process_count() == 1:  # (a save takes every process: with more, they stop)
          guard.check_now(step - 1, metrics)
          _save(reporter, ckpts, step - 1, state, data_state)
          saved = step - 1
        raise InputLost(notes.lost_input(why, step - 1, saved, ckpts)) from None
      reporter.waited(time.perf_counter() - waiting)
      profiler.before(step)
      state, metrics = profiler.run(step, train_step, state, batch)
      profiler.after(step, state)
      run.lock.touch()
      guard.check_lagged(step, metrics)  # the previous step's flag: no wait for this one
      reporter.stepped(metrics)
      # this step's decisions, the same on every process: a signal on any; process 0's clock
      stopping, out_of_time, heartbeat = agree(
        stop.asked, step < total and reporter.over_budget(), reporter.heartbeat_due()
      )
      if out_of_time:
        logging.info("max_train_minutes=%g reached at step %d: evaluating and stopping", config.max_train_minutes, step)
        total = step  # this step is the last: evaluate and checkpoint below (the line still says the planned total)
      due = tuple(e for e in run.evals if e.due(step, total))
      evaluating = bool(due)
      saving = evaluating or step % plan.checkpoint_every == 0
      if saving or stopping:
        guard.check_now(step, metrics)  # never save past a non-finite step unnoticed
      if reporter.due(step, heartbeat or out_of_time):
        guard.check_now(step, metrics)
        reporter.progress(step, {**jax.device_get(metrics), "train/skipped_steps": guard.skipped})
      if stopping:
        _save(reporter, ckpts, step, state, data_state)
        raise Preempted(notes.preempted(stop, step, ckpts))
      if evaluating:
        evaluations.run(step, state, data_state, due)
      elif saving:
        _save(reporter, ckpts, step, state, data_state)
      if out_of_time:
        break


# ------------------------------------------------------------------------------------ checkpoints


def _save(reporter: Reporter, ckpts, step: int, state, data_state) -> None:
  """Saves `step` without metrics, its training time written first (Reporter.checkpoint); not training time."""
  reporter.checkpoint(step)
  with reporter.pause():
    ckpts.save(step, state, data_state)
