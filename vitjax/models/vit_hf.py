"""The ViT in the `transformers` layout, read with the repository's config.json.

ViTForImageClassification / ViTModel: vit.embeddings..., vit.encoder.layer.N.attention.attention.query, ..., classifier.
Dinov2Model, Dinov2WithRegistersModel and their ...ForImageClassification (model_type "dinov2",
"dinov2_with_registers"): LayerScale, registers, and a classifier over the class token and the patches' mean.
SiglipVisionModel (model_type "siglip_vision_model"; SigLIP's image tower) with its attention-pooling head, and
SiglipForImageClassification and SiglipModel ("siglip": the vision tower's weights, the text tower's left aside).

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

LAYOUTS = {
  "hf-vit": "transformers ViT (vit.embeddings..., vit.encoder.layer.N.attention.attention.query, classifier)",
  "hf-dinov2": "transformers DINOv2 (embeddings..., encoder.layer.N.layer_scale1.lambda1, ...)",
  "hf-siglip": "transformers SigLIP vision tower (vision_model.embeddings.patch_embedding, encoder.layers.N.self_attn)",
}
READS = ("hf-vit", "hf-dinov2", "hf-siglip")
MODEL_TYPES = ("vit", "dinov2", "dinov2_with_registers", "siglip_vision_model", "siglip")  # config.json's model_type

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
_DINOV2 = re.compile(r"^(dinov2(_with_registers)?\.)?encoder\.layer\.0\.layer_scale1\.lambda1$")
# DINOv2's transformers 5 in-memory names -> its files'
_DINOV2_RENAMES = (
  (r"(encoder\.layer\.\d+\.attention)\.([qkv])_proj\.", lambda m: f"{m[1]}.attention.{_QKV[m[2]]}."),
  (r"(encoder\.layer\.\d+\.attention)\.o_proj\.", r"\1.output.dense."),
)
_QKV = {"q": "query", "k": "key", "v": "value"}


_SIGLIP = re.compile(r"^(vision_model\.)?embeddings\.patch_embedding\.weight$")


def detect(keys: set[str]) -> str | None:
  """The layout of a transformers model's keys (either naming): "hf-dinov2", "hf-siglip", "hf-vit", else None."""
  if any(_DINOV2.match(k) for k in keys):
    return "hf-dinov2"
  if any(_SIGLIP.match(k) for k in keys):
    return "hf-siglip"
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


def _norms_and_attention(r: u.Reader, d: str, heads: int, norm1: str, attn: dict, norm2: str, out: dict) -> None:
  """A transformers pre-norm block's two LayerNorms and its separate q/k/v/out linears (`attn`) into vitjax's `d`."""
  u.norm(r, norm1, f"{d}/norm1", out)
  u.separate_attention(r, attn, f"{d}/attn", heads, out)
  u.norm(r, norm2, f"{d}/norm2", out)


def read(state_dict, layout: str = "hf-vit", config: dict | None = None):
  """(module, variables) of a transformers ViT from its state dict and its config.json.

  The config is a dict; without one, transformers' ViTConfig defaults.
  """
  config = dict(config or {})
  if layout == "hf-dinov2" or config.get("model_type") in ("dinov2", "dinov2_with_registers"):
    return _read_dinov2(state_dict, config)
  if layout == "hf-siglip" or config.get("model_type") in ("siglip", "siglip_vision_model"):
    return _read_siglip(state_dict, config)
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
    names = {n: f"{s}.attention.attention.{n}" for n in ("query", "key", "value")}
    attn = {**names, "out": f"{s}.attention.output.dense"}
    _norms_and_attention(r, d, heads, f"{s}.layernorm_before", attn, f"{s}.layernorm_after", out)
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


def _read_dinov2(state_dict, config: dict):
  """(module, variables) of a transformers DINOv2, with or without registers, and its classifier if any.

  Long: the embeddings, each block's LayerScale and the classifier over the class token and the patches' mean are
  DINOv2's own, read in the order of transformers' module.

  With registers, transformers adds the table's first row to the class token and no row to the registers: vitjax's
  class_posemb=False holds the table's other rows, and the class token with its row added, the same sums.
  """
  what = f"transformers DINOv2 ({config.get('_name_or_path') or 'config.json'})"
  swiglu = bool(config.get("use_swiglu_ffn"))  # DINOv2's giant: SiLU-gated, weights_in holding the gate first
  sd = u.rename_keys(u.unwrap(state_dict), _DINOV2_RENAMES)
  prefix = next((p for p in ("dinov2_with_registers.", "dinov2.") if any(k.startswith(p) for k in sd)), "")
  r = u.Reader({k[len(prefix) :] if k.startswith(prefix) else k: v for k, v in sd.items()})
  heads = int(config.get("num_attention_heads", 12))
  proj = r.arrays["embeddings.patch_embeddings.projection.weight"]  # [D, C, p, p]
  depth = len({k.split(".")[2] for k in r.arrays if k.startswith("encoder.layer.")})
  out_layer = next(n for n in ("fc2", "weights_out", "down_proj") if f"encoder.layer.0.mlp.{n}.weight" in r)
  registers = int(r.arrays["embeddings.register_tokens"].shape[1]) if "embeddings.register_tokens" in r else 0
  head = r.arrays["classifier.weight"].shape[0] if "classifier.weight" in r else 0
  cfg = dict(
    patch_size=tuple(proj.shape[2:]),
    width=proj.shape[0],
    depth=depth,
    mlp_dim=r.arrays[f"encoder.layer.0.mlp.{out_layer}.weight"].shape[1],
    num_heads=heads,
    pool_type="tok_gap" if head else "tok",
    qkv_bias="encoder.layer.0.attention.attention.query.bias" in r,
    layernorm_eps=float(config.get("layer_norm_eps", 1e-6)),
    act="silu" if swiglu else activation(config, what),
    ffn="swiglu" if swiglu else "mlp",
    num_classes=head,
    init_values=float(config.get("layerscale_value", 1.0)),
  )
  out: dict[str, np.ndarray] = {}
  u.conv(r, "embeddings.patch_embeddings.projection", "embedding", out)
  cls, table = r("embeddings.cls_token"), r("embeddings.position_embeddings")
  if registers:
    cfg.update(num_registers=registers, class_posemb=False)
    out["cls"], out["registers"] = cls + table[:, :1], r("embeddings.register_tokens")
    out["posembed/pos_embedding"] = table[:, 1:]
  else:
    out["cls"], out["posembed/pos_embedding"] = cls, table
  for i in range(depth):
    s, d = f"encoder.layer.{i}", f"encoder/block_{i}"
    names = {n: f"{s}.attention.attention.{n}" for n in ("query", "key", "value")}
    _norms_and_attention(r, d, heads, f"{s}.norm1", {**names, "out": f"{s}.attention.output.dense"}, f"{s}.norm2", out)
    out[f"{d}/ls1/scale"] = r(f"{s}.layer_scale1.lambda1")
    if swiglu and f"{s}.mlp.gate_proj.weight" in r:  # transformers 5's in-memory names: the halves apart
      for src, dst in (("gate_proj", "fc1_g"), ("up_proj", "fc1_x"), ("down_proj", "fc2")):
        u.linear(r, f"{s}.mlp.{src}", f"{d}/mlp/{dst}", out)
    elif swiglu:
      u.packed_swiglu(r, f"{s}.mlp.weights_in", f"{s}.mlp.weights_out", f"{d}/mlp", out)
    else:
      u.linear(r, f"{s}.mlp.fc1", f"{d}/mlp/fc1", out)
      u.linear(r, f"{s}.mlp.fc2", f"{d}/mlp/fc2", out)
    out[f"{d}/ls2/scale"] = r(f"{s}.layer_scale2.lambda1")
  u.norm(r, "layernorm", "encoder/final_norm", out)
  if head:
    u.linear(r, "classifier", "head", out)
  r.check_all_used(what, re.compile(r"^embeddings\.mask_token$"))  # (masked-image pre-training's; unused here)
  return u.finish(vit_lib.ViT(**cfg), out, pair(config.get("image_size", 518)))


def _read_siglip(state_dict, config: dict):
  """(module, variables) of transformers' SigLIP image tower: SiglipVisionModel, or SiglipForImageClassification.

  The tower has no class token; its position table covers the patches. SiglipVisionModel pools with its attention
  head (vitjax's "map", torch's MultiheadAttention in_proj split into query, key, value); SiglipForImageClassification
  averages the tokens ("gap") into its classifier, its tower's attention head unused. A SiglipModel's text tower and
  logit scale are left aside.
  """
  vision = dict(config.get("vision_config") or config)  # (a SiglipModel's config holds the tower's)
  what = f"transformers SigLIP ({config.get('_name_or_path') or 'config.json'})"
  sd = u.unwrap(state_dict)
  r = u.Reader({k.removeprefix("vision_model."): v for k, v in sd.items()})
  heads = int(vision.get("num_attention_heads", 12))
  proj = r.arrays["embeddings.patch_embedding.weight"]  # [D, C, p, p]
  width = proj.shape[0]
  depth = len({k.split(".")[2] for k in r.arrays if k.startswith("encoder.layers.")})
  head = r.arrays["classifier.weight"].shape[0] if "classifier.weight" in r else 0
  cfg = dict(
    patch_size=tuple(proj.shape[2:]),
    width=width,
    depth=depth,
    mlp_dim=r.arrays["encoder.layers.0.mlp.fc1.weight"].shape[0],
    num_heads=heads,
    pool_type="gap" if head or "head.probe" not in r else "map",
    layernorm_eps=float(vision.get("layer_norm_eps", 1e-6)),
    act=activation({"hidden_act": vision.get("hidden_act", "gelu_pytorch_tanh")}, what),
    num_classes=head,
  )
  out: dict[str, np.ndarray] = {}
  u.conv(r, "embeddings.patch_embedding", "embedding", out)
  out["posembed/pos_embedding"] = r("embeddings.position_embedding.weight")[None]
  for i in range(depth):
    s, d = f"encoder.layers.{i}", f"encoder/block_{i}"
    names = {n: f"{s}.self_attn.{n[0]}_proj" for n in ("query", "key", "value")}
    attn = {**names, "out": f"{s}.self_attn.out_proj"}
    _norms_and_attention(r, d, heads, f"{s}.layer_norm1", attn, f"{s}.layer_norm2", out)
    u.timm_mlp(r, f"{s}.mlp", f"{d}/mlp", out)
  u.norm(r, "post_layernorm", "encoder/final_norm", out)
  if cfg["pool_type"] == "map":
    out["map_head/probe"] = r("head.probe")
    w, b = r("head.attention.in_proj_weight"), r("head.attention.in_proj_bias")
    for j, name in enumerate(("query", "key", "value")):
      out[f"map_head/attn/{name}/kernel"] = u.split_heads(w[j * width : (j + 1) * width], heads)
      out[f"map_head/attn/{name}/bias"] = b[j * width : (j + 1) * width].reshape(heads, -1)
    out["map_head/attn/out/kernel"] = r("head.attention.out_proj.weight").T.reshape(heads, -1, width)
    out["map_head/attn/out/bias"] = r("head.attention.out_proj.bias")
    u.norm(r, "head.layernorm", "map_head/norm", out)
    u.timm_mlp(r, "head.mlp", "map_head/mlp", out)
  if head:
    u.linear(r, "classifier", "head", out)
  aside = r"^(text_model\.|logit_scale|logit_bias)" + (r"|^head\." if head else "")  # (the classifier averages)
  r.check_all_used(what, re.compile(aside))
  return u.finish(vit_lib.ViT(**cfg), out, pair(vision.get("image_size", 224)))
