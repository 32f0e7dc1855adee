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
  nearest: the target of the most similar training source (TF-IDF of character 2-4-grams, cosine), the
          audit's retrieval baseline: what a model that only recalls similar verses would score. With it, how
          many held-out sources have a training source at least 90% / 80% similar (difflib's ratio of the two
          lowercased strings: 0.9 when 90% of their characters match in order).
Appends one JSON line to experiments/results/translation_baselines.jsonl with --out.

    python experiments/translation_baselines.py --config=configs/transformer_bible_en_es_books.py --by_book

--by_book (the Bible) prints, for each book, how many of its verses have a verse at least 90% similar in another
book: the check that chose the held-out books of configs/transformer_bible_en_es_books.py, so that no test or
validation verse has a parallel passage (Kings / Chronicles, the Gospels) in training.
"""

import argparse
import collections
import difflib
import json
import os

import numpy as np
import sacrebleu

from vitjax import tasks
from vitjax.config import load_module
from vitjax.data import text
from vitjax.evaluators.translation import synonym_scores


def nearest(train: list[str], queries: list[str], exclude: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
  """For each query, the index of the most similar training string (cosine of TF-IDF character 2-4-grams) and
  the two strings' difflib ratio (lowercased). `exclude[q]`: a group id; training strings of the same group
  (`exclude` over train + queries when train is queries) are not candidates."""
  from sklearn.feature_extraction.text import TfidfVectorizer

  vec = TfidfVectorizer(analyzer="char_wb", ngram_range=(2, 4), sublinear_tf=True, lowercase=True)
  a = vec.fit_transform(train)
  b = vec.transform(queries)
  best = np.zeros(len(queries), np.int64)
  for start in range(0, len(queries), 1000):
    sims = (b[start : start + 1000] @ a.T).toarray()
    if exclude is not None:
      sims[exclude[start : start + 1000, None] == exclude[None, : len(train)]] = -1
    best[start : start + 1000] = sims.argmax(1)
  ratio = np.array([difflib.SequenceMatcher(None, q.lower(), train[i].lower()).ratio() for q, i in zip(queries, best)])
  return best, ratio


def by_book(config) -> None:
  """Per book: its verses, and how many have a verse at least 90% (80%) similar in another book."""
  d = config.data
  refs: list = []
  pairs = text.load_pairs(d.source, src_lang=d.src_lang, tgt_lang=d.tgt_lang, data_dir=d.data_dir, refs=refs)
  books = [r.split(".")[0] for r in refs]
  ids = {b: i for i, b in enumerate(dict.fromkeys(books))}
  group = np.array([ids[b] for b in books])
  srcs = [s for s, _ in pairs]
  best, ratio = nearest(srcs, srcs, exclude=group)
  print("| book | verses | >= 90% similar elsewhere | >= 80% | most similar (a verse, its match) |")
  print("| --- | --- | --- | --- | --- |")
  for b, i in ids.items():
    mine = np.flatnonzero(group == i)
    top = mine[ratio[mine].argmax()]
    print(
      f"| {b} | {len(mine)} | {(ratio[mine] >= 0.9).sum()} | {(ratio[mine] >= 0.8).sum()} "
      f"| {refs[top]} ~ {refs[best[top]]} ({ratio[top]:.2f}) |"
    )


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--config", required=True)
  ap.add_argument("--split", default="test")
  ap.add_argument("--out", default="")
  ap.add_argument("--by_book", action="store_true", help="the per-book near-duplicate table (the Bible)")
  args = ap.parse_args()
  config = load_module(args.config).get_config()
  if args.by_book:
    return by_book(config)
  d = config.data
  splits = tasks.get(config, "").splits  # the trainer's own split (by pairs, or by books)
  held = splits[args.split]
  table = collections.defaultdict(collections.Counter)
  for s, t in splits["train"]:
    table[s][t] += 1
  srcs, refs = [s for s, _ in held], [t for _, t in held]
  lookup = [table[s].most_common(1)[0][0] if s in table else s for s in srcs]
  best, ratio = nearest([s for s, _ in splits["train"]], srcs)
  retrieved = [splits["train"][i][1] for i in best]
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
    "bleu_nearest": sacrebleu.corpus_bleu(retrieved, [refs]).score,
    "chrf_nearest": sacrebleu.corpus_chrf(retrieved, [refs]).score,
    "source_90pct_similar_in_train": int((ratio >= 0.9).sum()),
    "source_80pct_similar_in_train": int((ratio >= 0.8).sum()),
  }
  # A dictionary (Ding): exact match and BLEU against all of an entry's synonyms, as the task's evaluation scores
  references = text.load_references(d.source, src_lang=d.src_lang, tgt_lang=d.tgt_lang, data_dir=d.data_dir)
  for name, hyps in (("copy", srcs), ("lookup", lookup), ("nearest", retrieved)):
    for key, value in synonym_scores(references or {}, held, hyps).items():
      row[f"{key}_{name}"] = value
  print(json.dumps(row, indent=1))
  if args.out:
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "a") as f:
      f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
  main()
