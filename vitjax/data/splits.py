"""Prepared tfds splits: open, describe, hold out a validation subset, draw a class-balanced labelled subset.

Open one (with the command that prepares it when it is missing), read its facts without reading its examples, hold out a
seeded subset of it (how vitjax makes a validation split), and draw a class-balanced labelled subset of it
(``data.labelled``: training with few labels).
"""

from __future__ import annotations

import os
import shlex
from typing import Any

import numpy as np

from vitjax.data import builders, folder, local
from vitjax.errors import DatasetNotPreparedError


def not_prepared_message(name: str, data_dir: str, builder=None) -> str:
  """Explains how to prepare ``name`` into ``data_dir`` as array_record."""
  source = folder.parse(name)
  if source is not None:  # the absolute path: the command then works from any directory
    return (
      f"Dataset '{name}' ({source.abspath}) is not prepared in {data_dir}. Prepare it with:\n  python -m "
      f"vitjax.data.prepare --dataset={shlex.quote(f'{source.kind}:{source.abspath}')} "
      f"--data_dir={shlex.quote(data_dir)}"
    )
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


def open_split(name: str, split: str, data_dir: str | None = None, encoded_images: bool = False):
  """Opens a prepared split as a random-access tfds data source.

  Args:
    name: config name (``builders.resolve_name`` maps it to the tfds name).
    split: tfds split string, e.g. ``'train'`` or ``'train[:90%]'``.
    data_dir: tfds data dir (default ``$TFDS_DATA_DIR`` or
      ``~/tensorflow_datasets``).
    encoded_images: image features come as their stored bytes (JPEG, PNG),
      for the reader to decode (``augment.decode``), not as decoded arrays.

  Returns:
    (source, builder): ``source[i]`` is a dict of numpy features.

  Raises:
    DatasetNotPreparedError: nothing prepared there; the message gives the
      command that prepares it.
  """
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top

  builder = prepared_builder(name, data_dir)
  decoders = None
  if encoded_images:
    features = builder.info.features
    decoders = {k: tfds.decode.SkipDecoding() for k in features if isinstance(features[k], tfds.features.Image)}
  return builder.as_data_source(split=split, decoders=decoders), builder


def prepared_builder(name: str, data_dir: str | None = None):
  """The tfds builder of a prepared array_record dataset (open_split's checks, without opening a split).

  Raises:
    DatasetNotPreparedError: nothing prepared there; the message gives the command that prepares it.
  """
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top

  data_dir = os.path.expanduser(data_dir or local.default_data_dir())
  try:
    builder = builders.get_builder(name, data_dir)
  except tfds.core.DatasetNotFoundError as e:
    raise DatasetNotPreparedError(
      f"Dataset '{name}' is neither a vitjax dataset "
      f"({', '.join(sorted(builders.BUILDERS))}, folder:PATH, csv:FILE) nor a tfds dataset registered or "
      f"prepared in {data_dir}: check the name, or prepare it with `tfds "
      f"build {name} --file_format=array_record --data_dir={data_dir}`."
    ) from e
  if not builder.is_prepared():
    raise DatasetNotPreparedError(not_prepared_message(name, data_dir, builder))
  file_format = builder.info.file_format
  if file_format is not None and str(getattr(file_format, "value", file_format)) != local.FILE_FORMAT:
    raise DatasetNotPreparedError(
      f"Dataset '{name}' in {builder.data_dir} is stored as {file_format}, "
      "not array_record (needed for random access). " + not_prepared_message(name, data_dir, builder)
    )
  return builder


def has_split(name: str, split: str, data_dir: str | None = None) -> bool:
  """Whether the prepared dataset has a split of this exact name.

  E.g. ``has_split("folder:PATH", "valid")`` for a folder with its own ``valid/`` (which a task then reads instead of
  holding out part of ``train``).

  Raises:
    DatasetNotPreparedError: the dataset is not prepared (the message gives the command that prepares it).
  """
  return split in prepared_builder(name, data_dir).info.splits


def _supervised_keys(builder) -> tuple[str, str]:
  keys = builder.info.supervised_keys
  if keys and isinstance(keys[0], str) and isinstance(keys[1], str):
    return keys[0], keys[1]
  return "image", "label"


def holdout_split(num_examples: int, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
  """(kept, held-out) positions of a split: how vitjax makes a validation split from a training split.

  ``round(fraction * num_examples)`` positions drawn with ``np.random.default_rng(seed).permutation(num_examples)`` are
  held out (the first ones of the permutation); both are returned sorted.
  """
  n_out = int(round(fraction * num_examples))
  if not 0 <= n_out < num_examples:
    raise ValueError(f"cannot hold out {fraction:g} of {num_examples} examples")
  perm = np.random.default_rng(seed).permutation(num_examples)
  return np.sort(perm[n_out:]), np.sort(perm[:n_out])


def split_labels(name: str, split: str, data_dir: str | None = None) -> np.ndarray:
  """The labels int64 [N] of a prepared split, in order (its images are read, not decoded)."""
  source, builder = open_split(name, split, data_dir, encoded_images=True)
  _, label_key = _supervised_keys(builder)
  labels = np.zeros(len(source), np.int64)
  for start in range(0, len(source), 4096):
    rows = source.__getitems__(list(range(start, min(start + 4096, len(source)))))
    labels[start : start + len(rows)] = [int(r[label_key]) for r in rows]
  return labels


def labelled_count(amount: Any, num_examples: int) -> int:
  """How many examples `amount` (``data.labelled``) keeps of `num_examples`.

  A fraction in (0, 1] of them, or a count (an int >= 1, or a string "600" / "1%"). ValueError naming the field
  otherwise.
  """
  value = amount
  if isinstance(value, str):
    text = value.strip()
    try:
      value = float(text[:-1]) / 100 if text.endswith("%") else (int(text) if text.isdigit() else float(text))
    except ValueError:
      value = None
  if isinstance(value, bool) or not isinstance(value, int | float):
    raise ValueError(f"data.labelled={amount!r}: give a fraction in (0, 1] (0.01), a percentage ('1%') or a count")
  if isinstance(value, float) and value <= 1:
    if value <= 0:
      raise ValueError(f"data.labelled={amount!r}: a fraction must be in (0, 1]")
    return max(int(round(value * num_examples)), 1)
  if not float(value).is_integer() or not 1 <= value <= num_examples:
    raise ValueError(f"data.labelled={amount!r}: a count must be in [1, {num_examples}], the training examples")
  return int(value)


def labelled_subset(labels: np.ndarray, amount: Any, seed: int) -> np.ndarray:
  """Sorted positions into `labels` of a class-balanced subset of ``labelled_count(amount, len(labels))`` examples.

  The same number of each class present (the remainder to the first classes), drawn within each class by
  ``np.random.default_rng(seed)``. ValueError when a class has fewer examples than its share.
  """
  labels = np.asarray(labels)
  n = labelled_count(amount, len(labels))
  classes = np.unique(labels)
  if n < len(classes):
    raise ValueError(f"data.labelled={amount!r} keeps {n} examples, fewer than the {len(classes)} classes")
  rng = np.random.default_rng(seed)
  share, extra = divmod(n, len(classes))
  chosen = []
  for i, c in enumerate(classes):
    members = np.flatnonzero(labels == c)
    k = share + (i < extra)
    if k > len(members):
      raise ValueError(
        f"data.labelled={amount!r} wants {k} examples of class {c}, which has {len(members)}: give fewer"
      )
    chosen.append(rng.permutation(members)[:k])
  return np.sort(np.concatenate(chosen))


def split_info(name: str, split: str, data_dir: str | None = None) -> dict[str, Any]:
  """What a model needs to know of a prepared split, without reading it.

  ``{'num_examples', 'num_classes', 'class_names', 'channels'}``.
  """
  source, builder = open_split(name, split, data_dir)
  image_key, label_key = _supervised_keys(builder)
  label = builder.info.features[label_key]
  names = list(label.names) if getattr(label, "names", None) else None
  if names and names == [str(i) for i in range(label.num_classes)]:
    names = None
  return {
    "num_examples": len(source),
    "num_classes": int(label.num_classes),
    "class_names": names,
    "channels": int(builder.info.features[image_key].shape[-1] or 3),
  }
