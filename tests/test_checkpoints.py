"""Checkpoints: the reader (vitjax.models.checkpoints), the writer (vitjax.train.checkpoints) and a network's weights
from them or from other sources (vitjax.pretrained).

The faults a run survives through them (SIGTERM, SIGKILL, corrupt steps in a run) are test_faults.py's.
"""

import json
import os

import numpy as np
import pytest


def test_a_non_finite_evaluation_is_recorded_but_never_best(tmp_path):
  import jax.numpy as jnp

  from vitjax.train import Checkpoints

  state = {"w": jnp.arange(4.0)}
  with Checkpoints(str(tmp_path), "eval/accuracy", "max", keep=10) as ckpts:
    for step, acc in ((1, 0.5), (2, float("nan")), (3, 0.4), (4, float("inf"))):
      ckpts.save(step, state, "{}", metrics={"eval/accuracy": acc})
    ckpts.wait()
    assert ckpts.best_step() == 1
    assert ckpts.candidates("best") == [1, 3, 4, 2]
    assert np.isnan(ckpts.metrics(2)["eval/accuracy"])  # evaluated (not re-run on resume), just not finite


def test_a_data_position_that_differs_from_its_checksum_is_corrupt(tmp_path):
  """The data iterator's position is checked like the arrays. A reader (evaluation, vitjax.load) names the corruption
  of a step asked for by number, falls back for 'latest' and moves nothing; training resumes from the step before
  and sets the bad one aside in corrupt/. A read without the position (evaluation) still takes the step."""
  import jax
  import jax.numpy as jnp

  from vitjax.errors import ConfigError
  from vitjax.models.checkpoints import Checkpoints as Reader
  from vitjax.train import Checkpoints

  workdir = str(tmp_path)
  with Checkpoints(workdir, "eval/accuracy", "max", keep=10) as ckpts:
    for step in (1, 2):
      ckpts.save(step, {"w": jnp.arange(4.0) + step}, json.dumps({"pos": step}))
  with open(os.path.join(workdir, "checkpoints", "2", "data", "metadata"), "w") as f:
    json.dump(json.dumps({"pos": 3}), f)
  abstract = jax.eval_shape(lambda: {"w": jnp.zeros(4)})
  with Reader(workdir, "eval/accuracy", "max") as ckpts:
    says = r"checkpoint 2 in .* is corrupt \(the data position differs from its checksum\); the workdir keeps \[1\]"
    with pytest.raises(ConfigError, match=says):
      ckpts.restore("2", abstract)
    step, state, data = ckpts.restore("latest", abstract)
    assert (step, json.loads(data)) == (1, {"pos": 1})
    np.testing.assert_array_equal(state["w"], np.arange(4.0) + 1)
    assert ckpts.restore("latest", abstract, with_data=False)[0] == 2
  assert not os.path.exists(os.path.join(workdir, "corrupt"))
  with Checkpoints(workdir, "eval/accuracy", "max", keep=10) as ckpts:
    assert ckpts.restore("latest", abstract)[0] == 1 and ckpts.steps() == [1]
  (moved,) = os.listdir(os.path.join(workdir, "corrupt"))
  assert moved.startswith("2-")


@pytest.mark.parametrize(
  "mode, values",
  [
    ("max", (0.5, 0.7, float("nan"), 0.7, float("inf"), 0.2)),
    ("min", (0.5, 0.3, float("nan"), 0.3, -float("inf"), 0.6)),
  ],
)
def test_the_best_finite_step_is_kept_beside_the_latest_the_later_on_a_tie(tmp_path, mode, values):
  """keep_checkpoints=1: the latest step and the best evaluated one by `best` ('max' or 'min' by its evaluator; a
  non-finite evaluation is never best, of two equal ones the later is); the others are deleted. With all kept,
  --checkpoint=best tries them best first, then the unranked ones from the latest."""
  import jax.numpy as jnp

  from vitjax.train import Checkpoints

  with Checkpoints(str(tmp_path), "eval/metric", mode, keep=1) as ckpts:
    for step, value in enumerate(values, 1):
      ckpts.save(step, {"w": jnp.arange(4.0)}, "{}", metrics={"eval/metric": value})
    ckpts.wait()
    assert ckpts.best_step() == 4 and ckpts.steps() == [4, 6]
    assert ckpts.candidates("best") == [4, 6]
  with Checkpoints(str(tmp_path / "all"), "eval/metric", mode, keep=10) as ckpts:  # all kept: the tie is ranked
    for step, value in enumerate(values, 1):
      ckpts.save(step, {"w": jnp.arange(4.0)}, "{}", metrics={"eval/metric": value})
    ckpts.wait()
    assert ckpts.best_step() == 4 and ckpts.candidates("best") == [4, 2, 1, 6, 5, 3]  # then the latest first


def test_an_unreadable_checkpoint_is_named_by_the_fault_inside_orbax_not_orbaxs_wrapper():
  """orbax wraps a failed read as 'Encountered error while reading array index: ... See full TensorStore details:
  <bound method ...>' (its spec method, not called); the line the user reads gives the cause: the array and the fault.
  (Which files a restore reads depends on whether orbax merged the per-process database yet, so a corruption made on
  disk does not reach this read reliably: the chain is built here as orbax builds it.)"""
  from vitjax.models import checkpoints

  fault = 'FAILED_PRECONDITION: Error reading "params.head.kernel/0.0": ZSTD_decompressStream() failed'
  wrapper = "Encountered error while reading array index: (slice(0, 32, 1),). See full TensorStore details: <bound "
  try:
    try:
      raise ValueError(fault)
    except ValueError as cause:
      raise Exception(wrapper + "method pybind11_detail_function_record_v1_system_libstdcpp.spec of ...>") from cause
  except Exception as e:  # noqa: BLE001
    said = checkpoints._fault(e)
  assert (
    said == 'ValueError: FAILED_PRECONDITION: Error reading "params.head.kernel/0.0": ZSTD_decompressStream() failed'
  )


def _net(num_classes: int = 3):
  """A tiny ViT's Network on this process's devices (8x8 grey images)."""
  from vitjax import mesh as mesh_lib
  from vitjax.config import default_config
  from vitjax.models import network

  c = default_config()
  c.model.update(name="vit_ti16", patch_size=4, width=16, depth=1, num_heads=2, mlp_dim=32)
  images = np.zeros((1, 8, 8, 1), np.float32)
  return network.network(c, {"num_classes": num_classes}, (images,), mesh_lib.Layout.of(c).mesh())


def test_weights_that_fit_the_network_are_placed_on_its_shardings_and_others_named():
  """pretrained.place: the arrays on the network's shardings, or one line naming what differs (a head of 10 classes
  for a network of 3), which points to init_from, where other shapes are fitted."""
  import jax

  from vitjax import pretrained
  from vitjax.errors import ConfigError

  net = _net()
  params, _ = jax.device_get(net.init())
  placed = pretrained.place(net, params, "npz:x.npz")
  assert sorted(placed) == ["params"]
  for got, sharding in zip(jax.tree.leaves(placed["params"]), jax.tree.leaves(net.sharding["params"]), strict=True):
    assert got.sharding == sharding
  other, _ = jax.device_get(_net(10).init())
  with pytest.raises(
    ConfigError, match=r"npz:x.npz: its weights do not fit the model \(head/bias: \(10,\) there, \(3,\) in"
  ):
    pretrained.place(net, other, "npz:x.npz")
  with pytest.raises(ConfigError, match=r"extra/w: not in the model.*start from them with config.init_from"):
    pretrained.place(net, {**params, "extra": {"w": np.zeros(2)}}, "npz:x.npz")


def test_initial_variables_are_the_seeds_and_imported_weights_are_one_set():
  """pretrained.load with fit and no source is config.seed's initialisation, the same twice; an imported source has
  no steps or moving average to choose (pretrained.load says so before reading anything)."""
  import jax

  from vitjax import pretrained
  from vitjax.errors import ConfigError

  net = _net()
  a, b = pretrained.load("", net, fit=True), pretrained.load(None, net, fit=True)
  assert a[0] == 0 and sorted(a[1]) == ["params"]
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
    np.testing.assert_array_equal(x, y)
  for checkpoint, weights in (("3", "params"), ("best", "ema")):
    with pytest.raises(ConfigError, match="imported weights are one set"):
      pretrained.load("timm:vit_tiny_patch16_224:missing.safetensors", net, checkpoint, weights)


def test_init_from_a_dinov2_with_registers_file_fits_a_smaller_grid_and_names_a_wrong_option(tmp_path, timm_ref):
  """init_from=timm:vit_small_patch14_reg4_dinov2:FILE (518 px as timm builds it) into a 56 px model: registers and
  LayerScale carried as they are, the 37x37 table resampled to 4x4, a new head. A model without registers, or with
  a table that has rows for them, gets one line naming config.model's option."""
  import jax
  import safetensors.torch
  import torch

  from vitjax import mesh as mesh_lib
  from vitjax import pretrained
  from vitjax.config import default_config
  from vitjax.errors import ConfigError
  from vitjax.models import network

  torch.manual_seed(0)
  model = timm_ref.create_model("vit_small_patch14_reg4_dinov2", pretrained=False, depth=1, num_classes=0)
  path = str(tmp_path / "dinov2.safetensors")
  safetensors.torch.save_file(model.state_dict(), path)
  source = f"timm:vit_small_patch14_reg4_dinov2:{path}"

  def net(**fields):
    c = default_config()
    c.model.update(dict(dict(name="vit_s16", patch_size=14, depth=1, init_values=1e-5), **fields))
    images = (np.zeros((1, 56, 56, 3), np.float32),)
    return network.network(c, {"num_classes": 3}, images, mesh_lib.Layout.of(c).mesh())

  _, variables = pretrained.load(source, net(num_registers=4, class_posemb=False), fit=True)
  p = jax.device_get(variables["params"])
  sd = model.state_dict()
  np.testing.assert_array_equal(p["registers"], sd["reg_token"].numpy())
  np.testing.assert_array_equal(p["encoder"]["block_0"]["ls2"]["scale"], sd["blocks.0.ls2.gamma"].numpy())
  assert p["posembed"]["pos_embedding"].shape == (1, 16, 384) and p["head"]["kernel"].shape == (384, 3)
  with pytest.raises(ConfigError, match=r"has 4 register tokens, the model 0: set config.model.num_registers=4"):
    pretrained.load(source, net(), fit=True)
  with pytest.raises(ConfigError, match=r"non-square grid of 21 tokens .*set config.model.class_posemb=False"):
    pretrained.load(source, net(num_registers=4), fit=True)
  # an option the checkpoint's blocks have and the model's lack, or the reverse: one line naming the field
  fields = dict(num_registers=4, class_posemb=False)
  for model_has, want in (
    (dict(init_values=None), r"has ls1/scale in its blocks, the model not: set config.model.init_values=1e-5"),
    (dict(ffn="swiglu", act="silu"), r"has no mlp/fc1_g/kernel in its blocks, the model does: .*ffn='mlp'"),
    (dict(qk_norm="layernorm"), r"has no attn/q_norm/scale .* set config.model.qk_norm=None"),
    (dict(key_bias=False), r"attention has a key bias, the model's none: set config.model.key_bias=True"),
  ):
    with pytest.raises(ConfigError, match=want):
      pretrained.load(source, net(**fields, **model_has), fit=True)
