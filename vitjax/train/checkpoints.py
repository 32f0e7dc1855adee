"""Checkpoints and the workdir.

WORKDIR/checkpoints/STEP is one orbax CheckpointManager's step: the TrainState and the data iterator's
position, written asynchronously and atomically. A step is saved every `checkpoint_every` steps, at every
evaluation (after it, with its metrics) and at the end. Orbax's preservation policies keep the latest
`keep_checkpoints` steps plus the best evaluated one by `best_metric` (`best_mode`); nothing is written twice.
`--checkpoint=best` is that step, `latest` the newest, or a step number.

The workdir also holds config.json (the resolved config), task.json (what prediction needs: classes, image size,
tokenizer; see Task.describe), metrics.jsonl and tb/ (vitjax.train.reporting).
"""

from __future__ import annotations

import json
import os

import flax
import jax
import ml_collections as mlc
import orbax.checkpoint as ocp
from absl import logging

from vitjax.errors import ConfigError

CHECKPOINTS = "checkpoints"


# ------------------------------------------------------------------------------------------- workdir


def fingerprint(config: dict) -> dict:
  """What makes two runs the same experiment (from a config as written to config.json), for refusing a workdir
  that holds another one."""
  d = config.get("data", {})
  model = {k: v for k, v in (config.get("model") or {}).items() if v is not None}  # None: the model's default
  return {"model": model, "data": d.get("name") or d.get("source"), "image_size": d.get("image_size")}


def has_checkpoints(workdir: str) -> bool:
  path = os.path.join(workdir, CHECKPOINTS)
  return os.path.isdir(path) and any(n.isdigit() for n in os.listdir(path))


def check_workdir(workdir: str, config) -> None:
  """Refuses a workdir whose checkpoints belong to another experiment. Writes nothing."""
  path = os.path.join(workdir, "config.json")
  if not (os.path.exists(path) and has_checkpoints(workdir)):
    return
  with open(path) as f:
    old = flax.traverse_util.flatten_dict(fingerprint(json.load(f)), sep=".")
  new = flax.traverse_util.flatten_dict(fingerprint(json.loads(config.to_json_best_effort())), sep=".")
  if old != new:
    diff = [
      f"{k}: {old.get(k)!r} there, {new.get(k)!r} now" for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)
    ]
    raise ConfigError(
      f"workdir {workdir} holds checkpoints of another experiment ({'; '.join(diff)}). "
      "Use a new --workdir, or --config.init_from to start from those weights."
    )


def write_json(workdir: str, name: str, obj) -> None:
  """WORKDIR/name, written atomically by process 0."""
  if jax.process_index() != 0:
    return
  os.makedirs(workdir, exist_ok=True)
  path = os.path.join(workdir, name)
  with open(path + ".tmp", "w") as f:
    f.write(obj if isinstance(obj, str) else json.dumps(obj, indent=2))
  os.replace(path + ".tmp", path)


def write_config(workdir: str, config) -> None:
  write_json(workdir, "config.json", config.to_json_best_effort(indent=2))


def read_json(workdir: str, name: str) -> dict | None:
  path = os.path.join(workdir, name)
  if not os.path.exists(path):
    return None
  with open(path) as f:
    return json.load(f)


def read_config(workdir: str) -> mlc.ConfigDict:
  """The config a workdir was trained with (its config.json)."""
  config = read_json(workdir, "config.json")
  if config is None:
    raise ConfigError(f"{os.path.join(workdir, 'config.json')} not found: is {workdir} the workdir of a vitjax run?")
  return mlc.ConfigDict(config)


# --------------------------------------------------------------------------------------- checkpoints


def _read_only_options(**kw) -> ocp.CheckpointManagerOptions:
  # (the settings orbax would otherwise change with a warning)
  return ocp.CheckpointManagerOptions(read_only=True, save_interval_steps=0, create=False, **kw)


class Checkpoints:
  """WORKDIR/checkpoints through one orbax CheckpointManager (see the module docstring).

  keep: how many latest steps to keep (training); None with read_only=True (evaluation, vitjax.load).
  """

  def __init__(self, workdir: str, best_metric: str, best_mode: str, keep: int | None = None, read_only=False):
    self.directory = os.path.join(workdir, CHECKPOINTS)
    self.best_metric = best_metric
    best_fn = lambda metrics: metrics[best_metric]
    if read_only:
      if not os.path.isdir(self.directory):
        raise ConfigError(
          f"no {CHECKPOINTS}/ in {workdir}: train first (python -m vitjax.main --config=... --workdir={workdir})"
        )
      options = _read_only_options(best_fn=best_fn, best_mode=best_mode)
    else:
      policy = ocp.checkpoint_managers.AnyPreservationPolicy(
        [
          ocp.checkpoint_managers.LatestN(n=keep),
          ocp.checkpoint_managers.BestN(
            get_metric_fn=best_fn, reverse=best_mode == "min", n=1, keep_checkpoints_without_metrics=False
          ),
        ]
      )
      options = ocp.CheckpointManagerOptions(
        best_fn=best_fn, best_mode=best_mode, preservation_policy=policy, enable_async_checkpointing=True
      )
    self.manager = ocp.CheckpointManager(self.directory, options=options, item_names=("state", "data"))

  def save(self, step: int, state, data_state: str, metrics: dict | None = None) -> None:
    """Starts writing step `step` (asynchronously); metrics make it a candidate for `best`."""
    args = ocp.args.Composite(state=ocp.args.StandardSave(state), data=ocp.args.JsonSave(data_state))
    metrics = {k: float(v) for k, v in metrics.items()} if metrics else None
    self.manager.save(step, args=args, metrics=metrics)

  def steps(self) -> list[int]:
    return sorted(self.manager.all_steps())

  def latest_step(self) -> int | None:
    return self.manager.latest_step()

  def best_step(self) -> int | None:
    """The kept step with the best metrics; None if no kept step was evaluated."""
    return self.manager.best_step()

  def resolve(self, which: str) -> int:
    """'latest', 'best' or a step number -> a saved step (ConfigError naming the saved ones otherwise)."""
    steps = self.steps()
    if not steps:
      raise ConfigError(f"{self.directory} holds no finished checkpoint")
    if which == "latest":
      return steps[-1]
    if which == "best":
      best = self.best_step()
      if best is None:
        logging.warning("no evaluated checkpoint in %s: using the latest, step %d", self.directory, steps[-1])
        return steps[-1]
      return best
    try:
      step = int(which)
    except ValueError:
      raise ConfigError(f"--checkpoint={which!r}: use 'best', 'latest' or a step number ({steps})") from None
    if step not in steps:
      raise ConfigError(f"no checkpoint for step {step} in {self.directory}; there are {steps}")
    return step

  def metrics(self, step: int) -> dict | None:
    """The metrics a step was saved with (its evaluation), or None."""
    return self.manager.metrics(step)

  def restore(self, step: int, abstract_state, with_data: bool = True) -> tuple:
    """(TrainState laid out as abstract_state's shardings, the data iterator's position or None)."""
    items = {"state": ocp.args.StandardRestore(abstract_state)}
    if with_data:
      items["data"] = ocp.args.JsonRestore()
    restored = self._restore(step, items)
    return restored["state"], restored.get("data") if with_data else None

  def restore_variables(self, step: int, abstract_state) -> tuple[dict, dict]:
    """(params, model_state) only: no optimizer state is read (vitjax.load, evaluation)."""
    target = {"params": abstract_state.params, "model_state": abstract_state.model_state}
    args = ocp.args.PyTreeRestore(
      item=target, restore_args=ocp.checkpoint_utils.construct_restore_args(target), partial_restore=True
    )
    restored = self._restore(step, {"state": args})["state"]
    return restored["params"], dict(restored.get("model_state") or {})

  def _restore(self, step, items):
    try:
      return self.manager.restore(step, args=ocp.args.Composite(**items))
    except (ValueError, KeyError) as e:
      raise ConfigError(
        f"the checkpoint at step {step} in {self.directory} does not match the model of this config "
        f"({str(e).splitlines()[0][:300]}). Use the config it was written with."
      ) from None

  def wait(self) -> None:
    self.manager.wait_until_finished()

  def close(self) -> None:
    self.manager.wait_until_finished()
    self.manager.close()


def load_params(workdir: str) -> tuple[dict, dict]:
  """(parameters, other collections such as BatchNorm statistics) of a workdir's latest checkpoint, as saved
  (for config.init_from=WORKDIR: the shapes may differ from the model's; vitjax.models.adapt fits them)."""
  workdir = os.path.abspath(workdir)
  if not has_checkpoints(workdir):
    raise ConfigError(
      f"init_from={workdir!r}: no checkpoints/ there; give a workdir of a vitjax run, "
      "'timm:NAME:FILE' or 'npz:VARIANT:FILE'"
    )
  with ocp.CheckpointManager(os.path.join(workdir, CHECKPOINTS), options=_read_only_options()) as manager:
    step = manager.latest_step()
    if step is None:
      raise ConfigError(f"init_from={workdir!r}: the workdir has no finished checkpoint")
    restored = manager.restore(step, args=ocp.args.Composite(state=ocp.args.PyTreeRestore()))
  return restored["state"]["params"], dict(restored["state"].get("model_state") or {})
