"""Reading a user's image files for vitjax.data.folder, in parallel processes.

Each file's bytes as they are when the pipeline reads them (JPEG that libjpeg-turbo decodes, PNG in RGB or grayscale),
converted once to RGB when it cannot (EXIF rotation, CMYK, palette, alpha, 16-bit, other formats), or None with the
reason (not a readable image).
"""

from __future__ import annotations

import collections
import concurrent.futures
import io
import multiprocessing
import os
import warnings
from collections.abc import Iterator, Sequence

import numpy as np
import PIL.Image
import PIL.ImageOps
import simplejpeg

CHUNK = 32  # files per task sent to a worker process (at most)
_ORIENTATION = 0x0112  # EXIF tag
_KEPT_MODES = ("RGB", "L")


def read_image(path: str) -> tuple[bytes | None, str]:
  """The bytes to store for an image file, and what was done.

  ``(data, 'kept')``, ``(data, 'converted: WHY')``, or ``(None, 'WHY it is skipped')`` for a file that is not a readable
  image.
  """
  try:
    with open(path, "rb") as f:
      data = f.read()
  except OSError as e:
    return None, f"cannot read the file: {e.strerror or e}"
  if not data:
    return None, "empty file"
  try:
    with warnings.catch_warnings():
      warnings.simplefilter("ignore")  # PIL's palette-transparency and decompression-bomb warnings
      return _storable(data)
  except PIL.UnidentifiedImageError:
    return None, "not an image PIL knows"
  except Exception as e:  # pylint: disable=broad-except  # PIL raises many kinds on a bad file: each is a skip
    text = " ".join(str(e).split()) or type(e).__name__
    return None, text if len(text) < 200 else text[:197] + "..."


def _storable(data: bytes) -> tuple[bytes, str]:
  with PIL.Image.open(io.BytesIO(data)) as pil:
    fmt, mode = pil.format, pil.mode
    orientation = pil.getexif().get(_ORIENTATION, 1)
    upright = orientation not in range(2, 9)  # 2..8: mirrored or rotated
    is_jpeg = fmt in ("JPEG", "MPO")
    why = None
    if is_jpeg and mode in _KEPT_MODES and upright:
      try:  # decodes every coefficient (at 1/8 scale: a check, not a full decode); a warning is an error
        simplejpeg.decode_jpeg(data, colorspace="RGB", min_height=1, min_width=1)
        return data, "kept"
      except ValueError as e:
        why = f"libjpeg-turbo: {e}"
    pil.load()  # a truncated or corrupt file fails here
    if fmt == "PNG" and mode in _KEPT_MODES and upright:
      return data, "kept"
    if why is None:
      why = f"EXIF orientation {orientation}" if not upright else f"{fmt} {mode}" if mode not in _KEPT_MODES else fmt
    rgb = _to_rgb(pil, upright)
  out = io.BytesIO()
  if is_jpeg:
    rgb.save(out, format="JPEG", quality=95)
  else:
    rgb.save(out, format="PNG", compress_level=3)
  return out.getvalue(), f"converted: {why}"


def _to_rgb(pil: PIL.Image.Image, upright: bool) -> PIL.Image.Image:
  """An RGB image of a decoded PIL image.

  Turned upright by its EXIF orientation, 16-bit levels scaled to 8 bits (65535 -> 255: the same scale for every
  image, whatever its own brightest pixel; before, 200 stayed 200 in one image and became 1 in another), 32-bit
  integer levels the same where any is above 255, float levels clipped to [0, 255], alpha dropped.
  """
  if not upright:
    pil = PIL.ImageOps.exif_transpose(pil)
  if pil.mode.startswith("I") or pil.mode == "F":  # I;16, I;16B, I (32-bit), F: one channel of wide levels
    levels = np.asarray(pil).astype(np.float64)
    if pil.mode.startswith("I;16") or (pil.mode == "I" and levels.size and levels.max() > 255):
      levels = levels / 257.0  # 0..65535 -> 0..255
    pil = PIL.Image.fromarray(np.clip(np.round(levels), 0, 255).astype(np.uint8))
  return pil if pil.mode == "RGB" else pil.convert("RGB")


def _read_chunk(paths: Sequence[str]) -> list[tuple[bytes | None, str]]:
  return [read_image(p) for p in paths]


def default_workers() -> int:
  """The CPUs this process may run on (``taskset`` counts)."""
  try:
    return len(os.sched_getaffinity(0))
  except AttributeError:  # not Linux
    return os.cpu_count() or 1


def _start_method() -> str | None:
  """The reading processes' start method: fork, unless JAX's runtime already runs threads in this process.

  Fork has nothing to import again. JAX runs threads when prepare() is called from a test or a notebook after a
  computation: forking those can deadlock, so then forkserver.
  """
  methods = multiprocessing.get_all_start_methods()
  if "fork" not in methods:
    return None
  try:
    from jax._src import xla_bridge  # pylint: disable=g-import-not-at-top

    started = xla_bridge.backends_are_initialized()
  except (ImportError, AttributeError):
    started = True
  if not started:
    return "fork"
  return "forkserver" if "forkserver" in methods else "spawn"


def map_chunks(chunks: list[list[str]], workers: int) -> Iterator[list[tuple[bytes | None, str]]]:
  """_read_chunk over chunks, in order; in ``workers`` processes (at most 4 chunks each in flight) when > 1."""
  if workers <= 1 or len(chunks) < 2:
    yield from map(_read_chunk, chunks)
    return
  context = multiprocessing.get_context(_start_method())
  with concurrent.futures.ProcessPoolExecutor(min(workers, len(chunks)), mp_context=context) as pool:
    pending = collections.deque()
    todo = iter(chunks)
    for chunk in todo:
      pending.append(pool.submit(_read_chunk, chunk))
      if len(pending) >= 4 * workers:
        break
    while pending:
      result = pending.popleft().result()
      chunk = next(todo, None)
      if chunk is not None:
        pending.append(pool.submit(_read_chunk, chunk))
      yield result
