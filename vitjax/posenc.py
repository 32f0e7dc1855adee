"""Positional encodings: sinusoidal 1-D and 2-D, learned (with resampling), 2-D rotary, relative position bias."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

Array = jax.Array


def sinusoidal_1d(length: int, d_model: int, max_timescale: float = 10000.0) -> np.ndarray:
  """The sinusoidal [length, d_model] table of "Attention is all you need".

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


def rope_2d(
  grid: Sequence[int],
  head_dim: int,
  temperature: float = 10000.0,
  ref_grid: Sequence[int] | None = None,
  prefix: int = 0,
  kind: str = "axial",
) -> tuple[np.ndarray, np.ndarray]:
  """EVA-02's axial 2-D rotary position embedding (Fang et al. 2023; timm's RotaryEmbeddingCat): (sin, cos).

  Each float32 [prefix + h * w, head_dim], row-major over the grid, interleaved: channels (2i, 2i + 1) turn together
  (vitjax.attention.apply_rope). The first half of the pairs turn with the row, the second half with the column, at
  frequencies temperature^(-j / (head_dim / 4)), j < head_dim / 4. ref_grid: the positions are rescaled so that the
  grid spans this one (EVA's ref_feat_shape: a model pre-trained at 16 x 16 patches keeps its range at 32 x 32);
  None: a patch's position is its index. The `prefix` rows (class token, registers) do not turn: sin 0, cos 1.
  Computed in float32, as timm computes it.

  kind "dinov3" is DINOv3's instead (Simeoni et al. 2025; timm's RotaryEmbeddingDinoV3): positions are the patches'
  centres scaled to [-1, 1] along each axis (any grid spans the same range: ref_grid is not used), the angles 2 pi x
  position / temperature^(2j / (head_dim / 2)), and the layout is the "half" one: channel i turns with i + head_dim / 2
  (apply_rope(..., half=True)).
  """
  if head_dim % 4:
    raise ValueError(f"2-D rotary position embedding needs a head size divisible by 4, got {head_dim}")
  bands = head_dim // 4
  f32 = np.float32
  if kind == "dinov3":
    axes = [(f32(2) * ((np.arange(n, dtype=f32) + f32(0.5)) / f32(n)) - f32(1)).astype(f32) for n in grid]
    periods = (f32(temperature) ** (f32(2) * np.arange(bands, dtype=f32) / f32(head_dim // 2))).astype(f32)
    freqs = (f32(2 * np.pi) / periods).astype(f32)
  else:
    freqs = (f32(1) / f32(temperature) ** (np.arange(bands, dtype=f32) / f32(bands))).astype(f32)
    axes = [np.arange(n, dtype=f32) for n in grid]
    if ref_grid is not None:
      axes = [(t / f32(n) * f32(r)).astype(f32) for t, n, r in zip(axes, grid, ref_grid)]
  rows, cols = np.meshgrid(*axes, indexing="ij")
  angle = np.stack([rows, cols], -1)[..., None] * freqs  # [h, w, 2, bands]
  angle = angle.reshape(-1, 2 * bands)
  expand = (lambda a: np.concatenate([a, a], -1)) if kind == "dinov3" else (lambda a: np.repeat(a, 2, -1))
  sin, cos = expand(np.sin(angle)), expand(np.cos(angle))  # [h * w, head_dim]: half or interleaved
  sin = np.concatenate([np.zeros((prefix, head_dim), f32), sin]).astype(f32)
  cos = np.concatenate([np.ones((prefix, head_dim), f32), cos]).astype(f32)
  return sin, cos


class LearnedPositionEmbedding(nn.Module):
  """Adds a learned [1, N, D] table (param "pos_embedding", N(0, 0.02) init) to inputs [B, N, D]."""

  embedding_init: Callable = nn.initializers.normal(stddev=0.02)
  grid: Sequence[int] | None = None
  prefix: int = 0

  @nn.compact
  def __call__(self, x: Array, grid: Sequence[int] | None = None) -> Array:
    """Adds the table: x [B, N, D] -> x + the table [1, N, D] (created at x's shape, cast to x's dtype).

    With `grid` (the attribute) the table is [1, prefix + h * w, D] for that patch grid, whatever x's, and every call
    resamples its patch rows to the patch grid of x, `grid` (the argument), as torch's antialiased bicubic resamples
    (timm's dynamic_img_size); its first `prefix` rows (a class token's, registers') stay as they are.
    """
    if self.grid is None:
      pe = self.param("pos_embedding", self.embedding_init, (1,) + x.shape[1:])
      return x + pe.astype(x.dtype)
    (h, w), (gh, gw) = self.grid, grid
    pe = self.param("pos_embedding", self.embedding_init, (1, self.prefix + h * w, x.shape[-1]))
    if (h, w) != (gh, gw):
      rows, cols = (jnp.asarray(antialiased_bicubic_weights(a, b), jnp.float32) for a, b in ((h, gh), (w, gw)))
      patches = jnp.einsum("ih,jw,hwd->ijd", rows, cols, pe[0, self.prefix :].reshape(h, w, -1)).reshape(1, gh * gw, -1)
      pe = jnp.concatenate([pe[:, : self.prefix], patches], axis=1)
    if pe.shape[1] != x.shape[1]:
      raise ValueError(f"a position table of {pe.shape[1]} rows for {x.shape[1]} tokens (grid {tuple(grid)})")
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
  method: jax.image.resize's ("bicubic", "bilinear", "nearest", ...; no antialiasing), or "bicubic_aa": torch's
  interpolate(mode="bicubic", antialias=True), as timm's resample_abs_pos_embed and transformers' DINOv2 resample
  (antialiased_bicubic_weights).
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
  if method == "bicubic_aa":
    rows, cols = (antialiased_bicubic_weights(a, b) for a, b in zip(old_grid, new_grid))
    grid = np.einsum("ih,jw,hwd->ijd", rows, cols, grid.astype(np.float64))
  else:
    grid = jax.image.resize(grid, (new_grid[0], new_grid[1], grid.shape[-1]), method=method, antialias=False)
  grid = np.asarray(grid, np.float32).reshape(1, new_grid[0] * new_grid[1], -1)
  return np.concatenate([prefix, grid], axis=1)


def antialiased_bicubic_weights(size_in: int, size_out: int) -> np.ndarray:
  """[size_out, size_in]: torch's bicubic resampling with antialias=True along one axis (PIL's filter), as weights.

  Output sample i sits at (i + 0.5) * s in input pixels, s = size_in / size_out (align_corners=False); it takes the
  input samples within 2 * max(s, 1) of it, weighted by Keys' cubic (a = -0.5) of their distance / max(s, 1) and
  normalised to sum 1 (at the borders too: the samples past the edge are left out, not repeated).
  """
  scale = size_in / size_out
  stretch = max(scale, 1.0)
  support = 2.0 * stretch

  def cubic(x):
    x, a = np.abs(x), -0.5
    near = ((a + 2) * x - (a + 3)) * x * x + 1
    far = ((a * x - 5 * a) * x + 8 * a) * x - 4 * a
    return np.where(x <= 1, near, np.where(x < 2, far, 0.0))

  out = np.zeros((size_out, size_in))
  for i in range(size_out):
    center = scale * (i + 0.5)
    lo, hi = max(int(center - support + 0.5), 0), min(int(center + support + 0.5), size_in)
    j = np.arange(lo, hi)
    w = cubic((j - center + 0.5) / stretch)
    out[i, lo:hi] = w / w.sum()
  return out


def relative_position_index(window: Sequence[int], cls_token: bool = False) -> np.ndarray:
  """[N, N] int index into a ((2Wh-1)(2Ww-1), heads) table for a window of N = Wh*Ww tokens (row-major).

  Query a, key b of relative offset (dy, dx) = pos(a) - pos(b) read row (dy + Wh-1)(2Ww-1) + (dx + Ww-1).
  cls_token: a class token comes first, N = 1 + Wh*Ww, and reads three rows past the table, R = (2Wh-1)(2Ww-1)
  (BEiT's): R for cls -> patch (the class token's query row), R+1 for patch -> cls, R+2 for cls -> cls.
  """
  wh, ww = window
  coords = np.stack(np.meshgrid(np.arange(wh), np.arange(ww), indexing="ij")).reshape(2, -1)  # [2, N]
  rel = coords[:, :, None] - coords[:, None, :]  # [2, N, N]
  idx = (rel[0] + wh - 1) * (2 * ww - 1) + (rel[1] + ww - 1)
  if not cls_token:
    return idx
  r = (2 * wh - 1) * (2 * ww - 1)
  out = np.empty((1 + wh * ww,) * 2, idx.dtype)
  out[1:, 1:] = idx
  out[0, :] = r
  out[:, 0] = r + 1
  out[0, 0] = r + 2
  return out


class RelativePositionBias(nn.Module):
  """A learned relative position bias (Swin's, and the ViT's option).

  A ((2Wh-1)(2Ww-1), heads) table "relative_position_bias_table" indexed by the relative offsets of a Wh x Ww token
  grid.

  cls_token: a class token precedes the grid; its three entries (cls -> patch, patch -> cls, cls -> cls, see
  relative_position_index) are a separate [3, heads] param "cls_bias", so the table keeps the grid's shape.
  Returns the additive attention bias [heads, N, N], N = Wh*Ww (+ 1 with cls_token).
  """

  window: tuple[int, int]
  num_heads: int
  cls_token: bool = False
  table_init: Callable = nn.initializers.truncated_normal(stddev=0.02)

  @nn.compact
  def __call__(self) -> Array:
    """The bias float [num_heads, N, N], N = Wh Ww (+ 1 with cls_token), gathered from the table."""
    wh, ww = self.window
    table = self.param("relative_position_bias_table", self.table_init, ((2 * wh - 1) * (2 * ww - 1), self.num_heads))
    if self.cls_token:
      table = jnp.concatenate([table, self.param("cls_bias", self.table_init, (3, self.num_heads))], axis=0)
    idx = relative_position_index(self.window, self.cls_token)
    n = idx.shape[0]
    return table[idx.reshape(-1)].reshape(n, n, self.num_heads).transpose(2, 0, 1)


RESIZE_METHODS = ("clip", "nearest", "linear", "bilinear", "cubic", "bicubic", "lanczos3", "lanczos5")


def resize_relative_bias_table(
  table: Array | np.ndarray, old_window: Sequence[int], new_window: Sequence[int], method: str = "bicubic"
) -> np.ndarray:
  """Resizes a [..., (2Wh-1)(2Ww-1), heads] table (leading axes, e.g. scan's layers, are kept) to a new window.

  method "clip" keeps the offsets: an offset both windows have keeps its bias exactly, and an offset beyond
  the old window takes the bias of the nearest old one (each coordinate clipped, as Shaw et al. 2018 clip
  distances): right when a patch offset keeps its meaning, as for a ViT at another resolution. Other methods
  (jax.image.resize's; "bicubic" is Swin's when fine-tuning with another window) resample the (2Wh-1) x (2Ww-1)
  offset grid over the new one: the zero offset and constant tables are kept, other offsets are stretched.
  """
  if method not in RESIZE_METHODS:
    raise ValueError(f"unknown resize method {method!r}; use one of {', '.join(RESIZE_METHODS)}")
  table = np.asarray(table, np.float32)
  old = (2 * old_window[0] - 1, 2 * old_window[1] - 1)
  new = (2 * new_window[0] - 1, 2 * new_window[1] - 1)
  if table.ndim < 2 or table.shape[-2] != old[0] * old[1]:
    raise ValueError(f"table of shape {table.shape} does not fit window {tuple(old_window)} ({old[0] * old[1]} rows)")
  if old == new:
    return table
  lead, heads = table.shape[:-2], table.shape[-1]
  grid = table.reshape(*lead, old[0], old[1], heads)
  if method == "clip":
    rows = np.clip(np.arange(new[0]) - (new[0] // 2), -(old[0] // 2), old[0] // 2) + old[0] // 2
    cols = np.clip(np.arange(new[1]) - (new[1] // 2), -(old[1] // 2), old[1] // 2) + old[1] // 2
    grid = grid[..., rows[:, None], cols[None, :], :]
  else:
    grid = np.asarray(jax.image.resize(grid, (*lead, new[0], new[1], heads), method=method, antialias=False))
  return np.asarray(grid, np.float32).reshape(*lead, new[0] * new[1], heads)
