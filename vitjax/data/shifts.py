"""Distribution shifts applied to evaluation images (ImageNet-C's corruptions, rotated MNIST).

As robustness evaluations do: uint8 images [B, H, W, C] in, uint8 images of the same shape out, the same for an image
wherever and in whatever batch it is read (noise is drawn from the image's own bytes), so a shifted evaluation does not
depend on the devices or processes.

    rotate:DEG     rotated by DEG degrees about the centre (bilinear; corners filled black)
    noise:STD      Gaussian noise of deviation STD (in [0, 1] pixel units), clipped
    contrast:F     contrast scaled by F (0 < F <= 1) around each image's mean
    blur:SIGMA     Gaussian blur of radius SIGMA pixels
"""

from __future__ import annotations

import zlib
from collections.abc import Callable

import numpy as np

KINDS = ("rotate", "noise", "contrast", "blur")


def parse(spec: str | None) -> Callable[[np.ndarray], np.ndarray] | None:
  """The shift that `spec` ('rotate:30', ...) names, or None for None; ValueError naming the forms."""
  if spec is None:
    return None
  kind, _, value = str(spec).partition(":")
  try:
    amount = float(value)
  except ValueError:
    amount = None
  if kind not in KINDS or amount is None:
    raise ValueError(f"shift={spec!r}: give one of {', '.join(k + ':X' for k in KINDS)}, e.g. 'rotate:30'")
  if kind == "contrast" and not 0 < amount <= 1:
    raise ValueError(f"shift={spec!r}: a contrast factor is in (0, 1]")
  if kind in ("noise", "blur") and amount < 0:
    raise ValueError(f"shift={spec!r}: the amount must be >= 0")
  fn = {"rotate": _rotate, "noise": _noise, "contrast": _contrast, "blur": _blur}[kind]
  return lambda images: np.stack([fn(np.asarray(im), amount) for im in images]) if len(images) else images


def _pil(image: np.ndarray, op) -> np.ndarray:
  import PIL.Image  # pylint: disable=g-import-not-at-top

  squeeze = image.shape[-1] == 1
  out = np.asarray(op(PIL.Image.fromarray(image[..., 0] if squeeze else image)))
  return out[..., None] if squeeze else out


def _rotate(image, degrees):
  import PIL.Image  # pylint: disable=g-import-not-at-top

  return _pil(image, lambda im: im.rotate(degrees, resample=PIL.Image.BILINEAR))


def _blur(image, sigma):
  import PIL.ImageFilter  # pylint: disable=g-import-not-at-top

  return _pil(image, lambda im: im.filter(PIL.ImageFilter.GaussianBlur(sigma)))


def _noise(image, std):
  rng = np.random.default_rng(zlib.crc32(image.tobytes()))
  noisy = image.astype(np.float32) + rng.normal(0.0, 255.0 * std, image.shape)
  return np.clip(np.round(noisy), 0, 255).astype(np.uint8)


def _contrast(image, factor):
  x = image.astype(np.float32)
  return np.clip(np.round(x.mean() + factor * (x - x.mean())), 0, 255).astype(np.uint8)
