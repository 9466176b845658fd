"""The float16 op lists of ``mxfp16.amp``, by MXNet 1.9's names
(``mxnet.contrib.amp.lists.symbol_fp16``): MXNet's lists with mxfp16's rows applied.

:data:`MXFP16_ROWS` holds each addition with its reason: the ops mxfp16's casting keeps in
float32 that MXNet's lists run in float16 or in their input's dtype, the matrix multiplies it
runs in float16, and the ops MXNet 1.9.1 registers but lists nowhere.  :data:`GRAPH_RULES` are
mxfp16's rules that depend on where an op sits, which no op list can say.

The lists are plain lists, as MXNet's: code may read them, and code that extends them before
``amp.init()`` or a ``convert_*`` call changes what the conversions do, as with MXNet.

Examples
--------
>>> from mxfp16.amp.lists import symbol_fp16
>>> 'FullyConnected' in symbol_fp16.FP16_FUNCS, 'softmax' in symbol_fp16.FP32_FUNCS
(True, True)
"""
from mxnet.contrib.amp.lists import symbol_fp16 as _mxnet

from ...casting import rules as _rules
from .rows import OWN_OPS, Row, build, listed_ops, registered_ops

#: The names MXNet gives the lists that decide an op's dtype.
LIST_NAMES = ("FP16_FUNCS", "FP16_FP32_FUNCS", "FP32_FUNCS", "WIDEST_TYPE_CASTS",
              "CONDITIONAL_FP32_FUNCS")


def _rows():
    mxnet_lists = {name: getattr(_mxnet, name) for name in LIST_NAMES}
    known = registered_ops() | listed_ops(mxnet_lists)
    rows, taken = [], set(_mxnet.FP32_FUNCS)
    for rule in _rules.OP_RULES:  # the float32 rows of mxfp16's rules table, with their reasons
        if rule.rule == "float32" and rule.when is None:
            ops = sorted((rule.ops & known) - taken)
            taken.update(ops)
            if ops:
                rows.append(Row(tuple(ops), "FP32_FUNCS", rule.reason))
    gemm = next(rule for rule in _rules.OP_RULES if rule.rule == "gemm")
    gemms = sorted((_rules.GEMM_OPS & known) - taken - set(_mxnet.FP16_FUNCS))
    rows.append(Row(tuple(gemms), "FP16_FUNCS", gemm.reason))
    taken.update(gemms)
    own = sorted(OWN_OPS - taken)
    rows.append(Row(tuple(own), "FP32_FUNCS", "mxfp16's CPU emulation rounds a float32 value to "
                    "the float16 grid and keeps it float32"))
    taken.update(own)
    unlisted = sorted(registered_ops() - listed_ops(mxnet_lists) - taken)
    rows.append(Row(tuple(unlisted), "FP16_FP32_FUNCS", "MXNet 1.9.1 registers these ops but "
                    "lists them nowhere (most are the NumPy interface's and the optimizers'); "
                    "no rule of mxfp16 keeps them float32: its rules run them in float16 with "
                    "the ops around them, MXNet's pass (with op lists) in the dtype that reaches "
                    "them"))
    return rows


#: mxfp16's additions to MXNet's float16 lists, each ``Row(ops, into, reason)``.
MXFP16_ROWS = _rows()

_LISTS = build(_mxnet, LIST_NAMES, MXFP16_ROWS)

#: Ops that run in float16 (Tensor Core matrix multiplies).
FP16_FUNCS = _LISTS["FP16_FUNCS"]
#: Ops that run in whichever dtype their inputs have.
FP16_FP32_FUNCS = _LISTS["FP16_FP32_FUNCS"]
#: Ops that run in float32.
FP32_FUNCS = _LISTS["FP32_FUNCS"]
#: Multi-input ops whose inputs get one dtype, the widest among them.
WIDEST_TYPE_CASTS = _LISTS["WIDEST_TYPE_CASTS"]
#: ``(op, attribute, [values])``: ops that run in float32 when the attribute has one of the values.
CONDITIONAL_FP32_FUNCS = _LISTS["CONDITIONAL_FP32_FUNCS"]
#: Loss heads whose ``grad_scale`` AMP multiplies by the loss scale (MXNet's list).
LOSS_OUTPUT_FUNCTIONS = list(_mxnet.LOSS_OUTPUT_FUNCTIONS)

#: mxfp16's rules that depend on an op's place in the graph, ``(name, reason)``: applied by the
#: conversions without op lists (mxfp16's own rules); with op lists, MXNet's pass alone decides.
GRAPH_RULES = (
    ("float32 tail", "ops that no matrix multiply reads (box decoding, NMS, in-network losses, "
     "after the last GEMM) run in float32: float16 buys no Tensor Core work there"),
    ("float32 outputs", "every output of the converted graph is float32"),
    ("index inputs", "indices, lengths and box coordinates are never cast "
     "(mxfp16.casting.rules, rule 'index')"),
)
