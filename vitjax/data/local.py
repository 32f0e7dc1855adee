"""The base of the tfds builders vitjax prepares itself: array_record files, written without TensorFlow.

The builders: builders.py (digits, Fashion-MNIST) and folder.py (a user's images). Images arrive encoded, PNG or JPEG
bytes.
"""

from __future__ import annotations

import inspect
import io
import os

import numpy as np
import PIL.Image
import tensorflow_datasets as tfds
from etils import epath

FILE_FORMAT = "array_record"


def default_data_dir() -> str:
  """``$TFDS_DATA_DIR`` if set, else ``~/tensorflow_datasets``."""
  return os.path.expanduser(os.environ.get("TFDS_DATA_DIR", "~/tensorflow_datasets"))


def encode_png(image: np.ndarray) -> bytes:
  """PNG-encodes a uint8 image of shape [H, W, C] (C in 1, 3, 4) with PIL."""
  if image.dtype != np.uint8 or image.ndim != 3:
    raise ValueError(f"Expected uint8 [H, W, C], got {image.dtype} {image.shape}")
  pil = PIL.Image.fromarray(image[..., 0] if image.shape[-1] == 1 else image)
  buf = io.BytesIO()
  pil.save(buf, format="png")
  return buf.getvalue()


def features(shape: tuple[int, int, int], names=None, num_classes=None):
  """The tfds features of an image classification dataset.

  Args:
    shape: the images' (H, W, C); an image feature is uint8 [H, W, C].
    names: the class names (a ClassLabel by name), or None.
    num_classes: the number of classes when `names` is None.

  Returns:
    tfds.features.FeaturesDict: {"image": Image, "label": ClassLabel}.
  """
  return tfds.features.FeaturesDict(
    {
      "image": tfds.features.Image(shape=shape, dtype=np.uint8),
      "label": tfds.features.ClassLabel(names=names, num_classes=num_classes),
    }
  )


class Info(tfds.core.DatasetInfo):
  """The DatasetInfo of vitjax's own builders: tfds' own, but never looked up in tfds' GCS bucket.

  tfds asks the bucket for the info of every builder whose dataset is not prepared yet. None of vitjax's datasets is
  there, and each time tfds left an empty ``tmp*tfds`` directory in the system's temporary directory.
  """

  def initialize_from_bucket(self) -> None:
    """Nothing to look up: the info is the builder's own until it is prepared."""


class _ThisFile:
  """Descriptor giving a builder's ``code_path`` as the file defining it.

  tfds' default goes through ``importlib_resources`` for packages that are
  not plain directories (namespace packages, editable installs), a module
  that is not always installed; the answer is the same.
  """

  def __get__(self, obj, objtype=None):
    return epath.Path(inspect.getfile(objtype or type(obj)))


class LocalBuilder(tfds.core.GeneratorBasedBuilder, skip_registration=True):
  """Base of the builders that vitjax prepares itself."""

  code_path = _ThisFile()
