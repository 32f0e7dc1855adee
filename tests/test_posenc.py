import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vitjax import posenc


def test_sinusoidal_1d_is_the_paper_formula():
  pe = posenc.sinusoidal_1d(50, 16)
  for pos in (0, 1, 7, 49):
    for i in range(8):
      angle = pos / 10000 ** (2 * i / 16)
      assert pe[pos, 2 * i] == pytest.approx(math.sin(angle), abs=1e-6)
      assert pe[pos, 2 * i + 1] == pytest.approx(math.cos(angle), abs=1e-6)


def test_sincos_2d_layout():
  h, w, d = 3, 4, 16
  pe = posenc.sincos_2d(h, w, d)
  assert pe.shape == (h * w, d)
  omega = 1.0 / 10000 ** (np.arange(4) / 3)
  for y in range(h):
    for x in range(w):
      want = np.concatenate([np.sin(x * omega), np.cos(x * omega), np.sin(y * omega), np.cos(y * omega)])
      np.testing.assert_allclose(pe[y * w + x], want, atol=1e-6)
  with pytest.raises(ValueError, match="divisible by 4"):
    posenc.sincos_2d(2, 2, 6)


def test_learned_embedding_and_resampling(rng):
  pe = rng.randn(1, 1 + 4 * 4, 8).astype(np.float32)
  same = posenc.resample_posemb(pe, (4, 4), num_prefix_tokens=1)
  np.testing.assert_array_equal(same, pe)
  big = posenc.resample_posemb(pe, (6, 8), num_prefix_tokens=1)
  assert big.shape == (1, 1 + 48, 8)
  np.testing.assert_array_equal(big[:, 0], pe[:, 0])  # class token kept
  const = np.ones((1, 16, 3), np.float32) * 2.5  # a constant field stays constant
  np.testing.assert_allclose(posenc.resample_posemb(const, (7, 7), method="bilinear"), 2.5, atol=1e-5)
  with pytest.raises(ValueError, match="old_grid"):
    posenc.resample_posemb(np.zeros((1, 15, 3)), (4, 4))
  mod = posenc.LearnedPositionEmbedding()
  x = jnp.zeros((2, 5, 8))
  v = mod.init(jax.random.key(0), x)
  assert v["params"]["pos_embedding"].shape == (1, 5, 8)
  np.testing.assert_array_equal(mod.apply(v, x)[1], v["params"]["pos_embedding"][0])


@pytest.mark.parametrize("window", [(2, 2), (3, 4), (7, 7)])
def test_relative_position_index_brute_force(window):
  wh, ww = window
  idx = posenc.relative_position_index(window)
  coords = [(i, j) for i in range(wh) for j in range(ww)]
  table_pos = {}
  for a, (ia, ja) in enumerate(coords):
    for b, (ib, jb) in enumerate(coords):
      rel = (ia - ib, ja - jb)
      # equal relative offsets share one row; different offsets get different rows
      assert table_pos.setdefault(rel, idx[a, b]) == idx[a, b]
  assert len(set(table_pos.values())) == len(table_pos) == (2 * wh - 1) * (2 * ww - 1)
  assert idx.min() == 0 and idx.max() == (2 * wh - 1) * (2 * ww - 1) - 1


def test_relative_position_bias_module_and_resize(rng):
  mod = posenc.RelativePositionBias((3, 3), num_heads=2)
  v = mod.init(jax.random.key(0))
  table = np.asarray(v["params"]["relative_position_bias_table"])
  assert table.shape == (25, 2)
  bias = np.asarray(mod.apply(v))
  idx = posenc.relative_position_index((3, 3))
  for h in range(2):
    np.testing.assert_array_equal(bias[h], table[idx, h])
  np.testing.assert_array_equal(posenc.resize_relative_bias_table(table, (3, 3), (3, 3)), table)
  assert posenc.resize_relative_bias_table(table, (3, 3), (5, 5)).shape == (81, 2)
  with pytest.raises(ValueError, match="does not fit"):
    posenc.resize_relative_bias_table(table, (4, 4), (5, 5))
