"""mxfp16: mixed-precision (float16) training for Apache MXNet 1.9, Gluon and Module APIs."""
from .casting import cast_block, cast_params, cast_symbol
from .dtypes import SUPPORTED_DTYPES

__version__ = "0.1.0"
