"""The one runner every command line uses (vitjax.main, export, inspect, translate, sweep, data.prepare).

Used as:

    if __name__ == "__main__":
      cli.run(main)          # main() -> exit status (None: 0), reading its absl FLAGS

It parses the flags (a bad flag, a missing or broken config file, a misspelt --config.FIELD, or an empty path flag
such as --workdir= from an unset variable: one "error: ..." line and exit status 2), sets up the log at --verbosity
(vitjax.logs: stderr; results go to stdout), runs main() and turns how it ended into the exit statuses of
vitjax.errors: a problem the user can fix is one "error: ..." line and 2; Preempted 75 and Diverged 3, already
logged; Ctrl-C that no handler of vitjax's takes, "SIGINT: stopped" and 130; anything else is a bug and keeps its
traceback.
"""

import ast
import os
import re
import sys
import threading
import time
from collections.abc import Callable

from absl import app, flags

from vitjax import logs
from vitjax.config import unknown_fields
from vitjax.errors import (
  USER_ERRORS,
  Diverged,
  Preempted,
  WorkdirUnwritable,
  one_line,
)


def _unknown_field_message(e: BaseException, argv) -> str | None:
  """A one-line message for a misspelt --config.FIELD override, or None if `e` is something else.

  While absl parses the flags, ml_collections raises AttributeError(KeyError(...)) whose text is the bad name and
  its 'Did you mean "lr" instead of "lrr"?'; uncaught, that ends the program with a long traceback.
  """
  while e.args and isinstance(e.args[0], BaseException):
    e = e.args[0]
  text = str(e.args[0]) if e.args else str(e)
  m = re.match(r"""['"]?([\w-]+)['"]?\s*(?:\n|$)""", text)
  if not m:
    return None
  bad = m.group(1)
  for arg in argv[1:]:
    path = re.match(r"--(config(?:\.[\w-]+)+)(?:=|$)", arg)
    parts = path.group(1).split(".") if path else []
    if bad not in parts[1:]:
      continue
    i = parts.index(bad, 1)
    parent, flag = ".".join(parts[:i]), "--" + path.group(1)
    if parent == "config.optim" and bad in ("b1", "b2", "eps", "momentum", "nesterov"):  # config version 1's
      return (
        f"{flag}: optim.{bad} is now an argument of the optax optimizer: --config.optim.kwargs=\"{{'{bad}': ...}}\""
      )
    if parent == "config.model" and bad in _model_attributes():
      return (
        f"{flag}: the config file's model sets no {bad!r}, and an override changes only the fields the file sets: "
        f"set it in the config file (c.model.{bad} = ...)"
      )
    suggestion = re.search(r'Did you mean "([^"]+)"', text)
    if suggestion:
      fixed = "--" + ".".join(parts[:i] + [suggestion.group(1)] + parts[i + 1 :])
      return f"{flag}: {parent} has no field {bad!r}; did you mean {fixed} ({suggestion.group(1)!r})?"
    return (
      f"{flag}: {parent} has no field {bad!r} (the fields are those of vitjax/config/schema.py and the config file)"
    )
  return None


def _model_attributes() -> set[str]:
  """Every registered model family's attributes (what config.model's fields may set)."""
  from vitjax.models import registry  # pylint: disable=g-import-not-at-top

  return {f for family in registry.FAMILIES for f in family.cls.__dataclass_fields__} - {"parent", "name"}


def _config_file_problem(argv) -> str | None:
  """One line for a --config file that does not exist or does not parse, or an override without one, or None."""
  overrides = [a.split("=", 1)[0] for a in argv[1:] if a.startswith("--config.")]
  if overrides and not any(a == "--config" or a.startswith("--config=") and a != "--config=" for a in argv[1:]):
    return (
      f"{overrides[0]} changes a field of a config file: give the file too, --config=configs/NAME.py, with the "
      "overrides the run was trained with (WORKDIR/config.json lists its values; it is not a config file)"
    )
  for arg, following in zip(argv[1:], [*argv[2:], None]):
    if arg.startswith("--config=") or (arg == "--config" and following is not None):  # --config=FILE, --config FILE
      value = arg.split("=", 1)[1] if "=" in arg else following
      path, _, config_args = value.partition(":")
      if os.path.isdir(path):
        return f"--config={value}: {path} is a folder; give a config file in it, such as configs/vit_digits.py"
      if not os.path.isfile(path):
        return f"--config={value}: no such file {path} (give a config file such as configs/vit_digits.py)"
      try:
        with open(path, encoding="utf-8") as f:
          tree = ast.parse(f.read(), path)
      except (SyntaxError, UnicodeDecodeError, ValueError) as e:
        where = f" line {e.lineno}" if getattr(e, "lineno", None) else ""
        return f"--config={value}: {path}{where}: {type(e).__name__}: {getattr(e, 'msg', e)}"
      names = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
      names |= {a.asname or a.name for n in tree.body if isinstance(n, ast.Import | ast.ImportFrom) for a in n.names}
      names |= {t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
      if "get_config" not in names:
        return f"--config={value}: {path} defines no get_config() (a config file's function that returns the config)"
      get_config = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "get_config"), None)
      params = get_config.args if get_config else None
      if config_args and params and not (params.args or params.vararg or params.posonlyargs):
        return f"--config={value}: {path}'s get_config() takes no arguments: leave out ':{config_args}'"
  return None


# what every vitjax config has (vitjax.config.default_config and translation_config build them)
CONFIG_FIELDS = ("task", "model", "data", "optim", "schedule")


def _config_value_problem(argv) -> str | None:
  """One line if --config's get_config() returned something other than a vitjax config, or None."""
  given = next((a for a in argv[1:] if a.startswith("--config=") and a != "--config="), None)
  if given is None or "config" not in flags.FLAGS:
    return None
  import ml_collections  # pylint: disable=g-import-not-at-top

  value = flags.FLAGS.config
  if not isinstance(value, ml_collections.ConfigDict):
    return f"{given}: get_config() returned {type(value).__name__}, not a config (build it on vitjax.config.default_config())"
  missing = [k for k in CONFIG_FIELDS if k not in value]
  if missing:
    return f"{given}: get_config()'s config has no {', '.join(missing)} (build it on vitjax.config.default_config())"

  unknown = unknown_fields(value)
  if unknown:
    key, near = unknown[0]
    hint = f"; did you mean {near}?" if near else " (the fields: vitjax/config/schema.py's default_config)"
    more = (
      f" (and {', '.join(k for k, _ in unknown[1:4])}{' ...' if len(unknown) > 4 else ''})" if len(unknown) > 1 else ""
    )
    return f"{given}: get_config() sets {key}, which vitjax does not read{hint}{more}"
  return None


# flags that name a file or folder: given empty (a job script's unset variable), each would mean the current directory
PATH_FLAGS = ("workdir", "out", "sweep_dir")


def _empty_path_problem() -> str | None:
  """One line for a path flag given as an empty string (or a list flag with an empty item), or None."""
  for name in PATH_FLAGS:
    if name in flags.FLAGS and flags.FLAGS[name].present:
      value = flags.FLAGS[name].value
      if not all(str(v).strip() for v in (value if isinstance(value, list) else [value])) or value == []:
        return f"--{name} is empty: give a path (an unset variable in a script gives this; '' is not taken as '.')"
  return None


def _root(e: BaseException) -> BaseException:
  """The innermost cause (ml_collections wraps a config file's own error twice)."""
  while e.__cause__ is not None or (e.__context__ is not None and not e.__suppress_context__):
    e = e.__cause__ or e.__context__
  return e


def _root_message(e: BaseException) -> str:
  """The innermost cause's last line."""
  text = str(_root(e)).strip().splitlines()
  return text[-1] if text else type(_root(e)).__name__


def parse_flags(argv):
  """Parses flags as absl does, with one clear line (exit status 2) for a bad flag, config file or --config.FIELD."""
  problem = _config_file_problem(argv)
  if problem is None:
    if any(a in ("--help", "-h", "-?", "--helpshort", "--helpfull", "--helpxml") for a in argv[1:]):
      try:
        flags.FLAGS(argv)
      except SystemExit as e:  # absl prints the help, then exits with 1 as if it were an error
        sys.exit(0 if e.code == 1 else e.code)
    try:
      with logs.muted():  # ml_collections' warnings while it loads the file: the error line says it
        rest = flags.FLAGS(argv)
        problem = _config_value_problem(argv) or _empty_path_problem()
      if problem is None:
        return rest
    except (flags.Error, AttributeError, KeyError, ValueError, TypeError) as e:
      problem = _unknown_field_message(e, argv)
      if problem is None:
        flag = re.match(r"flag (--[^=: ]+)", str(e))
        problem = f"{flag.group(1) + ': ' if flag else ''}{_root_message(e)}"
    except Exception as e:  # noqa: BLE001 -- the config file's own code failed (an import, a RuntimeError, ...)
      given = next((a for a in argv[1:] if a.startswith("--config=")), "--config")
      problem = f"{given}: the config file failed: {type(_root(e)).__name__}: {_root_message(e)}"
  if not logs.is_quiet_process():  # the processes of a --multihost run share their flags: one line says it
    print(f"error: {problem}", file=sys.stderr, flush=True)
  sys.exit(2)


def run(main: Callable[[], int | None]) -> None:
  """Runs a command line's main() under absl with vitjax's flag parsing, log and exit statuses (see above)."""

  def entry(argv):
    del argv

    logs.setup()
    status = 1  # a bug: its traceback, then exit 1
    try:
      status = guarded(main)
    finally:
      exit_within(EXIT_WAIT_S, status)
    sys.exit(status)

  try:
    app.run(entry, flags_parser=parse_flags)
  except KeyboardInterrupt:  # Ctrl-C where no handler of vitjax's takes it (training's checkpoints; see preemption)
    print("\nSIGINT: stopped", file=sys.stderr, flush=True)
    sys.exit(130)


EXIT_WAIT_S = 30.0


def exit_within(seconds: float, status: int) -> None:
  """Makes sure the process ends: if threads a library left behind still hold it `seconds` from now, exit anyway.

  Python waits for every non-daemon thread before it exits. After a failed asynchronous checkpoint write, orbax leaves
  threads that wait forever for a signal that will not come, and a run that had said how it ended would hang there.
  A daemon thread watches: a normal exit ends it with the process; otherwise it names the threads and exits with
  `status` (1 if it was 0: something was wrong).
  """

  def watch():
    time.sleep(seconds)
    names = [t.name for t in threading.enumerate() if not t.daemon and t is not threading.main_thread()]
    sys.stdout.flush()
    print(f"error: exiting {seconds:g} s after the end, which threads left running held: {', '.join(names[:3])}",
          file=sys.stderr, flush=True)  # fmt: skip
    os._exit(status or 1)

  threading.Thread(target=watch, name="vitjax-exit-watch", daemon=True).start()


def guarded(main: Callable[[], int | None]) -> int:
  """main()'s exit status, with a user error printed as one "error: ..." line.

  A user error exits with 2; a run stopped by a signal or a divergence is given its status (already logged).
  """
  try:
    return main() or 0
  except (*USER_ERRORS, FileNotFoundError) as e:
    if not logs.is_quiet_process():  # every process meets the same config and data: process 0 says it once
      print(f"error: {one_line(e)}", file=sys.stderr, flush=True)
    return 2
  except WorkdirUnwritable as e:
    print(f"error: {one_line(e)}", file=sys.stderr, flush=True)
    return e.exit_code
  except (Preempted, Diverged) as e:
    return e.exit_code
