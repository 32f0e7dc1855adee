"""On paper: the largest ViT that trains at global batch 1,024 on 8 x 80 GB under each sharding preset.

    python experiments/largest_vit.py --measured=experiments/results/sharding_memory.jsonl

An extrapolation, not a measurement. It takes the per-device bytes that XLA reported for the compiled training
step of ViT-B/16, L/16 and H/14 at batch 64 on 8 devices (experiments/sharding_memory.py) and:

- state (parameters + AdamW's two moments, float32): counted exactly, per device, from each parameter's shape
  and the preset's PartitionSpec (vitjax.mesh.param_specs on the abstract parameters; nothing is allocated);
- temporaries: fitted per preset as  g * (4 bytes x parameters per device) + a * U,  with
  U = 4 bytes x rows per device x depth x tokens x width  (the size of the blocks' residual stream), by least
  squares over the three measured models; the fit's error on them is printed. Attention-score memory, which
  grows as heads x tokens^2, is folded into U: heads x tokens / width is 3.1-3.2 for B, L and H, so the fold holds
  for them; for g/G/e (16 heads, wider) it overstates activations a little.
- with `model.scan=True, model.remat=True` (the blocks scanned and each rematerialised): temporaries =
  r * (4 bytes x parameters per device) + U + a * U / depth, i.e. the blocks' inputs (U), one block's
  activations recomputed in the backward pass (a * U / depth, a from the fit above) and r gradient-sized buffers
  (gradients, the optimizer's update, fsdp's gathered layer), r calibrated per preset on the measured ViT-L/16
  scan+remat row and checked on ViT-B/16's. (Remat without scan saves nothing for dp on XLA's CPU backend:
  ViT-L/16 dp reports 5.96 GiB of temporaries with remat against 5.39 GiB without.)

Then, for global batch 1,024 (rows per device: 1,024 / (data x fsdp)), it reports each model's bytes per device
and whether it fits in 80 GB, without and with rematerialisation. The XLA numbers come from the CPU backend; the
GPU backend fuses differently, so treat the answer as a size class, not a byte count.
"""

from __future__ import annotations

import argparse
import json

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P
from scipy.optimize import nnls

from vitjax import mesh as mesh_lib
from vitjax import models

# name: (width, depth, mlp_dim, heads, patch); g, G, e from Zhai et al. 2022 / Chen et al. 2023, and a plain ViT of
# ViT-22B's shape (Dehghani et al. 2023; the real one drops biases and runs layers in parallel)
FAMILY = {
  "vit_b16": (768, 12, 3072, 12, 16),
  "vit_l16": (1024, 24, 4096, 16, 16),
  "vit_h14": (1280, 32, 5120, 16, 14),
  "vit_g14": (1408, 40, 6144, 16, 14),
  "vit_G14": (1664, 48, 8192, 16, 14),
  "vit_e14": (1792, 56, 15360, 16, 14),
  "vit_22B14": (6144, 48, 24576, 48, 14),
}
MESH_SHAPES = {
  "dp": {"data": 8, "fsdp": 1, "tensor": 1},
  "fsdp": {"data": 1, "fsdp": 8, "tensor": 1},
  "tp": {"data": 2, "fsdp": 1, "tensor": 4},
  "fsdp_tp": {"data": 1, "fsdp": 2, "tensor": 4},
}
GB = 1e9
HBM = 80 * GB


def abstract_params(name: str, image: int = 224, classes: int = 1000):
  width, depth, mlp, heads, patch = FAMILY[name]
  model = models.create(
    "vit_b16", width=width, depth=depth, mlp_dim=mlp, num_heads=heads, patch_size=patch, num_classes=classes
  )
  x = jnp.zeros((1, image, image, 3), jnp.float32)
  return jax.eval_shape(lambda: model.init(jax.random.key(0), x))["params"]


def per_device_params(params, preset: str) -> float:
  """Parameters held by one device (elements), from each parameter's PartitionSpec under the preset."""
  shape = MESH_SHAPES[preset]
  specs = mesh_lib.param_specs(params, shape, preset, tp_rules=models.registry.tp_rules(models.ViT))
  total = 0.0
  for leaf, spec in zip(jax.tree.leaves(params), jax.tree.leaves(specs, is_leaf=lambda s: isinstance(s, P))):
    split = 1
    for axis in spec:
      for a in (axis,) if isinstance(axis, str) else axis or ():
        split *= shape[a]
    total += leaf.size / split
  return total


def units(name: str, rows: int, image: int = 224) -> float:
  width, depth, _, _, patch = FAMILY[name]
  tokens = (image // patch) ** 2 + 1
  return 4.0 * rows * depth * tokens * width


def remat_activations(name: str, rows: int, act: float) -> float:
  """Scanned, rematerialised blocks: their inputs (U) plus one block's activations (act * U / depth)."""
  return units(name, rows) * (1.0 + act / FAMILY[name][1])


def main():
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--measured", default="experiments/results/sharding_memory.jsonl")
  p.add_argument("--batch", type=int, default=1024)
  p.add_argument("--out", default=None)
  a = p.parse_args()
  measured = [json.loads(line) for line in open(a.measured)]
  params = {name: abstract_params(name) for name in FAMILY}
  counts = {name: sum(x.size for x in jax.tree.leaves(t)) for name, t in params.items()}
  rows_out = []
  print("fit of the temporaries on the measured models (batch 64, 8 devices):")
  fits = {}
  for preset, shape in MESH_SHAPES.items():
    shards = shape["data"] * shape["fsdp"]
    ms = [m for m in measured if m["preset"] == preset and m["model"] in FAMILY and not m.get("remat")]
    if len({m["model"] for m in ms}) < 3:
      print(f"  {preset:8} fewer than 3 models measured: skipped")
      continue
    x = np.array(
      [[4.0 * per_device_params(params[m["model"]], preset), units(m["model"], m["batch"] // shards)] for m in ms]
    )
    y = np.array([m["temp_bytes"] for m in ms], float)
    (g, act), _ = nnls(x, y)  # both terms are sizes: non-negative
    for m, pred in zip(ms, x @ [g, act]):
      state = 12.0 * per_device_params(params[m["model"]], preset)
      print(
        f"  {preset:8} {m['model']:8} temp measured {m['temp_bytes'] / GB:6.2f} GB, fitted {pred / GB:6.2f} GB | "
        f"state counted {state / GB:6.2f} GB, arguments measured {m['argument_bytes'] / GB:6.2f} GB"
      )
    print(f"  {preset:8} g = {g:.2f}, a = {act:.1f} (bytes of temporaries per byte of residual stream)")
    remat = {m["model"]: m for m in measured if m.get("remat") and m.get("scan") and m["preset"] == preset}
    if "vit_l16" not in remat:
      print(f"  {preset:8} no ViT-L/16 scan+remat row: no remat column")
      continue
    m = remat["vit_l16"]
    r = (m["temp_bytes"] - remat_activations("vit_l16", m["batch"] // shards, act)) / (
      4.0 * per_device_params(params["vit_l16"], preset)
    )
    fits[preset] = (g, act, r)
    print(f"  {preset:8} scan+remat: r = {r:.2f} gradient-sized buffers (from ViT-L/16)")
    for name, m in remat.items():
      n = per_device_params(params[name], preset)
      pred = r * 4.0 * n + remat_activations(name, m["batch"] // shards, act)
      print(
        f"  {preset:8} {name:8} scan+remat temp measured {m['temp_bytes'] / GB:6.2f} GB, formula {pred / GB:6.2f} GB"
      )
  print(f"\nglobal batch {a.batch} on 8 x 80 GB (GB = 1e9 bytes per device; on paper):")
  print(f"{'preset':8} {'model':9} {'params':>8} {'state':>8} {'no remat':>9} {'scan+remat':>10}")
  for preset, (g, act, r) in fits.items():
    shape = MESH_SHAPES[preset]
    rows = a.batch // (shape["data"] * shape["fsdp"])
    for name in FAMILY:
      n = per_device_params(params[name], preset)
      state, grads = 12.0 * n, 4.0 * n
      u = units(name, rows)
      plain = state + g * grads + act * u
      remat = state + r * grads + remat_activations(name, rows, act)
      row = {
        "preset": preset,
        "model": name,
        "params": int(counts[name]),
        "rows_per_device": rows,
        "state_bytes": state,
        "no_remat_bytes": plain,
        "scan_remat_bytes": remat,
        "fits_no_remat": bool(plain <= HBM),
        "fits_remat": bool(remat <= HBM),
      }
      rows_out.append(row)
      mark = lambda b: f"{b / GB:7.0f}{'*' if b <= HBM else ' '}"
      print(f"{preset:8} {name:9} {counts[name] / 1e9:7.2f}B {state / GB:7.1f} {mark(plain):>9} {mark(remat):>8}")
    fit = lambda key, fam=[r for r in rows_out if r["preset"] == preset]: max(
      (r for r in fam if r[key]), key=lambda r: r["params"], default={"model": "none"}
    )["model"]
    print(f"  -> largest that fits: {fit('fits_no_remat')} (no remat), {fit('fits_remat')} (scan+remat)   (* fits)")
  if a.out:
    with open(a.out, "w") as f:
      for r in rows_out:
        f.write(json.dumps(r) + "\n")


if __name__ == "__main__":
  main()
