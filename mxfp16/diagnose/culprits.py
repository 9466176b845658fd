"""Where an overflow starts: the culprits of a target run, told from what only inherits one.

An op output (forward) or a tapped gradient (backward) *overflows* when it holds inf or NaN in the
target run, which stores every float16 value as a GPU does (:mod:`mxfp16.diagnose.reading`): a
value beyond float16's range is inf there.  An overflow **starts** at an op when none
of the op's inputs overflows (an inserted node of the cast, a rounding or a cast, stands for the
op it rounds; one that overflows on a parameter names the parameter), and at a gradient when the
loss is finite and no tapped gradient downstream of it overflows.  A start is a **culprit**:

- forward: when the values that overflow because of it reach an output of the network, or the
  backward pass of an op reading them starts a gradient overflow (a BatchNorm whose input is inf
  computes NaN statistics: a ReLU after it gives 0, the forward looks fine, its backward is NaN,
  which may show first at the gradients of a kept op whose float32 output the BatchNorm read);
  the others are *contained*, inf by design (GluonNLP fills masked attention scores with -1e18,
  which a softmax turns into 0);
- backward: when the ops whose backward computes that gradient read no value that overflowed
  in the forward pass (else the forward overflow is the culprit).

Everything else that overflows is *propagated*, counted but not listed.
"""
import math
from collections import namedtuple

import mxnet as mx

from ..casting.graph import MARK
from .probes import TAP_SUFFIX

__all__ = ["Culprit", "Findings", "Underflow", "find_culprits", "underflow_rows", "wanted",
           "with_magnitudes"]

#: Where an overflow starts: the owning block's path, the op (node) name, ``'forward'`` or
#: ``'backward'``, float32's largest magnitude there (the same output, or gradient at the same
#: loss scale), the tensor (the op's output, or a parameter), what the target run holds there (inf,
#: or NaN) and the op's type (``'parameter'`` for a float16 parameter beyond 65504, ``'input'``
#: for a data input beyond it, which the cast rounds to float16 before the first op).
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
    """``{id(runner): _Graph}`` of a reading's runners, each built once per runner."""
    runners = [runner for runner, *_ in reading.forward + reading.backward] + \
        [runner for runner, _ in reading.parameters]
    graphs = {}
    for runner in runners:
        if id(runner) not in graphs:
            if getattr(runner, "analysis", None) is None:
                runner.analysis = _Graph(runner)
            graphs[id(runner)] = runner.analysis
    return graphs


def _bad(values):
    return not math.isfinite(values[0])


def _input_taint(graph, reading, call, entry, taint):
    """The starts (numbers) whose overflow reaches input ``entry`` of an op; ``{-1}`` for a data
    input holding inf or NaN (given so: not an overflow of this run)."""
    node = graph.view.nodes[entry[0]]
    while node["name"].endswith(TAP_SUFFIX):  # a tap passes its input through
        entry = node["inputs"][0]
        node = graph.view.nodes[entry[0]]
    if node["op"] == "null":
        values = reading.inputs.get((graph.runner, (call, node["name"])))
        return {-1} if values is not None and _bad(values) else set()
    return set(taint.get((id(graph.runner), call, entry[0], entry[1]), ()))


def _magnitude(values):
    """What the target run holds at an overflow, from its sum: inf, or NaN (NaN, or both inf and
    -inf)."""
    return math.inf if math.isinf(values[0]) else math.nan


def _start(graph, index, runner, call, node_id, out, values):
    """``(Culprit, place)`` of an overflow that starts at output ``out`` of ``node_id``; the
    place is where the float32 run's magnitude is read."""
    source = graph.source(node_id)
    op = graph.view.nodes[source]
    tensor = graph.view.outputs.get((source, out if source == node_id else 0), op["name"])
    kind = op["op"] if op["op"] != "null" else \
        "input" if op["name"] in runner.part.data_names else "parameter"
    culprit = Culprit("" if op["op"] == "null" else index.owner(op["name"]), op["name"],
                      "forward", math.nan, tensor, _magnitude(values), kind)
    place = ("parameter", runner.label, None, tensor) if kind == "parameter" else \
        ("input", runner.label, call, tensor) if kind == "input" else \
        ("forward", runner.label, call, tensor, _reader_paths(graph, index, source))
    return culprit, place


def _reader_paths(graph, index, node_id):
    """``(block path, op name)`` of the ops that read the output of ``node_id``, in graph
    order."""
    names = [graph.view.nodes[reader]["name"] for reader in sorted(graph.readers(node_id))]
    return tuple((index.owner(name), name) for name in names)


def _reaching_outputs(graphs, taint):
    """The starts whose overflow reaches an output of its graph (through overflowing values)."""
    reached = set()
    for (runner_id, _, node_id, out), starts in taint.items():
        if (node_id, out) in graphs[runner_id].outputs:
            reached |= starts
    return reached


def forward_pass(reading, index):
    """The :class:`ForwardPass` of a target run, its starts in execution order."""
    graphs = _graphs(reading)
    taint, starts, propagated = {}, [], 0
    for runner, (call, node_id, out), values in reading.forward:
        if not _bad(values):
            continue
        graph = graphs[id(runner)]
        inherited = set()
        for entry in graph.view.nodes[node_id]["inputs"]:
            inherited |= _input_taint(graph, reading, call, entry, taint)
        if -1 in inherited:  # an input given inf or NaN (by an earlier part): it alone is the cause
            inherited = {-1}
        if inherited:
            propagated += 1
        else:
            inherited = {len(starts)}
            starts.append(_start(graph, index, runner, call, node_id, out, values))
        taint[(id(runner), call, node_id, out)] = frozenset(inherited)
    return ForwardPass(starts, taint, _reaching_outputs(graphs, taint), propagated)


def _overflowing_gradients(reading, graphs):
    """``[(runner, node id, tensor, values, is parameter)]`` of every gradient that overflows,
    the last op's first (the backward's order); a part called several times counts once."""
    found = {}
    for runner, name, values in reading.backward:
        if _bad(values):
            found[(id(runner), name)] = (runner, graphs[id(runner)].node_of[name], name, values,
                                         False)
    for (runner, name), values in reading.parameters.items():
        if _bad(values):
            found[(id(runner), name)] = (runner, graphs[id(runner)].node_of[name], name, values,
                                         True)
    return sorted(found.values(), key=lambda item: (-item[1], item[4]))


def _forward_starts_read(graph, node_id, forward, observed):
    """The forward starts (numbers; -1 for an input given inf or NaN) whose overflow reaches a
    node whose backward computes the gradient of ``node_id``: the nodes reading its value and,
    past inserted nodes and ops whose output's gradient the run does not read (``observed``: the
    nodes whose gradient it does), the nodes reading theirs.  A kept op's float32 output is not
    read: the NaN that a float16 BatchNorm's backward computes from the kept convolution's output
    (inf once cast to float16) first shows in the convolution's parameter gradients."""
    nodes, todo = set(), list(graph.consumers[node_id])
    while todo:
        other = todo.pop()
        if other not in nodes:
            nodes.add(other)
            if graph.inserted(other) or other not in observed:
                todo.extend(graph.consumers[other])
    found = set()
    for (runner_id, _, other, _), starts in forward.taint.items():
        if runner_id == id(graph.runner) and other in nodes:
            found |= starts
    return found


def backward_pass(reading, index, forward):
    """``([(Culprit, place)], forward starts blamed, propagated count)`` of a target run's
    backward pass, the last op's first."""
    graphs = _graphs(reading)
    loss_bad = reading.loss is not None and not math.isfinite(reading.loss)
    found = _overflowing_gradients(reading, graphs)
    bad, observed = {}, {}
    for runner, node_id, _, _, is_param in found:
        if not is_param:
            bad[id(runner)] = bad.get(id(runner), 0) | (1 << node_id)
    for runner, name, _ in reading.backward:
        observed.setdefault(id(runner), set()).add(graphs[id(runner)].node_of[name])
    culprits, blamed, propagated = [], set(), 0
    for runner, node_id, tensor, values, is_param in found:
        graph = graphs[id(runner)]
        below = graph.reach[node_id] & ~(0 if is_param else 1 << node_id)
        read = _forward_starts_read(graph, node_id, forward, observed.get(id(runner), ()))
        if loss_bad or below & bad.get(id(runner), 0) or read:
            blamed |= read
            propagated += 1
            continue
        op = graph.view.nodes[graph.reader(node_id) if is_param else graph.source(node_id)]
        culprits.append((Culprit(index.owner(tensor if is_param else op["name"]), op["name"],
                                 "backward", math.nan, tensor, _magnitude(values), op["op"]),
                         ("backward", runner.label, None, tensor)))
    return culprits, blamed - {-1}, propagated


#: What a target run gave: the culprits and the contained starts, each ``(Culprit, place)`` with
#: float32's magnitude still to read at ``place`` (a forward start's place ends with the
#: ``(block path, op name)`` of the ops reading its value), and the propagated counts.
Findings = namedtuple("Findings", ["culprits", "contained", "propagated"])


def find_culprits(target, index):
    """The :class:`Findings` of a target run: the forward culprits in execution order then the
    backward ones, the contained forward starts, and ``{'forward': n, 'backward': m}``, the
    overflowing values that only inherit one."""
    forward = forward_pass(target, index)
    backward, blamed, backward_propagated = backward_pass(target, index, forward)
    chosen = forward.reached | blamed
    return Findings([c for i, c in enumerate(forward.starts) if i in chosen] + backward,
                    [c for i, c in enumerate(forward.starts) if i not in chosen],
                    {"forward": forward.propagated, "backward": backward_propagated})


def _where(place):
    return place[:4] if place[0] in ("forward", "input") else (place[0], place[1], place[3])


def wanted(findings):
    """The places whose float32 magnitude the float32 run reads."""
    return {_where(place) for _, place in findings.culprits + findings.contained
            if place[0] != "parameter"}


def with_magnitudes(findings, reference, runners):
    """``(culprits, contained)``: the findings with float32's largest magnitudes filled in, read
    from the float32 run (``runners``, its runners, hold the parameters' float32 values)."""
    found = {}
    for runner in runners:
        for _, place in findings.culprits + findings.contained:
            if place[0] == "parameter" and place[1] == runner.label:
                value = mx.nd.max(mx.nd.abs(runner.arrays[place[3]])).asscalar()
                found[_where(place)] = float(value)
    for runner, key, values in reference.forward:
        found[("forward", runner.label, key[0], runner.view.outputs[key[1:]])] = values[0]
    for (runner, (call, name)), values in reference.inputs.items():
        found[("input", runner.label, call, name)] = values[0]
    for runner, name, values in reference.backward:
        place = ("backward", runner.label, name)
        found[place] = max(found.get(place, values[0]), values[0])
    for (runner, name), values in reference.parameters.items():
        found[("backward", runner.label, name)] = values[0]

    def filled(pairs):
        return [culprit._replace(max_abs=float(found.get(_where(place), math.nan)))
                for culprit, place in pairs]
    return filled(findings.culprits), filled(findings.contained)


def underflow_rows(reference, index):
    """The :class:`Underflow` of every tapped gradient and float16 parameter of the float32 run
    (read with ``counts``), in graph order; a part called several times adds its calls up."""
    graphs, rows = _graphs(reference), {}
    records = [(runner, name, values, False) for runner, name, values in reference.backward] + \
        [(runner, name, values, True) for (runner, name), values in reference.parameters.items()]
    for runner, name, values, is_param in records:
        if is_param and runner.part.plan.get(name) != "float16":
            continue
        graph = graphs[id(runner)]
        node_id = graph.node_of[name]
        op = graph.view.nodes[graph.reader(node_id) if is_param else node_id]["name"]
        key = (graph.runner.label, node_id)
        counts = rows[key][5] + values[2:4] if key in rows else values[2:4]
        rows[key] = (id(runner), node_id, index.owner(name if is_param else op), op, name, counts)
    ordered = sorted(rows.values(), key=lambda row: row[:2])
    return [Underflow(path, op, tensor, int(counts.sum()), int(counts[0]),
                      float(counts[0] / counts.sum()) if counts.sum() else 0.0)
            for _, _, path, op, tensor, counts in ordered]
