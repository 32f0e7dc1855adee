"""Devices and shardings: the mesh, parameter and optimizer-state specs, global batches.

Parallelism is jax.jit over a named Mesh: the global batch is split over the mesh's first axis ("data") across
all devices of all processes; parameters follow (regex, axes) rules and are replicated by default; optimizer
state follows its parameter exactly, by tree structure (a moment of `query/kernel` gets `query/kernel`'s spec,
whatever other parameter shares its shape). Nothing here knows which task or model runs.
"""

from __future__ import annotations

import re
from typing import Any

import jax
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P


def make_mesh(axes=("data",)) -> Mesh:
  """All devices of all processes on the first axis (data parallel); other axes get size 1."""
  shape = (jax.device_count(),) + (1,) * (len(axes) - 1)
  # Auto axes: XLA propagates shardings from the inputs' and parameters' (jax's newer default is Explicit).
  return jax.make_mesh(shape, tuple(axes), axis_types=(jax.sharding.AxisType.Auto,) * len(axes))


def batch_sharding(mesh: Mesh) -> NamedSharding:
  """Leading (batch) dimension split over the mesh's first axis, the rest replicated."""
  return NamedSharding(mesh, P(mesh.axis_names[0]))


def param_specs(params, rules) -> Any:
  """PartitionSpec per parameter from (regex, axes) rules on 'a/b/kernel' paths; unmatched: replicated."""
  compiled = [(re.compile(r), tuple(axes)) for r, axes in rules]

  def spec(path, _):
    name = "/".join(str(getattr(k, "key", k)) for k in path)
    for r, axes in compiled:
      if r.search(name):
        return P(*axes)
    return P()

  return jax.tree_util.tree_map_with_path(spec, params)


def param_shardings(mesh: Mesh, params, rules) -> Any:
  """NamedSharding per parameter (see param_specs)."""
  return jax.tree.map(lambda s: NamedSharding(mesh, s), param_specs(params, rules), is_leaf=lambda x: isinstance(x, P))


def opt_state_shardings(tx: optax.GradientTransformation, opt_state, params_sharding, mesh: Mesh) -> Any:
  """The optimizer state's shardings: every parameter-shaped subtree (Adam's mu and nu, momentum, ...) takes
  its parameter's sharding, matched by position in the tree; everything else (step counts) is replicated."""
  replicated = NamedSharding(mesh, P())
  return optax.tree_map_params(
    tx, lambda _, sharding: sharding, opt_state, params_sharding, transform_non_params=lambda _: replicated
  )


def to_global(batch: dict, sharding: NamedSharding, keys) -> dict:
  """Process-local numpy batch -> global jax arrays split over the mesh's data axis."""
  return {k: jax.make_array_from_process_local_data(sharding, np.asarray(batch[k])) for k in keys if k in batch}


def gather(x) -> np.ndarray:
  """A global array -> all of its rows as numpy on every process."""
  if jax.process_count() == 1:
    return np.asarray(jax.device_get(x))
  from jax.experimental import multihost_utils

  return np.asarray(multihost_utils.process_allgather(x, tiled=True))


def all_agree(flag: bool) -> bool:
  """Process 0's value of `flag` on every process (so that all stop at the same step)."""
  if jax.process_count() == 1:
    return bool(flag)
  from jax.experimental import multihost_utils

  return bool(multihost_utils.broadcast_one_to_all(np.asarray(flag)))


def agree(any_of: bool, *from_zero: bool) -> tuple[bool, ...]:
  """One collective for a step's decisions: (any process's `any_of`, then process 0's value of each `from_zero`).
  Every process gets the same answer, so all take the same branch at the same step."""
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
