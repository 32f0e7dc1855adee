"""Image work on the host, per image, on uint8 arrays (numpy, PIL, simplejpeg).

Decoding, resize, Inception random-resized crop, flip, RandAugment. The batch-level work (normalisation, Mixup / CutMix)
runs on the devices: vitjax.data.device_ops.

`Augment` holds the training augmentations of a config (`parse_augment` validates a dict or ConfigDict into one);
vitjax.data.images applies the per-image ones in its grain pipeline, and `preprocess_eval` is the host's part of
the evaluation (and prediction) preprocessing: resize to the model's size.
"""

from __future__ import annotations

import dataclasses
import io
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import PIL.Image
import PIL.ImageEnhance
import PIL.ImageOps
import simplejpeg

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
    """Whether batches are mixed: Mixup or CutMix is on (an alpha above 0)."""
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
  if aug.random_resized_crop is not None:  # else a reversed or percent range fails at the first batch, or crops nothing
    (s0, s1), (r0, r1) = aug.random_resized_crop
    if not 0 < s0 <= s1 <= 1:
      raise ValueError(f"augment.random_resized_crop.scale=({s0:g}, {s1:g}): give 0 < lo <= hi <= 1 (e.g. (0.08, 1.0))")
    if not 0 < r0 <= r1:
      raise ValueError(f"augment.random_resized_crop.ratio=({r0:g}, {r1:g}): give 0 < lo <= hi (e.g. (0.75, 1.3333))")
  return aug


# ----------------------------------------------------------------------------
# Per-image ops on uint8 [H, W, C] arrays and PIL images.

Box = tuple[float, float, float, float]  # x0, y0, x1, y1 in pixels


def _to_pil(image: np.ndarray) -> PIL.Image.Image:
  """uint8 [H, W, C] (C in 1, 3) -> PIL image ('L' or 'RGB')."""
  return PIL.Image.fromarray(image[..., 0] if image.shape[-1] == 1 else image)


def _from_pil(pil: PIL.Image.Image) -> np.ndarray:
  """PIL image -> uint8 [H, W, C]."""
  array = np.asarray(pil, dtype=np.uint8)
  return array[..., None] if array.ndim == 2 else array


_RESAMPLE = {"bilinear": PIL.Image.BILINEAR, "bicubic": PIL.Image.BICUBIC}


def resize(
  image: np.ndarray, size: tuple[int, int], box: Box | None = None, interpolation: str = "bilinear"
) -> np.ndarray:
  """Antialiased resize (PIL's; "bilinear" or "bicubic") of uint8 [H, W, C] (or of its ``box`` = x0, y0, x1, y1).

  Returns uint8 [size[0], size[1], C].
  """
  if box is None and image.shape[:2] == tuple(size):
    return image
  pil = _to_pil(image).resize((size[1], size[0]), _RESAMPLE[interpolation], box=box)
  return _from_pil(pil)


def is_jpeg(data: bytes) -> bool:
  """Whether encoded image bytes start with a JPEG's start-of-image marker."""
  return data[:2] == b"\xff\xd8"


def encoded_shape(data: bytes | np.ndarray) -> tuple[int, int]:
  """(height, width) of an encoded image (JPEG, PNG, ...), read from its header without decoding it.

  Or of an image already decoded, uint8 [H, W, C].
  """
  if isinstance(data, np.ndarray):
    return data.shape[0], data.shape[1]
  if is_jpeg(data):
    try:
      height, width, _, _ = simplejpeg.decode_jpeg_header(data)
      return height, width
    except ValueError:
      pass  # Not a JPEG libjpeg-turbo reads: PIL's turn.
  with PIL.Image.open(io.BytesIO(data)) as pil:
    return pil.height, pil.width


def decode(
  data: bytes | np.ndarray, channels: int, box: Box | None = None, size: tuple[int, int] | None = None
) -> tuple[np.ndarray, Box | None]:
  """Decodes an encoded image to uint8 [H, W, channels] (channels 1 or 3).

  JPEGs are decoded by libjpeg-turbo through simplejpeg (bitwise PIL's pixels, 1.3x its rate on this project's
  CPU: experiments/bench_input.py). Given ``size`` (H, W), the size the image (or its ``box``) will be resized to,
  a JPEG is decoded at the smallest of libjpeg's fast DCT scales (1/8, 1/4, 1/2, 1) at which the box still spans
  at least ``size`` pixels: a crop twice its target or more then costs less to decode and to resize. Other formats
  (PNG, ...) and JPEGs libjpeg-turbo cannot read go through PIL at full size.

  An image already decoded (uint8 [H, W, channels]: images.make_input's ``cache``) comes back as it is.

  Returns:
    (image, box): the box in the decoded image's pixels (``box`` unchanged when nothing was scaled).
  """
  if isinstance(data, np.ndarray):
    if data.ndim != 3 or data.shape[-1] != channels or data.dtype != np.uint8:
      raise ValueError(f"a decoded image must be uint8 [H, W, {channels}], got {data.dtype} {data.shape}")
    return data, box
  if is_jpeg(data):
    try:
      return _decode_jpeg(data, channels, box, size)
    except ValueError:
      pass
  with PIL.Image.open(io.BytesIO(data)) as pil:
    if pil.mode != ("L" if channels == 1 else "RGB"):
      pil = pil.convert("L" if channels == 1 else "RGB")
    return _from_pil(pil), box


def _decode_jpeg(data, channels, box, size):
  colorspace = "GRAY" if channels == 1 else "RGB"
  if size is None:
    return simplejpeg.decode_jpeg(data, colorspace=colorspace), box
  height, width, _, _ = simplejpeg.decode_jpeg_header(data)
  x0, y0, x1, y1 = box or (0, 0, width, height)
  need = max(size[0] / max(y1 - y0, 1e-6), size[1] / max(x1 - x0, 1e-6))  # the least scale the crop allows
  # libjpeg-turbo decodes at any n/8, but only 1/8, 1/4 and 1/2 are faster than a full decode (3/8, 5/8, 7/8 take
  # up to 1.7x as long: experiments/README.md, input pipeline).
  scale = next((s for s in (1 / 8, 1 / 4, 1 / 2) if s >= need), 1)
  if scale == 1:
    return simplejpeg.decode_jpeg(data, colorspace=colorspace), box
  min_height, min_width = math.ceil(height * scale), math.ceil(width * scale)
  image = simplejpeg.decode_jpeg(data, colorspace=colorspace, min_height=min_height, min_width=min_width)
  sy, sx = image.shape[0] / height, image.shape[1] / width
  return image, (x0 * sx, y0 * sy, x1 * sx, y1 * sy)


def random_resized_crop_box(
  rng: np.random.Generator,
  height: int,
  width: int,
  scale: tuple[float, float],
  ratio: tuple[float, float],
  attempts: int = 10,
) -> tuple[int, int, int, int]:
  """Inception crop: (x0, y0, x1, y1) with area fraction in ``scale``, aspect ratio (w/h) log-uniform in ``ratio``.

  Central crop as fallback.
  """
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


@dataclasses.dataclass(frozen=True)
class Preprocess:
  """How images meet a model: host-side evaluation and prediction preprocessing, and the devices' normalisation.

  What evaluation and prediction do on the host, and the normalisation the devices apply in training, evaluation and
  prediction (vitjax.data.device_ops.to_float).

  mean, std: per channel, in [0, 1] units: x / 255 -> (x - mean) / std. None: x * 2 / 255 - 1 (the original
    ViT's and big_vision's [-1, 1]).

  crop_fraction: evaluation resizes the shorter side to floor(size / crop_fraction), then takes the centre crop of
    the model's size (timm's crop_pct, 0.875 or 0.9 for most ImageNet models); None resizes the whole image.

  interpolation: "bilinear" or "bicubic" (the evaluation's resize).

  crop_offset: where the centre crop starts, (resized - size) / 2 "round"ed (torchvision's CenterCrop, timm's) or
    "floor"ed (transformers' image processors); it moves an odd margin's crop by one pixel. Not a config field: a
    hub repository in transformers' layout sets "floor".
  """

  mean: tuple[float, ...] | None = None
  std: tuple[float, ...] | None = None
  crop_fraction: float | None = None
  interpolation: str = "bilinear"
  crop_offset: str = "round"

  def __post_init__(self):
    if (self.mean is None) != (self.std is None):
      raise ValueError("preprocess: give both mean and std, or neither")
    if self.mean is not None:
      mean, std = np.ravel(np.asarray(self.mean, float)), np.ravel(np.asarray(self.std, float))
      if not (np.all((mean >= 0) & (mean <= 1)) and np.all((std > 0) & (std <= 1))):
        hint = f" (in 0..255 units? divide by 255: {tuple(np.round(mean / 255, 4).tolist())})" if mean.max() > 1 else ""
        raise ValueError(
          f"preprocess.mean={tuple(mean.tolist())}, std={tuple(std.tolist())}: per channel, in [0, 1] units, mean in "
          f"[0, 1] and std in (0, 1]{hint}"
        )
    if self.crop_fraction is not None and not 0 < self.crop_fraction <= 1:
      raise ValueError(f"preprocess.crop_fraction={self.crop_fraction} must be in (0, 1]")
    if self.interpolation not in _RESAMPLE:
      raise ValueError(f"preprocess.interpolation={self.interpolation!r}: use one of {sorted(_RESAMPLE)}")
    if self.crop_offset not in ("round", "floor"):
      raise ValueError(f"preprocess.crop_offset={self.crop_offset!r}: use 'round' or 'floor'")

  def describe(self) -> dict:
    """The preprocessing as task.json records it; `from_described` reads it back.

    Returns:
      dict: {"normalize": "[-1, 1]: ..." or {"mean", "std"}, "crop_fraction", "interpolation"}.
    """
    normalize = "[-1, 1]: x * 2 / 255 - 1" if self.mean is None else {"mean": self.mean, "std": self.std}
    out = {"normalize": normalize, "crop_fraction": self.crop_fraction, "interpolation": self.interpolation}
    return {**out, "crop_offset": self.crop_offset} if self.crop_offset != "round" else out

  @classmethod
  def from_described(cls, described: dict) -> Preprocess:
    """From a task.json (one written before these fields existed means the defaults)."""
    normalize = described.get("normalize")
    mean = tuple(normalize["mean"]) if isinstance(normalize, dict) else None
    std = tuple(normalize["std"]) if isinstance(normalize, dict) else None
    interpolation = described.get("interpolation") or "bilinear"
    return cls(mean, std, described.get("crop_fraction"), interpolation, described.get("crop_offset") or "round")


def preprocess_eval(image: np.ndarray, size: tuple[int, int], pre: Preprocess | None = None) -> np.ndarray:
  """What the host does to a uint8 [H, W, C] image for evaluation and prediction.

  Resize to `size`, or with a crop_fraction resize the shorter side to floor(min(size) / crop_fraction) keeping the
  aspect ratio and take the centre crop (torchvision's Resize + CenterCrop, as timm evaluates). uint8 out; the device
  normalises it.
  """
  image = np.asarray(image)
  if image.dtype != np.uint8 or image.ndim != 3 or image.shape[-1] not in (1, 3):
    raise ValueError(
      f"preprocess_eval takes one uint8 image [H, W, C] (C 1 or 3); got {image.dtype} of shape {list(image.shape)}"
    )
  pre = pre or Preprocess()
  if pre.crop_fraction is None:
    return resize(image, size, interpolation=pre.interpolation)
  h, w = image.shape[:2]
  if size[0] == size[1]:
    scale = math.floor(size[0] / pre.crop_fraction)
    new = (scale, int(scale * w / h)) if h <= w else (int(scale * h / w), scale)
  else:  # timm's ResizeKeepRatio: the aspect kept, just covering floor(size / crop_fraction) in both dimensions
    want = [math.floor(s / pre.crop_fraction) for s in size]
    f = max(want[0] / h, want[1] / w)
    new = (max(want[0], round(h * f)), max(want[1], round(w * f)))
  image = resize(image, new, interpolation=pre.interpolation)
  if pre.crop_offset == "floor":  # transformers' image processors
    top, left = (new[0] - size[0]) // 2, (new[1] - size[1]) // 2
  else:  # torchvision's CenterCrop
    top, left = int(round((new[0] - size[0]) / 2.0)), int(round((new[1] - size[1]) / 2.0))
  if top < 0 or left < 0:
    raise ValueError(f"crop_fraction={pre.crop_fraction}: a {new} image cannot be cropped to {size}")
  return image[top : top + size[0], left : left + size[1]]
