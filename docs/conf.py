"""Sphinx configuration of mxfp16's documentation site.

Build it with ``python -m sphinx -W -n --keep-going -b html docs build/docs`` (tests/test_site.py
does, once per pytest run). The Markdown pages stay the source (myst-parser) and render on GitHub
as they are; the API reference comes from the docstrings (autodoc and numpydoc), the command-line
reference from the scripts' own parsers (docs/_ext/mxfp16_docs.py). Nothing is fetched: no
intersphinx, so references to MXNet, NumPy and Python objects are plain text.
"""
import os
import sys
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # the mxfp16 of this checkout
sys.path.insert(0, os.path.join(HERE, "_ext"))

project = "mxfp16"
author = "the mxfp16 developers"
copyright = "mxfp16 developers"
release = version = "0.1.0"

extensions = ["myst_parser", "sphinx.ext.autodoc", "numpydoc", "mxfp16_docs"]
source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "_generated", "README.md"]
templates_path = []

# MyST: GitHub-style heading anchors so that page.md#heading links resolve in the site too;
# colon fences for the directives of the site's own pages (GitHub shows them as text).
myst_heading_anchors = 4
myst_enable_extensions = ["colon_fence"]

# The docstrings are numpydoc; their types are prose here (no intersphinx to resolve them).
numpydoc_show_class_members = False
numpydoc_xref_param_type = False
numpydoc_validation_checks = set()
# Functions that wrap MXNet's (functools.wraps) carry MXNet's docstrings, with its own section names.
warnings.filterwarnings("ignore", "Unknown section", UserWarning, "numpydoc")
autodoc_member_order = "bysource"
autodoc_typehints = "none"
# A method without a docstring of its own shows none, not MXNet's (whose references would dangle).
autodoc_inherit_docstrings = False

# Names outside mxfp16 (MXNet, GluonCV, NumPy, Python) have no target without intersphinx.
# The application layers (mxfp16.train, .report, .doctor) are programs, in the command-line
# reference, not in the API reference: the docstrings' references to them stay text.
nitpick_ignore_regex = [
    (r"py:.*", r"mxfp16\.(train|report|doctor)(\..*)?"),
    (r"py:.*", r"(mx|mxnet|gluon|gluoncv|gluonnlp|nlp|np|numpy|nd|onnx|horovod|hvd|argparse|"
               r"logging|os|json|signal|threading|collections|dataclasses|typing|pathlib|"
               r"subprocess|sys|contextlib|enum|abc|io|random|builtins|fnmatch|functools|pickle)(\..*)?"),
]

html_theme = "alabaster"
html_title = "mxfp16"
html_static_path = ["_static"]  # custom.css: wider pages for 110-column code
html_theme_options = {"description": "Mixed-precision training for Apache MXNet 1.9",
                      "fixed_sidebar": True, "page_width": "96%", "sidebar_width": "250px",
                      "body_max_width": "none"}
html_sidebars = {"**": ["about.html", "searchbox.html", "navigation.html"]}
