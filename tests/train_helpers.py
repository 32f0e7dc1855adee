"""Helpers for the tests of the command lines: run `python -m vitjax.main` (and the others) in a process of its own,
read its outputs."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import threading

from forkserver import ForkServer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(ROOT, "configs", "vit_digits.py")

# A deliberately tiny ViT and a short run: 30 steps, progress every step, an evaluation every 10, a checkpoint
# every 5; the evaluation batch is a multiple of 8 so that the same run works on 8 devices.
TINY = [
  "--config.model.width=16",
  "--config.model.depth=1",
  "--config.model.num_heads=2",
  "--config.model.mlp_dim=32",
  "--config.batch_size=32",
  "--config.total_steps=30",
  "--config.log_every=1",
  "--config.eval_every=10",
  "--config.checkpoint_every=5",
  "--config.data.eval_batch_size=64",
]


# Tests compile with XLA's backend optimisations off and with its older loop emitters for CPU fusions: their tiny
# models spend most of their time compiling. The first cut a tiny run's compilation from 8 s to 3 s (the suite's time
# by a quarter); the second, XLA's compile time of the README's main job at toy size from 5.3 s to 3.5 s (the suite's
# by a sixth). The third compiles each module as one piece of LLVM code instead of several on threads (XLA's
# parallel codegen), which on 2 cores already busy with 2 test workers only adds contention: test_faults, test_train,
# test_models and test_transformer (now test_decode) at -n 2 took 129-135 s instead of 141-153 s (three runs each, 2026-11-28). Every
# fixture's bound still holds (they are set against rounding noise, tests/test_formats.py), and the bitwise tests
# compare runs compiled alike. VITJAX_TEST_XLA_OPT=1 compiles as users do. conftest.py sets the same flags for the
# pytest process itself.
FAST_COMPILE = (
  "--xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false --xla_cpu_parallel_codegen_split_count=1"
)
# XLA aborts the process (SIGABRT) when one of the simulated CPU devices reaches a collective more than 40 s after
# the others, and dumps every thread's stack after 20 s. On 2 cores shared by the test workers and a run's 8 devices
# that happens without any deadlock: a --config.sharding=tp run of the multihost guide aborted so at a checkpoint's
# all-gather (2026-11-28). The tests wait 300 s instead; a real deadlock still ends there, within each test's timeout.
COLLECTIVE_WAIT = (
  "--xla_cpu_collective_call_warn_stuck_timeout_seconds=120 --xla_cpu_collective_call_terminate_timeout_seconds=300"
)
XLA_TEST_FLAGS = COLLECTIVE_WAIT + ("" if os.environ.get("VITJAX_TEST_XLA_OPT") == "1" else " " + FAST_COMPILE)

# A persistent compilation cache shared by the subprocesses of a test session (set by a fixture): runs of the
# same config then compile their steps once, which halves their time.
CACHE_DIR = None


def env(devices: int = 1) -> dict:
  """The command lines' environment: os.environ on the CPU, with `devices` host devices."""
  e = dict(os.environ)
  e.update(
    JAX_PLATFORMS="cpu",
    XLA_FLAGS=f"--xla_force_host_platform_device_count={devices} {XLA_TEST_FLAGS}",
    PYTHONUNBUFFERED="1",
    TF_CPP_MIN_LOG_LEVEL="3",
  )
  if CACHE_DIR:
    e.update(
      JAX_COMPILATION_CACHE_DIR=CACHE_DIR,
      JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
      JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0",
    )
  return e


def main_cmd(workdir: str | None, *args: str, config: str | None = CONFIG) -> list[str]:
  cmd = [sys.executable, "-m", "vitjax.main"]
  if config:
    cmd.append(f"--config={config}")
  if workdir:
    cmd.append(f"--workdir={workdir}")
  return cmd + list(args)


def run_main(workdir, *args, devices: int = 1, config=CONFIG, timeout: float = 300) -> subprocess.CompletedProcess:
  """Runs the command line to completion; returns the CompletedProcess (text stdout/stderr)."""
  return run_module("main", *main_cmd(workdir, *args, config=config)[3:], devices=devices, timeout=timeout)


# The variables the preloaded libraries may read when imported (jax's config, TensorFlow's and tfds' constants, the
# interpreter's path): a fork server is started per distinct set of them; every other variable (XLA_FLAGS, which
# XLA reads when the child starts its backend, a test's own) reaches the child with its request.
IMPORT_TIME_PREFIXES = ("JAX_", "TF_", "TFDS_", "GRAIN_", "PYTHON", "LD_")
MAX_SERVERS = 4  # per test worker; beyond it a plain subprocess

_servers: dict[tuple, ForkServer] = {}


def _import_time(e: dict) -> tuple:
  return tuple(sorted((k, v) for k, v in e.items() if k.startswith(IMPORT_TIME_PREFIXES)))


def run_module(
  module: str,
  *args: str,
  devices: int = 1,
  timeout: float = 300,
  stdin: str = "",
  cwd: str = ROOT,
  extra_env: dict | None = None,
) -> subprocess.CompletedProcess:
  """Runs `python -m vitjax.MODULE ARGS` (main, export, attention_maps, ...; or `python FILE ARGS` for a module
  ending in .py) to completion in a process of its own (absl flags are per process), forked from one that has
  imported the libraries (tests/forkserver.py): the same process but for the imports' 1.7 s. extra_env: variables
  set on top of env(devices)."""
  e = {**env(devices), **(extra_env or {})}
  key = _import_time(e)
  target = module if module.endswith(".py") else f"vitjax.{module}"
  if key not in _servers and len(_servers) >= MAX_SERVERS:
    cmd = [sys.executable, *([] if module.endswith(".py") else ["-m"]), target, *args]
    return subprocess.run(cmd, cwd=cwd, env=e, input=stdin, capture_output=True, text=True, timeout=timeout)
  if key not in _servers:
    _servers[key] = ForkServer(e, ROOT)
  return _servers[key].run(target, list(args), e, stdin=stdin, timeout=timeout, cwd=cwd)


def start_main(workdir, *args, devices: int = 1, config=CONFIG) -> subprocess.Popen:
  """Starts the command line; its log (stderr, with stdout) is a line-buffered text pipe, `proc.stdout`."""
  return subprocess.Popen(
    main_cmd(workdir, *args, config=config),
    cwd=ROOT,
    env=env(devices),
    stdout=subprocess.PIPE,
    stderr=subprocess.STDOUT,
    text=True,
    bufsize=1,
  )


def check_ok(proc: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
  assert proc.returncode == 0, f"exit {proc.returncode}\nstdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-5000:]}"
  return proc


def error_lines(proc: subprocess.CompletedProcess) -> str:
  """stderr without the log lines (those start with a HH:MM:SS time)."""
  return "\n".join(s for s in proc.stderr.splitlines() if not re.match(r"\d\d:\d\d:\d\d ", s))


def assert_refused(proc: subprocess.CompletedProcess, words) -> None:
  """A command refused bad input: exit 2, no traceback, one "error: " line and nothing else, holding every word."""
  assert proc.returncode == 2, f"exit {proc.returncode}\n{proc.stderr[-3000:]}"
  assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
  err = error_lines(proc)
  errors = [line for line in err.splitlines() if line.startswith("error: ")]
  assert len(errors) == 1 and err.strip() == errors[0], err
  for word in words:
    assert word in errors[0], f"{word!r} not in {errors[0]!r}"


def read_metrics(workdir: str) -> list[dict]:
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [json.loads(line) for line in f if line.strip()]


def snapshot(directory: str) -> dict:
  """{relative path: (size, mtime_ns, sha1)} of every file under directory (dirs as (None, None, None))."""
  out = {}
  for root, dirs, files in os.walk(directory):
    for d in dirs:
      out[os.path.relpath(os.path.join(root, d), directory) + "/"] = (None, None, None)
    for name in files:
      p = os.path.join(root, name)
      st = os.stat(p)
      with open(p, "rb") as f:
        digest = hashlib.sha1(f.read()).hexdigest()
      out[os.path.relpath(p, directory)] = (st.st_size, st.st_mtime_ns, digest)
  return out


def finished_steps(workdir: str, sub: str = "checkpoints") -> list[int]:
  path = os.path.join(workdir, sub)
  return sorted(int(n) for n in os.listdir(path) if n.isdigit()) if os.path.isdir(path) else []


def load_state(workdir: str, step: int | None = None) -> dict:
  """The full saved TrainState (step, params, opt_state, model_state) of a workdir's checkpoint, as numpy arrays
  (whatever devices and processes wrote it)."""
  import jax
  import numpy as np
  import orbax.checkpoint as ocp

  step = max(finished_steps(workdir)) if step is None else step
  path = os.path.join(workdir, "checkpoints", str(step), "state")
  checkpointer = ocp.PyTreeCheckpointer()
  tree = checkpointer.metadata(path).item_metadata.tree
  as_numpy = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), tree)
  return jax.tree.map(np.asarray, checkpointer.restore(path, restore_args=as_numpy))


def jax_leaves(tree) -> list:
  import jax

  return jax.tree.leaves(tree)


def assert_same_state(ref: dict, got: dict, context: str = "") -> None:
  """Two saved TrainStates (load_state) are equal bit for bit: same paths, dtypes and bytes."""
  import jax

  ref_leaves = jax.tree_util.tree_leaves_with_path(ref)
  got_leaves = jax.tree_util.tree_leaves_with_path(got)
  assert [p for p, _ in ref_leaves] == [p for p, _ in got_leaves], context
  differ = [
    jax.tree_util.keystr(p)
    for (p, a), (_, b) in zip(ref_leaves, got_leaves)
    if a.dtype != b.dtype or a.tobytes() != b.tobytes()
  ]
  assert not differ, f"{context}: these differ: {differ[:10]}"


def read_until(proc, pattern, timeout=240.0):
  """Reads proc's output until a line matches `pattern`; returns (match, lines so far). Kills proc on timeout."""
  timer = threading.Timer(timeout, proc.kill)
  timer.start()
  lines = []
  try:
    for line in proc.stdout:
      lines.append(line)
      m = re.search(pattern, line)
      if m:
        return m, lines
  finally:
    timer.cancel()
  raise AssertionError(f"{pattern!r} never appeared:\n{''.join(lines[-30:])}")
