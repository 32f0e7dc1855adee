"""Masked-image pre-training (vitjax.models.mae, vitjax.tasks.mae): masking, the encoder's view, the loss, a run
whose reconstruction improves, and a classifier fine-tuned from its checkpoint."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import train_helpers as th

from vitjax import models, tasks
from vitjax.config import load_module
from vitjax.models.mae import patchify, random_mask, unpatchify

ENCODER = dict(name="Ti/2", width=16, depth=1, num_heads=2, mlp_dim=32)


def _mae(**kw):
  return models.create("mae", encoder=ENCODER, decoder_width=8, decoder_depth=1, decoder_heads=2, channels=1, **kw)


def test_random_mask_keeps_the_lowest_noise():
  noise = jax.random.uniform(jax.random.key(0), (3, 16))
  keep, mask = random_mask(noise, 0.75)
  assert keep.shape == (3, 4) and mask.shape == (3, 16) and keep.dtype == jnp.int32
  for b in range(3):
    want = np.sort(np.argsort(np.asarray(noise[b]))[:4])
    np.testing.assert_array_equal(np.asarray(keep[b]), want)
    assert set(np.flatnonzero(np.asarray(mask[b]) == 0)) == set(want)  # mask is 1 exactly where dropped
  images = jax.random.normal(jax.random.key(1), (2, 8, 8, 3))
  np.testing.assert_array_equal(unpatchify(patchify(images, (2, 2)), (4, 4), (2, 2), 3), images)


def test_the_encoder_sees_exactly_the_kept_patches():
  model = _mae()
  images = jax.random.uniform(jax.random.key(0), (2, 8, 8, 1), minval=-1, maxval=1)
  noise = jax.random.uniform(jax.random.key(1), (2, 16))
  variables = model.init(jax.random.key(2), images, noise)
  (out, inter) = model.apply(variables, images, noise)
  keep, mask = random_mask(noise, 0.75)
  assert inter["encoded"].shape == (2, 1 + 4, 16)  # the class token and 4 of 16 patches
  np.testing.assert_array_equal(out["mask"], mask)
  assert out["pred"].shape == (2, 16, 4)  # every patch's 2x2 pixels
  # changing every dropped patch leaves the encoder's tokens as they were; changing one kept patch does not
  dropped = unpatchify(mask[..., None] * jnp.ones((2, 16, 4)), (4, 4), (2, 2), 1)
  (_, other) = model.apply(variables, images + 0.5 * dropped, noise)
  np.testing.assert_allclose(other["encoded"], inter["encoded"], atol=1e-6)
  one = jnp.zeros((2, 16, 4)).at[0, int(keep[0, 0])].set(0.5)
  (_, moved) = model.apply(variables, images + unpatchify(one, (4, 4), (2, 2), 1), noise)
  assert float(jnp.abs(moved["encoded"][0] - inter["encoded"][0]).max()) > 1e-4


def test_the_loss_counts_only_the_dropped_patches(data_dir):
  config = load_module(os.path.join(th.ROOT, "configs", "mae_digits.py")).get_config()
  config.data.data_dir = data_dir
  task = tasks.get(config, "")
  task.check()
  images = jax.random.uniform(jax.random.key(0), (2, 8, 8, 1), minval=-1, maxval=1)
  noise = jax.random.uniform(jax.random.key(1), (2, 16))
  _, mask = random_mask(noise, 0.75)
  pred = jax.random.normal(jax.random.key(2), (2, 16, 4))
  loss = lambda p: task.loss({"pred": p, "mask": mask}, {"image": images})[0]
  grad = jax.grad(loss)(pred)
  assert float(jnp.abs(grad * (1 - mask)[..., None]).max()) == 0.0  # kept patches: no gradient
  assert float(jnp.abs(grad[mask.astype(bool)]).min()) > 0.0  # dropped patches: all of them
  # the target is each patch normalised by its own mean and variance: predicting it exactly costs nothing
  target = patchify(images, (2, 2))
  target = (target - target.mean(-1, keepdims=True)) / jnp.sqrt(target.var(-1, keepdims=True) + 1e-6)
  assert float(loss(target)) < 1e-10 and float(loss(jnp.zeros_like(pred))) == pytest.approx(1.0, abs=0.02)


def test_the_evaluation_masks_are_each_images_own(data_dir):
  """The evaluation's fixed masks are drawn from each image's position in the split: its loss does not depend on
  the batch size (they were drawn per batch: 2.042 at 64 a batch, 2.029 at 40, 2.023 at 160)."""
  from vitjax import evaluators, pretrained

  config = load_module(os.path.join(th.ROOT, "configs", "mae_digits.py")).get_config()
  config.data.data_dir, config.evals.eval.drawn = data_dir, 0
  task = tasks.get(config, "")
  net = tasks.network(config, task)
  _, variables = pretrained.load(config.init_from, net, fit=True)
  losses = []
  for batch_size in (64, 40):
    config.data.eval_batch_size = batch_size
    with jax.set_mesh(net.mesh):
      losses.append(evaluators.named(config, task, "eval").run(net, variables))
  assert losses[0]["eval/examples"] == 150 and losses[0]["eval/loss"] == pytest.approx(losses[1]["eval/loss"], rel=1e-6)


def test_the_evaluation_loss_is_the_mean_of_each_images_dropped_patches_and_draws_them(tmp_path):
  """The mae evaluator on a model whose masks and predictions are known: the loss is the mean over the real images
  (padding rows left out) of each image's mean error on its own dropped patches, and the drawing's rows are the
  original, the visible patches on grey, and the visible patches with the reconstruction (here each patch's mean)."""
  from types import SimpleNamespace

  import flax.linen as nn
  from jax.sharding import Mesh, NamedSharding, PartitionSpec

  from vitjax.evaluators import mae as mae_eval
  from vitjax.tasks.mae import patch_errors

  class Known(nn.Module):  # drops the patches brighter than mid-grey; predicts 0 (each patch's mean)
    def __call__(self, images, noise, train=False):
      mask = (patchify(images, (2, 2)).mean(-1) > 0).astype(jnp.float32)
      return {"pred": jnp.zeros(mask.shape + (4,)), "mask": mask}, {}

  rng = np.random.default_rng(0)
  images = rng.integers(0, 256, (6, 8, 8, 1)).astype(np.uint8)
  images[:, :2, :2] = 250  # a bright flat patch in each image: dropped, error 0
  images[0, 2:, 2:] = 10  # image 0 has far fewer dropped patches with an error than the others
  mask = np.array([1, 1, 1, 1, 1, 0], bool)  # the last row is padding
  batches = [{"image": images[k : k + 3], "mask": mask[k : k + 3], "index": np.arange(k, k + 3)} for k in (0, 3)]
  task = SimpleNamespace(grid=(4, 4), patch=(2, 2), preprocess=lambda: SimpleNamespace(mean=None, std=None),
                         eval_batches=lambda split, n: batches)  # fmt: skip
  ev = SimpleNamespace(name="eval", split="test", examples=None, task=task, config=SimpleNamespace(seed=0),
                       options={"drawn": 2}, workdir=str(tmp_path))  # fmt: skip
  mesh = Mesh(np.array(jax.devices()[:1]), ("data",))
  net = SimpleNamespace(model=Known(), batch_sharding=NamedSharding(mesh, PartitionSpec("data")))
  got = mae_eval.run(ev, net, {}, step=3)
  x = images[:5].astype(np.float32) * (2 / 255) - 1
  dropped = np.asarray(patchify(x, (2, 2)).mean(-1) > 0, np.float32)
  errors = np.asarray(patch_errors(np.zeros((5, 16, 4)), x, (2, 2)))
  per_image = (errors * dropped).sum(-1) / dropped.sum(-1)
  assert got["examples"] == 5 and got["loss"] == pytest.approx(per_image.mean(), rel=1e-5)
  assert got["loss"] != pytest.approx((errors * dropped).sum() / dropped.sum(), rel=1e-3)  # not pooled over images
  from PIL import Image

  png = np.asarray(Image.open(tmp_path / "reconstructions" / "step_3.png"))[::12, ::12].astype(int)  # drawn 12x
  assert png.shape == (2 * 8, 3 * 8)  # the first 2 images: (original, visible, reconstruction) each
  for i in range(2):
    original, visible, pasted = (png[8 * i : 8 * i + 8, 8 * j : 8 * j + 8] for j in range(3))
    gone = np.kron(dropped[i].reshape(4, 4), np.ones((2, 2))).astype(bool)  # [8, 8]
    means = np.kron(images[i, ..., 0].reshape(4, 2, 4, 2).mean((1, 3)), np.ones((2, 2)))
    assert np.abs(original - images[i, ..., 0]).max() <= 1
    assert np.abs(visible - images[i, ..., 0])[~gone].max() <= 1 and np.abs(visible[gone] - 127.5).max() <= 1
    assert np.abs(pasted - images[i, ..., 0])[~gone].max() <= 1 and np.abs(pasted - means)[gone].max() <= 1
  assert mae_eval.run(ev, net, {}) == got and os.listdir(tmp_path / "reconstructions") == ["step_3.png"]


def test_the_mae_evaluator_refuses_a_drawn_count_that_is_not_a_whole_number_and_another_task():
  """mae's check: `drawn` an integer >= 0 (one line naming the entry), an MAE run, and the split asked of the task."""
  from types import SimpleNamespace

  from vitjax.errors import ConfigError
  from vitjax.evaluators import mae as mae_eval

  splits = []
  entry = lambda task="mae", **options: SimpleNamespace(
    name="eval",
    split="test",
    config=SimpleNamespace(task=task),
    options={"drawn": 8, **options},
    task=SimpleNamespace(check_split=lambda split, what: splits.append((split, what))),
  )
  for drawn in (-1, 2.5, "8"):
    with pytest.raises(ConfigError, match=rf"^config.evals.eval: drawn={drawn!r} must be an integer >= 0$"):
      mae_eval.check(entry(drawn=drawn))
  with pytest.raises(ConfigError, match="evaluates a masked autoencoder, not a 'classification' run"):
    mae_eval.check(entry("classification"))
  mae_eval.check(entry(drawn=0))
  assert splits == [("test", "evals.eval.split")]


def test_pretraining_improves_the_reconstruction_and_a_classifier_starts_from_its_encoder(tmp_path, data_dir):
  workdir = str(tmp_path / "mae")
  args = [
    f"--config.data.data_dir={data_dir}",
    "--config.model.encoder.width=32",
    "--config.model.encoder.depth=2",
    "--config.model.encoder.mlp_dim=64",
    "--config.num_epochs=12",
    "--config.eval_every=84",
    "--config.checkpoint_every=84",
  ]
  config = os.path.join(th.ROOT, "configs", "mae_digits.py")
  th.check_ok(th.run_main(workdir, *args, config=config))
  evals = [r["eval/loss"] for r in th.read_metrics(workdir) if "eval/loss" in r and "source" not in r]
  # 1.0 is predicting each patch's mean (the per-patch normalised target's mean): the reconstruction beats it by
  # far, and keeps improving from evaluation to evaluation
  assert len(evals) == 3 and evals[-1] < evals[1] < evals[0] and evals[-1] < 0.7, evals
  from PIL import Image

  png = Image.open(os.path.join(workdir, "reconstructions", "step_252.png"))
  assert png.size == (3 * 8 * 12, 8 * 8 * 12)  # 8 rows of (original, visible, reconstruction), drawn 12x
  import vitjax

  mae = vitjax.load(workdir)
  with pytest.raises(TypeError, match="predicts pixels, not classes"):
    mae.predict(np.zeros((1, 8, 8, 1), np.uint8))
  with pytest.raises(TypeError, match=r"is a mae run: use its .model and .variables"):  # it said: use .predict
    mae.translate(["hello"])

  # init_from the MAE run: the encoder's parameters as trained, no decoder, a new head
  from vitjax.models import checkpoints
  from vitjax.train import state as state_lib

  cls_config = load_module(os.path.join(th.ROOT, "configs", "vit_digits.py")).get_config()
  cls_config.model.update(width=32, depth=2, mlp_dim=64)
  cls_config.data.data_dir, cls_config.init_from = data_dir, workdir
  exp = state_lib.setup(cls_config, tasks.get(cls_config, ""))
  params = jax.device_get(state_lib.initial_state(exp).params)
  mae_params, _ = checkpoints.load_params(workdir)
  assert not any(k.startswith(("decoder", "mask_token")) for k in params) and "head" in params
  for k in ("embedding", "cls", "posembed", "encoder"):
    for a, b in zip(jax.tree.leaves(params[k]), jax.tree.leaves(mae_params[k]), strict=True):
      np.testing.assert_array_equal(a, b)


def test_the_decoder_knows_where_each_dropped_patch_is():
  """Every dropped patch enters the decoder as the same mask token: only the decoder's positions tell them apart."""
  model = _mae()
  images = jax.random.uniform(jax.random.key(0), (1, 8, 8, 1), minval=-1, maxval=1)
  noise = jax.random.uniform(jax.random.key(1), (1, 16))
  out, _ = model.apply(model.init(jax.random.key(2), images, noise), images, noise)
  dropped = np.asarray(out["pred"][0])[np.asarray(out["mask"][0]) == 1]  # [12, 4]
  assert np.abs(dropped - dropped[:1]).max() > 1e-3
