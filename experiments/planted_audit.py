"""Issue 76's audit as a script: what planted links, damaged records, bombs and pickles do to a vitjax checkout.

    python experiments/planted_audit.py --tree=. --out=experiments/results/planted_after.md
    python experiments/planted_audit.py --tree=/tmp/before --out=experiments/results/planted_before.md

Each case runs a real command (python -m vitjax.main / export / sweep / data.prepare) on real files, links and
sockets, with the checkout `--tree` first on PYTHONPATH, and records: exit status, the last line it printed, what it
wrote where (a victim file outside the workdir: changed or not, its mode), its peak memory (ru_maxrss) and time.
Every command runs under a 12 GiB address-space limit and its own timeout, so a case that would eat the machine stops.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import pickle
import resource
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import time
import zipfile

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = [
  "--config.model.width=16", "--config.model.depth=1", "--config.model.num_heads=2", "--config.model.mlp_dim=32",
  "--config.batch_size=32", "--config.total_steps=10", "--config.eval_every=5", "--config.checkpoint_every=5",
]  # fmt: skip
SECRET = b"the victim: a file outside every workdir\n"


def run(tree: str, args: list[str], timeout: float = 120, cwd: str | None = None) -> dict:
  """Runs `python ARGS` with `tree` first on the path; its exit, last line, peak MiB and seconds."""
  env = dict(os.environ, PYTHONPATH=tree, JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="3", PYTHONUNBUFFERED="1")

  def limit():
    resource.setrlimit(resource.RLIMIT_AS, (12 * 2**30, 12 * 2**30))

  start = time.monotonic()
  proc = subprocess.Popen(
    ["/usr/bin/time", "-f", "maxrss=%M", sys.executable, *args], env=env, cwd=cwd or tree, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    preexec_fn=limit, text=True, errors="replace",
  )  # fmt: skip
  try:
    out, _ = proc.communicate(timeout=timeout)
    rc = proc.returncode
  except subprocess.TimeoutExpired:
    proc.kill()
    out, rc = proc.communicate()[0] + f"\n(killed after {timeout:g} s)", "timeout"
  lines = [s for s in out.strip().splitlines() if s.strip()]
  peaks = [s for s in lines if s.startswith("maxrss=")]
  peak = int(peaks[-1][7:]) // 1024 if peaks else "?"
  lines = [s for s in lines if not s.startswith(("maxrss=", "Command exited with non-zero status"))]
  tb = any(s.startswith("Traceback") for s in lines)
  last = lines[-1] if lines else ""
  return {"rc": rc, "line": ("[traceback] " if tb else "") + last[:260], "peak": peak, "s": time.monotonic() - start}


def victim(tmp: str) -> str:
  path = os.path.join(tmp, "victim")
  with open(path, "wb") as f:
    f.write(SECRET)
  os.chmod(path, 0o600)
  return path


def victim_state(path: str) -> str:
  with open(path, "rb") as f:
    same = f.read() == SECRET
  mode = oct(stat.S_IMODE(os.stat(path).st_mode))
  return f"victim {'untouched' if same else 'OVERWRITTEN'} ({mode})"


def trained(tree: str, tmp: str, data_dir: str) -> str:
  w = os.path.join(tmp, "trained")
  r = run(tree, ["-m", "vitjax.main", f"--config={ROOT}/configs/vit_digits.py", f"--workdir={w}", *TINY,
                 f"--config.data.data_dir={data_dir}"], timeout=300)  # fmt: skip
  assert r["rc"] == 0, r
  return w


def copy(w: str, tmp: str, name: str) -> str:
  dst = os.path.join(tmp, name)
  shutil.copytree(w, dst)
  return dst


def main_cmd(w, data_dir, *extra):
  return ["-m", "vitjax.main", f"--config={ROOT}/configs/vit_digits.py", f"--workdir={w}", *TINY,
          f"--config.data.data_dir={data_dir}", *extra]  # fmt: skip


def eval_cmd(w):
  return ["-m", "vitjax.main", "--mode=eval", f"--workdir={w}", "--split=test"]


# ------------------------------------------------------------------------------------------ the cases


def case_export(tree, tmp, w, data_dir, fmt):
  out = os.path.join(tmp, f"exports_{fmt}")
  os.makedirs(out)
  v = victim(out)
  planted = "m.npz.tmp.npz" if fmt == "npz" else "m.json.tmp"
  os.symlink(v, os.path.join(out, planted))
  suffix = ".npz" if fmt == "npz" else ".safetensors"
  cmd = ["-m", "vitjax.export", f"--workdir={w}", f"--format={fmt}", f"--out={out}/m{suffix}"]
  return f"ln -s victim DIR/{planted}; export --format={fmt} --out=DIR/m{suffix}", run(tree, cmd), victim_state(v)


def case_workdir_link(tree, tmp, w, data_dir, name):
  d = copy(w, tmp, f"w_link_{name.replace('/', '_')}")
  vdir = tempfile.mkdtemp(dir=tmp)
  v = victim(vdir)
  target = v
  if name == "checkpoints/5":
    target = os.path.join(vdir, "outside_5")
    shutil.move(os.path.join(d, name), target)
  elif os.path.lexists(os.path.join(d, name)):
    os.remove(os.path.join(d, name))
  os.symlink(target, os.path.join(d, name))
  r = run(tree, main_cmd(d, data_dir, "--config.total_steps=20", "--allow_config_change"))
  after = (
    victim_state(v) if name != "checkpoints/5" else f"outside folder {'kept' if os.path.isdir(target) else 'GONE'}"
  )
  return f"ln -s OUTSIDE W/{name}; resume to step 20 (--allow_config_change)", r, after


def case_dangling(tree, tmp, w, data_dir):
  d = os.path.join(tmp, "dangling")
  os.symlink(os.path.join(tmp, "nowhere"), d)
  return (
    "W a dangling link; train",
    run(tree, main_cmd(d, data_dir)),
    f"target created: {os.path.exists(tmp + '/nowhere')}",
  )


def _edit(path, fn):
  with open(path) as f:
    rec = json.load(f)
  fn(rec)
  with open(path, "w") as f:
    json.dump(rec, f)


def case_damaged(tree, tmp, w, data_dir, what):
  d = copy(w, tmp, "w_" + what.replace(" ", "_").replace("^", ""))
  if what == "config.json []":
    open(os.path.join(d, "config.json"), "w").write("[]")
  elif what == "history garbage":
    open(os.path.join(d, "config_history.jsonl"), "a").write("garbage{\n")
  elif what == "task.json image_size 10^6":
    _edit(os.path.join(d, "task.json"), lambda r: r.update(image_size=[10**6, 10**6]))
  elif what == "depth 10^9":
    _edit(os.path.join(d, "config.json"), lambda r: r["model"].update(depth=10**9))
  return f"{what}; --mode=eval", run(tree, eval_cmd(d), timeout=90), ""


def case_too_large(tree, tmp, w, data_dir):
  d = os.path.join(tmp, "too_large")
  r = run(tree, main_cmd(d, data_dir, "--config.model.width=65536", "--config.model.mlp_dim=65536"), timeout=120)
  return "train width=65536 (1e11 parameters)", r, f"workdir created: {os.path.exists(d)}"


def case_zip_bomb(tree, tmp, w, data_dir):
  bomb = os.path.join(tmp, "bomb.npz")
  with zipfile.ZipFile(bomb, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as z:
    header = io.BytesIO()
    n = 5 * 2**27  # 2.5 GiB of float32 zeros
    np.lib.format.write_array_header_1_0(header, {"descr": "<f4", "fortran_order": False, "shape": (n,)})
    with z.open("Transformer/encoderblock_0/MlpBlock_3/Dense_0/kernel.npy", "w", force_zip64=True) as m:
      m.write(header.getvalue())
      for _ in range(n * 4 // 2**24):
        m.write(bytes(2**24))
  size = os.path.getsize(bomb) / 2**20
  d = os.path.join(tmp, "from_bomb")
  r = run(tree, main_cmd(d, data_dir, f"--config.init_from=npz:{bomb}"), timeout=180)
  return f"init_from=npz: a {size:.1f} MiB .npz holding 2.5 GiB", r, ""


def case_empty_study(tree, tmp, w, data_dir):
  s = os.path.join(tmp, "sweep")
  os.makedirs(s)
  db = os.path.join(s, "study.db")
  open(db, "wb").close()
  os.utime(db, (time.time() - 3600,) * 2)
  with open(os.path.join(s, "sweep.json"), "w") as f:
    json.dump({"study": "s", "storage": f"sqlite:///{db}", "command": "-"}, f)
  r = run(tree, ["-m", "vitjax.sweep", "--mode=report", f"--sweep_dir={s}"])
  return "a 0-byte study.db; sweep --mode=report", r, f"study.db now {os.path.getsize(db)} bytes"


class _Payload:
  def __init__(self, marker):
    self.marker = marker

  def __reduce__(self):
    return (open, (self.marker, "w"))


def case_pickle(tree, tmp, w, data_dir):
  marker = os.path.join(tmp, "payload_ran")
  pth = os.path.join(tmp, "evil.pth")
  with open(pth, "wb") as f:
    pickle.dump({"w": _Payload(marker)}, f, protocol=2)
  d = os.path.join(tmp, "from_pickle")
  r = run(tree, main_cmd(d, data_dir, f"--config.init_from=timm:vit_tiny_patch16_224:{pth}"))
  return "init_from=timm:...:evil.pth (a pickle that opens a file)", r, f"payload ran: {os.path.exists(marker)}"


def _listen_addresses(port):
  found = []
  for table in ("/proc/net/tcp", "/proc/net/tcp6"):
    for line in open(table).readlines()[1:]:
      local, st = line.split()[1], line.split()[3]
      if st == "0A" and int(local.rsplit(":", 1)[1], 16) == port:
        addr = local.rsplit(":", 1)[0]
        names = {"0100007F": "127.0.0.1", "00000000": "0.0.0.0", "0000000000000000FFFF00000100007F": "::ffff:127.0.0.1"}
        found.append(names.get(addr, "::" if set(addr) == {"0"} else addr))
  return found


def case_coordinator(tree, tmp, w, data_dir):
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
  cmd = main_cmd(os.path.join(tmp, "mh"), data_dir, "--multihost", f"--coordinator_address=127.0.0.1:{port}",
                 "--num_processes=2", "--process_id=0")  # fmt: skip
  env = dict(os.environ, PYTHONPATH=tree, JAX_PLATFORMS="cpu")
  proc = subprocess.Popen([sys.executable, *cmd], env=env, cwd=tree, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True)  # fmt: skip
  deadline, bound = time.monotonic() + 60, []
  while not bound and time.monotonic() < deadline:
    time.sleep(0.5)
    bound = _listen_addresses(port)
  time.sleep(12)
  proc.kill()
  out = proc.communicate()[0]
  waits = [s for s in out.splitlines() if "waiting for" in s]
  r = {"rc": "killed", "line": (waits[-1] if waits else "(silent while it waits)")[:200], "peak": "", "s": 0}
  return f"--multihost --coordinator_address=127.0.0.1:{port}, process 0 alone", r, f"listens on {bound}"


CASES = [
  ("export npz", lambda *a: case_export(*a, "npz")),
  ("export timm", lambda *a: case_export(*a, "timm")),
  *[
    (f"workdir link {n}", lambda *a, n=n: case_workdir_link(*a, n)) for n in ("lock", "metrics.jsonl", "checkpoints/5")
  ],
  ("dangling workdir", case_dangling),
  *[
    (w, lambda *a, w=w: case_damaged(*a, w))
    for w in ("config.json []", "history garbage", "task.json image_size 10^6", "depth 10^9")
  ],  # fmt: skip
  ("too large", case_too_large),
  ("zip bomb", case_zip_bomb),
  ("empty study.db", case_empty_study),
  ("pickle", case_pickle),
  ("coordinator", case_coordinator),
]


def main():
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--tree", default=ROOT, help="the vitjax checkout to audit")
  p.add_argument("--out", required=True, help="the Markdown table to write")
  p.add_argument("--only", default="", help="comma-separated case names (default: all)")
  args = p.parse_args()
  tree = os.path.abspath(args.tree)
  tmp = tempfile.mkdtemp(prefix="planted-")
  data_dir = os.path.join(tmp, "tfds")
  prep = run(tree, ["-m", "vitjax.data.prepare", "--dataset=digits", f"--data_dir={data_dir}"], timeout=300)
  assert prep["rc"] == 0, prep
  w = trained(tree, tmp, data_dir)
  rows = [
    "| case | command | exit | last line printed | written | peak MiB | s |",
    "| --- | --- | --- | --- | --- | --- | --- |",
  ]
  for name, fn in CASES:
    if args.only and name not in args.only.split(","):
      continue
    what, r, written = fn(tree, tmp, w, data_dir)
    line = r["line"].replace("|", "\\|")
    rows.append(f"| {name} | `{what}` | {r['rc']} | {line} | {written} | {r['peak']} | {r['s']:.0f} |")
    print(rows[-1], flush=True)
  commit = subprocess.run(["git", "-C", tree, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout
  head = f"Audit of {tree} (HEAD {commit.strip()}, plus its uncommitted changes), {time.strftime('%Y-%m-%d %H:%M')}\n\n"
  with open(args.out, "w") as f:
    f.write(head + "\n".join(rows) + "\n")
  shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
  main()
