"""The Swin Transformer in the `transformers` layout, read through timm's layout (vitjax.models.swin_timm).

SwinForImageClassification / SwinModel: swin.embeddings..., swin.encoder.layers.S.blocks.N.attention.self.query, ...,
the patch merging at the end of stages 1-3, classifier; read with the repository's config.json.

read(state_dict, layout, config) -> (module, variables); the architecture comes from the weights as for timm's
Swin, the activation from config.json. Options vitjax's Swin does not have are refused with their name: another
LayerNorm epsilon than 1e-5, absolute position embeddings. transformers pads a stage's map to whole windows before
the cyclic shift, timm and vitjax after it: where a window does not divide a stage's map (larger than the window)
their logits differ (a warning says so); the hub's models (224 px, window 7: maps 56, 28, 14, 7) are not such.
The hub's files use the names above; transformers 5 renames them in memory (attention.q_proj, ..., mlp.fc1), and a
state dict of either naming is read.
"""

from __future__ import annotations

import math
import re

import numpy as np
from absl import logging

from vitjax.models import convert_util as u
from vitjax.models import swin_timm
from vitjax.models.vit_hf import activation, pair

LAYOUTS = {
  "hf-swin": "transformers Swin (swin.embeddings..., swin.encoder.layers.S.blocks.N.attention.self.query, classifier)"
}
READS = ("hf-swin",)
MODEL_TYPES = ("swin",)  # config.json's model_type

_BLOCK = r"^encoder\.layers\.(\d+)\.blocks\.(\d+)\."
# transformers 5's in-memory names -> the names of the hub's files
_RENAMES = (
  (_BLOCK + r"attention\.q_proj\.", r"encoder.layers.\1.blocks.\2.attention.self.query."),
  (_BLOCK + r"attention\.k_proj\.", r"encoder.layers.\1.blocks.\2.attention.self.key."),
  (_BLOCK + r"attention\.v_proj\.", r"encoder.layers.\1.blocks.\2.attention.self.value."),
  (_BLOCK + r"attention\.o_proj\.", r"encoder.layers.\1.blocks.\2.attention.output.dense."),
  (_BLOCK + r"attention\.relative_position_bias\.", r"encoder.layers.\1.blocks.\2.attention.self."),
  (_BLOCK + r"mlp\.fc1\.", r"encoder.layers.\1.blocks.\2.intermediate.dense."),
  (_BLOCK + r"mlp\.fc2\.", r"encoder.layers.\1.blocks.\2.output.dense."),
)
# the hub's names -> timm's (q, k, v are fused afterwards; the downsample moves to the next stage's start)
_TO_TIMM = (
  (r"^embeddings\.patch_embeddings\.projection\.", "patch_embed.proj."),
  (r"^embeddings\.norm\.", "patch_embed.norm."),
  (_BLOCK + r"layernorm_before\.", r"layers.\1.blocks.\2.norm1."),
  (_BLOCK + r"layernorm_after\.", r"layers.\1.blocks.\2.norm2."),
  (
    _BLOCK + r"attention\.self\.(relative_position_bias_table|relative_position_index)$",
    r"layers.\1.blocks.\2.attn.\3",
  ),
  (_BLOCK + r"attention\.output\.dense\.", r"layers.\1.blocks.\2.attn.proj."),
  (_BLOCK + r"intermediate\.dense\.", r"layers.\1.blocks.\2.mlp.fc1."),
  (_BLOCK + r"output\.dense\.", r"layers.\1.blocks.\2.mlp.fc2."),
  (r"^layernorm\.", "norm."),
  (r"^classifier\.", "head.fc."),
)
_DETECT = re.compile(r"^(swin\.)?encoder\.layers\.0\.blocks\.0\.attention\.(self\.query|q_proj)\.weight$")


def detect(keys: set[str]) -> str | None:
  """The layout "hf-swin" if the state dict's keys are those of a transformers Swin (either naming), else None."""
  return "hf-swin" if any(_DETECT.match(k) for k in keys) else None


def to_timm_layout(state_dict) -> dict:
  """A transformers Swin state dict (either naming, with or without the `swin.` prefix) in timm's layout.

  Keys it does not know stay as they are (so the reader names them).
  """
  sd = u.unwrap(state_dict)
  sd = {k[len("swin.") :] if k.startswith("swin.") else k: v for k, v in sd.items()}
  sd = u.rename_keys(sd, _RENAMES)
  out, qkv = {}, {}
  for k, v in sd.items():
    if m := re.match(_BLOCK + r"attention\.self\.(query|key|value)\.(weight|bias)$", k):
      qkv.setdefault((f"layers.{m[1]}.blocks.{m[2]}.attn.qkv.{m[4]}"), {})[m[3]] = u.to_numpy(v)
    elif m := re.match(r"^encoder\.layers\.(\d+)\.downsample\.(.*)$", k):
      out[f"layers.{int(m[1]) + 1}.downsample.{m[2]}"] = v
    else:
      out.update(u.rename_keys({k: v}, _TO_TIMM))
  for key, parts in qkv.items():
    if set(parts) != {"query", "key", "value"}:
      raise KeyError(f"checkpoint has {sorted(parts)} but not all of query, key, value for {key}")
    out[key] = np.concatenate([np.asarray(parts[n]) for n in ("query", "key", "value")])
  return out


def read(state_dict, layout: str = "hf-swin", config: dict | None = None):
  """(module, variables) of a transformers Swin from its state dict and its config.json.

  The config is a dict; without one, transformers' SwinConfig defaults.
  """
  del layout
  config = dict(config or {})
  what = f"transformers Swin ({config.get('_name_or_path') or 'config.json'})"
  eps = float(config.get("layer_norm_eps", 1e-5))
  if not math.isclose(eps, 1e-5, rel_tol=1e-6):
    raise ValueError(f"{what}: layer_norm_eps={eps:g}; vitjax's Swin has LayerNorm epsilon 1e-5 only")
  if config.get("use_absolute_embeddings"):
    raise ValueError(f"{what}: use_absolute_embeddings=True; vitjax's Swin has no absolute position embedding")
  act = activation(config, what)
  module, variables = swin_timm.read(to_timm_layout(state_dict), "timm-swin")
  if act != module.act:
    module = module.clone(act=act)
  _warn_if_padded(module, pair(config.get("image_size", 224)), what)
  return module, variables


def _warn_if_padded(module, image_hw: tuple[int, int], what: str) -> None:
  window = module.window_size if isinstance(module.window_size, int) else min(module.window_size)
  side = min(image_hw) // module.patch_size
  for s in range(len(module.depths)):
    if side > window and side % window:
      logging.warning(
        "%s at %s px: stage %d's map (%d) is not a multiple of the window (%d): transformers pads it before the "
        "shift, vitjax after (as timm), so the logits differ from transformers' there",
        what,
        "x".join(map(str, image_hw)),
        s + 1,
        side,
        window,
      )
      return
    side = -(-side // 2)
