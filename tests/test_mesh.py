"""Shardings on a device mesh: optimizer state follows its parameter exactly, by tree position, even where two
parameters of one shape follow different rules (8 simulated CPU devices, in a subprocess)."""

import json
import subprocess
import sys
import textwrap

import train_helpers as th

SCRIPT = textwrap.dedent("""
  import json
  import jax
  import ml_collections as mlc
  from jax.sharding import PartitionSpec as P
  from vitjax import tasks
  from vitjax.config import default_config
  from vitjax.train import state as state_lib

  name = lambda path: "/".join(str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k)))) for k in path)
  out = []
  for optimizer, kwargs, frozen in CASES:
    c = default_config()
    c.model = mlc.ConfigDict(dict(name="Ti/2", width=16, depth=1, num_heads=8, mlp_dim=32, num_classes=10))
    c.optim.name, c.optim.kwargs, c.frozen = optimizer, kwargs, frozen
    # query/key/value kernels are all [16, 8, 2]: only the query's heads are split over the 8 devices.
    c.sharding_rules = ((r"attn/query/kernel$", (None, "data", None)),)
    # A task described as a trained run's task.json would be: no dataset needed.
    task = tasks.get(c, "/nonexistent", described={"image_size": [8, 8], "channels": 1, "num_classes": 10})
    exp = state_lib.setup(c, task)
    state = jax.jit(exp.init_state, out_shardings=exp.state_sharding)()  # real arrays laid out on the mesh
    params = {name(p): (a.shape, a.sharding.spec) for p, a in jax.tree_util.tree_leaves_with_path(state.params)}
    moments = {}
    for path, a in jax.tree_util.tree_leaves_with_path(state.opt_state):
      keys = [str(getattr(k, "name", getattr(k, "key", ""))) for k in path]
      for field in ("mu", "nu", "trace", "v_row", "v_col"):
        if field in keys:
          moments[field + ":" + name(path[keys.index(field) + 1 :])] = (a.shape, a.sharding.spec)
    out.append({"devices": jax.device_count(),
                "params": {k: [list(s), str(p)] for k, (s, p) in params.items()},
                "moments": {k: [list(s), str(p)] for k, (s, p) in moments.items()}})
  print(json.dumps(out))
""")
# (optimizer, kwargs, frozen) of each case, set up in one process (one compilation cache, one start)
CASES = [
  ("adamw", {}, ()),
  ("sgd", {"momentum": 0.9}, ()),
  ("adamw", {}, ("^(?!encoder/block_0/attn/).*",)),
  ("adafactor", {}, ()),
]


def _run() -> list[dict]:
  proc = subprocess.run(
    [sys.executable, "-c", SCRIPT.replace("CASES", repr(CASES))],
    cwd=th.ROOT,
    env=th.env(devices=8),
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  return json.loads(proc.stdout.strip().splitlines()[-1])


def test_optimizer_state_takes_its_parameters_sharding_not_a_same_shape_ones():
  """Adam's moments and SGD's momentum take their own parameter's sharding (never a same-shape parameter's);
  with config.frozen (optax.multi_transform) only the trained parameters have moments (the frozen ones' entries
  are optax.MaskedNode, no array), each sharded like its parameter; Adafactor's factored statistics, laid out
  like the parameters but of other shapes, are replicated."""
  adamw, sgd, frozen, adafactor = _run()
  for out, fields in ((adamw, ("mu", "nu")), (sgd, ("trace",))):
    assert out["devices"] == 8
    params = out["params"]
    query, key = params["encoder/block_0/attn/query/kernel"], params["encoder/block_0/attn/key/kernel"]
    assert query[0] == key[0] == [16, 8, 2]  # same shape ...
    assert query[1] == "P(None, 'data', None)" and key[1] == "P()"  # ... different rules
    for field in fields:
      for pname, (shape, spec) in params.items():
        assert out["moments"][f"{field}:{pname}"] == [shape, spec], (field, pname)
    assert len(out["moments"]) == len(fields) * len(params)
  params = frozen["params"]
  trained = {k: v for k, v in params.items() if k.startswith("encoder/block_0/attn/")}
  assert 0 < len(trained) < len(params) and params["encoder/block_0/attn/query/kernel"][1] == "P(None, 'data', None)"
  assert frozen["moments"] == {f"{f}:{k}": v for f in ("mu", "nu") for k, v in trained.items()}
  rows = {k: v for k, v in adafactor["moments"].items() if k.endswith("attn/query/kernel")}
  assert rows and all(spec == "P()" for _, spec in rows.values()), rows  # factored: not the [16, 8, 2] kernel's


def test_tp_splits_scanned_blocks_like_unscanned_ones():
  """With model.scan the blocks' weights are stacked on a leading layer axis: tp's rules, aligned to the right,
  split the same dimension as without scan (it used to leave every scanned weight replicated, silently)."""
  import jax
  import jax.numpy as jnp
  from jax.sharding import PartitionSpec

  from vitjax import mesh as mesh_lib
  from vitjax import models

  def split(scan, block):
    model = models.create("Ti/2", width=32, depth=2, num_heads=4, mlp_dim=64, num_classes=10, scan=scan)
    params = jax.eval_shape(lambda: model.init(jax.random.key(0), jnp.zeros((1, 8, 8, 1))))["params"]
    specs = mesh_lib.param_specs(
      params, {"data": 2, "fsdp": 1, "tensor": 4}, "tp", tp_rules=models.registry.tp_rules(model)
    )
    leaves = jax.tree_util.tree_leaves_with_path(specs, is_leaf=lambda x: isinstance(x, PartitionSpec))
    return {mesh_lib.path_name(p).split(block)[-1]: tuple(s) for p, s in leaves if block in mesh_lib.path_name(p)}

  plain, scanned = split(False, "block_0/"), split(True, "blocks/block/")
  assert sorted(plain) == sorted(scanned) and len(plain) >= 10
  for name, spec in plain.items():
    if "tensor" in spec:
      assert scanned[name] == (None, *spec), name
  assert sum("tensor" in s for s in scanned.values()) == 10  # q/k/v kernels and biases, out, fc1 kernel and bias, fc2


def test_layout_resolves_config_mesh_and_names_the_fix():
  import ml_collections as mlc
  import pytest

  from vitjax import mesh as mesh_lib
  from vitjax.errors import ConfigError

  assert mesh_lib.mesh_sizes((("data", -1), ("tensor", 2)), num_devices=8) == {"data": 4, "fsdp": 1, "tensor": 2}
  assert mesh_lib.mesh_sizes((("fsdp", 2), ("data", -1)), num_devices=8) == {"data": 4, "fsdp": 2, "tensor": 1}
  layout = mesh_lib.Layout.of(mlc.ConfigDict({}))  # no config.mesh: every device on data
  assert (layout.data, layout.fsdp, layout.tensor, layout.batch_shards) == (1, 1, 1, 1)
  assert dict(layout.mesh().shape) == {"data": 1, "fsdp": 1, "tensor": 1}
  for bad, says in (
    ((("tensor", 2),), "uses 2 devices"),
    ((("pipe", -1),), "unknown axis"),
    ((("data", 0),), "at least 1"),
  ):
    with pytest.raises(ConfigError, match=says):
      mesh_lib.Layout.of(mlc.ConfigDict({"mesh": bad}))


def test_a_run_resolves_config_mesh_once(data_dir, tmp_path, monkeypatch):
  """The trainer resolves config.mesh into one Layout that the task and setup() share (it was parsed five times)."""
  from vitjax import mesh as mesh_lib
  from vitjax import train
  from vitjax.config import load_module

  calls, of = [], mesh_lib.Layout.of.__func__
  monkeypatch.setattr(mesh_lib.Layout, "of", classmethod(lambda cls, c: calls.append(1) or of(cls, c)))
  config = load_module(th.CONFIG).get_config()
  config.model.update(width=16, depth=1, num_heads=2, mlp_dim=32)
  config.update(batch_size=32, total_steps=2, log_every=1, eval_every=2, checkpoint_every=2)
  config.data.update(eval_batch_size=64, data_dir=data_dir)
  assert train.train(config, str(tmp_path / "wd"))["step"] == 2
  assert len(calls) == 1


def test_fsdp_specs_and_mesh_sizes_at_their_edges():
  """fsdp shards a parameter of exactly FSDP_MIN_SIZE elements (smaller ones stay whole) on its largest dimension,
  the first of equal ones; one no dimension of which the axis divides stays whole. An axis given twice (once as the
  rest) and a rest that the devices do not divide into are errors, not a silent other mesh."""
  import jax
  import pytest
  from jax.sharding import PartitionSpec as P

  from vitjax import mesh as mesh_lib
  from vitjax.errors import ConfigError

  n = mesh_lib.FSDP_MIN_SIZE
  shapes = {"exact": (n,), "small": (n - 1,), "square": (64, 64), "tall": (16, 128), "odd": (31, 33)}
  params = {k: jax.ShapeDtypeStruct(s, "float32") for k, s in shapes.items()}
  specs = mesh_lib.param_specs(params, {"data": 1, "fsdp": 2, "tensor": 1}, "fsdp")
  assert specs == {
    "exact": P("fsdp"),
    "small": P(),
    "square": P("fsdp"),
    "tall": P(None, "fsdp"),
    "odd": P(),
  }
  with pytest.raises(ConfigError, match="gives 2 axes to exact"):
    mesh_lib.param_specs(params, {"data": 1, "fsdp": 2, "tensor": 1}, "dp", rules=((r"^exact$", ("fsdp", None)),))
  for mesh, says in (
    ((("data", -1), ("data", 2)), "axis 'data' is given twice"),
    ((("data", 2), ("data", -1)), "axis 'data' is given twice"),
    ((("tensor", 3), ("data", -1)), "the 8 devices do not divide"),
  ):
    with pytest.raises(ConfigError, match=says):
      mesh_lib.mesh_sizes(mesh, num_devices=8)
