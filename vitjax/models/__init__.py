"""Model registry: `create(name, **overrides)` builds a model from the short names configs use.

Names: "vit_ti16", "vit_s16", "vit_s32", "vit_b16", "vit_b32", "vit_l16", "vit_h14", ... (vit_SIZE PATCH),
a ViT variant string such as "S/16", "swin_t", "swin_s", "swin_b", "swin_l", and the translation Transformer
"transformer_base", "transformer_big" (the paper's sizes), "transformer_small", "transformer_tiny" (CPU sizes);
every transformer_* name needs vocab_size=.... "mae": a masked autoencoder around a ViT (encoder={"name": ...}).
"""

from __future__ import annotations

import difflib
import re

import flax.linen as nn

from vitjax.models import swin as swin_lib
from vitjax.models import transformer as transformer_lib
from vitjax.models import vit as vit_lib
from vitjax.models.mae import MAE
from vitjax.models.swin import Swin
from vitjax.models.transformer import Transformer
from vitjax.models.vit import ViT

_VIT_NAME = re.compile(r"^vit_(ti|s|m|b|l|h)(\d+)$")
_SWIN_NAME = re.compile(r"^swin_(t|s|b|l)$")
_TRANSFORMER_NAME = re.compile(r"^transformer_(" + "|".join(transformer_lib.SIZES) + ")$")
EXAMPLE_NAMES = [
  "vit_ti16",
  "vit_s16",
  "vit_b16",
  "vit_l16",
  "vit_h14",
  "swin_t",
  "swin_s",
  "swin_b",
  "swin_l",
  "transformer_base",
  "transformer_big",
  "transformer_small",
  "transformer_tiny",
]


def _config(name: str) -> tuple[type[nn.Module], dict]:
  if name == "mae":
    return MAE, {}
  if "/" in name:
    return ViT, vit_lib.parse_variant(name)
  if m := _VIT_NAME.match(name):
    size = {"ti": "Ti"}.get(m[1], m[1].upper())
    return ViT, vit_lib.parse_variant(f"{size}/{m[2]}")
  if m := _SWIN_NAME.match(name):
    embed, depths, heads = swin_lib.VARIANTS[m[1].upper()]
    return Swin, dict(embed_dim=embed, depths=depths, num_heads=heads)
  if m := _TRANSFORMER_NAME.match(name):
    d, h, ff, layers, drop = transformer_lib.SIZES[m[1]]
    return Transformer, dict(d_model=d, num_heads=h, d_ff=ff, num_layers=layers, dropout_rate=drop)
  near = difflib.get_close_matches(name, EXAMPLE_NAMES, n=1)
  hint = f" Did you mean {near[0]!r}?" if near else ""
  raise ValueError(
    f"unknown model {name!r}.{hint} Known: {', '.join(EXAMPLE_NAMES)}, vit_SIZEPATCH "
    "(e.g. vit_b32) or a ViT variant string like 'S/16'."
  )


def create(name: str, **overrides) -> nn.Module:
  """Builds a model by name; keyword overrides replace any attribute (num_classes, drop_path_rate, ...)."""
  cls, kwargs = _config(name)
  fields = set(cls.__dataclass_fields__) - {"parent", "name"}
  unknown = set(overrides) - fields
  if unknown:
    bad = sorted(unknown)[0]
    near = difflib.get_close_matches(bad, sorted(fields), n=1)
    hint = f" Did you mean {near[0]!r}?" if near else ""
    raise ValueError(f"{cls.__name__} has no option {bad!r}.{hint} Options: {', '.join(sorted(fields))}")
  if "patch_size" in overrides and isinstance(overrides["patch_size"], int) and cls is ViT:
    overrides["patch_size"] = (overrides["patch_size"],) * 2
  if cls is MAE and isinstance(overrides.get("encoder"), dict):  # hashable, as a jit static argument must be
    overrides["encoder"] = _frozen(overrides["encoder"])
  return cls(**{**kwargs, **overrides})


def _frozen(value):
  """dicts -> sorted (key, value) tuples, lists -> tuples, recursively."""
  if isinstance(value, dict):
    return tuple(sorted((k, _frozen(v)) for k, v in value.items()))
  if isinstance(value, (list, tuple)):
    return tuple(_frozen(v) for v in value)
  return value


__all__ = ["MAE", "ViT", "Swin", "Transformer", "create"]
