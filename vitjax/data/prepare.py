"""Prepares a dataset as array_record files, without TensorFlow.

Usage::

  python -m vitjax.data.prepare --dataset=digits --data_dir=~/tensorflow_datasets
  python -m vitjax.data.prepare --dataset=fashion_mnist --data_dir=DIR \
      [--manual_dir=/usr/share/datasets/fashion-mnist]
  python -m vitjax.data.prepare --dataset=folder:PATH [--workers=N]   # PATH/CLASS/* or PATH/{train,valid,test}/CLASS/*
  python -m vitjax.data.prepare --dataset=csv:FILE                    # rows path,label[,split]
  python -m vitjax.data.prepare --dataset=folder:PATH --allow_outside_root   # also files linked from elsewhere

Your own images (``folder:``/``csv:``, vitjax.data.folder): a relative PATH is resolved against the current
directory; files are read by ``--workers`` processes (default: the CPUs this process may use); files that are not
readable images are skipped and listed in ``skipped.txt`` beside the dataset. Only regular files inside PATH (the
CSV file's folder), by their real paths, are read: a link out of it is skipped (a CSV row naming such a file is an
error) unless ``--allow_outside_root``. Preparing again is a no-op: to take changed files, delete the dataset's folder
(the log names it) and prepare again.

``--data_dir`` defaults to ``$TFDS_DATA_DIR`` or ``~/tensorflow_datasets``.
Other names are handed to the stock tfds builder (which may download, and
whose image encoding may need TensorFlow); ``tfds build NAME
--file_format=array_record`` does the same.
"""

from __future__ import annotations

import contextlib
import io
import os
import shlex
import time

import tensorflow_datasets as tfds
from absl import flags, logging

from vitjax import cli, paths
from vitjax.data import builders, folder, local
from vitjax.data import splits as splits_lib
from vitjax.errors import DatasetNotPreparedError


def prepare_command(name: str, data_dir: str | None = None, manual_dir: str | None = None) -> str:
  """The shell command that prepares ``name`` into ``data_dir``."""
  source = folder.parse(name)
  name = f"{source.kind}:{source.abspath}" if source is not None else name
  cmd = f"python -m vitjax.data.prepare --dataset={shlex.quote(name)}"
  cmd += f" --data_dir={data_dir or local.default_data_dir()}"
  if manual_dir:
    cmd += f" --manual_dir={manual_dir}"
  return cmd


def prepare(
  name: str,
  data_dir: str | None = None,
  manual_dir: str | None = None,
  workers: int | None = None,
  allow_outside_root: bool = False,
) -> tfds.core.DatasetBuilder:
  """Builds dataset ``name`` (config name, see ``builders.resolve_name``).

  Args:
    name: ``'digits'``, ``'fashion_mnist'``, ``'folder:PATH'``, ``'csv:FILE'`` or a stock tfds name.
    data_dir: output root; files go to ``data_dir/<tfds name>/<version>/``.
    manual_dir: directory with manually obtained source files; for
      ``fashion_mnist`` defaults to Debian's ``/usr/share/datasets/fashion-mnist``.
    workers: processes that read a folder's or CSV's images (default: the CPUs this process may use).
    allow_outside_root: a folder's or CSV's files may be outside its folder (links, ``../`` or absolute CSV paths);
      by default those are skipped (a folder's) or refused (a CSV's rows).

  Returns:
    The prepared builder (``builder.as_data_source()`` reads it back).
    Preparing an already prepared dataset is a no-op.

  Raises:
    vitjax.errors.ConfigError: a ``folder:``/``csv:`` source that cannot be a dataset (the message says why), or a
      ``data_dir`` that cannot be written. A dataset that fails to prepare leaves ``data_dir`` as it was.
  """
  return _prepare(name, data_dir, manual_dir, workers, allow_outside_root)[0]


def _prepare(
  name: str,
  data_dir: str | None,
  manual_dir: str | None,
  workers: int | None = None,
  allow_outside_root: bool = False,
) -> tuple[tfds.core.DatasetBuilder, bool]:
  """prepare(), and whether the dataset was prepared already."""
  data_dir = os.path.expanduser(data_dir or local.default_data_dir())
  source = folder.parse(name)
  if builders.resolve_name(name) == builders.FashionMnistDeb.name:
    manual_dir = manual_dir or builders.DEBIAN_FASHION_MNIST_DIR
    if not builders.fashion_mnist_available(os.path.expanduser(manual_dir)):
      raise FileNotFoundError(builders.fashion_mnist_missing_message(manual_dir))
  builder = builders.get_builder(name, data_dir)
  if os.path.exists(os.path.join(builder.data_dir, "dataset_info.json")):  # is_prepared(), without its warning
    return builder, True
  paths.check_writable(data_dir, "data_dir", folder=True)
  if source is not None:  # check the source (one error line for a bad one) before tfds makes any folder
    builder.scan_result, builder.workers = folder.scan(source, allow_outside_root), workers
  config = tfds.download.DownloadConfig(manual_dir=os.path.expanduser(manual_dir) if manual_dir else None)
  # tfds prints "Downloading and preparing dataset ..." even when nothing downloads: shown at --verbosity=1
  quiet = logging.get_verbosity() < 1
  made = _made_by_tfds(data_dir, builder)
  try:
    with contextlib.redirect_stdout(io.StringIO()) if quiet else contextlib.nullcontext():
      builder.download_and_prepare(download_config=config)
  except Exception:
    _remove_new(made)  # tfds removes the dataset files it wrote, not the folders and metadata it made on the way
    raise
  if source is not None:
    folder.report(builder)
  return builder, False


def _made_by_tfds(data_dir: str, builder) -> list[str]:
  """What tfds may create in data_dir while preparing `builder` and does not remove when that fails, deepest first.

  data_dir and its parents, downloads/ (and its extracted/), the dataset's folders down to its version's, and the
  dataset's .config/metadata.json: those of them that do not exist yet.
  """
  data_dir = os.path.abspath(data_dir)
  made, path = [], os.path.abspath(builder.data_dir)
  while path != data_dir and path.startswith(data_dir + os.sep):
    made.append(path)
    path = os.path.dirname(path)
  path = data_dir
  if made:
    made += [os.path.join(made[-1], ".config"), os.path.join(made[-1], ".config", "metadata.json")]
  made += [os.path.join(data_dir, "downloads"), os.path.join(data_dir, "downloads", "extracted")]
  while True:
    made.append(path)
    if os.path.dirname(path) == path:
      break
    path = os.path.dirname(path)
  return sorted((p for p in made if not os.path.lexists(p)), key=lambda p: -p.count(os.sep))


def _remove_new(made: list[str]) -> None:
  """Removes those of `made` (deepest first) that are files or empty folders now (another process may share them)."""
  for path in made:
    with contextlib.suppress(OSError):
      if os.path.isfile(path):
        os.remove(path)
      else:
        os.rmdir(path)


def define_flags() -> None:
  """The command line's flags (defined by `python -m vitjax.data.prepare` only, not by importing this module)."""
  flags.DEFINE_string(
    "dataset",
    None,
    "'digits', 'fashion_mnist', 'folder:PATH' (PATH/CLASS/* images), 'csv:FILE' (path,label rows) or a stock tfds name",
    required=True,
  )
  flags.DEFINE_string("data_dir", None, "default: $TFDS_DATA_DIR or ~/tensorflow_datasets")
  flags.DEFINE_string("manual_dir", None, "source files (fashion_mnist: Debian dir)")
  flags.DEFINE_integer("workers", None, "folder:/csv: processes reading the images (default: the CPUs available)")
  flags.DEFINE_bool(
    "allow_outside_root",
    False,
    "folder:/csv: also read files outside PATH (the CSV file's folder): links out of it, ../ or absolute CSV paths",
  )


def main() -> None:
  """Prepares --dataset, or says it is already prepared.

  The main() of python -m vitjax.data.prepare (vitjax.cli.run).
  """
  f = flags.FLAGS
  start = time.time()
  try:
    builder, was_prepared = _prepare(f.dataset, f.data_dir, f.manual_dir, f.workers, f.allow_outside_root)
  except tfds.core.DatasetNotFoundError:  # the trainer's message for the same name: the valid names, a tfds command
    splits_lib.prepared_builder(f.dataset, f.data_dir)  # (raises DatasetNotPreparedError: the name is not found there)
    raise
  except FileNotFoundError as e:
    raise DatasetNotPreparedError(str(e).strip().splitlines()[0]) from None
  splits = {k: v.num_examples for k, v in builder.info.splits.items()}
  if was_prepared:
    again = " (delete that folder to prepare it again from changed files)" if folder.is_source(f.dataset) else ""
    logging.info(
      "%s (%s) is already prepared in %s: %s%s", f.dataset, _tfds_name(builder), builder.data_dir, splits, again
    )
  else:
    took = time.time() - start
    logging.info("prepared %s (%s) in %s: %s in %.1fs", f.dataset, _tfds_name(builder), builder.data_dir, splits, took)


def _tfds_name(builder) -> str:
  config = builder.builder_config
  return f"{builder.name}/{config.name}" if config is not None else builder.name


if __name__ == "__main__":
  define_flags()
  cli.run(main)
