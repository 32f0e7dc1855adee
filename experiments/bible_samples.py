"""The opening verses of Genesis and John, translated by a trained Bible EN->ES workdir, beside the reference and
the split each verse is in (a verse the model trained on says so: it is not a test of generalisation).

    python experiments/bible_samples.py --workdir=workdirs/bible_en_es [--checkpoint=best] [--verses=5] \
        [--out=experiments/results/bible_samples.md]

The verses come from the installed SWORD modules at run time (sword-text-kjv, sword-text-sparv), found by their
opening words in canonical order; nothing of the text is stored here.
"""

from __future__ import annotations

import argparse
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

OPENINGS = {"Genesis 1": "In the beginning God", "John 1": "In the beginning was"}


def passages(pairs, verses: int) -> dict[str, list[tuple[str, str]]]:
  """{"Genesis 1": the first `verses` pairs from the one whose English starts with its opening words, ...}."""
  found = {}
  for name, opening in OPENINGS.items():
    start = next((i for i, (en, _) in enumerate(pairs) if en.startswith(opening)), None)
    if start is None:
      sys.exit(f"error: no verse starts with {opening!r}: is this the KJV module (sword-text-kjv)?")
    found[name] = pairs[start : start + verses]
  return found


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--workdir", required=True)
  parser.add_argument("--checkpoint", default="best", help="'best', 'latest', 'averaged' or a step")
  parser.add_argument("--verses", type=int, default=5, help="verses from each opening")
  parser.add_argument("--out", help="also write the Markdown table here")
  args = parser.parse_args()

  import vitjax
  from vitjax.data.text import sources
  from vitjax.evaluators.translation import decoding

  trained = vitjax.load(args.workdir, args.checkpoint)
  d = trained.config.data
  if trained.config.get("task") != "translation" or d.source != "bible" or (d.src_lang, d.tgt_lang) != ("en", "es"):
    sys.exit(f"error: {args.workdir} is not a Bible EN->ES translation run")
  split_of = {pair: name for name, pairs in trained.task.splits.items() for pair in pairs}
  g = decoding(trained.config)
  lines = [
    f"Translations by `{args.workdir}` (checkpoint {args.checkpoint}, step {trained.step}, "
    f"{g['method']} {g['beam_size']}, alpha {g['alpha']}):",
    "",
  ]
  verses = sources.load_pairs("bible", src_lang=d.src_lang, tgt_lang=d.tgt_lang, data_dir=d.data_dir)
  for name, pairs in passages(verses, args.verses).items():
    outputs = trained.translate([en for en, _ in pairs])
    lines += [
      f"**{name}**",
      "",
      "| verse | split | source (KJV) | vitjax | reference (Reina-Valera 1909) |",
      "| --- " * 5 + "|",
    ]
    for k, ((en, es), out) in enumerate(zip(pairs, outputs, strict=True)):
      split = split_of.get((en, es), "?")
      lines.append(f"| {k + 1} | {split} | {en} | {out} | {es} |")
    lines.append("")
  text = "\n".join(lines)
  print(text)
  if args.out:
    with open(args.out, "w", encoding="utf-8") as f:
      f.write(text + "\n")


if __name__ == "__main__":
  main()
