"""``keep_float32``: the ops of a graph that stay float32 whatever the cast, from selectors.

:func:`mxfp16.cast_block` resolves its selectors against the network's blocks
(:mod:`~mxfp16.casting.selectors`): a selected block and every block inside it are *kept*, and an
op of a traced graph is kept when the block it belongs to (:meth:`BlockIndex.owner
<mxfp16.casting.selectors.BlockIndex.owner>`, the innermost Gluon prefix starting its name) is
kept.  A graph without its blocks (a Symbol given to :func:`mxfp16.cast_symbol`, a
``SymbolBlock``) is selected by names instead: a string is a glob matched against each op's name
and the names its Gluon prefixes give it (``'resnetv10_stage1_conv0'`` selects
``'resnetv10_stage1_conv0_fwd'``: every part of the name that ends before a ``'_'``), and a Block
(of the network the graph was traced from) selects the ops its prefixes, and those of the blocks
inside it, start.

The graph passes ask a :class:`Keep` of each op name; names derived from a kept op's (the padded
convolution of a bfloat16 graph, ``<name>_padded``) are kept with it.
"""
import fnmatch
import inspect

from mxnet import gluon

from .. import mxnet_internals
from .graph import MARK
from .selectors import BlockIndex, describe_selector, nearest, select_blocks

__all__ = ["Keep", "block_keep", "graph_keep", "kept_ops", "op_keep"]


class Keep:
    """What ``keep_float32`` keeps: ``keep(op_name, op_type) -> bool``, and ``paths``, the
    block paths kept (every selected block and the blocks inside it; empty for a graph selected
    by names).  ``a | b`` keeps what either keeps."""

    def __init__(self, is_kept, paths=()):
        self._is_kept = is_kept
        self.paths = tuple(paths)

    def __call__(self, name, op=None):
        return self._is_kept(name, op)

    def __or__(self, other):
        return Keep(lambda name, op: self(name, op) or other(name, op),
                    self.paths + tuple(p for p in other.paths if p not in self.paths))


def op_keep(ops):
    """The :class:`Keep` of every op whose type is one of ``ops`` (MXNet AMP's ``fp32_ops``).

    Examples
    --------
    >>> op_keep(['FullyConnected'])('net0_dense0_fwd', 'FullyConnected')
    True
    """
    ops = frozenset(ops)
    return Keep(lambda name, op: op in ops)


def _ops(sym):
    """``(name, op type)`` of the ops of ``sym``, in graph order, without mxfp16's inserted
    nodes."""
    return [(node["name"], node["op"]) for node in mxnet_internals.graph_json(sym)["nodes"]
            if node["op"] != "null" and not node.get("attrs", {}).get(MARK)]


def kept_ops(sym, keep):
    """The names of the ops of ``sym`` (not variables, not mxfp16's inserted casts) that ``keep``
    keeps, in graph order; ``[]`` for ``keep=None``.

    Examples
    --------
    >>> import mxnet as mx
    >>> fc = mx.sym.FullyConnected(mx.sym.var('data'), num_hidden=2, name='head_fc')
    >>> kept_ops(mx.sym.relu(fc, name='relu'), graph_keep(fc, ['head']))
    ['head_fc']
    """
    if keep is None:
        return []
    return [name for name, op in _ops(sym) if keep(name, op)]


def _top_paths(paths):
    """The paths of ``paths`` that no other one of them contains."""
    return [p for p in paths if not any(p.startswith(q + ".") for q in paths)]


def block_keep(block, selectors):
    """The :class:`Keep` of ``selectors`` (see :func:`~mxfp16.casting.selectors.select_blocks`)
    on a network with its blocks (or its :class:`~mxfp16.casting.selectors.BlockIndex`):
    ``(keep, {selector: [paths]})``.

    Examples
    --------
    >>> from mxnet.gluon import nn
    >>> net = nn.HybridSequential(prefix='net_')
    >>> with net.name_scope():
    ...     net.add(nn.Dense(4), nn.Dense(2))
    >>> keep, selected = block_keep(net, ['1'])
    >>> keep.paths, keep('net_dense1_fwd'), keep('net_dense0_fwd')
    (('1',), True, False)
    """
    index = block if isinstance(block, BlockIndex) else BlockIndex(block)
    selected = select_blocks(index, selectors)
    chosen = set()
    for paths in selected.values():
        for path in _top_paths(paths):
            chosen.update(index.subtree(path))
    kept = [p for p in index.paths if p in chosen]
    return Keep(lambda name, op=None: index.owner(name) in chosen, kept), selected


def _name_parts(name):
    """The op name and its parts that end before a ``'_'``: the Gluon names it carries."""
    return [name[:end] for end in range(1, len(name)) if name[end] == "_"] + [name]


def _block_prefixes(block):
    """The Gluon prefixes of ``block`` and of every block inside it."""
    blocks = [block] + list(BlockIndex(block).paths.values())
    original = [vars(b).get("_original") or b for b in blocks]
    return tuple(sorted({b.prefix for b in original if b.prefix}, key=len, reverse=True))


def _graph_matcher(selector):
    """``op name -> bool`` for one selector of a graph without its blocks."""
    if isinstance(selector, str):
        return lambda name: any(fnmatch.fnmatchcase(part, selector) for part in _name_parts(name))
    if isinstance(selector, gluon.Block):
        prefixes = _block_prefixes(selector)
        return lambda name: name.startswith(prefixes)
    if inspect.isclass(selector):
        raise TypeError(f"keep_float32 selector {selector.__name__} (a class) on a graph without "
                        "its blocks (a Symbol or a SymbolBlock): select the ops by name (a glob "
                        "such as 'resnetv10_stage4_*'), or cast the Gluon network itself")
    raise TypeError(f"keep_float32 selector {selector!r} ({type(selector).__name__}): give a "
                    "string (a glob of op names or of the Gluon names they start with) or a Block "
                    "of the network the graph was traced from")


def _suggestions(sym):
    """Names to suggest for a selector of ``sym``: the Gluon names its parameters carry (each
    parameter's name without its last part, ``'net0_dense0'``), then its op names."""
    nodes = mxnet_internals.graph_json(sym)["nodes"]
    return [node["name"].rsplit("_", 1)[0] for node in nodes if node["op"] == "null"
            and "_" in node["name"]] + [name for name, _ in _ops(sym)]


def graph_keep(sym, selectors):
    """The :class:`Keep` of ``selectors`` on a graph without its blocks (see the module
    docstring); each selector must select an op of ``sym``.

    Raises
    ------
    ValueError
        For a selector that selects no op, naming it and the nearest names of the graph.
    TypeError
        For a Block subclass (a graph has no classes) or a selector of another kind.

    Examples
    --------
    >>> import mxnet as mx
    >>> fc = mx.sym.FullyConnected(mx.sym.var('data'), num_hidden=2, name='net0_dense0_fwd')
    >>> graph_keep(fc, 'net0_dense0')('net0_dense0_fwd')
    True
    """
    if isinstance(selectors, (str, gluon.Block)) or inspect.isclass(selectors):
        selectors = [selectors]
    names = [name for name, _ in _ops(sym)]
    matchers = []
    for selector in selectors:
        matcher = _graph_matcher(selector)
        if not any(matcher(name) for name in names):
            near = ", ".join(map(repr, nearest(describe_selector(selector), _suggestions(sym))))
            raise ValueError(f"keep_float32 selector {describe_selector(selector)!r} selects no "
                             f"op of the graph: the nearest names are {near} (a glob of op names "
                             "or of the Gluon names they start with)")
        matchers.append(matcher)
    return Keep(lambda name, op=None: any(matcher(name) for matcher in matchers))
