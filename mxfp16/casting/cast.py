"""Casting Gluon blocks and Symbol graphs to float16 (or bfloat16) for training and inference.

The recipe is the MXNet float16 guide's: a cast to float16 after every data input, float16 weights,
float32 parameters for normalization layers, and a cast to float32 before softmax and loss heads
(and before the other ops MXNet's AMP lists keep in float32).  Gluon blocks go through the same
graph rewrite as symbols, so one set of rules serves both APIs.

A Gluon block is traced per mode, in training and in inference mode, so that Python code branching
on ``autograd.is_training()`` keeps both branches, and each mode with the inputs of its own call
(GluonCV's detectors take targets in training only); the :class:`~mxfp16.casting.block.CastBlock`
returned runs the graph of the current mode.
"""
import functools
import json
from collections import namedtuple

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon

from .. import mxnet_internals
from .amp_graph import cast_with_amp, float32_tail
from .block import CastBlock
from .boundary import Boundary
from .plain_block import cast_children
from .rules import (DTYPE_ATTR_OPS, EXACT_CONSTANT_OPS, INDEX_INPUTS, SHAPE_INPUTS, applies,
                    check_dtype, check_mode)
from .emulation import emulate_float16, resolve_emulate
from .signature import (block_inputs, call_structure, describe_call, describe_signature,
                        imperative_call_error)
from .graph import (DTYPE_CODES, MARK, MARK_DTYPE, GraphRewriter, internal_dtypes, node_dtype,
                    without_dtype)

def _created_dtype(node):
    """The dtype an op without inputs (``random.uniform``, ``zeros``, ``arange``) creates: its
    ``dtype`` attribute, float32 when unset."""
    dtype = node.get("attrs", {}).get("dtype", "None")
    return "float32" if dtype == "None" else dtype


def _target_dtype(node, tail=False):
    """The dtype an op with inputs runs in, in the float16 graph (``tail``: no GEMM reads it)."""
    return node_dtype(node) or (
        "float32" if tail or applies("float32", node) else "float16")


def _skipped(op):
    """Input positions that take no dtype from the op: index inputs and shape-only inputs."""
    return INDEX_INPUTS.get(op, ()) + SHAPE_INPUTS.get(op, ())


def _consumer_dtypes(rw, tail, shape_only=frozenset()):
    """``{old node id: set of dtypes its consumers run in}``, index and shape inputs, and the
    ops read only for their shape, left out."""
    wanted = {}
    for old_id, node in enumerate(rw.old_nodes):
        if node["op"] == "null" or not node["inputs"] or node.get("attrs", {}).get(MARK) \
                or old_id in shape_only:
            continue  # inserted casts of an earlier cast are not consumers: they are dropped
        skip = _skipped(node["op"])
        for position, entry in enumerate(node["inputs"]):
            if position not in skip:
                wanted.setdefault(entry[0], set()).add(_target_dtype(node, old_id in tail))
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


def _cast_op(rw, old_id, node, inputs, kind, tail):
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
    target = _target_dtype(node, tail)
    other = {"float32": "float16", "float16": "float32"}[target]
    inputs = [rw.cast(e, target) if i not in skip and kind.get(e[0]) == other else e
              for i, e in enumerate(inputs)]
    dtype = node.get("attrs", {}).get("dtype", "float32" if node["op"] in DTYPE_ATTR_OPS else None)
    if dtype in _FLOAT_DTYPE_ATTRS:
        node = _with_dtype(node, target)
    rw.emit(node, inputs, old_id)
    return target


def _cast_whole_graph(sym, data_names):
    """The GPU float16 graph of the MXNet float16 guide (no emulation).

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
    consumers = _consumer_dtypes(rw, tail, shape_only)
    kind = {}  # new node id -> 'float16' | 'float32' | None (parameters and unknown)
    for old_id, node in rw.nodes_in_order():
        if node["op"] == "null":
            is_data = node["name"] in data_names
            if not is_data:  # declared float32 where only float32 ops read it (SSD's anchors,
                # which slice_like reads without giving them a type), else left to inference
                node = without_dtype(node)
                if consumers.get(old_id) == {"float32"}:
                    node = dict(node, attrs=dict(node.get("attrs", {}),
                                                 __dtype__=DTYPE_CODES["float32"]))
            new_id = rw.emit(node, [], old_id)
            kind[new_id] = "float32" if is_data else None
            continue
        if not node["inputs"]:  # its dtype attribute decides, not the float16 rule
            node = _created(node, consumers.get(old_id, set()))
            kind[rw.emit(node, [], old_id)] = _created_dtype(node)
            continue
        inputs = [rw.input_entry(e) for e in node["inputs"]]
        target = node_dtype(node)
        kinds = {kind.get(e[0]) for e in inputs}
        if target is None and old_id in shape_only and len(kinds) == 1:
            target = kinds.pop()  # its value is never used: no cast, its input's dtype
            rw.emit(node, inputs, old_id)
        elif target is None and old_id in tail and boundary.stays_float16(old_id, node, kind):
            target = "float16"
            rw.emit(node, inputs, old_id)
        elif target is None:
            target = _cast_op(rw, old_id, node, inputs, kind, old_id in tail)
        else:
            rw.emit(node, inputs, old_id)
        kind[len(rw.nodes) - 1] = target
    heads = [rw.cast(h, "float32") if kind.get(h[0]) == "float16" else h for h in rw.heads()]
    return rw.to_symbol(heads)


def _describe(value):
    """A one-line description of a wrong argument: its type and the start of its repr."""
    text = " ".join(repr(value).split())
    return f"{type(value).__name__} {text[:60]}{'...' if len(text) > 60 else ''}"


def _check_data_names(sym, data_names):
    arguments = sym.list_arguments()
    missing = [name for name in data_names if name not in arguments]
    if missing:
        raise ValueError(f"data input(s) {missing} not found among the symbol's arguments "
                         f"{arguments[:8]}{' ...' if len(arguments) > 8 else ''}: pass "
                         "data_names=[...] with the names of the graph's data inputs")


def cast_symbol(sym, dtype="float16", emulate=None, mode="full", data_names=("data",)):
    """Cast a Symbol graph for mixed-precision training.

    Parameters
    ----------
    sym : mx.sym.Symbol
        A float32 graph, for example a ResNet ending in ``SoftmaxOutput``.
    dtype : {'float16', 'bfloat16', 'float32'}
        ``'float32'`` returns ``sym`` unchanged; ``'bfloat16'`` takes MXNet's AMP bfloat16 pass.
    emulate : bool or None
        CPU emulation of float16 (see :mod:`mxfp16.casting.emulation`).  ``None``: on when MXNet sees no
        GPU.  ``False`` builds the GPU graph even on a CPU machine.
    mode : {'full', 'amp'}
        ``'full'``: every op runs in float16 except normalization layers, softmax, losses and the
        ops MXNet's AMP lists keep in float32.  ``'amp'``: MXNet's AMP pass decides op by op.
    data_names : sequence of str
        The data inputs; each gets a cast to float16.  Labels and parameters are not cast.

    Returns
    -------
    mx.sym.Symbol
        The cast graph.  With float32 data, ``infer_type`` gives float16 weights and float32
        normalization parameters; it binds and trains with ``mx.mod.Module``.  Casting a cast graph
        again gives the same graph.

    Raises
    ------
    TypeError
        If ``sym`` is not a Symbol.
    ValueError
        For an unknown ``dtype`` or ``mode``, or a data name the graph does not have.

    Examples
    --------
    >>> import mxnet as mx
    >>> net = mx.sym.FullyConnected(mx.sym.var('data'), num_hidden=4, name='fc')
    >>> net = mx.sym.SoftmaxOutput(net, name='softmax')
    >>> cast = cast_symbol(net, 'float16', emulate=False)
    >>> arg_types, _, _ = cast.infer_type(data='float32')
    >>> dict(zip(cast.list_arguments(), [t.__name__ for t in arg_types]))['fc_weight']
    'float16'
    """
    if not isinstance(sym, mx.sym.Symbol):
        raise TypeError(f"cast_symbol takes an mx.sym.Symbol, got {_describe(sym)}: "
                        "use cast_block for a Gluon block")
    dtype = check_dtype(dtype)
    check_mode(mode)
    data_names = tuple(data_names)
    _check_data_names(sym, data_names)
    if dtype == "float32":
        return sym
    if dtype == "bfloat16":
        resolve_emulate(emulate, dtype)
        return cast_with_amp(sym, dtype, data_names)
    gpu = _cast_whole_graph(sym, data_names) if mode == "full" else \
        cast_with_amp(sym, dtype, data_names)
    if not resolve_emulate(emulate, dtype):
        return gpu
    plan = internal_dtypes(gpu, data_names)
    return emulate_float16(sym, plan, data_names)


def _structure(sym):
    """A graph without what differs between two traces of one block (op names, aux versions)."""
    graph = json.loads(sym.tojson(remove_amp_cast=False))
    nodes = [(node["op"], node["name"] if node["op"] == "null" else "", node.get("attrs"),
              [entry[:2] for entry in node["inputs"]]) for node in graph["nodes"]]
    return nodes, [head[:2] for head in graph["heads"]]


def _block_graphs(block):
    """``(data names, inference graph, training graph or None where the two are the same)`` of a
    SymbolBlock (a :class:`CastBlock` has both graphs)."""
    if isinstance(block, CastBlock):
        return (block.data_names,) + block.graphs
    inputs, outputs = mxnet_internals.symbol_block_graph(block)
    return [s.name for s in inputs], outputs, None


class _Float32Init(mx.init.Initializer):
    """Draws a parameter's initial value in float32 and rounds it to the parameter's dtype, so
    that a float16 network initialized from a seed starts from float32's weights rounded."""

    def __init__(self, initializer):
        super().__init__()
        self._initializer = mx.init.create(initializer)

    def __call__(self, desc, arr):
        value = mx.nd.zeros(arr.shape, ctx=arr.context, dtype="float32")
        self._initializer(desc, value)
        arr[:] = value.astype(arr.dtype)


def _cast_parameters(params, graphs, data_names):
    """Cast each parameter in place to the dtype the cast graphs give it.  A parameter still
    waiting for its shape (deferred initialization) is initialized in float32 and then rounded:
    drawn in float16, a uniform or normal initializer gives other values than float32 from the same
    seed."""
    for sym in graphs:
        types = internal_dtypes(sym, data_names)
        for name, param in params.items():
            if name in types and np.dtype(param.dtype) != np.dtype(types[name]):
                mxnet_internals.wrap_deferred_initializer(param, _Float32Init)
                param.cast(np.dtype(types[name]).type)


def _default_layouts(params):
    """Copy each initialized parameter's values into MXNet's default layout: an
    inference-mode forward leaves oneDNN's convolution weights in its blocked layout, which the
    bfloat16 graph's cast of the weight cannot read ("could not create a primitive descriptor for
    a reorder primitive", GluonCV's SSD evaluated before it is cast)."""
    for param in params.values():
        if mxnet_internals.initialized_arrays(param):
            param.cast(param.dtype)  # fresh copies, as a float16 cast makes them


def _input_names(block, input_names):
    """The names the block's data inputs are traced under: ``input_names`` when given; else
    ``data`` for a block of one required input (as before), the names of ``hybrid_forward`` (or
    of the block's own ``forward``) for several."""
    if input_names is not None:
        return tuple(input_names)
    inputs = block_inputs(block)
    if inputs is None or len(inputs[0]) <= 1:
        return ("data",)
    return inputs[0]


#: One traced call: the cast graph, its data inputs (names and positions among the call's flat
#: arrays), the nesting of its outputs, and the structure of the float32 graph (to compare traces).
Trace = namedtuple("Trace", ["data_names", "positions", "graph", "out_fmt", "structure"])


def _traced_outputs(block, symbols, training, recording):
    """``block(*symbols)`` in the autograd state of the call being traced: GluonCV's YOLOv3 returns
    its losses when recording in training mode, raw predictions when only training."""
    scope = autograd.record(train_mode=True) if training and recording else \
        autograd.train_mode() if training else autograd.predict_mode()
    with scope:
        return block(*symbols)


def _variant_tracer(block, dtype, emulate, mode):
    """``trace(call, names=None, training=False, recording=None) -> Trace``: the cast graph of
    ``block`` called as in ``call`` (nested lists, None), in one mode, for :class:`CastBlock`.
    ``recording`` (default: ``training``) traces inside ``autograd.record()``."""
    def trace(call, names=None, training=False, recording=None):
        flat, fmt, _ = call_structure(call)
        names = list(names) if names else [f"input{index}" for index in range(len(flat))]
        symbols = mxnet_internals.regroup(
            [None if array is None else mx.sym.var(name) for array, name in zip(flat, names)], fmt)
        with autograd.pause():  # the casting's own NDArray work is never recorded
            try:
                outputs = _traced_outputs(block, symbols, training,
                                          training if recording is None else recording)
            except (TypeError, AssertionError) as error:
                raise imperative_call_error(error, block) or TypeError(
                    f"the cast network takes what {describe_signature(block)} takes, called with "
                    f"{describe_call(call)} in {'training' if training else 'inference'} mode: "
                    f"{' '.join(str(error).split())}") from None
            out_flat, out_fmt = mxnet_internals.flatten_call(outputs)
            graph = out_flat[0] if len(out_flat) == 1 else mx.sym.Group(out_flat)
            used = set(graph.list_arguments())
            positions = [index for index, (array, name) in enumerate(zip(flat, names))
                         if array is not None and name in used]
            data_names = [names[index] for index in positions]
            cast = cast_symbol(graph, dtype, emulate=emulate, mode=mode, data_names=data_names)
            _cast_parameters(block.collect_params(), [cast], data_names)
        return Trace(data_names, positions, cast, out_fmt, _structure(graph))
    return trace


def _closed_signature(block, count):
    """Whether ``block`` takes exactly ``count`` inputs, none optional: its training call is then
    its inference call, and both can be traced when it is cast."""
    inputs = block_inputs(block)
    return inputs is not None and not inputs[1] and len(inputs[0]) == count


def _trace_plain(tracer, block, names):
    """The traces of the call with ``names``: inference, and training where the block's signature
    leaves no other training call (None: traced at the first training call, with its inputs)."""
    inference = tracer([mx.nd.zeros(1)] * len(names), names)
    if not _closed_signature(block, len(names)):
        return inference, None
    training = tracer([mx.nd.zeros(1)] * len(names), names, training=True)
    if training.structure == inference.structure:
        training = training._replace(graph=None)
    return inference, training


def cast_block(block, dtype="float16", emulate=None, mode="full", input_names=None):
    """Prepare a Gluon HybridBlock for mixed-precision training and inference: ``net.cast``'s
    replacement.

    All parameters become float16 except those of normalization layers (BatchNorm, SyncBatchNorm,
    InstanceNorm, LayerNorm, GroupNorm), whose weights and running statistics stay float32.  Inputs
    of any float dtype are accepted; outputs come back as float32, so softmax and losses run in
    float32.  The parameters are cast in place and shared with the returned block.

    The block is traced in training and in inference mode: calls in either mode run that mode's
    graph, so Python branches on ``autograd.is_training()`` behave as in the original.  Each mode
    is traced with the inputs of its own call: inference at the cast, training too where the
    block takes nothing but its required inputs, else at the first training call with the arrays
    it passes (Faster R-CNN's ``gt_box, gt_label``, YOLOv3's targets), inside ``autograd.record()``
    when that call records.  Nothing is traced with inputs the caller did not give.  The cast
    network always runs as a graph, as a hybridized block does: a block that was not hybridized
    stays so (no ``static_alloc``), and one that was keeps its ``hybridize()`` settings, but the
    Python code of its ``hybrid_forward`` runs at cast time, not at every call, so printing,
    ``asnumpy()`` or data-dependent Python control flow there, and forward hooks of its inner
    layers, do not run per call.

    Parameters
    ----------
    block : gluon.HybridBlock or gluon.Block
        Any hybridizable network (model-zoo networks, ``SymbolBlock.imports`` of a checkpoint),
        initialized or not, hybridized or not, its parameters loaded or not.  Initialized before
        the cast (shapes known or deferred), a float16 parameter starts from the float32 values
        of the same seed, rounded; initialized after it, its values are drawn in float16.  A ``gluon.Block``
        that is not hybridizable but is made of HybridBlocks (GluonNLP's ``NMTModel``) has those
        cast in place and is returned itself: its own Python code between them runs on their
        float32 outputs, the cast parts keep the methods of the originals, and its
        ``save_parameters`` / ``load_parameters`` become a CastBlock's (float32 checkpoints under
        the float32 network's names; :mod:`~mxfp16.casting.plain_block`).
    dtype : {'float16', 'bfloat16', 'float32'}
        ``'float32'`` returns ``block`` itself, unchanged.
    emulate : bool or None
        CPU emulation of float16; ``None`` turns it on when MXNet sees no GPU.
    mode : {'full', 'amp'}
        As in :func:`cast_symbol`.
    input_names : sequence of str, optional
        Names for the block's inputs, for Symbol-style callers (ignored for a SymbolBlock, which
        has its own).  Without it the cast network is called exactly like ``block``: the inputs
        are read from ``block``'s signature (``data`` for one input), and calls with nested lists
        of states (``net(x, begin_state)`` returning ``(output, states)``), optional inputs given
        or left out, or another number of inputs are traced from ``block`` on their first use.
        A call ``block`` itself does not take is one ``TypeError`` naming both.

    Returns
    -------
    CastBlock
        The cast network, a ``gluon.SymbolBlock``.  It shares the Parameter objects of ``block``,
        so a Trainer over either's ``collect_params()`` trains both.  Its ``save_parameters``
        writes float32 checkpoints under the original's names; save and load through it.

    Raises
    ------
    TypeError
        If ``block`` is not a HybridBlock.
    ValueError
        For an unknown ``dtype`` or ``mode``.

    Examples
    --------
    >>> import mxnet as mx
    >>> from mxnet.gluon import nn
    >>> net = nn.HybridSequential()
    >>> net.add(nn.Dense(8), nn.BatchNorm(), nn.Dense(2))
    >>> net.initialize()
    >>> net16 = cast_block(net, 'float16')
    >>> net[0].weight.dtype.__name__, net[1].gamma.dtype.__name__
    ('float16', 'float32')
    >>> net16(mx.nd.ones((4, 3))).dtype.__name__
    'float32'
    """
    plain = isinstance(block, gluon.Block) and not isinstance(block, gluon.HybridBlock) \
        and bool(mxnet_internals.block_children(block))
    if not (plain or isinstance(block, gluon.HybridBlock)):
        raise TypeError(f"cast_block takes a gluon.HybridBlock, got {_describe(block)}: "
                        "make the network hybridizable, or pass a Symbol to cast_symbol")
    dtype = check_dtype(dtype)
    check_mode(mode)
    if dtype == "float32":
        return block
    if plain:  # its HybridBlock parts cast in place, float32 checkpoints (see plain_block)
        return cast_children(block, functools.partial(cast_block, dtype=dtype, emulate=emulate,
                                                      mode=mode))
    params = block.collect_params()
    if dtype == "bfloat16":
        _default_layouts(params)
    if isinstance(block, gluon.SymbolBlock):  # a fixed graph: its own inputs, as they are
        data_names, *graphs = _block_graphs(block)
        graphs = [None if sym is None else
                  cast_symbol(sym, dtype, emulate=emulate, mode=mode, data_names=data_names)
                  for sym in graphs]
        _cast_parameters(params, [sym for sym in graphs if sym is not None], data_names)
        tracer, plain = None, (len(data_names), list(range(len(data_names))), None)
        plain_training = (data_names,) + plain[1:]
    else:  # traced called with plain arrays; other calls traced on first use
        tracer = _variant_tracer(block, dtype, emulate, mode)
        names = _input_names(block, input_names)
        try:
            inference, training = _trace_plain(tracer, block, names)
        except (TypeError, ValueError, AssertionError, mx.base.MXNetError) as error:
            # nd.* in hybrid_forward fails every trace: say so now, not at the first call
            if input_names is not None or getattr(error, "method", None) == "hybrid_forward":
                raise
            # Inputs that must be nested (a decoder's [memory, mask] states): traced at the first
            # call, which also casts the parameters; until then the graph holds the parameters.
            graph = mx.sym.Group([mx.sym.var(name, dtype=param.dtype)
                                  for name, param in params.items()])
            names, inference, training = (), Trace([], [], graph, None, None), None
        data_names, graphs = inference.data_names, (inference.graph, training and training.graph)
        plain = (len(names), inference.positions, inference.out_fmt)
        plain_training = training and (training.data_names, training.positions, training.out_fmt)
    keys = block.param_keys if isinstance(block, CastBlock) else \
        mxnet_internals.block_param_keys(block)
    cast = CastBlock(graphs, data_names, params, keys, dtype, tracer=tracer, plain=plain,
                     original=None if tracer is None else block, plain_training=plain_training)
    cast.recast = functools.partial(cast_symbol, mode=mode)  # export's float16 graph
    flags = mxnet_internals.hybridize_flags(block)
    if flags is not None:
        cast.hybridize(True, **flags)
    return cast

