"""Optimizer and learning-rate schedule from the config, big_vision's way.

Any optax optimizer by name with its keyword arguments, per-parameter rules by regex over 'a/b/kernel' paths (lr_mults,
wd_mults, frozen), global-norm clipping, layer-wise learning-rate decay (a generator of learning-rate multipliers), an
EMA of the parameters; warm-up then cosine / linear / inverse-sqrt / constant decay.

    config.optim = dict(name="adamw", lr=1e-3, kwargs=dict(b2=0.95), weight_decay=0.05, ...)
    config.lr_mults = (("pos_embedding", 0.1),)   # (regex, multiplier): the first rule a path matches decides
    config.wd_mults = ((".*/bias$", 0.0),)        # None: the model family's (no decay on biases, norms, positions)
    config.frozen = ("^(?!head/).*",)             # not updated, no optimizer state

The optimizer is `optax.NAME(learning_rate=schedule, **kwargs)`. Weight decay is the optimizer's own where optax's
function takes it with a mask (adamw, nadamw, adamaxw, lion: decoupled, p -= lr * wd * p; lamb, lars, adan,
adafactor's weight_decay_rate: as each defines it), on or off per parameter by wd_mults; for any other (sgd,
adam, rmsprop, ...) it is added to the gradient before the optimizer (L2, SGD's weight decay). wd_mults other
than 0 and 1 scale a decoupled decay (vitjax's beside the optimizer's, which is then off) or the L2 one. lr_mults scale a parameter's update after the optimizer,
so a decoupled decay is scaled with its learning rate (BEiT's and MAE's parameter groups); optim.layer_decay
multiplies in decay ** (L + 1 - layer). A rule that matches no parameter is an error naming the nearest paths;
`describe` gives the run's opening lines, one per rule with what it matched.
"""

from __future__ import annotations

import difflib
import inspect
import re
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from vitjax import durations, models
from vitjax.errors import ConfigError
from vitjax.mesh import path_name
from vitjax.models.lora import frozen_rules


def make_schedule(config, total_steps: int, steps_per_epoch: int, warmup: int | None = None) -> optax.Schedule:
  """Warm-up then decay over total_steps; warmup in steps (None: from the config, vitjax.durations)."""
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
  layer_decay, ema_decay = o.layer_decay, config.ema_decay
  rules = [
    ("optim.lr", o.lr, o.lr > 0, "positive, e.g. 1e-3"),
    ("optim.weight_decay", o.weight_decay, o.weight_decay >= 0, "0 or more"),
    ("optim.grad_clip_norm", o.grad_clip_norm, o.grad_clip_norm >= 0, "0 (off) or positive"),
    ("optim.accum_steps", o.accum_steps, o.accum_steps >= 1, "at least 1"),
    ("optim.layer_decay", layer_decay, layer_decay is None or 0 < layer_decay <= 1, "in (0, 1], or None"),
    ("ema_decay", ema_decay, ema_decay is None or 0 < ema_decay < 1, "in (0, 1), or None"),
    ("schedule.end_lr_factor", s.end_lr_factor, 0 <= s.end_lr_factor <= 1, "in [0, 1]"),
    ("label_smoothing", config.label_smoothing, 0 <= config.label_smoothing < 1, "in [0, 1)"),
  ]
  for name in ("warmup_epochs", "rsqrt_timescale"):  # warmup_steps: vitjax.durations
    value = s[name]
    rules.append((f"schedule.{name}", value, value is None or value >= 0, "0 or more"))
  for name, value, ok, want in rules:
    if not ok:
      raise ConfigError(f"{name}={value} must be {want} (--config.{name}=...)")
  for name, value, uses in (("rsqrt_timescale", s.rsqrt_timescale, ("rsqrt",)),
                            ("end_lr_factor", s.end_lr_factor or None, ("cosine", "linear"))):  # fmt: skip
    if value is not None and s.decay not in uses:  # it was silently unread
      raise ConfigError(
        f"schedule.{name}={value} does nothing with schedule.decay={s.decay!r}: it shapes {' and '.join(uses)} decay;"
        f" set --config.schedule.decay={uses[0]} or leave it unset"
      )
  fn, _ = optimizer(o.name, kwargs(o))
  if kwargs(o):
    _try(o.name, fn, kwargs(o))
  for what in ("lr_mults", "wd_mults"):
    _rules(config[what] or (), what)
  _rules(tuple((r, 1.0) for r in frozen_rules(config)), "frozen")


def kwargs(o) -> dict:
  """optim.kwargs as a plain dict (a config file's dict, or the ConfigDict a workdir's config.json becomes)."""
  k = o.kwargs
  if k is None:
    return {}
  if hasattr(k, "to_dict"):
    k = k.to_dict()
  if not isinstance(k, dict):
    raise ConfigError(
      f"optim.kwargs={k!r} must be a dict of the optimizer's arguments, e.g. --config.optim.kwargs=\"{{'b2': 0.95}}\""
    )
  return dict(k)


# (weight decay argument, its mask argument) of the optax optimizers that decay weights themselves
OWN_DECAY = (
  ("weight_decay", "mask"),
  ("weight_decay", "weight_decay_mask"),
  ("weight_decay_rate", "weight_decay_mask"),
)


# optax functions whose first argument is learning_rate but that are not optimizers vitjax can step with
NOT_OPTIMIZERS = ("lbfgs",)
# optimizers whose own decay is AdamW's, decoupled and scaled by the learning rate (p -= lr * wd * p): the only
# ones where wd_mults other than 0 and 1 can be vitjax's own decay beside theirs
DECOUPLED = ("adamw", "adamaxw", "nadamw", "lion")


def _signature(fn) -> dict:
  try:
    return dict(inspect.signature(fn).parameters) if callable(fn) else {}
  except (TypeError, ValueError):
    return {}


def _is_optimizer(name: str) -> bool:
  fn = getattr(optax, name, None)
  ok = not name.startswith(("_", "scale_by")) and name not in NOT_OPTIMIZERS and not isinstance(fn, type)
  return ok and next(iter(_signature(fn)), None) == "learning_rate"


def optimizer(name: str, kw: dict):
  """(optax's function NAME, its weight-decay argument names or None).

  ConfigError for a name optax lacks or an argument NAME does not take.
  """
  if not _is_optimizer(str(name)):
    near = difflib.get_close_matches(str(name), [n for n in dir(optax) if _is_optimizer(n)], 4, 0.5)
    raise ConfigError(
      f"optim.name={name!r} is not an optax optimizer; {'nearest: ' + ', '.join(near) if near else 'e.g. adamw, sgd, lion, adafactor'}"
      f" (any optax optimizer whose first argument is learning_rate)"
    )
  fn = getattr(optax, name)
  params = _signature(fn)
  own = next((pair for pair in OWN_DECAY if set(pair) <= set(params)), None)
  reserved = {"learning_rate", "weight_decay", *(own or ())}
  for k, v in kw.items():
    if k in reserved:
      raise ConfigError(
        f"optim.kwargs: {k!r} is vitjax's to set (optim.lr and the schedule; optim.weight_decay and wd_mults)"
      )
    if k not in params:
      accepted = [p for p in params if p not in reserved]
      raise ConfigError(f"optim.kwargs: optax.{name} takes no {k!r}; it takes {', '.join(accepted)}")
    if not isinstance(v, (bool, int, float, str, type(None))):
      raise ConfigError(f"optim.kwargs: {k}={v!r} must be a number, a bool, a string or None")
  return fn, own


def _try(name: str, fn, kw: dict) -> None:
  """ConfigError if optax.NAME(**kw) cannot take a step (a value of the wrong type): traced only, nothing computed."""
  try:
    tx = fn(learning_rate=1e-3, **kw)
    params = {"w": jax.ShapeDtypeStruct((2, 2), jnp.float32)}
    jax.eval_shape(lambda p: tx.update(p, tx.init(p), p), params)
  except Exception as e:  # noqa: BLE001 -- whatever optax raises, the arguments are the user's
    why = " ".join(f"{type(e).__name__}: {e}".split())[:200]
    raise ConfigError(
      f"optim.kwargs={kw}: optax.{name} cannot step with them ({why}); give each argument a value of its type "
      f"(see help(optax.{name}))"
    ) from None


def _rules(rules, what: str) -> tuple[tuple[re.Pattern, float], ...]:
  """config.lr_mults / wd_mults / frozen as compiled (regex, value) pairs; ConfigError for a malformed entry."""
  if isinstance(rules, str) or not isinstance(rules, (list, tuple)):
    raise ConfigError(f"config.{what}={rules!r} must be a tuple of rules, e.g. {_EXAMPLES[what]}")
  out = []
  for rule in rules:
    ok = isinstance(rule, (list, tuple)) and len(rule) == 2 and isinstance(rule[0], str)
    ok = ok and isinstance(rule[1], (int, float)) and not isinstance(rule[1], bool) and rule[1] >= 0
    if not ok:
      raise ConfigError(f"config.{what}: {rule!r} is not a (regex, multiplier >= 0) rule, e.g. {_EXAMPLES[what]}")
    try:
      out.append((re.compile(rule[0]), float(rule[1])))
    except re.error as e:
      raise ConfigError(f"config.{what}: {rule[0]!r} is not a regular expression ({e})") from None
  return tuple(out)


_EXAMPLES = {
  "lr_mults": "--config.lr_mults=\"(('pos_embedding', 0.1),)\"",
  "wd_mults": "--config.wd_mults=\"(('.*/bias$', 0.0),)\"",
  "frozen": "--config.frozen=\"('^(?!head/).*',)\"",
}


def _decide(rules, params, what: str, default: float, strict: bool = True):
  """(tree of values, {rule index: [paths it decided]}).

  Each leaf takes the value of the first rule whose regex matches (re.search) its path, else `default`. ConfigError for
  a rule that decides no parameter (strict: the config's own rules; a family's defaults may find nothing to decide).
  """
  compiled = _rules(rules, what)
  decided: dict[int, list[str]] = {i: [] for i in range(len(compiled))}

  def value(path, _):
    name = path_name(path)
    for i, (pattern, v) in enumerate(compiled):
      if pattern.search(name):
        decided[i].append(name)
        return v
    return default

  tree = jax.tree_util.tree_map_with_path(value, params)
  paths = [path_name(p) for p, _ in jax.tree_util.tree_flatten_with_path(params)[0]]
  for i, names in decided.items():
    if not names and strict:
      pattern = compiled[i][0].pattern
      near = difflib.get_close_matches(pattern, paths, 3, 0.0)
      shadow = any(compiled[i][0].search(p) for p in paths)
      why = "every parameter it matches is decided by an earlier rule" if shadow else "it matches no parameter"
      raise ConfigError(
        f"config.{what}: the rule {pattern!r} decides nothing ({why}); nearest paths: {', '.join(near)}"
      )
  return tree, decided


def default_wd_mults(model=None) -> tuple[tuple[str, float], ...]:
  """The model family's weight-decay rules (config.wd_mults=None).

  No decay on the leaves its family names in `no_decay` (biases, norms' scales, positions, bias tables, class tokens,
  ...; every family's when model is None).
  """
  return ((models.registry.no_decay_pattern(model).pattern, 0.0),)


def decay_mask(params, model=None):
  """True where the family's default rules decay a parameter (every family's when `model` is None)."""
  return jax.tree.map(lambda m: m != 0, _decide(default_wd_mults(model), params, "wd_mults", 1.0, strict=False)[0])


def wd_mults(config, model=None) -> tuple:
  """The weight-decay rules, ((regex, multiplier), ...): config.wd_mults, or the model family's when it is None.

  The family's are default_wd_mults(model).
  """
  return tuple(config.wd_mults) if config.wd_mults is not None else default_wd_mults(model)


def frozen_tree(config, params):
  """True for the parameters config.frozen names (any of its regexes matches the path); with adapters, see lora."""
  rules = tuple((r, 1.0) for r in frozen_rules(config))
  if not rules:
    return jax.tree.map(lambda _: False, params)
  tree, _ = _decide(rules, params, "frozen", 0.0, strict=False)
  if all(jax.tree.leaves(tree)):
    raise ConfigError("config.frozen freezes every parameter: nothing would train; leave out what should learn")
  return jax.tree.map(bool, tree)


def lr_mults_tree(config, model, params):
  """Each parameter's learning-rate multiplier.

  Its lr_mults rule's value (1 if none) times, with optim.layer_decay, decay ** (L + 1 - layer) (an array over a scanned
  parameter's stacked layers).
  """
  tree, _ = _decide(config.lr_mults or (), params, "lr_mults", 1.0, strict=False)
  tree = jax.tree.map(np.float32, tree)
  decay = config.optim.layer_decay
  if decay not in (None, 1.0):
    tree = jax.tree.map(lambda m, s: m * s, tree, layer_decay_scales(model, params, decay))
  return tree


def describe(config, model, params) -> list[str]:
  """The run's opening lines about its optimizer: the call, then one line per rule with what it decided."""
  o = config.optim
  _, own = optimizer(o.name, kwargs(o))
  args = ", ".join(f"{k}={v!r}" for k, v in kwargs(o).items())
  how = f"optax's own ({own[0]})" if own else "L2 on the gradient"
  lines = [
    f"optimizer: optax.{o.name}(learning_rate=schedule{', ' + args if args else ''}), weight decay "
    f"{o.weight_decay:g} ({how})"
  ]
  sizes = {path_name(p): int(np.prod(x.shape)) for p, x in jax.tree_util.tree_flatten_with_path(params)[0]}
  count = lambda names: f"{len(names)} tensors, {sum(sizes[n] for n in names):,} values"
  frozen = [n for n, f in zip(sizes, jax.tree.leaves(frozen_tree(config, params))) if f]
  for r in frozen_rules(config):
    names = [n for n in frozen if re.search(r, n)]
    lines.append(f"frozen {r!r}: {count(names)}")
  if frozen:
    lines.append(f"frozen in all: {count(frozen)}; training {count([n for n in sizes if n not in frozen])}")
  for what, rules, default in (
    ("lr_mults", tuple(config.lr_mults or ()), 1.0),
    ("wd_mults" + ("" if config.wd_mults is not None else " (the model family's)"), wd_mults(config, model), 1.0),
  ):
    _, decided = _decide(rules, params, what.split()[0], default, strict=False)
    for i, (pattern, value) in enumerate(rules):
      lines.append(f"{what} {pattern!r} x{value:g}: {count(decided[i])}")
  if o.layer_decay not in (None, 1.0):
    lines.append(
      f"optim.layer_decay {o.layer_decay:g}: learning rate x{o.layer_decay:g}^(L + 1 - layer), L = {model.num_layers}"
    )
  return lines


def layer_decay_scales(model, params, decay: float):
  """The learning-rate multiplier of every parameter: decay ** (L + 1 - model.layer_index(path)).

  L = model.num_layers; an array broadcasting over a scanned (stacked) parameter's first axis. Raises ConfigError for a
  model without layers to count.
  """
  if not hasattr(model, "layer_index"):
    raise ConfigError(
      f"optim.layer_decay applies to ViT and Swin, not to {type(model).__name__}: leave it at 1.0 (off)"
    )

  def scale(path, x):
    layer = np.asarray(model.layer_index(path_name(path)))
    out = decay ** (model.num_layers + 1 - layer.astype(np.float64))
    return out.reshape(out.shape + (1,) * (np.ndim(x) - out.ndim)).astype(np.float32)

  return jax.tree_util.tree_map_with_path(scale, params)


def scale_by_mults(mults) -> optax.GradientTransformation:
  """Multiplies each parameter's update by mults(params)'s entry. Stateless.

  After the optimizer, so that a decoupled weight decay is scaled with the learning rate, as in BEiT's and MAE's
  parameter groups.
  """

  def update(updates, state, params=None):
    del params
    scales = mults(updates)
    return jax.tree.map(lambda u, s: u * jnp.asarray(s, u.dtype), updates, scales), state

  return optax.GradientTransformation(lambda params: optax.EmptyState(), update)


class DecayState(NamedTuple):
  """decoupled_weight_decay's state: `count`, an int32 scalar, the schedule's step (skipped steps count: kept_state)."""

  count: jax.Array


def decoupled_weight_decay(schedule, weight_decay: float, mults) -> optax.GradientTransformation:
  """AdamW's decoupled decay, a multiplier per parameter: update -= schedule(step) * weight_decay * mult * param.

  For an optimizer whose own decay wd_mults other than 0 and 1 cannot scale.
  """

  def update(updates, state, params=None):
    lr = schedule(state.count)
    scales = mults(params)
    updates = jax.tree.map(lambda u, p, m: u - (lr * weight_decay * m) * p.astype(u.dtype), updates, params, scales)
    return updates, DecayState(state.count + 1)

  return optax.GradientTransformation(lambda params: DecayState(jnp.zeros((), jnp.int32)), update)


def l2_weight_decay(weight_decay: float, mults) -> optax.GradientTransformation:
  """L2 weight decay, before an optimizer without a decay of its own: grad += weight_decay * mult * param. Stateless."""

  def update(updates, state, params=None):
    scales = mults(params)
    return jax.tree.map(lambda u, p, m: u + (weight_decay * m) * p.astype(u.dtype), updates, params, scales), state

  return optax.GradientTransformation(lambda params: optax.EmptyState(), update)


def make_optimizer(config, schedule, model=None) -> optax.GradientTransformation:
  """The config's optimizer; ``model`` is needed for the family's default wd_mults and optim.layer_decay.

  The chain, outermost first: [frozen: optax.multi_transform, the frozen parameters' updates zero and stateless]
  -> [global-norm clipping] -> the optimizer with its weight decay -> [lr multipliers] -> [EMA]. For a config
  without lr_mults, frozen or wd_mults other than 0 and 1 it is the chain vitjax built before these rules existed,
  so older checkpoints resume.
  """
  check(config)
  o = config.optim
  fn, own = optimizer(o.name, kwargs(o))
  rules = wd_mults(config, model)
  wd_tree = lambda params: _decide(rules, params, "wd_mults", 1.0, strict=False)[0]
  mask = lambda params: jax.tree.map(lambda m: m != 0, wd_tree(params))
  binary = all(v in (0.0, 1.0) for _, v in rules)
  if own and not binary and o.weight_decay and o.name not in DECOUPLED:
    raise ConfigError(
      f"config.wd_mults: multipliers other than 0 and 1 scale a decoupled decay (p -= lr * wd * p: "
      f"{', '.join(DECOUPLED)}) or L2 on the gradient (optimizers without a decay of their own, e.g. sgd, adam); "
      f"optax.{o.name}'s own decay is on or off per parameter: use 0 and 1"
    )
  if own:
    decay, decay_mask = own
    tx = fn(schedule, **{decay: o.weight_decay if binary else 0.0, decay_mask: mask}, **kwargs(o))
    if not binary and o.weight_decay:
      tx = optax.chain(tx, decoupled_weight_decay(schedule, o.weight_decay, wd_tree))
  elif binary:
    tx = optax.chain(optax.add_decayed_weights(o.weight_decay, mask=mask), fn(schedule, **kwargs(o)))
  else:
    tx = optax.chain(l2_weight_decay(o.weight_decay, wd_tree), fn(schedule, **kwargs(o)))
  layer_decay = o.layer_decay not in (None, 1.0)
  if layer_decay and model is None:
    raise ValueError("make_optimizer needs the model for optim.layer_decay")
  if layer_decay and not hasattr(model, "layer_index"):
    layer_decay_scales(model, {}, o.layer_decay)  # the ConfigError
  if config.lr_mults or layer_decay:
    tx = optax.chain(tx, scale_by_mults(lambda params: lr_mults_tree(config, model, params)))
  if o.grad_clip_norm:
    tx = optax.chain(optax.clip_by_global_norm(o.grad_clip_norm), tx)
  if frozen_rules(config):
    labels = lambda params: jax.tree.map(lambda f: "frozen" if f else "train", frozen_tree(config, params))
    tx = optax.multi_transform({"train": tx, "frozen": optax.set_to_zero()}, labels)
  if config.ema_decay:
    tx = optax.chain(tx, track_ema(config.ema_decay))

  def init(params):  # the rules checked once, on all the parameters, when the state is built (before any write)
    check_rules(config, model, params)
    return tx.init(params)

  return tx._replace(init=init)


def check_rules(config, model, params) -> None:
  """ConfigError for a config.lr_mults, wd_mults (when given) or frozen rule that decides no parameter.

  It names the nearest paths. Also for frozen rules that leave nothing to train. (Inside the optimizer a rule sees only
  the parameters that train, where a rule about frozen ones would find nothing: the check is here, once.)
  """
  _decide(config.lr_mults or (), params, "lr_mults", 1.0)
  if config.wd_mults is not None:
    _decide(tuple(config.wd_mults), params, "wd_mults", 1.0)
  for r in frozen_rules(config):  # any of them freezes a parameter: each must match one, overlaps are fine
    _decide(((r, 1.0),), params, "frozen", 0.0)
  if frozen_rules(config):
    frozen_tree(config, params)


def kept_state(applied, new_state, old_state):
  """The optimizer state after a step: `new_state` if `applied` (a traced bool), else `old_state` but for its counts.

  The schedule's step counts (optax.ScaleByScheduleState, DecayState) go on with the run's step, as the step count
  does: the learning rate of every later step is the one logged (train/lr = schedule(step)), and the schedule still
  ends at total_steps. The optimizer's own counts (Adam's bias
  correction) are those of the updates applied.
  """
  counts = lambda x: isinstance(x, (optax.ScaleByScheduleState, DecayState))
  pick = lambda n, o: n if counts(n) else jax.tree.map(lambda a, b: jnp.where(applied, a, b), n, o)
  return jax.tree.map(pick, new_state, old_state, is_leaf=counts)


class EmaState(NamedTuple):
  """track_ema's state: `ema`, the moving average of the parameters, a tree laid out like them."""

  ema: Any  # like the parameters


def track_ema(decay: float) -> optax.GradientTransformation:
  """Leaves the updates as they are and keeps, in its state, the exponential moving average of the parameters.

  The parameters are those the updates produce: ema <- decay * ema + (1 - decay) * (params + updates), starting from the
  initial parameters. Last in the chain, it sees the final updates; in the optimizer state, it is checkpointed with it,
  laid out like the parameters, and left as it was by a step the divergence guard rejects.
  """

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
