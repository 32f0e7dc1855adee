"""Fitting loaded parameters to a model of other shapes, for fine-tuning (`config.init_from`).

What every model shares is handled here: the classifier `head/...` and layer stacks scanned or not
(vitjax.layers.Stack). The rest are adapters, one function per kind of parameter, that each model family lists
in its registration (vitjax.models.registry): learned position embeddings resampled or extended, relative
position bias tables resized.
"""

from __future__ import annotations

import math
import re

import flax
import numpy as np

from vitjax import posenc
from vitjax.errors import ConfigError
from vitjax.models import lora, registry

HEADS = ("head/", "head_dist/")  # the classifier heads (DeiT's distillation token has the second)


def adapt_params(loaded, target, model=None) -> tuple[dict, list[str]]:
  """(parameters of the target's shapes, one line per change) from loaded parameters.

  The classifier head is replaced (kept at the target's initialisation) when the number of classes differs or
  the checkpoint has none; a stack scanned over layers on one side and not on the other is restacked; any other
  parameter whose shape differs goes to the adapters of `model`'s family (vitjax.models.registry; every
  family's when None): position embeddings resampled or truncated / extended, relative-position bias tables
  resized, to a new resolution, window or length. What no adapter takes raises a ConfigError listing every
  mismatch.
  """
  fits = registry.adapters(model)
  merged = lora.has_adapters(loaded) and not lora.has_adapters(target)
  if merged:  # an adapter run into a model without adapters: its adapters folded into their kernels
    loaded = lora.merged(loaded)
  flat_l = flax.traverse_util.flatten_dict(flax.core.unfreeze(loaded), sep="/")
  flat_t = flax.traverse_util.flatten_dict(flax.core.unfreeze(target), sep="/")
  out, problems, changes = {}, [], ["merged the checkpoint's low-rank adapters into their kernels"] if merged else []
  _check_registers(flat_l, flat_t)
  _check_options(flat_l, flat_t)
  flat_l = _restack(flat_l, scanned=any(_SCANNED in k for k in flat_t), changes=changes)
  for k, t in flat_t.items():
    if k not in flat_l:
      if lora.is_adapter(k):  # config.lora's new adapters start at their initialisation (B = 0: the base's outputs)
        out[k] = t
        continue
      if k.startswith(HEADS) or k == "dist":  # (a new head; DeiT's distillation token and head)
        changes.append(f"{k} not in the checkpoint; keeping its initialisation")
        out[k] = t
        continue
      problems.append(f"  {k}: missing from the checkpoint (model {t.shape})")
      continue
    v = np.asarray(flat_l[k])
    if v.shape == t.shape:
      out[k] = v
    elif k.startswith(HEADS):
      changes.append(f"new head {k} {v.shape} -> {t.shape}")
      out[k] = t
    elif fitted := next((r for fit in fits if (r := fit(k, v, t)) is not None), None):
      out[k] = fitted[0]
      changes.append(fitted[1])
    else:
      problems.append(f"  {k}: model {t.shape}, checkpoint {v.shape}")
  unused = sorted(set(flat_l) - set(flat_t))
  if unused:  # a shallower model, options it lacks (pre_logits, rel_pos): said, since config.model may be wrong
    groups = list(dict.fromkeys(_group(k) for k in unused))
    shown = ", ".join(groups[:8]) + (f" and {len(groups) - 8} more" if len(groups) > 8 else "")
    changes.append(f"left out {len(unused)} of the checkpoint's parameters that the model does not have: {shown}")
  if problems:
    more = f"; and {len(problems) - 20} more" if len(problems) > 20 else ""
    raise ConfigError(
      "the checkpoint's parameters do not match the model (check config.model): "
      + "; ".join(p.strip() for p in problems[:20])
      + more
    )
  return flax.traverse_util.unflatten_dict({tuple(k.split("/")): v for k, v in out.items()}), changes


# (a parameter an option adds to every block, the config field, what to set when the checkpoint has it / has not)
OPTION_PARAMS = (
  ("/mlp/fc1_g/kernel", "ffn", "'swiglu' (and act='silu')", "'mlp'"),
  ("/ls1/scale", "init_values", "1e-5 (LayerScale; DINOv2's)", "None"),
  ("/attn/q_norm/scale", "qk_norm", "'layernorm'", "None"),
  ("/mlp/norm/scale", "ffn_norm", "True", "False"),
  ("/attn/norm/scale", "attn_norm", "True", "False"),
)


def _check_options(flat_l: dict, flat_t: dict) -> None:
  """ConfigError naming the config.model field where the checkpoint's blocks and the model's differ in an option.

  SwiGLU against a two-layer MLP, LayerScale, QK-norm, sub-LayerNorms, a key bias; in the subtrees both have (an MAE
  checkpoint's decoder is not the classifier's).
  """
  tops = {k.split("/")[0] for k in flat_t} & {k.split("/")[0] for k in flat_l}
  has = lambda flat, part: any(k.endswith(part) and k.split("/")[0] in tops for k in flat)
  for part, field, on, off in OPTION_PARAMS:
    if has(flat_l, part) != has(flat_t, part):
      what = "has" if has(flat_l, part) else "has no"
      raise ConfigError(
        f"the checkpoint {what} {part.strip('/')} in its blocks, the model {'not' if what == 'has' else 'does'}: "
        f"set config.model.{field}={on if what == 'has' else off}"
      )
  if has(flat_l, "/attn/query/bias") and has(flat_t, "/attn/query/bias"):
    if has(flat_l, "/attn/key/bias") != has(flat_t, "/attn/key/bias"):
      want = has(flat_l, "/attn/key/bias")
      raise ConfigError(
        f"the checkpoint's attention has {'a' if want else 'no'} key bias, the model's {'none' if want else 'one'}: "
        f"set config.model.key_bias={want}" + ("" if want else " (EVA-02's)")
      )


def _check_registers(flat_l: dict, flat_t: dict) -> None:
  """ConfigError naming config.model.num_registers when the checkpoint has other register tokens than the model."""
  have, want = (int(np.shape(f["registers"])[1]) if "registers" in f else 0 for f in (flat_l, flat_t))
  if have != want:
    raise ConfigError(
      f"the checkpoint has {have} register tokens, the model {want}: set config.model.num_registers={have}"
      + (" (DINOv2's and timm's register ViTs also have config.model.class_posemb=False)" if have else "")
    )


def _group(key: str) -> str:
  """A parameter's subtree as left-out parameters are listed: "encoder/block_3/*", "pre_logits/*"."""
  parts = key.split("/")
  cut = next((i for i, p in enumerate(parts) if re.fullmatch(r"block_\d+|blocks", p)), 0)
  return "/".join(parts[: cut + 1]) + ("/*" if cut + 1 < len(parts) else "")


# Adapters: (key, loaded value, target value or its shape) -> (new value, one line saying what changed), or None if
# not theirs.


def extend_positions(k: str, v: np.ndarray, t: np.ndarray):
  """A learned position table [max_len, D] (the Transformer): truncated, or extended with its initialisation."""
  if k.endswith("pos_embedding") and v.ndim == 2 and v.shape[-1] == t.shape[-1]:
    new = np.concatenate([v[: t.shape[0]], np.asarray(t)[v.shape[0] :]], axis=0)
    return new, f"{k} {v.shape} -> {new.shape} (truncated, or extended with its initialisation)"
  return None


def resample_patch_positions(k: str, v: np.ndarray, t: np.ndarray):
  """A learned position embedding [1, N, D] over a square patch grid (the ViT), resampled to the target's grid.

  With or without a class token's row; as timm resamples one (posenc's "bicubic_aa": torch's antialiased bicubic).
  """
  if k.endswith("pos_embedding") and v.ndim == 3 and v.shape[-1] == t.shape[-1]:
    prefix = 1 if _is_square(v.shape[1] - 1) and not _is_square(v.shape[1]) else 0
    target_prefix = 1 if _is_square(t.shape[1] - 1) and not _is_square(t.shape[1]) else 0
    if prefix != target_prefix and _is_square(t.shape[1] - target_prefix):
      has = lambda p: "a class token's row" if p else "no class token's row"
      raise ConfigError(
        f"{k}: the checkpoint's table {v.shape} has {has(prefix)}, the model's {tuple(t.shape)} {has(target_prefix)}:"
        f" set config.model.pool_type to the checkpoint's ({'tok' if prefix else 'gap or map'}), or"
        f" config.model.class_posemb={not prefix} (rows for the class token and registers, or the patches' only)"
      )
    new = posenc.resample_posemb(v, _grid(t.shape[1] - prefix), num_prefix_tokens=prefix, method="bicubic_aa")
    return new, f"resampled {k} {v.shape} -> {new.shape}"
  return None


def grey_input(k: str, v: np.ndarray, t: np.ndarray):
  """An RGB model's first convolution [h, w, 3, D] for grey images [h, w, 1, D]: its three input channels summed.

  What the RGB model computes for a grey image given as three equal channels (timm's adapt_input_conv does the same).
  """
  if k in ("embedding/kernel", "conv_stem/conv_0/kernel") and v.ndim == 4 and v.shape[2] == 3 and t.shape[2] == 1:
    if v.shape[:2] + v.shape[3:] == tuple(t.shape[:2]) + tuple(t.shape[3:]):
      return v.sum(axis=2, keepdims=True), f"summed {k}'s 3 input channels into 1 {v.shape} -> {t.shape} (grey images)"
  return None


def bias_table_resizer(method: str, under: str = ""):
  """An adapter for relative position bias tables [(2W-1)^2, heads] under the path prefix `under`.

  Tables are [layers, ...] when scanned; square windows, resized by posenc.resize_relative_bias_table's `method`.
  """

  def fit(k: str, v: np.ndarray, t: np.ndarray):
    if (
      k.startswith(under)
      and k.endswith("relative_position_bias_table")
      and v.shape[:-2] + v.shape[-1:] == t.shape[:-2] + t.shape[-1:]
      and _odd_square(v.shape[-2])
      and _odd_square(t.shape[-2])
    ):
      old, new = (math.isqrt(v.shape[-2]) + 1) // 2, (math.isqrt(t.shape[-2]) + 1) // 2
      out = posenc.resize_relative_bias_table(v, (old, old), (new, new), method=method)
      return out, f"resized {k} {v.shape} -> {out.shape} ({method})"
    return None

  fit.__name__ = fit.__qualname__ = f"resize_bias_table_{method}"
  return fit


_SCANNED = "/blocks/block/"  # vitjax.layers.Stack's scanned parameters: [layers, ...] under STACK/blocks/block/
_LAYER = re.compile(r"^(.*)/block_(\d+)/(.*)$")  # and one subtree per layer: STACK/block_{i}/...


def _restack(flat: dict, scanned: bool, changes: list[str]) -> dict:
  """The `flat` parameters with their layer stacks in the target's form.

  Stacked along a leading axis (scanned) or one "block_{i}" subtree per layer.
  """
  out: dict = {}
  if scanned and not any(_SCANNED in k for k in flat):
    layers: dict[str, dict[int, np.ndarray]] = {}
    for k, v in flat.items():
      if m := _LAYER.match(k):
        layers.setdefault(f"{m[1]}{_SCANNED}{m[3]}", {})[int(m[2])] = np.asarray(v)
      else:
        out[k] = v
    out.update({k: np.stack([by[i] for i in sorted(by)]) for k, by in layers.items()})
    if layers:
      changes.append("stacked the checkpoint's layers for the scanned model")
  elif not scanned and any(_SCANNED in k for k in flat):
    for k, v in flat.items():
      if _SCANNED in k:
        out.update({k.replace(_SCANNED, f"/block_{i}/"): np.asarray(v)[i] for i in range(np.shape(v)[0])})
      else:
        out[k] = v
    changes.append("unstacked the checkpoint's scanned layers")
  else:
    return flat
  return out


def _is_square(n: int) -> bool:
  return n > 0 and math.isqrt(n) ** 2 == n


def _odd_square(n: int) -> bool:
  return _is_square(n) and math.isqrt(n) % 2 == 1


def _grid(n: int) -> tuple[int, int]:
  side = math.isqrt(n)
  if side * side != n:
    raise ConfigError(
      f"cannot resample position embeddings to a non-square grid of {n} tokens (a table with rows for registers: "
      "set config.model.class_posemb=False, as the checkpoint's)"
    )
  return side, side
