"""The train loop and checkpoint evaluation: a config in, a trained, checkpointed, evaluated model out.

train(): check the config and data -> lock the workdir -> build the data, model and initial state, or restore the
newest intact checkpoint (a check that fails here puts the workdir back as it was) -> steps, progress,
evaluations (vitjax.evaluators, config.evals), checkpoints -> final evaluation. It goes on or stops with one line:
Preempted (SIGTERM/SIGINT, after checkpointing; InputLost, a dead data worker, after checkpointing the last step
trained), Diverged (a non-finite step), ConfigError (input to fix).
evaluate(): restore a checkpoint (or take the initial weights) and run one evaluator on it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import queue
import threading
import time
from collections import deque

import jax
import ml_collections as mlc
from absl import logging

from vitjax import config as config_lib
from vitjax import durations, evaluators, tasks
from vitjax import mesh as mesh_lib
from vitjax.errors import (
  USER_ERRORS,
  ConfigError,
  Diverged,
  InputLost,
  Preempted,
  WorkdirUnwritable,
  lost_worker,
  write_failure,
)
from vitjax.logs import muted, plural
from vitjax.mesh import agree, to_global
from vitjax.tasks.base import EvaluationInterrupted
from vitjax.train import checkpoints as ckpt_lib
from vitjax.train import optim, trackers
from vitjax.train import state as state_lib
from vitjax.train import workdir as workdir_lib
from vitjax.train.preemption import StopRequest
from vitjax.train.reporting import Profiler, Reporter
from vitjax.train.step import make_train_step


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


def _prefetch(data: tasks.TrainInput, task: tasks.Task, sharding, size: int = 2):
  """Yields (global batch, data position after it) with `size` batches already on their way to the devices.

  A background thread reads the host batches (the per-image work: decoding, crops, augmentation), so that it
  overlaps the device steps instead of taking turns with them; the main thread only hands each batch to the
  devices. Each batch carries the iterator's position taken right after it was read, so a checkpoint saves the
  position of the last batch consumed, not of the ones prefetched: a resumed run sees exactly the same batches.
  Closing the generator stops the thread.
  """
  ready, done = queue.Queue(maxsize=size), threading.Event()

  def offer(item) -> None:  # waits for room, unless the consumer has gone
    while not done.is_set():
      try:
        return ready.put(item, timeout=0.1)
      except queue.Full:
        pass

  def read():
    try:
      while not done.is_set():
        offer((next(data.batches), data.state()))
    except BaseException as e:  # noqa: BLE001 -- raised again in the consumer's thread
      offer(e)

  reader = threading.Thread(target=read, name="vitjax-input", daemon=True)
  reader.start()
  on_device = deque()
  try:
    while True:
      while len(on_device) < size:
        item = ready.get()
        if isinstance(item, BaseException):
          raise item
        batch, state = item
        on_device.append((to_global(batch, sharding, task.batch_keys), state))
      yield on_device.popleft()
  finally:
    done.set()
    reader.join(timeout=10)


def _finite(metrics: dict) -> bool:
  return all(math.isfinite(v) for v in metrics.values())


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
  check_config(config)
  workdir_lib.check_path(workdir)
  layout = mesh_lib.Layout.of(config)  # config.mesh, resolved once: the task and setup() share it
  task = tasks.get(config, workdir, layout=layout)
  task.check()
  untouched = workdir_lib.Untouched(workdir)
  lock = workdir_lib.Lock(workdir)
  ckpts = None
  try:
    try:
      untouched.create()
      lock.acquire()  # a second writer stops here, before it reads or writes anything
      resuming = ckpt_lib.has_checkpoints(workdir)
      changes = workdir_lib.check_config_change(workdir, config, allow_config_change) if resuming else {}
      data = task.train_input()
      plan = durations.resolve(config, data.steps_per_epoch, data.examples_per_step)
      total = plan.total
      steps_of = lambda what, every: durations.steps(what, every, data.steps_per_epoch, data.examples_per_step)
      evals = evaluators.plan(config, task, steps_of, workdir)
      exp = state_lib.setup(config, task, total, data.steps_per_epoch, warmup=plan.warmup)
      if resuming:
        ckpts = _checkpoints(config, workdir)
        start, state, data_state = ckpts.restore("latest", exp.abstract_state)
        _restore_data(data, data_state, workdir)
      else:  # builds the initial state (and checks config.init_from) before it writes anything
        start, state, data_state = 0, state_lib.initial_state(exp), None
        ckpts = _checkpoints(config, workdir)
      if start >= total and any(not workdir_lib.is_bookkeeping(k) for k in changes):
        raise ConfigError(
          f"the run is at step {start}; total steps {total} is not beyond it: raise --config.total_steps "
          "(or --config.num_epochs) to train longer"
        )
    except BaseException:  # the workdir goes back to what it was (corrupt steps set aside stay set aside)
      if ckpts is not None:
        ckpts.close()
      lock.release(restore=True)
      untouched.restore()
      raise
    if start >= total:
      logging.info("the run in %s is complete (step %d of %d): nothing to train", workdir, start, total)
      return _best_result(config, ckpts, evals)
    budget = config.max_train_minutes
    # the budget counts the earlier sessions' training time too: a stopped and resumed run ends where one would have
    spent = workdir_lib.train_seconds(workdir, start) if start else 0.0
    if budget and spent >= 60 * budget:
      logging.info(
        "the run in %s has spent its max_train_minutes=%g (step %d): nothing to train; raise it to go on",
        workdir,
        budget,
        start,
      )
      return _best_result(config, ckpts, evals)
    if stop.requested():
      raise Preempted(f"{stop.name} before the first step: nothing new to checkpoint; rerun the same command")
    run = _Run(config, workdir, task, data, exp, plan, evals, ckpts, lock, stop, spent)
    return _train(run, state, start, data_state, changes)
  except Preempted as e:
    if ckpts is not None:  # the checkpoint the line names is written before the line says so
      ckpts.close()
    (logging.warning if isinstance(e, InputLost) else logging.info)("%s", e)
    raise
  finally:
    if ckpts is not None:
      ckpts.close()  # waits for the writes in flight, whatever ended the run
    lock.release()


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


def _train(run: _Run, state, start: int, data_state, changes: dict) -> dict:
  """train() after every check: the workdir is locked and from here on written."""
  config, exp, ckpts, plan = run.config, run.exp, run.ckpts, run.plan
  train_step = jax.jit(
    make_train_step(exp.model, exp.tx, exp.schedule, config, run.task, exp.state_sharding.params),
    in_shardings=(exp.state_sharding, exp.batch_sharding),
    out_shardings=(exp.state_sharding, None),
    donate_argnums=0,
  )
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
  evaluations = _Evaluations(run, reporter)
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
  return _best_result(config, ckpts, run.evals)


def _begin(run: _Run, state, start: int, changes: dict) -> None:
  """The workdir's bookkeeping (a resume's record, or a fresh start) and the run's opening lines."""
  config, exp, data = run.config, run.exp, run.data
  if start:
    dropped = workdir_lib.drop_metrics_after(run.workdir, start)
    trained_with = workdir_lib.read_config(run.workdir) if changes else None  # before this start's changes
    workdir_lib.record_config_change(run.workdir, start, changes)
    logging.info(
      "resumed from %s at step %d%s",
      run.ckpts.directory,
      start,
      f" ({plural(dropped, 'metrics row')} past it dropped)" if dropped else "",
    )
    if any(not workdir_lib.is_bookkeeping(k) for k in changes):
      _schedule_change(run, trained_with, start)
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
  logging.info(
    "%s: %s parameters | %s: %d training examples, %d steps/epoch | %d steps | %d devices, %d process%s",
    config.model.name,
    f"{state_lib.num_params(state):,}",
    data.name,
    data.num_examples,
    data.steps_per_epoch,
    run.plan.total,
    jax.device_count(),
    jax.process_count(),
    "es" if jax.process_count() > 1 else "",
  )
  logging.info(
    "sharding=%s%s, %s",
    config.sharding,
    " + sharding_rules" if config.sharding_rules else "",
    mesh_lib.describe(exp.mesh, exp.abstract_state.params, exp.state_sharding.params),
  )
  idle = [a for a in {"fsdp": ("fsdp",), "tp": ("tensor",), "fsdp_tp": ("fsdp", "tensor")}.get(config.sharding, ())
          if exp.mesh.shape.get(a, 1) == 1]  # fmt: skip
  if idle and jax.device_count() > 1:
    logging.warning(
      "sharding=%s splits over the mesh axis %s, which has size 1 in config.mesh=%s: nothing is split; e.g. "
      "--config.mesh=\"(('%s', -1),)\"",
      config.sharding,
      " and ".join(idle),
      tuple(tuple(x) for x in config.mesh),
      idle[0],
    )
  for line in optim.describe(config, exp.model, exp.abstract_state.params):
    logging.info("%s", line)
  dtype = state_lib.compute_dtype(config.compute_dtype)
  bf16_cpu = None if jax.default_backend() != "cpu" else state_lib.bfloat16_is_fast()  # None: not a CPU
  if config.compute_dtype == "auto":
    logging.info("compute_dtype=auto: %s on %s", dtype, jax.default_backend())
  elif dtype == "bfloat16" and bf16_cpu is False:
    logging.warning(
      "compute_dtype=bfloat16 on a CPU without AVX512-BF16 or AMX: no faster than float32 there "
      "(experiments/README.md); --config.compute_dtype=float32 (or auto) is this CPU's setting"
    )
  elif dtype == "float32" and bf16_cpu:
    logging.info(
      "compute_dtype=float32 on a CPU with AVX512-BF16 or AMX: bfloat16 (--config.compute_dtype=bfloat16 or auto) "
      "trained 1.20-1.59x faster on an AVX512-BF16 EPYC (experiments/README.md, issue 28)"
    )
  p = config.profile_steps
  if p is not None and (p[1] > run.plan.total or p[0] <= start):  # the trace never starts, or never stops
    logging.warning(
      "profile_steps=%s is not within this session's steps %d..%d: no profile is written; e.g. "
      '--config.profile_steps="(%d, %d)"',
      tuple(p),
      start + 1,
      run.plan.total,
      min(start + 5, run.plan.total),
      min(start + 7, run.plan.total),
    )
  if config.get("label_smoothing"):  # train/loss next to eval/loss read as a 5x gap
    logging.info("%s", _smoothing_note(config.label_smoothing, exp.model))
  unread = _unread_settings(config)
  if unread:
    logging.warning("%s", unread)
  if config.ema_decay and not any(e.weights == "ema" for e in run.evals):
    logging.warning(
      "ema_decay=%g: the moving average is kept (vitjax.load(W, weights='ema'), --mode=eval --weights=ema) but no "
      "evaluator reads it: evaluations, best and the result are the raw weights'; add an entry with weights='ema'",
      config.ema_decay,
    )
  if config.ema_decay and jax.tree.leaves(exp.abstract_state.model_state):
    logging.warning(
      "ema_decay: the moving average covers the parameters only; this model's %s (BatchNorm statistics) stay the "
      "raw model's, so eval_ema/... can lag the raw weights: compare them before choosing best by eval_ema",
      "/".join(exp.abstract_state.model_state),
    )


def _schedule_change(run: _Run, old, start: int) -> None:
  """One line when a resume's config changes the learning-rate schedule: its length, or its rate at the next step.

  `old`: the config that trained the checkpoint. The schedule is rebuilt over the new total, so a longer run does not
  continue the old curve: from its end (or wherever the run stopped) the learning rate jumps to the new curve's (a
  warm restart), which deserves saying, as the config's change alone does not.
  """
  data, exp = run.data, run.exp
  try:
    with muted():  # the old config's own notes (which of total_steps and num_epochs wins) were said in its session
      before = durations.resolve(old, data.steps_per_epoch, data.examples_per_step)
      schedule = optim.make_schedule(old, before.total, data.steps_per_epoch, before.warmup)
  except ConfigError:  # the old config no longer resolves (its data changed): nothing to compare with
    return
  was, would = float(schedule(start - 1)), float(schedule(start))  # step N trains at schedule(N - 1)
  now = float(exp.schedule(start))
  total = run.plan.total
  if before.total == total and math.isclose(now, would, rel_tol=1e-3, abs_tol=1e-12):
    return
  spans = f"now spans {total} steps (it spanned {before.total})" if before.total != total else "changed"
  if math.isclose(now, would, rel_tol=1e-3, abs_tol=1e-12):
    logging.info(
      "the learning-rate schedule %s: the learning rate goes on from %.2e (step %d) to %.2e (step %d), as the old "
      "schedule would have",
      spans,
      was,
      start,
      now,
      start + 1,
    )
    return
  logging.warning(
    "the learning-rate schedule %s: the learning rate goes from %.2e (step %d, the old schedule's) to %.2e (step %d, "
    "the new one's): %s, not a continuation",
    spans,
    was,
    start,
    now,
    start + 1,
    "a warm restart" if now > would else "a jump down",
  )


def _smoothing_note(eps: float, model) -> str:
  """What train/loss is under label smoothing, with its floor where the model says how many classes it scores."""
  k = next((getattr(model, a) for a in ("num_classes", "tgt_vocab_size", "vocab_size") if getattr(model, a, None)), 0)
  floor = ""
  if k > 1:  # the entropy of the smoothed target: the loss of predicting it exactly
    hit, miss = 1 - eps + eps / k, eps / k
    floor = f" (at least {-(hit * math.log(hit) + (k - 1) * miss * math.log(miss)):.3f} with {k} classes)"
  return (
    f"label_smoothing={eps:g}: train/loss is the smoothed objective{floor}, eval/loss the plain cross-entropy: "
    "train/loss above eval/loss is not a generalisation gap"
  )


def _unread_settings(config) -> str:
  """A line naming settings changed from their defaults that this run never reads, or ''."""
  default, said = config_lib.default_config(), []
  names, wandb = tuple(config.get("trackers", ("tensorboard",))), config.get("wandb") or {}
  if "wandb" not in names:
    # (not name or group: a sweep sets those for every trial, whatever its trackers)
    changed = [
      k
      for k in ("project", "entity", "tags", "notes")
      if json.dumps(wandb.get(k, default.wandb[k])) != json.dumps(default.wandb[k])  # (a list read back: a tuple)
    ]
    if changed:
      said.append(
        f"config.wandb.{changed[0]} is set but 'wandb' is not in config.trackers={names}: nothing "
        "goes to W&B; add it, e.g. --config.trackers=\"('tensorboard', 'wandb')\""
      )
  if config.on_nonfinite == "stop" and config.max_nonfinite_skips != default.max_nonfinite_skips:
    said.append(
      f"max_nonfinite_skips={config.max_nonfinite_skips} is read only with on_nonfinite='skip' (this run stops at "
      "the first non-finite step); add --config.on_nonfinite=skip"
    )
  return "; ".join(said)


def _steps(run: _Run, train_step, state, start: int, reporter: Reporter, evaluations) -> None:
  """The training steps from start + 1: progress, evaluations, checkpoints; Preempted on a signal.

  The reporter is told of each step, of the time spent waiting for input, and of the time spent in evaluations and
  saves (not training time: its speeds leave it out).
  """
  config, plan, ckpts, stop = run.config, run.plan, run.ckpts, run.stop
  profiler = Profiler(run.workdir, config.profile_steps)
  guard = _NonfiniteGuard(config, ckpts)
  total = plan.total
  batches = _prefetch(run.data, run.task, run.exp.batch_sharding)
  metrics = data_state = None  # the last trained step's (bound once a step has run)
  try:
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
        raise InputLost(_lost_input(why, step - 1, saved, ckpts)) from None
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
        raise Preempted(_preempted(stop, step, ckpts))
      if evaluating:
        evaluations.run(step, state, data_state, due)
      elif saving:
        _save(reporter, ckpts, step, state, data_state)
      if out_of_time:
        break
  finally:
    batches.close()  # stops the input thread


def _save(reporter: Reporter, ckpts, step: int, state, data_state) -> None:
  """Saves `step` without metrics, its training time written first (Reporter.checkpoint); not training time."""
  reporter.checkpoint(step)
  with reporter.pause():
    ckpts.save(step, state, data_state)


class _Evaluations:
  """Evaluates a step and saves it.

  With its metrics (a candidate for best) when the evaluator of config.best ran; one log line per evaluator, the best
  one's saying whether it is the best so far.
  """

  def __init__(self, run: _Run, reporter: Reporter):
    self.run_, self.reporter = run, reporter
    config, ckpts = run.config, run.ckpts
    self.best, mode = evaluators.best_of(config, run.evals)
    best = ckpts.best_step()
    self.best_value = (ckpts.metrics(best) or {}).get(config.best) if best is not None else None
    self.sign = 1 if mode == "max" else -1

  def _interrupted(self) -> bool:  # asked between evaluation batches
    self.run_.lock.touch()
    return self.run_.stop.requested()

  def run(self, step: int, state, data_state, due, resave: bool = False) -> None:
    """Runs the evaluators `due` at `step` and saves the step.

    An interrupted evaluation saves the step without metrics (it runs again on resume) and raises Preempted. The
    reporter is told how long each evaluator took (the ETA) and that none of it was training time.
    """
    with self.reporter.pause():
      self._run(step, state, data_state, due, resave)

  def _run(self, step: int, state, data_state, due, resave: bool) -> None:
    run, ckpts = self.run_, self.run_.ckpts
    weights = {"params": lambda: state_lib.variables(state)}
    weights["ema"] = lambda: {"params": optim.ema_params(state.opt_state), **state.model_state}
    results = {}
    try:
      for e in due:
        started = time.time()
        results[e.name] = e.run(run.exp, weights[e.weights](), self._interrupted, step)
        self.reporter.evaluated(e.name, time.time() - started)
        if e is self.best:
          e.check_reports(run.config.best, results[e.name])
    except (EvaluationInterrupted, evaluators.EvaluatorError) as e:  # the step is kept, evaluated again on resume
      if not resave:
        self.reporter.checkpoint(step)
        ckpts.save(step, state, data_state)
      if isinstance(e, EvaluationInterrupted):
        raise Preempted(_preempted(run.stop, step, ckpts)) from None
      raise ConfigError(f"step {step}: {e}; step {step} is checkpointed: rerun the same command to resume") from None
    metrics = {k: v for r in results.values() for k, v in r.items()}
    candidate = self.best.name in results
    if not _finite(metrics):
      logging.warning("step %d: the evaluation is not finite (%s): not a candidate for best", step, metrics)
    self.reporter.checkpoint(step)  # the training time at this save, evaluation included
    if resave:  # the step is saved already, without metrics: save it again with them
      ckpts.wait()
      ckpts.manager.delete(step)
    ckpts.save(step, state, data_state, metrics=metrics if candidate else None)
    if resave:
      ckpts.wait()
    self.reporter.write(step, metrics)
    for e in due:
      note = self._note(metrics) if e is self.best else ""
      self.reporter.evaluation(step, e.split, results[e.name], note)
      if note:  # the best so far, or a tie that makes this later step best
        self.reporter.best(step, metrics)

  def _note(self, metrics: dict) -> str:
    config = self.run_.config
    value = metrics.get(config.best)
    if (
      value is not None
      and value == value
      and (self.best_value is None or self.sign * value > self.sign * self.best_value)
    ):
      self.best_value = value
      return f" | best {config.best} so far"
    if value is not None and value == self.best_value:  # orbax keeps the later of equal steps as best
      return f" | ties the best {config.best}: this later step becomes best"
    return ""


def _result_file(workdir: str, name: str, options: dict) -> str:
  """NAME.json, or NAME_<hash of options>.json where NAME.json holds a result of other options.

  Before, evaluating with beam 1 then beam 4 left only beam 4's result, under the same name.
  """
  try:
    with open(os.path.join(workdir, f"{name}.json")) as f:
      earlier = json.load(f).get("options", options)
  except (OSError, ValueError, AttributeError):
    earlier = options
  if earlier == options:
    return f"{name}.json"
  digest = hashlib.sha256(json.dumps(options, sort_keys=True).encode()).hexdigest()[:8]
  return f"{name}_{digest}.json"


def _best_result(config, ckpts, evals) -> dict:
  """The run's result: the best kept step and its evaluation, in evaluate()'s layout."""
  best = ckpts.best_step()
  metrics = (ckpts.metrics(best) if best is not None else None) or {}
  ev, _ = evaluators.best_of(config, evals)
  row = {"step": best, "checkpoint": "best", "evaluator": ev.name, "split": ev.split, "weights": ev.weights}
  return {**row, **metrics}


def _lost_input(why: str, trained: int, saved: int, ckpts) -> str:
  n = jax.process_count()
  again = "rerun the same command" if n == 1 else f"the other processes stop within --peer_timeout; rerun all {n}"
  kept = f"checkpoint {saved} is in {ckpts.directory}: {again} to resume"
  if not saved:
    kept = f"nothing was checkpointed yet: {again} to start again"
  return f"the training input stopped after step {trained}: {why}; {kept}"


def _preempted(stop: StopRequest, step: int, ckpts) -> str:
  return (
    f"{stop.name}: stopped at step {step}, checkpoint {step} written to {ckpts.directory}; "
    "rerun the same command to resume"
  )


class _NonfiniteGuard:
  """Reads each step's train/nonfinite flag, one step late unless asked now, and applies config.on_nonfinite."""

  def __init__(self, config, ckpts):
    self.config, self.ckpts = config, ckpts
    self.pending = None  # (step, metrics) not yet checked
    self.streak = self.skipped = 0

  def check_lagged(self, step: int, metrics: dict) -> None:
    previous, self.pending = self.pending, (step, metrics)
    if previous is not None:
      self._check(*previous)

  def check_now(self, step: int, metrics: dict) -> None:
    if self.pending is not None and self.pending[0] == step:
      self.pending = None
      self._check(step, metrics)

  def _check(self, step: int, metrics: dict) -> None:
    if float(metrics["train/nonfinite"]) == 0:
      self.streak = 0
      return
    values = jax.device_get(metrics)
    what = f"loss {values['train/loss']:.4g}, grad norm {values['train/grad_norm']:.4g}"
    self.streak += 1
    if self.config.on_nonfinite == "skip" and self.streak <= self.config.max_nonfinite_skips:
      self.skipped += 1
      logging.warning("step %d is not finite (%s): update skipped (%d in a row)", step, what, self.streak)
      return
    self.ckpts.wait()
    good = self.ckpts.latest_step()
    where = f"step {good} in {self.ckpts.directory}" if good is not None else "none yet"
    if self.config.on_nonfinite == "skip":
      why = f"more than max_nonfinite_skips={self.config.max_nonfinite_skips} non-finite steps in a row"
      fix = "or allow more skips with --config.max_nonfinite_skips"
    else:
      why, fix = "on_nonfinite='stop'", "or skip such steps with --config.on_nonfinite=skip"
    message = (
      f"step {step}: the loss, gradient norm or parameters are not finite ({what}); stopped ({why}), nothing "
      f"non-finite was saved. Newest good checkpoint: {where}. Lower --config.optim.lr (now "
      f"{self.config.optim.lr:g}), {fix}"
    )
    logging.error("%s", message)
    raise Diverged(message)


def evaluate(
  config,
  workdir: str,
  checkpoint: str = "best",
  split: str | None = None,
  weights: str | None = None,
  name: str | None = None,
) -> dict:
  """Runs evaluator `name` on a checkpoint; writes WORKDIR/NAME_SPLIT_STEP.json and a metrics.jsonl row.

  `name`: a config.evals entry, or a type with its default options; None: the one that chooses best. The checkpoint:
  best, latest, a step, averaged (vitjax.average's; corrupt ones are skipped for best and latest), or init (the initial
  weights: config.init_from's, else random; also what a workdir without checkpoints but with config.init_from
  evaluates). `split` and `weights` ('params', 'ema') override the evaluator's. Writes WORKDIR/NAME_SPLIT_STEP.json
  (STEP: averaged, init, imported; _ema added where --weights=ema overrides the evaluator's weights) and a metrics.jsonl
  row.
  """
  workdir = os.path.abspath(workdir)
  trained = ckpt_lib.has_checkpoints(workdir)
  imported = not trained and bool(config.init_from)
  initial = str(checkpoint) == "init" or imported
  described = None if initial else workdir_lib.read_json(workdir, "task.json")
  ran = (described or {}).get("task")
  if ran and ran != config.task and "translation" in (ran, config.task):  # text and images: nothing carries over
    raise ConfigError(
      f"{workdir} is a {ran} run and --config's task is {config.task}: evaluate it with its own config (leave out "
      "--config)"
    )
  task = tasks.get(config, workdir, described=described)
  if initial or not trained:
    workdir_lib.check_path(workdir)
    task.check()
  else:
    workdir_lib.check_recordable(workdir, "an evaluation")
  name = name or str(config.best).split("/")[0]
  configured = evaluators.entries(config).get(name, {}).get("weights") or "params"
  ev = evaluators.named(config, task, name, workdir, split=split, weights=weights)
  if ev.examples is not None:  # the whole split: an entry's `examples` caps its evaluations during training only
    ev = dataclasses.replace(ev, examples=None)
  if not initial and not trained:
    raise ConfigError(
      f"{workdir} has no checkpoints: train first, give --config.init_from, or evaluate the initial (random) "
      "weights with --checkpoint=init"
    )
  net = state_lib.network(config, task)
  if initial:
    if ev.weights != "params":
      raise ConfigError("--weights=ema: initial weights have no moving average")
    step, which = 0, "imported" if imported else "init"
    params, model_state = state_lib.initial_variables(net)
    source = f"init_from={config.init_from}" if config.init_from else f"random init (seed {config.seed})"
    logging.info("evaluating the initial weights: %s", source)
  else:
    step, params, model_state = ckpt_lib.read_variables(workdir, config, checkpoint, net.abstract, ev.weights)
    which = "averaged" if str(checkpoint) == ckpt_lib.AVERAGED else step
  with jax.set_mesh(net.mesh):
    metrics = ev.run(net, {"params": params, **model_state}, step=which)  # (names the files a type writes)
  row = {"step": step, "checkpoint": "init" if initial else str(checkpoint), "evaluator": ev.name, "split": ev.split}
  options = json.loads(json.dumps(ev.options))  # (how it evaluated: a translation's decoding, a probe's shots, ...)
  row = {**row, "weights": ev.weights, **({"init_from": config.init_from} if imported else {}), "options": options}
  row = {**row, **metrics}
  other = f"_{ev.weights}" if ev.weights != configured else ""  # --weights= against the evaluator's own
  workdir_lib.write_json(workdir, _result_file(workdir, f"{ev.name}_{ev.split}_{which}{other}", options), row)
  if jax.process_index() == 0:
    with open(os.path.join(workdir, "metrics.jsonl"), "a") as f:
      f.write(json.dumps({**row, "source": "evaluate"}) + "\n")
  return row
