"""Bytes per device of a ViT training step under each sharding preset, from XLA's own accounting.

    XLA_FLAGS=--xla_force_host_platform_device_count=8 JAX_PLATFORMS=cpu \
      python experiments/sharding_memory.py --models=vit_b16,vit_l16,vit_h14 --batch=64 \
      --out=experiments/results/sharding_memory.jsonl
    ... --models=vit_l16 --presets=dp,tp --remat [--scan]   # blocks rematerialised [and scanned]

For each model and preset it lowers and compiles the real training step (vitjax.train.step, AdamW, float32) on 8
devices and reads `compiled.memory_analysis()`: argument bytes (the state and the batch), output bytes (the new
state, donated into the arguments' buffers) and temporaries (activations, gradients), per device. Nothing runs.
Rows go to --out as JSON lines; the table is printed.
"""

from __future__ import annotations

import argparse
import json
import time

import jax
import ml_collections as mlc

from vitjax import tasks
from vitjax.config import default_config
from vitjax.train import state as state_lib
from vitjax.train.step import make_train_step

MESHES = {
  "dp": (("data", -1),),
  "fsdp": (("fsdp", -1),),
  "tp": (("data", 2), ("tensor", 4)),
  "fsdp_tp": (("fsdp", 2), ("tensor", 4)),
}


def analyse(model: str, preset: str, batch: int, image: int, remat: bool = False, scan: bool = False) -> dict:
  c = default_config()
  c.model = mlc.ConfigDict({"name": model, "num_classes": 1000, "remat": remat, "scan": scan})
  c.batch_size, c.sharding, c.mesh = batch, preset, MESHES[preset]
  task = tasks.get(c, "/nonexistent", described={"image_size": [image, image], "channels": 3, "num_classes": 1000})
  exp = state_lib.setup(c, task, total_steps=1000)
  step = jax.jit(
    make_train_step(exp.model, exp.tx, exp.schedule, c, task, exp.state_sharding.params),
    in_shardings=(exp.state_sharding, exp.batch_sharding),
    out_shardings=(exp.state_sharding, None),
    donate_argnums=0,
  )
  images = jax.ShapeDtypeStruct((batch, image, image, 3), jax.numpy.float32, sharding=exp.batch_sharding)
  labels = jax.ShapeDtypeStruct((batch,), jax.numpy.int32, sharding=exp.batch_sharding)
  t = time.time()
  with jax.set_mesh(exp.mesh):
    compiled = step.lower(exp.abstract_state, {"image": images, "label": labels}).compile()
  m = compiled.memory_analysis()
  params = sum(a.size for a in jax.tree.leaves(exp.abstract_state.params))
  return {
    "model": model,
    "preset": preset,
    "mesh": dict(exp.mesh.shape),
    "batch": batch,
    "image": image,
    "remat": remat,
    "scan": scan,
    "params": int(params),
    "argument_bytes": int(m.argument_size_in_bytes),
    "output_bytes": int(m.output_size_in_bytes),
    "alias_bytes": int(m.alias_size_in_bytes),
    "temp_bytes": int(m.temp_size_in_bytes),
    "compile_s": round(time.time() - t, 1),
    "devices": jax.device_count(),
    "platform": jax.devices()[0].platform,
  }


def main():
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--models", default="vit_b16,vit_l16")
  p.add_argument("--presets", default=",".join(MESHES))
  p.add_argument("--batch", type=int, default=64)
  p.add_argument("--image", type=int, default=224)
  p.add_argument("--remat", action="store_true", help="rematerialise each block (config.model.remat)")
  p.add_argument("--scan", action="store_true", help="scan over the blocks (config.model.scan)")
  p.add_argument("--out", default=None)
  a = p.parse_args()
  rows = []
  print(f"{'model':8} {'preset':8} {'args GiB':>9} {'out GiB':>8} {'alias':>8} {'temp GiB':>9}  (per device)")
  for model in a.models.split(","):
    for preset in a.presets.split(","):
      r = analyse(model, preset, a.batch, a.image, a.remat, a.scan)
      rows.append(r)
      g = lambda k, r=r: r[k] / 2**30
      print(
        f"{model:8} {preset:8} {g('argument_bytes'):9.3f} {g('output_bytes'):8.3f} {g('alias_bytes'):8.3f} "
        f"{g('temp_bytes'):9.3f}",
        flush=True,
      )
      if a.out:
        with open(a.out, "a") as f:
          f.write(json.dumps(r) + "\n")


if __name__ == "__main__":
  main()
