"""Masked image modelling's reconstruction (vitjax.tasks.mae): its loss, and images drawn as PNG.

The loss of the dropped patches under fixed masks (each image's drawn from config.seed and its position in the
split: the same at every evaluation, for any batch size or number of devices), and the first `drawn` images of the
split drawn as PNG rows (original, what the encoder saw, the reconstruction with the visible patches pasted back)
into WORKDIR/reconstructions/step_N.png.

Options: drawn (8; 0 draws nothing).
"""

from __future__ import annotations

import functools
import os

import jax
import jax.numpy as jnp
import numpy as np

from vitjax import mesh as mesh_lib
from vitjax import paths
from vitjax.data import device_ops
from vitjax.errors import ConfigError
from vitjax.models.mae import patchify, unpatchify
from vitjax.tasks.base import check_stop
from vitjax.tasks.mae import patch_errors

OPTIONS = {"drawn": 8}


def metrics(options: dict) -> dict[str, str]:
  """The metrics this type reports and which way is better: loss (min) and examples."""
  del options
  return {"loss": "min", "examples": "max"}


def check(ev) -> None:
  """Checks the entry before anything is written: an MAE run, `drawn` an integer >= 0 and a split the task can read.

  Raises:
    ConfigError: naming config.evals.NAME and what is wrong.
  """
  if ev.config.task != "mae":
    raise ConfigError(
      f"config.evals.{ev.name}: type 'mae' evaluates a masked autoencoder, not a {ev.config.task!r} run"
    )
  if not isinstance(ev.options["drawn"], int) or ev.options["drawn"] < 0:
    raise ConfigError(f"config.evals.{ev.name}: drawn={ev.options['drawn']!r} must be an integer >= 0")
  ev.task.check_split(ev.split, f"evals.{ev.name}.split")


def run(ev, net, variables, stop=None, step=None) -> dict:
  """The reconstruction loss on the dropped patches of the split's images, under masks fixed by config.seed.

  With a `step` and a workdir, process 0 also draws the first `drawn` images into
  WORKDIR/reconstructions/step_STEP.png. Arguments as in classification.run.

  Returns:
    dict: {"loss": the mean over images of each image's mean patch error on its dropped patches, "examples": the
    images evaluated}.

  Raises:
    ConfigError: the split has no examples.
  """
  task = ev.task
  (gh, gw), patch, pre = task.grid, task.patch, task.preprocess()
  key = jax.random.key(ev.config.seed + 4)  # the same masks at every evaluation
  sums, drawn = None, None
  for batch in task.eval_batches(ev.split, ev.examples):
    check_stop(stop)
    batch = mesh_lib.to_global(batch, net.batch_sharding, ("image", "mask", "index"))
    out, pred = _step(net.model, variables, batch, key, patch, gh * gw, pre.mean, pre.std)
    sums = out if sums is None else jax.tree.map(jnp.add, sums, out)
    if drawn is None and ev.options["drawn"]:
      n = ev.options["drawn"]
      drawn = tuple(mesh_lib.gather(x)[:n] for x in (batch["image"], pred["pred"], pred["mask"]))
  if sums is None:
    raise ConfigError(f"config.evals.{ev.name}: split {ev.split!r} has no examples to evaluate")
  sums = jax.device_get(sums)
  if drawn is not None and step is not None and jax.process_index() == 0 and ev.workdir:
    _draw(*drawn, (gh, gw), patch, os.path.join(ev.workdir, "reconstructions", f"step_{step}.png"))
  return {"loss": float(sums["loss_sum"] / sums["count"]), "examples": float(sums["count"])}


def _draw(images, pred, mask, grid, patch, path: str) -> None:
  """Rows of (original, visible patches only, reconstruction with the visible patches pasted back)."""
  import PIL.Image  # pylint: disable=g-import-not-at-top

  channels = images.shape[-1]
  images = device_ops.to_float(jnp.asarray(images))  # drawn in [-1, 1] (the targets are per-patch normalised)
  target = patchify(images, patch)
  mean, std = target.mean(-1, keepdims=True), jnp.sqrt(target.var(-1, keepdims=True) + 1e-6)
  recon = jnp.asarray(pred) * std + mean  # back from the per-patch normalised pixels
  m = jnp.asarray(mask)[..., None]
  visible = unpatchify(target * (1 - m), grid, patch, channels)  # dropped patches mid-grey (0 in [-1, 1])
  pasted = unpatchify(target * (1 - m) + recon * m, grid, patch, channels)
  rows = [jnp.concatenate([a, b, c], axis=1) for a, b, c in zip(images, visible, pasted)]
  pixels = np.asarray(jnp.clip((jnp.concatenate(rows, axis=0) + 1) * 127.5, 0, 255)).astype(np.uint8)
  scale = max(1, 96 // images.shape[1])  # small images drawn larger
  pil = PIL.Image.fromarray(pixels[..., 0] if channels == 1 else pixels)
  pil = pil.resize((pil.width * scale, pil.height * scale), PIL.Image.NEAREST)
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with paths.replacing(path) as f:
    pil.save(f, format="PNG")


@functools.partial(jax.jit, static_argnums=(0, 4, 5, 6, 7))
def _step(model, variables, batch, key, patch, num_patches, mean=None, std=None):
  images = device_ops.to_float(batch["image"], mean, std)
  # each image's mask from its position in the split: the same whatever the batch size, devices or processes
  noise = jax.vmap(lambda i: jax.random.uniform(jax.random.fold_in(key, i), (num_patches,)))(batch["index"])
  output, _ = model.apply(variables, images, noise, train=False)
  per_patch = patch_errors(output["pred"], images, patch)
  valid = batch["mask"].astype(jnp.float32)
  # An image's loss is the mean over its dropped patches (every image drops as many): the training loss's form.
  per_image = jnp.sum(per_patch * output["mask"], -1) / jnp.maximum(jnp.sum(output["mask"], -1), 1.0)
  return {"loss_sum": jnp.sum(per_image * valid), "count": jnp.sum(valid)}, output
