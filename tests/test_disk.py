"""A workdir on a filesystem that fills up, or cannot be written: real tmpfs mounts made by the test (root only).

A disk that fills during training: one line naming the workdir, the free space and a checkpoint's size, exit 74
(not 75: requeueing would fail the same way), the half-written step removed, the last good checkpoint intact; once
space is freed, the same command resumes to the undisturbed run's curve. A read-only workdir, and a new one whose
parent is read-only: one line each, exit 2, nothing written."""

import os
import re
import shutil
import subprocess
import threading

import numpy as np
import pytest
import train_helpers as th


def _mount(path: str, *options: str) -> None:
  os.makedirs(path, exist_ok=True)
  proc = subprocess.run(["mount", "-t", "tmpfs", "-o", ",".join(("size=64m", *options)), "tmpfs", path],
                        capture_output=True, text=True)  # fmt: skip
  if proc.returncode:
    pytest.skip(f"cannot mount a tmpfs here ({proc.stderr.strip()}): run the disk tests as root")


@pytest.fixture
def tmpfs(tmp_path):
  """A fresh 64 MB tmpfs at tmp_path/fs, unmounted afterwards."""
  if os.geteuid() != 0:
    pytest.skip("cannot mount a tmpfs here (not root): run the disk tests as root")
  path = str(tmp_path / "fs")
  _mount(path)
  yield path
  subprocess.run(["umount", "-l", path], capture_output=True)


def _fill(path: str) -> str:
  """Fills the filesystem at `path` to the last byte with one file; its path (remove it to free the space)."""
  filler = os.path.join(path, "filler")
  with open(filler, "wb", buffering=0) as f:  # unbuffered: closing it writes nothing more
    try:
      while True:
        f.write(b"\0" * (1 << 16))
    except OSError:
      pass
    try:
      while True:
        f.write(b"\0" * 512)  # the last partial page
    except OSError:
      pass
  return filler


def _keep_full(path: str, done: threading.Event) -> None:
  """Until `done`, writes into what space the filesystem at `path` gets back (another file beside the filler)."""
  with open(os.path.join(path, "filler2"), "wb", buffering=0) as f:
    while not done.wait(0.005):
      try:
        while True:
          f.write(b"\0" * 512)
      except OSError:
        pass


def _losses(workdir, steps=30):
  got = {r["step"]: r["train/loss"] for r in th.read_metrics(workdir) if "train/loss" in r}
  assert sorted(got) == list(range(1, steps + 1)), sorted(got)
  return np.array([got[s] for s in range(1, steps + 1)])


def test_a_disk_that_fills_up_is_one_line_exit_74_and_resumes_once_freed(tmpfs, run_args, finished_run):
  workdir = os.path.join(tmpfs, "w")
  proc = th.start_main(workdir, *run_args)
  filler = None
  for line in proc.stdout:
    if re.search(r" step 13/30 ", line):  # checkpoint 10 is written or being written: fill the disk
      filler = _fill(tmpfs)
      break
  # the run deletes old checkpoints as it goes (keep_checkpoints): space it frees is taken again at once, so the disk
  # stays full (under load, step 5's deletion left room for checkpoint 15, and the run went on to step 22)
  done = threading.Event()
  keeper = threading.Thread(target=_keep_full, args=(tmpfs, done), daemon=True)
  if filler is not None:
    keeper.start()
  out = proc.stdout.read()
  proc.wait(timeout=300)
  done.set()
  if filler is not None:
    keeper.join()
    os.remove(os.path.join(tmpfs, "filler2"))
  assert filler is not None and proc.returncode == 74, out[-3000:]
  errors = [line for line in out.splitlines() if "error" in line.lower()]
  assert len(errors) == 1 and errors[0].startswith(f"error: cannot write the workdir {workdir}: no space is left ("), (
    out
  )
  assert re.search(r"MiB free of 64\.0 MiB; a checkpoint takes [\d.]+ MiB\); the half-written step was removed", out)
  intact = int(re.search(r"checkpoint (\d+) is intact", errors[0]).group(1))
  assert intact in (5, 10) and "Traceback" not in out, out[-3000:]
  steps = os.listdir(os.path.join(workdir, "checkpoints"))  # nothing half-written left; 5 may remain beside 10
  assert all(s.isdigit() for s in steps) and max(map(int, steps)) == intact, steps

  os.remove(filler)  # space freed: the same command resumes from checkpoint 10 to the undisturbed end
  resumed = th.check_ok(th.run_main(workdir, *run_args))
  assert "resumed from" in resumed.stderr and f"at step {intact}" in resumed.stderr
  np.testing.assert_allclose(_losses(workdir), _losses(finished_run), rtol=1e-6)


def test_a_read_only_workdir_and_a_read_only_parent_are_one_line_each(tmpfs, run_args, finished_run):
  workdir = os.path.join(tmpfs, "w")
  shutil.copytree(finished_run, workdir)
  os.makedirs(os.path.join(tmpfs, "sub"))
  subprocess.run(["mount", "-o", "remount,ro", tmpfs], check=True)
  for path, says in (
    (workdir, f"{workdir} is not writable"),
    (os.path.join(tmpfs, "sub", "new"), "sub is not writable"),
  ):
    proc = th.run_main(path, *run_args, "--config.total_steps=40", "--allow_config_change")
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = th.error_lines(proc).splitlines()
    assert len(lines) == 1 and says in lines[0] and "Read-only file system" in lines[0], proc.stderr[-2000:]
  assert not os.path.exists(os.path.join(tmpfs, "sub", "new"))


def test_a_failed_write_is_told_apart_by_its_errno_or_the_libraries_words_anywhere_in_the_chain():
  """vitjax.errors.write_failure, what turns a failed checkpoint write into exit 74: the OS error's errno, or the
  words orbax and tensorstore wrap it in, in the exception given or one it was raised from or during; anything else
  (a permission error, a bug) is None, and so is a chain that loops."""
  import errno

  from vitjax import errors

  assert errors.write_failure(OSError(errno.ENOSPC, "x")) == "no space is left"
  assert errors.write_failure(OSError(errno.EDQUOT, "x")) == "the disk quota is exceeded"
  assert errors.write_failure(OSError(errno.EROFS, "x")) == "the filesystem is read-only"
  assert errors.write_failure(ValueError("tensorstore: os_error_code='122' writing")) == "the disk quota is exceeded"
  assert errors.write_failure(ValueError("[Errno 30] Read-only file system: '/w'")) == "the filesystem is read-only"
  assert errors.write_failure(ValueError("tensorstore: os_error_code='30'")) == "the filesystem is read-only"
  for e in (OSError(errno.EACCES, "Permission denied"), ValueError("shapes differ"), None):
    assert errors.write_failure(e) is None
  for how in ("cause", "context"):
    outer = RuntimeError("the checkpoint manager failed")
    setattr(outer, f"__{how}__", ValueError("os_error_code='28'"))
    assert errors.write_failure(outer) == "no space is left", how
  a, b = RuntimeError("a"), RuntimeError("b")
  a.__context__, b.__context__ = b, a
  assert errors.write_failure(a) is None
  assert errors.is_write_failure_line("OSError: [Errno 28] No space left on device")
  assert not errors.is_write_failure_line("saved step 10")
  assert errors.one_line(ValueError("data.max_len=0\n  must be at least 2\tor more")) == (
    "data.max_len=0 must be at least 2 or more"
  )
