import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vitjax import models
from vitjax.models.swin import effective_window, shift_attention_mask, window_partition


def n_params(model, hw=224, c=3):
  shapes = jax.eval_shape(lambda: model.init(jax.random.key(0), jnp.zeros((1, hw, hw, c))))["params"]
  return sum(int(np.prod(a.shape)) for a in jax.tree.leaves(shapes))


@pytest.mark.parametrize(
  "name,count",
  [
    ("vit_ti16", 5_717_416),
    ("vit_s16", 22_050_664),
    ("vit_b16", 86_567_656),
    ("vit_l16", 304_326_632),
    ("Ti/16", 5_717_416),
    ("swin_t", 28_288_354),
  ],
)
def test_published_parameter_counts(name, count):
  assert n_params(models.create(name)) == count


def _tiny_vit(**kw):
  return models.create("Ti/4", depth=2, width=32, num_heads=2, mlp_dim=64, num_classes=5, **kw)


@pytest.mark.parametrize(
  "kw",
  [
    dict(),
    dict(pool_type="gap"),
    dict(pool_type="map"),
    dict(posemb="sincos2d"),
    dict(stem="conv"),
    dict(representation_size=16),
    dict(scan=True, remat=True),
    dict(pool_type="gap", fc_norm=True),
  ],
)
def test_vit_options_run_on_non_square_images(kw):
  model = _tiny_vit(**kw)
  x = jnp.ones((2, 16, 24, 3))
  variables = model.init(jax.random.key(0), x)
  logits, inter = model.apply(variables, x)
  assert logits.shape == (2, 5) and np.isfinite(np.asarray(logits)).all()
  assert inter["encoded"].shape[1] == 4 * 6 + (kw.get("pool_type", "tok") == "tok")
  if kw.get("stem") == "conv":  # BatchNorm statistics update in training mode
    _, upd = model.apply(variables, x, train=True, mutable=["batch_stats"], rngs={"dropout": jax.random.key(1)})
    assert "batch_stats" in upd


def test_vit_refuses_images_not_divisible_by_the_patch():
  with pytest.raises(ValueError, match=r"not divisible by the patch size \(16, 16\).*230 -> 224 or 240"):
    models.create("vit_ti16").init(jax.random.key(0), jnp.zeros((1, 230, 224, 3)))


def test_registry_names_and_errors():
  assert models.create("vit_b32").patch_size == (32, 32)
  assert models.create("swin_b").embed_dim == 128
  assert models.create("S/16", num_classes=10).num_classes == 10
  with pytest.raises(ValueError, match="Did you mean 'vit_b16'"):
    models.create("vit_bb16")
  with pytest.raises(ValueError, match="Did you mean 'num_classes'"):
    models.create("vit_s16", num_clases=10)
  with pytest.raises(ValueError, match="unknown ViT variant"):
    models.create("Q/16")


def _brute_force_shift_mask(hw, window, shift):
  """Two tokens of a shifted window may attend iff neither or both wrapped around, along each axis."""
  h, w = hw
  rows, cols = np.meshgrid(np.arange(h), np.arange(w), indexing="ij")
  wrapped = np.stack([(rows + shift[0]) >= h, (cols + shift[1]) >= w], -1)  # position came from the far side
  same_region = np.zeros((h, w, h, w), bool)
  for i in range(h):
    for j in range(w):
      same_region[i, j] = (wrapped == wrapped[i, j]).all(-1)
  n_wh, n_ww = h // window[0], w // window[1]
  out = np.zeros((n_wh * n_ww, window[0] * window[1], window[0] * window[1]), bool)
  for wi in range(n_wh):
    for wj in range(n_ww):
      cells = [(wi * window[0] + a, wj * window[1] + b) for a in range(window[0]) for b in range(window[1])]
      for p, (i, j) in enumerate(cells):
        for q, (k, m) in enumerate(cells):
          out[wi * n_ww + wj, p, q] = same_region[i, j, k, m]
  return out


@pytest.mark.parametrize("hw,window", [((8, 8), (4, 4)), ((14, 14), (7, 7)), ((6, 9), (3, 3))])
def test_swin_shift_mask_against_brute_force(hw, window):
  shift = (window[0] // 2, window[1] // 2)
  np.testing.assert_array_equal(shift_attention_mask(hw, window, shift), _brute_force_shift_mask(hw, window, shift))


def test_window_partition_roundtrip_and_effective_window():
  x = jnp.arange(2 * 6 * 9 * 3).reshape(2, 6, 9, 3)
  from vitjax.models.swin import window_reverse

  parts = window_partition(x, (3, 3))
  assert parts.shape == (2, 6, 9, 3)
  np.testing.assert_array_equal(parts[0, 1, :, 0], np.asarray(x[0, :3, 3:6, 0]).reshape(-1))
  np.testing.assert_array_equal(window_reverse(parts, (3, 3), (6, 9)), x)
  assert effective_window((7, 7), (7, 7), (3, 3)) == ((7, 7), (0, 0))
  assert effective_window((4, 14), (7, 7), (3, 3)) == ((4, 7), (0, 3))


def _tiny_swin(**kw):
  return models.create("swin_t", embed_dim=16, depths=(2, 2), num_heads=(2, 4), window_size=4, num_classes=3, **kw)


def test_swin_window_shrinks_to_small_maps():
  model = _tiny_swin()
  variables = model.init(jax.random.key(0), jnp.zeros((1, 24, 24, 3)))  # maps 6x6 then 3x3
  p = variables["params"]
  assert p["stage_0_block_1"]["rel_pos"]["relative_position_bias_table"].shape == (7 * 7, 2)  # window 4
  assert p["stage_1_block_1"]["rel_pos"]["relative_position_bias_table"].shape == (5 * 5, 4)  # shrunk to 3


def test_swin_pads_maps_the_window_does_not_divide_and_refuses_bad_patches():
  model = _tiny_swin()
  x = jax.random.normal(jax.random.key(0), (2, 20, 28, 3))  # maps 5x7 (padded to 8x8) then 3x4
  variables = model.init(jax.random.key(0), x)
  logits, inter = model.apply(variables, x)
  assert logits.shape == (2, 3) and np.isfinite(np.asarray(logits)).all()
  assert inter["stage_0"].shape == (2, 5, 7, 16) and inter["stage_1"].shape == (2, 3, 4, 32)
  with pytest.raises(ValueError, match=r"not divisible by the patch size \(4, 4\).*30 -> 28 or 32"):
    model.init(jax.random.key(0), jnp.zeros((1, 30, 28, 3)))


def test_swin_conv_stem_replaces_the_patch_embedding():
  model = _tiny_swin(stem="conv")
  x = jax.random.normal(jax.random.key(0), (2, 16, 16, 3))
  v = model.init(jax.random.key(0), x)
  assert "conv_stem" in v["params"] and "patch_embed" not in v["params"]
  (logits, inter), upd = model.apply(v, x, train=True, mutable=["batch_stats"], rngs={"dropout": jax.random.key(1)})
  assert inter["stage_0"].shape == (2, 4, 4, 16) and logits.shape == (2, 3)
  assert not np.allclose(upd["batch_stats"]["conv_stem"]["bn_0"]["mean"], 0)
  with pytest.raises(ValueError, match="unknown stem 'cnn'"):
    _tiny_swin(stem="cnn").init(jax.random.key(0), x)


def test_swin_training_mode_is_stochastic_and_evaluation_is_not():
  model = _tiny_swin(drop_path_rate=0.5)
  x = jax.random.normal(jax.random.key(0), (4, 16, 16, 3))
  v = model.init(jax.random.key(0), x)
  a, _ = model.apply(v, x, train=True, rngs={"dropout": jax.random.key(1)})
  b, _ = model.apply(v, x, train=True, rngs={"dropout": jax.random.key(2)})
  assert not np.allclose(a, b)
  np.testing.assert_array_equal(model.apply(v, x)[0], model.apply(v, x)[0])


@pytest.mark.parametrize("name", ["vit", "swin"])
def test_fast_and_reference_attention_agree_in_models(name):
  mk = _tiny_vit if name == "vit" else _tiny_swin
  x = jax.random.normal(jax.random.key(0), (2, 16, 16, 3))
  v = mk().init(jax.random.key(0), x)
  np.testing.assert_allclose(mk().apply(v, x)[0], mk(implementation="reference").apply(v, x)[0], atol=1e-5)
