"""Rewriting MXNet Symbol graphs: the JSON node list, copied node by node with new nodes inserted.

MXNet 1.9 has no Python graph-pass API apart from AMP's fixed pass, so mxfp16 rewrites the graph's
JSON, the format ``Symbol.tojson`` writes and ``mx.sym.load_json`` reads.  Nodes come in topological
order; an entry ``[node_id, output_index, version]`` names one output of one node.
"""
import json

import mxnet as mx
import numpy as np

from . import fastround

#: Attribute that marks the nodes mxfp16 inserts, so a second cast can take them out first.
MARK = "__mxfp16__"

#: Attribute holding the ``dtype`` attribute an op had before a cast changed it (zeros created in
#: float16, a float16 Embedding), so a second cast starts from the original.
MARK_DTYPE = "__mxfp16_dtype__"

#: MXNet's type codes, as ``mx.sym.var(dtype=...)`` writes them into ``__dtype__``.
DTYPE_CODES = {"float32": "0", "float16": "2"}


class GraphRewriter:
    """Copies a symbol's nodes into a new graph, inserting nodes on the way.

    Parameters
    ----------
    sym : mx.sym.Symbol
        The graph to copy.
    drop_inserted : bool
        Drop the nodes an earlier mxfp16 cast inserted (their input takes their place), so that
        rewriting an already rewritten graph starts from the original.
    """

    def __init__(self, sym, drop_inserted=True):
        self.drop_inserted = drop_inserted
        graph = json.loads(sym.tojson(remove_amp_cast=False))
        self.old_nodes = graph["nodes"]
        self.old_heads = graph["heads"]
        self.meta = graph.get("attrs", {})
        self.nodes = []
        self._names = {node["name"] for node in self.old_nodes
                       if not (drop_inserted and node.get("attrs", {}).get(MARK))}
        self._node = {}  # old node id -> new node id
        self._override = {}  # (old node id, output index) -> new entry, for dropped nodes
        self._cache = {}  # (new entry, key) -> new entry, so each cast is inserted once

    def nodes_in_order(self):
        """Yield ``(old_id, node)`` for the nodes to copy, skipping mxfp16's own inserted nodes."""
        for old_id, node in enumerate(self.old_nodes):
            if self.drop_inserted and node.get("attrs", {}).get(MARK):
                # An inserted cast passes its inputs through: the graph is rewritten from the original.
                # (Only the first input: the weight of an inserted identity convolution is not.)
                if node["inputs"]:
                    self._override[(old_id, 0)] = self.input_entry(node["inputs"][0])
                continue
            if self.drop_inserted and MARK_DTYPE in node.get("attrs", {}):
                attrs = dict(node["attrs"])
                attrs["dtype"] = attrs.pop(MARK_DTYPE)
                node = dict(node, attrs=attrs)
            yield old_id, node

    def input_entry(self, old_entry):
        """The new entry that stands for an old entry ``[node, index, version]``."""
        old_id, index = old_entry[0], old_entry[1]
        if (old_id, index) in self._override:
            return self._override[(old_id, index)]
        return (self._node[old_id], index, 0)

    def emit(self, node, inputs, old_id=None):
        """Append a copy of ``node`` with new ``inputs``; it stands for old node ``old_id``."""
        self.nodes.append(dict(node, inputs=[list(e) for e in inputs]))
        new_id = len(self.nodes) - 1
        if old_id is not None:
            self._node[old_id] = new_id
        return new_id

    def copy(self, old_id, node):
        """Append ``node`` (the old node or a modified copy) with its inputs mapped to the new graph."""
        return self.emit(node, [self.input_entry(e) for e in node["inputs"]], old_id)

    def replace(self, old_id, entry):
        """Make ``entry`` stand for (the first output of) old node ``old_id``, which is not copied."""
        self._override[(old_id, 0)] = entry

    def heads(self):
        """The new entries of the old graph's outputs."""
        return [self.input_entry(head) for head in self.old_heads]

    def unique_name(self, base):
        name, n = base, 1
        while name in self._names:
            name, n = f"{base}{n}", n + 1
        self._names.add(name)
        return name

    def insert_op(self, op, entry, key, **attrs):
        """Insert ``op(entry, **attrs)`` once per ``(entry, key)`` and return its output entry."""
        cached = self._cache.get((tuple(entry), key))
        if cached is not None:
            return cached
        source = self.nodes[entry[0]]["name"]
        attrs = {k: str(v) for k, v in attrs.items()}
        attrs[MARK] = key
        node = {"op": op, "name": self.unique_name(f"{source}_{key}"), "attrs": attrs}
        out = (self.emit(node, [entry]), 0, 0)
        self._cache[(tuple(entry), key)] = out
        return out

    def identity_convolution(self, entry, channels, kernel_dims):
        """A depthwise convolution by 1 (exact: ``x * 1`` accumulated in float32), inserted once per
        entry: it hands its consumer oneDNN's blocked layout.  Its weight is an ``_ones`` op, not a
        parameter."""
        cached = self._cache.get((tuple(entry), "identity"))
        if cached is not None:
            return cached
        source = self.nodes[entry[0]]["name"]
        ones = (self.emit({"op": "_ones", "name": self.unique_name(f"{source}_identity_weight"),
                           "attrs": {"shape": str((channels, 1) + (1,) * kernel_dims),
                                     "dtype": "float32", MARK: "identity_weight"}}, []), 0, 0)
        attrs = {"kernel": str((1,) * kernel_dims), "num_filter": str(channels),
                 "num_group": str(channels), "no_bias": "True", MARK: "identity"}
        node = {"op": "Convolution", "name": self.unique_name(f"{source}_identity"), "attrs": attrs}
        out = (self.emit(node, [entry, ones]), 0, 0)
        self._cache[(tuple(entry), "identity")] = out
        return out

    def cast(self, entry, dtype):
        """``Cast(entry, dtype)``, inserted once per entry and dtype.

        ``Cast`` rather than ``amp_cast``: ``Symbol.save`` and ``Module.save_checkpoint`` drop
        ``amp_cast`` nodes by default, and ``amp_cast`` leaves float64 inputs float64.
        """
        return self.insert_op("Cast", entry, f"cast_{dtype}", dtype=dtype)

    def round_to_float16(self, entry, any_dtype=False):
        """Round a float32 entry through float16 and back: the value, and in backward its gradient,
        land on the float16 grid (overflow to inf, underflow to zero) while staying float32.

        One fused pass (:mod:`mxfp16.casting.fastround`) where it can be built, else a ``Cast`` pair with
        the same results bit for bit.  ``any_dtype``: the entry may not be float32 (a data input),
        which only the ``Cast`` pair accepts.
        """
        if not any_dtype and fastround.wanted() and fastround.load():
            return self.insert_op(fastround.ROUND_OP, entry, "round_float16")
        half = self.cast(entry, "float16")
        return self.insert_op("Cast", half, "round_float16", dtype="float32")

    def to_symbol(self, heads):
        graph = {"nodes": self.nodes, "arg_nodes": [], "heads": [list(h) for h in heads],
                 "attrs": self.meta}
        return mx.sym.load_json(json.dumps(graph))


def strip(sym, data_names):
    """``sym`` without the nodes an earlier mxfp16 cast inserted and without pinned parameter dtypes:
    the original graph, ready to be cast."""
    rw = GraphRewriter(sym)
    for old_id, node in rw.nodes_in_order():
        rw.copy(old_id, node if node["name"] in data_names else without_dtype(node))
    return rw.to_symbol(rw.heads())


def without_dtype(node):
    """A variable node without its ``__dtype__``, so type inference decides (Gluon pins float32)."""
    if node["op"] != "null" or "__dtype__" not in node.get("attrs", {}):
        return node
    return dict(node, attrs={k: v for k, v in node["attrs"].items() if k != "__dtype__"})


def node_dtype(node):
    """The dtype a Cast or amp_cast node casts to, or None for any other node."""
    if node["op"] in ("Cast", "amp_cast"):
        return node.get("attrs", {}).get("dtype")
    return None


def op_inputs(node, skip):
    """Positions of a node's inputs, without the positions in ``skip``."""
    return [i for i in range(len(node["inputs"])) if i not in skip]


def count_ops(sym, op):
    """Number of nodes of type ``op`` in ``sym``.

    Examples
    --------
    >>> import mxnet as mx
    >>> count_ops(mx.sym.relu(mx.sym.var('data')), 'relu')
    1
    """
    return sum(1 for node in json.loads(sym.tojson(remove_amp_cast=False))["nodes"] if node["op"] == op)


def internal_dtypes(sym, input_dtypes):
    """Dtype names of every node output and argument of ``sym``, by output name.

    Parameters
    ----------
    sym : mx.sym.Symbol
    input_dtypes : dict of str to str, or sequence of str
        Known input dtypes, e.g. ``{'data': 'float16'}``; a sequence of input names means they are
        all float32 (data as an iterator yields it).

    Returns
    -------
    dict of str to str
        ``{'conv0_output': 'float16', 'conv0_weight': 'float16', ...}``; types MXNet cannot infer are
        left out.  An op of the NumPy interface whose output MXNet names ``<name>_out`` (``matmul``)
        is given under ``<name>_output`` too.

    Examples
    --------
    >>> import mxnet as mx
    >>> fc = mx.sym.FullyConnected(mx.sym.var('data'), num_hidden=2, name='fc')
    >>> internal_dtypes(fc, ['data'])['fc_output']
    'float32'
    """
    if not isinstance(input_dtypes, dict):
        input_dtypes = {name: "float32" for name in input_dtypes}
    internals = sym.get_internals()
    _, out_types, _ = internals.infer_type_partial(**input_dtypes)
    arg_types, _, aux_types = sym.infer_type_partial(**input_dtypes)
    named = list(zip(internals.list_outputs(), out_types))
    # The NumPy interface's ops name their output ``<name>_out`` (``_npi_matmul``), the legacy
    # ones ``<name>_output``: both are given under the legacy name too.
    outputs = {name for name, _ in named}
    named += [(name[:-len("_out")] + "_output", t) for name, t in named if name.endswith("_out")
              and name[:-len("_out")] + "_output" not in outputs]
    named += list(zip(sym.list_arguments(), arg_types))
    named += list(zip(sym.list_auxiliary_states(), aux_types))
    return {name: np.dtype(t).name for name, t in named if t is not None}


def feeding(rw, ops, skip):
    """Old node ids whose value reaches (through any path) a data input of a node whose op is in
    ``ops``; ``skip`` maps an op to input positions that do not count (index inputs, box
    coordinates).

    Examples
    --------
    >>> import mxnet as mx
    >>> fc = mx.sym.FullyConnected(mx.sym.relu(mx.sym.var('data')), num_hidden=2, name='fc')
    >>> rw = GraphRewriter(mx.sym.exp(fc))
    >>> sorted(rw.old_nodes[i]['op'] for i in feeding(rw, {'FullyConnected'}, {}))
    ['null', 'null', 'null', 'relu']
    """
    feeds = set()
    for old_id in reversed(range(len(rw.old_nodes))):
        node = rw.old_nodes[old_id]
        if node["op"] in ops or old_id in feeds:
            positions = skip.get(node["op"], ())
            feeds.update(entry[0] for i, entry in enumerate(node["inputs"]) if i not in positions)
    return feeds
