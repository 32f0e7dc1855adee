"""Grain input pipeline for image classification, numpy/PIL only (no TF).

Entry point: :func:`make_input` returns ``(iterator, DatasetInfo)``. Batches::

  {'image': uint8 [B, H, W, C]  (the device normalises it and applies Mixup/CutMix
                                inside the jitted step: vitjax.data.device_ops),
   'label': int32 [B],
   'mask':  bool [B]   True for real examples (all True when training),
   'index': int32 [B]  position of the example in the split (-1 for padding)}

with ``B = global_batch_size // process_count``. The training iterator has
``get_state()`` / ``set_state(state)``: ``{"batches": n}``, the global batches
read so far, the same on every process.

Training: one sequence of global batches for the whole run, which depends only
on the seed and the global batch size (:class:`GlobalOrder`): each epoch is a
seeded permutation of the split cut into global batches (the last partial one
dropped), and process ``p`` of ``P`` reads rows ``[p * B, (p + 1) * B)`` of each.
Each example is augmented with an rng drawn from the seed and its position in
that sequence (grain ``RandomMap``). So 1 process x 4 devices and 2 processes x 2
devices train on the same batches, read in the process or by any number of grain
workers, and a checkpoint resumes on any number of processes and workers.
Mixup/CutMix is not applied here: the training step applies it on the device
(the batch per process must be even, as it pairs neighbouring rows).
A validation split is a seeded subset of the training split (:func:`holdout_split`,
passed as ``subset``); training then reads the rest.
Evaluation: no shuffling, no augmentation, one pass (unless ``num_epochs``);
every process yields the same number of batches, ``ceil(ceil(N / P) / B)``, the
tail padded with masked copies, so each example is counted exactly once.

Augmentations (``augment`` dict or ConfigDict, used only when ``train=True``;
see :class:`Augment` for keys and defaults): resize to ``image_size`` (always),
Inception random-resized crop, horizontal flip, RandAugment (per image, on the
host); per-batch Mixup / CutMix happens on the device.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import grain
import numpy as np
from absl import logging

from vitjax.data.augment import (
  Augment,
  Preprocess,
  decode,
  encoded_shape,
  is_jpeg,
  parse_augment,
  preprocess_eval,
  randaugment,
  random_resized_crop_box,
  resize,
)
from vitjax.data.splits import _supervised_keys, open_split


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
# Grain data sources and transforms (top-level classes: picklable for workers).


class _Examples:
  """Random-access source of ``{'image': bytes, 'label': int, 'index': int, 'mask': bool}`` over ``positions``.

  The tfds data source is opened with ``encoded_images=True``: images stay encoded (JPEG, PNG) until the preprocessing
  decodes them, which for a crop can decode a JPEG at a reduced DCT scale (``augment.decode``).

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
      pos = _padding_position(self._positions)
    example = self._source[pos]
    image = example[self._image_key]
    image = image if isinstance(image, np.ndarray) else bytes(image)
    return {"image": image, "label": int(example[self._label_key]), "index": pos if real else -1, "mask": real}

  def __repr__(self) -> str:
    return f"_Examples({self._source!r}, n={len(self)})"


def _padding_position(positions: np.ndarray) -> int:
  """The example that pads a shard (``-1`` in ``positions``): the shard's first, or example 0 for an empty shard."""
  return int(positions[0]) if positions[0] >= 0 else 0


class _InMemory:
  """The examples at ``positions`` of a tfds source (and the padding one, ``_padding_position``), read once into memory.

  ``source[pos]`` as the source gives it, except that images other than JPEGs (PNG, ...) come decoded, uint8 [H, W,
  channels], so that the preprocessing skips their decoding. JPEGs stay encoded: how one is decoded depends on its crop
  (``augment.decode``). Batches are those of the source itself; only the time to make them changes. Images of one shape
  are held as one [N, H, W, C] array (one buffer for grain workers to copy).
  """

  def __init__(self, source, image_key: str, label_key: str, positions: np.ndarray, channels: int):
    self._keys, self._len = (image_key, label_key), len(source)
    positions = np.asarray(positions, np.int64)
    padding = [_padding_position(positions)] if (positions < 0).any() else []
    wanted = np.unique(np.concatenate([positions[positions >= 0], padding]))
    self._rows = np.full(len(source), -1, np.int64)
    self._rows[wanted.astype(np.int64)] = np.arange(len(wanted))
    images, labels = [], np.zeros(len(wanted), np.int64)
    for start in range(0, len(wanted), 1024):
      chunk = [int(p) for p in wanted[start : start + 1024]]
      for i, example in enumerate(source.__getitems__(chunk), start):
        image = bytes(example[image_key])
        images.append(image if is_jpeg(image) else decode(image, channels)[0])
        labels[i] = int(example[label_key])
    shapes = {x.shape if isinstance(x, np.ndarray) else None for x in images}
    self._images = np.stack(images) if images and None not in shapes and len(shapes) == 1 else images
    self._labels = labels
    self.nbytes = sum(x.nbytes if isinstance(x, np.ndarray) else len(x) for x in images)
    self.count = len(images)

  def __len__(self) -> int:
    return self._len

  def __getitem__(self, pos: int) -> dict[str, Any]:
    row = self._rows[pos]
    if row < 0:
      raise KeyError(f"position {pos} was not read into memory (data.cache)")
    return {self._keys[0]: self._images[row], self._keys[1]: self._labels[row]}

  def __repr__(self) -> str:
    return f"_InMemory({self.count} of {self._len} examples, {self.nbytes / 2**20:.1f} MiB)"


def _finish(example: dict[str, Any], image: np.ndarray) -> dict[str, Any]:
  """The output example around a preprocessed uint8 image."""
  return {
    "image": image,
    "label": np.int32(example["label"]),
    "mask": np.bool_(example["mask"]),
    "index": np.int32(example["index"]),
  }


@dataclasses.dataclass(frozen=True)
class _EvalPreprocess(grain.transforms.Map):
  """Decode at full size, resize (or resize and centre-crop) to ``size``.

  As augment.preprocess_eval does, which prediction uses too.
  """

  size: tuple[int, int]
  channels: int
  pre: Preprocess | None = None

  def map(self, example):
    image, _ = decode(example["image"], self.channels)
    return _finish(example, preprocess_eval(image, self.size, self.pre))


@dataclasses.dataclass(frozen=True)
class _TrainPreprocess(grain.transforms.RandomMap):
  """Random-resized crop (or resize), flip, RandAugment.

  The crop is drawn from the encoded image's header, so that the decoder can skip the resolution the crop's resize would
  throw away.
  """

  size: tuple[int, int]
  channels: int
  aug: Augment

  def random_map(self, example, rng: np.random.Generator):
    box = None
    if self.aug.random_resized_crop is not None:
      box = random_resized_crop_box(rng, *encoded_shape(example["image"]), *self.aug.random_resized_crop)
    image, box = decode(example["image"], self.channels, box, self.size)
    image = resize(image, self.size, box=box)
    if self.aug.flip and rng.random() < 0.5:
      image = image[:, ::-1]
    if self.aug.randaugment is not None:
      image = randaugment(np.ascontiguousarray(image), rng, *self.aug.randaugment)
    return _finish(example, np.ascontiguousarray(image))


def epoch_order(seed: int, epoch: int, num_examples: int) -> np.ndarray:
  """The examples of one training epoch in order: a permutation of range(num_examples) drawn from (seed, epoch)."""
  return np.random.default_rng([seed, epoch]).permutation(num_examples)


class GlobalOrder:
  """A grain sampler: record key k of process p -> an example of the run's sequence of global batches.

  The example at position ``g = (start + j) * G + p * B + r`` (G examples per global batch, B = G / P per process) is
  row r of this process's batch j; epoch e is the permutation of the N examples drawn from (seed, e), cut into N // G
  batches. The example's rng comes from (seed, g): independent of P and of where the run resumed. Read in this
  process (``workers`` 0 or 1), key k is row ``k % B`` of batch ``k // B``. grain's W worker processes take the keys
  w, w + W, w + 2W, ... each and batch them in turn, then yield their batches in turn: so with W > 1 worker w's i-th
  B keys are batch ``i * W + w``, and the batches come out in the same order, with the same rows, for any W.
  """

  def __init__(
    self, num_examples, global_batch, process_index, process_count, seed, start=0, num_epochs=None, workers=0
  ):
    self.n, self.global_batch, self.start = num_examples, global_batch, start
    self.local_batch = global_batch // process_count
    self.process_index, self.seed = process_index, seed
    self.steps_per_epoch = num_examples // global_batch
    self.num_epochs = num_epochs
    self.workers = max(int(workers), 1)
    self._perm = (None, None)

  def batches(self) -> int | None:
    """The batches left to read (from `start`); None: endless."""
    return None if self.num_epochs is None else max(self.num_epochs * self.steps_per_epoch - self.start, 0)

  def __len__(self) -> int:
    left = self.batches()
    if left is None:
      return 2**62
    return -(-left // self.workers) * self.workers * self.local_batch  # whole rounds of W batches (the last cut short)

  def __getitem__(self, k: int) -> grain.RecordMetadata:
    if k < 0 or k >= len(self):
      raise IndexError(k)
    if self.workers > 1:  # key k = w + W * (i * B + row) is worker w's i-th batch's row
      q, w = divmod(k, self.workers)
      i, row = divmod(q, self.local_batch)
      batch = i * self.workers + w
    else:
      batch, row = divmod(k, self.local_batch)
    batch += self.start
    epoch, b = divmod(batch, self.steps_per_epoch)
    if self._perm[0] != epoch:
      self._perm = (epoch, epoch_order(self.seed, epoch, self.n))
    offset = self.process_index * self.local_batch + row  # in the global batch
    index = int(self._perm[1][b * self.global_batch + offset])
    g = batch * self.global_batch + offset
    return grain.RecordMetadata(index=k, record_key=index, rng=np.random.Generator(np.random.Philox([self.seed, g])))

  def __repr__(self) -> str:
    return (
      f"GlobalOrder(n={self.n}, global_batch={self.global_batch}, process={self.process_index}, "
      f"local_batch={self.local_batch}, seed={self.seed}, start={self.start}, num_epochs={self.num_epochs}, "
      f"workers={self.workers})"
    )


class _GlobalBatches:
  """The training iterator: grain batches in GlobalOrder; its state is the global batches read."""

  def __init__(self, make_loader, sampler: GlobalOrder):
    self._make, self._sampler = make_loader, sampler
    self._start()

  def _start(self) -> None:
    self._batches, left = self._sampler.start, self._sampler.batches()
    self._end = None if left is None else self._batches + left  # (workers read up to a whole round past it)
    self._it = iter(self._make(self._sampler))

  def __iter__(self):
    return self

  def __next__(self):
    if self._end is not None and self._batches >= self._end:
      raise StopIteration
    batch = next(self._it)
    self._batches += 1
    return batch

  def get_state(self) -> dict:
    return {"batches": self._batches}

  def set_state(self, state: dict) -> None:
    if "batches" not in state:
      raise ValueError(
        "the checkpoint's data position was written by an older vitjax (per-process grain state); "
        "resume it with that version, or start again in a new workdir"
      )
    if state.get("on_device"):
      logging.info("data.on_device: the checkpoint's batches were made on the devices; same order, other crop draws")
    self._sampler.start = int(state["batches"])
    self._start()


def image_pair(size: int | Sequence[int]) -> tuple[int, int]:
  """image_size as (H, W); ValueError of one line for anything but one whole number >= 1 or a pair of them."""
  pair = (size, size) if isinstance(size, (int, np.integer)) else tuple(size) if isinstance(size, Sequence) else ()
  if (
    isinstance(size, str)
    or len(pair) != 2
    or not all(isinstance(n, (int, np.integer)) and not isinstance(n, bool) and n >= 1 for n in pair)
  ):
    raise ValueError(f"image_size={size!r}: give one whole number >= 1 (square images) or an (H, W) pair of them")
  return int(pair[0]), int(pair[1])


def _ensure_absl_flags_parsed():
  """Marks absl's flags parsed where they are not, so that grain's worker processes use their defaults.

  grain's worker processes read absl flags (``--grain_*``); outside ``absl.app.run`` (pytest, notebooks) flags are
  unparsed, so use defaults.
  """
  from absl import flags  # pylint: disable=g-import-not-at-top

  if not flags.FLAGS.is_parsed():
    flags.FLAGS.mark_as_parsed()


def _cache(source, image_key, label_key, positions, channels) -> _InMemory:
  start = time.perf_counter()
  cached = _InMemory(source, image_key, label_key, positions, channels)
  logging.info(
    "data.cache: %s examples in memory (%.1f MiB) after %.0f s",
    f"{cached.count:,}",
    cached.nbytes / 2**20,
    time.perf_counter() - start,
  )
  return cached


def memory_estimate(builder, image_key: str, num_examples: int) -> float:
  """Bytes that ``num_examples`` examples take in memory (_InMemory).

  The larger of the decoded image (when the dataset's image shape is fixed) and the stored example (the prepared files'
  size per example).
  """
  info = builder.info
  total = sum(s.num_examples for s in info.splits.values())
  stored = info.dataset_size / total if total else 0.0
  shape = info.features[image_key].shape
  decoded = float(np.prod(shape)) if shape and None not in shape else 0.0
  return num_examples * max(stored, decoded)


def mix_seed(seed: int) -> int:
  """Spreads a user seed over 31 bits.

  grain derives per-record rngs as ``seed + index``, so nearby user seeds would otherwise share streams.
  """
  return int(np.random.SeedSequence(seed).generate_state(1)[0] >> 1)


# ----------------------------------------------------------------------------
# The pipeline.


def _process_shard(process_index: int | None, process_count: int | None, train: bool) -> tuple[int, int]:
  """(this process's index, the number of processes): as given, or jax's."""
  if (process_index is None) != (process_count is None):
    raise ValueError("Give both process_index and process_count, or neither.")
  if process_count is None:
    shard = grain.sharding.ShardByJaxProcess(drop_remainder=train)
    process_index, process_count = shard.shard_index, shard.shard_count
  if not 0 <= process_index < process_count:
    raise ValueError(f"process_index={process_index} not in [0, process_count={process_count})")
  return process_index, process_count


class Split:
  """One prepared split (or the `subset` of its positions): its source, keys and sizes."""

  def __init__(self, name: str, split: str, data_dir: str | None, subset: np.ndarray | None):
    self.label = f"{name}[{split}]"
    self.source, self.builder = open_split(name, split, data_dir, encoded_images=True)
    self.image_key, self.label_key = _supervised_keys(self.builder)
    self.num_classes = self.builder.info.features[self.label_key].num_classes
    self.channels = self.builder.info.features[self.image_key].shape[-1] or 3
    if subset is not None:
      subset = np.asarray(subset, np.int64)
      if len(subset) and (subset.min() < 0 or subset.max() >= len(self.source)):
        raise ValueError(f"subset positions must lie in [0, {len(self.source)})")
    self.subset = subset
    self.num_examples = len(self.source) if subset is None else len(subset)

  def limit(self, count: int) -> None:
    """Keeps the first `count` examples (of the subset, if any)."""
    if not isinstance(count, (int, np.integer)) or isinstance(count, bool) or count < 1:
      raise ValueError(f"limit={count!r} must be a whole number, at least 1 (or None: every example)")
    positions = np.arange(len(self.source)) if self.subset is None else self.subset
    self.subset = np.asarray(positions[:count], np.int64)
    self.num_examples = len(self.subset)

  def examples(self, positions: np.ndarray | None, cache: bool) -> _Examples:
    """The examples at `positions` (None: all, or the subset), read into memory first when `cache`."""
    source = self.source
    if cache:
      wanted = positions if positions is not None else np.arange(len(source))
      source = _cache(source, self.image_key, self.label_key, wanted, self.channels)
    return _Examples(source, self.image_key, self.label_key, positions)


def _fits_in_memory(split: Split, worker_count: int, cache_max_mb: float) -> bool:
  """cache=None: whether (1 + worker_count) copies of the split's decoded examples fit in cache_max_mb."""
  estimate = memory_estimate(split.builder, split.image_key, split.num_examples) * (1 + worker_count)
  if estimate <= cache_max_mb * 2**20:
    return True
  logging.info(
    "data.cache: not cached (about %.0f MiB for %d copies, over data.cache_max_mb=%g)",
    estimate / 2**20,
    1 + worker_count,
    cache_max_mb,
  )
  return False


def _train_order(split: Split, shards, size, aug: Augment, seed: int, num_epochs, workers: int):
  """Training: (positions read, the GlobalOrder sampler, the operations).

  A seeded global shuffle of which each process takes its rows, augmentation, whole batches.
  """
  process_index, process_count, local_batch = shards
  global_batch = local_batch * process_count
  if aug.mixes and local_batch % 2:
    raise ValueError(
      f"Mixup/CutMix pairs neighbouring examples: the batch per process ({local_batch}) must be even; use a "
      f"global batch size that is a multiple of {2 * process_count}"
    )
  sampler = GlobalOrder(
    split.num_examples, global_batch, process_index, process_count, seed, num_epochs=num_epochs, workers=workers
  )
  if sampler.steps_per_epoch == 0:
    raise ValueError(f"{split.label} has {split.num_examples} examples, fewer than one batch of {global_batch}.")
  operations = [_TrainPreprocess(size, split.channels, aug), grain.transforms.Batch(local_batch, drop_remainder=True)]
  return split.subset, sampler, operations


def _eval_order(split: Split, shards, size, preprocess: Preprocess | None):
  """Evaluation: (positions read, the operations).

  This process's contiguous share in order, padded to whole batches with -1 (masked), resized / cropped, no
  augmentation.
  """
  process_index, process_count, local_batch = shards
  n = split.num_examples
  start, end = n * process_index // process_count, n * (process_index + 1) // process_count
  steps = math.ceil(math.ceil(n / process_count) / local_batch)
  positions = np.full(steps * local_batch, -1, np.int64)
  positions[: end - start] = np.arange(start, end) if split.subset is None else split.subset[start:end]
  operations = [
    _EvalPreprocess(size, split.channels, preprocess),
    grain.transforms.Batch(local_batch, drop_remainder=False),
  ]
  return positions, operations


def _loader(examples, operations, shard, worker_count: int, read_threads: int | None, sampler) -> grain.DataLoader:
  if worker_count > 0:
    _ensure_absl_flags_parsed()
  read_options = None if read_threads is None else grain.ReadOptions(num_threads=read_threads)
  return grain.DataLoader(
    data_source=examples,
    sampler=sampler,
    operations=operations,
    worker_count=worker_count,
    shard_options=shard,
    read_options=read_options,
  )


def _train_or_eval_order(split_, shards, size, aug, seed, num_epochs, worker_count, preprocess, train: bool):
  """(positions, sampler, operations, steps per epoch) of _train_order or _eval_order (sampler None: the caller's)."""
  if train:
    positions, sampler, operations = _train_order(split_, shards, size, aug, mix_seed(seed), num_epochs, worker_count)
    return positions, sampler, operations, sampler.steps_per_epoch
  positions, operations = _eval_order(split_, shards, size, preprocess)
  return positions, None, operations, len(positions) // shards[2]


def _check_names(name, split) -> None:
  """ValueError unless the dataset's name and split are non-empty strings."""
  for arg, value in (("name", name), ("split", split)):
    if not isinstance(value, str) or not value:
      raise ValueError(f"{arg}={value!r}: give the dataset's {arg} as a str (e.g. name='digits', split='train')")


def _local_batch(global_batch_size, process_count: int) -> int:
  """This process's share of the global batch; ValueError unless it is a positive multiple of process_count."""
  if (
    not isinstance(global_batch_size, (int, np.integer)) or global_batch_size <= 0 or global_batch_size % process_count
  ):
    raise ValueError(
      f"global_batch_size={global_batch_size} must be a positive multiple of process_count={process_count}."
    )
  return global_batch_size // process_count


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
  subset: np.ndarray | None = None,
  preprocess: Preprocess | None = None,
  cache: bool | None = False,
  cache_max_mb: float = 1024,
  limit: int | None = None,
) -> tuple[Iterator[dict[str, np.ndarray]], DatasetInfo]:
  """Builds the grain input pipeline of one split on this process.

  Long for its 18 documented arguments; the body reads as the pipeline's order.

  Args:
    name: config name: 'digits', 'fashion_mnist', or a stock tfds name prepared as array_record in `data_dir`.
    split: tfds split string ('train', 'test', 'train[90%:]', ...).
    global_batch_size: batch size summed over processes.
    image_size: output (H, W), or one int for square images.
    train: True (_train_order): seeded global shuffle, augmentation, the last partial batch dropped, `num_epochs`
      passes (None: forever). False (_eval_order): in order, no augmentation, the last batch padded (its 'mask'),
      one pass (or `num_epochs`).
    seed: shuffling and augmentation seed (train only).
    data_dir: default $TFDS_DATA_DIR or ~/tensorflow_datasets.
    augment: a dict / ConfigDict of `Augment` fields; validated, and used when `train`.
    num_epochs: passes over the split; None: forever in training, one pass in evaluation.
    process_index: this process's shard; default jax.process_index().
    process_count: the number of shards; default jax.process_count().
    worker_count: grain worker processes (0: read in this process). Training batches do not depend on it (each
      worker builds whole batches of the GlobalOrder, in turn), so a run may resume with another.
    read_threads: reader threads per process (grain default 16; 0 reads synchronously, fastest on few cores).
    subset: positions in the split to read (e.g. one side of `holdout_split`); None: all. Batches' 'index' stays
      the position in the whole split.
    preprocess: the evaluation's resize / centre crop (augment.Preprocess; when `train` is False).
    cache: read the examples this process needs into memory first, non-JPEG images decoded (`_InMemory`): the
      same batches, faster, for datasets that fit in memory (Fashion-MNIST: 40 MiB). None: when
      `memory_estimate` times (1 + worker_count) copies is at most `cache_max_mb`.
    cache_max_mb: the memory, in MiB, that cache=None lets the copies take.
    limit: evaluation only: the first `limit` examples of the split (or of `subset`), shared among the processes
      as the whole split would be; None: all. The same examples on any number of processes or devices.

  Returns:
    (iterator, info): the iterator yields the batches of the module docstring and has get_state() / set_state().

  Raises:
    DatasetNotPreparedError: the split is not prepared (the message has the fix).
    ValueError: bad name, split, image size, batch size / sharding, augment keys.
  """
  _check_names(name, split)
  size, aug = image_pair(image_size), parse_augment(augment)
  process_index, process_count = _process_shard(process_index, process_count, train)
  local_batch = _local_batch(global_batch_size, process_count)
  split_ = Split(name, split, data_dir, subset)
  if limit is not None and not train:
    split_.limit(limit)
  cache = _fits_in_memory(split_, worker_count, cache_max_mb) if cache is None else cache
  shards = (process_index, process_count, local_batch)
  positions, sampler, operations, steps = _train_or_eval_order(
    split_, shards, size, aug, seed, num_epochs, worker_count, preprocess, train
  )
  examples = split_.examples(positions, cache)
  shard = grain.sharding.NoSharding()  # sharded by GlobalOrder (train) or by `positions` (eval)
  if sampler is None:
    sampler = grain.samplers.IndexSampler(len(examples), shard_options=shard, shuffle=False, num_epochs=num_epochs or 1)
  make_loader = functools.partial(_loader, examples, operations, shard, worker_count, read_threads)
  info = DatasetInfo(name, split, split_.num_classes, split_.num_examples, (*size, split_.channels), local_batch, steps)
  if train:
    return _GlobalBatches(make_loader, sampler), info
  return iter(make_loader(sampler)), info
