"""The optimizer from the config (vitjax.train.optim): any optax optimizer by name, per-parameter rules by regex
(lr_mults, wd_mults, frozen), each checked by what it does to one update, and the chain of a plain config kept as
it was (older checkpoints resume)."""

import re

import jax
import jax.numpy as jnp
import ml_collections as mlc
import numpy as np
import optax
import pytest

from vitjax import models
from vitjax.config import default_config
from vitjax.errors import ConfigError
from vitjax.mesh import path_name
from vitjax.train import optim

LR = 0.1


def _setup(**fields):
  c = default_config()
  c.optim.lr, c.optim.weight_decay, c.optim.grad_clip_norm = LR, 0.0, 0.0
  for key, value in fields.items():
    node, *rest = key.split("__")
    if rest:
      c[node][rest[0]] = value
    else:
      c[key] = value
  model = models.create("Ti/2", width=16, depth=2, num_heads=2, mlp_dim=32, num_classes=10)
  params = model.init(jax.random.key(0), jnp.zeros((1, 8, 8, 1)))["params"]
  return c, model, params


def _by_path(tree) -> dict:
  """{'encoder/.../kernel': numpy array} of a parameter-shaped tree."""
  return {path_name(p): np.asarray(x) for p, x in jax.tree_util.tree_flatten_with_path(tree)[0]}


def _update(c, model, params, grads=None):
  """One update of params at a constant learning rate LR (the schedule's value)."""
  tx = optim.make_optimizer(c, optax.constant_schedule(LR), model)
  grads = grads if grads is not None else jax.tree.map(jnp.ones_like, params)
  updates, state = tx.update(grads, tx.init(params), params)
  return _by_path(updates), state


def test_lr_mults_scale_the_update_the_first_matching_rule_decides():
  c, model, params = _setup()
  base, _ = _update(c, model, params)
  c.lr_mults = (("pos_embedding", 0.1), ("encoder/.*kernel$", 0.5), ("kernel$", 3.0))
  scaled, _ = _update(c, model, params)
  first = lambda path: next((v for r, v in c.lr_mults if re.search(r, path)), 1.0)
  assert sorted({first(p) for p in base}) == [0.1, 0.5, 1.0, 3.0]  # every rule decides some parameter
  for path, u in base.items():
    np.testing.assert_allclose(scaled[path], first(path) * u, rtol=1e-6, err_msg=path)


def test_wd_mults_scale_the_decoupled_decay_and_the_family_default_spares_biases():
  c, model, params = _setup(optim__weight_decay=0.5)
  flat = _by_path(params)
  zero = jax.tree.map(jnp.zeros_like, params)
  default, _ = _update(c, model, params, zero)  # zero gradients: Adam's step is 0, the update is the decay alone
  for path, u in default.items():
    decays = not path.endswith(("bias", "scale", "pos_embedding", "cls"))
    np.testing.assert_allclose(u, -LR * 0.5 * flat[path] * decays, rtol=1e-6, atol=1e-9, err_msg=path)
  # not 0 or 1: vitjax's decoupled decay beside adamw's (on the patch embedding: the head starts at zeros)
  c.wd_mults = (("^embedding/kernel$", 2.0), ("bias$", 0.0))
  assert np.abs(flat["embedding/kernel"]).min() > 0
  scaled, _ = _update(c, model, params, zero)
  for path, u in scaled.items():
    mult = 2.0 if path == "embedding/kernel" else 0.0 if path.endswith("bias") else 1.0
    np.testing.assert_allclose(u, -LR * 0.5 * mult * flat[path], rtol=1e-6, atol=1e-9, err_msg=path)
  c.optim.name = "sgd"  # no decay of its own: L2 on the gradient, then the step
  sgd, _ = _update(c, model, params, zero)
  for path, u in sgd.items():
    mult = 2.0 if path == "embedding/kernel" else 0.0 if path.endswith("bias") else 1.0
    np.testing.assert_allclose(u, -LR * 0.5 * mult * flat[path], rtol=1e-6, atol=1e-9, err_msg=path)


def test_frozen_parameters_do_not_move_and_have_no_optimizer_state():
  c, model, params = _setup(frozen=("^(?!head/).*",), ema_decay=0.9)
  updates, state = _update(c, model, params)
  assert {p for p, u in updates.items() if np.any(u)} == {"head/kernel", "head/bias"}
  moments = [x for x in jax.tree.leaves(state) if np.ndim(x) > 0]
  trained_and_ema = 2 * 2 + len(jax.tree.leaves(params))  # Adam's mu and nu of the head; the EMA of everything
  assert len(moments) == trained_and_ema
  c.frozen, c.lr_mults = ("^(?!head/).*",), (("pos_embedding", 0.1),)  # a rule may name a frozen parameter
  updates, _ = _update(c, model, params)
  assert {p for p, u in updates.items() if np.any(u)} == {"head/kernel", "head/bias"}
  c.frozen = (".*",)
  with pytest.raises(ConfigError, match="freezes every parameter"):
    _update(c, model, params)


def test_any_optax_optimizer_by_name_with_its_own_arguments():
  for name, kwargs in (("lion", {"b1": 0.95}), ("adafactor", {"decay_rate": 0.8}), ("sgd", {"momentum": 0.9})):
    c, model, params = _setup(optim__name=name, optim__kwargs=kwargs, optim__weight_decay=0.1)
    updates, _ = _update(c, model, params)
    assert all(np.isfinite(u).all() for u in updates.values()) and any(np.any(u) for u in updates.values())
  c, model, params = _setup(optim__name="adamm")
  with pytest.raises(ConfigError, match="nearest: .*adamw"):
    _update(c, model, params)
  c, model, params = _setup(optim__kwargs={"weight_decay": 0.1})
  with pytest.raises(ConfigError, match="vitjax's to set"):
    _update(c, model, params)


def test_rules_that_decide_nothing_are_errors_naming_the_nearest_paths():
  c, model, params = _setup(lr_mults=(("pos_embeding", 0.1),))
  with pytest.raises(ConfigError, match=r"'pos_embeding' decides nothing \(it matches no parameter\).*pos_embedding"):
    _update(c, model, params)
  c.lr_mults = (("kernel", 0.5), ("head/kernel", 2.0))  # shadowed: the first rule takes head/kernel
  with pytest.raises(ConfigError, match="decided by an earlier rule"):
    _update(c, model, params)


def test_the_plain_chain_is_the_one_older_checkpoints_hold():
  """adamw with the family's weight decay, clipping and EMA builds the same optax chain (state structure and
  values) as before these rules: optax.adamw with a decay mask, clipped, then the EMA."""
  c, model, params = _setup(optim__weight_decay=0.05, optim__grad_clip_norm=1.0, ema_decay=0.9)
  schedule = optax.constant_schedule(LR)
  tx = optim.make_optimizer(c, schedule, model)
  before = optax.chain(
    optax.chain(
      optax.clip_by_global_norm(1.0),
      optax.adamw(schedule, weight_decay=0.05, mask=lambda p: optim.decay_mask(p, model)),
    ),
    optim.track_ema(0.9),
  )
  assert jax.tree.structure(tx.init(params)) == jax.tree.structure(before.init(params))
  grads = jax.tree.map(lambda p: jnp.sin(p) + 0.1, params)
  ours, theirs = tx.update(grads, tx.init(params), params)[0], before.update(grads, before.init(params), params)[0]
  jax.tree.map(np.testing.assert_array_equal, ours, theirs)


def test_describe_gives_one_line_per_rule_with_what_it_matched():
  c, model, params = _setup(lr_mults=(("pos_embedding", 0.1),), frozen=("^embedding/",), optim__kwargs={"b2": 0.95})
  lines = optim.describe(c, model, params)
  assert lines[0].startswith("optimizer: optax.adamw(learning_rate=schedule, b2=0.95)")
  assert "frozen '^embedding/': 2 tensors" in "\n".join(lines)
  assert any(line.startswith("lr_mults 'pos_embedding' x0.1: 1 tensors") for line in lines)
  assert any(line.startswith("wd_mults (the model family's)") for line in lines)


def test_kwargs_read_back_from_a_workdir_as_a_configdict():
  c, model, params = _setup()
  c.optim.kwargs = mlc.ConfigDict({"b2": 0.95})  # what config.json gives back
  assert optim.kwargs(c.optim) == {"b2": 0.95}


def test_malformed_options_are_one_config_error_each():
  c, model, params = _setup()
  for field, value, says in (
    ("optim__kwargs", "b2", "must be a dict"),
    ("optim__kwargs", {"b2": [0.9]}, "must be a number"),
    ("wd_mults", (("bias",),), r"is not a \(regex, multiplier >= 0\) rule"),
    ("lr_mults", (("(", 0.1),), "is not a regular expression"),
    ("optim__name", "lbfgs", "is not an optax optimizer"),
  ):
    c, model, params = _setup(**{field: value})
    with pytest.raises(ConfigError, match=says):
      _update(c, model, params)


def test_optax_partials_are_optimizers_and_frozen_regexes_may_overlap():
  for name in ("nadamw", "nadam"):  # functools.partial objects in optax
    c, model, params = _setup(optim__name=name)
    updates, _ = _update(c, model, params)
    assert any(np.any(u) for u in updates.values())
  c, model, params = _setup(frozen=("^encoder/", "^encoder/block_0/"))  # any of them freezes: overlap is fine
  updates, _ = _update(c, model, params)
  assert not any(np.any(u) for p, u in updates.items() if p.startswith("encoder/"))


def test_fractional_wd_mults_only_where_the_decay_is_decoupled_or_l2():
  rules = (("head/kernel", 0.5),)
  for name, ok in (("adamw", True), ("lion", True), ("sgd", True), ("adafactor", False), ("lamb", False)):
    c, model, params = _setup(optim__name=name, optim__weight_decay=0.1, wd_mults=rules)
    if ok:
      _update(c, model, params)
    else:
      with pytest.raises(ConfigError, match="on or off per parameter"):
        _update(c, model, params)


def test_l2_decay_of_an_optimizer_without_its_own_spares_the_familys_no_decay_parameters():
  c, model, params = _setup(optim__name="sgd", optim__weight_decay=0.5)  # wd_mults None: the family's rules
  flat = _by_path(params)
  updates, _ = _update(c, model, params, jax.tree.map(jnp.zeros_like, params))  # the decay alone
  for path, u in updates.items():
    decays = not path.endswith(("bias", "scale", "pos_embedding", "cls"))
    np.testing.assert_allclose(u, -LR * 0.5 * flat[path] * decays, rtol=1e-6, atol=1e-9, err_msg=path)


def test_vitjaxs_decoupled_decay_takes_each_steps_learning_rate():
  """wd_mults other than 0 and 1 beside adamw: update -= schedule(step) * weight_decay * mult * param, the schedule
  read at the step the update is for (as adamw's own decay reads it)."""
  c, model, params = _setup(optim__weight_decay=0.5, wd_mults=(("^embedding/kernel$", 2.0),))
  flat = _by_path(params)
  assert np.abs(flat["embedding/kernel"]).min() > 0
  schedule = lambda count: LR / (1.0 + count)
  tx = optim.make_optimizer(c, schedule, model)
  zero, state = jax.tree.map(jnp.zeros_like, params), tx.init(params)
  for step in range(3):  # zero gradients: Adam's step is 0, the update is the decay alone
    updates, state = tx.update(zero, state, params)
    for path, u in _by_path(updates).items():
      mult = 2.0 if path == "embedding/kernel" else 1.0
      np.testing.assert_allclose(u, -schedule(step) * 0.5 * mult * flat[path], rtol=1e-6, atol=1e-9, err_msg=path)
