"""What an attacker or a careless user plants (issue 76): links, damaged records, bombs, code in pickles, listeners.

Real links, real zip archives, real pickles and real sockets. Each case failed before: an export wrote through a
planted link (a mode-600 file overwritten and left 0644), a workdir's lock and metrics.jsonl were written through
links, a damaged config.json or history gave a traceback, an 11 MB .npz took 3 GB, depth=10**9 ran for minutes, a
code-carrying .pth was refused with advice to turn the protection off, and the coordinator listened on every
interface.
"""

import json
import os
import pickle
import re
import shutil
import socket
import stat
import subprocess
import sys
import time
import zipfile

import numpy as np
import pytest
import train_helpers as th

from vitjax import paths
from vitjax.errors import ConfigError

SECRET = b"a file the attacker wants overwritten\n"


def _victim(tmp_path):
  victim = tmp_path / "victim"
  victim.write_bytes(SECRET)
  victim.chmod(0o600)
  return victim


def _untouched(victim) -> None:
  assert victim.read_bytes() == SECRET and stat.S_IMODE(victim.stat().st_mode) == 0o600


# ---------------------------------------------------------------------------------- the one writer


def test_replacing_writes_a_fresh_file_and_never_through_a_link_at_the_target_or_an_old_temporary_name(tmp_path):
  victim = _victim(tmp_path)
  out = tmp_path / "out" / "m.npz"
  out.parent.mkdir()
  for planted in ("m.npz", "m.npz.tmp", "m.npz.tmp.npz", "m.json.tmp"):  # the target and the old fixed names
    os.symlink(victim, out.parent / planted)
  with paths.replacing(str(out)) as f:
    np.savez(f, w=np.ones(3))
  _untouched(victim)
  assert not out.is_symlink() and np.load(out)["w"].tolist() == [1, 1, 1]
  umask = os.umask(0)
  os.umask(umask)
  assert stat.S_IMODE(out.stat().st_mode) == 0o666 & ~umask
  assert sorted(os.listdir(out.parent)) == ["m.json.tmp", "m.npz", "m.npz.tmp", "m.npz.tmp.npz"]  # no temporary left


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path):
  out = tmp_path / "report.md"
  out.write_text("old")
  with pytest.raises(RuntimeError), paths.replacing(str(out), "w") as f:
    f.write("half")
    raise RuntimeError("disk full")
  assert out.read_text() == "old" and os.listdir(tmp_path) == ["report.md"]


def test_appending_refuses_a_planted_link_in_one_line(tmp_path):
  victim = _victim(tmp_path)
  os.symlink(victim, tmp_path / "metrics.jsonl")
  with pytest.raises(ConfigError, match=r"metrics.jsonl is a symbolic link \(to .*victim\); vitjax writes and deletes"):
    with paths.appending(str(tmp_path / "metrics.jsonl")) as f:
      f.write("{}\n")
  _untouched(victim)


@pytest.mark.parametrize("fmt", ["npz", "timm"])
def test_an_export_through_planted_links_replaces_the_links_and_leaves_their_targets_alone(fmt, finished_run, tmp_path):
  """Before: `ln -s ~/victim DIR/m.npz.tmp.npz` and an export to DIR/m.npz overwrote the victim, left it 0644."""
  victim = _victim(tmp_path)
  out_dir = tmp_path / "exports"
  out_dir.mkdir()
  suffix = ".npz" if fmt == "npz" else ".safetensors"
  for planted in (f"m{suffix}", "m.npz.tmp.npz", "m.json.tmp", "m.json"):
    os.symlink(victim, out_dir / planted)
  th.check_ok(
    th.run_module("export", f"--workdir={finished_run}", f"--format={fmt}", f"--out={out_dir / ('m' + suffix)}")
  )
  _untouched(victim)
  assert not (out_dir / f"m{suffix}").is_symlink() and (out_dir / f"m{suffix}").stat().st_size > 1000
  if fmt == "timm":
    assert not (out_dir / "m.json").is_symlink() and json.loads((out_dir / "m.json").read_text())["kwargs"]


# ---------------------------------------------------------------------------------- a workdir's links


@pytest.mark.parametrize("planted", ["lock", "metrics.jsonl", "config_history.jsonl", "checkpoints/5", "tb"])
def test_a_link_planted_in_a_workdir_is_refused_in_one_line_and_nothing_is_written_through_it(
  planted, finished_run, run_args, tmp_path
):
  """Before: the lock's JSON and metrics rows went into the link's target; checkpoints/5 as a link gave a traceback
  on every resume (orbax cannot rmtree a link) and keep_checkpoints no longer held."""
  victim = _victim(tmp_path)
  workdir = tmp_path / "w"
  shutil.copytree(finished_run, workdir)
  target = victim
  if planted in ("checkpoints/5", "tb"):  # a folder outside the workdir
    target = tmp_path / "outside"
    shutil.move(workdir / planted, target) if (workdir / planted).exists() else target.mkdir()
  elif (workdir / planted).exists():
    (workdir / planted).unlink()
  os.symlink(target, workdir / planted)
  before = th.snapshot(str(target)) if target.is_dir() else None
  proc = th.run_main(str(workdir), *run_args, "--config.total_steps=40")
  th.assert_refused(proc, [f"{workdir / planted} is a symbolic link", "writes and deletes nothing through links"])
  _untouched(victim)
  assert (workdir / planted).is_symlink()
  if before is not None:
    assert th.snapshot(str(target)) == before


def test_a_workdir_that_is_a_dangling_link_is_one_line(run_args, tmp_path):
  """Before: a FileExistsError traceback."""
  os.symlink(tmp_path / "gone", tmp_path / "w")
  proc = th.run_main(str(tmp_path / "w"), *run_args)
  th.assert_refused(proc, ["is a symbolic link to", "which is no folder; remove the link"])
  assert not (tmp_path / "gone").exists()


# ---------------------------------------------------------------------------------- damaged records


def _damage(workdir, name, how):
  path = workdir / name
  if callable(how):
    record = json.loads(path.read_text())
    how(record)
    path.write_text(json.dumps(record))
  else:
    with open(path, "a") as f:
      f.write(how)


DAMAGE = {
  "config.json holds a list": ("config.json", None, "config.json holds a JSON list, not the object vitjax wrote"),
  "a garbage history line": ("config_history.jsonl", "garbage{\n", "line 1: not a record of config changes"),
  "task.json's image_size 10^6": ("task.json", lambda r: r.update(image_size=[10**6] * 2), "each 1 to 16384"),
  "depth 10^9": ("config.json", lambda r: r["model"].update(depth=10**9), "depth=1000000000 is more than 1000 layers"),
  "num_heads '4'": ("config.json", lambda r: r["model"].update(num_heads="4"), "num_heads='4' must be a whole number"),
  "num_heads 0": ("config.json", lambda r: r["model"].update(num_heads=0), "num_heads=0 must be a whole number >= 1"),
}


@pytest.mark.parametrize("case", list(DAMAGE))
def test_a_damaged_workdir_is_one_line_naming_the_file_and_the_fault(case, finished_run, tmp_path):
  """Before: AttributeError and JSONDecodeError tracebacks, a RESOURCE_EXHAUSTED traceback, 600 s of silence."""
  name, how, words = DAMAGE[case]
  workdir = tmp_path / "w"
  shutil.copytree(finished_run, workdir)
  if how is None:
    (workdir / name).write_text("[]")
  else:
    _damage(workdir, name, how)
  before = th.snapshot(str(workdir))
  start = time.monotonic()
  proc = th.run_main(str(workdir), "--mode=eval", "--split=test", config=None, timeout=120)
  th.assert_refused(proc, [words])
  assert time.monotonic() - start < 60 and th.snapshot(str(workdir)) == before


def test_a_model_too_large_for_the_devices_is_refused_from_its_abstract_shapes_before_allocation(run_args, tmp_path):
  """width 2^16 is 1e11 parameters: refused from jax.eval_shape's shapes, with nothing allocated or written."""
  proc = subprocess.run(
    [sys.executable, "-c", _MAXRSS, *th.main_cmd(str(tmp_path / "w"), *run_args)[1:],
     "--config.model.width=65536", "--config.model.mlp_dim=65536"],
    env=th.env(), capture_output=True, text=True, timeout=300, cwd=th.ROOT,
  )  # fmt: skip
  th.assert_refused(proc, ["the model's parameters alone", "GiB of each device", "make the model smaller"])
  # (the parameters need 96 GiB; measured 0.3 GiB alone, 5.4 GiB once beside the full suite at -n 2)
  assert _peak_mb(proc) < 10000 and not (tmp_path / "w").exists()


# runs `python -m MODULE ARGS...` and prints its peak memory (ru_maxrss, MiB) on stdout as 'maxrss=N'
_MAXRSS = (
  "import resource, runpy, sys\n"
  "sys.argv = sys.argv[2:]\n"
  "try:\n"
  "  runpy.run_module(sys.argv[0], run_name='__main__', alter_sys=True)\n"
  "finally:\n"
  "  print(f'maxrss={resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024}', flush=True)\n"
)


def _peak_mb(proc) -> int:
  return int(proc.stdout.rsplit("maxrss=", 1)[1].split()[0])


# ---------------------------------------------------------------------------------- archives and pickles


def _npz_member(z, name, shape, data_bytes):
  header = np.lib.format.header_data_from_array_1_0(np.zeros(0, "<f4"))
  header["shape"] = shape
  import io

  buf = io.BytesIO()
  np.lib.format.write_array_header_1_0(buf, header)
  with z.open(name + ".npy", "w", force_zip64=True) as m:
    m.write(buf.getvalue())
    for _ in range(data_bytes // 2**24):
      m.write(bytes(2**24))
    m.write(bytes(data_bytes % 2**24))


def test_a_zip_bomb_npz_is_refused_from_its_zip_headers_before_anything_is_unpacked(tmp_path):
  """1 GiB of zeros in a ~1 MB .npz under a ViT's names: before, np.load unpacked it all (3 GB for 2.5 GiB)."""
  bomb = tmp_path / "bomb.npz"
  with zipfile.ZipFile(bomb, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as z:
    _npz_member(z, "Transformer/encoderblock_0/MlpBlock_3/Dense_0/kernel", (2**28,), 2**30)
  assert bomb.stat().st_size < 8 * 2**20
  code = f"from vitjax import convert\nconvert.from_vit_npz({str(bomb)!r})\n"
  proc = subprocess.run(
    [sys.executable, "-c", code], env=th.env(), capture_output=True, text=True, timeout=120, cwd=th.ROOT
  )
  assert "claims 1 GiB of arrays in a" in proc.stderr and "a zip bomb or a damaged file, not unpacked" in proc.stderr
  peak = subprocess.run(
    [sys.executable, "-c", "import resource, subprocess, sys\n"
     f"subprocess.run([sys.executable, '-c', {code!r}], capture_output=True)\n"
     "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss // 1024)"],
    env=th.env(), capture_output=True, text=True, timeout=120, cwd=th.ROOT,
  )  # fmt: skip
  assert int(peak.stdout.split()[-1]) < 800, peak.stdout  # (importing vitjax and jax: ~300 MiB)


def test_an_npz_member_whose_zip_size_disagrees_with_its_array_header_is_refused(tmp_path):
  from vitjax import convert

  forged = tmp_path / "forged.npz"
  with zipfile.ZipFile(forged, "w") as z:
    _npz_member(z, "Transformer/encoderblock_0/x", (10,), 4000)  # says 10 floats, holds 1000
  with pytest.raises(ValueError, match=r"forged.npz is not a readable .npz \(member .*x.npy says \d+ bytes, its array"):
    convert.from_vit_npz(str(forged))


class _Payload:
  def __init__(self, marker):
    self.marker = marker

  def __reduce__(self):
    return (open, (self.marker, "w"))  # creates the marker file when unpickled


def test_a_code_carrying_torch_file_is_refused_saying_so_and_its_code_never_runs(tmp_path):
  """Before: torch's own message cut at 200 characters, ending in advice to set weights_only=False."""
  pytest.importorskip("torch")
  from vitjax import convert

  marker = tmp_path / "ran"
  path = tmp_path / "model.pth"
  with open(path, "wb") as f:
    pickle.dump({"w": _Payload(str(marker))}, f)
  with pytest.raises(ConfigError) as e:
    convert._read_state_dict("init_from", str(path))
  assert "carries code" in str(e.value) and "vitjax will not run it" in str(e.value)
  assert "weights_only" not in str(e.value) and not marker.exists()


@pytest.mark.parametrize("version", ["2.5.1+cpu", "1.13.0", "2.4"])
def test_a_torch_whose_weights_only_is_unsafe_is_refused_for_pickles(version):
  from vitjax import convert

  with pytest.raises(
    ConfigError, match=rf"torch {re.escape(version)} can run it even with weights_only=True .*torch>=2.6"
  ):
    convert._check_torch(version, "model.pth")
  convert._check_torch("2.6.0", "model.pth")


# ---------------------------------------------------------------------------------- listeners


def _listening(port: int) -> list[str]:
  """The local addresses (hex, as /proc/net/tcp{,6} show them) in state LISTEN on `port`."""
  out = []
  for table in ("/proc/net/tcp", "/proc/net/tcp6"):
    with open(table) as f:
      for line in f.readlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        if state == "0A" and int(local.rsplit(":", 1)[1], 16) == port:
          out.append(local.rsplit(":", 1)[0])
  return out


def test_the_coordinator_listens_on_the_address_given_and_process_0_says_it_waits(tmp_path):
  """Before: --coordinator_address=127.0.0.1:PORT listened on *:PORT (jax's default bind), silent for its wait."""
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
  code = (
    "from vitjax import distributed, logs\nlogs.setup(0)\ndistributed.WAIT_LINE_S = 1\n"
    f"distributed.initialize('127.0.0.1:{port}', 2, 0)\n"
  )
  proc = subprocess.Popen([sys.executable, "-c", code], env=th.env(), stderr=subprocess.PIPE, text=True, cwd=th.ROOT)
  try:
    deadline = time.monotonic() + 60
    while not _listening(port) and time.monotonic() < deadline:
      time.sleep(0.2)
    bound = _listening(port)
    time.sleep(3)
  finally:
    proc.kill()
    err = proc.communicate()[1]
  assert bound and all(a in ("0100007F", "0000000000000000FFFF00000100007F") for a in bound), (bound, err[-2000:])
  assert f"process 0: waiting for the other 1 processes at 127.0.0.1:{port}" in err, err[-2000:]


def test_a_coordinator_address_that_is_not_this_machines_is_one_line_naming_the_bind_flag():
  from vitjax import distributed

  with pytest.raises(ConfigError, match=r"192.0.2.1 is not an address of this machine.*--coordinator_bind_address"):
    distributed.check_coordinator("192.0.2.1:8476", 0, 1)
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    free = s.getsockname()[1]
  distributed.check_coordinator("192.0.2.1:8476", 0, 1, bind_address=f"127.0.0.1:{free}")  # told where to listen


# ---------------------------------------------------------------------------------- sweeps


@pytest.mark.parametrize("mode", ["report", "run"])
def test_an_empty_study_file_is_refused_not_silently_given_a_new_schema(mode, data_dir, tmp_path):
  """Before: a 0-byte study.db got a new schema written into it: --mode=report reported nothing, a run started over."""
  sweep_dir = tmp_path / "sweep"
  sweep_dir.mkdir()
  db = sweep_dir / "study.db"
  db.write_bytes(b"")
  old = time.time() - 3600
  os.utime(db, (old, old))  # (a fresh empty file may be one another worker is creating)
  if mode == "report":
    record = {"study": "s", "storage": f"sqlite:///{db}", "command": "python -m vitjax.sweep ..."}
    (sweep_dir / "sweep.json").write_text(json.dumps(record))
    proc = th.run_module("sweep", "--mode=report", f"--sweep_dir={sweep_dir}")
  else:
    proc = th.run_module(
      "sweep", f"--config={th.CONFIG}", f"--sweep_dir={sweep_dir}", f"--config.data.data_dir={data_dir}", timeout=120
    )
  th.assert_refused(proc, [f"{db} is empty (0 bytes), so it holds no trials", "remove it to start over"])
  assert db.stat().st_size == 0


def test_a_link_planted_in_a_sweep_folder_is_refused(data_dir, tmp_path):
  victim = _victim(tmp_path)
  sweep_dir = tmp_path / "sweep"
  (sweep_dir / "logs").mkdir(parents=True)
  os.symlink(victim, sweep_dir / "logs" / "trial_0000.log")
  proc = th.run_module(
    "sweep", f"--config={th.CONFIG}", f"--sweep_dir={sweep_dir}", f"--config.data.data_dir={data_dir}", timeout=120
  )
  th.assert_refused(proc, ["trial_0000.log is a symbolic link", "writes and deletes nothing through links"])
  _untouched(victim)


def test_a_recorded_field_of_the_wrong_kind_is_one_line_naming_it(finished_run, tmp_path):
  """Before: seed "a" in config.json gave a traceback from inside jax at --mode=eval."""
  workdir = tmp_path / "w"
  shutil.copytree(finished_run, workdir)
  _damage(workdir, "config.json", lambda r: r.update(seed="a"))
  proc = th.run_main(str(workdir), "--mode=eval", "--split=test", config=None, timeout=120)
  th.assert_refused(proc, ["config.json: seed='a' must be a number (default 0)"])


def test_a_recorded_duration_in_epochs_is_of_its_kind(finished_run, tmp_path):
  """checkpoint_every="1 epoch" (configs/vit_fashion_mnist.py's) is a duration, not a wrong kind: before, the kind
  check refused every such run at --mode=eval ("must be a number (default 500)")."""
  workdir = tmp_path / "w"
  shutil.copytree(finished_run, workdir)
  _damage(workdir, "config.json", lambda r: r.update(checkpoint_every="1 epoch", eval_every="2 epochs"))
  th.check_ok(th.run_main(str(workdir), "--mode=eval", "--split=test", config=None, timeout=120))


@pytest.mark.parametrize("heads", ["4", 0, True])
def test_a_head_count_of_the_wrong_kind_beside_timm_weights_is_one_line(heads, tmp_path):
  """Before: "4" gave a logging traceback, then the wrong message "not a readable .safetensors file"; 0 was ignored."""
  from vitjax import convert

  (tmp_path / "m.json").write_text(json.dumps({"model": "vit", "kwargs": {"num_heads": heads}}))
  with pytest.raises(ConfigError, match=rf"m.json, beside the weights: num_heads={re.escape(repr(heads))} must be a"):
    convert.exported_heads(str(tmp_path / "m.safetensors"))
  (tmp_path / "m.json").write_text(json.dumps({"model": "vit", "kwargs": {"num_heads": 3}}))
  assert convert.exported_heads(str(tmp_path / "m.safetensors")) == 3


def test_every_file_vitjax_writes_goes_through_the_one_writer():
  """open(..., "w"/"a"/"x"), os.replace/rename, savefig or np.savez to a path anywhere but vitjax/paths.py would
  bring back a writer that follows a planted link or leaves half a file."""
  import pathlib
  import re as re_

  writes = re_.compile(
    r"open\([^)]*, *[\"'][wax]b?[\"']|os\.replace\(|os\.rename\(|shutil\.copy(file)?\(|\.savefig\((?!f\b)|"
    r"np\.savez(_compressed)?\((?!f\b)[a-z_]+"
  )
  found = []
  for path in sorted(pathlib.Path(th.ROOT, "vitjax").rglob("*.py")):
    if path.name == "paths.py":
      continue
    for n, line in enumerate(path.read_text().splitlines(), 1):
      if writes.search(line) and not line.lstrip().startswith(("#", '"', "`")) and "(folders:" not in line:
        found.append(f"{path.relative_to(th.ROOT)}:{n}: {line.strip()}")
  assert not found, "write these through vitjax.paths.replacing / appending:\n" + "\n".join(found)
