"""Evaluation of a checkpoint (--mode=eval): restore it, or take the initial weights, and run one evaluator on it."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os

import jax
from absl import logging

from vitjax import config as config_lib
from vitjax import evaluators, paths, pretrained, tasks
from vitjax.errors import ConfigError
from vitjax.models import checkpoints as ckpt_lib
from vitjax.train import workdir as workdir_lib


def evaluate(
  config,
  workdir: str,
  checkpoint: str = "best",
  split: str | None = None,
  weights: str | None = None,
  name: str | None = None,
) -> dict:
  """Runs evaluator `name` on a checkpoint; writes WORKDIR/NAME_SPLIT_STEP.json and a metrics.jsonl row.

  Long: the checks and the result row of --mode=eval in the order a checkpoint is evaluated.

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
  described = None if initial else config_lib.read_task(workdir)
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
  net = tasks.network(config, task)
  if initial:
    if ev.weights != "params":
      raise ConfigError("--weights=ema: initial weights have no moving average")
    step, which = 0, "imported" if imported else "init"
    _, variables = pretrained.load(config.init_from, net, fit=True)
    source = f"init_from={config.init_from}" if config.init_from else f"random init (seed {config.seed})"
    logging.info("evaluating the initial weights: %s", source)
  else:
    best = (config.best, evaluators.best_mode(config))
    step, variables = pretrained.load(workdir, net, checkpoint, ev.weights, best, config.keep_checkpoints)
    which = "averaged" if str(checkpoint) == ckpt_lib.AVERAGED else step
  with jax.set_mesh(net.mesh):
    metrics = ev.run(net, variables, step=which)  # (names the files a type writes)
  row = {"step": step, "checkpoint": "init" if initial else str(checkpoint), "evaluator": ev.name, "split": ev.split}
  options = json.loads(json.dumps(ev.options))  # (how it evaluated: a translation's decoding, a probe's shots, ...)
  row = {**row, "weights": ev.weights, **({"init_from": config.init_from} if imported else {}), "options": options}
  row = {**row, **metrics}
  other = f"_{ev.weights}" if ev.weights != configured else ""  # --weights= against the evaluator's own
  workdir_lib.write_json(workdir, result_file(workdir, f"{ev.name}_{ev.split}_{which}{other}", options), row)
  if jax.process_index() == 0:
    with paths.appending(os.path.join(workdir, "metrics.jsonl")) as f:
      f.write(json.dumps({**row, "source": "evaluate"}) + "\n")
  return row


def result_file(workdir: str, name: str, options: dict) -> str:
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


def best_result(config, ckpts, evals) -> dict:
  """The run's result: the best kept step and its evaluation, in evaluate()'s layout."""
  best = ckpts.best_step()
  metrics = (ckpts.metrics(best) if best is not None else None) or {}
  ev, _ = evaluators.best_of(config, evals)
  row = {"step": best, "checkpoint": "best", "evaluator": ev.name, "split": ev.split, "weights": ev.weights}
  return {**row, **metrics}
