"""The documents' BLEU figures are measured ones: each "N.N BLEU" in README.md, experiments/README.md and the docs
site's pages (docs/**/*.md), and each number in a table column whose header says BLEU, equals, at its own
precision, a BLEU value of a row committed under experiments/results/ (any key with "bleu" in its name). A table
cell may hold a figure with no row only if it says so: "(no row)"."""

import glob
import json
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_NUMBER = re.compile(r"(?<![\d.])(\d+\.\d+)(?![\d.%])")


def _figures(text: str) -> list[str]:
  """The BLEU figures of a markdown document: "N.N BLEU" in its text, and the numbers of its tables' BLEU columns
  (a header cell naming BLEU, not chrF) unless the cell says "(no row)"."""
  figures = re.findall(r"(\d+\.\d+) BLEU", text)
  header = None
  for line in text.splitlines():
    if not line.startswith("|"):
      header = None
      continue
    cells = [c.strip() for c in line.strip().strip("|").split("|")]
    if header is None:
      header = cells
    elif not set("".join(cells)) <= set("-: "):
      for name, cell in zip(header, cells):
        if "BLEU" in name and "chrF" not in name and "(no row)" not in cell:
          figures += _NUMBER.findall(cell)
  return figures


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
      for figure in _figures(f.read()):
        digits = len(figure.split(".")[1])
        if any(round(v, digits) == float(figure) for v in values):
          found.add(figure)
        else:
          missing.append(f"{doc}: {figure} BLEU")
  assert not missing, f"BLEU figures with no row in experiments/results/: {missing}"
  assert len(found) >= 20


def test_a_bleu_table_column_counts_and_a_cell_may_say_it_has_no_row():
  text = "| model | test BLEU | chrF |\n| --- | --- | --- |\n| a | 32.64 | 53.09 |\n| b | 33.03 (no row) | 1.5 |\n"
  assert _figures(text + "\nand 16.2 BLEU here") == ["16.2", "32.64"]
