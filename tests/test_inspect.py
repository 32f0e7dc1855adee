"""vitjax.attention_maps: attention maps, rollout and position similarity of a trained ViT, window attention of a trained
Swin, as PNGs, from the reference attention path (which changes no result)."""

import os
import textwrap

import jax.numpy as jnp
import numpy as np
import pytest
import train_helpers as th

import vitjax
from vitjax import attention_maps as inspect_lib

pytestmark = pytest.mark.xdist_group("inspect")

SWIN_CONFIG = textwrap.dedent("""
  import ml_collections as mlc
  from vitjax.config import load_module

  def get_config():
    c = load_module({vit!r}).get_config()
    c.model = mlc.ConfigDict(dict(name="swin_t", patch_size=2, embed_dim=16, depths=(2, 2), num_heads=(2, 4),
                                  window_size=2, num_classes=10, drop_path_rate=0.0))
    return c
""")
SHORT = ["--config.total_steps=20", "--config.eval_every=20", "--config.checkpoint_every=20"]


@pytest.fixture(scope="session")  # not "module": xdist may interleave modules, and a module fixture is rebuilt
def runs(tmp_path_factory, data_dir):
  root = tmp_path_factory.mktemp("inspect")
  vit = str(root / "vit")
  args = [*th.TINY, "--config.model.depth=2", *SHORT, f"--config.data.data_dir={data_dir}"]
  th.check_ok(th.run_main(vit, *args))
  config = root / "swin_digits.py"
  config.write_text(SWIN_CONFIG.format(vit=os.path.join(th.ROOT, "configs", "vit_digits.py")))
  swin = str(root / "swin")
  th.check_ok(
    th.run_main(swin, *SHORT, "--config.batch_size=32", f"--config.data.data_dir={data_dir}", config=str(config))
  )
  return root, vit, swin


def _image(seed=0):
  return np.random.default_rng(seed).integers(0, 256, (8, 8, 1), dtype=np.uint8)


def test_vit_attention_rollout_and_positions(runs):
  root, vit, _ = runs
  trained = vitjax.load(vit, "latest")
  x = np.asarray(_image(), np.float32) / 127.5 - 1
  weights, _ = inspect_lib.attention_weights(trained.model, trained.variables, x)
  layers = inspect_lib.vit_layers(weights)
  assert len(layers) == 2 and all(a.shape == (2, 17, 17) for a in layers)  # 2 heads, class token + 4x4 patches
  for a in layers:
    np.testing.assert_allclose(a.sum(-1), 1.0, rtol=1e-5)
  roll = inspect_lib.rollout(layers)
  assert roll.shape == (17, 17) and (roll >= 0).all()
  np.testing.assert_allclose(roll.sum(-1), 1.0, rtol=1e-6)  # rollout rows sum to 1
  table = np.asarray(trained.variables["params"]["posembed"]["pos_embedding"])[0, 1:]
  sim = inspect_lib.posemb_similarity(table, (4, 4))
  assert sim.shape == (4, 4, 4, 4)
  np.testing.assert_allclose([sim[r, c, r, c] for r in range(4) for c in range(4)], 1.0, rtol=1e-6)
  # the reference path, which gives the weights, gives the model's own outputs
  images = jnp.asarray(np.stack([x, np.asarray(_image(1), np.float32) / 127.5 - 1]))
  logits, _ = trained.model.apply(trained.variables, images)
  ref, _ = trained.model.clone(implementation="reference").apply(trained.variables, images)
  np.testing.assert_allclose(np.asarray(ref), np.asarray(logits), atol=1e-5)

  # the command line: its PNGs, one path a line
  out = root / "vit_out"
  proc = th.run_module("attention_maps", f"--workdir={vit}", f"--out={out}", "--example=5", "--split=test")
  assert proc.returncode == 0, proc.stderr[-2000:]
  names = ["input.png", "attention.png", "rollout.png", "posemb_similarity.png"]
  assert proc.stdout.split() == [str(out / n) for n in names]
  from PIL import Image

  assert all(Image.open(out / n).size[0] > 50 for n in names)
  proc = th.run_module("attention_maps", f"--workdir={vit}", f"--out={out}", "--example=300")
  assert proc.returncode == 2 and proc.stderr.count("error:") == 1 and "examples 0 to 299" in proc.stderr
  # --split names the examples as --mode=eval does: 'valid' the held-out part, the training split the rest
  d = trained.config.data
  held = trained.task.split_source("valid")[1]
  assert d.valid_fraction and len(held) and np.array_equal(inspect_lib._split_examples(trained, "valid")[1], held)
  source, rest = inspect_lib._split_examples(trained, d.train_split)
  assert len(rest) + len(held) == len(source) and not set(rest.tolist()) & set(held.tolist())  # (was all of it)


def test_swin_window_attention_follows_the_patch(runs):
  root, _, swin = runs
  trained = vitjax.load(swin, "latest")
  x = np.asarray(_image(), np.float32) / 127.5 - 1
  weights, inter = inspect_lib.attention_weights(trained.model, trained.variables, x)
  assert sorted(weights) == [f"stage_{s}_block_{j}/attn" for s in range(2) for j in range(2)]
  blocks = inspect_lib.swin_blocks(trained.model, weights, inter, (1, 2))
  shapes = [(name, m.shape) for name, m in blocks]
  assert shapes == [
    ("stage_0_block_0", (2, 4, 4)),
    ("stage_0_block_1", (2, 4, 4)),  # 4x4 map, windows of 2x2
    ("stage_1_block_0", (4, 2, 2)),
    ("stage_1_block_1", (4, 2, 2)),  # 2x2 map: one window
  ]
  for _, maps in blocks:
    np.testing.assert_allclose(maps.sum(axis=(1, 2)), 1.0, rtol=1e-5)  # all of the patch's window, nothing else
  # unshifted, patch (1, 2) sits in the window of rows 0-1, columns 2-3; with the map shifted by one patch, the
  # windows start at row and column 1: its window is rows 1-2, columns 1-2
  assert set(zip(*np.nonzero(blocks[0][1][0]))) == {(0, 2), (0, 3), (1, 2), (1, 3)}
  assert set(zip(*np.nonzero(blocks[1][1][0]))) == {(1, 1), (1, 2), (2, 1), (2, 2)}
  out = root / "swin_out"
  written = inspect_lib.inspect(trained, _image(), str(out), (1, 2))
  assert [os.path.basename(p) for p in written] == ["input.png", "window_attention.png"]


# ------------------------------------------------------------------ the computations, on arrays made here


def _rownorm(a):
  return a / a.sum(-1, keepdims=True)


def test_rollout_multiplies_the_layers_with_the_first_rightmost():
  """rollout = rownorm(mean_heads(A_L) + I) @ ... @ rownorm(mean_heads(A_1) + I): the order matters (the products
  of row-stochastic matrices all have rows summing to 1, whichever order)."""
  rng = np.random.default_rng(0)
  first, second = (_rownorm(rng.random((2, 3, 3)) ** 4) for _ in range(2))
  eye = np.eye(3)
  want = _rownorm(second.mean(0) + eye) @ _rownorm(first.mean(0) + eye)
  np.testing.assert_allclose(inspect_lib.rollout([first, second]), want, rtol=1e-12)
  assert not np.allclose(want, _rownorm(first.mean(0) + eye) @ _rownorm(second.mean(0) + eye))  # (a real test)


def test_vit_layers_come_in_depth_order_from_blocks_or_a_scanned_stack():
  """Unscanned blocks (encoder/block_N/..., [B, heads, T, T]) in N's numeric order (block_10 after block_9), a
  scanned stack ([layers, B, heads, T, T]) layer by layer; what is not the encoder's left out."""
  weights = {f"encoder/block_{n}/attn": np.full((1, 2, 3, 3), n, float) for n in (10, 2, 0, 9, 1)}
  weights["decoder/block_0/attn"] = np.full((1, 2, 3, 3), -1.0)
  assert [int(a[0, 0, 0]) for a in inspect_lib.vit_layers(weights)] == [0, 1, 2, 9, 10]
  assert all(a.shape == (2, 3, 3) for a in inspect_lib.vit_layers(weights))
  stack = np.arange(3, dtype=float)[:, None, None, None, None] * np.ones((3, 1, 2, 3, 3))
  layers = inspect_lib.vit_layers({"encoder/blocks/attn": stack})
  assert [int(a[0, 0, 0]) for a in layers] == [0, 1, 2] and layers[0].shape == (2, 3, 3)


def test_posemb_similarity_is_the_cosine_of_each_pair_of_positions():
  """[N, D] -> [gh, gw, gh, gw] cosines: the length of an embedding does not count."""
  table = np.array([[1.0, 0.0], [3.0, 0.0], [0.0, 2.0], [1.0, 1.0], [-5.0, 0.0], [0.0, 0.5]])
  sim = inspect_lib.posemb_similarity(table, (2, 3))
  assert sim.shape == (2, 3, 2, 3)
  flat = sim.reshape(6, 6)
  np.testing.assert_allclose(np.diag(flat), 1.0)
  assert flat[0, 1] == pytest.approx(1.0) and flat[0, 2] == pytest.approx(0.0) and flat[0, 4] == pytest.approx(-1.0)
  assert flat[0, 3] == pytest.approx(2**-0.5) and sim[0, 1, 1, 2] == pytest.approx(0.0)


def test_the_position_table_leaves_out_the_prefix_tokens_rows():
  """A learned table less its rows before the grid's (class and register tokens: none without them, or with a table
  of the patches only); the fixed sin-cos table of the grid otherwise."""
  from types import SimpleNamespace

  from vitjax.posenc import sincos_2d

  table = np.arange(5 * 2, dtype=float).reshape(1, 5, 2)
  params = {"posembed": {"pos_embedding": table}}
  learned = SimpleNamespace(posemb="learn", width=2)
  np.testing.assert_array_equal(inspect_lib._position_table(learned, params, (2, 2)), table[0, 1:])
  np.testing.assert_array_equal(inspect_lib._position_table(learned, params, (1, 5)), table[0])
  fixed = SimpleNamespace(posemb="sincos2d", width=8)
  got = inspect_lib._position_table(fixed, {}, (2, 3))
  np.testing.assert_array_equal(got, np.asarray(sincos_2d(2, 3, 8)))
  assert got.shape == (6, 8)


def test_registers_are_drawn_apart_from_the_patch_grid(runs, tmp_path):
  """A ViT with registers (and a position table of the patches only, as DINOv2's): the maps show the patches; each
  head's share of attention to the registers is in its title; the class token is the query."""
  import dataclasses

  import jax

  _, vit, _ = runs
  trained = vitjax.load(vit, "latest")
  model = trained.model.clone(num_registers=2, class_posemb=False)
  x = np.asarray(_image(), np.float32) / 127.5 - 1
  variables = jax.jit(model.init)(jax.random.key(0), x[None])
  weights, _ = inspect_lib.attention_weights(model, variables, x)
  layers = inspect_lib.vit_layers(weights)
  assert layers[0].shape == (2, 19, 19) and inspect_lib.prefix_tokens(model, 19, (4, 4)) == (1, 2)
  share = inspect_lib.register_share(layers[0], 0, 1, 2)
  np.testing.assert_allclose(share, layers[0][:, 0, 1:3].sum(-1)) and (0 < share).all() and (share < 1).all()
  assert inspect_lib._position_table(model, variables["params"], (4, 4)).shape == (16, 16)
  written = inspect_lib.inspect(dataclasses.replace(trained, model=model, variables=variables), _image(), str(tmp_path))
  assert [os.path.basename(p) for p in written] == [
    "input.png",
    "attention.png",
    "rollout.png",
    "posemb_similarity.png",
  ]
