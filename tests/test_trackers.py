"""config.trackers (vitjax.train.trackers): Weights & Biases beside metrics.jsonl and TensorBoard, offline (no
network): a run stopped by SIGTERM and resumed is one W&B run, with the same metrics as metrics.jsonl, the run's
config, and the best step's metrics as its summary; a missing wandb package or a W&B that cannot start is one
warning line, and the run trains to its end.

W&B's offline files (WORKDIR/wandb/offline-run-*/run-ID.wandb) are read with wandb's own record type
(wandb.proto.wandb_internal_pb2.Record); wandb 0.31 has no Python reader of the file (its sync is in Go), so
`_records` reads the LevelDB log framing around the records (W&B's header, then 32 KiB blocks of chunks).
"""

import glob
import json
import os
import signal
import struct

import pytest
import train_helpers as th

WANDB = "--config.trackers=('tensorboard', 'wandb')"


@pytest.fixture
def wandb_env(tmp_path, monkeypatch):
  """W&B offline, its own files (settings, cache) under tmp_path rather than the home directory."""
  pytest.importorskip("wandb")
  monkeypatch.setenv("WANDB_MODE", "offline")
  for var in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR", "WANDB_ARTIFACT_DIR"):
    monkeypatch.setenv(var, str(tmp_path / "wandb_home" / var.lower()))
  monkeypatch.delenv("WANDB_API_KEY", raising=False)


def _records(path: str):
  """The records of a .wandb file, in order, as wandb's protobuf Records."""
  from wandb.proto import wandb_internal_pb2

  data = open(path, "rb").read()
  assert data[:4] == b":W&B", path
  block, pos, chunks = 32768, 7, b""
  while pos + 7 <= len(data):
    if block - pos % block < 7:  # a block's tail too short for a chunk header is padding
      pos += block - pos % block
      continue
    _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
    if length == 0 and kind == 0:
      break
    chunks += data[pos + 7 : pos + 7 + length]
    pos += 7 + length
    if kind in (1, 4):  # FULL, or LAST of FIRST/MIDDLE.../LAST
      record = wandb_internal_pb2.Record()
      record.ParseFromString(chunks)
      yield record
      chunks = b""


def _items(items) -> dict:
  return {"/".join(i.nested_key) or i.key: json.loads(i.value_json) for i in items}


def _offline_runs(workdir: str) -> list[dict]:
  """Each offline session of the run: its id, config, history rows by step and summary updates, oldest first."""
  runs = []
  for path in sorted(glob.glob(os.path.join(workdir, "wandb", "offline-run-*", "run-*.wandb"))):
    run = {"id": None, "config": {}, "history": {}, "summary": {}}
    for record in _records(path):
      kind = record.WhichOneof("record_type")
      if kind == "run":
        run["id"] = record.run.run_id
        run["config"] = _items(record.run.config.update)
      elif kind == "history":
        row = _items(record.history.item)
        if "step" in row:
          run["history"].setdefault(row["step"], {}).update(row)
      elif kind == "summary":
        run["summary"].update(_items(record.summary.update))
    runs.append(run)
  return runs


def test_a_resumed_run_is_one_wandb_run_with_the_metrics_config_and_best_summary(run_args, tmp_path, wandb_env):
  workdir = str(tmp_path / "w")
  proc = th.start_main(workdir, *run_args, WANDB)
  for line in proc.stdout:
    if " step 13/30 " in line:
      proc.send_signal(signal.SIGTERM)
      break
  out, _ = proc.communicate(timeout=120)
  assert proc.returncode == 75, out[-2000:]
  resumed = th.check_ok(th.run_main(workdir, *run_args, WANDB))
  run_id = open(os.path.join(workdir, "wandb_run_id")).read().strip()
  assert f"W&B: run {run_id} (w), project vitjax, offline files in" in resumed.stderr, resumed.stderr[-2000:]

  runs = _offline_runs(workdir)
  assert len(runs) == 2 and {r["id"] for r in runs} == {run_id}, [r["id"] for r in runs]
  stopped = max(runs[0]["history"])
  assert 13 <= stopped < 30 and min(runs[1]["history"]) == stopped + 1, (sorted(runs[0]["history"]), stopped)
  logged = {s: row for r in runs for s, row in r["history"].items()}
  rows = th.read_metrics(workdir)  # the same names and values as metrics.jsonl (rows at or past the stop dropped)
  for row in rows:
    for key, value in row.items():
      assert logged[row["step"]][key] == pytest.approx(value, rel=1e-6), (row["step"], key)
  assert sorted(logged) == sorted({r["step"] for r in rows}) == list(range(1, 31))
  assert runs[0]["config"]["model"]["width"] == 16 and runs[0]["config"]["total_steps"] == 30, runs[0]["config"]

  evals = {r["step"]: r["eval/accuracy"] for r in rows if "eval/accuracy" in r}
  best = max(evals, key=lambda s: (evals[s], s))  # the later of equal steps is best
  summary = {**runs[0]["summary"], **runs[1]["summary"]}
  assert summary["best/step"] == best and summary["best/eval/accuracy"] == pytest.approx(evals[best]), summary
  assert th.finished_steps(workdir)[-1] == 30 and os.path.isdir(os.path.join(workdir, "tb"))


@pytest.mark.parametrize("problem", ["no package", "no API key"])
def test_wandb_that_cannot_start_is_one_warning_and_the_run_goes_on(
  problem, run_args, tmp_path, wandb_env, monkeypatch
):
  if problem == "no package":  # an importable path where `import wandb` fails, as where it is not installed
    fake = tmp_path / "fake" / "wandb"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('No module named wandb')\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "fake"))
    says = "config.trackers has 'wandb' but the wandb package is not installed (pip install wandb)"
  else:  # online, with no key: W&B refuses to start
    monkeypatch.setenv("WANDB_MODE", "online")
    monkeypatch.setenv("WANDB_BASE_URL", "http://127.0.0.1:9")
    says = "W&B: could not start the run ("
  workdir = str(tmp_path / "w")
  # (a warm-up shorter than the 10 steps: else its own warning)
  proc = th.check_ok(
    th.run_main(workdir, *run_args, WANDB, "--config.total_steps=10", "--config.schedule.warmup_steps=2")
  )
  lines = proc.stderr.splitlines()
  warnings = [s for s in lines if " WARNING" in s or " ERROR" in s or s.startswith("wandb:") or "W&B" in s]
  assert len(warnings) == 1 and says in warnings[0] and "metrics.jsonl" in warnings[0], proc.stderr[-3000:]
  assert "Traceback" not in proc.stderr
  assert [r["step"] for r in th.read_metrics(workdir) if "train/loss" in r] == list(range(1, 11))


def test_tracker_names_are_checked_and_metrics_jsonl_is_always_written(tmp_path):
  """config.trackers: a tuple of known names (a bare string is the usual slip, each of its letters no tracker);
  metrics.jsonl comes first whatever the tuple, TensorBoard only when named."""
  from vitjax.errors import ConfigError
  from vitjax.train import trackers

  for names in ("tensorboard", ("tensorboard", 1)):
    with pytest.raises(ConfigError, match=r"give a tuple of names, e\.g\. --config\.trackers="):
      trackers.check({"trackers": names})
  with pytest.raises(ConfigError, match="unknown tracker 'tb'; the trackers are jsonl, tensorboard, wandb"):
    trackers.check({"trackers": ("jsonl", "tb")})
  trackers.check({"trackers": ()})
  trackers.check({})
  none = trackers.open_trackers(str(tmp_path / "a"), {"trackers": ()}, None)
  default = trackers.open_trackers(str(tmp_path / "b"), {}, None)
  try:
    assert [type(t).__name__ for t in none] == ["Jsonl"] and not os.path.exists(tmp_path / "a" / "tb")
    assert [type(t).__name__ for t in default] == ["Jsonl", "TensorBoard"]
  finally:
    for t in none + default:
      t.close()


def test_tensorboard_drops_what_a_killed_session_wrote_from_the_resumed_step_on(tmp_path):
  """purge_step: TensorBoard's reader shows each step once, the resumed session's values from purge_step on, and the
  killed session's before it."""
  from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

  from vitjax.train import trackers

  logdir = str(tmp_path / "tb")
  killed = trackers.TensorBoard(logdir, None)
  for step in range(1, 6):
    killed.scalars(step, {"train/loss": float(step)})
  killed.close()
  resumed = trackers.TensorBoard(logdir, 3)  # resumed from the checkpoint of step 2
  for step in (3, 4):
    resumed.scalars(step, {"train/loss": 10.0 * step})
  resumed.close()
  acc = EventAccumulator(logdir)
  acc.Reload()
  assert [(e.step, e.value) for e in acc.Scalars("train/loss")] == [(1, 1.0), (2, 2.0), (3, 30.0), (4, 40.0)]


class _FakeWandbRun:
  """What the tracker calls of a wandb Run; `fail`: the calls that raise (a W&B service gone mid-run)."""

  def __init__(self, fail=()):
    self.fail, self.logged, self.summary_updates, self.finished = fail, [], [], 0
    self.summary = self

  def _maybe_fail(self, what):
    if what in self.fail:
      raise RuntimeError(f"{what}: the service\n  is unreachable")

  def log(self, row):
    self._maybe_fail("log")
    self.logged.append(row)

  def update(self, values):
    self._maybe_fail("summary")
    self.summary_updates.append(values)

  def finish(self):
    self._maybe_fail("finish")
    self.finished += 1


def test_wandb_logs_by_step_and_a_failing_call_turns_it_off_with_one_warning(caplog):
  """A W&B call that fails is one warning line (its error on one line), and W&B is off for the rest of the run: no
  warning per step after it. A run closes once."""
  import logging as py_logging

  from vitjax.train import trackers

  caplog.set_level(py_logging.WARNING)
  run = _FakeWandbRun()
  ok = trackers.WandB(run)
  ok.scalars(3, {"train/loss": 1.5})
  ok.best(3, {"eval/accuracy": 0.5})
  ok.close()
  ok.close()
  assert run.logged == [{"step": 3, "train/loss": 1.5}] and run.finished == 1
  assert run.summary_updates == [{"best/step": 3, "best/eval/accuracy": 0.5}]
  assert not [r for r in caplog.records if r.levelno >= py_logging.WARNING]

  run = _FakeWandbRun(fail=("log",))
  broken = trackers.WandB(run)
  for step in range(1, 4):
    broken.scalars(step, {"train/loss": 1.0})
  broken.best(3, {"eval/accuracy": 0.5})
  broken.close()
  warnings = [r.getMessage() for r in caplog.records if r.levelno >= py_logging.WARNING]
  assert warnings == ["W&B: logging failed (log: the service is unreachable): W&B is off for the rest of this run"], (
    warnings
  )
  assert run.summary_updates == [] and run.finished == 0
  assert trackers._one_line(RuntimeError()) == "RuntimeError"
  assert trackers._one_line(ValueError("x" * 300)) == "x" * 197 + "..."
