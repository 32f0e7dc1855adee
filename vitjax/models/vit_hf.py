"""The ViT in the `transformers` layout, read with the repository's config.json.

ViTForImageClassification / ViTModel: vit.embeddings..., vit.encoder.layer.N.attention.attention.query, ..., classifier.

read(state_dict, layout, config) -> (module, variables). The weights give the width, depth, MLP width, classes,
pooler and qkv biases; config.json (a dict) the heads, the LayerNorm epsilon (transformers' default 1e-12 becomes
`layernorm_eps`), the activation and the image size. The hub's files use the names above; transformers 5 renames
them in memory (vit.layers.N.attention.q_proj, ..., mlp.fc1), and a state dict of either naming is read.
"""

from __future__ import annotations

import re

import numpy as np

from vitjax.models import convert_util as u
from vitjax.models import vit as vit_lib

LAYOUTS = {"hf-vit": "transformers ViT (vit.embeddings..., vit.encoder.layer.N.attention.attention.query, classifier)"}
READS = ("hf-vit",)
MODEL_TYPES = ("vit",)  # config.json's model_type

# transformers' activations that vitjax has (anything else is refused with its name)
ACTIVATIONS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "relu": "relu"}

# transformers 5's in-memory names -> the names of the hub's files
_RENAMES = (
  (r"^(vit\.)?layers\.(\d+)\.attention\.q_proj\.", r"\1encoder.layer.\2.attention.attention.query."),
  (r"^(vit\.)?layers\.(\d+)\.attention\.k_proj\.", r"\1encoder.layer.\2.attention.attention.key."),
  (r"^(vit\.)?layers\.(\d+)\.attention\.v_proj\.", r"\1encoder.layer.\2.attention.attention.value."),
  (r"^(vit\.)?layers\.(\d+)\.attention\.o_proj\.", r"\1encoder.layer.\2.attention.output.dense."),
  (r"^(vit\.)?layers\.(\d+)\.mlp\.fc1\.", r"\1encoder.layer.\2.intermediate.dense."),
  (r"^(vit\.)?layers\.(\d+)\.mlp\.fc2\.", r"\1encoder.layer.\2.output.dense."),
  (r"^(vit\.)?layers\.(\d+)\.(layernorm_before|layernorm_after)\.", r"\1encoder.layer.\2.\3."),
)
_DETECT = re.compile(r"^(vit\.)?(encoder\.layer\.0\.attention\.attention\.query|layers\.0\.attention\.q_proj)\.weight$")


def detect(keys: set[str]) -> str | None:
  """The layout "hf-vit" if the state dict's keys are those of a transformers ViT (either naming), else None."""
  return "hf-vit" if any(_DETECT.match(k) for k in keys) else None


def activation(config: dict, what: str) -> str:
  """The vitjax name of config.json's hidden_act; ValueError naming it if vitjax has no such activation."""
  act = config.get("hidden_act", "gelu")
  if act not in ACTIVATIONS:
    raise ValueError(f"{what}: hidden_act={act!r} has no equivalent in vitjax (it has {', '.join(ACTIVATIONS)})")
  return ACTIVATIONS[act]


def pair(v) -> tuple[int, int]:
  """An int or float, or a pair, from config.json (image_size, patch_size) -> (int, int)."""
  return (int(v), int(v)) if isinstance(v, int | float) else (int(v[0]), int(v[1]))


def read(state_dict, layout: str = "hf-vit", config: dict | None = None):
  """(module, variables) of a transformers ViT from its state dict and its config.json.

  The config is a dict; without one, transformers' ViTConfig defaults.
  """
  del layout
  config = dict(config or {})
  what = f"transformers ViT ({config.get('_name_or_path') or 'config.json'})"
  sd = u.rename_keys(u.unwrap(state_dict), _RENAMES)
  prefix = "vit." if any(k.startswith("vit.") for k in sd) else ""
  r = u.Reader({k[len(prefix) :] if k.startswith(prefix) else k: v for k, v in sd.items()})
  heads = int(config.get("num_attention_heads", 12))
  eps = float(config.get("layer_norm_eps", 1e-12))
  proj = r.arrays["embeddings.patch_embeddings.projection.weight"]  # [D, C, p, p]
  width = proj.shape[0]
  depth = len({k.split(".")[2] for k in r.arrays if k.startswith("encoder.layer.")})
  cfg = dict(
    patch_size=tuple(proj.shape[2:]),
    width=width,
    depth=depth,
    mlp_dim=r.arrays["encoder.layer.0.intermediate.dense.weight"].shape[0],
    num_heads=heads,
    pool_type="tok",
    qkv_bias="encoder.layer.0.attention.attention.query.bias" in r,
    layernorm_eps=eps,
    act=activation(config, what),
    num_classes=r.arrays["classifier.weight"].shape[0] if "classifier.weight" in r else 0,
  )
  if width % heads:
    raise ValueError(f"{what}: hidden_size {width} is not a multiple of num_attention_heads {heads}")
  out: dict[str, np.ndarray] = {}
  u.conv(r, "embeddings.patch_embeddings.projection", "embedding", out)
  out["cls"] = r("embeddings.cls_token")
  out["posembed/pos_embedding"] = r("embeddings.position_embeddings")
  for i in range(depth):
    s, d = f"encoder.layer.{i}", f"encoder/block_{i}"
    u.norm(r, f"{s}.layernorm_before", f"{d}/norm1", out)
    names = {n: f"{s}.attention.attention.{n}" for n in ("query", "key", "value")}
    u.separate_attention(r, {**names, "out": f"{s}.attention.output.dense"}, f"{d}/attn", heads, out)
    u.norm(r, f"{s}.layernorm_after", f"{d}/norm2", out)
    u.linear(r, f"{s}.intermediate.dense", f"{d}/mlp/fc1", out)
    u.linear(r, f"{s}.output.dense", f"{d}/mlp/fc2", out)
  u.norm(r, "layernorm", "encoder/final_norm", out)
  if "pooler.dense.weight" in r:  # ViTModel's pooler: tanh(Dense(class token)), vitjax's pre-logits layer
    if config.get("pooler_act", "tanh") != "tanh":
      raise ValueError(f"{what}: pooler_act={config['pooler_act']!r}; vitjax's pre-logits layer is tanh")
    cfg["representation_size"] = r.arrays["pooler.dense.weight"].shape[0]
    u.linear(r, "pooler.dense", "pre_logits", out)
  if cfg["num_classes"]:
    u.linear(r, "classifier", "head", out)
  r.check_all_used(what)
  hw = pair(config.get("image_size", 224))
  return u.finish(vit_lib.ViT(**cfg), out, hw)
