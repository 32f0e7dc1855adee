"""Parallel text for translation: sources, splits, SentencePiece, batches.

numpy + sentencepiece only (no TensorFlow). The pieces::

  pairs = load_pairs('bible', src_lang='en', tgt_lang='es')
  splits = split_pairs(pairs, seed=0, num_valid=1000, num_test=1000)
  tok = Tokenizer.train([t for p in splits['train'] for t in p],
                        '/tmp/spm_enes', vocab_size=8000)
  train_it = make_batches(splits['train'], tok, tokens_per_batch=4096,
                          max_len=128, seed=0)
  for batch in train_it: ...           # {'src', 'tgt', 'src_mask', 'tgt_mask'}
  state = train_it.get_state()         # -> checkpoint; train_it.set_state(state)
  for batch in make_eval_batches(splits['test'], tok, batch_size=64): ...

Sources (``load_pairs``):

* ``bible``: English (KJV, ``engKJV2006eb``) <-> Spanish (Reina-Valera 1909,
  ``spaRV1909eb``) verses, read from Debian's ``sword-text-kjv`` /
  ``sword-text-sparv`` SWORD modules with :mod:`vitjax.data.sword`. Both use
  the KJV versification, so verse-index entry ``i`` of one pairs with entry
  ``i`` of the other; entries empty on either side (book and chapter headings,
  verses the Spanish merges into a neighbour) are dropped, and so are pairs
  that the modules' Strong's numbers show to be misaligned (a few chapters
  where the Spanish numbering is shifted; see :func:`bible_pairs`).
* ``ding``: German <-> English from Debian's ``trans-de-en`` (the Ding
  dictionary, ``/usr/share/trans/de-en``); see :func:`parse_ding_line`.
* ``tsv:PATH``: ``source<TAB>target`` lines. ``files:SRC,TGT``: two
  line-aligned files.
* ``tfds:NAME[:SPLIT]``: a tfds translation dataset prepared as array_record in
  ``data_dir`` (e.g. ``tfds:wmt14_translate/de-en:validation``; split default
  ``train``), read with ``as_data_source`` (no TensorFlow).

Token ids: pad=0, eos=1, bos=2, unk=3 by default (``Tokenizer.train`` takes
others; an instance's ``PAD``, ``EOS``, ``BOS``, ``UNK`` are its model's). Every
sequence in a batch ends with EOS and is right-padded with pad.

One job per module: ``sources`` (load_pairs and the readers), ``splits``
(split_pairs, split_by_books), ``tokenizer`` (Tokenizer), ``batching`` (make_batches, the
resumable BatchIterator), ``eval_batches`` (make_eval_batches);
``python -m vitjax.data.text --source=SOURCE --src=LANG --tgt=LANG`` prints a source's
statistics.
"""

from __future__ import annotations

from vitjax.data.text.batching import BatchIterator, EncodedPairs, default_buckets, make_batches
from vitjax.data.text.eval_batches import make_eval_batches
from vitjax.data.text.sources import (
  BIBLE_MODULES,
  DING_PACKAGE,
  DING_PATH,
  Pair,
  SourceNotAvailableError,
  bible_pairs,
  ding_alternatives,
  ding_pairs,
  ding_references,
  file_pairs,
  load_pairs,
  load_references,
  parse_ding_line,
  tfds_pairs,
  tsv_pairs,
)
from vitjax.data.text.splits import split_by_books, split_pairs
from vitjax.data.text.tokenizer import BOS_ID, EOS_ID, PAD_ID, UNK_ID, Tokenizer

__all__ = [
  "BIBLE_MODULES",
  "BOS_ID",
  "BatchIterator",
  "DING_PACKAGE",
  "DING_PATH",
  "EOS_ID",
  "EncodedPairs",
  "PAD_ID",
  "Pair",
  "SourceNotAvailableError",
  "Tokenizer",
  "UNK_ID",
  "bible_pairs",
  "default_buckets",
  "ding_alternatives",
  "ding_pairs",
  "ding_references",
  "file_pairs",
  "load_pairs",
  "load_references",
  "make_batches",
  "make_eval_batches",
  "parse_ding_line",
  "split_by_books",
  "split_pairs",
  "tfds_pairs",
  "tsv_pairs",
]
