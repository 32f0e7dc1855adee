"""`python -m vitjax.data.text SOURCE SRC TGT [VOCAB]`: counts, lengths, tokenizer time and padding efficiency."""

import os
import sys
import time

import numpy as np

from vitjax.data.text import EncodedPairs, Tokenizer, load_pairs, make_batches, split_pairs


def main(argv: list[str]) -> None:
  """``python -m vitjax.data.text SOURCE SRC TGT [VOCAB]``: counts, lengths,
  tokenizer time and padding efficiency."""
  import tempfile  # pylint: disable=g-import-not-at-top

  source, src_lang, tgt_lang = argv[:3]
  vocab = int(argv[3]) if len(argv) > 3 else 8000
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
  main(sys.argv[1:])
