"""What a run tells its user: progress lines, its metrics, and a profiler trace of chosen steps.

Progress lines, its metrics through the trackers of `config.trackers` (vitjax.train.trackers: WORKDIR/metrics.jsonl
always, TensorBoard in WORKDIR/tb, Weights & Biases), and a jax.profiler trace of chosen steps (`config.profile_steps`),
viewable in TensorBoard's profile tab.

Process 0 writes; every process may log.
"""

from __future__ import annotations

import contextlib
import os
import time

import jax
from absl import logging

from vitjax.logs import fmt_time
from vitjax.train import trackers as trackers_lib
from vitjax.train import workdir as workdir_lib

HEARTBEAT_SECONDS = 30.0  # a progress line at least this often, whatever log_every is


class Reporter:
  """Progress lines and metrics rows.

  A progress line comes every `log_every` steps, at the first and last step, and whenever `HEARTBEAT_SECONDS` of
  training passed without one. Its speeds are those of the steps since the previous line, over their training time:
  the time the loop spent in evaluations and checkpoint saves (`pause()`) is not training time, so an evaluation
  between two lines does not halve the step rate. Its ETA is the remaining steps at this session's training step rate
  plus the evaluations still due, each at its last measured time (nothing for an evaluator not timed yet), or the time
  budget (`budget`, from max_train_minutes) and the final evaluation when the budget ends the run first.

  train/elapsed_s, the run's training time across its sessions (what max_train_minutes spends), is wall-clock time:
  this session's and the `spent` seconds of the earlier ones. A resumed session does not count its start-up and
  compilation (up to its first line), which an uninterrupted run did not spend, so that a stopped and resumed run
  ends where the uninterrupted one would. `checkpoint()` records it for each saved step, before the save, so that a
  resume reads it exactly at its checkpoint (vitjax.train.workdir.train_seconds).
  """

  def __init__(
    self,
    workdir: str,
    total_steps: int,
    log_every: int,
    examples_per_step: int | None,
    budget: float | None = None,
    purge_step=None,
    spent: float = 0.0,
    config=None,
    evaluators=(),
    resumed: bool = False,
  ):
    """`budget`: seconds of training across sessions (max_train_minutes), or None; `spent`: the earlier sessions'.

    `evaluators`: the run's (their `name` and `every`, steps or None), for the ETA; `resumed`: a resumed session.
    """
    self.workdir, self.total, self.log_every, self.spent = workdir, total_steps, log_every, spent
    self.examples_per_step, self.budget, self.resumed = examples_per_step, budget, resumed
    self.evaluators = tuple(evaluators)
    self.main = jax.process_index() == 0
    # config: its trackers and their settings (None: metrics.jsonl and TensorBoard)
    self.trackers = trackers_lib.open_trackers(workdir, config or {}, purge_step) if self.main else []
    self.s0 = self.last_step = None
    self.created = self.last_line = time.time()
    self.excluded = 0.0  # a resumed session's start-up and compilation: not training time of the run
    self.wait = 0.0  # seconds spent waiting for the input pipeline since the last progress line
    self.paused_since_line = self.paused_in_session = 0.0  # seconds in evaluations and saves
    self.trained_s = 0.0  # training seconds and steps since the first line: the ETA's step rate
    self.trained_steps = 0
    self.tokens, self.pending_tokens = 0.0, []  # the target tokens of the steps since the last line
    self.evaluation_s = {}  # evaluator name -> seconds of its last evaluation

  def heartbeat_due(self) -> bool:
    """Whether HEARTBEAT_SECONDS of training passed since the last line, by this process's clock.

    Agree on it across processes before acting on it (see mesh.agree).
    """
    return time.time() - self.last_line - self.paused_since_line >= HEARTBEAT_SECONDS

  def due(self, step: int, heartbeat: bool = False) -> bool:
    """Whether `step` gets a progress line (so the caller fetches its metrics from the devices).

    `heartbeat`: a line now whatever the step (heartbeat_due(), or the last step of a run its time budget ends).
    """
    return heartbeat or step % self.log_every == 0 or step == self.total or self.s0 is None

  def waited(self, seconds: float) -> None:
    """Time the loop spent getting the next batch from the input pipeline.

    The devices idle meanwhile once the steps queued ahead of it are done.
    """
    self.wait += seconds

  def stepped(self, metrics: dict) -> None:
    """Counts a step's target tokens (its train/tokens, read from the devices at the next line) for tok/s.

    Called for every step, right after it is dispatched. The counts of the steps before it are read in batches as
    they pile up: those steps are done (the loop has read the previous step's non-finite flag), so reading them does
    not wait.
    """
    count = metrics.get("train/tokens")
    if count is None:
      return
    self.pending_tokens.append(count)
    if len(self.pending_tokens) > 64:
      self.tokens += float(sum(jax.device_get(self.pending_tokens[:-1])))
      del self.pending_tokens[:-1]

  def paused(self, seconds: float) -> None:
    """`seconds` the loop spent on something other than training steps (an evaluation, a checkpoint save)."""
    self.paused_since_line += seconds
    self.paused_in_session += seconds

  @contextlib.contextmanager
  def pause(self):
    """The time inside is not training time (an evaluation, a checkpoint save): see paused()."""
    started = time.time()
    try:
      yield
    finally:
      self.paused(time.time() - started)

  def evaluated(self, name: str, seconds: float) -> None:
    """Evaluator `name` took `seconds` (the ETA counts its evaluations still due at this time each)."""
    self.evaluation_s[name] = seconds

  def elapsed(self, now: float | None = None) -> float:
    """The run's training seconds so far (train/elapsed_s): the earlier sessions' and this one's."""
    now = time.time() if now is None else now
    if self.resumed and self.s0 is None:  # its start-up until the first line is not counted, its pauses are
      return self.spent + self.paused_in_session
    return self.spent + ((now - self.created) - self.excluded)

  def over_budget(self) -> bool:
    """Whether the run has spent its time budget (max_train_minutes), by this process's clock (agree on it)."""
    return self.budget is not None and self.elapsed() > self.budget

  def write(self, step: int, metrics: dict) -> None:
    """One row of metrics.jsonl and the same scalars in every other tracker."""
    for tracker in self.trackers:
      tracker.scalars(int(step), metrics)

  def checkpoint(self, step: int) -> None:
    """Before `step` is saved: the run's training time at it, which a resume goes on from (workdir.train_seconds).

    Written before the save, it is there for every saved step, whatever kills the run, and exact: the time after the
    step's last progress line (an evaluation, a signal between lines) is counted. It goes to WORKDIR/train_time.json
    rather than metrics.jsonl, whose rows (and TensorBoard's and W&B's) keep one train/elapsed_s per step.
    """
    if self.main:
      workdir_lib.record_train_time(self.workdir, step, self.elapsed())

  def best(self, step: int, metrics: dict) -> None:
    """`step` is the best so far (by config.best): its metrics become the trackers' summary."""
    for tracker in self.trackers:
      tracker.best(int(step), metrics)

  def _evaluations_left(self, step: int) -> float:
    """Seconds of the evaluations still due, by the last measured time of each evaluator (0 for one not timed yet).

    Those from `step` on, its own included (its line comes before them), to the last step.
    """
    seconds = 0.0
    for e in self.evaluators:
      took = self.evaluation_s.get(e.name)
      if took is not None and e.every:
        seconds += took * (self.total // e.every - (step - 1) // e.every + (1 if self.total % e.every else 0))
    return seconds

  def progress(self, step: int, metrics: dict) -> None:
    """Writes `step`'s metrics row with the rates added and logs its progress line.

    The row gains train/elapsed_s and, from the second line on (the first includes compilation),
    train/steps_per_s, train/data_wait and train/examples_per_s or train/tokens_per_s: those of the steps since the
    previous line, over their training time (evaluations and saves left out). The line gives the step, loss,
    accuracy (and agreement with a teacher), learning rate, skipped steps, the same speeds and the ETA.

    Args:
      step: the training step.
      metrics: the step's train/... scalars, with at least train/loss and train/lr.
    """
    now = time.time()
    training = max(now - self.last_line - self.paused_since_line, 1e-9)  # the interval's training time
    wait, tokens = self.wait, self.tokens + float(sum(jax.device_get(self.pending_tokens)))
    self.wait, self.paused_since_line, self.tokens, self.pending_tokens = 0.0, 0.0, 0.0, []
    if self.s0 is None:  # the first line includes compilation: rates start after it
      self.s0, rate = step, float("nan")
      if self.resumed:
        self.excluded = (now - self.created) - self.paused_in_session
    else:
      rate = (step - self.last_step) / training
      self.trained_s, self.trained_steps = self.trained_s + training, self.trained_steps + step - self.last_step
    self.last_line, self.last_step = now, step
    extra = {"train/elapsed_s": self.elapsed(now)}
    if rate == rate:
      extra["train/steps_per_s"] = rate
      # the share of the training time since the last line spent waiting for input: the devices' idle share when
      # it is large (the pipeline cannot keep up), near 0 when the steps are the bottleneck
      extra["train/data_wait"] = min(wait / training, 1.0)
      if self.examples_per_step:
        extra["train/examples_per_s"] = rate * self.examples_per_step
      if "train/tokens" in metrics:
        extra["train/tokens_per_s"] = tokens / training
    self.write(step, {**metrics, **extra})
    parts = [f"step {step}/{self.total}", f"loss {metrics['train/loss']:.4f}"]
    if "train/accuracy" in metrics:
      parts.append(f"acc {metrics['train/accuracy']:.3f}")
    if "train/agreement" in metrics:  # (config.distill: the share of the batch where the teacher's argmax is ours)
      parts.append(f"agree {metrics['train/agreement']:.3f}")
    parts.append(f"lr {metrics['train/lr']:.2e}")
    if metrics.get("train/skipped_steps"):
      parts.append(f"{int(metrics['train/skipped_steps'])} non-finite steps skipped")
    if rate != rate:
      first = now - self.created - self.paused_in_session
      logging.info(" | ".join([*parts, f"first step in {first:.0f}s (compilation)"]))
      return
    speed = f"{rate:.2f} steps/s"
    for key, unit in (("train/examples_per_s", "ex/s"), ("train/tokens_per_s", "tok/s")):
      if key in extra:
        speed += f", {extra[key]:.0f} {unit}"
    speed += f", data wait {100 * extra['train/data_wait']:.0f}%"
    logging.info(" | ".join([*parts, speed, f"ETA {self._eta(step, now)}"]))

  def _eta(self, step: int, now: float) -> str:
    """The time to the end: the remaining steps and evaluations, or the time budget and the final evaluation."""
    steps_left = (self.total - step) / (self.trained_steps / self.trained_s) if self.trained_steps else float("nan")
    eta = steps_left + self._evaluations_left(step)
    if self.budget is not None:
      final = sum(self.evaluation_s.get(e.name, 0.0) for e in self.evaluators if e.every)
      by_budget = max(self.budget - self.elapsed(now), 0.0) + final
      if by_budget < (eta if eta == eta else float("inf")):
        return f"{fmt_time(by_budget)} (time budget)"
    return fmt_time(eta)

  def evaluation(self, step: int, split: str, metrics: dict, note: str = "") -> None:
    """Logs one evaluator's metrics in one line (the loop writes a step's evaluations once, together)."""
    logging.info("step %d | %s%s", step, format_evaluation(split, metrics), note)

  def close(self) -> None:
    """Closes every tracker."""
    for tracker in self.trackers:
      tracker.close()


def format_evaluation(split: str, metrics: dict) -> str:
  """One evaluator's metrics on one line, by the names metrics.jsonl and TensorBoard give them.

  E.g. 'eval/loss 0.0712, eval/accuracy 0.9800, eval/top5 1.0000 (valid, 300 examples)'. Spreads (`*_std`) and the
  probe's regulariser stay there.
  """
  hidden = lambda k: k.endswith(("/examples", "_std", "_l2"))
  shown = ", ".join(f"{k} {v:.4f}" for k, v in metrics.items() if not hidden(k))
  count = next((f", {int(v)} examples" for k, v in metrics.items() if k.endswith("/examples")), "")
  return f"{shown} ({split}{count})"


def format_result(row: dict) -> str:
  """A result (train()'s or evaluate()'s) on one line.

  E.g. 'checkpoint best (step 1600) | eval/loss 0.0712, eval/accuracy 0.9833, ... (test, 300 examples)'; imported
  weights: 'imported weights (init_from=...), no training | ...'.
  """
  name = row.get("evaluator", "eval")
  metrics = {k: v for k, v in row.items() if k.startswith(name + "/")}
  if "init_from" in row:
    what = f"imported weights (init_from={row['init_from']}), no training"
  elif row["checkpoint"] == "init":
    what = "initial weights (no training)"
  else:
    what = f"checkpoint {row['checkpoint']} (step {row['step']}{', EMA weights' if row['weights'] == 'ema' else ''})"
  return f"{what} | {format_evaluation(row['split'], metrics)}"


class Profiler:
  """A jax.profiler trace of steps [first, last] (1-based, inclusive) into WORKDIR/tb/plugins/profile/RUN/.

  There `tensorboard --logdir WORKDIR` (or a parent) shows it in the profile tab (needs the tensorboard-plugin-profile
  package, installed with vitjax).
  """

  def __init__(self, workdir: str, steps):
    self.logdir = os.path.join(workdir, "tb")
    self.first, self.last = (int(steps[0]), int(steps[1])) if steps else (None, None)
    self.active = False

  def before(self, step: int) -> None:
    """Starts the trace when `step` is the first step to profile."""
    if step == self.first:
      jax.profiler.start_trace(self.logdir)
      self.active = True

  def run(self, step: int, fn, *args):
    """`fn(*args)`; while tracing, inside a step marker and waited for, so the profile tab shows real step times."""
    if not self.active:
      return fn(*args)
    with jax.profiler.StepTraceAnnotation("train", step_num=step):
      return jax.block_until_ready(fn(*args))

  def after(self, step: int, state) -> None:
    """Once `step` reaches the last step to profile: waits for `state`, stops the trace and logs where it went."""
    if self.active and step >= self.last:
      jax.block_until_ready(state)
      jax.profiler.stop_trace()
      self.active = False
      logging.info("profile of steps %d-%d written to %s/plugins/profile", self.first, self.last, self.logdir)
