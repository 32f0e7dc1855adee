"""Prepares a dataset as array_record files, without TensorFlow.

Usage::

  python -m vitjax.data.prepare --dataset=digits --data_dir=~/tensorflow_datasets
  python -m vitjax.data.prepare --dataset=fashion_mnist --data_dir=DIR \
      [--manual_dir=/usr/share/datasets/fashion-mnist]

``--data_dir`` defaults to ``$TFDS_DATA_DIR`` or ``~/tensorflow_datasets``.
Other names are handed to the stock tfds builder (which may download, and
whose image encoding may need TensorFlow); ``tfds build NAME
--file_format=array_record`` does the same.
"""

from __future__ import annotations

import contextlib
import io
import os
import time

import tensorflow_datasets as tfds
from absl import flags, logging

from vitjax import cli
from vitjax.data import builders
from vitjax.errors import DatasetNotPreparedError


def prepare_command(name: str, data_dir: str | None = None, manual_dir: str | None = None) -> str:
  """The shell command that prepares ``name`` into ``data_dir``."""
  cmd = f"python -m vitjax.data.prepare --dataset={name}"
  cmd += f" --data_dir={data_dir or builders.default_data_dir()}"
  if manual_dir:
    cmd += f" --manual_dir={manual_dir}"
  return cmd


def prepare(name: str, data_dir: str | None = None, manual_dir: str | None = None) -> tfds.core.DatasetBuilder:
  """Builds dataset ``name`` (config name, see ``builders.resolve_name``).

  Args:
    name: ``'digits'``, ``'fashion_mnist'`` or a stock tfds name.
    data_dir: output root; files go to ``data_dir/<tfds name>/<version>/``.
    manual_dir: directory with manually obtained source files; for
      ``fashion_mnist`` defaults to Debian's ``/usr/share/datasets/fashion-mnist``.

  Returns:
    The prepared builder (``builder.as_data_source()`` reads it back).
    Preparing an already prepared dataset is a no-op.
  """
  return _prepare(name, data_dir, manual_dir)[0]


def _prepare(name: str, data_dir: str | None, manual_dir: str | None) -> tuple[tfds.core.DatasetBuilder, bool]:
  """prepare(), and whether the dataset was prepared already."""
  data_dir = os.path.expanduser(data_dir or builders.default_data_dir())
  if builders.resolve_name(name) == builders.FashionMnistDeb.name:
    manual_dir = manual_dir or builders.DEBIAN_FASHION_MNIST_DIR
    if not builders.fashion_mnist_available(os.path.expanduser(manual_dir)):
      raise FileNotFoundError(builders.fashion_mnist_missing_message(manual_dir))
  builder = builders.get_builder(name, data_dir)
  if os.path.exists(os.path.join(builder.data_dir, "dataset_info.json")):  # is_prepared(), without its warning
    return builder, True
  config = tfds.download.DownloadConfig(manual_dir=os.path.expanduser(manual_dir) if manual_dir else None)
  # tfds prints "Downloading and preparing dataset ..." even when nothing downloads: shown at --verbosity=1
  quiet = logging.get_verbosity() < 1
  with contextlib.redirect_stdout(io.StringIO()) if quiet else contextlib.nullcontext():
    builder.download_and_prepare(download_config=config)
  return builder, False


def define_flags() -> None:
  """The command line's flags (defined by `python -m vitjax.data.prepare` only, not by importing this module)."""
  flags.DEFINE_string("dataset", None, "'digits', 'fashion_mnist' or a stock tfds name", required=True)
  flags.DEFINE_string("data_dir", None, "default: $TFDS_DATA_DIR or ~/tensorflow_datasets")
  flags.DEFINE_string("manual_dir", None, "source files (fashion_mnist: Debian dir)")


def main() -> None:
  """python -m vitjax.data.prepare (vitjax.cli.run): prepares --dataset, or says it is already prepared."""
  f = flags.FLAGS
  start = time.time()
  try:
    builder, was_prepared = _prepare(f.dataset, f.data_dir, f.manual_dir)
  except (FileNotFoundError, tfds.core.DatasetNotFoundError) as e:
    raise DatasetNotPreparedError(str(e).strip().splitlines()[0]) from None
  splits = {k: v.num_examples for k, v in builder.info.splits.items()}
  if was_prepared:
    logging.info("%s (%s) is already prepared in %s: %s", f.dataset, builder.name, builder.data_dir, splits)
  else:
    took = time.time() - start
    logging.info("prepared %s (%s) in %s: %s in %.1fs", f.dataset, builder.name, builder.data_dir, splits, took)


if __name__ == "__main__":
  define_flags()
  cli.run(main)
