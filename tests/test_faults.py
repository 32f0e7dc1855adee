"""Runs that survive what clusters do to them, tested with real signals, real corrupted files and subprocesses
running the tiny 30-step digits run (tests/train_helpers.py): preemption, divergence, corruption, two writers, a
changed config, and the bookkeeping of metrics.jsonl across kills."""

import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import train_helpers as th

from vitjax import config as config_lib


def _copy(src, tmp_path, name="w"):
  dst = str(tmp_path / name)
  shutil.copytree(src, dst)
  return dst


def _rest(proc, timeout=120.0):
  """The rest of proc's output, after it exits; (rc, text, seconds it took)."""
  t = time.time()
  out, _ = proc.communicate(timeout=timeout)
  return proc.returncode, out, time.time() - t


def _train_steps(workdir):
  return [r["step"] for r in th.read_metrics(workdir) if "train/loss" in r]


def _eval_steps(workdir):
  return [r["step"] for r in th.read_metrics(workdir) if "eval/accuracy" in r and "source" not in r]


def _all_finite(workdir):
  return {
    s: all(np.isfinite(np.asarray(x)).all() for x in th.jax_leaves(th.load_state(workdir, s)))
    for s in th.finished_steps(workdir)
  }


# ------------------------------------------------------------------------------------ 1. preemption


def test_sigterm_checkpoints_the_step_in_flight_and_the_resume_is_bitwise_exact(finished_run, run_args, tmp_path):
  workdir = str(tmp_path / "w")
  kill_at = random.randint(3, 27)  # a random step; printed with any failure
  proc = th.start_main(workdir, *run_args)
  th.read_until(proc, rf" step {kill_at}/30 ")
  t = time.time()
  proc.send_signal(signal.SIGTERM)
  m, _ = th.read_until(proc, r"SIGTERM: stopped at step (\d+), checkpoint \1 written to .*; rerun the same command to")
  stopped, on_disk = int(m.group(1)), th.finished_steps(workdir)  # as the line says it, not later
  rc, out, _ = _rest(proc)
  assert rc == 75, (kill_at, out[-2000:])
  assert time.time() - t < 60, time.time() - t
  assert kill_at <= stopped < 30 and stopped in on_disk, (kill_at, stopped, on_disk)

  resumed = th.check_ok(th.run_main(workdir, *run_args))
  assert re.search(rf"resumed from .* at step {stopped}\b", resumed.stderr), resumed.stderr[-2000:]
  th.assert_same_state(th.load_state(finished_run), th.load_state(workdir), f"SIGTERM at step {kill_at}")
  assert _train_steps(workdir) == list(range(1, 31)) and _eval_steps(workdir) == [10, 20, 30]
  # the training time (max_train_minutes' account) goes on from the one recorded with the checkpoint, not from the
  # step's progress row, and the resumed session's start-up and compilation (not spent uninterrupted) do not count
  elapsed = {r["step"]: r["train/elapsed_s"] for r in th.read_metrics(workdir) if "train/loss" in r}
  with open(os.path.join(workdir, "train_time.json")) as f:
    saved = json.load(f)[str(stopped)]
  assert elapsed[stopped] <= saved, (stopped, saved, elapsed)
  if stopped % 10:  # (at an evaluation step, the evaluation it stopped before runs first on resume, and counts)
    assert elapsed[stopped + 1] == pytest.approx(saved, abs=1e-3), (stopped, saved, elapsed)


def _grain_workers(pid: int) -> list[int]:
  """The grain worker processes of process `pid`: its children started by multiprocessing's spawn."""
  found = []
  for name in filter(str.isdigit, os.listdir("/proc")):
    try:
      with open(f"/proc/{name}/stat") as f:
        parent = int(f.read().rsplit(")", 1)[1].split()[1])
      with open(f"/proc/{name}/cmdline") as f:
        spawned = "spawn_main" in f.read()
    except OSError:  # it ended meanwhile
      continue
    if parent == pid and spawned:
      found.append(int(name))
  return found


def test_a_killed_data_worker_stops_the_run_with_its_steps_checkpointed_and_it_resumes_bitwise(
  finished_run, run_args, tmp_path
):
  """A grain worker process killed (SIGKILL: what the out-of-memory killer sends) while training: the run trains on the
  batches already read, checkpoints its last step with the data position after that step's batch, says so in one
  line and exits 75, which a cluster script requeues; the same command resumes to the uninterrupted run's state."""
  workdir = str(tmp_path / "w")
  proc = th.start_main(workdir, *run_args, "--config.data.worker_count=2")
  th.read_until(proc, r" step 6/30 ")
  workers = _grain_workers(proc.pid)
  assert len(workers) == 2, workers
  os.kill(workers[0], signal.SIGKILL)
  rc, out, _ = _rest(proc)
  assert rc == 75 and "Traceback" not in out, out[-3000:]
  m = re.search(
    r"WARNING the training input stopped after step (\d+): a grain worker process was killed by SIGKILL \(what the "
    r"out-of-memory killer sends: fewer data.worker_count, or more memory for the job\); checkpoint \1 is in .*: rerun "
    r"the same command to resume",
    out,
  )
  assert m, out[-3000:]
  stopped = int(m.group(1))
  assert 6 <= stopped < 30 and max(th.finished_steps(workdir)) == stopped, (stopped, th.finished_steps(workdir))
  with open(os.path.join(workdir, "checkpoints", str(stopped), "data", "metadata")) as f:
    assert json.loads(json.loads(f.read())) == {"batches": stopped}  # not a batch read ahead

  resumed = th.check_ok(th.run_main(workdir, *run_args, "--config.data.worker_count=2"))
  assert re.search(rf"resumed from .* at step {stopped}\b", resumed.stderr), resumed.stderr[-2000:]
  th.assert_same_state(th.load_state(finished_run), th.load_state(workdir), f"a worker killed, stopped at {stopped}")


@pytest.mark.parametrize(
  "error, why",
  [
    (RuntimeError("Worker process was terminated unexpectedly with exit code -9. Search the logs above"), "SIGKILL ("),
    (RuntimeError("Worker process was terminated unexpectedly with exit code -11."), "killed by SIGSEGV"),
    (RuntimeError("Worker process was terminated unexpectedly with exit code 1."), "exited with status 1 (its own"),
    (RuntimeError("a record could not be decoded"), None),  # an error inside a worker: a bug, its own traceback
    (ValueError("Worker process was terminated unexpectedly with exit code -9."), None),
  ],
)
def test_only_grains_report_of_a_dead_worker_is_a_lost_input(error, why):
  from vitjax.errors import lost_worker

  said = lost_worker(error)
  assert said == why if why is None else why in said, said


def test_a_second_signal_stops_at_once(run_args, tmp_path):
  workdir = str(tmp_path / "w")
  proc = th.start_main(workdir, *run_args)
  th.read_until(proc, r"training examples")  # the first step is compiling: a long step
  proc.send_signal(signal.SIGTERM)
  time.sleep(0.05)
  proc.send_signal(signal.SIGINT)
  rc, out, seconds = _rest(proc)
  assert rc == 128 + signal.SIGINT and seconds < 10, (rc, seconds, out[-1000:])
  assert "SIGINT again: stopping now, without a checkpoint" in out


def test_a_stop_request_holds_the_handlers_only_inside_its_block_and_only_on_the_main_thread(capfd):
  """Inside the block a SIGTERM is a request (no exit), named by the signal; after it the previous handlers are back
  (a process that trains again, or goes on to evaluate, keeps its own Ctrl-C); off the main thread, where Python
  cannot install handlers (train() called from a worker thread), it installs none and still answers."""
  from vitjax.train.preemption import StopRequest

  before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
  with StopRequest() as stop:
    assert not stop.asked and not stop.requested() and stop.name == "a signal to another process"
    os.kill(os.getpid(), signal.SIGTERM)
    deadline = time.time() + 5  # (Python runs the handler between bytecodes of the main thread)
    while not stop.asked and time.time() < deadline:
      time.sleep(0.01)
    assert stop.asked and stop.requested() and stop.name == "SIGTERM"
  assert {s: signal.getsignal(s) for s in before} == before
  assert "SIGTERM: stopping after the step in flight is checkpointed" in capfd.readouterr().err

  seen = []

  def worker():
    with StopRequest() as other:
      seen.append((other.asked, signal.getsignal(signal.SIGTERM)))

  thread = threading.Thread(target=worker)
  thread.start()
  thread.join(timeout=10)
  assert seen == [(False, before[signal.SIGTERM])] and signal.getsignal(signal.SIGTERM) == before[signal.SIGTERM]


@pytest.mark.parametrize(
  "first, again, rc, said",
  [
    ("SIGTERM", "SIGTERM", 128 + signal.SIGTERM, "SIGTERM again: stopping now"),
    ("SIGINT", "SIGINT", 128 + signal.SIGINT, "SIGINT again: stopping now"),
  ],
)
def test_a_sigterm_delivered_again_at_once_is_the_same_request_and_a_later_one_a_second(first, again, rc, said):
  """Clusters deliver one SIGTERM twice within milliseconds: a sweep killed with SIGKILL sends its trial the
  parent-death signal once for each of its threads that hands the trial on, and that second SIGTERM stopped the
  trial at once, without the checkpoint the first had asked for (steps lost). A SIGTERM within REPEAT_S of the first
  is now the same request; one after it, or a second Ctrl-C at any time, still stops at once."""
  script = f"""
import os, signal, time
from vitjax.train import preemption
preemption.REPEAT_S = 1.0
def send(name):
  os.kill(os.getpid(), getattr(signal, name))
  time.sleep(0.1)
with preemption.StopRequest() as stop:
  send({first!r})
  send({again!r})
  print("went on after the second", stop.name, flush=True)
  time.sleep(1.0)
  send({again!r})
print("not reached", flush=True)
"""
  proc = subprocess.run([sys.executable, "-c", script], env=th.env(), capture_output=True, text=True, timeout=120)
  if first == "SIGTERM":  # the repeat is ignored, the one after REPEAT_S stops the process
    assert proc.stdout == "went on after the second SIGTERM\n", (proc.stdout, proc.stderr)
  else:  # Ctrl-C twice: at once
    assert proc.stdout == "", (proc.stdout, proc.stderr)
  assert proc.returncode == rc and said in proc.stderr, (proc.returncode, proc.stderr)
  assert proc.stderr.count(f"{first}: stopping after the step in flight is checkpointed") == 1, proc.stderr


# ------------------------------------------------------------------------------------ 2. divergence


def test_a_diverging_run_stops_and_saves_nothing_non_finite(run_args, tmp_path):
  workdir = str(tmp_path / "w")
  proc = th.run_main(workdir, *run_args, "--config.optim.lr=1e4", "--config.on_nonfinite=stop")
  assert proc.returncode == 3, proc.stderr[-2000:]
  err = proc.stderr
  assert re.search(r"step \d+: the loss, gradient norm or parameters are not finite", err), err[-2000:]
  assert "nothing non-finite was saved" in err and "--config.on_nonfinite=skip" in err and "Traceback" not in err
  assert all(_all_finite(workdir).values())


def test_skip_mode_counts_the_non_finite_steps_in_a_row_and_stop_mode_names_the_newest_good_checkpoint(caplog):
  """on_nonfinite='skip': a finite step ends a streak, and the run stops at the first step past max_nonfinite_skips
  in a row (not at it); each step's flag is read one step late unless asked now. 'stop' stops at the first."""
  import logging as py_logging
  import types

  from vitjax.errors import Diverged
  from vitjax.train.guard import NonfiniteGuard

  ckpts = types.SimpleNamespace(wait=lambda: None, latest_step=lambda: 20, directory="/w/checkpoints")
  config = lambda mode: types.SimpleNamespace(
    on_nonfinite=mode, max_nonfinite_skips=2, optim=types.SimpleNamespace(lr=0.002)
  )
  bad = {"train/nonfinite": 1.0, "train/loss": float("nan"), "train/grad_norm": float("inf")}
  good = {"train/nonfinite": 0.0, "train/loss": 1.0, "train/grad_norm": 1.0}
  caplog.set_level(py_logging.WARNING)
  guard = NonfiniteGuard(config("skip"), ckpts)
  for step, metrics in enumerate([bad, good, bad, bad], start=1):
    guard.check_lagged(step, metrics)
  assert guard.skipped == 2  # steps 1 and 3; step 4's flag is not read yet
  guard.check_now(4, bad)
  assert guard.skipped == 3 and guard.streak == 2
  assert (
    "step 4 is not finite (loss nan, grad norm inf): update skipped (2 in a row)" in caplog.records[-1].getMessage()
  )
  guard.check_lagged(5, bad)
  with pytest.raises(Diverged) as e:
    guard.check_now(5, bad)
  assert str(e.value).startswith(
    "step 5: the loss, gradient norm or parameters are not finite (loss nan, grad norm inf); stopped (more than "
    "max_nonfinite_skips=2 non-finite steps in a row), nothing non-finite was saved. Newest good checkpoint: step 20 "
    "in /w/checkpoints. Lower --config.optim.lr (now 0.002), or allow more skips with --config.max_nonfinite_skips"
  ), str(e.value)

  ckpts.latest_step = lambda: None
  guard = NonfiniteGuard(config("stop"), ckpts)
  guard.check_lagged(1, good)
  guard.check_lagged(2, bad)
  with pytest.raises(Diverged, match=r"^step 2: .*stopped \(on_nonfinite='stop'\).* checkpoint: none yet\. .*skip"):
    guard.check_lagged(3, good)  # step 2's flag, read at step 3


def test_a_good_run_resumed_at_a_bad_learning_rate_keeps_its_good_checkpoints(finished_run, run_args, tmp_path):
  workdir = _copy(finished_run, tmp_path)
  before = th.finished_steps(workdir)
  best = th.read_metrics(workdir)
  args = ["--config.optim.lr=1e4", "--config.total_steps=60", "--allow_config_change"]
  proc = th.run_main(workdir, *run_args, *args)
  assert proc.returncode == 3, proc.stderr[-2000:]
  assert "Newest good checkpoint: step" in proc.stderr
  after = th.finished_steps(workdir)
  assert set(before) <= set(after), (before, after)  # no good checkpoint rotated out
  assert all(_all_finite(workdir).values())
  assert [r for r in th.read_metrics(workdir) if r["step"] <= 30] == [r for r in best if r["step"] <= 30]
  # skip mode: goes on without the update, then stops after max_nonfinite_skips in a row
  skip = th.run_main(workdir, *run_args, *args, "--config.on_nonfinite=skip", "--config.max_nonfinite_skips=3")
  assert skip.returncode == 3, skip.stderr[-2000:]
  assert "more than max_nonfinite_skips=3 non-finite steps in a row" in skip.stderr
  # at lr 1e4 a finite step may come between two skipped ones (how often depends on the CPU's rounding), so the
  # run's last streak is what must hold: skips 1, 2, 3 on consecutive steps, then the stop
  skipped = [
    tuple(map(int, m)) for m in re.findall(r"step (\d+) is not finite .*?update skipped \((\d+) in a row", skip.stderr)
  ]
  assert [n for _, n in skipped[-3:]] == [1, 2, 3], skipped
  assert [s for s, _ in skipped[-3:]] == list(range(skipped[-3][0], skipped[-3][0] + 3)), skipped
  assert all(_all_finite(workdir).values())


# ------------------------------------------------------------------------------------ 3. corruption


def _data_file(step_dir):
  """The largest data file the step's restore reads: orbax merges the per-process OCDBT files into the step's
  top-level d/ (the ocdbt.process_N/ copies are not read again)."""
  d = os.path.join(step_dir, "state", "d")
  return max((os.path.join(d, n) for n in os.listdir(d)), key=os.path.getsize)


def _corrupt(step_dir, how):
  state = os.path.join(step_dir, "state")
  if how == "truncate":
    path = _data_file(step_dir)
    with open(path, "r+b") as f:
      f.truncate(os.path.getsize(path) // 2)
  elif how == "delete":
    os.remove(os.path.join(state, "manifest.ocdbt"))
  elif how == "zero_metadata":
    path = os.path.join(state, "_METADATA")
    with open(path, "r+b") as f:
      f.write(b"\0" * os.path.getsize(path))
  elif how == "flip":
    path = _data_file(step_dir)
    with open(path, "r+b") as f:
      data = bytearray(f.read())
      middle = len(data) // 2
      data[middle : middle + 64] = bytes(b ^ 0xFF for b in data[middle : middle + 64])
      f.seek(0)
      f.write(data)
  elif how == "checksum":  # arrays that read back fine but are not what was saved
    path = os.path.join(step_dir, "checksums", "metadata")
    with open(path) as f:
      sums = json.load(f)
    key = sorted(k for k in sums["state"] if k.startswith("params/"))[0]
    sums["state"][key][0] ^= 1
    with open(path, "w") as f:
      json.dump(sums, f)


# two kinds in the default run (a data file cut short; bytes flipped inside it), the other three with -m slow
@pytest.mark.parametrize(
  "how",
  ["truncate", "flip", *(pytest.param(h, marks=pytest.mark.slow) for h in ("delete", "zero_metadata", "checksum"))],
)
def test_a_corrupt_checkpoint_is_named_skipped_and_the_run_resumes_from_the_one_before(
  how, finished_run, run_args, tmp_path
):
  workdir = _copy(finished_run, tmp_path)
  _corrupt(os.path.join(workdir, "checkpoints", "30"), how)
  # evaluation and vitjax.load fall back for "latest" and name the corruption for an explicit step
  latest = th.check_ok(th.run_main(workdir, "--mode=eval", "--checkpoint=latest", config=None))
  assert "checkpoint 30 in" in latest.stderr and "is corrupt (" in latest.stderr, latest.stderr[-2000:]
  assert th.read_metrics(workdir)[-1]["step"] == 25
  explicit = th.run_main(workdir, "--mode=eval", "--checkpoint=30", config=None)
  (line,) = th.error_lines(explicit).strip().splitlines()
  assert explicit.returncode == 2 and "checkpoint 30 in" in line and "is corrupt (" in line and "25]" in line, line

  resumed = th.check_ok(th.run_main(workdir, *run_args))  # the same command as the run's
  assert re.search(r"checkpoint 30 in .* is corrupt \(.+\): skipped", resumed.stderr), resumed.stderr[-2000:]
  assert re.search(r"resumed from .* at step 25\b", resumed.stderr)
  (moved,) = os.listdir(os.path.join(workdir, "corrupt"))  # set aside, not deleted
  assert moved.startswith("30-")
  th.assert_same_state(th.load_state(finished_run), th.load_state(workdir), how)
  for proc in (latest, explicit, resumed):  # orbax's reads left pending on a closed event loop print these
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]


# ------------------------------------------------------------------------------------ 4. one writer


def test_a_second_run_is_refused_and_a_dead_runs_lock_is_taken_over(run_args, tmp_path):
  workdir = str(tmp_path / "w")
  # no checkpoint before the kill: the third run trains from the start, until its time budget stops it
  long = [*run_args, "--config.total_steps=100000", "--config.checkpoint_every=100000", "--config.eval_every=100000"]
  first = th.start_main(workdir, *long)
  try:
    th.read_until(first, r" step 2/100000 ")
    second = th.run_main(workdir, *long)
    assert second.returncode == 2, second.stderr[-2000:]
    assert f"workdir {workdir} is in use: PID {first.pid} on " in second.stderr and "Traceback" not in second.stderr
    assert first.poll() is None  # the first goes on
  finally:
    first.kill()
    first.communicate(timeout=60)
  third = th.check_ok(th.run_main(workdir, *long, "--config.max_train_minutes=0.01"))
  assert f"took over the lock of PID {first.pid}" in third.stderr, third.stderr[-2000:]
  # stopped by its time budget: the last line gives the planned total (it read "step N/N", like a finished run)
  last = int(re.search(r"max_train_minutes=0.01 reached at step (\d+): evaluating and stopping", third.stderr)[1])
  assert re.findall(r" step \d+/\d+ \|", third.stderr)[-1] == f" step {last}/100000 |", third.stderr[-2000:]
  assert not os.path.exists(os.path.join(workdir, "lock"))  # released at the end


def test_a_lock_of_another_host_is_honoured_while_fresh_and_taken_over_once_stale(tmp_path, monkeypatch):
  """Where flock does not reach across hosts: a lock naming another host that its holder keeps fresh stops the run,
  one older than Lock.STALE is taken over; the holder's heartbeat keeps its lock fresh; a run that fails before
  writing anything puts the lock it found back as it was, and a finished one removes it."""
  import socket

  from vitjax.errors import ConfigError
  from vitjax.train import workdir as workdir_lib

  workdir = str(tmp_path)
  path = os.path.join(workdir, "lock")
  other = json.dumps({"host": "elsewhere", "pid": 4242, "started": "2020-01-01 00:00:00"})
  with open(path, "w") as f:
    f.write(other)
  with pytest.raises(ConfigError, match=r"is in use: PID 4242 on elsewhere .*last seen \d+ s ago"):
    workdir_lib.Lock(workdir).acquire()
  stale = int(time.time() - workdir_lib.Lock.STALE - 60)
  os.utime(path, (stale, stale))
  lock = workdir_lib.Lock(workdir)
  lock.acquire()  # the other host's run is gone
  holder = json.load(open(path))
  assert holder["host"] == socket.gethostname() and holder["pid"] == os.getpid() and lock.acquired
  os.utime(path, (stale, stale))
  lock.touch()  # not due yet: the heartbeat is cheap to call every step
  assert os.stat(path).st_mtime == stale
  lock.touched -= lock.HEARTBEAT
  lock.touch()
  assert time.time() - os.stat(path).st_mtime < 60
  lock.release(restore=True)  # failed before writing anything: the other host's lock as it was
  assert open(path).read() == other and os.stat(path).st_mtime == stale and not lock.acquired
  lock = workdir_lib.Lock(workdir)
  lock.acquire()
  lock.release()
  assert not os.path.exists(path)


def test_a_run_that_fails_its_checks_puts_the_workdir_back(tmp_path):
  """What a failed start created in the workdir goes, what was there stays, and so do corrupt/ (steps set aside) and
  the lock; a workdir (and its parents) that the run created goes once empty."""
  from vitjax.train import workdir as workdir_lib

  existing = tmp_path / "existing"
  existing.mkdir()
  (existing / "mine.txt").write_text("x")
  untouched = workdir_lib.Untouched(str(existing))
  for name in ("tokenizer.model", "corrupt", "lock"):
    (existing / name).write_text("x")
  (existing / "checkpoints").mkdir()
  untouched.restore()
  assert sorted(os.listdir(existing)) == ["corrupt", "lock", "mine.txt"]
  workdir = tmp_path / "new" / "deeper" / "w"
  untouched = workdir_lib.Untouched(str(workdir))
  untouched.create()
  (workdir / "config.json").write_text("{}")
  untouched.restore()
  assert os.listdir(tmp_path) == ["existing"]


# ------------------------------------------------------------------------------------ 5. config on resume


def test_a_changed_config_is_refused_or_recorded(finished_run, run_args, tmp_path):
  workdir = _copy(finished_run, tmp_path)
  before = th.snapshot(workdir)
  refused = th.run_main(workdir, *run_args, "--config.optim.lr=1e-3")
  assert refused.returncode == 2, refused.stderr[-2000:]
  assert "optim.lr: 0.002 there, 0.001 now" in refused.stderr and "--allow_config_change" in refused.stderr
  epochs = th.run_main(workdir, *run_args, "--config.num_epochs=0")
  assert epochs.returncode == 2 and "num_epochs: 80.0 there, 0.0 now" in epochs.stderr, epochs.stderr[-2000:]
  not_beyond = th.run_main(workdir, *run_args, "--config.optim.lr=1e-3", "--allow_config_change")
  assert not_beyond.returncode == 2 and "total steps 30 is not beyond it" in not_beyond.stderr
  assert th.snapshot(workdir) == before  # config.json, checkpoints, metrics: untouched by all three

  again = th.check_ok(th.run_main(workdir, *run_args))  # unchanged and finished: nothing to do
  assert "is complete (step 30 of 30)" in again.stderr and th.finished_steps(workdir) == th.finished_steps(finished_run)

  allowed = th.check_ok(
    th.run_main(workdir, *run_args, "--config.optim.lr=1e-3", "--config.total_steps=40", "--allow_config_change")
  )
  assert "resumed from" in allowed.stderr and max(th.finished_steps(workdir)) == 40
  # the schedule is rebuilt over 40 steps with half the rate, and says so
  lr = {r["step"]: r["train/lr"] for r in th.read_metrics(workdir) if "train/lr" in r}
  said = (
    f"the learning-rate schedule now spans 40 steps (it spanned 30): the learning rate goes from {lr[30]:.2e} (step "
    f"30, the old schedule's) to {lr[31]:.2e} (step 31, the new one's): a jump down, not a continuation"
  )
  assert lr[31] < lr[30] and said in allowed.stderr, allowed.stderr[-3000:]  # (halved, and still warming up)

  assert config_lib.config_source(workdir) == (
    f"{workdir}/config.json with the changes of config_history.jsonl (optim.lr, total_steps)"
  )
  assert config_lib.config_source(finished_run) == f"{finished_run}/config.json"
  with (
    open(os.path.join(workdir, "config.json"), "rb") as f,
    open(os.path.join(finished_run, "config.json"), "rb") as g,
  ):
    assert f.read() == g.read()  # what trained steps 1-30 is still on record
  with open(os.path.join(workdir, "config_history.jsonl")) as f:
    (row,) = [json.loads(line) for line in f]
  assert row["step"] == 30 and row["changes"] == {"optim.lr": [0.002, 0.001], "total_steps": [30, 40]}
  # bookkeeping fields change freely (and are recorded); the effective config now has lr 1e-3 and 40 steps
  th.check_ok(
    th.run_main(
      workdir,
      *run_args,
      "--config.optim.lr=1e-3",
      "--config.total_steps=50",
      "--allow_config_change",
      "--config.log_every=2",
    )
  )
  with open(os.path.join(workdir, "config_history.jsonl")) as f:
    rows = [json.loads(line) for line in f]
  assert rows[-1]["changes"] == {"log_every": [1, 2], "total_steps": [40, 50]}


# ------------------------------------------------------------------------------------ 6. bookkeeping


def test_metrics_have_one_row_per_step_after_two_kills(finished_run, run_args, tmp_path):
  workdir = str(tmp_path / "w")
  for kill_after in (8, 18):
    proc = th.start_main(workdir, *run_args)
    th.read_until(proc, rf" step {kill_after + 3}/30 ")  # a few rows past the checkpoint at kill_after - 3 .. +0
    proc.kill()
    proc.communicate(timeout=60)
  th.check_ok(th.run_main(workdir, *run_args))
  assert _train_steps(workdir) == list(range(1, 31))
  assert _eval_steps(workdir) == [10, 20, 30]
  th.assert_same_state(th.load_state(finished_run), th.load_state(workdir), "two kills")


def test_an_evaluation_missing_from_a_checkpoint_runs_on_resume(run_args, tmp_path):
  """A step saved without its evaluation (cut short by a signal, or an evaluation step under the resumed run's
  cadence) is evaluated first on resume and saved again with its metrics, so `best` can choose it."""
  workdir = str(tmp_path / "w")
  proc = th.start_main(workdir, *run_args, "--config.eval_every=1000")
  th.read_until(proc, r" step 13/30 ")
  proc.send_signal(signal.SIGTERM)
  rc, out, _ = _rest(proc)
  assert rc == 75, out[-2000:]
  stopped = int(re.search(r"stopped at step (\d+)", out).group(1))
  # resumed with evaluations every `stopped` steps (a bookkeeping change): the step it stopped at is one
  resumed = th.check_ok(
    th.run_main(workdir, *run_args, f"--config.eval_every={stopped}", "--config.keep_checkpoints=20")
  )
  assert f"step {stopped} was saved without its evaluation (interrupted): evaluating it now" in resumed.stderr
  assert _eval_steps(workdir)[0] == stopped and _eval_steps(workdir)[-1] == 30
  from vitjax.models.checkpoints import Checkpoints

  checkpoints = Checkpoints(workdir, "eval/accuracy", "max")  # (the reader)
  assert checkpoints.metrics(stopped) is not None  # saved again with its metrics: a candidate for best


def test_a_workdir_without_a_checkpoint_starts_over(finished_run, run_args, tmp_path):
  """A run that stopped before its first checkpoint left a config.json, metrics rows and maybe a history, but
  trained nothing it kept: the next start (another learning rate here) starts over and replaces them."""
  workdir = _copy(finished_run, tmp_path)
  shutil.rmtree(os.path.join(workdir, "checkpoints"))
  with open(os.path.join(workdir, "config_history.jsonl"), "w") as f:
    f.write(json.dumps({"step": 10, "changes": {"log_every": [1, 2]}}) + "\n")
  proc = th.check_ok(th.run_main(workdir, *run_args, "--config.optim.lr=1e-3"))
  assert "has no checkpoint (its run stopped before its first): starting over at step 0" in proc.stderr
  with open(os.path.join(workdir, "config.json")) as f:
    assert json.load(f)["optim"]["lr"] == 1e-3
  assert not os.path.exists(os.path.join(workdir, "config_history.jsonl"))
  assert _train_steps(workdir) == list(range(1, 31)) and _eval_steps(workdir) == [10, 20, 30]


def test_a_workdir_written_before_a_field_was_renamed_or_added_reads_as_today(tmp_path):
  """model.prenorm became model.norm, and the Transformer gained pad/eos/bos ids (None: the tokenizer's): an older
  translation workdir must still load, and resume without a 'changed config'."""
  from vitjax import config as config_lib
  from vitjax.train import workdir as workdir_lib

  config = config_lib.translation_config("bible", "en", "es")
  old = workdir_lib.as_dict(config)
  old["model"] = {k: v for k, v in old["model"].items() if k not in ("norm", "pad_id", "eos_id", "bos_id")}
  old["model"]["prenorm"] = False
  workdir_lib.write_json(str(tmp_path), "config.json", json.dumps(old, indent=2))
  assert config_lib.read_config(str(tmp_path)).model.norm == "post"
  assert workdir_lib.config_changes(str(tmp_path), config) == {}
  config.model.norm = "pre"  # a real change is still one
  assert workdir_lib.config_changes(str(tmp_path), config) == {"model.norm": ("post", "pre")}
