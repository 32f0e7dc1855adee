"""The train loop and checkpoint evaluation: a config in, a trained, checkpointed, evaluated model out.

train(): check everything -> build the experiment -> initialise or resume -> steps, progress, evaluations and
checkpoints -> final evaluation. evaluate(): restore a checkpoint and evaluate it on a split.
"""

from __future__ import annotations

import json
import math
import os
import time

import jax
import ml_collections as mlc
from absl import logging

from vitjax import tasks
from vitjax.errors import ConfigError
from vitjax.mesh import all_agree
from vitjax.train import checkpoints as ckpt_lib
from vitjax.train import state as state_lib
from vitjax.train.reporting import Profiler, Reporter
from vitjax.train.step import make_train_step


def _total_steps(config, steps_per_epoch: int) -> int:
  if config.total_steps is None and config.num_epochs is None:
    raise ConfigError("set config.total_steps or config.num_epochs")
  if config.total_steps is not None:
    if config.num_epochs is not None:
      logging.info("total_steps=%d takes precedence over num_epochs=%g", config.total_steps, config.num_epochs)
    total = config.total_steps
  else:
    total = int(math.ceil(config.num_epochs * steps_per_epoch))
  if total < 1:
    raise ConfigError(f"the run has {total} steps: set --config.total_steps or --config.num_epochs above 0")
  return total


def _check(config) -> None:
  """The trainer's own settings (the task checks its data and batch sizes)."""
  for key in ("log_every", "eval_every", "checkpoint_every", "keep_checkpoints"):
    if config[key] < 1:
      raise ConfigError(f"{key}={config[key]} must be at least 1 (e.g. --config.{key}=500)")
  p = config.get("profile_steps")
  if p is not None and (len(p) != 2 or not 1 <= p[0] <= p[1]):
    raise ConfigError(f"profile_steps={tuple(p)}: give (first, last) steps, 1 <= first <= last, e.g. (10, 12)")


def _prefetch(data: tasks.TrainInput, task: tasks.Task, sharding, size: int = 2):
  """Yields (global batch, data position after it) with `size` batches already on their way to the devices.

  Each batch carries the iterator's position taken right after it was read, so a checkpoint saves the position of
  the last batch consumed, not of the ones prefetched: a resumed run sees exactly the same batches.
  """
  from collections import deque

  from vitjax.mesh import to_global

  queue = deque()
  while True:
    while len(queue) < size:
      batch = next(data.batches)
      queue.append((to_global(batch, sharding, task.batch_keys), data.state()))
    yield queue.popleft()


def _variables(state) -> dict:
  return {"params": state.params, **state.model_state}


def train(config: mlc.ConfigDict, workdir: str) -> dict:
  """Trains (resuming from WORKDIR's latest checkpoint if any), evaluates, checkpoints. Returns the last
  evaluation's metrics. Raises ConfigError / DatasetNotPreparedError before writing anything if the config,
  data or workdir cannot work."""
  workdir = os.path.abspath(workdir)
  _check(config)
  task = tasks.get(config, workdir)
  task.check()
  ckpt_lib.check_workdir(workdir, config)
  data = task.train_input()
  total = _total_steps(config, data.steps_per_epoch)
  exp = state_lib.setup(config, task, total, data.steps_per_epoch)
  train_step = jax.jit(
    make_train_step(exp.model, exp.tx, exp.schedule, config, task),
    in_shardings=(exp.state_sharding, exp.batch_sharding),
    out_shardings=(exp.state_sharding, None),
    donate_argnums=0,
  )

  # A fresh run builds its initial state (and checks config.init_from) before it writes anything to the workdir.
  state = None if ckpt_lib.has_checkpoints(workdir) else state_lib.initial_state(exp)
  ckpt_lib.write_config(workdir, config)
  ckpt_lib.write_json(workdir, "task.json", task.describe())
  ckpts = ckpt_lib.Checkpoints(workdir, config.best_metric, config.best_mode, keep=config.keep_checkpoints)
  start = ckpts.latest_step()
  best_value = None
  if start is not None:
    state, data_state = ckpts.restore(start, exp.abstract_state)
    data.restore(data_state)
    best = ckpts.best_step()
    best_value = (ckpts.metrics(best) or {}).get(config.best_metric) if best is not None else None
    logging.info("resumed from %s at step %d", ckpts.directory, start)
  else:
    state = state if state is not None else state_lib.initial_state(exp)
    start = 0
  data_name = config.data.get("name") or config.data.get("source")
  logging.info(
    "%s: %s parameters | %s: %d training examples, %d steps/epoch | %d steps | %d devices, %d processes",
    config.model.name,
    f"{state_lib.num_params(state):,}",
    data_name,
    data.num_examples,
    data.steps_per_epoch,
    total,
    jax.device_count(),
    jax.process_count(),
  )

  deadline = time.time() + 60 * config.max_train_minutes if config.get("max_train_minutes") else None
  reporter = Reporter(workdir, total, config.log_every, data.examples_per_step, deadline)
  profiler = Profiler(workdir, config.get("profile_steps"))
  split, limit = config.data.eval_split, config.data.get("eval_examples")
  sign = 1 if config.best_mode == "max" else -1
  final = {}
  batches = _prefetch(data, task, exp.batch_sharding)
  with jax.set_mesh(exp.mesh):
    for step in range(start + 1, total + 1):
      batch, data_state = next(batches)
      profiler.before(step)
      state, metrics = profiler.run(step, train_step, state, batch)
      profiler.after(step, state)
      out_of_time = deadline is not None and step < total and all_agree(time.time() > deadline)
      if out_of_time:
        logging.info("max_train_minutes=%g reached at step %d: evaluating and stopping", config.max_train_minutes, step)
        total = reporter.total = step  # this step is the last: evaluate and checkpoint below
      if reporter.due(step):
        reporter.progress(step, jax.device_get(metrics))
      if step % config.eval_every == 0 or step == total:
        final = task.evaluate(exp.model, _variables(state), split, exp.batch_sharding, limit)
        ckpts.save(step, state, data_state, metrics=final)  # one write: the step and its metrics, for `best`
        value = final.get(config.best_metric)
        note = ""
        if value is not None and (best_value is None or sign * value > sign * best_value):
          best_value, note = value, f" | best {config.best_metric.removeprefix('eval/')} so far"
        reporter.evaluation(step, split, final, note)
      elif step % config.checkpoint_every == 0:
        ckpts.save(step, state, data_state)
      if out_of_time:
        break
  ckpts.close()
  reporter.close()
  logging.info("done: checkpoints in %s (best: step %s)", ckpts.directory, ckpts.best_step())
  return final


def evaluate(config, workdir: str, checkpoint: str = "latest", split: str | None = None) -> dict:
  """Restores a checkpoint (latest, best, or a step) and evaluates it on a split; writes the result to
  WORKDIR/eval_SPLIT_STEP.json and a row of metrics.jsonl."""
  workdir = os.path.abspath(workdir)
  split = split or config.data.eval_split
  task = tasks.get(config, workdir, described=ckpt_lib.read_json(workdir, "task.json"))
  exp = state_lib.setup(config, task)
  ckpts = ckpt_lib.Checkpoints(workdir, config.best_metric, config.best_mode, read_only=True)
  step = ckpts.resolve(checkpoint)
  params, model_state = ckpts.restore_variables(step, exp.abstract_state)
  with jax.set_mesh(exp.mesh):
    result = task.evaluate(exp.model, {"params": params, **model_state}, split, exp.batch_sharding)
  shown = ", ".join(f"{k.removeprefix('eval/')} {v:.4f}" for k, v in result.items() if k != "eval/examples")
  count = f" ({int(result['eval/examples'])} examples)" if "eval/examples" in result else ""
  logging.info("checkpoint %s (step %d) | %s: %s%s", checkpoint, step, split, shown, count)
  row = {"step": step, "checkpoint": checkpoint, "split": split, **result}
  ckpt_lib.write_json(workdir, f"eval_{split}_{step}.json", row)
  if jax.process_index() == 0:
    with open(os.path.join(workdir, "metrics.jsonl"), "a") as f:
      f.write(json.dumps({**row, "source": "evaluate"}) + "\n")
  return {"step": step, **result}
