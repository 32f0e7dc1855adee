"""Grain input pipeline for image classification, numpy/PIL only (no TF).

Entry point: :func:`make_input` returns ``(iterator, DatasetInfo)``. Batches::

  {'image': float32 [B, H, W, C] in [-1, 1],
   'label': int32 [B]  (float32 [B, num_classes] soft targets when Mixup/CutMix
                        is on, train only),
   'mask':  bool [B]   True for real examples (all True when training),
   'index': int32 [B]  position of the example in the split (-1 for padding)}

with ``B = global_batch_size // process_count``. The iterator has
``get_state()`` / ``set_state(state)`` (grain's ``DataLoaderIterator``).

Training: each process reads its contiguous shard of the split (grain
``ShardOptions``; the remainder over processes is dropped), shuffles it with a
seeded per-epoch permutation, augments each example with a per-example rng
derived from the seed (grain ``RandomMap``), and drops the last partial batch.
Evaluation: no shuffling, no augmentation, one pass (unless ``num_epochs``);
every process yields the same number of batches, ``ceil(ceil(N / P) / B)``, the
tail padded with masked copies, so each example is counted exactly once.

Augmentations (``augment`` dict or ConfigDict, used only when ``train=True``;
see :class:`Augment` for keys and defaults): resize to ``image_size`` (always),
Inception random-resized crop, horizontal flip, RandAugment, and per-batch
Mixup / CutMix.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import grain
import numpy as np
import PIL.Image
import PIL.ImageEnhance
import PIL.ImageOps

from vitjax.data import builders

_FILL = 128  # Gray fill for pixels that geometric ops move in.


class DatasetNotPreparedError(FileNotFoundError):
  """The dataset has no array_record files in data_dir; the message says how."""


@dataclasses.dataclass(frozen=True)
class DatasetInfo:
  """What a model and trainer need to know about an input.

  Attributes:
    name: config name (``'digits'``, ``'fashion_mnist'``, ``'cifar10'``...).
    split: the split read, e.g. ``'train'``, ``'test'``, ``'train[:90%]'``.
    num_classes: number of label classes.
    num_examples: examples in the split, over all processes.
    image_shape: (H, W, C) of the batched images.
    local_batch_size: batch size on this process.
    steps_per_epoch: batches this process yields per epoch (eval: including
      the padded last one; train: full batches only).
  """

  name: str
  split: str
  num_classes: int
  num_examples: int
  image_shape: tuple[int, int, int]
  local_batch_size: int
  steps_per_epoch: int


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


def normalize(image: np.ndarray) -> np.ndarray:
  """uint8 [..., C] -> float32 in [-1, 1]."""
  return image.astype(np.float32) * (2.0 / 255.0) - 1.0


# ----------------------------------------------------------------------------
# Per-batch Mixup / CutMix on float images.


def mix_batch(
  images: np.ndarray, labels: np.ndarray, num_classes: int, aug: Augment, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
  """Mixup or CutMix of a batch with its reverse.

  Args:
    images: float32 [B, H, W, C].
    labels: int [B].
    num_classes: size of the one-hot targets.
    aug: Mixup/CutMix settings (``mixup_alpha``, ``cutmix_alpha``,
      ``mix_switch_prob``, ``mix_prob``).
    rng: numpy generator.

  Returns:
    (images float32 [B, H, W, C], soft labels float32 [B, num_classes]); each
    row of the labels sums to 1.
  """
  onehot = np.eye(num_classes, dtype=np.float32)[labels]
  if not aug.mixes or rng.random() >= aug.mix_prob:
    return images, onehot
  use_cutmix = aug.cutmix_alpha > 0 and (aug.mixup_alpha <= 0 or rng.random() < aug.mix_switch_prob)
  alpha = aug.cutmix_alpha if use_cutmix else aug.mixup_alpha
  lam = float(rng.beta(alpha, alpha))
  other = images[::-1]
  if use_cutmix:
    height, width = images.shape[1:3]
    cut = math.sqrt(1.0 - lam)
    ch, cw = int(height * cut), int(width * cut)
    cy, cx = int(rng.integers(height)), int(rng.integers(width))
    y0, y1 = max(cy - ch // 2, 0), min(cy + ch - ch // 2, height)
    x0, x1 = max(cx - cw // 2, 0), min(cx + cw - cw // 2, width)
    images = images.copy()
    images[:, y0:y1, x0:x1] = other[:, y0:y1, x0:x1]
    lam = 1.0 - (y1 - y0) * (x1 - x0) / (height * width)
  else:
    images = (lam * images + (1.0 - lam) * other).astype(np.float32)
  return images, (lam * onehot + (1.0 - lam) * onehot[::-1]).astype(np.float32)


# ----------------------------------------------------------------------------
# Grain data sources and transforms (top-level classes: picklable for workers).


class _Examples:
  """Random-access source of ``{'image': uint8 [H, W, C], 'label': int,
  'index': int, 'mask': bool}`` over ``positions`` of a tfds data source.

  Positions beyond the shard (``-1`` in ``positions``) are padding: a copy of
  the shard's first example (or of example 0) with ``mask=False``.
  """

  def __init__(self, source, image_key: str, label_key: str, positions: np.ndarray | None = None):
    self._source, self._image_key, self._label_key = source, image_key, label_key
    self._positions = positions

  def __len__(self) -> int:
    return len(self._source) if self._positions is None else len(self._positions)

  def __getitem__(self, i: int) -> dict[str, Any]:
    pos = int(i if self._positions is None else self._positions[i])
    real = pos >= 0
    if not real:  # Padding: any real example, masked out.
      pos = int(self._positions[0]) if self._positions[0] >= 0 else 0
    example = self._source[pos]
    image = np.asarray(example[self._image_key])
    if image.ndim == 2:
      image = image[..., None]
    return {"image": image, "label": int(example[self._label_key]), "index": pos if real else -1, "mask": real}

  def __repr__(self) -> str:
    return f"_Examples({self._source!r}, n={len(self)})"


def _finish(example: dict[str, Any], image: np.ndarray) -> dict[str, Any]:
  return {
    "image": normalize(image),
    "label": np.int32(example["label"]),
    "mask": np.bool_(example["mask"]),
    "index": np.int32(example["index"]),
  }


@dataclasses.dataclass(frozen=True)
class _EvalPreprocess(grain.transforms.Map):
  """Resize to ``size`` and normalize."""

  size: tuple[int, int]

  def map(self, example):
    return _finish(example, resize(example["image"], self.size))


@dataclasses.dataclass(frozen=True)
class _TrainPreprocess(grain.transforms.RandomMap):
  """Random-resized crop (or resize), flip, RandAugment, normalize."""

  size: tuple[int, int]
  aug: Augment

  def random_map(self, example, rng: np.random.Generator):
    image = example["image"]
    if self.aug.random_resized_crop is not None:
      box = random_resized_crop_box(rng, *image.shape[:2], *self.aug.random_resized_crop)
      image = resize(image, self.size, box=box)
    else:
      image = resize(image, self.size)
    if self.aug.flip and rng.random() < 0.5:
      image = image[:, ::-1]
    if self.aug.randaugment is not None:
      image = randaugment(np.ascontiguousarray(image), rng, *self.aug.randaugment)
    return _finish(example, np.ascontiguousarray(image))


@dataclasses.dataclass(frozen=True)
class _MixBatch(grain.transforms.RandomMap):
  """Per-batch Mixup/CutMix; 'label' becomes float32 [B, num_classes]."""

  num_classes: int
  aug: Augment

  def random_map(self, batch, rng: np.random.Generator):
    images, labels = mix_batch(batch["image"], batch["label"], self.num_classes, self.aug, rng)
    return {**batch, "image": images, "label": labels}


# ----------------------------------------------------------------------------
# Opening a prepared split.


def not_prepared_message(name: str, data_dir: str, builder=None) -> str:
  """Explains how to prepare ``name`` into ``data_dir`` as array_record."""
  if builders.is_local(name):
    return (
      f"Dataset '{name}' is not prepared in {data_dir}. Prepare it "
      f"with:\n  python -m vitjax.data.prepare --dataset={name} "
      f"--data_dir={data_dir}"
    )
  cmd = f"tfds build {name} --file_format=array_record --data_dir={data_dir}"
  manual = getattr(builder, "MANUAL_DOWNLOAD_INSTRUCTIONS", None)
  if manual:
    cmd += f" --manual_dir=DIR\n(this dataset needs manually downloaded files in DIR: {manual.strip()})"
  return (
    f"Dataset '{name}' has no array_record files in {data_dir}. It is a "
    f"stock tfds dataset; prepare it with:\n  {cmd}\n(or: python -m "
    f"vitjax.data.prepare --dataset={name} --data_dir={data_dir}; "
    "building stock tfds datasets may need TensorFlow, reading does not)"
  )


def open_split(name: str, split: str, data_dir: str | None = None):
  """Opens a prepared split as a random-access tfds data source.

  Args:
    name: config name (``builders.resolve_name`` maps it to the tfds name).
    split: tfds split string, e.g. ``'train'`` or ``'train[:90%]'``.
    data_dir: tfds data dir (default ``$TFDS_DATA_DIR`` or
      ``~/tensorflow_datasets``).

  Returns:
    (source, builder): ``source[i]`` is a dict of numpy features.

  Raises:
    DatasetNotPreparedError: nothing prepared there; the message gives the
      command that prepares it.
  """
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top

  data_dir = os.path.expanduser(data_dir or builders.default_data_dir())
  try:
    builder = builders.get_builder(name, data_dir)
  except tfds.core.DatasetNotFoundError as e:
    raise DatasetNotPreparedError(
      f"Dataset '{name}' is neither a vitjax dataset "
      f"({sorted(builders.BUILDERS)}) nor a tfds dataset registered or "
      f"prepared in {data_dir}: check the name, or prepare it with `tfds "
      f"build {name} --file_format=array_record --data_dir={data_dir}`."
    ) from e
  if not builder.is_prepared():
    raise DatasetNotPreparedError(not_prepared_message(name, data_dir, builder))
  file_format = builder.info.file_format
  if file_format is not None and str(getattr(file_format, "value", file_format)) != builders.FILE_FORMAT:
    raise DatasetNotPreparedError(
      f"Dataset '{name}' in {builder.data_dir} is stored as {file_format}, "
      "not array_record (needed for random access). " + not_prepared_message(name, data_dir, builder)
    )
  return builder.as_data_source(split=split), builder


def _supervised_keys(builder) -> tuple[str, str]:
  keys = builder.info.supervised_keys
  if keys and isinstance(keys[0], str) and isinstance(keys[1], str):
    return keys[0], keys[1]
  return "image", "label"


def _pair(size: int | Sequence[int]) -> tuple[int, int]:
  if isinstance(size, int):
    return size, size
  height, width = size
  return int(height), int(width)


def _ensure_absl_flags_parsed():
  """grain's worker processes read absl flags (``--grain_*``); outside
  ``absl.app.run`` (pytest, notebooks) flags are unparsed, so use defaults."""
  from absl import flags  # pylint: disable=g-import-not-at-top

  if not flags.FLAGS.is_parsed():
    flags.FLAGS.mark_as_parsed()


def _mix_seed(seed: int) -> int:
  """Spreads a user seed over 31 bits (grain derives per-record rngs as
  ``seed + index``, so nearby user seeds would otherwise share streams)."""
  return int(np.random.SeedSequence(seed).generate_state(1)[0] >> 1)


# ----------------------------------------------------------------------------
# The pipeline.


def make_input(
  name: str,
  split: str,
  *,
  global_batch_size: int,
  image_size: int | Sequence[int],
  train: bool,
  seed: int = 0,
  data_dir: str | None = None,
  augment: Mapping[str, Any] | Any | None = None,
  num_epochs: int | None = None,
  process_index: int | None = None,
  process_count: int | None = None,
  worker_count: int = 0,
  read_threads: int | None = None,
) -> tuple[Iterator[dict[str, np.ndarray]], DatasetInfo]:
  """Builds the grain input pipeline of one split on this process.

  Args:
    name: config name: ``'digits'``, ``'fashion_mnist'``, or a stock tfds name
      prepared as array_record in ``data_dir``.
    split: tfds split string (``'train'``, ``'test'``, ``'train[90%:]'``...).
    global_batch_size: batch size summed over processes.
    image_size: output (H, W), or one int for square images.
    train: True: shard with remainder dropped, seeded shuffle, augment, drop
      the last partial batch, repeat ``num_epochs`` (None = forever). False:
      in order, no augmentation, padded last batch with ``'mask'``, one epoch
      (or ``num_epochs``).
    seed: shuffling and augmentation seed (only used when ``train``).
    data_dir: tfds data dir (default ``$TFDS_DATA_DIR`` or
      ``~/tensorflow_datasets``).
    augment: dict/ConfigDict of :class:`Augment` fields; ignored (but
      validated) when ``train`` is False.
    num_epochs: passes over the split (train default: forever; eval: 1).
    process_index, process_count: this process's shard; default
      ``jax.process_index()`` / ``jax.process_count()``.
    worker_count: grain worker processes (0 = read in this process). Batch
      composition depends on it (each worker builds whole batches from its
      records): keep it fixed across a resume.
    read_threads: reader threads per process (grain default 16; 0 reads
      synchronously, fastest on machines with very few cores).

  Returns:
    (iterator, info): the iterator yields the batches described in the module
    docstring and has ``get_state()`` / ``set_state(state)``.

  Raises:
    DatasetNotPreparedError: the split is not prepared (message has the fix).
    ValueError: bad batch size / sharding / augment keys.
  """
  aug = parse_augment(augment)
  if (process_index is None) != (process_count is None):
    raise ValueError("Give both process_index and process_count, or neither.")
  if process_count is None:
    shard = grain.sharding.ShardByJaxProcess(drop_remainder=train)
    process_index, process_count = shard.shard_index, shard.shard_count
  if not 0 <= process_index < process_count:
    raise ValueError(f"process_index={process_index} not in [0, process_count={process_count})")
  if global_batch_size <= 0 or global_batch_size % process_count:
    raise ValueError(
      f"global_batch_size={global_batch_size} must be a positive multiple of process_count={process_count}."
    )
  local_batch = global_batch_size // process_count
  size = _pair(image_size)

  source, builder = open_split(name, split, data_dir)
  image_key, label_key = _supervised_keys(builder)
  num_classes = builder.info.features[label_key].num_classes
  num_examples = len(source)
  channels = builder.info.features[image_key].shape[-1] or 3

  if train:
    shard = grain.sharding.ShardOptions(process_index, process_count, drop_remainder=True)
    examples = _Examples(source, image_key, label_key)
    sampler = grain.samplers.IndexSampler(
      num_examples, shard_options=shard, shuffle=True, num_epochs=num_epochs, seed=_mix_seed(seed)
    )
    per_process = num_examples // process_count
    steps = per_process // local_batch
    if steps == 0:
      raise ValueError(
        f"{name}[{split}] has {per_process} examples per process, fewer than one batch of {local_batch}."
      )
    operations = [_TrainPreprocess(size, aug), grain.transforms.Batch(local_batch, drop_remainder=True)]
    if aug.mixes:
      operations.append(_MixBatch(num_classes, aug))
  else:
    start = num_examples * process_index // process_count
    end = num_examples * (process_index + 1) // process_count
    steps = math.ceil(math.ceil(num_examples / process_count) / local_batch)
    positions = np.full(steps * local_batch, -1, np.int64)
    positions[: end - start] = np.arange(start, end)
    examples = _Examples(source, image_key, label_key, positions)
    shard = grain.sharding.NoSharding()  # Sharded by `positions` above.
    sampler = grain.samplers.IndexSampler(len(examples), shard_options=shard, shuffle=False, num_epochs=num_epochs or 1)
    operations = [_EvalPreprocess(size), grain.transforms.Batch(local_batch, drop_remainder=False)]

  if worker_count > 0:
    _ensure_absl_flags_parsed()
  read_options = None if read_threads is None else grain.ReadOptions(num_threads=read_threads)
  loader = grain.DataLoader(
    data_source=examples,
    sampler=sampler,
    operations=operations,
    worker_count=worker_count,
    shard_options=shard,
    read_options=read_options,
  )
  info = DatasetInfo(
    name=name,
    split=split,
    num_classes=num_classes,
    num_examples=num_examples,
    image_shape=(*size, channels),
    local_batch_size=local_batch,
    steps_per_epoch=steps,
  )
  return iter(loader), info
