"""Configs on disk: config files (configs/NAME.py, each with its `get_config(arg=None)`) and a workdir's config.

A workdir's config is WORKDIR/config.json with the changes of config_history.jsonl applied, brought to today's schema
(migrate); its JSON records (task.json, ...) are read here too. vitjax.train.workdir writes them.
"""

from __future__ import annotations

import importlib.util
import json
import os

import ml_collections as mlc

from vitjax import durations
from vitjax.config.migrate import migrate
from vitjax.config.schema import OPEN, default_config, flatten, translation_config
from vitjax.errors import ConfigError


def load_module(path: str):
  """A config file (configs/NAME.py) as a module: its docstring, `get_config(arg=None)`."""
  name = os.path.splitext(os.path.basename(path))[0]
  spec = importlib.util.spec_from_file_location(f"vitjax_configs.{name}", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def read_json(workdir: str, name: str):
  """WORKDIR/name parsed as JSON; None if there is no such file.

  Raises:
    ConfigError: the file is not valid JSON.
  """
  path = os.path.join(workdir, name)
  if not os.path.exists(path):
    return None
  try:
    with open(path) as f:
      return json.load(f)
  except (ValueError, UnicodeDecodeError) as e:
    raise ConfigError(f"{path} is not valid JSON ({e}); {RESTORE}") from None


RESTORE = "restore it from a copy or use a new --workdir"
MAX_SIDE = 16384  # pixels: an image side a recorded task may claim (a float32 RGB image of it is 3 GiB)
# task.json's fields and what each must be: (check, what it must be)
_TASK_FIELDS = {
  "task": (lambda v: isinstance(v, str), "a task's name"),
  "num_classes": (lambda v: _whole(v, 1, 10**7), "a whole number of classes, 1 to 10^7"),
  "channels": (lambda v: _whole(v, 1, 4), "1, 3 or 4"),
  "image_size": (
    lambda v: isinstance(v, list) and len(v) == 2 and all(_whole(n, 1, MAX_SIDE) for n in v),
    f"[height, width], each 1 to {MAX_SIDE}",
  ),
  "class_names": (lambda v: v is None or isinstance(v, list) and all(isinstance(n, str) for n in v), "names or null"),
  "vocab_size": (lambda v: _whole(v, 1, 10**7), "a whole number, 1 to 10^7"),
  "max_len": (lambda v: _whole(v, 1, 10**6), "a whole number, 1 to 10^6"),
}


def _whole(v, low: int, high: int) -> bool:
  return isinstance(v, int) and not isinstance(v, bool) and low <= v <= high


def read_record(workdir: str, name: str) -> dict | None:
  """WORKDIR/name, a JSON object (config.json, task.json); None if there is no such file; ConfigError for the rest."""
  record = read_json(workdir, name)
  if record is not None and not isinstance(record, dict):
    path = os.path.join(workdir, name)
    raise ConfigError(f"{path} holds a JSON {type(record).__name__}, not the object vitjax wrote; {RESTORE}")
  return record


def read_task(workdir: str) -> dict | None:
  """WORKDIR/task.json (what prediction needs), its fields checked; None if there is none. ConfigError per fault."""
  task = read_record(workdir, "task.json")
  for key, (ok, want) in _TASK_FIELDS.items():
    if task is not None and key in task and not ok(task[key]):
      path = os.path.join(workdir, "task.json")
      raise ConfigError(f"{path}: {key}={task[key]!r} must be {want}; {RESTORE}")
  return task


def _unflatten(flat: dict) -> dict:
  out: dict = {}
  for key, v in flat.items():
    node = out
    *parents, last = key.split(".")
    for p in parents:
      node = node.setdefault(p, {})
    node[last] = v
  return out


def history(workdir: str) -> list[dict]:
  """The rows of WORKDIR/config_history.jsonl, oldest first; [] if there is none."""
  path = os.path.join(workdir, "config_history.jsonl")
  if not os.path.exists(path):
    return []
  rows = []
  with open(path, encoding="utf-8", errors="replace") as f:
    for number, line in enumerate(f, 1):
      if not line.strip():
        continue
      try:
        row = json.loads(line)
      except ValueError:
        row = None
      changes = row.get("changes") if isinstance(row, dict) else None
      if not isinstance(changes, dict) or not all(isinstance(v, list) and len(v) == 2 for v in changes.values()):
        raise ConfigError(
          f"{path}, line {number}: not a record of config changes ({line.strip()[:60]!r}); restore the file from a "
          "copy, or delete that line if you know the run's config did not change there"
        )
      rows.append(row)
  return rows


def effective_config(workdir: str) -> dict | None:
  """config.json with the changes of config_history.jsonl applied (None for a workdir without config.json)."""
  base = read_record(workdir, "config.json")
  if base is None:
    return None
  flat = flatten(base)
  for row in history(workdir):
    for key, (_, new) in row["changes"].items():
      flat[key] = new
  flat = migrate(flat)
  check_types(flat, os.path.join(workdir, "config.json"))
  return _unflatten(flat)


def _kind(v) -> str | None:
  if v is None:
    return None
  if isinstance(v, bool):
    return "true or false"
  if isinstance(v, (int, float)) or (isinstance(v, list) and v and all(isinstance(n, (int, float)) for n in v)):
    return "a number"
  return "text" if isinstance(v, str) else None


def check_types(flat: dict, where: str) -> None:
  """ConfigError naming the first field of a recorded config whose value is not of its default's kind.

  The kinds: true/false, a number (or numbers: an image size), text; fields whose default is None, lists and dicts
  are checked where they are read, and so are the OPEN subtrees (the model's, evaluators', augmentation's options).
  """
  ref = translation_config("x", "en", "es") if flat.get("task") == "translation" else default_config()
  for key, default in flatten(ref.to_dict()).items():
    want, value = _kind(default), flat.get(key)
    if key in durations.FIELDS:  # a number, or a text such as "1 epoch" (checked where it is read)
      continue
    if want is not None and value is not None and _kind(value) != want and not key.startswith(OPEN):
      raise ConfigError(f"{where}: {key}={value!r} must be {want} (default {default!r}); {RESTORE}")


def config_source(workdir: str) -> str:
  """Where a workdir's config comes from, for the line that names it.

  WORKDIR/config.json, and the fields config_history.jsonl changes in it when there are any (config.json alone is
  then not what trained the latest checkpoints).
  """
  path = os.path.join(workdir, "config.json")
  fields = list(dict.fromkeys(k for row in history(workdir) for k in row["changes"]))
  if not fields:
    return path
  shown = ", ".join(fields[:6]) + (f" and {len(fields) - 6} more" if len(fields) > 6 else "")
  return f"{path} with the changes of config_history.jsonl ({shown})"


def read_config(workdir: str) -> mlc.ConfigDict:
  """The config a workdir trains with: config.json and its recorded changes."""
  config = effective_config(workdir)
  if config is None:
    raise ConfigError(f"{os.path.join(workdir, 'config.json')} not found: is {workdir} the workdir of a vitjax run?")
  return mlc.ConfigDict(config)
