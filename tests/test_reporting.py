"""What a run tells its user: progress lines (heartbeat, ETA against the time budget), evaluation progress,
quiet library logs, a profiler trace, and the README main job's output at the default verbosity."""

import errno
import glob
import logging as py_logging
import os
import re
import subprocess
import threading
import time
from types import SimpleNamespace

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
  r = reporting.Reporter(str(tmp_path), 10_000, 100, None, budget=120)
  r.progress(1, METRICS)
  clock[0] += 10.0
  r.progress(101, METRICS)  # 10 steps/s: 990 s for the remaining steps, but 110 s of budget
  assert _lines(caplog)[-1].endswith("10.00 steps/s, data wait 0% | ETA 1m50s (time budget)")
  clock[0] += 100.0
  r.budget = r.elapsed() + 3600  # a budget that does not bind: the step-rate ETA
  r.progress(1101, METRICS)
  assert _lines(caplog)[-1].endswith("10.00 steps/s, data wait 0% | ETA 14m49s")


def _evaluator(name, every):
  import types

  return types.SimpleNamespace(name=name, every=every)


def test_speeds_are_the_intervals_and_leave_out_evaluations_and_saves(tmp_path, clock, caplog):
  """A line's steps/s, ex/s and data wait are those of the steps since the previous line over their training time:
  an evaluation or a save in between neither lowers them nor (as a whole-session average did) the later ones."""
  caplog.set_level(py_logging.INFO)
  r = reporting.Reporter(str(tmp_path), 1000, 100, examples_per_step=8, evaluators=[_evaluator("eval", 200)])
  r.progress(1, METRICS)  # compiled: the rates start here
  clock[0] += 10.0
  r.progress(101, METRICS)  # 100 steps in 10 s
  clock[0] += 5.0
  with r.pause():  # an evaluation of 8 s, then a save of 2 s
    clock[0] += 8.0
  r.paused(2.0)
  clock[0] += 2.0 + 5.0
  r.waited(2.5)
  assert not r.heartbeat_due()
  r.progress(201, METRICS)  # 100 steps in 20 s, 10 of them training, a quarter of those waiting for input
  clock[0] += 2.5  # 50 steps at 20 steps/s
  r.progress(251, METRICS)
  lines = _lines(caplog)
  assert "| 10.00 steps/s, 80 ex/s, data wait 0% |" in lines[1], lines[1]
  assert "| 10.00 steps/s, 80 ex/s, data wait 25% |" in lines[2], lines[2]
  assert "| 20.00 steps/s, 160 ex/s, data wait 0% |" in lines[3], lines[3]
  rows = th.read_metrics(str(tmp_path))
  assert [row.get("train/steps_per_s") for row in rows] == [None, 10.0, 10.0, 20.0]
  assert [row.get("train/examples_per_s") for row in rows] == [None, 80.0, 80.0, 160.0]
  assert rows[2]["train/data_wait"] == pytest.approx(0.25)
  assert [row["train/elapsed_s"] for row in rows] == [0.0, 10.0, 30.0, 32.5]  # wall-clock, as before
  # a long evaluation is no 30 s without a line: the heartbeat counts training time
  with r.pause():
    clock[0] += 40.0
  assert not r.heartbeat_due()
  clock[0] += 30.0
  assert r.heartbeat_due()


def test_tokens_per_second_counts_every_step_of_the_interval(tmp_path, clock, caplog):
  """tok/s: the target tokens of the steps since the last line over their training time (it was the step rate
  times the last step's tokens: batches by tokens vary)."""
  import numpy as np

  caplog.set_level(py_logging.INFO)
  r = reporting.Reporter(str(tmp_path), 1000, 100, examples_per_step=None)
  metrics = lambda tokens: {**METRICS, "train/tokens": np.float32(tokens)}
  r.stepped(metrics(999))
  r.progress(1, metrics(999))
  for step in range(2, 201):  # 199 steps in 10 s, of 100 tokens each but the last, of 300
    r.stepped(metrics(300 if step == 200 else 100))
  clock[0] += 10.0
  r.progress(200, metrics(300))
  (row,) = [row for row in th.read_metrics(str(tmp_path)) if row["step"] == 200]
  assert row["train/tokens_per_s"] == pytest.approx((198 * 100 + 300) / 10)
  assert "19.90 steps/s, 2010 tok/s, data wait 0%" in _lines(caplog)[-1], _lines(caplog)[-1]


def test_eta_counts_the_evaluations_still_due_once_one_was_timed(tmp_path, clock, caplog):
  """The ETA adds the evaluations due before the end (the final one included) at the last measured time of each
  evaluator; nothing for one not timed yet. An MAE run said ETA 3s and ended 13 s later."""
  caplog.set_level(py_logging.INFO)
  evals = [_evaluator("eval", 100), _evaluator("probe", 150), _evaluator("other", None)]
  r = reporting.Reporter(str(tmp_path), 205, 50, None, evaluators=evals)
  r.progress(1, METRICS)
  clock[0] += 5.0
  r.progress(51, METRICS)  # 10 steps/s: 15.4 s of steps; no evaluation timed yet: nothing added, not a guess
  clock[0] += 4.9
  r.progress(100, METRICS)  # 10.5 s (the evaluation at step 100 comes after this line; untimed still)
  with r.pause():
    clock[0] += 8.0
    r.evaluated("eval", 8.0)
  clock[0] += 5.0
  r.progress(150, METRICS)  # 5.5 s, and eval's at 200 and at the end (205): 21.5 s; probe's are not timed yet
  with r.pause():
    clock[0] += 30.0
    r.evaluated("probe", 30.0)
  r.budget = r.elapsed() + 6.0
  clock[0] += 4.0
  r.progress(190, METRICS)  # 1.5 s, 2 x 8 s, 30 s: 47.5 s; the budget ends the run first: 2 s, then 8 s and 30 s
  clock[0] += 1.5
  r.progress(205, METRICS)  # the last line comes before the final evaluations: 38 s
  etas = [line.rsplit("| ETA ", 1)[1] for line in _lines(caplog)[1:]]
  assert etas == ["15s", "10s", "21s", "40s (time budget)", "38s"]


def test_a_checkpoint_records_the_training_time_a_resume_goes_on_from(tmp_path, clock):
  """train/elapsed_s (what max_train_minutes spends across sessions) at a saved step is recorded before the save,
  also when no progress line came at that step (a SIGTERM between lines, an evaluation after the line): a resume
  reads it exactly (it read the last logged row's, losing the time after it), and does not count its own start-up
  and compilation, which the uninterrupted run did not spend."""
  from vitjax.train import workdir as workdir_lib

  workdir = str(tmp_path)
  first = reporting.Reporter(workdir, 1000, 100, None, budget=100.0)
  clock[0] += 10.0  # compilation: a fresh run counts it
  first.progress(1, METRICS)
  clock[0] += 5.0
  first.progress(100, METRICS)
  with first.pause():  # an evaluation of step 100, then its save
    clock[0] += 3.0
    first.checkpoint(100)
  clock[0] += 2.0
  first.checkpoint(133)  # SIGTERM at step 133: no line there
  first.close()
  rows = th.read_metrics(workdir)
  assert [(row["step"], row["train/elapsed_s"]) for row in rows] == [(1, 10.0), (100, 15.0)]  # one per line
  assert workdir_lib.train_seconds(workdir, 100) == 18.0 and workdir_lib.train_seconds(workdir, 133) == 20.0
  spent = workdir_lib.train_seconds(workdir, 133)

  resumed = reporting.Reporter(workdir, 1000, 100, None, budget=100.0, purge_step=134, spent=spent, resumed=True)
  clock[0] += 7.0  # start-up and compilation again
  assert resumed.elapsed() == 20.0 and not resumed.over_budget()
  resumed.progress(134, METRICS)
  clock[0] += 3.0
  resumed.progress(200, METRICS)
  resumed.close()
  rows = th.read_metrics(workdir)
  assert [(row["step"], row["train/elapsed_s"]) for row in rows][2:] == [(134, 20.0), (200, 23.0)]
  resumed.budget = 22.5
  assert resumed.over_budget()
  # a workdir from before train_time.json: the last logged row at or before the step
  os.remove(os.path.join(workdir, "train_time.json"))
  assert workdir_lib.train_seconds(workdir, 133) == 15.0


def test_a_resume_keeps_the_metrics_rows_up_to_its_step_and_every_eval_mode_row(tmp_path):
  """metrics.jsonl on a resume from step 2: the rows of steps 1 and 2 stay (the step's own too), --mode=eval's rows
  (with a "source") stay whatever their step, the later rows and a row cut short by a kill go, and the file still
  ends in a newline for the rows appended next. Without train_time.json the time spent is the last training row's at
  or before the step (its own included), never an --mode=eval row's."""
  import json

  from vitjax.train import workdir as workdir_lib

  workdir = str(tmp_path)
  rows = [
    {"step": 1, "train/loss": 2.0, "train/elapsed_s": 4.0},
    {"step": 2, "train/loss": 1.0, "train/elapsed_s": 7.0},
    {"step": 3, "train/loss": 0.5, "train/elapsed_s": 9.0},
    {"step": 3, "eval/accuracy": 0.5},
  ]
  eval_mode = {"step": 5, "eval/accuracy": 0.6, "train/elapsed_s": 99.0, "source": "eval"}
  with open(os.path.join(workdir, "metrics.jsonl"), "w") as f:
    f.writelines(json.dumps(r) + "\n" for r in rows)
    f.write('{"step": 3, "train/lo\n')  # cut short by a kill
    f.write(json.dumps(eval_mode))  # the last line, without its newline
  assert workdir_lib.train_seconds(workdir, 2) == 7.0 and workdir_lib.train_seconds(workdir, 1) == 4.0
  assert workdir_lib.train_seconds(workdir, 9) == 9.0
  assert workdir_lib.drop_metrics_after(workdir, 2) == 3
  assert th.read_metrics(workdir) == [*rows[:2], eval_mode]
  assert open(os.path.join(workdir, "metrics.jsonl")).read().endswith("}\n")
  assert workdir_lib.drop_metrics_after(workdir, 2) == 0


def test_the_last_line_of_a_run_its_time_budget_ends_gives_the_planned_total(tmp_path, clock, caplog):
  caplog.set_level(py_logging.INFO)
  r = reporting.Reporter(str(tmp_path), 1680, 100, None, budget=60.0)
  r.progress(1, METRICS)
  clock[0] += 61.0
  assert r.over_budget() and not r.due(147) and r.due(147, heartbeat=True)  # (the loop asks for it)
  r.progress(147, METRICS)
  assert _lines(caplog)[-1].startswith("step 147/1680 | ")


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


def test_evaluation_progress_leaves_the_first_batchs_compilation_out_of_its_rate(clock, caplog):
  caplog.set_level(py_logging.INFO)
  p = logs.Progress("eval test", total=5, unit="sentences")
  clock[0] += 4.5  # the first batch compiles the evaluation's step
  p.update(items=8)
  clock[0] += 1.0
  p.update(items=8)
  assert _lines(caplog) == ["eval test: 2/5 batches | 8.0 sentences/s | ETA 3s"]  # it was 2.9 sentences/s, ETA 8s
  assert logs.plural(1, "metrics row") == "1 metrics row" and logs.plural(3, "metrics row") == "3 metrics rows"


_OURS = os.path.join(os.path.dirname(logs.__file__), "train", "loop.py")  # a vitjax module's path


def _record(path, level=py_logging.WARNING, msg="x", name="absl"):
  """A log record as if logged from `path`: vitjax's own (_OURS) or a library's."""
  return py_logging.LogRecord(name, level, path, 1, msg, None, None)


def test_library_info_is_hidden_at_the_default_verbosity():
  from absl import logging as absl_logging

  f = logs._Filter()
  record, ours = _record, _OURS
  theirs = "/site-packages/orbax/checkpoint/checkpoint_manager.py"
  old = absl_logging.get_verbosity()
  try:
    absl_logging.set_verbosity(0)
    assert f.filter(record(ours, py_logging.INFO)) and not f.filter(record(theirs, py_logging.INFO))
    assert f.filter(record(theirs, py_logging.WARNING))  # warnings always pass ...
    assert not f.filter(record(theirs, py_logging.WARNING, "Given directory is read only=/x"))  # ... but noise
    absl_logging.set_verbosity(1)
    assert f.filter(record(theirs, py_logging.INFO)) and f.filter(record(ours, py_logging.DEBUG))
    # the libraries' debug lines wait for 2: at 1 a 30-step run logged 11,392 lines (4,614 of PIL's PNG chunks)
    assert not f.filter(record(theirs, py_logging.DEBUG))
    absl_logging.set_verbosity(2)
    assert f.filter(record(theirs, py_logging.DEBUG))
  finally:
    absl_logging.set_verbosity(old)


def test_times_read_as_seconds_minutes_then_hours_from_their_first_whole_unit():
  assert [logs.fmt_time(t) for t in (-3.0, 0.4, 59.9, 60.0, 187.0, 3599.0, 3600.0, 3725.0, 90061.0)] == [
    "0s", "0s", "59s", "1m00s", "3m07s", "59m59s", "1h00m", "1h02m", "25h01m"
  ]  # fmt: skip
  assert logs.fmt_time(float("nan")) == logs.fmt_time(float("inf")) == logs.fmt_time(float("-inf")) == "?"


def test_a_later_process_logs_its_warnings_and_errors_only_each_naming_the_process_and_source():
  """Process 1 of 2 drops every INFO line (vitjax's too) and keeps every warning, its lines saying `process 1:`,
  the level (ERROR for anything above a warning) and the library they come from; process 0 logs as one process."""
  from absl import logging as absl_logging

  f, fmt = logs._Filter(), logs._Formatter()
  ours, theirs = _OURS, "/site-packages/orbax/checkpoint/checkpoint_manager.py"
  record = lambda path, level, msg="x": _record(path, level, msg, name="orbax")
  old = absl_logging.get_verbosity()
  try:
    absl_logging.set_verbosity(0)
    logs.set_process(1, 2)
    assert not f.filter(record(ours, py_logging.INFO)) and f.filter(record(ours, py_logging.WARNING))
    assert f.filter(record(theirs, py_logging.WARNING)) and f.filter(record(theirs, py_logging.ERROR))
    assert fmt.format(record(theirs, py_logging.WARNING, "slow")).endswith(" process 1: WARNING [orbax] slow")
    assert fmt.format(record(ours, py_logging.ERROR, "bad")).endswith(" process 1: ERROR bad")
    assert fmt.format(record(ours, py_logging.CRITICAL, "worse")).endswith(" process 1: ERROR worse")
    logs.set_process(0, 2)
    assert f.filter(record(ours, py_logging.INFO)) and not f.filter(record(theirs, py_logging.INFO))
    assert fmt.format(record(theirs, py_logging.WARNING, "slow"))[8:] == " WARNING [orbax] slow"
    assert fmt.format(record(ours, py_logging.INFO, "step 3"))[8:] == " step 3"
  finally:
    logs.set_process(0, 1)
    absl_logging.set_verbosity(old)


def test_a_full_disk_is_said_once_by_vitjax_not_by_each_library():
  """At the default verbosity a library's warning about a full disk, or a background thread that died of one, is
  hidden (the trainer says it in one line); vitjax's own line, and other failures, are not; --verbosity=1 shows all."""
  from absl import logging as absl_logging

  f = logs._Filter()
  ours, theirs = _OURS, "/site-packages/orbax/checkpoint/async_checkpointer.py"
  full = "write failed: [Errno 28] No space left on device"
  record = lambda path, msg: _record(path, msg=msg)
  seen = []
  hook = logs._quiet_thread_excepthook(lambda args: seen.append(type(args.exc_value).__name__))
  died = lambda e: hook(SimpleNamespace(exc_type=type(e), exc_value=e, exc_traceback=None, thread=None))
  old = absl_logging.get_verbosity()
  try:
    absl_logging.set_verbosity(0)
    assert not f.filter(record(theirs, full)) and f.filter(record(ours, full)) and f.filter(record(theirs, "slow"))
    died(OSError(errno.ENOSPC, "No space left on device"))
    died(ValueError("a bug"))
    assert seen == ["ValueError"]
    absl_logging.set_verbosity(1)
    assert f.filter(record(theirs, full))
    died(OSError(errno.ENOSPC, "No space left on device"))
    assert seen == ["ValueError", "OSError"]
  finally:
    absl_logging.set_verbosity(old)


def test_muted_drops_absls_info_and_warnings_but_never_an_error():
  absl = py_logging.getLogger("absl")
  record = lambda level, msg: _record(__file__, level, msg)
  with logs.muted():
    assert not absl.filter(record(py_logging.INFO, "x")) and not absl.filter(record(py_logging.WARNING, "x"))
    assert absl.filter(record(py_logging.ERROR, "x"))
  with logs.muted("Saving"):
    assert not absl.filter(record(py_logging.INFO, "Saving item")) and absl.filter(record(py_logging.INFO, "x"))
  assert absl.filter(record(py_logging.INFO, "Saving item"))  # the filter goes with the block


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
  error = "error: cannot write the workdir /w: no space is left (0.1 MiB free of 64.0 MiB)\n"

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


def test_a_resume_that_changes_the_schedule_says_where_the_learning_rate_goes(caplog):
  """A finished 300-step run extended to 500 steps (--allow_config_change) trains on a cosine over 500 steps: its
  learning rate jumps from the old end's ~0 back up. It went from lr 8.79e-08 to 8.67e-04 with only the config change
  named; now one line says it."""
  import types

  from vitjax.config import default_config
  from vitjax.train import notes, optim

  def resume(old, new, start):
    caplog.clear()
    schedule = optim.make_schedule(new, new.total_steps, 21, new.schedule.warmup_steps)
    run = types.SimpleNamespace(
      data=types.SimpleNamespace(steps_per_epoch=21, examples_per_step=64),
      exp=types.SimpleNamespace(schedule=schedule),
      plan=types.SimpleNamespace(total=new.total_steps),
    )
    notes.schedule_change(run, old, start)
    return _lines(caplog), optim.make_schedule(old, old.total_steps, 21, 30), schedule

  caplog.set_level(py_logging.INFO, logger="absl")  # (an earlier test may leave absl's logger at WARNING)
  old = default_config()
  old.total_steps, old.schedule.warmup_steps = 300, 30
  new = default_config()
  new.total_steps, new.schedule.warmup_steps = 500, 30
  (line,), was, now = resume(old, new, 300)
  assert line == (
    f"the learning-rate schedule now spans 500 steps (it spanned 300): the learning rate goes from {was(299):.2e} "
    f"(step 300, the old schedule's) to {now(300):.2e} (step 301, the new one's): a warm restart, not a continuation"
  )
  assert float(now(300)) > 100 * float(was(299))
  # a constant rate after the warm-up: a longer run goes on at the same rate
  old.schedule.decay = new.schedule.decay = "constant"
  (line,), _, _ = resume(old, new, 300)
  assert line == (
    "the learning-rate schedule now spans 500 steps (it spanned 300): the learning rate goes on from 1.00e-03 (step "
    "300) to 1.00e-03 (step 301), as the old schedule would have"
  )
  new.total_steps = 300  # the same schedule: nothing to say
  assert resume(old, new, 300)[0] == []


def test_the_last_step_always_gets_a_line_and_skipped_steps_are_named(tmp_path, clock, caplog):
  """A run whose length is no multiple of log_every still logs its last step (the line the user reads the end by);
  a line after non-finite steps were skipped says how many; the heartbeat's 30 s are at least, not more than."""
  caplog.set_level(py_logging.INFO)
  caplog.set_level(py_logging.INFO, logger="absl")  # (an earlier test may leave absl's logger at WARNING)
  r = reporting.Reporter(str(tmp_path), total_steps=105, log_every=50, examples_per_step=None)
  assert r.due(1)
  r.progress(1, METRICS)
  assert [s for s in (2, 49, 50, 51, 100, 104, 105) if r.due(s)] == [50, 100, 105]
  clock[0] += reporting.HEARTBEAT_SECONDS
  assert r.heartbeat_due()
  r.progress(105, {**METRICS, "train/skipped_steps": 2})
  assert "| lr 1.00e-03 | 2 non-finite steps skipped | 3.47 steps/s" in _lines(caplog)[-1], _lines(caplog)[-1]
  r.close()


def test_an_evaluation_line_names_its_split_and_examples_and_a_result_its_checkpoint():
  """Spreads (_std), the probe's regulariser (_l2) and the example count stay out of the metrics listed; the count
  goes in the brackets; a result says which checkpoint (EMA weights, initial weights) it is."""
  metrics = {
    "eval/loss": 0.5,
    "eval/accuracy": 0.75,
    "eval/10shot_std": 0.1,
    "eval/linear_l2": 1.0,
    "eval/examples": 300.0,
  }
  assert reporting.format_evaluation("valid", metrics) == "eval/loss 0.5000, eval/accuracy 0.7500 (valid, 300 examples)"
  assert reporting.format_evaluation("test", {"probe/accuracy": 0.5}) == "probe/accuracy 0.5000 (test)"
  row = {"step": 20, "checkpoint": "best", "split": "test", "weights": "ema", "eval/accuracy": 1.0, "other/x": 2.0}
  assert reporting.format_result(row) == "checkpoint best (step 20, EMA weights) | eval/accuracy 1.0000 (test)"
  row = {**row, "evaluator": "other", "weights": "params", "checkpoint": "init", "step": 0}
  assert reporting.format_result(row) == "initial weights (no training) | other/x 2.0000 (test)"


def test_a_read_orbax_abandoned_at_a_corrupt_checkpoint_is_not_printed_but_others_are():
  """After a corrupt checkpoint's first failed read, a coroutine orbax left behind printed 'Exception ignored in' with
  a traceback and a 60-line TensorStore spec when collected (1 run in 5), after the trainer's one line."""
  import types

  from absl import logging as absl_logging

  namespace = {}
  exec(
    compile("async def read():\n  pass\n", os.path.join(os.sep, "site-packages", "orbax", "s.py"), "exec"), namespace
  )
  exec(compile("async def mine():\n  pass\n", os.path.join(os.sep, "elsewhere", "m.py"), "exec"), namespace)
  seen = []
  hook = logs._quiet_unraisable_hook(seen.append)
  old = absl_logging.get_verbosity()
  coros = [namespace["read"](), namespace["mine"]()]
  try:
    absl_logging.set_verbosity(0)
    for coro in coros:
      hook(types.SimpleNamespace(object=coro))
    assert [u.object.cr_code.co_name for u in seen] == ["mine"]
    absl_logging.set_verbosity(1)
    hook(types.SimpleNamespace(object=coros[0]))
    assert len(seen) == 2  # shown when asked for
  finally:
    absl_logging.set_verbosity(old)
    for coro in coros:
      coro.close()
