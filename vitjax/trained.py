"""One call to load a trained model: `vitjax.load(workdir, checkpoint="best")`.

    import vitjax
    trained = vitjax.load("workdirs/vit_digits")        # "best", "latest" or a step number
    probs = trained.predict(images_uint8)                # classification: [N, H, W, C] uint8 -> [N, classes]
    trained = vitjax.load("workdirs/bible_en_es")
    trained.translate(["In the beginning God created the heaven and the earth."])
    trained = vitjax.load("hf:google/vit-base-patch16-224")   # a Hugging Face hub repository (timm's or
    trained.predict(images_uint8), trained.class_names        # transformers' ViT / Swin), as it was pretrained

It works from any current directory, with a relative or absolute workdir, and without the dataset: the workdir
holds all that prediction needs (config.json, task.json, tokenizer.model, checkpoints/). Only parameters and
model state are read, not the optimizer's, and they are verified against their checksums: a corrupt "best" or
"latest" falls back to the next intact step, with a warning.

A hub repository ('hf:ORG/NAME[@REVISION]', vitjax.hub) loads the same way, through huggingface_hub's cache: its
config gives the model, the input size, the preprocessing (mean, std, crop, interpolation) and the class names,
as a workdir's config.json and task.json do; `step` is 0 and `workdir` the spec.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
from typing import Any

import flax.linen as nn
import jax
import ml_collections as mlc
import numpy as np
from absl import logging
from jax.sharding import Mesh, NamedSharding

from vitjax import config as config_lib
from vitjax import convert, decode, evaluators, pretrained, tasks
from vitjax.tasks.classification import hub_classifier


@dataclasses.dataclass
class Trained:
  """A trained model: the module, its variables and config, with predict, classify or translate.

  `.model` (a Flax module), `.variables` (`{"params": ..., "batch_stats": ...}`), `.config`, `.step`; `.predict(images)`
  (probabilities), `.classify(images)` (class names) and `.features(images)` (pooled and patch features) for image
  classification, `.translate(lines)` for translation.

  `model.apply(trained.variables, inputs, train=False)` returns `(output, intermediates)` like every vitjax model (an
  MAE also takes the masking noise [B, patches]: `model.apply(variables, images, noise)`).
  """

  model: nn.Module
  variables: dict
  config: mlc.ConfigDict
  step: int
  workdir: str
  mesh: Mesh
  sharding: NamedSharding
  task: Any

  def __repr__(self) -> str:  # (the dataclass's printed every weight: 110k characters in a notebook)
    count = sum(x.size for x in jax.tree.leaves(self.variables.get("params", {})))
    return (
      f"Trained({type(self.model).__name__}, {self.config.get('task')}, step {self.step}, {count:,} parameters, "
      f"workdir={self.workdir!r})"
    )

  @property
  def batch_sharding(self) -> NamedSharding:  # (what evaluators take: a Trained serves as their network)
    """The batches' sharding (`sharding`), under the name evaluators take from a network."""
    return self.sharding

  @property
  def class_names(self) -> list[str] | None:
    """The classes' names by index (a classification run's dataset's, a hub model's config's), None if unknown."""
    describe = getattr(self.task, "describe", None)
    return describe().get("class_names") if describe else None

  def predict(self, images, batch_size: int = 256):
    """uint8 images [N, H, W, C] as the dataset stores them -> class probabilities, numpy float32 [N, classes].

    They are resized and normalised as in evaluation.
    """
    if not hasattr(self.task, "predict"):
      raise TypeError(f"{self.workdir} is a {self.config.task} run: use .translate(lines)")
    _check_batch_size(batch_size)
    with jax.set_mesh(self.mesh):
      return self.task.predict(self.model, self.variables, images, self.sharding, batch_size)

  def features(self, images, batch_size: int = 256) -> dict:
    """uint8 images [N, H, W, C] -> {"pooled": [N, D], "patches": [N, h, w, D]}, numpy float32.

    pooled: what the head takes (the class token; for DINOv2's classifier the class token and the patches' mean);
    patches: the encoded patch tokens on their grid (DINOv2's x_norm_patchtokens). Preprocessed as predict.
    """
    if not hasattr(self.task, "embed"):
      raise TypeError(f"{self.workdir} is a {self.config.task} run: features are an image classifier's")
    _check_batch_size(batch_size)
    with jax.set_mesh(self.mesh):
      return self.task.embed(self.model, self.variables, images, self.sharding, batch_size)

  def classify(self, images, batch_size: int = 256) -> list[str]:
    """uint8 images [N, H, W, C] -> the most probable class of each, by name.

    Its index as text where the classes have no names.
    """
    top = self.predict(images, batch_size).argmax(-1)
    names = self.class_names
    return [names[i] if names else str(i) for i in top]

  def translate(self, lines, batch_size: int = 32, **decode_args) -> list[str]:
    """Source sentences -> translations (one per line, in order; an empty line gives an empty line).

    decode_args override the run's decoding (its best evaluator's: vitjax.decode.configured):
    method ("beam", "greedy", "sample"), beam_size, alpha, temperature, top_k, extra_len.
    """
    if not hasattr(self.task, "translate"):
      use = "its .model and .variables (it reconstructs pixels)" if self.config.task == "mae" else ".predict(images)"
      raise TypeError(f"{self.workdir} is a {self.config.task} run: use {use}")
    if isinstance(lines, str):  # a str is a sequence too: of characters, each translated on its own
      raise TypeError("translate takes a list of sentences, not one str: translate([line])")
    lines = list(lines)
    bad = next((i for i, line in enumerate(lines) if not isinstance(line, str)), None)
    if bad is not None:
      raise TypeError(f"translate takes sentences (str); line {bad} is {type(lines[bad]).__name__}")
    unknown = sorted(set(decode_args) - set(decode.DECODING))
    if unknown:
      near = difflib.get_close_matches(unknown[0], list(decode.DECODING), 1)
      hint = f"; did you mean {near[0]!r}?" if near else ""
      raise TypeError(f"translate has no option {unknown[0]!r}{hint} (the options: {', '.join(decode.DECODING)})")
    _check_batch_size(batch_size)
    with jax.set_mesh(self.mesh):
      return self.task.translate(self.model, self.variables, lines, self.sharding, batch_size, **decode_args)


def _check_batch_size(batch_size) -> None:
  if not isinstance(batch_size, int | np.integer) or isinstance(batch_size, bool) or batch_size < 1:
    raise ValueError(f"batch_size={batch_size!r} must be a whole number, at least 1")


def load(workdir: str, checkpoint: str | int = "best", weights: str = "params") -> Trained:
  """The model of a vitjax workdir at a checkpoint, or of a Hugging Face hub repository.

  The checkpoint: "best" (the best evaluated kept step), "latest" or a step; weights: "params" (the trained parameters)
  or "ema" (their moving average, for runs with config.ema_decay). workdir may also be a Hugging Face hub repository,
  'hf:ORG/NAME[@REVISION]' (load_hub).

  Raises vitjax.errors.ConfigError (with what to do) when the workdir or checkpoint is not there.
  """
  if str(workdir).startswith("hf:"):
    return load_hub(str(workdir), checkpoint, weights)

  workdir = os.path.abspath(os.path.expanduser(workdir))
  config = config_lib.read_config(workdir)
  task = tasks.get(config, workdir, described=config_lib.read_task(workdir))
  net = tasks.network(config, task)
  best = (config.best, evaluators.best_mode(config))
  step, variables = pretrained.load(workdir, net, checkpoint, weights, best, config.keep_checkpoints)
  return Trained(net.model, variables, config, step, workdir, net.mesh, net.batch_sharding, task)


def load_hub(spec: str, checkpoint: str | int = "best", weights: str = "params") -> Trained:
  """The pretrained classifier of a Hugging Face hub repository, 'hf:ORG/NAME[@REVISION]', as a Trained.

  In timm's layout, or transformers' ViT and Swin (vitjax.convert.from_hub). Its config and the task.json-like
  description are built from the repository's config (architecture, input size, mean, std, crop, interpolation, class
  names), so predict() preprocesses as the model was trained and needs no dataset.

  ConfigError (one line) for a repository that cannot be read (not cached while HF_HUB_OFFLINE is set, another
  kind of model), and for checkpoint or weights other than the defaults: a repository has one set of weights (pin
  one with @REVISION).
  """
  pretrained.check_one_set(spec, checkpoint, weights)
  config, described, module, variables = hub_classifier(spec)
  if not described["num_classes"]:
    logging.warning(
      "%s has no classifier head: predict() gives a softmax over its pooled features; model.apply(variables, x) "
      "returns the features themselves",
      spec,
    )
  task = tasks.get(config, spec, described=described)
  net = tasks.network(config, task)
  if convert.model_config(net.model) != config.model.to_dict():  # the config must rebuild the converted module
    raise RuntimeError(f"{spec}: config.model {config.model.to_dict()} builds {net.model}, not {module}")
  variables = pretrained.place(net, pretrained.at_input_size(net, variables["params"], spec), spec)  # (read once)
  return Trained(net.model, variables, config, 0, spec, net.mesh, net.batch_sharding, task)
