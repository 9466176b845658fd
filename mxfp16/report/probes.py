"""Gradient probes: read the gradient of the loss with respect to internal outputs of a graph.

MXNet 1.9 gives gradients of arguments only.  A probe turns an internal output ``x`` into
``x + p``, with ``p`` a new input fed zeros: the forward values do not change (``x + 0 == x``), and the
gradient of ``p`` is exactly the gradient of the loss with respect to ``x`` (all of ``x``'s consumers
summed), which :func:`mxnet.autograd` returns when ``p`` has ``attach_grad()``.

Where the probes sit, in a float16-emulated graph (:mod:`mxfp16.casting.emulation`): one on every op output
that the GPU graph keeps in float16, before it fans out to its consumers.  When the only consumer is
the emulation's float16 rounding (a GEMM's output, or an input read only by a GEMM), the probe sits
after the rounding, so its gradient is the float32 value *before* the backward rounding to float16:
the value the GPU would have to store in float16, which shows whether it underflows.  Gradients coming
from GEMM branches have already been rounded, as on a GPU.
"""
import json
from collections import defaultdict

import mxnet as mx

from ..casting.fastround import ROUND_OP
from ..casting.graph import MARK, node_dtype

#: Suffix of the probe inputs' names.
PROBE_SUFFIX = "_grad_probe"


def _output_name(node, index, dtypes):
    """The name MXNet gives output ``index`` of ``node`` if the dtype map knows it, else None."""
    names = (f"{node['name']}_output", f"{node['name']}_output0") if index == 0 else \
        (f"{node['name']}_output{index}",)
    return next((name for name in names if name in dtypes), None)


def _consumers(graph):
    """(node id, output index) -> ids of the nodes that read it (-1 for a graph output)."""
    users = defaultdict(list)
    for node_id, node in enumerate(graph["nodes"]):
        for entry in node["inputs"]:
            users[(entry[0], entry[1])].append(node_id)
    for head in graph["heads"]:
        users[(head[0], head[1])].append(-1)
    return users


def _inserted_cast(nodes, node_id, dtype):
    """Whether node ``node_id`` is a cast to ``dtype`` that an mxfp16 rewrite inserted."""
    node = nodes[node_id] if node_id >= 0 else {"op": "output"}
    return bool(node.get("attrs", {}).get(MARK)) and node_dtype(node) == dtype


def _after_rounding(nodes, users, entry):
    """The end of the emulation's float16 rounding if it is ``entry``'s only consumer, else entry."""
    first = users[entry]
    if len(first) == 1 and first[0] >= 0 and nodes[first[0]]["op"] == ROUND_OP \
            and nodes[first[0]].get("attrs", {}).get(MARK):
        return (first[0], 0)  # the fused rounding op
    if len(first) != 1 or not _inserted_cast(nodes, first[0], "float16"):
        return entry
    second = users[(first[0], 0)]
    if len(second) == 1 and _inserted_cast(nodes, second[0], "float32"):
        return (second[0], 0)
    return entry


def _probe_targets(graph, dtypes):
    """Entry to probe -> the original output it stands for, for every float16 op output."""
    nodes, users = graph["nodes"], _consumers(graph)
    targets = {}
    for (node_id, index) in list(users):
        node = nodes[node_id]
        if node["op"] == "null" or node.get("attrs", {}).get(MARK):
            continue
        name = _output_name(node, index, dtypes)
        if name and dtypes[name] == "float16":
            targets[_after_rounding(nodes, users, (node_id, index))] = name
    return targets


def add_gradient_probes(sym, dtypes):
    """Insert a probe after every float16 output of an emulated graph.

    Parameters
    ----------
    sym : mx.sym.Symbol
        A graph, usually float16-emulated (its original op names kept).
    dtypes : dict of str to str
        Output name -> dtype in the GPU graph (:func:`mxfp16.casting.graph.internal_dtypes` of
        ``cast_symbol(..., emulate=False)``); outputs that are float16 there get a probe.

    Returns
    -------
    (mx.sym.Symbol, list of str, list of str)
        The graph with probes, the probe input names and the output each probe stands for.

    Examples
    --------
    >>> import mxnet as mx
    >>> fc = mx.sym.FullyConnected(mx.sym.var('data'), num_hidden=2, name='fc')
    >>> net = mx.sym.relu(fc, name='r')
    >>> probed, probes, outputs = add_gradient_probes(net, {'fc_output': 'float16'})
    >>> probes, outputs, sorted(probed.list_arguments())
    (['fc_output_grad_probe'], ['fc_output'], ['data', 'fc_bias', 'fc_output_grad_probe', 'fc_weight'])
    """
    graph = json.loads(sym.tojson(remove_amp_cast=False))
    targets = _probe_targets(graph, dtypes)
    new_nodes, new_id, redirect = [], {}, {}

    def entry(old):
        return redirect.get((old[0], old[1])) or [new_id[old[0]], old[1], 0]

    for node_id, node in enumerate(graph["nodes"]):
        new_nodes.append(dict(node, inputs=[entry(e) for e in node["inputs"]]))
        new_id[node_id] = len(new_nodes) - 1
        for index in sorted(i for (n, i) in targets if n == node_id):
            probe = targets[(node_id, index)] + PROBE_SUFFIX
            new_nodes.append({"op": "null", "name": probe, "inputs": []})
            new_nodes.append({"op": "elemwise_add", "name": f"{probe}_add",
                              "inputs": [[new_id[node_id], index, 0], [len(new_nodes) - 1, 0, 0]]})
            redirect[(node_id, index)] = [len(new_nodes) - 1, 0, 0]
    graph = dict(graph, nodes=new_nodes, heads=[entry(h) for h in graph["heads"]],
                 arg_nodes=[i for i, n in enumerate(new_nodes) if n["op"] == "null"])
    graph.pop("node_row_ptr", None)
    order = sorted(targets, key=lambda key: (new_id[key[0]], key[1]))
    outputs = [targets[key] for key in order]
    return mx.sym.load_json(json.dumps(graph)), [o + PROBE_SUFFIX for o in outputs], outputs
