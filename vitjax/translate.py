"""Translates lines from a file or stdin with a trained translation workdir (its config, tokenizer, checkpoint).

    echo "In the beginning God created the heaven and the earth." | python -m vitjax.translate --workdir=W
    python -m vitjax.translate --workdir=W --input=lines.txt --output=out.txt --checkpoint=best --beam_size=4

One output line per input line, in order. An empty line translates to an empty line; unknown characters map to
the unknown token; a line longer than the model's max_len tokens is truncated, with a warning on stderr naming
the line. --method=greedy or --method=sample (with --temperature, --top_k) replace beam search.
"""

import json
import os
import sys

from absl import app, flags

flags.DEFINE_string("workdir", None, "a workdir of a translation run", required=True)
flags.DEFINE_string("input", None, "file of source lines (default: stdin)")
flags.DEFINE_string("output", None, "file to write (default: stdout)")
flags.DEFINE_string("checkpoint", "best", "'best', 'latest' or a step")
flags.DEFINE_enum("method", None, ["beam", "greedy", "sample"], "decoding (default: the config's)")
flags.DEFINE_integer("beam_size", None, "beam width (default: the config's)")
flags.DEFINE_float("alpha", None, "length penalty exponent (default: the config's)")
flags.DEFINE_float("temperature", None, "sampling temperature")
flags.DEFINE_integer("top_k", None, "sample from the k most likely tokens (0: all)")
flags.DEFINE_integer("batch_size", 32, "lines per batch (rounded up to a multiple of the device count)")
FLAGS = flags.FLAGS


def translate_lines(exp, params, lines, batch_size=32, warn=lambda msg: print(msg, file=sys.stderr)):
  """Source strings -> translated strings (same order, empty stays empty)."""
  import jax
  import numpy as np

  from vitjax import tasks
  from vitjax.models.transformer import EOS

  task, max_len = exp.task, exp.config.data.max_len
  tok = task.tokenizer
  out = [""] * len(lines)
  todo = []
  for i, line in enumerate(lines):
    line = line.strip()
    if not line:
      continue
    ids = tok.encode(line)
    if len(ids) > max_len - 1:
      warn(f"warning: line {i + 1} has {len(ids)} tokens; truncated to the model's max_len of {max_len} (with EOS)")
      ids = ids[: max_len - 1]
    todo.append((i, ids + [EOS]))
  n_dev = jax.device_count()
  batch_size = -(-batch_size // n_dev) * n_dev
  todo.sort(key=lambda x: len(x[1]))  # similar lengths together: less padding
  for start in range(0, len(todo), batch_size):
    chunk = todo[start : start + batch_size]
    width = max(len(ids) for _, ids in chunk)
    width = min(-(-width // 8) * 8, max_len)  # few distinct shapes, few compilations
    src = np.zeros((batch_size, width), np.int32)
    for r, (_, ids) in enumerate(chunk):
      src[r, : len(ids)] = ids
    src = tasks.to_global({"src": src}, exp.batch_sharding, ("src",))["src"]
    tokens = tasks._gather(task.translate_batch(exp, params, src, task.decode_len(width)))
    for (i, _), text in zip(chunk, tok.decode_batch(tokens[: len(chunk)])):
      out[i] = text
  return out


def main(argv):
  del argv
  import jax
  import ml_collections as mlc

  from vitjax import tasks, train

  path = os.path.join(FLAGS.workdir, "config.json")
  if not os.path.exists(path):
    print(f"error: {path} not found: --workdir must be a translation run's workdir", file=sys.stderr)
    sys.exit(2)
  with open(path) as f:
    config = mlc.ConfigDict(json.load(f))
  if config.get("task") != "translation":
    print(f"error: {FLAGS.workdir} is a {config.get('task')} run, not a translation run", file=sys.stderr)
    sys.exit(2)
  for key in ("method", "beam_size", "alpha", "temperature", "top_k"):
    if getattr(FLAGS, key) is not None:
      config.decode[key] = getattr(FLAGS, key)
  try:
    workdir = os.path.abspath(FLAGS.workdir)
    exp = train.setup(config, workdir, tasks.get(config, workdir, log=lambda *a: None))
    state, _, _ = train.restore_checkpoint(exp, workdir, FLAGS.checkpoint)
  except train.ConfigError as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(2)
  src = open(FLAGS.input, encoding="utf-8") if FLAGS.input else sys.stdin
  lines = src.read().split("\n")
  if lines and lines[-1] == "":
    lines.pop()  # a final newline ends the last line; it is not an extra empty line
  with jax.set_mesh(exp.mesh):
    result = translate_lines(exp, state.params, lines, FLAGS.batch_size)
  dst = open(FLAGS.output, "w", encoding="utf-8") if FLAGS.output else sys.stdout
  dst.write("".join(r + "\n" for r in result))
  dst.flush()


if __name__ == "__main__":
  app.run(main)
