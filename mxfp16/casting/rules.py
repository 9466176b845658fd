"""The per-op dtype rules of casting, as named constants.

Each rule carries the reason it exists.  The float32 op list is MXNet's own AMP list
(:mod:`mxnet.contrib.amp.lists.symbol_fp16`), not a copy of it, so it follows the installed MXNet.
"""
from mxnet.contrib.amp.lists import symbol_bf16 as _bf16_lists
from mxnet.contrib.amp.lists import symbol_fp16 as _amp_lists

from ..dtypes import (GRAD_SCALE_HEADS, LABELLED_HEADS, LOSS_HEADS, LOW_PRECISION_DTYPES,  # noqa: F401
                      SUPPORTED_DTYPES, check_dtype)

#: Casting modes: ``full`` casts the whole network (the MXNet float16 guide's recipe),
#: ``amp`` lets MXNet's AMP op lists decide op by op.
CAST_MODES = ("full", "amp")

#: Normalization layers keep float32 weights and running statistics: their statistics are sums of
#: squares over many values, which overflow or lose precision in float16.
NORM_OPS = frozenset({
    "BatchNorm", "BatchNorm_v1", "CuDNNBatchNorm", "_contrib_SyncBatchNorm",
    "InstanceNorm", "LayerNorm", "GroupNorm",
})

#: BatchNorm is the one normalization op whose kernels take float16 data with float32 parameters, so it
#: runs in place; the other normalization ops are fed float32 (their kernels want one dtype throughout).
NORM_OPS_WITH_FLOAT16_DATA = frozenset({"BatchNorm", "BatchNorm_v1", "CuDNNBatchNorm"})

#: Loss heads and softmax run in float32: exp() of a float16 logit overflows above ~11, and the
#: normalising sums lose precision.  These are the ones named in the MXNet float16 guide; MXNet's AMP
#: float32 list adds the rest (exp, log, norms, reductions, ...).
LOSS_AND_SOFTMAX_OPS = LOSS_HEADS | {
    "Softmax", "softmax", "log_softmax", "SoftmaxActivation", "softmin", "make_loss",
    "softmax_cross_entropy", "CTCLoss", "ctc_loss", "_contrib_CTCLoss", "_contrib_ctc_loss",
    "smooth_l1",
}

#: Ops that run in float32 in a float16 network.
FLOAT32_OPS = frozenset(_amp_lists.FP32_FUNCS) | LOSS_AND_SOFTMAX_OPS | (
    NORM_OPS - NORM_OPS_WITH_FLOAT16_DATA)

#: Matrix-multiply ops: the ones Tensor Cores run, and the ones MXNet's CPU backend cannot run in
#: float16 ("FP16 gemm on cpu not implemented!"), so CPU emulation computes them in float32.
GEMM_OPS = frozenset({
    "Convolution", "Deconvolution", "FullyConnected", "RNN", "dot", "batch_dot",
    "_linalg_gemm", "_linalg_gemm2", "linalg_gemm", "linalg_gemm2", "_npi_matmul", "_npi_dot",
    "_contrib_interleaved_matmul_selfatt_qk", "_contrib_interleaved_matmul_selfatt_valatt",
    "_contrib_interleaved_matmul_encdec_qk", "_contrib_interleaved_matmul_encdec_valatt",
})

#: Ops MXNet's AMP bfloat16 pass knows (any of its lists); an op it does not know keeps whatever dtype
#: reaches it, and MXNet 1.9.1's CPU kernels of such ops (the interleaved attention matmuls) are
#: float32-only.
BFLOAT16_LISTED_OPS = frozenset(
    _bf16_lists.BF16_FUNCS + _bf16_lists.BF16_FP32_FUNCS + _bf16_lists.FP32_FUNCS
    + _bf16_lists.WIDEST_TYPE_CASTS + [rule[0] for rule in _bf16_lists.CONDITIONAL_FP32_FUNCS])

#: Ops the bfloat16 graph runs in float32 although AMP's bfloat16 pass would leave them bfloat16:
#: GEMMs outside its bfloat16 list (batch_dot and dot are "widest type" ops there, but their CPU
#: kernels are float32-only: "dot only supports float32/float64 for CPU").
BFLOAT16_FLOAT32_GEMMS = GEMM_OPS - frozenset(_bf16_lists.BF16_FUNCS)

#: Ops whose output dtype is their ``dtype`` attribute, float32 when it is unset, not their input's:
#: a float16 graph sets it (a float16 Embedding has a float16 weight and output).
DTYPE_ATTR_OPS = frozenset({"Embedding", "_contrib_SparseEmbedding", "one_hot"})

#: Inputs that hold integer indices, by op and input position: casting them to float16 would round
#: indices above 2048.
INDEX_INPUTS = {
    "Embedding": (0,), "take": (1,), "pick": (1,), "one_hot": (0,), "gather_nd": (1,),
    "SequenceMask": (1,), "SequenceLast": (1,), "SequenceReverse": (1,),
    "SoftmaxOutput": (1,), "SVMOutput": (1,), "softmax_cross_entropy": (1,),
    # softmax(data, length, use_length=True): the valid lengths of GluonNLP's attention masks.
    "softmax": (1,), "log_softmax": (1,), "masked_softmax": (1,), "masked_log_softmax": (1,),
}

#: Ops whose output is on the float16 grid whenever their inputs are (they select or move values and
#: never compute new ones), so emulation need not round their output again.
GRID_PRESERVING_OPS = frozenset({
    "relu", "Flatten", "flatten", "Reshape", "reshape", "transpose", "expand_dims", "squeeze",
    "SliceChannel", "split", "slice", "slice_axis", "Concat", "concat", "_copy", "identity",
    "max", "min", "_maximum", "_minimum", "broadcast_maximum", "broadcast_minimum", "SwapAxis",
    "swapaxes", "tile", "repeat", "Crop", "Pad", "pad", "reverse", "_contrib_BilinearResize2D_none",
    "_rnn_param_concat", "stack", "SequenceReverse", "SequenceLast", "take", "pick", "Embedding",
    "broadcast_to", "broadcast_like", "broadcast_axis", "slice_like", "zeros_like",
})

#: Ops without inputs that create values exactly representable in float16 and bfloat16 (zeros and
#: ones): recurrent begin states and masks.  They can be created in the dtype their consumers need,
#: instead of being created float32 and cast.
EXACT_CONSTANT_OPS = frozenset({"_zeros", "_ones", "_zeros_without_dtype"})

#: Ops that produce the float16 grid only with some attribute values (op -> (attribute, values)).
CONDITIONAL_GRID_PRESERVING_OPS = {
    "Activation": ("act_type", ("relu",)),
    "Pooling": ("pool_type", ("max",)),
}


def check_mode(mode):
    """Return ``mode`` if it is one of :data:`CAST_MODES`, or raise ``ValueError`` naming the choices."""
    if mode not in CAST_MODES:
        raise ValueError(f"unknown cast mode {mode!r}: choose one of {', '.join(CAST_MODES)} "
                         "('full' casts the whole network, 'amp' uses MXNet's AMP op lists)")
    return mode
