"""Parallel-text sources: the Debian Bibles, the Ding dictionary, TSV and line-aligned files, tfds datasets.

`load_pairs(source, src_lang=..., tgt_lang=...)` is the entry point; see vitjax.data.text for the source names.
"""

from __future__ import annotations

import os
import re
from typing import Any

import numpy as np

from vitjax.data import sword
from vitjax.errors import DatasetNotPreparedError

Pair = tuple[str, str]


class SourceNotAvailableError(DatasetNotPreparedError):
  """A text source is not installed / prepared; the message says how."""


BIBLE_MODULES = {"en": ("engKJV2006eb", "sword-text-kjv"), "es": ("spaRV1909eb", "sword-text-sparv")}
DING_PATH = "/usr/share/trans/de-en"
DING_PACKAGE = "trans-de-en"


def _norm_ws(text: str) -> str:
  return " ".join(text.split())


def _orient(pairs: list[Pair], langs: tuple[str, str], src_lang: str, tgt_lang: str, what: str) -> list[Pair]:
  if (src_lang, tgt_lang) == langs:
    return pairs
  if (tgt_lang, src_lang) == langs:
    return [(b, a) for a, b in pairs]
  raise ValueError(f"{what} has languages {langs[0]}<->{langs[1]}; got src_lang={src_lang!r}, tgt_lang={tgt_lang!r}.")


def bible_pairs(
  sword_dir: str | None = None,
  *,
  check_alignment: bool = True,
  stats: dict | None = None,
  refs: list | None = None,
) -> list[Pair]:
  """(English, Spanish) verse pairs, in canonical (verse-index) order.

  Args:
    sword_dir: SWORD library root holding ``mods.d`` (default: the standard
      places, ``/usr/share/sword`` for Debian's packages).
    check_alignment: drop pairs that look misaligned: both modules tag words
      with Strong's numbers, so the English verse ``i`` shares most of its
      numbers with its Spanish counterpart. A pair is dropped when the Spanish
      entry ``i+d`` (``0 < |d| <= 5``) shares clearly more (Jaccard overlap
      larger by > 0.1) or when the overlap at ``i`` is < 0.1. About 0.6% of the
      pairs go: chapters where the Spanish numbering is shifted (Num 13,
      Job 39-41, ...). Has no effect without Strong's numbers.
    stats: if given, filled with counts (entries, empty, misaligned, pairs).
    refs: if given, filled with each pair's OSIS reference ("Gen.1.1"; :func:`sword.references`).

  Raises:
    SourceNotAvailableError: a module is missing (message names the package).
    ValueError: the modules' verse indices do not have the same versification.
  """
  dirs = [sword_dir] if sword_dir else None
  raw = {}
  for lang, (module, package) in BIBLE_MODULES.items():
    try:
      conf, entries = sword.read_module(module, dirs, plain=False)
    except sword.ModuleNotFoundInLibraryError as e:
      raise SourceNotAvailableError(f"{e}\nInstall it with: apt-get install {package}") from e
    raw[lang] = (conf, entries)
  (conf_en, en), (conf_es, es) = raw["en"], raw["es"]
  if conf_en.versification != conf_es.versification or len(en) != len(es):
    raise ValueError(
      f"{conf_en.name} ({conf_en.versification}, {len(en)} entries) and "
      f"{conf_es.name} ({conf_es.versification}, {len(es)} entries) do not "
      "share a versification; verses cannot be paired by index."
    )
  plain_en = [sword.strip_markup(x) for x in en]
  plain_es = [sword.strip_markup(x) for x in es]
  keep = [bool(a and b) for a, b in zip(plain_en, plain_es)]
  num_empty = keep.count(False)
  num_misaligned = 0
  if check_alignment:
    bad = _misaligned(en, es, keep)
    num_misaligned = len(bad)
    for i in bad:
      keep[i] = False
  pairs = [(a, b) for a, b, k in zip(plain_en, plain_es, keep) if k]
  if refs is not None:
    refs.extend(r for r, k in zip(sword.references(en), keep) if k)
  if stats is not None:
    stats.update(entries=len(en), empty=num_empty, misaligned=num_misaligned, pairs=len(pairs))
  return pairs


_STRONGS = re.compile(r"strong:([HG]\d+)")


def _misaligned(
  a: list[str], b: list[str], keep: list[bool], max_shift: int = 5, margin: float = 0.1, min_overlap: float = 0.1
) -> list[int]:
  """Indices whose Strong's numbers say that a[i] does not go with b[i]."""
  sa = [set(_STRONGS.findall(x)) for x in a]
  sb = [set(_STRONGS.findall(x)) for x in b]

  def jaccard(x, y):
    return len(x & y) / len(x | y) if x and y else 0.0

  bad = []
  n = len(a)
  for i in range(n):
    if not keep[i] or not sa[i] or not sb[i]:
      continue
    j0 = jaccard(sa[i], sb[i])
    best = max(
      (jaccard(sa[i], sb[i + d]) for d in range(-max_shift, max_shift + 1) if d and 0 <= i + d < n), default=0.0
    )
    if best > j0 + margin or j0 < min_overlap:
      bad.append(i)
  return bad


_ANNOTATION = re.compile(r"\{[^{}]*\}|\[[^\[\]]*\]|\([^()]*\)")


_BRACKETS = re.compile(r"[{}\[\]()]")


def _strip_annotations(text: str) -> str:
  prev = None
  while prev != text:  # innermost first, so nested brackets go too
    prev, text = text, _ANNOTATION.sub(" ", text)
  return text


def ding_alternatives(line: str) -> list[tuple[list[str], list[str]]]:
  """(German synonyms, English synonyms) of each alternative of one Ding dictionary line.

  A line is ``German :: English``; each side lists alternatives separated by
  ``|`` that correspond positionally (headword | plural | example phrase ...),
  each alternative lists synonyms separated by ``;``. Steps: drop ``#``
  comment lines; strip annotations ``{m}``, ``{pl}``, ``{hid; hidden}``,
  ``[ugs.]``, ``[Br.]`` and parenthesised glosses ``(auf der Speisekarte)``
  (nested ones too) -- they are grammar / usage labels or explanations that the
  other side does not mirror; split ``|`` positionally (lines whose sides have
  different numbers of alternatives are skipped, and so are alternatives with
  an unbalanced bracket left); normalise whitespace; empty ones skipped.
  """
  line = line.strip()
  if not line or line.startswith("#") or " :: " not in line:
    return []
  de, en = line.split(" :: ", 1)
  de_alts = _strip_annotations(de).split("|")
  en_alts = _strip_annotations(en).split("|")
  if len(de_alts) != len(en_alts):
    return []
  out = []
  for d, e in zip(de_alts, en_alts):
    if _BRACKETS.search(d + e):
      continue  # an unbalanced bracket: malformed alternative
    d_syn = [x for x in (_norm_ws(s) for s in d.split(";")) if x]
    e_syn = [x for x in (_norm_ws(s) for s in e.split(";")) if x]
    if d_syn and e_syn:
      out.append((d_syn, e_syn))
  return out


def parse_ding_line(line: str, synonyms: str = "first") -> list[Pair]:
  """(German, English) pairs from one Ding dictionary line (see ding_alternatives).

  Args:
    line: one line of the dictionary file.
    synonyms: ``'first'`` (default) keeps the first synonym of each side --
      one clean pair per alternative; ``'all'`` pairs every German synonym with
      every English one (many near-duplicate pairs).
  """
  if synonyms not in ("first", "all"):
    raise ValueError(f"synonyms must be 'first' or 'all', got {synonyms!r}")
  pairs = []
  for d_syn, e_syn in ding_alternatives(line):
    if synonyms == "first":
      pairs.append((d_syn[0], e_syn[0]))
    else:
      pairs.extend((x, y) for x in d_syn for y in e_syn)
  return pairs


def _ding_lines(path: str):
  if not os.path.exists(path):
    raise SourceNotAvailableError(
      f"Ding dictionary not found at {path}. Install it with: apt-get install {DING_PACKAGE}"
    )
  with open(path, encoding="utf-8", errors="replace") as f:
    yield from f


def ding_pairs(path: str = DING_PATH, synonyms: str = "first") -> list[Pair]:
  """(German, English) pairs of the whole Ding file, in file order."""
  return [pair for line in _ding_lines(path) for pair in parse_ding_line(line, synonyms)]


def ding_references(path: str = DING_PATH, target: str = "en") -> dict[Pair, list[str]]:
  """The references a dictionary entry's translation may match.

  {(German, English) pair as ding_pairs gives it: every synonym on the `target` side ('en' or 'de') of the alternatives
  it comes from}. A pair that several lines give collects the synonyms of all of them.
  """
  refs: dict[Pair, list[str]] = {}
  for line in _ding_lines(path):
    for d_syn, e_syn in ding_alternatives(line):
      found = refs.setdefault((d_syn[0], e_syn[0]), [])
      found.extend(x for x in (e_syn if target == "en" else d_syn) if x not in found)
  return refs


def _need_file(path: str, source: str) -> None:
  if not os.path.isfile(path):
    raise SourceNotAvailableError(f"{source}: no such file {path}; check config.data.source")


def tsv_pairs(path: str) -> list[Pair]:
  """``source<TAB>target`` lines; no quoting: tabs separate.

  Extra columns are ignored; lines with fewer than two columns or an empty side are skipped.
  """
  _need_file(path, f"tsv:{path}")
  pairs, lines = [], 0
  with open(path, encoding="utf-8") as f:
    for line in f:
      lines += bool(line.strip())
      cols = line.rstrip("\r\n").split("\t")
      if len(cols) < 2:
        continue
      a, b = _norm_ws(cols[0]), _norm_ws(cols[1])
      if a and b:
        pairs.append((a, b))
  if lines and not pairs:  # e.g. comma-separated: silently no data
    raise ValueError(f"tsv:{path}: none of its {lines} lines is source<TAB>target; separate the sides with a tab")
  return pairs


def file_pairs(src_path: str, tgt_path: str) -> list[Pair]:
  """Two line-aligned files; pairs with an empty side are skipped.

  Raises:
    ValueError: the files have different numbers of lines.
  """
  for path in (src_path, tgt_path):
    _need_file(path, f"files:{src_path},{tgt_path}")
  with open(src_path, encoding="utf-8") as f:
    src = f.read().splitlines()
  with open(tgt_path, encoding="utf-8") as f:
    tgt = f.read().splitlines()
  if len(src) != len(tgt):
    raise ValueError(f"{src_path} has {len(src)} lines, {tgt_path} has {len(tgt)}: not line-aligned.")
  pairs = [(_norm_ws(a), _norm_ws(b)) for a, b in zip(src, tgt)]
  return [(a, b) for a, b in pairs if a and b]


def _as_str(value: Any) -> str:
  if isinstance(value, np.ndarray):
    value = value.item()
  if isinstance(value, bytes):
    return value.decode("utf-8")
  return str(value)


def tfds_pairs(
  name: str, *, src_lang: str, tgt_lang: str, data_dir: str | None = None, split: str = "train"
) -> list[Pair]:
  """Pairs of a tfds translation dataset prepared as array_record.

  The languages must be keys of the examples, at the top level (a
  ``Translation`` feature, e.g. ``wmt14_translate``, ``ted_hrlr_translate``)
  or in a nested dict; the builder's ``supervised_keys`` are shown on error.

  Raises:
    SourceNotAvailableError: not prepared in ``data_dir`` (message gives the
      ``tfds build`` command).
  """
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top

  data_dir = os.path.expanduser(data_dir or os.environ.get("TFDS_DATA_DIR", "~/tensorflow_datasets"))
  command = f"tfds build {name} --file_format=array_record --data_dir={data_dir}"
  try:
    builder = tfds.builder(name, data_dir=data_dir, file_format="array_record")
  except tfds.core.DatasetNotFoundError as e:
    raise SourceNotAvailableError(
      f"tfds dataset '{name}' is not known or not prepared in {data_dir}. Prepare it with:\n  {command}"
    ) from e
  if not builder.is_prepared():
    raise SourceNotAvailableError(f"tfds dataset '{name}' is not prepared in {data_dir}. Prepare it with:\n  {command}")
  file_format = builder.info.file_format
  if file_format is not None and "array_record" not in str(getattr(file_format, "value", file_format)):
    raise SourceNotAvailableError(
      f"tfds dataset '{name}' is stored as {file_format}, not array_record "
      f"(needed to read without TensorFlow). Prepare it with:\n  {command}"
    )
  source = builder.as_data_source(split=split)
  keys = builder.info.supervised_keys
  pairs = []
  chunk = 4096
  for start in range(0, len(source), chunk):
    for ex in source.__getitems__(list(range(start, min(start + chunk, len(source))))):
      d = _find_langs(ex, src_lang, tgt_lang)
      if d is None:
        raise ValueError(
          f"tfds dataset '{name}' examples have no keys {src_lang!r} and "
          f"{tgt_lang!r} (supervised_keys={keys}, example keys="
          f"{sorted(ex) if isinstance(ex, dict) else type(ex)})."
        )
      a, b = _norm_ws(_as_str(d[src_lang])), _norm_ws(_as_str(d[tgt_lang]))
      if a and b:
        pairs.append((a, b))
  return pairs


def _find_langs(ex: Any, a: str, b: str) -> dict | None:
  if not isinstance(ex, dict):
    return None
  if a in ex and b in ex:
    return ex
  for value in ex.values():
    found = _find_langs(value, a, b)
    if found is not None:
      return found
  return None


def _ding_path(arg: str, data_dir: str | None) -> str:
  return arg or (os.path.join(data_dir, "de-en") if data_dir else DING_PATH)


def load_references(source: str, *, src_lang: str, tgt_lang: str, data_dir: str | None = None):
  """Every acceptable target of each pair, for sources whose entries have several correct translations.

  {(source_text, target_text) as load_pairs gives it: every acceptable target} for such sources (the Ding dictionary's
  synonyms); None for the others (one reference each).
  """
  kind, _, arg = source.partition(":")
  if kind != "ding":
    return None
  _orient([], ("de", "en"), src_lang, tgt_lang, "ding")  # the languages' check
  refs = ding_references(_ding_path(arg, data_dir), target=tgt_lang)
  return refs if src_lang == "de" else {(b, a): v for (a, b), v in refs.items()}


def load_pairs(
  source: str, *, src_lang: str, tgt_lang: str, data_dir: str | None = None, refs: list | None = None
) -> list[tuple[str, str]]:
  """Loads ``(source_text, target_text)`` pairs, whitespace-normalised.

  Args:
    source: ``'bible'`` (en<->es), ``'ding'`` (de<->en), ``'tsv:PATH'``,
      ``'files:SRC_PATH,TGT_PATH'`` or ``'tfds:NAME[:SPLIT]'``.
    src_lang: source language code. For ``bible``/``ding`` it picks the
      direction; for ``tfds`` it is the example key; for files it is a label.
    tgt_lang: target language code (same roles).
    data_dir: ``bible``: SWORD library root (default ``/usr/share/sword``);
      ``ding``: folder holding the ``de-en`` file (default
      ``/usr/share/trans``); ``tfds``: tfds data dir (default
      ``$TFDS_DATA_DIR`` or ``~/tensorflow_datasets``).
    refs: if given, filled with each pair's reference: ``bible``'s verse ("Gen.1.1"); ValueError for a source
      without references.

  Returns:
    The pairs in the source's order (duplicates kept; :func:`split_pairs`
    removes them).

  Raises:
    SourceNotAvailableError: a Debian package is missing (the message names
      the ``apt-get install`` command) or a tfds dataset is not prepared (the
      message names the ``tfds build`` command).
  """
  kind, _, arg = source.partition(":")
  if kind == "bible":
    return _orient(bible_pairs(data_dir, refs=refs), ("en", "es"), src_lang, tgt_lang, "bible")
  if refs is not None:
    raise ValueError(f"source {source!r} has no verse references (only 'bible' has): split it by pairs")
  if kind == "ding":
    return _orient(ding_pairs(_ding_path(arg, data_dir)), ("de", "en"), src_lang, tgt_lang, "ding")
  if kind == "tsv" and arg:
    return tsv_pairs(arg)
  if kind == "files" and arg.count(",") == 1:
    src, tgt = arg.split(",")
    return file_pairs(src, tgt)
  if kind == "tfds" and arg:
    name, _, split = arg.partition(":")
    return tfds_pairs(name, src_lang=src_lang, tgt_lang=tgt_lang, data_dir=data_dir, split=split or "train")
  raise ValueError(f"Unknown text source {source!r}: use bible, ding, tsv:PATH, files:SRC,TGT or tfds:NAME[:SPLIT].")
