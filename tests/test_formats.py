"""Checkpoint formats in and out (vitjax.convert, vitjax.export).

In: golden fixtures written by the original code (tests/golden/, made by experiments/golden/make_vision.py from
google-research/vision_transformer, google-research/big_vision and microsoft/Swin-Transformer): their weights in
their own format, a fixed input and their logits; vitjax must reproduce the logits within 1e-5 relative.
Out: vitjax -> timm -> vitjax and vitjax -> npz -> vitjax give back the same parameters, and timm loads the
exported state dict with strict=True and gives vitjax's logits.
"""

import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import train_helpers as th

from vitjax import convert, models, paths

GOLDEN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "golden")
TOL = 1e-5  # max |difference| <= TOL * max |logit|


def _rel(got, want) -> float:
  got, want = np.asarray(got), np.asarray(want)
  assert got.shape == want.shape, (got.shape, want.shape)
  rel = float(np.abs(got - want).max() / np.abs(want).max())
  print(f"relative max error {rel:.1e}")
  return rel


def _randomised(variables, seed=0, scale=0.2):
  """Every weight moved off its initialisation (zero heads and biases would hide mistakes)."""
  leaves, tree = jax.tree.flatten(variables)
  keys = jax.random.split(jax.random.key(seed), len(leaves))
  return jax.tree.unflatten(tree, [x + scale * jax.random.normal(k, x.shape) for x, k in zip(leaves, keys)])


def _same_params(a, b) -> None:
  fa = jax.tree_util.tree_flatten_with_path(a)[0]
  fb = dict(jax.tree_util.tree_flatten_with_path(b)[0])
  assert [p for p, _ in fa] == list(fb), "parameter trees differ"
  for p, x in fa:
    np.testing.assert_array_equal(np.asarray(x), np.asarray(fb[p]), err_msg=jax.tree_util.keystr(p))


def _images(hw, seed=1, channels=3):
  return np.random.RandomState(seed).randn(2, *hw, channels).astype(np.float32)


# ------------------------------------------------------------------------------------- golden fixtures (in)


def _manifest() -> dict:
  path = os.path.join(GOLDEN, "MANIFEST.json")
  if not os.path.exists(path):
    return {}
  with open(path) as f:
    return json.load(f)


def _load_weights(case: dict):
  path = os.path.join(GOLDEN, case["weights"])
  if path.endswith(".pth"):
    torch = pytest.importorskip("torch")
    return convert.from_swin(torch.load(path, map_location="cpu", weights_only=True))
  if path.endswith(".safetensors"):  # timm's layout, read by the model's name (timm_name)
    from safetensors.numpy import load_file

    return convert.from_timm(case["timm_name"], load_file(path))
  return convert.from_vit_npz(path)


@pytest.mark.parametrize("name", sorted(_manifest()))
def test_golden_fixtures_are_well_conditioned(name):
  """Another CPU (AVX-512 against AVX2, other thread counts) rounds differently; a fixture whose logits move by
  about TOL when every weight moves one float32 ulp would fail there. Measured: 2.7e-7 to 1.6e-6 of max |logit|
  (vit_jax_token_rep the most), so TOL = 1e-5 stands 6x or more above the noise."""
  module, variables = _load_weights(_manifest()[name])
  images = np.load(os.path.join(GOLDEN, _manifest()[name]["expected"]))["images"]
  rng = np.random.default_rng(0)

  def one_ulp(v):  # each nonzero weight one ulp up or down at random
    v = np.asarray(v)
    step = np.where(rng.random(v.shape) < 0.5, -np.inf, np.inf).astype(v.dtype)
    return np.where(v == 0, v, np.nextafter(v, step)) if v.dtype == np.float32 else v

  apply = jax.jit(module.apply)
  base, _ = apply(variables, images)
  moved, _ = apply(jax.tree.map(one_ulp, variables), images)
  assert _rel(moved, base) <= TOL / 4


@pytest.mark.parametrize("name", sorted(_manifest()))
def test_golden_logits_of_the_original_code(name):
  case = _manifest()[name]
  module, variables = _load_weights(case)
  expected = np.load(os.path.join(GOLDEN, case["expected"]))
  got, _ = jax.jit(module.apply)(variables, expected["images"])
  assert _rel(got, expected["logits"]) <= TOL
  if case["weights"].endswith(".npz"):  # the activation matters: exact GELU is visibly off the original
    other, _ = jax.jit(module.clone(act="gelu").apply)(variables, expected["images"])
    assert _rel(other, expected["logits"]) > 10 * TOL


def test_unknown_layouts_name_the_known_ones():
  with pytest.raises(ValueError, match=r"known: (?=.*timm ViT)(?=.*Microsoft's Swin)(?=.*big_vision)"):
    convert.from_swin({"conv1.weight": np.zeros((4, 3, 7, 7))})
  with pytest.raises(ValueError, match="not an original-ViT or big_vision checkpoint"):
    convert.from_vit_npz({"foo": np.zeros(3)})
  vit = models.ViT(num_classes=3, patch_size=(4, 4), width=24, depth=1, num_heads=3)
  npz = convert.to_vit_npz(vit, jax.jit(vit.init)(jax.random.key(0), jnp.zeros((1, 8, 8, 3))))
  with pytest.raises(ValueError, match=r"weights are in the vit-npz layout \(another model family\); use from_vit_npz"):
    convert.from_timm("vit_tiny_patch4_8", npz)
  with pytest.raises(ValueError, match="not a B/16: width 768 != 24"):
    convert.from_vit_npz(npz, "B/16")


# ------------------------------------------------------------------------------------------------ out: timm


def _timm_logits(torch, state_dict, cfg, images):
  """timm's model for an exported (state dict, config), loaded strictly, on images [B, H, W, C] (the test asks for
  the timm_ref fixture first: convert.build_timm imports timm)."""
  model = convert.build_timm(cfg)
  model.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in state_dict.items()}, strict=True)
  with torch.no_grad():
    return model(torch.from_numpy(images.transpose(0, 3, 1, 2))).numpy()


TINY_VIT = dict(num_classes=5, patch_size=(4, 4), width=24, depth=2, mlp_dim=40, num_heads=3)


@pytest.mark.parametrize(
  "options",
  [
    dict(pool_type="tok"),
    dict(pool_type="gap", fc_norm=True),
    dict(pool_type="map", act="gelu_tanh"),
    dict(pool_type="tok", posemb="sincos2d"),
  ],
  ids=["tok", "gap-fc_norm", "map-tanh", "sincos2d"],
)
def test_vit_to_timm_loads_strictly_and_round_trips(options, torch_ref, timm_ref):
  module = models.ViT(**TINY_VIT, **options)
  x = _images((16, 16))
  variables = _randomised(jax.jit(module.init)(jax.random.key(0), x))
  state_dict, cfg = convert.to_timm(module, variables, 16)
  want, _ = jax.jit(module.apply)(variables, x)
  assert _rel(_timm_logits(torch_ref, state_dict, cfg, x), want) <= TOL
  if options.get("posemb") == "sincos2d":
    return  # timm learns the table: it comes back as posemb="learn"
  assert cfg["kwargs"]["act_layer"] == module.act  # the export's config carries the activation
  back, back_vars = convert.from_timm("vit_tiny_patch4_16", state_dict)  # the name gives the heads (Ti: 3)
  _same_params(variables, back_vars)
  # a bare state dict carries no activation: it reads back as exact GELU, timm's; with the config's, the same model
  assert back.act == "gelu"
  assert back.clone(act=cfg["kwargs"]["act_layer"]) == module.clone(parent=None)
  assert (_rel(jax.jit(back.apply)(back_vars, x)[0], want) <= TOL) == (module.act == "gelu")


def test_swin_to_timm_loads_strictly_and_round_trips(torch_ref, timm_ref):
  module = models.Swin(num_classes=5, embed_dim=16, depths=(2, 2), num_heads=(2, 4), window_size=4)
  x = _images((32, 32))
  variables = _randomised(jax.jit(module.init)(jax.random.key(0), x))
  state_dict, cfg = convert.to_timm(module, variables, 32)
  want, _ = jax.jit(module.apply)(variables, x)
  assert _rel(_timm_logits(torch_ref, state_dict, cfg, x), want) <= TOL
  back, back_vars = convert.from_timm("swin_tiny_patch4_window4_32", state_dict)
  _same_params(variables, back_vars)
  for field in ("embed_dim", "depths", "num_heads", "window_size", "patch_size", "num_classes", "act"):
    assert tuple(np.atleast_1d(getattr(back, field))) == tuple(np.atleast_1d(getattr(module, field))), field


@pytest.mark.parametrize("family", ["vit", "swin"])
def test_to_timm_at_another_image_size_fits_the_weights_as_init_from_does(family, torch_ref, timm_ref, caplog):
  """A model made at 16 px exported for 32 px: timm's logits are vitjax's with the weights config.init_from would give
  (before, the ViT's position table was written for the old grid: timm refused it, or misread a non-square one)."""
  from vitjax.models import adapt

  if family == "vit":
    module = models.ViT(**TINY_VIT)
    changed = "pos_embedding"
  else:  # 16 px: stage 1's map is 2 x 2, its window 2; at 32 px 4 x 4 and 4: a bigger bias table
    module = models.Swin(num_classes=5, embed_dim=16, depths=(2, 2), num_heads=(2, 4), window_size=4)
    changed = "relative_position_bias_table"
  variables = _randomised(jax.jit(module.init)(jax.random.key(0), _images((16, 16))))
  x = _images((32, 32))
  state_dict, cfg = convert.to_timm(module, variables, 32)
  target = jax.eval_shape(module.init, jax.random.key(0), x)["params"]
  fitted, changes = adapt.adapt_params(variables["params"], target, module)
  assert changes and all(changed in c for c in changes)
  assert any(changed in r.getMessage() and "at image size (32, 32)" in r.getMessage() for r in caplog.records)
  want, _ = jax.jit(module.apply)({"params": fitted}, x)
  assert _rel(_timm_logits(torch_ref, state_dict, cfg, x), want) <= TOL
  with pytest.raises(ValueError, match=r"not divisible by the patch size \(4, 4\)"):
    convert.to_timm(module, variables, 30)


def test_export_refuses_what_the_format_cannot_express():
  x = jnp.zeros((1, 16, 16, 3))
  vit = models.ViT(**TINY_VIT, stem="conv")
  variables = jax.jit(vit.init)(jax.random.key(0), x)  # jitted: op by op, an init takes seconds
  with pytest.raises(ValueError, match="no equivalent for stem='conv'"):
    convert.to_timm(vit, variables, 16)
  gap = models.ViT(**TINY_VIT, pool_type="map")
  with pytest.raises(ValueError, match="no equivalent for pool_type='map'"):
    convert.to_vit_npz(gap, jax.jit(gap.init)(jax.random.key(0), x))
  # neither file holds a LayerNorm epsilon (both formats' models use 1e-6: read back, 1e-3 moved the logits by 6.5e-3),
  # and the original ViT's attention always has biases (its .npz without them did not read back)
  for options, write in (
    (dict(layernorm_eps=1e-12), lambda m, v: convert.to_timm(m, v, 16)),
    (dict(layernorm_eps=1e-12), convert.to_vit_npz),
    (dict(qkv_bias=False), convert.to_vit_npz),
  ):
    module = models.ViT(**TINY_VIT, **options)
    ((name, value),) = options.items()
    with pytest.raises(ValueError, match=f"no equivalent for {name}={value!r}"):
      write(module, jax.jit(module.init)(jax.random.key(0), x))


def test_a_vit_with_a_head_count_no_timm_name_has_reads_back_with_num_heads():
  """A timm file does not hold the heads, and a timm name gives only its size's (tiny 3, small 6, medium 8, ...):
  vitjax's own export of a 4-head ViT read back as 'vit_medium' (8 heads) gave other logits, without a word."""
  module = models.ViT(**{**TINY_VIT, "width": 32, "num_heads": 4})
  variables = _randomised(jax.jit(module.init)(jax.random.key(0), _images((16, 16))))
  state_dict, cfg = convert.to_timm(module, variables, 16)
  back, back_vars = convert.from_timm("vit_medium_patch4_16", state_dict, num_heads=cfg["kwargs"]["num_heads"])
  assert back.num_heads == 4
  _same_params(variables, back_vars)
  with pytest.raises(ValueError, match="3 heads do not divide the weights' width 32: .* num_heads="):
    convert.from_timm("vit_tiny_patch4_16", state_dict)


def test_writers_name_a_tree_of_the_wrong_kind(tmp_path):
  """params for variables was a bare KeyError 'params'; a nested dict for a state dict a TypeError from float()."""
  module = models.ViT(**TINY_VIT)
  variables = jax.jit(module.init)(jax.random.key(0), _images((16, 16)))
  for write in (
    lambda: convert.to_timm(module, variables["params"], 16),
    lambda: convert.to_vit_npz(module, variables["params"]),
  ):
    with pytest.raises(ValueError, match=r"takes the variables \{'params': ...\} as module.init returns them; got \["):
      write()
  with pytest.raises(ValueError, match="save_safetensors takes a flat state dict .*'embedding' holds a dict"):
    convert.save_safetensors(str(tmp_path / "m.safetensors"), jax.device_get(variables["params"]))
  assert not os.listdir(tmp_path)
  (tmp_path / "w.npz").write_bytes(b"x")
  with pytest.raises(ValueError, match=r"is an .npz: the original ViT's or big_vision's weights: npz:"):
    convert.load_params(f"timm:vit_tiny_patch16_224:{tmp_path / 'w.npz'}")


def test_a_safetensors_write_that_fails_leaves_neither_a_temporary_nor_a_target_file(tmp_path, monkeypatch):
  """save_safetensors writes a temporary file and renames it: when the rename fails, the temporary file goes too,
  the old file at the path is kept, and the error is raised."""
  path = tmp_path / "m.safetensors"
  path.write_bytes(b"old")

  def fail(tmp, dst):
    raise OSError("disk full")

  monkeypatch.setattr(paths, "publish", fail)
  with pytest.raises(OSError, match="disk full"):
    convert.save_safetensors(str(path), {"w": np.ones((2, 2), np.float32)})
  assert os.listdir(tmp_path) == ["m.safetensors"] and path.read_bytes() == b"old"


def test_timm_round_trip_without_qkv_biases_or_a_head_and_its_config_fits_the_weights():
  """qkv_bias=False and num_classes=0 (a feature extractor), mlp_dim left to the default 4 x width: the config's
  qkv_bias, num_classes and mlp_ratio are those of the weights (else timm's strict load refuses them), and from_timm
  gives the same model back."""
  module = models.ViT(**{**TINY_VIT, "num_classes": 0, "mlp_dim": None}, qkv_bias=False)
  variables = _randomised(jax.jit(module.init)(jax.random.key(0), _images((16, 16))))
  state_dict, cfg = convert.to_timm(module, variables, 16)
  assert not any(k.endswith("qkv.bias") or k.startswith("head.") for k in state_dict)
  kw = cfg["kwargs"]
  assert (kw["qkv_bias"], kw["num_classes"]) == (False, 0)
  assert kw["mlp_ratio"] * kw["embed_dim"] == state_dict["blocks.0.mlp.fc1.weight"].shape[0] == 96
  back, back_vars = convert.from_timm("vit_tiny_patch4_16", state_dict)
  _same_params(variables, back_vars)
  assert (back.qkv_bias, back.num_classes, back.mlp_dim) == (False, 0, 96)


def test_training_checkpoints_are_unwrapped_to_the_model_not_its_ema():
  """{'state_dict': sd} (Lightning and others) is unwrapped as {'model': sd} (Microsoft's Swin) is; beside 'model', a
  'model_ema' is not what is read."""
  module = models.ViT(**TINY_VIT)
  variables = _randomised(jax.jit(module.init)(jax.random.key(0), _images((16, 16))))
  state_dict, _ = convert.to_timm(module, variables, 16)
  ema = {k: v + 1 for k, v in state_dict.items()}
  for wrapped in ({"state_dict": state_dict, "epoch": 3}, {"model": state_dict, "model_ema": ema, "epoch": 3}):
    assert convert.detect_layout(wrapped) == "timm-vit"
    _same_params(variables, convert.from_timm("vit_tiny_patch4_16", wrapped)[1])


def test_a_sincos_vit_exported_for_non_square_images_gets_the_table_of_that_grid():
  """At 16 x 32 px (a 4 x 8 grid) the written pos_embed, as a learned table, gives the sin-cos model's logits (a
  table computed for the 8 x 4 grid has the same shape but other values)."""
  module = models.ViT(**TINY_VIT, posemb="sincos2d")
  x = _images((16, 32))
  variables = _randomised(jax.jit(module.init)(jax.random.key(0), x))
  state_dict, cfg = convert.to_timm(module, variables, (16, 32))
  assert cfg["kwargs"]["img_size"] == (16, 32) and state_dict["pos_embed"].shape == (1, 1 + 4 * 8, 24)
  learned = {"params": {**variables["params"], "posembed": {"pos_embedding": state_dict["pos_embed"]}}}
  want, _ = jax.jit(module.apply)(variables, x)
  got, _ = jax.jit(module.clone(posemb="learn").apply)(learned, x)
  assert _rel(got, want) <= TOL


def test_check_shapes_lists_misshapen_missing_and_extra_parameters():
  """Every parameter that does not fit is named, each kind on its own line (a converter that forgets one or writes
  one too many is caught here, not by a KeyError deep in flax)."""
  from flax import traverse_util

  module = models.ViT(**TINY_VIT)
  shapes = jax.eval_shape(module.init, jax.random.key(0), jnp.zeros((1, 16, 16, 3)))["params"]
  flat = {k: np.zeros(v.shape, np.float32) for k, v in traverse_util.flatten_dict(shapes, sep="/").items()}
  flat["cls"] = np.zeros((1, 1, 12), np.float32)
  del flat["head/bias"]
  flat["head/extra"] = np.zeros(3, np.float32)
  with pytest.raises(ValueError) as e:
    convert.check_shapes(module, traverse_util.unflatten_dict(flat, sep="/"), (1, 16, 16, 3))
  assert str(e.value).splitlines() == [
    "checkpoint does not match the model:",
    "  cls: model (1, 1, 24), checkpoint (1, 1, 12)",
    "  head/bias: missing from checkpoint (model (5,))",
    "  head/extra: not in the model",
  ]


def test_importers_name_the_layout_of_another_familys_weights():
  """Weights of a known layout given to another family's importer: the error names their layout (and the importer
  to use), not a KeyError or IndexError from reading them as the wrong model."""
  timm_vit = {"blocks.0.attn.qkv.weight": np.zeros((6, 2), np.float32)}
  with pytest.raises(ValueError, match=r"^a Swin was asked for, but the weights are in the timm-vit layout"):
    convert.from_swin(timm_vit)
  with pytest.raises(ValueError, match=r"^from_vit_npz reads the original ViT's .npz, but .* in the timm-vit layout$"):
    convert.from_vit_npz(timm_vit)
  with pytest.raises(ValueError, match=r"^a transformers model was asked for, but .* in the timm-vit layout$"):
    convert.from_hf(timm_vit, {})
  hf_vit = {
    "vit.embeddings.patch_embeddings.projection.weight": np.zeros((30, 3, 4, 4), np.float32),
    "vit.encoder.layer.0.attention.attention.query.weight": np.zeros((30, 30), np.float32),
    "vit.encoder.layer.0.intermediate.dense.weight": np.zeros((60, 30), np.float32),
  }
  with pytest.raises(ValueError, match=r"^config.json's model_type is 'swin', but the weights are a transformers ViT$"):
    convert.from_hf(hf_vit, {"model_type": "swin"})
  with pytest.raises(ValueError, match=r"hidden_size 30 is not a multiple of num_attention_heads 4$"):
    convert.from_hf(hf_vit, {"model_type": "vit", "num_attention_heads": 4})


def test_a_transformers_swin_warns_once_at_the_first_stage_whose_map_is_padded(caplog):
  """transformers pads a stage's map to whole windows before the shift, vitjax after: a warning names the first
  stage where a map larger than the window is not a multiple of it (maps halve rounding up, as patch merging pads)."""
  from vitjax.models import swin_hf

  swin = models.Swin(embed_dim=16, depths=(2, 2, 2), num_heads=(1, 2, 4), window_size=7)
  for px, stage in ((224, None), (20, None), (256, "stage 1's map (64)"), (168, "stage 3's map (11)")):
    caplog.clear()
    swin_hf._warn_if_padded(swin, (px, px), "a Swin")  # maps 56 28 14; 5 (< the window); 64 32 16; 42 21 11
    warnings = [r.getMessage() for r in caplog.records if "not a multiple of the window" in r.getMessage()]
    assert len(warnings) == (stage is not None), (px, warnings)
    assert stage is None or f"{stage} is not a multiple of the window (7)" in warnings[0]


def test_to_timm_refuses_a_swin_timm_cannot_build():
  def zeros(module):  # the refusal needs the parameters' names and shapes only: no compiled init
    shapes = jax.eval_shape(module.init, jax.random.key(0), jnp.zeros((1, 32, 32, 3)))
    return jax.tree.map(lambda s: np.zeros(s.shape, s.dtype), shapes)

  swin = models.Swin(num_classes=5, embed_dim=16, depths=(2, 2), num_heads=(2, 4), window_size=4, act="gelu_tanh")
  with pytest.raises(ValueError, match=r"timm's SwinTransformer uses exact GELU; this model has act='gelu_tanh'"):
    convert.to_timm(swin, zeros(swin), 32)
  conv = swin.clone(act="gelu", stem="conv")
  with pytest.raises(ValueError, match="timm's SwinTransformer has no equivalent for stem='conv'"):
    convert.to_timm(conv, zeros(conv), 32)


# ------------------------------------------------------------------------------------------------- out: npz


def test_vit_npz_round_trip_and_timm_reads_it(tmp_path, torch_ref, timm_ref):
  module = models.ViT(**TINY_VIT, representation_size=None)
  x = _images((16, 16))
  variables = _randomised(jax.jit(module.init)(jax.random.key(0), x))
  path = str(tmp_path / "vit.npz")
  np.savez(path, **convert.to_vit_npz(module, variables))
  back, back_vars = convert.from_vit_npz(path, act=module.act)
  _same_params(variables, back_vars)
  assert back == module.clone(parent=None)
  # timm's reader of the original release's checkpoints, as a second, independent reader of the file
  from timm.models.vision_transformer import VisionTransformer, _load_weights

  ref = VisionTransformer(
    img_size=16, patch_size=4, embed_dim=24, depth=2, num_heads=3, mlp_ratio=40 / 24, num_classes=5
  ).eval()
  _load_weights(ref, path)
  with torch_ref.no_grad():
    got = ref(torch_ref.from_numpy(x.transpose(0, 3, 1, 2))).numpy()
  assert _rel(got, jax.jit(module.apply)(variables, x)[0]) <= TOL


def test_from_vit_npz_and_init_from_name_every_size_that_differs_from_the_variant(tmp_path):
  """A ViT-Ti's width and MLP with 4 heads and 4 px patches is not a Ti/16: both differences are named, by
  from_vit_npz and by init_from=npz:VARIANT:FILE."""
  vit = models.ViT(num_classes=3, patch_size=(4, 4), width=192, depth=1, num_heads=4, mlp_dim=768)
  path = str(tmp_path / "ti.npz")
  np.savez(path, **convert.to_vit_npz(vit, jax.jit(vit.init)(jax.random.key(0), jnp.zeros((1, 8, 8, 3)))))
  message = r"not a Ti/16: num_heads 3 != 4, patch_size \(16, 16\) != \(4, 4\)$"
  with pytest.raises(ValueError, match=message):
    convert.from_vit_npz(path, "Ti/16")
  from vitjax.errors import ConfigError

  with pytest.raises(ConfigError, match=message):
    convert.load_params(f"npz:Ti/16:{path}")
  assert convert.load_params(f"npz:{path}")["embedding"]["kernel"].shape == (4, 4, 3, 192)


def test_safetensors_export_feeds_init_from(tmp_path):
  module = models.Swin(num_classes=5, embed_dim=16, depths=(2, 2), num_heads=(2, 4), window_size=4)
  variables = _randomised(jax.jit(module.init)(jax.random.key(0), _images((32, 32))))
  path = str(tmp_path / "swin.safetensors")
  convert.save_safetensors(path, convert.to_timm(module, variables, 32)[0])
  _same_params(variables["params"], convert.load_params(f"timm:swin_t:{path}"))


# ------------------------------------------------------------------------------------------ the export command


def test_export_command_writes_what_timm_and_from_vit_npz_load(finished_run, tmp_path, torch_ref, timm_ref):
  import vitjax

  out = str(tmp_path / "new" / "folder" / "digits.safetensors")  # export creates the folder
  env = th.env()
  cmd = [sys.executable, "-m", "vitjax.export", f"--workdir={finished_run}"]
  th.check_ok(
    subprocess.run(
      [*cmd, "--format=timm", f"--out={out}"], cwd=th.ROOT, env=env, capture_output=True, text=True, timeout=300
    )
  )
  th.check_ok(
    subprocess.run(
      [*cmd, "--format=npz", f"--out={tmp_path / 'digits.npz'}"],
      cwd=th.ROOT,
      env=env,
      capture_output=True,
      text=True,
      timeout=300,
    )
  )
  trained = vitjax.load(finished_run)
  _, h, w, c = trained.task.example_inputs()[0].shape
  x = _images((h, w), channels=c)
  want, _ = jax.jit(trained.model.apply)(trained.variables, x)
  from safetensors.numpy import load_file

  with open(str(tmp_path / "new" / "folder" / "digits.json")) as f:
    cfg = json.load(f)
  for path in (out, tmp_path / "new" / "folder" / "digits.json", tmp_path / "digits.npz"):  # as any file, not 0600
    assert os.stat(path).st_mode & 0o777 == 0o666 & ~_umask(), path
  assert _rel(_timm_logits(torch_ref, load_file(out), cfg, x), want) <= TOL
  back, back_vars = convert.from_vit_npz(str(tmp_path / "digits.npz"), act=trained.model.act)
  _same_params(jax.device_get(trained.variables["params"]), back_vars["params"])
  # init_from's reader takes the heads (2: no timm name has 2) from the .json beside the weights
  assert cfg["kwargs"]["num_heads"] == trained.model.num_heads == 2
  _same_params(jax.device_get(trained.variables["params"]), convert.load_params(f"timm:vit_tiny_patch2_8:{out}"))
  bad = subprocess.run([*cmd, "--format=npz", "--out=x.bin"], cwd=th.ROOT, env=env, capture_output=True, text=True)
  assert (
    bad.returncode == 2
    and th.error_lines(bad) == "error: --out=x.bin: a --format=npz export is a .npz file (e.g. --out=model.npz)"
  )


def _umask() -> int:
  mask = os.umask(0)
  os.umask(mask)
  return mask


@pytest.mark.parametrize("spec,case", [("npz:{}", "big_vision_scan_gap_sincos"), ("timm:swin_tiny:{}", "swin_3stage")])
def test_init_from_reads_the_original_formats(spec, case):
  """config.init_from takes the big_vision .npz (npz:FILE) and Microsoft's Swin .pth (timm:NAME:FILE) as they are."""
  path = os.path.join(GOLDEN, _manifest()[case]["weights"])
  _same_params(_load_weights(_manifest()[case])[1]["params"], convert.load_params(spec.format(path)))


def test_init_from_fits_a_scanned_checkpoint_to_a_model_that_is_not_and_back():
  """big_vision trains scanned (its .npz is unstacked on import); vitjax configs may scan or not: adapt_params
  restacks the layers either way, the values unchanged."""
  from vitjax.models.adapt import adapt_params

  module, variables = convert.from_vit_npz(os.path.join(GOLDEN, "big_vision_scan_gap_sincos.npz"))
  params = jax.device_get(variables["params"])
  x = jnp.zeros((1, 16, 16, 3))
  scanned = jax.device_get(jax.jit(module.clone(scan=True).init)(jax.random.key(0), x)["params"])
  stacked, changes = adapt_params(params, scanned)
  assert changes == ["stacked the checkpoint's layers for the scanned model"]
  q = stacked["encoder"]["blocks"]["block"]["attn"]["query"]["kernel"]
  np.testing.assert_array_equal(q[1], params["encoder"]["block_1"]["attn"]["query"]["kernel"])
  unstacked, changes = adapt_params(stacked, params)
  assert changes == ["unstacked the checkpoint's scanned layers"]
  _same_params(params, unstacked)
