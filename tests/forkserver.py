"""Runs vitjax's command lines (`python -m vitjax.X ARGS`) in processes forked from one that has already imported
their libraries: each run is its own process, with its own exit status, environment, stdin, stdout and stderr, but
does not pay the 1.7 s of imports (jax, flax, optax, orbax, tfds, grain) that `python -m` pays before the first line
of vitjax runs. train_helpers.run_main / run_module (runs to completion: about 150 in the suite) go through it; the
tests that signal, kill or watch a run (start_main) and those of the scripts start `python -m` as users do.

The server imports libraries only: no JAX backend is started (a fork after that would copy XLA's threads), and no
entry point, whose absl flags each child defines afresh when it runs the module as __main__. The environment is the
request's (XLA reads XLA_FLAGS when the child starts its backend); a request whose variables read at import differ
from the server's needs another server (train_helpers keeps one per set of them).

    server = ForkServer(env, cwd)       # one per test worker; it ends when the worker does (its stdin closes)
    proc = server.run("vitjax.main", ["--config=...", "--workdir=..."], env, stdin="")   # -> CompletedProcess
    proc = server.run("/path/to/script.py", [], env, cwd="/tmp/x")   # a script (a path), in another directory
"""

import json
import os
import subprocess
import sys

PRELOAD = (
  "jax",
  "flax.linen",
  "optax",
  "orbax.checkpoint",
  "tensorflow_datasets",
  "grain",
  "ml_collections.config_flags",
  "vitjax",
  "vitjax.cli",
  "vitjax.train",
  "vitjax.distributed",
  "vitjax.tasks",
  "vitjax.models",
  "vitjax.evaluators",
  "safetensors.numpy",
)


class ForkServer:
  def __init__(self, env: dict, cwd: str):
    self.proc = subprocess.Popen(
      [sys.executable, os.path.abspath(__file__)],
      cwd=cwd,
      env=env,
      stdin=subprocess.PIPE,
      stdout=subprocess.PIPE,
      text=True,
    )
    self.env = dict(env)

  def run(self, module: str, args: list[str], env: dict, stdin: str = "", timeout: float = 300, cwd: str | None = None):
    """-> subprocess.CompletedProcess (text stdout and stderr); TimeoutExpired past `timeout` seconds. `module` is a
    module's name (`python -m`) or a script's path (`python FILE`); cwd: the server's by default."""
    request = {"module": module, "args": list(args), "env": env, "stdin": stdin, "timeout": timeout, "cwd": cwd}
    self.proc.stdin.write(json.dumps(request) + "\n")
    self.proc.stdin.flush()
    line = self.proc.stdout.readline()
    if not line:
      raise RuntimeError(f"the fork server ended (exit {self.proc.wait()})")
    reply = json.loads(line)
    if reply["timed_out"]:
      raise subprocess.TimeoutExpired([module, *args], timeout, reply["stdout"], reply["stderr"])
    return subprocess.CompletedProcess([module, *args], reply["returncode"], reply["stdout"], reply["stderr"])


def _child(module: str, args: list[str], env: dict, files: tuple[str, str, str], cwd: str | None):
  """In the forked process: the module (or script) as __main__ with the given argv, environment, directory and
  standard streams; never returns."""
  import atexit
  import runpy

  os.environ.clear()
  os.environ.update(env)
  for fd, (path, mode) in enumerate(zip(files, (os.O_RDONLY, os.O_WRONLY, os.O_WRONLY))):
    os.dup2(os.open(path, mode), fd)
  code = 0
  try:
    if cwd:
      os.chdir(cwd)
    sys.argv = [module, *args]
    if module.endswith(".py"):
      sys.path.insert(0, os.path.dirname(os.path.abspath(module)))  # as `python FILE` puts the script's folder first
      runpy.run_path(module, run_name="__main__")
    else:
      runpy.run_module(module, run_name="__main__", alter_sys=True)
  except SystemExit as e:
    code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    if not isinstance(e.code, (int, type(None))):
      print(e.code, file=sys.stderr)
  except BaseException:
    import traceback

    traceback.print_exc()
    code = 1
  try:
    atexit._run_exitfuncs()  # what the interpreter's own exit would run
  finally:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _serve():
  import importlib
  import shutil
  import tempfile

  for name in PRELOAD:
    importlib.import_module(name)
  requests, replies = sys.stdin, os.fdopen(os.dup(1), "w")
  os.dup2(2, 1)  # a stray print of the server's goes to its stderr, not into the replies
  scratch = tempfile.mkdtemp(prefix="forkserver-")
  try:
    _answer(requests, replies, tuple(os.path.join(scratch, n) for n in ("stdin", "stdout", "stderr")))
  finally:  # the server ends when its test worker's pipe closes: its files go with it
    shutil.rmtree(scratch, ignore_errors=True)


def _answer(requests, replies, files) -> None:
  """Serves each request line with a forked child; the child's stdin, stdout and stderr go through `files`."""
  import signal
  import time

  for line in requests:
    request = json.loads(line)
    with open(files[0], "w") as f:
      f.write(request["stdin"])
    for path in files[1:]:
      open(path, "w").close()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
      _child(request["module"], request["args"], request["env"], files, request.get("cwd"))
    deadline, timed_out = time.monotonic() + request["timeout"], False
    while True:
      done, status = os.waitpid(pid, os.WNOHANG)
      if done:
        break
      if time.monotonic() > deadline:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        timed_out, status = True, 0
        break
      time.sleep(0.01)
    out, err = (open(p, errors="replace").read() for p in files[1:])
    reply = {"returncode": os.waitstatus_to_exitcode(status), "stdout": out, "stderr": err, "timed_out": timed_out}
    replies.write(json.dumps(reply) + "\n")
    replies.flush()


if __name__ == "__main__":
  _serve()
