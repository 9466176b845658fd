"""Casting: Gluon blocks and Symbol graphs in float16 or bfloat16, with float32 where it must stay.

One concept, one subpackage:

- :mod:`.cast`: ``cast_block`` and ``cast_symbol``;
- :mod:`.tracing`: a Gluon block traced into graphs (numpy symbols for the NumPy interface);
- :mod:`.full_graph`: the graph rewrite that gives each op its dtype (``mode='full'``);
- :mod:`.rules`: the per-op dtype rules, a table of rows with their reasons;
- :mod:`.amp_graph`: MXNet's AMP pass (``mode='amp'``, bfloat16) after mxfp16's rules;
- :mod:`.graph`: the JSON rewrite of an MXNet graph that casting and emulation share;
- :mod:`.block`: ``CastBlock``, what ``cast_block`` returns;
- :mod:`.selectors`: a network's block paths, the block each traced op belongs to, and
  ``keep_float32``'s selectors resolved to blocks;
- :mod:`.signature`: how a Gluon block is called (inputs, nesting, messages);
- :mod:`.emulation` and :mod:`.fastround`: float16 with GPU numerics on a CPU;
- :mod:`.params`: ``cast_params``, float32 checkpoint values in a cast graph's dtypes;
- :mod:`.deploy`: ``export``, graphs and parameters for plain MXNet (float32 or float16).
"""
from ..dtypes import SUPPORTED_DTYPES
from .block import CastBlock
from .cast import cast_block, cast_symbol
from .deploy import export_network as export
from .emulation import resolve_emulate
from .params import cast_params

__all__ = ["cast_block", "cast_symbol", "cast_params", "CastBlock", "resolve_emulate", "export",
           "SUPPORTED_DTYPES"]
