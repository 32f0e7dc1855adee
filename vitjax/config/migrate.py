"""Old workdirs: a config.json of an earlier schema version, brought to today's (CONFIG_VERSION)."""

from __future__ import annotations

import inspect
import json

from vitjax.config.schema import CONFIG_VERSION, default_config, flatten, translation_config
from vitjax.errors import ConfigError


def _optax_defaults(name: str) -> dict:
  import optax

  try:
    params = inspect.signature(getattr(optax, str(name))).parameters
  except (AttributeError, TypeError, ValueError):
    return {}
  return {k: p.default for k, p in params.items() if p.default is not inspect.Parameter.empty}


def migrate(flat: dict) -> dict:
  """A workdir's config (config.json with its history applied, flat 'a.b' keys) in the schema of CONFIG_VERSION.

  So that older runs load, evaluate and resume. Fields added since the run was written take their defaults (the task's),
  so code reads every field directly. ConfigError for a config from a newer vitjax.
  """
  flat = dict(flat)
  version = flat.get("config_version") or 1
  if not isinstance(version, int) or version > CONFIG_VERSION:
    raise ConfigError(
      f"this workdir's config is version {version}, newer than this vitjax's {CONFIG_VERSION}: upgrade vitjax"
    )
  has = lambda key: key in flat or any(k.startswith(key + ".") for k in flat)
  if "model.prenorm" in flat:  # (before version 1 had a number) model.prenorm (bool) became model.norm
    prenorm = flat.pop("model.prenorm")
    flat.setdefault("model.norm", "pre" if prenorm else "post")
  if version < 2:  # optim's own fields became optax's keyword arguments, those that differ from optax's defaults
    old = {k: flat.pop(f"optim.{k}") for k in ("b1", "b2", "eps", "momentum", "nesterov") if f"optim.{k}" in flat}
    if not has("optim.kwargs"):
      defaults = _optax_defaults(flat.get("optim.name", "adamw"))
      flat["optim.kwargs"] = {k: v for k, v in old.items() if k in defaults and defaults[k] != v}
  if version < 3:
    flat = _evaluators_by_name(flat)
  task_defaults = translation_config("bible", "en", "es") if flat.get("task") == "translation" else default_config()
  for key, value in flatten(json.loads(task_defaults.to_json_best_effort())).items():
    if key.startswith(("model.", "data.", "evals.")) or has(key) or any(key.startswith(k + ".") for k in flat):
      continue
    flat[key] = value
  flat["config_version"] = CONFIG_VERSION
  return flat


def _evaluators_by_name(flat: dict) -> dict:
  """Version 2 -> 3: evaluations become named entries of config.evals, with their options.

  The primary evaluation (data.eval_split every eval_every, the task's own), its moving average's twin with ema_decay,
  and the (name, split, kind, every) entries of config.evals become named entries; the probe and decode blocks and
  data.eval_examples become their options; best_metric becomes best.
  """
  task = flat.get("task", "classification")
  probe = {k.removeprefix("probe."): flat.pop(k) for k in [k for k in flat if k.startswith("probe.")]}
  decode = {k.removeprefix("decode."): flat.pop(k) for k in [k for k in flat if k.startswith("decode.")]}
  examples = flat.pop("data.eval_examples", None)
  own = {"type": task, "split": flat.pop("data.eval_split", "valid"), "examples": examples}
  if task == "translation":
    own.update(decode)
  entries = {"eval": own}
  if flat.get("ema_decay"):
    entries["eval_ema"] = {**own, "weights": "ema"}
  old = flat.pop("evals", None) or []
  for k in [k for k in flat if k.startswith("evals.")]:  # (an older config's evals is a list: nothing here)
    flat.pop(k)
  for name, split, kind, every in old:
    entry = {"type": task, "split": split, "every": every, "examples": examples}
    if kind == "ema":
      entry["weights"] = "ema"
    elif kind == "probe":
      entry = {"type": "probe", "split": split, "every": every, **probe}
    entries[name] = entry
  for name, entry in entries.items():
    for key, value in entry.items():
      if value is not None:
        flat[f"evals.{name}.{key}"] = value
  flat["best"] = flat.pop("best_metric", "eval/loss" if task == "mae" else "eval/accuracy")
  flat.pop("best_mode", None)
  return flat
