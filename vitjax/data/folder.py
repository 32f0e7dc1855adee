"""A user's own images as a tfds dataset: ``folder:PATH`` (one folder per class) or ``csv:FILE`` (``path,label`` rows).

Prepared as array_record without TensorFlow by ``python -m vitjax.data.prepare --dataset=folder:PATH``.

Sources:

* ``folder:PATH``: ``PATH/CLASS/**/*`` (every non-hidden file under a class folder, at any depth), all in the
  ``train`` split; or, when PATH holds split folders, ``PATH/train/CLASS/...``, ``PATH/valid/CLASS/...``
  (``val/`` and ``validation/`` name it too) and ``PATH/test/CLASS/...``: those are the splits. The classes are
  the sorted class folder names (over all splits).
* ``csv:FILE``: rows ``path,label`` or ``path,label,split`` (split ``train``, ``valid`` or ``test``; empty means
  ``train``); paths are relative to the CSV file's folder (or absolute); a first row ``path,label[,split]`` is a
  header. The classes are the distinct labels, sorted (numerically when every label is an integer).

A relative PATH or FILE (and ``~``) is resolved against the current directory, when preparing and when training:
``folder:imgs`` names another dataset from another directory (the not-prepared error shows the absolute path).

In tfds every source is one config of the builder ``image_folder``: ``image_folder/<name>_<hash>``, the sanitised
base name of the source and 8 hex digits of the SHA-256 of ``folder:/absolute/path`` (or ``csv:...``), so two
sources never share files: they go to ``DATA_DIR/image_folder/<name>_<hash>/1.0.0/``.

Images: the dataset has 3 channels (RGB) whatever the files hold. The pipeline (``augment.decode``) reads JPEG
with libjpeg-turbo (simplejpeg, at reduced DCT scales) and everything else with PIL, converting to RGB; so JPEGs in
RGB or grayscale that libjpeg-turbo decodes without a warning, and PNGs in RGB or grayscale (``L``), are stored as
their own bytes. Anything else is converted once, here, to RGB: EXIF-rotated images (the pipeline ignores EXIF)
are turned upright, CMYK, palette, alpha (dropped, as PIL's ``convert("RGB")`` drops it, as timm's and
torchvision's loaders do), 16-bit and 1-bit images and other formats (BMP, GIF's first frame, TIFF, WebP, ...)
become RGB; converted JPEGs are stored as JPEG (quality 95), everything else as PNG. Sizes may differ: the image
feature is ``(None, None, 3)`` and the pipeline resizes or crops to ``config.data.image_size``.

Files that are not readable images (not an image, truncated, ...) are skipped: one log line says how many, and
``skipped.txt`` in the dataset's version folder lists each with the reason (``name<TAB>why``, one line each: control
characters and bytes that are no UTF-8 in either are backslash escapes). Files are read and checked in parallel
worker processes (``workers``: default all the CPUs this process may use).

What is read: regular files inside the source's folder (the CSV file's folder), by their real paths. A link out of
it is a skip line, a CSV row naming a file outside it an error, unless ``allow_outside_root`` (``prepare
--allow_outside_root``). Folder links are followed, but never into a folder above (a loop) nor twice into a folder;
each file is read once (one linked into another class stays in its own class); FIFOs, devices and sockets are skip
lines (the reader checks the file it opened, without blocking, again). An image of more than
``image_files.MAX_PIXELS`` pixels, or a file of more than ``image_files.MAX_FILE_BYTES``, is a skip line too.
"""

from __future__ import annotations

import collections
import csv
import dataclasses
import hashlib
import os
import re
import stat
import types

import tensorflow_datasets as tfds
from absl import logging

from vitjax import paths
from vitjax.data import image_files, local
from vitjax.errors import ConfigError
from vitjax.logs import Progress

KINDS = ("folder", "csv")
BUILDER_NAME = "image_folder"
SPLITS = ("train", "valid", "test")
_SPLIT_ALIASES = {"train": "train", "valid": "valid", "val": "valid", "validation": "valid", "test": "test"}
SKIPPED_FILE = "skipped.txt"


# ----------------------------------------------------------------------------
# Names: folder:PATH / csv:FILE -> the source and its tfds config.


@dataclasses.dataclass(frozen=True)
class Source:
  """A dataset name ``kind:path``: ``kind`` 'folder' or 'csv', ``path`` as given, ``abspath`` resolved."""

  kind: str
  path: str
  abspath: str

  @property
  def name(self) -> str:
    """The dataset name as the config gives it: ``kind:path``."""
    return f"{self.kind}:{self.path}"

  @property
  def config_name(self) -> str:
    """The tfds config name: the sanitised base name and a hash of the absolute path (``flowers_1a2b3c4d``)."""
    base = os.path.basename(self.abspath.rstrip(os.sep))
    if self.kind == "csv":
      base = os.path.splitext(base)[0] + "_csv"
    base = re.sub(r"[^a-z0-9]+", "_", base.lower()).strip("_")[:40] or "data"
    digest = hashlib.sha256(f"{self.kind}:{self.abspath}".encode()).hexdigest()[:8]
    return f"{base}_{digest}"

  @property
  def tfds_name(self) -> str:
    """The tfds name of the prepared dataset: ``image_folder/CONFIG_NAME`` (see `config_name`)."""
    return f"{BUILDER_NAME}/{self.config_name}"


def is_source(name: str) -> bool:
  """Whether a config dataset name is ``folder:...`` or ``csv:...``."""
  return isinstance(name, str) and name.split(":", 1)[0] in KINDS and ":" in name


def parse(name: str) -> Source | None:
  """``folder:PATH`` / ``csv:FILE`` -> Source (PATH resolved against the current directory); None for other names.

  Raises:
    ConfigError: the name has no path.
  """
  if not is_source(name):
    return None
  kind, path = name.split(":", 1)
  if not path.strip():
    example = "folder:PATH (PATH/CLASS/*.jpg)" if kind == "folder" else "csv:FILE (rows path,label)"
    raise ConfigError(f"dataset {name!r} names no {'folder' if kind == 'folder' else 'file'}: use {example}")
  return Source(kind, path, os.path.abspath(os.path.expanduser(path)))


# ----------------------------------------------------------------------------
# Scanning a source: which files, which class, which split.


@dataclasses.dataclass
class Scan:
  """What a source holds: the class names and, per split, ``(key, file, label)`` rows (key: unique, readable).

  ``skipped``: ``(file, why)`` of what the scan did not take (links out of the source's folder or into a folder above,
  FIFOs, devices, a file met twice, ...); ``identity``: each listed file's ``(st_dev, st_ino)``, which the reader
  checks again on the file it opens.
  """

  class_names: list[str]
  splits: dict[str, list[tuple[str, str, int]]]
  ignored: list[str] = dataclasses.field(default_factory=list)  # files outside class folders
  skipped: list[tuple[str, str]] = dataclasses.field(default_factory=list)
  identity: dict[str, tuple[int, int]] = dataclasses.field(default_factory=dict)

  @property
  def num_files(self) -> int:
    """The files of all splits together."""
    return sum(len(v) for v in self.splits.values())


def _visible(name: str) -> bool:
  return not name.startswith(".")


def _inside(path: str, root: str) -> bool:
  """Whether the real path ``path`` is ``root`` or under it (both real, absolute)."""
  return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


OUTSIDE_HINT = "prepare with --allow_outside_root to read such files"


@dataclasses.dataclass(frozen=True)
class _File:
  """A regular file found under a class folder: its path there, its (st_dev, st_ino), whether a link led to it."""

  path: str
  ident: tuple[int, int]
  linked: bool


@dataclasses.dataclass
class _Walk:
  """What walking a source's folders needs: the real path of its root, the opt-in, where the skip lines go."""

  root: str  # real path
  allow_outside_root: bool
  skipped: list[tuple[str, str]]
  base: str = ""  # the source's folder as given (messages name files relative to it)

  def look(self, path: str, plain: str, via_link: bool):
    """(stat, real path, reached by a link) of a folder entry, or None (a skip line said why).

    ``plain``: its real path if it is no link (its folder's real path and its name).
    """
    try:
      st = os.lstat(path)
      real, linked = plain, via_link or stat.S_ISLNK(st.st_mode)
      if stat.S_ISLNK(st.st_mode):
        real = os.path.realpath(path)
        st = os.stat(path)
    except OSError as e:
      self.skipped.append((path, f"cannot follow the link: {e.strerror or e}"))
      return None
    if not self.allow_outside_root and not _inside(real, self.root):
      self.skipped.append((path, f"a link to {real}, outside the dataset's folder: not read ({OUTSIDE_HINT})"))
      return None
    return st, real, linked

  def files(self, top: str, top_real: str, linked: bool) -> list[_File]:
    """Every non-hidden regular file under folder ``top`` (any depth), sorted, each folder visited once.

    Links are followed, but never into a folder above (a loop) nor twice into one folder; FIFOs, devices and sockets
    are skip lines, not files.
    """
    out, seen = [], {}  # seen: (st_dev, st_ino) of a folder -> its path
    st = os.stat(top)
    seen[(st.st_dev, st.st_ino)] = top
    stack = [(top, top_real, linked, (self.root, top_real))]
    while stack:
      directory, real_dir, via, chain = stack.pop()
      try:
        names = sorted(n for n in os.listdir(directory) if _visible(n))
      except OSError as e:
        self.skipped.append((directory, f"cannot list the folder: {e.strerror or e}"))
        continue
      below = []
      for name in names:
        path = os.path.join(directory, name)
        found = self.look(path, os.path.join(real_dir, name), via)
        if found is None:
          continue
        st, real, link = found
        if stat.S_ISDIR(st.st_mode):
          if real in chain or _inside(real_dir, real):
            self.skipped.append((path, f"a link to {real}, a folder above it (a loop): not followed"))
          elif (st.st_dev, st.st_ino) in seen:
            first = os.path.relpath(seen[(st.st_dev, st.st_ino)], self.base)
            self.skipped.append((path, f"the same folder as {first}: read once"))
          else:
            seen[(st.st_dev, st.st_ino)] = path
            below.append((path, real, link, (*chain, real)))
        elif stat.S_ISREG(st.st_mode):
          out.append(_File(path, (st.st_dev, st.st_ino), link))
        else:
          self.skipped.append((path, f"{image_files.file_kind(st.st_mode)}, not a regular file: not read"))
      stack.extend(reversed(below))  # depth first, in name order (as os.walk)
    return out


def _subdirs(directory: str) -> tuple[list[str], list[str]]:
  """(sorted visible subfolder names, visible file names) of a folder."""
  names = sorted(n for n in os.listdir(directory) if _visible(n))
  dirs = [n for n in names if os.path.isdir(os.path.join(directory, n))]
  return dirs, [n for n in names if n not in dirs]


def scan(source: Source, allow_outside_root: bool = False) -> Scan:
  """Lists a source's images (without reading them).

  Only files inside the source's folder (the CSV file's folder), by their real paths, unless ``allow_outside_root``:
  a link out of it is a skip line (a CSV row naming such a file is an error, as a row naming no file is).

  Raises:
    ConfigError: the path does not exist, a folder has no class folders or an empty one, a CSV row has no label
      or names a file that does not exist, ... (one line that says what to fix).
  """
  if source.kind == "folder":
    found = _scan_folder(source, allow_outside_root)
  else:
    found = _scan_csv(source, allow_outside_root)
  trained = {label for *_, label in found.splits["train"]}
  untrained = [name for i, name in enumerate(found.class_names) if i not in trained]
  if untrained:  # (a model would learn never to predict it: a misspelt test/Cat beside train/cat made two classes)
    elsewhere = sorted(
      s for s, rows in found.splits.items() if any(found.class_names[r[2]] == untrained[0] for r in rows)
    )
    raise ConfigError(
      f"{source.name}: class {untrained[0]!r} has no training images, only {' and '.join(elsewhere)} ones: give it "
      "training images, or fix its name where it is misspelt"
    )
  return found


def _located(source: Source, noun: str, give: str) -> str:
  """How errors name the source ('folder:imgs (/abs/imgs)'); ConfigError if it does not exist."""
  path = source.abspath
  where = f"{source.name} ({path})" if source.path != path else source.name
  if not os.path.exists(path):
    raise ConfigError(
      f"{where}: no such {noun} (a relative path is resolved against the current directory); give {give}"
    )
  return where


def _split_layout(root: str, where: str) -> tuple[dict[str, str], list[str]]:
  """({split: its folder}, files beside the split folders) of a source's folder (``{"train": root}``: no split folders)."""
  dirs, files = _subdirs(root)
  split_dirs = [d for d in dirs if d.lower() in _SPLIT_ALIASES]
  if not split_dirs:
    return {"train": root}, []  # (the files beside the class folders: found with those of train)
  others = [d for d in dirs if d.lower() not in _SPLIT_ALIASES]
  if others:
    raise ConfigError(
      f"{where} mixes split folders ({', '.join(split_dirs)}) with other folders ({', '.join(others[:5])}): "
      "put every class folder inside train/ (and valid/, test/), or use no split folders at all (a class "
      "folder cannot be named train, valid, val, validation or test)"
    )
  by_split = collections.defaultdict(list)
  for d in split_dirs:
    by_split[_SPLIT_ALIASES[d.lower()]].append(d)
  twice = {s: ds for s, ds in by_split.items() if len(ds) > 1}
  if twice:
    s, ds = next(iter(twice.items()))
    raise ConfigError(f"{where}: folders {', '.join(ds)} all name the {s!r} split: keep one")
  if "train" not in by_split:
    raise ConfigError(
      f"{where} has {', '.join(d + '/' for d in split_dirs)} but no train/: put the training images in train/CLASS/"
    )
  return {split: os.path.join(root, ds[0]) for split, ds in by_split.items()}, [os.path.join(root, f) for f in files]


def _own_folder(walk: _Walk, path: str, rel: str, where: str) -> str:
  """The real path of a split or class folder; ConfigError if it is a link out of the source's folder or above it."""
  real = os.path.realpath(path)
  if not walk.allow_outside_root and not _inside(real, walk.root):
    raise ConfigError(f"{where}: {rel}/ is a link to {real}, outside the folder: move it inside, or {OUTSIDE_HINT}")
  if _inside(walk.root, real):
    raise ConfigError(f"{where}: {rel}/ is a link to {real}, a folder above it (a loop): remove the link")
  return real


def _read_once(per_split: dict[str, dict[str, list[_File]]], walk: _Walk, root: str) -> None:
  """Keeps each file once (by st_dev, st_ino) in per_split: where it is without a link, else where it is met first.

  The others are skip lines (a file linked into another class keeps its own class, not the link's).
  """
  owner = {}
  every = [f for classes in per_split.values() for files in classes.values() for f in files]
  for f in sorted(every, key=lambda f: f.linked):  # (sorted() is stable: in name order otherwise)
    owner.setdefault(f.ident, f.path)
  for classes in per_split.values():
    for c, files in classes.items():
      classes[c] = [f for f in files if owner[f.ident] == f.path]
      walk.skipped.extend(
        (f.path, f"the same file as {os.path.relpath(owner[f.ident], root)}: read once")
        for f in files
        if owner[f.ident] != f.path
      )


def _scan_folder(source: Source, allow_outside_root: bool = False) -> Scan:
  """A folder of class folders (or of split folders of class folders): what scan() does for ``folder:PATH``."""
  root = source.abspath
  where = _located(source, "folder", "the folder that holds one subfolder per class")
  if not os.path.isdir(root):
    hint = f"; for a CSV list of images use --dataset=csv:{source.path}" if root.endswith(".csv") else ""
    raise ConfigError(f"{where} is a file, not a folder: give the folder that holds one subfolder per class{hint}")
  layout, ignored = _split_layout(root, where)
  walk = _Walk(os.path.realpath(root), allow_outside_root, [], root)
  per_split: dict[str, dict[str, list[_File]]] = {}
  for split, directory in layout.items():
    rel = os.path.relpath(directory, root)
    if rel != ".":
      _own_folder(walk, directory, rel, where)
    classes, loose = _subdirs(directory)
    ignored += [os.path.join(directory, f) for f in loose]
    if not classes:
      raise ConfigError(
        f"{where}: {'the folder' if rel == '.' else rel + '/'} has no class folders: put each class's images in "
        f"{os.path.join(source.path, '' if rel == '.' else rel, 'CLASS')}/ (one subfolder per class)"
      )
    per_split[split] = {}
    for c in classes:
      path, name = os.path.join(directory, c), os.path.normpath(os.path.join(rel, c))
      linked = os.path.islink(directory) or os.path.islink(path)
      per_split[split][c] = walk.files(path, _own_folder(walk, path, name, where), linked)
  _read_once(per_split, walk, root)
  for split, classes in per_split.items():
    for c, files in classes.items():
      if not files:
        _no_files(where, os.path.join(layout[split], c), root, walk.skipped)
  class_names = sorted({c for split in per_split.values() for c in split})
  index = {c: i for i, c in enumerate(class_names)}
  splits = {
    split: [(os.path.relpath(f.path, root), f.path, index[c]) for c, found in classes.items() for f in found]
    for split, classes in per_split.items()
  }
  identity = {f.path: f.ident for classes in per_split.values() for found in classes.values() for f in found}
  return Scan(class_names, {s: splits[s] for s in SPLITS if s in splits}, ignored, walk.skipped, identity)


def _no_files(where: str, directory: str, root: str, skipped: list[tuple[str, str]]) -> None:
  """ConfigError: a class folder has no files (to read: its last skip line says why, a file met twice if one was)."""
  why = next(((p, w) for p, w in reversed(skipped) if p.startswith(directory + os.sep)), None)
  more = f" to read ({_escape(os.path.relpath(why[0], root))}: {_escape(why[1])})" if why else ""
  raise ConfigError(
    f"{where}: class folder {os.path.relpath(directory, root)}/ has no files{more}: add its images or remove the folder"
  )


def _label_order(labels) -> list[str]:
  """Distinct labels, sorted; numerically when all are integers ('2' before '10')."""
  distinct = set(labels)
  if all(re.fullmatch(r"[+-]?\d+", x) for x in distinct):
    return sorted(distinct, key=lambda x: (int(x), x))
  return sorted(distinct)


def _csv_rows(path: str, where: str) -> list[tuple[int, list[str]]]:
  """The (line number, cells) of a CSV file's rows, less empty rows and the header; ConfigError if it is no CSV."""
  rows = []
  try:
    nonblocking = lambda name, flags: os.open(name, flags | os.O_NONBLOCK)  # a FIFO is refused, not waited on
    with open(path, newline="", encoding="utf-8-sig", opener=nonblocking) as f:
      mode = os.fstat(f.fileno()).st_mode
      if not stat.S_ISREG(mode):
        raise ConfigError(f"{where} is {image_files.file_kind(mode)}, not a regular file: give a CSV file")
      for lineno, row in enumerate(csv.reader(f), 1):
        row = [cell.strip() for cell in row]
        if not any(row):
          continue
        if not rows and lineno == 1 and [c.lower() for c in row[:3]] in (["path", "label"], ["path", "label", "split"]):
          continue  # the header
        rows.append((lineno, row))
  except (UnicodeDecodeError, csv.Error) as e:
    raise ConfigError(f"{where} is not a UTF-8 CSV file of path,label rows: {e}") from None
  except OSError as e:
    raise ConfigError(f"{where} cannot be read: {e.strerror or e}") from None
  if not rows:
    raise ConfigError(f"{where} has no rows: write one path,label row per image")
  return rows


def _csv_file(file: str, root: str, allow_outside_root: bool) -> tuple[str, str | os.stat_result]:
  """('ok', its stat) for a file a CSV row names; else ('missing' | 'outside' | 'special', what to say)."""
  try:
    st = os.stat(file)
  except OSError:
    return "missing", ""
  real = os.path.realpath(file)
  if not allow_outside_root and not _inside(real, root):
    return "outside", real
  if not stat.S_ISREG(st.st_mode):
    return "special", image_files.file_kind(st.st_mode)
  return "ok", st


def _bad_csv_rows(where: str, base: str, bad: list[tuple[int, str, str, str]]) -> ConfigError:
  """The one error for the CSV rows that name no file, one outside the CSV's folder, or no regular file."""
  order = ("missing", "outside", "special")
  kind = min((k for _, _, k, _ in bad), key=order.index)
  same = [b for b in bad if b[2] == kind]
  lineno, name, _, said = same[0]
  more = f", and so are {len(same) - 1} more rows" if len(same) > 1 else ""
  if kind == "missing":
    more = f" and {len(same) - 1} more rows" if len(same) > 1 else ""
    return ConfigError(
      f"{where} line {lineno}: no such file {name!r}{more} (paths are relative to the CSV file's folder {base}): "
      "fix the paths or remove those rows"
    )
  if kind == "outside":
    return ConfigError(
      f"{where} line {lineno}: {name!r} is outside the CSV file's folder {base} (it is {said}){more}: move the "
      f"images into that folder (or the CSV file up to them), or {OUTSIDE_HINT}"
    )
  return ConfigError(f"{where} line {lineno}: {name!r} is {said}, not a regular file{more}: list image files only")


def _scan_csv(source: Source, allow_outside_root: bool = False) -> Scan:
  """A CSV file of ``path,label[,split]`` rows: what scan() does for ``csv:FILE``."""
  path = source.abspath
  where = _located(source, "file", "a CSV file of path,label rows")
  if os.path.isdir(path):
    raise ConfigError(f"{where} is a folder: for class subfolders use --dataset=folder:{source.path}")
  base = os.path.dirname(path)
  root = os.path.realpath(base)
  items, bad = [], []
  for lineno, row in _csv_rows(path, where):
    if len(row) < 2 or not row[1]:
      raise ConfigError(f"{where} line {lineno}: {','.join(row)!r} has no label: each row is path,label[,split]")
    if len(row) > 3 or not row[0]:
      raise ConfigError(f"{where} line {lineno}: {','.join(row)!r} is not path,label[,split]")
    split = row[2].lower() if len(row) == 3 and row[2] else "train"
    if split not in _SPLIT_ALIASES:
      raise ConfigError(f"{where} line {lineno}: split {row[2]!r} is not train, valid or test (or empty: train)")
    file = os.path.join(base, os.path.expanduser(row[0]))
    kind, found = _csv_file(file, root, allow_outside_root)
    if kind != "ok":
      bad.append((lineno, row[0], kind, found))
      continue
    items.append((lineno, row[0], file, row[1], _SPLIT_ALIASES[split], (found.st_dev, found.st_ino)))
  if bad:
    raise _bad_csv_rows(where, base, bad)
  class_names = _label_order(item[3] for item in items)
  if any("\n" in c or "\r" in c for c in class_names):
    raise ConfigError(f"{where}: a label holds a line break: give labels of one line")
  index = {c: i for i, c in enumerate(class_names)}
  splits = collections.defaultdict(list)
  for lineno, name, file, label, split, _ in items:
    splits[split].append((f"{name}#{lineno}", file, index[label]))
  if "train" not in splits:
    raise ConfigError(f"{where} has no train rows: give train (or empty) in the split column of the training images")
  identity = {item[2]: item[5] for item in items}
  return Scan(class_names, {s: splits[s] for s in SPLITS if s in splits}, identity=identity)


# ----------------------------------------------------------------------------
# The tfds builder.


class ImageFolder(local.LocalBuilder, skip_registration=True):
  """Images from a folder of class folders or a CSV list (see vitjax/data/folder.py).

  Features: ``image`` (None, None, 3) stored as JPEG or PNG bytes, ``label`` ClassLabel (the class names). One
  subclass per source (:func:`builder_class`), whose single config is the source's; ``source`` is the name the
  user gave (``folder:imgs``), ``scan_result`` what :func:`scan` found (scanned when preparing, if not given).
  """

  name = BUILDER_NAME
  VERSION = tfds.core.Version("1.0.0")
  RELEASE_NOTES = {"1.0.0": "Initial release."}

  def __init__(
    self,
    *args,
    source: Source,
    scan_result: Scan | None = None,
    workers: int | None = None,
    allow_outside_root: bool = False,
    **kwargs,
  ):
    self.source, self.scan_result, self.workers = source, scan_result, workers  # before tfds calls _info()
    self.allow_outside_root = allow_outside_root  # (scan()'s, when the builder scans)
    super().__init__(*args, **kwargs)
    self.counts: collections.Counter = collections.Counter()  # kept / converted (per reason)
    self.skipped: list[tuple[str, str]] = []  # (path relative to the source, why)

  def _info(self) -> local.Info:
    names = list(self.scan_result.class_names) if self.scan_result else None
    return local.Info(
      builder=self,
      description=f"Images of {self.source.name} ({self.source.abspath}), prepared by vitjax.data.folder.",
      features=local.features((None, None, 3), names=names),
      supervised_keys=("image", "label"),
    )

  def _split_generators(self, dl_manager):
    del dl_manager  # the files are local
    if self.scan_result is None:
      self.scan_result = scan(self.source, self.allow_outside_root)
    base = _base(self.source)
    self.skipped = [(os.path.relpath(file, base), why) for file, why in self.scan_result.skipped]
    label = self.info.features["label"]
    if label.num_classes is None:
      label.names = list(self.scan_result.class_names)
    return {split: self._generate_examples(split, items) for split, items in self.scan_result.splits.items()}

  def _generate_examples(self, split: str, items: list[tuple[str, str, int]]):
    workers = self.workers or image_files.default_workers()
    size = max(1, min(image_files.CHUNK, len(items) // (4 * workers)))  # small folders: work for every worker too
    chunks = [items[i : i + size] for i in range(0, len(items), size)]
    progress = Progress(f"prepare {self.source.name} [{split}]", total=len(chunks), unit="images")
    stored = 0
    identity = self.scan_result.identity
    paths = [[(file, identity.get(file)) for _, file, _ in chunk] for chunk in chunks]
    for chunk, results in zip(chunks, image_files.map_chunks(paths, workers)):
      for (key, file, label), (data, note) in zip(chunk, results):
        if data is None:
          self.skipped.append((os.path.relpath(file, _base(self.source)), note))
          continue
        self.counts[note] += 1
        stored += 1
        yield key, {"image": data, "label": label}
      progress.update(items=len(chunk))
    if not stored:
      raise ConfigError(
        f"{self.source.name}: none of the {len(items)} files of the {split!r} split is a readable image (e.g. "
        f"{_escape(self.skipped[-1][0])}: {_escape(self.skipped[-1][1])}): give image files (JPEG, PNG, ...)"
      )


def _base(source: Source) -> str:
  return source.abspath if source.kind == "folder" else os.path.dirname(source.abspath)


_CLASSES: dict[str, type[ImageFolder]] = {}  # config name -> class


def builder_class(source: Source) -> type[ImageFolder]:
  """The ImageFolder subclass whose one BuilderConfig is ``source``'s; one class per absolute path.

  tfds then reads and writes ``image_folder/<config_name>``.
  """
  name = source.config_name
  if name not in _CLASSES:
    config = tfds.core.BuilderConfig(name=name, description=f"{source.kind}:{source.abspath}")

    def body(ns):
      ns.update(name=BUILDER_NAME, BUILDER_CONFIGS=[config], __module__=__name__)

    _CLASSES[name] = types.new_class(f"ImageFolder_{name}", (ImageFolder,), {"skip_registration": True}, body)
  return _CLASSES[name]


def get_builder(source: Source, data_dir: str | None = None, **kwargs) -> ImageFolder:
  """The builder of a source (kwargs: ImageFolder's scan_result, workers, allow_outside_root)."""
  cls = builder_class(source)
  return cls(config=source.config_name, data_dir=data_dir, file_format=local.FILE_FORMAT, source=source, **kwargs)


_ESCAPES = {"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"}


def _escape(text: str) -> str:
  r"""``text`` on one line of skipped.txt: backslash escapes for backslash, control characters and what is no UTF-8.

  C0 controls, DEL, C1 controls, the Unicode line and paragraph separators (str.splitlines() splits on them) and the
  surrogates os.listdir() gives for bytes that are no UTF-8 become ``\t``, ``\n``, ``\x1b``, ``\u2028``, ...; a
  name cannot write a line of its own (nor a tab, which parts name from reason).
  """
  return "".join(_ESCAPES.get(c) or (_escaped(c) if _unsafe(c) else c) for c in text)


def _unsafe(c: str) -> bool:
  """Whether a character may not stand as it is on a line of skipped.txt (see _escape)."""
  n = ord(c)
  return n < 0x20 or 0x7F <= n < 0xA0 or n in (0x2028, 0x2029) or 0xD800 <= n < 0xE000


def _escaped(c: str) -> str:
  r"""A character's backslash escape: ``\xNN`` (a byte that is no UTF-8 is its byte: surrogate U+DCNN), ``\uNNNN``."""
  n = ord(c)
  if 0xDC80 <= n < 0xDD00:
    n -= 0xDC00
  return f"\\x{n:02x}" if n < 0x100 else f"\\u{n:04x}"


def report(builder: ImageFolder) -> None:
  """After preparing: writes ``skipped.txt`` beside the dataset (when files were skipped) and logs what was done.

  It logs one line for the conversions and one for the skipped files.
  """
  converted = {k.split(": ", 1)[1]: v for k, v in builder.counts.items() if k.startswith("converted")}
  if converted:
    kinds = collections.Counter()
    for why, n in converted.items():
      kinds[why.split(":")[0]] += n
    logging.info(
      "%s: %d images kept as they are; %d converted to RGB once (%s)",
      builder.source.name,
      builder.counts["kept"],
      sum(converted.values()),
      ", ".join(f"{n} {why}" for why, n in kinds.most_common(6)),
    )
  scanned = builder.scan_result
  if scanned is not None and scanned.ignored:
    logging.info(
      "%s: ignored %d files outside class folders (e.g. %s)",
      builder.source.name,
      len(scanned.ignored),
      _escape(os.path.relpath(scanned.ignored[0], _base(builder.source))),
    )
  if builder.skipped:
    path = os.path.join(builder.data_dir, SKIPPED_FILE)
    paths.write_text(path, "".join(f"{_escape(name)}\t{_escape(why)}\n" for name, why in builder.skipped))
    total = sum(builder.counts.values()) + len(builder.skipped)
    first = "; ".join(f"{_escape(name)}: {_escape(why)}" for name, why in builder.skipped[:3])
    logging.warning(
      "%s: skipped %d of %d files that are not readable images or not read (%s%s); all of them are listed in %s",
      builder.source.name,
      len(builder.skipped),
      total,
      first,
      "; ..." if len(builder.skipped) > 3 else "",
      path,
    )
