"""The one trainer: a config in, a trained, checkpointed, evaluated model out.

Sections: mesh and sharding -> model and state -> optimizer -> steps -> parameter import -> checkpoints ->
reporting -> train loop -> evaluation. What differs between image classification and translation (inputs,
loss, evaluation) lives in vitjax.tasks. `python -m vitjax.main` is the command line.

Parallelism: jax.jit over a Mesh; the global batch is split over all devices of all processes along the
"data" axis; parameters follow `config.sharding_rules` (replicated by default), so FSDP or tensor-parallel
rules are a config change, not a rewrite.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import math
import os
import re
import time
from collections.abc import Callable
from typing import Any

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections as mlc
import numpy as np
import optax
import orbax.checkpoint as ocp
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from vitjax import convert, models, posenc
from vitjax import tasks as tasks_lib
from vitjax.tasks import ConfigError, check_batch, cross_entropy  # noqa: F401  (part of this module's API)

# --------------------------------------------------------------------------------- mesh & sharding


def make_mesh(axes=("data",)) -> Mesh:
  """All devices of all processes on the first axis (data parallel); other axes get size 1."""
  shape = (jax.device_count(),) + (1,) * (len(axes) - 1)
  # Auto axes: XLA propagates shardings from the inputs' and parameters' (jax's newer default is Explicit).
  return jax.make_mesh(shape, tuple(axes), axis_types=(jax.sharding.AxisType.Auto,) * len(axes))


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


# ---------------------------------------------------------------------------------- model & state


@flax.struct.dataclass
class TrainState:
  step: jax.Array
  params: Any
  opt_state: Any
  model_state: Any  # non-parameter collections, e.g. BatchNorm's batch_stats


def build_model(config, overrides: dict | None = None) -> nn.Module:
  """The model named by config.model (other fields are attributes), with the task's overrides."""
  kwargs = {k: v for k, v in config.model.to_dict().items() if k != "name" and v is not None}
  kwargs.update(overrides or {})
  if config.compute_dtype not in ("float32", "bfloat16"):
    raise ConfigError(f"compute_dtype must be 'float32' or 'bfloat16', got {config.compute_dtype!r}")
  if config.compute_dtype == "bfloat16":
    kwargs["dtype"] = jnp.bfloat16
  try:
    return models.create(config.model.name, **kwargs)
  except ValueError as e:
    raise ConfigError(f"config.model: {e}") from None


def init_variables(model, inputs: tuple, seed: int):
  return model.init({"params": jax.random.key(seed), "dropout": jax.random.key(seed + 1)}, *inputs)


# --------------------------------------------------------------------------------------- optimizer

NO_DECAY = re.compile(r"(bias|scale|pos_embedding|relative_position_bias_table|cls|probe)$")


def decay_mask(params):
  """True where weight decay applies: kernels and embeddings, not biases, norms, positions or bias tables."""
  return jax.tree_util.tree_map_with_path(
    lambda path, x: not NO_DECAY.search(str(getattr(path[-1], "key", path[-1]))) and x.ndim > 1, params
  )


def make_schedule(config, total_steps: int, steps_per_epoch: int) -> optax.Schedule:
  s, lr = config.schedule, config.optim.lr
  warmup = s.warmup_steps if s.warmup_steps is not None else int(round((s.warmup_epochs or 0) * steps_per_epoch))
  warmup = min(warmup, total_steps)
  rest = max(total_steps - warmup, 1)
  if s.decay == "cosine":
    decay = optax.cosine_decay_schedule(lr, rest, alpha=s.end_lr_factor)
  elif s.decay == "linear":
    decay = optax.linear_schedule(lr, lr * s.end_lr_factor, rest)
  elif s.decay == "constant":
    decay = optax.constant_schedule(lr)
  elif s.decay == "rsqrt":  # inverse square root, continuous with the warm-up ("Attention is all you need")
    t0 = s.rsqrt_timescale or max(warmup, 1)
    # join_schedules also evaluates this at step - warmup < 0: keep the denominator positive (a Python int step
    # would otherwise raise ZeroDivisionError at step 0).
    decay = lambda step: lr * jnp.sqrt(t0 / jnp.maximum(step + t0, 1))
  else:
    raise ConfigError(f"unknown schedule.decay {s.decay!r}; use 'cosine', 'linear', 'rsqrt' or 'constant'")
  if warmup == 0:
    return decay
  return optax.join_schedules([optax.linear_schedule(0.0, lr, warmup), decay], [warmup])


def make_optimizer(config, schedule) -> optax.GradientTransformation:
  o = config.optim
  if o.name == "adamw":
    tx = optax.adamw(schedule, b1=o.b1, b2=o.b2, eps=o.eps, weight_decay=o.weight_decay, mask=decay_mask)
  elif o.name == "sgd":
    tx = optax.chain(
      optax.add_decayed_weights(o.weight_decay, mask=decay_mask),
      optax.sgd(schedule, momentum=o.momentum, nesterov=o.nesterov),
    )
  else:
    raise ConfigError(f"unknown optim.name {o.name!r}; use 'adamw' or 'sgd'")
  if o.grad_clip_norm:
    tx = optax.chain(optax.clip_by_global_norm(o.grad_clip_norm), tx)
  return tx


# ------------------------------------------------------------------------------------------- steps


def make_train_step(model, tx, schedule, config, task) -> Callable:
  """(state, batch) -> (state, metrics): forward, task loss, gradients (accumulated over micro-batches), update."""
  accum = config.optim.accum_steps
  dropout_key = jax.random.key(config.seed + 2)

  def loss_fn(params, model_state, batch, rng):
    variables = {"params": params, **model_state}
    out, new_state = model.apply(
      variables, *task.model_inputs(batch), train=True, rngs={"dropout": rng}, mutable=list(model_state)
    )
    loss, metrics = task.loss(out[0], batch)
    return loss, (dict(new_state), metrics)

  def train_step(state: TrainState, batch):
    rng = jax.random.fold_in(dropout_key, state.step)
    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
    if accum == 1:
      (loss, (model_state, metrics)), grads = grad_fn(state.params, state.model_state, batch, rng)
    else:  # micro-batches in sequence, gradients averaged: one optimizer step per global batch
      # micro-batch i takes rows i, i + accum, ...: every micro-batch spans all devices of the data axis
      micro = jax.tree.map(lambda x: jnp.swapaxes(x.reshape((x.shape[0] // accum, accum) + x.shape[1:]), 0, 1), batch)

      def body(carry, xs):
        grads, model_state, loss, metrics, i = carry
        (micro_loss, (model_state, m)), g = grad_fn(state.params, model_state, xs, jax.random.fold_in(rng, i))
        return (
          jax.tree.map(jnp.add, grads, g),
          model_state,
          loss + micro_loss,
          jax.tree.map(jnp.add, metrics, m),
          i + 1,
        ), None

      zeros = jax.tree.map(jnp.zeros_like, state.params)
      shapes = jax.eval_shape(
        lambda: grad_fn(state.params, state.model_state, jax.tree.map(lambda x: x[0], micro), rng)
      )
      m0 = jax.tree.map(lambda a: jnp.zeros(a.shape, a.dtype), shapes[0][1][1])
      (grads, model_state, loss, metrics, _), _ = jax.lax.scan(body, (zeros, state.model_state, 0.0, m0, 0), micro)
      grads, loss = jax.tree.map(lambda g: g / accum, grads), loss / accum
      metrics = {k: v if k == "tokens" else v / accum for k, v in metrics.items()}  # token counts add up
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    metrics = {
      "train/loss": loss,
      **{f"train/{k}": v for k, v in metrics.items()},
      "train/grad_norm": optax.global_norm(grads),
      "train/lr": schedule(state.step),
    }
    return TrainState(state.step + 1, params, opt_state, model_state), metrics

  return train_step


# -------------------------------------------------------------------------------- parameter import


def load_params(init_from: str) -> tuple[dict, dict]:
  """(parameters, other collections such as BatchNorm statistics) from a workdir's latest checkpoint, or
  (parameters, {}) from 'timm:NAME:FILE' or 'npz:VARIANT:FILE'."""
  kind, _, rest = init_from.partition(":")
  if kind == "timm":
    name, _, path = rest.partition(":")
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
    return convert.from_timm(name, sd)[1]["params"], {}
  if kind == "npz":
    variant, _, path = rest.partition(":")
    return convert.from_vit_npz(path, variant)[1]["params"], {}
  workdir = os.path.abspath(init_from)
  ckpt_dir = os.path.join(workdir, "checkpoints")
  if not os.path.isdir(ckpt_dir):
    raise ConfigError(
      f"init_from={init_from!r}: no checkpoints/ there; give a workdir of a vitjax run, "
      "'timm:NAME:FILE' or 'npz:VARIANT:FILE'"
    )
  with ocp.CheckpointManager(ckpt_dir, options=ocp.CheckpointManagerOptions(read_only=True)) as mngr:
    step = mngr.latest_step()
    if step is None:
      raise ConfigError(f"init_from={init_from!r}: the workdir has no finished checkpoint")
    restored = mngr.restore(step, args=ocp.args.Composite(state=ocp.args.PyTreeRestore()))
  return restored["state"]["params"], dict(restored["state"].get("model_state") or {})


def adapt_params(loaded, target, log=print):
  """Fits loaded parameters to the target model's shapes, for fine-tuning.

  The classifier head is replaced (kept at its initialisation) when the number of classes differs; learned
  position embeddings are resampled, relative-position bias tables resized, to a new resolution or window.
  Anything else that differs is an error listing every mismatch.
  """
  flat_l = flax.traverse_util.flatten_dict(flax.core.unfreeze(loaded), sep="/")
  flat_t = flax.traverse_util.flatten_dict(flax.core.unfreeze(target), sep="/")
  out, problems = {}, []
  for k, t in flat_t.items():
    if k not in flat_l:
      if k.startswith("head/"):
        log(f"init_from: {k} not in the checkpoint; keeping its initialisation")
        out[k] = t
        continue
      problems.append(f"  {k}: missing from the checkpoint (model {t.shape})")
      continue
    v = np.asarray(flat_l[k])
    if v.shape == t.shape:
      out[k] = v
    elif k.startswith("head/"):
      log(f"init_from: new head {k} {v.shape} -> {t.shape}")
      out[k] = t
    elif k.endswith("pos_embedding") and v.ndim == 2 and v.shape[-1] == t.shape[-1]:  # [max_len, D]
      out[k] = np.concatenate([v[: t.shape[0]], np.asarray(t)[v.shape[0] :]], axis=0)
      log(f"init_from: {k} {v.shape} -> {out[k].shape} (truncated, or extended with its initialisation)")
    elif k.endswith("pos_embedding") and v.ndim == 3 and v.shape[-1] == t.shape[-1]:
      prefix = 1 if _has_square(v.shape[1] - 1) and not _has_square(v.shape[1]) else 0
      grid = _grid(t.shape[1] - prefix)
      out[k] = posenc.resample_posemb(v, grid, num_prefix_tokens=prefix)
      log(f"init_from: resampled {k} {v.shape} -> {out[k].shape}")
    elif k.endswith("relative_position_bias_table") and v.shape[1] == t.shape[1]:
      old, new = (int(math.isqrt(v.shape[0])) + 1) // 2, (int(math.isqrt(t.shape[0])) + 1) // 2
      out[k] = posenc.resize_relative_bias_table(v, (old, old), (new, new))
      log(f"init_from: resized {k} {v.shape} -> {out[k].shape}")
    else:
      problems.append(f"  {k}: model {t.shape}, checkpoint {v.shape}")
  if problems:
    raise ConfigError(
      "the checkpoint's parameters do not match the model (check config.model):\n" + "\n".join(problems[:20])
    )
  return flax.traverse_util.unflatten_dict({tuple(k.split("/")): v for k, v in out.items()})


def _has_square(n):
  return n > 0 and math.isqrt(n) ** 2 == n


def _grid(n):
  side = math.isqrt(n)
  if side * side != n:
    raise ConfigError(f"cannot resample position embeddings to a non-square grid of {n} tokens")
  return side, side


# ------------------------------------------------------------------------------------- checkpoints


def _fingerprint(config: dict) -> dict:
  """What makes two runs the same experiment (from a config as written to config.json), for refusing a
  workdir that holds another one."""
  d = config.get("data", {})
  model = {k: v for k, v in (config.get("model") or {}).items() if v is not None}  # None: the model's default
  return {"model": model, "data": d.get("name") or d.get("source"), "image_size": d.get("image_size")}


def _has_checkpoints(workdir: str) -> bool:
  ckpt = os.path.join(workdir, "checkpoints")
  return os.path.isdir(ckpt) and any(n.isdigit() for n in os.listdir(ckpt))


def check_workdir(workdir: str, config) -> None:
  """Refuses a workdir whose checkpoints belong to another experiment. Writes nothing."""
  path = os.path.join(workdir, "config.json")
  if os.path.exists(path) and _has_checkpoints(workdir):
    with open(path) as f:
      old_fp = _fingerprint(json.load(f))
    new_fp = _fingerprint(json.loads(config.to_json_best_effort()))
    if old_fp != new_fp:
      flat_old = flax.traverse_util.flatten_dict(old_fp, sep=".")
      flat_new = flax.traverse_util.flatten_dict(new_fp, sep=".")
      diff = [
        f"{k}: {flat_old.get(k)!r} there, {flat_new.get(k)!r} now"
        for k in sorted(set(flat_old) | set(flat_new))
        if flat_old.get(k) != flat_new.get(k)
      ]
      raise ConfigError(
        f"workdir {workdir} holds checkpoints of another experiment ({'; '.join(diff)}). "
        "Use a new --workdir, or --config.init_from to start from those weights."
      )


def write_config(workdir: str, config) -> None:
  """Writes the resolved config to WORKDIR/config.json (atomically; process 0)."""
  if jax.process_index() == 0:
    path = os.path.join(workdir, "config.json")
    os.makedirs(workdir, exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
      f.write(config.to_json_best_effort(indent=2))
    os.replace(tmp, path)


def checkpoint_managers(workdir: str, config):
  last = ocp.CheckpointManager(
    os.path.join(workdir, "checkpoints"),
    options=ocp.CheckpointManagerOptions(max_to_keep=config.keep_checkpoints, enable_async_checkpointing=True),
    item_names=("state", "data"),
  )
  best = ocp.CheckpointManager(
    os.path.join(workdir, "best"),
    options=ocp.CheckpointManagerOptions(
      max_to_keep=1,
      best_fn=lambda m: m[config.best_metric],
      best_mode=config.best_mode,
      enable_async_checkpointing=False,
    ),
    item_names=("state",),
  )
  return last, best


def _data_state(it) -> str:
  s = it.get_state()
  return s.decode() if isinstance(s, bytes) else json.dumps(s)


def restore_state(mngr, step, abstract_state, with_data: bool = True):
  items = {"state": ocp.args.StandardRestore(abstract_state)}
  if with_data:
    items["data"] = ocp.args.JsonRestore()
  try:
    restored = mngr.restore(step, args=ocp.args.Composite(**items))
  except (ValueError, KeyError) as e:
    raise ConfigError(
      f"the checkpoint at step {step} in {mngr.directory} does not match the model of this "
      f"config ({str(e).splitlines()[0][:300]}). Use the config it was written with."
    ) from None
  return restored


# --------------------------------------------------------------------------------------- reporting


class Reporter:
  """Progress lines, WORKDIR/metrics.jsonl and TensorBoard summaries (process 0 only)."""

  def __init__(self, workdir: str, total_steps: int, global_batch: int):
    self.workdir, self.total, self.batch = workdir, total_steps, global_batch
    self.main = jax.process_index() == 0
    self.tb = None
    if self.main:
      from tensorboardX import SummaryWriter

      self.tb = SummaryWriter(os.path.join(workdir, "tb"))
    self.t0, self.s0 = time.time(), None

  def write(self, step: int, metrics: dict) -> None:
    if not self.main:
      return
    row = {"step": int(step), **{k: float(v) for k, v in metrics.items()}}
    with open(os.path.join(self.workdir, "metrics.jsonl"), "a") as f:
      f.write(json.dumps(row) + "\n")
    for k, v in row.items():
      if k != "step":
        self.tb.add_scalar(k, v, step)
    self.tb.flush()

  def progress(self, step: int, metrics: dict) -> None:
    now = time.time()
    if self.s0 is None:  # the first report includes compilation: rates start after it
      self.t0, self.s0 = now, step
      rate = float("nan")
    else:
      rate = (step - self.s0) / max(now - self.t0, 1e-9)
    extra = {}
    if rate == rate:
      extra["train/steps_per_s"] = rate
      if self.batch:
        extra["train/examples_per_s"] = rate * self.batch
      if "train/tokens" in metrics:
        extra["train/tokens_per_s"] = rate * float(metrics["train/tokens"])
    self.write(step, {**metrics, **extra})
    if self.main:
      eta = (self.total - step) / rate if rate == rate and rate > 0 else float("nan")
      throughput = " | ".join(
        f"{extra[k]:.0f} {u}"
        for k, u in (("train/examples_per_s", "ex/s"), ("train/tokens_per_s", "tok/s"))
        if k in extra
      )
      acc = f" | acc {metrics['train/accuracy']:.3f}" if "train/accuracy" in metrics else ""
      print(
        f"step {step}/{self.total} | loss {metrics['train/loss']:.4f}{acc} | lr {metrics['train/lr']:.2e} | "
        f"{rate:.2f} steps/s{' | ' + throughput if throughput else ''} | ETA {_fmt_time(eta)}",
        flush=True,
      )

  def close(self):
    if self.tb:
      self.tb.close()


def _fmt_time(s: float) -> str:
  if s != s:
    return "?"
  s = int(s)
  return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


# -------------------------------------------------------------------------------------- train loop


@dataclasses.dataclass
class Experiment:
  """What train() and evaluate() share: task, model, mesh, shardings, optimizer."""

  config: Any
  task: Any
  model: nn.Module
  mesh: Mesh
  abstract_state: Any
  state_sharding: Any
  batch_sharding: NamedSharding
  init_state: Callable
  schedule: Callable
  tx: optax.GradientTransformation


def setup(config, workdir: str, task=None, total_steps: int | None = None, steps_per_epoch: int = 1) -> Experiment:
  task = task or tasks_lib.get(config, workdir)
  mesh = make_mesh(config.mesh_axes)
  task.check()
  model = build_model(config, task.model_overrides())
  inputs = task.example_inputs()
  schedule = make_schedule(config, total_steps or 1, steps_per_epoch)
  tx = make_optimizer(config, schedule)

  def init_state():
    variables = init_variables(model, inputs, config.seed)
    params = variables.pop("params")
    return TrainState(jnp.zeros((), jnp.int32), params, tx.init(params), dict(variables))

  try:
    abstract = jax.eval_shape(init_state)
  except ValueError as e:  # impossible shapes (image size vs patch, widths vs heads): say which setting
    raise ConfigError(f"{e} (the model's input comes from config.data; e.g. set --config.data.image_size)") from None
  specs = TrainState(
    P(),
    param_specs(abstract.params, config.sharding_rules),
    _opt_specs(abstract, config.sharding_rules),
    jax.tree.map(lambda _: P(), abstract.model_state),
  )
  sharding = jax.tree.map(lambda s: NamedSharding(mesh, s), specs, is_leaf=lambda x: isinstance(x, P))
  abstract = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract, sharding)
  return Experiment(
    config, task, model, mesh, abstract, sharding, NamedSharding(mesh, P(config.mesh_axes[0])), init_state, schedule, tx
  )


def _opt_specs(abstract, rules):
  """Optimizer moments shaped like a parameter follow that parameter's rule; the rest is replicated."""
  pspecs = param_specs(abstract.params, rules)
  by_shape = {}
  for leaf, spec in zip(jax.tree.leaves(abstract.params), jax.tree.leaves(pspecs, is_leaf=lambda x: isinstance(x, P))):
    by_shape.setdefault(leaf.shape, spec)
  return jax.tree.map(lambda a: by_shape.get(a.shape, P()) if rules else P(), abstract.opt_state)


def prefetch(it, task, sharding, size: int = 2):
  """Yields (global batch, data state after it) with `size` batches already on their way to the devices.

  Each batch carries the iterator's state taken right after it was read, so a checkpoint saves the position
  of the last batch consumed, not of the ones prefetched: a resumed run sees exactly the same batches.
  """
  queue = collections.deque()
  while True:
    while len(queue) < size:
      batch = next(it)
      queue.append((tasks_lib.to_global(batch, sharding, task.batch_keys), task.data_state(it)))
    yield queue.popleft()


def _all_agree(flag: bool) -> bool:
  """Process 0's value of `flag` on every process (so all stop at the same step)."""
  if jax.process_count() == 1:
    return bool(flag)
  from jax.experimental import multihost_utils

  return bool(multihost_utils.broadcast_one_to_all(np.asarray(flag)))


def initial_state(exp: Experiment, config, log=print) -> TrainState:
  """The initialised TrainState, with parameters from config.init_from if set (ConfigError if they do not fit)."""
  state = jax.jit(exp.init_state, out_shardings=exp.state_sharding)()
  if config.init_from:
    loaded, loaded_ms = load_params(config.init_from)
    params = adapt_params(loaded, jax.device_get(state.params), log=log)
    params = jax.device_put(params, exp.state_sharding.params)
    state = state.replace(
      params=params, opt_state=jax.jit(exp.tx.init, out_shardings=exp.state_sharding.opt_state)(params)
    )
    if loaded_ms and jax.tree.map(np.shape, loaded_ms) == jax.tree.map(np.shape, jax.device_get(state.model_state)):
      state = state.replace(model_state=jax.device_put(loaded_ms, exp.state_sharding.model_state))
      log("init_from: BatchNorm statistics carried over")
    log(f"initialised parameters from {config.init_from}")
  return state


def train(config: mlc.ConfigDict, workdir: str, log=print) -> dict:
  """Trains (resuming from WORKDIR's latest checkpoint if any), evaluates, checkpoints. Returns final metrics."""
  workdir = os.path.abspath(workdir)
  task = tasks_lib.get(config, workdir, log)
  task.check()
  check_workdir(workdir, config)
  train_it, num_examples, steps_per_epoch = task.train_input()
  if config.total_steps is None and config.num_epochs is None:
    raise ConfigError("set config.total_steps or config.num_epochs")
  total = config.total_steps if config.total_steps is not None else int(math.ceil(config.num_epochs * steps_per_epoch))
  if config.total_steps is not None and config.num_epochs is not None:
    log(f"total_steps={config.total_steps} takes precedence over num_epochs={config.num_epochs}")
  exp = setup(config, workdir, task, total, steps_per_epoch)
  train_step = jax.jit(
    make_train_step(exp.model, exp.tx, exp.schedule, config, task),
    in_shardings=(exp.state_sharding, exp.batch_sharding),
    out_shardings=(exp.state_sharding, None),
    donate_argnums=0,
  )

  # A fresh run builds its initial state (and checks config.init_from) before it writes anything to the workdir.
  state = None if _has_checkpoints(workdir) else initial_state(exp, config, log)
  write_config(workdir, config)
  last_mngr, best_mngr = checkpoint_managers(workdir, config)
  start = last_mngr.latest_step()
  if start is not None:
    restored = restore_state(last_mngr, start, exp.abstract_state)
    state = restored["state"]
    task.restore_data_state(train_it, restored["data"])
    log(f"resumed from {workdir}/checkpoints at step {start}")
  else:
    state = state if state is not None else initial_state(exp, config, log)
    start = 0
  n_params = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(state.params))
  data_name = config.data.get("name") or config.data.get("source")
  log(
    f"{config.model.name}: {n_params:,} parameters | {data_name}: {num_examples} training examples, "
    f"{steps_per_epoch} steps/epoch | {total} steps | {jax.device_count()} devices, {jax.process_count()} processes"
  )

  reporter = Reporter(workdir, total, config.batch_size if isinstance(task, tasks_lib.ImageClassification) else 0)
  eval_limit = config.data.get("eval_examples")
  final = {}
  batches = prefetch(train_it, task, exp.batch_sharding)
  deadline = time.time() + 60 * config.max_train_minutes if config.get("max_train_minutes") else None
  with jax.set_mesh(exp.mesh):
    for step in range(start + 1, total + 1):
      batch, data_state = next(batches)
      state, metrics = train_step(state, batch)
      out_of_time = deadline is not None and step < total and _all_agree(time.time() > deadline)
      if out_of_time:
        log(f"max_train_minutes={config.max_train_minutes} reached at step {step}: evaluating and stopping")
        total = reporter.total = step  # this step is the last: evaluate and checkpoint below
      if step % config.log_every == 0 or step == total or step == start + 1:
        reporter.progress(step, jax.device_get(metrics))
      if step % config.checkpoint_every == 0 or step == total:  # before evaluating: a failed eval loses nothing
        last_mngr.save(
          step, args=ocp.args.Composite(state=ocp.args.StandardSave(state), data=ocp.args.JsonSave(data_state))
        )
      if step % config.eval_every == 0 or step == total:
        final = task.evaluate(exp, state.params, state.model_state, config.data.eval_split, eval_limit)
        reporter.write(step, final)
        log(f"step {step}: " + ", ".join(f"{k} {v:.4f}" for k, v in final.items()))
        best_mngr.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state)), metrics=final)
      if out_of_time:
        break
  last_mngr.wait_until_finished()
  best_mngr.wait_until_finished()
  last_mngr.close()
  best_mngr.close()
  reporter.close()
  return final


# -------------------------------------------------------------------------------------- evaluation


def restore_checkpoint(exp: Experiment, workdir: str, checkpoint: str = "latest"):
  """(state, step, kind) from WORKDIR/checkpoints (latest or a step) or WORKDIR/best."""
  sub = "best" if checkpoint == "best" else "checkpoints"
  path = os.path.join(workdir, sub)
  if not os.path.isdir(path):
    raise ConfigError(f"no {sub}/ in {workdir}: train first (python -m vitjax.main --config=... --workdir={workdir})")
  with ocp.CheckpointManager(
    path,
    options=ocp.CheckpointManagerOptions(read_only=True),
    item_names=("state", "data") if sub == "checkpoints" else ("state",),
  ) as mngr:
    steps = mngr.all_steps()
    if not steps:
      raise ConfigError(f"{path} holds no finished checkpoint")
    step = max(steps) if checkpoint in ("latest", "best") else int(checkpoint)
    if step not in steps:
      raise ConfigError(f"no checkpoint for step {step} in {path}; there are {sorted(steps)}")
    state = restore_state(mngr, step, exp.abstract_state, with_data=False)["state"]
  return state, step, sub


def evaluate(config, workdir: str, checkpoint: str = "latest", split: str | None = None, log=print) -> dict:
  """Restores a checkpoint (latest, best, or a step) and evaluates it on a split; writes the result."""
  workdir = os.path.abspath(workdir)
  split = split or config.data.eval_split
  exp = setup(config, workdir, tasks_lib.get(config, workdir, log))
  state, step, sub = restore_checkpoint(exp, workdir, checkpoint)
  with jax.set_mesh(exp.mesh):
    result = exp.task.evaluate(exp, state.params, state.model_state, split)
  log(f"{sub}/ step {step}, split {split}: " + ", ".join(f"{k} {v:.4f}" for k, v in result.items()))
  if jax.process_index() == 0:
    with open(os.path.join(workdir, f"eval_{split}_{sub}_{step}.json"), "w") as f:
      json.dump({"step": step, "checkpoint": sub, "split": split, **result}, f, indent=1)
    with open(os.path.join(workdir, "metrics.jsonl"), "a") as f:
      f.write(json.dumps({"step": step, "source": f"{sub} checkpoint", "split": split, **result}) + "\n")
  return {"step": step, **result}
