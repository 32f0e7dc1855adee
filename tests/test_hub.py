"""Pretrained models by name from the Hugging Face hub ('hf:ORG/NAME[@REVISION]'): config.init_from, vitjax.load,
convert.from_hub / from_hf, and their errors.

Never the network: each test writes its repositories into huggingface_hub's cache layout in a temporary HF_HOME
(blobs, snapshots/COMMIT/FILE links, refs/main; what hf_hub_download leaves behind) and runs with HF_HUB_OFFLINE=1.
The repositories' files are written by the code that writes them on the hub (transformers' save_pretrained, timm's
save_for_hf) from random weights, and the models are compared with those implementations on the same input.
Parity needs torch + transformers (+ timm) (docs/contributing.md, 'Tests'); without them those tests are skipped.
"""

import hashlib
import json
import os
import subprocess

import jax
import numpy as np
import pytest
import train_helpers as th
from conftest import _import_reference

import vitjax
from vitjax import convert, hub
from vitjax.errors import ConfigError

TOL = 1e-5  # max |difference| <= TOL * max |logit|


# ------------------------------------------------------------------------------------------------ a local hub


def cache_repo(cache: str, repo_id: str, files: dict, revision: str = "main") -> str:
  """Writes `files` (name -> bytes, or a dict written as JSON) as one commit of `repo_id` into huggingface_hub's
  cache folder `cache`, with `revision` pointing at it; returns the commit."""
  folder = os.path.join(cache, "models--" + repo_id.replace("/", "--"))
  blobs = {n: d if isinstance(d, bytes) else json.dumps(d, indent=2).encode() for n, d in files.items()}
  commit = hashlib.sha1(b"".join(n.encode() + d for n, d in sorted(blobs.items()))).hexdigest()
  os.makedirs(os.path.join(folder, "blobs"), exist_ok=True)
  os.makedirs(os.path.join(folder, "refs"), exist_ok=True)
  for name, data in blobs.items():
    blob = os.path.join(folder, "blobs", hashlib.sha256(data).hexdigest())
    with open(blob, "wb") as f:
      f.write(data)
    link = os.path.join(folder, "snapshots", commit, name)
    os.makedirs(os.path.dirname(link), exist_ok=True)
    os.symlink(os.path.relpath(blob, os.path.dirname(link)), link)
  with open(os.path.join(folder, "refs", revision), "w") as f:
    f.write(commit)
  return commit


def read_dir(path: str) -> dict:
  return {n: open(os.path.join(path, n), "rb").read() for n in os.listdir(path)}


def _transformers():
  """transformers (after the torchvision shim, as the parity tests import timm), or a skip (under CI, a failure)."""
  return _import_reference("transformers")


def _timm():
  return _import_reference("timm")


def _perturbed(model):
  """Random weights that all matter (the implementations zero some biases and heads at initialisation)."""
  import torch

  torch.manual_seed(0)
  with torch.no_grad():
    for p in model.parameters():
      p.add_(0.02 * torch.randn_like(p))
  return model.eval()


def _rel(got, want) -> float:
  return float(np.abs(np.asarray(got) - want).max() / np.abs(want).max())


def _labels(config: dict) -> dict:
  """The config with names for its classes (5 unless num_labels says otherwise): "class A", "class B", ..."""
  n = config.pop("num_labels", 5)
  return {**config, "id2label": {i: f"class {chr(65 + i)}" for i in range(n)}}


def _tiny_transformers(kind: str, tmp_path, **config):
  """(torch model, repository files) of a tiny transformers ViT or Swin with random weights, saved as the hub
  holds them (save_pretrained), and a preprocessor_config.json of transformers' ViT image processor."""
  t = _transformers()
  import torch

  torch.manual_seed(0)  # the initialisation too: the same weights every run
  if kind == "vit":
    args = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, image_size=32)
    cfg = t.ViTConfig(**{**args, "patch_size": 8, **_labels(config)})
    model = _perturbed(t.ViTForImageClassification(cfg))
    channels = cfg.num_channels
    pre = dict(image_mean=[0.5] * channels, image_std=[0.5] * channels, resample=2)  # bilinear
  else:  # 3 stages, maps 16, 8, 4 for window 4: shifted windows in the first two, the window = the map in the last
    args = dict(embed_dim=16, depths=[2, 2, 2], num_heads=[1, 2, 4], window_size=4, image_size=32, patch_size=2)
    cfg = t.SwinConfig(**{**args, **_labels(config)})
    model = _perturbed(t.SwinForImageClassification(cfg))
    pre = dict(image_mean=[0.485, 0.456, 0.406], image_std=[0.229, 0.224, 0.225], resample=3)  # bicubic
  out = tmp_path / f"save_{kind}"
  model.save_pretrained(str(out))
  size = cfg.image_size
  t.ViTImageProcessorPil(size={"height": size, "width": size}, **pre).save_pretrained(str(out))
  return model, read_dir(str(out))


# ------------------------------------------------------------------------------------------------- the specs


def test_weight_source_and_spec_parsing():
  s = convert.WeightSource.parse("hf:google/vit-base-patch16-224@refs/pr/3")
  assert (s.kind, s.name, s.revision, s.imported) == ("hf", "google/vit-base-patch16-224", "refs/pr/3", True)
  assert s.spec == "hf:google/vit-base-patch16-224@refs/pr/3"
  assert convert.WeightSource.parse("hf:timm/vit_tiny_patch16_224.augreg_in21k").revision == ""
  assert hub.parse("hf:org/name") == ("org/name", None) and hub.parse("hf:org/name@v1") == ("org/name", "v1")
  for bad in ("hf:", "hf:org/name@"):
    with pytest.raises(ConfigError, match="give a repository, hf:ORG/NAME"):
      hub.parse(bad)
  assert convert.pretrained_preprocess(convert.WeightSource.parse("npz:x.npz")) is None


def _repo(layout: str, config: dict, preprocessor: dict | None = None) -> hub.Repo:
  return hub.Repo("hf:o/n", "o/n", None, None, layout, config, preprocessor)


def test_transformers_preprocessor_configs_give_the_input_size_and_crop(caplog):
  """preprocessor_config.json's forms: {height, width} resizes the whole image; {shortest_edge} resizes the shorter
  side, then a centre crop (crop_size, or ConvNeXt's crop_pct); do_normalize false means no normalisation; a scalar
  mean or std holds for every channel; a resampling vitjax lacks is bicubic, said in a warning."""
  vit = {"model_type": "vit"}
  fields, hw = _repo("transformers", vit, {"size": {"height": 384, "width": 320}, "resample": 3})._transformers_input()
  assert hw == (384, 320)
  assert fields == {
    "mean": (0.5,) * 3, "std": (0.5,) * 3, "crop_fraction": None, "interpolation": "bicubic", "crop_offset": "floor"
  }  # fmt: skip
  pre = {"size": {"shortest_edge": 256}, "do_center_crop": True, "crop_size": {"height": 224, "width": 224}}
  fields, hw = _repo("transformers", vit, pre)._transformers_input()
  assert hw == (224, 224) and fields["crop_fraction"] == 224 / 256 and fields["interpolation"] == "bilinear"
  fields, hw = _repo("transformers", vit, {"size": {"shortest_edge": 224}, "crop_pct": 0.875})._transformers_input()
  assert hw == (224, 224) and fields["crop_fraction"] == 0.875
  assert _repo("transformers", vit, {"size": {"shortest_edge": 96}})._transformers_input()[1:] == ((96, 96),)
  no_crop = {**pre, "do_center_crop": False}  # a crop_size that is not used
  assert _repo("transformers", vit, no_crop)._transformers_input()[0]["crop_fraction"] == 1.0
  gray = {**vit, "num_channels": 1, "image_size": 32}
  fields, hw = _repo("transformers", gray, {"do_normalize": False, "image_mean": [0.3]})._transformers_input()
  assert hw == (32, 32) and (fields["mean"], fields["std"]) == ((0.0,), (1.0,))
  fields = _repo("transformers", {**vit, "num_channels": 2}, {"image_mean": 0.5, "image_std": 0.25}).preprocess()
  assert (fields["mean"], fields["std"]) == ((0.5, 0.5), (0.25, 0.25))
  assert _repo("transformers", vit, {"resample": 1}).preprocess()["interpolation"] == "bicubic"
  said = " ".join(r.getMessage() for r in caplog.records)
  assert "resamples with PIL's lanczos, which vitjax does not have: bicubic is used" in said


def test_repositories_name_their_classes_only_when_they_have_a_name_for_each():
  """config.json's class names: timm's label_names, or transformers' id2label (its keys are strings), only when there
  is one for every class and they are not transformers' placeholders LABEL_0, LABEL_1, ...; timm's input size."""
  assert _repo("transformers", {"id2label": {"1": "dog", "0": "cat"}}).class_names(2) == ["cat", "dog"]
  assert _repo("transformers", {"id2label": {"0": "cat", "1": "dog"}}).class_names(3) is None
  assert _repo("transformers", {"id2label": {"0": "LABEL_0", "1": "LABEL_1"}}).class_names(2) is None
  timm = _repo("timm", {"architecture": "vit_x", "pretrained_cfg": {"tag": "t", "label_names": ["a", "b"]}})
  assert timm.class_names(2) == ["a", "b"] and timm.class_names(1) is None and timm.timm_name == "vit_x.t"
  assert _repo("timm", {"architecture": "vit_x", "pretrained_cfg": {"input_size": [3, 96, 64]}}).image_size() == (
    96,
    64,
  )
  assert _repo("timm", {"architecture": "vit_x"}).image_size() == (224, 224)
  pre = hub.timm_pretrained_preprocess(
    {"mean": [0, 0.5, 1], "std": [1, 1, 2], "crop_pct": 0.9, "interpolation": "nearest"}
  )
  assert pre == {"mean": (0.0, 0.5, 1.0), "std": (1.0, 1.0, 2.0), "crop_fraction": 0.9, "interpolation": "bicubic"}


# ------------------------------------------------------------------------------------- errors: one line each


def test_not_cached_offline_and_unknown_layouts_are_one_line(hub_cache):
  with pytest.raises(ConfigError) as e:
    hub.open_repo("hf:nobody/nothing")
  msg = str(e.value)
  assert "\n" not in msg and msg.startswith("hf:nobody/nothing: config.json is not in the hub cache")
  assert hub_cache in msg and "HF_HUB_OFFLINE" in msg
  cache_repo(hub_cache, "someone/a-bert", {"config.json": {"model_type": "bert", "hidden_size": 8}})
  cache_repo(hub_cache, "someone/no-config", {"README.md": b"hi"})
  cache_repo(hub_cache, "someone/no-weights", {"config.json": {"model_type": "vit"}})
  cache_repo(hub_cache, "timm/resnet50.a1_in1k", {"config.json": {"architecture": "resnet50", "num_classes": 9}})
  with pytest.raises(
    ConfigError, match=r"^hf:someone/a-bert: an unknown hub layout \(config.json has model_type 'bert'"
  ):
    convert.load_params("hf:someone/a-bert")
  with pytest.raises(ConfigError, match="config.json is not in the hub cache"):  # offline, it may just not be cached
    hub.open_repo("hf:someone/no-config")
  with pytest.raises(ConfigError, match=r"no-weights: model.safetensors is not in the hub cache .* HF_HUB_OFFLINE"):
    convert.from_hub("hf:someone/no-weights")
  with pytest.raises(ConfigError, match=r"^hf:timm/resnet50.a1_in1k: timm's 'resnet50' is not a model vitjax reads"):
    convert.load_params("hf:timm/resnet50.a1_in1k")  # before it fetches the weights
  # a ViT's kin vitjax does not build: the refusal names what it needs
  rope_vit = "vit_base_patch16_rope_224"
  cache_repo(hub_cache, f"timm/{rope_vit}.naver_in1k", {"config.json": {"architecture": rope_vit}})
  with pytest.raises(ConfigError, match=rf"'{rope_vit}' needs rotary positions without a position table"):
    convert.load_params(f"hf:timm/{rope_vit}.naver_in1k")
  with pytest.raises(ConfigError, match="a hub repository has one set of weights"):
    vitjax.load("hf:someone/no-weights", weights="ema")


def test_an_unreachable_hub_reads_the_cache_at_once(hub_cache, monkeypatch, caplog):
  """No network and HF_HUB_OFFLINE unset: huggingface_hub retried each file for about 20 s, logging each retry twice.
  Now one probe of the host; a cached repository opens, an uncached one is one line, and nothing retries."""
  import huggingface_hub.constants as constants

  monkeypatch.delenv("HF_HUB_OFFLINE")
  monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
  monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")  # the discard port: nothing listens there
  for proxy in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"):
    monkeypatch.delenv(proxy, raising=False)
  hub.reachable.cache_clear()
  try:
    cache_repo(hub_cache, "someone/cached", {"config.json": {"architecture": "vit_tiny_patch16_224", "num_classes": 3}})
    assert hub.open_repo("hf:someone/cached").layout == "timm"
    with pytest.raises(ConfigError, match=r"^hf:nobody/nothing: the hub cannot be reached and config.json is not in"):
      hub.open_repo("hf:nobody/nothing")
    assert hub.reachable() is False
  finally:
    hub.reachable.cache_clear()
  said = [r.getMessage() for r in caplog.records]
  assert not any("Retry" in m for m in said), said
  assert sum("cannot be reached" in m for m in said) == 1, said


def _run_cli(tmp_path, hf_home, data_dir, *args, config=th.CONFIG):
  workdir = str(tmp_path / "absent" / "w")
  env = {**th.env(), "HF_HOME": hf_home, "HF_HUB_OFFLINE": "1"}
  env.pop("HF_HUB_CACHE", None)
  cmd = [*th.main_cmd(workdir, "--mode=eval", f"--config.data.data_dir={data_dir}", config=config), *args]
  proc = subprocess.run(cmd, cwd=th.ROOT, env=env, capture_output=True, text=True, timeout=300)
  return proc, workdir


@pytest.mark.parametrize("case", ["not cached", "unknown layout"])
def test_command_line_says_it_in_one_error_line(case, tmp_path, hub_cache, data_dir):
  if case == "unknown layout":
    cache_repo(hub_cache, "someone/a-convnet", {"config.json": {"model_type": "resnet"}, "model.safetensors": b"x"})
  repo = "nobody/nothing" if case == "not cached" else "someone/a-convnet"
  proc, workdir = _run_cli(tmp_path, os.path.dirname(hub_cache), data_dir, f"--config.init_from=hf:{repo}")
  err = th.error_lines(proc)
  assert proc.returncode == 2, proc.stderr[-3000:]
  assert "Traceback" not in proc.stderr and len(err.strip().splitlines()) == 1 and err.startswith("error: "), err
  if case == "not cached":
    assert f"hf:{repo}: config.json is not in the hub cache {hub_cache} and HF_HUB_OFFLINE is set" in err
  else:
    assert (
      "an unknown hub layout (config.json has model_type 'resnet')" in err
      and "'vit', 'dinov2', 'dinov2_with_registers', 'siglip_vision_model', 'siglip', 'swin'" in err
    )
  assert not os.path.exists(workdir)


# ----------------------------------------------------------------------------- parity: transformers and timm


@pytest.mark.parametrize("kind", ["vit", "swin"])
def test_transformers_layout_matches_transformers(kind, tmp_path, hub_cache):
  """hf:ORG/NAME in transformers' layout (the files save_pretrained writes) -> the same logits as
  ViTForImageClassification / SwinForImageClassification; the in-memory names of transformers 5 too."""
  import torch

  model, files = _tiny_transformers(kind, tmp_path)
  cache_repo(hub_cache, f"someone/tiny-{kind}", files)
  module, variables, repo = convert.from_hub(f"hf:someone/tiny-{kind}")
  assert type(module).__name__ == {"vit": "ViT", "swin": "Swin"}[kind] and repo.layout == "transformers"
  if kind == "vit":
    assert module.layernorm_eps == 1e-12 and module.num_heads == 4  # transformers' epsilon, from config.json
  x = np.random.RandomState(1).randn(2, 3, 32, 32).astype(np.float32)
  with torch.no_grad():
    want = model(pixel_values=torch.from_numpy(x)).logits.numpy()
  apply = jax.jit(module.apply)
  rel = _rel(apply(variables, x.transpose(0, 2, 3, 1))[0], want)
  print(f"{kind}: relative max error {rel:.2e}")
  assert rel <= TOL
  _, in_memory = convert.from_hf(model.state_dict(), json.loads(files["config.json"]))
  jax.tree.map(np.testing.assert_array_equal, in_memory, variables)


def test_transformers_options_vitjax_lacks_are_refused(tmp_path, hub_cache):
  _, files = _tiny_transformers("swin", tmp_path, layer_norm_eps=1e-6)
  cache_repo(hub_cache, "someone/swin-eps", files)
  with pytest.raises(ConfigError, match=r"^hf:someone/swin-eps: .*layer_norm_eps=1e-06; vitjax's Swin has .* 1e-5"):
    convert.load_params("hf:someone/swin-eps")
  _, files = _tiny_transformers("vit", tmp_path, hidden_act="silu")
  cache_repo(hub_cache, "someone/vit-silu", files)
  with pytest.raises(ConfigError, match=r"hidden_act='silu' has no equivalent in vitjax"):
    convert.load_params("hf:someone/vit-silu")


@pytest.mark.parametrize("kind", ["vit", "swin"])
def test_load_predicts_as_transformers_with_its_preprocessing(kind, tmp_path, hub_cache):
  """vitjax.load("hf:...").predict(uint8 images) = softmax of the transformers model on its image processor's
  output (resize to 32 x 32, bilinear for the ViT, bicubic for the Swin; the repository's mean and std)."""
  import torch

  t = _transformers()
  model, files = _tiny_transformers(kind, tmp_path)
  commit = cache_repo(hub_cache, f"someone/tiny-{kind}", files)
  cache_repo(hub_cache, f"someone/tiny-{kind}", {"config.json": {"model_type": "bert"}}, revision="other")
  trained = vitjax.load(f"hf:someone/tiny-{kind}@{commit}")
  assert trained.step == 0 and trained.class_names == ["class A", "class B", "class C", "class D", "class E"]
  assert list(trained.variables) == ["params"] and trained.config.model.num_classes == 5
  images = np.random.RandomState(2).randint(0, 256, (3, 40, 52, 3)).astype(np.uint8)  # resized to 32 x 32
  processor = t.ViTImageProcessorPil.from_pretrained(str(tmp_path / f"save_{kind}"))
  x = processor(list(images), return_tensors="np")["pixel_values"]
  with torch.no_grad():
    want = torch.softmax(model(pixel_values=torch.from_numpy(x)).logits, -1).numpy()
  got = trained.predict(images)
  assert got.shape == (3, 5) and np.abs(got - want).max() <= 1e-5
  pre = convert.pretrained_preprocess(convert.WeightSource.parse(f"hf:someone/tiny-{kind}"))
  assert pre["interpolation"] == {"vit": "bilinear", "swin": "bicubic"}[kind] and pre["crop_fraction"] is None
  with pytest.raises(ConfigError, match="an unknown hub layout"):  # another revision, another config
    convert.load_params(f"hf:someone/tiny-{kind}@other")


def test_timm_layout_matches_timm_and_takes_its_pretrained_config(tmp_path, hub_cache):
  """hf:timm/NAME (config.json and model.safetensors as timm's save_for_hf writes them) goes through from_timm;
  its preprocessing is the pretrained_cfg's (timm_preprocess's for NAME), and vitjax.load predicts as timm's eval
  transform and model do."""
  import torch
  from PIL import Image

  timm = _timm()
  name = "vit_tiny_patch16_224.augreg_in21k_ft_in1k"
  torch.manual_seed(0)
  model = _perturbed(timm.create_model(name, pretrained=False, depth=1, num_classes=4))  # ViT-Ti, one block
  timm.models.save_for_hf(
    model, str(tmp_path / "timm"), model_config={"label_names": ["n01", "n02", "n03", "n04"]}, safe_serialization=True
  )
  cache_repo(hub_cache, f"timm/{name}", read_dir(str(tmp_path / "timm")))
  spec = f"hf:timm/{name}"
  module, variables, repo = convert.from_hub(spec)
  assert repo.layout == "timm" and repo.timm_name == name and module.depth == 1
  x = np.random.RandomState(1).randn(2, 3, 224, 224).astype(np.float32)
  with torch.no_grad():
    want = model(torch.from_numpy(x)).numpy()
  rel = _rel(jax.jit(module.apply)(variables, x.transpose(0, 2, 3, 1))[0], want)
  print(f"timm ViT: relative max error {rel:.2e}")
  assert rel <= TOL
  pre = convert.pretrained_preprocess(convert.WeightSource.parse(spec))
  assert pre == convert.timm_preprocess(name) and pre["crop_fraction"] == 0.9
  jax.tree.map(np.testing.assert_array_equal, convert.load_params(spec), variables["params"])

  trained = vitjax.load(spec)
  assert trained.class_names == ["n01", "n02", "n03", "n04"]
  photo = Image.fromarray(np.random.RandomState(3).randint(0, 256, (20, 24, 3), dtype=np.uint8)).resize((310, 260))
  transform = timm.data.create_transform(**timm.data.resolve_data_config({}, model=model))
  with torch.no_grad():
    want = torch.softmax(model(transform(photo)[None]), -1).numpy()
  assert np.abs(trained.predict(np.asarray(photo)[None]) - want).max() <= 1e-5


def test_a_dinov2_with_registers_repository_loads_and_predicts_as_timm(tmp_path, hub_cache):
  """hf:timm/vit_small_patch14_reg4_dinov2.lvd142m (refused before: "not a model vitjax reads"): 4 registers,
  LayerScale, patch 14 and a position table of the patches only, at timm's 518 px; one block, 3 classes."""
  import torch

  timm = _timm()
  name = "vit_small_patch14_reg4_dinov2.lvd142m"
  model = _perturbed(timm.create_model(name, pretrained=False, depth=1, num_classes=3))
  timm.models.save_for_hf(model, str(tmp_path / "timm"), safe_serialization=True)
  cache_repo(hub_cache, f"timm/{name}", read_dir(str(tmp_path / "timm")))
  trained = vitjax.load(f"hf:timm/{name}")
  module = trained.model
  assert (module.num_registers, module.class_posemb, module.patch_size, module.init_values) == (
    4,
    False,
    (14, 14),
    1e-5,
  )
  assert trained.config.data.image_size == 518
  x = np.random.RandomState(1).randn(1, 3, 518, 518).astype(np.float32)
  with torch.no_grad():
    want = model(torch.from_numpy(x)).numpy()
  assert _rel(jax.jit(module.apply)(trained.variables, x.transpose(0, 2, 3, 1))[0], want) <= TOL


def test_an_eva02_repository_loads_and_predicts_as_timm(tmp_path, hub_cache):
  """hf:timm/eva02_tiny_patch14_224.mim_in22k (refused before: "not a model vitjax reads"): timm's Eva, with 2-D
  rotary positions, packed SwiGLU, no key bias and the patches' average; one block, 3 classes, at timm's 224 px."""
  import torch

  timm = _timm()
  name = "eva02_tiny_patch14_224.mim_in22k"
  model = _perturbed(timm.create_model(name, pretrained=False, depth=1, num_classes=3))
  timm.models.save_for_hf(model, str(tmp_path / "timm"), safe_serialization=True)
  cache_repo(hub_cache, f"timm/{name}", read_dir(str(tmp_path / "timm")))
  trained = vitjax.load(f"hf:timm/{name}")
  module = trained.model
  assert (module.rope, module.ffn, module.key_bias, module.pool_type) == ("axial", "swiglu", False, "gap")
  assert trained.config.data.image_size == 224
  x = np.random.RandomState(1).randn(1, 3, 224, 224).astype(np.float32)
  with torch.no_grad():
    want = model(torch.from_numpy(x)).numpy()
  assert _rel(jax.jit(module.apply)(trained.variables, x.transpose(0, 2, 3, 1))[0], want) <= TOL


def test_transformers_dinov2_with_registers_predicts_as_transformers_at_its_processors_size(tmp_path, hub_cache):
  """A transformers Dinov2WithRegistersForImageClassification repository (model_type 'dinov2_with_registers', refused
  before: "an unknown hub layout"): 4 registers, LayerScale, the classifier over the class token and the patches'
  mean. Its config says 56 px, its BitImageProcessor crops 28 (DINOv2's 518 and 224): transformers resamples the
  table at every call, vitjax once at load, the same way; vitjax.load's predict gives transformers' probabilities,
  non-square images cropped where transformers crops them.
  Dinov2Model (no classifier) and the in-memory state dict of transformers 5 read too."""
  import torch

  t = _transformers()
  torch.manual_seed(0)
  cfg = t.Dinov2WithRegistersConfig(
    hidden_size=32, num_hidden_layers=2, num_attention_heads=2, image_size=56, patch_size=14, num_register_tokens=4,
    layerscale_value=0.5, **_labels({"num_labels": 3}),
  )  # fmt: skip
  model = _perturbed(t.Dinov2WithRegistersForImageClassification(cfg)).eval()
  out = tmp_path / "save"
  model.save_pretrained(str(out))
  pre = dict(size={"shortest_edge": 32}, crop_size={"height": 28, "width": 28}, do_center_crop=True, resample=3)
  processor = t.BitImageProcessorPil(**pre, image_mean=[0.485, 0.456, 0.406], image_std=[0.229, 0.224, 0.225])
  processor.save_pretrained(str(out))
  cache_repo(hub_cache, "someone/tiny-dinov2-reg", read_dir(str(out)))
  trained = vitjax.load("hf:someone/tiny-dinov2-reg")
  m = trained.model
  assert (m.num_registers, m.class_posemb, m.pool_type, m.init_values) == (4, False, "tok_gap", 0.5)
  assert trained.variables["params"]["posembed"]["pos_embedding"].shape == (1, 4, 32)  # 4x4 -> 2x2
  # 40x36: resized to 35x32, an odd margin of 7 rows: transformers' centre crop starts at row 3 (floor), torchvision's
  # at 4 (round); a transformers repository's preprocessing takes the floor (augment.Preprocess.crop_offset)
  images = np.random.RandomState(2).randint(0, 256, (3, 40, 36, 3), dtype=np.uint8)
  assert trained.task.preprocess().crop_offset == "floor"
  x = processor(list(images), return_tensors="np")["pixel_values"]
  assert x.shape == (3, 3, 28, 28)
  with torch.no_grad():
    want = torch.softmax(model(pixel_values=torch.from_numpy(x)).logits, -1).numpy()
  assert np.abs(trained.predict(images) - want).max() <= 1e-5
  with torch.no_grad():  # .features: DINOv2's x_norm_patchtokens on their grid, and what its classifier takes
    tokens = model.dinov2_with_registers(pixel_values=torch.from_numpy(x)).last_hidden_state.numpy()
  feats = trained.features(images, batch_size=2)
  patches = tokens[:, 1 + 4 :].reshape(3, 2, 2, 32)
  assert feats["patches"].shape == (3, 2, 2, 32) and feats["pooled"].shape == (3, 64)
  np.testing.assert_allclose(feats["patches"], patches, atol=1e-5 * np.abs(patches).max())
  np.testing.assert_allclose(feats["pooled"][:, :32], tokens[:, 0], atol=1e-5 * np.abs(patches).max())
  np.testing.assert_allclose(feats["pooled"][:, 32:], patches.mean((1, 2)), atol=1e-5 * np.abs(patches).max())
  base = _perturbed(t.Dinov2Model(t.Dinov2Config(hidden_size=32, num_hidden_layers=1, num_attention_heads=2))).eval()
  module, variables = convert.from_hf({k: v.numpy() for k, v in base.state_dict().items()}, base.config.to_dict())
  assert module.pool_type == "tok" and module.num_registers == 0 and module.class_posemb
  x = np.random.RandomState(3).randn(1, 3, 224, 224).astype(np.float32)
  with torch.no_grad():
    want = base(pixel_values=torch.from_numpy(x)).pooler_output.numpy()
  assert _rel(jax.jit(module.apply)(variables, x.transpose(0, 2, 3, 1))[0], want) <= TOL


def test_a_timm_hybrid_repository_goes_through_from_timm(tmp_path, hub_cache):
  """hf:timm/vit_tiny_r_s16_p8_224... (the release's R+ViT-Ti_16 as timm publishes it): the hybrid family's timm
  reader, with timm's stem arithmetic."""
  import torch

  timm = _timm()
  name = "vit_tiny_r_s16_p8_224.augreg_in21k_ft_in1k"
  torch.manual_seed(0)
  model = _perturbed(timm.create_model(name, pretrained=False, depth=1, num_classes=4))
  timm.models.save_for_hf(model, str(tmp_path / "timm"), safe_serialization=True)
  cache_repo(hub_cache, f"timm/{name}", read_dir(str(tmp_path / "timm")))
  module, variables, repo = convert.from_hub(f"hf:timm/{name}")
  assert type(module).__name__ == "HybridViT" and module.resnet_layers == () and module.resnet_std == "timm"
  x = np.random.RandomState(1).randn(2, 3, 224, 224).astype(np.float32)
  with torch.no_grad():
    want = model(torch.from_numpy(x)).numpy()
  assert _rel(jax.jit(module.apply)(variables, x.transpose(0, 2, 3, 1))[0], want) <= TOL


# ------------------------------------------------------------------------------------------ init_from=hf:...


def test_init_from_hf_evaluates_the_imported_weights(tmp_path, hub_cache, data_dir):
  """init_from=hf:... with --mode=eval on digits (a 1-channel, 8 px transformers ViT, 10 classes): the weights load
  (offline, from the cache) into the model the config describes (convert.model_config's fields) and are
  evaluated."""
  model, files = _tiny_transformers(
    "vit",
    tmp_path,
    num_channels=1,
    image_size=8,
    patch_size=2,
    hidden_size=16,
    num_hidden_layers=1,
    num_attention_heads=2,
    intermediate_size=32,
    num_labels=10,
  )
  cache_repo(hub_cache, "someone/vit-digits", files)
  module, _, _ = convert.from_hub("hf:someone/vit-digits")
  fields = convert.model_config(module)
  assert fields == {
    "name": "vit_ti2",
    "width": 16,
    "depth": 1,
    "num_heads": 2,
    "mlp_dim": 32,
    "num_classes": 10,
    "layernorm_eps": 1e-12,
  }
  config = tmp_path / "vit_digits_from_hf.py"  # what a user writes: the digits config with the hub model's fields
  config.write_text(
    "import ml_collections as mlc\n"
    "from vitjax.config import load_module\n\n\n"
    "def get_config():\n"
    f"  c = load_module({th.CONFIG!r}).get_config()\n"
    f"  c.model = mlc.ConfigDict({fields!r})\n"
    "  c.init_from = 'hf:someone/vit-digits'\n"
    "  return c\n"
  )
  proc, workdir = _run_cli(tmp_path, os.path.dirname(hub_cache), data_dir, config=str(config))
  th.check_ok(proc)
  assert proc.stdout.startswith("imported weights (init_from=hf:someone/vit-digits), no training | eval/loss ")
  assert json.load(open(os.path.join(workdir, "eval_valid_imported.json")))["init_from"] == "hf:someone/vit-digits"


def test_transformers_dinov2_giant_swiglu_matches_transformers(tmp_path):
  """use_swiglu_ffn (DINOv2's giant, refused before): a SiLU-gated feed-forward whose weights_in holds the gate's
  rows first, read as vitjax's SwiGLU; two blocks, 56 px, width 48."""
  import torch

  t = _transformers()
  torch.manual_seed(0)
  cfg = t.Dinov2Config(
    hidden_size=48, num_hidden_layers=2, num_attention_heads=2, image_size=56, patch_size=14, use_swiglu_ffn=True
  )
  model = _perturbed(t.Dinov2Model(cfg)).eval()
  model.save_pretrained(str(tmp_path))
  from safetensors.numpy import load_file

  x = np.random.RandomState(3).randn(2, 3, 56, 56).astype(np.float32)
  with torch.no_grad():
    want = model(pixel_values=torch.from_numpy(x)).pooler_output.numpy()
  in_memory = {k: v.numpy() for k, v in model.state_dict().items()}  # transformers 5: gate_proj, up_proj, down_proj
  for sd in (in_memory, load_file(str(tmp_path / "model.safetensors"))):  # the hub's file: weights_in, weights_out
    module, variables = convert.from_hf(sd, cfg.to_dict())
    assert (module.ffn, module.act, module.mlp_dim) == ("swiglu", "silu", 128)  # (int(192 * 2 / 3) + 7) // 8 * 8
    assert _rel(jax.jit(module.apply)(variables, x.transpose(0, 2, 3, 1))[0], want) <= TOL


@pytest.mark.parametrize("kind", ["SiglipVisionModel", "SiglipForImageClassification", "SiglipModel"])
def test_transformers_siglip_vision_tower_matches_transformers(kind, tmp_path, hub_cache):
  """SigLIP's image tower in transformers' layout (model_type 'siglip_vision_model' or 'siglip', refused before):
  no class token, the attention-pooling head as vitjax's MAP head (torch's MultiheadAttention in_proj split), or
  the classifier's token average; a SiglipModel's text tower left aside. From memory and from the saved file; the
  tower's repository loads with vitjax.load and gives its pooled features."""
  import torch
  from safetensors.numpy import load_file

  t = _transformers()
  torch.manual_seed(0)
  vision = t.SiglipVisionConfig(
    hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, image_size=56, patch_size=14
  )
  text = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, vocab_size=100)
  cfg = {
    "SiglipVisionModel": vision,
    "SiglipForImageClassification": t.SiglipConfig(vision_config=vision.to_dict(), num_labels=3),
    "SiglipModel": t.SiglipConfig(vision_config=vision.to_dict(), text_config=text),
  }[kind]
  model = _perturbed(getattr(t, kind)(cfg)).eval()
  x = np.random.RandomState(1).randn(2, 3, 56, 56).astype(np.float32)
  with torch.no_grad():
    tower = model if kind != "SiglipModel" else model.vision_model
    out = tower(pixel_values=torch.from_numpy(x))
  want = (out.logits if kind == "SiglipForImageClassification" else out.pooler_output).numpy()
  model.save_pretrained(str(tmp_path / "save"))
  for sd in (
    {k: v.numpy() for k, v in model.state_dict().items()},
    load_file(str(tmp_path / "save/model.safetensors")),
  ):
    module, variables = convert.from_hf(sd, cfg.to_dict())
    assert (
      module.pool_type == ("gap" if kind == "SiglipForImageClassification" else "map") and module.act == "gelu_tanh"
    )
    assert _rel(jax.jit(module.apply)(variables, x.transpose(0, 2, 3, 1))[0], want) <= TOL
  if kind == "SiglipVisionModel":
    t.SiglipImageProcessor(size={"height": 56, "width": 56}).save_pretrained(str(tmp_path / "save"))
    cache_repo(hub_cache, "someone/tiny-siglip", read_dir(str(tmp_path / "save")))
    feats = vitjax.load("hf:someone/tiny-siglip").features(np.zeros((2, 56, 56, 3), np.uint8))
    assert feats["pooled"].shape == (2, 32) and feats["patches"].shape == (2, 4, 4, 32)
