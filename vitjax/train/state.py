"""The model and its training state: build the model from the config, lay its state out on the mesh, initialise it.

Initialisation may start from other weights (`config.init_from`).

`network()` makes the `Network` that prediction needs (vitjax.load, evaluation, probing): task, model, mesh, the
variables' abstract sharded layout, with no optimizer. `setup()` adds what training needs to it: schedule,
optimizer and the whole TrainState's layout, as an `Experiment`. Neither compiles nor allocates anything.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from absl import logging
from jax.sharding import Mesh, NamedSharding

from vitjax import convert, models
from vitjax import mesh as mesh_lib
from vitjax.errors import ConfigError
from vitjax.models import registry
from vitjax.models.adapt import adapt_params
from vitjax.tasks import Task
from vitjax.train import checkpoints, optim


@flax.struct.dataclass
class TrainState:
  """The training state, a flax struct (a pytree).

  Attributes:
    step: an int scalar array.
    params: the model's parameters.
    opt_state: optax's state.
    model_state: the collections other than params, e.g. BatchNorm's batch_stats.
  """

  step: jax.Array
  params: Any
  opt_state: Any
  model_state: Any  # non-parameter collections, e.g. BatchNorm's batch_stats


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
      return models.create(config.model.name, **kwargs)
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

  The model on the task's mesh, its variables' abstract layout, how to initialise them. No schedule, no optimizer:
  vitjax.load, evaluation and probing stop here.
  """

  config: Any
  task: Task
  model: nn.Module
  mesh: Mesh
  abstract: dict  # {"params": ..., "model_state": ...}: ShapeDtypeStructs carrying their shardings
  sharding: dict  # NamedSharding per leaf, laid out as `abstract`
  batch_sharding: NamedSharding
  init: Callable[[], tuple[Any, dict]]  # () -> (params, model_state), from config.seed


def network(config, task: Task) -> Network:
  """The Network of a config on the devices of the task's layout (config.mesh as resolved once).

  Raises ConfigError for a model the config cannot build. Compiles and allocates nothing.
  """
  mesh = task.layout.mesh()
  model = build_model(config, task.model_overrides())
  inputs = task.example_inputs()

  def init():
    rngs = {"params": jax.random.key(config.seed), "dropout": jax.random.key(config.seed + 1)}
    variables = model.init(rngs, *inputs)
    params = variables.pop("params")
    return params, dict(variables)

  try:
    params, model_state = jax.eval_shape(init)
  except ValueError as e:  # impossible shapes (image size vs patch, widths vs heads): say which setting
    about_input = any(w in str(e).lower() for w in ("image", "patch", "window"))
    where = "the model's options are --config.model.*"
    if about_input:
      where = "the model's input comes from config.data; e.g. set --config.data.image_size"
    raise ConfigError(f"{e} ({where})") from None
  replicated = NamedSharding(mesh, jax.sharding.PartitionSpec())
  sharding = {
    "params": mesh_lib.param_shardings(
      mesh, params, config.sharding, config.sharding_rules, models.registry.tp_rules(model)
    ),
    "model_state": jax.tree.map(lambda _: replicated, model_state),
  }
  abstract = _with_shardings({"params": params, "model_state": model_state}, sharding)
  return Network(config, task, model, mesh, abstract, sharding, mesh_lib.batch_sharding(mesh), init)


def _with_shardings(abstract, sharding):
  return jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract, sharding)


@dataclasses.dataclass
class Experiment:
  """What training shares: the Network, and the optimizer and schedule with the whole TrainState's layout."""

  network: Network
  abstract_state: TrainState  # ShapeDtypeStructs carrying their shardings
  state_sharding: TrainState  # NamedSharding per leaf
  init_state: Callable[[], TrainState]
  schedule: optax.Schedule
  tx: optax.GradientTransformation

  config = property(lambda self: self.network.config)
  task = property(lambda self: self.network.task)
  model = property(lambda self: self.network.model)
  mesh = property(lambda self: self.network.mesh)
  batch_sharding = property(lambda self: self.network.batch_sharding)


def setup(
  config, task: Task, total_steps: int | None = None, steps_per_epoch: int = 1, warmup: int | None = None
) -> Experiment:
  """The Experiment of a config: its Network, and the schedule and optimizer that training adds.

  The config has total_steps and warmup in steps (vitjax.durations). Raises ConfigError for a model or rule the
  config cannot build.
  """
  net = network(config, task)
  schedule = optim.make_schedule(config, total_steps or 1, steps_per_epoch, warmup)
  tx = optim.make_optimizer(config, schedule, net.model)

  def init_state():
    params, model_state = net.init()
    return TrainState(jnp.zeros((), jnp.int32), params, tx.init(params), model_state)

  opt_state = jax.eval_shape(tx.init, net.abstract["params"])
  replicated = NamedSharding(net.mesh, jax.sharding.PartitionSpec())
  sharding = TrainState(
    replicated,
    net.sharding["params"],
    mesh_lib.opt_state_shardings(opt_state, net.abstract["params"], net.sharding["params"], net.mesh),
    net.sharding["model_state"],
  )
  abstract = TrainState(
    jax.ShapeDtypeStruct((), jnp.int32), net.abstract["params"], opt_state, net.abstract["model_state"]
  )
  return Experiment(net, _with_shardings(abstract, sharding), sharding, init_state, schedule, tx)


def initial_variables(net: Network) -> tuple[Any, dict]:
  """(params, model_state) at initialisation, laid out on the mesh.

  From config.seed, or config.init_from's weights adapted to the model (ConfigError if they do not fit).
  """
  config = net.config
  params, model_state = jax.jit(net.init, out_shardings=(net.sharding["params"], net.sharding["model_state"]))()
  if not config.init_from:
    return params, model_state
  if convert.WeightSource.parse(config.init_from).imported:
    loaded, loaded_ms = convert.load_params(config.init_from), {}
  else:
    loaded, loaded_ms = checkpoints.load_params(config.init_from)
  adapted, changes = adapt_params(loaded, jax.device_get(params), net.model)
  for line in changes:
    logging.info("init_from: %s", line)
  params = jax.device_put(adapted, net.sharding["params"])
  if loaded_ms and jax.tree.map(np.shape, loaded_ms) == jax.tree.map(np.shape, jax.device_get(model_state)):
    model_state = jax.device_put(loaded_ms, net.sharding["model_state"])
    logging.info("init_from: BatchNorm statistics carried over")
  logging.info("initialised parameters from %s", config.init_from)
  return params, model_state


def initial_state(exp: Experiment) -> TrainState:
  """The initialised TrainState (initial_variables, and the optimizer's state of them)."""
  if not exp.config.init_from:
    return jax.jit(exp.init_state, out_shardings=exp.state_sharding)()
  params, model_state = initial_variables(exp.network)
  opt_state = jax.jit(exp.tx.init, out_shardings=exp.state_sharding.opt_state)(params)
  step = jax.device_put(jnp.zeros((), jnp.int32), exp.state_sharding.step)
  return TrainState(step, params, opt_state, model_state)


def variables(state: TrainState) -> dict:
  """What model.apply takes: the parameters and the other collections (BatchNorm statistics)."""
  return {"params": state.params, **state.model_state}


def num_params(state: TrainState) -> int:
  """The number of parameter values: the sizes of all the leaves of state.params."""
  return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(state.params))
