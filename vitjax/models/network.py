"""A network: the model a config names, on a mesh, with its variables' abstract sharded layout and their init.

    net = network(config, overrides={"num_classes": 10}, inputs=(images,), mesh=mesh)
    net.model, net.abstract["params"], net.sharding["params"], net.init()   # () -> (params, model_state)

What prediction needs and no more: no schedule, no optimizer (vitjax.train.state adds those for training). The task
gives `overrides` (what its data fixes: classes, vocabulary), `inputs` (example inputs, for the shapes) and the mesh;
vitjax.pretrained fills the variables from a checkpoint, a weights file or a hub repository. Nothing here
compiles or allocates.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from absl import logging
from jax.sharding import Mesh, NamedSharding

from vitjax import mesh as mesh_lib
from vitjax.errors import ConfigError
from vitjax.models import lora, registry


def build_model(config, overrides: dict | None = None) -> nn.Module:
  """The model named by config.model (other fields are attributes), with the task's overrides."""
  # Lists become tuples: config.json stores tuples as lists, and a model must stay hashable (jit static argument).
  kwargs = {k: _tuples(v) for k, v in config.model.to_dict().items() if k != "name" and v is not None}
  kwargs.update(overrides or {})
  bf16 = compute_dtype(config.compute_dtype) == "bfloat16"
  if bf16:
    kwargs["dtype"] = jnp.bfloat16
  try:
    family, fields = registry.options(config.model.name)
    if not bf16 or "dtype" in fields:
      return registry.create(config.model.name, **kwargs)
  except ValueError as e:
    raise ConfigError(f"config.model: {e}") from None
  raise ConfigError(
    f"compute_dtype={config.compute_dtype!r} computes in bfloat16, but {family.name} has no `dtype` attribute to "
    "compute in: give its module a `dtype` field that its layers use (CONTRIBUTING.md, 'A model family'), or run "
    "with --config.compute_dtype=float32"
  )


def compute_dtype(name: str) -> str:
  """config.compute_dtype as 'float32' or 'bfloat16'.

  'auto': bfloat16 where matmuls with bfloat16 inputs are faster than float32 ones on every process's devices (a TPU; a
  GPU of compute capability 8.0 or more; a CPU with AVX512-BF16 or AMX), float32 elsewhere (see bfloat16_is_fast).
  """
  if name not in ("float32", "bfloat16", "auto"):
    raise ConfigError(f"compute_dtype must be 'float32', 'bfloat16' or 'auto', got {name!r}")
  return name if name != "auto" else _auto_dtype()


@functools.cache
def _auto_dtype() -> str:
  """compute_dtype('auto'), decided once per process.

  The first call is a collective (every process agrees), which every process makes at the same point, building the
  model; later calls (the loop's log line, evaluation) reuse it.
  """
  return "float32" if mesh_lib.agree(not bfloat16_is_fast())[0] else "bfloat16"


def bfloat16_is_fast() -> bool:
  """Whether this process's devices multiply bfloat16 inputs faster than float32 ones (see compute_dtype)."""
  backend = jax.default_backend()
  if backend == "tpu":
    return True
  if backend == "gpu":
    capability = getattr(jax.local_devices()[0], "compute_capability", None) or "0"
    return float(capability) >= 8.0
  # A CPU with AVX512-BF16 or AMX multiplies bfloat16 inputs into float32 at twice float32's rate (337 against 173
  # GFLOP/s on this project's EPYC). With every matmul of the step taking that path (vitjax.dots, the explicit
  # attention's backward layout) the bf16 step there is 1.20-1.59x float32's speed on every bench_train model, the
  # least for the small Fashion-MNIST ViT, whose 49-token attention's batched dots gain nothing from bf16
  # (experiments/dtype_ab.py, experiments/README.md, issue 28; measured on AVX512-BF16, no AMX machine yet).
  # Without those instructions bf16 matmuls are no faster than float32 (an AVX2 CPU: 144 against 153-157 GFLOP/s).
  return bool(cpu_flags() & BF16_CPU_FLAGS)


BF16_CPU_FLAGS = {"avx512_bf16", "amx_bf16"}  # /proc/cpuinfo's names


def cpu_flags() -> set[str]:
  """The CPU's instruction-set flags from /proc/cpuinfo (Linux); empty where that cannot be read."""
  try:
    with open("/proc/cpuinfo") as f:
      line = next((x for x in f if x.startswith("flags")), "")
  except OSError:
    return set()
  return set(line.partition(":")[2].split())


def _tuples(v):
  return tuple(_tuples(x) for x in v) if isinstance(v, (list, tuple)) else v


@dataclasses.dataclass
class Network:
  """What prediction needs, and no more.

  The model on a mesh, its variables' abstract layout, how to initialise them. No schedule, no optimizer:
  vitjax.load, evaluation and probing stop here.
  """

  config: Any
  model: nn.Module
  mesh: Mesh
  abstract: dict  # {"params": ..., "model_state": ...}: ShapeDtypeStructs carrying their shardings
  sharding: dict  # NamedSharding per leaf, laid out as `abstract`
  batch_sharding: NamedSharding
  init: Callable[[], tuple[Any, dict]]  # () -> (params, model_state), from config.seed


def network(config, overrides: dict, inputs: tuple, mesh: Mesh) -> Network:
  """The Network of a config on `mesh`: config.model with the task's `overrides`, shaped by example `inputs`.

  Raises ConfigError for a model the config cannot build. Compiles and allocates nothing.
  """
  model = build_model(config, overrides)

  def base_init():
    rngs = {"params": jax.random.key(config.seed), "dropout": jax.random.key(config.seed + 1)}
    variables = model.init(rngs, *inputs)
    params = variables.pop("params")
    return params, dict(variables)

  init = base_init

  try:
    params, model_state = jax.eval_shape(init)
  except ValueError as e:  # impossible shapes (image size vs patch, widths vs heads): say which setting
    about_input = any(w in str(e).lower() for w in ("image", "patch", "window"))
    where = "the model's options are --config.model.*"
    if about_input:
      where = "the model's input comes from config.data; e.g. set --config.data.image_size"
    raise ConfigError(f"{e} ({where})") from None
  if lora.enabled(config):  # low-rank adapters beside the targeted kernels (vitjax.models.lora)
    targets, rank, scale = lora.plan(config, base_init), config.lora.rank, lora.scale(config)
    logging.info(
      "low-rank adapters of rank %d (scale %g) on %d layers: %s",
      rank,
      scale,
      len(targets),
      ", ".join(t.path for t in targets[:3]) + (" ..." if len(targets) > 3 else ""),
    )

    def init():
      params, model_state = base_init()
      return lora.add(
        params, targets, rank, scale, config.seed + 5, float(config.lora.get("dropout") or 0.0)
      ), model_state

    params = jax.eval_shape(lambda: init()[0])
  replicated = NamedSharding(mesh, jax.sharding.PartitionSpec())
  sharding = {
    "params": lora.follow_kernels(
      mesh_lib.param_shardings(mesh, params, config.sharding, config.sharding_rules, registry.tp_rules(model)), params
    ),
    "model_state": jax.tree.map(lambda _: replicated, model_state),
  }
  mesh_lib.check_fits(params, sharding["params"])
  abstract = with_shardings({"params": params, "model_state": model_state}, sharding)
  return Network(config, model, mesh, abstract, sharding, mesh_lib.batch_sharding(mesh), init)


def with_shardings(abstract, sharding):
  """ShapeDtypeStructs of `abstract` carrying the matching NamedSharding of `sharding`."""
  return jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract, sharding)
