"""The documentation site (docs/, Sphinx with MyST Markdown) builds as the README says, with warnings as errors:
a broken cross-reference or link to a page, a page outside the table of contents, a docstring that does not
parse, a module the API reference cannot import."""

import os
import subprocess
import sys

import pytest
import train_helpers as th

PAGES = [
  "index",
  "getting_started",
  "how_it_works",
  "extending",
  "modules",
  "api",
  "results",
  "contributing",
  *(
    f"guides/{g}"
    for g in (
      "own_images",
      "finetune",
      "evaluate",
      "training",
      "sweeps",
      "multihost",
      "precision",
      "checkpoints",
      "export",
      "translation",
    )
  ),
]


def test_the_site_builds_with_warnings_as_errors(tmp_path):
  pytest.importorskip("sphinx")
  out = tmp_path / "html"
  cmd = [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-E", "-q", "-b", "html", "docs", str(out)]
  # the basic theme: the same pages, references and warnings in half the time of sphinx-book-theme's (docs/conf.py)
  env = {**th.env(), "VITJAX_DOCS_THEME": "basic"}
  proc = subprocess.run(cmd, cwd=th.ROOT, env=env, capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-5000:]
  for page in PAGES:
    assert os.path.getsize(out / f"{page}.html") > 2000, page
  api = (out / "api.html").read_text()
  for module in ("vitjax.train.trackers", "vitjax.attention", "vitjax.evaluators.probe", "vitjax.sweep.runner"):
    assert f"_autosummary/{module}.html" in api, module
    assert (out / "_autosummary" / f"{module}.html").exists(), module
  assert "dot_product_attention" in (out / "_autosummary" / "vitjax.attention.html").read_text()
