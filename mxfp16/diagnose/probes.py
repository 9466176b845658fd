"""Gradient probes and taps: read the gradient of the loss with respect to internal outputs of a graph.

MXNet 1.9 gives gradients of arguments only.  A probe turns an internal output ``x`` into
``x + p``, with ``p`` a new input fed zeros: the forward values do not change (``x + 0 == x``), and the
gradient of ``p`` is exactly the gradient of the loss with respect to ``x`` (all of ``x``'s consumers
summed), which :func:`mxnet.autograd` returns when ``p`` has ``attach_grad()`` (the report's
histograms, :mod:`mxfp16.report.underflow`).  A tap turns ``x`` into ``identity(x)``: the
backward node of the identity (``<tap>_backward``) outputs that same gradient, which an op hook
(``register_op_hook``) reads as the backward runs, with no input and no gradient array to keep
(the locator, :mod:`mxfp16.diagnose.capture`).

Where the probes and taps sit, in a float16-emulated graph (:mod:`mxfp16.casting.emulation`): one
on every op output that the GPU graph keeps in float16 (or bfloat16), before it fans out to its
consumers.  When the only consumer is the emulation's float16 rounding (a GEMM's output, or an input
read only by a GEMM), the probe sits after the rounding, so its gradient is the float32 value
*before* the backward rounding to float16: the value the GPU would have to store in float16, which
shows whether it underflows or overflows.  Gradients coming from GEMM branches have already been
rounded, as on a GPU.
"""
import json
from collections import defaultdict

import mxnet as mx

from ..casting import fastround
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


#: The names ``internal_dtypes`` gives the dtypes whose values a probe watches: float16, and
#: bfloat16 (which numpy names ``'void16'``).
LOW_PRECISION_NAMES = ("float16", "void16", "bfloat16")


def _probe_targets(graph, dtypes, after_rounding=True):
    """Entry to probe -> the original output it stands for, for every float16 (or bfloat16) op
    output (after the emulation's rounding where that is its only reader, or at the output
    itself)."""
    nodes, users = graph["nodes"], _consumers(graph)
    targets = {}
    for (node_id, index) in list(users):
        node = nodes[node_id]
        if node["op"] == "null" or node.get("attrs", {}).get(MARK):
            continue
        name = _output_name(node, index, dtypes)
        if name and dtypes[name] in LOW_PRECISION_NAMES:
            entry = (node_id, index)
            targets[_after_rounding(nodes, users, entry) if after_rounding else entry] = name
    return targets


def _insert_after(graph, targets, make):
    """``graph`` with ``make(name, entry)`` -> (new nodes, index of the one standing for the
    entry) inserted after each entry of ``targets`` (``{(node, index): name}``), its consumers
    reading that node instead; returns ``(symbol, names in graph order)``."""
    new_nodes, new_id, redirect = [], {}, {}

    def entry(old):
        return redirect.get((old[0], old[1])) or [new_id[old[0]], old[1], 0]

    for node_id, node in enumerate(graph["nodes"]):
        new_nodes.append(dict(node, inputs=[entry(e) for e in node["inputs"]]))
        new_id[node_id] = len(new_nodes) - 1
        for index in sorted(i for (n, i) in targets if n == node_id):
            added, last = make(targets[(node_id, index)], [new_id[node_id], index, 0],
                               len(new_nodes))
            new_nodes.extend(added)
            redirect[(node_id, index)] = [last, 0, 0]
    graph = dict(graph, nodes=new_nodes, heads=[entry(h) for h in graph["heads"]],
                 arg_nodes=[i for i, n in enumerate(new_nodes) if n["op"] == "null"])
    graph.pop("node_row_ptr", None)
    order = sorted(targets, key=lambda key: (new_id[key[0]], key[1]))
    return mx.sym.load_json(json.dumps(graph)), [targets[key] for key in order]


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
    def probe(name, entry, next_id):
        return [{"op": "null", "name": name + PROBE_SUFFIX, "inputs": []},
                {"op": "elemwise_add", "name": f"{name}{PROBE_SUFFIX}_add",
                 "inputs": [entry, [next_id, 0, 0]]}], next_id + 1

    graph = json.loads(sym.tojson(remove_amp_cast=False))
    probed, outputs = _insert_after(graph, _probe_targets(graph, dtypes), probe)
    return probed, [o + PROBE_SUFFIX for o in outputs], outputs


#: Suffix of the taps' node names: the hook reads a tap's gradient as ``<output><TAP_SUFFIX>_backward_0``.
TAP_SUFFIX = "_grad_tap"


def add_gradient_taps(sym, dtypes, after_rounding=True):
    """Insert a tap (an ``identity`` op) after every float16 (or bfloat16) output of a graph, at
    the places :func:`add_gradient_probes` puts its probes, or (``after_rounding=False``) right at
    the output, before the rounding that reads it: its gradient then is the one rounded to
    float16, as a GPU stores it.

    Parameters
    ----------
    sym : mx.sym.Symbol
        A graph: float32, emulated, or cast (its original op names kept).
    dtypes : dict of str to str
        Output name -> dtype in the cast graph; outputs that are float16 or bfloat16 there get a
        tap (so a float32 graph given the dtypes of its cast takes its taps at the same outputs).

    Returns
    -------
    (mx.sym.Symbol, list of str)
        The graph with taps and the outputs tapped, in graph order: the backward node of the tap
        of output ``name`` is ``name + TAP_SUFFIX + '_backward'``, its output the gradient.

    Examples
    --------
    >>> import mxnet as mx
    >>> fc = mx.sym.FullyConnected(mx.sym.var('data'), num_hidden=2, name='fc')
    >>> tapped, outputs = add_gradient_taps(mx.sym.relu(fc, name='r'), {'fc_output': 'float16'})
    >>> outputs, tapped.get_internals().list_outputs()[-2:], tapped.list_arguments()
    (['fc_output'], ['fc_output_grad_tap_output', 'r_output'], ['data', 'fc_weight', 'fc_bias'])
    """
    def tap(name, entry, next_id):
        return [{"op": "_copy", "name": name + TAP_SUFFIX, "inputs": [entry]}], next_id

    graph = json.loads(sym.tojson(remove_amp_cast=False))
    return _insert_after(graph, _probe_targets(graph, dtypes, after_rounding), tap)


def round_float16_outputs(sym, dtypes):
    """An emulated graph with every output the GPU graph stores in float16 rounded to float16
    before anything reads it, as a GPU stores it; the emulation itself rounds only where a GEMM
    reads or writes (:mod:`mxfp16.casting.emulation`), so that an elementwise op's overflow there
    (a mask filled with ``-1e18``, a product beyond 65504) stays finite, where a GPU's is inf.

    Outputs already read through a rounding alone are left as they are; the roundings inserted
    are marked as mxfp16's (``MARK``), so they stand for the op they round.

    Examples
    --------
    >>> import mxnet as mx
    >>> scaled = mx.sym.relu(mx.sym.var('data') * 1e5, name='r')
    >>> rounded = round_float16_outputs(scaled, {'r_output': 'float16'})
    >>> rounded.eval(data=mx.nd.ones(1))[0].asnumpy().tolist()
    [inf]
    """
    graph = json.loads(sym.tojson(remove_amp_cast=False))
    nodes = graph["nodes"]
    targets = {entry: name for entry, name in _probe_targets(graph, dtypes).items()
               if not nodes[entry[0]].get("attrs", {}).get(MARK)
               and dtypes[name] == "float16"}
    fused = fastround.wanted() and fastround.load()

    def rounding(name, entry, next_id):
        if fused:
            return [{"op": ROUND_OP, "name": f"{name}_strict_round", "inputs": [entry],
                     "attrs": {MARK: "round_float16"}}], next_id
        half = {"op": "Cast", "name": f"{name}_strict_half", "inputs": [entry],
                "attrs": {"dtype": "float16", MARK: "cast_float16"}}
        back = {"op": "Cast", "name": f"{name}_strict_round", "inputs": [[next_id, 0, 0]],
                "attrs": {"dtype": "float32", MARK: "round_float16"}}
        return [half, back], next_id + 1
    return _insert_after(graph, targets, rounding)[0]


def rounding_points(sym, dtypes):
    """``{rounding node name: output name}`` of the float16 outputs of an emulated graph that
    every reader reads through one rounding (all of them after :func:`round_float16_outputs`):
    the backward node of that rounding (``<name>_backward``) outputs the output's gradient
    rounded to float16, as a GPU stores it, so no tap is needed there.

    Examples
    --------
    >>> import mxnet as mx
    >>> scaled = mx.sym.relu(mx.sym.var('data') * 1e5, name='r')
    >>> rounded = round_float16_outputs(scaled, {'r_output': 'float16'})
    >>> rounding_points(rounded, {'r_output': 'float16'})
    {'r_output_strict_round': 'r_output'}
    """
    graph = json.loads(sym.tojson(remove_amp_cast=False))
    nodes = graph["nodes"]
    return {nodes[entry[0]]["name"]: name for entry, name in _probe_targets(graph, dtypes).items()
            if nodes[entry[0]].get("attrs", {}).get(MARK)}
