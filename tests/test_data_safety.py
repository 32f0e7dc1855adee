"""Hostile folder and CSV datasets (vitjax.data.folder, issue 76): link loops, FIFOs, a link to /dev/zero, files
outside the dataset's folder, control characters in file names, a decompression bomb, a file too big to read.

Every case is made of real files (os.symlink, os.mkfifo, /dev/zero, PNGs written by PIL). The command line runs in
its own process group with a timeout and an 8 GiB address-space limit, so a regression fails (a timeout, a
MemoryError) rather than hanging the suite or filling the machine's memory.
"""

import json
import os
import resource
import signal
import subprocess
import sys
import textwrap
import threading

import numpy as np
import PIL.Image
import pytest
import train_helpers as th

from vitjax.data import folder, image_files, split_info
from vitjax.data import prepare as prepare_lib
from vitjax.data.splits import open_split
from vitjax.errors import ConfigError

_ADDRESS_SPACE = 8 << 30  # the command lines' limit (RLIMIT_AS): preparing takes ~0.2 GiB of memory, ~3 of space

# Runs argv[1:] and writes {"rc", "peak_mb"} (the child's peak resident memory) to stdout's last line; stderr passes.
_MEASURE = textwrap.dedent(
  """
  import json, resource, subprocess, sys
  rc = subprocess.run(sys.argv[1:]).returncode
  peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss // 1024
  print(json.dumps({"rc": rc, "peak_mb": peak}))
  """
)


def _limit():
  resource.setrlimit(resource.RLIMIT_AS, (_ADDRESS_SPACE, _ADDRESS_SPACE))


def _run(args, timeout=120):
  """(exit status, stderr, peak resident MiB) of ``python ARGS``, in its own process group; fails after timeout s."""
  proc = subprocess.Popen(
    [sys.executable, "-c", _MEASURE, sys.executable, *args],
    cwd=th.ROOT,
    env=th.env(),
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
    text=True,
    start_new_session=True,
    preexec_fn=_limit,
  )
  try:
    out, err = proc.communicate(timeout=timeout)
  except subprocess.TimeoutExpired:
    os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate()
    pytest.fail(f"python {' '.join(args)} did not finish in {timeout} s")
  result = json.loads(out.strip().splitlines()[-1])
  return result["rc"], err, result["peak_mb"]


def _prepare(source, data_dir, *flags, timeout=120):
  """(exit status, stderr, peak MiB) of ``python -m vitjax.data.prepare`` for a source, read by one process."""
  return _run(["-m", "vitjax.data.prepare", f"--dataset={source}", f"--data_dir={data_dir}", "--workers=1", *flags])


def _png(path, h, w=9):
  """An RGB PNG of h x w pixels (each test image has a size of its own: the stored sizes say which were read)."""
  os.makedirs(os.path.dirname(path), exist_ok=True)
  PIL.Image.fromarray(np.full((h, w, 3), h * 7 % 256, np.uint8)).save(path)


def _skipped(name, data_dir):
  """The lines of the prepared source's skipped.txt, each as (name, why) (exactly one tab each)."""
  builder = folder.get_builder(folder.parse(name), data_dir)
  with open(os.path.join(builder.data_dir, folder.SKIPPED_FILE), encoding="utf-8") as f:
    lines = f.read().split("\n")
  assert lines[-1] == "", lines
  parts = [line.split("\t") for line in lines[:-1]]
  assert all(len(p) == 2 for p in parts), lines
  return [tuple(p) for p in parts]


def _stored(name, data_dir):
  """{stored image height: label} of the train split (each test image has a height of its own)."""
  source, _ = open_split(name, "train", data_dir)
  heights = [int(source[i]["image"].shape[0]) for i in range(len(source))]
  assert len(set(heights)) == len(heights), sorted(heights)  # each file once
  return {h: int(source[i]["label"]) for i, h in enumerate(heights)}


# ------------------------------------------------------------------ links: loops, files met twice


def test_a_link_loop_is_not_followed_and_each_file_is_read_once(tmp_path):
  """a/up -> .. (the dataset's folder) is a loop: before, preparing followed it until paths grew too long (60 files
  made 2,460 examples, half of b's labelled a) with one skip line. A file or folder linked into another class is
  read once, in its own class."""
  src = tmp_path / "pets"
  for i in range(6):
    _png(str(src / "a" / f"{i}.png"), 10 + i)
    _png(str(src / "b" / f"{i}.png"), 20 + i)
  _png(str(src / "b" / "sub" / "x.png"), 30)
  os.symlink("..", src / "a" / "up")
  os.symlink("../b/0.png", src / "a" / "same.png")  # b's file, linked into a
  os.symlink("../b/sub", src / "a" / "bsub")  # b's folder, linked into a
  os.symlink("self", src / "b" / "self")  # a link to itself
  name, data_dir = f"folder:{src}", str(tmp_path / "tfds")
  prepare_lib.prepare(name, data_dir, workers=1)
  assert _stored(name, data_dir) == {**{10 + i: 0 for i in range(6)}, **{20 + i: 1 for i in range(6)}, 30: 1}
  assert sorted(_skipped(name, data_dir)) == [
    ("a/bsub/x.png", "the same file as b/sub/x.png: read once"),
    ("a/same.png", "the same file as b/0.png: read once"),
    ("a/up", f"a link to {os.path.realpath(src)}, a folder above it (a loop): not followed"),
    ("b/self", "cannot follow the link: Too many levels of symbolic links"),
  ]


# ------------------------------------------------------------------ FIFOs and devices


def test_a_fifo_is_skipped_not_waited_on(tmp_path):
  """Before, opening a FIFO in a class folder waited for a writer: preparing hung with no output."""
  src = tmp_path / "pets"
  for cls, h in (("a", 10), ("b", 11)):
    _png(str(src / cls / "0.png"), h)
  os.mkfifo(src / "a" / "pipe")
  rc, err, _ = _prepare(f"folder:{src}", tmp_path / "tfds")
  assert rc == 0, err
  assert "skipped 1 of 3 files" in err and "a/pipe: a FIFO (named pipe), not a regular file: not read" in err, err
  assert _skipped(f"folder:{src}", str(tmp_path / "tfds")) == [
    ("a/pipe", "a FIFO (named pipe), not a regular file: not read")
  ]


def _read_in_thread(*args):
  """read_image(*args) in a thread that may not take more than 20 s (a blocked open of a FIFO is then released)."""
  got = []
  thread = threading.Thread(target=lambda: got.append(image_files.read_image(*args)), daemon=True)
  thread.start()
  thread.join(20)
  if thread.is_alive():  # opening the FIFO waits for a writer: be one, so that the thread ends
    os.close(os.open(args[0], os.O_WRONLY | os.O_NONBLOCK))
    thread.join(20)
    pytest.fail(f"read_image{args} waited on a FIFO")
  return got[0]


def test_a_file_swapped_for_a_fifo_after_the_scan_is_not_waited_on(tmp_path):
  """The reader checks the file it opened (without blocking), not only what the scan saw."""
  path = str(tmp_path / "a.png")
  _png(path, 8)
  st = os.stat(path)
  os.rename(path, path + ".old")  # (kept: its inode is not taken by the next file)
  os.mkfifo(path)
  assert _read_in_thread(path) == (None, "a FIFO (named pipe), not a regular file: not read")
  os.remove(path)
  _png(path, 9)  # another file where the scanned one was
  data, why = _read_in_thread(path, (st.st_dev, st.st_ino))
  assert data is None and why.startswith("another file is there now"), why


@pytest.mark.skipif(not os.path.exists("/dev/zero"), reason="no /dev/zero")
def test_a_link_to_dev_zero_is_not_read(tmp_path):
  """Before, a class folder's link to /dev/zero was read until memory ran out (a MemoryError traceback)."""
  src = tmp_path / "pets"
  for cls, h in (("a", 10), ("b", 11)):
    _png(str(src / cls / "0.png"), h)
  os.symlink("/dev/zero", src / "a" / "zero.png")
  name = f"folder:{src}"
  for flags, why in (
    (
      (),
      "a link to /dev/zero, outside the dataset's folder: not read (prepare with --allow_outside_root to read such files)",
    ),
    (("--allow_outside_root",), "a character device, not a regular file: not read"),
  ):
    data_dir = str(tmp_path / f"tfds{len(flags)}")
    rc, err, peak = _prepare(name, data_dir, *flags)
    assert rc == 0 and "Traceback" not in err, err
    assert _skipped(name, data_dir) == [("a/zero.png", why)] and peak < 600, (flags, peak)
    assert split_info(name, "train", data_dir)["num_examples"] == 2


# ------------------------------------------------------------------ outside the dataset's folder


def test_links_outside_the_folder_are_skipped_unless_allowed(tmp_path):
  """A file linked from elsewhere is a skip line; a class folder linked from elsewhere is an error that names the
  fix; with allow_outside_root both are read."""
  src, elsewhere = tmp_path / "pets", tmp_path / "elsewhere"
  for cls, h in (("a", 10), ("b", 11)):
    _png(str(src / cls / "0.png"), h)
  _png(str(elsewhere / "x.png"), 12)
  _png(str(elsewhere / "cats" / "y.png"), 13)
  os.symlink(elsewhere / "x.png", src / "a" / "x.png")
  name = f"folder:{src}"
  prepare_lib.prepare(name, str(tmp_path / "tfds"), workers=1)
  assert _stored(name, str(tmp_path / "tfds")) == {10: 0, 11: 1}
  outside = f"a link to {os.path.realpath(elsewhere / 'x.png')}, outside the dataset's folder: not read"
  assert _skipped(name, str(tmp_path / "tfds")) == [
    ("a/x.png", f"{outside} (prepare with --allow_outside_root to read such files)")
  ]
  prepare_lib.prepare(name, str(tmp_path / "allowed"), workers=1, allow_outside_root=True)
  assert _stored(name, str(tmp_path / "allowed")) == {10: 0, 11: 1, 12: 0}
  os.symlink(elsewhere / "cats", src / "c")
  with pytest.raises(
    ConfigError, match=r"c/ is a link to .*elsewhere/cats, outside the folder: .*--allow_outside_root"
  ):
    folder.scan(folder.parse(name))
  assert folder.scan(folder.parse(name), allow_outside_root=True).class_names == ["a", "b", "c"]


def test_csv_rows_outside_the_csv_folder_are_refused_unless_allowed(tmp_path):
  """``../x``, an absolute path elsewhere, a link out of the folder and a root-only system file were read silently."""
  lists = tmp_path / "lists"
  _png(str(lists / "in.png"), 10)
  _png(str(tmp_path / "up.png"), 11)
  os.symlink(tmp_path / "up.png", lists / "link.png")
  rows = {
    "../up.png": "'../up.png' is outside the CSV file's folder",
    str(tmp_path / "up.png"): f"'{tmp_path / 'up.png'}' is outside the CSV file's folder",
    "link.png": "'link.png' is outside the CSV file's folder",
  }
  if os.path.exists("/etc/shadow"):
    rows["/etc/shadow"] = "'/etc/shadow' is outside the CSV file's folder"
  for row, says in rows.items():
    csv = lists / "labels.csv"
    csv.write_text(f"path,label\nin.png,cat\n{row},dog\n")
    with pytest.raises(ConfigError, match=f"line 3: {says}.*--allow_outside_root"):
      folder.scan(folder.parse(f"csv:{csv}"))
  csv.write_text("path,label\nin.png,cat\n../up.png,dog\nlink.png,dog\n")
  rc, err, _ = _prepare(f"csv:{csv}", tmp_path / "tfds")
  th.assert_refused(
    subprocess.CompletedProcess([], rc, "", err),
    ["line 3", "is outside the CSV file's folder", "and so are 1 more rows"],
  )
  rc, err, _ = _prepare(f"csv:{csv}", tmp_path / "tfds", "--allow_outside_root")
  assert rc == 0, err
  assert split_info(f"csv:{csv}", "train", str(tmp_path / "tfds"))["num_examples"] == 3


def test_csv_rows_naming_a_fifo_or_a_device_are_refused(tmp_path):
  """A CSV row's file must be a regular file (the CSV itself too): before, a FIFO row was 'no such file' and a FIFO
  given as the CSV hung."""
  _png(str(tmp_path / "in.png"), 10)
  os.mkfifo(tmp_path / "pipe")
  (tmp_path / "labels.csv").write_text("in.png,cat\npipe,dog\n")
  with pytest.raises(ConfigError, match="line 2: 'pipe' is a FIFO \\(named pipe\\), not a regular file"):
    folder.scan(folder.parse(f"csv:{tmp_path / 'labels.csv'}"))
  (tmp_path / "labels.csv").write_text("in.png,cat\n/dev/zero,dog\n")
  with pytest.raises(ConfigError, match="line 2: '/dev/zero' is a character device, not a regular file"):
    folder.scan(folder.parse(f"csv:{tmp_path / 'labels.csv'}"), allow_outside_root=True)
  rc, err, _ = _prepare(f"csv:{tmp_path / 'pipe'}", tmp_path / "tfds")
  th.assert_refused(subprocess.CompletedProcess([], rc, "", err), ["is a FIFO (named pipe), not a regular file"])


# ------------------------------------------------------------------ names that could write lines of their own


def _names_folder(tmp_path, names):
  """A folder of two classes' images, and files named ``names`` in a/ (bytes: os.fsencode'd) that are no images."""
  src = tmp_path / "pets"
  for cls, h in (("a", 10), ("b", 11)):
    _png(str(src / cls / "0.png"), h)
  for raw in names:
    with open(os.path.join(os.fsencode(src / "a"), os.fsencode(raw)), "w") as f:
      f.write("not an image\n")
  return f"folder:{src}"


def test_control_characters_in_names_are_escaped_in_skipped_txt(tmp_path):
  """A name with a tab and a newline wrote a forged line into skipped.txt. Each is one escaped line now (control
  characters, DEL, the Unicode line separator, and the backslash that escapes them)."""
  names = {
    "evil\tname\nforged.png\tfake reason": "evil\\tname\\nforged.png\\tfake reason",
    "\x1b[31mred\x7f\r.png": "\\x1b[31mred\\x7f\\r.png",
    "line\u2028sep\\.png": "line\\u2028sep\\\\.png",
  }
  name, data_dir = _names_folder(tmp_path, names), str(tmp_path / "tfds")
  prepare_lib.prepare(name, data_dir, workers=1)
  assert sorted(_skipped(name, data_dir)) == sorted((f"a/{e}", "not an image PIL knows") for e in names.values())


def test_a_name_that_is_no_utf8_is_escaped_in_skipped_txt(tmp_path):
  """A name of bytes that are no UTF-8 (os.listdir gives surrogates) stopped the report with a UnicodeEncodeError
  traceback; it is its bytes' escapes now."""
  name, data_dir = _names_folder(tmp_path, [b"\xff\xfe.png"]), str(tmp_path / "tfds")
  prepare_lib.prepare(name, data_dir, workers=1)
  assert _skipped(name, data_dir) == [("a/\\xff\\xfe.png", "not an image PIL knows")]


# ------------------------------------------------------------------ decoded size and file size


def test_a_huge_png_is_refused_in_bounded_memory(tmp_path):
  """A 280 KB 16-bit 12000x12000 PNG took a preparing process to 3.9 GB (PIL's decompression-bomb warning was
  switched off) and was stored; its header now refuses it."""
  src = tmp_path / "pets"
  for cls, h in (("a", 10), ("b", 11)):
    _png(str(src / cls / "0.png"), h)
  PIL.Image.new("I;16", (12000, 12000)).save(src / "b" / "bomb.png")
  assert os.path.getsize(src / "b" / "bomb.png") < 2**20
  name, data_dir = f"folder:{src}", str(tmp_path / "tfds")
  rc, err, peak = _prepare(name, data_dir)
  assert rc == 0 and peak < 600, (f"peak memory {peak} MiB", err[-3000:])  # 214 MiB measured; 3,778 before
  why = "144,000,000 pixels, more than the 89,478,485 an image may have (PIL's decompression-bomb limit): not decoded"
  assert _skipped(name, data_dir) == [("b/bomb.png", why)] and f"b/bomb.png: {why}" in err
  assert split_info(name, "train", data_dir)["num_examples"] == 2


_READ = textwrap.dedent(
  """
  import io, json, resource, sys
  import numpy as np, PIL.Image
  from vitjax.data import image_files
  data, note = image_files.read_image(sys.argv[1])
  peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024  # (before the test decodes what it stored)
  image = np.asarray(PIL.Image.open(io.BytesIO(data)))
  row = image[0, [0, 257, 514, 8000], 0].tolist()
  print(json.dumps({"note": note, "shape": image.shape, "row": row, "peak_mb": peak}))
  """
)


def test_a_large_sixteen_bit_png_is_converted_in_bounded_memory(tmp_path):
  """A 9000x9000 16-bit PNG (81 M pixels, under the limit) is converted to 8 bits by blocks of rows: before, in
  float64 at once, reading it took 2.2 GB; now 0.6."""
  path = str(tmp_path / "big.png")
  levels = (np.arange(9000 * 9000, dtype=np.uint32) % 65536).astype(np.uint16).reshape(9000, 9000)
  PIL.Image.fromarray(levels).save(path, compress_level=1)
  del levels
  proc = subprocess.run(
    [sys.executable, "-c", _READ, path], env=th.env(), capture_output=True, text=True, timeout=120, preexec_fn=_limit
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  got = json.loads(proc.stdout.strip().splitlines()[-1])
  assert got["note"] == "converted: PNG I;16" and got["shape"] == [9000, 9000, 3], got
  # 596 MiB measured alone (with the check's own decode), 1450 once beside the full suite at -n 2; 2217 before
  assert got["row"] == [0, 1, 2, 31] and got["peak_mb"] < 2000, got


def test_a_file_too_big_is_not_read(tmp_path):
  """A file of more than MAX_FILE_BYTES is refused by its size, before it is read (a sparse file here); before, all
  300 MiB were read, then found to be no image."""
  path = tmp_path / "big.png"
  _png(str(path), 8)
  os.truncate(path, 300 * 2**20)  # (MAX_FILE_BYTES: 256 MiB)
  assert image_files.read_image(str(path)) == (None, "larger than 256 MiB (the most an image file may be): not read")
