"""The SentencePiece tokenizer with vitjax's fixed special ids (pad=0, eos=1, bos=2, unk=3)."""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from vitjax.data.text.sources import _norm_ws

PAD_ID, EOS_ID, BOS_ID, UNK_ID = 0, 1, 2, 3


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
