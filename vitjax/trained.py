"""One call to load a trained model: `vitjax.load(workdir, checkpoint="best")`.

    import vitjax
    trained = vitjax.load("workdirs/vit_digits")        # "best", "latest" or a step number
    probs = trained.predict(images_uint8)                # classification: [N, H, W, C] uint8 -> [N, classes]
    trained = vitjax.load("workdirs/bible_en_es")
    trained.translate(["In the beginning God created the heaven and the earth."])

It works from any current directory, with a relative or absolute workdir, and without the dataset: the workdir
holds all that prediction needs (config.json, task.json, tokenizer.model, checkpoints/). Only parameters and
model state are read, not the optimizer's, and they are verified against their checksums: a corrupt "best" or
"latest" falls back to the next intact step, with a warning.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import flax.linen as nn
import jax
import ml_collections as mlc
from jax.sharding import Mesh, NamedSharding


@dataclasses.dataclass
class Trained:
  """A trained model: `.model` (a Flax module), `.variables` (`{"params": ..., "batch_stats": ...}`), `.config`,
  `.step`; `.predict(images)` for image classification, `.translate(lines)` for translation.

  `model.apply(trained.variables, inputs, train=False)` returns `(output, intermediates)` like every vitjax model.
  """

  model: nn.Module
  variables: dict
  config: mlc.ConfigDict
  step: int
  workdir: str
  mesh: Mesh
  sharding: NamedSharding
  task: Any

  def predict(self, images, batch_size: int = 256):
    """uint8 images [N, H, W, C] as the dataset stores them -> class probabilities, numpy float32 [N, classes].
    They are resized and normalised as in evaluation."""
    if not hasattr(self.task, "predict"):
      raise TypeError(f"{self.workdir} is a {self.config.get('task')} run: use .translate(lines)")
    with jax.set_mesh(self.mesh):
      return self.task.predict(self.model, self.variables, images, self.sharding, batch_size)

  def translate(self, lines, batch_size: int = 32, **decode_args) -> list[str]:
    """Source sentences -> translations (one per line, in order; an empty line gives an empty line).
    decode_args override the config's decoding: method ("beam", "greedy", "sample"), beam_size, alpha,
    temperature, top_k."""
    if not hasattr(self.task, "translate"):
      raise TypeError(f"{self.workdir} is a {self.config.get('task')} run: use .predict(images)")
    with jax.set_mesh(self.mesh):
      return self.task.translate(self.model, self.variables, list(lines), self.sharding, batch_size, **decode_args)


def load(workdir: str, checkpoint: str | int = "best", weights: str = "params") -> Trained:
  """The model of a vitjax workdir at a checkpoint: "best" (the best evaluated kept step), "latest" or a step;
  weights: "params" (the trained parameters) or "ema" (their moving average, for runs with config.ema_decay).

  Raises vitjax.errors.ConfigError (with what to do) when the workdir or checkpoint is not there.
  """
  from vitjax import tasks
  from vitjax.train import checkpoints as ckpt_lib
  from vitjax.train import state as state_lib
  from vitjax.train import workdir as workdir_lib

  workdir = os.path.abspath(os.path.expanduser(workdir))
  config = workdir_lib.read_config(workdir)
  task = tasks.get(config, workdir, described=workdir_lib.read_json(workdir, "task.json"))
  exp = state_lib.setup(config, task)
  with ckpt_lib.Checkpoints(workdir, config.best_metric, config.best_mode, read_only=True) as ckpts:
    step, params, model_state = ckpts.restore_variables(str(checkpoint), exp.abstract_state, weights)
  variables = {"params": params, **model_state}
  return Trained(exp.model, variables, config, step, workdir, exp.mesh, exp.batch_sharding, task)
