"""Swin Transformer (Liu et al. 2021): window attention with a relative position bias, shifted windows, patch merging.

Layout follows timm's (downsampling at the start of stages 2-4), so weights map one to one.

Feature maps are [B, H, W, C]. Per stage and per axis, where the map is not larger than the window the
window shrinks to the map and the shift is dropped (as the reference does); where the window does not
divide the map, the shifted map is zero-padded to whole windows and cropped back after attention (timm's
convention; the padded tokens are not masked).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from vitjax import dots
from vitjax.attention import MultiHeadAttention
from vitjax.layers import BIAS_TABLE_TP_RULE, TP_RULES, DropPath, FeedForward, drop_path_rates
from vitjax.models import adapt, registry
from vitjax.models.vit import ConvStem, check_divisible
from vitjax.posenc import RelativePositionBias

Array = jax.Array

# name: (embed_dim, depths, num_heads)
VARIANTS = {
  "T": (96, (2, 2, 6, 2), (3, 6, 12, 24)),
  "S": (96, (2, 2, 18, 2), (3, 6, 12, 24)),
  "B": (128, (2, 2, 18, 2), (4, 8, 16, 32)),
  "L": (192, (2, 2, 18, 2), (6, 12, 24, 48)),
}


def effective_window(feature_hw: Sequence[int], window: Sequence[int], shift: Sequence[int]):
  """Per axis: a map not larger than the window takes the map's size as window and no shift."""
  win = tuple(r if r <= w else w for r, w in zip(feature_hw, window))
  sh = tuple(0 if r <= w else s for r, w, s in zip(feature_hw, win, shift))
  return win, sh


def window_partition(x: Array, window: Sequence[int]) -> Array:
  """[B, H, W, C] -> [B, nW, Wh*Ww, C] (H, W multiples of the window; windows row-major)."""
  b, h, w, c = x.shape
  wh, ww = window
  x = x.reshape(b, h // wh, wh, w // ww, ww, c).transpose(0, 1, 3, 2, 4, 5)
  return x.reshape(b, (h // wh) * (w // ww), wh * ww, c)


def window_reverse(x: Array, window: Sequence[int], hw: Sequence[int]) -> Array:
  """Inverse of window_partition: [B, nW, Wh*Ww, C] -> [B, H, W, C]."""
  b, _, _, c = x.shape
  (wh, ww), (h, w) = window, hw
  x = x.reshape(b, h // wh, w // ww, wh, ww, c).transpose(0, 1, 3, 2, 4, 5)
  return x.reshape(b, h, w, c)


@functools.cache
def shift_attention_mask(hw: tuple[int, int], window: tuple[int, int], shift: tuple[int, int]) -> np.ndarray:
  """[nW, N, N] boolean: after a cyclic shift, tokens attend only within their own pre-shift region.

  The (padded) map is cut into 3 x 3 regions by the lines -window and -shift along each axis; two tokens of
  one window may attend to each other when they come from the same region.
  """
  regions = np.zeros(hw, np.int32)
  cuts = [((0, -window[a]), (-window[a], -shift[a]), (-shift[a], None)) for a in range(2)]
  label = 0
  for hs in cuts[0]:
    for ws in cuts[1]:
      regions[slice(*hs), slice(*ws)] = label
      label += 1
  windows = np.asarray(window_partition(regions[None, :, :, None], window))[0, :, :, 0]  # [nW, N]
  return windows[:, :, None] == windows[:, None, :]


class SwinBlock(nn.Module):
  """(Shifted-)window attention + MLP, pre-norm, with stochastic depth. [B, H, W, C] -> [B, H, W, C]."""

  num_heads: int
  window: tuple[int, int]
  shift: tuple[int, int]
  mlp_ratio: float = 4.0
  act: str = "gelu"
  qkv_bias: bool = True
  dropout_rate: float = 0.0
  attention_dropout_rate: float = 0.0
  drop_path: float = 0.0
  implementation: str = "fast"
  deterministic: bool = True
  dtype: Any = None

  @nn.compact
  def __call__(self, x: Array) -> Array:
    """Applies the block: x [B, H, W, C] -> [B, H, W, C].

    The window and shift shrink to the map where it is not larger than the window (`effective_window`); the map is
    cyclically shifted, padded to whole windows, attended within each window (with the relative position bias and,
    when shifted, the mask of `shift_attention_mask`), and put back; then the MLP. Both branches are pre-norm
    residuals with dropout and stochastic depth.
    """
    b, h, w, c = x.shape
    win, shift = effective_window((h, w), self.window, self.shift)
    shortcut = x
    x = nn.LayerNorm(epsilon=1e-5, dtype=self.dtype, name="norm1")(x)
    if any(shift):  # cyclic shift of the map, then padding to whole windows (timm's order)
      x = jnp.roll(x, (-shift[0], -shift[1]), axis=(1, 2))
    ph, pw = (-h) % win[0], (-w) % win[1]
    x = jnp.pad(x, ((0, 0), (0, ph), (0, pw), (0, 0)))
    hp, wp = h + ph, w + pw
    windows = window_partition(x, win)  # [B, nW, N, C]
    nw, n = windows.shape[1], windows.shape[2]
    bias = RelativePositionBias(win, self.num_heads, name="rel_pos")()[None, None]  # [1, 1, H, N, N]
    mask = None
    if any(shift):
      mask = jnp.asarray(shift_attention_mask((hp, wp), win, shift))[None, :, None]  # [1, nW, 1, N, N]
      mask = jnp.broadcast_to(mask, (b, nw, 1, n, n)).reshape(b * nw, 1, n, n)
    attn = MultiHeadAttention(
      self.num_heads,
      qkv_bias=self.qkv_bias,
      dropout_rate=self.attention_dropout_rate,
      implementation=self.implementation,
      deterministic=self.deterministic,
      dtype=self.dtype,
      name="attn",
    )
    y = attn(windows.reshape(b * nw, n, c), mask=mask, bias=bias[0]).reshape(b, nw, n, c)
    x = window_reverse(y, win, (hp, wp))[:, :h, :w]
    if any(shift):
      x = jnp.roll(x, shift, axis=(1, 2))
    drop = lambda y: DropPath(self.deterministic)(
      nn.Dropout(self.dropout_rate)(y, deterministic=self.deterministic), self.drop_path
    )
    x = shortcut + drop(x)
    y = nn.LayerNorm(epsilon=1e-5, dtype=self.dtype, name="norm2")(x)
    y = FeedForward(
      int(c * self.mlp_ratio),
      act=self.act,
      dropout_rate=self.dropout_rate,
      deterministic=self.deterministic,
      dtype=self.dtype,
      kernel_init=nn.initializers.truncated_normal(0.02),
      bias_init=nn.initializers.zeros,
      name="mlp",
    )(y)
    return x + drop(y)


class PatchMerging(nn.Module):
  """2x2 neighbours concatenated (4C), LayerNorm, linear to 2C. [B, H, W, C] -> [B, ceil(H/2), ceil(W/2), 2C]."""

  dtype: Any = None

  @nn.compact
  def __call__(self, x: Array) -> Array:
    """Merges 2x2 patches: x [B, H, W, C] -> [B, ceil(H/2), ceil(W/2), 2C].

    An odd H or W is zero-padded by one row or column first.
    """
    b, h, w, c = x.shape
    x = jnp.pad(x, ((0, 0), (0, h % 2), (0, w % 2), (0, 0)))
    x = jnp.concatenate([x[:, 0::2, 0::2], x[:, 1::2, 0::2], x[:, 0::2, 1::2], x[:, 1::2, 1::2]], axis=-1)
    x = nn.LayerNorm(epsilon=1e-5, dtype=self.dtype, name="norm")(x)
    return dots.Dense(2 * c, use_bias=False, dtype=self.dtype, name="reduction")(x)


def parse_name(name: str) -> dict | None:
  """The Swin's keyword arguments for a name such as "swin_t"; None for another family's name."""
  if m := re.match(r"^swin_(t|s|b|l)$", name):
    embed, depths, heads = VARIANTS[m[1].upper()]
    return dict(embed_dim=embed, depths=depths, num_heads=heads)
  return None


@registry.register(
  parse_name,
  examples=("swin_t", "swin_s", "swin_b", "swin_l"),
  no_decay=("relative_position_bias_table",),
  tp_rules=(*TP_RULES, BIAS_TABLE_TP_RULE),
  adapters=(adapt.bias_table_resizer("bicubic"),),  # the window resampled, as Microsoft's code does
  # msft and hf: read through swin_timm
  formats={"timm": "vitjax.models.swin_timm", "msft": "vitjax.models.swin_msft", "hf": "vitjax.models.swin_hf"},
)
class Swin(nn.Module):
  """Swin Transformer. __call__(images [B, H, W, C], train) -> (logits [B, classes], intermediates).

  Attributes:
    num_classes: classifier outputs; 0 or None gives pooled features.
    patch_size: side of the square patch partition (4).
    stem: "patch" (a p x p stride-p convolution, the paper's) or "conv" (the ViT's ConvStem, Xiao et al.
      2021: 3x3 stride-2 convolutions with BatchNorm, which helps on small images).
    stem_depth: with stem "conv", the 3x3 convolutions at each of its resolutions (ConvStem.depth).
    embed_dim, depths, num_heads: the architecture (see VARIANTS).
    window_size: attention window (7 at 224 px, 12 at 384 px); shifts are window // 2 on odd blocks.
    act: the MLP activation, "gelu" (exact, as Microsoft's and timm's Swin), "gelu_tanh" or "relu".
    drop_path_rate: stochastic depth of the last block, rising linearly over all blocks.
  intermediates: "stage_{i}" [B, H_i, W_i, C_i] feature maps, "patches" [B, H, W, C] (the last, normalised: what
    the head's average pools), "pre_logits" [B, C].
  """

  num_classes: int | None = 1000
  patch_size: int = 4
  stem: str = "patch"
  stem_depth: int = 1
  embed_dim: int = 96
  depths: Sequence[int] = (2, 2, 6, 2)
  num_heads: Sequence[int] = (3, 6, 12, 24)
  window_size: int | Sequence[int] = 7
  mlp_ratio: float = 4.0
  act: str = "gelu"
  qkv_bias: bool = True
  dropout_rate: float = 0.0
  attention_dropout_rate: float = 0.0
  drop_path_rate: float = 0.1
  implementation: str = "fast"
  dtype: Any = None

  @property
  def patch_hw(self) -> tuple[int, int]:
    """patch_size as (height, width)."""
    return (self.patch_size, self.patch_size)

  @property
  def num_layers(self) -> int:
    """All stages' blocks: what layer-wise learning-rate decay counts (see layer_index)."""
    return sum(self.depths)

  def layer_index(self, path: str) -> int:
    """The layer of the parameter at ``path`` ("stage_2_block_1/attn/query/kernel") for layer-wise learning-rate decay.

    Numbered over all stages as SimMIM fine-tunes Swin: 0 for the stem (patch_embed or conv_stem, patch_norm),
    sum(depths[:s]) + j + 1 in block j of stage s, sum(depths[:s]) (its preceding block's) for the patch merging before
    stage s, sum(depths) + 1 for the final norm and the head.
    """
    if m := re.match(r"stage_(\d+)_(?:block_(\d+)|downsample)/", path):
      before = sum(self.depths[: int(m[1])])
      return before if m[2] is None else before + int(m[2]) + 1
    if path.startswith(("norm/", "head/")):
      return sum(self.depths) + 1
    return 0

  @registry.fits_weights
  @nn.compact
  def __call__(self, images: Array, train: bool = False) -> tuple[Array, dict]:
    """Classifies images.

    Long: the network's stages in order, with its documented inputs.

    Args:
      images: float [B, H, W, C], H and W multiples of the patch size.
      train: dropout and stochastic depth on, BatchNorm of the conv stem in training mode.

    Returns:
      (logits float32 [B, num_classes], or the pooled features float32 [B, C] without a head; intermediates
      {"stage_i": [B, H_i, W_i, C_i], "pre_logits": [B, C]}).

    Raises:
      ValueError: images not 4-D, depths and num_heads of different lengths, an image size not divisible by the
        patch, or an unknown stem.
    """
    if images.ndim != 4:
      raise ValueError(f"Swin takes images [B, H, W, C], got shape {images.shape}")
    if len(self.depths) != len(self.num_heads):
      raise ValueError(f"depths {self.depths} and num_heads {self.num_heads} must have the same length")
    p = self.patch_hw
    check_divisible(images.shape[1:3], p)
    window = tuple(self.window_size) if isinstance(self.window_size, Sequence) else (self.window_size,) * 2
    images = images.astype(self.dtype or images.dtype)
    if self.stem == "patch":
      x = dots.Conv(self.embed_dim, p, strides=p, padding="VALID", dtype=self.dtype, name="patch_embed")(images)
    elif self.stem == "conv":
      x = ConvStem(self.embed_dim, self.patch_size, self.stem_depth, train=train, dtype=self.dtype, name="conv_stem")(
        images
      )
    else:
      raise ValueError(f"unknown stem {self.stem!r}; use 'patch' or 'conv'")
    x = nn.LayerNorm(epsilon=1e-5, dtype=self.dtype, name="patch_norm")(x)
    x = nn.Dropout(self.dropout_rate)(x, deterministic=not train)
    rates = drop_path_rates(self.drop_path_rate, sum(self.depths))
    out, k = {}, 0
    for s, (depth, heads) in enumerate(zip(self.depths, self.num_heads)):
      if s > 0:
        x = PatchMerging(dtype=self.dtype, name=f"stage_{s}_downsample")(x)
      for j in range(depth):
        shift = (0, 0) if j % 2 == 0 else (window[0] // 2, window[1] // 2)
        x = SwinBlock(
          heads,
          window,
          shift,
          mlp_ratio=self.mlp_ratio,
          act=self.act,
          qkv_bias=self.qkv_bias,
          dropout_rate=self.dropout_rate,
          attention_dropout_rate=self.attention_dropout_rate,
          drop_path=float(rates[k]),
          implementation=self.implementation,
          deterministic=not train,
          dtype=self.dtype,
          name=f"stage_{s}_block_{j}",
        )(x)
        k += 1
      out[f"stage_{s}"] = x
    x = nn.LayerNorm(epsilon=1e-5, dtype=self.dtype, name="norm")(x)
    out["patches"] = x
    x = x.mean(axis=(1, 2))
    out["pre_logits"] = x
    if self.num_classes:
      x = dots.Dense(
        self.num_classes, dtype=self.dtype, kernel_init=nn.initializers.truncated_normal(0.02), name="head"
      )(x)
    return x.astype(jnp.float32), out
