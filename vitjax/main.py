"""Command line: train, resume or evaluate an experiment.

    python -m vitjax.main --config=configs/vit_digits.py --workdir=workdirs/vit_digits
    python -m vitjax.main --config=configs/vit_digits.py --workdir=workdirs/vit_digits --config.optim.lr=3e-3
    python -m vitjax.main --config=configs/vit.py:variant=S/16,dataset=fashion_mnist --workdir=...
    python -m vitjax.main --mode=eval --workdir=workdirs/vit_digits [--checkpoint=best|latest|STEP] [--split=test]

Training resumes from the workdir's latest checkpoint. In eval mode the config defaults to the one saved in the
workdir, and --checkpoint=best is the kept step with the best validation metric. For several hosts, pass
--multihost on each (jax.distributed reads the cluster from the environment).

Output: progress, evaluations and one closing line at the default --verbosity=0; --verbosity=1 adds the
libraries' INFO lines (orbax, grain, tfds), --verbosity=-1 keeps warnings and errors only (see vitjax.logs).
A problem the user can fix ends the run with one "error: ..." line and exit status 2.
"""

import json
import os
import re
import sys

from absl import app, flags
from ml_collections import config_flags

config_flags.DEFINE_config_file("config", None, "experiment config file (configs/*.py), with :args", lock_config=True)
flags.DEFINE_string("workdir", None, "where checkpoints, metrics and summaries go", required=True)
flags.DEFINE_enum("mode", "train", ["train", "eval"], "train (resumes if possible) or evaluate a checkpoint")
flags.DEFINE_string("checkpoint", "best", "eval mode: 'best' (best validation metric), 'latest' or a step number")
flags.DEFINE_string("split", None, "eval mode: split to evaluate (default: config.data.eval_split)")
flags.DEFINE_bool("multihost", False, "call jax.distributed.initialize() first (one process per host)")
FLAGS = flags.FLAGS


def _saved_config(workdir):
  import ml_collections as mlc

  workdir = os.path.abspath(workdir)

  path = os.path.join(workdir, "config.json")
  if not os.path.exists(path):
    raise FileNotFoundError(f"{path} not found: pass --config, or point --workdir at a vitjax run's workdir")
  with open(path) as f:
    return mlc.ConfigDict(json.load(f))


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
    suggestion = re.search(r'Did you mean "([^"]+)"', text)
    if suggestion:
      fixed = "--" + ".".join(parts[:i] + [suggestion.group(1)] + parts[i + 1 :])
      return f"{flag}: {parent} has no field {bad!r}; did you mean {fixed} ({suggestion.group(1)!r})?"
    return f"{flag}: {parent} has no field {bad!r} (the fields are those of vitjax/config.py and the config file)"
  return None


def _parse_flags(argv):
  """absl's flag parsing, with a clear error (exit status 2) for an unknown --config.FIELD."""
  try:
    return app.parse_flags_with_usage(argv)
  except (AttributeError, KeyError) as e:
    msg = _unknown_field_message(e, argv)
    if msg is None:
      raise
    print(f"error: {msg}", file=sys.stderr, flush=True)
    sys.exit(2)


def main(argv):
  del argv
  from vitjax import logs

  logs.setup()
  if FLAGS.multihost:
    import jax

    jax.distributed.initialize()
  from vitjax import train
  from vitjax.errors import USER_ERRORS, ConfigError

  try:
    config = FLAGS.config if FLAGS.config is not None else _saved_config(FLAGS.workdir)
    if FLAGS.mode == "train":
      if FLAGS.config is None:
        raise ConfigError("training needs --config=configs/NAME.py")
      train.train(config, FLAGS.workdir)
    else:
      train.evaluate(config, FLAGS.workdir, FLAGS.checkpoint, FLAGS.split)
  except (*USER_ERRORS, FileNotFoundError) as e:
    print(f"error: {e}", file=sys.stderr, flush=True)
    sys.exit(2)


if __name__ == "__main__":
  app.run(main, flags_parser=_parse_flags)
