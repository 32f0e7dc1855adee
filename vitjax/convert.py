"""Weight import: timm state dicts (ViT and Swin families) and the original JAX ViT `.npz` checkpoints.

Both return `(module, variables)`; `module.apply(variables, images)` then gives the reference's logits.
Images are NHWC for vitjax (timm takes NCHW: transpose (0, 3, 1, 2) to compare).

    module, variables = from_timm("vit_base_patch16_224", safetensors.numpy.load_file("model.safetensors"))
    module, variables = from_vit_npz("ViT-B_16.npz", "B/16")
    params = load_params("timm:vit_base_patch16_224:model.safetensors")   # what config.init_from takes
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any

import flax
import jax
import jax.numpy as jnp
import numpy as np

from vitjax import models
from vitjax.models import swin as swin_lib
from vitjax.models import vit as vit_lib

_TIMM_VIT = re.compile(r"^vit_(tiny|small|medium|base|large|huge)_patch(\d+)_(?:clip_|gap_)*(\d+)")
_TIMM_SWIN = re.compile(r"^swin_(tiny|small|base|large)_patch(\d+)_window(\d+)_(\d+)")
_SIZES = {"tiny": "Ti", "small": "S", "medium": "M", "base": "B", "large": "L", "huge": "H"}
_TIMM_BUFFERS = re.compile(r"(relative_position_index|attn_mask)$")


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


def _to_numpy(v):
  if hasattr(v, "detach"):  # a torch tensor
    return v.detach().cpu().float().numpy()
  return v


def _nest(flat: dict[str, np.ndarray]) -> dict:
  return flax.traverse_util.unflatten_dict({tuple(k.split("/")): v for k, v in flat.items()})


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


# ----------------------------------------------------------------------------------------- timm


def _linear(r: _Reader, src: str, dst: str, out: dict, bias: bool = True) -> None:
  out[f"{dst}/kernel"] = r(f"{src}.weight").T
  if bias:
    out[f"{dst}/bias"] = r(f"{src}.bias")


def _norm(r: _Reader, src: str, dst: str, out: dict) -> None:
  out[f"{dst}/scale"], out[f"{dst}/bias"] = r(f"{src}.weight"), r(f"{src}.bias")


def _conv(r: _Reader, src: str, dst: str, out: dict) -> None:
  out[f"{dst}/kernel"] = r(f"{src}.weight").transpose(2, 3, 1, 0)  # OIHW -> HWIO
  out[f"{dst}/bias"] = r(f"{src}.bias")


def _timm_attention(r: _Reader, src: str, dst: str, heads: int, out: dict) -> None:
  """timm's fused qkv [3D, D] and proj [D, D] -> query/key/value [D, H, K] and out [H, K, D]."""
  w, b = r(f"{src}.qkv.weight"), r(f"{src}.qkv.bias") if f"{src}.qkv.bias" in r else None
  d = w.shape[1]
  for i, name in enumerate(("query", "key", "value")):
    out[f"{dst}/{name}/kernel"] = w[i * d : (i + 1) * d].T.reshape(d, heads, d // heads)
    if b is not None:
      out[f"{dst}/{name}/bias"] = b[i * d : (i + 1) * d].reshape(heads, d // heads)
  out[f"{dst}/out/kernel"] = r(f"{src}.proj.weight").T.reshape(heads, d // heads, d)
  out[f"{dst}/out/bias"] = r(f"{src}.proj.bias")


def _timm_mlp(r: _Reader, src: str, dst: str, out: dict) -> None:
  _linear(r, f"{src}.fc1", f"{dst}/fc1", out)
  _linear(r, f"{src}.fc2", f"{dst}/fc2", out)


def _timm_vit(m: re.Match, r: _Reader):
  variant = vit_lib.parse_variant(f"{_SIZES[m[1]]}/{m[2]}")
  image = int(m[3])
  heads = variant["num_heads"]
  depth = len({k.split(".")[1] for k in r.arrays if k.startswith("blocks.")})
  cfg = dict(
    variant,
    depth=depth,
    pool_type="tok" if "cls_token" in r else "gap",
    fc_norm="fc_norm.weight" in r,
    num_classes=r.arrays["head.weight"].shape[0] if "head.weight" in r else 0,
    qkv_bias="blocks.0.attn.qkv.bias" in r,
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
  if "representation_size" in cfg:
    _linear(r, "pre_logits.fc", "pre_logits", out)
  if cfg["num_classes"]:
    _linear(r, "head", "head", out)
  return models.ViT(**cfg), out, (1, image, image, 3)


def _timm_swin(m: re.Match, r: _Reader):
  embed, depths, heads = swin_lib.VARIANTS[_SIZES[m[1]].upper().replace("TI", "T")]
  patch, window, image = int(m[2]), int(m[3]), int(m[4])
  num_classes = r.arrays["head.fc.weight"].shape[0] if "head.fc.weight" in r else 0
  cfg = dict(
    embed_dim=embed, depths=depths, num_heads=heads, patch_size=patch, window_size=window, num_classes=num_classes
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
  return models.Swin(**cfg), out, (1, image, image, 3)


def from_timm(timm_name: str, state_dict: Mapping[str, Any]):
  """(module, variables) for a timm ViT or Swin, e.g. "vit_base_patch16_224", "swin_tiny_patch4_window7_224".

  state_dict: parameter name -> array (numpy or torch), e.g. `safetensors.numpy.load_file(...)` or
  `torch.load(...)`. The pretrained tag after a dot ("vit_base_patch16_224.augreg_in21k") is ignored. Keys the
  conversion does not use (other than timm's buffers) are an error, so an unsupported variant never loads
  half-converted.
  """
  base = timm_name.split(".")[0]
  r = _Reader(state_dict)
  if m := _TIMM_VIT.match(base):
    module, flat, shape = _timm_vit(m, r)
  elif m := _TIMM_SWIN.match(base):
    module, flat, shape = _timm_swin(m, r)
  else:
    raise ValueError(
      f"no conversion for timm model {timm_name!r}; supported: vit_{{tiny,small,medium,base,"
      "large,huge}_patchP_SIZE and swin_{tiny,small,base,large}_patch4_windowW_SIZE"
    )
  unused = r.unused(_TIMM_BUFFERS)
  if unused:
    raise ValueError(
      f"{timm_name}: the state dict has parameters this conversion does not know: "
      f"{unused[:8]}{' ...' if len(unused) > 8 else ''}"
    )
  params = _nest(flat)
  check_shapes(module, params, shape)
  return module, {"params": jax.tree.map(jnp.asarray, params)}


# ------------------------------------------------------------------------------- original JAX ViT


def _load_npz(path_or_mapping) -> dict[str, np.ndarray]:
  if isinstance(path_or_mapping, Mapping):
    flat = dict(path_or_mapping)
  else:
    with open(path_or_mapping, "rb") as f:
      flat = dict(np.load(f, allow_pickle=False))
  if any(isinstance(v, Mapping) for v in flat.values()):  # a nested tree
    flat = flax.traverse_util.flatten_dict(flat, sep="/")
  return {k.removeprefix("params/"): v for k, v in flat.items()}


def from_vit_npz(path_or_mapping, variant: str):
  """(module, variables) from a checkpoint of the original JAX ViT release (google-research/vision_transformer).

  path_or_mapping: an `.npz` path or a mapping of its keys ("Transformer/encoderblock_0/
  MultiHeadDotProductAttention_1/query/kernel", ...). variant: "B/16" etc. Image size, classes, class token
  and pre-logits layer are read from the checkpoint.
  """
  r = _Reader(_load_npz(path_or_mapping))
  cfg = vit_lib.parse_variant(variant)
  blocks = sorted({int(k.split("/")[1].split("_")[-1]) for k in r.arrays if k.startswith("Transformer/encoderblock_")})
  if not blocks:
    raise ValueError("no Transformer/encoderblock_* keys: not an original-ViT checkpoint")
  cfg["depth"] = len(blocks)
  cfg["pool_type"] = "tok" if "cls" in r else "gap"
  cfg["num_classes"] = r.arrays["head/kernel"].shape[-1] if "head/kernel" in r else 0
  if "pre_logits/kernel" in r:
    cfg["representation_size"] = r.arrays["pre_logits/kernel"].shape[-1]
  n = r.arrays["Transformer/posembed_input/pos_embedding"].shape[1] - (cfg["pool_type"] == "tok")
  side = int(round(np.sqrt(n)))
  image = side * cfg["patch_size"][0]

  out: dict[str, np.ndarray] = {
    "embedding/kernel": r("embedding/kernel"),
    "embedding/bias": r("embedding/bias"),
    "posembed/pos_embedding": r("Transformer/posembed_input/pos_embedding"),
  }
  if "cls" in r:
    out["cls"] = r("cls")
  for i in blocks:
    src, dst = f"Transformer/encoderblock_{i}", f"encoder/block_{i}"
    names = sorted({k[len(src) + 1 :].split("/")[0] for k in r.arrays if k.startswith(src + "/")})
    norms = [n for n in names if n.startswith("LayerNorm_")]
    attn = [n for n in names if n.startswith("MultiHeadDotProductAttention_")]
    mlp = [n for n in names if n.startswith("MlpBlock_")]
    if len(norms) != 2 or len(attn) != 1 or len(mlp) != 1:
      raise ValueError(f"unexpected layout in {src}: {names}")
    for k, name in enumerate(norms):
      for p in ("scale", "bias"):
        out[f"{dst}/norm{k + 1}/{p}"] = r(f"{src}/{name}/{p}")
    for proj in ("query", "key", "value", "out"):
      for p in ("kernel", "bias"):
        out[f"{dst}/attn/{proj}/{p}"] = r(f"{src}/{attn[0]}/{proj}/{p}")
    for k in (0, 1):
      for p in ("kernel", "bias"):
        out[f"{dst}/mlp/fc{k + 1}/{p}"] = r(f"{src}/{mlp[0]}/Dense_{k}/{p}")
  for p in ("scale", "bias"):
    out[f"encoder/final_norm/{p}"] = r(f"Transformer/encoder_norm/{p}")
  for name in ("pre_logits", "head"):
    if f"{name}/kernel" in r:
      out[f"{name}/kernel"], out[f"{name}/bias"] = r(f"{name}/kernel"), r(f"{name}/bias")
  unused = r.unused()
  if unused:
    raise ValueError(f"the checkpoint has parameters this conversion does not know: {unused[:8]}")
  module = models.ViT(**cfg)
  params = _nest(out)
  check_shapes(module, params, (1, image, image, 3))
  return module, {"params": jax.tree.map(jnp.asarray, params)}


# ------------------------------------------------------------------------------------------ init_from


def load_params(spec: str) -> dict:
  """Parameters from 'timm:NAME:FILE' (.safetensors, or .pth/.bin with torch) or 'npz:VARIANT:FILE'.

  (A vitjax workdir as init_from is read by vitjax.train.checkpoints.load_params.) Raises ConfigError naming the
  problem: a missing or unreadable file, or weights of another model family.
  """
  from vitjax.errors import ConfigError

  kind, _, rest = spec.partition(":")
  if kind not in ("timm", "npz"):
    raise ConfigError(f"init_from={spec!r}: use a vitjax workdir, 'timm:NAME:FILE' or 'npz:VARIANT:FILE'")
  name, _, path = rest.partition(":")
  if not os.path.isfile(path):
    raise ConfigError(f"init_from={spec!r}: no such file {path!r} (the form is '{kind}:NAME:FILE')")
  try:
    if kind == "npz":
      return from_vit_npz(path, name)[1]["params"]
    if path.endswith(".safetensors"):
      from safetensors.numpy import load_file

      sd = load_file(path)
    else:
      try:
        import torch  # a .pth / .bin state dict
      except ImportError:
        raise ConfigError(f"reading {path} needs torch (pip install torch), or convert it to .safetensors") from None
      sd = torch.load(path, map_location="cpu", weights_only=True)
      sd = sd.get("state_dict", sd.get("model", sd))
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
