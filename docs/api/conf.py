"""Sphinx configuration of the API reference, built from the docstrings (contract §5)."""

from __future__ import annotations

import mnestoma

project = "mnestoma"
version = release = mnestoma.__version__
extensions = ["sphinx.ext.autodoc", "sphinx.ext.napoleon"]
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_default_options = {"members": True, "undoc-members": False, "show-inheritance": True}
# The guides are Markdown, tested and linked from the README; only the reference is built.
exclude_patterns: list[str] = []
html_theme = "alabaster"
