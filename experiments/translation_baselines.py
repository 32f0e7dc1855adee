"""Reference points for a translation config's held-out split: what BLEU does no learning give?

    python experiments/translation_baselines.py --config=configs/transformer_ding_de_en.py --split=test

Reads the same pairs and the same seeded split as the trainer (no model, no training) and prints, for the
split: its size and length statistics, how many of its source sides also occur in the training split, and
sacreBLEU / chrF of two baselines:
  copy:   the source unchanged (what the results table calls "copy source");
  lookup: the training split used as a phrase table: a source seen in training gets its most frequent
          training target, any other source is copied. It shows how much of the split is memorisable.
For a dictionary (Ding), also each baseline's exact match and BLEU against all of an entry's synonyms
(exact_match_copy, bleu_synonyms_lookup, ...), scored as the translation task's evaluation scores them.
Appends one JSON line to experiments/results/translation_baselines.jsonl with --out.
"""

import argparse
import collections
import json
import os

import numpy as np
import sacrebleu

from vitjax.config import load_module
from vitjax.data import text
from vitjax.evaluators.translation import synonym_scores


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--config", required=True)
  ap.add_argument("--split", default="test")
  ap.add_argument("--out", default="")
  args = ap.parse_args()
  d = load_module(args.config).get_config().data
  pairs = text.load_pairs(d.source, src_lang=d.src_lang, tgt_lang=d.tgt_lang, data_dir=d.data_dir)
  splits = text.split_pairs(pairs, d.split_seed, d.num_valid, d.num_test)
  held = splits[args.split]
  table = collections.defaultdict(collections.Counter)
  for s, t in splits["train"]:
    table[s][t] += 1
  srcs, refs = [s for s, _ in held], [t for _, t in held]
  lookup = [table[s].most_common(1)[0][0] if s in table else s for s in srcs]
  words = np.array([len(s.split()) for s in srcs])
  row = {
    "config": args.config,
    "split": args.split,
    "pairs": len(held),
    "train_pairs": len(splits["train"]),
    "source_words_median": float(np.median(words)),
    "source_words_mean": float(words.mean()),
    "source_one_word": float((words == 1).mean()),
    "source_seen_in_train": float(np.mean([s in table for s in srcs])),
    "bleu_copy": sacrebleu.corpus_bleu(srcs, [refs]).score,
    "chrf_copy": sacrebleu.corpus_chrf(srcs, [refs]).score,
    "bleu_lookup": sacrebleu.corpus_bleu(lookup, [refs]).score,
    "chrf_lookup": sacrebleu.corpus_chrf(lookup, [refs]).score,
  }
  # A dictionary (Ding): exact match and BLEU against all of an entry's synonyms, as the task's evaluation scores
  references = text.load_references(d.source, src_lang=d.src_lang, tgt_lang=d.tgt_lang, data_dir=d.data_dir)
  for name, hyps in (("copy", srcs), ("lookup", lookup)):
    for key, value in synonym_scores(references or {}, held, hyps).items():
      row[f"{key}_{name}"] = value
  print(json.dumps(row, indent=1))
  if args.out:
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "a") as f:
      f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
  main()
