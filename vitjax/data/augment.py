"""Image augmentations. On the host, per image, on uint8 arrays (numpy and PIL): resize, Inception random-resized
crop, flip, RandAugment. On the device, per batch, inside the jitted step (jax): normalisation to [-1, 1]
(`to_float`) and Mixup / CutMix (`mix_batch`), so that images travel to the device as uint8.

`Augment` holds the training augmentations of a config (`parse_augment` validates a dict or ConfigDict into one);
vitjax.data.images applies the per-image ones in its grain pipeline, and `preprocess_eval` is the host's part of
the evaluation (and prediction) preprocessing: resize to the model's size.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import PIL.Image
import PIL.ImageEnhance
import PIL.ImageOps

_FILL = 128  # Gray fill for pixels that geometric ops move in.


# ----------------------------------------------------------------------------
# Augmentation config.


@dataclasses.dataclass(frozen=True)
class Augment:
  """Training augmentations; built from a dict by :func:`parse_augment`.

  Attributes:
    random_resized_crop: ``None`` (plain resize) or ``{'scale': (lo, hi),
      'ratio': (lo, hi)}``; ``True`` means scale (0.08, 1), ratio (3/4, 4/3).
    flip: random horizontal flip with probability 1/2.
    randaugment: ``None`` or ``{'num_layers': 2, 'magnitude': 9}`` (magnitude
      on the 0..10 scale; each layer applies one uniformly drawn op).
    mixup_alpha: Beta(alpha, alpha) Mixup, 0 = off.
    cutmix_alpha: Beta(alpha, alpha) CutMix, 0 = off.
    mix_switch_prob: when both are on, probability that a batch uses CutMix.
    mix_prob: probability that a batch is mixed at all (labels stay soft).
  """

  random_resized_crop: tuple[tuple[float, float], tuple[float, float]] | None = None
  flip: bool = False
  randaugment: tuple[int, float] | None = None
  mixup_alpha: float = 0.0
  cutmix_alpha: float = 0.0
  mix_switch_prob: float = 0.5
  mix_prob: float = 1.0

  @property
  def mixes(self) -> bool:
    return self.mixup_alpha > 0 or self.cutmix_alpha > 0


_RRC_DEFAULTS = {"scale": (0.08, 1.0), "ratio": (3 / 4, 4 / 3)}
_RANDAUGMENT_DEFAULTS = {"num_layers": 2, "magnitude": 9}


def _as_dict(value: Any, what: str) -> dict[str, Any]:
  if hasattr(value, "to_dict"):  # ml_collections.ConfigDict
    value = value.to_dict()
  if not isinstance(value, Mapping):
    raise TypeError(f"{what} must be a dict or ConfigDict, got {value!r}")
  return dict(value)


def _check_keys(given: Mapping[str, Any], valid: Sequence[str], what: str):
  unknown = sorted(set(given) - set(valid))
  if unknown:
    raise ValueError(f"Unknown {what} key(s) {unknown}; valid keys: {sorted(valid)}")


def _sub_options(value: Any, defaults: dict[str, Any], what: str):
  """``None``/``False`` -> None, ``True`` -> defaults, dict -> merged."""
  if value is None or value is False:
    return None
  if value is True:
    return dict(defaults)
  value = _as_dict(value, what)
  _check_keys(value, list(defaults), what)
  return {**defaults, **value}


def parse_augment(augment: Mapping[str, Any] | Any | None) -> Augment:
  """Validates an augmentation dict/ConfigDict into an :class:`Augment`.

  Raises:
    ValueError: on unknown keys (the message lists the valid ones).
  """
  if augment is None:
    return Augment()
  augment = _as_dict(augment, "augment")
  _check_keys(augment, [f.name for f in dataclasses.fields(Augment)], "augment")
  rrc = _sub_options(augment.pop("random_resized_crop", None), _RRC_DEFAULTS, "augment.random_resized_crop")
  ra = _sub_options(augment.pop("randaugment", None), _RANDAUGMENT_DEFAULTS, "augment.randaugment")
  aug = Augment(
    random_resized_crop=None if rrc is None else (tuple(map(float, rrc["scale"])), tuple(map(float, rrc["ratio"]))),
    randaugment=None if ra is None else (int(ra["num_layers"]), float(ra["magnitude"])),
    **augment,
  )
  for key in ("mixup_alpha", "cutmix_alpha"):
    if getattr(aug, key) < 0:
      raise ValueError(f"augment.{key} must be >= 0, got {getattr(aug, key)}")
  return aug


# ----------------------------------------------------------------------------
# Per-image ops on uint8 [H, W, C] arrays and PIL images.


def _to_pil(image: np.ndarray) -> PIL.Image.Image:
  """uint8 [H, W, C] (C in 1, 3) -> PIL image ('L' or 'RGB')."""
  return PIL.Image.fromarray(image[..., 0] if image.shape[-1] == 1 else image)


def _from_pil(pil: PIL.Image.Image) -> np.ndarray:
  """PIL image -> uint8 [H, W, C]."""
  array = np.asarray(pil, dtype=np.uint8)
  return array[..., None] if array.ndim == 2 else array


def resize(
  image: np.ndarray, size: tuple[int, int], box: tuple[float, float, float, float] | None = None
) -> np.ndarray:
  """Bilinear resize of uint8 [H, W, C] (or of its ``box`` = x0, y0, x1, y1).

  Returns uint8 [size[0], size[1], C].
  """
  if box is None and image.shape[:2] == tuple(size):
    return image
  pil = _to_pil(image).resize((size[1], size[0]), PIL.Image.BILINEAR, box=box)
  return _from_pil(pil)


def random_resized_crop_box(
  rng: np.random.Generator,
  height: int,
  width: int,
  scale: tuple[float, float],
  ratio: tuple[float, float],
  attempts: int = 10,
) -> tuple[int, int, int, int]:
  """Inception crop: (x0, y0, x1, y1) with area fraction in ``scale`` and
  aspect ratio (w/h) log-uniform in ``ratio``; central crop as fallback."""
  area = height * width
  for _ in range(attempts):
    target = area * rng.uniform(*scale)
    aspect = math.exp(rng.uniform(math.log(ratio[0]), math.log(ratio[1])))
    w = int(round(math.sqrt(target * aspect)))
    h = int(round(math.sqrt(target / aspect)))
    if 0 < w <= width and 0 < h <= height:
      x0 = int(rng.integers(0, width - w + 1))
      y0 = int(rng.integers(0, height - h + 1))
      return x0, y0, x0 + w, y0 + h
  # Fallback: the largest central crop with aspect ratio clipped to ``ratio``.
  aspect = min(max(width / height, ratio[0]), ratio[1])
  w, h = (width, int(round(width / aspect))) if aspect > width / height else (int(round(height * aspect)), height)
  w, h = min(w, width), min(h, height)
  x0, y0 = (width - w) // 2, (height - h) // 2
  return x0, y0, x0 + w, y0 + h


def _fill(pil: PIL.Image.Image):
  return _FILL if pil.mode == "L" else (_FILL,) * len(pil.getbands())


def _affine(pil, matrix):
  return pil.transform(pil.size, PIL.Image.AFFINE, matrix, resample=PIL.Image.BILINEAR, fillcolor=_fill(pil))


def _enhance(enhancer):
  return lambda pil, m: enhancer(pil).enhance(1.0 + 0.9 * m)


# RandAugment ops: (PIL image, signed level m in [-1, 1]) -> PIL image. The
# level is magnitude / 10 with a random sign; unsigned ops use |m|.
RANDAUGMENT_OPS = {
  "Identity": lambda pil, m: pil,
  "AutoContrast": lambda pil, m: PIL.ImageOps.autocontrast(pil),
  "Equalize": lambda pil, m: PIL.ImageOps.equalize(pil),
  "Rotate": lambda pil, m: pil.rotate(30.0 * m, PIL.Image.BILINEAR, fillcolor=_fill(pil)),
  "Solarize": lambda pil, m: PIL.ImageOps.solarize(pil, 256 - int(256 * abs(m))),
  "Posterize": lambda pil, m: PIL.ImageOps.posterize(pil, 8 - int(4 * abs(m))),
  "Color": _enhance(PIL.ImageEnhance.Color),
  "Contrast": _enhance(PIL.ImageEnhance.Contrast),
  "Brightness": _enhance(PIL.ImageEnhance.Brightness),
  "Sharpness": _enhance(PIL.ImageEnhance.Sharpness),
  "ShearX": lambda pil, m: _affine(pil, (1, 0.3 * m, 0, 0, 1, 0)),
  "ShearY": lambda pil, m: _affine(pil, (1, 0, 0, 0.3 * m, 1, 0)),
  "TranslateX": lambda pil, m: _affine(pil, (1, 0, 0.45 * m * pil.size[0], 0, 1, 0)),
  "TranslateY": lambda pil, m: _affine(pil, (1, 0, 0, 0, 1, 0.45 * m * pil.size[1])),
}
_OP_NAMES = tuple(RANDAUGMENT_OPS)


def randaugment(image: np.ndarray, rng: np.random.Generator, num_layers: int, magnitude: float) -> np.ndarray:
  """RandAugment (Cubuk et al. 2019) on uint8 [H, W, C], C in {1, 3}.

  Applies ``num_layers`` ops drawn uniformly from :data:`RANDAUGMENT_OPS` at
  ``magnitude`` in [0, 10] (random sign for signed ops).
  """
  pil = _to_pil(image)
  level = min(max(magnitude, 0.0), 10.0) / 10.0
  for _ in range(num_layers):
    op = _OP_NAMES[int(rng.integers(len(_OP_NAMES)))]
    sign = 1.0 if rng.random() < 0.5 else -1.0
    pil = RANDAUGMENT_OPS[op](pil, sign * level)
  return _from_pil(pil)


# ----------------------------------------------------------------------------
# On the device, inside the jitted step: normalisation and per-batch Mixup / CutMix.


def to_float(images):
  """Device-side normalisation. uint8 [..., C] -> float32 in [-1, 1], x * 2 / 255 - 1; float
  images are taken as already normalised and pass through unchanged."""
  if jnp.issubdtype(images.dtype, jnp.integer):
    return images.astype(jnp.float32) * (2.0 / 255.0) - 1.0
  return images


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


def preprocess_eval(image: np.ndarray, size: tuple[int, int]) -> np.ndarray:
  """What the host does to a uint8 [H, W, C] image for evaluation and prediction: resize to `size` (uint8); the
  device normalises it (`to_float`)."""
  return resize(image, size)
