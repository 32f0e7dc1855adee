"""Masked image modelling (MAE, He et al. 2021): pre-training on images without their labels.

The data are those of image classification (the same config.data, splits and augmentations; the labels are
read but unused). The model is vitjax.models.MAE (config.model.name = "mae"). Each step draws the masking noise
on the devices from the step's key, so the mask of an image depends on the seed and the step only. The loss is
the mean squared error of the dropped patches only, against each patch's pixels normalised by its own mean and
variance (MAE's norm_pix_loss). Its evaluator is the type 'mae'
(vitjax.evaluators.mae: the loss under fixed masks, and reconstructions drawn as PNGs).

A classification run fine-tunes the encoder with config.init_from=THIS_WORKDIR (the decoder is dropped, the head
is new): configs/mae_fashion_mnist.py and configs/vit_fashion_mnist_from_mae.py.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from vitjax import models
from vitjax.data import device_ops
from vitjax.errors import ConfigError
from vitjax.models.mae import patchify, random_mask
from vitjax.tasks.base import check_batch
from vitjax.tasks.classification import ImageClassification


class MaskedImageModeling(ImageClassification):
  """See the module docstring; the interface is vitjax.tasks.base.Task."""

  batch_keys = ("image",)

  @functools.cached_property
  def patch(self) -> tuple[int, int]:
    """The patch size (height, width) of the configured MAE's encoder, built once, without parameters."""
    kw = {k: v for k, v in self.config.model.to_dict().items() if k != "name" and v is not None}
    options = dict(models.create(self.config.model.name, **{**kw, **self.model_overrides()}).encoder)
    return models.create(options.pop("name"), **options).patch_hw

  @property
  def grid(self) -> tuple[int, int]:
    """The patch grid (rows, columns) at the data's image size."""
    (h, w), (ph, pw) = self.describe()["image_size"], self.patch
    return h // ph, w // pw

  # -- interface
  def check(self):
    """Validates the config before anything is written.

    Checks model "mae", batch sizes that split over the layout, data.valid_fraction in [0, 1), data.labelled, and a
    model that builds.

    Raises:
      ConfigError: naming the setting and what is wrong.
    """
    c = self.config
    if c.model.get("name") != "mae":
      raise ConfigError(f"task 'mae' trains model 'mae' (a masked autoencoder), not {c.model.get('name')!r}")
    check_batch(c.batch_size, "batch_size", self.layout, c.optim.accum_steps)
    check_batch(c.data.eval_batch_size, "data.eval_batch_size", self.layout)
    if not 0 <= c.data.valid_fraction < 1:
      raise ConfigError(f"data.valid_fraction={c.data.valid_fraction} must be in [0, 1)")
    aug = c.data.get("augment") or {}
    unused = [f"{k}={v}" for k, v in (("label_smoothing", c.get("label_smoothing") or 0),
              ("data.augment.mixup_alpha", aug.get("mixup_alpha") or 0),
              ("data.augment.cutmix_alpha", aug.get("cutmix_alpha") or 0)) if v]  # fmt: skip
    if unused:  # a reconstruction loss has no labels to smooth or mix
      raise ConfigError(
        f"config.{unused[0]} does nothing in an MAE run (it reconstructs pixels, no labels): set it to 0"
      )
    self.training_positions()  # data.labelled: a bad amount, or too few examples of a class
    try:
      self.grid  # noqa: B018 (builds the model: a bad config.model raises here)
    except ValueError as e:
      raise ConfigError(f"config.model: {e}") from None

  def describe(self) -> dict:
    """The classification task's description with "task": "mae"."""
    return {**super().describe(), "task": "mae"}

  @staticmethod
  def representation(model, images):
    """The encoder's pooled features [B, D] of all the patches (no masking): what a probe or fine-tuning sees."""
    return model.vit(images, train=False)[1]["pre_logits"]

  def model_overrides(self) -> dict:
    """{"channels": the data's channels}: the decoder predicts p q channels values per patch."""
    return {"channels": self.describe()["channels"]}

  def example_inputs(self):
    """(zeros float32 [1, H, W, C] images, zeros float32 [1, N] noise), N the patches of the grid."""
    (images,) = super().example_inputs()
    gh, gw = self.grid
    return images, jnp.zeros((1, gh * gw), jnp.float32)

  def device_batch(self, batch, key):
    """Normalises the images and draws the masking noise [B, N] from the step's key."""
    pre = self.preprocess()
    images = device_ops.to_float(batch["image"], pre.mean, pre.std)
    gh, gw = self.grid
    return {"image": images, "noise": jax.random.uniform(key, (images.shape[0], gh * gw))}

  def model_inputs(self, batch):
    """(images float [B, H, W, C], noise float [B, N]) from a device batch."""
    return batch["image"], batch["noise"]

  def loss(self, output, batch):
    """MAE's loss: the per-patch error (patch_errors) averaged over the batch's dropped patches.

    Args:
      output: the model's {"pred": float32 [B, N, p q C], "mask": float32 [B, N], 1 where dropped}.
      batch: with "image", float [B, H, W, C].

    Returns:
      tuple: (scalar loss, {"visible_mse": the same error averaged over the kept patches}).
    """
    per_patch = patch_errors(output["pred"], batch["image"], self.patch)
    mask = output["mask"]
    loss = jnp.sum(per_patch * mask) / jnp.maximum(jnp.sum(mask), 1.0)
    return loss, {"visible_mse": jnp.sum(per_patch * (1 - mask)) / jnp.maximum(jnp.sum(1 - mask), 1.0)}

  def predict(self, *args, **kwargs):
    """Always raises TypeError: an MAE run predicts pixels, not classes (fine-tune it with config.init_from)."""
    raise TypeError("an MAE run predicts pixels, not classes: fine-tune it (config.init_from) to classify")


def patch_errors(pred, images, patch):
  """Mean squared error per patch [B, N] against the patch's pixels normalised by its own mean and variance."""
  target = patchify(images.astype(jnp.float32), patch)
  mean, var = target.mean(-1, keepdims=True), target.var(-1, keepdims=True)
  target = (target - mean) / jnp.sqrt(var + 1e-6)
  return jnp.mean((pred - target) ** 2, axis=-1)


__all__ = ["MaskedImageModeling", "random_mask"]
