"""Fine-tuning tools: layer-wise learning-rate decay (the layer of every parameter of ViT and Swin)."""

import json
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import train_helpers as th

from vitjax import models
from vitjax.config import default_config
from vitjax.errors import ConfigError
from vitjax.mesh import path_name
from vitjax.train import optim


def _scales(model, shape, decay=0.5):
  variables = jax.eval_shape(lambda: model.init(jax.random.key(0), jnp.zeros(shape)))
  scales = optim.layer_decay_scales(model, variables["params"], decay)
  return {path_name(p): np.asarray(s) for p, s in jax.tree_util.tree_flatten_with_path(scales)[0]}


def test_vit_layer_of_every_parameter():
  # depth 3: L + 1 = 4 -> embeddings 0.5^4, block i 0.5^(3 - i), after the encoder 0.5^0
  vit = models.create("vit_ti16", num_classes=10, depth=3, representation_size=8)
  s = _scales(vit, (1, 32, 32, 3))
  for path in ("cls", "embedding/kernel", "embedding/bias", "posembed/pos_embedding"):
    assert s[path] == 0.5**4, path
  for i in range(3):
    for path in ("attn/query/kernel", "attn/out/bias", "mlp/fc1/kernel", "norm1/scale", "norm2/bias"):
      assert s[f"encoder/block_{i}/{path}"] == 0.5 ** (3 - i), path
  after = [p for p in s if p.startswith(("encoder/final_norm/", "pre_logits/", "head/"))]
  assert len(after) == 6 and all(s[p] == 1.0 for p in after)
  pooled = _scales(vit.clone(pool_type="map"), (1, 32, 32, 3))
  map_head = [p for p in pooled if p.startswith("map_head/")]
  assert len(map_head) > 4 and all(pooled[p] == 1.0 for p in map_head)
  assert set(np.unique(np.concatenate([v.ravel() for v in s.values()]))) == {0.5**k for k in range(5)}

  # a scanned encoder: the same multipliers, along the stacking axis
  scanned = _scales(vit.clone(scan=True), (1, 32, 32, 3))
  q = scanned["encoder/blocks/block/attn/query/kernel"]
  assert q.shape == (3, 1, 1, 1)  # broadcasts over [depth, width, heads, head_dim]
  np.testing.assert_array_equal(q.ravel(), [0.125, 0.25, 0.5])
  assert scanned["cls"] == 0.5**4 and scanned["head/kernel"] == 1.0

  # the conv stem and its norm come before the encoder
  stem = _scales(models.create("vit_ti16", num_classes=10, depth=2, stem="conv", embed_norm=True), (1, 32, 32, 3))
  stem_paths = [p for p in stem if p.startswith(("conv_stem/", "embed_norm/"))]
  assert len(stem_paths) >= 4 and all(stem[p] == 0.5**3 for p in stem_paths)


def test_swin_layer_of_every_parameter():
  # depths (1, 1, 2, 1): L = 5; blocks are numbered 1..5 over the stages, patch merging takes its preceding block's
  swin = models.create("swin_t", num_classes=10, depths=(1, 1, 2, 1), num_heads=(1, 1, 1, 1), embed_dim=8)
  s = _scales(swin, (1, 64, 64, 3))
  want = {
    "patch_embed/kernel": 0,
    "patch_norm/scale": 0,
    "stage_0_block_0/attn/query/kernel": 1,
    "stage_0_block_0/rel_pos/relative_position_bias_table": 1,
    "stage_1_downsample/reduction/kernel": 1,
    "stage_1_downsample/norm/scale": 1,
    "stage_1_block_0/mlp/fc2/kernel": 2,
    "stage_2_downsample/reduction/kernel": 2,
    "stage_2_block_0/norm1/scale": 3,
    "stage_2_block_1/attn/out/kernel": 4,
    "stage_3_downsample/reduction/kernel": 4,
    "stage_3_block_0/mlp/fc1/bias": 5,
    "norm/scale": 6,
    "head/kernel": 6,
  }
  for path, layer in want.items():
    assert s[path] == 0.5 ** (6 - layer), path
  blocks = {p.split("/")[0] for p in s if "_block_" in p}
  assert blocks == {"stage_0_block_0", "stage_1_block_0", "stage_2_block_0", "stage_2_block_1", "stage_3_block_0"}


def test_layer_decay_scales_each_update_by_its_layer():
  """One AdamW step with layer_decay 0.5 moves each parameter by its multiplier times the step without it
  (weight decay included: it is scaled with the learning rate, as BEiT's and MAE's parameter groups do)."""
  vit = models.create("vit_ti16", num_classes=10, depth=2, width=16, num_heads=2, mlp_dim=32, head_zeroinit=False)
  params = vit.init(jax.random.key(0), jnp.zeros((2, 16, 16, 3)))["params"]
  grads = jax.tree.map(lambda p: jnp.cos(jnp.arange(p.size, dtype=jnp.float32)).reshape(p.shape), params)
  moved = []
  for decay in (1.0, 0.5):
    cfg = default_config()
    cfg.optim.layer_decay, cfg.optim.weight_decay = decay, 0.1
    tx = optim.make_optimizer(cfg, optim.make_schedule(cfg, 10, 1), vit)
    updates, _ = tx.update(grads, tx.init(params), params)
    moved.append(updates)
  scales = optim.layer_decay_scales(vit, params, 0.5)
  for full, decayed, scale in zip(*(jax.tree.leaves(t) for t in (*moved, scales)), strict=True):
    np.testing.assert_allclose(np.asarray(decayed), np.asarray(full) * scale, rtol=1e-6, atol=1e-12)
  assert float(jnp.abs(moved[1]["embedding"]["kernel"]).max()) > 0  # the embedding still learns, 0.5^3 as fast


def test_layer_decay_is_refused_where_there_are_no_layers_to_count():
  cfg = default_config()
  cfg.optim.layer_decay = 0.75
  transformer = models.create("transformer_tiny", vocab_size=32)
  with pytest.raises(ConfigError, match="optim.layer_decay applies to ViT and Swin"):
    optim.make_optimizer(cfg, optim.make_schedule(cfg, 10, 1), transformer)
  cfg.optim.layer_decay = 1.5
  with pytest.raises(ConfigError, match=r"optim.layer_decay=1.5 must be in \(0, 1\]"):
    optim.make_optimizer(cfg, optim.make_schedule(cfg, 10, 1), transformer)


def test_top5_counts_the_label_among_the_five_largest_logits():
  import flax.linen as nn

  from vitjax.evaluators import classification

  class Logits(nn.Module):  # the "image" is the logits
    def __call__(self, images, train=False):
      return images.reshape(images.shape[0], -1), {}

  logits = np.array(
    [
      [9, 8, 7, 6, 5, 4, 3],  # label 0: rank 0 (top-1 and top-5)
      [9, 8, 7, 6, 5, 4, 3],  # label 4: rank 4 (top-5 only)
      [9, 8, 7, 6, 5, 4, 3],  # label 5: rank 5 (neither)
      [1, 1, 1, 1, 1, 1, 1],  # label 6: all tied -> rank 6, as argmax ranks ties (the lowest class first)
      [0, 0, 0, 0, 0, 0, 9],  # label 6, masked out (padding)
    ],
    np.float32,
  )
  batch = {
    "image": jnp.asarray(logits[:, None, None, :]),
    "label": jnp.asarray([0, 4, 5, 6, 6], jnp.int32),
    "mask": jnp.asarray([True, True, True, True, False]),
  }
  sums = jax.device_get(classification._step(Logits(), {}, batch, None, None, 5, 0))
  assert (float(sums["correct"]), float(sums["correct_k"]), float(sums["count"])) == (1.0, 2.0, 4.0)


# ----------------------------------------------------------------------------
# EMA of the parameters (config.ema_decay)


def test_ema_is_the_moving_average_of_the_parameters_each_step_produces():
  cfg = default_config()
  cfg.ema_decay, cfg.optim.grad_clip_norm = 0.9, 0.0
  tx = optim.make_optimizer(cfg, optim.make_schedule(cfg, 10, 1))
  params = {"w": jnp.asarray([1.0, -2.0, 3.0]), "b": jnp.asarray(0.5)}
  state = jax.jit(tx.init)(params)
  want = jax.tree.map(np.asarray, params)  # it starts from the initial parameters
  for k in range(4):
    grads = jax.tree.map(lambda p, k=k: jnp.sin(p + k), params)
    updates, state = tx.update(grads, state, params)
    params = jax.tree.map(jnp.add, params, updates)
    want = jax.tree.map(lambda e, p: 0.9 * e + 0.1 * np.asarray(p), want, params)
  got = optim.ema_params(state)
  for name in ("w", "b"):
    np.testing.assert_allclose(np.asarray(got[name]), want[name], rtol=1e-6)
    assert not np.allclose(np.asarray(got[name]), np.asarray(params[name]))  # an average, not the last value
  assert optim.ema_params(jax.jit(optim.make_optimizer(default_config(), lambda s: 1e-3).init)(params)) is None


def test_ema_run_evaluates_checkpoints_loads_and_exports_its_average(tmp_path, data_dir, finished_run):
  import vitjax

  workdir = str(tmp_path / "ema")
  common = [*th.TINY, f"--config.data.data_dir={data_dir}"]
  evals = (  # the moving average's evaluator, and one more on the test split every 15 steps (vitjax.evaluators)
    "--config.evals={'eval': {'type': 'classification'}, 'eval_ema': {'type': 'classification', 'weights': 'ema'},"
    " 'test': {'type': 'classification', 'split': 'test', 'every': 15}}"
  )
  proc = th.run_main(workdir, *common, "--config.ema_decay=0.8", "--config.best=eval_ema/accuracy", evals)
  assert "covers the parameters only" not in th.check_ok(proc).stderr  # no BatchNorm here, so no warning
  rows = [r for r in th.read_metrics(workdir) if "eval/accuracy" in r and "source" not in r]
  assert [r["step"] for r in rows] == [10, 20, 30]
  assert all({"eval_ema/accuracy", "eval_ema/top5", "eval_ema/loss"} <= set(r) for r in rows)
  assert any(r["eval_ema/loss"] != r["eval/loss"] for r in rows)  # two sets of weights
  tests = [r for r in th.read_metrics(workdir) if "test/accuracy" in r]
  assert [(r["step"], r["test/examples"]) for r in tests] == [(15, 300), (30, 300)], tests
  assert "step 15 | test/loss" in proc.stderr and "step 15 | eval/" not in proc.stderr

  # --mode=eval --weights=ema reproduces the logged eval_ema metrics of the step it restores (from its checkpoint)
  proc = th.check_ok(
    th.run_main(workdir, "--mode=eval", "--eval=eval", "--checkpoint=latest", "--weights=ema", config=None)
  )
  got = json.load(open(os.path.join(workdir, "eval_valid_30_ema.json")))
  assert got["weights"] == "ema" and got["eval/loss"] == pytest.approx(rows[-1]["eval_ema/loss"], rel=1e-6)
  assert got["eval/accuracy"] == pytest.approx(rows[-1]["eval_ema/accuracy"], abs=1e-6)
  assert proc.stdout.startswith("checkpoint latest (step 30, EMA weights) | eval/loss ")  # the result: stdout

  # vitjax.load and export take the average too; best is chosen by eval_ema/accuracy
  raw, ema = vitjax.load(workdir, "latest"), vitjax.load(workdir, "latest", weights="ema")
  assert not np.allclose(raw.variables["params"]["head"]["kernel"], ema.variables["params"]["head"]["kernel"])
  out = str(tmp_path / "ema.npz")
  proc = th.run_module(
    "export", f"--workdir={workdir}", "--format=npz", f"--out={out}", "--checkpoint=latest", "--weights=ema"
  )
  assert proc.returncode == 0, proc.stderr[-2000:]
  np.testing.assert_array_equal(np.load(out)["head/kernel"], np.asarray(ema.variables["params"]["head"]["kernel"]))
  best = max(rows, key=lambda r: (r["eval_ema/accuracy"], r["step"]))["step"]
  assert vitjax.load(workdir, "best").step == best

  # a model with BatchNorm statistics (the conv stem) is warned that its average leaves them out
  config = tmp_path / "conv_stem.py"
  config.write_text(
    "from vitjax.config import load_module\n\n\ndef get_config():\n"
    f"  c = load_module({th.CONFIG!r}).get_config()\n  c.model.stem = 'conv'\n  return c\n"
  )
  stem = [*common, "--config.ema_decay=0.8", "--config.total_steps=2", "--config.checkpoint_every=2"]
  proc = th.check_ok(th.run_main(str(tmp_path / "bn"), *stem, config=str(config)))
  assert "covers the parameters only; this model's batch_stats (BatchNorm statistics)" in proc.stderr

  # a run without an average: one line naming the fix, exit 2
  plain = str(shutil.copytree(finished_run, tmp_path / "plain"))  # a finished run without an average
  proc = th.run_main(plain, "--mode=eval", "--weights=ema", config=None)
  assert (
    proc.returncode == 2
    and "weights='ema' needs the moving average" in proc.stderr
    and "config.ema_decay" in proc.stderr
  )
  assert "Traceback" not in proc.stderr


def test_eval_mode_evaluates_imported_weights_without_training(tmp_path, data_dir):
  """--mode=eval with config.init_from and a workdir without checkpoints evaluates the imported weights as they
  are (here another run's, whose own evaluation of its last step it must reproduce)."""
  source = str(tmp_path / "source")
  common = [*th.TINY, f"--config.data.data_dir={data_dir}", "--config.total_steps=10", "--config.eval_every=10"]
  th.check_ok(th.run_main(source, *common))
  logged = [r for r in th.read_metrics(source) if "eval/accuracy" in r][-1]
  target = str(tmp_path / "imported")
  proc = th.check_ok(th.run_main(target, *common, f"--config.init_from={source}", "--mode=eval"))
  got = json.load(open(os.path.join(target, "eval_valid_imported.json")))
  assert got["init_from"] == source and got["step"] == 0
  assert got["eval/accuracy"] == pytest.approx(logged["eval/accuracy"], abs=1e-6)
  assert got["eval/loss"] == pytest.approx(logged["eval/loss"], rel=1e-5)
  assert proc.stdout.startswith(f"imported weights (init_from={source}), no training | eval/loss ")
  assert not os.path.exists(os.path.join(target, "checkpoints"))  # nothing trained, nothing saved
  # without init_from, an empty workdir is still an error naming the fix
  proc = th.run_main(str(tmp_path / "empty"), *common, "--mode=eval")
  assert proc.returncode == 2 and proc.stderr.count("error:") == 1


def test_a_workdir_from_before_ema_and_layer_decay_still_loads_and_evaluates(tmp_path, data_dir):
  import vitjax

  workdir = str(tmp_path / "old")
  common = [*th.TINY, f"--config.data.data_dir={data_dir}", "--config.total_steps=5", "--config.eval_every=5"]
  th.check_ok(th.run_main(workdir, *common))
  path = os.path.join(workdir, "config.json")
  config = json.load(open(path))
  del config["ema_decay"], config["optim"]["layer_decay"]  # as vitjax wrote it before these fields existed
  json.dump(config, open(path, "w"))
  assert vitjax.load(workdir).step == 5
  th.check_ok(th.run_main(workdir, "--mode=eval", config=None))
  th.check_ok(th.run_main(workdir, *common))  # resuming with today's config: nothing changed, nothing to train


def test_init_from_a_run_names_the_step_it_reads_and_refuses_its_average(finished_run, caplog):
  """init_from=WORKDIR said only 'initialised parameters from W', not which step; W/averaged was 'no checkpoints/
  there', as if the user had the wrong folder."""
  from vitjax.errors import ConfigError
  from vitjax.models import checkpoints as ckpt_lib

  caplog.set_level("INFO", logger="absl")
  ckpt_lib.load_params(finished_run)
  assert f"init_from: step 30, the latest intact checkpoint of {os.path.abspath(finished_run)}" in caplog.text
  with pytest.raises(ConfigError, match=r"init_from reads a run's latest intact checkpoint, not its average; give"):
    ckpt_lib.load_params(os.path.join(finished_run, "averaged"))
