"""Held-out splits of a parallel corpus: deduplicate, then a seeded permutation, or whole books held out."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from vitjax.data.text.sources import Pair


def split_pairs(pairs: Sequence[Pair], seed: int, num_valid: int, num_test: int) -> dict[str, list[Pair]]:
  """Deduplicates and splits pairs into train / valid / test.

  Exact duplicate pairs are removed first (first occurrence kept), so a test
  pair never also appears in train. Then ``perm =
  np.random.default_rng(seed).permutation(n)``: ``perm[:num_test]`` is test,
  ``perm[num_test:num_test + num_valid]`` valid, the rest train; each split is
  returned in the original corpus order. The held-out sets depend only on the
  (deduplicated) pairs and the seed.
  """
  for name, value in (("seed", seed), ("num_valid", num_valid), ("num_test", num_test)):
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool):  # a fraction, or a seed of None (random)
      raise ValueError(
        f"{name}={value!r} must be a whole number" + (" of pairs (not a fraction)" if name != "seed" else "")
      )
  unique = list(dict.fromkeys((a, b) for a, b in pairs))
  n = len(unique)
  if num_valid < 0 or num_test < 0 or num_valid + num_test > n:
    raise ValueError(f"Cannot hold out {num_valid} + {num_test} of {n} pairs.")
  perm = np.random.default_rng(seed).permutation(n)
  test = np.sort(perm[:num_test])
  valid = np.sort(perm[num_test : num_test + num_valid])
  train = np.sort(perm[num_test + num_valid :])
  return {name: [unique[i] for i in idx] for name, idx in (("train", train), ("valid", valid), ("test", test))}


def split_by_books(
  pairs: Sequence[Pair], refs: Sequence[str], valid_books: Sequence[str], test_books: Sequence[str]
) -> dict[str, list[Pair]]:
  """Splits pairs by book: every pair of `valid_books` is valid, of `test_books` test, the rest train.

  Books are the first part of an OSIS reference, "Job" of "Job.1.1". Exact duplicate pairs are removed, and a pair that
  is also held out leaves train, so no held-out pair is trained on. Each split keeps the corpus order.
  """
  if len(refs) != len(pairs):
    raise ValueError(f"{len(refs)} references for {len(pairs)} pairs")
  if not valid_books or not test_books:
    raise ValueError("a split by books needs both valid_books and test_books (OSIS names: 'Ruth,Esth')")
  book_of = [r.split(".")[0] for r in refs]
  known = dict.fromkeys(book_of)
  for what, books in (("valid_books", valid_books), ("test_books", test_books)):
    unknown = [b for b in books if b not in known]
    if unknown:
      raise ValueError(f"{what}: no book {', '.join(unknown)}; the books are {' '.join(known)}")
  both = set(valid_books) & set(test_books)
  if both:
    raise ValueError(f"{', '.join(sorted(both))} both in valid_books and test_books")
  role = {**{b: "valid" for b in valid_books}, **{b: "test" for b in test_books}}
  out: dict[str, dict[Pair, None]] = {"train": {}, "valid": {}, "test": {}}
  for pair, book in zip(pairs, book_of):
    out[role.get(book, "train")].setdefault(tuple(pair), None)
  held = set(out["valid"]) | set(out["test"])
  out["valid"] = {p: None for p in out["valid"] if p not in out["test"]}
  return {name: [p for p in kept if name != "train" or p not in held] for name, kept in out.items()}
