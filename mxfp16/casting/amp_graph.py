"""The casting of MXNet's AMP pass (``mode='amp'`` and bfloat16), with mxfp16's rules applied
before it: float32 after the last GEMM (post-processing: box decoding, NMS, losses), float32 where
MXNet 1.9.1 has no bfloat16 CPU kernel or a slower one than float32's (rows
``bfloat16_float32``), and one dtype for the inputs of multi-input ops (MXNet AMP's widest-type
rule, which its bfloat16 lists leave out for Concat), explicit float32 where AMP's bfloat16 pass
would mistype an op reading a float32 value.  ``take`` and ``pick`` pass through the float16 pass
under a stand-in (see :data:`PASS_STAND_INS`).
"""
import json

import mxnet as mx
from mxnet.contrib import amp
from mxnet.contrib.amp.lists import symbol_bf16 as _bf16_lists
from mxnet.contrib.amp.lists import symbol_fp16 as _fp16_lists

from .. import mxnet_internals
from .channels import pad_output_channels
from .transposed import deconvolution_as_convolution
from .graph import MARK, GraphRewriter, feeding, internal_dtypes, node_dtype, strip
from .rules import (BFLOAT16_FLOAT32_GEMMS, BFLOAT16_LISTED_OPS, DTYPE_ATTR_OPS, GEMM_OPS,
                    INDEX_INPUTS, applies, numpy_amp_lists)

#: Ops the tail rule leaves alone: GEMMs, and lookups whose weight dtype is theirs (a float16
#: Embedding's table is float16, wherever it sits).
KEPT_OPS = GEMM_OPS | DTYPE_ATTR_OPS

#: Dtypes a float32 cast applies to (None: not inferred, as a parameter of deferred shape).
_FLOATS = (None, "float16", "float32", "bfloat16")


def float32_tail(rw):
    """Old ids of the ops that run in float32 because no GEMM reads their value: what follows
    the network's last matrix multiply (box decoding, anchors, NMS, scores, in-network losses,
    the final upsampling of segmentation logits), where float16 buys no Tensor Core work and a
    box coordinate above 2048 would move by 2 px or more.  Index inputs and box coordinates
    (ROIAlign's rois) do not count as reading."""
    feeds = feeding(rw, GEMM_OPS, INDEX_INPUTS)
    return {old_id for old_id, node in enumerate(rw.old_nodes)
            if node["op"] != "null" and node["inputs"] and node["op"] not in KEPT_OPS
            and old_id not in feeds and node["op"] not in ("Cast", "amp_cast")}


def _entry_dtype(rw, types, old_entry):
    """The dtype of an old entry in ``types`` (:func:`internal_dtypes` of the graph), or None."""
    node = rw.old_nodes[old_entry[0]]
    if node["op"] == "null":
        return types.get(node["name"])
    name, index = node["name"], old_entry[1]
    return types.get(f"{name}_output{index}", types.get(f"{name}_output") if index == 0 else None)


def _float32_inputs(sym, wanted, data_names, kept=frozenset()):
    """Cast to float32 the float values the nodes ``wanted(rw) -> old ids`` selects read: not
    their index inputs, integer values (shapes, top-k indices), parameters (AMP gives those
    their dtype; BatchNorm's running statistics must stay variables) or a cast to float32 of an
    earlier pass.  ``sym`` is stripped of an earlier cast's nodes already; the casts of the
    passes before this one are kept.  The ops named in ``kept`` (``keep_float32``'s) are left
    to AMP's pass, which casts the inputs of its excluded ops itself, and only where needed."""
    rw = GraphRewriter(sym, drop_inserted=False)
    chosen = {old_id for old_id in wanted(rw) if rw.old_nodes[old_id]["name"] not in kept}
    types = internal_dtypes(sym, data_names) if chosen else {}

    def read_as_is(position, entry, skip):
        source = rw.old_nodes[entry[0]]
        return position in skip or _entry_dtype(rw, types, entry) not in _FLOATS or (
            source["op"] == "null" and source["name"] not in data_names) or \
            node_dtype(source) == "float32"

    for old_id, node in rw.nodes_in_order():
        if old_id not in chosen:
            rw.copy(old_id, node)
            continue
        skip = INDEX_INPUTS.get(node["op"], ())
        inputs = [rw.input_entry(e) if read_as_is(i, e, skip) else
                  rw.cast(rw.input_entry(e), "float32") for i, e in enumerate(node["inputs"])]
        rw.emit(node, inputs, old_id)
    return rw.to_symbol(rw.heads())


def _mark_new_casts(sym, before):
    """Mark the cast nodes AMP inserted (names not in ``before``) so a later cast can drop them."""
    rw = GraphRewriter(sym, drop_inserted=False)
    for old_id, node in rw.nodes_in_order():
        if node["op"] in ("amp_cast", "amp_multicast") and node["name"] not in before:
            node = dict(node, attrs=dict(node.get("attrs", {}), **{MARK: "amp"}))
        rw.copy(old_id, node)
    return rw.to_symbol(rw.heads())


def _outputs_to_float32(sym, data_names):
    """Cast every output that is not float32 (as inferred with float32 data) to float32."""
    types = internal_dtypes(sym, data_names)
    rw = GraphRewriter(sym, drop_inserted=False)
    for old_id, node in rw.nodes_in_order():
        rw.copy(old_id, node)
    heads = [rw.cast(h, "float32") if types.get(name, "float32") != "float32" else h
             for h, name in zip(rw.heads(), sym.list_outputs())]
    return rw.to_symbol(heads)


def _lacks_bfloat16_kernel(op):
    """Whether MXNet 1.9.1 cannot run ``op`` in bfloat16 on a CPU although AMP may leave it so."""
    return op in BFLOAT16_FLOAT32_GEMMS or (
        op not in BFLOAT16_LISTED_OPS and op not in ("amp_cast", "amp_multicast", "Cast"))


def _no_bfloat16_kernel(rw):
    """Ops without a bfloat16 CPU kernel (batch_dot, dot, the interleaved attention matmuls):
    AMP's bfloat16 pass would leave them bfloat16 (widest-type rule) or fail its own type
    inference (ops in none of its lists)."""
    return {old_id for old_id, node in enumerate(rw.old_nodes)
            if node["op"] != "null" and _lacks_bfloat16_kernel(node["op"])}


def _reads_float32(rw, kept=frozenset()):
    """Ops AMP's bfloat16 pass runs in whatever dtype reaches them (Concat, Pooling, the widest-
    type ops) that read a float32 value (from an op without a bfloat16 kernel, as YOLOv3's
    upsampling ``repeat`` or DeepLab's ASPP resize): their float inputs are cast to float32
    explicitly.  For a multi-input op this is MXNet AMP's widest-type rule (its bfloat16 lists
    leave Concat out of it: "Non-uniform data type in Concat"); for any such op it keeps AMP's
    pass from reading the value's bfloat16 copy made for another consumer while typing the op's
    output as bfloat16 (DeepLab's global pooling then fed float32 to a bfloat16 convolution)."""
    float32 = {old_id for old_id, node in enumerate(rw.old_nodes)
               if node["op"] == "null" or _lacks_bfloat16_kernel(node["op"])
               or node["op"] in _bf16_lists.FP32_FUNCS or node_dtype(node) == "float32"
               or node["name"] in kept}
    follows = set(_bf16_lists.BF16_FP32_FUNCS) | set(_bf16_lists.WIDEST_TYPE_CASTS)
    chosen = set()
    for old_id, node in enumerate(rw.old_nodes):
        if node["op"] in follows and any(e[0] in float32 and rw.old_nodes[e[0]]["op"] != "null"
                                         for e in node["inputs"]):
            float32.add(old_id)  # its output is float32 in turn
            chosen.add(old_id)
    return chosen


#: Ops of MXNet AMP's "runs in its input's dtype" list whose type inference raises, rather than
#: answering "unknown", when only their data input is typed.  MXNet 1.9.1's pass
#: (src/nnvm/low_precision_pass.cc, its last branch) types such an op by calling its FInferType
#: with the dtype of input 0 alone, the others unset; TakeOpType and PickOpType then fail their
#: CHECK ("Index type must be set for take operator": Faster and Mask R-CNN's target sampler,
#: every ``take`` of a computed value, in float16).  The pass sees the stand-in in their place: an
#: op of the same list, whose output has its data's dtype and whose index input is left as it is
#: (no cast), as the pass means to treat take; the op is put back, attributes and all, after it.
PASS_STAND_INS = {"take": "gather_nd", "pick": "gather_nd"}

#: Attribute of a stand-in node: the JSON of the op and attributes it stands for.
STAND_IN = "__mxfp16_stand_in__"


def _with_stand_ins(sym, dtype):
    """``sym`` with the ops of :data:`PASS_STAND_INS` that MXNet's ``dtype`` pass types by their
    data input (its lp16-fp32 list) under their stand-in."""
    listed = set(_fp16_lists.FP16_FP32_FUNCS if dtype == "float16" else
                 _bf16_lists.BF16_FP32_FUNCS)
    rw = GraphRewriter(sym, drop_inserted=False)
    for old_id, node in rw.nodes_in_order():
        if node["op"] in listed and PASS_STAND_INS.get(node["op"]) in listed:
            original = json.dumps({"op": node["op"], "attrs": node.get("attrs", {})})
            node = dict(node, op=PASS_STAND_INS[node["op"]], attrs={STAND_IN: original})
        rw.copy(old_id, node)
    return rw.to_symbol(rw.heads())


def _put_back(sym):
    """``sym`` with the ops :func:`_with_stand_ins` stood in for put back, with their attributes
    and the inputs the pass gave them."""
    rw = GraphRewriter(sym, drop_inserted=False)
    for old_id, node in rw.nodes_in_order():
        original = node.get("attrs", {}).get(STAND_IN)
        if original:
            original = json.loads(original)
            node = dict(node, op=original["op"], attrs=original["attrs"])
        rw.copy(old_id, node)
    return rw.to_symbol(rw.heads())


#: NumPy-interface ops a bfloat16 graph runs as the legacy op that computes the same values
#: with oneDNN's kernel: MXNet 1.9.1's own bfloat16 kernel of ``_npx_relu`` is a generic loop,
#: about 40x slower than oneDNN's ``Activation`` on a (16, 64, 16, 16) value (measured;
#: max(x, 0) and its gradient are exact in either).
BFLOAT16_EQUIVALENTS = {"_npx_relu": ("Activation", {"act_type": "relu"})}


def _bfloat16_equivalents(sym):
    """``sym`` with the ops of :data:`BFLOAT16_EQUIVALENTS` replaced by their equivalents."""
    rw = GraphRewriter(sym, drop_inserted=False)
    for old_id, node in rw.nodes_in_order():
        if node["op"] in BFLOAT16_EQUIVALENTS:
            op, attrs = BFLOAT16_EQUIVALENTS[node["op"]]
            node = dict(node, op=op, attrs=dict(attrs))
        rw.copy(old_id, node)
    return rw.to_symbol(rw.heads())


def _last_line(error):
    """The check that failed, from an MXNetError's message."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return lines[-1] if lines else type(error).__name__


def _kept_names(sym, keep):
    """The names of the ops of ``sym`` that ``keep`` (``keep_float32``'s) keeps."""
    return frozenset() if keep is None else frozenset(
        node["name"] for node in GraphRewriter(sym, drop_inserted=False).old_nodes
        if node["op"] != "null" and keep(node["name"], node["op"]))


def cast_with_amp(sym, dtype, data_names, keep=None):
    """MXNet's AMP pass with its own op lists, after mxfp16's rules (see the module docstring);
    outputs come back as float32.  The ops ``keep`` keeps (``keep_float32``) go to the pass's
    ``excluded_sym_names``: it runs them in float32, their inputs cast to float32 and their
    parameters float32, as MXNet AMP's conversions keep the ops they are given."""
    plain = _float32_inputs(strip(sym, data_names), float32_tail, data_names,
                            _kept_names(sym, keep))
    if dtype == "bfloat16":  # Convolutions, which run in bfloat16, for oneDNN's Deconvolution
        plain = _bfloat16_equivalents(deconvolution_as_convolution(plain))
        # channels in oneDNN's blocks of 16
        plain = pad_output_channels(plain, _kept_names(plain, keep))
        kept = _kept_names(plain, keep)
        plain = _float32_inputs(plain, _no_bfloat16_kernel, data_names, kept)
        plain = _float32_inputs(plain, lambda rw: _reads_float32(rw, kept), data_names, kept)
    nodes = GraphRewriter(plain).old_nodes
    before = {node["name"] for node in nodes}
    kept = _kept_names(plain, keep)
    # AMP's pass casts the inputs of its excluded ops to float32 and runs them so
    excluded = [node["name"] for node in nodes if node["name"] in kept or (
        dtype == "bfloat16" and applies("bfloat16_float32", node))]
    try:
        with mxnet_internals.amp_lists_extended(dtype, numpy_amp_lists(dtype)):
            converted = amp.convert_symbol(_with_stand_ins(plain, dtype), target_dtype=dtype,
                                           data_names=list(data_names),
                                           cast_optional_params=(dtype == "float16"),
                                           excluded_sym_names=excluded)
    except mx.base.MXNetError as error:
        fix = "cast with mode='full' (the default)" if dtype == "float16" else \
            "cast to float16 with mode='full' (the default), or keep this part float32"
        raise mx.base.MXNetError(  # the class it had: callers that catch it still do
            f"MXNet's AMP pass (mode='amp', and every bfloat16 cast) cannot convert this graph to "
            f"{dtype} ({_last_line(error)}): {fix}") from None
    converted = _put_back(converted)
    return _outputs_to_float32(_mark_new_casts(converted, before), data_names)
