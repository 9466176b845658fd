"""The GPU float16 graph of ``mode='full'``: every op in float16 but those the rules keep float32.

The recipe is the MXNet float16 guide's: a cast to float16 after every data input, float16 weights,
float32 parameters for normalization layers, and a cast to float32 before softmax and loss heads
(and before the other ops the rules of :mod:`~mxfp16.casting.rules` keep in float32).  ``mode='amp'``
and bfloat16 take MXNet's AMP pass instead (:mod:`~mxfp16.casting.amp_graph`).
"""
from .amp_graph import float32_tail
from .boundary import Boundary
from .graph import DTYPE_CODES, MARK, MARK_DTYPE, GraphRewriter, node_dtype, without_dtype
from .rules import DTYPE_ATTR_OPS, EXACT_CONSTANT_OPS, INDEX_INPUTS, SHAPE_INPUTS, applies

__all__ = ["cast_whole_graph"]


def _created_dtype(node):
    """The dtype an op without inputs (``random.uniform``, ``zeros``, ``arange``) creates: its
    ``dtype`` attribute, float32 when unset."""
    dtype = node.get("attrs", {}).get("dtype", "None")
    return "float32" if dtype == "None" else dtype


def _target_dtype(node, tail=False, kept=frozenset()):
    """The dtype an op with inputs runs in, in the float16 graph (``tail``: no GEMM reads it;
    ``kept``: the names of the ops ``keep_float32`` keeps)."""
    return node_dtype(node) or (
        "float32" if tail or node["name"] in kept or applies("float32", node) else "float16")


def _skipped(op):
    """Input positions that take no dtype from the op: index inputs and shape-only inputs."""
    return INDEX_INPUTS.get(op, ()) + SHAPE_INPUTS.get(op, ())


def _consumer_dtypes(rw, tail, shape_only=frozenset(), kept=frozenset()):
    """``{old node id: set of dtypes its consumers run in}``, index and shape inputs, and the
    ops read only for their shape, left out.  A value a kept op reads counts as read in float32
    twice over (``'kept'``): a parameter of a kept op stays float32."""
    wanted = {}
    for old_id, node in enumerate(rw.old_nodes):
        if node["op"] == "null" or not node["inputs"] or node.get("attrs", {}).get(MARK) \
                or old_id in shape_only:
            continue  # inserted casts of an earlier cast are not consumers: they are dropped
        skip = _skipped(node["op"])
        for position, entry in enumerate(node["inputs"]):
            if position not in skip:
                wanted.setdefault(entry[0], set()).add(_target_dtype(node, old_id in tail, kept))
                if node["name"] in kept:
                    wanted[entry[0]].add("kept")
    return wanted


def _created(node, consumers):
    """An op without inputs as the float16 graph creates it: zeros and ones directly in the one
    dtype their consumers run in (a recurrent begin state needs float16, with no cast), anything
    else (random samplers, arange) in its own dtype, cast where it meets float16 ops."""
    if node["op"] in EXACT_CONSTANT_OPS and len(consumers) == 1:
        return _with_dtype(node, next(iter(consumers)))
    return node


def _with_dtype(node, dtype):
    """``node`` with its ``dtype`` attribute set to ``dtype``, the original kept for a later cast."""
    attrs = node.get("attrs", {})
    if attrs.get("dtype") == dtype:
        return node
    return dict(node, attrs=dict(attrs, dtype=dtype, **{MARK_DTYPE: attrs.get("dtype", "None")}))


#: Values of an op's ``dtype`` attribute that name the float dtype of its output (Embedding's
#: weight and output, one_hot's output): a float16 op gets ``dtype='float16'``.
_FLOAT_DTYPE_ATTRS = ("float32", "float16", "float64")

#: Dtypes the float16 rule converts between; other kinds (int32 lengths, ids) flow as they are.
_FLOAT_KINDS = ("float16", "float32")


def _cast_op(rw, old_id, node, inputs, kind, tail, kept):
    """Emit an op with inputs in the float16 graph: its inputs cast to the dtype it runs in; return
    that dtype.  Ops on integer values (valid lengths, shape_array) stay so; shapes are read as is."""
    skip = _skipped(node["op"])
    if skip and len(skip) == len(inputs) and node["op"] in SHAPE_INPUTS:  # shape_array: integers
        rw.emit(node, inputs, old_id)
        return "int64"
    kinds = [kind.get(e[0]) for i, e in enumerate(inputs) if i not in skip]
    if kinds and all(k is not None and k not in _FLOAT_KINDS for k in kinds):
        rw.emit(node, inputs, old_id)
        return kinds[0]
    target = _target_dtype(node, tail, kept)
    other = {"float32": "float16", "float16": "float32"}[target]
    inputs = [rw.cast(e, target) if i not in skip and kind.get(e[0]) == other else e
              for i, e in enumerate(inputs)]
    dtype = node.get("attrs", {}).get("dtype", "float32" if node["op"] in DTYPE_ATTR_OPS else None)
    if dtype in _FLOAT_DTYPE_ATTRS:
        node = _with_dtype(node, target)
    rw.emit(node, inputs, old_id)
    return target


def cast_whole_graph(sym, data_names, keep=None):
    """The GPU float16 graph of the MXNet float16 guide (no emulation).

    ``keep`` (a :class:`~mxfp16.casting.keep.Keep`, from ``keep_float32``) names ops that run in
    float32 whatever their op, with float32 parameters (a parameter a kept op reads stays float32,
    cast to float16 where float16 ops read it too): casts only where they meet float16 ops.

    Every op runs in float16 but those of :data:`~mxfp16.casting.rules.FLOAT32_OPS`, which take float32
    and whose float16 consumers get a cast back, so a float32 op can sit anywhere in the graph
    (softmax between two batch_dots, LayerNorm between GEMMs), and those no GEMM reads
    (:func:`~mxfp16.casting.amp_graph.float32_tail`: box decoding, NMS, losses).  What is read
    only for its shape runs in its input's dtype, and the tail's layout ops on float16 values
    read by them alone stay float16 (see :mod:`~mxfp16.casting.boundary`).
    """
    rw = GraphRewriter(sym)
    tail = float32_tail(rw)
    boundary = Boundary(rw)
    shape_only = boundary.shape_only
    kept = frozenset(node["name"] for node in rw.old_nodes
                     if keep is not None and node["op"] != "null" and keep(node["name"], node["op"]))
    consumers = _consumer_dtypes(rw, tail, shape_only, kept)
    kind = {}  # new node id -> 'float16' | 'float32' | None (parameters and unknown)
    for old_id, node in rw.nodes_in_order():
        if node["op"] == "null":
            is_data = node["name"] in data_names
            if not is_data:  # declared float32 where only float32 ops read it (SSD's anchors,
                # which slice_like reads without giving them a type), else left to inference
                node = without_dtype(node)
                read = consumers.get(old_id, set())
                if read == {"float32"} or "kept" in read:
                    node = dict(node, attrs=dict(node.get("attrs", {}),
                                                 __dtype__=DTYPE_CODES["float32"]))
            new_id = rw.emit(node, [], old_id)
            kind[new_id] = "float32" if is_data or "kept" in consumers.get(old_id, ()) else None
            continue
        if not node["inputs"]:  # its dtype attribute decides, not the float16 rule
            node = _created(node, consumers.get(old_id, set()) - {"kept"})
            kind[rw.emit(node, [], old_id)] = _created_dtype(node)
            continue
        inputs = [rw.input_entry(e) for e in node["inputs"]]
        target = node_dtype(node)
        kinds = {kind.get(e[0]) for e in inputs}
        if target is None and old_id in shape_only and len(kinds) == 1:
            target = kinds.pop()  # its value is never used: no cast, its input's dtype
            rw.emit(node, inputs, old_id)
        elif target is None and old_id in tail and node["name"] not in kept and \
                boundary.stays_float16(old_id, node, kind):
            target = "float16"
            rw.emit(node, inputs, old_id)
        elif target is None:
            target = _cast_op(rw, old_id, node, inputs, kind, old_id in tail, kept)
        else:
            rw.emit(node, inputs, old_id)
        kind[len(rw.nodes) - 1] = target
    heads = [rw.cast(h, "float32") if kind.get(h[0]) == "float16" else h for h in rw.heads()]
    return rw.to_symbol(heads)
