"""Shared test helpers."""

import os
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
  sys.path.insert(0, ROOT)


@pytest.fixture
def rng():
  return np.random.RandomState(0)


def naive_attention(q, k, v, bias=None, mask=None):
  """float64 attention with explicit loops over batch, heads and queries. q [B,T,H,K] -> [B,T,H,V]."""
  q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
  b, t, h, dk = q.shape
  s = k.shape[1]
  bias = np.zeros((1, 1, 1, 1)) if bias is None else np.asarray(bias, np.float64)
  mask = np.ones((1, 1, 1, 1), bool) if mask is None else np.asarray(mask, bool)
  bias = np.broadcast_to(bias.reshape((1,) * (4 - bias.ndim) + bias.shape), (b, h, t, s))
  mask = np.broadcast_to(mask.reshape((1,) * (4 - mask.ndim) + mask.shape), (b, h, t, s))
  out = np.zeros((b, t, h, v.shape[-1]))
  for bi in range(b):
    for hi in range(h):
      for ti in range(t):
        logits = np.array([q[bi, ti, hi] @ k[bi, si, hi] / np.sqrt(dk) + bias[bi, hi, ti, si] for si in range(s)])
        valid = mask[bi, hi, ti]
        if not valid.any():  # fully masked: uniform weights (the convention of both implementations)
          w = np.full(s, 1.0 / s)
        else:
          logits = np.where(valid, logits, -np.inf)
          w = np.exp(logits - logits.max())
          w /= w.sum()
        out[bi, ti, hi] = w @ v[bi, :, hi]
  return out
