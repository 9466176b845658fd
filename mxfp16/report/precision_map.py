"""Which ops of a float16-cast network run in float16 and which in float32, and the casts inserted.

The map is read from the GPU graph (``cast_symbol(sym, 'float16', emulate=False)``) by MXNet's type
inference with float32 data: an op runs in the dtype of its first output.
"""
from collections import Counter

from ..casting.graph import internal_dtypes
from .graph_info import graph_nodes

#: The cast ops MXNet and mxfp16 insert.
CAST_OPS = ("amp_cast", "amp_multicast", "Cast", "cast")


def _output_dtype(dtypes, name):
    return dtypes.get(f"{name}_output") or dtypes.get(f"{name}_output0") or "unknown"


def precision_map(original, cast, data_names=("data",)):
    """The dtype each op of a cast graph runs in.

    Parameters
    ----------
    original : mx.sym.Symbol
        The float32 graph (to count only the casts the cast added).
    cast : mx.sym.Symbol
        The float16 graph, as ``cast_symbol(original, 'float16', emulate=False)`` gives it.
    data_names : sequence of str
        The data inputs (fed float32).

    Returns
    -------
    dict
        ``ops``: op type -> ``{'float16': n, 'float32': n}``; ``layers``: ``[{'name', 'op',
        'dtype'}]`` per op, casts excluded, in graph order; ``casts``: ``{'inserted', 'to_float16',
        'to_float32'}``; ``float16_ops`` / ``float32_ops``: totals.

    Examples
    --------
    >>> import mxnet as mx
    >>> from mxfp16 import cast_symbol
    >>> net = mx.sym.softmax(mx.sym.FullyConnected(mx.sym.var('data'), num_hidden=4, name='fc'))
    >>> report = precision_map(net, cast_symbol(net, 'float16', emulate=False))
    >>> report['ops']
    {'FullyConnected': {'float16': 1}, 'softmax': {'float32': 1}}
    >>> report['casts']
    {'inserted': 2, 'to_float16': 1, 'to_float32': 1}
    """
    dtypes = internal_dtypes(cast, data_names)
    nodes = [node for node in graph_nodes(cast) if node["op"] != "null"]
    layers = [{"name": node["name"], "op": node["op"], "dtype": _output_dtype(dtypes, node["name"])}
              for node in nodes if node["op"] not in CAST_OPS]
    ops = {}
    for layer in layers:
        ops.setdefault(layer["op"], Counter())[layer["dtype"]] += 1
    before = {node["name"] for node in graph_nodes(original)}
    added = [node for node in nodes if node["op"] in CAST_OPS and node["name"] not in before]
    targets = Counter(_output_dtype(dtypes, node["name"]) for node in added)
    totals = Counter(layer["dtype"] for layer in layers)
    return {"ops": {op: dict(sorted(count.items())) for op, count in ops.items()},
            "layers": layers,
            "casts": {"inserted": len(added), "to_float16": targets["float16"],
                      "to_float32": targets["float32"]},
            "float16_ops": totals["float16"], "float32_ops": totals["float32"]}
