"""What a run tells its user: progress lines (heartbeat, ETA against the time budget), evaluation progress,
quiet library logs, a profiler trace, and the README main job's output at the default verbosity."""

import glob
import logging as py_logging
import os
import re
import subprocess
import threading
import time

import pytest
import train_helpers as th

from vitjax import logs
from vitjax.train import reporting

METRICS = {"train/loss": 1.5, "train/accuracy": 0.5, "train/lr": 1e-3}


class _FakeTime:
  """The time module with time() reading now[0]."""

  def __init__(self, now):
    self.now = now

  def time(self):
    return self.now[0]

  def __getattr__(self, name):
    return getattr(time, name)


@pytest.fixture
def clock(monkeypatch):
  """A fake time.time() for vitjax.train.reporting and vitjax.logs only: clock[0] is now. (Patching the time
  module itself would also move the clock of TensorBoard's writer thread, which then waits for ~1e9 s.)"""
  now = [1000.0]
  monkeypatch.setattr(reporting, "time", _FakeTime(now))
  monkeypatch.setattr(logs, "time", _FakeTime(now))
  return now


def _lines(caplog):
  """vitjax's own log lines (jax logs its backend search too)."""
  return [r.getMessage() for r in caplog.records if r.pathname.startswith(os.path.dirname(logs.__file__))]


def test_a_progress_line_comes_at_least_every_30_seconds_whatever_log_every(tmp_path, clock, caplog):
  caplog.set_level(py_logging.INFO)
  r = reporting.Reporter(str(tmp_path), total_steps=100_000, log_every=10_000, examples_per_step=8)
  # (the loop asks heartbeat_due() and agrees on the answer across processes before passing it to due())
  assert r.due(1, r.heartbeat_due())  # the first step always
  r.progress(1, METRICS)
  clock[0] += 29.0
  assert not r.heartbeat_due() and not r.due(2, r.heartbeat_due())
  clock[0] += 2.0  # 31 s without a line
  assert r.heartbeat_due() and r.due(3, r.heartbeat_due())
  r.waited(7.75)  # a quarter of the 31 s waiting for input
  r.progress(3, METRICS)
  clock[0] += 1.0
  assert not r.due(4, r.heartbeat_due()) and r.due(10_000, r.heartbeat_due())  # log_every still applies
  first, second = _lines(caplog)
  assert first.startswith("step 1/100000 | loss 1.5000 | acc 0.500 | lr 1.00e-03 | first step in")
  # 2 steps in 31 s: the rate, the examples/s (8 per step) and the ETA of the remaining 99,997 steps.
  assert "0.06 steps/s, 1 ex/s, data wait 25% | ETA 430h" in second, second
  rows = th.read_metrics(str(tmp_path))
  assert [row["step"] for row in rows] == [1, 3] and rows[1]["train/examples_per_s"] == pytest.approx(16 / 31)
  assert rows[1]["train/data_wait"] == pytest.approx(0.25)


def test_eta_follows_the_time_budget_when_it_ends_the_run_first(tmp_path, clock, caplog):
  caplog.set_level(py_logging.INFO)
  r = reporting.Reporter(str(tmp_path), 10_000, 100, None, deadline=clock[0] + 120)
  r.progress(1, METRICS)
  clock[0] += 10.0
  r.progress(101, METRICS)  # 10 steps/s: 990 s for the remaining steps, but 110 s of budget
  assert _lines(caplog)[-1].endswith("10.00 steps/s, data wait 0% | ETA 1m50s (time budget)")
  clock[0] += 100.0
  r.deadline = clock[0] + 3600  # a budget that does not bind: the step-rate ETA
  r.progress(1101, METRICS)
  assert _lines(caplog)[-1].endswith("10.00 steps/s, data wait 0% | ETA 14m49s")


def test_evaluation_progress_appears_only_when_it_is_slow(clock, caplog):
  caplog.set_level(py_logging.INFO)
  p = logs.Progress("eval valid", total=100, unit="sentences")
  for _ in range(4):  # 4 s: quiet
    clock[0] += 1.0
    p.update(items=8)
  assert not _lines(caplog)
  for _ in range(20):  # then a line every 10 s
    clock[0] += 1.0
    p.update(items=8)
  lines = _lines(caplog)
  assert lines == [
    "eval valid: 5/100 batches | 8.0 sentences/s | ETA 1m35s",
    "eval valid: 15/100 batches | 8.0 sentences/s | ETA 1m25s",
  ]


def test_library_info_is_hidden_at_the_default_verbosity():
  from absl import logging as absl_logging

  f = logs._Filter()
  record = lambda path, level, msg="x": py_logging.LogRecord("absl", level, path, 1, msg, None, None)
  ours = os.path.join(os.path.dirname(logs.__file__), "train", "loop.py")
  theirs = "/site-packages/orbax/checkpoint/checkpoint_manager.py"
  old = absl_logging.get_verbosity()
  try:
    absl_logging.set_verbosity(0)
    assert f.filter(record(ours, py_logging.INFO)) and not f.filter(record(theirs, py_logging.INFO))
    assert f.filter(record(theirs, py_logging.WARNING))  # warnings always pass ...
    assert not f.filter(record(theirs, py_logging.WARNING, "Given directory is read only=/x"))  # ... but noise
    absl_logging.set_verbosity(1)
    assert f.filter(record(theirs, py_logging.INFO))
  finally:
    absl_logging.set_verbosity(old)


def _write_from_threads(err, schedule) -> None:
  """Writes each (thread index, text) of `schedule` to `err` from that thread, in the schedule's order."""
  import queue

  n = max(i for i, _ in schedule) + 1
  inboxes, done = [queue.Queue() for _ in range(n)], queue.Queue()

  def work(inbox):
    for text in iter(inbox.get, None):
      err.write(text)
      done.put(True)

  workers = [threading.Thread(target=work, args=(inbox,)) for inbox in inboxes]
  for w in workers:
    w.start()
  for i, text in schedule:
    inboxes[i].put(text)
    done.get(timeout=10)
  for inbox, w in zip(inboxes, workers):
    inbox.put(None)
    w.join()


def test_stderr_drops_the_closed_event_loop_tracebacks_even_interleaved_and_keeps_every_other():
  """After a full disk, tensorstore's callbacks print "Event loop is closed" tracebacks from several threads at once,
  while the trainer writes its one line (CI saw two tracebacks interleave, and the full-disk line land inside one):
  each thread's traceback is read on its own; anything else, from any thread, must pass whole."""
  import io

  from absl import logging as absl_logging

  tb, loop = (
    "Traceback (most recent call last):\n",
    '  File "/usr/lib/python3.11/asyncio/base_events.py", line 806, in call_soon_threadsafe\n',
  )
  check, noise = (
    "    self._check_closed()\n",
    "    raise RuntimeError('Event loop is closed')\nRuntimeError: Event loop is closed\n",
  )
  closed = tb + loop + check + noise
  real = tb + '  File "x.py", line 1, in f\n' + "    f()\n" + "ValueError: a real one\n"
  error = "error: cannot write the workdir /w: no space is left (0.1 MB free of 64.0 MB)\n"

  def pieces(thread, text):  # in pieces of 7 characters, as C++ and Python write them
    return [(thread, text[i : i + 7]) for i in range(0, len(text), 7)]

  def interleave(*streams):
    streams, out = [list(s) for s in streams], []
    while any(streams):
      for s in streams:
        if s:
          out.append(s.pop(0))
    return out

  old = absl_logging.get_verbosity()
  try:
    absl_logging.set_verbosity(0)
    out = io.StringIO()
    err = logs._Stderr(out)
    schedule = pieces(0, "step 16/30\n") + pieces(1, closed)
    # two closed loops' tracebacks and the trainer's line at once (thread 0 is the trainer's)
    schedule += interleave(pieces(1, closed), pieces(2, closed), pieces(0, "step 17/30\n" + error))
    # a real traceback in one thread while another prints a closed loop's, and a closed loop's cut short by the exit
    schedule += interleave(pieces(3, real), pieces(2, closed), pieces(1, tb + loop + check))
    _write_from_threads(err, schedule)
    err.close()
    assert out.getvalue() == "step 16/30\n" + "step 17/30\n" + error + real
    assert not err.threads
  finally:
    absl_logging.set_verbosity(old)


def test_profile_steps_write_a_trace_tensorboard_reads(tmp_path, run_args):
  workdir = str(tmp_path / "w")
  proc = th.check_ok(th.run_main(workdir, *run_args, "--config.total_steps=6", "--config.profile_steps=(3, 4)"))
  assert "profile of steps 3-4 written to" in proc.stderr
  traces = glob.glob(os.path.join(workdir, "tb", "plugins", "profile", "*", "*.xplane.pb"))
  assert len(traces) == 1 and os.path.getsize(traces[0]) > 10_000, traces
  bad = th.run_main(str(tmp_path / "bad"), *run_args, "--config.profile_steps=(4, 3)")
  assert bad.returncode == 2 and "profile_steps=(4, 3)" in bad.stderr and not os.path.exists(tmp_path / "bad")
  # a window past the run's end: the trace started and never stopped, without a word
  late = th.check_ok(
    th.run_main(str(tmp_path / "late"), *run_args, "--config.total_steps=4", "--config.profile_steps=(3, 10)")
  )
  assert "profile_steps=(3, 10) is not within this session's steps 1..4: no profile is written" in late.stderr


def _readme_main_command() -> str:
  with open(os.path.join(th.ROOT, "README.md")) as f:
    text = f.read()
  block = re.search(r"<!-- main-command -->\s*```bash\n(.*?)```", text, re.S).group(1)
  return " ".join(block.split())


# 4-5 minutes on a CI core (1,680 steps): with -m slow, and before every release
@pytest.mark.slow
def test_the_readme_main_job_prints_at_most_60_lines(tmp_path):
  """The README's main command after its install steps (prepare, train, evaluate), as written, with its workdir
  and the dataset under tmp_path; at the default verbosity everything it prints fits in 60 lines."""
  steps = [s.strip() for s in _readme_main_command().split("&&")]
  vitjax_steps = [s for s in steps if s.startswith("python -m vitjax.")]
  assert len(vitjax_steps) == 3 and all("pip" in s or "venv" in s for s in steps if s not in vitjax_steps)
  command = " && ".join(vitjax_steps).replace("workdirs/", f"{tmp_path}/workdirs/")
  env = {**th.env(), "TFDS_DATA_DIR": str(tmp_path / "tfds")}
  proc = subprocess.run(["bash", "-c", command], cwd=th.ROOT, env=env, capture_output=True, text=True, timeout=900)
  out = proc.stdout + proc.stderr
  assert proc.returncode == 0, out[-3000:]
  lines = out.splitlines()
  assert len(lines) <= 60, "\n".join(lines)
  assert re.search(
    r"checkpoint best \(step \d+\) \| eval/loss [\d.]+, eval/accuracy 0\.9\d+, eval/top5 [\d.]+ \(test, 300", out
  ), out
