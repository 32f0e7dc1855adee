"""Parallel text for translation: sources, splits, SentencePiece, batches.

numpy + sentencepiece only (no TensorFlow). The pieces::

  pairs = load_pairs('bible', src_lang='en', tgt_lang='es')
  splits = split_pairs(pairs, seed=0, num_valid=1000, num_test=1000)
  tok = Tokenizer.train([t for p in splits['train'] for t in p],
                        '/tmp/spm_enes', vocab_size=8000)
  train_it = make_batches(splits['train'], tok, tokens_per_batch=4096,
                          max_len=128, seed=0)
  for batch in train_it: ...           # {'src', 'tgt', 'src_mask', 'tgt_mask'}
  state = train_it.get_state()         # -> checkpoint; train_it.set_state(state)
  for batch in make_eval_batches(splits['test'], tok, batch_size=64): ...

Sources (``load_pairs``):

* ``bible``: English (KJV, ``engKJV2006eb``) <-> Spanish (Reina-Valera 1909,
  ``spaRV1909eb``) verses, read from Debian's ``sword-text-kjv`` /
  ``sword-text-sparv`` SWORD modules with :mod:`vitjax.data.sword`. Both use
  the KJV versification, so verse-index entry ``i`` of one pairs with entry
  ``i`` of the other; entries empty on either side (book and chapter headings,
  verses the Spanish merges into a neighbour) are dropped, and so are pairs
  that the modules' Strong's numbers show to be misaligned (a few chapters
  where the Spanish numbering is shifted; see :func:`bible_pairs`).
* ``ding``: German <-> English from Debian's ``trans-de-en`` (the Ding
  dictionary, ``/usr/share/trans/de-en``); see :func:`parse_ding_line`.
* ``tsv:PATH``: ``source<TAB>target`` lines. ``files:SRC,TGT``: two
  line-aligned files.
* ``tfds:NAME[:SPLIT]``: a tfds translation dataset prepared as array_record in
  ``data_dir`` (e.g. ``tfds:wmt14_translate/de-en:validation``; split default
  ``train``), read with ``as_data_source`` (no TensorFlow).

Token ids: pad=0, eos=1, bos=2, unk=3 (:class:`Tokenizer`). Every sequence in
a batch ends with EOS and is right-padded with 0.
"""

from __future__ import annotations

import hashlib
import os
import re
import sys
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np

from vitjax.data import sword

PAD_ID, EOS_ID, BOS_ID, UNK_ID = 0, 1, 2, 3

Pair = tuple[str, str]


class SourceNotAvailableError(FileNotFoundError):
  """A text source is not installed / prepared; the message says how."""


# ----------------------------------------------------------------------------
# Sources.

#: SWORD module and Debian package per Bible language.
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


def bible_pairs(sword_dir: str | None = None, *, check_alignment: bool = True, stats: dict | None = None) -> list[Pair]:
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


def parse_ding_line(line: str, synonyms: str = "first") -> list[Pair]:
  """(German, English) pairs from one Ding dictionary line.

  A line is ``German :: English``; each side lists alternatives separated by
  ``|`` that correspond positionally (headword | plural | example phrase ...),
  each alternative lists synonyms separated by ``;``. Steps: drop ``#``
  comment lines; strip annotations ``{m}``, ``{pl}``, ``{hid; hidden}``,
  ``[ugs.]``, ``[Br.]`` and parenthesised glosses ``(auf der Speisekarte)``
  (nested ones too) -- they are grammar / usage labels or explanations that the
  other side does not mirror; split ``|`` positionally (lines whose sides have
  different numbers of alternatives are skipped, and so are alternatives with
  an unbalanced bracket left); normalise whitespace.

  Args:
    line: one line of the dictionary file.
    synonyms: ``'first'`` (default) keeps the first synonym of each side --
      one clean pair per alternative; ``'all'`` pairs every German synonym with
      every English one (many near-duplicate pairs).

  Returns:
    The pairs, empty alternatives skipped.
  """
  line = line.strip()
  if not line or line.startswith("#") or " :: " not in line:
    return []
  de, en = line.split(" :: ", 1)
  de_alts = _strip_annotations(de).split("|")
  en_alts = _strip_annotations(en).split("|")
  if len(de_alts) != len(en_alts):
    return []
  pairs = []
  for d, e in zip(de_alts, en_alts):
    if _BRACKETS.search(d + e):
      continue  # an unbalanced bracket: malformed alternative
    d_syn = [_norm_ws(s) for s in d.split(";")]
    e_syn = [_norm_ws(s) for s in e.split(";")]
    d_syn = [s for s in d_syn if s]
    e_syn = [s for s in e_syn if s]
    if not d_syn or not e_syn:
      continue
    if synonyms == "first":
      pairs.append((d_syn[0], e_syn[0]))
    elif synonyms == "all":
      pairs.extend((x, y) for x in d_syn for y in e_syn)
    else:
      raise ValueError(f"synonyms must be 'first' or 'all', got {synonyms!r}")
  return pairs


def ding_pairs(path: str = DING_PATH, synonyms: str = "first") -> list[Pair]:
  """(German, English) pairs of the whole Ding file, in file order."""
  if not os.path.exists(path):
    raise SourceNotAvailableError(
      f"Ding dictionary not found at {path}. Install it with: apt-get install {DING_PACKAGE}"
    )
  pairs = []
  with open(path, encoding="utf-8", errors="replace") as f:
    for line in f:
      pairs.extend(parse_ding_line(line, synonyms))
  return pairs


def tsv_pairs(path: str) -> list[Pair]:
  """``source<TAB>target`` lines (extra columns ignored; lines with fewer than
  two columns or an empty side are skipped). No quoting: tabs separate."""
  pairs = []
  with open(path, encoding="utf-8") as f:
    for line in f:
      cols = line.rstrip("\r\n").split("\t")
      if len(cols) < 2:
        continue
      a, b = _norm_ws(cols[0]), _norm_ws(cols[1])
      if a and b:
        pairs.append((a, b))
  return pairs


def file_pairs(src_path: str, tgt_path: str) -> list[Pair]:
  """Two line-aligned files; pairs with an empty side are skipped.

  Raises:
    ValueError: the files have different numbers of lines.
  """
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


def load_pairs(source: str, *, src_lang: str, tgt_lang: str, data_dir: str | None = None) -> list[tuple[str, str]]:
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
    return _orient(bible_pairs(data_dir), ("en", "es"), src_lang, tgt_lang, "bible")
  if kind == "ding":
    path = arg or (os.path.join(data_dir, "de-en") if data_dir else DING_PATH)
    return _orient(ding_pairs(path), ("de", "en"), src_lang, tgt_lang, "ding")
  if kind == "tsv" and arg:
    return tsv_pairs(arg)
  if kind == "files" and arg.count(",") == 1:
    src, tgt = arg.split(",")
    return file_pairs(src, tgt)
  if kind == "tfds" and arg:
    name, _, split = arg.partition(":")
    return tfds_pairs(name, src_lang=src_lang, tgt_lang=tgt_lang, data_dir=data_dir, split=split or "train")
  raise ValueError(f"Unknown text source {source!r}: use bible, ding, tsv:PATH, files:SRC,TGT or tfds:NAME[:SPLIT].")


# ----------------------------------------------------------------------------
# Splits.


def split_pairs(pairs: Sequence[Pair], seed: int, num_valid: int, num_test: int) -> dict[str, list[Pair]]:
  """Deduplicates and splits pairs into train / valid / test.

  Exact duplicate pairs are removed first (first occurrence kept), so a test
  pair never also appears in train. Then ``perm =
  np.random.default_rng(seed).permutation(n)``: ``perm[:num_test]`` is test,
  ``perm[num_test:num_test + num_valid]`` valid, the rest train; each split is
  returned in the original corpus order. The held-out sets depend only on the
  (deduplicated) pairs and the seed.
  """
  unique = list(dict.fromkeys((a, b) for a, b in pairs))
  n = len(unique)
  if num_valid < 0 or num_test < 0 or num_valid + num_test > n:
    raise ValueError(f"Cannot hold out {num_valid} + {num_test} of {n} pairs.")
  perm = np.random.default_rng(seed).permutation(n)
  test = np.sort(perm[:num_test])
  valid = np.sort(perm[num_test : num_test + num_valid])
  train = np.sort(perm[num_test + num_valid :])
  return {name: [unique[i] for i in idx] for name, idx in (("train", train), ("valid", valid), ("test", test))}


# ----------------------------------------------------------------------------
# Tokenizer.


class Tokenizer:
  """A SentencePiece model with fixed special ids pad=0, eos=1, bos=2, unk=3.

  One model for source and target (a joint vocabulary, so embeddings can be
  shared). ``encode`` adds no bos/eos; ``decode`` stops at the first eos and
  skips pad/bos.
  """

  PAD, EOS, BOS, UNK = PAD_ID, EOS_ID, BOS_ID, UNK_ID

  def __init__(self, processor, path: str | None = None):
    self.sp = processor
    self.path = path
    ids = (processor.pad_id(), processor.eos_id(), processor.bos_id(), processor.unk_id())
    if ids != (PAD_ID, EOS_ID, BOS_ID, UNK_ID):
      raise ValueError(
        f"{path}: special ids (pad, eos, bos, unk) = {ids}, expected {(PAD_ID, EOS_ID, BOS_ID, UNK_ID)}."
      )

  @classmethod
  def load(cls, path: str) -> Tokenizer:
    """Loads ``PREFIX.model`` written by :meth:`train`."""
    import sentencepiece as spm  # pylint: disable=g-import-not-at-top

    return cls(spm.SentencePieceProcessor(model_file=path), path)

  @classmethod
  def train(
    cls,
    texts: Iterable[str],
    path_prefix: str,
    vocab_size: int = 8000,
    *,
    model_type: str = "unigram",
    character_coverage: float = 0.9995,
    input_sentence_size: int = 1_000_000,
    seed: int = 0,
    num_threads: int = 1,
    hard_vocab_limit: bool = True,
    **kwargs,
  ) -> Tokenizer:
    """Trains on ``texts`` (source and target sentences of the train split)
    and writes ``path_prefix.model`` / ``.vocab``.

    Deterministic: if there are more than ``input_sentence_size`` texts, a
    subset is drawn here with ``np.random.default_rng(seed)`` (kept in corpus
    order; SentencePiece's own sampling/shuffling is off), SentencePiece's rng
    is seeded too, and training runs on ``num_threads`` threads: the same
    pieces and scores on every run (the ``.model`` also records its path). ``byte_fallback`` is off, so characters outside
    the model's alphabet (never seen, or rarer than ``character_coverage``
    allows) encode to unk (3). ``hard_vocab_limit=False`` lets a tiny corpus
    produce fewer pieces instead of failing. Extra ``kwargs`` go to
    ``SentencePieceTrainer.train``.
    """
    import sentencepiece as spm  # pylint: disable=g-import-not-at-top

    texts = [t for t in (_norm_ws(t) for t in texts) if t]
    if len(texts) > input_sentence_size:
      keep = np.sort(np.random.default_rng(seed).choice(len(texts), input_sentence_size, replace=False))
      texts = [texts[i] for i in keep]
    spm.set_random_generator_seed(seed)
    os.makedirs(os.path.dirname(os.path.abspath(path_prefix)), exist_ok=True)
    spm.SentencePieceTrainer.train(
      sentence_iterator=iter(texts),
      model_prefix=path_prefix,
      vocab_size=vocab_size,
      model_type=model_type,
      character_coverage=character_coverage,
      pad_id=PAD_ID,
      eos_id=EOS_ID,
      bos_id=BOS_ID,
      unk_id=UNK_ID,
      byte_fallback=False,
      shuffle_input_sentence=False,
      input_sentence_size=0,
      num_threads=num_threads,
      hard_vocab_limit=hard_vocab_limit,
      minloglevel=2,
      **kwargs,
    )
    return cls.load(path_prefix + ".model")

  @property
  def vocab_size(self) -> int:
    return self.sp.get_piece_size()

  def encode(self, text: str) -> list[int]:
    """Token ids of ``text``, no bos/eos."""
    return self.sp.encode(text)

  def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
    return self.sp.encode(list(texts))

  def decode(self, ids: Sequence[int]) -> str:
    """Text of ``ids`` up to the first eos; pad and bos are skipped."""
    out = []
    for i in np.asarray(ids, dtype=np.int64).reshape(-1).tolist():
      if i == EOS_ID:
        break
      if i not in (PAD_ID, BOS_ID) and 0 <= i < self.vocab_size:
        out.append(i)
    return self.sp.decode(out)

  def decode_batch(self, ids: Any) -> list[str]:
    return [self.decode(row) for row in ids]


# ----------------------------------------------------------------------------
# Batching.


def default_buckets(max_len: int, per_octave: int = 2, smallest: int = 8) -> tuple[int, ...]:
  """Bucket lengths: ``per_octave`` lengths per doubling, multiples of 8,
  capped by and ending with ``max_len``; jit compiles one shape per bucket.

  ``per_octave=1``: 8, 16, 32, 64, 128; ``2`` (default): 8, 16, 24, 32, 48, 64,
  96, 128; ``4``: 8, 16, 24, ..., 64, 80, 96, 112, 128.
  """
  lengths = set()
  octave = smallest
  while octave < max_len:
    for k in range(per_octave):
      length = int(round(octave * (1 + k / per_octave) / 8)) * 8
      if smallest <= length < max_len:
        lengths.add(max(length, smallest))
    octave *= 2
  return tuple(sorted(lengths)) + (max_len,)


class EncodedPairs:
  """Token ids of pairs, each sequence ending with EOS, stored flat.

  Attributes:
    src, tgt: flat int32 token arrays; ``src_offsets`` / ``tgt_offsets`` int64
      ``[n + 1]`` delimit pair ``i``.
    pair_index: index of each kept pair in the input list.
    num_input, num_dropped, num_truncated: counts of the length filter.
  """

  def __init__(
    self, pairs: Sequence[Pair], tokenizer: Tokenizer, max_len: int | None, too_long: str = "drop", chunk: int = 8192
  ):
    if too_long not in ("drop", "truncate"):
      raise ValueError(f"too_long must be 'drop' or 'truncate', got {too_long!r}")
    srcs, tgts, kept = [], [], []
    self.num_input = len(pairs)
    self.num_dropped = self.num_truncated = 0
    for start in range(0, len(pairs), chunk):
      part = pairs[start : start + chunk]
      src_ids = tokenizer.encode_batch([p[0] for p in part])
      tgt_ids = tokenizer.encode_batch([p[1] for p in part])
      for k, (s, t) in enumerate(zip(src_ids, tgt_ids)):
        s = s + [EOS_ID]
        t = t + [EOS_ID]
        if max_len is not None and max(len(s), len(t)) > max_len:
          if too_long == "drop":
            self.num_dropped += 1
            continue
          self.num_truncated += 1
          s = s[: max_len - 1] + [EOS_ID] if len(s) > max_len else s
          t = t[: max_len - 1] + [EOS_ID] if len(t) > max_len else t
        srcs.append(np.asarray(s, np.int32))
        tgts.append(np.asarray(t, np.int32))
        kept.append(start + k)
    self.pair_index = np.asarray(kept, np.int64)
    self.src_lengths = np.asarray([len(s) for s in srcs], np.int64)
    self.tgt_lengths = np.asarray([len(t) for t in tgts], np.int64)
    self.src_offsets = np.concatenate([[0], np.cumsum(self.src_lengths)])
    self.tgt_offsets = np.concatenate([[0], np.cumsum(self.tgt_lengths)])
    self.src = np.concatenate(srcs) if srcs else np.zeros(0, np.int32)
    self.tgt = np.concatenate(tgts) if tgts else np.zeros(0, np.int32)

  def __len__(self) -> int:
    return len(self.pair_index)

  def fill(self, rows: np.ndarray, length: int, size: int) -> tuple[np.ndarray, np.ndarray]:
    """``[size, length]`` src and tgt arrays of ``rows`` (-1: padding row)."""
    src = np.zeros((size, length), np.int32)
    tgt = np.zeros((size, length), np.int32)
    for r, i in enumerate(rows):
      if i < 0:
        continue
      s = self.src[self.src_offsets[i] : self.src_offsets[i + 1]][:length]
      t = self.tgt[self.tgt_offsets[i] : self.tgt_offsets[i + 1]][:length]
      src[r, : len(s)] = s
      tgt[r, : len(t)] = t
    return src, tgt


class BatchIterator(Iterator[dict[str, np.ndarray]]):
  """Training batches, bucketed by length, sharded over processes.

  Built by :func:`make_batches` (see there). Iterating yields dicts
  ``{'src': int32 [B, L], 'tgt': int32 [B, L], 'src_mask', 'tgt_mask': bool
  [B, L]}`` where ``L`` is a bucket length and ``B = batch_sizes[L]``.
  ``get_state()`` / ``set_state()`` save and restore the position.
  """

  def __init__(
    self,
    data: EncodedPairs,
    *,
    buckets: Sequence[int],
    batch_sizes: dict[int, int],
    seed: int,
    shuffle: bool,
    num_epochs: int | None,
    process_index: int,
    process_count: int,
    with_mask: bool,
  ):
    self.data = data
    self.buckets = tuple(buckets)
    self.batch_sizes = dict(batch_sizes)
    self.seed = int(seed)
    self.shuffle = shuffle
    self.num_epochs = num_epochs
    self.process_index = process_index
    self.process_count = process_count
    self.with_mask = with_mask
    longest = np.maximum(data.src_lengths, data.tgt_lengths)
    bucket_of = np.searchsorted(np.asarray(self.buckets), longest)
    if len(longest) and bucket_of.max() >= len(self.buckets):
      raise ValueError(f"A pair has {longest.max()} tokens, more than the largest bucket {self.buckets[-1]}.")
    self._members = [np.flatnonzero(bucket_of == b) for b in range(len(self.buckets))]
    self.epoch = 0
    self.step = 0
    self._schedule_epoch = None
    self._schedule: list[tuple[int, np.ndarray]] = []
    self._fingerprint_cache = None
    if self.steps_per_epoch == 0:
      raise ValueError(
        "No full batch: fewer pairs per bucket than the global batch size "
        f"(bucket sizes {[len(m) for m in self._members]}, global batch "
        f"sizes {[self.batch_sizes[b] * process_count for b in buckets]})."
      )

  # The schedule of one epoch is a pure function of (seed, epoch), computed
  # identically on every process.
  def schedule(self, epoch: int) -> list[tuple[int, np.ndarray]]:
    """``[(bucket_length, global_rows)]`` of an epoch, in yield order."""
    if self._schedule_epoch == epoch:
      return self._schedule
    rng = np.random.default_rng([self.seed, epoch])
    batches = []
    carry = np.zeros(0, np.int64)
    for length, members in zip(self.buckets, self._members):
      pool = np.concatenate([carry, members])
      if self.shuffle:
        pool = rng.permutation(pool)
      size = self.batch_sizes[length] * self.process_count
      full = len(pool) // size
      for k in range(full):
        batches.append((length, pool[k * size : (k + 1) * size]))
      carry = pool[full * size :]  # too few for a batch: padded up a bucket
    if self.shuffle:
      order = rng.permutation(len(batches))
      batches = [batches[i] for i in order]
    self._schedule_epoch, self._schedule = epoch, batches
    return batches

  @property
  def steps_per_epoch(self) -> int:
    steps, carry = 0, 0
    for length, members in zip(self.buckets, self._members):
      size = self.batch_sizes[length] * self.process_count
      steps += (carry + len(members)) // size
      carry = (carry + len(members)) % size
    return steps

  def local_rows(self, length: int, rows: np.ndarray) -> np.ndarray:
    size = self.batch_sizes[length]
    return rows[self.process_index * size : (self.process_index + 1) * size]

  def __iter__(self):
    return self

  def __next__(self) -> dict[str, np.ndarray]:
    if self.num_epochs is not None and self.epoch >= self.num_epochs:
      raise StopIteration
    schedule = self.schedule(self.epoch)
    length, rows = schedule[self.step]
    self.step += 1
    if self.step >= len(schedule):
      self.epoch, self.step = self.epoch + 1, 0
    rows = self.local_rows(length, rows)
    src, tgt = self.data.fill(rows, length, len(rows))
    batch = {"src": src, "tgt": tgt}
    if self.with_mask:
      batch["src_mask"] = src != PAD_ID
      batch["tgt_mask"] = tgt != PAD_ID
    return batch

  def _fingerprint(self) -> str:
    if self._fingerprint_cache is None:
      self._fingerprint_cache = self._compute_fingerprint()
    return self._fingerprint_cache

  def _compute_fingerprint(self) -> str:
    h = hashlib.sha256()
    for arr in (self.data.src_lengths, self.data.tgt_lengths):
      h.update(np.ascontiguousarray(arr).tobytes())
    h.update(repr((self.buckets, sorted(self.batch_sizes.items()), self.shuffle, self.process_count)).encode())
    return h.hexdigest()[:16]

  def get_state(self) -> dict[str, Any]:
    """Position to checkpoint: ``{'epoch', 'step', 'seed', 'fingerprint'}``
    (the same on every process; ``step`` counts batches within the epoch)."""
    return {"epoch": self.epoch, "step": self.step, "seed": self.seed, "fingerprint": self._fingerprint()}

  def set_state(self, state: dict[str, Any]) -> None:
    """Resumes at a position from :meth:`get_state`: the next batches are
    exactly those that would have followed. The data, buckets, batch sizes and
    process count must be those of the saved run (checked)."""
    if int(state["seed"]) != self.seed or state["fingerprint"] != (self._fingerprint()):
      raise ValueError("State was saved with another seed, data, bucket or batch configuration or process count.")
    epoch, step = int(state["epoch"]), int(state["step"])
    if not 0 <= step < max(1, self.steps_per_epoch):
      raise ValueError(f"step {step} out of range for {self.steps_per_epoch} steps per epoch.")
    self.epoch, self.step = epoch, step

  def padding_efficiency(self, epoch: int = 0) -> float:
    """Fraction of non-pad positions in this process's src+tgt arrays over
    one epoch."""
    real = total = 0
    for length, rows in self.schedule(epoch):
      rows = self.local_rows(length, rows)
      real += int(self.data.src_lengths[rows].sum() + self.data.tgt_lengths[rows].sum())
      total += 2 * length * len(rows)
    return real / max(total, 1)

  def stats(self) -> dict[str, Any]:
    """Counts: pairs in/kept/dropped/truncated, pairs per bucket, batches
    and unused pairs (the last bucket's remainder) per epoch."""
    used = sum(len(r) for _, r in self.schedule(0))
    return {
      "pairs": self.data.num_input,
      "kept": len(self.data),
      "dropped_too_long": self.data.num_dropped,
      "truncated": self.data.num_truncated,
      "per_bucket": {b: len(m) for b, m in zip(self.buckets, self._members)},
      "batch_sizes": dict(self.batch_sizes),
      "steps_per_epoch": self.steps_per_epoch,
      "unused_per_epoch": len(self.data) - used,
    }


def _batch_sizes(
  buckets: Sequence[int], batch_size: int | None, tokens_per_batch: int | None, multiple: int
) -> dict[int, int]:
  if (batch_size is None) == (tokens_per_batch is None):
    raise ValueError("Give exactly one of batch_size and tokens_per_batch.")
  if batch_size is not None:
    if batch_size % multiple:
      raise ValueError(f"batch_size {batch_size} is not a multiple of batch_multiple {multiple}.")
    return {b: batch_size for b in buckets}
  return {b: max(multiple, tokens_per_batch // b // multiple * multiple) for b in buckets}


def make_batches(
  pairs: Sequence[Pair] | EncodedPairs,
  tokenizer: Tokenizer | None = None,
  *,
  batch_size: int | None = None,
  tokens_per_batch: int | None = None,
  max_len: int = 128,
  buckets: Sequence[int] | None = None,
  too_long: str = "drop",
  batch_multiple: int = 1,
  seed: int = 0,
  shuffle: bool = True,
  num_epochs: int | None = None,
  process_index: int = 0,
  process_count: int = 1,
  with_mask: bool = True,
) -> BatchIterator:
  """Training batches of ``(src, tgt)`` token ids, bucketed by length.

  Each pair is tokenized, EOS appended to both sides, and goes to the smallest
  bucket length ``L >= max(len(src), len(tgt))``; a batch holds pairs of one
  bucket, padded with 0 to ``[B, L]`` (src and tgt both). Pairs longer than
  ``max_len`` tokens (EOS included) are dropped or truncated (``too_long``);
  :meth:`BatchIterator.stats` counts them.

  Per epoch ``e``, with ``rng = np.random.default_rng([seed, e])`` and
  ``P = process_count``: going up the buckets, each bucket's pairs (plus those
  carried up from the bucket below) are permuted and cut into global batches
  of ``P * B`` pairs; the remainder (< ``P * B``) is carried up to the next
  bucket (padded longer), so only the last bucket's remainder is left out of
  the epoch (a different one each epoch). The list of global batches is then
  permuted. Process ``p`` yields rows ``[p * B, (p + 1) * B)`` of each global
  batch: the processes get disjoint pairs and, step by step, batches of the
  same shape, as multi-host jit needs. Every process must be given the same
  pairs and arguments except ``process_index``.

  Args:
    pairs: (source, target) strings, or an :class:`EncodedPairs`.
    tokenizer: the :class:`Tokenizer` (unused for EncodedPairs).
    batch_size: fixed per-process batch size for every bucket, or
    tokens_per_batch: per-process budget of ``B * L`` positions per side:
      ``B = max(m, tokens_per_batch // L // m * m)`` with ``m =
      batch_multiple``.
    max_len: the longest sequence kept, EOS included.
    buckets: bucket lengths (default :func:`default_buckets` of ``max_len``:
      8, 16, 24, 32, 48, 64, 96, 128, ... up to ``max_len``).
    too_long: ``'drop'`` or ``'truncate'`` (keeps the first ``max_len - 1``
      tokens and EOS).
    batch_multiple: per-process batch sizes are multiples of this (the local
      device count).
    seed: shuffling seed.
    shuffle: False keeps corpus order within buckets and bucket order.
    num_epochs: stop after this many epochs (None: forever).
    process_index, process_count: this process and the number of processes.
    with_mask: add ``src_mask`` / ``tgt_mask`` (bool, True on tokens).
  """
  buckets = tuple(sorted(buckets)) if buckets else default_buckets(max_len)
  if buckets[-1] < max_len:
    buckets = buckets + (max_len,)
  if not 0 <= process_index < process_count:
    raise ValueError(f"process_index {process_index} not in [0, {process_count}).")
  data = pairs if isinstance(pairs, EncodedPairs) else EncodedPairs(pairs, tokenizer, max_len, too_long)
  return BatchIterator(
    data,
    buckets=buckets,
    batch_sizes=_batch_sizes(buckets, batch_size, tokens_per_batch, batch_multiple),
    seed=seed,
    shuffle=shuffle,
    num_epochs=num_epochs,
    process_index=process_index,
    process_count=process_count,
    with_mask=with_mask,
  )


def make_eval_batches(
  pairs: Sequence[Pair],
  tokenizer: Tokenizer,
  *,
  batch_size: int,
  max_len: int | None = None,
  buckets: Sequence[int] | None = None,
  process_index: int = 0,
  process_count: int = 1,
) -> list[dict[str, Any]]:
  """Evaluation batches: every pair once, in order, none dropped.

  Global batch ``k`` holds pairs ``[k * P * B, (k + 1) * P * B)`` (``P =
  process_count``, ``B = batch_size`` per process); process ``p`` gets rows
  ``[p * B, (p + 1) * B)`` of it. All processes get the same number of batches
  and the same shapes: ``L`` is the smallest bucket length (default 8, 16, 32,
  ... up to ``max_len``) holding the longest pair of the *global* batch. The
  last batches are padded with empty rows (``mask`` False, ``index`` -1, text
  ``''``). Pairs longer than ``max_len`` are truncated (last token EOS), never
  dropped; ``src_text`` / ``tgt_text`` keep the full original strings (for
  BLEU). Pop the text keys before handing a batch to jit.

  Returns:
    A list of ``{'src', 'tgt': int32 [B, L], 'src_mask', 'tgt_mask': bool
    [B, L], 'mask': bool [B], 'index': int32 [B] (position in ``pairs``),
    'src_text', 'tgt_text': list[str]}``.
  """
  data = EncodedPairs(pairs, tokenizer, max_len, "truncate")
  longest = int(max(data.src_lengths.max(initial=1), data.tgt_lengths.max(initial=1)))
  if buckets is None:
    buckets = default_buckets(max(max_len or longest, 8))
  buckets = np.asarray(sorted(buckets))
  lengths = np.maximum(data.src_lengths, data.tgt_lengths)
  per_step = batch_size * process_count
  out = []
  for start in range(0, max(len(pairs), 1), per_step):
    rows = np.arange(start, start + per_step)
    rows = np.where(rows < len(pairs), rows, -1)
    real = rows[rows >= 0]
    need = int(lengths[real].max()) if len(real) else 1
    length = int(buckets[min(np.searchsorted(buckets, need), len(buckets) - 1)])
    rows = rows[process_index * batch_size : (process_index + 1) * batch_size]
    src, tgt = data.fill(rows, length, batch_size)
    out.append(
      {
        "src": src,
        "tgt": tgt,
        "src_mask": src != PAD_ID,
        "tgt_mask": tgt != PAD_ID,
        "mask": rows >= 0,
        "index": np.where(rows >= 0, rows, -1).astype(np.int32),
        "src_text": [pairs[i][0] if i >= 0 else "" for i in rows],
        "tgt_text": [pairs[i][1] if i >= 0 else "" for i in rows],
      }
    )
  return out


# ----------------------------------------------------------------------------
# Command line: statistics of a source.


def _main(argv: list[str]) -> None:
  """``python -m vitjax.data.text SOURCE SRC TGT [VOCAB]``: counts, lengths,
  tokenizer time and padding efficiency."""
  import tempfile  # pylint: disable=g-import-not-at-top

  source, src_lang, tgt_lang = argv[:3]
  vocab = int(argv[3]) if len(argv) > 3 else 8000
  t = time.time()
  pairs = load_pairs(source, src_lang=src_lang, tgt_lang=tgt_lang)
  words = np.asarray([max(len(a.split()), len(b.split())) for a, b in pairs])
  print(f"{source}: {len(pairs)} pairs ({time.time() - t:.1f}s), {int((words >= 4).sum())} with >= 4 words on a side")
  splits = split_pairs(pairs, 0, 1000, 1000)
  print({k: len(v) for k, v in splits.items()})
  with tempfile.TemporaryDirectory() as tmp:
    t = time.time()
    tok = Tokenizer.train([x for p in splits["train"] for x in p], os.path.join(tmp, "spm"), vocab)
    print(f"tokenizer: vocab {tok.vocab_size}, trained in {time.time() - t:.1f}s")
  data = EncodedPairs(splits["train"], tok, None)
  for name, lens in (("src", data.src_lengths), ("tgt", data.tgt_lengths)):
    print(
      f"{name} tokens (with EOS): median {np.median(lens):.0f}, p95 {np.percentile(lens, 95):.0f}, max {lens.max()}"
    )
  for max_len in (64, 128):
    it = make_batches(splits["train"], tok, tokens_per_batch=4096, max_len=max_len)
    print(f"max_len {max_len}: padding efficiency {it.padding_efficiency():.3f}", it.stats())


if __name__ == "__main__":
  _main(sys.argv[1:])
