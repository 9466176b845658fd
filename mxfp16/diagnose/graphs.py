"""What the locator runs: a network's call as a float32 graph and its cast, with the same op names.

A call of a Gluon network becomes a :class:`Part`: the float32 graph of the call (traced in
training mode, as a training step runs it), the graph cast to the target dtype (emulated float16 on
a CPU, the float16 GPU graph where MXNet sees a GPU, MXNet's bfloat16 graph) and the dtypes the
target dtype's GPU graph gives every output (:attr:`Part.plan`: what a GPU stores in float16).
Casting keeps the float32 graph's op names, so an output of one run is found in the other by name.

A network already cast by :func:`mxfp16.cast_block` is traced from its float32 original and cast
again the way it was (its mode and its ``keep_float32`` blocks, ``CastBlock.recast``); a cast
``SymbolBlock`` gives its own graph, without what casting inserted.

MXNet's Dropout draws its mask from MXNet's global generator, whose state MXNet 1.9 can neither
read nor restore: a Dropout op of the graph becomes a product with a mask the locator draws
itself (:func:`masked_dropout`), the same in both runs, and MXNet's generator is left as it was
for the next training step.
"""
import functools
import re
from collections import namedtuple

import mxnet as mx
import numpy as np

from .. import mxnet_internals, numpy_interface
from ..casting import cast_symbol, resolve_emulate
from ..casting.block import CastBlock
from ..casting.graph import GraphRewriter, internal_dtypes, strip
from ..casting.tracing import trace_call

__all__ = ["Part", "trace_part", "masked_dropout", "random_ops", "DROPOUT_MASK"]

#: One call of a network: the float32 graph and its cast (same op names), their data inputs,
#: which of the call's flat arrays feed them (None: all, in order) and how the outputs nest
#: (None: as the graph gives them), the dtypes of the target dtype's GPU graph by output name, the
#: parameters by name, whether it runs in the NumPy interface, the Dropout masks standing for its
#: Dropout ops (:func:`masked_dropout`), whether the target graph is emulated float16, and
#: ``cast(graph, dtype=..., emulate=..., data_names=..., keep_float32=...)``, how it was cast.
Part = namedtuple("Part", ["float32", "target", "data_names", "positions", "out_fmt", "plan",
                           "params", "numpy", "masks", "emulated", "cast"])

#: Prefix of the names of the mask inputs standing for the graph's Dropout ops.
DROPOUT_MASK = "__dropout_mask"

#: Ops that draw from MXNet's global generator, besides Dropout: the locator leaves them as they
#: are (their draws differ between the two runs and move the generator) and says so.
_RANDOM_OP = re.compile(r"^(_random_|_sample_|_npi_random|_npi_(uniform|normal|bernoulli|gamma|"
                        r"multinomial|choice|exponential|weibull|pareto|power|rayleigh|logistic|"
                        r"gumbel|laplace)|_shuffle$)")


class GraphView:
    """A graph's nodes with the names MXNet gives their outputs.

    Attributes
    ----------
    nodes : list of dict
        The nodes, as ``Symbol.tojson`` writes them.
    outputs : dict
        ``(node id, output index) -> name`` of every visible output and variable, as
        ``get_internals().list_outputs()`` names them (``'fc_output'``, ``'bn_output'``, ``'x'``).
    heads : list of (int, int)
        The graph's outputs.
    by_hook : dict
        ``name -> (node id, output index)`` as ``register_op_hook`` names an op's outputs: its
        node name and the op's own name of the output (``'fc_output'``, ``'bn_mean'``) or the
        output's index (``'relu0_0'``).

    Examples
    --------
    >>> fc = mx.sym.FullyConnected(mx.sym.var('x'), num_hidden=2, name='fc')
    >>> view = GraphView(mx.sym.relu(fc, name='r'))
    >>> view.outputs[(3, 0)], view.by_hook['r_0'], view.by_hook['fc_output']
    ('fc_output', (4, 0), (3, 0))
    """

    def __init__(self, sym):
        self.nodes = mxnet_internals.graph_json(sym)["nodes"]
        internals = sym.get_internals()
        heads = mxnet_internals.graph_json(internals)["heads"]
        self.outputs = {(entry[0], entry[1]): name
                        for entry, name in zip(heads, internals.list_outputs())}
        self.heads = [tuple(head[:2]) for head in mxnet_internals.graph_json(sym)["heads"]]
        self.by_hook = {}
        for (node_id, index), name in self.outputs.items():
            node = self.nodes[node_id]["name"]
            for spelled in (name[len(node) + 1:], str(index)):
                self.by_hook.setdefault(f"{node}_{spelled}", (node_id, index))


def random_ops(sym):
    """The names of the ops of ``sym`` other than Dropout that draw random numbers (samplers, and
    the fused RNN op's dropout between layers).

    Examples
    --------
    >>> noise = mx.sym.random.uniform(shape=(2,), name='noise')
    >>> random_ops(mx.sym.relu(noise, name='r'))
    ['noise']
    """
    return [node["name"] for node in mxnet_internals.graph_json(sym)["nodes"]
            if _RANDOM_OP.match(node["op"]) or
            (node["op"] == "RNN" and float(node.get("attrs", {}).get("p", 0)) > 0)]


def masked_dropout(sym):
    """``sym`` with each Dropout op replaced by a product with a mask input, and the masks.

    Returns
    -------
    (mx.sym.Symbol, list of (str, str, float, tuple))
        The graph, and for each mask input its name, the output its Dropout read, the drop
        probability and the axes along which one mask value is shared (Dropout's ``axes``).

    Examples
    --------
    >>> drop = mx.sym.Dropout(mx.sym.var('data'), p=0.25, name='drop')
    >>> graph, masks = masked_dropout(mx.sym.relu(drop, name='r'))
    >>> graph.list_arguments(), masks
    (['data', '__dropout_mask0'], [('__dropout_mask0', 'data', 0.25, ())])
    """
    rw, names = GraphRewriter(sym, drop_inserted=False), GraphView(sym)
    masks = []
    for old_id, node in rw.nodes_in_order():
        attrs = node.get("attrs", {})
        if node["op"] != "Dropout" or float(attrs.get("p", 0.5)) == 0:
            rw.copy(old_id, node)
            continue
        read = names.outputs[tuple(node["inputs"][0][:2])]
        name = f"{DROPOUT_MASK}{len(masks)}"
        mask = (rw.emit({"op": "null", "name": name, "inputs": []}, []), 0, 0)
        product = rw.emit({"op": "broadcast_mul", "name": node["name"]},
                          [rw.input_entry(node["inputs"][0]), mask], old_id)
        rw.replace(old_id, (product, 0, 0))
        axes = tuple(int(a) for a in attrs.get("axes", "()").strip("()[] ").split(",") if a)
        masks.append((name, read, float(attrs.get("p", 0.5)), axes))
    return (rw.to_symbol(rw.heads()) if masks else sym), masks


def draw_masks(masks, shapes, rng):
    """Dropout masks as float32 numpy arrays: 0 with probability p, else ``1 / (1 - p)``, one value
    per slice along the axes Dropout shares; ``shapes`` maps an output name to its shape."""
    arrays = []
    for _, read, p, axes in masks:
        shape = tuple(1 if axis in axes or axis - len(shapes[read]) in axes else size
                      for axis, size in enumerate(shapes[read]))
        keep = rng.uniform(size=shape) >= p
        arrays.append(keep.astype(np.float32) / np.float32(1 - p))
    return arrays


def _trace_float32(net, call, numpy, training):
    """``(float32 graph, data names, positions, out_fmt)`` of a HybridBlock called with ``call``,
    traced in training mode inside ``autograd.record()`` as a training step calls it, or in
    inference mode."""
    graph, names, positions, out_fmt = trace_call(net, call, training=training,
                                                  recording=training, numpy=numpy)
    return strip(graph, names), tuple(names), positions, out_fmt


def _float32_graph(net, call, training):
    """``(float32 graph, data names, positions, out_fmt, cast)`` of any network's call; ``cast``
    casts a float32 graph as ``net`` was cast (its mode and kept blocks), ``cast_symbol`` in mode
    ``'full'`` for a float32 network."""
    if isinstance(net, CastBlock):
        cast = net.recast or functools.partial(cast_symbol, mode="full")
        original = vars(net).get("_original")
        if original is None:  # a cast SymbolBlock: its own graph
            inference, training_graph = net.graphs
            names = tuple(net.data_names)
            graph = training_graph if training and training_graph is not None else inference
            return strip(graph, names), names, None, None, cast
        return _trace_float32(original, call, net.numpy, training) + (cast,)
    cast = functools.partial(cast_symbol, mode="full")
    if isinstance(net, mx.gluon.SymbolBlock):
        inputs, outputs = mxnet_internals.symbol_block_graph(net)
        names = tuple(s.name for s in inputs)
        return strip(outputs, names), names, None, None, cast
    return _trace_float32(net, call, numpy_interface.numpy_mode(), training) + (cast,)


def _input_dtypes(data_names, positions, flat):
    """``{data name: dtype name}`` of the arrays a call passes to its graph."""
    arrays = [flat[i] for i in positions] if positions is not None else list(flat)
    return {name: np.dtype(array.dtype).name for name, array in zip(data_names, arrays)}


def _cast(graph, cast, dtype, names, input_dtypes, **keep):
    """``(target graph, plan, emulated)`` of a float32 graph."""
    target = cast(graph, dtype=dtype, emulate=None, data_names=names, **keep)
    emulated = dtype == "float16" and resolve_emulate(None, dtype)
    gpu = cast(graph, dtype=dtype, emulate=False, data_names=names, **keep) if emulated else target
    return target, internal_dtypes(gpu, input_dtypes), emulated


def trace_part(net, call, dtype, training=True):
    """The :class:`Part` of ``net`` called with ``call`` (a list of arguments), for ``dtype``,
    traced in training mode (its Dropout ops masked, see :func:`masked_dropout`) or in inference
    mode.

    Parameters
    ----------
    net : gluon.HybridBlock
        A float32 network, or one cast by :func:`mxfp16.cast_block` (a ``CastBlock``).
    call : list
        The arguments of the call (arrays, None, nested lists).
    dtype : {'float16', 'bfloat16'}
    training : bool

    Returns
    -------
    Part

    Examples
    --------
    >>> from mxnet.gluon import nn
    >>> dense = nn.Dense(2, in_units=3, prefix='fc_')
    >>> dense.initialize()
    >>> part = trace_part(dense, [mx.nd.ones((1, 3))], 'float16')
    >>> part.plan['fc_fwd_output'], np.dtype(dense.weight.dtype).name  # the network unchanged
    ('float16', 'float32')
    """
    flat, _ = mxnet_internals.flatten_call(list(call))
    graph, names, positions, out_fmt, cast = _float32_graph(net, call, training)
    graph, masks = masked_dropout(graph) if training else (graph, [])
    dtypes = _input_dtypes(names, positions, flat)
    target, plan, emulated = _cast(graph, cast, dtype, names, dtypes)
    numpy = net.numpy if isinstance(net, CastBlock) else numpy_interface.numpy_mode()
    return Part(graph, target, names, positions, out_fmt, plan,
                dict(net.collect_params().items()), numpy, masks, emulated, cast)


def recast_part(part, dtype, keep):
    """``part`` with its target graph cast again, keeping ``keep`` (a ``Keep``) in float32."""
    dtypes = {name: "float32" for name in part.data_names}
    target, plan, _ = _cast(part.float32, part.cast, dtype, part.data_names, dtypes,
                            keep_float32=keep)
    return part._replace(target=target, plan=plan)
