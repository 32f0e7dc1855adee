"""Several local processes (jax.distributed on 127.0.0.1, CPU devices).

The same curve on any topology: the tiny digits run gives the same losses on 1 process x 1 device (the session's
finished run), 2 processes x 2 devices and 4 processes x 1 device, and so does a tiny translation run. Faults: SIGTERM to one process of
two stops both at one checkpoint, which resumes on one process and continues the curve (and a one-process
checkpoint on two); SIGKILL to both and a restart ends bit for bit where an uninterrupted run ends; SIGKILL to one
makes the other stop with one line.
"""

import os
import re
import signal
import socket
import subprocess
import textwrap

import numpy as np
import pytest
import train_helpers as th

# one worker builds this module's fixture once (pytest -n with --dist loadgroup, as the README runs it)
pytestmark = pytest.mark.xdist_group("multiprocess")


@pytest.mark.parametrize("address", ["localhost", "localhost:notaport", "localhost:0", "localhost:70000", ":1234"])
def test_a_malformed_coordinator_address_is_one_line(address):
  """jax.distributed.initialize crashed on these: an IndexError inside jax, or a segmentation fault."""
  from vitjax import distributed
  from vitjax.errors import ConfigError

  with pytest.raises(ConfigError, match=f"--coordinator_address={address} must be HOST:PORT"):
    distributed.initialize(address, 2, 0)


def test_a_taken_port_or_a_coordinator_that_never_comes_is_one_line_not_a_crash(caplog):
  """Process 0 on a port something listens on: jax's segmentation fault. Process 1 with nothing at the address:
  silence, then jax's abort after 300 s. Both now a ConfigError, before jax is called; process 1 says it waits."""
  from vitjax import distributed
  from vitjax.errors import ConfigError

  caplog.set_level("INFO", logger="absl")
  with socket.create_server(("127.0.0.1", 0)) as taken:
    address = f"127.0.0.1:{taken.getsockname()[1]}"
    with pytest.raises(ConfigError, match=f"process 0 cannot listen on port {address.split(':')[1]} .*another port"):
      distributed.check_coordinator(address, 0, 1)
    distributed.check_coordinator(address, 1, 1)  # it answers
  with pytest.raises(
    ConfigError, match=f"--coordinator_address={address}: nothing answered there in 2 s .*--process_id=0"
  ):
    distributed.check_coordinator(address, 1, 2)
  assert f"process 1: waiting for process 0 at {address} (up to 2 s)" in caplog.text
  distributed.check_coordinator(address, 0, 1)  # free again


def _port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _start(workdir, processes, devices, args, config=th.CONFIG):
  port = _port()
  procs = []
  for i in range(processes):
    flags = ["--multihost", f"--coordinator_address=127.0.0.1:{port}", f"--num_processes={processes}"]
    cmd = th.main_cmd(workdir, *args, *flags, f"--process_id={i}", config=config)
    procs.append(
      subprocess.Popen(
        cmd, cwd=th.ROOT, env=th.env(devices), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
      )
    )
  return procs


def _finish(procs, timeout=400) -> list[str]:
  try:
    outs = [p.communicate(timeout=timeout)[0] for p in procs]
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
  return outs


def _run(workdir, processes, devices, args, config=th.CONFIG) -> list[str]:
  """Runs to completion; every process must exit 0."""
  procs = _start(workdir, processes, devices, args, config)
  outs = _finish(procs)
  assert [p.returncode for p in procs] == [0] * processes, "\n".join(o[-2000:] for o in outs)
  assert f"{processes * devices} devices, {processes} processes" in outs[0]
  return outs


def _losses(workdir, steps=30):
  got = {r["step"]: r["train/loss"] for r in th.read_metrics(workdir) if "train/loss" in r}
  assert sorted(got) == list(range(1, steps + 1))
  return [got[s] for s in range(1, steps + 1)]


@pytest.fixture(scope="session")  # not "module": xdist may interleave modules, and a module fixture is rebuilt
def two_by_two(run_args, tmp_path_factory):
  """The same run on 2 processes x 2 devices: its workdir."""
  workdir = str(tmp_path_factory.mktemp("mp") / "two")
  _run(workdir, 2, 2, run_args)
  return workdir


def test_two_processes_follow_the_one_process_curve_and_a_sigterm_to_one_stops_both(
  finished_run, two_by_two, run_args, tmp_path
):
  ref = _losses(finished_run)
  np.testing.assert_allclose(_losses(two_by_two), ref, rtol=1e-5)

  cut = str(tmp_path / "cut")
  procs = _start(cut, 2, 2, run_args)
  for line in procs[0].stdout:  # process 0 logs the run; a signal to process 1 stops both
    if re.search(r" step 12/30 ", line):
      procs[1].send_signal(signal.SIGTERM)
      break
  outs = _finish(procs, timeout=120)
  assert [p.returncode for p in procs] == [75, 75], outs[0][-2000:] + outs[1][-2000:]
  stopped = {int(m) for out in outs for m in re.findall(r"stopped at step (\d+), checkpoint", out)}
  assert len(stopped) == 1, outs  # both at the same step
  (step,) = stopped
  # one log: process 1 prints no progress, evaluation or stop line of its own (only its warnings and errors,
  # each naming it)
  assert not re.search(r"\| loss |eval/accuracy|stopped at step", outs[1]), outs[1][-2000:]
  assert all(line.split(" ", 1)[1].startswith("process 1: ") for line in outs[1].splitlines() if line[:2].isdigit())
  assert step in th.finished_steps(cut)

  resumed = th.check_ok(th.run_main(cut, *run_args, devices=4))  # one process now
  assert f"at step {step}" in resumed.stderr and "4 devices, 1 process\n" in resumed.stderr
  np.testing.assert_allclose(_losses(cut), ref, rtol=1e-5)


def test_a_process_that_loses_its_peer_stops_with_one_line(run_args, tmp_path):
  """SIGKILL to process 1 of 2: process 0 says which process is gone and what to do, and exits 75, within
  --peer_timeout rather than after JAX's heartbeat abort (a C++ fatal error and a thread dump, ~60-100 s)."""
  workdir = str(tmp_path / "lost")
  args = [*run_args, "--config.total_steps=400", "--peer_timeout=5"]
  procs = _start(workdir, 2, 2, args)
  for line in procs[0].stdout:
    if re.search(r" step 8/400 ", line):
      procs[1].kill()
      break
  (out,) = _finish(procs[:1], timeout=60)
  procs[1].wait()
  assert procs[0].returncode == 75, out[-3000:]
  lines = [s for s in out.splitlines() if "given no sign of life" in s]
  assert len(lines) == 1, out[-3000:]
  assert "process 1 of 2 has given no sign of life" in lines[0] and "rerun all 2 processes" in lines[0]
  assert "Traceback" not in out and "Fatal Python error" not in out, out[-3000:]


@pytest.mark.slow
def test_four_processes_of_one_device_follow_the_same_curve(finished_run, run_args, tmp_path):
  workdir = str(tmp_path / "four")
  _run(workdir, 4, 1, run_args)
  np.testing.assert_allclose(_losses(workdir), _losses(finished_run), rtol=1e-5)


@pytest.mark.slow
def test_a_one_process_checkpoint_resumes_on_two_processes(finished_run, run_args, tmp_path):
  workdir = str(tmp_path / "grow")
  proc = th.start_main(workdir, *run_args, devices=4)
  th.read_until(proc, r" step 12/30 ")
  proc.send_signal(signal.SIGTERM)
  proc.communicate(timeout=120)
  assert proc.returncode == 75
  step = max(th.finished_steps(workdir))
  outs = _run(workdir, 2, 2, run_args)
  assert f"at step {step}" in outs[0]
  np.testing.assert_allclose(_losses(workdir), _losses(finished_run), rtol=1e-5)


@pytest.mark.slow
def test_sigkill_to_both_processes_and_a_restart_end_bitwise_equal(two_by_two, run_args, tmp_path):
  workdir = str(tmp_path / "killed")
  procs = _start(workdir, 2, 2, run_args)
  killed = False
  for line in procs[0].stdout:
    m = re.search(r" step (\d+)/30 ", line)
    if m and int(m.group(1)) >= 13 and 10 in th.finished_steps(workdir):
      for p in procs:
        p.kill()
      killed = True
      break
  _finish(procs, timeout=60)
  assert killed and [p.returncode for p in procs] == [-signal.SIGKILL] * 2
  assert max(th.finished_steps(workdir)) < 30

  outs = _run(workdir, 2, 2, run_args)  # the same commands
  m = re.search(r"resumed from .* at step (\d+)", outs[0])
  assert m and 10 <= int(m.group(1)) < 30, outs[0][-2000:]
  th.assert_same_state(th.load_state(two_by_two), th.load_state(workdir), "2 processes, SIGKILL to both")
  assert _losses(workdir) == _losses(two_by_two)


WORDS = ["alpha", "beta", "gamma", "delta", "omega", "sigma", "kappa", "theta"]


@pytest.mark.slow
def test_translation_follows_the_same_curve_on_1x4_2x2_and_4x1(compile_cache, tmp_path):
  rng = np.random.RandomState(0)
  with open(tmp_path / "pairs.tsv", "w") as f:
    for _ in range(600):
      words = list(rng.choice(WORDS, rng.randint(2, 6)))
      f.write(" ".join(words) + "\t" + " ".join(w.upper() for w in reversed(words)) + "\n")
  config = tmp_path / "tiny_translation.py"
  config.write_text(
    textwrap.dedent(f"""
      from vitjax.config import translation_config

      def get_config():
        c = translation_config("tsv:{tmp_path / "pairs.tsv"}", "xx", "yy", size="tiny")
        c.data.update(dict(vocab_size=40, tokenizer_sentences=2000, max_len=32, tokens_per_batch=300,
                           num_valid=40, num_test=40, eval_batch_size=8))
        c.evals.eval.examples = 16
        c.update(dict(total_steps=30, log_every=1, eval_every=30, checkpoint_every=30))
        c.schedule.warmup_steps = 10
        c.optim.lr = 3e-3
        return c
    """)
  )
  one = str(tmp_path / "one")
  th.check_ok(th.run_main(one, devices=4, config=str(config)))
  ref = _losses(one)
  for processes, devices in ((2, 2), (4, 1)):
    workdir = str(tmp_path / f"{processes}x{devices}")
    _run(workdir, processes, devices, [], config=str(config))
    np.testing.assert_allclose(_losses(workdir), ref, rtol=1e-5, err_msg=f"{processes} x {devices}")
    assert os.path.exists(os.path.join(workdir, "tokenizer.model"))


def test_multihost_flags_are_checked_before_jax_distributed_starts(monkeypatch):
  """--multihost: all three of address, count and index or none; an index in [0, count); --peer_timeout at least
  1 s. JAX's heartbeat timeout is three times --peer_timeout, 100 s at least, so the watch's line comes first; JAX
  finding no cluster is one line naming the flags."""
  import jax

  from vitjax import distributed, logs
  from vitjax.errors import ConfigError

  calls = []
  monkeypatch.setattr(jax.distributed, "initialize", lambda *a, **kw: calls.append((a, kw)))
  monkeypatch.setattr(logs, "_PROCESS", list(logs._PROCESS))
  coordinator = socket.create_server(("127.0.0.1", 0))  # what process 1 checks is there before jax connects
  address = f"127.0.0.1:{coordinator.getsockname()[1]}"
  with pytest.raises(ConfigError, match="give all of --coordinator_address=HOST:PORT, --num_processes=N and"):
    distributed.initialize(address, 2, None)
  with pytest.raises(ConfigError, match=r"--process_id=2 must be in \[0, --num_processes=2\)"):
    distributed.initialize(address, 2, 2)
  with pytest.raises(ConfigError, match=r"--process_id=-1 must be in"):
    distributed.initialize(address, 2, -1)
  with pytest.raises(ConfigError, match=r"--peer_timeout=0.5 must be at least 1 \(seconds\)"):
    distributed.initialize(peer_timeout=0.5)
  assert not calls
  distributed.initialize(address, 2, 1, peer_timeout=1)  # the last index, the shortest timeout
  coordinator.close()
  distributed.initialize(peer_timeout=50)  # none given: JAX detects the cluster
  assert [a for a, _ in calls] == [(address, 2, 1), (None, None, None)]
  assert [kw["heartbeat_timeout_seconds"] for _, kw in calls] == [100, 150]

  def no_cluster(*args, **kwargs):
    raise ValueError("coordinator_address should be defined.\nmore detail")

  monkeypatch.setattr(jax.distributed, "initialize", no_cluster)
  with pytest.raises(ConfigError) as e:
    distributed.initialize()
  assert str(e.value) == (
    "--multihost: coordinator_address should be defined.; pass --coordinator_address=HOST:PORT --num_processes=N "
    "--process_id=I"
  )


class _FakeCoordination:
  """The coordination service's key-value store; `beating`: processes whose counter moves at every read."""

  def __init__(self, beating=(), down=False, shut_at_read=None):
    self.store, self.beating, self.down, self.reads = {}, beating, down, 0
    self.shut_at_read, self.leaving = shut_at_read, None  # (process 0 shuts it down as this process leaves too)

  def key_value_set(self, key, value, allow_overwrite=False):
    if self.down:
      raise RuntimeError("UNAVAILABLE: failed to connect\n to all addresses")
    self.store[key] = value

  def key_value_dir_get(self, prefix):
    self.reads += 1
    if self.reads == self.shut_at_read:
      self.leaving.set()
      raise RuntimeError("UNAVAILABLE: the service is gone")
    for p in self.beating:
      key = f"vitjax/peers/alive/{p}"
      self.store[key] = str(int(self.store.get(key, 0)) + 1)
    return [(k, v) for k, v in self.store.items() if k.startswith(prefix)]


def test_the_peer_watch_stops_at_a_silent_process_and_not_at_one_that_left_or_beats(monkeypatch, caplog):
  """Process 0 of 3: a process whose counter never moves (dead before its first beat) is lost after --peer_timeout,
  one line and exit 75; one that beats, or that said it left, is not; an unreachable coordination service is lost
  too. Leaving the block normally or by a way every process stops (Preemption) tells the others so; a
  KeyboardInterrupt, or a data worker lost by this process alone (InputLost), does not."""
  import logging as py_logging
  import time
  import types

  from vitjax import distributed
  from vitjax.errors import InputLost, Preempted

  caplog.set_level(py_logging.ERROR)
  monkeypatch.setattr(distributed, "jax", types.SimpleNamespace(process_count=lambda: 3, process_index=lambda: 0))

  def watch(client, seconds, exc=None):
    monkeypatch.setattr(distributed, "_client", lambda: client)
    exits = []
    try:
      with distributed.PeerWatch(timeout=0.3, interval=0.02, exit=exits.append):
        deadline = time.time() + seconds
        while time.time() < deadline and not exits:
          time.sleep(0.02)
        if exc is not None:
          raise exc
    except (Preempted, KeyboardInterrupt):
      pass
    return exits

  silent = _FakeCoordination(beating=(1,))
  assert watch(silent, 5) == [75]
  (line,) = [r.getMessage() for r in caplog.records]
  assert line.startswith("process 2 of 3 has given no sign of life for 0 s: process 0 stops without a checkpoint")
  assert line.endswith("rerun all 3 processes with the same command to resume from the last checkpoint")

  caplog.clear()
  left = _FakeCoordination(beating=(1,))
  left.store["vitjax/peers/left/2"] = "1"
  assert watch(left, 1.0) == [] and not caplog.records
  assert left.store["vitjax/peers/left/0"] == "1"  # leaving normally: the others are told
  preempted = _FakeCoordination(beating=(1, 2))
  assert watch(preempted, 0.5, Preempted("SIGTERM")) == [] and preempted.store["vitjax/peers/left/0"] == "1"
  # a dead data worker stops this process alone: it exits 75 at once (jax's exit would wait for the others at a
  # barrier), unannounced, so that the others find it lost
  lost_input, started = _FakeCoordination(beating=(1, 2)), time.time()
  assert watch(lost_input, 0.5, InputLost("a grain worker process was killed")) == [75]
  assert "vitjax/peers/left/0" not in lost_input.store and time.time() - started < 3
  interrupted, started = _FakeCoordination(beating=(1, 2)), time.time()
  assert watch(interrupted, 0.5, KeyboardInterrupt()) == [] and "vitjax/peers/left/0" not in interrupted.store
  assert time.time() - started < 3  # Ctrl-C: no wait for the watch's verdict (an unexpected error waits 5.3 s)
  assert not caplog.records
  # the service gone while this process leaves too (process 0 finished first): nothing to say
  exits, gone = [], _FakeCoordination(beating=(1, 2), shut_at_read=3)
  monkeypatch.setattr(distributed, "_client", lambda: gone)
  w = distributed.PeerWatch(timeout=0.3, interval=0.02, exit=exits.append)
  gone.leaving = w._stop
  with w:
    deadline = time.time() + 5
    while gone.reads < 3 and time.time() < deadline:
      time.sleep(0.02)
  assert gone.reads >= 3 and exits == [] and not caplog.records

  assert watch(_FakeCoordination(down=True), 5) == [75]
  (line,) = [r.getMessage() for r in caplog.records]
  assert line.startswith(
    "the coordination service at process 0 is unreachable (UNAVAILABLE: failed to connect to all addresses): "
  )
