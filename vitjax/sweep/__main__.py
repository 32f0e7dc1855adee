"""Command line: run a hyperparameter sweep (the config file's get_sweep(), see vitjax.sweep), or report on one.

    python -m vitjax.sweep --config=configs/vit_digits.py --sweep_dir=sweeps/vit_digits
    python -m vitjax.sweep --config=configs/vit_digits.py --sweep_dir=sweeps/vit_digits --workers=2 \
        --config.num_epochs=30          # an override applies to every trial (a quicker sweep: fewer epochs)
    python -m vitjax.sweep --mode=report --sweep_dir=sweeps/vit_digits

Each trial is an ordinary vitjax run in SWEEP_DIR/trial_NNNN (config.json, checkpoints, metrics.jsonl, tb/),
its log in SWEEP_DIR/logs/. The study lives in --storage (default sqlite:///SWEEP_DIR/study.db) under a name
made of the config file, its :args and the overrides. At the end SWEEP_DIR/report.md, trials.csv and plots.

Rerun the same command after anything stops it (SIGTERM, SIGKILL, a lost machine): finished trials stay
finished, interrupted ones resume from their checkpoints. --max_trials=N caps the study at N trials in all. A
changed get_sweep(), or config file (but for what a resumed run may change: log_every, evals, ...), is refused:
one study holds one experiment.

Many machines: the same command on each, with one PostgreSQL database and, so that a trial a dead machine left
resumes from its checkpoint elsewhere, a --sweep_dir on a shared filesystem:

    python -m vitjax.sweep --config=configs/vit_digits.py --sweep_dir=/shared/sweeps/vit_digits \
        --storage=postgresql://USER:PASSWORD@DBHOST/vitjax --workers=4   # 4 GPUs: one each

Exit status: 0 every trial finished (complete, pruned or failed); 2 a problem you can fix (one "error: ..."
line; the sweep directory is left as it was), or 3 trials in a row failed with exit status 2 (fix, then rerun
with --retry_failed); 75 stopped by SIGTERM/SIGINT, every running trial checkpointed and queued again.
"""

import json
import os
import shlex
import signal
import sys
import time

from absl import flags, logging

from vitjax import cli, config_flag, paths
from vitjax import sweep as sweep_lib
from vitjax.errors import ConfigError
from vitjax.sweep import devices, report, runner
from vitjax.sweep import study as study_lib

config_flag.define("experiment config file with a get_sweep() (configs/*.py)")
flags.DEFINE_string(
  "sweep_dir", None, "where the trials' workdirs, logs, the SQLite study and the report go", required=True
)
flags.DEFINE_enum("mode", "run", ["run", "report"], "run the sweep (resuming it) or write its report")
flags.DEFINE_string(
  "storage", None, "Optuna storage URL (default sqlite:///SWEEP_DIR/study.db; postgresql://... for many machines)"
)
flags.DEFINE_integer("workers", 1, "trials run at once on this machine, each on its own devices")
flags.DEFINE_integer("devices_per_worker", None, "GPUs (or CPU cores) per worker; default: an equal share")
flags.DEFINE_integer("max_trials", None, "cap the study at this many trials in all (default: the whole sweep)")
flags.DEFINE_integer("heartbeat", 10, "seconds between a running trial's heartbeats in the study")
flags.DEFINE_integer("grace", 60, "seconds without a heartbeat after which a trial's worker counts as lost")
flags.DEFINE_bool("retry_failed", False, "queue the failed trials again (after fixing what made them fail)")
FLAGS = flags.FLAGS


def _config_arg(argv) -> str | None:
  return next((a.split("=", 1)[1] for a in argv if a.startswith("--config=")), None)


def _overrides(argv) -> list[str]:
  """The --config.FIELD=VALUE arguments, as given (each trial gets them)."""
  out, args = [], list(argv[1:])
  for i, a in enumerate(args):
    if a.startswith("--config."):
      out.append(a if "=" in a or i + 1 >= len(args) or args[i + 1].startswith("-") else f"{a}={args[i + 1]}")
  return out


def _check_sweep_dir(sweep_dir: str, record: dict) -> None:

  paths.refuse_links(sweep_dir, ("logs",))  # (each trial's workdir is checked by its run)
  if os.path.exists(sweep_dir) and not os.path.isdir(sweep_dir):
    raise ConfigError(f"--sweep_dir={sweep_dir} is a file; give a directory")
  path = os.path.join(sweep_dir, "sweep.json")
  if not os.path.exists(path) and os.path.exists(os.path.join(sweep_dir, "config.json")):
    raise ConfigError(
      f"--sweep_dir={sweep_dir} is a run's workdir (it holds config.json); give the sweep a folder of its own"
    )
  if os.path.exists(path):
    old = _read_record(path)
    for key in ("study", "storage"):
      if old.get(key) != record[key]:
        raise ConfigError(
          f"{sweep_dir} holds the sweep {old.get('study')!r} on {old.get('storage')}, not {record['study']!r} on "
          f"{record['storage']}: rerun its command ({old.get('command')}) or give a new --sweep_dir"
        )


def _read_record(path: str) -> dict:

  try:
    with open(path) as f:
      record = json.load(f)
  except (OSError, ValueError) as e:
    raise ConfigError(f"{path} cannot be read ({e}); restore it, or give a new --sweep_dir") from None
  if not isinstance(record, dict) or not {"study", "storage"} <= set(record):
    raise ConfigError(f"{path} is not a sweep's record (no study and storage); restore it, or give a new --sweep_dir")
  return record


def _check_flags(sweep, overrides: list[str]) -> None:
  """The sweep's own flags, and no override of a swept field (ConfigError naming the fix)."""
  swept = [o for o in overrides if o.split("=", 1)[0].removeprefix("--config.") in sweep.fields]
  if swept:
    raise ConfigError(f"{swept[0].split('=', 1)[0]} is swept by get_sweep(): remove the override")
  if FLAGS.max_trials is not None and FLAGS.max_trials < 1:
    raise ConfigError(f"--max_trials={FLAGS.max_trials}: give at least 1")
  if FLAGS.heartbeat < 1 or FLAGS.grace < 2 * FLAGS.heartbeat:
    raise ConfigError(
      f"--heartbeat={FLAGS.heartbeat} --grace={FLAGS.grace}: give a heartbeat of at least 1 s and a grace of at "
      "least twice the heartbeat (a live trial must never look lost)"
    )


def _check_config(config, sweep_dir: str, sweep=None) -> None:
  """The trials' shared config passes the trainer's checks and its data is there, before the sweep folder exists.

  An override the trials would refuse is refused here, while a corrected command can still make the same sweep (the
  overrides name its study). What depends on a trial's devices (batch sizes over its mesh) is the trial's to check.
  """
  from vitjax import mesh as mesh_lib, tasks  # noqa: I001 (one import: jax, once a sweep checks its config)
  from vitjax.train import loop

  loop.check_config(config)
  task = tasks.get(config, os.path.join(sweep_dir, "trial"), layout=mesh_lib.Layout())
  task.check()
  if sweep is not None:
    _check_objective(config, task, sweep)


def _check_objective(config, task, sweep) -> None:
  """ConfigError where the trials' evaluators do not report the objective, or report it better the other way."""
  from vitjax import evaluators

  reported = {k: mode for e in evaluators.plan(config, task) for k, mode in e.metrics().items()}
  if sweep.objective not in reported:
    raise ConfigError(f"get_sweep() objective={sweep.objective!r} is not reported by config.evals; use one of "
                      f"{sorted(reported)}")  # fmt: skip
  want = "maximize" if reported[sweep.objective] == "max" else "minimize"
  if sweep.direction != want:
    raise ConfigError(
      f"get_sweep() direction={sweep.direction!r}, but {sweep.objective} is better "
      f"{'higher' if want == 'maximize' else 'lower'}: direction={want!r}"
    )


def _trial_command(config_arg: str, overrides: list[str], config, sweep) -> list[str]:
  """The command every trial runs, less its workdir and its point's overrides.

  Where config.best names another metric than the objective, the trials run with --config.best=OBJECTIVE: a trial's
  `best` checkpoint is then the step the sweep ranks it by, the one the report's evaluation command reads.
  """
  cmd = [sys.executable, "-m", "vitjax.main", f"--config={config_arg}", *overrides]
  if config.best != sweep.objective:
    cmd.append(f"--config.best={sweep.objective}")
    logging.info("the trials keep as best the step of their best %s, the objective (config.best is %s)",
                 sweep.objective, config.best)  # fmt: skip
  return cmd


def _open_study(url: str, name: str, sweep, target: int, sweep_dir: str):
  """(study, store) of the sweep, creating sweep_dir.

  Bad input leaves nothing behind (only what this process made).
  """
  existed = os.path.isdir(sweep_dir)
  missing = paths.missing_folders(sweep_dir)
  os.makedirs(sweep_dir, exist_ok=True)
  try:
    study, store = study_lib.open_study(
      url, name, sweep, target, FLAGS.heartbeat, FLAGS.grace, config=study_lib.config_fields(FLAGS.config, sweep)
    )
  except BaseException:
    if not existed and not FLAGS.storage:  # bad input leaves nothing behind (only what this process made)
      for name in ("study.db", "study.db.claim-lock"):
        if os.path.exists(os.path.join(sweep_dir, name)):
          os.remove(os.path.join(sweep_dir, name))
    paths.remove_empty(missing)  # the sweep folder and the parents this made, if nothing else is there
    raise
  return study, store


def _requeue(study, target: int) -> None:
  """Queues again the interrupted trials whose worker died before it could, and (--retry_failed) the failed."""
  for t in study_lib.latest_attempts(study.get_trials(deepcopy=False)).values():
    if t.state.name != "FAIL" or study_lib.slot(t) >= target:
      continue
    if "error" not in t.user_attrs:  # interrupted, and its worker died before it queued the copy
      logging.info("trial %d: interrupted and not queued again: queued now", study_lib.slot(t))
      study_lib.requeue(study, t)
    elif FLAGS.retry_failed:
      logging.info(
        "trial %d: queued again (--retry_failed; it failed with: %s)", study_lib.slot(t), t.user_attrs["error"]
      )
      study_lib.requeue(study, t)


def _run_workers(run) -> int:
  """Runs the trials until done (0) or stopped; each stop says how to go on.

  Stopped by a signal (every trial checkpoints; a second one stops at once, but for a SIGTERM delivered again within
  vitjax.train.preemption.REPEAT_S), a worker that crashed, or three user errors in a row.
  """
  from vitjax.train import preemption

  stops = []

  def on_signal(signum, frame):
    if stops and preemption.repeated(signum, *stops[0]):
      return
    stops.append((signum, time.monotonic()))
    if len(stops) == 1:
      logging.info(
        "%s: stopping every trial at its next step (they checkpoint and are queued again)", signal.Signals(signum).name
      )
      run.request_stop(signal.Signals(signum).name)
    else:  # a second signal: stop now, without checkpoints
      run.kill_trials()
      os._exit(128 + signum)

  signal.signal(signal.SIGTERM, on_signal)
  signal.signal(signal.SIGINT, on_signal)
  status = run.run()
  if status == runner.EXIT_PREEMPTED:
    logging.info("%s: sweep stopped; rerun the same command to resume it", run.stop_reason)
    return status
  if status == 1:
    print(f"error: a sweep worker stopped: {run.crashed[0]}; rerun the same command to go on", file=sys.stderr)
    return status
  if status == runner.EXIT_USER_ERROR:
    print(
      f"error: 3 trials in a row failed: the last {run.user_error}; fix it in the config file, then rerun with "
      "--retry_failed (a changed --config override makes another sweep: give it a new --sweep_dir)",
      file=sys.stderr,
      flush=True,
    )
    return status
  return 0


def _run(argv) -> int:

  config_arg = _config_arg(argv)
  if FLAGS.config is None or config_arg is None:
    raise ConfigError("a sweep needs --config=configs/NAME.py (a config file with a get_sweep())")
  sweep = sweep_lib.load(config_arg, FLAGS.config)
  overrides = _overrides(argv)
  _check_flags(sweep, overrides)
  target = min(sweep.size, FLAGS.max_trials or sweep.size)
  groups = devices.device_groups(FLAGS.workers, FLAGS.devices_per_worker)
  sweep_dir = os.path.abspath(FLAGS.sweep_dir)
  url = FLAGS.storage or f"sqlite:///{os.path.join(sweep_dir, 'study.db')}"
  name = study_lib.study_name(config_arg, overrides)
  record = {
    "study": name,
    "storage": study_lib.masked(url),
    "config": config_arg,
    "overrides": overrides,
    "command": shlex.join(["python", "-m", "vitjax.sweep", *argv[1:]]),
  }
  _check_sweep_dir(sweep_dir, record)
  _check_config(FLAGS.config, sweep_dir, sweep)
  study, store = _open_study(url, name, sweep, target, sweep_dir)
  if not os.path.exists(os.path.join(sweep_dir, "sweep.json")):
    paths.write_text(os.path.join(sweep_dir, "sweep.json"), json.dumps(record, indent=2))  # (many may write it)
  _requeue(study, target)
  base = _trial_command(config_arg, overrides, FLAGS.config, sweep)
  run = runner.Runner(sweep, study, store, sweep_dir, base, groups, target, FLAGS.heartbeat, FLAGS.grace)
  logging.info(
    "sweep %r: %d trials (%s), %s %s | storage %s | %d worker%s: %s",
    name,
    target,
    ", ".join(f"{k} {d.describe()}" for k, d in sweep.dims().items()),
    sweep.direction,
    sweep.objective,
    study_lib.masked(url),
    len(groups),
    "s" if len(groups) > 1 else "",
    ", ".join(devices.describe_devices(g) for g in groups),
  )
  status = _run_workers(run)
  if status:
    return status
  out = report.write(study, sweep_dir, record)
  logging.info("sweep done: %s", out)
  return 0


def _report(argv) -> int:

  sweep_dir = os.path.abspath(FLAGS.sweep_dir)
  path = os.path.join(sweep_dir, "sweep.json")
  if not os.path.exists(path):
    raise ConfigError(
      f"{sweep_dir} has no sweep.json: give the --sweep_dir of a sweep (python -m vitjax.sweep --config=...)"
    )
  record = _read_record(path)
  url = FLAGS.storage or record["storage"]
  if "***" in url:
    raise ConfigError(f"the sweep's storage {url} needs its password: give --storage=URL")
  db = url.removeprefix("sqlite:///") if url.startswith("sqlite:///") else None
  if db is not None and not os.path.isfile(db):  # optuna would create an empty one
    raise ConfigError(f"the sweep's study {db} is gone: restore it, or give the sweep's --storage")
  optuna = study_lib.optuna_module()
  try:
    study = optuna.load_study(study_name=record["study"], storage=study_lib.storage(url))
  except KeyError:
    raise ConfigError(f"no study {record['study']!r} in {study_lib.masked(url)}: give the sweep's --storage") from None
  logging.info("%s", report.write(study, sweep_dir, record))
  return 0


def main() -> int:
  """Command line entry: runs or resumes the sweep (--mode=run), or writes its report (--mode=report).

  Returns:
    The exit status.
  """
  return _run(sys.argv) if FLAGS.mode == "run" else _report(sys.argv)


if __name__ == "__main__":
  cli.run(main)
