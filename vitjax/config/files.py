"""Configs on disk: config files (configs/NAME.py, each with its `get_config(arg=None)`) and a workdir's config.

A workdir's config is WORKDIR/config.json with the changes of config_history.jsonl applied, brought to today's schema
(migrate); its JSON records (task.json, ...) are read here too. vitjax.train.workdir writes them.
"""

from __future__ import annotations

import importlib.util
import json
import os

import ml_collections as mlc

from vitjax.config.migrate import migrate
from vitjax.config.schema import flatten
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
    raise ConfigError(f"{path} is not valid JSON ({e}); restore it from a copy or use a new --workdir") from None


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
  with open(path) as f:
    return [json.loads(line) for line in f if line.strip()]


def effective_config(workdir: str) -> dict | None:
  """config.json with the changes of config_history.jsonl applied (None for a workdir without config.json)."""
  base = read_json(workdir, "config.json")
  if base is None:
    return None
  flat = flatten(base)
  for row in history(workdir):
    for key, (_, new) in row["changes"].items():
      flat[key] = new
  return _unflatten(migrate(flat))


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
