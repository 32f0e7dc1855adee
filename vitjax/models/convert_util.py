"""What the weight converters beside each model family share (`vitjax/models/*_timm.py`, `vit_npz.py`).

A reader that remembers which source keys were used, the flax <-> torch layouts of linear, norm, convolution, attention
and MLP parameters, and the shape check every importer ends with.
"""

from __future__ import annotations

import importlib
import math
import re
from collections.abc import Mapping
from typing import Any

import flax
import jax
import jax.numpy as jnp
import numpy as np
from absl import logging

from vitjax.models import adapt, registry

TIMM_BUFFERS = re.compile(r"(relative_position_index|attn_mask)$")


class Reader:
  """Reads a flat mapping of numpy arrays and remembers which keys were used."""

  def __init__(self, mapping: Mapping[str, Any]):
    self.arrays = {k: np.asarray(to_numpy(v), np.float32) for k, v in mapping.items()}
    self.used: set[str] = set()

  def __contains__(self, key):
    return key in self.arrays

  def __call__(self, key: str) -> np.ndarray:
    """The array under `key` (float32), marked as used.

    Raises:
      KeyError: the checkpoint has no such key.
    """
    if key not in self.arrays:
      raise KeyError(f"checkpoint has no {key!r}; is it the right model family?")
    self.used.add(key)
    return self.arrays[key]

  def unused(self, ignore: re.Pattern | None = None) -> list[str]:
    """The keys not read yet, sorted, without those `ignore` matches (re.search)."""
    return sorted(k for k in self.arrays if k not in self.used and not (ignore and ignore.search(k)))

  def check_all_used(self, what: str, ignore: re.Pattern | None = None) -> None:
    """A key the conversion did not read is an error, so an unsupported variant never loads half-converted."""
    unused = self.unused(ignore)
    if unused:
      raise ValueError(
        f"{what}: the checkpoint has parameters this conversion does not know: "
        f"{unused[:8]}{' ...' if len(unused) > 8 else ''}"
      )


def to_numpy(v):
  """A torch tensor as a float32 numpy array (detached, on the CPU); anything else as it is."""
  if hasattr(v, "detach"):  # a torch tensor
    return v.detach().cpu().float().numpy()
  return v


def nest(flat: dict[str, np.ndarray]) -> dict:
  """Flat {"a/b/kernel": array} -> the nested parameter dict {"a": {"b": {"kernel": array}}}."""
  return flax.traverse_util.unflatten_dict({tuple(k.split("/")): v for k, v in flat.items()})


def flat_params(params) -> dict[str, np.ndarray]:
  """A parameter tree (on devices or not) -> {"a/b/kernel": float32 numpy array}."""
  flat = flax.traverse_util.flatten_dict(flax.core.unfreeze(params), sep="/")
  return {k: np.asarray(jax.device_get(v), np.float32) for k, v in flat.items()}


def is_square(n: int) -> bool:
  """Whether `n` is a positive perfect square (a token count that can be a square patch grid)."""
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


def finish(module, flat: dict[str, np.ndarray], image_hw: tuple[int, int]):
  """The importer's result from converted flat parameters, after check_shapes.

  Args:
    module: the model the parameters are for.
    flat: {"a/b/kernel": array} in flax names, holding "resnet/conv_root/kernel" (a hybrid's), "embedding/kernel"
      or "patch_embed/kernel": the first one's third dimension gives the input channels.
    image_hw: the image size (H, W) the shapes are checked at.

  Returns:
    tuple: (module, {"params": the nested parameters as jax arrays}).

  Raises:
    ValueError: a parameter's shape differs from the model's, or one is missing or extra.
  """
  params = nest(flat)
  check_shapes(module, params, (1, *image_hw, input_channels(flat)))
  return module, {"params": jax.tree.map(jnp.asarray, params)}


FIRST_LAYERS = ("resnet/conv_root/kernel", "embedding/kernel", "patch_embed/kernel")  # the first the image meets


def input_channels(flat: dict[str, np.ndarray]) -> int:
  """The image channels an image model's flat parameters take: the first layer's kernel's third dimension."""
  found = [flat[k].shape[2] for k in FIRST_LAYERS if k in flat]
  if not found:
    raise ValueError(f"no first layer ({', '.join(FIRST_LAYERS)}) among the parameters: not an image model's")
  return found[0]


def at_image_size(module, flat: dict[str, np.ndarray], image_hw: tuple[int, int]) -> dict[str, np.ndarray]:
  """Flat parameters fitted to `module` at images of image_hw, as config.init_from fits them (vitjax.models.adapt).

  A learned position table is resampled to the new patch grid, relative position bias tables resized to the new
  windows; each change is logged as a warning, since the model's outputs are then no longer the same. Parameters
  that fit are returned as they are. ValueError for a size the model cannot take or parameters no adapter fits.
  """
  if not any(k in flat for k in FIRST_LAYERS):  # a stem no format writes (the writer names it)
    return flat
  target = jax.eval_shape(lambda: module.init(jax.random.key(0), jnp.zeros((1, *image_hw, input_channels(flat)))))
  fitted, changes = adapt.adapt_params(nest(flat), target["params"], module)
  for change in changes:
    logging.warning("at image size %s: %s", tuple(image_hw), change)
  return flat_params(fitted)


def unwrap(state_dict: Mapping[str, Any]) -> Mapping[str, Any]:
  """A training checkpoint {'model': sd, 'optimizer': ...} (Microsoft's Swin) or {'state_dict': sd} -> sd."""
  for key in ("model", "state_dict", "model_ema"):
    if isinstance(state_dict.get(key), Mapping):
      return state_dict[key]
  return state_dict


def layout_modules() -> list:
  """Every registered family's converter modules, each with LAYOUTS {id: description} and detect(keys)."""
  names = dict.fromkeys(m for f in registry.FAMILIES for m in f.formats.values())
  return [importlib.import_module(m) for m in names]


def detect_layout(state_dict: Mapping[str, Any]) -> str | None:
  """The layout id of a state dict ("timm-vit", "timm-swin", "swin-official", "vit-npz", ...), None if unknown."""
  keys = set(unwrap(state_dict))
  return next((layout for m in layout_modules() if (layout := m.detect(keys))), None)


def unknown_layout(state_dict: Mapping[str, Any], what: str) -> ValueError:
  """The ValueError for a state dict no registered converter knows: `what`, its first keys, the known layouts."""
  first = sorted(unwrap(state_dict))[:4]
  known = "; ".join(d for m in layout_modules() for d in m.LAYOUTS.values())
  return ValueError(
    f"{what}: weights of another model family or an unknown layout (first keys {first}); known: {known}"
  )


def linear(r: Reader, src: str, dst: str, out: dict, bias: bool = True) -> None:
  """A torch Linear SRC.weight [D_out, D_in] (and SRC.bias) -> out["DST/kernel"] [D_in, D_out] (and out["DST/bias"])."""
  out[f"{dst}/kernel"] = r(f"{src}.weight").T
  if bias:
    out[f"{dst}/bias"] = r(f"{src}.bias")


def norm(r: Reader, src: str, dst: str, out: dict) -> None:
  """A torch LayerNorm SRC.weight, SRC.bias -> out["DST/scale"], out["DST/bias"]."""
  out[f"{dst}/scale"], out[f"{dst}/bias"] = r(f"{src}.weight"), r(f"{src}.bias")


def conv(r: Reader, src: str, dst: str, out: dict) -> None:
  """A torch Conv2d SRC.weight [O, I, H, W] and SRC.bias -> out["DST/kernel"] [H, W, I, O] and out["DST/bias"]."""
  out[f"{dst}/kernel"] = r(f"{src}.weight").transpose(2, 3, 1, 0)  # OIHW -> HWIO
  out[f"{dst}/bias"] = r(f"{src}.bias")


def split_heads(w: np.ndarray, heads: int) -> np.ndarray:
  """A torch Linear weight [D_out, D_in] -> flax DenseGeneral kernel [D_in, H, D_out / H]."""
  return w.T.reshape(w.shape[1], heads, w.shape[0] // heads)


def timm_attention(r: Reader, src: str, dst: str, heads: int, out: dict) -> None:
  """The fused qkv [3D, D] and proj [D, D] of timm's attention -> query/key/value [D, H, K] and out [H, K, D]."""
  w, b = r(f"{src}.qkv.weight"), r(f"{src}.qkv.bias") if f"{src}.qkv.bias" in r else None
  d = w.shape[1]
  for i, name in enumerate(("query", "key", "value")):
    out[f"{dst}/{name}/kernel"] = split_heads(w[i * d : (i + 1) * d], heads)
    if b is not None:
      out[f"{dst}/{name}/bias"] = b[i * d : (i + 1) * d].reshape(heads, d // heads)
  out[f"{dst}/out/kernel"] = r(f"{src}.proj.weight").T.reshape(heads, d // heads, d)
  out[f"{dst}/out/bias"] = r(f"{src}.proj.bias")


def separate_attention(r: Reader, src: dict[str, str], dst: str, heads: int, out: dict) -> None:
  """Separate query, key, value and output linears -> query/key/value [D, H, K] and out [H, K, D].

  src: {"query": KEY_PREFIX, "key": ..., "value": ..., "out": ...}, torch [D, D] each, as transformers keeps them.
  """
  for name in ("query", "key", "value"):
    out[f"{dst}/{name}/kernel"] = split_heads(r(f"{src[name]}.weight"), heads)
    if f"{src[name]}.bias" in r:
      out[f"{dst}/{name}/bias"] = r(f"{src[name]}.bias").reshape(heads, -1)
  w = r(f"{src['out']}.weight")
  out[f"{dst}/out/kernel"] = w.T.reshape(heads, w.shape[1] // heads, w.shape[0])
  out[f"{dst}/out/bias"] = r(f"{src['out']}.bias")


def rename_keys(state_dict: Mapping[str, Any], rules: tuple[tuple[str, str], ...]) -> dict[str, Any]:
  """The state dict with each key rewritten by the first (regex, replacement) rule that matches it (re.sub).

  Other keys stay unchanged. How a converter reads several namings of one layout.
  """
  out = {}
  for k, v in state_dict.items():
    for pattern, repl in rules:
      new, n = re.subn(pattern, repl, k)
      if n:
        k = new
        break
    out[k] = v
  return out


def timm_mlp(r: Reader, src: str, dst: str, out: dict) -> None:
  """A timm Mlp (SRC.fc1, SRC.fc2 Linears) -> out["DST/fc1/..."], out["DST/fc2/..."] (see `linear`)."""
  linear(r, f"{src}.fc1", f"{dst}/fc1", out)
  linear(r, f"{src}.fc2", f"{dst}/fc2", out)


def packed_swiglu(r: Reader, fc1: str, fc2: str, dst: str, out: dict) -> None:
  """A packed gated feed-forward -> vitjax.layers.FeedForward(gated=True)'s fc1_g, fc1_x and fc2 (see `linear`).

  Its fc1 [2H, D] holds the gate's rows first (timm's SwiGLUPacked GluMlp, transformers' DINOv2 weights_in); fc2 [D, H].
  """
  w, b = r(f"{fc1}.weight"), r(f"{fc1}.bias")
  h = w.shape[0] // 2
  out[f"{dst}/fc1_g/kernel"], out[f"{dst}/fc1_g/bias"] = w[:h].T, b[:h]
  out[f"{dst}/fc1_x/kernel"], out[f"{dst}/fc1_x/bias"] = w[h:].T, b[h:]
  linear(r, fc2, f"{dst}/fc2", out)


def copy_tree(r: Reader, src: str, dst: str, out: dict, subs=(None,), new_subs=None) -> None:
  """Copies every parameter under src/SUB to dst/NEW_SUB (flax names on both sides: kernel, bias, scale)."""
  for sub, new in zip(subs, new_subs or subs):
    s, d = f"{src}/{sub}" if sub else src, f"{dst}/{new}" if new else dst
    keys = [k for k in r.arrays if k.startswith(s + "/") and "/" not in k[len(s) + 1 :]]
    if not keys:
      raise KeyError(f"checkpoint has no {s}/*; is it the right model family?")
    for k in keys:
      out[f"{d}/{k[len(s) + 1 :]}"] = r(k)


def unsupported(module, what: str, **allowed) -> None:
  """ValueError naming every attribute of `module` whose value is not among those `allowed` for the format."""
  bad = {k: getattr(module, k) for k, ok in allowed.items() if getattr(module, k) not in ok}
  if bad:
    raise ValueError(f"{what} has no equivalent for " + ", ".join(f"{k}={v!r}" for k, v in bad.items()))


def put_linear(p: dict, src: str, dst: str, out: dict) -> None:
  """`linear`'s inverse: p["SRC/kernel"] [D_in, D_out] -> out["DST.weight"] [D_out, D_in].

  p["SRC/bias"], if present, becomes out["DST.bias"].
  """
  out[f"{dst}.weight"] = p[f"{src}/kernel"].T
  if f"{src}/bias" in p:
    out[f"{dst}.bias"] = p[f"{src}/bias"]


def put_norm(p: dict, src: str, dst: str, out: dict) -> None:
  """`norm`'s inverse: p["SRC/scale"], p["SRC/bias"] -> out["DST.weight"], out["DST.bias"]."""
  out[f"{dst}.weight"], out[f"{dst}.bias"] = p[f"{src}/scale"], p[f"{src}/bias"]


def merge_heads(kernel: np.ndarray) -> np.ndarray:
  """A flax kernel [D_in, H, K] -> torch Linear weight [H*K, D_in] (inverse of split_heads)."""
  return kernel.reshape(kernel.shape[0], -1).T


def put_attention(p: dict, src: str, dst: str, out: dict) -> None:
  """`timm_attention`'s inverse: flax attention parameters under SRC -> timm's fused qkv and proj under DST.

  query/key/value kernels [D, H, K] (and biases [H, K]) become DST.qkv.weight [3D, D] (and DST.qkv.bias [3D]); the
  out kernel [H, K, D] and bias become DST.proj.weight [D, D] and DST.proj.bias.
  """
  out[f"{dst}.qkv.weight"] = np.concatenate([merge_heads(p[f"{src}/{n}/kernel"]) for n in ("query", "key", "value")])
  if f"{src}/query/bias" in p:  # a model without a key bias (key_bias=False) has a zero one here
    bias = lambda n: p.get(f"{src}/{n}/bias", np.zeros_like(p[f"{src}/query/bias"])).reshape(-1)
    out[f"{dst}.qkv.bias"] = np.concatenate([bias(n) for n in ("query", "key", "value")])
  w = p[f"{src}/out/kernel"]
  out[f"{dst}.proj.weight"] = w.reshape(-1, w.shape[-1]).T
  out[f"{dst}.proj.bias"] = p[f"{src}/out/bias"]


def put_mlp(p: dict, src: str, dst: str, out: dict) -> None:
  """`timm_mlp`'s inverse: SRC/fc1 and SRC/fc2 -> DST.fc1 and DST.fc2 (see `put_linear`)."""
  put_linear(p, f"{src}/fc1", f"{dst}.fc1", out)
  put_linear(p, f"{src}/fc2", f"{dst}.fc2", out)
