"""The hybrid ViT in timm's layout (vit_small_r26_s32_224, vit_base_r50_s16_384, vit_tiny_r_s16_p8_224, ...), both ways.

timm builds these models as a VisionTransformer whose patch_embed is a HybridEmbed around a ResNetV2 backbone
(preact=False: post-activation bottlenecks, stride on the 3x3) or, for R+Ti, the ResNetV2 stem alone:
patch_embed.backbone.stem.{conv, norm}, .stages.S.blocks.U.{conv1..3, norm1..3, downsample.conv, downsample.norm},
then patch_embed.proj and the ViT's keys (vitjax.models.vit_timm). Its arithmetic differs slightly from the release's:
StdConv2dSame standardises as (w - mean) / sqrt(var + 1e-8) and GroupNorm's epsilon is 1e-5, so what read() returns
computes that way (HybridViT resnet_std="timm", resnet_gn_eps=1e-5), with timm's exact GELU.

read(name, state_dict) -> (module, variables); write(module, params, image_size) -> (state_dict, timm config).
"""

from __future__ import annotations

import re

import numpy as np

from vitjax.models import convert_util as u
from vitjax.models import vit as vit_lib
from vitjax.models import vit_hybrid as hybrid_lib
from vitjax.models import vit_timm

# vit_tiny_r_s16_p8_224, vit_small_r26_s32_384, vit_base_r50_s16_224, vit_large_r50_s32_224 (the name's
# sizes give the heads; the weights the rest; the last number is the image size timm builds it for)
NAMES = re.compile(r"^vit_(tiny|small|base|large)_r(\d*)_s(\d+)(?:_p(\d+))?_(\d+)")
LAYOUTS = {"timm-vit-hybrid": "timm hybrid ViT (patch_embed.backbone.stem / stages, patch_embed.proj, blocks.N...)"}
READS = ("timm-vit-hybrid",)
_SIZES = {"tiny": "Ti", "small": "S", "base": "B", "large": "L"}
_BACKBONE = "patch_embed.backbone."


def detect(keys: set[str]) -> str | None:
  """The layout "timm-vit-hybrid" if the keys are those of timm's hybrid VisionTransformer, else None."""
  if "blocks.0.attn.qkv.weight" in keys and any(k.startswith(_BACKBONE) for k in keys):
    return "timm-vit-hybrid"
  return None


def _conv(r: u.Reader, src: str) -> np.ndarray:
  return r(f"{src}.weight").transpose(2, 3, 1, 0)  # OIHW -> HWIO


def _norm(r: u.Reader, src: str, dst: str, out: dict) -> None:
  out[f"{dst}/scale"], out[f"{dst}/bias"] = r(f"{src}.weight"), r(f"{src}.bias")


def read(state_dict, layout: str, timm_name: str, num_heads: int | None = None):
  """(module, variables) of timm hybrid `timm_name` ("vit_small_r26_s32_224") from its (unwrapped) state dict.

  The heads: `num_heads`, or the name's.
  """
  del layout
  m = NAMES.match(timm_name.split(".")[0])
  r = u.Reader(state_dict)
  stem = _BACKBONE + ("stem." if f"{_BACKBONE}stem.conv.weight" in r else "")  # R+Ti: the stem alone
  out = {"resnet/conv_root/kernel": _conv(r, f"{stem}conv")}
  _norm(r, f"{stem}norm", "resnet/gn_root", out)
  units: dict[int, int] = {}
  for k in r.arrays:
    if mm := re.match(rf"{re.escape(_BACKBONE)}stages\.(\d+)\.blocks\.(\d+)\.conv1\.weight$", k):
      units[int(mm[1])] = max(units.get(int(mm[1]), 0), int(mm[2]) + 1)
  for s in range(len(units)):
    for b in range(units[s]):
      src, dst = f"{_BACKBONE}stages.{s}.blocks.{b}", f"resnet/block{s + 1}/unit{b + 1}"
      for i in (1, 2, 3):
        out[f"{dst}/conv{i}/kernel"] = _conv(r, f"{src}.conv{i}")
        _norm(r, f"{src}.norm{i}", f"{dst}/gn{i}", out)
      if f"{src}.downsample.conv.weight" in r:
        out[f"{dst}/conv_proj/kernel"] = _conv(r, f"{src}.downsample.conv")
        _norm(r, f"{src}.downsample.norm", f"{dst}/gn_proj", out)
  cfg, vit_out = vit_timm.read_vit(r, num_heads or vit_lib.VARIANTS[_SIZES[m[1]]][3])
  r.check_all_used(timm_name, u.TIMM_BUFFERS)
  module = hybrid_lib.HybridViT(
    **cfg,
    resnet_layers=tuple(units[s] for s in range(len(units))),
    resnet_width=int(out["resnet/conv_root/kernel"].shape[-1]),
    resnet_std="timm",
    resnet_gn_eps=1e-5,
  )
  return u.finish(module, {**out, **vit_out}, (int(m[5]), int(m[5])))  # the name's image size, as timm builds it


def write(module, p: dict, image_size) -> tuple[dict, dict]:
  """A vitjax hybrid's parameters in timm's layout, and the config convert.build_timm builds the timm model from.

  timm computes the stem with its own arithmetic (see the module docstring): a hybrid trained with the release's
  (resnet_std "release", resnet_gn_eps 1e-6) gives slightly other logits in timm (the standardisations differ by
  about 1e-5 / the kernels' std, relative); one read from timm, or trained with timm's, carries over exactly.

  Returns:
    tuple: (state dict {timm key: numpy array}, {"model": "vit_hybrid", "kwargs": VisionTransformer's arguments,
    "backbone": {"layers", "width"}}).
  """
  state, cfg = vit_timm.write(module, p, image_size)
  stem = _BACKBONE + ("stem." if module.resnet_layers else "")
  state[f"{stem}conv.weight"] = p["resnet/conv_root/kernel"].transpose(3, 2, 0, 1)  # HWIO -> OIHW
  state[f"{stem}norm.weight"], state[f"{stem}norm.bias"] = p["resnet/gn_root/scale"], p["resnet/gn_root/bias"]
  for s, n in enumerate(module.resnet_layers):
    for b in range(n):
      src, dst = f"resnet/block{s + 1}/unit{b + 1}", f"{_BACKBONE}stages.{s}.blocks.{b}"
      names = {f"conv{i}": f"conv{i}" for i in (1, 2, 3)} | {"conv_proj": "downsample.conv"}
      for ours, theirs in names.items():
        if f"{src}/{ours}/kernel" in p:
          state[f"{dst}.{theirs}.weight"] = p[f"{src}/{ours}/kernel"].transpose(3, 2, 0, 1)
          gn = ours.replace("conv", "gn")
          norm = theirs.replace("conv", "norm")
          state[f"{dst}.{norm}.weight"], state[f"{dst}.{norm}.bias"] = p[f"{src}/{gn}/scale"], p[f"{src}/{gn}/bias"]
  cfg["kwargs"]["in_chans"] = int(p["resnet/conv_root/kernel"].shape[2])
  cfg["model"] = "vit_hybrid"
  cfg["backbone"] = {"layers": list(module.resnet_layers), "width": int(module.resnet_width)}
  return state, cfg


def build(config: dict):
  """The timm hybrid VisionTransformer for a `write` config (random weights, eval mode); needs timm."""
  from functools import partial

  from timm.layers import StdConv2dSame
  from timm.layers.hybrid_embed import HybridEmbed
  from timm.models.resnetv2 import ResNetV2, create_resnetv2_stem
  from timm.models.vision_transformer import VisionTransformer

  kwargs, b = dict(config["kwargs"]), config["backbone"]
  conv = partial(StdConv2dSame, eps=1e-8)
  chans = kwargs["in_chans"]
  if b["layers"]:
    backbone = ResNetV2(
      layers=b["layers"],
      num_classes=0,
      global_pool="",
      in_chans=chans,
      preact=False,
      stem_type="same",
      conv_layer=conv,
      width_factor=b["width"] / 64,
    )
  else:
    backbone = create_resnetv2_stem(chans, b["width"], stem_type="same", preact=False, conv_layer=conv)
  kwargs["embed_layer"] = partial(HybridEmbed, backbone=backbone)
  return VisionTransformer(**kwargs).eval()
