"""Positional encodings: sinusoidal 1-D and 2-D, learned (with resampling), Swin's relative position bias."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import flax.linen as nn
import jax
import numpy as np

Array = jax.Array


def sinusoidal_1d(length: int, d_model: int, max_timescale: float = 10000.0) -> np.ndarray:
  """[length, d_model] table of "Attention is all you need":

  PE(pos, 2i) = sin(pos / max_timescale^(2i / d_model)), PE(pos, 2i + 1) = cos(pos / max_timescale^(2i / d_model)).
  """
  pos = np.arange(length, dtype=np.float64)[:, None]
  two_i = np.arange(0, d_model, 2, dtype=np.float64)[None, :]
  angle = pos / np.power(max_timescale, two_i / d_model)
  pe = np.zeros((length, d_model), np.float64)
  pe[:, 0::2] = np.sin(angle)
  pe[:, 1::2] = np.cos(angle[:, : d_model // 2])
  return pe.astype(np.float32)


def sincos_2d(height: int, width: int, dim: int, temperature: float = 10000.0) -> np.ndarray:
  """[height * width, dim] fixed 2-D sin-cos table for a patch grid, row-major (the MoCo-v3 / big_vision form).

  A quarter of the channels each: sin(x w), cos(x w), sin(y w), cos(y w), w = temperature^(-j / (dim/4 - 1)).
  """
  if dim % 4:
    raise ValueError(f"2-D sin-cos position embedding needs a width divisible by 4, got {dim}")
  y, x = np.mgrid[:height, :width]
  omega = np.arange(dim // 4, dtype=np.float64) / max(dim // 4 - 1, 1)
  omega = 1.0 / temperature**omega
  y = y.reshape(-1)[:, None] * omega[None]
  x = x.reshape(-1)[:, None] * omega[None]
  return np.concatenate([np.sin(x), np.cos(x), np.sin(y), np.cos(y)], axis=1).astype(np.float32)


class LearnedPositionEmbedding(nn.Module):
  """Adds a learned [1, N, D] table (param "pos_embedding", N(0, 0.02) init) to inputs [B, N, D]."""

  embedding_init: Callable = nn.initializers.normal(stddev=0.02)

  @nn.compact
  def __call__(self, x: Array) -> Array:
    pe = self.param("pos_embedding", self.embedding_init, (1,) + x.shape[1:])
    return x + pe.astype(x.dtype)


def resample_posemb(
  posemb: Array | np.ndarray,
  new_grid: Sequence[int],
  num_prefix_tokens: int = 0,
  old_grid: Sequence[int] | None = None,
  method: str = "bicubic",
) -> np.ndarray:
  """Resamples a learned table [1, P + h*w, D] (P prefix tokens, e.g. a class token) to a new grid.

  Used to fine-tune at another resolution: prefix tokens are kept, the grid part is interpolated.
  old_grid defaults to the square root of the grid length. Returns [1, P + H*W, D] float32.
  """
  posemb = np.asarray(posemb, np.float32)
  prefix, grid = posemb[:, :num_prefix_tokens], posemb[:, num_prefix_tokens:]
  n = grid.shape[1]
  if old_grid is None:
    side = int(round(np.sqrt(n)))
    if side * side != n:
      raise ValueError(f"cannot infer the grid of {n} position embeddings; pass old_grid")
    old_grid = (side, side)
  if old_grid[0] * old_grid[1] != n:
    raise ValueError(f"old_grid {tuple(old_grid)} does not hold {n} position embeddings")
  if tuple(old_grid) == tuple(new_grid):
    return posemb
  grid = grid.reshape(old_grid[0], old_grid[1], -1)
  grid = jax.image.resize(grid, (new_grid[0], new_grid[1], grid.shape[-1]), method=method, antialias=False)
  grid = np.asarray(grid, np.float32).reshape(1, new_grid[0] * new_grid[1], -1)
  return np.concatenate([prefix, grid], axis=1)


def relative_position_index(window: Sequence[int]) -> np.ndarray:
  """[N, N] int index into a ((2Wh-1)(2Ww-1), heads) table for a window of N = Wh*Ww tokens (row-major)."""
  wh, ww = window
  coords = np.stack(np.meshgrid(np.arange(wh), np.arange(ww), indexing="ij")).reshape(2, -1)  # [2, N]
  rel = coords[:, :, None] - coords[:, None, :]  # [2, N, N]
  return (rel[0] + wh - 1) * (2 * ww - 1) + (rel[1] + ww - 1)


class RelativePositionBias(nn.Module):
  """Swin's relative position bias: a learned ((2Wh-1)(2Ww-1), heads) table indexed by relative coordinates.

  Returns the additive attention bias [heads, N, N], N = Wh*Ww.
  """

  window: tuple[int, int]
  num_heads: int
  table_init: Callable = nn.initializers.truncated_normal(stddev=0.02)

  @nn.compact
  def __call__(self) -> Array:
    wh, ww = self.window
    table = self.param("relative_position_bias_table", self.table_init, ((2 * wh - 1) * (2 * ww - 1), self.num_heads))
    idx = relative_position_index(self.window).reshape(-1)
    n = wh * ww
    return table[idx].reshape(n, n, self.num_heads).transpose(2, 0, 1)


def resize_relative_bias_table(
  table: Array | np.ndarray, old_window: Sequence[int], new_window: Sequence[int], method: str = "bicubic"
) -> np.ndarray:
  """Resizes a ((2Wh-1)(2Ww-1), heads) table to a new window (fine-tuning Swin with another window)."""
  table = np.asarray(table, np.float32)
  old = (2 * old_window[0] - 1, 2 * old_window[1] - 1)
  new = (2 * new_window[0] - 1, 2 * new_window[1] - 1)
  if table.shape[0] != old[0] * old[1]:
    raise ValueError(f"table of {table.shape[0]} rows does not fit window {tuple(old_window)}")
  if old == new:
    return table
  grid = table.reshape(old[0], old[1], -1)
  grid = jax.image.resize(grid, (new[0], new[1], grid.shape[-1]), method=method, antialias=False)
  return np.asarray(grid, np.float32).reshape(new[0] * new[1], -1)
