"""Low-rank adapters (vitjax.models.lora): zero at the start, merged exactly, the base untouched, bad input refused."""

import flax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vitjax import mesh as mesh_lib
from vitjax.config import default_config
from vitjax.errors import ConfigError
from vitjax.models import lora
from vitjax.models.network import network
from vitjax.train import optim

X = jnp.asarray(np.random.default_rng(0).normal(size=(2, 32, 32, 1)), jnp.float32)


def _net(**lora_fields):
  c = default_config()
  c.model.depth = 2
  for k, v in lora_fields.items():
    c.lora[k] = v
  return c, network(c, {"num_classes": 10}, (X,), mesh_lib.Layout.of(c).mesh())


def _logits(net, params, ms):
  out = net.model.apply({"params": params, **ms}, X)
  return np.asarray(out[0] if isinstance(out, tuple) else out)


def test_zero_adapters_leave_the_base_outputs_bitwise():
  _, base = _net()
  c, net = _net(rank=4)
  p0, ms = base.init()
  p1, _ = net.init()
  assert lora.has_adapters(p1) and not lora.has_adapters(p0)
  np.testing.assert_array_equal(_logits(base, p0, ms), _logits(net, p1, ms))


def test_merged_export_equals_the_adapted_model():
  c, net = _net(rank=4, alpha=8.0)
  p, ms = net.init()
  rng = np.random.default_rng(1)
  p = jax.tree_util.tree_map_with_path(
    lambda k, v: rng.normal(size=v.shape).astype(np.float32) * 0.1 if "lora_b" in str(k) or "head" in str(k) else v, p
  )
  _, base = _net()
  adapted, merged = _logits(net, p, ms), _logits(base, lora.merged(p), ms)
  unadapted = jax.tree_util.tree_map_with_path(lambda k, v: v * 0 if "lora_b" in str(k) else v, p)
  assert np.abs(adapted - _logits(net, unadapted, ms)).max() > 1e-3  # the adapters do something
  np.testing.assert_allclose(merged, adapted, rtol=1e-5, atol=1e-5)


def test_only_adapters_and_head_train():
  c, net = _net(rank=2)
  p, _ = net.init()
  frozen = optim.frozen_tree(c, p)
  flat = {mesh_lib.path_name(k): v for k, v in jax.tree_util.tree_leaves_with_path(frozen)}
  train = sorted(k for k, f in flat.items() if not f)
  assert all(k.endswith(("lora_a", "lora_b")) or k.startswith("head/") for k in train)
  assert any(k.startswith("head/") for k in train) and not any(k.endswith("lora_scale") for k in train)


@pytest.mark.parametrize(
  "fields, line",
  [
    (dict(rank=4, targets=("nosuchlayer$",)), "matches no Dense layer"),
    (dict(rank=4096), "is larger than"),
    (dict(rank=-1), "must be a positive int"),
    (dict(rank=4, alpha=-1.0), "must be positive"),
  ],
)
def test_bad_lora_settings_are_one_line(fields, line):
  with pytest.raises(ConfigError, match=line):
    _net(**fields)


def test_timm_names_select_the_same_layers():
  _, a = _net(rank=2, targets=("qkv",))
  _, b = _net(rank=2, targets=("attn/(query|key|value)$",))
  assert jax.tree.map(lambda x: x.shape, a.abstract) == jax.tree.map(lambda x: x.shape, b.abstract)


def test_an_adapter_run_keeps_its_base_bitwise_and_exports_merged(tmp_path, run_args, finished_run):
  import train_helpers as th

  import vitjax
  from vitjax import convert

  workdir = str(tmp_path / "lora")
  proc = th.check_ok(th.run_main(workdir, *run_args, f"--config.init_from={finished_run}", "--config.lora.rank=4"))
  assert "frozen in all" in proc.stderr
  base, tuned = th.load_state(finished_run)["params"], th.load_state(workdir)["params"]
  flat = lambda t: {mesh_lib.path_name(k): v for k, v in jax.tree_util.tree_leaves_with_path(t)}
  base, tuned = flat(base), flat(tuned)
  for k, v in base.items():
    if not k.startswith("head/"):
      np.testing.assert_array_equal(tuned[k], v, err_msg=k)  # frozen: bitwise the base's
  assert any(np.abs(v).max() > 0 for k, v in tuned.items() if k.endswith("lora_b"))  # the adapters learned
  out = str(tmp_path / "m.npz")
  from vitjax.export import export

  export(workdir, "npz", out, checkpoint="latest")
  trained = vitjax.load(workdir, "latest")
  images = np.random.default_rng(0).uniform(size=(4, 8, 8, 1)).astype(np.float32)
  merged = dict(trained.variables, params=lora.merged(trained.variables["params"]))
  assert set(convert.to_vit_npz(trained.model, merged)) == set(np.load(out).files)
  a = trained.model.apply(trained.variables, images, train=False)[0]
  b = trained.model.apply(merged, images, train=False)[0]
  np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-5, atol=1e-5)


def test_adapter_dropout_drops_the_adapters_inputs_in_training_only():
  c, net = _net(rank=4, dropout=0.5)
  _, plain = _net(rank=4)
  p, ms = net.init()
  assert lora.has_adapters(p) and optim.frozen_tree(c, p)["encoder"]["block_0"]["attn"]["query"]["lora_dropout"]
  rng = np.random.default_rng(2)
  p = jax.tree_util.tree_map_with_path(
    lambda k, v: rng.normal(size=v.shape).astype(np.float32) * 0.1 if "lora_b" in str(k) else v, p
  )
  flat = flax.traverse_util.flatten_dict(p, sep="/")
  without = flax.traverse_util.unflatten_dict({k: v for k, v in flat.items() if "lora_dropout" not in k}, sep="/")
  assert len(flat) > len(flax.traverse_util.flatten_dict(without))
  # evaluation (no dropout RNG): the model without dropout's, bitwise
  np.testing.assert_array_equal(_logits(net, p, ms), _logits(plain, without, ms))
  features = lambda **kw: np.asarray(net.model.apply({"params": p, **ms}, X, **kw)[1]["pre_logits"])
  train = lambda key: features(rngs={"dropout": jax.random.key(key)})  # (the head starts at zero: its input)
  assert np.abs(train(0) - features()).max() > 1e-4 and np.abs(train(0) - train(1)).max() > 1e-4
  np.testing.assert_array_equal(train(0), train(0))
  assert lora.merged(p).keys() == lora.merged(without).keys()
  with pytest.raises(ConfigError, match="must be in"):
    _net(rank=4, dropout=1.0)
