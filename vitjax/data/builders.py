"""TFDS builders for small local image datasets, and dataset-name resolution.

Both builders write ``array_record`` files and need no TensorFlow: images are
PNG-encoded with PIL before they reach tfds (tfds only needs TF to encode raw
numpy images), and reading goes through ``tfds.data_source``/PIL.

Short names used in configs are mapped to builders by :func:`resolve_name`:

=================  ======================  =====================================
config name        registered tfds name    source
=================  ======================  =====================================
``digits``         ``digits``              ``sklearn.datasets.load_digits()``
``fashion_mnist``  ``fashion_mnist_deb``   Debian ``dataset-fashion-mnist`` IDX
``folder:PATH``    ``image_folder/<cfg>``  ``PATH/CLASS/*`` (vitjax.data.folder)
``csv:FILE``       ``image_folder/<cfg>``  ``path,label`` rows (vitjax.data.folder)
anything else      unchanged               stock tfds dataset read from data_dir
=================  ======================  =====================================

``<cfg>`` is the source's base name and a hash of its absolute path (``folder.Source.config_name``).
"""

from __future__ import annotations

import gzip
import os

import numpy as np
import tensorflow_datasets as tfds

from vitjax.data import folder
from vitjax.data.local import FILE_FORMAT, Info, LocalBuilder, encode_png, features

DEBIAN_FASHION_MNIST_DIR = "/usr/share/datasets/fashion-mnist"

_FASHION_MNIST_CLASSES = (
  "T-shirt/top",
  "Trouser",
  "Pullover",
  "Dress",
  "Coat",
  "Sandal",
  "Shirt",
  "Sneaker",
  "Bag",
  "Ankle boot",
)


def digits_split_indices(num_examples: int = 1797, num_test: int = 300, seed: int = 0) -> dict[str, np.ndarray]:
  """Held-out split of ``load_digits``: a seeded plain permutation.

  ``np.random.default_rng(seed).permutation(num_examples)``; the first
  ``num_test`` indices are ``test``, the rest ``train`` (both sorted).
  """
  perm = np.random.default_rng(seed).permutation(num_examples)
  return {"test": np.sort(perm[:num_test]), "train": np.sort(perm[num_test:])}


class Digits(LocalBuilder):
  """scikit-learn's 8x8 handwritten digits (1,797 scans) as a tfds dataset.

  Features: ``image`` uint8 [8, 8, 1], ``round(v * 255 / 16)`` of the 0..16
  pixel counts; ``label`` ClassLabel(10).

  Splits (fixed, seed 0): ``perm = np.random.default_rng(0).permutation(1797)``;
  ``test`` = ``perm[:300]`` (300 scans), ``train`` = ``perm[300:]`` (1,497
  scans). Example keys are the row indices into ``load_digits()``.
  """

  name = "digits"
  VERSION = tfds.core.Version("1.0.0")
  RELEASE_NOTES = {"1.0.0": "Initial release: 1497 train / 300 test."}

  def _info(self) -> Info:
    return Info(
      builder=self,
      description=self.__doc__,
      features=features((8, 8, 1), num_classes=10),
      supervised_keys=("image", "label"),
      homepage="https://scikit-learn.org/stable/datasets/toy_dataset.html",
    )

  def _split_generators(self, dl_manager):
    del dl_manager  # sklearn ships the data: nothing to download.
    from sklearn.datasets import load_digits  # pylint: disable=g-import-not-at-top

    digits = load_digits()
    images = np.round(digits.images * (255.0 / 16.0)).astype(np.uint8)[..., None]
    labels = digits.target.astype(np.int64)
    return {
      split: self._generate_examples(images, labels, idx) for split, idx in digits_split_indices(len(labels)).items()
    }

  def _generate_examples(self, images, labels, indices):
    for i in indices:
      yield int(i), {"image": encode_png(images[i]), "label": int(labels[i])}


def read_idx(path: str) -> np.ndarray:
  """Reads an IDX file (optionally ``.gz``) into a numpy array (uint8 data)."""
  opener = gzip.open if path.endswith(".gz") else open
  with opener(path, "rb") as f:
    data = f.read()
  zero, dtype_code, ndim = data[0] * 256 + data[1], data[2], data[3]
  if zero != 0 or dtype_code != 0x08:
    raise ValueError(f"{path}: not an unsigned-byte IDX file")
  shape = tuple(int.from_bytes(data[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim))
  return np.frombuffer(data, np.uint8, offset=4 + 4 * ndim).reshape(shape)


def _find_idx(directory: str, stem: str) -> str | None:
  for name in (stem, stem + ".gz"):
    path = os.path.join(directory, name)
    if os.path.isfile(path):
      return path
  return None


_FASHION_FILES = {
  "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
  "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}


def fashion_mnist_missing_message(directory: str) -> str:
  """The error message for Fashion-MNIST IDX files missing from `directory`: how to install them, or --manual_dir."""
  return (
    f"Fashion-MNIST IDX files (train-images-idx3-ubyte[.gz], ...) not "
    f"found in {directory}. Install them with `apt-get install "
    f"dataset-fashion-mnist` (files land in {DEBIAN_FASHION_MNIST_DIR}), "
    "or pass --manual_dir=DIR holding the four IDX files."
  )


def fashion_mnist_available(directory: str = DEBIAN_FASHION_MNIST_DIR) -> bool:
  """Whether all four Fashion-MNIST IDX files are in ``directory``."""
  return all(_find_idx(directory, s) for pair in _FASHION_FILES.values() for s in pair)


class FashionMnistDeb(LocalBuilder):
  """Fashion-MNIST (Zalando) read from local IDX files, e.g. Debian's package.

  ``manual_dir`` holds ``{train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz]``;
  it defaults to ``/usr/share/datasets/fashion-mnist`` (``apt-get install
  dataset-fashion-mnist``). Features: ``image`` uint8 [28, 28, 1], ``label``
  ClassLabel(10). Splits: the official ``train`` (60,000) / ``test`` (10,000).
  """

  name = "fashion_mnist_deb"
  VERSION = tfds.core.Version("1.0.0")
  RELEASE_NOTES = {"1.0.0": "Initial release."}
  MANUAL_DOWNLOAD_INSTRUCTIONS = (
    "`apt-get install dataset-fashion-mnist` (default manual_dir "
    f"{DEBIAN_FASHION_MNIST_DIR}), or put the four IDX files in manual_dir."
  )

  def _info(self) -> Info:
    return Info(
      builder=self,
      description=self.__doc__,
      features=features((28, 28, 1), names=list(_FASHION_MNIST_CLASSES)),
      supervised_keys=("image", "label"),
      homepage="https://github.com/zalandoresearch/fashion-mnist",
    )

  def _split_generators(self, dl_manager):
    try:
      directory = os.fspath(dl_manager.manual_dir)
    except AssertionError:  # No manual_dir given and tfds' default is empty.
      directory = DEBIAN_FASHION_MNIST_DIR
    if not fashion_mnist_available(directory):
      raise FileNotFoundError(fashion_mnist_missing_message(directory))
    return {
      split: self._generate_examples(_find_idx(directory, images), _find_idx(directory, labels))
      for split, (images, labels) in _FASHION_FILES.items()
    }

  def _generate_examples(self, images_path, labels_path):
    images, labels = read_idx(images_path), read_idx(labels_path)
    if len(images) != len(labels):
      raise ValueError(f"{images_path} and {labels_path} differ in length")
    for i, (image, label) in enumerate(zip(images, labels)):
      yield i, {"image": encode_png(image[..., None]), "label": int(label)}


# Config name -> our builder class. Any other name is a stock tfds dataset.
BUILDERS: dict[str, type[tfds.core.DatasetBuilder]] = {
  "digits": Digits,
  "fashion_mnist": FashionMnistDeb,
}


def resolve_name(name: str) -> str:
  """Maps a config dataset name to the registered tfds name to read.

  ``'digits' -> 'digits'``, ``'fashion_mnist' -> 'fashion_mnist_deb'``,
  ``'folder:PATH' -> 'image_folder/<base name>_<hash>'``; any other name
  (``'cifar10'``, ``'imagenet2012'``, ...) is returned unchanged.
  """
  source = folder.parse(name)
  if source is not None:
    return source.tfds_name
  cls = BUILDERS.get(name)
  return cls.name if cls is not None else name


def is_local(name: str) -> bool:
  """True for datasets built by vitjax (``python -m vitjax.data.prepare``): ours and ``folder:``/``csv:``."""
  return folder.is_source(name) or name in BUILDERS or name in {c.name for c in BUILDERS.values()}


def get_builder(
  name: str,
  data_dir: str | None = None,
) -> tfds.core.DatasetBuilder:
  """Returns the array_record builder for a config name (ours or stock tfds).

  Stock datasets are looked up with ``tfds.builder``; nothing is downloaded.
  ``folder:PATH`` and ``csv:FILE`` get their ``folder.ImageFolder`` builder
  (nothing is read from the source until it is prepared).
  """
  source = folder.parse(name)
  if source is not None:
    return folder.get_builder(source, data_dir)
  for cls in BUILDERS.values():
    if resolve_name(name) == cls.name:
      return cls(data_dir=data_dir, file_format=FILE_FORMAT)
  return tfds.builder(name, data_dir=data_dir, file_format=FILE_FORMAT)
