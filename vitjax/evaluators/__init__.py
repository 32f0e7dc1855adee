"""Evaluators: what a run measures, configured by name, one module per type.

The model is big_vision's evaluators/. The trainer runs them without knowing what they are.

    config.evals.eval = dict(type="classification")                                  # the run's 'valid' split
    config.evals.test = dict(type="classification", split="test", every="5 epochs")
    config.evals.rotated = dict(type="classification", split="test", shift="rotate:30")
    config.evals.other = dict(type="classification", data=dict(name="fashion_mnist"), split="test")
    config.evals.probe = dict(type="probe", every="2 epochs", shots=(1, 5, 10, 25))
    config.best = "probe/knn"        # NAME/METRIC of any evaluator; higher is better unless the type says not

An entry's keys: `type` (a module of this package), `split` (default 'valid'), `every` (a duration; default
config.eval_every; every evaluator also runs at the end), `data` (fields of config.data for another dataset, e.g.
dict(name="fashion_mnist")), `weights` ('params', or 'ema': the moving average of config.ema_decay), `examples`
(a cap on the examples evaluated during training; None: all; --mode=eval reads the whole split), and the type's own OPTIONS. Metrics are NAME/METRIC everywhere:
the log, metrics.jsonl, TensorBoard, --json, a sweep's objective, `best`.

A type is one module here that defines

    OPTIONS = {...}                               # its options and their defaults
    def metrics(options) -> {metric: "max" | "min"}   # what it reports, and which way is better
    def check(ev) -> None                         # ConfigError before anything is written
    def run(ev, net, variables, stop=None, step=None) -> {metric: float}

where `ev` is an Evaluator (below: its task, split, options, ...) and `net` the model on its mesh (model,
batch_sharding: vitjax.models.network.Network or vitjax.train.state.Experiment); `step` names what is evaluated in the files a type writes:
the training step, or outside training 'averaged', 'init' or 'imported' for those weights. Adding a type is one new
file plus its test.

On a folder or csv dataset without a 'test' split, an evaluator of split 'test' evaluates 'valid' and says so.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import pkgutil
from types import ModuleType
from typing import Any

import ml_collections as mlc
from absl import logging

from vitjax import config as config_lib
from vitjax import data as data_lib
from vitjax import durations, tasks
from vitjax.errors import ConfigError
from vitjax.tasks.base import VALID, check_stop

COMMON = ("type", *config_lib.ENTRY)  # what every entry has (vitjax.config.evaluator), then its type's OPTIONS
WEIGHTS = ("params", "ema")

__all__ = ["Evaluator", "EvaluatorError", "check_stop", "complete", "get", "plan", "resolve", "types"]


def types() -> list[str]:
  """The evaluator types: the modules of this package."""
  return sorted(m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_"))


# what a type's module defines (the docstring above)
PARTS = ("OPTIONS", "metrics", "check", "run")


def get(name: str) -> ModuleType:
  """The module of evaluator type `name`; ConfigError listing the types there are, or naming what it lacks."""
  if name not in types():
    raise ConfigError(f"no evaluator type {name!r}; the types are {', '.join(types())} (vitjax/evaluators/)")
  module = importlib.import_module(f"{__name__}.{name}")
  missing = [part for part in PARTS if not hasattr(module, part)]
  if missing:
    raise ConfigError(
      f"vitjax/evaluators/{name}.py defines no {', '.join(missing)}: an evaluator type defines OPTIONS = {{...}}, "
      "metrics(options), check(ev) and run(ev, net, variables, stop=None, step=None) (vitjax/evaluators/__init__.py)"
    )
  return module


class EvaluatorError(ConfigError):
  """An evaluator type's run() did not return the metric config.best names, which its metrics() declares."""


@dataclasses.dataclass(frozen=True)
class Evaluator:
  """One configured evaluation, resolved.

  Its module, the task that reads its data, the split, its cadence in steps and its options (the type's OPTIONS with the
  entry's values).
  """

  name: str
  module: ModuleType
  task: Any
  split: str
  every: int | None  # steps; None: not during training (--mode=eval of a type no entry names)
  weights: str
  examples: int | None
  options: dict
  config: Any
  workdir: str | None

  @property
  def type(self) -> str:
    """The evaluator type: its module's name ("classification", "probe", ...)."""
    return self.module.__name__.rsplit(".", 1)[1]

  def due(self, step: int, total: int) -> bool:
    """Whether the evaluator runs after training step `step` of `total`.

    It runs every `every` steps and at the last step; never during training when `every` is None.
    """
    return self.every is not None and (step % self.every == 0 or step == total)

  def metrics(self) -> dict[str, str]:
    """{NAME/METRIC: 'max' | 'min'} of what it reports."""
    return {f"{self.name}/{k}": v for k, v in self.module.metrics(self.options).items()}

  def run(self, net, variables, stop=None, step=None) -> dict:
    """{NAME/METRIC: float} of `variables` on the evaluator's split; stop() is asked between batches."""
    metrics = self.module.run(self, net, variables, stop=stop, step=step)
    return {f"{self.name}/{k}": float(v) for k, v in metrics.items()}

  def check_reports(self, metric: str, result: dict) -> None:
    """EvaluatorError where `result`, of run(), lacks `metric` (NAME/METRIC: config.best, which it declares).

    A type may declare metrics that only some data gives (translation's exact_match), but without `best` a run would
    choose no best step.
    """
    if metric not in result:
      raise EvaluatorError(
        f"config.best={metric!r}: vitjax/evaluators/{self.type}.py's run() returned "
        f"{sorted(k.split('/', 1)[1] for k in result)}, without {metric.split('/', 1)[1]!r}, which its metrics() "
        "declares: make the two agree"
      )


def complete(config) -> None:
  """Gives every config.evals entry each field it lacks, with its default: the common ones and its type's OPTIONS.

  In place (unlocked for the while where the config is locked), before a command line applies its overrides (so
  --config.evals.NAME.OPTION sets any of a type's options) and before a run writes its config.json, so that the record
  holds every option the entry evaluated with. An entry of no known type is left as it is: resolve() names it.
  """
  evals = config.get("evals") or {}
  with config.unlocked():
    for entry in evals.values():
      kind = entry.get("type") if hasattr(entry, "get") else None
      if not hasattr(entry, "unlocked") or kind not in types():
        continue
      defaults = {**config_lib.ENTRY, **get(kind).OPTIONS}
      with entry.unlocked():
        for key, value in defaults.items():
          if key not in entry:
            entry[key] = mlc.FieldReference(None, field_type=object) if value is None else value


def entries(config) -> dict[str, dict]:
  """config.evals as {name: plain dict}."""
  evals = config.get("evals") or {}
  return {k: dict(v.to_dict() if hasattr(v, "to_dict") else v) for k, v in dict(evals).items()}


def resolve(config, task, name: str, entry: dict, every: int | None, workdir: str | None = None) -> Evaluator:
  """An Evaluator of one entry; ConfigError naming the entry for anything it cannot run."""
  what = f"config.evals.{name}"
  if not isinstance(entry, dict) or "type" not in entry:
    raise ConfigError(f"{what}: give a dict with a type, e.g. dict(type='classification', split='test')")
  if not name.isidentifier() or name == "train":
    raise ConfigError(f"{what}: the name {name!r} is not a plain word (or is 'train', training's own)")
  module = get(entry["type"])
  unknown = sorted(set(entry) - set(COMMON) - set(module.OPTIONS))
  if unknown:
    near = difflib.get_close_matches(unknown[0], [*COMMON, *module.OPTIONS], n=1)
    hint = f"did you mean {near[0]!r}? " if near else ""
    raise ConfigError(
      f"{what}: type {entry['type']!r} has no option {unknown[0]!r}; {hint}its options are "
      f"{', '.join([*COMMON[1:], *module.OPTIONS])}"
    )
  weights = entry.get("weights") or "params"
  if weights not in WEIGHTS:
    raise ConfigError(f"{what}: weights={weights!r}; use 'params' or 'ema'")
  if weights == "ema" and not config.ema_decay:
    raise ConfigError(
      f"{what}: weights='ema' needs the moving average of config.ema_decay: set it for a new run (e.g. 0.9999); a "
      "run trained without it has none"
    )
  examples = entry.get("examples")
  if examples is not None and (not isinstance(examples, int) or examples < 1):
    raise ConfigError(f"{what}: examples={examples!r}; give a count >= 1, or None for all")
  if entry.get("data"):
    task = _task_of(config, task, entry["data"], what, workdir)
  split = entry.get("split") or VALID
  if split == "test" and hasattr(task, "has_split") and not task.has_split("test"):
    logging.info("%s: %s has no 'test' split: evaluating '%s' (split= names another)", what, task.data_name, VALID)
    split = VALID
  options = {**module.OPTIONS, **{k: v for k, v in entry.items() if k in module.OPTIONS}}
  ev = Evaluator(name, module, task, split, every, weights, examples, options, config, workdir)
  module.check(ev)
  return ev


def _task_of(config, task, data: dict, what: str, workdir):
  """The run's task over another dataset: config.data with `data`'s fields, and the run's preprocessing."""
  if not isinstance(data, dict):
    raise ConfigError(f"{what}: data={data!r}; give fields of config.data, e.g. dict(name='fashion_mnist')")
  other = config.copy_and_resolve_references()
  unknown = sorted(set(data) - set(other.data))
  if unknown:
    raise ConfigError(f"{what}: data has no field {unknown[0]!r}; config.data's are {', '.join(other.data)}")
  with other.unlocked():
    other.data.update(data)
  described = task.describe() if hasattr(task, "describe") else None
  found = tasks.get(other, workdir, described=described, layout=task.layout)
  if described and "num_classes" in described:  # the model's classes are the run's; the labels, the other data's
    _check_classes(what, other.data, described)
  return found


def _check_classes(what: str, data, described: dict) -> None:
  """ConfigError where another dataset has another number of classes than the run's model.

  A warning where only their names differ: digits' 0-9 against Fashion-MNIST's ten may be meant, a folder's cat/dog
  against dog/cat is not.
  """
  info = data_lib.split_info(data.name, data.train_split, data.data_dir)
  ours, theirs = described.get("class_names") or [], info.get("class_names") or []
  if info["num_classes"] != described["num_classes"]:  # (labels past the model's logits: a wrong loss and accuracy)
    raise ConfigError(
      f"{what}: {data.name} has {info['num_classes']} classes, the run's model {described['num_classes']}: "
      "evaluate a dataset of the run's classes, in the same order"
    )
  if list(ours) != list(theirs):
    shown = lambda names: ", ".join(map(str, names[:4])) + (" ..." if len(names) > 4 else "")
    logging.warning(
      "%s: %s's classes (%s) are not the run's (%s): label i is scored as the model's class i", what, data.name,
      shown(theirs), shown(ours)
    )  # fmt: skip


def plan(config, task, steps_of=None, workdir: str | None = None) -> tuple[Evaluator, ...]:
  """The run's evaluators, in the order of their names (a ConfigDict's), with `every` in steps.

  `every` comes from steps_of(what, duration) -> steps; None: no cadence, for evaluation after training. ConfigError for
  a bad entry or a `best` no evaluator reports, before anything is written.
  """
  found = []
  for name, entry in entries(config).items():
    every, given = None, entry.get("every")
    if given is not None and durations.parse(f"config.evals.{name}.every", given)[0] <= 0:
      raise ConfigError(
        f"config.evals.{name}.every={given!r} must be at least 1 step (e.g. ='1 epoch'), or unset: config.eval_every"
      )
    if steps_of is not None:
      every = max(1, steps_of(f"config.evals.{name}.every", config.eval_every if given is None else given))
    found.append(resolve(config, task, name, entry, every, workdir))
  best_of(config, found)
  return tuple(found)


def best_of(config, evals) -> tuple[Evaluator, str]:
  """(the evaluator that reports config.best, 'max' or 'min'); ConfigError naming the metrics there are."""
  reported = {k: (e, mode) for e in evals for k, mode in e.metrics().items()}
  if config.best not in reported:
    near = difflib.get_close_matches(str(config.best), list(reported), n=1)
    hint = f" (did you mean {near[0]!r}?)" if near else ""
    raise ConfigError(f"best={config.best!r} is not reported by config.evals{hint}; use one of {sorted(reported)}")
  return reported[config.best]


def named(config, task, name: str, workdir: str | None = None, **overrides) -> Evaluator:
  """The evaluator --eval=NAME names: a configured entry, or a type with its default options (e.g. 'probe').

  With `overrides` (entry keys; None values are left out) applied; ConfigError listing both.
  """
  known = entries(config)
  if name not in known and name not in types():
    raise ConfigError(
      f"--eval={name}: no such evaluator; this run's are {', '.join(known) or 'none'}, and any type by name: "
      f"{', '.join(types())}"
    )
  entry = {**known.get(name, {"type": name}), **{k: v for k, v in overrides.items() if v is not None}}
  return resolve(config, task, name, entry, None, workdir)


def best_mode(config) -> str:
  """'max' or 'min' for config.best, from its evaluator's type (without building anything).

  'max' for a name no entry reports (plan() refuses such a config before a run starts).
  """
  name, _, metric = str(config.best).partition("/")
  entry = entries(config).get(name)
  if not entry or entry.get("type") not in types():
    return "max"
  module = get(entry["type"])
  return module.metrics({**module.OPTIONS, **{k: v for k, v in entry.items() if k in module.OPTIONS}}).get(
    metric, "max"
  )
