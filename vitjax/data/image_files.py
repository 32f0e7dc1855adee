"""Reading a user's image files for vitjax.data.folder, in parallel processes.

Each file's bytes as they are when the pipeline reads them (JPEG that libjpeg-turbo decodes, PNG in RGB or grayscale),
converted once to RGB when it cannot (EXIF rotation, CMYK, palette, alpha, 16-bit, other formats), or None with the
reason (not a readable image).

Bounded: only regular files are read (opened without blocking, checked with fstat before a byte is read, so a FIFO
or a device put in a file's place is a skip, not a hang), at most ``MAX_FILE_BYTES`` of them, and an image of more
than ``MAX_PIXELS`` pixels (its header says how many) is refused before it is decoded.
"""

from __future__ import annotations

import collections
import concurrent.futures
import io
import multiprocessing
import os
import re
import stat
import warnings
from collections.abc import Iterator, Sequence

import numpy as np
import PIL.Image
import PIL.ImageOps
import simplejpeg

CHUNK = 32  # files per task sent to a worker process (at most)
_ORIENTATION = 0x0112  # EXIF tag
_KEPT_MODES = ("RGB", "L")
MAX_FILE_BYTES = 256 * 2**20  # a bigger file is refused before it is read
MAX_PIXELS = 89_478_485  # PIL's decompression-bomb limit (its default MAX_IMAGE_PIXELS), whatever PIL's is set to
_BLOCK_PIXELS = 2**22  # 16-bit and 32-bit images are scaled to 8 bits this many pixels (whole rows) at a time
_OPEN_FLAGS = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0)


class Skip(Exception):
  """A file that is not read: the message says why (one skip line)."""


def file_kind(mode: int) -> str:
  """What a file that is not a regular one is, in words ('a FIFO (named pipe)', 'a character device', ...)."""
  kinds = (
    (stat.S_ISDIR, "a folder"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
  )
  return next((what for test, what in kinds if test(mode)), "not a regular file")


def read_bytes(path: str, expect: tuple[int, int] | None = None) -> bytes:
  """A regular file's bytes (at most MAX_FILE_BYTES); ``expect``: its (st_dev, st_ino) when it was listed.

  Raises:
    Skip: the file cannot be opened, is not a regular file (checked on the open file: nothing can be swapped in
      between), is another file than the one listed, or is too big.
  """
  try:
    fd = os.open(path, _OPEN_FLAGS)  # O_NONBLOCK: opening a FIFO does not wait for a writer
  except OSError as e:
    raise Skip(f"cannot read the file: {e.strerror or e}") from None
  with open(fd, "rb", closefd=True) as f:
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
      raise Skip(f"{file_kind(st.st_mode)}, not a regular file: not read")
    if expect is not None and (st.st_dev, st.st_ino) != tuple(expect):
      raise Skip("another file is there now than when the folder was listed: not read (prepare again)")
    too_big = f"larger than {MAX_FILE_BYTES // 2**20} MiB (the most an image file may be): not read"
    if st.st_size > MAX_FILE_BYTES:
      raise Skip(too_big)
    try:
      data = f.read(MAX_FILE_BYTES + 1)
    except OSError as e:
      raise Skip(f"cannot read the file: {e.strerror or e}") from None
  if len(data) > MAX_FILE_BYTES:
    raise Skip(too_big)
  return data


def read_image(path: str, expect: tuple[int, int] | None = None) -> tuple[bytes | None, str]:
  """The bytes to store for an image file, and what was done.

  ``(data, 'kept')``, ``(data, 'converted: WHY')``, or ``(None, 'WHY it is skipped')`` for a file that is not a readable
  image (or not read: see read_bytes; ``expect`` is the file's (st_dev, st_ino) when it was listed).
  """
  try:
    data = read_bytes(path, expect)
  except Skip as e:
    return None, str(e)
  if not data:
    return None, "empty file"
  try:
    with warnings.catch_warnings():
      warnings.simplefilter("ignore")  # PIL's palette-transparency warnings; not its decompression-bomb ones:
      warnings.simplefilter("error", PIL.Image.DecompressionBombWarning)  # (_storable checks the size first)
      return _storable(data)
  except Skip as e:
    return None, str(e)
  except (PIL.Image.DecompressionBombError, PIL.Image.DecompressionBombWarning) as e:  # (PIL's check, on opening)
    pixels = re.search(r"\((\d+) pixels\)", str(e))
    return None, _too_many(f"{int(pixels[1]):,} pixels" if pixels else "too many pixels")
  except PIL.UnidentifiedImageError:
    return None, "not an image PIL knows"
  except Exception as e:  # pylint: disable=broad-except  # PIL raises many kinds on a bad file: each is a skip
    text = " ".join(str(e).split()) or type(e).__name__
    return None, text if len(text) < 200 else text[:197] + "..."


def _too_many(pixels: str) -> str:
  """The skip line of an image of too many pixels."""
  return f"{pixels}, more than the {MAX_PIXELS:,} an image may have (PIL's decompression-bomb limit): not decoded"


def _storable(data: bytes) -> tuple[bytes, str]:
  with PIL.Image.open(io.BytesIO(data)) as pil:
    fmt, mode = pil.format, pil.mode
    width, height = pil.size  # from the header: nothing is decoded yet
    if width * height > MAX_PIXELS:  # (where PIL's own limit is higher, or off)
      raise Skip(_too_many(f"{width * height:,} pixels ({width}x{height})"))
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
  integer levels the same where any is above 255, float levels clipped to [0, 255], alpha dropped. An image of wide
  levels is closed once it is read.
  """
  if pil.mode.startswith("I") or pil.mode == "F":  # I;16, I;16B, I (32-bit), F: one channel of wide levels
    wide, pil = pil, _eight_bits(pil)
    wide.close()  # (frees its pixels before the RGB copy is made: 2 bytes a pixel, or 4)
  if not upright:
    pil = PIL.ImageOps.exif_transpose(pil)
  return pil if pil.mode == "RGB" else pil.convert("RGB")


def _eight_bits(pil: PIL.Image.Image) -> PIL.Image.Image:
  """A one-channel image of wide levels as 8-bit ``L``, scaled a block of rows at a time (bounded memory).

  Whole, in float64, a 9000x9000 16-bit PNG took a reading process to 2.2 GB; by blocks, to 0.6 GB.
  """
  width, height = pil.size
  wide = pil.mode.startswith("I;16") or (pil.mode == "I" and pil.getextrema()[1] > 255)  # (32-bit: as 16-bit)
  out = np.empty((height, width), np.uint8)
  rows = max(1, _BLOCK_PIXELS // max(width, 1))
  for top in range(0, height, rows):
    block = np.asarray(pil.crop((0, top, width, min(height, top + rows))))
    if wide:  # round(x / 257) in integers (x / 257 is never halfway)
      block = (block.astype(np.int64) + 128) // 257
    elif block.dtype.kind == "f":
      block = np.round(block)
    out[top : top + rows] = np.clip(block, 0, 255)
  return PIL.Image.fromarray(out)


def _read_chunk(items: Sequence[str | tuple[str, tuple[int, int] | None]]) -> list[tuple[bytes | None, str]]:
  """read_image of each path, or of each (path, its (st_dev, st_ino) when listed)."""
  return [read_image(item) if isinstance(item, str) else read_image(*item) for item in items]


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


def map_chunks(chunks: list[list], workers: int) -> Iterator[list[tuple[bytes | None, str]]]:
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
