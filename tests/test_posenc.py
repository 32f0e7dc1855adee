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


def test_relative_position_index_with_a_class_token():
  r = 3 * 7  # window (2, 4)
  idx = posenc.relative_position_index((2, 4), cls_token=True)
  assert idx.shape == (9, 9)
  np.testing.assert_array_equal(idx[1:, 1:], posenc.relative_position_index((2, 4)))
  assert (idx[0, 1:] == r).all() and (idx[1:, 0] == r + 1).all() and idx[0, 0] == r + 2  # BEiT's three rows


def _offsets(table, window):
  """{(dy, dx): table row} for a [(2h-1)(2w-1), ...] table, written out."""
  h, w = window
  return {(dy, dx): table[(dy + h - 1) * (2 * w - 1) + dx + w - 1] for dy in range(1 - h, h) for dx in range(1 - w, w)}


@pytest.mark.parametrize("old,new", [((3, 4), (5, 6)), ((4, 3), (2, 2)), ((3, 3), (3, 5))])
def test_clip_resize_keeps_shared_offsets_and_clips_the_others(rng, old, new):
  table = rng.randn(2, (2 * old[0] - 1) * (2 * old[1] - 1), 3).astype(np.float32)  # [layers, rows, heads]
  out = posenc.resize_relative_bias_table(table, old, new, method="clip")
  assert out.shape == (2, (2 * new[0] - 1) * (2 * new[1] - 1), 3)
  before, after = _offsets(table.transpose(1, 0, 2), old), _offsets(out.transpose(1, 0, 2), new)
  for (dy, dx), v in after.items():
    clipped = (int(np.clip(dy, 1 - old[0], old[0] - 1)), int(np.clip(dx, 1 - old[1], old[1] - 1)))
    np.testing.assert_array_equal(v, before[clipped])  # the offset itself when both windows have it
  back = posenc.resize_relative_bias_table(out, new, old, method="clip")
  if new[0] >= old[0] and new[1] >= old[1]:
    np.testing.assert_array_equal(back, table)  # growing then shrinking is lossless
  with pytest.raises(ValueError, match="unknown resize method 'cubicle'"):
    posenc.resize_relative_bias_table(table, old, new, method="cubicle")


def test_bicubic_resize_over_leading_axes_is_per_layer(rng):
  table = rng.randn(3, 25, 2).astype(np.float32)
  out = posenc.resize_relative_bias_table(table, (3, 3), (4, 4))
  for i in range(3):
    np.testing.assert_allclose(out[i], posenc.resize_relative_bias_table(table[i], (3, 3), (4, 4)), atol=1e-6)
  np.testing.assert_allclose(out[:, 24], table[:, 12], atol=1e-6)  # the zero offset stays at the centre


def test_relative_position_bias_module_and_resize(rng):
  mod = posenc.RelativePositionBias((3, 3), num_heads=2)
  v = mod.init(jax.random.key(0))
  table = np.asarray(v["params"]["relative_position_bias_table"])
  assert table.shape == (25, 2)
  bias = np.asarray(mod.apply(v))
  idx = posenc.relative_position_index((3, 3))
  for h in range(2):
    np.testing.assert_array_equal(bias[h], table[idx, h])
  mod = posenc.RelativePositionBias((2, 3), num_heads=2, cls_token=True)
  v = mod.init(jax.random.key(0))["params"]
  assert v["relative_position_bias_table"].shape == (15, 2) and v["cls_bias"].shape == (3, 2)
  full = np.concatenate([v["relative_position_bias_table"], v["cls_bias"]])
  np.testing.assert_array_equal(
    mod.apply({"params": v}), full[posenc.relative_position_index((2, 3), True)].transpose(2, 0, 1)
  )
  np.testing.assert_array_equal(posenc.resize_relative_bias_table(table, (3, 3), (3, 3)), table)
  assert posenc.resize_relative_bias_table(table, (3, 3), (5, 5)).shape == (81, 2)
  with pytest.raises(ValueError, match="does not fit"):
    posenc.resize_relative_bias_table(table, (4, 4), (5, 5))


def test_resampling_a_non_square_grid_keeps_each_patch_in_its_place():
  """old_grid (2, 3), rows first: doubled by nearest-neighbour resampling, cell (i, j) takes old cell (i // 2, j // 2)."""
  rows, cols = np.mgrid[:2, :3]
  pe = np.stack([rows, cols], -1).reshape(1, 6, 2).astype(np.float32)
  pe = np.concatenate([np.full((1, 1, 2), -1.0, np.float32), pe], axis=1)  # a class token first
  big = posenc.resample_posemb(pe, (4, 6), num_prefix_tokens=1, old_grid=(2, 3), method="nearest")
  rows, cols = np.mgrid[:4, :6]
  want = np.stack([rows // 2, cols // 2], -1).reshape(1, 24, 2)
  np.testing.assert_array_equal(big[:, 1:], want)
  np.testing.assert_array_equal(big[:, 0], pe[:, 0])


def test_antialiased_bicubic_resampling_is_torchs_as_timm_and_transformers_call_it(rng, torch_ref):
  """method="bicubic_aa": torch's interpolate(mode="bicubic", antialias=True, align_corners=False), which timm's
  resample_abs_pos_embed and transformers' DINOv2 use on position tables: DINOv2's 37x37 down to 16x16 (224 px) and
  4x4, up to 24x24, and a non-square grid. float64 on both sides: the weights, not float32's rounding, are compared
  (torch's own float32 result differs by up to 5e-6 when upsampling)."""
  torch = torch_ref
  for old, new in (((37, 37), (16, 16)), ((37, 37), (4, 4)), ((14, 14), (24, 24)), ((7, 5), (3, 9))):
    pe = rng.randn(1, 1 + old[0] * old[1], 8)
    got = posenc.resample_posemb(pe, new, num_prefix_tokens=1, old_grid=old, method="bicubic_aa")
    grid = torch.from_numpy(pe[:, 1:].reshape(1, *old, 8)).permute(0, 3, 1, 2)
    want = torch.nn.functional.interpolate(grid, size=new, mode="bicubic", antialias=True, align_corners=False)
    want = want.permute(0, 2, 3, 1).reshape(1, -1, 8).numpy()
    np.testing.assert_allclose(got[:, 1:], want, atol=1e-6)
    np.testing.assert_array_equal(got[:, 0], pe[:, 0].astype(np.float32))
  rows = posenc.antialiased_bicubic_weights(37, 16)
  np.testing.assert_allclose(rows.sum(1), 1.0)  # normalised at the borders too
