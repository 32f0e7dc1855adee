"""A network's variables from a workdir's checkpoint, a weights file or a Hugging Face hub repository.

    net = vitjax.models.network.network(config, overrides, inputs, mesh)
    step, variables = load("workdirs/vit_digits", net, "best", best=("accuracy", "max"))   # a checkpoint, as saved
    _, variables = load("hf:google/vit-base-patch16-224", net, fit=True)   # config.init_from: fitted to the model

The one way in for weights: vitjax.load (a workdir; a hub repository's weights go through `place`), evaluation
(--mode=eval, --checkpoint=init), init_from and vitjax.export all come here. Without `fit` the weights must have the
network's own shapes (another config's checkpoint is a ConfigError); with it they are fitted to the network's
initialisation (vitjax.models.adapt: a new head, other positions). Sources: a vitjax workdir, 'timm:NAME:FILE',
'npz:[VARIANT:]FILE', 'hf:ORG/NAME[@REVISION]' (vitjax.convert); with `fit`, also none ("": the seed's).
"""

from __future__ import annotations

import jax
import numpy as np
from absl import logging

from vitjax import convert
from vitjax.errors import ConfigError
from vitjax.mesh import path_name
from vitjax.models import checkpoints
from vitjax.models.adapt import adapt_params
from vitjax.models.network import Network


def load(
  source: str,
  net: Network,
  checkpoint: str | int = "best",
  weights: str = "params",
  best: tuple[str, str] = ("", "max"),
  keep: int = 5,
  fit: bool = False,
) -> tuple[int, dict]:
  """(step, variables `{"params": ..., **model_state}`) of `source` for `net`, laid out on its mesh.

  A workdir: its checkpoint ("best", "latest", a step, "averaged"; corrupt ones fall back to the next intact step)
  and weights ("params" or "ema"), ranked by best = (config.best, 'max' or 'min'); keep: config.keep_checkpoints.
  A weights file or hub repository: its converted parameters, step 0. ConfigError where they do not fit `net`.
  fit: config.init_from's way, step 0: the seed's initialisation with `source`'s weights fitted to it (see _fitted).
  """
  if fit:
    return 0, _fitted(net, source)
  if not convert.WeightSource.parse(source).imported:
    metric, mode = best
    step, params, model_state = checkpoints.read_variables(
      source, checkpoint, net.abstract, weights, metric, mode, keep
    )
    return step, {"params": params, **model_state}
  check_one_set(source, checkpoint, weights)
  return 0, place(net, convert.load_params(source), source)


def check_one_set(source: str, checkpoint, weights: str) -> None:
  """ConfigError unless checkpoint and weights are the defaults: imported weights have no steps or moving average."""
  if str(checkpoint) not in ("best", "latest") or weights != "params":
    raise ConfigError(
      f"{source}: imported weights are one set, and a hub repository has one set of weights (checkpoint="
      f"{checkpoint!r}, weights={weights!r} asked for); pin a hub repository's version with hf:ORG/NAME@REVISION"
    )


def place(net: Network, params, source: str) -> dict:
  """{"params": params} on `net`'s shardings; ConfigError naming the first array whose shape differs from net's."""
  want = {path_name(p): tuple(a.shape) for p, a in jax.tree_util.tree_leaves_with_path(net.abstract["params"])}
  got = {path_name(p): tuple(np.shape(a)) for p, a in jax.tree_util.tree_leaves_with_path(params)}
  differ = [f"{k}: {got.get(k)} there, {v} in the model" for k, v in want.items() if got.get(k) != v]
  differ += [f"{k}: not in the model" for k in got if k not in want]
  if differ:
    raise ConfigError(
      f"{source}: its weights do not fit the model ({'; '.join(differ[:3])}{' ...' if len(differ) > 3 else ''}); "
      "start from them with config.init_from, which fits them to the model"
    )
  return {"params": jax.device_put(params, net.sharding["params"])}


def _fitted(net: Network, source: str | None) -> dict:
  """The variables at initialisation on the mesh: net.config.seed's, then `source`'s weights fitted to them.

  source (config.init_from): a workdir (its latest intact checkpoint, any shapes) or a weights file or hub repository.
  Other shapes are adapted (vitjax.models.adapt, each change logged); BatchNorm statistics carry over where they fit.
  """
  params, model_state = jax.jit(net.init, out_shardings=(net.sharding["params"], net.sharding["model_state"]))()
  if not source:
    return {"params": params, **model_state}
  if convert.WeightSource.parse(source).imported:
    loaded, loaded_ms = convert.load_params(source), {}
  else:
    loaded, loaded_ms = checkpoints.load_params(source)
  adapted, changes = adapt_params(loaded, jax.device_get(params), net.model)
  for line in changes:
    logging.info("init_from: %s", line)
  params = jax.device_put(adapted, net.sharding["params"])
  if loaded_ms and jax.tree.map(np.shape, loaded_ms) == jax.tree.map(np.shape, jax.device_get(model_state)):
    model_state = jax.device_put(loaded_ms, net.sharding["model_state"])
    logging.info("init_from: BatchNorm statistics carried over")
  logging.info("initialised parameters from %s", source)
  return {"params": params, **model_state}


def at_input_size(net: Network, params, spec: str):
  """The hub's parameters for `net`, at net's input size.

  That may be another than the weights' (DINOv2: 518 px weights, 224 px crops): the position table is resampled once,
  as transformers and timm resample it at run time (vitjax.models.adapt).
  """
  if jax.tree.map(np.shape, params) == jax.tree.map(lambda a: a.shape, net.abstract["params"]):
    return params
  zeros = jax.tree.map(lambda a: np.zeros(a.shape, a.dtype), net.abstract["params"])
  params, changes = adapt_params(jax.device_get(params), zeros, net.model)
  for line in changes:
    logging.info("%s: %s", spec, line)
  return params
