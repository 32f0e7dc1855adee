"""Vision Transformer (Dosovitskiy et al. 2021), every option of the family in one module.

Patchify (or a convolutional stem, Xiao et al. 2021) -> optional LayerNorm -> optional class token and register
tokens (Darcet et al. 2024) -> position embedding (learned or 2-D sin-cos) -> encoder (optionally with LayerScale) (pre-norm, post-norm or res-post-norm blocks, optionally with a
learned relative position bias) -> pooling (class token, global average, a MAP head, or all tokens flattened)
-> optional pre-logits layer -> classifier. Images are [B, H, W, C]; H and W must be multiples of the
patch size but need not be equal.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from vitjax import dots
from vitjax.attention import MultiHeadAttention
from vitjax.layers import BIAS_TABLE_TP_RULE, NORMS, TP_RULES, EncoderBlock, FeedForward, Stack
from vitjax.models import adapt, registry, vit_backbones
from vitjax.posenc import LearnedPositionEmbedding, rope_2d, sincos_2d

Array = jax.Array
POOL_TYPES = ("tok", "gap", "map", "none", "flatten", "tok_gap")
ROPES = ("axial", "dinov3")  # ViT.rope

# name: (width, depth, mlp_dim, heads)
VARIANTS = {
  "Ti": (192, 12, 768, 3),
  "S": (384, 12, 1536, 6),
  "M": (512, 12, 2048, 8),
  "B": (768, 12, 3072, 12),
  "L": (1024, 24, 4096, 16),
  "H": (1280, 32, 5120, 16),
}


def parse_variant(variant: str) -> dict:
  """A variant's sizes, e.g. "S/16" -> dict(width=384, depth=12, mlp_dim=1536, num_heads=6, patch_size=(16, 16))."""
  try:
    size, patch = variant.split("/")
    width, depth, mlp_dim, heads = VARIANTS[size]
    patch = int(patch)
  except (ValueError, KeyError):
    raise ValueError(
      f"unknown ViT variant {variant!r}: use SIZE/PATCH with SIZE one of "
      f"{list(VARIANTS)} and PATCH an integer, e.g. 'B/16'"
    ) from None
  return dict(width=width, depth=depth, mlp_dim=mlp_dim, num_heads=heads, patch_size=(patch, patch))


def check_divisible(image_hw: Sequence[int], patch: Sequence[int], what: str = "patch size") -> None:
  """Raises a ValueError naming the nearest working sizes when the image is not a multiple of `patch`."""
  bad = [(s, p) for s, p in zip(image_hw, patch) if s % p]
  if bad:
    sizes = lambda s, p: " or ".join(str(m) for m in ((s // p) * p, (s // p + 1) * p) if m > 0)  # never 0
    hints = ", ".join(f"{s} -> {sizes(s, p)}" for s, p in bad)
    raise ValueError(
      f"image size {tuple(image_hw)} is not divisible by the {what} {tuple(patch)}; "
      f"resize or crop to a multiple ({hints})"
    )


class ConvStem(nn.Module):
  """Xiao et al. 2021 stem: log2(p) 3x3 stride-2 convs (BatchNorm, ReLU), then a 1x1 conv to the width.

  [B, H, W, C] -> [B, H/p, W/p, width]. Channels double up to the width: width/2^(n-1), ..., width.
  depth: 3x3 convs (BatchNorm, ReLU) at each resolution: the stride-2 one ("conv_{i}", "bn_{i}"), then depth - 1
  that keep the size ("conv_{i}_{j}", "bn_{i}_{j}", j = 1 .. depth - 1), a small CNN before the tokens.
  """

  width: int
  patch: int
  depth: int = 1
  train: bool = False
  dtype: Any = None

  @nn.compact
  def __call__(self, x: Array) -> Array:
    """Applies the stem: x [B, H, W, C] -> [B, H/patch, W/patch, width].

    Raises:
      ValueError: `patch` is not a power of two, or `depth` < 1.
    """
    n = int(math.log2(self.patch))
    if 2**n != self.patch:
      raise ValueError(f"the convolutional stem needs a power-of-two patch size, got {self.patch}")
    if self.depth < 1:
      raise ValueError(f"the convolutional stem needs depth >= 1 (convolutions per resolution), got {self.depth}")
    for i in range(n):
      for j in range(self.depth):
        suffix = f"{i}" if j == 0 else f"{i}_{j}"
        x = dots.Conv(
          max(self.width // 2 ** (n - 1 - i), 8),
          (3, 3),
          strides=2 if j == 0 else 1,
          padding=1,
          use_bias=False,
          dtype=self.dtype,
          name=f"conv_{suffix}",
        )(x)
        x = nn.BatchNorm(use_running_average=not self.train, dtype=self.dtype, name=f"bn_{suffix}")(x)
        x = nn.relu(x)
    return dots.Conv(self.width, (1, 1), dtype=self.dtype, name="proj")(x)


class MAPHead(nn.Module):
  """Multihead attention pooling: a learned probe attends over the tokens. [B, N, D] -> [B, D]."""

  num_heads: int
  mlp_dim: int
  act: str = "gelu"
  layernorm_eps: float = 1e-6
  implementation: str = "fast"
  dtype: Any = None

  @nn.compact
  def __call__(self, x: Array) -> Array:
    """Pools tokens x [B, N, D] into [B, D]: the learned probe attends over them, then a pre-norm residual MLP."""
    probe = self.param("probe", nn.initializers.xavier_uniform(), (1, 1, x.shape[-1]))
    probe = jnp.broadcast_to(probe.astype(x.dtype), (x.shape[0], 1, x.shape[-1]))
    x = MultiHeadAttention(self.num_heads, implementation=self.implementation, dtype=self.dtype, name="attn")(probe, x)
    y = nn.LayerNorm(epsilon=self.layernorm_eps, dtype=self.dtype, name="norm")(x)
    x = x + FeedForward(self.mlp_dim, act=self.act, dtype=self.dtype, name="mlp")(y)
    return x[:, 0]


_NAME = re.compile(r"^vit_(ti|s|m|b|l|h)(\d+)$")


def parse_name(name: str) -> dict | None:
  """The ViT's keyword arguments for a name: "vit_s16", "S/16", a backbone's ("dinov2_s14_reg4"); None if not a ViT's.

  The backbones' names: vitjax.models.vit_backbones.
  """
  if "/" in name:
    return parse_variant(name)
  if m := _NAME.match(name):
    size = "Ti" if m[1] == "ti" else m[1].upper()
    return parse_variant(f"{size}/{m[2]}")
  if backbone := vit_backbones.parse(name):
    size, options = backbone
    width, depth, mlp_dim, heads = vit_backbones.SIZES.get(size) or VARIANTS[size]
    return dict(width=width, depth=depth, mlp_dim=mlp_dim, num_heads=heads) | options
  return None


def _overrides(kw: dict) -> dict:
  if isinstance(kw.get("patch_size"), int):
    kw["patch_size"] = (kw["patch_size"],) * 2
  return kw


# The ViT's parameters that weight decay leaves alone (besides biases and norm scales), and how loaded weights
# fit another resolution. They are shared with every model built on the ViT (MAE).
NO_DECAY = ("pos_embedding", "relative_position_bias_table", "cls", "dist", "registers", "probe")
ADAPTERS = (adapt.resample_patch_positions, adapt.bias_table_resizer("clip", under="encoder/"), adapt.grey_input)


@registry.register(
  parse_name,
  examples=(
    "vit_ti16",
    "vit_s16",
    "vit_b16",
    "vit_l16",
    "vit_h14",
    "dinov2_s14_reg4",
    "deit3_s16",
    "eva02_s14",
    "siglip_b16",
  ),
  no_decay=NO_DECAY,
  tp_rules=(*TP_RULES, BIAS_TABLE_TP_RULE),
  adapters=ADAPTERS,
  formats={"timm": "vitjax.models.vit_timm", "npz": "vitjax.models.vit_npz", "hf": "vitjax.models.vit_hf"},
  overrides=_overrides,
)
class ViT(nn.Module):
  """Vision Transformer. __call__(images [B, H, W, C], train) -> (logits [B, classes], intermediates).

  Attributes:
    num_classes: classifier outputs; 0 or None gives the pooled features (no head).
    patch_size, width, depth, mlp_dim, num_heads: the architecture (see VARIANTS, parse_variant).
    pool_type: "tok" (class token), "gap" (global average), "map" (attention pooling), "tok_gap" (the class token and
      the patches' average side by side, [B, 2D]: DINOv2's linear classifier), "none" (all tokens,
      [B, N, D], to the head), "flatten" (all tokens flattened to [B, N*D], then the head: "Flatten + Linear";
      the head's kernel [N*D, classes] fixes the number of tokens, so the image size, to the one it was built for).
    posemb: "learn" (a learned table, covering the class token too, as the original ViT, unless not class_posemb),
      "sincos2d" (fixed, the patches only) or "none" (no table: DINOv3's, whose positions are rope's alone).
    posemb_grid: with posemb "learn", the patch grid of the table (say (37, 37), DINOv2's at 518 px / 14), which every
      call resamples to the input's grid (torch's antialiased bicubic: timm's dynamic_img_size): one model for any
      image size; None: the table is the input's grid at initialisation, and a call at another size is an error.
    patch_dropout: at training, each example's encoder sees a random (1 - patch_dropout) of its patches (timm's
      PatchDropout, FLIP's and EVA-CLIP's; the class token and registers stay); 0: all. Evaluation sees all.
    class_posemb: with posemb "learn", the table has rows for the class token and the registers (the original ViT's,
      timm's default, DINOv2's); False: for the patches only, the other tokens join after it is added (timm's
      no_embed_class: DeiT III, DINOv2 with registers, big_vision).
    class_token: a class token ("cls") whatever pool_type pools (EVA-02 and BEiT average the patches, with one);
      False: one only where pool_type reads it ("tok", "tok_gap").
    distill_token: DeiT's distillation token ("dist" [1, 1, D], after the class token) with a head of its own
      ("head_dist"): the logits are the mean of the two heads' (DeiT's inference), which the intermediates hold apart,
      "logits_cls" and "logits_dist" (distillation trains the second on a teacher: vitjax.tasks.distill). With
      pool_type "tok" only; False: none, and no parameter.
    num_registers: register tokens (Darcet et al. 2024, "Vision Transformers Need Registers"): learned tokens
      "registers" [1, R, D] after the class token, before the patches; attended to, never pooled ("gap" averages the
      patches only). 0: none, and no parameter.
    ffn: the blocks' feed-forward: "mlp" (two layers, `act` between) or "swiglu" (vitjax.layers.FeedForward gated, `act` on its
      gate, "silu" for SwiGLU; mlp_dim the width of each half: DINOv2-g, EVA-02).
    qk_norm: "layernorm" or "rmsnorm" on each attention's queries and keys, per head (vitjax.attention, "q_norm" and
      "k_norm"; timm's qk_norm); None: none.
    init_values: LayerScale on both residual branches of every block (vitjax.layers.LayerScale, "ls1" and "ls2"),
      initialised to this (DeiT III 1e-6, DINOv2 1e-5); None: none.
    rope: "axial": every attention turns the patches' queries and keys by their 2-D position (EVA-02's rotary
      embedding, vitjax.posenc.rope_2d; the class token and registers are not turned), on top of posemb; None: none.
      rope_temperature: its base frequency. rope_grid: the patch grid its positions span whatever the input's grid
      (EVA's ref_feat_shape, (16, 16) for EVA-02 at 224 px / 14); None: a patch's position is its index.
      "dinov3": DINOv3's (positions in [-1, 1] on any grid, the half layout; rope_temperature 100, posemb "none").
    ffn_norm: a LayerNorm on the feed-forward's hidden features (EVA-02-B/L's sub-LayerNorm, "mlp/norm").
    attn_norm: a LayerNorm on the attention heads' outputs before their projection (EVA-02 CLIP's, "attn/norm").
    key_bias: False: the keys' projection has no bias where qkv_bias gives the queries' and values' one (EVA-02's).
    stem: "patch" (a p x p stride-p convolution) or "conv" (ConvStem).
    stem_depth: with stem "conv", the 3x3 convolutions at each of its resolutions (ConvStem.depth).
    norm: where each block's LayerNorms sit (vitjax.layers.NORMS): "pre" x + F(LN(x)) (the ViT's), "post"
      LN(x + F(x)) (the 2017 Transformer's) or "respost" x + LN(F(x)) (Swin V2's res-post-norm). "pre" and
      "respost" end the encoder in a LayerNorm ("encoder/final_norm", unless fc_norm); "post" has none: its
      output is normalised already.
    embed_norm: a LayerNorm ("embed_norm") right after the patch embedding or stem, before the class token
      and position embedding.
    rel_pos_bias: every attention layer adds a learned 2-D relative position bias per head to its logits,
      softmax(q k^T / sqrt(d) + p) (BEiT's; Swin's, over the whole patch grid instead of a window): block i learns
      "encoder/block_{i}/rel_pos/relative_position_bias_table" [(2h-1)(2w-1), heads] for an h x w patch grid
      ("encoder/blocks/block/rel_pos/..." [depth, ...] when scanned), read at the offset from key to query patch.
      With a class token ("tok") it also learns "rel_pos/cls_bias" [3, heads], BEiT's entries for cls -> patch,
      patch -> cls and cls -> cls. The table follows the grid: config.init_from at another (square) resolution
      resizes it (vitjax.models.adapt; offsets both grids have keep their bias, new ones take the nearest
      one's). The absolute position embedding (posemb) stays.
    act: the MLP activation: "gelu" (exact, timm's and PyTorch's), "gelu_tanh" (the tanh approximation,
      flax's nn.gelu default, which the original ViT and big_vision were trained with) or "relu".
    representation_size: width of the optional pre-logits layer (Dense + tanh).
    fc_norm: with pool_type "gap", normalise after pooling instead of before (timm's gap models).
    dropout_rate, attention_dropout_rate, drop_path_rate: regularisation.
    scan, remat: scan over layers / rematerialise each block (memory for compute).
    implementation: the attention implementation (see vitjax.attention).
    dtype: compute dtype (parameters stay float32).
  intermediates: "pre_logits" [B, D] (pooled features; [B, N*D] with "flatten"), "encoded" [B, N, D], "patches"
    [B, h, w, D] (the encoded patch tokens on their grid: DINOv2's x_norm_patchtokens; not when `keep` drops some).
  """

  num_classes: int | None = 1000
  patch_size: Sequence[int] = (16, 16)
  width: int = 768
  depth: int = 12
  mlp_dim: int | None = None
  num_heads: int = 12
  pool_type: str = "tok"
  posemb: str = "learn"
  class_posemb: bool = True
  posemb_grid: Sequence[int] | None = None
  patch_dropout: float = 0.0
  class_token: bool = False
  distill_token: bool = False
  num_registers: int = 0
  init_values: float | None = None
  qk_norm: str | None = None
  ffn: str = "mlp"
  rope: str | None = None
  rope_temperature: float = 10000.0
  rope_grid: Sequence[int] | None = None
  ffn_norm: bool = False
  attn_norm: bool = False
  key_bias: bool = True
  stem: str = "patch"
  stem_depth: int = 1
  norm: str = "pre"
  embed_norm: bool = False
  rel_pos_bias: bool = False
  act: str = "gelu"
  representation_size: int | None = None
  fc_norm: bool = False
  head_zeroinit: bool = True
  dropout_rate: float = 0.0
  attention_dropout_rate: float = 0.0
  drop_path_rate: float = 0.0
  qkv_bias: bool = True
  layernorm_eps: float = 1e-6
  scan: bool = False
  remat: bool = False
  implementation: str = "fast"
  dtype: Any = None

  @property
  def patch_hw(self) -> tuple[int, int]:
    """patch_size as (height, width)."""
    p = self.patch_size
    return tuple(p) if isinstance(p, Sequence) else (p, p)

  @property
  def has_class_token(self) -> bool:
    """Whether the tokens start with a class token ("cls"): pool_type "tok" or "tok_gap", or class_token."""
    return self.class_token or self.pool_type in ("tok", "tok_gap")

  @property
  def num_layers(self) -> int:
    """The encoder's blocks: what layer-wise learning-rate decay counts (see layer_index)."""
    return self.depth

  def layer_index(self, path: str) -> int | np.ndarray:
    """The layer of the parameter at ``path`` ("encoder/block_3/mlp/fc1/kernel") for layer-wise learning-rate decay.

    BEiT's and MAE's numbering: 0 before the encoder (embedding or conv_stem, embed_norm, cls, posembed), i + 1 in
    encoder block i, depth + 1 after it (encoder/final_norm, map_head, fc_norm, pre_logits, head, head_dist). A scanned encoder's
    parameters ("encoder/blocks/...", stacked over blocks) get [1, ..., depth] along their first axis.
    """
    if m := re.match(r"encoder/block_(\d+)/", path):
      return int(m[1]) + 1
    if path.startswith("encoder/blocks/"):
      return np.arange(1, self.depth + 1)
    if path.startswith(("encoder/", "map_head/", "fc_norm/", "pre_logits/", "head/", "head_dist/")):
      return self.depth + 1
    return 0

  # The phases of __call__: the submodules they create belong to the ViT, named as before (a parameter of the ViT's
  # own, the class token, is made in __call__: Linen makes parameters only in a compact method).

  def _embed(self, images: Array, train: bool) -> tuple[Array, tuple[int, int]]:
    """Embeds images [B, H, W, C] -> (patch embeddings [B, h * w, D], the patch grid (h, w))."""
    patch = self.patch_hw
    check_divisible(images.shape[1:3], patch)
    x = images.astype(self.dtype or images.dtype)
    if self.stem == "patch":
      x = dots.Conv(self.width, patch, strides=patch, padding="VALID", dtype=self.dtype, name="embedding")(x)
    elif self.stem == "conv":
      if patch[0] != patch[1]:
        raise ValueError(f"the convolutional stem needs a square patch, got {patch}")
      x = ConvStem(self.width, patch[0], self.stem_depth, train=train, dtype=self.dtype, name="conv_stem")(x)
    else:
      raise ValueError(f"unknown stem {self.stem!r}; use 'patch' or 'conv'")
    b, h, w, d = x.shape
    x = x.reshape(b, h * w, d)
    if self.embed_norm:
      x = nn.LayerNorm(epsilon=self.layernorm_eps, dtype=self.dtype, name="embed_norm")(x)
    return x, (h, w)

  def _tokens(self, x: Array, prefix: list, h: int, w: int, keep: Array | None, train: bool) -> tuple[Array, int]:
    """Class token and registers (`prefix`), positions, the kept patches (MAE), dropout.

    Returns ([B, prefix + patches, D], number of patches).
    """
    b, _, d = x.shape
    prefix = [jnp.broadcast_to(t.astype(x.dtype), (b, t.shape[1], d)) for t in prefix]
    if self.posemb not in ("learn", "sincos2d", "none"):
      raise ValueError(f"unknown posemb {self.posemb!r}; use 'learn', 'sincos2d' or 'none'")
    rows = sum(t.shape[1] for t in prefix) if self.class_posemb else 0  # the table's rows before the patches'
    table = LearnedPositionEmbedding(grid=self.posemb_grid, prefix=rows, name="posembed")
    if self.posemb == "learn" and self.class_posemb:  # a row for each token
      x = table(jnp.concatenate([*prefix, x], axis=1), (h, w))
    else:  # the patches' positions, then the other tokens
      if self.posemb == "learn":
        x = table(x, (h, w))
      elif self.posemb == "sincos2d":
        x = x + jnp.asarray(sincos_2d(h, w, d), x.dtype)[None]
      x = jnp.concatenate([*prefix, x], axis=1) if prefix else x
    num_patches = h * w
    if keep is not None:  # after the positions are added: each kept patch keeps its own
      if self.rel_pos_bias:
        raise ValueError("a ViT with rel_pos_bias attends over the whole patch grid: it cannot drop patches (keep)")
      prefix, num_patches = x.shape[1] - h * w, keep.shape[1]
      patches = jnp.take_along_axis(x[:, prefix:], keep[:, :, None].astype(jnp.int32), axis=1)
      x = jnp.concatenate([x[:, :prefix], patches], axis=1)
    return nn.Dropout(self.dropout_rate)(x, deterministic=not train), num_patches

  def _rope(self, grid: tuple[int, int], prefix: int, keep: Array | None) -> tuple | None:
    """The rotary embedding's (sin, cos) of the tokens: [T, K], or [B, T, K] for the kept patches; None without rope."""
    if self.rope is None:
      return None
    if self.rope not in ROPES:
      raise ValueError(f"unknown rope {self.rope!r}; use one of {', '.join(map(repr, ROPES))} or None")
    head_dim = self.width // self.num_heads
    sin, cos = rope_2d(grid, head_dim, self.rope_temperature, self.rope_grid, prefix, kind=self.rope)
    if keep is None:
      return jnp.asarray(sin), jnp.asarray(cos)
    rows = jnp.concatenate([jnp.broadcast_to(jnp.arange(prefix), (keep.shape[0], prefix)), prefix + keep], axis=1)
    return jnp.asarray(sin)[rows], jnp.asarray(cos)[rows]

  def _encoder(self, x: Array, grid: tuple[int, int], train: bool, rope: tuple | None = None) -> Array:
    block_kwargs = dict(
      num_heads=self.num_heads,
      mlp_dim=self.mlp_dim or 4 * x.shape[-1],
      norm=self.norm,
      act=self.act,
      dropout_rate=self.dropout_rate,
      attention_dropout_rate=self.attention_dropout_rate,
      qkv_bias=self.qkv_bias,
      layernorm_eps=self.layernorm_eps,
      implementation=self.implementation,
      deterministic=not train,
      dtype=self.dtype,
      init_values=self.init_values,
      qk_norm=self.qk_norm,
      ffn=self.ffn,
      ffn_norm=self.ffn_norm,
      attn_norm=self.attn_norm,
      key_bias=self.key_bias,
      rope_half=self.rope == "dinov3",
    )
    if self.rel_pos_bias:
      block_kwargs.update(rel_pos_grid=grid, rel_pos_cls_token=self.has_class_token)
    return Stack(
      EncoderBlock,
      self.depth,
      tuple(block_kwargs.items()),
      drop_path_rate=self.drop_path_rate,
      scan=self.scan,
      remat=self.remat,
      final_norm=not self.fc_norm,
      layernorm_eps=self.layernorm_eps,
      dtype=self.dtype,
      name="encoder",
    )(x, *(() if rope is None else (None, None, rope)))

  def _pool(self, x: Array, num_patches: int) -> Array:
    """Encoded tokens [B, N, D] -> the pooled representation (see pool_type)."""
    if self.pool_type == "tok":
      return x[:, 0]
    if self.pool_type == "gap":
      return x[:, -num_patches:].mean(axis=1)
    if self.pool_type == "tok_gap":
      return jnp.concatenate([x[:, 0], x[:, -num_patches:].mean(axis=1)], axis=-1)
    if self.pool_type == "map":
      mlp_dim = self.mlp_dim or 4 * x.shape[-1]
      kwargs = dict(act=self.act, layernorm_eps=self.layernorm_eps, implementation=self.implementation)
      return MAPHead(self.num_heads, mlp_dim, **kwargs, dtype=self.dtype, name="map_head")(x)
    if self.pool_type == "flatten":
      return x.reshape(x.shape[0], -1)
    return x  # "none"

  @registry.fits_weights
  @nn.compact
  def __call__(self, images: Array, train: bool = False, keep: Array | None = None) -> tuple[Array, dict]:
    """Applies the ViT to images [B, H, W, C], optionally to a subset of their patches (`keep`).

    keep: int [B, K], the patches (row-major positions in the patch grid) that enter the encoder, for masked image
    modelling (vitjax.models.mae); the class token, if any, stays. None: all of them.
    """
    if images.ndim != 4:
      raise ValueError(f"ViT takes images [B, H, W, C], got shape {images.shape}")
    if self.pool_type not in POOL_TYPES:
      raise ValueError(f"unknown pool_type {self.pool_type!r}; use one of {', '.join(map(repr, POOL_TYPES))}")
    if self.norm not in NORMS:
      raise ValueError(f"unknown norm {self.norm!r}; use one of {', '.join(map(repr, NORMS))}")
    x, (h, w) = self._embed(images, train)
    prefix = []
    if self.has_class_token:
      prefix.append(self.param("cls", nn.initializers.normal(1e-6), (1, 1, x.shape[-1])))
    if self.distill_token:
      if self.pool_type != "tok" or self.fc_norm or self.representation_size or self.rel_pos_bias:
        raise ValueError("distill_token: DeiT's heads read the class and distillation tokens (pool_type 'tok', no "
                         "fc_norm, representation_size or rel_pos_bias)")  # fmt: skip
      prefix.append(self.param("dist", nn.initializers.normal(0.02), (1, 1, x.shape[-1])))
    if self.num_registers:
      prefix.append(self.param("registers", nn.initializers.normal(1e-6), (1, self.num_registers, x.shape[-1])))
    if train and self.patch_dropout and keep is None:  # a random subset of each example's patches
      n = max(1, int(h * w * (1.0 - self.patch_dropout)))
      keep = jnp.argsort(jax.random.uniform(self.make_rng("dropout"), (x.shape[0], h * w)), axis=1)[:, :n]
    x, num_patches = self._tokens(x, prefix, h, w, keep, train)
    x = self._encoder(x, (h, w), train, self._rope((h, w), x.shape[1] - num_patches, keep))
    out = {"encoded": x}
    if keep is None:
      out["patches"] = x[:, -h * w :].reshape(x.shape[0], h, w, x.shape[-1])
    x = self._pool(x, num_patches)
    if self.fc_norm:
      x = nn.LayerNorm(epsilon=self.layernorm_eps, dtype=self.dtype, name="fc_norm")(x)
    if self.representation_size:
      x = jnp.tanh(dots.Dense(self.representation_size, dtype=self.dtype, name="pre_logits")(x))
    out["pre_logits"] = x
    if self.num_classes:
      init = nn.initializers.zeros if self.head_zeroinit else nn.initializers.lecun_normal()
      head = lambda t, name: dots.Dense(self.num_classes, kernel_init=init, dtype=self.dtype, name=name)(t)
      if self.distill_token:  # DeiT: each token its head; the logits their mean
        out["logits_cls"] = head(x, "head").astype(jnp.float32)
        out["logits_dist"] = head(out["encoded"][:, 1], "head_dist").astype(jnp.float32)
        return (out["logits_cls"] + out["logits_dist"]) / 2, out
      x = head(x, "head")
    return x.astype(jnp.float32), out
