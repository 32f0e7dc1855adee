"""Optimizer and learning-rate schedule from the config: AdamW or SGD, weight decay on kernels and embeddings
only, global-norm clipping, layer-wise learning-rate decay, warm-up then cosine / linear / inverse-sqrt / constant
decay.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from vitjax import models
from vitjax.errors import ConfigError
from vitjax.train import durations


def decay_mask(params, model=None):
  """True where weight decay applies: kernels and embeddings, not biases, norms, nor what the model's family
  names in its `no_decay` (positions, bias tables, class tokens, ...; every family's when `model` is None)."""
  no_decay = models.registry.no_decay_pattern(model)
  return jax.tree_util.tree_map_with_path(
    lambda path, x: not no_decay.search(str(getattr(path[-1], "key", path[-1]))) and x.ndim > 1, params
  )


def make_schedule(config, total_steps: int, steps_per_epoch: int, warmup: int | None = None) -> optax.Schedule:
  """Warm-up then decay over total_steps; warmup in steps (None: from the config, vitjax.train.durations)."""
  s, lr = config.schedule, config.optim.lr
  if warmup is None:
    warmup = durations.warmup_steps(config, total_steps, steps_per_epoch)
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


def check(config) -> None:
  """The optimizer's and schedule's numbers are in range (ConfigError naming the field otherwise)."""
  o, s = config.optim, config.schedule
  # (.get: a workdir's config.json from before these fields existed has neither)
  layer_decay, ema_decay = o.get("layer_decay"), config.get("ema_decay")
  rules = [
    ("optim.lr", o.lr, o.lr > 0, "positive, e.g. 1e-3"),
    ("optim.weight_decay", o.weight_decay, o.weight_decay >= 0, "0 or more"),
    ("optim.b1", o.b1, 0 <= o.b1 < 1, "in [0, 1)"),
    ("optim.b2", o.b2, 0 <= o.b2 < 1, "in [0, 1)"),
    ("optim.eps", o.eps, o.eps > 0, "positive"),
    ("optim.momentum", o.momentum, 0 <= o.momentum < 1, "in [0, 1)"),
    ("optim.grad_clip_norm", o.grad_clip_norm, o.grad_clip_norm >= 0, "0 (off) or positive"),
    ("optim.accum_steps", o.accum_steps, o.accum_steps >= 1, "at least 1"),
    ("optim.layer_decay", layer_decay, layer_decay is None or 0 < layer_decay <= 1, "in (0, 1], or None"),
    ("ema_decay", ema_decay, ema_decay is None or 0 < ema_decay < 1, "in (0, 1), or None"),
    ("schedule.end_lr_factor", s.end_lr_factor, 0 <= s.end_lr_factor <= 1, "in [0, 1]"),
    ("label_smoothing", config.label_smoothing, 0 <= config.label_smoothing < 1, "in [0, 1)"),
  ]
  for name in ("warmup_epochs", "rsqrt_timescale"):  # warmup_steps: vitjax.train.durations
    value = s[name]
    rules.append((f"schedule.{name}", value, value is None or value >= 0, "0 or more"))
  for name, value, ok, want in rules:
    if not ok:
      raise ConfigError(f"{name}={value} must be {want} (--config.{name}=...)")


def _path(path) -> str:
  return "/".join(str(getattr(k, "key", k)) for k in path)


def layer_decay_scales(model, params, decay: float):
  """The learning-rate multiplier of every parameter: decay ** (L + 1 - model.layer_index(path)), L =
  model.num_layers; an array broadcasting over a scanned (stacked) parameter's first axis. Raises ConfigError for
  a model without layers to count."""
  if not hasattr(model, "layer_index"):
    raise ConfigError(
      f"optim.layer_decay applies to ViT and Swin, not to {type(model).__name__}: leave it at 1.0 (off)"
    )

  def scale(path, x):
    layer = np.asarray(model.layer_index(_path(path)))
    out = decay ** (model.num_layers + 1 - layer.astype(np.float64))
    return out.reshape(out.shape + (1,) * (np.ndim(x) - out.ndim)).astype(np.float32)

  return jax.tree_util.tree_map_with_path(scale, params)


def scale_by_layer_decay(model, decay: float) -> optax.GradientTransformation:
  """Multiplies each parameter's update by its layer_decay_scales entry (after the optimizer, so AdamW's decoupled
  weight decay is scaled with the learning rate, as in BEiT's and MAE's parameter groups)."""

  def update(updates, state, params=None):
    del params
    scales = layer_decay_scales(model, updates, decay)
    return jax.tree.map(lambda u, s: u * s.astype(u.dtype), updates, scales), state

  return optax.GradientTransformation(lambda params: optax.EmptyState(), update)


def make_optimizer(config, schedule, model=None) -> optax.GradientTransformation:
  """The config's optimizer; ``model`` is needed for optim.layer_decay (the layer of each parameter)."""
  check(config)
  o = config.optim
  decay_mask_fn = functools.partial(decay_mask, model=model)
  if o.name == "adamw":
    tx = optax.adamw(schedule, b1=o.b1, b2=o.b2, eps=o.eps, weight_decay=o.weight_decay, mask=decay_mask_fn)
  elif o.name == "sgd":
    tx = optax.chain(
      optax.add_decayed_weights(o.weight_decay, mask=decay_mask_fn),
      optax.sgd(schedule, momentum=o.momentum, nesterov=o.nesterov),
    )
  else:
    raise ConfigError(f"unknown optim.name {o.name!r}; use 'adamw' or 'sgd'")
  layer_decay = o.get("layer_decay")
  if layer_decay not in (None, 1.0):
    if model is None:
      raise ValueError("make_optimizer needs the model for optim.layer_decay")
    if not hasattr(model, "layer_index"):
      layer_decay_scales(model, {}, layer_decay)  # the ConfigError
    tx = optax.chain(tx, scale_by_layer_decay(model, layer_decay))
  if o.grad_clip_norm:
    tx = optax.chain(optax.clip_by_global_norm(o.grad_clip_norm), tx)
  if config.get("ema_decay"):
    tx = optax.chain(tx, track_ema(config.ema_decay))
  return tx


class EmaState(NamedTuple):
  ema: Any  # like the parameters


def track_ema(decay: float) -> optax.GradientTransformation:
  """Leaves the updates as they are and keeps, in its state, the exponential moving average of the parameters
  they produce: ema <- decay * ema + (1 - decay) * (params + updates), starting from the initial parameters. Last
  in the chain, it sees the final updates; in the optimizer state, it is checkpointed with it, laid out like the
  parameters, and left as it was by a step the divergence guard rejects."""

  def init(params):
    return EmaState(jax.tree.map(lambda p: p, params))  # (under jit, as the trainer runs it: a copy)

  def update(updates, state, params=None):
    if params is None:
      raise ValueError("track_ema needs the parameters (tx.update(grads, state, params))")
    new = optax.apply_updates(params, updates)
    ema = jax.tree.map(lambda e, p: decay * e + (1 - decay) * p.astype(e.dtype), state.ema, new)
    return updates, EmaState(ema)

  return optax.GradientTransformation(init, update)


def ema_params(opt_state):
  """The EMA of the parameters kept in an optimizer state (track_ema's); None when there is none."""
  found = [s for s in jax.tree.leaves(opt_state, is_leaf=lambda x: isinstance(x, EmaState)) if isinstance(s, EmaState)]
  return found[0].ema if found else None
