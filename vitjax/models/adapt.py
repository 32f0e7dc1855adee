"""Fitting loaded parameters to a model of other shapes, for fine-tuning (`config.init_from`).

It knows the parameter names of vitjax's models: the classifier `head/...`, learned position embeddings
`.../pos_embedding` ([1, N, D] for the ViT, [max_len, D] for the Transformer) and relative position bias tables
`.../relative_position_bias_table` ([(2W-1)^2, heads]; [layers, ...] when scanned): Swin's windows and the ViT's
patch grid (rel_pos_bias), both assumed square here.
"""

from __future__ import annotations

import math
import re

import flax
import numpy as np

from vitjax import posenc
from vitjax.errors import ConfigError


def adapt_params(loaded, target) -> tuple[dict, list[str]]:
  """(parameters of the target's shapes, one line per change) from loaded parameters.

  The classifier head is replaced (kept at the target's initialisation) when the number of classes differs or
  the checkpoint has none; learned position embeddings are resampled (ViT) or truncated / extended (Transformer),
  relative-position bias tables resized, to a new resolution or window; a stack scanned over layers on one side
  and not on the other is restacked. Anything else that differs raises a ConfigError listing every mismatch.
  """
  flat_l = flax.traverse_util.flatten_dict(flax.core.unfreeze(loaded), sep="/")
  flat_t = flax.traverse_util.flatten_dict(flax.core.unfreeze(target), sep="/")
  out, problems, changes = {}, [], []
  flat_l = _restack(flat_l, scanned=any(_SCANNED in k for k in flat_t), changes=changes)
  for k, t in flat_t.items():
    if k not in flat_l:
      if k.startswith("head/"):
        changes.append(f"{k} not in the checkpoint; keeping its initialisation")
        out[k] = t
        continue
      problems.append(f"  {k}: missing from the checkpoint (model {t.shape})")
      continue
    v = np.asarray(flat_l[k])
    if v.shape == t.shape:
      out[k] = v
    elif k.startswith("head/"):
      changes.append(f"new head {k} {v.shape} -> {t.shape}")
      out[k] = t
    elif k.endswith("pos_embedding") and v.ndim == 2 and v.shape[-1] == t.shape[-1]:  # [max_len, D]
      out[k] = np.concatenate([v[: t.shape[0]], np.asarray(t)[v.shape[0] :]], axis=0)
      changes.append(f"{k} {v.shape} -> {out[k].shape} (truncated, or extended with its initialisation)")
    elif k.endswith("pos_embedding") and v.ndim == 3 and v.shape[-1] == t.shape[-1]:
      prefix = 1 if _is_square(v.shape[1] - 1) and not _is_square(v.shape[1]) else 0
      out[k] = posenc.resample_posemb(v, _grid(t.shape[1] - prefix), num_prefix_tokens=prefix)
      changes.append(f"resampled {k} {v.shape} -> {out[k].shape}")
    elif (
      k.endswith("relative_position_bias_table")
      and v.shape[:-2] + v.shape[-1:] == t.shape[:-2] + t.shape[-1:]
      and _odd_square(v.shape[-2])
      and _odd_square(t.shape[-2])
    ):
      old, new = (math.isqrt(v.shape[-2]) + 1) // 2, (math.isqrt(t.shape[-2]) + 1) // 2
      # A ViT's patch offset keeps its meaning at another resolution: shared offsets keep their bias ("clip").
      # Swin's window is resampled (bicubic), as the reference implementation does.
      method = "clip" if k.startswith("encoder/") else "bicubic"
      out[k] = posenc.resize_relative_bias_table(v, (old, old), (new, new), method=method)
      changes.append(f"resized {k} {v.shape} -> {out[k].shape} ({method})")
    else:
      problems.append(f"  {k}: model {t.shape}, checkpoint {v.shape}")
  if problems:
    more = f"; and {len(problems) - 20} more" if len(problems) > 20 else ""
    raise ConfigError(
      "the checkpoint's parameters do not match the model (check config.model): "
      + "; ".join(p.strip() for p in problems[:20])
      + more
    )
  return flax.traverse_util.unflatten_dict({tuple(k.split("/")): v for k, v in out.items()}), changes


_SCANNED = "/blocks/block/"  # vitjax.layers.Stack's scanned parameters: [layers, ...] under STACK/blocks/block/
_LAYER = re.compile(r"^(.*)/block_(\d+)/(.*)$")  # and one subtree per layer: STACK/block_{i}/...


def _restack(flat: dict, scanned: bool, changes: list[str]) -> dict:
  """flat parameters with their layer stacks in the target's form: stacked along a leading axis (scanned) or one
  "block_{i}" subtree per layer."""
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
    raise ConfigError(f"cannot resample position embeddings to a non-square grid of {n} tokens")
  return side, side
