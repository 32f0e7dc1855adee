"""Weights in and out: timm state dicts (ViT and Swin), Microsoft's Swin `.pth`, the original JAX ViT and
big_vision `.npz` checkpoints (SigLIP image towers included).

Importers return `(module, variables)`; `module.apply(variables, images)` then gives the source's logits.
Images are NHWC for vitjax (timm takes NCHW: transpose (0, 3, 1, 2) to compare). Each importer sets the MLP
activation its source was trained with (timm and Microsoft's Swin: exact GELU; the original ViT and big_vision:
flax's tanh-approximated GELU).

    module, variables = from_timm("vit_base_patch16_224", safetensors.numpy.load_file("model.safetensors"))
    module, variables = from_swin(torch.load("swin_tiny_patch4_window7_224.pth"))   # Microsoft's or timm's
    module, variables = from_vit_npz("ViT-B_16.npz")           # original ViT, big_vision, SigLIP (img tower)
    params = load_params("timm:vit_base_patch16_224:model.safetensors")   # what config.init_from takes

Exporters take `(module, variables)` back out:

    state_dict, timm_cfg = to_timm(module, variables, image_size=224)   # timm.create_model(**timm_cfg)
    save_safetensors("model.safetensors", state_dict)
    np.savez("model.npz", **to_vit_npz(module, variables))             # the original ViT release's layout
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping
from typing import Any

import flax
import jax
import jax.numpy as jnp
import numpy as np
from absl import logging

from vitjax import models, posenc
from vitjax.models import vit as vit_lib

_TIMM_VIT = re.compile(r"^vit_(tiny|small|medium|base|large|huge)_patch(\d+)_(?:clip_|gap_|siglip_)*(\d+)")
_TIMM_SWIN = re.compile(r"^swin_")
_SIZES = {"tiny": "Ti", "small": "S", "medium": "M", "base": "B", "large": "L", "huge": "H"}
_TIMM_BUFFERS = re.compile(r"(relative_position_index|attn_mask)$")
LAYOUTS = (
  "timm ViT (patch_embed.proj, blocks.N.attn.qkv, ...)",
  "timm Swin (layers.S.blocks.N..., downsample at the start of stages 2-4, head.fc)",
  "Microsoft's Swin .pth ({'model': ...}, downsample at the end of stages 1-3, head.weight)",
  "the original JAX ViT .npz (Transformer/encoderblock_N/MultiHeadDotProductAttention_1, ...)",
  "big_vision ViT .npz (pos_embedding, Transformer/encoderblock[_N], MAPHead_0; SigLIP's params/img/...)",
)


class _Reader:
  """Reads a flat mapping of numpy arrays and remembers which keys were used."""

  def __init__(self, mapping: Mapping[str, Any]):
    self.arrays = {k: np.asarray(_to_numpy(v), np.float32) for k, v in mapping.items()}
    self.used: set[str] = set()

  def __contains__(self, key):
    return key in self.arrays

  def __call__(self, key: str) -> np.ndarray:
    if key not in self.arrays:
      raise KeyError(f"checkpoint has no {key!r}; is it the right model family?")
    self.used.add(key)
    return self.arrays[key]

  def unused(self, ignore: re.Pattern | None = None) -> list[str]:
    return sorted(k for k in self.arrays if k not in self.used and not (ignore and ignore.search(k)))

  def check_all_used(self, what: str, ignore: re.Pattern | None = None) -> None:
    """A key the conversion did not read is an error, so an unsupported variant never loads half-converted."""
    unused = self.unused(ignore)
    if unused:
      raise ValueError(
        f"{what}: the checkpoint has parameters this conversion does not know: "
        f"{unused[:8]}{' ...' if len(unused) > 8 else ''}"
      )


def _to_numpy(v):
  if hasattr(v, "detach"):  # a torch tensor
    return v.detach().cpu().float().numpy()
  return v


def _nest(flat: dict[str, np.ndarray]) -> dict:
  return flax.traverse_util.unflatten_dict({tuple(k.split("/")): v for k, v in flat.items()})


def _flat(params) -> dict[str, np.ndarray]:
  flat = flax.traverse_util.flatten_dict(flax.core.unfreeze(params), sep="/")
  return {k: np.asarray(jax.device_get(v), np.float32) for k, v in flat.items()}


def _is_square(n: int) -> bool:
  return n > 0 and math.isqrt(n) ** 2 == n


def check_shapes(module, params: dict, image_shape: tuple[int, ...]) -> None:
  """Raises ValueError listing every parameter whose shape differs from what `module` expects."""
  expected = jax.eval_shape(lambda: module.init(jax.random.key(0), jnp.zeros(image_shape)))["params"]
  exp = flax.traverse_util.flatten_dict(flax.core.unfreeze(expected), sep="/")
  got = flax.traverse_util.flatten_dict(params, sep="/")
  problems = [
    f"  {k}: model {exp[k].shape}, checkpoint {got[k].shape}"
    for k in sorted(exp)
    if k in got and exp[k].shape != got[k].shape
  ]
  problems += [f"  {k}: missing from checkpoint (model {exp[k].shape})" for k in sorted(set(exp) - set(got))]
  problems += [f"  {k}: not in the model" for k in sorted(set(got) - set(exp))]
  if problems:
    raise ValueError("checkpoint does not match the model:\n" + "\n".join(problems[:20]))


def _finish(module, flat: dict[str, np.ndarray], image_hw: tuple[int, int]):
  params = _nest(flat)
  channels = next(v.shape[2] for k, v in flat.items() if k in ("embedding/kernel", "patch_embed/kernel"))
  check_shapes(module, params, (1, *image_hw, channels))
  return module, {"params": jax.tree.map(jnp.asarray, params)}


def _unwrap(state_dict: Mapping[str, Any]) -> Mapping[str, Any]:
  """A training checkpoint {'model': sd, 'optimizer': ...} (Microsoft's Swin) or {'state_dict': sd} -> sd."""
  for key in ("model", "state_dict", "model_ema"):
    if isinstance(state_dict.get(key), Mapping):
      return state_dict[key]
  return state_dict


def detect_layout(state_dict: Mapping[str, Any]) -> str | None:
  """ "timm-vit", "timm-swin", "swin-official", "vit-npz" (original or big_vision), or None if unknown."""
  keys = set(_unwrap(state_dict))
  if "layers.0.downsample.reduction.weight" in keys or (
    "head.weight" in keys and "layers.0.blocks.0.norm1.weight" in keys
  ):
    return "swin-official"
  if "layers.0.blocks.0.norm1.weight" in keys:
    return "timm-swin"
  if "blocks.0.attn.qkv.weight" in keys:
    return "timm-vit"
  if any(k.removeprefix("params/").removeprefix("img/").startswith("Transformer/encoderblock") for k in keys):
    return "vit-npz"
  return None


def _unknown_layout(state_dict: Mapping[str, Any], what: str) -> ValueError:
  first = sorted(_unwrap(state_dict))[:4]
  return ValueError(
    f"{what}: weights of another model family or an unknown layout (first keys {first}); known: " + "; ".join(LAYOUTS)
  )


# ------------------------------------------------------------------------------------------------------ timm


def _linear(r: _Reader, src: str, dst: str, out: dict, bias: bool = True) -> None:
  out[f"{dst}/kernel"] = r(f"{src}.weight").T
  if bias:
    out[f"{dst}/bias"] = r(f"{src}.bias")


def _norm(r: _Reader, src: str, dst: str, out: dict) -> None:
  out[f"{dst}/scale"], out[f"{dst}/bias"] = r(f"{src}.weight"), r(f"{src}.bias")


def _conv(r: _Reader, src: str, dst: str, out: dict) -> None:
  out[f"{dst}/kernel"] = r(f"{src}.weight").transpose(2, 3, 1, 0)  # OIHW -> HWIO
  out[f"{dst}/bias"] = r(f"{src}.bias")


def _split_heads(w: np.ndarray, heads: int) -> np.ndarray:
  """torch Linear weight [D_out, D_in] -> flax DenseGeneral kernel [D_in, H, D_out / H]."""
  return w.T.reshape(w.shape[1], heads, w.shape[0] // heads)


def _timm_attention(r: _Reader, src: str, dst: str, heads: int, out: dict) -> None:
  """timm's fused qkv [3D, D] and proj [D, D] -> query/key/value [D, H, K] and out [H, K, D]."""
  w, b = r(f"{src}.qkv.weight"), r(f"{src}.qkv.bias") if f"{src}.qkv.bias" in r else None
  d = w.shape[1]
  for i, name in enumerate(("query", "key", "value")):
    out[f"{dst}/{name}/kernel"] = _split_heads(w[i * d : (i + 1) * d], heads)
    if b is not None:
      out[f"{dst}/{name}/bias"] = b[i * d : (i + 1) * d].reshape(heads, d // heads)
  out[f"{dst}/out/kernel"] = r(f"{src}.proj.weight").T.reshape(heads, d // heads, d)
  out[f"{dst}/out/bias"] = r(f"{src}.proj.bias")


def _timm_mlp(r: _Reader, src: str, dst: str, out: dict) -> None:
  _linear(r, f"{src}.fc1", f"{dst}/fc1", out)
  _linear(r, f"{src}.fc2", f"{dst}/fc2", out)


def _timm_attention_pool(r: _Reader, heads: int, out: dict) -> None:
  """timm's AttentionPoolLatent (latent, q, fused kv, proj, norm, mlp) -> vitjax's MAPHead."""
  out["map_head/probe"] = r("attn_pool.latent")
  w, b = r("attn_pool.kv.weight"), r("attn_pool.kv.bias")
  d = w.shape[1]
  q_w, q_b = r("attn_pool.q.weight"), r("attn_pool.q.bias")
  for name, (wi, bi) in {"query": (q_w, q_b), "key": (w[:d], b[:d]), "value": (w[d:], b[d:])}.items():
    out[f"map_head/attn/{name}/kernel"] = _split_heads(wi, heads)
    out[f"map_head/attn/{name}/bias"] = bi.reshape(heads, d // heads)
  out["map_head/attn/out/kernel"] = r("attn_pool.proj.weight").T.reshape(heads, d // heads, d)
  out["map_head/attn/out/bias"] = r("attn_pool.proj.bias")
  _norm(r, "attn_pool.norm", "map_head/norm", out)
  _timm_mlp(r, "attn_pool.mlp", "map_head/mlp", out)


def _timm_vit(m: re.Match, r: _Reader):
  variant = vit_lib.parse_variant(f"{_SIZES[m[1]]}/{m[2]}")
  heads = variant["num_heads"]
  variant["width"] = r.arrays["patch_embed.proj.weight"].shape[0]
  variant["mlp_dim"] = r.arrays["blocks.0.mlp.fc1.weight"].shape[0]
  depth = len({k.split(".")[1] for k in r.arrays if k.startswith("blocks.")})
  pool = "map" if "attn_pool.latent" in r else "tok" if "cls_token" in r else "gap"
  cfg = dict(
    variant,
    depth=depth,
    pool_type=pool,
    fc_norm="fc_norm.weight" in r,
    num_classes=r.arrays["head.weight"].shape[0] if "head.weight" in r else 0,
    qkv_bias="blocks.0.attn.qkv.bias" in r,
    act="gelu",
  )
  if "pre_logits.fc.weight" in r:
    cfg["representation_size"] = r.arrays["pre_logits.fc.weight"].shape[0]
  out: dict[str, np.ndarray] = {}
  _conv(r, "patch_embed.proj", "embedding", out)
  if "cls_token" in r:
    out["cls"] = r("cls_token")
  out["posembed/pos_embedding"] = r("pos_embed")
  for i in range(depth):
    s, d = f"blocks.{i}", f"encoder/block_{i}"
    _norm(r, f"{s}.norm1", f"{d}/norm1", out)
    _timm_attention(r, f"{s}.attn", f"{d}/attn", heads, out)
    _norm(r, f"{s}.norm2", f"{d}/norm2", out)
    _timm_mlp(r, f"{s}.mlp", f"{d}/mlp", out)
  _norm(r, "fc_norm" if cfg["fc_norm"] else "norm", "fc_norm" if cfg["fc_norm"] else "encoder/final_norm", out)
  if pool == "map":
    _timm_attention_pool(r, heads, out)
  if "representation_size" in cfg:
    _linear(r, "pre_logits.fc", "pre_logits", out)
  if cfg["num_classes"]:
    _linear(r, "head", "head", out)
  return models.ViT(**cfg), out, (int(m[3]), int(m[3]))  # the name's image size, as timm builds it


def from_timm(timm_name: str, state_dict: Mapping[str, Any]):
  """(module, variables) for a timm ViT or Swin, e.g. "vit_base_patch16_224", "swin_tiny_patch4_window7_224".

  state_dict: parameter name -> array (numpy or torch), e.g. `safetensors.numpy.load_file(...)` or
  `torch.load(...)` (a training checkpoint {'model': state_dict, ...} is unwrapped). The pretrained tag after a
  dot ("vit_base_patch16_224.augreg_in21k") is ignored. ViT: the name gives the heads, the weights the rest.
  Swin: the weights give everything, in timm's layout or Microsoft's (see from_swin). Keys the conversion does
  not use (other than buffers) are an error, so an unsupported variant never loads half-converted.
  Activation: exact GELU, as timm builds these models.
  """
  base = timm_name.split(".")[0]
  state_dict = _unwrap(state_dict)
  layout = detect_layout(state_dict)
  if m := _TIMM_VIT.match(base):
    if layout != "timm-vit":
      raise (
        _unknown_layout(state_dict, f"{timm_name} (a timm ViT)")
        if layout is None
        else ValueError(
          f"{timm_name} is a timm ViT, but the weights are in the {layout} layout (another model family)"
          + ("; use from_vit_npz / init_from=npz:FILE" if layout == "vit-npz" else "")
        )
      )
    r = _Reader(state_dict)
    module, flat, hw = _timm_vit(m, r)
    r.check_all_used(timm_name, _TIMM_BUFFERS)
    return _finish(module, flat, hw)
  if _TIMM_SWIN.match(base):
    return from_swin(state_dict)
  raise ValueError(
    f"no conversion for timm model {timm_name!r}; supported: vit_{{tiny,small,medium,base,"
    "large,huge}_patchP_SIZE and swin_*"
  )


# ------------------------------------------------------------------------------------------------------- Swin


def _official_to_timm_swin(sd: Mapping[str, Any]) -> dict[str, Any]:
  """Microsoft's Swin layout -> timm's: a stage's downsample moves from its end to the next stage's start,
  head.weight -> head.fc.weight; relative_position_index and attn_mask are buffers (rebuilt, not read)."""
  out = {}
  for k, v in sd.items():
    if m := re.match(r"layers\.(\d+)\.downsample\.(.*)", k):
      k = f"layers.{int(m[1]) + 1}.downsample.{m[2]}"
    elif k.startswith("head."):
      k = "head.fc." + k[len("head.") :]
    out[k] = v
  return out


def from_swin(state_dict: Mapping[str, Any]):
  """(module, variables) for a Swin state dict, Microsoft's official `.pth` or timm's; the architecture (embed dim,
  depths, heads, window, patch, MLP ratio, classes) is read from the weights.

  Microsoft's checkpoints are `{'model': state_dict, ...}` with the patch-merging layer at the end of stages
  1-3; timm's put it at the start of stages 2-4 (as vitjax does). Both use exact GELU.
  """
  state_dict = _unwrap(state_dict)
  layout = detect_layout(state_dict)
  if layout not in ("timm-swin", "swin-official"):
    raise (
      _unknown_layout(state_dict, "from_swin")
      if layout is None
      else ValueError(f"a Swin was asked for, but the weights are in the {layout} layout (another model family)")
    )
  if layout == "swin-official":
    state_dict = _official_to_timm_swin(state_dict)
  r = _Reader(state_dict)
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
  _conv(r, "patch_embed.proj", "patch_embed", out)
  _norm(r, "patch_embed.norm", "patch_norm", out)
  for s, (depth, h) in enumerate(zip(depths, heads)):
    if s > 0:
      _norm(r, f"layers.{s}.downsample.norm", f"stage_{s}_downsample/norm", out)
      _linear(r, f"layers.{s}.downsample.reduction", f"stage_{s}_downsample/reduction", out, bias=False)
    for j in range(depth):
      src, dst = f"layers.{s}.blocks.{j}", f"stage_{s}_block_{j}"
      _norm(r, f"{src}.norm1", f"{dst}/norm1", out)
      _timm_attention(r, f"{src}.attn", f"{dst}/attn", h, out)
      out[f"{dst}/rel_pos/relative_position_bias_table"] = r(f"{src}.attn.relative_position_bias_table")
      _norm(r, f"{src}.norm2", f"{dst}/norm2", out)
      _timm_mlp(r, f"{src}.mlp", f"{dst}/mlp", out)
  _norm(r, "norm", "norm", out)
  if num_classes:
    _linear(r, "head.fc", "head", out)
  r.check_all_used(f"Swin ({layout})", _TIMM_BUFFERS)
  side = patch * window * 2 ** (len(depths) - 1)
  return _finish(models.Swin(**cfg), out, (side, side))


# ------------------------------------------------------------------------- original JAX ViT and big_vision


def _load_npz(path_or_mapping) -> dict[str, np.ndarray]:
  """Flat '/'-keyed arrays from an .npz path or a (nested or flat) mapping; big_vision's "params/" prefix and
  SigLIP's two-tower "img/" prefix are taken off (the text tower, "t" and "b" are left out)."""
  if isinstance(path_or_mapping, Mapping):
    flat = dict(path_or_mapping)
  else:
    with open(path_or_mapping, "rb") as f:
      flat = dict(np.load(f, allow_pickle=False))
  if any(isinstance(v, Mapping) for v in flat.values()):  # a nested tree
    flat = flax.traverse_util.flatten_dict(flat, sep="/")
  flat = {k.removeprefix("params/"): v for k, v in flat.items()}
  if any(k.startswith("img/") for k in flat):
    flat = {k[len("img/") :]: v for k, v in flat.items() if k.startswith("img/")}
  # big_vision's scanned encoder: one "encoderblock" subtree stacked along a leading layer axis
  scanned = {k: v for k, v in flat.items() if k.startswith("Transformer/encoderblock/")}
  for k, v in scanned.items():
    del flat[k]
    for i in range(v.shape[0]):
      flat[k.replace("encoderblock/", f"encoderblock_{i}/", 1)] = v[i]
  return flat


_POSEMB_KEYS = ("Transformer/posembed_input/pos_embedding", "Transformer/pos_embedding", "pos_embedding")


def from_vit_npz(path_or_mapping, variant: str | None = None, act: str = "gelu_tanh"):
  """(module, variables) from an `.npz` of the original JAX ViT release (google-research/vision_transformer) or
  of big_vision (scanned or not; class token, GAP or MAP head; learned or sin-cos 2-D positions; SigLIP's
  `params/img/` image tower, whose head is the projection into the joint embedding).

  path_or_mapping: an `.npz` path or a mapping of its keys ("Transformer/encoderblock_0/
  MultiHeadDotProductAttention_1/query/kernel", ...). The architecture (width, depth, heads, MLP size, patch,
  pooling, positions, classes, pre-logits) is read from the weights; `variant` ("B/16"), if given, is checked
  against them. act: both sources trained with flax's `nn.gelu`, the tanh approximation ("gelu_tanh"); the
  exact GELU moves logits by about 1e-4 relative. Without a class token or MAP head, pooling is "gap"
  (big_vision's pool_type "0" and "none" leave no trace in the weights).
  """
  flat = _load_npz(path_or_mapping)
  r = _Reader(flat)
  blocks = sorted({int(k.split("/")[1].split("_")[-1]) for k in r.arrays if k.startswith("Transformer/encoderblock_")})
  if not blocks or "embedding/kernel" not in r:
    raise _unknown_layout(flat, "not an original-ViT or big_vision checkpoint")
  kernel = r.arrays["embedding/kernel"]  # [p, p, C, D]
  first = f"Transformer/encoderblock_{blocks[0]}"
  attn0 = next(k for k in r.arrays if k.startswith(first + "/MultiHeadDotProductAttention_") and "query/kernel" in k)
  dense0 = next(k for k in r.arrays if k.startswith(first + "/MlpBlock_") and k.endswith("Dense_0/kernel"))
  cfg: dict[str, Any] = dict(
    width=kernel.shape[-1],
    depth=len(blocks),
    mlp_dim=r.arrays[dense0].shape[1],
    num_heads=r.arrays[attn0].shape[1],
    patch_size=tuple(kernel.shape[:2]),
    act=act,
  )
  if variant is not None:
    want = vit_lib.parse_variant(variant)
    diff = {k: (want[k], cfg[k]) for k in ("width", "mlp_dim", "num_heads") if want[k] != cfg[k]}
    if tuple(want["patch_size"]) != cfg["patch_size"]:
      diff["patch_size"] = (want["patch_size"], cfg["patch_size"])
    if diff:
      raise ValueError(
        f"the checkpoint is not a {variant}: " + ", ".join(f"{k} {a} != {b}" for k, (a, b) in diff.items())
      )
  has_map = any(k.startswith("MAPHead_0/") for k in r.arrays)
  cfg["pool_type"] = "map" if has_map else "tok" if "cls" in r else "gap"
  cfg["num_classes"] = r.arrays["head/kernel"].shape[-1] if "head/kernel" in r else 0
  if "pre_logits/kernel" in r:
    cfg["representation_size"] = r.arrays["pre_logits/kernel"].shape[-1]

  out: dict[str, np.ndarray] = {"embedding/kernel": r("embedding/kernel"), "embedding/bias": r("embedding/bias")}
  if "cls" in r:
    out["cls"] = r("cls")
  pe_key = next((k for k in _POSEMB_KEYS if k in r), None)
  if pe_key is None:
    cfg["posemb"] = "sincos2d"
    grid = 4
  else:
    pe = r(pe_key)
    n = pe.shape[1]
    cls_row = "cls" in r and not _is_square(n) and _is_square(n - 1)
    if "cls" in r and not cls_row:  # big_vision adds positions to the patches only: a zero row for the token
      pe = np.concatenate([np.zeros_like(pe[:, :1]), pe], axis=1)
    out["posembed/pos_embedding"] = pe
    grid = math.isqrt(n - cls_row)
  for i in blocks:
    src, dst = f"Transformer/encoderblock_{i}", f"encoder/block_{i}"
    names = sorted({k[len(src) + 1 :].split("/")[0] for k in r.arrays if k.startswith(src + "/")})
    norms = sorted((n for n in names if n.startswith("LayerNorm_")), key=lambda n: int(n.split("_")[1]))
    attn = [n for n in names if n.startswith("MultiHeadDotProductAttention_")]
    mlp = [n for n in names if n.startswith("MlpBlock_")]
    if len(norms) != 2 or len(attn) != 1 or len(mlp) != 1:
      raise ValueError(f"unexpected layout in {src}: {names}")
    for k, name in enumerate(norms):
      _copy(r, f"{src}/{name}", f"{dst}/norm{k + 1}", out)
    _copy(r, f"{src}/{attn[0]}", f"{dst}/attn", out, ("query", "key", "value", "out"))
    _copy(r, f"{src}/{mlp[0]}", f"{dst}/mlp", out, ("Dense_0", "Dense_1"), ("fc1", "fc2"))
  _copy(r, "Transformer/encoder_norm", "encoder/final_norm", out)
  if has_map:
    out["map_head/probe"] = r("MAPHead_0/probe")
    _copy(r, "MAPHead_0/MultiHeadDotProductAttention_0", "map_head/attn", out, ("query", "key", "value", "out"))
    _copy(r, "MAPHead_0/LayerNorm_0", "map_head/norm", out)
    _copy(r, "MAPHead_0/MlpBlock_0", "map_head/mlp", out, ("Dense_0", "Dense_1"), ("fc1", "fc2"))
  for name in ("pre_logits", "head"):
    if f"{name}/kernel" in r:
      _copy(r, name, name, out)
  r.check_all_used("from_vit_npz")
  return _finish(models.ViT(**cfg), out, (grid * cfg["patch_size"][0], grid * cfg["patch_size"][1]))


def _copy(r: _Reader, src: str, dst: str, out: dict, subs=(None,), new_subs=None) -> None:
  """Copies every parameter under src/SUB to dst/NEW_SUB (flax names on both sides: kernel, bias, scale)."""
  for sub, new in zip(subs, new_subs or subs):
    s, d = f"{src}/{sub}" if sub else src, f"{dst}/{new}" if new else dst
    keys = [k for k in r.arrays if k.startswith(s + "/") and "/" not in k[len(s) + 1 :]]
    if not keys:
      raise KeyError(f"checkpoint has no {s}/*; is it the right model family?")
    for k in keys:
      out[f"{d}/{k[len(s) + 1 :]}"] = r(k)


# ------------------------------------------------------------------------------------------------------ export


def _unsupported(module, what: str, **allowed) -> None:
  """ValueError naming every attribute of `module` whose value is not among those `allowed` for the format."""
  bad = {k: getattr(module, k) for k, ok in allowed.items() if getattr(module, k) not in ok}
  if bad:
    raise ValueError(f"{what} has no equivalent for " + ", ".join(f"{k}={v!r}" for k, v in bad.items()))


def _put_linear(p: dict, src: str, dst: str, out: dict) -> None:
  out[f"{dst}.weight"] = p[f"{src}/kernel"].T
  if f"{src}/bias" in p:
    out[f"{dst}.bias"] = p[f"{src}/bias"]


def _put_norm(p: dict, src: str, dst: str, out: dict) -> None:
  out[f"{dst}.weight"], out[f"{dst}.bias"] = p[f"{src}/scale"], p[f"{src}/bias"]


def _merge_heads(kernel: np.ndarray) -> np.ndarray:
  """flax kernel [D_in, H, K] -> torch Linear weight [H*K, D_in] (inverse of _split_heads)."""
  return kernel.reshape(kernel.shape[0], -1).T


def _put_attention(p: dict, src: str, dst: str, out: dict) -> None:
  out[f"{dst}.qkv.weight"] = np.concatenate([_merge_heads(p[f"{src}/{n}/kernel"]) for n in ("query", "key", "value")])
  if f"{src}/query/bias" in p:
    out[f"{dst}.qkv.bias"] = np.concatenate([p[f"{src}/{n}/bias"].reshape(-1) for n in ("query", "key", "value")])
  w = p[f"{src}/out/kernel"]
  out[f"{dst}.proj.weight"] = w.reshape(-1, w.shape[-1]).T
  out[f"{dst}.proj.bias"] = p[f"{src}/out/bias"]


def _put_mlp(p: dict, src: str, dst: str, out: dict) -> None:
  _put_linear(p, f"{src}/fc1", f"{dst}.fc1", out)
  _put_linear(p, f"{src}/fc2", f"{dst}.fc2", out)


def _vit_to_timm(module, p: dict, image_size) -> tuple[dict, dict]:
  _unsupported(
    module,
    "timm's VisionTransformer",
    stem=("patch",),
    representation_size=(None, 0),
    scan=(False,),
    pool_type=("tok", "gap", "map"),
    norm=("pre",),
    embed_norm=(False,),
    rel_pos_bias=(False,),
  )
  out: dict[str, np.ndarray] = {}
  k = p["embedding/kernel"]  # [p, p, C, D]
  out["patch_embed.proj.weight"], out["patch_embed.proj.bias"] = k.transpose(3, 2, 0, 1), p["embedding/bias"]
  grid = (image_size[0] // k.shape[0], image_size[1] // k.shape[1])
  if "cls" in p:
    out["cls_token"] = p["cls"]
  if module.posemb == "learn":
    out["pos_embed"] = p["posembed/pos_embedding"]
  else:  # a fixed sin-cos table becomes timm's (learned) table: same values, same logits
    pe = posenc.sincos_2d(*grid, k.shape[-1])[None]
    out["pos_embed"] = np.concatenate([np.zeros_like(pe[:, :1]), pe], 1) if "cls" in p else pe
  for i in range(module.depth):
    s, d = f"encoder/block_{i}", f"blocks.{i}"
    _put_norm(p, f"{s}/norm1", f"{d}.norm1", out)
    _put_attention(p, f"{s}/attn", f"{d}.attn", out)
    _put_norm(p, f"{s}/norm2", f"{d}.norm2", out)
    _put_mlp(p, f"{s}/mlp", f"{d}.mlp", out)
  if module.fc_norm:
    _put_norm(p, "fc_norm", "fc_norm", out)
  else:
    _put_norm(p, "encoder/final_norm", "norm", out)
  if module.pool_type == "map":
    out["attn_pool.latent"] = p["map_head/probe"]
    out["attn_pool.q.weight"] = _merge_heads(p["map_head/attn/query/kernel"])
    out["attn_pool.q.bias"] = p["map_head/attn/query/bias"].reshape(-1)
    out["attn_pool.kv.weight"] = np.concatenate(
      [_merge_heads(p[f"map_head/attn/{n}/kernel"]) for n in ("key", "value")]
    )
    out["attn_pool.kv.bias"] = np.concatenate([p[f"map_head/attn/{n}/bias"].reshape(-1) for n in ("key", "value")])
    w = p["map_head/attn/out/kernel"]
    out["attn_pool.proj.weight"], out["attn_pool.proj.bias"] = w.reshape(-1, w.shape[-1]).T, p["map_head/attn/out/bias"]
    _put_norm(p, "map_head/norm", "attn_pool.norm", out)
    _put_mlp(p, "map_head/mlp", "attn_pool.mlp", out)
  if "head/kernel" in p:
    _put_linear(p, "head", "head", out)
  width = k.shape[-1]
  args = dict(
    img_size=tuple(image_size),
    in_chans=k.shape[2],
    patch_size=tuple(k.shape[:2]),
    embed_dim=width,
    depth=module.depth,
    num_heads=module.num_heads,
    mlp_ratio=(module.mlp_dim or 4 * width) / width,
    qkv_bias=module.qkv_bias,
    class_token="cls" in p,
    global_pool={"tok": "token", "gap": "avg", "map": "map"}[module.pool_type],
    fc_norm=bool(module.fc_norm),
    num_classes=int(out["head.weight"].shape[0]) if "head.weight" in out else 0,
    act_layer=module.act,
  )
  return out, {"model": "vit", "kwargs": args}


def _swin_to_timm(module, p: dict, image_size) -> tuple[dict, dict]:
  _unsupported(module, "timm's SwinTransformer", stem=("patch",))
  if module.act != "gelu":
    raise ValueError(f"timm's SwinTransformer uses exact GELU; this model has act={module.act!r}")
  out: dict[str, np.ndarray] = {}
  k = p["patch_embed/kernel"]
  out["patch_embed.proj.weight"], out["patch_embed.proj.bias"] = k.transpose(3, 2, 0, 1), p["patch_embed/bias"]
  _put_norm(p, "patch_norm", "patch_embed.norm", out)
  for s, depth in enumerate(module.depths):
    if s > 0:
      _put_norm(p, f"stage_{s}_downsample/norm", f"layers.{s}.downsample.norm", out)
      _put_linear(p, f"stage_{s}_downsample/reduction", f"layers.{s}.downsample.reduction", out)
    for j in range(depth):
      src, dst = f"stage_{s}_block_{j}", f"layers.{s}.blocks.{j}"
      _put_norm(p, f"{src}/norm1", f"{dst}.norm1", out)
      _put_attention(p, f"{src}/attn", f"{dst}.attn", out)
      out[f"{dst}.attn.relative_position_bias_table"] = p[f"{src}/rel_pos/relative_position_bias_table"]
      _put_norm(p, f"{src}/norm2", f"{dst}.norm2", out)
      _put_mlp(p, f"{src}/mlp", f"{dst}.mlp", out)
  _put_norm(p, "norm", "norm", out)
  if "head/kernel" in p:
    _put_linear(p, "head", "head.fc", out)
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


def to_timm(module, variables, image_size) -> tuple[dict[str, np.ndarray], dict]:
  """(state_dict, config) of timm's ViT or Swin for a vitjax ViT / Swin; `image_size` (int or (H, W)) is the
  resolution the timm model is built for (timm fixes it at construction; vitjax reads it from the input).

  state_dict: numpy float32 arrays that `load_state_dict(..., strict=True)` accepts in the model that
  `build_timm(config)` makes (timm's VisionTransformer or SwinTransformer classes with config["kwargs"]).
  A ViT with a tanh-GELU keeps it (act_layer="gelu_tanh"), so its logits carry over. Options timm has no
  equivalent for (a convolutional stem, a pre-logits layer, a scanned encoder, other norm placements, ...)
  raise ValueError naming them.
  """
  image_size = (image_size, image_size) if isinstance(image_size, int) else tuple(image_size)
  p = _flat(variables["params"])
  if isinstance(module, models.ViT):
    return _vit_to_timm(module, p, image_size)
  if isinstance(module, models.Swin):
    return _swin_to_timm(module, p, image_size)
  raise ValueError(f"to_timm converts a ViT or a Swin, not a {type(module).__name__}")


def build_timm(config: dict):
  """The timm model (random weights, eval mode) a `to_timm` state dict loads into with strict=True."""
  from timm.models.swin_transformer import SwinTransformer
  from timm.models.vision_transformer import VisionTransformer

  cls = {"vit": VisionTransformer, "swin": SwinTransformer}[config["model"]]
  return cls(**config["kwargs"]).eval()


def to_vit_npz(module, variables) -> dict[str, np.ndarray]:
  """The flat '/'-keyed arrays of the original JAX ViT release's `.npz` (`np.savez(path, **arrays)`), for a
  vitjax ViT with learned positions and a class token or GAP. from_vit_npz reads it back (pass act=module.act:
  the original ViT code itself uses tanh GELU)."""
  if not isinstance(module, models.ViT):
    raise ValueError(f"to_vit_npz converts a ViT, not a {type(module).__name__}")
  _unsupported(
    module,
    "the original ViT",
    stem=("patch",),
    posemb=("learn",),
    pool_type=("tok", "gap"),
    fc_norm=(False,),
    scan=(False,),
    norm=("pre",),
    embed_norm=(False,),
    rel_pos_bias=(False,),
  )
  p = _flat(variables["params"])
  out = {"embedding/kernel": p["embedding/kernel"], "embedding/bias": p["embedding/bias"]}
  if "cls" in p:
    out["cls"] = p["cls"]
  out["Transformer/posembed_input/pos_embedding"] = p["posembed/pos_embedding"]
  names = {"norm1": "LayerNorm_0", "attn": "MultiHeadDotProductAttention_1", "norm2": "LayerNorm_2"}
  for i in range(module.depth):
    src, dst = f"encoder/block_{i}/", f"Transformer/encoderblock_{i}/"
    for k, v in p.items():
      if k.startswith(src):
        rest = k[len(src) :]
        first, tail = rest.split("/", 1)
        if first == "mlp":
          tail = tail.replace("fc1", "Dense_0").replace("fc2", "Dense_1")
          out[dst + "MlpBlock_3/" + tail] = v
        else:
          out[dst + names[first] + "/" + tail] = v
  for s in ("scale", "bias"):
    out[f"Transformer/encoder_norm/{s}"] = p[f"encoder/final_norm/{s}"]
  for name in ("pre_logits", "head"):
    for s in ("kernel", "bias"):
      if f"{name}/{s}" in p:
        out[f"{name}/{s}"] = p[f"{name}/{s}"]
  return out


def save_safetensors(path: str, state_dict: Mapping[str, Any], metadata: dict[str, str] | None = None) -> None:
  """Writes a state dict as `.safetensors` (contiguous float32), atomically: a reader never sees half a file."""
  from safetensors.numpy import save_file

  arrays = {k: np.ascontiguousarray(_to_numpy(v), dtype=np.float32) for k, v in state_dict.items()}
  tmp = f"{path}.tmp{os.getpid()}"
  save_file(arrays, tmp, metadata=metadata)
  publish(tmp, path)


def publish(tmp: str, path: str) -> None:
  """Moves a finished temporary file onto `path` (atomically) with an ordinary file's mode, 0666 less the umask
  (0644 by default), since some writers (safetensors) create theirs readable by the owner only."""
  umask = os.umask(0)
  os.umask(umask)
  os.chmod(tmp, 0o666 & ~umask)
  os.replace(tmp, path)


# --------------------------------------------------------------------------------------------------- init_from


def timm_preprocess(name: str) -> dict | None:
  """The preprocessing timm's pretrained config gives model NAME ("vit_small_patch16_224.augreg_in21k_ft_in1k"):
  {"mean", "std", "crop_fraction", "interpolation"}; None when timm is not installed or does not know NAME."""
  try:
    from timm.models import get_pretrained_cfg
  except Exception:  # timm missing, or torchvision that cannot load
    logging.warning("timm is not importable: the preprocessing of %s is not known, the config's is used", name)
    return None
  cfg = get_pretrained_cfg(name)
  if cfg is None:
    return None
  interpolation = cfg.interpolation if cfg.interpolation in ("bilinear", "bicubic") else "bicubic"
  return {
    "mean": tuple(float(m) for m in cfg.mean),
    "std": tuple(float(s) for s in cfg.std),
    "crop_fraction": float(cfg.crop_pct),
    "interpolation": interpolation,
  }


def load_params(spec: str) -> dict:
  """Parameters from 'timm:NAME:FILE' (.safetensors, or .pth/.bin with torch; timm's layout or, for Swin,
  Microsoft's) or 'npz:FILE' / 'npz:VARIANT:FILE' (the original ViT or big_vision).

  (A vitjax workdir as init_from is read by vitjax.train.checkpoints.load_params.) Raises ConfigError naming the
  problem: a missing or unreadable file, or weights of another model family.
  """
  from vitjax.errors import ConfigError

  kind, _, rest = spec.partition(":")
  if kind not in ("timm", "npz"):
    raise ConfigError(f"init_from={spec!r}: use a vitjax workdir, 'timm:NAME:FILE' or 'npz:FILE'")
  name, _, path = rest.partition(":")
  if kind == "npz" and not path:
    name, path = "", name
  if not os.path.isfile(path):
    form = "'timm:NAME:FILE'" if kind == "timm" else "'npz:FILE' or 'npz:VARIANT:FILE'"
    raise ConfigError(f"init_from={spec!r}: no such file {path!r} (the form is {form})")
  try:
    if kind == "npz":
      return from_vit_npz(path, name or None)[1]["params"]
    if path.endswith(".safetensors"):
      from safetensors.numpy import load_file

      sd = load_file(path)
    else:
      try:
        import torch  # a .pth / .bin state dict
      except ImportError:
        raise ConfigError(f"reading {path} needs torch (pip install torch), or convert it to .safetensors") from None
      sd = torch.load(path, map_location="cpu", weights_only=True)
    return from_timm(name, sd)[1]["params"]
  except ConfigError:
    raise
  except (KeyError, ValueError) as e:  # weights of another family or variant
    raise ConfigError(f"init_from={spec!r}: {str(e).strip(chr(34) + chr(39)).splitlines()[0]}") from None
  except Exception as e:  # a truncated or garbage file
    raise ConfigError(
      f"init_from={spec!r}: {path} is not a readable {os.path.splitext(path)[1] or 'weights'} file "
      f"({type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''})"
    ) from None
