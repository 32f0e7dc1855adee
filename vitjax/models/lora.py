"""Low-rank adapters (LoRA): a trainable update scale * A @ B beside chosen Dense kernels, the rest frozen.

    c.lora.rank = 8                      # 0: off (the default)
    c.lora.alpha = 16.0                  # scale = alpha / rank; None: alpha = rank (scale 1)
    c.lora.targets = ("attn/(query|value)$",)   # regexes of Dense layers' paths; () = DEFAULT_TARGETS
    c.lora.dropout = 0.05                # on the adapters' inputs in training (PEFT's lora_dropout); 0: none

A matched layer W [K..., N...] gets lora_a [K..., r] (uniform in +-1/sqrt(K), as PEFT's kaiming_uniform(a=sqrt(5)))
and lora_b [r, N...] (zeros: at the start the model is the base's, bitwise), and a frozen lora_scale []. The layers
themselves (vitjax.dots) add scale * (x @ lora_a) @ lora_b: no kernel gradient is formed. Targets are searched in the
layers' paths (`encoder/block_3/attn/query`, scanned stacks `encoder/blocks/block/attn/query`); timm's and
transformers' module names work too (ALIASES: "qkv", "attn.proj", "mlp.fc1", "query", "value", ...). With adapters
and no config.frozen of its own, everything but the adapters and the classifier head is frozen (`frozen_rules`), so
the optimizer keeps state for these only. `merged` folds the adapters into their kernels (vitjax.export, and
init_from of an adapter run into a model without them). Adapter shardings follow their kernels' (`follow_kernels`).
"""

from __future__ import annotations

import dataclasses
import difflib
import re
import zlib

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from vitjax import dots
from vitjax.errors import ConfigError

# The attention projections and the feed-forward's matrices of every family (ViT, Swin, the Transformer, MAE).
DEFAULT_TARGETS = ("attn/(query|key|value|out)$", "mlp/(fc1|fc1_g|fc1_x|fc2)$")
ALIASES = {  # timm's / transformers' module names -> vitjax's layers
  "qkv": "attn/(query|key|value)$",
  "attn.qkv": "attn/(query|key|value)$",
  "proj": "attn/out$",
  "attn.proj": "attn/out$",
  "fc1": "mlp/(fc1|fc1_g|fc1_x)$",
  "mlp.fc1": "mlp/(fc1|fc1_g|fc1_x)$",
  "fc2": "mlp/fc2$",
  "mlp.fc2": "mlp/fc2$",
  "query": "attn/query$",
  "key": "attn/key$",
  "value": "attn/value$",
  "q": "attn/query$",
  "k": "attn/key$",
  "v": "attn/value$",
}
_ADAPTER_LEAF = re.compile(r"(^|/)lora_(a|b|scale|dropout)$")


@dataclasses.dataclass(frozen=True)
class Target:
  """A Dense layer that gets an adapter: its path, its kernel's stacked (scan) lead, contracted and output dims."""

  path: str
  lead: tuple
  contracted: tuple
  features: tuple


def enabled(config) -> bool:
  """Whether config.lora asks for adapters (rank > 0)."""
  spec = config.get("lora")
  return bool(spec and spec.get("rank"))


def scale(config) -> float:
  """The adapters' scale: alpha / rank (alpha None: 1)."""
  spec = config.lora
  return float(spec.alpha if spec.get("alpha") is not None else spec.rank) / spec.rank


def _regexes(targets) -> list[tuple[str, re.Pattern]]:
  out = []
  for t in targets or DEFAULT_TARGETS:
    if not isinstance(t, str):
      raise ConfigError(f"config.lora.targets: {t!r} is not a regex; give strings, e.g. ('attn/(query|value)$',)")
    try:
      out.append((t, re.compile(ALIASES.get(t, t))))
    except re.error as e:
      raise ConfigError(f"config.lora.targets: {t!r} is not a regex ({e})") from None
  return out


def plan(config, init) -> tuple[Target, ...]:
  """The layers config.lora adapts, found by tracing `init` (() -> (params, model_state)) abstractly.

  ConfigError for a rank that is not a positive int, an alpha that is not positive, a target that matches no Dense
  layer (naming the nearest), a rank larger than a matched kernel's smaller side.
  """
  spec = config.lora
  rank = spec.rank
  if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
    raise ConfigError(f"config.lora.rank={rank!r} must be a positive int (e.g. --config.lora.rank=8; 0: no adapters)")
  if spec.get("alpha") is not None and not float(spec.alpha) > 0:
    raise ConfigError(f"config.lora.alpha={spec.alpha!r} must be positive (or None: alpha = rank)")
  if not 0 <= float(spec.get("dropout") or 0.0) < 1:
    raise ConfigError(f"config.lora.dropout={spec.dropout!r} must be in [0, 1) (e.g. 0.05; 0: none)")
  regexes = _regexes(spec.targets)
  layers = {}

  def record(next_fun, args, kwargs, context):
    out = next_fun(*args, **kwargs)
    m = context.module
    if context.method_name == "__call__" and isinstance(m, (dots.Dense, dots.DenseGeneral)):
      x, kernel = args[0], m.get_variable("params", "kernel")
      n = 1 if isinstance(m, dots.Dense) else len(np.atleast_1d(m.axis))
      trailing = isinstance(m, dots.Dense) or (
        not m.batch_dims and sorted(a % x.ndim for a in np.atleast_1d(m.axis)) == list(range(x.ndim - n, x.ndim))
      )
      layers["/".join(m.path)] = (tuple(kernel.shape[:n]), tuple(kernel.shape[n:]), trailing)
    return out

  with nn.intercept_methods(record):
    params, _ = jax.eval_shape(lambda: init())  # a new function: a cached trace would skip `record`
  shapes = {"/".join(k): v.shape for k, v in flax.traverse_util.flatten_dict(params).items()}
  chosen = {}
  for text, regex in regexes:
    hits = [p for p in layers if regex.search(p)]
    if not hits:
      near = difflib.get_close_matches(text, list(layers), n=3, cutoff=0.0)
      raise ConfigError(
        f"config.lora.targets: {text!r} matches no Dense layer of {config.model.name}; its layers are named like "
        f"{', '.join(near)} (regexes are searched in these paths)"
      )
    chosen.update(dict.fromkeys(hits))
  out = []
  for path in chosen:
    k, n, trailing = layers[path]
    if not trailing:
      raise ConfigError(f"config.lora.targets: {path} contracts other than its input's last dims; leave it out")
    if rank > min(int(np.prod(k)), int(np.prod(n))):
      raise ConfigError(
        f"config.lora.rank={rank} is larger than {path}'s kernel {k + n} allows (at most "
        f"{min(int(np.prod(k)), int(np.prod(n)))}); use a smaller rank or leave the layer out of the targets"
      )
    lead = tuple(shapes[path + "/kernel"][: len(shapes[path + "/kernel"]) - len(k) - len(n)])
    out.append(Target(path, lead, k, n))
  return tuple(out)


def add(params, targets: tuple[Target, ...], rank: int, scale_: float, seed: int, dropout: float = 0.0):
  """The parameters with each target's adapter beside its kernel: lora_a uniform in +-1/sqrt(K), lora_b zero, lora_scale.

  With dropout > 0, also lora_dropout (its rate, frozen: vitjax.dots.adapted drops the adapter's inputs in training).

  Each adapter's draw depends on the seed and its path only (not on the devices or the other targets).
  """
  params = flax.core.unfreeze(params)
  for t in targets:
    node = params
    for name in t.path.split("/"):
      node = node[name]
    key = jax.random.fold_in(jax.random.key(seed), zlib.crc32(t.path.encode()))
    bound = 1.0 / np.sqrt(np.prod(t.contracted))
    node["lora_a"] = jax.random.uniform(key, t.lead + t.contracted + (rank,), jnp.float32, -bound, bound)
    node["lora_b"] = jnp.zeros(t.lead + (rank,) + t.features, jnp.float32)
    node["lora_scale"] = jnp.full(t.lead, scale_, jnp.float32)
    if dropout:
      node["lora_dropout"] = jnp.full(t.lead, dropout, jnp.float32)
  return params


def frozen_rules(config) -> tuple:
  """config.frozen, and with adapters: their scale always; without a config.frozen of its own, all but them and head/."""
  rules = tuple(config.frozen or ())
  if not enabled(config):
    return rules
  return (rules or (r"^(?!head(_dist)?/)(?!(.*/)?lora_[ab]$).*",)) + (r"(^|/)lora_(scale|dropout)$",)


def follow_kernels(shardings, params):
  """Adapter shardings taken from their kernels': lora_a like its contracted dims, lora_b like its output dims.

  Tensor parallelism's splits are the kernel's (x @ A and h @ B then need no collective of their own); FSDP's split
  (ZeRO-3: memory only) is each adapter's own, on its largest dimension the axis divides, where the generic rule
  split it at all (vitjax.mesh.param_shardings: not tiny ones). shardings: NamedSharding per parameter, laid out as
  `params` (arrays or ShapeDtypeStructs).
  """
  flat = flax.traverse_util.flatten_dict(flax.core.unfreeze(shardings), sep="/")
  shapes = {k: v.shape for k, v in flax.traverse_util.flatten_dict(flax.core.unfreeze(params), sep="/").items()}
  for name in [k for k in flat if k.endswith("/lora_a") or k == "lora_a"]:
    base = name[: -len("lora_a")]
    kernel, a, b = shapes[base + "kernel"], shapes[name], shapes[base + "lora_b"]
    lead = len(a) + len(b) - len(kernel) - 2
    nk = len(a) - lead - 1
    ks = flat[base + "kernel"]
    spec = tuple(None if s == "fsdp" else s for s in tuple(ks.spec) + (None,) * (len(kernel) - len(ks.spec)))
    for path, axes in ((name, (*spec[: lead + nk], None)), (base + "lora_b", (*spec[:lead], None, *spec[lead + nk :]))):
      flat[path] = NamedSharding(ks.mesh, P(*_with_fsdp(axes, shapes[path], flat[path], ks.mesh)))
  return flax.traverse_util.unflatten_dict(flat, sep="/")


def _with_fsdp(axes: tuple, shape: tuple, generic: NamedSharding, mesh) -> tuple:
  """`axes` with "fsdp" on the largest free dimension it divides, where the generic sharding used fsdp at all."""
  if "fsdp" not in jax.tree.leaves(tuple(generic.spec)):
    return axes
  size = dict(mesh.shape).get("fsdp", 1)
  free = [i for i, ax in enumerate(axes) if ax is None and shape[i] % size == 0]
  if not free:
    return axes
  i = max(free, key=lambda j: (shape[j], -j))
  return (*axes[:i], "fsdp", *axes[i + 1 :])


def merged(params):
  """The parameters with every adapter folded into its kernel (kernel + scale * A @ B, in float32) and the adapter left out."""

  def visit(node):
    if not isinstance(node, dict):
      return node
    node = {k: visit(v) for k, v in node.items()}
    if "lora_a" in node:
      node.pop("lora_dropout", None)  # (training's alone)
      a, b, s, kernel = (np.asarray(node.pop(n), np.float32) for n in ("lora_a", "lora_b", "lora_scale", "kernel"))
      lead = a.ndim + b.ndim - kernel.ndim - 2
      rows = int(np.prod(a.shape[lead:-1]))
      la, lb = a.reshape((-1, rows, a.shape[-1])), b.reshape((-1, b.shape[lead], int(np.prod(b.shape[lead + 1 :]))))
      delta = np.einsum("lkr,lrn->lkn", la, lb) * s.reshape((-1, 1, 1))
      node["kernel"] = (kernel + delta.reshape(kernel.shape)).astype(kernel.dtype)
    return node

  return visit(flax.core.unfreeze(params))


def is_adapter(path: str) -> bool:
  """Whether a parameter path ('encoder/block_0/attn/query/lora_a') is an adapter's."""
  return bool(_ADAPTER_LEAF.search(path))


def has_adapters(params) -> bool:
  """Whether any parameter is an adapter's."""
  return any(_ADAPTER_LEAF.search("/".join(k)) for k in flax.traverse_util.flatten_dict(flax.core.unfreeze(params)))
