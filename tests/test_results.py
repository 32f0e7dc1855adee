"""The documents' BLEU figures are measured ones: each "N.N BLEU" in README.md, experiments/README.md and the docs
site's pages (docs/**/*.md) equals, at its own precision, a BLEU value of a row committed under
experiments/results/ (any key with "bleu" in its name)."""

import glob
import json
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Figures whose rows were never written: the long Bible run's averaged checkpoint with beam 8 and alpha 1.0 (test
# 33.03, validation 34.1); its workdir was not kept, and the rerun is issue 47's. The test fails once a row holds
# one of them, so that it leaves this list.
NOT_YET_IN_RESULTS = {"33.0", "33.03", "34.1"}


def _bleu_values() -> list[float]:
  values = []

  def walk(obj, key=""):
    if isinstance(obj, dict):
      for k, v in obj.items():
        walk(v, k)
    elif isinstance(obj, list):
      for v in obj:
        walk(v, key)
    elif isinstance(obj, int | float) and not isinstance(obj, bool) and "bleu" in key.lower():
      values.append(float(obj))

  for path in glob.glob(os.path.join(ROOT, "experiments", "results", "**", "*.json*"), recursive=True):
    with open(path) as f:
      if path.endswith(".json"):
        walk(json.load(f))
      else:
        for line in f:
          if line.strip():
            walk(json.loads(line))
  return values


def test_every_bleu_figure_in_the_readmes_is_a_committed_row():
  values = _bleu_values()
  assert len(values) > 50  # the translation runs' metrics, the baselines, the recipe grid
  found, missing = set(), []
  docs = glob.glob(os.path.join(ROOT, "docs", "**", "*.md"), recursive=True)
  for doc in ("README.md", os.path.join("experiments", "README.md"), *docs):
    with open(os.path.join(ROOT, doc)) as f:
      for figure in re.findall(r"(\d+\.\d+) BLEU", f.read()):
        digits = len(figure.split(".")[1])
        if any(round(v, digits) == float(figure) for v in values):
          found.add(figure)
        elif figure not in NOT_YET_IN_RESULTS:
          missing.append(f"{doc}: {figure} BLEU")
  assert not missing, f"BLEU figures with no row in experiments/results/: {missing}"
  assert not found & NOT_YET_IN_RESULTS, (
    f"now in experiments/results/: {found & NOT_YET_IN_RESULTS}; drop them from the list"
  )
  assert len(found) >= 10
