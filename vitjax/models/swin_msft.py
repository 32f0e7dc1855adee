"""Microsoft's Swin checkpoints: their layout, and its translation into timm's, which vitjax.models.swin_timm reads.

The checkpoints are `{'model': state_dict, ...}`, with the patch-merging layer at the end of stages 1-3 and head.weight.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

LAYOUTS = {"swin-official": "Microsoft's Swin .pth ({'model': ...}, downsample at the end of stages 1-3, head.weight)"}


def detect(keys: set[str]) -> str | None:
  """The layout "swin-official" if the state dict's keys are those of Microsoft's Swin layout, else None."""
  if "layers.0.downsample.reduction.weight" in keys or (
    "head.weight" in keys and "layers.0.blocks.0.norm1.weight" in keys
  ):
    return "swin-official"
  return None


def to_timm_layout(sd: Mapping[str, Any]) -> dict[str, Any]:
  """Microsoft's Swin layout -> timm's.

  A stage's downsample moves from its end to the next stage's start, head.weight -> head.fc.weight;
  relative_position_index and attn_mask are buffers (rebuilt, not read).
  """
  out = {}
  for k, v in sd.items():
    if m := re.match(r"layers\.(\d+)\.downsample\.(.*)", k):
      k = f"layers.{int(m[1]) + 1}.downsample.{m[2]}"
    elif k.startswith("head."):
      k = "head.fc." + k[len("head.") :]
    out[k] = v
  return out
