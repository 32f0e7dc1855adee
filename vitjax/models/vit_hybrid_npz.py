"""The hybrid ViT in the original JAX release's `.npz` layout (R50+ViT-B_16, R26+ViT-S_32, ...), both ways.

The ResNet stem's names are the release's own (conv_root, gn_root, block{s}/unit{u}/conv1..3, gn1..3, conv_proj,
gn_proj), the same before and after Linen; the released files hold GroupNorm scales and biases as [1, 1, 1, C]
(pre-Linen flax), newer ones as [C]: both are read. The ViT part is read and written as the plain ViT's
(vitjax.models.vit_npz).

read(path_or_mapping, variant, act) -> (module, variables); write(module, variables) -> flat arrays for np.savez.
"""

from __future__ import annotations

import re

import numpy as np

from vitjax.models import convert_util as u
from vitjax.models import vit_hybrid as hybrid_lib
from vitjax.models import vit_npz

LAYOUTS = {
  "vit-hybrid-npz": "the original JAX release's hybrid ViT .npz (conv_root, gn_root, block{s}/unit{u}/..., "
  "embedding, Transformer/encoderblock_N/...)"
}
_STEM = re.compile(r"^(conv_root|gn_root|block\d+/unit\d+/(conv[123]|gn[123]|conv_proj|gn_proj))/(kernel|scale|bias)$")
_UNIT = re.compile(r"^block(\d+)/unit(\d+)/")


def detect(keys: set[str]) -> str | None:
  """The layout "vit-hybrid-npz" if the keys are those of a hybrid ViT .npz (a ResNet stem and a ViT), else None."""
  keys = {k.removeprefix("params/") for k in keys}
  if "conv_root/kernel" in keys and any(k.startswith("Transformer/encoderblock") for k in keys):
    return "vit-hybrid-npz"
  return None


def _check_variant(variant: str, cfg: dict) -> None:
  """ValueError naming what differs when the weights are not the hybrid (e.g. "R26+ViT-S_32") the caller asked for."""
  want = hybrid_lib.parse_name(variant)
  if want is None:
    names = ", ".join(f"{hybrid_lib.RELEASE_NAMES[k]} ({k})" for k in hybrid_lib.HYBRIDS)
    raise ValueError(f"unknown hybrid ViT variant {variant!r}; use one of {names}")
  keys = ("width", "mlp_dim", "num_heads", "patch_size", "resnet_layers")
  diff = {k: (want[k], cfg[k]) for k in keys if want[k] != cfg[k]}
  if diff:
    raise ValueError(
      f"the checkpoint is not a {variant}: " + ", ".join(f"{k} {a} != {b}" for k, (a, b) in diff.items())
    )


def read(path_or_mapping, variant: str | None = None, act: str = "gelu_tanh"):
  """(module, variables) from a hybrid ViT `.npz` of the original JAX release.

  The architecture (ResNet stages and units, root width, and the ViT's sizes) is read from the weights; `variant`
  ("R26+ViT-S_32", "r26_s32", ...), if given, is checked against them. act: the release trained with flax's
  tanh-approximated GELU ("gelu_tanh").
  """
  flat = vit_npz.load_npz(path_or_mapping)
  if detect(set(flat)) is None:
    raise u.unknown_layout(flat, "not a hybrid ViT checkpoint of the original release")
  r = u.Reader(flat)
  out: dict[str, np.ndarray] = {}
  units: dict[int, int] = {}
  for k in sorted(r.arrays):
    if not _STEM.match(k):
      continue
    v = r(k)
    out[f"resnet/{k}"] = v.reshape(-1) if k.split("/")[-2].startswith("gn") else v  # [1, 1, 1, C] -> [C]
    if m := _UNIT.match(k):
      units[int(m[1])] = max(units.get(int(m[1]), 0), int(m[2]))
  if sorted(units) != list(range(1, len(units) + 1)):
    raise ValueError(f"the ResNet stem's stages are not block1 .. blockN: {sorted(units)}")
  stem = dict(
    resnet_layers=tuple(units[s] for s in sorted(units)), resnet_width=int(out["resnet/conv_root/kernel"].shape[-1])
  )

  def check(cfg):
    if variant:
      _check_variant(variant, {**cfg, **stem})

  cfg, vit_out, grid = vit_npz.read_vit(r, act, check)
  r.check_all_used("from_vit_npz (a hybrid ViT)")
  module = hybrid_lib.HybridViT(**cfg, **stem)
  h, w = module.patch_hw
  return u.finish(module, {**out, **vit_out}, (grid * h, grid * w))


def write(module, variables) -> dict[str, np.ndarray]:
  """The flat '/'-keyed arrays of the release's hybrid `.npz` (GroupNorm parameters [1, 1, 1, C], as released).

  read() (convert.from_vit_npz) and the original code's loader read it back (pass act=module.act to read()).
  """
  out = vit_npz.write(module, variables)
  for k, v in u.flat_params(variables["params"]).items():
    if k.startswith("resnet/"):
      name = k.removeprefix("resnet/")
      out[name] = np.reshape(v, (1, 1, 1, -1)) if name.split("/")[-2].startswith("gn") else v
  return out
