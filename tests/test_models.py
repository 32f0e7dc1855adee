import functools

import flax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vitjax import models
from vitjax.models.adapt import adapt_params
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
    dict(norm="post", embed_norm=True, pool_type="flatten"),
    dict(norm="respost", rel_pos_bias=True),
  ],
)
def test_vit_options_run_on_non_square_images(kw):
  model = _tiny_vit(**kw)
  x = jnp.ones((2, 16, 24, 3))
  variables = _init(model, x)
  logits, inter = _apply(model, variables, x)
  assert logits.shape == (2, 5) and np.isfinite(np.asarray(logits)).all()
  assert inter["encoded"].shape[1] == 4 * 6 + (kw.get("pool_type", "tok") == "tok")
  if kw.get("stem") == "conv":  # BatchNorm statistics update in training mode
    _, upd = _apply(model, variables, x, train=True, mutable=("batch_stats",), rngs={"dropout": jax.random.key(1)})
    assert "batch_stats" in upd


def _shapes(model, *inputs):
  return jax.eval_shape(lambda: model.init(jax.random.key(0), *inputs))["params"]


def _count(tree) -> int:
  return sum(int(np.prod(a.shape)) for a in jax.tree.leaves(tree))


@pytest.mark.parametrize(
  "kw",
  [
    dict(),
    dict(norm="post"),
    dict(norm="respost"),
    dict(embed_norm=True),
    dict(pool_type="flatten"),
    dict(rel_pos_bias=True),
    dict(rel_pos_bias=True, pool_type="gap", scan=True),
  ],
)
def test_vit_parameter_count_by_formula(kw):
  d, m, k, heads, depth, (h, w) = 32, 64, 5, 2, 2, (4, 6)  # _tiny_vit on 16 x 24 images: a 4 x 6 patch grid
  pool = kw.get("pool_type", "tok")
  n = h * w + (pool == "tok")
  block = 4 * (d * d + d) + (d * m + m) + (m * d + d) + 2 * 2 * d  # q, k, v, out; fc1, fc2; norm1, norm2
  if kw.get("rel_pos_bias"):
    block += (2 * h - 1) * (2 * w - 1) * heads + (3 * heads if pool == "tok" else 0)  # table (+ cls_bias)
  want = 4 * 4 * 3 * d + d + (d if pool == "tok" else 0) + n * d + depth * block  # patch conv, cls, posemb
  want += 2 * d if kw.get("norm", "pre") != "post" else 0  # final norm
  want += 2 * d if kw.get("embed_norm") else 0
  want += (n * d if pool == "flatten" else d) * k + k  # head
  assert _count(_shapes(_tiny_vit(**kw), jnp.zeros((1, 16, 24, 3)))) == want


def _ln(x, p, eps=1e-6):
  mu, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
  return (x - mu) / np.sqrt(var + eps) * p["scale"] + p["bias"]


def _random_params(model, *inputs, noise=0.2):
  """Parameters of model's shapes drawn by numpy: LayerNorm scales 1 + noise * N(0, 1), the rest noise * N(0, 1).

  Only shapes are traced (eval_shape): jax's initializers would compile once per shape, seconds on CI's CPU.
  """
  rng = np.random.RandomState(7)
  shapes = flax.traverse_util.flatten_dict(jax.eval_shape(lambda: model.init(jax.random.key(0), *inputs))["params"])
  draw = lambda k, s: jnp.asarray((k[-1] == "scale") + noise * rng.randn(*s.shape), jnp.float32)
  return flax.traverse_util.unflatten_dict({k: draw(k, s) for k, s in shapes.items()})


def test_vit_embed_norm_and_flatten_head_match_float64(rng):
  """No blocks (depth 0): patches -> embedding -> embed_norm -> (+ cls) + positions -> final norm or fc_norm."""
  images = rng.randn(2, 8, 12, 3)
  patches = images.reshape(2, 2, 4, 3, 4, 3).transpose(0, 1, 3, 2, 4, 5).reshape(2, 6, 48)  # 2 x 3 grid, row-major
  f64 = lambda tree: jax.tree.map(lambda a: np.asarray(a, np.float64), flax.core.unfreeze(tree))
  kw = dict(depth=0, width=8, num_heads=2, num_classes=3, embed_norm=True)
  model = models.create("Ti/4", pool_type="flatten", **kw)
  p = _random_params(model, jnp.asarray(images, jnp.float32))
  q = f64(p)
  x = _ln(patches @ q["embedding"]["kernel"].reshape(48, 8) + q["embedding"]["bias"], q["embed_norm"])
  x = _ln(x + q["posembed"]["pos_embedding"][0], q["encoder"]["final_norm"])
  want = x.reshape(2, 6 * 8) @ q["head"]["kernel"] + q["head"]["bias"]  # Flatten + Linear
  assert q["head"]["kernel"].shape == (48, 3)
  np.testing.assert_allclose(_apply(model, {"params": p}, jnp.asarray(images, jnp.float32))[0], want, atol=1e-5)
  # with a class token: the norm comes before it (the class token is not normalised)
  model = models.create("Ti/4", pool_type="tok", fc_norm=True, **kw)  # fc_norm: no final norm on "encoded"
  p = _random_params(model, jnp.asarray(images, jnp.float32))
  q = f64(p)
  x = _ln(patches @ q["embedding"]["kernel"].reshape(48, 8) + q["embedding"]["bias"], q["embed_norm"])
  want = np.concatenate([np.broadcast_to(q["cls"], (2, 1, 8)), x], 1) + q["posembed"]["pos_embedding"]
  got = _apply(model, {"params": p}, jnp.asarray(images, jnp.float32))[1]["encoded"]
  np.testing.assert_allclose(got, want, atol=1e-5)
  with pytest.raises(ValueError, match="unknown pool_type 'cls'; use one of 'tok', 'gap', 'map', 'none', 'flatten'"):
    _shapes(models.create("Ti/4", pool_type="cls", **kw), jnp.zeros((1, 8, 12, 3)))
  with pytest.raises(ValueError, match="unknown norm 'sandwich'; use one of 'pre', 'post', 'respost'"):
    _shapes(models.create("Ti/4", norm="sandwich", **kw), jnp.zeros((1, 8, 12, 3)))


def test_vit_relative_position_bias_scans_and_resizes_keeping_shared_offsets():
  x = jnp.asarray(np.random.RandomState(0).randn(2, 12, 12, 3), jnp.float32)  # a 3 x 3 patch grid
  big = jnp.zeros((1, 20, 20, 3))  # 5 x 5
  plain, scanned = _tiny_vit(rel_pos_bias=True), _tiny_vit(rel_pos_bias=True, scan=True)
  p = _random_params(plain, x)
  stacked = {k: v for k, v in p.items() if not k.startswith("encoder")}
  stacked["encoder"] = {
    "blocks": {"block": jax.tree.map(lambda *a: jnp.stack(a), p["encoder"]["block_0"], p["encoder"]["block_1"])},
    "final_norm": p["encoder"]["final_norm"],
  }
  assert jax.tree.map(jnp.shape, stacked) == jax.tree.map(jnp.shape, _shapes(scanned, x))
  plain_apply, scanned_apply = jax.jit(plain.apply), jax.jit(scanned.apply)  # one compile each, not op by op
  want = plain_apply({"params": p}, x)[0]
  np.testing.assert_allclose(scanned_apply({"params": stacked}, x)[0], want, atol=1e-5)  # per-layer tables
  zero = jax.tree.map(jnp.zeros_like, p["encoder"]["block_0"]["rel_pos"])
  p0 = {**p, "encoder": {**p["encoder"], "block_0": {**p["encoder"]["block_0"], "rel_pos": zero}}}
  assert not np.allclose(plain_apply({"params": p0}, x)[0], want, atol=1e-3)  # the bias is used

  for model, params in [(plain, p), (scanned, stacked)]:  # fine-tuning at 20 x 20: the tables grow 5x5 -> 9x9
    target = _shapes(model, big)  # adapt_params needs only the shapes here (the head stays)
    out, changes = adapt_params(params, target)
    new, old = (flax.traverse_util.flatten_dict(t, sep="/") for t in (out, params))
    tables = [k for k in new if k.endswith("relative_position_bias_table")]
    assert len(tables) == (1 if model.scan else 2)
    for k in tables:  # [(layers,) rows, heads]: the rows are a 5 x 5 grid of offsets, now 9 x 9
      t_new, t_old = np.asarray(new[k]).reshape(-1, 9, 9, 2), np.asarray(old[k]).reshape(-1, 5, 5, 2)
      np.testing.assert_array_equal(t_new[:, 2:7, 2:7], t_old)  # every offset of the 3x3 grid keeps its bias
      cls_bias = k.replace("relative_position_bias_table", "cls_bias")
      np.testing.assert_array_equal(new[cls_bias], old[cls_bias])
    assert any("relative_position_bias_table" in c and "(clip)" in c for c in changes)
    assert jax.tree.map(lambda a: tuple(a.shape), out) == jax.tree.map(lambda a: tuple(a.shape), target)


def test_transformer_default_parameter_tree_is_unchanged():
  """The default (post-norm) Transformer has the parameter names and shapes it had before `norm`, so older
  checkpoints load; pre and respost add only the stacks' final norms."""
  src, tgt = jnp.ones((1, 5), jnp.int32), jnp.ones((1, 4), jnp.int32)
  make = lambda **kw: models.create("transformer_tiny", vocab_size=7, num_layers=1, **kw)
  attn = {f"{n}/kernel": (64, 2, 32) for n in ("query", "key", "value")}
  attn |= {f"{n}/bias": (2, 32) for n in ("query", "key", "value")} | {"out/kernel": (2, 32, 64), "out/bias": (64,)}
  mlp = {"mlp/fc1/kernel": (64, 128), "mlp/fc1/bias": (128,), "mlp/fc2/kernel": (128, 64), "mlp/fc2/bias": (64,)}
  norms = lambda k: {f"norm{i}/{w}": (64,) for i in range(1, k + 1) for w in ("scale", "bias")}
  want = {"src_embed/embedding": (7, 64)}
  for part in (mlp, norms(2), {f"attn/{k}": v for k, v in attn.items()}):
    want |= {f"encoder/stack/block_0/{k}": v for k, v in part.items()}
  for part in (
    mlp,
    norms(3),
    {f"self_attn/{k}": v for k, v in attn.items()},
    {f"cross_attn/{k}": v for k, v in attn.items()},
  ):
    want |= {f"decoder/stack/block_0/{k}": v for k, v in part.items()}
  flat = lambda model: {
    k: v.shape for k, v in flax.traverse_util.flatten_dict(_shapes(model, src, tgt), sep="/").items()
  }
  assert flat(make()) == want
  assert flat(make(norm="respost")) == flat(make(norm="pre"))
  assert set(flat(make(norm="pre"))) - set(want) == {
    f"{s}/stack/final_norm/{w}" for s in ("encoder", "decoder") for w in ("scale", "bias")
  }
  with pytest.raises(ValueError, match="use one of 'pre', 'post', 'respost'"):
    _shapes(make(norm="prenorm"), src, tgt)


def test_vit_refuses_images_not_divisible_by_the_patch():
  with pytest.raises(ValueError, match=r"not divisible by the patch size \(16, 16\).*230 -> 224 or 240"):
    models.create("vit_ti16").init(jax.random.key(0), jnp.zeros((1, 230, 224, 3)))
  with pytest.raises(ValueError, match=r"\(15, 15\); resize or crop to a multiple \(8 -> 15, 8 -> 15\)"):  # not 0
    models.create("vit_s15").init(jax.random.key(0), jnp.zeros((1, 8, 8, 1)))


@pytest.mark.parametrize("name", ["vit_ti16", "swin_t"])
def test_inputs_of_another_size_or_channels_than_the_weights_are_one_line(name):
  model = models.create(name, num_classes=3)
  variables = jax.eval_shape(model.init, jax.random.key(0), jnp.zeros((1, 64, 64, 3)))  # shapes only: no compute
  param = {"vit_ti16": ("posembed/pos_embedding", "embedding/kernel"), "swin_t": ("relative_position_bias_table",
           "patch_embed/kernel")}[name]  # fmt: skip
  for shape, where in (((1, 128, 128, 3), param[0]), ((1, 64, 64, 1), param[1])):
    with pytest.raises(ValueError, match=rf"inputs \[{', '.join(map(str, shape))}\] do not fit its weights: .*{where}"
                       r".*or adapt the weights .*adapt_params") as e:  # fmt: skip
      jax.eval_shape(model.apply, variables, jax.ShapeDtypeStruct(shape, jnp.float32))
    assert str(e.value).splitlines()[0].endswith("(as config.init_from does)")  # (jax may add a note below)


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


def _init(model, x, key=0):
  """model.init, jitted: op by op, a Swin's init or apply is 5-10x slower."""
  return jax.jit(model.init)(jax.random.key(key), x)


def _apply(model, variables, x, train=False, mutable=False, **kw):
  """model.apply, jitted (train and mutable are static)."""
  return jax.jit(functools.partial(model.apply, train=train, mutable=mutable))(variables, x, **kw)


def _tiny_swin(**kw):
  return models.create("swin_t", embed_dim=16, depths=(2, 2), num_heads=(2, 4), window_size=4, num_classes=3, **kw)


def test_swin_window_shrinks_to_small_maps():
  model = _tiny_swin()
  variables = _init(model, jnp.zeros((1, 24, 24, 3)))  # maps 6x6 then 3x3
  p = variables["params"]
  assert p["stage_0_block_1"]["rel_pos"]["relative_position_bias_table"].shape == (7 * 7, 2)  # window 4
  assert p["stage_1_block_1"]["rel_pos"]["relative_position_bias_table"].shape == (5 * 5, 4)  # shrunk to 3


def test_swin_pads_maps_the_window_does_not_divide_and_refuses_bad_patches():
  model = _tiny_swin()
  x = jax.random.normal(jax.random.key(0), (2, 20, 28, 3))  # maps 5x7 (padded to 8x8) then 3x4
  variables = _init(model, x)
  logits, inter = _apply(model, variables, x)
  assert logits.shape == (2, 3) and np.isfinite(np.asarray(logits)).all()
  assert inter["stage_0"].shape == (2, 5, 7, 16) and inter["stage_1"].shape == (2, 3, 4, 32)
  with pytest.raises(ValueError, match=r"not divisible by the patch size \(4, 4\).*30 -> 28 or 32"):
    model.init(jax.random.key(0), jnp.zeros((1, 30, 28, 3)))


def test_swin_conv_stem_replaces_the_patch_embedding():
  model = _tiny_swin(stem="conv")
  x = jax.random.normal(jax.random.key(0), (2, 16, 16, 3))
  v = _init(model, x)
  assert "conv_stem" in v["params"] and "patch_embed" not in v["params"]
  (logits, inter), upd = _apply(model, v, x, train=True, mutable=("batch_stats",), rngs={"dropout": jax.random.key(1)})
  assert inter["stage_0"].shape == (2, 4, 4, 16) and logits.shape == (2, 3)
  assert not np.allclose(upd["batch_stats"]["conv_stem"]["bn_0"]["mean"], 0)
  with pytest.raises(ValueError, match="unknown stem 'cnn'"):
    _tiny_swin(stem="cnn").init(jax.random.key(0), x)


def test_conv_stem_depth_adds_same_size_convolutions_at_each_resolution():
  x = jnp.ones((2, 16, 16, 1))
  stem = models.create("Ti/4", depth=1, width=32, num_heads=2, num_classes=3, stem="conv", stem_depth=3)
  variables = _init(stem, x)
  v = variables["params"]["conv_stem"]
  # 16 -> 8 at 16 channels (conv_0, then conv_0_1, conv_0_2 at 8x8), 8 -> 4 at 32 channels (conv_1, conv_1_*), 1x1
  convs = ["conv_0", "conv_0_1", "conv_0_2", "conv_1", "conv_1_1", "conv_1_2"]
  assert sorted(k for k in v if k.startswith("conv")) == convs
  assert v["conv_0"]["kernel"].shape == (3, 3, 1, 16) and v["conv_0_2"]["kernel"].shape == (3, 3, 16, 16)
  assert v["conv_1_1"]["kernel"].shape == (3, 3, 32, 32) and v["proj"]["kernel"].shape == (1, 1, 32, 32)
  _, inter = _apply(stem, variables, x)
  assert inter["encoded"].shape == (2, 1 + 16, 32)  # the token grid is the same as depth 1's
  swin = _tiny_swin(stem="conv", stem_depth=2)
  assert "conv_0_1" in _init(swin, jnp.ones((1, 16, 16, 3)))["params"]["conv_stem"]
  with pytest.raises(ValueError, match="depth >= 1"):
    models.create("Ti/4", depth=1, width=32, num_heads=2, stem="conv", stem_depth=0).init(jax.random.key(0), x)


def test_swin_training_mode_is_stochastic_and_evaluation_is_not():
  model = _tiny_swin(drop_path_rate=0.5)
  x = jax.random.normal(jax.random.key(0), (4, 16, 16, 3))
  v = _init(model, x)
  a, _ = _apply(model, v, x, train=True, rngs={"dropout": jax.random.key(1)})
  b, _ = _apply(model, v, x, train=True, rngs={"dropout": jax.random.key(2)})
  assert not np.allclose(a, b)
  np.testing.assert_array_equal(_apply(model, v, x)[0], _apply(model, v, x)[0])


@pytest.mark.parametrize("name", ["vit", "swin"])
def test_fast_and_reference_attention_agree_in_models(name):
  mk = _tiny_vit if name == "vit" else _tiny_swin
  x = jax.random.normal(jax.random.key(0), (2, 16, 16, 3))
  v = _init(mk(), x)
  np.testing.assert_allclose(_apply(mk(), v, x)[0], _apply(mk(implementation="reference"), v, x)[0], atol=1e-5)


def test_registers_are_attended_to_and_never_pooled():
  """num_registers: learned tokens after the class token; they change what the patches see, but "gap" averages
  the patches alone and "tok" takes the class token. Off (0), the ViT has no such parameter."""
  x = jax.random.normal(jax.random.key(0), (2, 16, 16, 3))
  kw = dict(patch_size=4, width=32, depth=2, num_heads=2, mlp_dim=64, num_classes=0)
  assert "registers" not in _init(models.create("vit_ti16", **kw), x)["params"]
  for pool in ("gap", "tok"):
    model = models.create("vit_ti16", **kw, pool_type=pool, num_registers=3, class_posemb=False)
    v = _init(model, x)
    assert v["params"]["registers"].shape == (1, 3, 32) and v["params"]["posembed"]["pos_embedding"].shape == (
      1,
      16,
      32,
    )
    pooled, out = model.apply(v, x)
    assert out["encoded"].shape == (2, 16 + 3 + (pool == "tok"), 32)
    want = out["encoded"][:, -16:].mean(1) if pool == "gap" else out["encoded"][:, 0]
    np.testing.assert_allclose(pooled, want, rtol=1e-6, atol=1e-6)
    moved = {**v["params"], "registers": jax.random.normal(jax.random.key(1), (1, 3, 32))}  # (a shift: LayerNorm)
    assert np.abs(model.apply({"params": moved}, x)[0] - pooled).max() > 1e-3  # attended to
  with pytest.raises(ValueError, match="num_registers=-1 must be a whole number >= 0"):
    models.create("vit_ti16", num_registers=-1)


def test_layerscale_scales_each_branch_and_is_not_decayed():
  """init_values: every block's two branches are scaled per channel ("ls1", "ls2", initialised to it); at a scale of
  1e-30 the blocks add nothing, so the ViT is its embeddings and final norm. Scales and registers are not decayed."""
  from vitjax.train import optim

  x = jax.random.normal(jax.random.key(0), (2, 16, 16, 3))
  kw = dict(patch_size=4, width=32, num_heads=2, mlp_dim=64, num_classes=5, head_zeroinit=False)
  model = models.create("vit_ti16", **kw, depth=2, init_values=1e-30, num_registers=2)
  v = _init(model, x)
  assert v["params"]["encoder"]["block_1"]["ls2"]["scale"][0] == np.float32(1e-30)
  blockless = {k: w for k, w in v["params"].items() if k != "encoder"}
  blockless["encoder"] = {"final_norm": v["params"]["encoder"]["final_norm"]}
  shallow = models.create("vit_ti16", **kw, depth=0, num_registers=2)
  np.testing.assert_allclose(model.apply(v, x)[0], shallow.apply({"params": blockless}, x)[0], atol=1e-6)
  mask = optim.decay_mask(v["params"], model)
  assert not mask["encoder"]["block_0"]["ls1"]["scale"] and not mask["registers"]
  assert mask["encoder"]["block_0"]["mlp"]["fc1"]["kernel"]
  scanned = models.create("vit_ti16", **kw, depth=2, init_values=1e-5, scan=True, remat=True)
  assert _init(scanned, x)["params"]["encoder"]["blocks"]["block"]["ls1"]["scale"].shape == (2, 32)
  with pytest.raises(ValueError, match="init_values=0 must be a number > 0"):
    models.create("vit_ti16", init_values=0)
  assert "ls1" not in _init(models.create("vit_ti16", **kw, depth=1), x)["params"]["encoder"]["block_0"]


def test_qk_norm_normalises_each_heads_queries_and_keys():
  """qk_norm: "layernorm" (timm's) or "rmsnorm" on each head's queries and keys, one norm shared by the heads; the
  logits are then invariant to scaling the query and key kernels (a norm's point); None adds nothing."""
  from vitjax.attention import MultiHeadAttention

  x = jax.random.normal(jax.random.key(0), (2, 5, 16))
  for kind in ("layernorm", "rmsnorm"):
    attn = MultiHeadAttention(num_heads=2, qkv_bias=False, qk_norm=kind)
    v = attn.init(jax.random.key(1), x)
    assert v["params"]["q_norm"]["scale"].shape == (8,) and "k_norm" in v["params"]
    scaled = jax.tree_util.tree_map_with_path(
      lambda p, a: a * 7.0 if any(getattr(k, "key", "") in ("query", "key") for k in p) else a, v
    )
    np.testing.assert_allclose(attn.apply(v, x), attn.apply(scaled, x), atol=1e-4)
  assert "q_norm" not in MultiHeadAttention(num_heads=2).init(jax.random.key(1), x)["params"]
  with pytest.raises(ValueError, match="unknown qk_norm 'l2'"):
    MultiHeadAttention(num_heads=2, qk_norm="l2").init(jax.random.key(1), x)
  vit = models.create("vit_ti16", patch_size=4, width=32, depth=1, num_heads=2, mlp_dim=64, qk_norm="rmsnorm")
  assert "q_norm" in _init(vit, jnp.zeros((1, 16, 16, 3)))["params"]["encoder"]["block_0"]["attn"]


def test_rgb_weights_on_grey_images_see_them_as_the_rgb_model_sees_three_equal_channels():
  """adapt.grey_input: an RGB ViT's weights fitted to a 1-channel model (its patch embedding summed over the colours)
  give that model, on grey images, the RGB model's logits on the same images repeated in three channels."""
  from vitjax.models import adapt

  rgb = models.create("Ti/4", width=32, depth=1, num_heads=2, mlp_dim=64, num_classes=3)
  images = jax.random.uniform(jax.random.key(1), (2, 16, 16, 1))
  loaded = rgb.init(jax.random.key(0), jnp.repeat(images, 3, axis=-1))["params"]
  loaded = jax.tree.map(lambda p: p + 0.1 * jax.random.normal(jax.random.key(2), p.shape), loaded)
  target = jax.eval_shape(rgb.init, jax.random.key(0), images)["params"]
  fitted, changes = adapt.adapt_params(loaded, target, rgb)
  assert any("summed embedding/kernel's 3 input channels" in c for c in changes), changes
  want = rgb.apply({"params": loaded}, jnp.repeat(images, 3, axis=-1))[0]
  np.testing.assert_allclose(rgb.apply({"params": fitted}, images)[0], want, rtol=1e-5, atol=1e-6)


def test_patch_dropout_shows_the_encoder_a_random_share_of_patches_in_training_only():
  """ViT(patch_dropout=0.75): in training each example's encoder sees a quarter of its 16 patches (and its class token),
  drawn from the "dropout" RNG; evaluation sees them all and equals the model without the option."""
  model = models.create(
    "Ti/4", width=32, depth=1, num_heads=2, mlp_dim=64, num_classes=3, patch_dropout=0.75, head_zeroinit=False
  )
  x = jax.random.normal(jax.random.key(1), (2, 16, 16, 3))
  variables = model.init(jax.random.key(0), x)
  train = lambda seed: model.apply(variables, x, train=True, rngs={"dropout": jax.random.key(seed)})
  (a, out), (b, _) = train(0), train(1)
  assert out["encoded"].shape == (2, 1 + 4, 32)
  assert not np.allclose(a, b)  # another draw, other patches
  np.testing.assert_array_equal(model.apply(variables, x)[0], model.clone(patch_dropout=0.0).apply(variables, x)[0])
