"""Evaluation batches: every pair once, in order, the same shapes on every process."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from vitjax.data.text.batching import EncodedPairs, check_counts, default_buckets
from vitjax.data.text.sources import Pair
from vitjax.data.text.tokenizer import Tokenizer


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
    A list of dicts: ``src``, ``tgt`` (int32 [B, L]), ``src_mask``,
    ``tgt_mask`` (bool [B, L]), ``mask`` (bool [B]), ``index`` (int32 [B],
    the position in ``pairs``), ``src_text``, ``tgt_text`` (list[str]).
  """
  check_counts(process_index, process_count, batch_size=batch_size)
  data = EncodedPairs(pairs, tokenizer, max_len, "truncate")
  longest = int(max(data.src_lengths.max(initial=1), data.tgt_lengths.max(initial=1)))
  if buckets is None:
    buckets = default_buckets(max(max_len or longest, 8))
  # as make_batches: the longest bucket holds max_len (else rows were cut to it without their EOS)
  buckets = np.asarray(sorted({*buckets, max(max(buckets), max_len or longest)}))
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
        "src_mask": src != data.pad_id,
        "tgt_mask": tgt != data.pad_id,
        "mask": rows >= 0,
        "index": np.where(rows >= 0, rows, -1).astype(np.int32),
        "src_text": [pairs[i][0] if i >= 0 else "" for i in rows],
        "tgt_text": [pairs[i][1] if i >= 0 else "" for i in rows],
      }
    )
  return out
