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
  t = time.time()
  pairs = load_pairs(source, src_lang=src_lang, tgt_lang=tgt_lang)
  words = np.asarray([max(len(a.split()), len(b.split())) for a, b in pairs])
  print(f"{source}: {len(pairs)} pairs ({time.time() - t:.1f}s), {int((words >= 4).sum())} with >= 4 words on a side")
  splits = split_pairs(pairs, 0, 1000, 1000)
  print({k: len(v) for k, v in splits.items()})
  with tempfile.TemporaryDirectory() as tmp:
    t = time.time()
    tok = Tokenizer.train([x for p in splits["train"] for x in p], os.path.join(tmp, "spm"), vocab)
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
