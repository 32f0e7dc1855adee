"""Masked image modelling (MAE, He et al. 2021): pre-training on images without their labels.

The data are those of image classification (the same config.data, splits and augmentations; the labels are
read but unused). The model is vitjax.models.MAE (config.model.name = "mae"). Each step draws the masking noise
on the devices from the step's key, so the mask of an image depends on the seed and the step only. The loss is
the mean squared error of the dropped patches only, against each patch's pixels normalised by its own mean and
variance (MAE's norm_pix_loss). Evaluation uses fixed noise (the same masks at every evaluation), reports
eval/loss, and draws the first 8 images of the split as PNG rows (original, what the encoder saw, the
reconstruction with the visible patches pasted back) into WORKDIR/reconstructions/step_N.png (the trained
weights' evaluations, and --mode=eval's).

A classification run fine-tunes the encoder with config.init_from=THIS_WORKDIR (the decoder is dropped, the head
is new): configs/mae_fashion_mnist.py and configs/vit_fashion_mnist_from_mae.py.
"""

from __future__ import annotations

import functools
import os

import jax
import jax.numpy as jnp
import numpy as np

from vitjax import mesh as mesh_lib
from vitjax import models
from vitjax.data import device_ops
from vitjax.errors import ConfigError
from vitjax.logs import Progress
from vitjax.models.mae import patchify, random_mask, unpatchify
from vitjax.tasks.base import check_batch, check_best_metric, check_stop
from vitjax.tasks.classification import ImageClassification

SHOWN = 8  # images drawn per evaluation


class MaskedImageModeling(ImageClassification):
  """See the module docstring; the interface is vitjax.tasks.base.Task."""

  batch_keys = ("image",)

  @functools.cached_property
  def _patch(self) -> tuple[int, int]:
    """The patch size (height, width) of the configured MAE's encoder, built once, without parameters."""
    kw = {k: v for k, v in self.config.model.to_dict().items() if k != "name" and v is not None}
    options = dict(models.create(self.config.model.name, **{**kw, **self.model_overrides()}).encoder)
    return models.create(options.pop("name"), **options).patch_hw

  @property
  def _grid(self) -> tuple[int, int]:
    """The patch grid (rows, columns) at the data's image size."""
    (h, w), (ph, pw) = self.describe()["image_size"], self._patch
    return h // ph, w // pw

  # -- interface
  def check(self):
    c = self.config
    if c.model.get("name") != "mae":
      raise ConfigError(f"task 'mae' trains model 'mae' (a masked autoencoder), not {c.model.get('name')!r}")
    check_batch(c.batch_size, "batch_size", self.layout, c.optim.accum_steps)
    check_batch(c.data.eval_batch_size, "data.eval_batch_size", self.layout)
    if not 0 <= c.data.valid_fraction < 1:
      raise ConfigError(f"data.valid_fraction={c.data.valid_fraction} must be in [0, 1)")
    check_best_metric(c, ("eval/loss",))
    if c.best_mode != "min":
      raise ConfigError("best_metric eval/loss is a loss: set --config.best_mode=min")
    self.check_split(c.data.eval_split, "data.eval_split")
    for name, split, *_ in (e for e in c.get("evals") or () if isinstance(e, list | tuple) and len(e) == 4):
      self.check_split(split, f"evals[{name}] split")
    try:
      self._grid  # noqa: B018 (builds the model: a bad config.model raises here)
    except ValueError as e:
      raise ConfigError(f"config.model: {e}") from None

  def describe(self) -> dict:
    return {**super().describe(), "task": "mae"}

  @staticmethod
  def representation(model, images):
    """The encoder's pooled features [B, D] of all the patches (no masking): what a probe or fine-tuning sees."""
    return model.vit(images, train=False)[1]["pre_logits"]

  def model_overrides(self) -> dict:
    return {"channels": self.describe()["channels"]}

  def example_inputs(self):
    (images,) = super().example_inputs()
    gh, gw = self._grid
    return images, jnp.zeros((1, gh * gw), jnp.float32)

  def device_batch(self, batch, key):
    """Normalises the images and draws the masking noise [B, N] from the step's key."""
    pre = self.preprocess()
    images = device_ops.to_float(batch["image"], pre.mean, pre.std)
    gh, gw = self._grid
    return {"image": images, "noise": jax.random.uniform(key, (images.shape[0], gh * gw))}

  def model_inputs(self, batch):
    return batch["image"], batch["noise"]

  def loss(self, output, batch):
    per_patch = _patch_errors(output["pred"], batch["image"], self._patch)
    mask = output["mask"]
    loss = jnp.sum(per_patch * mask) / jnp.maximum(jnp.sum(mask), 1.0)
    return loss, {"visible_mse": jnp.sum(per_patch * (1 - mask)) / jnp.maximum(jnp.sum(1 - mask), 1.0)}

  def evaluate(self, model, variables, split, sharding, limit=None, stop=None, step=None) -> dict:
    it, info = self._input(split, False)
    progress = Progress(f"eval {split}", info.steps_per_epoch, unit="images")
    gh, gw = self._grid
    key = jax.random.key(self.config.seed + 4)  # the same masks at every evaluation
    sums, drawn = None, None
    for i, batch in enumerate(it):
      check_stop(stop)
      batch = mesh_lib.to_global(batch, sharding, ("image", "mask"))
      pre = self.preprocess()
      step_key = jax.random.fold_in(key, i)
      out, pred = _eval_step(model, variables, batch, step_key, self._patch, gh * gw, pre.mean, pre.std)
      sums = out if sums is None else jax.tree.map(jnp.add, sums, out)
      if drawn is None:
        drawn = (mesh_lib.gather(batch["image"])[:SHOWN], mesh_lib.gather(pred["pred"])[:SHOWN])
        drawn += (mesh_lib.gather(pred["mask"])[:SHOWN],)
      progress.update(info.local_batch_size * jax.process_count())
      if limit is not None and (i + 1) * info.local_batch_size * jax.process_count() >= limit:
        break
    sums = jax.device_get(sums)
    if drawn is not None and step is not None and jax.process_index() == 0 and self.workdir:
      self._draw(*drawn, (gh, gw), step)
    return {"eval/loss": float(sums["loss_sum"] / sums["count"]), "eval/examples": float(sums["count"])}

  def _draw(self, images, pred, mask, grid, step) -> None:
    """Rows of (original, visible patches only, reconstruction with the visible patches pasted back)."""
    import PIL.Image  # pylint: disable=g-import-not-at-top

    patch = self._patch
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
    directory = os.path.join(self.workdir, "reconstructions")
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, f"step_{step}.png")
    pil.save(path + ".tmp.png")
    os.replace(path + ".tmp.png", path)

  def predict(self, *args, **kwargs):
    raise TypeError("an MAE run predicts pixels, not classes: fine-tune it (config.init_from) to classify")


def _patch_errors(pred, images, patch):
  """Mean squared error per patch [B, N] against the patch's pixels normalised by its own mean and variance."""
  target = patchify(images.astype(jnp.float32), patch)
  mean, var = target.mean(-1, keepdims=True), target.var(-1, keepdims=True)
  target = (target - mean) / jnp.sqrt(var + 1e-6)
  return jnp.mean((pred - target) ** 2, axis=-1)


@functools.partial(jax.jit, static_argnums=(0, 4, 5, 6, 7))
def _eval_step(model, variables, batch, key, patch, num_patches, mean=None, std=None):
  images = device_ops.to_float(batch["image"], mean, std)
  noise = jax.random.uniform(key, (images.shape[0], num_patches))
  output, _ = model.apply(variables, images, noise, train=False)
  per_patch = _patch_errors(output["pred"], images, patch)
  valid = batch["mask"].astype(jnp.float32)
  # An image's loss is the mean over its dropped patches (every image drops as many): the training loss's form.
  per_image = jnp.sum(per_patch * output["mask"], -1) / jnp.maximum(jnp.sum(output["mask"], -1), 1.0)
  return {"loss_sum": jnp.sum(per_image * valid), "count": jnp.sum(valid)}, output


__all__ = ["MaskedImageModeling", "random_mask"]
