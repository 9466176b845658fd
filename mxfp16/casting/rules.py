"""The per-op dtype rules of casting, as data: a table of rows, each with its reason.

A row names ops (or a family of them), the rule they follow and why.  A new op family adds its rows
to :data:`OP_RULES`, in a section of its own; casting and emulation read the table only through
:func:`ops_with`, :func:`applies` and :func:`index_inputs`, and the named sets at the end are views
of it.  The float32 op list is MXNet's own AMP list
(:mod:`mxnet.contrib.amp.lists.symbol_fp16`), not a copy of it, so it follows the installed MXNet.

The rules:

``float32``
    The op runs in float32 in a float16 graph; float16 consumers get a cast back.
``norm``
    A normalization layer: its weights and running statistics stay float32.
``float16_data``
    A normalization op whose kernels take float16 data with float32 parameters (runs in place).
``gemm``
    A matrix multiply: float16 on Tensor Cores; emulated with float32 compute and float16 rounding
    of its inputs and outputs on a CPU, which has no float16 GEMM.
``dtype_attr``
    The op's output dtype is its ``dtype`` attribute (float32 when unset), not its input's.
``index``
    The inputs at ``inputs`` hold integer indices or box coordinates: never cast, never rounded.
``widest``
    A multi-input op: all its float inputs get one dtype, the widest among them (MXNet AMP's rule).
``grid``
    The op only selects or moves values: float16 inputs give float16-grid outputs.
``constant``
    An op without inputs creating values exact in float16 and bfloat16 (zeros, ones).
``shape``
    The inputs at ``inputs`` are read for their shape only (``slice_like(anchors, x * 0)``): they
    are never cast, and what is read only so (``x * 0``) runs in its input's dtype, without a cast.
``layout``
    The op only rearranges values (transpose, reshape, concat): exact in any dtype, so where its
    float16 inputs feed it alone, it runs in float16 and the float32 boundary moves after it
    (one cast after a concat of predictions rather than one per prediction).
``bfloat16_float32``
    The op runs in float32 in a bfloat16 graph although MXNet's AMP lists would run it in
    bfloat16: on a CPU, oneDNN's bfloat16 kernel for it is slower than float32's (measured).
``channel_padding``
    In a bfloat16 graph, the op's output channels are padded with zero filters to a multiple of
    16 and the extra ones sliced off (:mod:`~mxfp16.casting.channels`): oneDNN's fast bfloat16
    kernels block channels by 16.

A row with ``when=(attribute, values)`` applies only when the node's attribute has one of the values.
"""
from collections import namedtuple

from mxnet.contrib.amp.lists import symbol_bf16 as _bf16_lists
from mxnet.contrib.amp.lists import symbol_fp16 as _amp_lists

from ..dtypes import (GRAD_SCALE_HEADS, LABELLED_HEADS, LOSS_HEADS, LOW_PRECISION_DTYPES,  # noqa: F401
                      SUPPORTED_DTYPES, check_dtype)

#: Casting modes: ``full`` casts the whole network (the MXNet float16 guide's recipe),
#: ``amp`` lets MXNet's AMP op lists decide op by op.
CAST_MODES = ("full", "amp")

#: The rules a row may give (see the module docstring).
RULES = ("float32", "norm", "float16_data", "gemm", "dtype_attr", "index", "widest", "grid",
         "constant", "shape", "layout", "bfloat16_float32", "channel_padding")

#: The rules whose rows name input positions.
_POSITIONAL = ("index", "shape")

#: One row of the table: ``ops`` (names, a family), its ``rule``, the ``reason``, the input
#: positions of an ``index`` rule, and the ``(attribute, values)`` condition, if any.
Rule = namedtuple("Rule", ["ops", "rule", "reason", "inputs", "when"], defaults=((), None))


def row(ops, rule, reason, inputs=(), when=None):
    """A checked row of the table: ``ops`` as a tuple of names, ``rule`` one of :data:`RULES`.

    Raises
    ------
    ValueError
        For an unknown rule, an ``index`` row without input positions, or a row without a reason.

    Examples
    --------
    >>> row("relu", "grid", "max(x, 0) of a float16 value is a float16 value").ops
    frozenset({'relu'})
    """
    ops = frozenset((ops,) if isinstance(ops, str) else ops)
    if rule not in RULES:
        raise ValueError(f"unknown dtype rule {rule!r} for {sorted(ops)[:3]}: choose one of "
                         f"{', '.join(RULES)}")
    if (rule in _POSITIONAL) != bool(inputs):
        raise ValueError(f"rule {rule!r} for {sorted(ops)[:3]} with inputs={inputs!r}: an 'index' or "
                         "'shape' row names its input positions, and only such a row does")
    if not reason:
        raise ValueError(f"the row {rule!r} for {sorted(ops)[:3]} has no reason: every rule says why")
    return Rule(ops, rule, reason, tuple(inputs), when)


#: The NumPy interface's own ops (``npx.set_np()``; MXNet 1.9.1's AMP lists name none of them),
#: each with the legacy op whose rules and AMP list it follows.  Its layers record the legacy ops
#: already (``_npx_fully_connected`` is FullyConnected, ``_npx_softmax`` softmax,
#: ``_npx_log_softmax`` log_softmax, ``_npx_layer_norm`` LayerNorm, ``_npx_batch_dot``
#: batch_dot): only its arithmetic, reductions, layout ops and constants are ops of their own.
NUMPY_TWINS = {
    # elementwise arithmetic on two arrays, and joins: MXNet AMP's widest-type ops
    "_npi_add": "broadcast_add", "_npi_subtract": "broadcast_sub", "_npi_multiply": "broadcast_mul",
    "_npi_true_divide": "broadcast_div", "_npi_mod": "broadcast_mod",
    "_npi_power": "broadcast_power", "_npi_hypot": "broadcast_hypot",
    "_npi_equal": "broadcast_equal", "_npi_not_equal": "broadcast_not_equal",
    "_npi_greater": "broadcast_greater", "_npi_greater_equal": "broadcast_greater_equal",
    "_npi_less": "broadcast_lesser", "_npi_less_equal": "broadcast_lesser_equal",
    "_npi_concatenate": "Concat", "_npi_stack": "stack", "_npi_where": "where",
    # with a scalar (``X / math.sqrt(d)`` is _npi_true_divide_scalar)
    "_npi_add_scalar": "_plus_scalar", "_npi_subtract_scalar": "_minus_scalar",
    "_npi_rsubtract_scalar": "_rminus_scalar", "_npi_multiply_scalar": "_mul_scalar",
    "_npi_true_divide_scalar": "_div_scalar", "_npi_rtrue_divide_scalar": "_rdiv_scalar",
    "_npi_power_scalar": "_power_scalar", "_npi_rpower_scalar": "_rpower_scalar",
    "_npi_mod_scalar": "_mod_scalar",
    # one array
    "_npx_relu": "relu", "_npx_sigmoid": "sigmoid", "_npi_logistic": "sigmoid",
    "_npi_exp": "exp", "_npi_expm1": "expm1", "_npi_log": "log", "_npi_log10": "log10",
    "_npi_log2": "log2", "_npi_log1p": "log1p", "_npi_sqrt": "sqrt", "_npi_cbrt": "cbrt",
    "_npi_square": "square", "_npi_reciprocal": "reciprocal", "_npi_negative": "negative",
    "_npi_absolute": "abs", "_npi_sign": "sign", "_npi_tanh": "tanh", "_npi_sin": "sin",
    "_npi_cos": "cos", "_npi_tan": "tan", "_npi_arcsin": "arcsin", "_npi_arccos": "arccos",
    "_npi_arctan": "arctan", "_npi_sinh": "sinh", "_npi_cosh": "cosh", "_npi_arcsinh": "arcsinh",
    "_npi_arccosh": "arccosh", "_npi_arctanh": "arctanh", "_npi_floor": "floor",
    "_npi_ceil": "ceil", "_npi_rint": "rint", "_npi_trunc": "trunc", "_npi_fix": "fix",
    # reductions (std, var, average and cumsum are sums, as mean is)
    "_np_sum": "sum", "_npi_mean": "mean", "_np_prod": "prod", "_npi_norm": "norm",
    "_npi_std": "mean", "_npi_var": "mean", "_npi_average": "mean", "_np_cumsum": "sum",
    "_np_max": "max", "_np_min": "min",
    # layout
    "_npx_reshape": "Reshape", "_np_reshape": "Reshape", "_np_transpose": "transpose",
    "_np_moveaxis": "transpose", "_np_squeeze": "squeeze", "_np_copy": "_copy",
    "_npi_broadcast_to": "broadcast_to", "_npi_flip": "reverse", "_np_roll": "reverse",
    # constants
    "_npi_zeros": "_zeros", "_npi_ones": "_ones", "_npi_full_like": "zeros_like",
    # contractions: GEMMs
    "_npi_matmul": "batch_dot", "_np_dot": "dot", "_npi_tensordot": "dot",
    "_npi_tensordot_int_axes": "dot", "_npi_einsum": "dot",
}


def numpy_twins_in(ops):
    """The NumPy interface's ops whose legacy twin is one of ``ops`` (an AMP list, a row's ops).

    Examples
    --------
    >>> sorted(numpy_twins_in(["sum", "mean"]))[:3]
    ['_np_cumsum', '_np_sum', '_npi_average']
    """
    ops = set(ops)
    return frozenset(op for op, twin in NUMPY_TWINS.items() if twin in ops)


#: NumPy-interface ops that MXNet 1.9.1's CPU backend cannot run in bfloat16 (measured by
#: benchmarks/numpy_kernels.py): "Unknown type enum 12" (12 is bfloat16's type code), or the
#: float32-only GEMM check of matmul; with the NumPy interface's arrays, MXNet cannot even make a
#: bfloat16 array (``x.astype('bfloat16')``: "data type 'bfloat16' not understood").
NUMPY_NO_BFLOAT16_KERNEL = ("_npi_true_divide", "_npi_true_divide_scalar",
                            "_npi_rtrue_divide_scalar", "_np_sum", "_npi_mean", "_npi_std",
                            "_npi_var", "_npi_norm", "_np_dot", "_npi_einsum", "_npi_matmul")

_NORM = ("BatchNorm", "BatchNorm_v1", "CuDNNBatchNorm", "_contrib_SyncBatchNorm", "InstanceNorm",
         "LayerNorm", "GroupNorm")
_NORM_FLOAT16_DATA = ("BatchNorm", "BatchNorm_v1", "CuDNNBatchNorm")

#: The table.  Rows of one op may add up (LayerNorm is ``norm`` and ``float32``).
OP_RULES = [
    row(_NORM, "norm", "statistics are sums of squares over many values, which overflow or lose "
        "precision in float16: float32 weights and running statistics"),
    row(_NORM_FLOAT16_DATA, "float16_data", "the one normalization op whose kernels take float16 "
        "data with float32 parameters"),
    row(sorted(set(_NORM) - set(_NORM_FLOAT16_DATA)), "float32", "their kernels want one dtype "
        "for data and (float32) parameters"),
    row(sorted(LOSS_HEADS), "float32", "loss heads: exp() of a float16 logit overflows above ~11, "
        "and the normalising sums lose precision (the MXNet float16 guide)"),
    row(("Softmax", "softmax", "log_softmax", "SoftmaxActivation", "softmin", "make_loss",
         "softmax_cross_entropy", "CTCLoss", "ctc_loss", "_contrib_CTCLoss", "_contrib_ctc_loss",
         "smooth_l1"), "float32", "softmax and losses: exp() overflows, sums lose precision"),
    row(_amp_lists.FP32_FUNCS, "float32", "MXNet AMP's float32 list (exp, log, norms, "
        "reductions, ...), followed as the installed MXNet has it"),
    *[row(op, "float32", "MXNet AMP's conditional float32 list: float16 overflows in this "
          "activation", when=(attr, tuple(values)))
      for op, attr, values in _amp_lists.CONDITIONAL_FP32_FUNCS],
    row(("Convolution", "Deconvolution", "FullyConnected", "RNN", "dot", "batch_dot",
         "_linalg_gemm", "_linalg_gemm2", "linalg_gemm", "linalg_gemm2", "_npi_matmul", "_npi_dot",
         "_contrib_interleaved_matmul_selfatt_qk", "_contrib_interleaved_matmul_selfatt_valatt",
         "_contrib_interleaved_matmul_encdec_qk", "_contrib_interleaved_matmul_encdec_valatt"),
        "gemm", "matrix multiplies: what Tensor Cores run, and what MXNet's CPU backend cannot run "
        "in float16 (\"FP16 gemm on cpu not implemented!\")"),
    row(("Embedding", "_contrib_SparseEmbedding", "one_hot"), "dtype_attr", "a float16 graph "
        "sets their dtype attribute (a float16 Embedding has float16 weight and output)"),
    row("Embedding", "index", "token ids above 2048 would round in float16", inputs=(0,)),
    row(("take", "pick", "gather_nd"), "index", "indices above 2048 would round", inputs=(1,)),
    row("one_hot", "index", "class ids above 2048 would round", inputs=(0,)),
    row(("SequenceMask", "SequenceLast", "SequenceReverse"), "index", "sequence lengths",
        inputs=(1,)),
    row(("SoftmaxOutput", "SVMOutput", "softmax_cross_entropy"), "index", "class labels",
        inputs=(1,)),
    row(("softmax", "log_softmax", "masked_softmax", "masked_log_softmax"), "index",
        "softmax(data, length, use_length=True): the valid lengths of GluonNLP's attention masks",
        inputs=(1,)),
    row(("relu", "Flatten", "flatten", "Reshape", "reshape", "transpose", "expand_dims", "squeeze",
         "SliceChannel", "split", "slice", "slice_axis", "Concat", "concat", "_copy", "identity",
         "max", "min", "_maximum", "_minimum", "broadcast_maximum", "broadcast_minimum",
         "SwapAxis", "swapaxes", "tile", "repeat", "Crop", "Pad", "pad", "reverse",
         "_contrib_BilinearResize2D_none", "_rnn_param_concat", "stack", "SequenceReverse",
         "SequenceLast", "take", "pick", "Embedding", "broadcast_to", "broadcast_like",
         "broadcast_axis", "slice_like", "zeros_like"), "grid", "they select or move values and "
        "never compute new ones, so emulation need not round their output again"),
    row("Activation", "grid", "relu selects", when=("act_type", ("relu",))),
    row("Pooling", "grid", "max-pooling selects", when=("pool_type", ("max",))),
    row(_amp_lists.WIDEST_TYPE_CASTS, "widest", "MXNet AMP's widest-type list: the inputs of a "
        "multi-input op get one dtype, the widest of theirs (float32 if one is float32)"),
    # The NumPy interface (npx.set_np()): each op follows its legacy twin (NUMPY_TWINS).
    row(numpy_twins_in(_amp_lists.FP32_FUNCS), "float32", "the NumPy interface's twins of MXNet "
        "AMP's float32 list (the reductions _np_sum, _npi_mean, _npi_std, _npi_norm; exp, log, "
        "powers): sums and exponentials overflow float16 or lose precision, as their twins do"),
    row(("_npx_softmax", "_npx_log_softmax", "_npx_masked_softmax", "_npx_masked_log_softmax"),
        "float32", "the NumPy interface's softmax: exp() overflows, sums lose precision (its "
        "graphs record _npx_softmax and _npx_log_softmax as softmax and log_softmax, and MXNet "
        "2.0 adds the masked ones)"),
    row(("_npx_masked_softmax", "_npx_masked_log_softmax"), "index", "the mask is booleans, "
        "never cast", inputs=(1,)),
    row(numpy_twins_in(_amp_lists.WIDEST_TYPE_CASTS), "widest", "the NumPy interface's twins of "
        "MXNet AMP's widest-type list (_npi_add, _npi_multiply, _npi_concatenate, ...): one dtype "
        "for their float inputs, as their twins"),
    row(("_np_dot", "_npi_tensordot", "_npi_tensordot_int_axes", "_npi_einsum"), "gemm",
        "the NumPy interface's contractions: matrix multiplies (_npi_matmul is in the GEMM row)"),
    row(("_npx_relu", "_npx_reshape", "_np_reshape", "_np_transpose", "_np_moveaxis",
         "_np_squeeze", "_np_copy", "_npi_concatenate", "_npi_stack", "_np_max", "_np_min",
         "_npi_broadcast_to", "_npi_flip", "_np_roll", "_npi_where"), "grid", "the NumPy "
        "interface's ops that select or move values: no new value to round"),
    row(("_npx_reshape", "_np_reshape", "_np_transpose", "_np_moveaxis", "_np_squeeze",
         "_np_copy", "_npi_concatenate", "_npi_stack"), "layout", "the NumPy interface's layout "
        "ops: exact in any dtype"),
    row(("_npi_zeros", "_npi_ones"), "constant", "the NumPy interface's zeros and ones: exact in "
        "float16 and bfloat16"),
    row(NUMPY_NO_BFLOAT16_KERNEL, "bfloat16_float32", "MXNet 1.9.1 has no bfloat16 CPU kernel for "
        "these NumPy-interface ops (\"Unknown type enum 12\", or matmul's float32-only check; "
        "benchmarks/numpy_kernels.py): a bfloat16 graph runs them in float32"),
    # Detection (GluonCV's SSD, YOLOv3, Faster/Mask R-CNN, CenterNet).  What follows the last GEMM
    # (box decoding, anchors, NMS, scores, in-network losses) runs in float32 by the graph rule of
    # amp_graph.float32_tail; these rows hold wherever the ops sit.
    row(("_contrib_ROIAlign", "ROIPooling", "_contrib_PSROIPooling"), "float32", "box "
        "coordinates stay float32, and the kernel wants features and rois of one dtype (MXNet "
        "AMP's widest-type rule gives the same)"),
    row(("_contrib_ROIAlign", "ROIPooling", "_contrib_PSROIPooling"), "index", "rois are box "
        "coordinates: a float16 coordinate above 2048 steps by 2 px or more", inputs=(1,)),
    row(("_contrib_MultiBoxPrior", "_contrib_MultiBoxTarget", "_contrib_MultiBoxDetection",
         "_contrib_Proposal", "_contrib_MultiProposal", "_contrib_box_nms",
         "_contrib_box_non_maximum_suppression", "_contrib_box_iou", "_contrib_box_encode",
         "_contrib_box_decode", "_contrib_bipartite_matching"), "float32", "anchors, box "
        "targets, proposals and NMS: coordinates and scores stay float32, where float16 would "
        "move boxes and reorder close scores"),
    # Shape-only reads and layout ops (SSD's anchors read the feature maps for their shape; its
    # predictions are transposed, flattened and concatenated before the float32 loss and decoder).
    row(("slice_like", "reshape_like", "broadcast_like"), "shape", "the second input gives only "
        "the output's shape (SSD's and YOLOv3's anchors sliced like x * 0): its dtype is neutral",
        inputs=(1,)),
    row(("shape_array", "size_array"), "shape", "they read only the shape, and return integers",
        inputs=(0,)),
    row(("transpose", "Flatten", "flatten", "Reshape", "reshape", "Concat", "concat", "slice",
         "slice_axis", "expand_dims", "squeeze", "SwapAxis", "swapaxes", "_copy", "identity",
         "stack"), "layout", "they rearrange values and compute none: exact in float16, so a "
        "cast to float32 after them gives the values a cast before them gives"),
    row(("_zeros", "_ones", "_zeros_without_dtype"), "constant", "zeros and ones are exact in "
        "float16 and bfloat16: recurrent begin states and masks are created in the dtype their "
        "consumers need"),
    # bfloat16 on a CPU: where oneDNN (2.4, in MXNet 1.9.1) runs bfloat16 slower than float32.
    row("Convolution", "bfloat16_float32", "oneDNN's bfloat16 convolutions block channels by 16: "
        "with fewer output channels (mobilenet0.25's 8-channel first layers) a convolution takes "
        "its reference GEMM kernel and the BatchNorm after it the plain-layout reference kernel, "
        "3x to 10x float32's time there (docs/benchmarks.md, bfloat16 speed of detectors); "
        "float32 is also the more precise", when=("num_filter", tuple(map(str, range(1, 16))))),
    row("Convolution", "channel_padding", "oneDNN's bfloat16 convolutions block channels by 16: "
        "with 17 or more output channels but not a multiple of 16 (SSD's 44-channel class "
        "predictors) a convolution takes its reference GEMM kernel, 2-3x the time of the one "
        "padded with zero filters; the kept channels are the same sums"),
]


def ops_with(rule):
    """The ops a row gives ``rule`` without a condition.

    Examples
    --------
    >>> 'FullyConnected' in ops_with('gemm')
    True
    """
    return frozenset(op for r in OP_RULES if r.rule == rule and r.when is None for op in r.ops)


def conditions(rule):
    """``{op: [(attribute, values), ...]}`` of the rows that give ``rule`` under a condition."""
    found = {}
    for r in OP_RULES:
        if r.rule == rule and r.when is not None:
            for op in r.ops:
                found.setdefault(op, []).append(r.when)
    return found


def applies(rule, node):
    """Whether ``rule`` applies to graph node ``node`` (a dict of the graph's JSON).

    Examples
    --------
    >>> applies('grid', {'op': 'Pooling', 'attrs': {'pool_type': 'max'}})
    True
    >>> applies('grid', {'op': 'Pooling', 'attrs': {'pool_type': 'avg'}})
    False
    """
    op = node["op"]
    for r in OP_RULES:
        if r.rule == rule and op in r.ops:
            if r.when is None or node.get("attrs", {}).get(r.when[0]) in r.when[1]:
                return True
    return False


def index_inputs(rule="index"):
    """``{op: input positions}`` of the ``index`` rows (or of another positional ``rule``).

    Examples
    --------
    >>> index_inputs("shape")["slice_like"]
    (1,)
    """
    found = {}
    for r in OP_RULES:
        if r.rule == rule:
            for op in r.ops:
                found[op] = tuple(sorted(set(found.get(op, ())) | set(r.inputs)))
    return found


#: The named views of the table the modules read (computed once, at import).
NORM_OPS = ops_with("norm")
NORM_OPS_WITH_FLOAT16_DATA = ops_with("float16_data")
FLOAT32_OPS = ops_with("float32")
GEMM_OPS = ops_with("gemm")
DTYPE_ATTR_OPS = ops_with("dtype_attr")
INDEX_INPUTS = index_inputs()
SHAPE_INPUTS = index_inputs("shape")
LAYOUT_OPS = ops_with("layout")
WIDEST_TYPE_OPS = ops_with("widest")
GRID_PRESERVING_OPS = ops_with("grid")
EXACT_CONSTANT_OPS = ops_with("constant")

#: Ops MXNet's AMP bfloat16 pass knows (any of its lists); an op it does not know keeps whatever dtype
#: reaches it, and MXNet 1.9.1's CPU kernels of such ops (the interleaved attention matmuls) are
#: float32-only.
BFLOAT16_LISTED_OPS = frozenset(
    _bf16_lists.BF16_FUNCS + _bf16_lists.BF16_FP32_FUNCS + _bf16_lists.FP32_FUNCS
    + _bf16_lists.WIDEST_TYPE_CASTS + [rule[0] for rule in _bf16_lists.CONDITIONAL_FP32_FUNCS])
BFLOAT16_LISTED_OPS |= numpy_twins_in(BFLOAT16_LISTED_OPS)  # the lists AMP's pass runs with


def numpy_amp_lists(dtype):
    """``{AMP list name: NumPy-interface ops}`` to add to MXNet AMP's ``dtype`` lists while its
    pass runs (:func:`mxfp16.mxnet_internals.amp_lists_extended`): each op in its twin's list, so
    the pass treats a NumPy-interface graph as the legacy one (it runs an op it does not know in
    whatever dtype its first input has, and refuses unknown ops in its arguments).

    Examples
    --------
    >>> '_npx_relu' in numpy_amp_lists('float16')['FP16_FP32_FUNCS']
    True
    """
    lists = _amp_lists if dtype == "float16" else _bf16_lists
    names = ("FP16_FUNCS", "FP16_FP32_FUNCS") if dtype == "float16" else \
        ("BF16_FUNCS", "BF16_FP32_FUNCS")
    return {name: sorted(numpy_twins_in(getattr(lists, name)))
            for name in names + ("FP32_FUNCS", "WIDEST_TYPE_CASTS")}

#: Ops the bfloat16 graph runs in float32 although AMP's bfloat16 pass would leave them bfloat16:
#: GEMMs outside its bfloat16 list (batch_dot and dot are "widest type" ops there, but their CPU
#: kernels are float32-only: "dot only supports float32/float64 for CPU").
BFLOAT16_FLOAT32_GEMMS = GEMM_OPS - frozenset(_bf16_lists.BF16_FUNCS)


def check_mode(mode):
    """Return ``mode`` if it is one of :data:`CAST_MODES`, or raise ``ValueError`` naming the choices."""
    if mode not in CAST_MODES:
        raise ValueError(f"unknown cast mode {mode!r}: choose one of {', '.join(CAST_MODES)} "
                         "('full' casts the whole network, 'amp' uses MXNet's AMP op lists)")
    return mode
