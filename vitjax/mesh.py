"""Devices and shardings: the named mesh, parameter specs (presets or rules), optimizer-state specs, global batches.

The mesh has three named axes, outermost to innermost: `data` (data parallel), `fsdp` (data parallel with
parameters and optimizer state sharded, ZeRO-3 style) and `tensor` (Megatron-style model parallel). The devices
are laid out with the innermost axis fastest, so `tensor` (and then `fsdp`) stays inside a host, on its fast
links (NVLink, ICI), and `data` spans hosts. `config.mesh` gives (axis, size) pairs; one size may be -1 (the rest
of the devices); an axis not named has size 1. The global batch is split over `data` x `fsdp`.

Parameter shardings (`config.sharding`, a preset; `config.sharding_rules`, (regex, spec) rules on 'a/b/kernel'
paths that take precedence over it)::

    dp       every parameter replicated
    fsdp     every parameter of at least FSDP_MIN_SIZE elements sharded over `fsdp` on its largest dimension
             that the axis divides (none: replicated); smaller ones replicated
    tp       the model family's tensor-parallel rules (vitjax.models.registry; vitjax.layers.TP_RULES for the
             blocks every family shares: attention heads and the MLP hidden dimension, column-parallel in,
             row-parallel out; ViT and Swin add their relative position bias tables) split over `tensor`; a
             dimension the axis does not divide stays replicated
    fsdp_tp  tp, then fsdp on each parameter's largest remaining dimension

Optimizer state
follows its parameter exactly, by tree position (a moment of `query/kernel` gets `query/kernel`'s spec, whatever
other parameter shares its shape). Nothing here knows which task runs.
"""

from __future__ import annotations

import dataclasses
import os
import re
from typing import Any

import jax
import numpy as np
import optax
from absl import logging
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from vitjax.errors import ConfigError

AXES = ("data", "fsdp", "tensor")
BATCH_AXES = ("data", "fsdp")
PRESETS = ("dp", "fsdp", "tp", "fsdp_tp")
FSDP_MIN_SIZE = 1024  # elements: smaller parameters (biases, norms) stay replicated under fsdp


DEFAULT = (("data", -1),)  # every device on the data axis: plain data parallelism


def mesh_sizes(mesh=DEFAULT, num_devices: int | None = None) -> dict[str, int]:
  """{'data': D, 'fsdp': F, 'tensor': T} from config.mesh's (axis, size) pairs; ConfigError if they do not fit."""
  n = num_devices or jax.device_count()
  sizes, rest = {}, None
  example = "e.g. --config.mesh=\"(('data', -1), ('tensor', 2))\""
  for pair in mesh:
    if not (isinstance(pair, list | tuple) and len(pair) == 2 and isinstance(pair[1], int)):
      raise ConfigError(f"config.mesh: {pair!r} is not an (axis, size) pair; {example}")
    axis, size = pair
    if axis not in AXES:
      raise ConfigError(f"config.mesh: unknown axis {axis!r}; the axes are {', '.join(AXES)}")
    if axis in sizes or axis == rest:
      raise ConfigError(f"config.mesh: axis {axis!r} is given twice")
    if size == -1:
      if rest is not None:
        raise ConfigError(f"config.mesh: only one size may be -1 (the rest of the devices); {example}")
      rest = axis
    elif size < 1:
      raise ConfigError(f"config.mesh: {axis} size {size} must be at least 1 (or -1: the rest of the devices)")
    else:
      sizes[axis] = size
  fixed = int(np.prod(list(sizes.values()), dtype=np.int64))
  if rest is not None:
    if n % fixed:
      raise ConfigError(f"config.mesh: the {n} devices do not divide into {sizes} times the rest; {example}")
    sizes[rest] = n // fixed
  elif fixed != n:
    raise ConfigError(f"config.mesh {tuple(map(tuple, mesh))} uses {fixed} devices but there are {n}; {example}")
  return {a: sizes.get(a, 1) for a in AXES}


@dataclasses.dataclass(frozen=True)
class Layout:
  """config.mesh resolved once, over this run's devices: the size of each axis.

  The trainer builds it before anything else and hands it down (the task splits its batches by it, setup() builds the
  Mesh from it).
  """

  data: int = 1
  fsdp: int = 1
  tensor: int = 1

  @classmethod
  def of(cls, config) -> Layout:
    """The layout of config.mesh (DEFAULT if the config has none).

    ConfigError if it does not fit the devices, or (on several processes) if the tensor axis would leave a process.
    """
    layout = cls(**mesh_sizes(config.get("mesh", DEFAULT)))
    local = jax.local_device_count()
    if jax.process_count() > 1 and local % layout.tensor:
      raise ConfigError(
        f"config.mesh: tensor={layout.tensor} does not divide the {local} devices of each process; tensor "
        "parallelism stays inside a host (give tensor a size that divides the devices per host)"
      )
    return layout

  @property
  def batch_shards(self) -> int:
    """How many ways the global batch is split: data x fsdp."""
    return self.data * self.fsdp

  def mesh(self) -> Mesh:
    """The named Mesh over all devices of all processes (see the module docstring)."""
    # Auto axes: XLA propagates shardings from the inputs' and parameters' (jax's newer default is Explicit).
    auto = (jax.sharding.AxisType.Auto,) * len(AXES)
    return jax.make_mesh((self.data, self.fsdp, self.tensor), AXES, axis_types=auto)


def batch_sharding(mesh: Mesh) -> NamedSharding:
  """Leading (batch) dimension split over data x fsdp, the rest replicated."""
  return NamedSharding(mesh, P(BATCH_AXES))


def path_name(path) -> str:
  """'params/encoder/block_0/attn/query/kernel' for a tree path (attributes, dict keys and indices alike)."""
  return "/".join(str(getattr(k, "name", getattr(k, "key", getattr(k, "idx", k)))) for k in path)


def _axis_size(mesh_shape, axes) -> int:
  axes = axes if isinstance(axes, tuple | list) else (axes,)
  return int(np.prod([mesh_shape[a] for a in axes if a is not None]))


def _check_rules(rules) -> list:
  compiled = []
  for rule in rules:
    try:
      regex, spec = rule
      if isinstance(spec, str):  # ("kernel$", "tensor") would read as the axes 't', 'e', ...
        raise ValueError(
          f"its spec {spec!r} is one str: give a tuple of axes, one per dimension, e.g. (None, {spec!r})"
        )
      compiled.append((re.compile(regex), tuple(spec)))
    except (TypeError, ValueError, re.error) as e:
      raise ConfigError(f"config.sharding_rules: {rule!r} is not a (regex, spec) rule ({e})") from None
    for a in compiled[-1][1]:
      for name in a if isinstance(a, tuple | list) else (a,):
        if name is not None and name not in AXES:
          raise ConfigError(f"config.sharding_rules: {rule!r} names the axis {name!r}; the axes are {AXES}")
  return compiled


def param_specs(
  params, mesh_shape: dict, sharding: str = "dp", rules=(), min_size: int = FSDP_MIN_SIZE, tp_rules=()
) -> Any:
  """PartitionSpec per parameter: the first matching rule, else the preset (see the module docstring).

  tp_rules: the model family's tensor-parallel rules, for the 'tp' presets (vitjax.models.registry.tp_rules(model)).
  """
  if sharding not in PRESETS:
    raise ConfigError(f"config.sharding={sharding!r}: use one of {', '.join(PRESETS)} (see vitjax.mesh)")
  rules, tp = _check_rules(rules), _check_rules(tp_rules)
  left_whole = []

  def spec(path, leaf):
    name, shape = path_name(path), tuple(leaf.shape)
    for regex, axes in rules:  # the user's: exactly as written, or an error that says why not
      if regex.search(name):
        if len(axes) > len(shape):
          raise ConfigError(f"config.sharding_rules: {regex.pattern!r} gives {len(axes)} axes to {name} {shape}")
        for dim, a in zip(shape, axes):
          if a is not None and dim % _axis_size(mesh_shape, a):
            raise ConfigError(
              f"config.sharding_rules: {name} {shape}: dimension {dim} does not split over {a} "
              f"(size {_axis_size(mesh_shape, a)}); change the rule or config.mesh"
            )
        return P(*axes)
    axes = [None] * len(shape)
    if sharding in ("tp", "fsdp_tp") and mesh_shape["tensor"] > 1:
      for regex, tp_axes in tp:
        if regex.search(name) and len(shape) >= len(tp_axes):  # aligned right: scan adds a leading layer axis
          i = len(shape) - len(tp_axes) + tp_axes.index("tensor")
          if shape[i] % mesh_shape["tensor"] == 0:
            axes[i] = "tensor"
          else:
            left_whole.append(f"{name} {shape}")
          break
    if sharding in ("fsdp", "fsdp_tp") and mesh_shape["fsdp"] > 1 and int(np.prod(shape)) >= min_size:
      free = [i for i, a in enumerate(axes) if a is None and shape[i] % mesh_shape["fsdp"] == 0]
      if free:
        axes[max(free, key=lambda i: (shape[i], -i))] = "fsdp"
      elif not any(axes):
        left_whole.append(f"{name} {shape}")
    while axes and axes[-1] is None:
      axes.pop()
    return P(*axes)

  specs = jax.tree_util.tree_map_with_path(spec, params)
  if left_whole:
    logging.info(
      "sharding=%s: %d parameters have no dimension the mesh %s divides and stay replicated: %s",
      sharding,
      len(left_whole),
      mesh_shape,
      ", ".join(left_whole[:5]) + (" ..." if len(left_whole) > 5 else ""),
    )
  return specs


def param_shardings(mesh: Mesh, params, sharding: str = "dp", rules=(), tp_rules=()) -> Any:
  """NamedSharding per parameter (see param_specs)."""
  specs = param_specs(params, dict(mesh.shape), sharding, rules, tp_rules=tp_rules)
  return jax.tree.map(lambda s: NamedSharding(mesh, s), specs, is_leaf=lambda x: isinstance(x, P))


def describe(mesh: Mesh, params, shardings) -> str:
  """One line for the log: the mesh's axes and what the parameter layout leaves a device to hold.

  `params`: ShapeDtypeStructs (or arrays); `shardings`: a NamedSharding per parameter (param_shardings).
  E.g. "mesh fsdp=8: 12 of 40 parameter arrays split, a device holds 0.06 of 0.54 MiB of parameters (11%)".
  """
  sizes = {a: n for a, n in mesh.shape.items() if n > 1} or {"data": 1}
  text = "mesh " + " ".join(f"{a}={n}" for a, n in sizes.items())
  leaves, shards = jax.tree.leaves(params), jax.tree.leaves(shardings, is_leaf=lambda x: isinstance(x, NamedSharding))
  whole = held = 0
  split = 0
  for leaf, sharding in zip(leaves, shards, strict=True):
    item = np.dtype(leaf.dtype).itemsize
    whole += int(np.prod(leaf.shape)) * item
    shard = sharding.shard_shape(leaf.shape)
    held += int(np.prod(shard)) * item
    split += tuple(shard) != tuple(leaf.shape)
  if not split:
    return f"{text}: parameters replicated ({whole / 2**20:.3g} MiB on each device)"
  return (
    f"{text}: {split} of {len(leaves)} parameter arrays split, a device holds {held / 2**20:.3g} of "
    f"{whole / 2**20:.3g} MiB of parameters ({held / whole:.0%}), and that share of their optimizer state"
  )


def device_memory() -> int:
  """Bytes one local device can hold: an accelerator's own limit (memory_stats), a CPU device's share of the RAM."""
  devices = jax.local_devices()
  stats = devices[0].memory_stats() or {}
  if stats.get("bytes_limit"):
    return int(stats["bytes_limit"])
  return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // len(devices)


def check_fits(params, shardings) -> None:
  """ConfigError, before anything is allocated, when a device's share of the parameters alone exceeds its memory.

  `params`: ShapeDtypeStructs (jax.eval_shape); `shardings`: their NamedShardings. (Training needs several times
  more: gradients, optimizer state, activations; this refuses only what can never fit.)
  """
  leaves = jax.tree.leaves(params)
  shards = jax.tree.leaves(shardings, is_leaf=lambda x: isinstance(x, NamedSharding))
  held = sum(int(np.prod(s.shard_shape(p.shape))) * np.dtype(p.dtype).itemsize for p, s in zip(leaves, shards))
  have = device_memory()
  if held > have:
    count = sum(int(np.prod(p.shape)) for p in leaves)
    raise ConfigError(
      f"the model's parameters alone ({count:.3g} of them) take {held / 2**30:.3g} GiB of each device, which holds "
      f"{have / 2**30:.3g} GiB: make the model smaller (--config.model.*), or shard it (--config.sharding=fsdp)"
    )


def device_bytes(tree) -> int:
  """Bytes the first device holds of a tree of arrays (its shards, not the global arrays)."""
  device = jax.devices()[0]
  total = 0
  for leaf in jax.tree.leaves(tree):
    total += sum(s.data.nbytes for s in leaf.addressable_shards if s.device == device)
  return total


def opt_state_shardings(opt_state, params, params_sharding, mesh: Mesh) -> Any:
  """The optimizer state's shardings: the parameters' where a leaf has its parameter's shape, else replicated.

  Every subtree laid out like the parameters (Adam's mu and nu, momentum, the EMA; with some leaves optax.MaskedNode
  where config.frozen leaves a parameter without state) takes, leaf by leaf, its parameter's sharding where it has the
  parameter's shape; everything else (step counts, Adafactor's factored rows and columns) is replicated.
  """
  replicated = NamedSharding(mesh, P())
  masked = lambda x: isinstance(x, optax.MaskedNode)
  layout = jax.tree.structure(params_sharding)

  def like_params(x) -> bool:
    return not masked(x) and jax.tree.structure(x, is_leaf=masked) == layout

  def leaf(x, p, s):
    return x if masked(x) else s if tuple(x.shape) == tuple(p.shape) else replicated

  def shard(x):
    if like_params(x):
      return jax.tree.map(leaf, x, params, params_sharding, is_leaf=masked)
    return x if masked(x) else replicated

  return jax.tree.map(shard, opt_state, is_leaf=lambda x: masked(x) or like_params(x))


def to_global(batch: dict, sharding: NamedSharding, keys) -> dict:
  """Process-local numpy batch -> global jax arrays split over the mesh's batch axes."""
  return {k: jax.make_array_from_process_local_data(sharding, np.asarray(batch[k])) for k in keys if k in batch}


def gather(x) -> np.ndarray:
  """A global array -> all of its rows as numpy on every process."""
  if jax.process_count() == 1:
    return np.asarray(jax.device_get(x))
  from jax.experimental import multihost_utils

  return np.asarray(multihost_utils.process_allgather(x, tiled=True))


def all_agree(flag: bool) -> bool:
  """Process 0's value of `flag` on every process (see agree)."""
  return agree(False, flag)[1]


def agree(any_of: bool, *from_zero: bool) -> tuple[bool, ...]:
  """One collective for a step's decisions: (any process's `any_of`, then process 0's value of each `from_zero`).

  Every process gets the same answer, so all take the same branch at the same step.
  """
  flags = (bool(any_of), *map(bool, from_zero))
  if jax.process_count() == 1:
    return flags
  from jax.experimental import multihost_utils

  table = np.asarray(multihost_utils.process_allgather(np.asarray(flags, np.int32))).reshape(-1, len(flags))
  return (bool(table[:, 0].any()), *map(bool, table[0, 1:]))


def sync(name: str) -> None:
  """A barrier across processes (no-op on one)."""
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils

    multihost_utils.sync_global_devices(name)
