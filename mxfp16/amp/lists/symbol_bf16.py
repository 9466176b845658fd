"""The bfloat16 op lists of ``mxfp16.amp``, by MXNet 1.9's names
(``mxnet.contrib.amp.lists.symbol_bf16``): MXNet's lists with mxfp16's rows applied.

:data:`MXFP16_ROWS` holds each addition with its reason: matrix multiplies whose MXNet 1.9.1 CPU
kernel is float32-only, and the ops MXNet registers but lists nowhere, which have no bfloat16 CPU
kernel.  :data:`FP32_WHEN` holds mxfp16's conditions on ops of :data:`BF16_FUNCS` (an op in two
lists is refused, so they are not in :data:`CONDITIONAL_FP32_FUNCS`); :data:`GRAPH_RULES` the
rules that depend on where an op sits.

Examples
--------
>>> from mxfp16.amp.lists import symbol_bf16
>>> 'Convolution' in symbol_bf16.BF16_FUNCS, 'batch_dot' in symbol_bf16.FP32_FUNCS
(True, True)
"""
from mxnet.contrib.amp.lists import symbol_bf16 as _mxnet

from ...casting import rules as _rules
from .rows import OWN_OPS, Row, build, listed_ops, registered_ops

#: The names MXNet gives the lists that decide an op's dtype.
LIST_NAMES = ("BF16_FUNCS", "BF16_FP32_FUNCS", "FP32_FUNCS", "WIDEST_TYPE_CASTS",
              "CONDITIONAL_FP32_FUNCS")

#: The casts themselves: their dtype is their attribute.
_CASTS = ("amp_cast", "amp_multicast")


def _rows():
    mxnet_lists = {name: getattr(_mxnet, name) for name in LIST_NAMES}
    listed = listed_ops(mxnet_lists)
    gemms = sorted((_rules.BFLOAT16_FLOAT32_GEMMS & (registered_ops() | listed)))
    unlisted = sorted(registered_ops() - listed - set(gemms) - set(_CASTS) - OWN_OPS)
    return [
        Row(tuple(sorted(OWN_OPS)), "FP32_FUNCS", "mxfp16's CPU emulation of float16 rounds a "
            "float32 value to the float16 grid and keeps it float32"),
        Row(tuple(gemms), "FP32_FUNCS", "matrix multiplies outside MXNet's bfloat16 list: their "
            "MXNet 1.9.1 CPU kernels are float32-only (\"dot only supports float32/float64 for "
            "CPU\"), so mxfp16 runs them in float32"),
        Row(tuple(unlisted), "FP32_FUNCS", "MXNet 1.9.1 registers these ops but lists them "
            "nowhere for bfloat16 and has no bfloat16 CPU kernel for them: float32"),
        Row(tuple(op for op in _CASTS if op not in listed), "BF16_FP32_FUNCS", "AMP's own "
            "casts: their output dtype is their dtype attribute"),
    ]


#: mxfp16's additions to MXNet's bfloat16 lists, each ``Row(ops, into, reason)``.
MXFP16_ROWS = _rows()

_LISTS = build(_mxnet, LIST_NAMES, MXFP16_ROWS)

#: Ops that run in bfloat16.
BF16_FUNCS = _LISTS["BF16_FUNCS"]
#: Ops that run in whichever dtype their inputs have.
BF16_FP32_FUNCS = _LISTS["BF16_FP32_FUNCS"]
#: Ops that run in float32.
FP32_FUNCS = _LISTS["FP32_FUNCS"]
#: Multi-input ops whose inputs get one dtype, the widest among them.
WIDEST_TYPE_CASTS = _LISTS["WIDEST_TYPE_CASTS"]
#: ``(op, attribute, [values])``: ops that run in float32 when the attribute has one of the values.
CONDITIONAL_FP32_FUNCS = _LISTS["CONDITIONAL_FP32_FUNCS"]
#: Loss heads whose ``grad_scale`` AMP multiplies by the loss scale (MXNet's list).
LOSS_OUTPUT_FUNCTIONS = list(_mxnet.LOSS_OUTPUT_FUNCTIONS)
#: ``{op: inputs kept float32}`` of bfloat16 ops (BatchNorm's statistics), MXNet's.
BF16_USE_FP32_PARAMS = dict(_mxnet.BF16_USE_FP32_PARAMS)

#: ``(op, attribute, [values], reason)``: ops of :data:`BF16_FUNCS` that mxfp16's conversions
#: without op lists run in float32 when the attribute has one of the values.
FP32_WHEN = [(rule_op, rule.when[0], list(rule.when[1]), rule.reason)
             for rule in _rules.OP_RULES if rule.rule == "bfloat16_float32" and rule.when
             for rule_op in sorted(rule.ops)]

#: mxfp16's rules that depend on an op's place in the graph, ``(name, reason)``: applied by the
#: conversions without op lists (mxfp16's own rules); with op lists, MXNet's pass alone decides.
GRAPH_RULES = (
    ("float32 tail", "ops that no matrix multiply reads (box decoding, NMS, in-network losses, "
     "after the last GEMM) run in float32"),
    ("float32 outputs", "every output of the converted graph is float32"),
    ("channel padding", "bfloat16 convolutions with 17 or more output channels, not a multiple "
     "of 16, are padded with zero filters to oneDNN's blocks of 16 and the extra channels sliced "
     "off (mxfp16.casting.channels)"),
    ("one dtype for Concat", "the float inputs of an op that reads a float32 value are cast to "
     "float32 (MXNet's widest-type rule, which its bfloat16 lists leave out for Concat)"),
)
