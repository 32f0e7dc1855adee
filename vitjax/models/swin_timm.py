"""The Swin Transformer in timm's layout, both ways.

SwinTransformer: layers.S.blocks.N..., downsample at the start of stages 2-4, head.fc. Microsoft's own layout is read
through vitjax.models.swin_msft.

read(state_dict) -> (module, variables), the architecture read from the weights; write(module, params,
image_size) -> (state_dict, timm config). Both use exact GELU.
"""

from __future__ import annotations

import math
import re

import numpy as np

from vitjax.models import convert_util as u
from vitjax.models import swin as swin_lib
from vitjax.models import swin_msft

NAMES = re.compile(r"^swin_")
READS = ("timm-swin", "swin-official")  # the layouts read() takes
LAYOUTS = {"timm-swin": "timm Swin (layers.S.blocks.N..., downsample at the start of stages 2-4, head.fc)"}


def detect(keys: set[str]) -> str | None:
  """The layout "timm-swin" if the keys are those of timm's SwinTransformer (not Microsoft's), else None."""
  return "timm-swin" if "layers.0.blocks.0.norm1.weight" in keys and not swin_msft.detect(keys) else None


def read(state_dict, layout: str = "timm-swin", timm_name: str | None = None, num_heads=None):
  """(module, variables) for an (unwrapped) Swin state dict in `layout`, "timm-swin" or "swin-official" (Microsoft's).

  The architecture (embed dim, depths, heads, window, patch, MLP ratio, classes) is read from the weights; the name
  and `num_heads` are not needed.
  """
  del timm_name, num_heads
  if layout == "swin-official":
    state_dict = swin_msft.to_timm_layout(state_dict)
  r = u.Reader(state_dict)
  proj = r.arrays["patch_embed.proj.weight"]  # [D, C, p, p]
  embed, patch = proj.shape[0], proj.shape[2]
  stages = sorted({int(k.split(".")[1]) for k in r.arrays if k.startswith("layers.")})
  depths = tuple(len({k.split(".")[3] for k in r.arrays if k.startswith(f"layers.{s}.blocks.")}) for s in stages)
  tables = [r.arrays[f"layers.{s}.blocks.0.attn.relative_position_bias_table"] for s in stages]
  heads = tuple(t.shape[1] for t in tables)
  window = (math.isqrt(tables[0].shape[0]) + 1) // 2
  num_classes = r.arrays["head.fc.weight"].shape[0] if "head.fc.weight" in r else 0
  cfg = dict(
    embed_dim=embed,
    depths=depths,
    num_heads=heads,
    patch_size=patch,
    window_size=window,
    mlp_ratio=r.arrays["layers.0.blocks.0.mlp.fc1.weight"].shape[0] / embed,
    qkv_bias="layers.0.blocks.0.attn.qkv.bias" in r,
    num_classes=num_classes,
    act="gelu",
  )
  out: dict[str, np.ndarray] = {}
  u.conv(r, "patch_embed.proj", "patch_embed", out)
  u.norm(r, "patch_embed.norm", "patch_norm", out)
  for s, (depth, h) in enumerate(zip(depths, heads)):
    if s > 0:
      u.norm(r, f"layers.{s}.downsample.norm", f"stage_{s}_downsample/norm", out)
      u.linear(r, f"layers.{s}.downsample.reduction", f"stage_{s}_downsample/reduction", out, bias=False)
    for j in range(depth):
      src, dst = f"layers.{s}.blocks.{j}", f"stage_{s}_block_{j}"
      u.norm(r, f"{src}.norm1", f"{dst}/norm1", out)
      u.timm_attention(r, f"{src}.attn", f"{dst}/attn", h, out)
      out[f"{dst}/rel_pos/relative_position_bias_table"] = r(f"{src}.attn.relative_position_bias_table")
      u.norm(r, f"{src}.norm2", f"{dst}/norm2", out)
      u.timm_mlp(r, f"{src}.mlp", f"{dst}/mlp", out)
  u.norm(r, "norm", "norm", out)
  if num_classes:
    u.linear(r, "head.fc", "head", out)
  r.check_all_used(f"Swin ({layout})", u.TIMM_BUFFERS)
  side = patch * window * 2 ** (len(depths) - 1)
  return u.finish(swin_lib.Swin(**cfg), out, (side, side))


def write(module, p: dict, image_size) -> tuple[dict, dict]:
  """A vitjax Swin's parameters in timm's SwinTransformer layout.

  Args:
    module: the Swin (patch stem, exact GELU).
    p: its parameters, flat {"a/b/kernel": numpy array} (`convert_util.flat_params`).
    image_size: (H, W) the timm model is built for.

  Returns:
    tuple: (state dict {timm key: numpy array}, {"model": "swin", "kwargs": timm's SwinTransformer arguments}).

  Raises:
    ValueError: a stem or activation timm's SwinTransformer does not have.
  """
  u.unsupported(module, "timm's SwinTransformer", stem=("patch",))
  if module.act != "gelu":
    raise ValueError(f"timm's SwinTransformer uses exact GELU; this model has act={module.act!r}")
  out: dict[str, np.ndarray] = {}
  k = p["patch_embed/kernel"]
  out["patch_embed.proj.weight"], out["patch_embed.proj.bias"] = k.transpose(3, 2, 0, 1), p["patch_embed/bias"]
  u.put_norm(p, "patch_norm", "patch_embed.norm", out)
  for s, depth in enumerate(module.depths):
    if s > 0:
      u.put_norm(p, f"stage_{s}_downsample/norm", f"layers.{s}.downsample.norm", out)
      u.put_linear(p, f"stage_{s}_downsample/reduction", f"layers.{s}.downsample.reduction", out)
    for j in range(depth):
      src, dst = f"stage_{s}_block_{j}", f"layers.{s}.blocks.{j}"
      u.put_norm(p, f"{src}/norm1", f"{dst}.norm1", out)
      u.put_attention(p, f"{src}/attn", f"{dst}.attn", out)
      out[f"{dst}.attn.relative_position_bias_table"] = p[f"{src}/rel_pos/relative_position_bias_table"]
      u.put_norm(p, f"{src}/norm2", f"{dst}.norm2", out)
      u.put_mlp(p, f"{src}/mlp", f"{dst}.mlp", out)
  u.put_norm(p, "norm", "norm", out)
  if "head/kernel" in p:
    u.put_linear(p, "head", "head.fc", out)
  window = module.window_size
  args = dict(
    img_size=tuple(image_size),
    in_chans=k.shape[2],
    patch_size=module.patch_size,
    embed_dim=module.embed_dim,
    depths=tuple(module.depths),
    num_heads=tuple(module.num_heads),
    window_size=tuple(window) if isinstance(window, (tuple, list)) else window,
    mlp_ratio=module.mlp_ratio,
    qkv_bias=module.qkv_bias,
    num_classes=int(out["head.fc.weight"].shape[0]) if "head.fc.weight" in out else 0,
  )
  return out, {"model": "swin", "kwargs": args}
