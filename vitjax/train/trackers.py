"""Where a run's metrics go besides its log: one small interface, three writers.

    config.trackers = ("tensorboard",)            # the default
    config.trackers = ("tensorboard", "wandb")    # and Weights & Biases (config.wandb: project, entity, name, ...)

WORKDIR/metrics.jsonl ("jsonl") is always written: the workdir's own record, which resumes, sweeps and the tests
read. "tensorboard" writes the same scalars under the same names to WORKDIR/tb. "wandb" logs them to a W&B run
whose id is kept in WORKDIR/wandb_run_id, so that a resumed run (after a kill, a preemption, a longer total_steps)
goes on as the same W&B run; its config is the run's config, its x-axis the training step, and its summary holds,
besides the latest values, the metrics of the best step so far as best/NAME (best/step: which one). W&B's own
settings come from its environment (WANDB_MODE=offline writes WORKDIR/wandb/ for a later `wandb sync`; WANDB_API_KEY,
WANDB_BASE_URL). A missing wandb package or a failing W&B service is one warning line, and training goes on with
the other trackers.

A tracker has three methods: scalars(step, {name: value}), best(step, {name: value}) and close(). Only process 0
tracks (the loop's Reporter builds them).
"""

from __future__ import annotations

import json
import os
import time
import uuid

from absl import logging

from vitjax import paths
from vitjax.errors import ConfigError
from vitjax.train.workdir import as_dict

TRACKERS = ("jsonl", "tensorboard", "wandb")
WANDB_ID_FILE = "wandb_run_id"


def check(config) -> None:
  """ConfigError for an unknown tracker name (before anything is written)."""
  names = config.get("trackers", ("tensorboard",))
  if isinstance(names, str) or not all(isinstance(n, str) for n in names):
    raise ConfigError(
      f"config.trackers={names!r}: give a tuple of names, e.g. --config.trackers=\"('tensorboard', 'wandb')\""
    )
  unknown = [n for n in names if n not in TRACKERS]
  if unknown:
    raise ConfigError(f"config.trackers: unknown tracker {unknown[0]!r}; the trackers are {', '.join(TRACKERS)}")


def open_trackers(workdir: str, config, purge_step: int | None) -> list:
  """The run's trackers, metrics.jsonl first. purge_step: the first step this session writes (a resume)."""
  names = tuple(config.get("trackers", ("tensorboard",)))
  out = [Jsonl(workdir)]
  if "tensorboard" in names:
    out.append(TensorBoard(os.path.join(workdir, "tb"), purge_step))
  if "wandb" in names:
    tracker = WandB.open(workdir, config)
    if tracker is not None:
      out.append(tracker)
  return out


class Jsonl:
  """WORKDIR/metrics.jsonl: one JSON row per call, {"step": N, name: value, ...}."""

  def __init__(self, workdir: str):
    self.path = os.path.join(workdir, "metrics.jsonl")

  def scalars(self, step: int, values: dict) -> None:
    """Appends the row {"step": step, name: value, ...} (values as floats) to metrics.jsonl."""
    with paths.appending(self.path) as f:
      f.write(json.dumps({"step": int(step), **{k: float(v) for k, v in values.items()}}) + "\n")

  def best(self, step: int, values: dict) -> None:
    """Nothing: the checkpoints record which step is best."""
    pass

  def close(self) -> None:
    """Nothing: each row is written and the file closed at once."""
    pass


class TensorBoard:
  """Scalars in a TensorBoard event file, written with tensorboard's own writer.

  tensorboardX's would import torch where it is installed: 2-4 s at every start.

  purge_step: the first step this run writes; TensorBoard drops the events an earlier, killed run left at or past it
  (a SessionLog START event, as tf.summary and tensorboardX write on a resume).
  """

  def __init__(self, logdir: str, purge_step: int | None):
    from tensorboard.compat.proto import event_pb2, summary_pb2
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    self._event, self._summary = event_pb2, summary_pb2
    self._writer = EventFileWriter(logdir)
    if purge_step is not None:
      start = event_pb2.SessionLog(status=event_pb2.SessionLog.START)
      self._writer.add_event(event_pb2.Event(step=purge_step, wall_time=time.time(), session_log=start))

  def scalars(self, step: int, values: dict) -> None:
    """Writes `values` as scalar summaries at `step`, and flushes."""
    value = [self._summary.Summary.Value(tag=k, simple_value=float(v)) for k, v in values.items()]
    summary = self._summary.Summary(value=value)
    self._writer.add_event(self._event.Event(step=int(step), wall_time=time.time(), summary=summary))
    self._writer.flush()

  def best(self, step: int, values: dict) -> None:
    """Nothing: TensorBoard keeps no summary of the best step."""
    pass

  def close(self) -> None:
    """Closes the event file."""
    self._writer.close()


class WandB:
  """A Weights & Biases run, resumed by the id in WORKDIR/wandb_run_id.

  Every call that fails turns the tracker off with one warning line; the run goes on.
  """

  def __init__(self, run):
    self.run = run

  @classmethod
  def open(cls, workdir: str, config) -> WandB | None:
    """Starts or resumes the W&B run of `workdir`.

    The run's id is kept in WORKDIR/wandb_run_id (a new one is written there at the first start); config.wandb gives
    the project, entity, name, group, tags and notes.

    Returns:
      The tracker; None, after one warning line, when wandb is not installed or the run cannot start.
    """
    try:
      import wandb
    except ImportError:
      logging.warning(
        "config.trackers has 'wandb' but the wandb package is not installed (pip install wandb): "
        "the metrics go to metrics.jsonl and the other trackers only"
      )
      return None
    opts = config.get("wandb") or {}
    id_path = os.path.join(workdir, WANDB_ID_FILE)
    try:
      if os.path.exists(id_path):
        run_id = open(id_path).read().strip()
      else:
        run_id = uuid.uuid4().hex[:12]
        paths.write_text(id_path, run_id + "\n")

      run = wandb.init(
        project=opts.get("project") or "vitjax",
        entity=opts.get("entity") or None,
        name=opts.get("name") or os.path.basename(os.path.normpath(workdir)),
        group=opts.get("group") or None,
        tags=list(opts.get("tags") or ()) or None,
        notes=opts.get("notes") or None,
        id=run_id,
        resume="allow",
        dir=workdir,
        config=as_dict(config),
        settings=wandb.Settings(silent=True, console="off", init_timeout=60, x_disable_stats=True),
      )
      run.define_metric("step", hidden=True)
      run.define_metric("*", step_metric="step")
    except Exception as e:  # noqa: BLE001 (W&B's errors are many: no API key, no network, a refused id)
      logging.warning(
        "W&B: could not start the run (%s): the metrics go to metrics.jsonl and the other trackers only", _one_line(e)
      )
      return None
    logging.info(
      "W&B: run %s (%s), project %s%s",
      run.id,
      run.name,
      run.project,
      f", offline files in {run.dir}" if run.settings.mode == "offline" else f", {run.url}",
    )
    return cls(run)

  def _call(self, what: str, fn) -> None:
    if self.run is None:
      return
    try:
      fn()
    except Exception as e:  # noqa: BLE001
      logging.warning("W&B: %s failed (%s): W&B is off for the rest of this run", what, _one_line(e))
      self.run = None

  def scalars(self, step: int, values: dict) -> None:
    """Logs `values` at `step` (the run's x-axis "step")."""
    self._call("logging", lambda: self.run.log({"step": int(step), **{k: float(v) for k, v in values.items()}}))

  def best(self, step: int, values: dict) -> None:
    """Puts `step`'s metrics in the run's summary as best/NAME, with best/step."""
    summary = {"best/step": int(step), **{f"best/{k}": float(v) for k, v in values.items()}}
    self._call("the summary", lambda: self.run.summary.update(summary))

  def close(self) -> None:
    """Finishes the W&B run; the tracker is off afterwards."""
    self._call("finishing", lambda: self.run.finish())
    self.run = None


def _one_line(e: BaseException) -> str:
  text = " ".join(str(e).split()) or type(e).__name__
  return text if len(text) <= 200 else text[:197] + "..."
