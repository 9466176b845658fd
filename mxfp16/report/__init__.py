"""The float16 precision report of a network (``scripts/report.py``).

One module per part: :mod:`~mxfp16.report.tensor_cores` (the multiple-of-8 rule),
:mod:`~mxfp16.report.precision_map` (which ops run in float16), :mod:`~mxfp16.report.memory`,
:mod:`~mxfp16.report.speedup` (roofline estimate for V100, A100, H100),
:mod:`~mxfp16.report.underflow` (activation-gradient histogram under CPU emulation), and
:mod:`~mxfp16.report.render` / :mod:`~mxfp16.report.plots` for text, Markdown, JSON and PNG.
:func:`build_report` runs them all.
"""
from .build import ReportConfig, build_report, parse_shape, save_report
from .memory import parse_size
from .render import render_markdown, render_text

__all__ = ["ReportConfig", "build_report", "save_report", "parse_shape", "parse_size",
           "render_text", "render_markdown"]
