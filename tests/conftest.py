"""Shared test helpers."""

import glob
import os
import pwd
import re
import shutil
import socket
import subprocess
import sys
import tempfile

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
  sys.path.insert(0, ROOT)

import train_helpers as th  # noqa: E402  (tests/ is on sys.path: pytest's default import mode)

# The tests start hundreds of Python processes. Where PYTHONDONTWRITEBYTECODE=1 is set (these machines set it), each
# of them compiled every vitjax module it imported (0.15 s a process): let this run and its subprocesses keep the
# bytecode in __pycache__ (git-ignored).
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False

# before any test imports jax: the tests' XLA flags (train_helpers.XLA_TEST_FLAGS) for this process and the
# subprocesses that inherit its environment
os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {th.XLA_TEST_FLAGS}".strip()


@pytest.fixture
def rng():
  return np.random.RandomState(0)


def naive_attention(q, k, v, bias=None, mask=None):
  """float64 attention with explicit loops over batch, heads and queries. q [B,T,H,K] -> [B,T,H,V]."""
  q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
  b, t, h, dk = q.shape
  s = k.shape[1]
  bias = np.zeros((1, 1, 1, 1)) if bias is None else np.asarray(bias, np.float64)
  mask = np.ones((1, 1, 1, 1), bool) if mask is None else np.asarray(mask, bool)
  bias = np.broadcast_to(bias.reshape((1,) * (4 - bias.ndim) + bias.shape), (b, h, t, s))
  mask = np.broadcast_to(mask.reshape((1,) * (4 - mask.ndim) + mask.shape), (b, h, t, s))
  out = np.zeros((b, t, h, v.shape[-1]))
  for bi in range(b):
    for hi in range(h):
      for ti in range(t):
        logits = np.array([q[bi, ti, hi] @ k[bi, si, hi] / np.sqrt(dk) + bias[bi, hi, ti, si] for si in range(s)])
        valid = mask[bi, hi, ti]
        if not valid.any():  # fully masked: uniform weights (the convention of both implementations)
          w = np.full(s, 1.0 / s)
        else:
          logits = np.where(valid, logits, -np.inf)
          w = np.exp(logits - logits.max())
          w /= w.sum()
        out[bi, ti, hi] = w @ v[bi, :, hi]
  return out


# ------------------------------------------------------------ session fixtures: digits and a tiny finished run


@pytest.fixture(scope="session")
def compile_cache(tmp_path_factory):
  """A persistent jax compilation cache shared by this session's subprocesses."""
  if os.environ.get("PYTEST_XDIST_WORKER"):  # one cache for all workers: a program compiled by one is not compiled
    # again by another (the tiny runs of most tests share their steps); JAX writes its entries atomically
    path = tmp_path_factory.getbasetemp().parent / "jax_cache"
    path.mkdir(exist_ok=True)
    th.CACHE_DIR = str(path)
  else:
    th.CACHE_DIR = str(tmp_path_factory.mktemp("jax_cache"))
  yield th.CACHE_DIR
  th.CACHE_DIR = None


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory, compile_cache):
  """digits, prepared once for the session with the documented command."""
  path = str(tmp_path_factory.mktemp("tfds"))
  proc = subprocess.run(
    [sys.executable, "-m", "vitjax.data.prepare", "--dataset=digits", f"--data_dir={path}"],
    cwd=th.ROOT,
    env=th.env(),
    capture_output=True,
    text=True,
    timeout=300,
  )
  th.check_ok(proc)
  return path


@pytest.fixture(scope="session")
def run_args(data_dir):
  """The tiny 30-step run's overrides (progress every step, so that a kill can land on any step)."""
  return [*th.TINY, f"--config.data.data_dir={data_dir}"]


@pytest.fixture(scope="session")
def finished_run(tmp_path_factory, run_args):
  """Workdir of an uninterrupted tiny run to step 30. Tests must not modify it: copy it first."""
  workdir = str(tmp_path_factory.mktemp("finished") / "w")
  th.check_ok(th.run_main(workdir, *run_args))
  return workdir


@pytest.fixture
def hub_cache(tmp_path, monkeypatch):
  """An empty hub cache, offline: HF_HOME for the subprocesses, and huggingface_hub's constants (read when it was
  first imported) for this process. Returns the cache folder (HF_HOME/hub)."""
  import huggingface_hub.constants as constants

  home = tmp_path / "hf_home"
  cache = str(home / "hub")
  os.makedirs(cache)
  monkeypatch.setenv("HF_HOME", str(home))
  monkeypatch.delenv("HF_HUB_CACHE", raising=False)
  monkeypatch.setenv("HF_HUB_OFFLINE", "1")
  monkeypatch.setattr(constants, "HF_HUB_CACHE", cache)
  monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
  return cache


# Tests of XLA:CPU's own bf16 dot path (vitjax.dots takes it on a CPU only): the bring-up on a GPU
# (experiments/gpu_check.sh) skips them. The condition is evaluated in the test module, which imports jax.
cpu_backend_only = pytest.mark.skipif(
  "jax.default_backend() != 'cpu'", reason="checks XLA:CPU's bf16 dot path (vitjax.dots); this backend is not a CPU"
)


def dot_operand_types(hlo: str) -> list[tuple[str, str]]:
  """(lhs, rhs) types of every dot in a compiled HLO module's text (operand names resolved per computation)."""
  types, found = {}, []
  for line in hlo.splitlines():
    if not line.startswith(" "):
      types = {}
    m = re.match(r"\s+(?:ROOT )?%(\S+) = (\S+) ", line)
    if m:
      types[m.group(1)] = m.group(2)
    m = re.search(r" dot\(%([^,]+), %([^)]+)\)", line)
    if m:
      found.append((types[m.group(1)], types[m.group(2)]))
  return found


# ------------------------------------------------------------ skips under CI, and the reference libraries

# The skips no CI machine can meet. Under CI=true (.ci/run sets it) every other skip fails the test: a dependency
# or package that .ci/run installs must be there, so a broken install cannot hide tests behind a green run.
SKIPS_CI_CANNOT_MEET = {
  "chattr +i failed": "an unprivileged container may not set the immutable flag (tests/test_bad_input.py)",
  "no GPU": "CI machines have no accelerator (experiments/gpu_check.sh covers a lent GPU)",
}


def _skip_is_a_failure_under_ci(report) -> None:
  if not report.skipped or os.environ.get("CI") != "true" or hasattr(report, "wasxfail"):
    return
  reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
  if any(known in reason for known in SKIPS_CI_CANNOT_MEET):
    return
  report.outcome = "failed"
  report.longrepr = f"skipped under CI=true, where .ci/run installs what this needs: {reason}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
  outcome = yield
  _skip_is_a_failure_under_ci(outcome.get_result())


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
  outcome = yield
  _skip_is_a_failure_under_ci(outcome.get_result())


def _import_reference(name: str):
  """torch, timm or transformers, as the reference tests import them: torchvision's CUDA wheel does not load next to
  CPU torch, so tests/torchvision_ops_shim.py (or $VITJAX_REFS's) goes first. Skips when it cannot import."""
  refs = os.environ.get("VITJAX_REFS", os.path.dirname(os.path.abspath(__file__)))
  if refs not in sys.path:
    sys.path.insert(0, refs)
  try:
    import torch

    if name != "torch" and torch.version.cuda is None:
      import torchvision_ops_shim  # noqa: F401
    return __import__(name)
  except Exception as e:  # torchvision's CUDA wheel raises RuntimeError, not ImportError, without the shim
    pytest.skip(f"{name} is not importable here ({type(e).__name__}: {e}); see docs/contributing.md, 'Tests'")


@pytest.fixture(scope="session")
def torch_ref():
  return _import_reference("torch")


@pytest.fixture(scope="session")
def timm_ref():
  return _import_reference("timm")


@pytest.fixture(scope="session")
def transformers_ref():
  return _import_reference("transformers")


# ------------------------------------------------------------ PostgreSQL (sweeps on many machines: test_sweep, test_slurm)


def _pg_bin(name: str) -> str | None:
  found = shutil.which(name)
  if found:
    return found
  candidates = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
  return candidates[-1] if candidates else None


@pytest.fixture
def postgres():
  """A PostgreSQL server of its own: initdb in a temporary folder, stopped at the end. No TCP (listen_addresses=''),
  its Unix socket in a folder only the server's user can enter (0700, the socket 0700 too), and peer authentication
  that maps this process's user alone to the superuser vitjax: no other local user connects (tests/test_listeners.py).
  """
  initdb, pg_ctl = _pg_bin("initdb"), _pg_bin("pg_ctl")
  if not (initdb and pg_ctl):
    pytest.skip("PostgreSQL is not installed (Debian: apt-get install postgresql)")
  pytest.importorskip("psycopg2")
  as_user, owner = [], None
  base = tempfile.mkdtemp(prefix="vitjax-pg-")  # 0700; short: a Unix socket path has a length limit
  if os.getuid() == 0:  # initdb refuses root: run the server as the postgres user (root reaches its socket still)
    try:
      pw = pwd.getpwnam("postgres")
    except KeyError:
      pytest.skip("running as root and there is no postgres user to run PostgreSQL as")
    owner = (pw.pw_uid, pw.pw_gid)
    os.chown(base, *owner)
    as_user = ["runuser", "-u", "postgres", "--"]
  os.chmod(base, 0o700)
  data = os.path.join(base, "data")
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
  init = [initdb, "-D", data, "--auth-local=peer", "--auth-host=reject", "-U", "vitjax", "-N"]
  subprocess.run([*as_user, *init], check=True, capture_output=True)
  rules = {  # only this process's user, as vitjax, over the socket; no other user, no TCP
    "pg_hba.conf": "local all vitjax peer map=tests\n",
    "pg_ident.conf": f"tests {pwd.getpwuid(os.getuid()).pw_name} vitjax\n",
  }
  for name, text in rules.items():
    path = os.path.join(data, name)
    with open(path, "w") as f:
      f.write(text)
    if owner:
      os.chown(path, *owner)
    os.chmod(path, 0o600)
  opts = f"-k {base} -p {port} -c listen_addresses='' -c unix_socket_permissions=0700 -c fsync=off"
  subprocess.run(
    [*as_user, pg_ctl, "-D", data, "-l", f"{base}/log", "-o", opts, "-w", "start"], check=True, capture_output=True
  )
  try:
    yield f"postgresql+psycopg2://vitjax@/postgres?host={base}&port={port}"
  finally:
    subprocess.run([*as_user, pg_ctl, "-D", data, "-m", "immediate", "stop"], capture_output=True)
    shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
  """A one-node SLURM cluster of the module's own (tests/slurm_cluster.py), stopped at the end; skipped without SLURM."""
  import slurm_cluster

  why = slurm_cluster.missing()
  if why:
    pytest.skip(why)
  cluster = slurm_cluster.Cluster.start(str(tmp_path_factory.mktemp("slurm")))
  yield cluster
  cluster.stop()
