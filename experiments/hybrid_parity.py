"""Parity of vitjax's hybrid ViT with the originals at the release's full sizes: the parity table of issue 49.

For each hybrid of the release (R+ViT-Ti_16, R26+ViT-S_32, R26+ViT-B_32, R50+ViT-B_16, R50+ViT-L_32), on random
weights (the originals' own initialisation, with the zero-initialised leaves made non-trivial), at 224 pixels:

- npz in: vit_jax's VisionTransformer (google-research/vision_transformer, configs/models.py's config) is
  initialised, saved as the release's .npz (pre-Linen block names, GroupNorm [1, 1, 1, C]; read back by
  vit_jax.checkpoint.load, bit-identical logits required), read by `convert.from_vit_npz(path, variant=NAME)`;
- npz out: that model written by `convert.to_vit_npz`, read by vit_jax.checkpoint.load and run by vit_jax;
- timm in: timm.create_model(TIMM_NAME) (random), its state dict through `convert.from_timm`;
- timm out: that model written by `convert.to_timm`, loaded with strict=True into `convert.build_timm`'s model.

Each row: the largest |difference| of the logits over the largest |logit|, float32, on 2 images. With --float64
(timm in only) both sides compute in float64 on the same weights, which separates a difference of arithmetic from
float32 rounding. Run (about 3
minutes on 2 CPU cores), with the original's checkout as experiments/golden/README.md makes it:

    python experiments/hybrid_parity.py --vit-repo /work/runs/golden/src/vision_transformer \\
        --out experiments/results/hybrid_parity.jsonl
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SIZES = {  # release name: (timm name, vitjax name)
  "R+ViT-Ti_16": ("vit_tiny_r_s16_p8_224", "vit_r_ti16"),
  "R26+ViT-S_32": ("vit_small_r26_s32_224", "vit_r26_s32"),
  "R26+ViT-B_32": ("vit_base_r26_s32_224", "vit_r26_b32"),
  "R50+ViT-B_16": ("vit_base_r50_s16_224", "vit_r50_b16"),
  "R50+ViT-L_32": ("vit_large_r50_s32_224", "vit_r50_l32"),
}


def _golden_helpers():
  spec = importlib.util.spec_from_file_location("make_vision", os.path.join(HERE, "golden", "make_vision.py"))
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  return mod


def rel(a, b) -> float:
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  return float(np.abs(a - b).max() / np.abs(b).max())


def nontrivial(flat: dict, rng) -> dict:
  """The zero-initialised leaves (gn3 scales, the head, the class token) made random; the rest kept."""
  out = {}
  for k, v in flat.items():
    v = np.asarray(v, np.float32)
    if not v.any():
      scale = k.endswith("/scale") or k.endswith(".weight") and "norm" in k
      v = (1.0 + 0.2 * rng.standard_normal(v.shape) if scale else 0.02 * rng.standard_normal(v.shape)).astype(
        np.float32
      )
    out[k] = v
  return out


def npz_rows(release: str, vit_repo: str, images: np.ndarray, tmp: str, g) -> list[dict]:
  import flax
  import jax
  import jax.numpy as jnp
  from flax import traverse_util

  from vitjax import convert

  if vit_repo not in sys.path:
    sys.path.insert(0, vit_repo)
    g.stub_module("vit_jax.models")
    import vit_jax  # noqa: F401

    sys.modules["vit_jax"].models = sys.modules["vit_jax.models"]
  with g.stubs():
    from vit_jax import checkpoint, models_vit, test_utils
    from vit_jax.configs import models as model_configs

  cfg = model_configs.MODEL_CONFIGS[release]
  model = models_vit.VisionTransformer(num_classes=1000, **cfg)
  init = model.init(jax.random.PRNGKey(0), jnp.zeros((1, *images.shape[1:])), train=False)["params"]
  flat = nontrivial(traverse_util.flatten_dict(flax.core.unfreeze(init), sep="/"), np.random.default_rng(0))
  params = traverse_util.unflatten_dict({k: jnp.asarray(v) for k, v in flat.items()}, sep="/")
  run = jax.jit(lambda p: model.apply({"params": p}, images, train=False))
  want = np.asarray(run(params))
  path = os.path.join(tmp, "release.npz")
  names_and_vals, _ = test_utils._tree_flatten_with_names(jax.tree.map(np.asarray, params))
  np.savez(path, **{g.pre_linen(k): g.released_shape(k, v) for k, v in names_and_vals})
  assert np.array_equal(np.asarray(run(checkpoint.load(path))), want), "the release's loader"
  module, variables = convert.from_vit_npz(path, variant=release)
  got = np.asarray(jax.jit(module.apply)(variables, images)[0])
  rows = [dict(direction="npz in", diff=rel(got, want))]
  out = os.path.join(tmp, "vitjax.npz")
  np.savez(out, **convert.to_vit_npz(module, variables))
  theirs = np.asarray(run(checkpoint.load(out)))
  rows.append(dict(direction="npz out", diff=rel(theirs, got)))
  return rows


def timm_rows(timm_name: str, images: np.ndarray, float64: bool = False) -> list[dict]:
  sys.path.insert(0, os.path.join(ROOT, "tests"))
  import jax
  import torch
  import torchvision_ops_shim  # noqa: F401  (torchvision's CUDA build next to CPU torch: before timm)

  timm = importlib.import_module("timm")
  from vitjax import convert

  torch.manual_seed(0)
  model = timm.create_model(timm_name, pretrained=False).eval()
  sd = nontrivial({k: v.numpy() for k, v in model.state_dict().items()}, np.random.default_rng(1))
  model.load_state_dict({k: torch.from_numpy(v) for k, v in sd.items()}, strict=True)
  x = torch.from_numpy(np.ascontiguousarray(images.transpose(0, 3, 1, 2)))
  module, variables = convert.from_timm(timm_name, sd)
  if float64:  # the same weights, both sides computing in float64: what is left is a difference of arithmetic
    model, x = model.double(), x.double()
    variables = jax.tree.map(lambda v: np.asarray(v, np.float64), variables)
    images = images.astype(np.float64)
  with torch.no_grad():
    want = model(x).numpy()
  got = np.asarray(jax.jit(module.apply)(variables, images)[0])
  rows = [dict(direction="timm in", diff=rel(got, want))]
  if float64:
    return rows
  state, cfg = convert.to_timm(module, variables, images.shape[1])
  back = convert.build_timm(cfg)
  back.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in state.items()}, strict=True)
  with torch.no_grad():
    theirs = back(x).numpy()
  rows.append(dict(direction="timm out", diff=rel(theirs, got)))
  return rows


def main():
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--vit-repo", required=True, help="checkout of google-research/vision_transformer (c6de1e5)")
  p.add_argument("--out", default=None, help="append the rows (JSON lines) here")
  p.add_argument("--sizes", default=",".join(SIZES))
  p.add_argument("--float64", action="store_true", help="timm in only, both sides in float64 (no npz rows)")
  a = p.parse_args()
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  import tempfile

  import jax

  if a.float64:
    jax.config.update("jax_enable_x64", True)

  jax.config.update("jax_default_matmul_precision", "highest")
  import flax.io  # noqa: F401  (before the stubs, as make_vision does)
  import flax.training.checkpoints  # noqa: F401

  g = _golden_helpers()
  images = np.random.default_rng(7).uniform(-1, 1, (2, 224, 224, 3)).astype(np.float32)
  command = f"python experiments/hybrid_parity.py --vit-repo REPO --sizes={a.sizes}" + (" --float64" * a.float64)
  rows = []
  for release in a.sizes.split(","):
    timm_name, name = SIZES[release]
    t0 = time.time()
    with tempfile.TemporaryDirectory() as tmp:
      npz = [] if a.float64 else npz_rows(release, os.path.abspath(a.vit_repo), images, tmp, g)
      found = npz + timm_rows(timm_name, images, a.float64)
    for r in found:
      r.update(
        release=release,
        vitjax=name,
        timm=timm_name,
        image_size=224,
        dtype="float64" if a.float64 else "float32",
        command=command,
        vit_jax_commit=g.git_commit(a.vit_repo),
        timm_version=sys.modules["timm"].__version__,
        date=time.strftime("%Y-%m-%d"),
      )
      rows.append(r)
      print(f"{release:14s} {r['direction']:9s} {r['diff']:.1e}", flush=True)
    print(f"  ({time.time() - t0:.0f} s)", flush=True)
  if a.out:
    with open(a.out, "a") as f:
      for r in rows:
        f.write(json.dumps(r) + "\n")


if __name__ == "__main__":
  main()
