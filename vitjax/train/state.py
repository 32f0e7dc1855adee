"""The training state: the task's Network with the optimizer and schedule, laid out on the mesh, initialised.

`network()` (vitjax.tasks.network) is the task's vitjax.models.network.Network (what prediction needs: model, mesh, the variables' abstract
sharded layout). `setup()` adds what training needs to it: schedule, optimizer and the whole TrainState's layout, as
an `Experiment`. Neither compiles nor allocates anything. Initialisation may start from other weights
(`config.init_from`, vitjax.pretrained).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import flax
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import NamedSharding

from vitjax import mesh as mesh_lib
from vitjax import pretrained
from vitjax.models.network import Network, with_shardings
from vitjax.tasks import Task, network
from vitjax.train import optim


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


@dataclasses.dataclass
class Experiment:
  """What training shares: the Network, and the optimizer and schedule with the whole TrainState's layout."""

  network: Network
  task: Task
  abstract_state: TrainState  # ShapeDtypeStructs carrying their shardings
  state_sharding: TrainState  # NamedSharding per leaf
  init_state: Callable[[], TrainState]
  schedule: optax.Schedule
  tx: optax.GradientTransformation

  config = property(lambda self: self.network.config)
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
  return Experiment(net, task, with_shardings(abstract, sharding), sharding, init_state, schedule, tx)


def initial_state(exp: Experiment) -> TrainState:
  """The initialised TrainState: config.init_from's variables fitted to the model, and the optimizer's state of them.

  vitjax.pretrained.load(..., fit=True); config.seed's initialisation without init_from.
  """
  if not exp.config.init_from:
    return jax.jit(exp.init_state, out_shardings=exp.state_sharding)()
  _, variables = pretrained.load(exp.config.init_from, exp.network, fit=True)
  params, model_state = variables.pop("params"), variables
  opt_state = jax.jit(exp.tx.init, out_shardings=exp.state_sharding.opt_state)(params)
  step = jax.device_put(jnp.zeros((), jnp.int32), exp.state_sharding.step)
  return TrainState(step, params, opt_state, model_state)


def variables(state: TrainState) -> dict:
  """What model.apply takes: the parameters and the other collections (BatchNorm statistics)."""
  return {"params": state.params, **state.model_state}


def num_params(state: TrainState) -> int:
  """The number of parameter values: the sizes of all the leaves of state.params."""
  return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(state.params))
