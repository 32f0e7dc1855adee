"""The sweep's Optuna study: storage, name, the queue of trials that workers claim, sampler and pruner.

Its storage (SQLite or PostgreSQL), its name, the queue of trials (slots) that any number of workers claim, and the
sampler and pruner (vitjax.sweep.runner runs the trials).
"""

from __future__ import annotations

import json
import os
import time
import warnings

from vitjax.config import flatten, is_bookkeeping
from vitjax.errors import ConfigError

SLOT, OWNER = "trial", "vitjax:owner"  # the trial's slot (a user attribute: its directory), its worker


def optuna_module():
  """The optuna module, imported when first needed, with its log and warnings quietened.

  Its experimental-feature and heartbeat warnings are silenced and its log level set to WARNING.
  """
  import optuna

  warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
  warnings.filterwarnings("ignore", message=".*Heartbeat of storage is supposed to be used with Study.optimize.*")
  optuna.logging.set_verbosity(optuna.logging.WARNING)
  return optuna


def storage(url: str, heartbeat: int | None = None, grace: int | None = None):
  """Optuna's RDB storage for `url`, with heartbeats (stale trials are queued again) when `heartbeat` is set."""
  optuna = optuna_module()
  kwargs = {"connect_args": {"timeout": 60}} if url.startswith("sqlite") else {"pool_pre_ping": True}
  _check_sqlite_file(url)
  for attempt in range(5):
    try:
      return optuna.storages.RDBStorage(
        url,
        engine_kwargs=kwargs,
        heartbeat_interval=heartbeat,
        grace_period=grace,
        heartbeat_stale_trial_callback=requeue if heartbeat else None,
      )
    except Exception as e:  # sqlalchemy's errors: a bad URL, an unreachable server, a missing driver
      racing = "duplicate key" in str(e) or "already exists" in str(e)
      if not racing or attempt == 4:  # racing: another worker is creating the tables right now
        raise ConfigError(f"--storage={masked(url)}: cannot open it ({first_line(e)})") from None
      time.sleep(1 + attempt)


EMPTY_AGE_S = 60  # a 0-byte SQLite file younger than this may be one another worker is creating right now


def _check_sqlite_file(url: str) -> None:
  """ConfigError for a SQLite study file that holds no database: empty (long enough not to be one being made) or other.

  Optuna would silently write a new schema into it: a report of nothing, a sweep that starts over.
  """
  path = url[len("sqlite:///") :].split("?")[0] if url.startswith("sqlite:///") else ""
  if not path or not os.path.isfile(path):
    return
  st = os.stat(path)
  with open(path, "rb") as f:
    head = f.read(16)
  empty = st.st_size == 0 and time.time() - st.st_mtime > EMPTY_AGE_S
  if empty or (st.st_size and head != b"SQLite format 3\x00"):
    what = "is empty (0 bytes)" if empty else "is not a SQLite database"
    raise ConfigError(
      f"the sweep's study {path} {what}, so it holds no trials; restore it from a copy, or remove it to start over"
    )


def masked(url: str) -> str:
  """The URL without its password (up to the last '@': a password may hold one)."""
  head, sep, tail = url.partition("://")
  userinfo, at, rest = tail.rpartition("@")
  if at and ":" in userinfo:
    return f"{head}{sep}{userinfo.split(':', 1)[0]}:***@{rest}"
  return url


def first_line(e: BaseException) -> str:
  """The first line of an exception's message, or its type's name when the message is empty."""
  text = str(e).strip().splitlines()
  return text[0] if text else type(e).__name__


def study_name(config_arg: str, overrides: list[str]) -> str:
  """The config file's name, its :args and the overrides: 'vit_digits --config.num_epochs=30'."""
  path, _, args = config_arg.partition(":")
  name = os.path.splitext(os.path.basename(path))[0] + (f":{args}" if args else "")
  return " ".join([name, *overrides])


def slot(t) -> int:
  """A trial's slot (the number of its trial_NNNN directory): its user attribute SLOT, else its Optuna number."""
  return t.user_attrs.get(SLOT, t.number)


def requeue(study, trial) -> None:
  """Queues a failed-while-running trial again.

  Same slot, parameters and reported evaluations (it resumes from its checkpoint in the same directory). Optuna calls it
  for stale trials; the runner for interrupted ones.
  """
  optuna = optuna_module()
  attrs = {k: v for k, v in trial.system_attrs.items() if k != OWNER}
  attrs["retry_of"] = attrs.get("retry_of", []) + [trial.number]
  study.add_trial(
    optuna.trial.create_trial(
      state=optuna.trial.TrialState.WAITING,
      params=trial.params,
      distributions=trial.distributions,
      user_attrs={k: v for k, v in trial.user_attrs.items() if k != "error"},
      system_attrs=attrs,
      intermediate_values=trial.intermediate_values,
    )
  )


def latest_attempts(trials) -> dict:
  """Maps each slot to its newest attempt (retries are new Optuna trials of the same slot)."""
  out = {}
  for t in sorted(trials, key=lambda t: t.number):
    out[slot(t)] = t
  return out


def open_study(
  url: str,
  name: str,
  sweep,
  target: int,
  heartbeat: int | None = None,
  grace: int | None = None,
  config: dict | None = None,
):
  """Creates the study (and queues its trials) or loads it; returns (study, storage).

  Long: creating, loading and refusing a changed study are one decision about the same storage.

  Checks a loaded study was made by the same sweep and, where it recorded one, from the same `config` (the trials'
  fields as {'a.b': value}: a changed config file would mix two experiments in one study); tops its slots up to
  `target` (a rerun with a larger --max_trials).
  """
  optuna = optuna_module()
  store = storage(url, heartbeat, grace)
  try:
    study = optuna.create_study(
      storage=store, study_name=name, direction=sweep.direction, sampler=make_sampler(sweep), pruner=make_pruner(sweep)
    )
    created = True
  except optuna.exceptions.DuplicatedStudyError:
    study = optuna.load_study(study_name=name, storage=store, sampler=make_sampler(sweep), pruner=make_pruner(sweep))
    created = False
  described = json.loads(json.dumps(sweep.describe()))
  if not created:
    waited = 0.0
    while "sweep" not in study.user_attrs and waited < 30:  # its creator is queueing the trials
      time.sleep(0.5)
      waited += 0.5
    recorded = study.user_attrs.get("sweep")
    if recorded is not None and sweep.grid is not None and "grid_order" not in recorded:  # made before shuffling
      sweep.in_order = True
      described = json.loads(json.dumps(sweep.describe()))
    if recorded is not None and recorded != described:
      raise ConfigError(
        f"the study {name!r} in {masked(url)} was made by a different get_sweep() ({difference(recorded, described)}); "
        "undo the change, or start a new sweep with another --sweep_dir (and --storage study)"
      )
    made_from = study.user_attrs.get("config")
    if config is not None and made_from is not None and made_from != config:
      changed = [k for k in sorted(set(made_from) | set(config)) if made_from.get(k) != config.get(k)]
      said = ", ".join(f"{k} {made_from.get(k, '(none)')} -> {config.get(k, '(none)')}" for k in changed[:3])
      raise ConfigError(
        f"the study {name!r} in {masked(url)} was made from another config ({said}{' ...' if len(changed) > 3 else ''}"
        "); undo the change, or start a new sweep with another --sweep_dir (and --storage study)"
      )
    if study.direction.name.lower() != sweep.direction:
      raise ConfigError(
        f"the study {name!r} in {masked(url)} is to {study.direction.name.lower()}, not {sweep.direction}"
      )
  have = {slot(t) for t in study.get_trials(deepcopy=False)}
  for i in range(target):
    if i not in have:
      fixed = sweep.point(i) if sweep.grid is not None else {}
      study.add_trial(
        optuna.trial.create_trial(
          state=optuna.trial.TrialState.WAITING, user_attrs={SLOT: i}, system_attrs={"fixed_params": fixed}
        )
      )
  if "sweep" not in study.user_attrs:
    study.set_user_attr("sweep", described)
  if config is not None and "config" not in study.user_attrs:  # (a study made before it was recorded: from now on)
    study.set_user_attr("config", config)
  return study, store


def config_fields(config, sweep) -> dict:
  """The trials' shared config as {'a.b': value}, less the swept fields and what a run may change on a resume."""
  flat = flatten(json.loads(config.to_json_best_effort()))
  return {k: v for k, v in flat.items() if k not in sweep.fields and not is_bookkeeping(k)}


def difference(a: dict, b: dict) -> str:
  """The keys whose values differ between two sweep descriptions, as "it differs in KEY, ..." (sorted)."""
  keys = [k for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
  return "it differs in " + ", ".join(keys)


def make_sampler(sweep, slot: int | None = None):
  """The sweep's sampler; with a seed and a slot, seeded by both.

  So that machines and reruns draw each trial's values from its own stream (the same seed everywhere would draw the same
  points on every machine).
  """
  optuna = optuna_module()
  seed = sweep.seed if sweep.seed is None or slot is None else sweep.seed * 100_003 + slot
  if sweep.sampler == "random":
    return optuna.samplers.RandomSampler(seed=seed)
  return optuna.samplers.TPESampler(seed=seed)


def make_pruner(sweep):
  """The sweep's Optuna pruner, by sweep.pruner.

  "none": NopPruner; "median": MedianPruner, after 3 finished trials; "halving": SuccessiveHalvingPruner.
  """
  optuna = optuna_module()
  return {
    "none": optuna.pruners.NopPruner,
    "median": lambda: optuna.pruners.MedianPruner(n_startup_trials=3, n_warmup_steps=0),
    "halving": optuna.pruners.SuccessiveHalvingPruner,
  }[sweep.pruner]()
