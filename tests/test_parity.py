"""Parity with the published implementations: timm's ViT and Swin, and the original JAX ViT checkpoint layout
(read by timm's own npz loader). Same random weights, same input, inference mode, float32.

Needs torch + timm (see docs/contributing.md, 'Tests'): each test asks for them (the `refs` fixture), and skips without them
(under CI, fails).
"""

import types

import jax
import numpy as np
import pytest

from vitjax import convert, models

# max |difference| <= TOL * max |logit|. Measured on the 2-core AVX2 EPYC (2026-11-26): 6.7e-7 (Swin-T) to 1.95e-6
# (ViT-S/32 at 384 px); the README's AVX-512 runs gave 1.1e-6 to 1.4e-6. 1e-5 is 5x the largest, as the golden
# fixtures' bound (tests/test_formats.py); it was 1e-4.
TOL = 1e-5


@pytest.fixture
def refs(torch_ref, timm_ref):
  return types.SimpleNamespace(torch=torch_ref, timm=timm_ref)


def _random_timm(refs, name, **kw):
  torch = refs.torch
  torch.manual_seed(0)
  model = refs.timm.create_model(name, pretrained=False, **kw).eval()
  with torch.no_grad():  # timm zero-initialises heads and some biases: make every weight matter
    for p in model.parameters():
      p.add_(0.02 * torch.randn_like(p))
  return model


def _rel_error(refs, model, module, variables, hw) -> float:
  """Relative max error of vitjax's logits against the torch model's, on the same random input."""
  x = np.random.RandomState(1).randn(2, 3, *hw).astype(np.float32)
  with refs.torch.no_grad():
    want = model(refs.torch.from_numpy(x)).numpy()
  got, _ = jax.jit(module.apply)(variables, x.transpose(0, 2, 3, 1))
  assert got.shape == want.shape
  rel = float(np.abs(np.asarray(got) - want).max() / np.abs(want).max())
  print(f"relative max error {rel:.2e}")
  return rel


def _compare(refs, model, module, variables, hw):
  rel = _rel_error(refs, model, module, variables, hw)
  assert rel <= TOL
  return rel


@pytest.mark.parametrize(
  "name,hw",
  [
    ("vit_tiny_patch16_224", (224, 224)),
    ("vit_small_patch32_384", (384, 384)),
    ("swin_tiny_patch4_window7_224", (224, 224)),
    pytest.param("vit_base_patch16_224", (224, 224), marks=pytest.mark.slow),
    pytest.param("swin_base_patch4_window12_384", (384, 384), marks=pytest.mark.slow),
  ],
)
def test_from_timm_matches_timm(refs, name, hw):
  model = _random_timm(refs, name)
  sd = {k: v.numpy() for k, v in model.state_dict().items()}
  module, variables = convert.from_timm(name + ".some_pretrained_tag", sd)
  _compare(refs, model, module, variables, hw)


@pytest.mark.parametrize(
  "name,kw,hw,options",
  [  # options: (num_registers, init_values, class_posemb, qk_norm) as read from the weights
    ("vit_small_patch14_dinov2", dict(img_size=56), 56, (0, 1e-5, True, None)),  # LayerScale; a class token row
    ("vit_small_patch14_reg4_dinov2", dict(img_size=56), 56, (4, 1e-5, False, None)),  # + 4 registers, no such rows
    ("deit3_small_patch16_224", {}, 224, (0, 1e-5, False, None)),  # LayerScale, no_embed_class
    ("deit_tiny_distilled_patch16_224", {}, 224, (0, None, True, None)),  # DeiT's distillation token and head
    ("vit_base_patch16_reg4_gap_256", dict(embed_dim=192, num_heads=3), 256, (4, None, False, None)),  # no cls, gap
    ("vit_small_patch16_224", dict(qk_norm=True), 224, (0, None, True, "layernorm")),  # QK-norm
    # DINOv2-g's packed SwiGLU, narrowed to 96 wide (4 heads)
    ("vit_giant_patch14_reg4_dinov2", dict(img_size=56, embed_dim=96, num_heads=4), 56, (4, 1e-5, False, None)),
  ],
)
def test_layerscale_register_and_qk_norm_vits_match_timm_and_export_back(refs, name, kw, hw, options):
  """DINOv2 (with and without registers), DeiT III, DeiT's distilled ViT (its distillation token and second head,
  the logits their mean), timm's register ViTs and QK-norm from timm's layout, two blocks;
  and vitjax.export's timm layout read back by timm with strict=True gives the same logits. DINOv2's names carry no
  image size: the position table's grid gives it (56 px here, 518 as timm builds them)."""
  model = _random_timm(refs, name, depth=2, num_classes=5, **kw)
  sd = {k: v.numpy() for k, v in model.state_dict().items()}
  module, variables = convert.from_timm(name, sd, num_heads=kw.get("num_heads"))
  assert (module.num_registers, module.init_values, module.class_posemb, module.qk_norm) == options
  _compare(refs, model, module, variables, (hw, hw))
  # SwiGLU (DINOv2-g) goes out as timm's Eva, which builds it from arguments the export's .json holds: the same
  # weights in another module, whose sums run in another order (6e-8 apart)
  eva = module.ffn == "swiglu"
  timm_class = "eva" if eva else "deit_distilled" if module.distill_token else "vit"
  _exports_back(refs, model, module, variables, hw, timm_class, tol=TOL if eva else 0.0)


def _exports_back(refs, model, module, variables, hw, timm_class, tol=0.0):
  """vitjax's timm export, built by timm (its `timm_class`) and loaded with strict=True, gives `model`'s logits.

  tol: relative; 0: bitwise the same.
  """
  torch = refs.torch
  state_dict, cfg = convert.to_timm(module, variables, (hw, hw))
  assert cfg["model"] == timm_class
  back = convert.build_timm(cfg).eval()
  back.load_state_dict({k: torch.from_numpy(np.asarray(v)) for k, v in state_dict.items()}, strict=True)
  x = torch.from_numpy(np.random.RandomState(2).randn(2, 3, hw, hw).astype(np.float32))
  with torch.no_grad():
    want, got = model(x).numpy(), back(x).numpy()
  assert np.abs(got - want).max() <= tol * np.abs(want).max()


@pytest.mark.parametrize(
  "name,kw,options",
  [  # options: (ffn, ffn_norm, attn_norm, pool_type) as read from the weights; two blocks
    ("eva02_tiny_patch14_224", dict(img_size=112), ("swiglu", False, False, "gap")),  # packed SwiGLU; q_bias, v_bias
    ("eva02_base_patch14_224", dict(embed_dim=96, num_heads=4), ("swiglu", True, False, "gap")),  # q/k/v_proj, sub-LN
    ("eva02_base_patch16_clip_224", dict(embed_dim=96, num_heads=4), ("swiglu", True, True, "tok")),  # + attn sub-LN
  ],
)
def test_eva02_matches_timm_and_exports_back(refs, name, kw, options):
  """EVA-02 (timm's Eva): 2-D rotary positions, SwiGLU packed and split, sub-LayerNorms, no key bias; and back through
  vitjax's export into timm's Eva. At 112 px (8 x 8 patches) the rotary positions are rescaled to span EVA-02's 16 x 16
  reference grid, as timm rescales them; the name passed gives the image size, as timm's names do."""
  px = kw.get("img_size", 224)
  model = _random_timm(refs, name, depth=2, num_classes=5, **kw)
  sd = {k: v.numpy() for k, v in model.state_dict().items()}
  module, variables = convert.from_timm(name.replace("_224", f"_{px}"), sd, num_heads=kw.get("num_heads"))
  assert (module.ffn, module.ffn_norm, module.attn_norm, module.pool_type) == options
  assert (module.rope, tuple(module.rope_grid), module.key_bias, module.has_class_token) == (
    "axial",
    (16, 16),
    False,
    True,
  )
  _compare(refs, model, module, variables, (px, px))
  _exports_back(refs, model, module, variables, px, "eva", tol=TOL)
  # the rotary embedding counts: without it, or (at 112 px) without the rescaling, the logits move
  assert _rel_error(refs, model, module.clone(rope=None), variables, (px, px)) > 3 * TOL
  if px != 224:
    assert _rel_error(refs, model, module.clone(rope_grid=None), variables, (px, px)) > 3 * TOL


def test_from_timm_matches_timm_when_swin_pads_windows(refs):
  # 256 px: stage maps 64, 32, 16, 8 are not multiples of the window 7, so both sides pad. A narrow Swin-T (width
  # 32, two blocks a stage: each stage's second block shifts): the padding is the same, the run 6x shorter.
  model = _random_timm(
    refs,
    "swin_tiny_patch4_window7_224",
    img_size=256,
    num_classes=10,
    embed_dim=32,
    depths=(2, 2, 2, 2),
    num_heads=(1, 2, 4, 8),
  )
  sd = {k: v.numpy() for k, v in model.state_dict().items()}
  module, variables = convert.from_timm("swin_tiny_patch4_window7_224", sd)
  _compare(refs, model, module, variables, (256, 256))


def test_a_swapped_gelu_is_caught_at_the_bound(refs):
  """Exact GELU read as the tanh form (the original ViT code's) must fail the bound. It moves ViT-Ti's logits by
  3.4e-4 (measured): 34x the bound, where the former 1e-4 left a 3.4x margin."""
  model = _random_timm(refs, "vit_tiny_patch16_224")
  module, variables = convert.from_timm("vit_tiny_patch16_224", {k: v.numpy() for k, v in model.state_dict().items()})
  assert module.act == "gelu"
  assert _rel_error(refs, model, module, variables, (224, 224)) <= TOL
  swapped = _rel_error(refs, model, module.clone(act="gelu_tanh"), variables, (224, 224))
  assert swapped > 3 * TOL, swapped


def test_from_timm_refuses_mismatched_or_unknown_weights(refs):
  model = _random_timm(refs, "vit_tiny_patch16_224", num_classes=10)
  sd = {k: v.numpy() for k, v in model.state_dict().items()}
  bad = dict(sd, pos_embed=sd["pos_embed"][:, :100])
  with pytest.raises(ValueError, match=r"posembed/pos_embedding: model \(1, 197, 192\), checkpoint \(1, 100, 192\)"):
    convert.from_timm("vit_tiny_patch16_224", bad)
  with pytest.raises(ValueError, match="does not know"):
    convert.from_timm("vit_tiny_patch16_224", dict(sd, mask_token=np.zeros((1, 1, 192))))  # a key no ViT has
  with pytest.raises(ValueError, match="no conversion"):
    convert.from_timm("resnet50", sd)


def _vit_npz_from_timm(model, path):
  """Writes the original ViT release's .npz layout from a timm model's weights (independently of vitjax)."""
  sd = {k: v.numpy() for k, v in model.state_dict().items()}
  d = sd["cls_token"].shape[-1]
  h = model.blocks[0].attn.num_heads
  out = {
    "embedding/kernel": sd["patch_embed.proj.weight"].transpose(2, 3, 1, 0),
    "embedding/bias": sd["patch_embed.proj.bias"],
    "cls": sd["cls_token"],
    "Transformer/posembed_input/pos_embedding": sd["pos_embed"],
    "Transformer/encoder_norm/scale": sd["norm.weight"],
    "Transformer/encoder_norm/bias": sd["norm.bias"],
    "head/kernel": sd["head.weight"].T,
    "head/bias": sd["head.bias"],
  }
  for i in range(len(model.blocks)):
    s, t = f"blocks.{i}.", f"Transformer/encoderblock_{i}/"
    for a, b in (("norm1", "LayerNorm_0"), ("norm2", "LayerNorm_2")):
      out[t + b + "/scale"], out[t + b + "/bias"] = sd[s + a + ".weight"], sd[s + a + ".bias"]
    qkv_w, qkv_b = sd[s + "attn.qkv.weight"], sd[s + "attn.qkv.bias"]
    for j, n in enumerate(("query", "key", "value")):
      out[t + f"MultiHeadDotProductAttention_1/{n}/kernel"] = qkv_w[j * d : (j + 1) * d].T.reshape(d, h, d // h)
      out[t + f"MultiHeadDotProductAttention_1/{n}/bias"] = qkv_b[j * d : (j + 1) * d].reshape(h, d // h)
    out[t + "MultiHeadDotProductAttention_1/out/kernel"] = sd[s + "attn.proj.weight"].T.reshape(h, d // h, d)
    out[t + "MultiHeadDotProductAttention_1/out/bias"] = sd[s + "attn.proj.bias"]
    for j, n in ((0, "fc1"), (1, "fc2")):
      out[t + f"MlpBlock_3/Dense_{j}/kernel"] = sd[s + f"mlp.{n}.weight"].T
      out[t + f"MlpBlock_3/Dense_{j}/bias"] = sd[s + f"mlp.{n}.bias"]
  np.savez(path, **out)


def test_from_vit_npz_matches_timm_reading_the_same_npz(refs, tmp_path):
  src = _random_timm(refs, "vit_tiny_patch16_224", num_classes=7)
  path = str(tmp_path / "Ti_16.npz")
  _vit_npz_from_timm(src, path)
  ref = refs.timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=7).eval()
  from timm.models.vision_transformer import _load_weights

  _load_weights(ref, path)  # timm's loader of the original release's checkpoints is the reference reader
  # timm builds the model with exact GELU; the original code's own tanh GELU is checked in test_formats.py
  module, variables = convert.from_vit_npz(path, "Ti/16", act="gelu")
  assert module.num_classes == 7 and module.depth == 12
  _compare(refs, ref, module, variables, (224, 224))
  with pytest.raises(ValueError, match="not an original-ViT or big_vision checkpoint"):
    convert.from_vit_npz({"foo": np.zeros(3)}, "Ti/16")


def test_init_from_a_timm_safetensors_file_for_fine_tuning(refs, tmp_path):
  """timm weights at 224 px / 1000 classes -> a 64 px / 10-class ViT-Ti: head replaced, positions resampled."""
  import jax
  import jax.numpy as jnp
  from safetensors.numpy import save_file

  from vitjax import models
  from vitjax.models.adapt import adapt_params

  src = _random_timm(refs, "vit_tiny_patch16_224")
  path = str(tmp_path / "model.safetensors")
  save_file({k: v.numpy().copy() for k, v in src.state_dict().items()}, path)
  loaded = convert.load_params(f"timm:vit_tiny_patch16_224:{path}")
  target = models.create("vit_ti16", num_classes=10).init(jax.random.key(0), jnp.zeros((1, 64, 64, 3)))["params"]
  params, changes = adapt_params(loaded, jax.device_get(target))
  assert any(c.startswith("new head head/kernel") for c in changes), changes
  assert params["posembed"]["pos_embedding"].shape == (1, 1 + 4 * 4, 192)
  np.testing.assert_array_equal(params["posembed"]["pos_embedding"][0, 0], loaded["posembed"]["pos_embedding"][0, 0])
  np.testing.assert_array_equal(params["head"]["kernel"], target["head"]["kernel"])  # new 10-class head
  np.testing.assert_array_equal(
    params["encoder"]["block_3"]["attn"]["query"]["kernel"], loaded["encoder"]["block_3"]["attn"]["query"]["kernel"]
  )


def test_imported_timm_weights_are_evaluated_with_their_own_preprocessing(refs, tmp_path):
  """init_from='timm:NAME:FILE' takes timm's pretrained config for NAME (Swin: ImageNet mean/std, bicubic resize of
  the shorter side to 224 / 0.9, centre crop): vitjax's evaluation input is timm's eval transform's, bitwise, and
  the logits match timm's on it."""
  from PIL import Image

  from vitjax.config import default_config
  from vitjax.data import augment, device_ops
  from vitjax.tasks import ImageClassification

  name = "swin_tiny_patch4_window7_224"
  model = _random_timm(refs, name, num_classes=2)
  rng = np.random.default_rng(0)
  small = rng.integers(0, 256, (20, 24, 3), dtype=np.uint8)
  photo = Image.fromarray(small).resize((310, 260), Image.BICUBIC)  # not square, not 224: resize and crop matter
  timm, torch = refs.timm, refs.torch
  transform = timm.data.create_transform(**timm.data.resolve_data_config({}, model=model))
  want_x = transform(photo).numpy()  # [3, 224, 224]
  with torch.no_grad():
    want = model(torch.from_numpy(want_x)[None]).numpy()

  config = default_config()
  config.data.image_size = 224
  config.init_from = f"timm:{name}:unused.safetensors"
  config.data.data_dir = str(tmp_path)  # (no digits there: where digits is prepared, grey images get a grey mean)
  pre = ImageClassification(config, "").preprocess()
  assert pre == augment.Preprocess(
    mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225), crop_fraction=0.9, interpolation="bicubic"
  )
  image = augment.preprocess_eval(np.asarray(photo), (224, 224), pre)
  x = np.asarray(device_ops.to_float(image[None], pre.mean, pre.std))
  np.testing.assert_allclose(x[0].transpose(2, 0, 1), want_x, atol=1e-6)  # the same input
  module, variables = convert.from_timm(name, {k: v.numpy() for k, v in model.state_dict().items()})
  got, _ = jax.jit(module.apply)(variables, x)
  assert np.abs(np.asarray(got) - want).max() <= TOL * np.abs(want).max()
  # the config's own fields win; without init_from the rest are the defaults ([-1, 1], bilinear)
  config.data.preprocess.crop_fraction = 0.875
  assert ImageClassification(config, "").preprocess().crop_fraction == 0.875
  config.init_from = ""
  assert ImageClassification(config, "").preprocess() == augment.Preprocess(crop_fraction=0.875)


@pytest.mark.parametrize(
  "vitjax_name,timm_name",
  [
    ("dinov2_s14", "vit_small_patch14_dinov2"),
    ("dinov2_s14_reg4", "vit_small_patch14_reg4_dinov2"),
    ("dinov3_s16", "vit_small_patch16_dinov3"),
    ("deit3_s16", "deit3_small_patch16_224"),
    ("eva02_ti14", "eva02_tiny_patch14_224"),
    ("eva02_b14", "eva02_base_patch14_224"),
    ("siglip_b16", "vit_base_patch16_siglip_224"),
  ],
)
def test_a_backbones_name_builds_the_architecture_timm_builds(refs, vitjax_name, timm_name):
  """models.create of a backbone's name (vitjax.models.vit_backbones) has the parameters, shape for shape, and the
  options of the model vitjax reads from timm's own build of that backbone (random weights, timm's default size).
  A backbone's name builds the architecture (for a config's model.name); its weights come with init_from."""
  model = refs.timm.create_model(timm_name, pretrained=False, num_classes=0)
  read, variables = convert.from_timm(timm_name, {k: v.numpy() for k, v in model.state_dict().items()})
  built = models.create(vitjax_name, num_classes=0)
  px = model.pretrained_cfg["input_size"][1]
  shapes = jax.eval_shape(built.init, jax.random.key(0), jax.numpy.zeros((1, px, px, 3)))["params"]
  assert jax.tree_util.tree_map(np.shape, shapes) == jax.tree_util.tree_map(np.shape, variables["params"])
  # (not act: timm builds SigLIP with exact GELU, big_vision trained it with the tanh form, which the name keeps)
  fields = ("num_registers", "qk_norm", "ffn", "ffn_norm", "rope", "key_bias", "pool_type", "posemb", "qkv_bias")
  fields += () if built.posemb == "none" else ("class_posemb",)  # (without a table it says nothing)
  assert {f: getattr(built, f) for f in fields} == {f: getattr(read, f) for f in fields}
  assert (built.rope_grid is None) == (read.rope_grid is None)


def test_one_model_for_any_image_size_as_timms_dynamic_img_size(refs):
  """ViT(posemb_grid=...) keeps DINOv2's table at its own grid and resamples it at every call to the input's, as timm's
  dynamic_img_size does: the same logits at 56 px (the table's 4 x 4), 84 px and a 70 x 98 image, one set of weights."""
  name = "vit_small_patch14_reg4_dinov2"
  model = _random_timm(refs, name, depth=2, num_classes=5, img_size=56, dynamic_img_size=True)
  module, variables = convert.from_timm(name, {k: v.numpy() for k, v in model.state_dict().items()})
  module = module.clone(posemb_grid=(4, 4))
  for hw in ((56, 56), (84, 84), (70, 98)):
    _compare(refs, model, module, variables, hw)
  _exports_back(refs, model, module, variables, 84, "vit")  # as timm's dynamic_img_size (built at 56 px), at 84
  with pytest.raises(ValueError, match="posembed/pos_embedding"):  # without posemb_grid the table is fixed at 4 x 4
    module.clone(posemb_grid=None).apply(variables, np.zeros((1, 84, 84, 3), np.float32))


@pytest.mark.parametrize(
  "name,px,want",
  [  # (pool_type, act): SigLIP 2's new shapes are built with the tanh GELU, the others with the exact one
    ("vit_so400m_patch16_siglip_256", 256, ("map", "gelu_tanh")),
    ("vit_giantopt_patch16_siglip_256", 256, ("map", "gelu_tanh")),
    ("vit_so400m_patch14_siglip_gap_224", 224, ("gap", "gelu")),
  ],
)
def test_siglip2_image_towers_match_timm(refs, name, px, want):
  """SigLIP 2's image towers as timm builds them (vit_*_siglip_*.v2_webli; refused before: so400m and giantopt were
  no sizes vitjax's names knew), narrowed to 128 wide with their 16 heads, two blocks; and exported back."""
  model = _random_timm(refs, name, depth=2, num_classes=5, embed_dim=128)
  module, variables = convert.from_timm(f"{name}.v2_webli", {k: v.numpy() for k, v in model.state_dict().items()})
  assert (module.pool_type, module.act, module.num_heads) == (*want, 16)
  _compare(refs, model, module, variables, (px, px))
  _exports_back(refs, model, module, variables, px, "vit")


@pytest.mark.parametrize(
  "name,ffn",
  [
    ("vit_small_patch16_dinov3", "mlp"),  # no qkv bias
    ("vit_small_patch16_dinov3_qkvb", "mlp"),  # q and v biases, none on the keys
    ("vit_small_plus_patch16_dinov3", "swiglu"),  # SwiGLU, its two halves apart
  ],
)
def test_dinov3_matches_timm_at_any_image_size(refs, name, ffn):
  """DINOv3 (timm's Eva): its rotary embedding alone gives the positions (patch centres in [-1, 1], the half layout,
  periods 100^(2j / (K / 2))), 4 registers, LayerScale, LayerNorm epsilon 1e-5; timm builds it for any image size, so
  one set of weights at 224 px and at a 160 x 96 image."""
  model = _random_timm(refs, name, depth=2, num_classes=5)
  module, variables = convert.from_timm(name, {k: v.numpy() for k, v in model.state_dict().items()})
  got = (module.rope, module.posemb, module.num_registers, module.ffn, module.layernorm_eps)
  assert got == ("dinov3", "none", 4, ffn, 1e-5)
  for hw in ((224, 224), (160, 96)):
    _compare(refs, model, module, variables, hw)
  assert _rel_error(refs, model, module.clone(rope=None), variables, (224, 224)) > 3 * TOL
  with pytest.raises(ValueError, match="posemb='none'"):  # timm's Eva from arguments the export cannot write
    convert.to_timm(module, variables, (224, 224))
