"""Input pipeline throughput: images/s of vitjax's grain training pipeline per core, the bytes a batch ships to the
devices, what the device-side part (normalisation, Mixup/CutMix) costs, and the per-image cost of an ImageNet-like
JPEG path.

Commands (experiments/README.md has the results; `--tag` names the code measured, so the same script measures a
checkout before a change, with PYTHONPATH pointing at it):

    python -m vitjax.data.prepare --dataset=fashion_mnist --data_dir=/work/runs/tfds
    taskset -c 0 python experiments/bench_input.py --data_dir=/work/runs/tfds --workers=0 --tag=after
    taskset -c 0,1 python experiments/bench_input.py --data_dir=/work/runs/tfds --workers=2 --tag=after

Rows (JSON lines appended to experiments/results/bench_input.jsonl):
  fashion_mnist: the Fashion-MNIST ViT config's input (28 px, batch 128) with random-resized crop, flip,
    RandAugment(2, 9) and Mixup 0.8 / CutMix 1.0 (heavier than the config's flip only, to load the host).
  jpeg: one 500x375 RGB JPEG (quality 90) through decode, random-resized crop to 224, flip, and optionally
    RandAugment, per image in this process: ms per image and images/s per core.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import sys
import time

import numpy as np

AUG = {
  "random_resized_crop": True,
  "flip": True,
  "randaugment": {"num_layers": 2, "magnitude": 9},
  "mixup_alpha": 0.8,
  "cutmix_alpha": 1.0,
}


def fashion_mnist(args) -> dict:
  import jax

  from vitjax.data import augment, make_input

  it, info = make_input(
    "fashion_mnist",
    "train",
    global_batch_size=args.batch,
    image_size=28,
    train=True,
    data_dir=args.data_dir,
    augment=AUG,
    worker_count=args.workers,
    read_threads=args.read_threads,
  )
  for _ in range(args.warmup):
    batch = next(it)
  t0 = time.perf_counter()
  for _ in range(args.batches):
    batch = next(it)
  seconds = time.perf_counter() - t0
  row = {
    "images_per_s": args.batches * args.batch / seconds,
    "batch_bytes": int(sum(np.asarray(v).nbytes for k, v in batch.items() if k in ("image", "label"))),
    "image_dtype": str(batch["image"].dtype),
    "label_shape": list(batch["label"].shape),
  }
  try:  # the device's share: normalisation and Mixup/CutMix in one jitted function (absent before issue 13)
    from vitjax.data import device_ops
  except ImportError:
    device_ops = None
  if device_ops is not None:
    aug = augment.parse_augment(AUG)
    f = jax.jit(lambda x, y, k: device_ops.mix_batch(device_ops.to_float(x), y, 10, aug, k))
    x, y = jax.device_put(batch["image"]), jax.device_put(batch["label"])
    jax.block_until_ready(f(x, y, jax.random.key(0)))
    t0 = time.perf_counter()
    for i in range(50):
      out = f(x, y, jax.random.key(i))
    jax.block_until_ready(out)
    row["device_ms_per_batch"] = (time.perf_counter() - t0) / 50 * 1e3
  return row


def jpeg(args) -> list[dict]:
  import PIL.Image

  from vitjax.data import augment

  r = np.random.default_rng(0)
  small = r.integers(0, 256, (24, 32, 3), dtype=np.uint8)  # smooth content that compresses like a photo
  photo = np.asarray(PIL.Image.fromarray(small).resize((500, 375), PIL.Image.BICUBIC))
  photo = np.clip(photo + r.normal(0, 8, photo.shape), 0, 255).astype(np.uint8)
  buf = io.BytesIO()
  PIL.Image.fromarray(photo).save(buf, format="JPEG", quality=90)
  data = buf.getvalue()
  rows = []
  for with_ra in (False, True):
    n = args.images
    t0 = time.perf_counter()
    for _ in range(n):
      image = np.asarray(PIL.Image.open(io.BytesIO(data)).convert("RGB"))
      box = augment.random_resized_crop_box(r, *image.shape[:2], (0.08, 1.0), (3 / 4, 4 / 3))
      image = augment.resize(image, (224, 224), box=box)
      if r.random() < 0.5:
        image = image[:, ::-1]
      if with_ra:
        image = augment.randaugment(np.ascontiguousarray(image), r, 2, 9)
    ms = (time.perf_counter() - t0) / n * 1e3
    rows.append({"path": "decode+rrc+flip" + ("+randaugment" if with_ra else ""), "ms_per_image": ms})
  t0 = time.perf_counter()
  for _ in range(args.images):
    np.asarray(PIL.Image.open(io.BytesIO(data)).convert("RGB"))
  rows.append({"path": "decode only", "ms_per_image": (time.perf_counter() - t0) / args.images * 1e3})
  for row in rows:
    row["images_per_s_per_core"] = 1e3 / row["ms_per_image"]
  return rows


def main():
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--data_dir", required=True)
  p.add_argument("--workers", type=int, default=0, help="grain worker processes")
  p.add_argument("--read_threads", type=int, default=0)
  p.add_argument("--batch", type=int, default=128)
  p.add_argument("--batches", type=int, default=40)
  p.add_argument("--warmup", type=int, default=5)
  p.add_argument("--images", type=int, default=200, help="JPEG images timed per path")
  p.add_argument("--tag", default="", help="names the code measured (e.g. before / after)")
  p.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results", "bench_input.jsonl"))
  args = p.parse_args()
  cores = len(os.sched_getaffinity(0))
  common = {
    "tag": args.tag,
    "cores": cores,
    "workers": args.workers,
    "read_threads": args.read_threads,
    "cpu": platform.processor() or platform.machine(),
    "command": " ".join([os.path.basename(sys.executable)] + sys.argv),
  }
  rows = [{"row": "fashion_mnist", "batch": args.batch, **fashion_mnist(args)}]
  if args.workers == 0:  # per image, in this process: independent of the worker count
    rows += [{"row": "jpeg", **r} for r in jpeg(args)]
  with open(args.out, "a") as f:
    for row in rows:
      row = {**row, **common}
      if "images_per_s" in row:
        row["images_per_s_per_core"] = row["images_per_s"] / cores
      print(json.dumps(row))
      f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
  main()
