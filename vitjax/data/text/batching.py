"""Training batches of token ids, bucketed by length, in one global order split over processes.

Resumable (get_state/set_state) on any number of processes.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from vitjax.data.text.sources import Pair
from vitjax.data.text.tokenizer import Tokenizer


def default_buckets(max_len: int, per_octave: int = 2, smallest: int = 8) -> tuple[int, ...]:
  """Bucket lengths: ``per_octave`` lengths per doubling, multiples of 8, capped by and ending with ``max_len``.

  jit compiles one shape per bucket.

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
  """Token ids of pairs, each sequence ending with the tokenizer's EOS, stored flat.

  Attributes:
    pad_id, eos_id: the tokenizer's (batches are padded with pad_id).
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
    eos = self.eos_id = tokenizer.EOS
    self.pad_id = tokenizer.PAD
    self.num_input = len(pairs)
    self.num_dropped = self.num_truncated = 0
    for start in range(0, len(pairs), chunk):
      part = pairs[start : start + chunk]
      for k, p in enumerate(part):  # else a list of strings reads their first two characters as the pair
        if not (isinstance(p, (tuple, list)) and len(p) == 2 and isinstance(p[0], str) and isinstance(p[1], str)):
          raise ValueError(f"pairs[{start + k}] is {str(p)[:60]!r}: pairs are (source, target) strings")
      src_ids = tokenizer.encode_batch([p[0] for p in part])
      tgt_ids = tokenizer.encode_batch([p[1] for p in part])
      for k, (s, t) in enumerate(zip(src_ids, tgt_ids)):
        s = s + [eos]
        t = t + [eos]
        if max_len is not None and max(len(s), len(t)) > max_len:
          if too_long == "drop":
            self.num_dropped += 1
            continue
          self.num_truncated += 1
          s = s[: max_len - 1] + [eos] if len(s) > max_len else s
          t = t[: max_len - 1] + [eos] if len(t) > max_len else t
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
    src = np.full((size, length), self.pad_id, np.int32)
    tgt = np.full((size, length), self.pad_id, np.int32)
    for r, i in enumerate(rows):
      if i < 0:
        continue
      s = self.src[self.src_offsets[i] : self.src_offsets[i + 1]][:length]
      t = self.tgt[self.tgt_offsets[i] : self.tgt_offsets[i + 1]][:length]
      src[r, : len(s)] = s
      tgt[r, : len(t)] = t
    return src, tgt


class BatchIterator(Iterator[dict[str, np.ndarray]]):
  """Training batches, bucketed by length, in one global order; each process yields its rows.

  Built by :func:`make_batches` (see there). Iterating yields dicts
  ``{'src': int32 [b, L], 'tgt': int32 [b, L], 'src_mask', 'tgt_mask': bool
  [b, L]}`` where ``L`` is a bucket length and ``b = padded_size(L) //
  process_count`` this process's rows of the global batch.
  ``get_state()`` / ``set_state()`` save and restore the position, which is
  the same on every process and for every process count.
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
    pad_multiple: int,
    with_mask: bool,
  ):
    if pad_multiple < 1 or pad_multiple % process_count:
      raise ValueError(f"pad_multiple {pad_multiple} is not a positive multiple of process_count {process_count}.")
    self.data = data
    self.buckets = tuple(buckets)
    self.batch_sizes = dict(batch_sizes)
    self.seed = int(seed)
    self.shuffle = shuffle
    self.num_epochs = num_epochs
    self.process_index = process_index
    self.process_count = process_count
    self.pad_multiple = pad_multiple
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
        f"(bucket sizes {[len(m) for m in self._members]}, global batch sizes {[batch_sizes[b] for b in buckets]})."
      )

  # The schedule of one epoch is a pure function of (seed, epoch, pairs, batch sizes), computed identically on
  # every process, whatever the number of processes.
  def schedule(self, epoch: int) -> list[tuple[int, np.ndarray]]:
    """``[(bucket_length, global_rows)]`` of an epoch, in yield order (unpadded)."""
    if self._schedule_epoch == epoch:
      return self._schedule
    rng = np.random.default_rng([self.seed, epoch])
    batches = []
    carry = np.zeros(0, np.int64)
    for length, members in zip(self.buckets, self._members):
      pool = np.concatenate([carry, members])
      if self.shuffle:
        pool = rng.permutation(pool)
      size = self.batch_sizes[length]
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
    """Global batches in one epoch.

    Each bucket gives its full batches; the rows left over are carried up into the next (longer) bucket, and the
    last bucket's remainder is dropped.
    """
    steps, carry = 0, 0
    for length, members in zip(self.buckets, self._members):
      size = self.batch_sizes[length]
      steps += (carry + len(members)) // size
      carry = (carry + len(members)) % size
    return steps

  def padded_size(self, length: int) -> int:
    """Rows of a global batch of bucket ``length``: its pairs, then empty rows up to a multiple of pad_multiple."""
    return -(-self.batch_sizes[length] // self.pad_multiple) * self.pad_multiple

  def local_rows(self, length: int, rows: np.ndarray) -> np.ndarray:
    """This process's slice of a global batch's rows, -1 for the padding rows."""
    padded = np.full(self.padded_size(length), -1, np.int64)
    padded[: len(rows)] = rows
    size = len(padded) // self.process_count
    return padded[self.process_index * size : (self.process_index + 1) * size]

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
      batch["src_mask"] = src != self.data.pad_id
      batch["tgt_mask"] = tgt != self.data.pad_id
    return batch

  def _fingerprint(self) -> str:
    if self._fingerprint_cache is None:
      self._fingerprint_cache = self._compute_fingerprint()
    return self._fingerprint_cache

  def _compute_fingerprint(self) -> str:
    h = hashlib.sha256()
    for arr in (self.data.src_lengths, self.data.tgt_lengths):
      h.update(np.ascontiguousarray(arr).tobytes())
    # The trailing 1 stood for the process count when batch sizes were per process; it stays so that positions
    # saved by single-process runs of that time, whose batches are the same, still restore.
    h.update(repr((self.buckets, sorted(self.batch_sizes.items()), self.shuffle, 1)).encode())
    return h.hexdigest()[:16]

  def get_state(self) -> dict[str, Any]:
    """Position to checkpoint: ``{'epoch', 'step', 'seed', 'fingerprint'}``.

    ``step`` counts global batches within the epoch; the same on every process and for any process count.
    """
    return {"epoch": self.epoch, "step": self.step, "seed": self.seed, "fingerprint": self._fingerprint()}

  def set_state(self, state: dict[str, Any]) -> None:
    """Resumes at a position from :meth:`get_state`.

    The next global batches are exactly those that would have followed, on any number of processes. The data, buckets
    and global batch sizes must be those of the saved run (checked).
    """
    if int(state["seed"]) != self.seed or state["fingerprint"] != (self._fingerprint()):
      raise ValueError("the data position was saved with another seed, data, bucket or batch configuration")
    epoch, step = int(state["epoch"]), int(state["step"])
    if not 0 <= step < max(1, self.steps_per_epoch):
      raise ValueError(f"step {step} out of range for {self.steps_per_epoch} steps per epoch.")
    self.epoch, self.step = epoch, step

  def padding_efficiency(self, epoch: int = 0) -> float:
    """Fraction of non-pad positions in the global src+tgt arrays over one epoch (empty rows included)."""
    real = total = 0
    for length, rows in self.schedule(epoch):
      real += int(self.data.src_lengths[rows].sum() + self.data.tgt_lengths[rows].sum())
      total += 2 * length * self.padded_size(length)
    return real / max(total, 1)

  def stats(self) -> dict[str, Any]:
    """Counts: pairs in/kept/dropped/truncated, pairs per bucket, global batch sizes, batches per epoch.

    Also unused pairs (the last bucket's remainder) per epoch.
    """
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


def check_counts(process_index: int = 0, process_count: int = 1, **counts) -> None:
  """ValueError for a count (batch_size=..., None: not given) below 1, or a process_index outside the processes."""
  for name, value in counts.items():
    if value is not None and (not isinstance(value, (int, np.integer)) or value < 1):
      raise ValueError(f"{name}={value!r} must be a whole number, at least 1")
  if not 0 <= process_index < process_count:
    raise ValueError(f"process_index {process_index} not in [0, {process_count}).")


def _batch_sizes(
  buckets: Sequence[int], batch_size: int | None, tokens_per_batch: int | None, multiple: int
) -> dict[int, int]:
  if (batch_size is None) == (tokens_per_batch is None):
    raise ValueError("Give exactly one of batch_size and tokens_per_batch.")
  check_counts(batch_size=batch_size, tokens_per_batch=tokens_per_batch)
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
  pad_multiple: int | None = None,
  with_mask: bool = True,
) -> BatchIterator:
  """Training batches of ``(src, tgt)`` token ids, bucketed by length, in one global order.

  Long for its documented arguments: the body is 17 lines.

  Each pair is tokenized, EOS appended to both sides, and goes to the smallest bucket length ``L >= max(len(src),
  len(tgt))``; a batch holds pairs of one bucket, padded with the tokenizer's pad id (0) to ``[B, L]`` (src and tgt
  both). Pairs longer than ``max_len`` tokens (EOS included) are dropped or truncated (``too_long``);
  :meth:`BatchIterator.stats` counts them.

  Per epoch ``e``, with ``rng = np.random.default_rng([seed, e])``: going up the buckets, each bucket's pairs (plus
  those carried up from the bucket below) are permuted and cut into global batches of ``B(L)`` pairs; the
  remainder is carried up to the next bucket (padded longer), so only the last bucket's remainder is left out of
  the epoch (a different one each epoch). The list of global batches is then permuted. None of this depends on the
  number of processes or devices: the sequence of global batches is a function of the pairs, the seed and the
  batch sizes only.

  A global batch is then completed with empty rows (all padding, no tokens, so no weight in a token-averaged loss)
  up to a multiple of ``pad_multiple`` (the devices the batch is split over, times accumulation steps), and process
  ``p`` of ``P`` yields its ``1/P`` slice of the rows: the processes get disjoint pairs and, step by step, batches
  of the same shape, as multi-host jit needs. Every process must be given the same pairs and arguments except
  ``process_index``.

  Args:
    pairs: (source, target) strings, or an :class:`EncodedPairs`.
    tokenizer: the :class:`Tokenizer` (unused for EncodedPairs).
    batch_size: global batch size (pairs) for every bucket, or
    tokens_per_batch: global budget of ``B * L`` positions per side:
      ``B(L) = max(m, tokens_per_batch // L // m * m)`` with ``m = batch_multiple``.
    max_len: the longest sequence kept, EOS included.
    buckets: bucket lengths (default :func:`default_buckets` of ``max_len``:
      8, 16, 24, 32, 48, 64, 96, 128, ... up to ``max_len``).
    too_long: ``'drop'`` or ``'truncate'`` (keeps the first ``max_len - 1``
      tokens and EOS).
    batch_multiple: global batch sizes are multiples of this (a property of the
      run, not of the machines: a multiple of the device count avoids empty rows).
    seed: shuffling seed.
    shuffle: False keeps corpus order within buckets and bucket order.
    num_epochs: stop after this many epochs (None: forever).
    process_index: this process.
    process_count: the number of processes.
    pad_multiple: global batches are padded with empty rows to a multiple of
      this; a multiple of ``process_count`` (the default).
    with_mask: add ``src_mask`` / ``tgt_mask`` (bool, True on tokens).
  """
  buckets = tuple(sorted(buckets)) if buckets else default_buckets(max_len)
  if buckets[-1] < max_len:
    buckets = buckets + (max_len,)
  check_counts(process_index, process_count)
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
    pad_multiple=process_count if pad_multiple is None else pad_multiple,
    with_mask=with_mask,
  )
