"""Input pipeline throughput: images/s of vitjax's grain training pipeline per core, the bytes a batch ships to the
devices, what the device-side part (normalisation, Mixup/CutMix) costs, and the per-image cost of an ImageNet-like
JPEG path.

Commands (experiments/README.md has the results; `--tag` names the code measured, so the same script measures a
checkout before a change, with PYTHONPATH pointing at it):

    python -m vitjax.data.prepare --dataset=fashion_mnist --data_dir=/work/runs/tfds
    taskset -c 0 python experiments/bench_input.py --data_dir=/work/runs/tfds --workers=0 --tag=after
    taskset -c 0,1 python experiments/bench_input.py --data_dir=/work/runs/tfds --workers=2 --tag=after
    taskset -c 1 python experiments/bench_input.py --data_dir=/work/runs/tfds --workers=0 --cache --tag=cache

Rows (JSON lines appended to experiments/results/bench_input.jsonl):
  fashion_mnist: the Fashion-MNIST ViT config's input (28 px, batch 128) with random-resized crop, flip,
    RandAugment(2, 9) and Mixup 0.8 / CutMix 1.0 (heavier than the config's flip only, to load the host).
  jpeg: a 500x375 and a 1024x768 RGB JPEG (quality 90) through decode, random-resized crop to 224, flip, and
    optionally RandAugment, per image in this process: ms per image and images/s per core, for PIL's full decode
    (decoder=pil, the path before) and for the pipeline's transform (decoder=vitjax: simplejpeg, DCT-scaled).
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
    **({"cache": True} if args.cache else {}),
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


def _photo_jpeg(width: int, height: int) -> bytes:
  import PIL.Image

  r = np.random.default_rng(0)
  small = r.integers(0, 256, (24, 32, 3), dtype=np.uint8)  # smooth content that compresses like a photo
  photo = np.asarray(PIL.Image.fromarray(small).resize((width, height), PIL.Image.BICUBIC))
  photo = np.clip(photo + r.normal(0, 8, photo.shape), 0, 255).astype(np.uint8)
  buf = io.BytesIO()
  PIL.Image.fromarray(photo).save(buf, format="JPEG", quality=90)
  return buf.getvalue()


def jpeg(args) -> list[dict]:
  """Per image, in this process: 'pil' is the path before the encoded-image reader (PIL's full decode, then the
  crop); 'vitjax' is the training pipeline's own per-image transform (images._TrainPreprocess: the crop drawn
  from the header, simplejpeg decoding at the smallest DCT scale that keeps the crop's resolution)."""
  import PIL.Image

  from vitjax.data import augment, images

  rows = []
  for width, height in ((500, 375), (1024, 768)):
    data = _photo_jpeg(width, height)
    for with_ra in (False, True):
      aug = augment.parse_augment({"random_resized_crop": True, "flip": True, "randaugment": None})
      if with_ra:
        aug = augment.parse_augment({"random_resized_crop": True, "flip": True, "randaugment": True})
      transform = images._TrainPreprocess((224, 224), 3, aug)
      example = {"image": data, "label": 0, "mask": True, "index": 0}

      def pil_path(r, aug=aug, data=data):
        image = np.asarray(PIL.Image.open(io.BytesIO(data)).convert("RGB"))
        box = augment.random_resized_crop_box(r, *image.shape[:2], *aug.random_resized_crop)
        image = augment.resize(image, (224, 224), box=box)
        if r.random() < 0.5:
          image = image[:, ::-1]
        if aug.randaugment is not None:
          image = augment.randaugment(np.ascontiguousarray(image), r, *aug.randaugment)

      paths = {"pil": pil_path, "vitjax": lambda r, t=transform, e=example: t.random_map(e, r)}
      for decoder in ("pil", "vitjax", "pil", "vitjax"):  # interleaved: this machine's speed drifts
        r = np.random.default_rng(0)  # the same crops for both decoders
        t0 = time.perf_counter()
        for _ in range(args.images):
          paths[decoder](r)
        ms = (time.perf_counter() - t0) / args.images * 1e3
        path = "decode+rrc+flip" + ("+randaugment" if with_ra else "")
        rows.append({"path": path, "decoder": decoder, "photo": f"{width}x{height}", "ms_per_image": ms})
    for decoder, decode in (
      ("pil", lambda d=data: np.asarray(PIL.Image.open(io.BytesIO(d)).convert("RGB"))),
      ("vitjax", lambda d=data: augment.decode(d, 3)),
    ):
      t0 = time.perf_counter()
      for _ in range(args.images):
        decode()
      ms = (time.perf_counter() - t0) / args.images * 1e3
      rows.append({"path": "decode only", "decoder": decoder, "photo": f"{width}x{height}", "ms_per_image": ms})
  for row in rows:
    row["images_per_s_per_core"] = 1e3 / row["ms_per_image"]
  return rows


def main():
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--data_dir", required=True)
  p.add_argument("--workers", type=int, default=0, help="grain worker processes")
  p.add_argument("--read_threads", type=int, default=0)
  p.add_argument("--cache", action="store_true", help="data.cache: the split read into memory first")
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
    "cache": args.cache,
    "cpu": platform.processor() or platform.machine(),
    "command": " ".join([os.path.basename(sys.executable)] + sys.argv),
  }
  rows = [{"row": "fashion_mnist", "batch": args.batch, **fashion_mnist(args)}]
  if args.workers == 0 and not args.cache:  # per image, in this process: independent of the worker count
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
