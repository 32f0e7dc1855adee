"""What a run tells its user: progress lines, its metrics, and a profiler trace of chosen steps.

Progress lines, its metrics through the trackers of `config.trackers` (vitjax.train.trackers: WORKDIR/metrics.jsonl
always, TensorBoard in WORKDIR/tb, Weights & Biases), and a jax.profiler trace of chosen steps (`config.profile_steps`),
viewable in TensorBoard's profile tab.

Process 0 writes; every process may log.
"""

from __future__ import annotations

import os
import time

import jax
from absl import logging

from vitjax.logs import fmt_time
from vitjax.train import trackers as trackers_lib

HEARTBEAT_SECONDS = 30.0  # a progress line at least this often, whatever log_every is


class Reporter:
  """Progress lines and metrics rows.

  A progress line comes every `log_every` steps, at the first and last step, and whenever `HEARTBEAT_SECONDS`
  passed without one. Its ETA follows the step rate, or the time budget (`deadline`, from max_train_minutes)
  when that ends the run first.
  """

  def __init__(
    self,
    workdir: str,
    total_steps: int,
    log_every: int,
    examples_per_step: int | None,
    deadline=None,
    purge_step=None,
    spent: float = 0.0,
    config=None,
  ):
    self.workdir, self.total, self.log_every, self.spent = workdir, total_steps, log_every, spent
    self.examples_per_step, self.deadline = examples_per_step, deadline
    self.main = jax.process_index() == 0
    # config: its trackers and their settings (None: metrics.jsonl and TensorBoard)
    self.trackers = trackers_lib.open_trackers(workdir, config or {}, purge_step) if self.main else []
    self.t0 = self.s0 = None
    self.created = self.last_line = time.time()
    self.wait = 0.0  # seconds spent waiting for the input pipeline since the last progress line

  def heartbeat_due(self) -> bool:
    """Whether HEARTBEAT_SECONDS passed since the last line, by this process's clock.

    Agree on it across processes before acting on it (see mesh.agree).
    """
    return time.time() - self.last_line >= HEARTBEAT_SECONDS

  def due(self, step: int, heartbeat: bool = False) -> bool:
    """Whether `step` gets a progress line (so the caller fetches its metrics from the devices)."""
    return heartbeat or step % self.log_every == 0 or step == self.total or self.s0 is None

  def waited(self, seconds: float) -> None:
    """Time the loop spent getting the next batch from the input pipeline.

    The devices idle meanwhile once the steps queued ahead of it are done.
    """
    self.wait += seconds

  def write(self, step: int, metrics: dict) -> None:
    """One row of metrics.jsonl and the same scalars in every other tracker."""
    for tracker in self.trackers:
      tracker.scalars(int(step), metrics)

  def best(self, step: int, metrics: dict) -> None:
    """`step` is the best so far (by config.best): its metrics become the trackers' summary."""
    for tracker in self.trackers:
      tracker.best(int(step), metrics)

  def progress(self, step: int, metrics: dict) -> None:
    """Writes `step`'s metrics row with the rates added and logs its progress line.

    The row gains train/elapsed_s and, from the second line on (the first includes compilation),
    train/steps_per_s, train/data_wait and train/examples_per_s or train/tokens_per_s. The line gives the step,
    loss, accuracy, learning rate, skipped steps, speed and ETA.

    Args:
      step: the training step.
      metrics: the step's train/... scalars, with at least train/loss and train/lr.
    """
    now, since = time.time(), self.last_line
    self.last_line = now
    wait, self.wait = self.wait, 0.0
    if self.s0 is None:  # the first line includes compilation: rates start after it
      self.t0, self.s0 = now, step
      rate = float("nan")
    else:
      rate = (step - self.s0) / max(now - self.t0, 1e-9)
    extra = {"train/elapsed_s": self.spent + now - self.created}  # this session's and the earlier ones'
    if rate == rate:
      extra["train/steps_per_s"] = rate
      # the share of the time since the last line spent waiting for input: the devices' idle share when it is
      # large (the pipeline cannot keep up), near 0 when the steps are the bottleneck
      extra["train/data_wait"] = min(wait / max(now - since, 1e-9), 1.0)
      if self.examples_per_step:
        extra["train/examples_per_s"] = rate * self.examples_per_step
      if "train/tokens" in metrics:
        extra["train/tokens_per_s"] = rate * float(metrics["train/tokens"])
    self.write(step, {**metrics, **extra})
    eta = (self.total - step) / rate if rate == rate and rate > 0 else float("nan")
    budget = ""
    if self.deadline is not None and self.deadline - now < (eta if eta == eta else float("inf")):
      eta, budget = self.deadline - now, " (time budget)"
    parts = [f"step {step}/{self.total}", f"loss {metrics['train/loss']:.4f}"]
    if "train/accuracy" in metrics:
      parts.append(f"acc {metrics['train/accuracy']:.3f}")
    parts.append(f"lr {metrics['train/lr']:.2e}")
    if metrics.get("train/skipped_steps"):
      parts.append(f"{int(metrics['train/skipped_steps'])} non-finite steps skipped")
    speed = f"{rate:.2f} steps/s" if rate == rate else f"first step in {now - self.created:.0f}s (compilation)"
    for key, unit in (("train/examples_per_s", "ex/s"), ("train/tokens_per_s", "tok/s")):
      if key in extra:
        speed += f", {extra[key]:.0f} {unit}"
    if "train/data_wait" in extra:
      speed += f", data wait {100 * extra['train/data_wait']:.0f}%"
    parts += [speed] + ([f"ETA {fmt_time(eta)}{budget}"] if rate == rate else [])
    logging.info(" | ".join(parts))

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
