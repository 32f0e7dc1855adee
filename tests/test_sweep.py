"""vitjax.sweep: get_sweep() forms, a sweep end to end on SQLite, SIGKILL and rerun, a lost worker's trial taken
over through heartbeats, and two sweep processes sharing one study on a real PostgreSQL server."""

from __future__ import annotations

import csv
import importlib.util
import json
import math
import os
import re
import signal
import subprocess
import sys
import time

import pytest
import train_helpers as th

from vitjax import sweep
from vitjax.errors import ConfigError

sys.path.insert(0, os.path.join(th.ROOT, "configs"))
from vit_digits import get_config  # noqa: E402

# ------------------------------------------------------------------ get_sweep(): grid and search-space forms


def _config_file(tmp_path, body: str, name: str = "cfg.py") -> str:
  path = tmp_path / name
  path.write_text(
    f"import sys\nsys.path.insert(0, {os.path.join(th.ROOT, 'configs')!r})\n"
    "from vit_digits import get_config  # noqa: F401\nfrom vitjax import sweep\n\n" + body
  )
  return str(path)


def test_grid_product_and_zip():
  grid = sweep.product(
    sweep.values("optim.lr", [1e-3, 2e-3, 4e-3]),
    sweep.zip(sweep.values("model.depth", [2, 4]), sweep.values("model.mlp_dim", [64, 128])),
  )
  assert len(grid) == 6
  assert grid[0] == {"optim.lr": 1e-3, "model.depth": 2, "model.mlp_dim": 64}
  assert grid[1] == {"optim.lr": 1e-3, "model.depth": 4, "model.mlp_dim": 128}  # the last axis varies fastest
  with pytest.raises(ConfigError, match="different lengths"):
    sweep.zip(sweep.values("a", [1, 2]), sweep.values("b", [1]))
  with pytest.raises(ConfigError, match="twice"):
    sweep.product(sweep.values("a", [1]), sweep.values("a", [2]))


def test_load_grid_and_space(tmp_path):
  path = _config_file(
    tmp_path,
    "def get_sweep():\n"
    "  return dict(grid=sweep.product(sweep.values('optim.lr', [1e-3, 2e-3]), sweep.values('model.depth', [2, 4])),\n"
    "              objective='eval/accuracy', direction='maximize', pruner='median')\n",
  )
  s = sweep.load(path, get_config())
  assert s.size == 4 and s.fields == ["optim.lr", "model.depth"] and s.pruner == "median"
  assert s.dims()["model.depth"].choices == (2, 4)
  assert sweep.flag("optim.lr", 1e-3) == "--config.optim.lr=0.001"

  path = _config_file(
    tmp_path,
    "def get_sweep():\n"
    "  return dict(space={'optim.lr': sweep.log_uniform(1e-4, 1e-2), 'model.dropout_rate': sweep.uniform(0, 0.3),\n"
    "                     'schedule.warmup_epochs': sweep.integer(1, 5), 'data.augment.flip': sweep.choice(True, False)},\n"
    "              trials=7, objective='eval/loss', direction='minimize', sampler='random', seed=3)\n",
    "space.py",
  )
  s = sweep.load(path, get_config())
  assert s.size == 7 and s.direction == "minimize" and s.space["optim.lr"].log
  assert s.dims()["data.augment.flip"].optuna().choices == (True, False)


@pytest.mark.parametrize(
  "body, message",
  [
    (
      "def get_sweep():\n  return dict(grid=sweep.values('optim.lrr', [1]), objective='eval/accuracy', "
      "direction='maximize')\n",
      "optim.lrr' is not in the config",
    ),
    (
      "def get_sweep():\n  return dict(grid=sweep.values('model.depth', [2.5]), objective='eval/accuracy', "
      "direction='maximize')\n",
      "model.depth=2.5 is a float",
    ),
    (
      "def get_sweep():\n  return dict(space={'optim.lr': sweep.log_uniform(1e-4, 1e-2)}, objective='eval/accuracy', "
      "direction='maximize')\n",
      "trials=None",
    ),
    (
      "def get_sweep():\n  return dict(grid=sweep.values('optim.lr', [1e-3]), objective='accuracy', "
      "direction='maximize')\n",
      "name an evaluator's metric",
    ),
    (
      "def get_sweep():\n  return dict(grid=sweep.values('optim.lr', [1e-3]), objective='eval/accuracy', "
      "direction='up')\n",
      "direction='up'",
    ),
    (
      "def get_sweep():\n  return dict(grid=sweep.values('optim.lr', [1e-3]), objective='eval/accuracy', "
      "direction='maximize', pruners='median')\n",
      "unknown keys",
    ),
    ("def get_config_only():\n  pass\n", "has no get_sweep"),
    (
      "def get_sweep():\n  return dict(grid=sweep.values('optim.lr', 1e-3), objective='eval/accuracy', "
      "direction='maximize')\n",
      "takes a list of values",
    ),
    (
      "def get_sweep():\n  return dict(space={'model.depth': sweep.integer(1, 8, step=0.5)}, trials=2, "
      "objective='eval/accuracy', direction='maximize')\n",
      "takes integers",
    ),
    (
      "def get_sweep():\n  return dict(grid=sweep.values('optim.lr', [1e-3]), objective='eval/accuracy', "
      "direction='maximize', pruner=undefined_name)\n",
      "get_sweep() raised NameError",
    ),
    (
      "def get_sweep():\n  return dict(grid=sweep.values('optim.lr', [1e-3]), objective='eval/accuracy', "
      "direction='maximize', seed=True)\n",
      "seed=True: give an integer",
    ),
    (
      "def get_sweep():\n  return dict(grid=sweep.values('optim.lr', [1e-3]), objective='train/loss', "
      "direction='minimize')\n",
      "objective='train/loss': name an evaluator's metric",
    ),
    (
      "def get_sweep():\n  return dict(grid=[{'optim.lr': 1e-3}, {'model.depth': 2}], objective='eval/accuracy', "
      "direction='maximize')\n",
      "every grid point must set the same fields (here ['optim.lr'])",
    ),
    (
      "def get_sweep():\n  return dict(grid=sweep.values('optim.lr', [1e-3]), trials=4, objective='eval/accuracy', "
      "direction='maximize')\n",
      "trials= is for a search space",
    ),
    (
      "def get_sweep():\n  return dict(space={'optim.lr': sweep.log_uniform(1e-4, 1e-2)}, trials=0, "
      "objective='eval/accuracy', direction='maximize')\n",
      "trials=0: a search space needs trials=N, N >= 1",
    ),
    (
      "def get_sweep():\n  return dict(objective='eval/accuracy', direction='maximize')\n",
      "needs exactly one of grid= (a list of points) and space=",
    ),
    (
      "def get_sweep():\n  return dict(space={'model.depth': sweep.integer(2, 16, step=2, log=True)}, trials=2, "
      "objective='eval/accuracy', direction='maximize')\n",
      "sweep.integer(..., log=True) takes no step (step=2)",
    ),
    (  # before: trials 0 and 2 trained the same point, and the report did not say so
      "def get_sweep():\n  return dict(space={'optim.lr': sweep.choice(1e-3, 4e-3), 'model.depth': sweep.integer(1, 3, "
      "step=2)}, trials=5, objective='eval/accuracy', direction='maximize')\n",
      "space= holds 4 points, fewer than trials=5: give trials=4 or fewer, or grid= (sweep.product)",
    ),
  ],
)
def test_bad_sweep_is_one_line(tmp_path, body, message):
  with pytest.raises(ConfigError, match=re.escape(message)):
    sweep.load(_config_file(tmp_path, body), get_config())


def test_a_dimension_counts_its_values_as_optuna_draws_them():
  """What trials= is checked against: 0, 0.1, 0.2 and 0.3 are 4 values (0.3 // 0.1 is 2.0 in binary floating point),
  a repeated choice counts once, a continuous range has no count."""
  assert sweep.uniform(0, 0.3, step=0.1).size() == 4 and sweep.uniform(0.0, 1.0, step=0.25).size() == 5
  assert sweep.integer(1, 3, step=2).size() == 2 and sweep.integer(2, 16, log=True).size() == 15
  assert sweep.choice(1, 1, 2).size() == 2 and sweep.log_uniform(1e-4, 1e-2).size() is None


@pytest.mark.parametrize(
  "space, message",
  [
    # a boolean is no integer, though Python's bool is an int
    ("{'model.depth': sweep.choice(2, True)}", "model.depth=True is a bool, the config's model.depth a int"),
    # every choice of a dimension is checked, the third too where the other dimensions have two points
    ("{'optim.lr': sweep.log_uniform(1e-4, 1e-2), 'data.augment.flip': sweep.choice(True, False, 'yes')}",
     "data.augment.flip='yes' is a str"),
  ],
)  # fmt: skip
def test_every_point_of_a_search_space_is_checked_against_the_config(tmp_path, space, message):
  """A search space is checked at its corners: each dimension's ends and every one of its choices."""
  body = f"def get_sweep():\n  return dict(space={space}, trials=2, objective='eval/accuracy', direction='maximize')\n"
  with pytest.raises(ConfigError, match=re.escape(message)):
    sweep.load(_config_file(tmp_path, body), get_config())


def test_a_swept_field_that_is_none_in_the_config_is_refused():
  """A field whose get_config() value is None has no type to check a value against: one line saying to give it one."""
  import ml_collections as mlc

  config = mlc.ConfigDict({"model": {"pool": None, "depth": 2}})
  sweep.check_overrides(config, {"model.depth": 4})
  with pytest.raises(ConfigError, match=re.escape("field 'model.pool' is None in get_config(); give it a value there")):
    sweep.check_overrides(config, {"model.pool": "gap"})


def test_ranges_are_refused_where_optuna_could_not_draw_from_them():
  """An axis without values, a log scale reaching 0, a step of 0: one line each when get_sweep() runs; a range of
  one value (low == high) is a range."""
  with pytest.raises(ConfigError, match=re.escape("sweep.values('optim.lr', ...) has no values")):
    sweep.values("optim.lr", [])
  assert sweep.uniform(0.5, 0.5).low == sweep.uniform(0.5, 0.5).high == 0.5
  assert sweep.integer(3, 3).describe() == "int in [3, 3] (linear, step 1)"
  with pytest.raises(ConfigError, match="needs finite low <= high"):
    sweep.uniform(0.6, 0.5)
  with pytest.raises(ConfigError, match=re.escape("a log-scale range [0.0, 0.01] needs low > 0")):
    sweep.log_uniform(0, 1e-2)
  for step in (0, -0.1):
    with pytest.raises(ConfigError, match=f"step={step} must be positive"):
      sweep.uniform(0.0, 1.0, step=step)


def test_grid_values_keep_their_types_in_the_trials_flags_and_directories():
  """A grid axis's values 1, 1.0 and True are three choices (equal in Python, not on the command line); a numpy
  float is passed as a plain number; a trial's directory has four digits at least."""
  import numpy as np

  s = sweep.Sweep("eval/accuracy", "maximize", grid=[{"x": 1}, {"x": 1.0}, {"x": True}, {"x": 1}])
  assert [(type(c), c) for c in s.dims()["x"].choices] == [(int, 1), (float, 1.0), (bool, True)]
  assert sweep.flag("optim.lr", np.float64(1e-3)) == "--config.optim.lr=0.001"
  assert (
    sweep.flag("optim.lr", 2.0) == "--config.optim.lr=2.0" and sweep.flag("model.depth", 4) == "--config.model.depth=4"
  )
  assert sweep.trial_dir("/s", 7) == os.path.join("/s", "trial_0007")
  assert sweep.trial_dir("/s", 12345) == os.path.join("/s", "trial_12345")


def test_bad_command_line_is_one_line(tmp_path, data_dir):
  """A bad flag of the sweep's own, a config the trials would refuse, a storage that cannot open: one error line,
  exit 2, no sweep directory (nor the new folder above it) left behind. A bad config is refused before the sweep
  exists, so the corrected command makes the same sweep."""
  sweep_dir = str(tmp_path / "new" / "sweep")
  for args, words in (
    (["--grace=5"], "--grace=5"),
    (["--workers=64"], "--workers=64"),
    (["--max_trials=0"], "--max_trials=0"),
    (["--config.data.eval_batch_size=0"], "data.eval_batch_size=0 must be positive"),
    (["--storage=foo://bar"], "foo"),
  ):
    args = [f"--config.data.data_dir={data_dir}", *args]
    proc = th.run_module("sweep", f"--config={th.CONFIG}", f"--sweep_dir={sweep_dir}", *args, timeout=120)
    assert proc.returncode == 2 and th.error_lines(proc).count("\n") == 0 and "error: " in proc.stderr, proc.stderr
    assert words in th.error_lines(proc), (words, proc.stderr[-2000:])
    assert not os.path.exists(tmp_path / "new"), args
  for objective, direction, says in (
    ("eval/loss", "maximize", "direction='maximize', but eval/loss is better lower: direction='minimize'"),
    ("eval/acc", "maximize", "objective='eval/acc' is not reported by config.evals; use one of ["),
  ):  # the sweep completed and chose the highest loss
    body = f"def get_sweep():\n  return dict(grid=sweep.values('optim.lr', [1e-3]), objective={objective!r}, "
    cfg = _config_file(tmp_path, body + f"direction={direction!r})\n", f"{direction}_{objective[5:]}.py")
    proc = th.run_module("sweep", f"--config={cfg}", f"--sweep_dir={sweep_dir}", f"--config.data.data_dir={data_dir}")
    th.assert_refused(proc, [says])
    assert not os.path.exists(tmp_path / "new")
  run = tmp_path / "a_run"  # a run's workdir is no sweep's folder, nor a sweep's folder a run's workdir
  run.mkdir()
  (run / "config.json").write_text("{}\n")
  proc = th.run_module("sweep", f"--config={th.CONFIG}", f"--sweep_dir={run}", f"--config.data.data_dir={data_dir}")
  th.assert_refused(proc, [f"--sweep_dir={run} is a run's workdir (it holds config.json)"])
  assert os.listdir(run) == ["config.json"]
  swept = tmp_path / "a_sweep"
  swept.mkdir()
  (swept / "sweep.json").write_text("{}\n")
  proc = subprocess.run(th.main_cmd(str(swept), f"--config.data.data_dir={data_dir}"), cwd=th.ROOT, env=th.env(),
                        capture_output=True, text=True, timeout=120)  # fmt: skip
  th.assert_refused(proc, [f"--workdir={swept} is a sweep's folder (it holds sweep.json)"])
  assert os.listdir(swept) == ["sweep.json"]


def test_command_line_overrides_and_sweep_dir_records(tmp_path):
  """The trials' --config.FIELD overrides, as --config.F=V or --config.F V, the rest left out; a sweep_dir that is
  a file, or holds another sweep's record (another study or storage), or a record that is not one: one line each.
  (vitjax.sweep.__main__ defines flags: it is imported in a process of its own.)"""
  script = f"""
import json, os
from vitjax.errors import ConfigError
from vitjax.sweep import __main__ as m
argv = ["vitjax.sweep", "--config=runs/lr=1/c.py:tiny", "--config.a=1", "--config.b", "2", "--workers=2", "--config.c",
        "--config.d", "-3", "--config.e"]
print(json.dumps(m._overrides(argv)), m._config_arg(argv))
import ml_collections
from vitjax import sweep
for best in ("eval/loss", "eval/accuracy"):  # a trial's best checkpoint: the step the sweep ranks it by
  s = sweep.Sweep(objective="eval/loss", direction="minimize", grid=[{{}}])
  print(m._trial_command("c.py", ["--config.a=1"], ml_collections.ConfigDict(dict(best=best)), s)[3:])
def check(sweep_dir, record):
  try:
    m._check_sweep_dir(sweep_dir, record)
    print("ok")
  except ConfigError as e:
    print(e)
d = {str(tmp_path)!r}
record = {{"study": "s", "storage": "sqlite:///x.db", "command": "python -m vitjax.sweep --config=c.py"}}
check(os.path.join(d, "new"), record)
with open(os.path.join(d, "sweep.json"), "w") as f:
  json.dump(record, f)
check(d, record)
check(d, {{**record, "study": "t"}})
check(d, {{**record, "storage": "sqlite:///y.db"}})
check(os.path.join(d, "sweep.json"), record)
for odd in ("[1]", json.dumps({{"study": "s"}})):
  with open(os.path.join(d, "sweep.json"), "w") as f:
    f.write(odd)
  check(d, record)
"""
  proc = subprocess.run([sys.executable, "-c", script], cwd=th.ROOT, env=th.env(), capture_output=True, text=True)
  assert proc.returncode == 0, proc.stderr[-3000:]
  d = str(tmp_path)
  assert proc.stdout.splitlines() == [
    '["--config.a=1", "--config.b=2", "--config.c", "--config.d", "--config.e"] runs/lr=1/c.py:tiny',
    "['--config=c.py', '--config.a=1']",
    "['--config=c.py', '--config.a=1', '--config.best=eval/loss']",
    "ok",
    "ok",
    f"{d} holds the sweep 's' on sqlite:///x.db, not 't' on sqlite:///x.db: rerun its command (python -m vitjax.sweep "
    "--config=c.py) or give a new --sweep_dir",
    f"{d} holds the sweep 's' on sqlite:///x.db, not 's' on sqlite:///y.db: rerun its command (python -m vitjax.sweep "
    "--config=c.py) or give a new --sweep_dir",
    f"--sweep_dir={d}/sweep.json is a file; give a directory",
    f"{d}/sweep.json is not a sweep's record (no study and storage); restore it, or give a new --sweep_dir",
    f"{d}/sweep.json is not a sweep's record (no study and storage); restore it, or give a new --sweep_dir",
  ], proc.stdout


# ------------------------------------------------------------------ the runner, end to end (subprocesses)


def _sweep_config(tmp_path, lrs=None, seeds=None, pruner="none") -> str:
  """A config file whose sweep zips the given learning rates and validation-split seeds. Trials that differ only
  in data.valid_seed share one compiled step (through the session's compilation cache); a learning rate or
  config.seed is a constant of the step, so each value compiles its own."""
  axes = [f"sweep.values({k!r}, {v!r})" for k, v in (("optim.lr", lrs), ("data.valid_seed", seeds)) if v is not None]
  return _config_file(
    tmp_path,
    f"def get_sweep():\n  return dict(grid=sweep.zip({', '.join(axes)}), objective='eval/accuracy',\n"
    f"              direction='maximize', pruner={pruner!r})\n",
    "sweep_cfg.py",
  )


# The tiny run's overrides without its per-step progress rows and checkpoints every 5 steps (a sweep test runs
# several trials; each trial compiles its own step, the learning rate being a constant in it).
LIGHT = ["--config.log_every=5", "--config.checkpoint_every=10"]


def _sweep_cmd(config, sweep_dir, run_args, *args):
  return [sys.executable, "-m", "vitjax.sweep", f"--config={config}", f"--sweep_dir={sweep_dir}", *args, *run_args]


def _run(cmd, timeout=300) -> subprocess.CompletedProcess:
  """Runs a _sweep_cmd to completion through the fork server (th.run_module: the same process, less the imports)."""
  assert cmd[:3] == [sys.executable, "-m", "vitjax.sweep"], cmd
  return th.run_module("sweep", *cmd[3:], timeout=timeout)


def _csv(sweep_dir) -> list[dict]:
  with open(os.path.join(sweep_dir, "trials.csv")) as f:
    return list(csv.DictReader(f))


def _launches(sweep_dir, n) -> int:
  """How many times trial n's run was started (each start writes a '===' header to its log)."""
  with open(os.path.join(sweep_dir, "logs", f"trial_{n:04d}.log")) as f:
    return sum(line.startswith("=== ") for line in f)


def _study_trials(sweep_dir, storage=None) -> list:
  import optuna

  with open(os.path.join(sweep_dir, "sweep.json")) as f:
    record = json.load(f)
  return optuna.load_study(study_name=record["study"], storage=storage or record["storage"]).get_trials()


def test_sweep_end_to_end(tmp_path, run_args):
  """Four trials on two workers (one where the process may use one core only: a worker per core); the one with a
  huge learning rate diverges and is recorded as failed with its error line while the others complete; a rerun
  runs nothing again."""
  config = _sweep_config(tmp_path, lrs=[2e-3, 2e-3, 1e30, 2e-3], seeds=[0, 1, 2, 3])
  sweep_dir = str(tmp_path / "sweep")
  workers = min(2, len(os.sched_getaffinity(0)))
  cmd = _sweep_cmd(config, sweep_dir, [*run_args, *LIGHT], f"--workers={workers}")
  proc = th.check_ok(_run(cmd, timeout=600))
  rows = _csv(sweep_dir)
  assert len(rows) == 4
  states = {int(r["data.valid_seed"]): r["state"] for r in rows}  # the slots take the grid in a shuffled order
  assert states == {0: "complete", 1: "complete", 2: "fail", 3: "complete"}, rows  # seed 2 is lr 1e30's point
  failed = next(r for r in rows if r["state"] == "fail")
  assert "not finite" in failed["error"] and f"trial {failed['trial']} failed: step" in proc.stderr
  assert "os.fork() was called" not in proc.stderr  # trials start without a preexec_fn in the sweep's JAX process
  complete = [r for r in rows if r["state"] == "complete"]
  assert [float(r["objective"]) for r in complete] == sorted((float(r["objective"]) for r in complete), reverse=True)
  for r in complete:  # an ordinary run: its config, checkpoints and metrics, the trial's value in its config
    workdir = os.path.join(sweep_dir, f"trial_{int(r['trial']):04d}")
    with open(os.path.join(workdir, "config.json")) as f:
      saved = json.load(f)
    assert saved["optim"]["lr"] == float(r["optim.lr"])
    # a W&B run (config.trackers with "wandb") is named by its trial, in a group named by the sweep
    assert saved["wandb"]["name"] == f"trial_{int(r['trial']):04d}", saved["wandb"]
    assert saved["wandb"]["group"] == os.path.basename(sweep_dir), saved["wandb"]
    assert os.path.isdir(os.path.join(workdir, "checkpoints"))
    assert int(r["last_step"]) == 30 and int(r["best_step"]) in (10, 20, 30)
    curve = [(m["step"], m["eval/accuracy"]) for m in th.read_metrics(workdir) if "eval/accuracy" in m]
    top = max(a for _, a in curve)  # of equal evaluations the later step, as the trainer's `best` checkpoint
    assert int(r["best_step"]) == max(step for step, a in curve if a == top), (r, curve)
  report = open(os.path.join(sweep_dir, "report.md")).read()
  assert "## Best: trial" in report and "python -m vitjax.main --config=" in report
  assert "Parameter importances from 3 complete trials are not reliable (fewer than 10)" in report
  for png in ("objective_vs_params.png", "curves.png", "parallel_coordinate.png", "importance.png"):
    assert os.path.getsize(os.path.join(sweep_dir, png)) > 1000, png

  again = th.check_ok(_run(cmd))
  assert " on CPU core" not in again.stderr  # nothing claimed
  assert len(_study_trials(sweep_dir)) == 4 and all(_launches(sweep_dir, n) == 1 for n in range(4))

  report = th.check_ok(th.run_module("sweep", "--mode=report", f"--sweep_dir={sweep_dir}"))
  assert "4 trials: 3 complete, 1 fail" in report.stderr

  # the same sweep_dir for a different sweep: one line, nothing touched
  other = _run(_sweep_cmd(config, sweep_dir, [*run_args, *LIGHT], "--config.total_steps=40"))
  assert other.returncode == 2 and th.error_lines(other).startswith("error: ") and "new --sweep_dir" in other.stderr


def test_poor_trial_is_pruned(tmp_path, run_args):
  """The median pruner stops a trial whose evaluation is below the median of earlier trials at the same step:
  three finished trials are put in the study first, the fourth (a learning rate too small to learn) runs."""
  from vitjax.sweep import runner
  from vitjax.sweep import study as study_lib

  config = _sweep_config(tmp_path, seeds=[0, 1, 2, 3], pruner="median")
  sweep_dir = str(tmp_path / "sweep")
  os.makedirs(sweep_dir)
  s = sweep.load(config, get_config())
  args = [*run_args, *LIGHT, "--config.total_steps=1000"]  # an evaluation every 10 steps: pruned long before the end
  study, store = study_lib.open_study(f"sqlite:///{sweep_dir}/study.db", study_lib.study_name(config, args), s, 4)
  run = runner.Runner(s, study, store, sweep_dir, [], [("cpu", [0])], 4, heartbeat=None, grace=None)
  for _ in range(3):
    trial = run._claim()
    run._suggest(trial)
    for step in (10, 20, 30):
      trial.report(0.9, step)
    study.tell(trial, 0.9)
  proc = th.check_ok(_run(_sweep_cmd(config, sweep_dir, args)))
  assert "trial 3 pruned at step 10" in proc.stderr
  row = next(r for r in _csv(sweep_dir) if r["trial"] == "3")
  assert row["state"] == "pruned" and int(row["last_step"]) < 1000  # stopped early
  assert "stopped at step" in open(os.path.join(sweep_dir, "logs", "trial_0003.log")).read()  # checkpointed


def _wait_for(predicate, timeout=240, what="", proc=None):
  t0 = time.time()
  while time.time() - t0 < timeout:
    if predicate():
      return
    if proc is not None and proc.poll() is not None:
      raise AssertionError(f"{what}: the sweep ended first (exit {proc.returncode})")
    time.sleep(0.05)
  raise AssertionError(f"timed out waiting for {what}")


def _last_step(workdir) -> int:
  steps = (
    [r["step"] for r in th.read_metrics(workdir)] if os.path.exists(os.path.join(workdir, "metrics.jsonl")) else []
  )
  return max(steps, default=0)


def _saved(workdir) -> bool:
  """Whether the run has a finished checkpoint (orbax renames a step's directory to its number when done)."""
  ckpts = os.path.join(workdir, "checkpoints")
  return os.path.isdir(ckpts) and any(name.isdigit() for name in os.listdir(ckpts))


@pytest.mark.slow  # 50 s; the default run has SIGTERM and requeue, and a lost worker's trial taken over
def test_sweep_sigkill_and_rerun(tmp_path, run_args):
  """SIGKILL to the sweep and its running trial, mid-trial; the same command again: the interrupted trial resumes
  from its checkpoint (its steps continue), the finished one is not rerun."""
  config = _sweep_config(tmp_path, seeds=[0, 1])
  sweep_dir = str(tmp_path / "sweep")
  args = [*run_args, *LIGHT, "--config.total_steps=150", "--config.eval_every=50", "--config.checkpoint_every=20"]
  cmd = _sweep_cmd(config, sweep_dir, args)
  log = open(tmp_path / "first.log", "w")
  proc = subprocess.Popen(cmd, cwd=th.ROOT, env=th.env(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
  trial1 = os.path.join(sweep_dir, "trial_0001")
  try:
    _wait_for(lambda: _saved(trial1) and _last_step(trial1) < 120, what="trial 1's first checkpoint", proc=proc)
  finally:
    os.killpg(proc.pid, signal.SIGKILL)  # the sweep and its trial's run, as a lost machine would
    proc.wait()
  killed_at = _last_step(trial1)
  assert killed_at < 150

  again = th.check_ok(_run(cmd, timeout=600))
  assert "trial 1: its worker (PID" in again.stderr and "queued again" in again.stderr
  assert [r["state"] for r in sorted(_csv(sweep_dir), key=lambda r: r["trial"])] == ["complete"] * 2
  assert [_launches(sweep_dir, n) for n in range(2)] == [1, 2]
  with open(os.path.join(sweep_dir, "logs", "trial_0001.log")) as f:
    resumed = [line for line in f if "resumed from" in line]
  assert len(resumed) == 1 and int(resumed[0].split(" at step ")[1].split()[0]) >= 5, resumed
  steps = [r["step"] for r in th.read_metrics(trial1) if "train/loss" in r]
  assert steps == sorted(set(steps)) and steps[-1] == 150  # the curve continues, no step twice


def test_sigterm_checkpoints_and_requeues(tmp_path, run_args):
  """SIGTERM to the sweep: its running trial checkpoints and is queued again (same slot), the sweep exits 75."""
  config = _sweep_config(tmp_path, seeds=[0])
  sweep_dir = str(tmp_path / "sweep")
  args = [*run_args, *LIGHT, "--config.total_steps=150", "--config.eval_every=50", "--config.checkpoint_every=20"]
  log = open(tmp_path / "sweep.log", "w")
  proc = subprocess.Popen(
    _sweep_cmd(config, sweep_dir, args), cwd=th.ROOT, env=th.env(), stdout=log, stderr=subprocess.STDOUT
  )
  trial = os.path.join(sweep_dir, "trial_0000")
  try:
    _wait_for(lambda: _saved(trial) and _last_step(trial) < 120, what="the trial's first checkpoint", proc=proc)
  finally:
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=120) == 75
  text = (tmp_path / "sweep.log").read_text()
  said = re.search(r"trial 0: interrupted, queued again \(it resumes from step (\d+)\)", text)
  assert "SIGTERM: stopping every trial" in text and said, text[-2000:]
  assert f"SIGTERM: stopped at step {said[1]}," in open(os.path.join(sweep_dir, "logs", "trial_0000.log")).read()
  assert int(said[1]) == th.finished_steps(trial)[-1]  # (before: the last logged step, not the checkpoint's)
  trials = _study_trials(sweep_dir)
  assert [(t.state.name, t.user_attrs.get("trial", t.number)) for t in trials] == [("FAIL", 0), ("WAITING", 0)]


# ------------------------------------------------------------------ the runner's parts, in this process


@pytest.mark.parametrize("maximize", [True, False])
def test_best_row_takes_the_later_of_equal_evaluations(maximize):
  """Two evaluations tie: the sweep's best step is the later one, the step the trainer's `best` checkpoint holds
  (vitjax.train.checkpoints: "ties: the later step"), in either direction; non-finite values never win."""
  from vitjax.sweep.metrics import best_row

  good, poor = (0.9, 0.5) if maximize else (0.1, 0.5)
  rows = [
    {"step": 10, "eval/m": poor},
    {"step": 20, "eval/m": good},
    {"step": 30, "eval/m": good},
    {"step": 40, "eval/m": math.nan},
    {"step": 50, "eval/m": poor},
  ]
  assert best_row(rows, "eval/m", maximize)["step"] == 30
  assert best_row(list(reversed(rows)), "eval/m", maximize)["step"] == 30  # by step, not by position
  assert best_row([{"step": 10, "eval/m": math.inf if maximize else -math.inf}], "eval/m", maximize) is None


def test_metrics_follower_reads_each_complete_row_once_and_a_replaced_file_from_its_start(tmp_path):
  """The sweep polls a trial's metrics.jsonl every second: each call returns only the complete rows appended since
  the last, a line still being written waits, a line that is not JSON is skipped, and a resume's replaced file (a
  new inode, possibly longer) is read again from its start."""
  from vitjax.sweep.metrics import MetricsFollower

  path = tmp_path / "metrics.jsonl"
  follower = MetricsFollower(str(tmp_path))
  assert follower.new_rows() == []  # no file yet
  path.write_text('{"step": 1}\n{"step": 2')
  assert follower.new_rows() == [{"step": 1}]
  assert follower.new_rows() == []  # nothing new: not the same rows again
  with open(path, "a") as f:
    f.write('}\nnot json\n{"step": 3}\n')
  assert follower.new_rows() == [{"step": 2}, {"step": 3}]
  assert follower.new_rows() == []  # read to its end: nothing again
  replaced = tmp_path / "metrics.jsonl.new"  # a resume writes the kept rows anew and renames: longer than before
  replaced.write_text("".join(f'{{"step": {s}, "pad": "{"x" * 20}"}}\n' for s in (1, 2)))
  os.replace(replaced, path)
  assert [r["step"] for r in follower.new_rows()] == [1, 2]
  with open(path, "r+") as f:  # truncated in place (the same inode): read from its start too
    f.truncate(0)
    f.write('{"step": 7}\n')
  assert follower.new_rows() == [{"step": 7}]


def test_error_line_prefers_the_error_line_then_the_last_logged_error_then_the_last_line(tmp_path):
  """A failed trial's reason in the sweep's summary: its 'error: ...' line, else the message of its last ERROR log
  line, else its last line; only the log written after `start` (this launch's) is read."""
  from vitjax.sweep.metrics import error_line

  log = tmp_path / "trial.log"
  earlier = "error: the previous launch's\n"
  log.write_text(earlier + "I0101 train.py:1] step 1\nE0101 1 train.py:2 ERROR disk full\nerror: bad flag\nlast\n")
  assert error_line(str(log), len(earlier)) == "error: bad flag"
  log.write_text(earlier + "E0101 a ERROR first\nE0101 b ERROR out of memory\n\nTraceback done\n\n")
  assert error_line(str(log), len(earlier)) == "out of memory"
  log.write_text(earlier + "one\nKilled\n\n")
  assert error_line(str(log), len(earlier)) == "Killed"
  assert error_line(str(log), len(log.read_text())) == ""
  assert error_line(str(tmp_path / "missing.log"), 0) == ""


def test_device_groups_split_the_gpus_or_cores_and_say_so(monkeypatch):
  """Each worker gets its own slice of the visible GPUs (or, with JAX_PLATFORMS=cpu or no GPU, of this process's
  cores); more than the machine has is one line naming both flags; a worker's devices read as ranges or lists."""
  from vitjax.sweep.devices import describe_devices, device_groups

  monkeypatch.delenv("JAX_PLATFORMS", raising=False)
  monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0, 1,2,3,-1")
  assert device_groups(2, None) == [("gpu", ["0", "1"]), ("gpu", ["2", "3"])]
  assert device_groups(3, 1) == [("gpu", ["0"]), ("gpu", ["1"]), ("gpu", ["2"])]
  assert device_groups(1, 4) == [("gpu", ["0", "1", "2", "3"])]  # exactly the machine's
  with pytest.raises(ConfigError, match=r"--workers=3 x --devices_per_worker=2 needs 6 GPUs; this machine has 4: "):
    device_groups(3, 2)
  for bad in ((0, None), (1, 0)):
    with pytest.raises(ConfigError, match="give at least 1"):
      device_groups(*bad)
  monkeypatch.setenv("JAX_PLATFORMS", "cpu,cuda")
  monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {65, 2, 3, 33, 5, 4})  # a set: not in core order
  assert device_groups(2, None) == [("cpu", [2, 3, 4]), ("cpu", [5, 33, 65])]
  with pytest.raises(ConfigError, match="needs 7 CPU cores; this machine has 6"):
    device_groups(7, None)
  assert describe_devices(("cpu", [4, 5, 6, 7])) == "CPU cores 4-7"
  assert describe_devices(("cpu", [5, 8, 9])) == "CPU cores 5,8,9"
  assert describe_devices(("cpu", [3])) == "CPU core 3"
  assert describe_devices(("gpu", ["0", "1"])) == "GPUs 0,1"
  assert describe_devices(("gpu", ["GPU-ab12"])) == "GPU GPU-ab12"


def test_owner_gone_only_for_a_process_of_this_host_that_ended_or_was_replaced(monkeypatch):
  """Another worker's trial is taken over at once when its process, on this host, is gone, or its pid now names
  another process (another start time); never for this process, another host's, or a live one."""
  from vitjax.sweep.devices import owner_gone, owner_record

  me = owner_record()
  assert me["pid"] == os.getpid() and me["start"] is not None
  assert not owner_gone(me) and not owner_gone(None)
  child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
  try:
    alive = {**me, "pid": child.pid, "start": None}
    assert not owner_gone(alive)  # no start time recorded: alive is enough
    from vitjax.sweep import devices

    alive["start"] = devices._start_time(child.pid)
    assert not owner_gone(alive) and not owner_gone({**alive, "host": "elsewhere", "start": "1"})
    assert owner_gone({**alive, "start": "1"})  # the pid was reused by another process
    monkeypatch.setattr(devices, "_start_time", lambda pid: None)
    assert not owner_gone({**alive, "start": "1"})  # its start time unreadable now: alive is enough
  finally:
    child.kill()
    child.wait()
  assert owner_gone({**me, "pid": child.pid})


def test_requeue_keeps_the_slot_parameters_and_evaluations_but_not_the_owner_or_the_error():
  """A retry is a new Optuna trial of the same slot: its parameters, reported evaluations and user attributes are
  kept, the dead worker's claim and the old error are not (a retry of a --retry_failed trial that is interrupted in
  turn is queued again as interrupted, not taken for failed), and retry_of lists every attempt before it."""
  from vitjax.sweep import study as study_lib

  optuna = study_lib.optuna_module()
  study = optuna.create_study(direction="maximize")
  lr = {"optim.lr": optuna.distributions.CategoricalDistribution([1e-3, 2e-3])}
  study.add_trial(
    optuna.trial.create_trial(
      state=optuna.trial.TrialState.FAIL,
      params={"optim.lr": 2e-3},
      distributions=lr,
      user_attrs={study_lib.SLOT: 4, "error": "error: out of memory", "wall_s": 12.5},
      system_attrs={study_lib.OWNER: {"host": "h", "pid": 1, "start": "9"}, "fixed_params": {"optim.lr": 2e-3}},
      intermediate_values={10: 0.5, 20: 0.75},
    )
  )
  study_lib.requeue(study, study.get_trials()[0])
  retry = study.get_trials()[1]
  assert retry.state.name == "WAITING" and study_lib.slot(retry) == 4 and retry.params == {"optim.lr": 2e-3}
  assert retry.intermediate_values == {10: 0.5, 20: 0.75}
  assert retry.user_attrs == {study_lib.SLOT: 4, "wall_s": 12.5}
  assert retry.system_attrs == {"fixed_params": {"optim.lr": 2e-3}, "retry_of": [0]}
  study_lib.requeue(study, retry)
  again = study.get_trials()[2]
  assert again.system_attrs["retry_of"] == [0, 1]
  assert {n: t.number for n, t in study_lib.latest_attempts(reversed(study.get_trials())).items()} == {4: 2}


def test_storage_urls_are_shown_without_their_password_and_studies_named_by_their_command():
  """--storage URLs appear in errors and report.md: the password is masked, the rest kept; a study is named by its
  config file, its :args and its overrides; a changed get_sweep() names the keys that differ."""
  from vitjax.sweep import study as study_lib

  assert study_lib.masked("postgresql://bob:hunter2@db.lab:5432/sweeps") == "postgresql://bob:***@db.lab:5432/sweeps"
  assert study_lib.masked("postgresql://bob:p@ss:w@db.lab/sweeps") == "postgresql://bob:***@db.lab/sweeps"
  for url in ("postgresql://bob@db.lab/sweeps", "sqlite:////tmp/study.db"):
    assert study_lib.masked(url) == url
  assert study_lib.study_name("configs/vit_digits.py", ["--config.num_epochs=3"]) == "vit_digits --config.num_epochs=3"
  assert study_lib.study_name("/a/swin.py:tiny,s2", []) == "swin:tiny,s2"
  a, b = (
    {"grid": [1], "objective": "eval/accuracy", "seed": 0},
    {"grid": [2], "objective": "eval/accuracy", "trials": 4},
  )
  assert study_lib.difference(a, b) == "it differs in grid, seed, trials"
  assert study_lib.first_line(ValueError("cannot connect\n  detail")) == "cannot connect"
  assert study_lib.first_line(ValueError("")) == "ValueError"


def test_time_left():
  """The sweep's estimate of its time left: min(trials left, workers) trials at a time, each taking the mean
  finished-trial time, less what the running ones have already run, never negative."""
  from vitjax.sweep.runner import time_left

  assert time_left(30.0, 0, 2, []) == 0.0
  assert time_left(30.0, 1, 4, []) == 30.0  # one trial left: one at a time, not a quarter of it
  assert time_left(30.0, 5, 2, []) == 90.0  # three rounds on two workers
  assert time_left(30.0, 2, 2, [10.0]) == 30.0  # the running trial ends in 20 s; the other starts now
  assert time_left(30.0, 2, 2, [10.0, 5.0]) == 25.0  # both running: the later-started one ends last
  assert time_left(30.0, 3, 2, [10.0]) == 50.0  # the worker free now takes one, the other the last in 20 s
  assert time_left(30.0, 1, 2, [45.0]) == 0.0  # running past the mean: never negative


def _runner(tmp_path, size=4, target=None):
  """A Runner to `target` slots on a fresh SQLite study of a `size`-point learning-rate grid, all queued (no trial
  runs: _attempt is replaced)."""
  from vitjax.sweep import runner
  from vitjax.sweep import study as study_lib

  s = sweep.Sweep("eval/accuracy", "maximize", grid=[{"optim.lr": 1e-3 * (i + 1)} for i in range(size)])
  target = size if target is None else target
  study, store = study_lib.open_study(f"sqlite:///{tmp_path / 'study.db'}", "unit", s, size)
  return runner.Runner(s, study, store, str(tmp_path), [], [("cpu", [0])], target, heartbeat=None, grace=None)


def _outcome(run, monkeypatch, rc, log="", metrics=(), pruned_at=None):
  """Claims the next trial and runs it with _attempt replaced: it writes `log` and `metrics`, exits with `rc`."""
  trial = run._claim()
  workdir = sweep.trial_dir(run.sweep_dir, trial.user_attrs["trial"])

  def attempt(index, trial, n, cmd, workdir_, log_path, reported):
    os.makedirs(workdir, exist_ok=True)
    with open(os.path.join(workdir, "metrics.jsonl"), "a") as f:
      f.writelines(json.dumps(m) + "\n" for m in metrics)
    with open(log_path, "a") as f:
      f.write(log)
    return rc, pruned_at, 0

  monkeypatch.setattr(run, "_attempt", attempt)
  run._run_trial(0, trial)
  return run.store.get_trial(trial._trial_id)


def test_a_trials_exit_status_decides_its_state_and_error(tmp_path, monkeypatch):
  """0 with evaluations: complete, its best evaluation the objective; 0 without the objective, or exit 2: failed as
  the user's error; another status: failed with its error line, else the status or the signal; 75, or 2 while the
  sweep stops (a trial waiting for a lock): queued again to resume, not failed."""
  from vitjax.sweep import runner
  from vitjax.sweep import study as study_lib

  monkeypatch.setattr(runner, "LOCK_WAIT", 0.0)  # no relaunch while a lost run holds the lock: the outcome at once
  run = _runner(tmp_path, size=7)
  evals = [{"step": 10, "eval/accuracy": 0.5}, {"step": 20, "eval/accuracy": 0.75}, {"step": 30, "eval/accuracy": 0.6}]
  done = _outcome(run, monkeypatch, 0, metrics=[{"step": 5, "train/loss": 1.0}, *evals])
  assert done.state.name == "COMPLETE" and done.value == 0.75
  assert done.user_attrs["best_step"] == 20 and done.user_attrs["last_step"] == 30
  no_objective = _outcome(run, monkeypatch, 0, metrics=[{"step": 10, "eval/loss": 0.3}])
  assert no_objective.state.name == "FAIL"
  assert no_objective.user_attrs["error"] == "no eval/accuracy in its evaluations (eval/loss)"
  assert len(run.failed_in_a_row) == 1  # the user's error: a config whose evaluators miss the objective
  crashed = _outcome(run, monkeypatch, 1, log="I0101 step 3\nerror: out of memory\n")
  assert crashed.state.name == "FAIL" and crashed.user_attrs["error"] == "error: out of memory"
  assert run.failed_in_a_row == [] and not run.stop.is_set()  # not the user's error: the count starts again
  killed = _outcome(run, monkeypatch, -signal.SIGKILL)
  assert killed.user_attrs["error"] == "killed by SIGKILL"
  silent = _outcome(run, monkeypatch, 3)
  assert silent.user_attrs["error"] == "exit status 3"
  interrupted = _outcome(run, monkeypatch, 75, metrics=evals[:1])
  assert interrupted.state.name == "FAIL" and "error" not in interrupted.user_attrs
  run.stop.set()
  waiting = _outcome(run, monkeypatch, 2, log="error: --workdir=W is in use by PID 7\n")
  assert waiting.state.name == "FAIL" and "error" not in waiting.user_attrs
  latest = {study_lib.slot(t): t.state.name for t in run.study.get_trials()}
  assert latest == {0: "COMPLETE", 1: "FAIL", 2: "FAIL", 3: "FAIL", 4: "FAIL", 5: "WAITING", 6: "WAITING"}


def test_three_user_errors_in_a_row_stop_the_sweep(tmp_path):
  """Exit 2 (or no objective) three trials in a row stops the sweep with the last error (run() exits 2, not 75);
  any other outcome between them starts the count again."""
  run = _runner(tmp_path, size=2)
  for what, user_error in (("failed: a", True), ("failed: b", True), ("complete", False), ("failed: c", True)):
    run._finished(0, what, 1.0, ok=not user_error, user_error=user_error)
  assert not run.stop.is_set() and run.failed_in_a_row == ["failed: c"]
  run._finished(0, "failed: d", 1.0, ok=False, user_error=True)
  assert not run.stop.is_set()
  run._finished(0, "failed: e", 1.0, ok=False, user_error=True)
  assert run.stop.is_set() and run.user_error == "failed: e"
  assert run.run() == 2  # (no workers: run() only reports how the sweep ended)
  run.user_error = None
  assert run.run() == 75
  run.stop.clear()
  assert run.run() == 0
  run.crashed.append("a bug")
  assert run.run() == 1


def test_claims_stay_under_the_target_and_skip_a_superseded_copy(tmp_path):
  """A worker claims slots below --max_trials' target only, each once; a slot queued twice (two machines requeued
  it at once) runs its newest copy, the older one failed as superseded; resumed trials are claimed first."""
  from vitjax.sweep import study as study_lib

  run = _runner(tmp_path, size=4, target=2)
  first = run._claim()
  assert study_lib.slot(first) == 0
  for _ in range(2):  # slot 0 queued again twice, as two machines that both found it lost would
    study_lib.requeue(run.study, run.store.get_trial(first._trial_id))
  resumed = run._claim()
  assert study_lib.slot(resumed) == 0 and resumed.number == 5  # the newest copy, before the fresh slot 1
  older = run.study.get_trials()[4]
  assert older.state.name == "FAIL" and older.user_attrs["superseded_by"] == 5
  assert study_lib.slot(run._claim()) == 1
  assert run._claim() is None  # slots 2 and 3 are past the target
  assert run._counts()["running"] == 2 and run._counts()["waiting"] == 0


def test_report_sends_each_new_evaluation_once_and_prunes_when_asked():
  """The follower's evaluations go to Optuna once each, in step order, rows without the objective skipped; the
  step to prune at is returned only where pruning is asked for."""
  from vitjax.sweep import runner

  class Trial:
    def __init__(self, prune):
      self.reports, self.prune = [], prune

    def report(self, value, step):
      self.reports.append((step, value))

    def should_prune(self):
      return self.prune

  class Follower:
    def __init__(self, rows):
      self.rows = rows

    def new_rows(self):
      rows, self.rows = self.rows, []
      return rows

  s = sweep.Sweep("eval/accuracy", "maximize", grid=[{"optim.lr": 1e-3}])
  store = type("Store", (), {"url": ""})()
  run = runner.Runner(s, None, store, "", [], [], 1, heartbeat=None, grace=None)
  rows = [
    {"step": 20, "eval/accuracy": 0.6},
    {"step": 5, "train/loss": 1.0},
    {"step": 10, "eval/accuracy": 0.5},
    {"step": 15, "eval/loss": 0.2},
    {"step": 30, "eval/accuracy": 0.7, "source": "eval"},
  ]
  trial, reported = Trial(prune=False), {20}
  assert run._report(trial, 0, Follower(rows), reported) is None
  assert trial.reports == [(10, 0.5)] and reported == {10, 20}
  trial = Trial(prune=True)
  assert run._report(trial, 0, Follower(rows), set()) == 10 and trial.reports == [(10, 0.5)]
  trial = Trial(prune=True)
  assert run._report(trial, 0, Follower(rows), set(), prune=False) is None and len(trial.reports) == 2


def test_sqlite_claims_are_serialised_by_a_lock_file_beside_the_database(tmp_path):
  """The flock that serialises claims on SQLite: a file beside the database (the URL's query left out); none for
  a server database or SQLite in memory."""
  from vitjax.sweep.runner import _SqliteGuard

  db = tmp_path / "study.db"
  guard = _SqliteGuard(f"sqlite:///{db}?timeout=60")
  assert guard.path == f"{db}.claim-lock"
  with guard:
    assert os.path.exists(f"{db}.claim-lock")
  for url in ("postgresql://u@h/db", "sqlite:///", "sqlite://"):
    assert _SqliteGuard(url).path is None, url


def test_trial_launch_pins_cores_without_a_fork_warning(tmp_path):
  """A trial starts pinned to its worker's cores and set to get SIGTERM when the sweep dies, without a
  `preexec_fn` in this multithreaded (JAX) process, so without JAX's "os.fork() was called" warning."""
  import warnings

  import jax

  from vitjax.sweep import runner

  jax.devices()  # JAX's backends are up: from now on, a fork in this process makes JAX warn
  core = sorted(os.sched_getaffinity(0))[-1]
  probe = (
    "import ctypes, os; sig = ctypes.c_int(); ctypes.CDLL(None).prctl(2, ctypes.byref(sig)); "
    "print('affinity', sorted(os.sched_getaffinity(0)), 'pdeathsig', sig.value, 'ppid', os.getppid())"
  )
  store = type("Store", (), {"url": ""})()
  run = runner.Runner(None, None, store, str(tmp_path), [], [("cpu", [core])], 1, heartbeat=None, grace=None)
  log = tmp_path / "trial.log"
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    rc, pruned_at, start = run._attempt(0, None, 0, [sys.executable, "-c", probe], str(tmp_path), str(log), set())
  assert rc == 0 and pruned_at is None, log.read_text()
  assert not [w for w in caught if "fork" in str(w.message)], [str(w.message) for w in caught]
  said = log.read_text()[start:].split()
  assert said == ["affinity", f"[{core}]", "pdeathsig", str(int(signal.SIGTERM)), "ppid", str(os.getpid())], said
  failed = run._attempt(0, None, 0, ["/nonexistent/python"], str(tmp_path), str(log), set())
  assert failed[0] == 127 and "error: cannot run /nonexistent/python: No such file or directory" in log.read_text()


def test_trial_launcher_refuses_a_bad_command_line_and_a_gone_sweep():
  """vitjax/sweep/launch.py (run by its path, no imports): no '--' or no command is its usage line, exit 2; a sweep
  that is no longer its parent stops the trial before it starts (exit 143, SIGTERM's); no cores: no pinning."""
  launch = os.path.join(th.ROOT, "vitjax", "sweep", "launch.py")

  def run(*args):
    return subprocess.run([sys.executable, "-I", "-S", launch, *args], capture_output=True, text=True, timeout=60)

  me, hello = str(os.getpid()), [sys.executable, "-c", "print('ran')"]
  for args in ((me, "", "x", *hello), (me, "", "--"), (me, "--", *hello)):
    proc = run(*args)
    assert proc.returncode == 2 and proc.stderr == "error: usage: launch.py SWEEP_PID CORES -- COMMAND...\n", args
    assert proc.stdout == ""
  ok = run(me, "", "--", *hello)
  assert ok.returncode == 0 and ok.stdout == "ran\n", ok.stderr
  gone = run("1", "", "--", *hello)  # PID 1 did not start it: the sweep that did is gone
  assert gone.returncode == 128 + signal.SIGTERM and gone.stdout == ""
  assert gone.stderr == "error: the sweep (PID 1) that started this trial is gone\n"


def test_importance_plot_from_few_trials_is_marked_unreliable():
  """report.md says beside the parameter-importance plot when fewer than 10 complete trials made it."""
  from vitjax.sweep import report

  table = [{"state": "complete"}] * 3 + [{"state": "pruned"}] * 20
  assert report._importance_note(table) == (
    "Parameter importances from 3 complete trials are not reliable (fewer than 10): read them as a rough hint at most."
  )
  assert report._importance_note([{"state": "complete"}] * 10) == ""


def test_report_rows_rank_by_state_then_the_objective_in_the_sweeps_direction(tmp_path):
  """trials.csv and report.md: complete trials first, best first for a minimized objective too, then pruned ones by
  their last reported evaluation, then the rest; a slot's newest attempt is its row, with the count of attempts."""
  from vitjax.sweep import report
  from vitjax.sweep import study as study_lib

  optuna = study_lib.optuna_module()
  study = optuna.create_study(direction="minimize")
  study.set_user_attr("sweep", {"objective": "eval/loss", "direction": "minimize"})
  state = optuna.trial.TrialState
  for n, st, value, steps in [
    (0, state.COMPLETE, 0.5, {}),
    (1, state.PRUNED, None, {10: 0.7, 20: 0.1}),  # better than any complete one
    (2, state.COMPLETE, 0.2, {}),
    (3, state.FAIL, None, {}),
    (4, state.PRUNED, None, {10: 0.9, 20: 0.6}),
    (3, state.WAITING, None, {}),
  ]:
    attrs = {study_lib.SLOT: n, **({"error": "error: boom"} if st == state.FAIL else {})}
    study.add_trial(optuna.trial.create_trial(state=st, value=value, user_attrs=attrs, intermediate_values=steps))
  table = report.rows(study, str(tmp_path))
  assert [(r["trial"], r["state"], r["objective"], r["attempts"]) for r in table] == [
    (2, "complete", 0.2, 1),
    (0, "complete", 0.5, 1),
    (1, "pruned", 0.1, 1),
    (4, "pruned", 0.6, 1),
    (3, "waiting", None, 2),
  ]
  assert table[-1]["error"] == ""  # the newest attempt's, not the failed one's
  grid = [{"optim.lr": 0.001}, {"optim.lr": 0.002}]
  assert report._grid_lines(grid, None, [{"params": p} for p in grid]) == ["- grid: all 2 points"]
  [line] = report._grid_lines(grid, None, [{"params": grid[1]}])
  assert "1 of 2 points tried" in line and "taken in the grid order; not tried: optim.lr=0.001" in line
  assert [report._fmt(v) for v in (None, 3, 0.5, 2.0, 0.001, 1e4, "tok")] == ["", "3", "0.5", "2", "0.001",
                                                                                  "1e+04", "tok"]  # fmt: skip


def test_stale_heartbeat_is_retried(tmp_path):
  """A RUNNING trial whose worker stopped sending heartbeats (another machine, gone) is failed and queued again
  in the same slot, with its parameters and reported evaluations, by whichever worker notices."""
  from vitjax.sweep import runner
  from vitjax.sweep import study as study_lib

  s = sweep.load(_sweep_config(tmp_path, [1e-3, 2e-3]), get_config())
  url = f"sqlite:///{tmp_path / 'study.db'}"
  study, store = study_lib.open_study(url, "stale", s, s.size, heartbeat=1, grace=2)
  run = runner.Runner(s, study, store, str(tmp_path), [], [("cpu", [0])], s.size, heartbeat=1, grace=2)
  trial = run._claim()
  assert trial is not None and study_lib.slot(trial) == 0
  trial.suggest_categorical("optim.lr", [1e-3, 2e-3])  # what _suggest does with the slot's fixed point
  trial.report(0.5, 10)
  store.set_trial_system_attr(trial._trial_id, study_lib.OWNER, {"host": "another-machine", "pid": 1})
  run._recover()
  assert study.get_trials()[0].state.name == "RUNNING"  # its heartbeat is fresh
  time.sleep(3.5)
  run._recover()
  trials = study.get_trials()
  assert [t.state.name for t in trials] == ["FAIL", "WAITING", "WAITING"]
  retry = trials[2]
  assert study_lib.slot(retry) == 0 and retry.params == s.point(0) and retry.intermediate_values == {10: 0.5}
  assert run._claim()._trial_id == retry._trial_id  # the retry is claimed first (same slot, same directory)


def test_changed_sweep_and_max_trials(tmp_path):
  """A study holds its sweep's slots: --max_trials caps them (a rerun with a larger cap adds the missing ones,
  never more), and a changed get_sweep() on the same study is one error line."""
  from vitjax.sweep import study as study_lib

  url = f"sqlite:///{tmp_path / 'study.db'}"
  s = sweep.load(_sweep_config(tmp_path, [1e-3, 2e-3, 3e-3]), get_config())
  study, _ = study_lib.open_study(url, "capped", s, 2)
  assert sorted(study_lib.slot(t) for t in study.get_trials()) == [0, 1]
  for _ in range(2):  # a rerun with the whole sweep adds the third, once
    study, _ = study_lib.open_study(url, "capped", s, 3)
  assert sorted(study_lib.slot(t) for t in study.get_trials()) == [0, 1, 2]
  points = [t.system_attrs["fixed_params"] for t in study.get_trials()]
  assert points == [s.point(i) for i in range(3)] and sorted(p["optim.lr"] for p in points) == [1e-3, 2e-3, 3e-3]
  changed = sweep.load(_sweep_config(tmp_path, [1e-3, 5e-3]), get_config())
  with pytest.raises(ConfigError, match="made by a different get_sweep"):
    study_lib.open_study(url, "capped", changed, 2)
  # the config file changed under the same get_sweep(): before, the study took trials of a wider model silently
  config = get_config()
  fields = study_lib.config_fields(config, s)
  assert "optim.lr" not in fields and "log_every" not in fields and fields["model.width"] == config.model.width
  study_lib.open_study(url, "capped", s, 3, config=fields)  # recorded by the first opener that has it
  config.log_every, config.data.data_dir = 7, "/elsewhere"  # what a resumed run may change anyway
  study_lib.open_study(url, "capped", s, 3, config=study_lib.config_fields(config, s))
  config.model.width += 8
  with pytest.raises(ConfigError) as e:
    study_lib.open_study(url, "capped", s, 3, config=study_lib.config_fields(config, s))
  assert str(e.value) == (
    f"the study 'capped' in {url} was made from another config (model.width {config.model.width - 8} -> "
    f"{config.model.width}); undo the change, or start a new sweep with another --sweep_dir (and --storage study)"
  )


def test_a_capped_grid_takes_points_spread_over_it(tmp_path):
  """vit_digits' 12-point grid (lr x weight decay x depth) capped at 3 trials: the slots take a seeded shuffled
  order, the same on every opener, so the 3 trials do not all share the first learning rate (in the grid's own
  order they did); the report names the points that did not run. A study made before the shuffle (no grid_order
  in its record) keeps the grid's order."""
  from vitjax.sweep import report
  from vitjax.sweep import study as study_lib

  config = os.path.join(th.ROOT, "configs", "vit_digits.py")
  s = sweep.load(config, _vit_digits_config())
  study, _ = study_lib.open_study(f"sqlite:///{tmp_path / 'a.db'}", "capped", s, 3)
  points = [t.system_attrs["fixed_params"] for t in study.get_trials()]
  assert points == [s.grid[i] for i in (9, 2, 7)], points  # numpy's PCG64 permutation of 12, seed 0
  assert len({p["optim.lr"] for p in points}) > 1 and study.user_attrs["sweep"]["grid_order"] == "shuffled, seed 0"
  again = sweep.load(config, _vit_digits_config())
  assert [again.point(i) for i in range(3)] == points  # another machine, or a rerun
  table = [{"params": p} for p in points]
  [line] = report._grid_lines(study.user_attrs["sweep"]["grid"], study.user_attrs["sweep"]["grid_order"], table)
  assert line.startswith("- grid: 3 of 12 points tried (all of them unless --max_trials caps the sweep), taken in ")
  assert "taken in a shuffled order (seed 0); not tried: " in line
  assert line.count(";") == 9 and "optim.lr=0.001, optim.weight_decay=0.05, model.depth=2" in line
  legacy_url = f"sqlite:///{tmp_path / 'b.db'}"
  old, _ = study_lib.open_study(legacy_url, "old", s, 1)
  old.set_user_attr("sweep", {k: v for k, v in old.user_attrs["sweep"].items() if k != "grid_order"})
  for t in old.get_trials():
    old._storage.set_trial_system_attr(t._trial_id, "fixed_params", s.grid[0])  # as the old code queued slot 0
  legacy = sweep.load(config, _vit_digits_config())
  old, _ = study_lib.open_study(legacy_url, "old", legacy, 3)
  assert [t.system_attrs["fixed_params"] for t in old.get_trials()] == s.grid[:3]


def _vit_digits_config():
  spec = importlib.util.spec_from_file_location("vit_digits_cfg", os.path.join(th.ROOT, "configs", "vit_digits.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config()


# ------------------------------------------------------------------ many machines: PostgreSQL


def test_two_machines_share_a_postgresql_study(tmp_path, run_args, postgres):
  """Two sweep processes ("machines") on one PostgreSQL study and a shared sweep_dir, a trial each: each trial runs
  once; one process is SIGKILLed mid-trial and the other, its own trial done, takes that trial over, resuming it
  from its checkpoint."""
  config = _sweep_config(tmp_path, seeds=[0, 1])
  sweep_dir = str(tmp_path / "sweep")
  cmd = _sweep_cmd(
    config,
    sweep_dir,
    [*run_args, *LIGHT, "--config.total_steps=150", "--config.eval_every=50", "--config.checkpoint_every=20"],
  )
  cmd.append(f"--storage={postgres}")
  logs = [tmp_path / "a.log", tmp_path / "b.log"]
  procs = [
    subprocess.Popen(
      cmd, cwd=th.ROOT, env=th.env(), stdout=open(p, "w"), stderr=subprocess.STDOUT, start_new_session=True
    )
    for p in logs
  ]

  def b_trial():
    lines = [ln for ln in logs[1].read_text().splitlines() if " on CPU core" in ln]
    return int(lines[0].split("trial ")[1].split()[0]) if lines else None

  try:
    _wait_for(lambda: b_trial() is not None, what="process b's first trial", proc=procs[1])
    victim = os.path.join(sweep_dir, f"trial_{b_trial():04d}")
    _wait_for(lambda: _saved(victim) and _last_step(victim) < 120, what="b's trial's first checkpoint", proc=procs[1])
  finally:
    os.killpg(procs[1].pid, signal.SIGKILL)
    procs[1].wait()
    if procs[0].poll() is not None and procs[0].returncode != 0:
      raise AssertionError(logs[0].read_text()[-3000:])
  assert procs[0].wait(timeout=600) == 0, logs[0].read_text()[-3000:]
  rows = _csv(sweep_dir)
  assert sorted(int(r["trial"]) for r in rows) == [0, 1] and {r["state"] for r in rows} == {"complete"}
  launches = [_launches(sweep_dir, n) for n in range(2)]
  assert launches[b_trial()] == 2 and sum(launches) == 3, launches  # only the killed one ran again
  trials = _study_trials(sweep_dir, postgres)
  assert len(trials) == 3 and sum(t.state.name == "COMPLETE" for t in trials) == 2
  a_log = logs[0].read_text()
  assert f"trial {b_trial()}: its worker (PID {procs[1].pid})" in a_log
  assert "resumed from" in open(os.path.join(sweep_dir, "logs", f"trial_{b_trial():04d}.log")).read()
