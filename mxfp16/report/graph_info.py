"""Shapes and dtypes of every op of a Symbol graph, from MXNet's shape and type inference.

The report's analyses (Tensor Core rules, memory, speed) all read the same per-op table: for each op
node its attributes, its input tensors (activations and parameters) and its output tensors, each with
a shape and a dtype.
"""
import json
from dataclasses import dataclass, field

import mxnet as mx
import numpy as np

from ..casting.graph import internal_dtypes

@dataclass
class Tensor:
    """One tensor of the graph: an op output or a variable (data or parameter)."""

    name: str
    shape: tuple
    dtype: str

    @property
    def size(self):
        """Number of elements."""
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def nbytes(self):
        """Bytes in memory."""
        return self.size * np.dtype(self.dtype).itemsize


@dataclass
class Layer:
    """One op node: ``inputs`` in the op's argument order, then its outputs."""

    name: str
    op: str
    attrs: dict
    inputs: list = field(default_factory=list)
    outputs: list = field(default_factory=list)


@dataclass
class GraphInfo:
    """The op nodes of a graph in topological order, its variables by name, and which variables are
    auxiliary states (BatchNorm running statistics: no gradient, no optimizer state)."""

    layers: list
    variables: dict
    aux_names: frozenset = frozenset()


def graph_nodes(sym):
    """The graph's JSON nodes, amp_cast nodes included (plain ``tojson`` drops them).

    Examples
    --------
    >>> import mxnet as mx
    >>> [node['op'] for node in graph_nodes(mx.sym.relu(mx.sym.var('data')))]
    ['null', 'relu']
    """
    return json.loads(sym.tojson(remove_amp_cast=False))["nodes"]


def _infer(sym, data_shapes, data_dtypes):
    """Shapes and dtypes of every internal output and argument, by name."""
    internals = sym.get_internals()
    try:  # infer_shape would also print its arguments to stdout on failure
        arg_shapes, out_shapes, aux_shapes = internals.infer_shape_partial(**data_shapes)
    except mx.base.MXNetError as err:
        message = str(err).strip().splitlines()[0]
        raise ValueError(f"shape inference failed for input shapes {data_shapes}: {message}; "
                         "check the image shape and batch size against the network") from None
    if any(not shape or 0 in shape for shape in arg_shapes + out_shapes + aux_shapes):
        raise ValueError(f"input shapes {data_shapes} leave some shapes of the graph unknown: "
                         f"give the shape of every input among {sym.list_arguments()[:4]}...")
    shapes = dict(zip(internals.list_outputs(), out_shapes))
    shapes.update(zip(internals.list_arguments(), arg_shapes))
    shapes.update(zip(internals.list_auxiliary_states(), aux_shapes))
    return shapes, internal_dtypes(sym, data_dtypes)


def inspect_graph(sym, data_shapes, data_dtypes=None):
    """Every op of ``sym`` with the shapes and dtypes of its inputs and outputs.

    Parameters
    ----------
    sym : mx.sym.Symbol
        Any graph, cast or not.
    data_shapes : dict of str to tuple
        Shapes of the data inputs, e.g. ``{'data': (256, 3, 224, 224)}``.
    data_dtypes : dict of str to str or None
        Dtypes of the data inputs; ``None`` means float32 for each.

    Returns
    -------
    GraphInfo
        ``layers``: a :class:`Layer` per op node, in topological order; ``variables``: a
        :class:`Tensor` per argument and auxiliary state.

    Raises
    ------
    ValueError
        If shape inference fails (a shape the network cannot take).

    Examples
    --------
    >>> import mxnet as mx
    >>> fc = mx.sym.FullyConnected(mx.sym.var('data'), num_hidden=4, name='fc')
    >>> layer = inspect_graph(fc, {'data': (2, 3)}).layers[0]
    >>> layer.op, [t.shape for t in layer.inputs], layer.outputs[0].shape
    ('FullyConnected', [(2, 3), (4, 3), (4,)], (2, 4))
    """
    data_dtypes = data_dtypes or {name: "float32" for name in data_shapes}
    shapes, dtypes = _infer(sym, data_shapes, data_dtypes)

    def tensor(name):
        return Tensor(name, tuple(shapes[name]), dtypes.get(name, "float32"))

    nodes = {node["name"]: node for node in graph_nodes(sym)}
    internals = sym.get_internals()
    layers, variables = {}, {}
    for index, output in enumerate(internals.list_outputs()):
        entry = internals[index]
        children = entry.get_children()
        node = nodes[entry.name]
        if node["op"] == "null":
            variables[output] = tensor(output)
            continue
        if entry.name not in layers:  # ops without inputs (zeros: an RNN's begin state) have no children
            inputs = [] if children is None else [tensor(name) for name in children.list_outputs()]
            layers[entry.name] = Layer(entry.name, node["op"], dict(node.get("attrs", {})), inputs)
        layers[entry.name].outputs.append(tensor(output))
    return GraphInfo(list(layers.values()), variables, frozenset(sym.list_auxiliary_states()))
