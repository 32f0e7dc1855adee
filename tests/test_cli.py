"""vitjax.cli: the one runner of every command line (flags, the config flag, one error line, exit statuses)."""

import os
import subprocess
import sys
import textwrap

import pytest
import train_helpers as th


def test_every_command_line_goes_through_the_one_runner():
  """The flags, the log, one error line and the exit statuses are cli.run's: no entry point writes its own."""
  root = os.path.join(os.path.dirname(__file__), "..", "vitjax")
  entry_points = []
  for folder, _, files in os.walk(root):
    for name in files:
      if not name.endswith(".py"):
        continue
      path = os.path.join(folder, name)
      text = open(path, encoding="utf-8").read()
      rel = os.path.relpath(path, root)
      assert "app.run(" not in text or rel == "cli.py", rel
      assert "import argparse" not in text, rel
      if rel == os.path.join("sweep", "launch.py"):  # not a command line: the sweep execs it, standard library only
        continue
      if '\nif __name__ == "__main__":' in text:
        entry_points.append(rel)
        assert "cli.run(main)" in text.split('\nif __name__ == "__main__":')[1], rel
  assert sorted(entry_points) == sorted(
    [
      "main.py",
      "export.py",
      "average.py",
      "plot.py",
      "attention_maps.py",
      "translate.py",
      os.path.join("sweep", "__main__.py"),
      os.path.join("sweep", "decode.py"),
      os.path.join("data", "prepare.py"),
      os.path.join("data", "text", "__main__.py"),
    ]
  ), entry_points


def test_ctrl_c_where_no_handler_of_vitjaxs_takes_it_is_one_line_and_exit_130():
  """An evaluation, or the start of any command (its config file, imports): a KeyboardInterrupt traceback before."""
  script = textwrap.dedent("""
    from vitjax import cli

    def main():
      raise KeyboardInterrupt

    cli.run(main)
  """)
  proc = subprocess.run([sys.executable, "-c", script], env=th.env(), capture_output=True, text=True, timeout=120)
  assert proc.returncode == 130 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
  assert proc.stderr.strip().splitlines()[-1] == "SIGINT: stopped"


def test_a_thread_left_running_cannot_keep_an_ended_command_alive():
  """Python waits for every non-daemon thread at exit: after a failed asynchronous write orbax left such threads waiting
  forever, and a run that had printed its error hung. cli.run exits anyway, EXIT_WAIT_S after the end, with the
  status, naming the threads."""
  script = textwrap.dedent("""
    import threading
    from vitjax import cli
    from vitjax.errors import ConfigError

    cli.EXIT_WAIT_S = 1

    def main():
      threading.Thread(target=threading.Event().wait, name="left-waiting").start()
      raise ConfigError("the check failed")

    cli.run(main)
  """)
  proc = subprocess.run([sys.executable, "-c", script], env=th.env(), capture_output=True, text=True, timeout=120)
  assert proc.returncode == 2, proc.stderr[-2000:]
  lines = proc.stderr.strip().splitlines()
  assert lines[0] == "error: the check failed", lines
  assert lines[-1] == "error: exiting 1 s after the end, which threads left running held: left-waiting", lines


def test_a_misspelt_nested_field_or_an_old_optim_field_is_one_line_naming_the_flag_to_give():
  """cli's reading of ml_collections' AttributeError(KeyError) for a --config.A.B.FIELD override: the field's own
  parent and the corrected flag (any depth, other flags around it), version 1's optimizer fields pointing to
  optim.kwargs, and None for an error that names no field."""
  from vitjax import cli

  def unknown(name, near=None):
    text = f"'{name}'" + (f'\nDid you mean "{near}" instead of "{name}"?' if near else "")
    return AttributeError(KeyError(text))

  argv = ["main", "--config.seed=1", "--config.model.encoder.widht=3", "--workdir=w"]
  assert cli._unknown_field_message(unknown("widht", "width"), argv) == (
    "--config.model.encoder.widht: config.model.encoder has no field 'widht'; did you mean"
    " --config.model.encoder.width ('width')?"
  )
  assert cli._unknown_field_message(unknown("widht"), argv) == (
    "--config.model.encoder.widht: config.model.encoder has no field 'widht' (the fields are those of"
    " vitjax/config/schema.py and the config file)"
  )
  assert cli._unknown_field_message(unknown("modle", "model"), ["main", "--config.modle.encoder.width=3"]) == (
    "--config.modle.encoder.width: config has no field 'modle'; did you mean --config.model.encoder.width ('model')?"
  )  # a misspelt parent: the rest of the flag kept
  assert cli._unknown_field_message(unknown("b2"), ["main", "--config.optim.b2=0.95"]) == (
    "--config.optim.b2: optim.b2 is now an argument of the optax optimizer: --config.optim.kwargs=\"{'b2': ...}\""
  )
  assert cli._unknown_field_message(unknown("b2"), ["main", "--config.model.b2=1"]).startswith(
    "--config.model.b2: config.model has no field 'b2'"
  )  # only optim's b2 moved
  assert cli._unknown_field_message(ValueError("bad value"), ["main", "--config.model.x=3"]) is None
  # a model attribute the config file does not set (the multihost guide's scan and remat, before it said so)
  assert cli._unknown_field_message(unknown("scan"), ["main", "--config.model.scan=True"]) == (
    "--config.model.scan: the config file's model sets no 'scan', and an override changes only the fields the file "
    "sets: set it in the config file (c.model.scan = ...)"
  )


def test_guarded_turns_how_main_ended_into_the_documented_exit_status(capsys):
  """vitjax.errors' statuses: 0 (or main's own), 2 and one line for a user error (none on a later process of several),
  74 and one line for an unwritable workdir, 75 and 3 already logged; a bug is not caught."""
  from vitjax import cli, logs
  from vitjax.errors import ConfigError, DatasetNotPreparedError, Diverged, Preempted, WorkdirUnwritable

  def ends(e):
    def main():
      raise e

    return main

  assert cli.guarded(lambda: None) == 0 and cli.guarded(lambda: 4) == 4
  assert cli.guarded(ends(ConfigError("give --config.seed=0\n  or 1"))) == 2
  assert capsys.readouterr().err == "error: give --config.seed=0 or 1\n"
  assert cli.guarded(ends(DatasetNotPreparedError("run prepare"))) == 2
  assert cli.guarded(ends(FileNotFoundError("no such file x"))) == 2
  assert capsys.readouterr().err == "error: run prepare\nerror: no such file x\n"
  assert cli.guarded(ends(WorkdirUnwritable("cannot write /w: no space is left"))) == 74
  assert capsys.readouterr().err == "error: cannot write /w: no space is left\n"
  assert cli.guarded(ends(Preempted())) == 75 and cli.guarded(ends(Diverged())) == 3
  assert capsys.readouterr().err == ""
  try:
    logs.set_process(1, 2)
    assert cli.guarded(ends(ConfigError("said by process 0"))) == 2 and capsys.readouterr().err == ""
  finally:
    logs.set_process(0, 1)
  with pytest.raises(ZeroDivisionError):
    cli.guarded(lambda: 1 / 0)
