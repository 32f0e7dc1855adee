"""How fast `python -m vitjax.data.prepare --dataset=folder:PATH` turns a folder of images into a dataset.

Generates NUM images (default 20,000) in 10 class folders of a temporary directory: sides drawn from 64..512 px,
smooth random content with noise (so that JPEG sizes are those of photos, not of noise), and this mix of kinds:
84% RGB JPEG (quality 90), 5% grayscale JPEG, 5% RGB PNG, 2% RGBA PNG (converted), 2% EXIF-rotated JPEG
(converted), 1% BMP (converted), 1% truncated JPEG (skipped). Then times the prepare command as a user runs it
(a subprocess, from its start to its exit: interpreter start and imports included) and prints images/s.

    taskset -c 0,1 python experiments/bench_folder_prepare.py [--num=20000] [--workers=2] [--keep]

Prints one JSON line: {"images", "bytes", "workers", "seconds", "images_per_s", "prepared", ...}.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np
import PIL.Image

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KINDS = (  # (kind, share in 1000)
  ("jpeg", 840),
  ("gray_jpeg", 50),
  ("png", 50),
  ("rgba_png", 20),
  ("rotated_jpeg", 20),
  ("bmp", 10),
  ("truncated_jpeg", 10),
)


def _kind(i: int) -> str:
  slot = (i * 7919) % 1000  # spread the kinds over the classes
  for kind, share in KINDS:
    if slot < share:
      return kind
    slot -= share
  return "jpeg"


def _picture(rng: np.random.Generator, h: int, w: int) -> np.ndarray:
  coarse = rng.integers(0, 256, (max(h // 32, 2), max(w // 32, 2), 3), np.uint8)
  smooth = np.asarray(PIL.Image.fromarray(coarse).resize((w, h), PIL.Image.BICUBIC), np.int16)
  return np.clip(smooth + rng.integers(-12, 13, (h, w, 3)), 0, 255).astype(np.uint8)


def _write(args) -> int:
  """Writes images [start, stop) under root; returns their bytes."""
  root, start, stop = args
  total = 0
  for i in range(start, stop):
    rng = np.random.default_rng(i)
    h, w = (int(x) for x in rng.integers(64, 513, 2))
    pil = PIL.Image.fromarray(_picture(rng, h, w))
    kind = _kind(i)
    buf = io.BytesIO()
    if kind == "jpeg":
      pil.save(buf, "JPEG", quality=90)
    elif kind == "gray_jpeg":
      pil.convert("L").save(buf, "JPEG", quality=90)
    elif kind == "png":
      pil.save(buf, "PNG")
    elif kind == "rgba_png":
      pil.convert("RGBA").save(buf, "PNG")
    elif kind == "rotated_jpeg":
      exif = PIL.Image.Exif()
      exif[0x0112] = 6
      pil.save(buf, "JPEG", quality=90, exif=exif.tobytes())
    elif kind == "bmp":
      pil.save(buf, "BMP")
    else:  # truncated
      pil.save(buf, "JPEG", quality=90)
      buf = io.BytesIO(buf.getvalue()[: buf.tell() // 2])
    ext = {"png": "png", "rgba_png": "png", "bmp": "bmp"}.get(kind, "jpg")
    data = buf.getvalue()
    with open(os.path.join(root, f"class_{i % 10}", f"{i:06d}.{ext}"), "wb") as f:
      f.write(data)
    total += len(data)
  return total


def generate(root: str, num: int, workers: int) -> int:
  for c in range(10):
    os.makedirs(os.path.join(root, f"class_{c}"), exist_ok=True)
  step = 250
  jobs = [(root, s, min(s + step, num)) for s in range(0, num, step)]
  with concurrent.futures.ProcessPoolExecutor(workers) as pool:
    return sum(pool.map(_write, jobs))


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--num", type=int, default=20000)
  parser.add_argument("--workers", type=int, default=None, help="prepare's --workers (default: its own)")
  parser.add_argument("--dir", default=None, help="where to generate (default: a temporary directory)")
  parser.add_argument("--keep", action="store_true", help="keep the generated images and the dataset")
  args = parser.parse_args()
  tmp = args.dir or tempfile.mkdtemp(prefix="bench_folder_")
  images, data_dir = os.path.join(tmp, "images"), os.path.join(tmp, "tfds")
  try:
    start = time.perf_counter()
    nbytes = generate(images, args.num, len(os.sched_getaffinity(0)))
    generated = time.perf_counter() - start
    print(f"generated {args.num} images ({nbytes / 2**20:.0f} MiB) in {generated:.0f} s", file=sys.stderr)
    cmd = [sys.executable, "-m", "vitjax.data.prepare", f"--dataset=folder:{images}", f"--data_dir={data_dir}"]
    if args.workers:
      cmd.append(f"--workers={args.workers}")
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    sys.stderr.write(proc.stderr)
    if proc.returncode:
      raise SystemExit(f"prepare failed with exit status {proc.returncode}")
    prepared = re.search(r"prepared .*: (\{.*\}) in ([\d.]+)s", proc.stderr)
    out = {
      "images": args.num,
      "bytes": nbytes,
      "workers": args.workers or len(os.sched_getaffinity(0)),
      "seconds": round(seconds, 1),
      "images_per_s": round(args.num / seconds, 1),
      "prepared": prepared.group(1) if prepared else None,
      "seconds_in_prepare": float(prepared.group(2)) if prepared else None,
      "cpus": len(os.sched_getaffinity(0)),
    }
    print(json.dumps(out))
  finally:
    if args.keep:
      print(f"kept {tmp}", file=sys.stderr)
    elif not args.dir:
      shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
  main()
