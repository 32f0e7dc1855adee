"""The batch-level image work that runs on the devices: normalisation to [-1, 1] and Mixup / CutMix.

It runs inside the jitted training step, so that images travel as uint8. The per-image work is the host's:
vitjax.data.augment.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from vitjax.data.augment import Augment


def to_float(images, mean=None, std=None):
  """Device-side normalisation.

  uint8 [..., C] -> float32: x * 2 / 255 - 1 (in [-1, 1]), or with a per-channel mean and std in [0, 1] units
  (augment.Preprocess) (x / 255 - mean) / std; float images are taken as already normalised and pass through unchanged.
  """
  if not jnp.issubdtype(images.dtype, jnp.integer):
    return images
  if mean is None:
    return images.astype(jnp.float32) * (2.0 / 255.0) - 1.0
  mean, std = jnp.asarray(mean, jnp.float32), jnp.asarray(std, jnp.float32)
  return (images.astype(jnp.float32) / 255.0 - mean) / std


def mix_batch(images, labels, num_classes: int, aug: Augment, key):
  """Mixup or CutMix of a batch on the device, each row with its neighbour: rows 2k and 2k + 1 mix.

  One draw per batch from `key` (whether to mix, which of the two, lambda, the CutMix box). The pairs and the draw
  depend only on the global batch and the key, so the result does not depend on how many devices or processes
  hold the batch (under jit the pair swap is a reshape; XLA moves rows between devices if a pair is split).

  Args:
    images: float [B, H, W, C] (normalised), B even.
    labels: int [B].
    num_classes: size of the one-hot targets.
    aug: `mixup_alpha`, `cutmix_alpha`, `mix_switch_prob`, `mix_prob`.
    key: a jax PRNG key.

  Returns:
    (images [B, H, W, C] in the input dtype, soft labels float32 [B, num_classes], each row summing to 1).
  """
  b, height, width = images.shape[:3]
  if b % 2:
    raise ValueError(f"Mixup/CutMix pairs neighbouring rows: the batch needs an even size, not {b}")
  onehot = jax.nn.one_hot(labels, num_classes, dtype=jnp.float32)
  if not aug.mixes:
    return images, onehot
  k_mix, k_switch, k_lam, k_y, k_x = jax.random.split(key, 5)
  mix = jax.random.uniform(k_mix) < aug.mix_prob
  if aug.cutmix_alpha > 0 and aug.mixup_alpha > 0:
    cutmix = jax.random.uniform(k_switch) < aug.mix_switch_prob
  else:
    cutmix = jnp.asarray(aug.cutmix_alpha > 0)
  alpha = jnp.where(cutmix, aug.cutmix_alpha, aug.mixup_alpha)
  lam = jax.random.beta(k_lam, alpha, alpha)
  # CutMix: a box of (1 - lam) of the area around a uniform centre, clipped to the image; lam is then the area
  # left outside the box.
  cut = jnp.sqrt(1.0 - lam)
  ch, cw = (height * cut).astype(jnp.int32), (width * cut).astype(jnp.int32)
  cy, cx = jax.random.randint(k_y, (), 0, height), jax.random.randint(k_x, (), 0, width)
  y0, y1 = jnp.maximum(cy - ch // 2, 0), jnp.minimum(cy + ch - ch // 2, height)
  x0, x1 = jnp.maximum(cx - cw // 2, 0), jnp.minimum(cx + cw - cw // 2, width)
  ys, xs = jnp.arange(height)[:, None], jnp.arange(width)[None, :]
  inside = (ys >= y0) & (ys < y1) & (xs >= x0) & (xs < x1)  # [H, W]
  cut_lam = 1.0 - (y1 - y0) * (x1 - x0) / (height * width)
  # weight of a row's own pixels: Mixup lam everywhere; CutMix 0 inside the box, 1 outside; 1 when not mixing
  weight = jnp.where(cutmix, jnp.where(inside, 0.0, 1.0), lam)
  weight = jnp.where(mix, weight, 1.0)[None, :, :, None]
  lam = jnp.where(mix, jnp.where(cutmix, cut_lam, lam), 1.0)

  def partner(x):  # row 2k <-> 2k + 1
    return jnp.flip(x.reshape((b // 2, 2) + x.shape[1:]), axis=1).reshape(x.shape)

  mixed = weight * images + (1.0 - weight) * partner(images)
  return mixed.astype(images.dtype), lam * onehot + (1.0 - lam) * partner(onehot)
