"""Sphinx configuration of vitjax's documentation (MyST Markdown, sphinx-book-theme, as flax and optax do).

Build it as the README says: `sphinx-build -W --keep-going -b html docs docs/_build/html` (warnings are errors:
a broken cross-reference, a page outside the table of contents, a docstring that does not parse).
"""

import os
import sys

sys.path.insert(0, os.path.abspath(".."))
os.environ.setdefault("JAX_PLATFORMS", "cpu")

project = "vitjax"
author = "the vitjax authors"
copyright = "2026, the vitjax authors"

extensions = [
  "myst_parser",
  "sphinx.ext.autodoc",
  "sphinx.ext.autosummary",
  "sphinx.ext.napoleon",
  "sphinx.ext.viewcode",
]
source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
exclude_patterns = ["_build"]
myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3

autosummary_generate = True
templates_path = ["_templates"]
autodoc_default_options = {"members": True, "ignore-module-all": True}  # each name where it is defined
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_mock_imports = ["torch", "timm", "transformers", "wandb"]
napoleon_google_docstring = True
napoleon_numpy_docstring = False

# VITJAX_DOCS_THEME=basic: the same pages, references and warnings in half the time (tests/test_docs.py; the theme's
# own templates are not vitjax's to test). The site is built with sphinx-book-theme.
html_theme = os.environ.get("VITJAX_DOCS_THEME", "sphinx_book_theme")
html_title = "vitjax"
html_theme_options = {"show_toc_level": 2} if html_theme == "sphinx_book_theme" else {}
