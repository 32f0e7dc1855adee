"""The backbones of 2021-2024 by name: DINOv2, DeiT (distilled), DeiT III, EVA-02, SigLIP's tower: ViTs with options.

    models.create("dinov2_s14_reg4")   # = ViT(width=384, ..., patch 14, init_values=1e-5, num_registers=4, ...)

Names: dinov2_{s,b,l,g}14[_reg4], dinov3_{s,b,l}16, deit_{ti,s,b}16[_distilled], deit3_{s,b,l}16, deit3_h14, eva02_{ti,s,b,l}14, siglip_{b,l}16,
siglip_so400m14.
They are the architectures only: their weights load from the hub (vitjax.load("hf:timm/...")) or as config.init_from;
fine-tuning a config of one such name starts from random weights unless init_from says where they are.
"""

from __future__ import annotations

import re

# size: (width, depth, mlp_dim, heads), beyond vitjax.models.vit.VARIANTS
SIZES = {
  "g": (1536, 40, 4096, 24),  # DINOv2's giant: SwiGLU, each half 4096 wide
  "so400m": (1152, 27, 4304, 16),  # SigLIP's shape-optimised 400M (Alabdulmohsin et al. 2023)
}
_EVA02_MLP = {"ti": 512, "s": 1024, "b": 2048, "l": 2730}  # int(width * 8 / 3): SwiGLU, each half

# family: (its sizes and patch, its options); a size's own options after "|"
FAMILIES = {
  "dinov2": ({"s": 14, "b": 14, "l": 14, "g": 14}, dict(init_values=1e-5)),
  "dinov3": (
    {"s": 16, "b": 16, "l": 16},
    dict(
      init_values=1e-5,
      num_registers=4,
      qkv_bias=False,
      rope="dinov3",
      rope_temperature=100.0,
      posemb="none",
      layernorm_eps=1e-5,
      class_token=True,
      pool_type="gap",
    ),
  ),
  "deit": ({"ti": 16, "s": 16, "b": 16}, {}),  # DeiT: the original ViT's shape; _distilled: its distillation token
  "deit3": ({"s": 16, "b": 16, "l": 16, "h": 14}, dict(init_values=1e-6, class_posemb=False)),
  "eva02": (
    {"ti": 14, "s": 14, "b": 14, "l": 14},
    dict(
      ffn="swiglu",
      act="silu",
      rope="axial",
      rope_grid=(16, 16),
      key_bias=False,
      class_token=True,
      pool_type="gap",
      fc_norm=True,
    ),
  ),
  "siglip": ({"b": 16, "l": 16, "so400m": 14}, dict(pool_type="map", act="gelu_tanh")),
}
_NAME = re.compile(
  r"^(?P<family>dinov2|dinov3|deit3?|eva02|siglip)_(?P<size>ti|s|b|l|h|g|so400m)(?P<patch>\d+)"
  r"(?:_reg(?P<reg>\d+)|(?P<distilled>_distilled))?$"
)


def parse(name: str) -> tuple[str, dict] | None:
  """(size, options) of a backbone's name ("dinov2_s14_reg4" -> ("s", {patch_size, init_values, ...})); else None.

  size: a key of vitjax.models.vit.VARIANTS ("Ti", "S", ...) or of SIZES; options: the ViT's other keyword arguments.

  Raises:
    ValueError: a backbone's name with a size, patch or registers the family does not have.
  """
  m = _NAME.match(name)
  if not m:
    return None
  family, size, patch = m["family"], m["size"], int(m["patch"])
  patches, options = FAMILIES[family]
  if patches.get(size) != patch or (m["reg"] and family != "dinov2") or (m["distilled"] and family != "deit"):
    known = ", ".join(f"{family}_{s}{p}" for s, p in patches.items())
    raise ValueError(
      f"unknown {family} backbone {name!r}: {family} has {known}"
      + (" (with _reg4)" * (family == "dinov2"))
      + (" (with _distilled)" * (family == "deit"))
    )
  options = dict(options, patch_size=(patch, patch))
  if family == "dinov2":
    options.update(num_registers=int(m["reg"] or 0), class_posemb=not m["reg"])  # the register models' table: patches
    if size == "g":
      options.update(ffn="swiglu", act="silu")
  if m["distilled"]:
    options.update(distill_token=True)
  if family == "eva02":
    options.update(mlp_dim=_EVA02_MLP[size], ffn_norm=size in ("b", "l"))
  return ("Ti" if size == "ti" else size if size in SIZES else size.upper()), options
