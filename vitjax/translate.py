"""Translates lines from a file or stdin with a trained translation workdir (its config, tokenizer, checkpoint).

    echo "In the beginning God created the heaven and the earth." | python -m vitjax.translate --workdir=W
    python -m vitjax.translate --workdir=W --input=lines.txt --output=out.txt --checkpoint=best --beam_size=4

One output line per input line, in order. An empty line translates to an empty line; unknown characters map to
the unknown token; a line longer than the model's max_len tokens is truncated, with a warning on stderr naming
the line. --method=greedy or --method=sample (with --temperature, --top_k) replace beam search.
"""

import sys

from absl import flags

from vitjax import cli, paths
from vitjax.config import read_config
from vitjax.errors import ConfigError

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


def _read_lines(path: str | None) -> list[str]:
  """The input's lines; bytes that are not UTF-8 become U+FFFD, with a warning naming the lines.

  U+FFFD is an unknown character: the unknown token.
  """
  from absl import logging

  try:
    raw = open(path, "rb").read() if path else sys.stdin.buffer.read()
  except OSError as e:
    raise ConfigError(f"--input={path}: {e.strerror}") from None
  lines, bad = [], []
  for i, line in enumerate(raw.split(b"\n")):  # (a newline byte is never part of a longer UTF-8 sequence)
    try:
      lines.append(line.decode("utf-8"))
    except UnicodeDecodeError:  # (a U+FFFD that the file itself holds is text: no warning)
      lines.append(line.decode("utf-8", errors="replace"))
      bad.append(i + 1)
  if bad:
    shown = ", ".join(map(str, bad[:10])) + (" ..." if len(bad) > 10 else "")
    logging.warning("line(s) %s are not valid UTF-8: the undecodable bytes are translated as unknown characters", shown)
  return lines


DECODE_FLAGS = ("method", "beam_size", "alpha", "temperature", "top_k")


def _check_decoding(vocab_size: int | None = None) -> None:
  """ConfigError for a decoding flag (top_k: above vocab_size too) or --batch_size out of range."""
  from vitjax import decode

  if FLAGS.batch_size < 1:
    raise ConfigError(f"--batch_size={FLAGS.batch_size} must be a whole number, at least 1 (e.g. --batch_size=32)")
  decode.check_decoding(
    {k: getattr(FLAGS, k) for k in DECODE_FLAGS}, name=lambda key: f"--{key}", vocab_size=vocab_size
  )


def _write(path: str | None, text: str) -> None:
  """Writes the translations to --output (or stdout); ConfigError if the file cannot be written, removed if new."""
  if not path:
    sys.stdout.write(text)
    sys.stdout.flush()
    return
  try:
    paths.write_text(path, text)
  except OSError as e:
    raise ConfigError(
      f"--output={path}: cannot write it ({e.strerror}); give another --output, in a writable folder with room"
    ) from None


def main() -> None:
  """Command line entry: translates --input (or stdin) with --workdir's --checkpoint into --output (or stdout).

  One output line per input line; a final newline does not count as an extra empty line.

  Raises:
    ConfigError: --workdir is not a translation run, a decoding flag is out of range, --output cannot be written.
  """
  import vitjax
  from vitjax import decode

  _check_decoding()
  if FLAGS.output:
    paths.check_writable(FLAGS.output, "output", folder=False, make_parents=False)
  config = read_config(FLAGS.workdir)
  task = config.get("task")
  if task != "translation":
    raise ConfigError(f"{FLAGS.workdir} is a {task} run, not a translation run")
  method = FLAGS.method or decode.configured(config)["method"]  # (the run's: that of the evaluator that chose its best)
  decode.check_method_options(method, {k: getattr(FLAGS, k) for k in DECODE_FLAGS}, name=lambda key: f"--{key}")
  lines = _read_lines(FLAGS.input)
  trained = vitjax.load(FLAGS.workdir, FLAGS.checkpoint)
  _check_decoding(trained.task.tokenizer.vocab_size)  # (top_k needs the run's vocabulary)
  if lines and lines[-1] == "":
    lines.pop()  # a final newline ends the last line; it is not an extra empty line
  decode_args = {k: getattr(FLAGS, k) for k in DECODE_FLAGS}
  result = trained.translate(lines, FLAGS.batch_size, **decode_args)
  _write(FLAGS.output, "".join(r + "\n" for r in result))


if __name__ == "__main__":
  cli.run(main)
