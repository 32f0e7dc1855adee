"""Counts, lengths, tokenizer time and padding efficiency of a text source.

Run as `python -m vitjax.data.text --source=SOURCE --src=LANG --tgt=LANG [--vocab=8000]`.
"""

import os
import tempfile
import time

import numpy as np
from absl import flags

from vitjax import cli
from vitjax.data.text import EncodedPairs, Tokenizer, load_pairs, make_batches, split_pairs
from vitjax.errors import ConfigError, DatasetNotPreparedError

HELD_OUT = 1000  # pairs held out for each of valid and test


def define_flags() -> None:
  """Defines the flags --source, --src, --tgt and --vocab (called only when this module runs as a script)."""
  flags.DEFINE_string("source", None, "a text source (vitjax.data.text.sources), e.g. bible", required=True)
  flags.DEFINE_string("src", None, "source language", required=True)
  flags.DEFINE_string("tgt", None, "target language", required=True)
  flags.DEFINE_integer("vocab", 8000, "the tokenizer's vocabulary size")


def main() -> None:
  """Command line entry: prints statistics of a text source and of its batching.

  The pair counts, split sizes, tokenizer training time, token lengths, and the padding efficiency of
  length-bucketed batches at max_len 64 and 128.
  """
  f = flags.FLAGS
  source, src_lang, tgt_lang, vocab = f.source, f.src, f.tgt, f.vocab
  if vocab < 1:
    raise ConfigError(f"--vocab={vocab} must be at least 1 (e.g. --vocab=8000)")
  t = time.time()
  try:
    pairs = load_pairs(source, src_lang=src_lang, tgt_lang=tgt_lang)
  except DatasetNotPreparedError as e:  # its message names the config's field; here the flag says it
    raise type(e)(str(e).replace("config.data.source", "--source")) from None
  except ValueError as e:  # an unknown source, languages the source does not have, files that do not pair up
    languages = "languages" in str(e) or "no keys" in str(e)
    flag = f"--src={src_lang} --tgt={tgt_lang}" if languages else f"--source={source}"
    raise ConfigError(f"{flag}: {e}") from None
  words = np.asarray([max(len(a.split()), len(b.split())) for a, b in pairs])
  print(f"{source}: {len(pairs)} pairs ({time.time() - t:.1f}s), {int((words >= 4).sum())} with >= 4 words on a side")
  distinct = len(set(pairs))
  if distinct <= 2 * HELD_OUT:
    raise ConfigError(
      f"--source={source} has {distinct} distinct pairs: too few to hold out {HELD_OUT} for valid and {HELD_OUT} for "
      f"test and train on the rest; give a corpus of more than {2 * HELD_OUT} pairs"
    )
  splits = split_pairs(pairs, 0, HELD_OUT, HELD_OUT)
  print({k: len(v) for k, v in splits.items()})
  with tempfile.TemporaryDirectory() as tmp:
    t = time.time()
    try:
      tok = Tokenizer.train([x for p in splits["train"] for x in p], os.path.join(tmp, "spm"), vocab)
    except ConfigError as e:  # a vocabulary the text cannot fill
      raise ConfigError(f"--vocab={vocab}: {e}") from None
    print(f"tokenizer: vocab {tok.vocab_size}, trained in {time.time() - t:.1f}s")
  data = EncodedPairs(splits["train"], tok, None)
  for name, lens in (("src", data.src_lengths), ("tgt", data.tgt_lengths)):
    print(
      f"{name} tokens (with EOS): median {np.median(lens):.0f}, p95 {np.percentile(lens, 95):.0f}, max {lens.max()}"
    )
  for max_len in (64, 128):
    it = make_batches(splits["train"], tok, tokens_per_batch=4096, max_len=max_len)
    print(f"max_len {max_len}: padding efficiency {it.padding_efficiency():.3f}", it.stats())


if __name__ == "__main__":
  define_flags()
  cli.run(main)
