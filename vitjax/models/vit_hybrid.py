"""The hybrid ViT of the original release: a BiT-style ResNet stem whose feature map is cut into patches.

Dosovitskiy et al. 2021, section 3.1 ("Hybrid Architecture") and the R50+ViT-B_16, R26+ViT-S_32, R50+ViT-L_32 and
R+ViT-Ti_16 checkpoints of google-research/vision_transformer (timm: vit_base_r50_s16_*, vit_small_r26_s32_*,
vit_large_r50_s32_*, vit_tiny_r_s16_p8_*). Images [B, H, W, C] -> a root convolution (7x7, stride 2,
weight-standardised, GroupNorm, ReLU) -> a 3x3 stride-2 max-pool -> bottleneck stages (none for R+Ti) -> the ViT's
patch embedding over the feature map (1x1 for the R26 / R50 hybrids, 8x8 for R+Ti) -> the ViT.

The stem follows the original's arithmetic exactly: every convolution is weight-standardised per output channel as
(w - mean) / (std + 1e-5), padded 'SAME' (TensorFlow's: the odd pixel after), has no bias, and is followed by a
GroupNorm of 32 groups (epsilon 1e-6); a bottleneck unit is post-activation (conv -> GN -> ReLU, twice; conv -> GN;
ReLU after the residual sum), its stride on the 3x3 convolution, and its shortcut a strided 1x1 projection (+ GN)
where the shape changes. Its parameters sit under "resnet/" with the release's names (conv_root, gn_root,
block{s}/unit{u}/conv1..3, gn1..3, conv_proj, gn_proj).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from vitjax import dots
from vitjax.layers import BIAS_TABLE_TP_RULE, TP_RULES
from vitjax.models import registry
from vitjax.models import vit as vit_lib

Array = jax.Array

# short name: (ViT size, ResNet stages' unit counts, patch size on the feature map); the release's names in
# RELEASE_NAMES. R50+ViT-B_16 has (3, 4, 9) units: three stages, so a total stride of 16 (the original's choice).
HYBRIDS = {
  "r_ti16": ("Ti", (), 8),
  "r26_s32": ("S", (2, 2, 2, 2), 1),
  "r26_b32": ("B", (2, 2, 2, 2), 1),
  "r50_b16": ("B", (3, 4, 9), 1),
  "r50_l32": ("L", (3, 4, 6, 3), 1),
}
RELEASE_NAMES = {
  "r_ti16": "R+ViT-Ti_16",
  "r26_s32": "R26+ViT-S_32",
  "r26_b32": "R26+ViT-B_32",
  "r50_b16": "R50+ViT-B_16",
  "r50_l32": "R50+ViT-L_32",
}
_RELEASE = re.compile(r"^R(\d*)[+_]?(?:ViT-)?(Ti|S|B|L)_(\d+)$")  # "R26+ViT-S_32", AugReg's "R26_S_32", "R_Ti_16"
_SHORT = re.compile(r"^(?:vit_)?(r\d*_(?:ti|s|b|l)\d+)$")  # "r26_s32", "vit_r26_s32"


def parse_name(name: str) -> dict | None:
  """The hybrid's keyword arguments for "r26_s32", "vit_r26_s32", "R26+ViT-S_32" or "R26_S_32"; else None."""
  key = None
  if m := _SHORT.match(name):
    key = m[1]
  elif m := _RELEASE.match(name):
    key = f"r{m[1]}_{m[2].lower()}{m[3]}"
  if key not in HYBRIDS:
    return None
  size, layers, patch = HYBRIDS[key]
  width, depth, mlp_dim, heads = vit_lib.VARIANTS[size]
  return dict(
    width=width, depth=depth, mlp_dim=mlp_dim, num_heads=heads, patch_size=(patch, patch), resnet_layers=layers
  )


def _overrides(kw: dict) -> dict:
  kw = vit_lib._overrides(kw)  # an int patch size -> (p, p)
  if "resnet_layers" in kw:
    kw["resnet_layers"] = tuple(kw["resnet_layers"])
  return kw


STANDARDIZE = ("release", "timm")


def standardize(kernel: Array, form: str = "release") -> Array:
  """Weight standardisation of a conv kernel [kh, kw, in, out] per output channel.

  form: "release", the original's (w - mean) / (std + 1e-5) with the population std (big_vision's BiT too); "timm",
  timm's StdConv2dSame for these models, (w - mean) / sqrt(var + 1e-8). They differ by about 1e-5 / std relative.
  """
  axes = (0, 1, 2)
  kernel = kernel - kernel.mean(axes, keepdims=True)
  if form == "release":
    return kernel / (kernel.std(axes, keepdims=True) + 1e-5)
  if form == "timm":
    return kernel * jax.lax.rsqrt(jnp.mean(kernel * kernel, axes, keepdims=True) + 1e-8)
  raise ValueError(f"unknown weight standardisation {form!r}; use one of {STANDARDIZE}")


def group_norm(eps: float, dtype: Any, name: str, zeros: bool = False) -> nn.GroupNorm:
  """The stem's GroupNorm: 32 groups; zeros: its scale starts at zero (a unit's last norm, the original's init)."""
  init = nn.initializers.zeros if zeros else nn.initializers.ones
  return nn.GroupNorm(num_groups=32, epsilon=eps, scale_init=init, dtype=dtype, name=name)


class StdConv(nn.Module):
  """A weight-standardised convolution without bias, 'SAME' padding: [B, H, W, C] -> [B, H/s, W/s, features]."""

  features: int
  kernel_size: Sequence[int]
  strides: int = 1
  dtype: Any = None
  form: str = "release"

  @nn.compact
  def __call__(self, x: Array) -> Array:
    """Applies it: float [B, H, W, C] -> [B, ceil(H / strides), ceil(W / strides), features]."""
    shape = (*self.kernel_size, x.shape[-1], self.features)
    kernel = standardize(self.param("kernel", nn.initializers.lecun_normal(), shape, jnp.float32), self.form)
    dtype = self.dtype or x.dtype
    return jax.lax.conv_general_dilated(
      x.astype(dtype),
      kernel.astype(dtype),
      (self.strides, self.strides),
      "SAME",
      dimension_numbers=("NHWC", "HWIO", "NHWC"),
      preferred_element_type=jnp.float32 if dtype == jnp.float32 else None,
    )


class Bottleneck(nn.Module):
  """A post-activation bottleneck unit: [B, H, W, C] -> [B, H/s, W/s, 4 * features].

  std: the convolutions' weight standardisation (`standardize`); gn_eps: the GroupNorms' epsilon.
  """

  features: int
  strides: int = 1
  std: str = "release"
  gn_eps: float = 1e-6
  dtype: Any = None

  def conv(self, features: int, kernel: int, strides: int, name: str) -> StdConv:
    """A weight-standardised convolution of this unit."""
    return StdConv(features, (kernel, kernel), strides, self.dtype, self.std, name=name)

  def norm(self, name: str, zeros: bool = False) -> nn.GroupNorm:
    """A GroupNorm of this unit (`group_norm`)."""
    return group_norm(self.gn_eps, self.dtype, name, zeros)

  @nn.compact
  def __call__(self, x: Array) -> Array:
    """Applies the unit to x [B, H, W, C]."""
    out = 4 * self.features
    residual = x
    if x.shape[-1] != out or self.strides != 1:
      residual = self.norm("gn_proj")(self.conv(out, 1, self.strides, "conv_proj")(x))
    y = nn.relu(self.norm("gn1")(self.conv(self.features, 1, 1, "conv1")(x)))
    y = nn.relu(self.norm("gn2")(self.conv(self.features, 3, self.strides, "conv2")(y)))
    y = self.norm("gn3", zeros=True)(self.conv(out, 1, 1, "conv3")(y))
    return nn.relu(residual + y)


class Stage(nn.Module):
  """Bottleneck units "unit1" .. "unitN", the first with the stride: [B, H, W, C] -> [B, H/s, W/s, 4 * features]."""

  units: int
  features: int
  strides: int = 1
  std: str = "release"
  gn_eps: float = 1e-6
  dtype: Any = None

  @nn.compact
  def __call__(self, x: Array) -> Array:
    """Applies the stage to x [B, H, W, C]."""
    for u in range(self.units):
      strides = self.strides if u == 0 else 1
      x = Bottleneck(self.features, strides, self.std, self.gn_eps, self.dtype, name=f"unit{u + 1}")(x)
    return x


class ResNetStem(nn.Module):
  """Root convolution, GroupNorm, ReLU, max-pool, then the stages: [B, H, W, C] -> [B, H/s, W/s, channels].

  s = 4 * 2^(stages - 1) (4 without stages); channels: width without stages, else 4 * width * 2^(stages - 1).
  """

  layers: Sequence[int] = ()
  width: int = 64
  std: str = "release"
  gn_eps: float = 1e-6
  dtype: Any = None

  @nn.compact
  def __call__(self, x: Array) -> Array:
    """Applies the stem to images x [B, H, W, C]."""
    x = StdConv(self.width, (7, 7), 2, self.dtype, self.std, name="conv_root")(x)
    x = group_norm(self.gn_eps, self.dtype, "gn_root")(x)
    x = nn.max_pool(nn.relu(x), (3, 3), strides=(2, 2), padding="SAME")
    for s, units in enumerate(self.layers):
      strides = 1 if s == 0 else 2
      x = Stage(units, self.width * 2**s, strides, self.std, self.gn_eps, self.dtype, name=f"block{s + 1}")(x)
    return x


@registry.register(
  parse_name,
  examples=tuple(f"vit_{k}" for k in HYBRIDS),
  no_decay=vit_lib.NO_DECAY,  # GroupNorm's scales and biases: registry.BASE_NO_DECAY
  tp_rules=(*TP_RULES, BIAS_TABLE_TP_RULE),  # the encoder's; the stem's convolutions stay replicated
  adapters=vit_lib.ADAPTERS,
  formats={"npz": "vitjax.models.vit_hybrid_npz", "timm": "vitjax.models.vit_hybrid_timm"},
  overrides=_overrides,
)
class HybridViT(vit_lib.ViT):
  """A ViT whose patches are cut from a ResNet stem's feature map. __call__ as the ViT's.

  patch_size is the patch embedding's on the feature map; `patch_hw` is the total stride, what one token covers in
  the image (32 for R26+ViT-S_32: a 7x7 grid at 224 pixels). The stem is layer 0 for layer-wise learning-rate decay,
  as the patch embedding (ViT.layer_index).

  Attributes:
    resnet_layers: bottleneck units per stage: (2, 2, 2, 2) for R26, (3, 4, 9) or (3, 4, 6, 3) for R50; () for the
      root block alone (R+Ti).
    resnet_width: the root convolution's channels (64: the release's width factor 1); stage s has
      resnet_width * 2^(s-1) bottleneck channels and outputs four times that.
    resnet_std, resnet_gn_eps: the convolutions' weight standardisation ("release", or "timm": `standardize`) and
      the GroupNorms' epsilon (the release's 1e-6; timm's 1e-5): timm's builds of these models compute both
      slightly differently, and its weights are read with its arithmetic (vitjax.models.vit_hybrid_timm).
    (The other attributes are the ViT's.)
  """

  resnet_layers: Sequence[int] = (3, 4, 9)
  resnet_width: int = 64
  resnet_std: str = "release"
  resnet_gn_eps: float = 1e-6

  @property
  def stem_stride(self) -> int:
    """The ResNet stem's total stride: 4 (root convolution and max-pool), halved again by each stage after the first."""
    return 4 * 2 ** max(len(self.resnet_layers) - 1, 0)

  @property
  def patch_hw(self) -> tuple[int, int]:
    """What one token covers in the image: the stem's stride times the patch size."""
    p = self.patch_size if isinstance(self.patch_size, Sequence) else (self.patch_size,) * 2
    return (self.stem_stride * p[0], self.stem_stride * p[1])

  def _embed(self, images: Array, train: bool) -> tuple[Array, tuple[int, int]]:
    """Embeds images [B, H, W, C] -> (patch embeddings [B, h * w, D], the patch grid (h, w))."""
    if self.stem != "patch":
      raise ValueError(f"a hybrid ViT's stem is its ResNet: stem={self.stem!r} has no meaning here")
    vit_lib.check_divisible(images.shape[1:3], self.patch_hw, "hybrid's stride (the stem's times the patch size)")
    x = images.astype(self.dtype or images.dtype)
    layers, width = tuple(self.resnet_layers), self.resnet_width
    x = ResNetStem(layers, width, self.resnet_std, self.resnet_gn_eps, self.dtype, name="resnet")(x)
    patch = self.patch_size if isinstance(self.patch_size, Sequence) else (self.patch_size,) * 2
    x = dots.Conv(self.width, patch, strides=patch, padding="VALID", dtype=self.dtype, name="embedding")(x)
    b, h, w, d = x.shape
    x = x.reshape(b, h * w, d)
    if self.embed_norm:
      x = nn.LayerNorm(epsilon=self.layernorm_eps, dtype=self.dtype, name="embed_norm")(x)
    return x, (h, w)
