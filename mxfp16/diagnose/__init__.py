"""Diagnosing float16: where a network overflows, and the blocks to keep in float32.

- :mod:`.overflow`: ``find_overflow`` and its ``OverflowReport``;
- :mod:`.fix`: the blocks to keep in float32, checked by running the batch again;
- :mod:`.precision`: ``compare_precision``, every layer against float32, and its
  ``PrecisionReport``;
- :mod:`.culprits`: where an overflow starts, told from what only inherits one;
- :mod:`.session`: a network's calls traced into parts and run as float32 and as its cast;
- :mod:`.graphs`: a call as a float32 graph and its cast, Dropout masks drawn by the locator;
- :mod:`.capture`: the capture engine: the graphs run as CachedOps read by MXNet's op hook;
- :mod:`.reading`: the magnitudes and counts a run keeps, reduced on MXNet's engine;
- :mod:`.probes`: gradient probes and taps at the outputs a cast keeps in float16, and the
  rounding of every such output.
"""
from .overflow import OverflowReport, find_overflow
from .precision import PrecisionReport, compare_precision

__all__ = ["find_overflow", "OverflowReport", "compare_precision", "PrecisionReport"]
