"""Golden fixtures for vitjax's weight importers, written by the ORIGINAL code of three model releases.

Each case builds a tiny model with the original repository's own module, replaces every parameter with random
normal values (the originals zero-initialise heads and some biases), runs it in inference mode in float32 on a fixed
random batch of 2 images, and writes the weights in the release's own format, with the release's own save code where it has one:

  * google-research/vision_transformer  vit_jax.models_vit.VisionTransformer; `.npz` as the released files are:
    np.savez of the '/'-joined tree (names from vit_jax/test_utils, the repo's writer of fake checkpoints) with
    the blocks' pre-linen module names of the releases (LayerNorm_0, MultiHeadDotProductAttention_1, LayerNorm_2,
    MlpBlock_3), which vit_jax.checkpoint.load maps back with flax's convert_pre_linen.
  * google-research/big_vision          big_vision.models.vit.Model and models.proj.image_text.two_towers.Model;
    `.npz` via big_vision.utils.tree_flatten_with_names + np.savez, which is what big_vision's `save_checkpoint`
    did (utils.py from the first commit until the tensorstore switch); read back by its `load_params`.
  * microsoft/Swin-Transformer          models/swin_transformer.SwinTransformer; `torch.save({'model':
    model.state_dict()}, ...)`, the 'model' entry of the repo's utils.save_checkpoint (what its releases hold).

Each fixture is re-read with the original's own loader (vit_jax.checkpoint.load, big_vision's vit.load /
two_towers.load, torch.load + load_state_dict) and re-run: the logits must come back bit-identical. The GELU check
swaps the original's activation (flax's tanh `nn.gelu`, torch's exact `nn.GELU`) for the other one and records the
relative logit change, which must exceed 1e-4 so that a wrong activation in an importer is visible.

Nothing here is copied from the originals; they are imported from the checkouts given on the command line. Imports
that the forward passes and the savers do not use are stubbed: `tensorflow.io.gfile` (only for remote paths; local
files go through `open`), `pandas` (vit_jax.checkpoint's augreg index) and `vit_jax.models` (test_utils imports it
for LiT/Mixer, which need tensorflow_text). See experiments/golden/README.md for the commands.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.util
import json
import os
import re
import subprocess
import sys
import time
import types
from unittest import mock

import numpy as np

FIXED_TIME = 946684800.0  # 2000-01-01: zip member timestamps, so that a rerun writes the same bytes
REL_GELU_MIN = 1e-4  # required: exact vs tanh GELU must move the logits by more than this, relative to max |logit|
GELU_TARGET = 1.5e-4  # weights seeds are searched (deterministically, from each case's base) until this is met
MAX_TRIES = 40


# ----------------------------------------------------------------------------------------------------------- helpers
@contextlib.contextmanager
def fixed_zip_time():
  """np.savez / torch.save stamp zip members with time.time(); pin it so reruns are byte-identical."""
  with mock.patch.object(time, "time", return_value=FIXED_TIME):
    yield


def git_commit(path):
  try:
    return subprocess.check_output(["git", "-C", path, "rev-parse", "HEAD"], text=True).strip()
  except Exception:  # not a git checkout
    return None


def random_like(name, shape, rng, *, is_scale):
  """Non-degenerate random values: LayerNorm scales ~ 1 + 0.2 N, biases ~ 0.1 N, everything else (kernels,
  embeddings, position tables, tokens, probes, t and b) ~ 0.2 N: the MLPs' pre-activations have std ~ 1."""
  z = rng.standard_normal(shape).astype(np.float32)
  if is_scale:
    return (1.0 + 0.2 * z).astype(np.float32)
  if name.split("/")[-1].split(".")[-1] == "bias":
    return (0.1 * z).astype(np.float32)
  return (0.2 * z).astype(np.float32)


def randomize_flat(flat, seed):
  """Replaces every array of a {'a/b/c': array} dict, in sorted-key order (independent of how it was initialised)."""
  rng = np.random.RandomState(seed)
  return {k: random_like(k, np.shape(flat[k]), rng, is_scale=k.endswith("/scale")) for k in sorted(flat)}


def search_seed(base, logits_pair):
  """The first weights seed base, base+1, ... whose logits move by > GELU_TARGET (relative) when the original's
  GELU is swapped for the other one. logits_pair(seed) -> (params, logits, logits_other_gelu)."""
  for seed in range(base, base + MAX_TRIES):
    params, logits, other = logits_pair(seed)
    d = rel_diff(other, logits)
    if d > GELU_TARGET:
      return seed, params, logits, d
  raise RuntimeError(f"no seed in [{base}, {base + MAX_TRIES}) makes the GELU visible")


def images_nhwc(seed, hw):
  return np.random.RandomState(seed).standard_normal((2, hw, hw, 3)).astype(np.float32)


def rel_diff(a, b):
  return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


def stub_module(name, **attrs):
  mod = types.ModuleType(name)
  mod.__dict__.update(attrs)
  mod.__golden_stub__ = True
  sys.modules[name] = mod
  return mod


@contextlib.contextmanager
def stubs():
  """Dummy modules, only while the originals import, for what their model code and the savers/loaders used here
  never call (local files only). Removed afterwards: other libraries probe for tensorflow/pandas with find_spec."""
  before = set(sys.modules)
  gfile = stub_module(
    "tensorflow.io.gfile",
    GFile=open,
    exists=os.path.exists,
    makedirs=lambda p: os.makedirs(p, exist_ok=True),
    rename=lambda a, b, overwrite=False: os.replace(a, b),
    stat=os.stat,
  )
  tf_io = stub_module("tensorflow.io", gfile=gfile)
  stub_module("tensorflow", io=tf_io)
  stub_module("pandas")
  try:
    yield
  finally:
    for name in set(sys.modules) - before:
      if getattr(sys.modules[name], "__golden_stub__", False):
        del sys.modules[name]


def save_expected(path, **arrays):
  with fixed_zip_time():
    np.savez(path, **{k: np.asarray(v) for k, v in arrays.items()})


def file_keys(path, n=None):
  with np.load(path) as z:
    items = [(k, list(z[k].shape)) for k in z.files]
  return items if n is None else items[:n]


# ------------------------------------------------------------------------------------------ google-research/vit_jax
PRE_LINEN = {  # linen name in Encoder1DBlock -> the name in the released checkpoints (pre-linen auto-numbering)
  "LayerNorm_0": "LayerNorm_0",
  "MultiHeadDotProductAttention_0": "MultiHeadDotProductAttention_1",
  "LayerNorm_1": "LayerNorm_2",
  "MlpBlock_0": "MlpBlock_3",
}


def pre_linen(name):
  parts = name.split("/")
  if len(parts) > 3 and parts[0] == "Transformer" and parts[1].startswith("encoderblock_"):
    parts[2] = PRE_LINEN[parts[2]]
  return "/".join(parts)


STEM_KERNEL_SCALE = 0.01  # a hybrid's ResNet kernels ~ 0.002 N: see stem_kernel_scale


def stem_kernel_scale(name, value):
  """A hybrid's ResNet convolution kernels scaled down to std ~0.002 (a trained one's are 0.01-0.05): weight
  standardisation removes their scale but for its epsilon, so small kernels make the fixture tell the release's
  (w - mean) / (std + 1e-5) from timm's (w - mean) / sqrt(var + 1e-8) (tests/test_hybrid.py measures by how much)."""
  if re.search(r"(^|/|\.)(conv_root|conv\d|conv_proj|conv)(/kernel|\.weight)$", name) and (
    "backbone" in name or not name.startswith(("embedding", "patch_embed"))
  ):
    return (value * STEM_KERNEL_SCALE).astype(np.float32)
  return value


def released_shape(name, value):
  """A hybrid's GroupNorm scale or bias as the released .npz files hold it: [1, 1, 1, C] (pre-linen flax.nn's shape,
  which vit_jax.checkpoint._fix_groupnorm squeezes on load)."""
  parts = name.split("/")
  if len(parts) >= 2 and re.fullmatch(r"gn(\d+|_root|_proj)", parts[-2]) and parts[-1] in ("scale", "bias"):
    return np.reshape(value, (1, 1, 1, -1))
  return value


def vit_jax_cases(vit_repo, out, manifest):
  import flax
  import flax.linen
  import jax
  import jax.numpy as jnp
  import ml_collections
  from flax import traverse_util

  sys.path.insert(0, vit_repo)
  stub_module("vit_jax.models")  # test_utils does `from vit_jax import models` (LiT needs tensorflow_text)
  import vit_jax  # noqa: F401

  sys.modules["vit_jax"].models = sys.modules["vit_jax.models"]
  with stubs():
    from vit_jax import checkpoint, models_vit, test_utils

  exact = lambda x: jax.nn.gelu(x, approximate=False)  # noqa: E731

  def tiny(**kw):  # two 32-wide layers, 2 heads, 5 classes: each case's own fields on top
    layers = {"num_layers": 2, "mlp_dim": 64, "num_heads": 2, "dropout_rate": 0.0, "attention_dropout_rate": 0.0}
    return dict(num_classes=5, transformer=layers, hidden_size=32, representation_size=None, **kw)

  cases = {
    "vit_jax_token_rep": {**tiny(patches={"size": (4, 4)}, classifier="token"), "representation_size": 24},
    "vit_jax_gap": tiny(patches={"size": (4, 4)}, classifier="gap"),
    # The hybrids (models_vit's `resnet` option): the root block alone with 2x2 patches on its feature map (as
    # R+ViT-Ti_16's 8x8; a 64-channel root: two channels per GroupNorm group, so that the weight standardisation's
    # arithmetic shows), and two one-unit stages with 1x1 patches (as R26+ViT-S_32's four two-unit stages;
    # width_factor 0.5: a 32-channel root). 32x32 images: a 4x4 token grid either way.
    "vit_jax_hybrid_root": tiny(
      patches={"size": (2, 2)}, resnet={"num_layers": (), "width_factor": 1.0}, classifier="token"
    ),
    "vit_jax_hybrid_stages": tiny(
      patches={"size": (1, 1)}, resnet={"num_layers": (1, 1), "width_factor": 0.5}, classifier="token"
    ),
  }
  for i, (case, kw) in enumerate(cases.items()):
    cfg = {**kw, "patches": ml_collections.ConfigDict(kw["patches"])}
    if "resnet" in kw:
      cfg["resnet"] = ml_collections.ConfigDict(kw["resnet"])
    model = models_vit.VisionTransformer(**cfg)
    hw = 32 if "resnet" in kw else 16
    x = images_nhwc(100 + i, hw)
    init = model.init(jax.random.PRNGKey(0), jnp.zeros_like(x), train=False)["params"]
    flat = traverse_util.flatten_dict(flax.core.unfreeze(init), sep="/")
    run = lambda p, m=model, x=x: np.asarray(m.apply({"params": p}, x, train=False))  # noqa: E731

    def pair(seed, flat=flat, run=run):
      values = {k: stem_kernel_scale(k, v) for k, v in randomize_flat(flat, seed).items()}
      params = traverse_util.unflatten_dict({k: jnp.asarray(v) for k, v in values.items()}, sep="/")
      logits = run(params)
      with mock.patch.object(flax.linen, "gelu", exact):
        return params, logits, run(params)

    seed, params, logits, d = search_seed(1000 * (i + 1), pair)
    assert d > REL_GELU_MIN, (case, d)

    path = os.path.join(out, f"{case}.npz")
    names_and_vals, _ = test_utils._tree_flatten_with_names(jax.tree.map(np.asarray, params))
    with fixed_zip_time():
      np.savez(path, **{pre_linen(k): released_shape(k, v) for k, v in names_and_vals})
    restored = checkpoint.load(path)  # the release's own reader (convert_pre_linen renames the blocks back)
    assert jax.tree.structure(restored) == jax.tree.structure(flax.core.unfreeze(params)), case
    again = np.asarray(model.apply({"params": restored}, x, train=False))
    assert np.array_equal(again, logits), case
    save_expected(os.path.join(out, f"{case}.expected.npz"), images=x, logits=logits)
    manifest[case] = {
      "source": "google-research/vision_transformer",
      "commit": git_commit(vit_repo),
      "module": "vit_jax.models_vit.VisionTransformer",
      "constructor": {**kw, "patches": {"size": list(kw["patches"]["size"])}},
      "call": "model.apply({'params': params}, images, train=False)",
      "weights": f"{case}.npz",
      "weights_format": "np.savez of the '/'-joined param tree, no prefix, the encoder blocks under their "
      "pre-linen names as in the released .npz files (LayerNorm_0, MultiHeadDotProductAttention_1, LayerNorm_2, "
      "MlpBlock_3/Dense_0|1; linen's code names them LayerNorm_0/1, MultiHeadDotProductAttention_0, MlpBlock_0)"
      + (
        "; the ResNet's GroupNorm scales and biases [1, 1, 1, C], as the released hybrids store them"
        if "resnet" in kw
        else ""
      )
      + "; read back with vit_jax.checkpoint.load (flax convert_pre_linen"
      + (", _fix_groupnorm" if "resnet" in kw else "")
      + ")",
      "expected": f"{case}.expected.npz",
      "activation": "flax.linen.gelu (= jax.nn.gelu, approximate=True: tanh GELU)",
      "gelu_exact_vs_tanh_rel_logit_diff": d,
      "weights_seed": seed,
      "logits": "VisionTransformer output: the 'head' Dense output, float32 [2, 5]",
      "input_layout": f"images NHWC float32 [2, {hw}, {hw}, 3], fed as is",
      "weights_keys_sample": file_keys(path, 8),
    }
    print(f"{case}: gelu rel diff {d:.3e}")


# ------------------------------------------------------------------------------------------------------- big_vision
def big_vision_cases(bv_repo, out, manifest):
  import flax
  import flax.linen
  import jax
  import jax.numpy as jnp
  import ml_collections
  from flax import traverse_util

  sys.path.insert(0, bv_repo)
  with stubs():
    from big_vision import utils as bv_utils
    from big_vision.models import vit as bv_vit
    from big_vision.models.proj.image_text import (
      text_transformer,  # noqa: F401  (two_towers imports it lazily)
      two_towers,
    )

  exact = lambda x: jax.nn.gelu(x, approximate=False)  # noqa: E731

  def bv_save(tree, path):
    # big_vision's save_checkpoint (removed with the tensorstore switch) was exactly this: names from its own
    # tree_flatten_with_names, np.savez of {name: value}.
    names_and_vals, _ = bv_utils.tree_flatten_with_names(jax.tree.map(np.asarray, tree))
    with fixed_zip_time():
      np.savez(path, **{k: v for k, v in names_and_vals})

  def random_params(model, args, seed):
    init = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), *args))["params"]
    flat = traverse_util.flatten_dict(flax.core.unfreeze(init), sep="/")
    flat = randomize_flat({k: np.zeros(v.shape) for k, v in flat.items()}, seed)
    return traverse_util.unflatten_dict({k: jnp.asarray(v) for k, v in flat.items()}, sep="/")

  common = dict(num_classes=5, patch_size=(4, 4), width=32, depth=2, mlp_dim=64, num_heads=2)
  vit_cases = {
    "big_vision_tok_learn_rep": (dict(**common, pool_type="tok", posemb="learn", rep_size=24, scan=False), None),
    "big_vision_scan_gap_sincos": (dict(**common, pool_type="gap", posemb="sincos2d", scan=True), "params"),
    "big_vision_map_learn": (dict(**common, pool_type="map", posemb="learn", scan=False), None),
  }
  for i, (case, (kw, prefix)) in enumerate(vit_cases.items()):
    model = bv_vit.Model(**kw)
    x = images_nhwc(200 + i, 16)
    run = lambda p, m=model, x=x: np.asarray(m.apply({"params": p}, x, train=False)[0])  # noqa: E731

    def pair(seed, model=model, x=x, run=run):
      params = random_params(model, (x,), seed)
      logits = run(params)
      with mock.patch.object(flax.linen, "gelu", exact):
        return params, logits, run(params)

    seed, params, logits, d = search_seed(3000 + 1000 * i, pair)
    assert d > REL_GELU_MIN, (case, d)

    path = os.path.join(out, f"{case}.npz")
    bv_save({prefix: params} if prefix else params, path)
    restored = bv_vit.load(None, path, ml_collections.ConfigDict(kw))  # big_vision's own reader (+ its fixups)
    again = run(restored)
    assert np.array_equal(again, logits), case
    extra = {}
    if kw["scan"]:  # the same weights through the python-loop encoder, via big_vision's own converter
      loop_kw = {**kw, "scan": False}
      loop = np.asarray(bv_vit.Model(**loop_kw).apply({"params": bv_vit.scan_to_pyloop(restored)}, x, train=False)[0])
      extra["scan_vs_pyloop_max_abs_diff"] = float(np.max(np.abs(loop - logits)))
    if kw["posemb"] == "sincos2d":
      extra["expected_extra"] = {"posemb": "[1, 16, 32] float32: big_vision.models.vit.posemb_sincos_2d(4, 4, 32)"}
    arrays = dict(images=x, logits=logits)
    if kw["posemb"] == "sincos2d":
      arrays["posemb"] = np.asarray(bv_vit.posemb_sincos_2d(4, 4, 32))
    save_expected(os.path.join(out, f"{case}.expected.npz"), **arrays)
    manifest[case] = {
      "source": "google-research/big_vision",
      "commit": git_commit(bv_repo),
      "module": "big_vision.models.vit.Model",
      "constructor": {**kw, "patch_size": list(kw["patch_size"])},
      "call": "model.apply({'params': params}, images, train=False)[0]",
      "weights": f"{case}.npz",
      "weights_format": (
        "np.savez of big_vision.utils.tree_flatten_with_names(tree): '/'-joined keys, "
        + ("prefixed 'params/' (as a big_vision training checkpoint {'params': ...})" if prefix else "no prefix")
        + "; read back with big_vision.models.vit.load(None, path, cfg) -> utils.load_params"
      ),
      "expected": f"{case}.expected.npz",
      "activation": "flax.linen.gelu (= jax.nn.gelu, approximate=True: tanh GELU)",
      "gelu_exact_vs_tanh_rel_logit_diff": d,
      "weights_seed": seed,
      "logits": "ViT Model's first output: the 'head' Dense output (out['logits']), float32 [2, 5]",
      "input_layout": "images NHWC float32 [2, 16, 16, 3], fed as is",
      "weights_keys_sample": file_keys(path, 8),
      **extra,
    }
    print(f"{case}: gelu rel diff {d:.3e}", extra)

  # SigLIP: two towers, the image tower a MAP-pooled ViT without a head (out_dim=(None, D)), as in the SigLIP demo.
  case = "big_vision_siglip"
  cfg = dict(
    image_model="vit",
    text_model="proj.image_text.text_transformer",
    image=dict(patch_size=(4, 4), width=32, depth=2, mlp_dim=64, num_heads=2, pool_type="map", posemb="learn"),
    text=dict(width=32, depth=2, mlp_dim=64, num_heads=2, vocab_size=64),
    out_dim=(None, 32),
    bias_init=-10.0,
    temperature_init=10.0,
  )
  model = two_towers.Model(**cfg)
  x = images_nhwc(300, 16)
  text = np.random.RandomState(301).randint(2, 64, size=(2, 8)).astype(np.int32)
  text[:, -1] = 1  # big_vision's text tower pools the last token (sticky EOS = 1)
  run = lambda p: model.apply({"params": p}, x, text, train=False)  # noqa: E731

  def pair(seed):
    params = random_params(model, (x, text), seed)
    logits = np.asarray(run(params)[2]["img/pre_logits"])
    with mock.patch.object(flax.linen, "gelu", exact):
      return params, logits, np.asarray(run(params)[2]["img/pre_logits"])

  seed, params, logits, d = search_seed(6000, pair)
  assert d > REL_GELU_MIN, (case, d)
  zimg, ztxt, out_ = run(params)
  assert np.array_equal(np.asarray(out_["img/pre_logits"]), logits)
  assert "img/logits" not in out_  # no image head: the tower's output is the MAP head's
  assert np.allclose(np.asarray(zimg), logits / (np.linalg.norm(logits, axis=1, keepdims=True) + 1e-8), atol=1e-6)
  path = os.path.join(out, f"{case}.npz")
  bv_save({"params": params}, path)
  restored = two_towers.load(None, path, ml_collections.ConfigDict(cfg))  # loads img, txt, t, b from one file
  z2 = run(restored)[2]
  assert np.array_equal(np.asarray(z2["img/pre_logits"]), logits)
  save_expected(
    os.path.join(out, f"{case}.expected.npz"),
    images=x,
    logits=logits,
    zimg_normalized=np.asarray(zimg),
    text=text,
    ztxt_normalized=np.asarray(ztxt),
  )
  manifest[case] = {
    "source": "google-research/big_vision",
    "commit": git_commit(bv_repo),
    "module": "big_vision.models.proj.image_text.two_towers.Model (image tower: big_vision.models.vit.Model, "
    "text tower: big_vision.models.proj.image_text.text_transformer.Model)",
    "constructor": {**cfg, "image": {**cfg["image"], "patch_size": [4, 4]}, "out_dim": [None, 32]},
    "call": "zimg, ztxt, out = model.apply({'params': params}, images, text, train=False)",
    "weights": f"{case}.npz",
    "weights_format": "np.savez of big_vision.utils.tree_flatten_with_names({'params': params}): keys "
    "'params/img/...', 'params/txt/...', 'params/t', 'params/b' (as the SigLIP .npz releases); read back with "
    "two_towers.load(None, path, cfg); the image tower alone is big_vision's 'path.npz:img'",
    "expected": f"{case}.expected.npz",
    "activation": "flax.linen.gelu (= jax.nn.gelu, approximate=True: tanh GELU), both towers and the MAP head",
    "gelu_exact_vs_tanh_rel_logit_diff": d,
    "weights_seed": seed,
    "logits": "out['img/pre_logits']: the image tower's output, the un-normalised image embedding [2, 32] = the "
    "MAP head output (out_dim[0] is None, so the image ViT has no 'head' Dense, as in the SigLIP releases). "
    "zimg_normalized = logits / (||logits|| + 1e-8) (two_towers' zimg); text [2, 8] int32 and "
    "ztxt_normalized [2, 32] are the text tower's input and normalised output",
    "input_layout": "images NHWC float32 [2, 16, 16, 3], fed as is; text int32 [2, 8], last token 1 (EOS)",
    "weights_keys_sample": file_keys(path, 8),
  }
  print(f"{case}: gelu rel diff {d:.3e}")


# ---------------------------------------------------------------------------------------------------------- Swin
def swin_cases(swin_repo, shim, out, manifest):
  import torch

  spec = importlib.util.spec_from_file_location("torchvision_ops_shim", shim)
  shim_mod = sys.modules["torchvision_ops_shim"] = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(shim_mod)  # lets torchvision (and timm) import on CPU-only torch; before timm
  # models/__init__ imports every model of the repo (MoE needs tutel): load the one file on its own.
  spec = importlib.util.spec_from_file_location(
    "swin_transformer", os.path.join(swin_repo, "models", "swin_transformer.py")
  )
  swin = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(swin)
  torch.set_num_threads(1)

  cases = {
    "swin_2stage": dict(
      img_size=32,
      patch_size=4,
      in_chans=3,
      num_classes=5,
      embed_dim=16,
      depths=[2, 2],
      num_heads=[2, 4],
      window_size=4,
      mlp_ratio=4.0,
      drop_path_rate=0.0,
    ),
    "swin_3stage": dict(
      img_size=64,
      patch_size=4,
      in_chans=3,
      num_classes=5,
      embed_dim=8,
      depths=[2, 2, 2],
      num_heads=[2, 4, 8],
      window_size=4,
      mlp_ratio=4.0,
      drop_path_rate=0.0,
    ),
  }
  for i, (case, kw) in enumerate(cases.items()):
    torch.manual_seed(0)
    model = swin.SwinTransformer(**kw).eval()
    x = images_nhwc(400 + i, kw["img_size"])
    xt = torch.from_numpy(np.ascontiguousarray(x.transpose(0, 3, 1, 2)))
    gelus = [m for m in model.modules() if isinstance(m, torch.nn.GELU)]
    assert gelus and all(m.approximate == "none" for m in gelus)

    def pair(seed, model=model, xt=xt, gelus=gelus):
      rng = np.random.RandomState(seed)
      names = dict(model.named_parameters())
      scales = {f"{n}.weight" for n, m in model.named_modules() if isinstance(m, torch.nn.LayerNorm)}
      with torch.no_grad():
        for name in sorted(names):
          value = random_like(name, tuple(names[name].shape), rng, is_scale=name in scales)
          names[name].copy_(torch.from_numpy(value))
        logits = model(xt).numpy()
        for m in gelus:
          m.approximate = "tanh"
        logits_tanh = model(xt).numpy()
        for m in gelus:
          m.approximate = "none"
      return None, logits, logits_tanh

    seed, _, logits, d = search_seed(7000 + 1000 * i, pair)
    assert d > REL_GELU_MIN, (case, d)

    path = os.path.join(out, f"{case}.pth")
    with fixed_zip_time():
      torch.save({"model": model.state_dict()}, path)
    fresh = swin.SwinTransformer(**kw).eval()
    fresh.load_state_dict(torch.load(path, map_location="cpu")["model"])
    with torch.no_grad():
      assert np.array_equal(fresh(xt).numpy(), logits), case
    save_expected(os.path.join(out, f"{case}.expected.npz"), images=x, logits=logits)
    sd = torch.load(path, map_location="cpu")["model"]
    shifts = [[blk.shift_size for blk in layer.blocks] for layer in model.layers]
    windows = [[blk.window_size for blk in layer.blocks] for layer in model.layers]
    manifest[case] = {
      "source": "microsoft/Swin-Transformer",
      "commit": git_commit(swin_repo),
      "module": "models/swin_transformer.py SwinTransformer",
      "constructor": kw,
      "call": "model.eval(); model(torch.from_numpy(images.transpose(0, 3, 1, 2)))",
      "weights": f"{case}.pth",
      "weights_format": "torch.save({'model': model.state_dict()}) (the 'model' entry of the repo's "
      "utils.save_checkpoint, as in its releases); buffers relative_position_index and attn_mask included",
      "expected": f"{case}.expected.npz",
      "activation": "torch.nn.GELU() (exact erf GELU)",
      "gelu_exact_vs_tanh_rel_logit_diff": d,
      "weights_seed": seed,
      "logits": f"SwinTransformer.forward output: the 'head' Linear output, float32 [2, {kw['num_classes']}]",
      "input_layout": f"images NHWC float32 [2, {kw['img_size']}, {kw['img_size']}, 3]; the torch model is fed "
      "images.transpose(0, 3, 1, 2) (NCHW)",
      "shift_size_per_block": shifts,
      "window_size_per_block": windows,
      "weights_keys_sample": [(k, list(v.shape)) for k, v in list(sd.items())[:8]],
    }
    print(f"{case}: gelu rel diff {d:.3e}, shifts {shifts}")


# ----------------------------------------------------------------------------------------------- timm's hybrid ViT
def timm_hybrid_cases(shim, out, manifest):
  """timm's hybrid ViT (VisionTransformer + HybridEmbed around a ResNetV2 built as timm's _resnetv2 builds it for
  vit_small_r26_s32_224 and friends: preact=False, stem_type 'same', StdConv2dSame eps 1e-8; or the ResNetV2 stem
  alone, as vit_tiny_r_s16_p8_224), tiny and random, saved as its state dict in .safetensors."""
  import torch

  spec = importlib.util.spec_from_file_location("torchvision_ops_shim", shim)
  shim_mod = sys.modules["torchvision_ops_shim"] = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(shim_mod)
  from functools import partial

  import timm
  from safetensors.torch import save_file
  from timm.layers import StdConv2dSame
  from timm.layers.hybrid_embed import HybridEmbed
  from timm.models.resnetv2 import ResNetV2, create_resnetv2_stem
  from timm.models.vision_transformer import VisionTransformer

  torch.set_num_threads(1)
  conv = partial(StdConv2dSame, eps=1e-8)
  vit = dict(img_size=32, embed_dim=48, depth=1, num_heads=3, mlp_ratio=2.0, num_classes=5)
  cases = {  # the name gives vitjax's reader the heads (tiny: 3) and the image size
    "timm_hybrid_r26": dict(
      timm_name="vit_tiny_r26_s32_32",
      backbone="ResNetV2(layers=[1, 1], num_classes=0, global_pool='', in_chans=3, preact=False, stem_type='same', "
      "conv_layer=partial(StdConv2dSame, eps=1e-8), width_factor=0.5)",
      make=lambda: ResNetV2(
        layers=[1, 1],
        num_classes=0,
        global_pool="",
        in_chans=3,
        preact=False,
        stem_type="same",
        conv_layer=conv,
        width_factor=0.5,
      ),
      patch_size=1,
    ),
    "timm_hybrid_root": dict(
      timm_name="vit_tiny_r_s16_p2_32",
      backbone="create_resnetv2_stem(3, 64, stem_type='same', preact=False, conv_layer=partial(StdConv2dSame, "
      "eps=1e-8))",
      make=lambda: create_resnetv2_stem(3, 64, stem_type="same", preact=False, conv_layer=conv),
      patch_size=2,
    ),
  }
  for i, (case, c) in enumerate(cases.items()):
    torch.manual_seed(0)

    def build(c=c):
      return VisionTransformer(
        **vit, patch_size=c["patch_size"], embed_layer=partial(HybridEmbed, backbone=c["make"]())
      ).eval()

    model = build()
    x = images_nhwc(500 + i, 32)
    xt = torch.from_numpy(np.ascontiguousarray(x.transpose(0, 3, 1, 2)))
    gelus = [m for m in model.modules() if isinstance(m, torch.nn.GELU)]
    assert gelus and all(m.approximate == "none" for m in gelus)
    names = dict(model.named_parameters())
    scales = {
      f"{n}.weight" for n, m in model.named_modules() if isinstance(m, (torch.nn.LayerNorm, torch.nn.GroupNorm))
    }

    def pair(seed, model=model, xt=xt, gelus=gelus, names=names, scales=scales):
      rng = np.random.RandomState(seed)
      with torch.no_grad():
        for name in sorted(names):
          value = random_like(name, tuple(names[name].shape), rng, is_scale=name in scales)
          names[name].copy_(torch.from_numpy(stem_kernel_scale(name, value)))
        logits = model(xt).numpy()
        for m in gelus:
          m.approximate = "tanh"
        logits_tanh = model(xt).numpy()
        for m in gelus:
          m.approximate = "none"
      return None, logits, logits_tanh

    seed, _, logits, d = search_seed(9000 + 1000 * i, pair)
    assert d > REL_GELU_MIN, (case, d)
    path = os.path.join(out, f"{case}.safetensors")
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    save_file(state, path)
    fresh = build()
    from safetensors.torch import load_file

    fresh.load_state_dict(load_file(path), strict=True)
    with torch.no_grad():
      assert np.array_equal(fresh(xt).numpy(), logits), case
    save_expected(os.path.join(out, f"{case}.expected.npz"), images=x, logits=logits)
    manifest[case] = {
      "source": "huggingface/pytorch-image-models (timm)",
      "commit": None,
      "timm_version": timm.__version__,
      "timm_name": c["timm_name"],
      "module": "timm.models.vision_transformer.VisionTransformer(embed_layer=partial(timm.layers.hybrid_embed."
      f"HybridEmbed, backbone={c['backbone']}), patch_size={c['patch_size']}, **constructor)",
      "constructor": vit,
      "call": "model.eval(); model(torch.from_numpy(images.transpose(0, 3, 1, 2)))",
      "weights": f"{case}.safetensors",
      "weights_format": "safetensors.torch.save_file(model.state_dict()): timm's keys (patch_embed.backbone...., "
      "patch_embed.proj, blocks.N...); read back with load_state_dict(strict=True)",
      "expected": f"{case}.expected.npz",
      "activation": "torch.nn.GELU() (exact erf GELU)",
      "gelu_exact_vs_tanh_rel_logit_diff": d,
      "weights_seed": seed,
      "logits": "VisionTransformer.forward output: the 'head' Linear output, float32 [2, 5]",
      "input_layout": "images NHWC float32 [2, 32, 32, 3]; the torch model is fed images.transpose(0, 3, 1, 2)",
      "weights_keys_sample": [(k, list(v.shape)) for k, v in list(state.items())[:8]],
    }
    print(f"{case}: gelu rel diff {d:.3e}")


def main():
  here = os.path.dirname(os.path.abspath(__file__))
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--vit-repo", required=True, help="checkout of github.com/google-research/vision_transformer")
  p.add_argument("--big-vision-repo", required=False, help="checkout of github.com/google-research/big_vision")
  p.add_argument("--swin-repo", required=False, help="checkout of github.com/microsoft/Swin-Transformer")
  p.add_argument("--out", default=os.path.join(here, "..", "..", "tests", "golden"))
  p.add_argument("--shim", default=os.path.join(here, "..", "..", "tests", "torchvision_ops_shim.py"))
  p.add_argument("--cases", default="vit_jax,big_vision,swin,timm_hybrid")
  a = p.parse_args()

  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  import jax

  jax.config.update("jax_default_matmul_precision", "highest")
  # Before the stubs: flax.io and orbax look for tensorflow with find_spec, which must not see the dummy.
  import flax.io  # noqa: F401
  import flax.training.checkpoints  # noqa: F401
  import optax  # noqa: F401

  os.makedirs(a.out, exist_ok=True)
  mpath = os.path.join(a.out, "MANIFEST.json")
  manifest = json.load(open(mpath)) if os.path.exists(mpath) else {}
  cases = a.cases.split(",")
  if "vit_jax" in cases:
    vit_jax_cases(os.path.abspath(a.vit_repo), a.out, manifest)
  if "big_vision" in cases:
    big_vision_cases(os.path.abspath(a.big_vision_repo), a.out, manifest)
  if "swin" in cases:
    swin_cases(os.path.abspath(a.swin_repo), os.path.abspath(a.shim), a.out, manifest)
  if "timm_hybrid" in cases:
    timm_hybrid_cases(os.path.abspath(a.shim), a.out, manifest)
  versions = {"python": sys.version.split()[0]}
  for name in ("jax", "flax", "numpy", "ml_collections", "torch", "timm"):
    if name in sys.modules:
      versions[name] = getattr(sys.modules[name], "__version__", None)
  for case, v in manifest.items():
    if v.get("generator", "experiments/golden/make_vision.py") == "experiments/golden/make_vision.py" and any(
      case.startswith(c) for c in cases
    ):
      v["generator"] = "experiments/golden/make_vision.py"
      v["versions"] = versions
  with open(mpath, "w") as f:
    json.dump(manifest, f, indent=1, sort_keys=True)
    f.write("\n")


if __name__ == "__main__":
  main()
