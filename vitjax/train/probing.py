"""A frozen encoder judged as papers judge representations (vitjax.probe: linear probe, few-shot, k-NN), during
training (the evaluator kind 'probe') and on its own (`python -m vitjax.main --mode=probe`).

    python -m vitjax.main --mode=probe --workdir=W                      # W's best checkpoint
    python -m vitjax.main --mode=probe --workdir=W --checkpoint=latest --config.data.name=fashion_mnist
    python -m vitjax.main --mode=probe --workdir=NEW --config=C --config.init_from=hf:...   # imported weights
    python -m vitjax.main --mode=probe --workdir=NEW --config=C --checkpoint=init           # a random encoder

The features of the training split (the probes' fitting set: the examples training used, without the held-out
'valid'), of 'valid' (where the linear probe chooses its regulariser) and of the reported split are computed
once, under jit over the mesh; the probes run on the host (vitjax.probe).
"""

from __future__ import annotations

import os

import jax
from absl import logging

from vitjax import probe as probe_lib
from vitjax import tasks
from vitjax.errors import ConfigError
from vitjax.tasks.base import VALID
from vitjax.train import checkpoints as ckpt_lib
from vitjax.train import state as state_lib
from vitjax.train import workdir as workdir_lib
from vitjax.train.reporting import format_probe


def features(config, task, exp, variables, splits, limit=None, stop=None) -> dict:
  """{split: (features [N, D], labels [N])} for the training split (capped by config.probe.fit_examples) and each
  of `splits` (capped by `limit`). ConfigError for a task without image features (translation)."""
  fit = config.data.train_split
  caps = {fit: config.probe.fit_examples, **{s: limit for s in splits if s != fit}}
  with jax.set_mesh(exp.mesh):
    return {s: task.features(exp.model, variables, s, exp.batch_sharding, cap, stop) for s, cap in caps.items()}


def check(config, task, split: str, what: str = "probe") -> None:
  """ConfigError, before anything is computed or written, when the probes cannot run on `split`: a task without
  image features, the training split itself (the probes' fitting set), or a split ('valid', where the linear probe
  chooses its regulariser, included) the data does not have; and bad config.probe options."""
  if not hasattr(task, "features"):
    raise ConfigError(f"the {config.task} task has no image features to probe")
  if split == config.data.train_split:
    raise ConfigError(f"{what}: {split!r} is the split the probes are fitted on; report on '{VALID}' or 'test'")
  for s in dict.fromkeys((VALID, split)):
    task.check_split(s, f"{what} split")
  probe_lib.Options.of(config)


def run(config, task, feats: dict) -> dict:
  """vitjax.probe.evaluate of computed features: {split: {"linear", "knn", "{N}shot", "{N}shot_std"}, "linear_l2"}."""
  num_classes = task.describe()["num_classes"]
  return probe_lib.evaluate(feats, num_classes, probe_lib.Options.of(config), config.data.train_split, VALID)


def evaluate_probe(task, exp, state, split, limit, stop, step) -> dict:
  """The evaluator kind 'probe' (vitjax.train.evaluators): {"probe/linear", "probe/knn", "probe/10shot", ...}
  of the parameters' representation on `split`."""
  del step
  config = exp.config
  feats = features(config, task, exp, state_lib.variables(state), dict.fromkeys((VALID, split)), limit, stop)
  return {f"probe/{k}": v for k, v in run(config, task, feats)[split].items()}


def probe(config, workdir: str, checkpoint: str = "best", split: str | None = None, weights: str = "params") -> dict:
  """--mode=probe: the three evaluations of a checkpoint's (or, with checkpoint='init' or imported weights and no
  checkpoints, the initial) encoder on 'valid' and `split` (default 'test', or 'valid' alone for a dataset without
  one). Writes WORKDIR/probe_SPLIT_STEP.json (probe_SPLIT_init.json, probe_SPLIT_averaged.json) for each and logs
  one line each; returns {"step", "checkpoint", "weights", "probe": {split: row}}."""
  workdir = os.path.abspath(workdir)
  task = tasks.get(config, workdir)  # the config's data: the workdir's own, or another dataset
  if split is None:  # 'test' where the dataset has one; a folder of your own may have train (and valid) only
    split = "test"
    try:
      task.check_split(split, "--split")
    except ConfigError:
      split = VALID
      logging.info(
        "%s has no 'test' split: the probes report on '%s' (--split= names another)", config.data.name, VALID
      )
  check(config, task, split, "--split")
  net = state_lib.network(config, task)
  if checkpoint == "init" or (not ckpt_lib.has_checkpoints(workdir) and config.init_from):
    if weights != "params":
      raise ConfigError("--weights=ema: initial weights have no moving average")
    workdir_lib.check_path(workdir)
    step, checkpoint = 0, "init"
    params, model_state = state_lib.initial_variables(net)
    variables = {"params": params, **model_state}
    source = f"init_from={config.init_from}" if config.init_from else f"random init (seed {config.seed})"
    logging.info("probing the initial weights: %s", source)
  else:
    if not ckpt_lib.has_checkpoints(workdir):
      raise ConfigError(
        f"{workdir} has no checkpoints: train first, give --config.init_from, or probe the initial (random) "
        "weights with --checkpoint=init"
      )
    step, params, model_state = ckpt_lib.read_variables(workdir, config, checkpoint, net.abstract, weights)
    variables = {"params": params, **model_state}
  result = run(config, task, features(config, task, net, variables, (VALID, split)))
  rows = {}
  for s in dict.fromkeys((VALID, split)):
    rows[s] = result[s]
    row = {"step": step, "checkpoint": str(checkpoint), "weights": weights, "split": s, "dataset": config.data.name}
    row = {**row, **result[s], "linear_l2": result["linear_l2"]}
    which = checkpoint if checkpoint in ("init", ckpt_lib.AVERAGED) else step
    workdir_lib.write_json(workdir, f"probe_{s}_{which}.json", row)
    logging.info("%s", format_probe(s, result[s]))
  return {"step": step, "checkpoint": str(checkpoint), "weights": weights, "probe": rows}
