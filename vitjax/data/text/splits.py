"""Held-out splits of a parallel corpus: deduplicate, then a seeded permutation."""

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
  unique = list(dict.fromkeys((a, b) for a, b in pairs))
  n = len(unique)
  if num_valid < 0 or num_test < 0 or num_valid + num_test > n:
    raise ValueError(f"Cannot hold out {num_valid} + {num_test} of {n} pairs.")
  perm = np.random.default_rng(seed).permutation(n)
  test = np.sort(perm[:num_test])
  valid = np.sort(perm[num_test : num_test + num_valid])
  train = np.sort(perm[num_test + num_valid :])
  return {name: [unique[i] for i in idx] for name, idx in (("train", train), ("valid", valid), ("test", test))}
