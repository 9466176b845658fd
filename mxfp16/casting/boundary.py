"""Where the float16 GPU graph's float32 boundary sits: values read only for their shape, and
layout ops before the float32 tail.

Two rules keep casts out of detection graphs without changing a value:

- an op whose value is read only for its shape (``x * 0`` in GluonCV's
  ``slice_like(anchors, x * 0)``, SSD's anchor generator and YOLOv3's offsets) runs in its input's
  dtype: the feature map it reads needs neither float32 nor a cast;
- a layout op (transpose, flatten, reshape, concat) of the float32 tail whose float16 inputs are
  read by it alone runs in float16, so the cast to float32 moves after it: SSD's ten class and box
  predictions are cast once each after their concat, not one by one.  Layout ops are exact in any
  dtype, and so are casts of float16 values to float32, so the values are those of a cast before.

Examples
--------
>>> import mxnet as mx
>>> from mxfp16.casting.graph import GraphRewriter
>>> x = mx.sym.relu(mx.sym.var('data'), name='feature')
>>> anchors = mx.sym.slice_like(mx.sym.var('anchors'), x * 0, axes=(2, 3), name='anchor')
>>> rw = GraphRewriter(mx.sym.Group([x, anchors]))
>>> [rw.old_nodes[i]['op'] for i in Boundary(rw).shape_only]
['_mul_scalar']
"""
from .graph import MARK, node_dtype
from .rules import INDEX_INPUTS, LAYOUT_OPS, SHAPE_INPUTS


def _source(rw, entry):
    """The old entry ``(node id, output)`` an entry stands for, through the casts an earlier cast
    inserted (dropped when the graph is rewritten)."""
    while rw.old_nodes[entry[0]].get("attrs", {}).get(MARK) and rw.drop_inserted:
        entry = rw.old_nodes[entry[0]]["inputs"][0]
    return (entry[0], entry[1])


def readers(rw):
    """``{old entry (node id, output): [(reader old id or None for an output, position)]}``."""
    reads = {}
    for old_id, node in enumerate(rw.old_nodes):
        if not node.get("attrs", {}).get(MARK):
            for position, entry in enumerate(node["inputs"]):
                reads.setdefault(_source(rw, entry), []).append((old_id, position))
    for head in rw.old_heads:
        reads.setdefault(_source(rw, head), []).append((None, 0))
    return reads


def by_node(reads):
    """``{old node id: [(reader, position)]}`` over all the node's outputs, from :func:`readers`."""
    found = {}
    for (old_id, _), entry_reads in reads.items():
        found.setdefault(old_id, []).extend(entry_reads)
    return found


def shape_only_ops(rw, node_reads):
    """Old ids of the ops whose value is read only for its shape, directly or through other such
    ops (``x * 0`` in GluonCV's ``slice_like(anchors, x * 0)``): they run in their input's dtype,
    so the feature map they read needs no cast and no float32."""
    found = set()
    for old_id in reversed(range(len(rw.old_nodes))):
        node = rw.old_nodes[old_id]
        if node["op"] == "null" or not node["inputs"] or node_dtype(node) or old_id not in node_reads:
            continue
        if all(reader is not None and (reader in found or position in SHAPE_INPUTS.get(
                rw.old_nodes[reader]["op"], ())) for reader, position in node_reads[old_id]):
            found.add(old_id)
    return found


def gathering_ops(rw, node_reads):
    """Old ids of the layout ops that gather float16 values before one cast: a concat (or stack)
    of several inputs, and a layout op whose one reader is such an op (SSD's transposed and
    flattened predictions).  A layout chain that gathers nothing (CenterNet's decoder reshapes
    its predictions for gather_nd) gains no cast by staying float16, and does not."""
    found = set()
    for old_id in reversed(range(len(rw.old_nodes))):
        node = rw.old_nodes[old_id]
        reads = node_reads.get(old_id, ())
        if node["op"] in LAYOUT_OPS and not node_dtype(node) and (
                len(node["inputs"]) > 1 or (len(reads) == 1 and reads[0][0] in found)):
            found.add(old_id)
    return found


class Boundary:
    """The readers of a graph's values (``rw``, a GraphRewriter), what is read only for its
    shape (``shape_only``), and :meth:`stays_float16` for the layout ops of the tail."""

    def __init__(self, rw):
        self.rw = rw
        self.reads = readers(rw)
        self.node_reads = by_node(self.reads)
        self.shape_only = shape_only_ops(rw, self.node_reads)
        self.gathering = gathering_ops(rw, self.node_reads)

    def stays_float16(self, old_id, node, kind):
        """Whether a gathering layout op of the float32 tail runs in float16, moving the float32
        cast after it: see :func:`stays_float16`.  ``kind`` maps the new graph's node ids to the
        dtype they run in."""
        return old_id in self.gathering and stays_float16(
            self.rw, self.reads, self.node_reads, old_id, node, kind)


def stays_float16(rw, reads, node_reads, old_id, node, kind):
    """Whether a layout op of the float32 tail (transpose, flatten, concat of SSD's predictions)
    can run in float16, the float32 cast after it: its inputs are float16 and read by it alone
    (so no cast of them is saved for another reader), and nothing reads it as indices.  The
    values are those of a cast before it; the casts are fewer or as many."""
    if node["op"] not in LAYOUT_OPS or node_dtype(node):
        return False
    entries = [rw.input_entry(e) for e in node["inputs"]]
    if not entries or any(kind.get(e[0]) != "float16" for e in entries):
        return False
    if any(len(reads.get(_source(rw, e), ())) != 1 for e in node["inputs"]):
        return False
    return not any(reader is not None and position in INDEX_INPUTS.get(
        rw.old_nodes[reader]["op"], ()) for reader, position in node_reads.get(old_id, ()))
