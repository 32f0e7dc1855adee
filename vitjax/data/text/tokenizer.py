"""The SentencePiece tokenizer; special ids pad=0, eos=1, bos=2, unk=3 unless it was trained with others."""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from vitjax.data.text.sources import _norm_ws
from vitjax.errors import ConfigError

PAD_ID, EOS_ID, BOS_ID, UNK_ID = 0, 1, 2, 3


class Tokenizer:
  """A SentencePiece model; its special ids are the attributes PAD, EOS, BOS, UNK.

  By default pad=0, eos=1, bos=2, unk=3 (see :meth:`train`). A model without a bos piece (flax's examples/wmt, T5) has
  BOS = PAD: decoding starts from the pad id.

  One model for source and target (a joint vocabulary, so embeddings can be
  shared). ``encode`` adds no bos/eos; ``decode`` stops at the first eos and
  skips pad/bos.
  """

  PAD, EOS, BOS, UNK = PAD_ID, EOS_ID, BOS_ID, UNK_ID  # the defaults; an instance has its model's

  def __init__(self, processor, path: str | None = None):
    self.sp = processor
    self.path = path
    pad, eos, bos, unk = processor.pad_id(), processor.eos_id(), processor.bos_id(), processor.unk_id()
    if pad < 0 or eos < 0:
      raise ValueError(f"{path}: a translation tokenizer needs pad and eos pieces; this one has pad {pad}, eos {eos}")
    self.PAD, self.EOS, self.BOS, self.UNK = pad, eos, pad if bos < 0 else bos, unk

  @property
  def special_ids(self) -> dict[str, int]:
    """{"pad_id", "eos_id", "bos_id"}: the ids a Transformer decoding this vocabulary must use."""
    return {"pad_id": self.PAD, "eos_id": self.EOS, "bos_id": self.BOS}

  @classmethod
  def load(cls, path: str) -> Tokenizer:
    """Loads ``PREFIX.model`` written by :meth:`train`."""
    import sentencepiece as spm  # pylint: disable=g-import-not-at-top

    if not os.path.isfile(path):
      hint = (
        f"; did you mean {path}.model (train takes the prefix, load the file)?"
        if os.path.isfile(path + ".model")
        else ""
      )
      raise FileNotFoundError(f"no SentencePiece model at {path}{hint}")
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
    pad_id: int = PAD_ID,
    eos_id: int = EOS_ID,
    bos_id: int = BOS_ID,
    **kwargs,
  ) -> Tokenizer:
    """Trains on ``texts`` and writes ``path_prefix.model`` / ``.vocab``.

    Long for its documented arguments, SentencePiece's among them.

    ``texts`` are the source and target sentences of the train split.

    Deterministic: if there are more than ``input_sentence_size`` texts, a
    subset is drawn here with ``np.random.default_rng(seed)`` (kept in corpus
    order; SentencePiece's own sampling/shuffling is off), SentencePiece's rng
    is seeded too, and training runs on ``num_threads`` threads: the same
    pieces and scores on every run (the ``.model`` also records its path). ``byte_fallback`` is off, so characters outside
    the model's alphabet (never seen, or rarer than ``character_coverage``
    allows) encode to unk (3 with the default ids). ``hard_vocab_limit=False``
    lets a tiny corpus produce fewer pieces instead of failing. ``pad_id``,
    ``eos_id``, ``bos_id`` place the special pieces (unk takes the smallest id
    of 0-3 left); ``bos_id == pad_id`` means no bos piece, decoding starting
    from pad (flax's examples/wmt). Extra ``kwargs`` go to
    ``SentencePieceTrainer.train``.
    """
    if pad_id == eos_id or bos_id == eos_id or min(pad_id, eos_id, bos_id) < 0:
      raise ValueError(
        f"special ids pad {pad_id}, eos {eos_id}, bos {bos_id}: pad, eos and bos must differ (bos may be pad)"
      )
    unk_id = min(set(range(4)) - {pad_id, eos_id, bos_id})
    import sentencepiece as spm  # pylint: disable=g-import-not-at-top

    texts = _sentences(texts, input_sentence_size, seed)
    spm.set_random_generator_seed(seed)
    if vocab_size < 4:  # the special pieces alone take up to 4
      raise ConfigError(f"vocab_size={vocab_size} is too small: the special pieces alone take 4; e.g. 8000")
    os.makedirs(os.path.dirname(os.path.abspath(path_prefix)), exist_ok=True)
    try:
      spm.SentencePieceTrainer.train(
        sentence_iterator=iter(texts),
        model_prefix=path_prefix,
        vocab_size=vocab_size,
        model_type=model_type,
        character_coverage=character_coverage,
        pad_id=pad_id,
        eos_id=eos_id,
        bos_id=-1 if bos_id == pad_id else bos_id,
        unk_id=unk_id,
        byte_fallback=False,
        shuffle_input_sentence=False,
        input_sentence_size=0,
        num_threads=num_threads,
        hard_vocab_limit=hard_vocab_limit,
        minloglevel=2,
        **kwargs,
      )
    except RuntimeError as e:  # SentencePiece's checks, as one line that says what to change
      raise _vocab_error(e, vocab_size, len(texts)) from None
    return cls.load(path_prefix + ".model")

  @property
  def vocab_size(self) -> int:
    """The number of pieces in the SentencePiece model, special ids included."""
    return self.sp.get_piece_size()

  def encode(self, text: str) -> list[int]:
    """Token ids of ``text``, no bos/eos."""
    return self.sp.encode(text)

  def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
    """Token ids of each of ``texts`` (no bos/eos), one list per text."""
    if isinstance(texts, str):  # a str is a sequence too: of characters, each encoded on its own
      raise TypeError("encode_batch takes a list of texts, not one str: encode(text) or encode_batch([text])")
    return self.sp.encode(list(texts))

  def decode(self, ids: Sequence[int]) -> str:
    """Text of ``ids`` (one sequence [T]) up to the first eos; pad and bos are skipped."""
    ids = np.asarray(ids, dtype=np.int64)
    if ids.ndim > 1:  # a batch: flattened it decoded the first row only, or glued the rows together
      raise ValueError(f"decode takes one sequence of ids [T]; got shape {list(ids.shape)}: use decode_batch")
    out = []
    for i in ids.reshape(-1).tolist():
      if i == self.EOS:
        break
      if i not in (self.PAD, self.BOS) and 0 <= i < self.vocab_size:
        out.append(i)
    return self.sp.decode(out)

  def decode_batch(self, ids: Any) -> list[str]:
    """Text of each row of ``ids`` (int [B, T], or any sequence of id sequences) as `decode` gives it."""
    flat = getattr(ids, "ndim", None) == 1 or (
      not hasattr(ids, "ndim") and isinstance(next(iter(ids), None), (int, np.integer))
    )
    if flat:
      raise ValueError("decode_batch takes rows of ids [B, T]; got one sequence [T]: use decode")
    return [self.decode(row) for row in ids]


def _sentences(texts, most: int, seed: int) -> list[str]:
  """Tokenizer.train's texts: checked, whitespace-normalised, empty ones left out.

  At most `most` of them, drawn by np.random.default_rng(seed) and kept in corpus order.
  """
  if isinstance(texts, str):
    raise TypeError("train takes sentences (an iterable of str), not one str: train([text], ...)")
  texts = list(texts)
  bad = next((i for i, t in enumerate(texts) if not isinstance(t, str)), None)
  if bad is not None:  # e.g. (source, target) pairs: give both sides' sentences
    raise TypeError(f"train takes sentences (str); text {bad} is a {type(texts[bad]).__name__}: for pairs give "
                    "[s for pair in pairs for s in pair]")  # fmt: skip
  texts = [t for t in (_norm_ws(t) for t in texts) if t]
  if len(texts) > most:
    keep = np.sort(np.random.default_rng(seed).choice(len(texts), most, replace=False))
    texts = [texts[i] for i in keep]
  return texts


def _vocab_error(e: RuntimeError, vocab_size: int, sentences: int) -> Exception:
  """SentencePiece's vocabulary-size failure as one ConfigError that says what to change; `e` itself otherwise."""
  high = re.search(r"Vocabulary size too high \((\d+)\)\. Please set it to a value <= (\d+)", str(e))
  low = re.search(r"Vocabulary size is smaller than required_chars\. (\d+) vs (\d+)", str(e))
  if high:
    return ConfigError(
      f"vocab_size={vocab_size} is more pieces than {sentences:,} sentences give: at most {high.group(2)}"
    )
  if low:
    return ConfigError(f"vocab_size={vocab_size} is fewer pieces than the text's {low.group(2)} characters need")
  return e
