"""Hyperparameter sweeps: the search lives beside get_config() in the config file; Optuna runs it on a database.

A config file may define `get_sweep()` (with the same argument as its get_config, if any). It returns a dict::

    from vitjax import sweep

    def get_sweep():
      return dict(
        grid=sweep.product(                      # every combination: 3 x 2 x 2 = 12 trials
          sweep.values("optim.lr", [1e-3, 2e-3, 4e-3]),
          sweep.values("optim.weight_decay", [0.05, 0.3]),
          sweep.zip(sweep.values("model.depth", [2, 4]), sweep.values("model.mlp_dim", [64, 128])),  # together
        ),
        objective="eval/accuracy", direction="maximize", pruner="median",
      )

or, instead of `grid`, a search space that Optuna's sampler (TPE, or random) draws `trials` points from::

        space={
          "optim.lr": sweep.log_uniform(1e-4, 1e-2),
          "model.dropout_rate": sweep.uniform(0.0, 0.3),
          "schedule.warmup_steps": sweep.integer(100, 800, step=100),
          "data.augment.flip": sweep.choice(True, False),
        },
        trials=12,

Keys: `grid` or `space` + `trials`; `objective`, a metric of an evaluator during training, NAME/METRIC
(eval/accuracy, eval/bleu, probe/knn: a trial's objective is its best evaluation, and its best step is where that
was, the step of its `best` checkpoint: the trials run with --config.best=OBJECTIVE where config.best differs);
`direction` (maximize or minimize); `pruner` ("none", "median": stop a trial whose evaluation is worse than the
median of earlier trials at the same step, "halving": successive halving; default "none"); `sampler` ("tpe" or
"random", search spaces only; default "tpe"); `seed` (the sampler's; default none).

Grid values and choices are numbers, strings or booleans; field names are dotted config paths, checked against
the config before anything runs. `python -m vitjax.sweep` runs a sweep and reports on it (vitjax.sweep.__main__).
"""

from __future__ import annotations

import builtins
import dataclasses
import decimal
import importlib.util
import itertools
import math
import os

from vitjax.errors import ConfigError

PRUNERS = ("none", "median", "halving")
SAMPLERS = ("tpe", "random")
_KEYS = {"grid", "space", "trials", "objective", "direction", "pruner", "sampler", "seed"}
_SCALARS = (bool, int, float, str)


# ------------------------------------------------------------------ the grid: lists of {field: value} points


def values(field: str, vals) -> list[dict]:
  """One axis of a grid: [{field: v} for v in vals]."""
  if isinstance(vals, str) or not hasattr(vals, "__iter__"):
    raise ConfigError(f"get_sweep(): sweep.values({field!r}, {vals!r}) takes a list of values")
  vals = list(vals)
  if not vals:
    raise ConfigError(f"get_sweep(): sweep.values({field!r}, ...) has no values")
  return [{field: v} for v in vals]


def product(*axes: list[dict]) -> list[dict]:
  """Every combination of the axes' points (the last axis varies fastest)."""
  return [_merge(points) for points in itertools.product(*axes)]


def zip(*axes: list[dict]) -> list[dict]:  # noqa: A001  (the grid's zip, as in big_vision/scenic sweeps)
  """The axes' points side by side: the i-th point of each, merged; the axes must have the same length."""
  lengths = {len(a) for a in axes}
  if len(lengths) > 1:
    raise ConfigError(f"get_sweep(): sweep.zip of axes of different lengths {sorted(lengths)}")
  return [_merge(points) for points in builtins.zip(*axes)]


def _merge(points) -> dict:
  merged = {}
  for p in points:
    for k, v in p.items():
      if k in merged:
        raise ConfigError(f"get_sweep(): the grid sets {k} twice in one point; give each field one axis")
      merged[k] = v
  return merged


# ------------------------------------------------------------------ the search space


@dataclasses.dataclass(frozen=True)
class Dist:
  """One dimension of a search space (made by uniform, log_uniform, integer, choice)."""

  kind: str  # float | int | categorical
  low: float | None = None
  high: float | None = None
  log: bool = False
  step: float | None = None
  choices: tuple = ()

  def optuna(self):
    """The dimension as an Optuna distribution.

    Returns:
      FloatDistribution, IntDistribution (step 1 unless given) or CategoricalDistribution.
    """
    import optuna

    if self.kind == "float":
      return optuna.distributions.FloatDistribution(self.low, self.high, log=self.log, step=self.step)
    if self.kind == "int":
      return optuna.distributions.IntDistribution(self.low, self.high, log=self.log, step=self.step or 1)
    return optuna.distributions.CategoricalDistribution(self.choices)

  def size(self) -> int | None:
    """How many values the dimension holds; None for a continuous range."""
    if self.kind == "categorical":
      return len(set(self.choices))
    if self.kind == "int":
      return (self.high - self.low) // (self.step or 1) + 1
    if self.step:  # (in decimal, as Optuna counts them: 0.3 // 0.1 is 2.0 in binary floating point)
      return (
        int((decimal.Decimal(str(self.high)) - decimal.Decimal(str(self.low))) // decimal.Decimal(str(self.step))) + 1
      )
    return None

  def describe(self) -> str:
    """The dimension in words, e.g. "float in [0.0001, 0.01] (log scale)" or "int in [2, 8] (linear, step 2)"."""
    if self.kind == "categorical":
      return f"one of {list(self.choices)}"
    scale = "log scale" if self.log else "linear"
    step = f", step {self.step:g}" if self.step else ""
    return f"{self.kind} in [{self.low:g}, {self.high:g}] ({scale}{step})"


def uniform(low: float, high: float, step: float | None = None) -> Dist:
  """A float on a linear scale, low <= x <= high (on a grid of `step` if given)."""
  if not all(isinstance(x, int | float) for x in (low, high, step if step is not None else 0.0)):
    raise ConfigError(f"get_sweep(): sweep.uniform({low!r}, {high!r}, step={step!r}) takes numbers")
  return _checked(Dist("float", float(low), float(high), step=step))


def log_uniform(low: float, high: float) -> Dist:
  """A float on a log scale, 0 < low <= x <= high (learning rates, weight decay)."""
  if not all(isinstance(x, int | float) for x in (low, high)):
    raise ConfigError(f"get_sweep(): sweep.log_uniform({low!r}, {high!r}) takes numbers")
  return _checked(Dist("float", float(low), float(high), log=True))


def integer(low: int, high: int, step: int = 1, log: bool = False) -> Dist:
  """An integer low <= n <= high, every `step` (or on a log scale, step 1)."""
  if not all(isinstance(x, int) and not isinstance(x, bool) for x in (low, high, step)):
    raise ConfigError(f"get_sweep(): sweep.integer({low!r}, {high!r}, step={step!r}) takes integers")
  if log and step != 1:
    raise ConfigError(f"get_sweep(): sweep.integer(..., log=True) takes no step (step={step})")
  return _checked(Dist("int", low, high, log=log, step=step))


def choice(*choices) -> Dist:
  """One of the given values (numbers, strings or booleans)."""
  return _checked(Dist("categorical", choices=tuple(choices)))


def _checked(d: Dist) -> Dist:
  if d.kind == "categorical":
    if not d.choices or not all(isinstance(c, _SCALARS) for c in d.choices):
      raise ConfigError(f"get_sweep(): sweep.choice{d.choices} needs one or more numbers, strings or booleans")
    return d
  if not (math.isfinite(d.low) and math.isfinite(d.high) and d.low <= d.high):
    raise ConfigError(f"get_sweep(): a range [{d.low}, {d.high}] needs finite low <= high")
  if d.log and d.low <= 0:
    raise ConfigError(f"get_sweep(): a log-scale range [{d.low}, {d.high}] needs low > 0")
  if d.step is not None and d.step <= 0:
    raise ConfigError(f"get_sweep(): step={d.step} must be positive")
  return d


# ------------------------------------------------------------------ a config file's sweep, checked


@dataclasses.dataclass
class Sweep:
  """A config file's get_sweep(), checked against its config."""

  objective: str
  direction: str  # maximize | minimize
  grid: list[dict] | None = None
  space: dict[str, Dist] | None = None
  trials: int | None = None
  pruner: str = "none"
  sampler: str = "tpe"
  seed: int | None = None

  in_order: bool = False  # a study made before grids were shuffled keeps its slots' points in the grid's order

  def point(self, slot: int) -> dict:
    """Trial slot's grid point.

    The slots take the grid in a shuffled order seeded by `seed` (0 if none), the same on every machine and rerun, so
    that a sweep capped by --max_trials runs points spread over the grid rather than its first ones (which vary the
    first axes least).
    """
    if self.in_order:
      return self.grid[slot]
    import numpy as np

    order = np.random.default_rng(0 if self.seed is None else self.seed).permutation(len(self.grid))
    return self.grid[int(order[slot])]

  @property
  def size(self) -> int:
    """How many trials the sweep has: the grid's points, or the search space's `trials`."""
    return len(self.grid) if self.grid is not None else self.trials

  @property
  def fields(self) -> list[str]:
    """The swept config fields (dotted paths): the grid's, in its first point's order, or the search space's."""
    return list(self.grid[0]) if self.grid is not None else list(self.space)

  def dims(self) -> dict[str, Dist]:
    """Each field's range: the search space's, or for a grid the values its axis takes (categorical)."""
    if self.space is not None:
      return dict(self.space)
    return {k: Dist("categorical", choices=tuple(_unique(p[k] for p in self.grid))) for k in self.fields}

  def describe(self) -> dict:
    """What the study records of the sweep (to recognise a changed get_sweep() on a rerun)."""
    if self.grid is not None:
      what = {"grid": self.grid, **({} if self.in_order else {"grid_order": f"shuffled, seed {self.seed or 0}"})}
    else:
      what = {"space": {k: d.describe() for k, d in self.space.items()}}
    return {**what, "objective": self.objective, "direction": self.direction}


def _unique(xs) -> list:
  out = []
  for x in xs:
    if not any(type(x) is type(y) and x == y for y in out):
      out.append(x)
  return out


def config_module(config_arg: str):
  """Imports the config file of a --config=PATH[:ARGS] value; returns (module, ARGS or None)."""
  path, _, args = config_arg.partition(":")
  spec = importlib.util.spec_from_file_location(f"vitjax_sweep_config_{abs(hash(path))}", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module, (args or None)


def load(config_arg: str, config) -> Sweep:
  """The checked Sweep of a --config=PATH[:ARGS] value; `config` is that file's config (with any overrides).

  Long: each check of a get_sweep() in the order its file is read, one line each.

  Raises ConfigError with one line naming the fix.
  """
  path = config_arg.partition(":")[0]
  module, args = config_module(config_arg)
  if not hasattr(module, "get_sweep"):
    raise ConfigError(f"{path} has no get_sweep(): add one beside get_config() (see `pydoc vitjax.sweep`)")
  try:
    raw = module.get_sweep(args) if args is not None else module.get_sweep()
  except ConfigError as e:
    raise ConfigError(f"{path}: {e}") from None
  except Exception as e:  # the config file's own error (a wrong argument count, a typo): one line
    raise ConfigError(f"{path}: get_sweep() raised {type(e).__name__}: {' '.join(str(e).split())}") from None
  if not isinstance(raw, dict):
    raise ConfigError(f"{path}: get_sweep() must return a dict (grid= or space=, objective=, direction=)")
  unknown = set(raw) - _KEYS
  if unknown:
    raise ConfigError(f"{path}: get_sweep() has unknown keys {sorted(unknown)}; the keys are {sorted(_KEYS)}")
  if ("grid" in raw) == ("space" in raw):
    raise ConfigError(f"{path}: get_sweep() needs exactly one of grid= (a list of points) and space= (a search space)")
  s = Sweep(
    objective=raw.get("objective"),
    direction=raw.get("direction"),
    pruner=raw.get("pruner", "none"),
    sampler=raw.get("sampler", "tpe"),
    seed=raw.get("seed"),
  )
  if s.seed is not None and (not isinstance(s.seed, int) or isinstance(s.seed, bool)):
    raise ConfigError(f"{path}: get_sweep() seed={s.seed!r}: give an integer (or leave it out)")
  if not isinstance(s.objective, str) or "/" not in s.objective or s.objective.startswith("train/"):
    raise ConfigError(
      f"{path}: get_sweep() objective={s.objective!r}: name an evaluator's metric, NAME/METRIC, e.g. 'eval/accuracy'"
    )
  if s.direction not in ("maximize", "minimize"):
    raise ConfigError(f"{path}: get_sweep() direction={s.direction!r}: use 'maximize' or 'minimize'")
  if s.pruner not in PRUNERS:
    raise ConfigError(f"{path}: get_sweep() pruner={s.pruner!r}: use one of {', '.join(PRUNERS)}")
  if s.sampler not in SAMPLERS:
    raise ConfigError(f"{path}: get_sweep() sampler={s.sampler!r}: use one of {', '.join(SAMPLERS)}")
  if "grid" in raw:
    grid = raw["grid"]
    if not isinstance(grid, list) or not grid or not all(isinstance(p, dict) and p for p in grid):
      raise ConfigError(f"{path}: get_sweep() grid= must be a non-empty list of points (sweep.product/zip/values)")
    if any(set(p) != set(grid[0]) for p in grid):
      raise ConfigError(f"{path}: get_sweep() every grid point must set the same fields (here {sorted(grid[0])})")
    if "trials" in raw:
      raise ConfigError(f"{path}: get_sweep() trials= is for a search space; a grid has one trial per point")
    for p in grid:
      for k, v in p.items():
        if not isinstance(v, _SCALARS):
          raise ConfigError(f"{path}: get_sweep() grid value {k}={v!r}: use numbers, strings or booleans")
    s.grid = grid
  else:
    space = raw["space"]
    if not isinstance(space, dict) or not space or not all(isinstance(d, Dist) for d in space.values()):
      raise ConfigError(
        f"{path}: get_sweep() space= must map fields to sweep.uniform/log_uniform/integer/choice ranges"
      )
    trials = raw.get("trials")
    if not isinstance(trials, int) or trials < 1:
      raise ConfigError(f"{path}: get_sweep() trials={trials!r}: a search space needs trials=N, N >= 1")
    sizes = [d.size() for d in space.values()]
    points = math.prod(sizes) if None not in sizes else None
    if points is not None and trials > points:  # the sampler would draw some points twice, and train them twice
      raise ConfigError(
        f"{path}: get_sweep() space= holds {points} points, fewer than trials={trials}: give trials={points} or "
        "fewer, or grid= (sweep.product) to run each point once"
      )
    s.space, s.trials = space, trials
  for point in s.grid or _corners(s.space):
    check_overrides(config, point, path)
  return s


def _corners(space: dict[str, Dist]) -> list[dict]:
  """Points that hold each dimension's every choice, or its low and high ends."""
  values = {
    k: list(d.choices) if d.kind == "categorical" else [type_of(d)(d.low), type_of(d)(d.high)] for k, d in space.items()
  }
  return [{k: v[min(i, len(v) - 1)] for k, v in values.items()} for i in range(max(map(len, values.values())))]


def type_of(d: Dist):
  """The Python type of a numeric dimension's values: int for an "int" dimension, float for the others."""
  return int if d.kind == "int" else float


def check_overrides(config, point: dict, path: str = "the config") -> None:
  """Each field exists in the config and takes the value's type (as --config.FIELD=VALUE would)."""
  for field, value in point.items():
    parent, _, name = field.rpartition(".")
    node = config
    for part in parent.split(".") if parent else []:
      node = node.get(part) if hasattr(node, "get") else None
    if node is None or not hasattr(node, "keys") or name not in node:
      raise ConfigError(
        f"{path}: get_sweep() field {field!r} is not in the config (fields are dotted paths such as optim.lr)"
      )
    kind = node.get_type(name) if hasattr(node, "get_type") else type(node[name])
    if kind is type(None):
      raise ConfigError(
        f"{path}: get_sweep() field {field!r} is None in get_config(); give it a value there so it can be swept"
      )
    if not _assignable(kind, value):
      raise ConfigError(
        f"{path}: get_sweep() {field}={value!r} is a {type(value).__name__}, the config's {field} a {kind.__name__}"
      )


def _assignable(kind: type, value) -> bool:
  if kind is bool or isinstance(value, bool):
    return kind is bool and isinstance(value, bool)
  if kind is float:
    return isinstance(value, int | float)
  return isinstance(value, kind)


def flag(field: str, value) -> str:
  """The --config.FIELD=VALUE argument that sets `value`."""
  text = repr(float(value)) if isinstance(value, float) else str(value)
  return f"--config.{field}={text}"


def trial_dir(sweep_dir: str, number: int) -> str:
  """The directory of trial slot `number`: SWEEP_DIR/trial_NNNN (four digits at least)."""
  return os.path.join(sweep_dir, f"trial_{number:04d}")
