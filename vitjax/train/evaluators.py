"""The evaluations a run makes while it trains, as a list the loop runs without knowing what each one is.

Every run has the primary evaluation, "eval": the task's own on config.data.eval_split every eval_every, which
checkpoints carry and `best` is chosen by; with config.ema_decay, "eval_ema" beside it (the moving average's).
config.evals adds more, each (name, split, kind, every) as big_vision's evaluators, e.g.

    --config.evals="(('test', 'test', 'task', '5 epochs'),)"

which evaluates the test split every 5 epochs (and at the end) and logs test/accuracy, test/loss, ... to
metrics.jsonl and TensorBoard. A kind is a function in KINDS: "task" (the task's evaluation of the parameters),
"ema" (of their moving average), "probe" (the frozen representation's linear probe, few-shot and k-NN accuracy,
vitjax.train.probing: ('probe', 'valid', 'probe', '1 epoch') logs probe/linear, probe/knn, probe/10shot, ...).
A new kind is one function, here or in its own module, entered in KINDS.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from vitjax.errors import ConfigError
from vitjax.tasks.base import ema_metric
from vitjax.train import durations, optim, probing
from vitjax.train import state as state_lib

PRIMARY = "eval"
PRIMARY_EMA = ema_metric(PRIMARY + "/").rstrip("/")  # "eval_ema"


def evaluate_params(task, exp, state, split, limit, stop, step) -> dict:
  """The task's evaluation of the parameters (and model state: BatchNorm statistics)."""
  return task.evaluate(exp.model, state_lib.variables(state), split, exp.batch_sharding, limit, stop=stop, step=step)


def evaluate_ema(task, exp, state, split, limit, stop, step) -> dict:
  """The task's evaluation of the parameters' moving average (config.ema_decay), without an example count."""
  del step
  variables = {"params": optim.ema_params(state.opt_state), **state.model_state}
  metrics = task.evaluate(exp.model, variables, split, exp.batch_sharding, limit, stop=stop)
  return {k: v for k, v in metrics.items() if k != "eval/examples"}


KINDS: dict[str, Callable[..., dict]] = {"task": evaluate_params, "ema": evaluate_ema, "probe": probing.evaluate_probe}


@dataclasses.dataclass(frozen=True)
class Eval:
  name: str  # the metrics' prefix: name/accuracy
  split: str
  kind: str
  every: int  # steps

  def due(self, step: int, total: int) -> bool:
    return step % self.every == 0 or step == total

  def run(self, task, exp, state, limit, stop, step) -> dict:
    metrics = KINDS[self.kind](task, exp, state, self.split, limit, stop, step)
    return {f"{self.name}/{k.split('/', 1)[1]}": v for k, v in metrics.items()}


CHECKS: dict[str, Callable[..., None]] = {"probe": probing.check}  # kind -> check(config, task, split)


def plan(
  config, eval_every: int, steps_per_epoch: int, examples_per_step: int | None = None, task=None
) -> tuple[Eval, ...]:
  """The run's evaluations: the primary one (and its EMA twin), then config.evals; ConfigError for a bad entry
  (with the task, also for an entry its kind cannot run on it), before anything is written."""
  split = config.data.eval_split
  evals = [Eval(PRIMARY, split, "task", eval_every)]
  if config.ema_decay:
    evals.append(Eval(PRIMARY_EMA, split, "ema", eval_every))
  for entry in config.evals:
    if not (isinstance(entry, list | tuple) and len(entry) == 4):
      raise ConfigError(
        f"config.evals: {entry!r} is not a (name, split, kind, every) entry, e.g. ('test', 'test', 'task', '5 epochs')"
      )
    name, split, kind, every = entry
    if kind not in KINDS:
      raise ConfigError(f"config.evals: {name!r} has kind {kind!r}; the kinds are {', '.join(KINDS)}")
    if kind == "ema" and not config.ema_decay:
      raise ConfigError(f"config.evals: {name!r} evaluates the EMA: set config.ema_decay (e.g. 0.9999)")
    if not isinstance(name, str) or not name.isidentifier() or name in {e.name for e in evals} | {"train"}:
      raise ConfigError(f"config.evals: the name {name!r} is taken or not a plain word; give each evaluation its own")
    if task is not None and kind in CHECKS:
      CHECKS[kind](config, task, split)
    steps = max(1, durations.steps(f"config.evals[{name}].every", every, steps_per_epoch, examples_per_step))
    evals.append(Eval(name, split, kind, steps))
  return tuple(evals)
