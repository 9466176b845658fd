"""Where an overflow starts: the culprits of a target run, told from what only inherits one.

An op output (forward) or a tapped gradient (backward) *overflows* when it holds inf or NaN, or a
magnitude beyond 65504 where the target graph stores it in float16
(:func:`~mxfp16.diagnose.reading.overflows`; an emulated graph computes it in float32 first, so
the value a GPU would turn into inf is seen as it is).  An overflow **starts** at an op when none
of the op's inputs overflows (an inserted node of the cast, a rounding or a cast, stands for the
op it rounds; one that overflows on a parameter names the parameter), and at a gradient when the
loss is finite and no tapped gradient downstream of it overflows.  A start is a **culprit**:

- forward: when the values that overflow because of it reach an output of the network, or the
  backward pass of an op reading them starts a gradient overflow (a BatchNorm whose input is inf
  computes NaN statistics: a ReLU after it gives 0, the forward looks fine, its backward is NaN);
  the others are *contained*, inf by design (GluonNLP fills masked attention scores with -1e18,
  which a softmax turns into 0);
- backward: when the ops whose backward computes that gradient read no value that overflowed
  in the forward pass (else the forward overflow is the culprit).

Everything else that overflows is *propagated*, counted but not listed.
"""
import math
from collections import namedtuple

from ..casting.graph import MARK
from .probes import TAP_SUFFIX
from .reading import overflows

__all__ = ["Culprit", "Underflow", "find_culprits", "underflow_rows"]

#: Where an overflow starts: the owning block's path, the op (node) name, ``'forward'`` or
#: ``'backward'``, float32's largest magnitude there (the same output, or gradient at the same
#: loss scale), the tensor (the op's output, or a parameter), the target run's largest magnitude
#: there (inf, NaN or beyond 65504; an emulated value before its float16 rounding) and the op's
#: type.
Culprit = namedtuple("Culprit", ["path", "op", "phase", "max_abs", "tensor", "value", "op_type"])

#: The gradient values of one output (or float16 parameter) that float16 flushes to zero: its
#: owning block's path, the op, the tensor, the nonzero values of float32's gradient (at the loss
#: scale), how many of those are at most 2**-25 (float16 rounds them to 0), and their share.
Underflow = namedtuple("Underflow", ["path", "op", "tensor", "values", "flushed", "fraction"])

#: What the forward pass gave: every start (a :class:`Culprit` each), the starts each overflowing
#: output inherits (``{(runner id, call, node, output): frozenset of start numbers}``), the starts
#: that reach an output of the network, and how many overflowing outputs only inherit one.
ForwardPass = namedtuple("ForwardPass", ["starts", "taint", "reached", "propagated"])


class _Graph:
    """A runner's graph with what the analysis asks of it: the node of each output name, each
    node's downstream nodes (as a bitset), its outputs (taps passed through) and the first op
    reading each variable."""

    def __init__(self, runner):
        self.runner = runner
        self.view = view = runner.view
        self.outputs = set()
        for node_id, out in view.heads:
            while view.nodes[node_id]["name"].endswith(TAP_SUFFIX):
                node_id, out = view.nodes[node_id]["inputs"][0][:2]
            self.outputs.add((node_id, out))
        self.node_of = {name: entry[0] for entry, name in view.outputs.items()}
        self.consumers = [[] for _ in view.nodes]
        for node_id, node in enumerate(view.nodes):
            for entry in node["inputs"]:
                self.consumers[entry[0]].append(node_id)
        self.reach = [1 << i for i in range(len(view.nodes))]
        for node_id in reversed(range(len(view.nodes))):
            for entry in view.nodes[node_id]["inputs"]:
                self.reach[entry[0]] |= self.reach[node_id]

    def inserted(self, node_id):
        """Whether a node is the cast's (a rounding, a cast) or the locator's (a tap)."""
        node = self.view.nodes[node_id]
        return bool(node.get("attrs", {}).get(MARK)) or node["name"].endswith(TAP_SUFFIX)

    def readers(self, node_id):
        """The ops (not inserted nodes) that read the value of ``node_id``, through inserted
        nodes: those whose backward computes its gradient."""
        found, todo = set(), list(self.consumers[node_id])
        while todo:
            other = todo.pop()
            if self.inserted(other):
                todo.extend(self.consumers[other])
            else:
                found.add(other)
        return found

    def source(self, node_id):
        """The op an inserted node stands for (following first inputs), or a variable."""
        while self.inserted(node_id) and self.view.nodes[node_id]["inputs"]:
            node_id = self.view.nodes[node_id]["inputs"][0][0]
        return node_id

    def reader(self, node_id):
        """The first op (not an inserted node) that reads the value of ``node_id``."""
        return min(self.readers(node_id), default=node_id)


def _graphs(reading):
    graphs = {}
    for runner, *_ in reading.forward + reading.backward:
        if id(runner) not in graphs:
            graphs[id(runner)] = _Graph(runner)
    for runner, _ in reading.parameters:
        graphs.setdefault(id(runner), _Graph(runner))
    return graphs


def _by_label(reading, table):
    """``{(runner label, name): values}`` of a run's forward or backward records (largest over
    the calls of a part), for looking up the other run's value at the same place."""
    found = {}
    for runner, key, values in getattr(reading, table):
        name = runner.view.outputs[key[1:]] if table == "forward" else key
        where = (runner.label, key[0] if table == "forward" else None, name)
        found[where] = values if where not in found else _merge(found[where], values)
    return found


def _merge(old, new):
    merged = old + new
    merged[0] = max(old[0], new[0]) if not (math.isnan(old[0]) or math.isnan(new[0])) else math.nan
    return merged


def _input_taint(graph, reading, call, entry, taint):
    """The origins (indices) whose overflow reaches input ``entry`` of an op; ``{-1}`` for a data
    input holding inf or NaN (given so: not an overflow of this run)."""
    node = graph.view.nodes[entry[0]]
    while node["name"].endswith(TAP_SUFFIX):  # a tap passes its input through
        entry = node["inputs"][0]
        node = graph.view.nodes[entry[0]]
    if node["op"] == "null":
        values = reading.inputs.get((graph.runner, (call, node["name"])))
        return {-1} if values is not None and not math.isfinite(values[0]) else set()
    return set(taint.get((id(graph.runner), call, entry[0], entry[1]), ()))


def _ref_value(ref, label, call, name):
    values = ref.get((label, call, name))
    return float(values[0]) if values is not None else math.nan


def _origin(graph, index, ref, runner, call, node_id, out, value):
    """The :class:`Culprit` of an overflow that starts at output ``out`` of ``node_id``."""
    source = graph.source(node_id)
    op = graph.view.nodes[source]
    tensor = graph.view.outputs.get((source, out if source == node_id else 0), op["name"])
    return Culprit("" if op["op"] == "null" else index.owner(op["name"]), op["name"], "forward",
                   _ref_value(ref, runner.label, call, tensor), tensor, value,
                   "parameter" if op["op"] == "null" else op["op"])


def _reaching_outputs(graphs, taint):
    """The starts whose overflow reaches an output of its graph (through overflowing values)."""
    reached = set()
    for (runner_id, _, node_id, out), starts in taint.items():
        if (node_id, out) in graphs[runner_id].outputs:
            reached |= starts
    return reached


def forward_pass(reading, reference, index):
    """The :class:`ForwardPass` of a target run, its starts in execution order."""
    graphs, ref = _graphs(reading), _by_label(reference, "forward")
    taint, starts, propagated = {}, [], 0
    for runner, (call, node_id, out), values in reading.forward:
        graph = graphs[id(runner)]
        name = graph.view.outputs[(node_id, out)]
        if not overflows(values[0], runner.part.plan.get(name, "float32")):
            continue
        inherited = set()
        for entry in graph.view.nodes[node_id]["inputs"]:
            inherited |= _input_taint(graph, reading, call, entry, taint)
        if inherited:
            propagated += 1
        else:
            inherited = {len(starts)}
            starts.append(_origin(graph, index, ref, runner, call, node_id, out,
                                  float(values[0])))
        taint[(id(runner), call, node_id, out)] = frozenset(inherited)
    return ForwardPass(starts, taint, _reaching_outputs(graphs, taint), propagated)


def _gradients(reading):
    """``[(runner, name, values)]`` of the tapped gradients, largest over calls, first-seen
    order."""
    merged = {}
    for runner, name, values in reading.backward:
        key = (id(runner), name)
        merged[key] = (runner, name, values if key not in merged else
                       _merge(merged[key][2], values))
    return list(merged.values())


def _overflowing_gradients(reading, graphs):
    """``[(runner, node id, tensor, values, is parameter)]`` of every gradient that overflows,
    the last op's first (the backward's order)."""
    found = []
    for runner, name, values in _gradients(reading):
        if overflows(values[0], runner.part.plan.get(name, "float32")):
            found.append((runner, graphs[id(runner)].node_of[name], name, values, False))
    for (runner, name), values in reading.parameters.items():
        if overflows(values[0], runner.part.plan.get(name, "float32")):
            found.append((runner, graphs[id(runner)].node_of[name], name, values, True))
    return sorted(found, key=lambda item: (-item[1], item[4]))


def _forward_starts_read(graph, node_id, forward):
    """The forward starts (numbers; -1 for an input given inf or NaN) whose overflow reaches a
    value the ops reading ``node_id`` compute: their backward computes its gradient."""
    readers = graph.readers(node_id)
    found = set()
    for (runner_id, _, other, _), starts in forward.taint.items():
        if runner_id == id(graph.runner) and other in readers:
            found |= starts
    return found


def backward_pass(reading, reference, index, forward):
    """``(culprits, forward starts blamed, propagated count)`` of a target run's backward pass,
    the last op's first."""
    graphs, ref = _graphs(reading), _by_label(reference, "backward")
    ref_params = {(runner.label, name): values for (runner, name), values in
                  reference.parameters.items()}
    loss_bad = reading.loss is not None and not math.isfinite(reading.loss)
    found = _overflowing_gradients(reading, graphs)
    bad = {}
    for runner, node_id, _, _, is_param in found:
        if not is_param:
            bad[id(runner)] = bad.get(id(runner), 0) | (1 << node_id)
    culprits, blamed, propagated = [], set(), 0
    for runner, node_id, tensor, values, is_param in found:
        graph = graphs[id(runner)]
        below = graph.reach[node_id] & ~(0 if is_param else 1 << node_id)
        read = _forward_starts_read(graph, node_id, forward)
        if loss_bad or below & bad.get(id(runner), 0) or read:
            blamed |= read
            propagated += 1
            continue
        op = graph.view.nodes[graph.reader(node_id) if is_param else graph.source(node_id)]
        ref_values = ref_params.get((runner.label, tensor)) if is_param else \
            ref.get((runner.label, None, tensor))
        culprits.append(Culprit(index.owner(tensor if is_param else op["name"]), op["name"],
                                "backward", float(ref_values[0]) if ref_values is not None
                                else math.nan, tensor, float(values[0]), op["op"]))
    return culprits, blamed - {-1}, propagated


def find_culprits(target, reference, index):
    """``(culprits, contained, propagated)`` of a target run against the float32 run: the forward
    culprits in execution order then the backward ones, the contained forward starts, and
    ``{'forward': n, 'backward': m}``, the overflowing values that only inherit one."""
    forward = forward_pass(target, reference, index)
    backward, blamed, backward_propagated = backward_pass(target, reference, index, forward)
    chosen = forward.reached | blamed
    return ([c for i, c in enumerate(forward.starts) if i in chosen] + backward,
            [c for i, c in enumerate(forward.starts) if i not in chosen],
            {"forward": forward.propagated, "backward": backward_propagated})


def underflow_rows(reference, index):
    """The :class:`Underflow` of every tapped gradient and float16 parameter of the float32 run,
    in graph order."""
    graphs = _graphs(reference)
    rows = []
    for runner, name, values in _gradients(reference):
        graph = graphs[id(runner)]
        op = graph.view.nodes[graph.node_of[name]]["name"]
        rows.append((id(runner), graph.node_of[name], index.owner(op), op, name, values))
    for (runner, name), values in reference.parameters.items():
        if runner.part.plan.get(name) != "float16":
            continue
        graph = graphs[id(runner)]
        var = next(i for i, node in enumerate(graph.view.nodes) if node["name"] == name)
        op = graph.view.nodes[graph.reader(var)]["name"]
        rows.append((id(runner), var, index.owner(name), op, name, values))
    rows.sort(key=lambda row: row[:2])
    return [Underflow(path, op, tensor, int(values[1]), int(values[2]),
                      values[2] / values[1] if values[1] else 0.0)
            for _, _, path, op, tensor, values in rows]
