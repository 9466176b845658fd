"""Naming the blocks of a Gluon network: their paths, the block an op of a traced graph belongs to,
and selectors (``keep_float32=[...]`` of :func:`mxfp16.cast_block`) resolved to blocks.

A block's **path** is its children's names joined by ``'.'``, as ``print(net)`` shows them and as
``save_parameters`` names parameters (``'features.3'``, ``'encoder.0.attention'``); the root has
none.  An op of a graph traced from the network belongs to the innermost block whose Gluon prefix
starts its name: ``hybrid_forward`` runs inside the block's ``name_scope()``, so the op names of
``'net0_att0_batch_dot0'`` carry the prefix ``'net0_att0_'`` of the block that made it, wherever
that block was registered (a block made in its grandparent's ``name_scope()`` and added to a
``HybridSequential`` carries the grandparent's prefix, not the sequence's).

A **selector** is one of:

- a Block of the network (``net.encoder.attention``);
- a Block subclass: every block of the network that is an instance of it;
- a string: a glob (:mod:`fnmatch`, case-sensitive) matched against the block paths
  (``'features.3'``, ``'encoder.*.attention'``) and against the blocks' Gluon names,
  ``block.name`` (``'dense0'``, ``'net0_att0'``).  A string matching blocks both as a path and as a
  name selects them if they are the same blocks, and is refused if they differ.

A selector that matches nothing is refused in one line naming it and the nearest paths.  A network
cast by ``cast_block`` (a :class:`~mxfp16.casting.block.CastBlock`, or a plain Block cast in place)
is named by the blocks of the float32 network it was cast from.
"""
import difflib
import fnmatch
import inspect

from mxnet import gluon

from .. import mxnet_internals

__all__ = ["BlockIndex", "block_paths", "select_blocks", "selector_list"]


def _structure(block):
    """The block whose children name ``block``'s: the float32 original of a cast network (a
    CastBlock's own children are its graphs), else the block itself."""
    original = vars(block).get("_original")
    return block if original is None else original


def block_paths(block):
    """``{path: Block}`` of every block inside ``block``, in registration order (pre-order), the
    root left out.

    Parameters
    ----------
    block : gluon.Block
        A network, float32 or cast by :func:`mxfp16.cast_block`.  A block registered under several
        names (shared) appears under each.

    Returns
    -------
    dict of str to gluon.Block

    Examples
    --------
    >>> from mxnet.gluon import nn
    >>> net = nn.HybridSequential()
    >>> body = nn.HybridSequential()
    >>> body.add(nn.Dense(4), nn.Dense(4))
    >>> net.add(body, nn.Dense(2))
    >>> list(block_paths(net))
    ['0', '0.0', '0.1', '1']
    """
    return dict(mxnet_internals.block_tree(
        block, lambda parent: mxnet_internals.block_children(_structure(parent))))


class _Named:
    """A block known by its Gluon prefix alone: its ``prefix`` and ``name``, as Gluon makes the
    name (the prefix without its trailing ``'_'``)."""

    def __init__(self, prefix):
        self.prefix = prefix
        self.name = prefix[:-1] if prefix.endswith("_") else prefix


def _gluon_name(block):
    return _structure(block).name


class BlockIndex:
    """The blocks of a network by path, and the block each op of its traced graphs belongs to.

    Parameters
    ----------
    block : gluon.Block
        A network, float32 or cast by :func:`mxfp16.cast_block`.

    Attributes
    ----------
    paths : dict of str to gluon.Block
        :func:`block_paths` of the network.

    Examples
    --------
    >>> from mxnet.gluon import nn
    >>> net = nn.HybridSequential(prefix='net_')
    >>> with net.name_scope():
    ...     net.add(nn.Dense(4), nn.Dense(2))
    >>> index = BlockIndex(net)
    >>> index.owner('net_dense1_fwd'), index.owner('net_relu0'), index.owner('data')
    ('1', '', '')
    >>> index.subtree('0')
    ['0']
    """

    def __init__(self, block):
        self.root = block
        self.paths = block_paths(block)
        self._index_prefixes()

    @classmethod
    def from_prefixes(cls, prefixes):
        """The index of a network known by ``{path: Gluon prefix}`` alone (a graph's
        :attr:`mxfp16.models.Network.block_prefixes`): selected by paths and Gluon names.

        Examples
        --------
        >>> index = BlockIndex.from_prefixes({'0': 'net_dense0_', '1': 'net_dense1_'})
        >>> index.owner('net_dense1_fwd'), select_blocks(index, 'net_dense0')
        ('1', {'net_dense0': ['0']})
        """
        index = cls.__new__(cls)
        index.root = None
        index.paths = {path: _Named(prefix) for path, prefix in prefixes.items()}
        index._index_prefixes()
        return index

    def _index_prefixes(self):
        self._by_prefix = {}  # Gluon prefix -> path (the last, innermost, of equal prefixes)
        for path, child in self.paths.items():
            prefix = _structure(child).prefix
            if prefix and (prefix not in self._by_prefix or
                           self._by_prefix[prefix].count(".") < path.count(".")):
                self._by_prefix[prefix] = path
        self._irregular = sorted((p for p in self._by_prefix if not p.endswith("_")),
                                 key=len, reverse=True)

    def owner(self, node_name):
        """The path of the innermost block whose Gluon prefix starts ``node_name`` (the longest
        such prefix), ``''`` for the root's own ops and names no block's prefix starts."""
        best = ""
        for end in range(len(node_name)):
            if node_name[end] == "_" and node_name[:end + 1] in self._by_prefix:
                best = node_name[:end + 1]
        for prefix in self._irregular:  # prefixes given without the trailing '_'
            if len(prefix) > len(best) and node_name.startswith(prefix):
                best = prefix
                break
        return self._by_prefix.get(best, "")

    def subtree(self, path):
        """``path`` and the paths of every block inside it, in ``paths`` order."""
        return [p for p in self.paths if p == path or p.startswith(path + ".")]

    def path_of(self, block):
        """The first path of ``block`` (or of the CastBlock made from it), None if it is not
        inside the network."""
        for path, child in self.paths.items():
            if child is block or _structure(child) is block:
                return path
        return None


def describe_selector(selector):
    """The key :func:`select_blocks` gives a selector: a string as given, a class's name, a
    block's Gluon name.

    Examples
    --------
    >>> from mxnet.gluon import nn
    >>> describe_selector('features.*'), describe_selector(nn.Dense)
    ('features.*', 'Dense')
    """
    if isinstance(selector, str):
        return selector
    if inspect.isclass(selector):
        return selector.__name__
    if isinstance(selector, gluon.Block):
        return _gluon_name(selector)
    return repr(selector)


def nearest(word, choices, count=3):
    """The ``count`` strings of ``choices`` closest to ``word`` (difflib), for error messages;
    the first choices when none is close."""
    choices = list(dict.fromkeys(choices))
    close = difflib.get_close_matches(word, choices, n=count, cutoff=0.3)
    return close or choices[:count]


def _no_match(selector, index, what):
    near = nearest(describe_selector(selector), list(index.paths) +
                   [_gluon_name(b) for b in index.paths.values()])
    near = ", ".join(map(repr, near)) or "(none: the network has no child blocks)"
    raise ValueError(f"keep_float32 selector {describe_selector(selector)!r} {what}: the nearest "
                     f"block paths and names are {near}; print(net) shows the paths")


def _match_string(selector, index):
    by_path = [p for p in index.paths if fnmatch.fnmatchcase(p, selector)]
    by_name = [p for p, b in index.paths.items() if fnmatch.fnmatchcase(_gluon_name(b), selector)]
    if by_path and by_name and {id(index.paths[p]) for p in by_path} != \
            {id(index.paths[p]) for p in by_name}:
        raise ValueError(
            f"keep_float32 selector {selector!r} matches the block path(s) {by_path[:3]} and the "
            f"Gluon name(s) of {by_name[:3]}, which are other blocks: select one of them by its "
            "path (or pass the Block itself)")
    return by_path or by_name


def _match(selector, index):
    if isinstance(selector, str):
        return _match_string(selector, index)
    if inspect.isclass(selector) and issubclass(selector, gluon.Block):
        return [p for p, b in index.paths.items() if isinstance(_structure(b), selector)]
    if selector is index.root or (index.root is not None and selector is _structure(index.root)):
        raise ValueError("keep_float32 selects the network itself: cast_block(net, 'float32') "
                         "keeps all of it; select the blocks inside it")
    return [p for p, b in index.paths.items() if b is selector or _structure(b) is selector]


def selector_list(selectors):
    """``selectors`` as a list (one string, Block or class alone too), each of a kind a selector
    may be, else ``TypeError`` naming it and the kinds.

    Examples
    --------
    >>> selector_list('features.3')
    ['features.3']
    """
    if isinstance(selectors, (str, gluon.Block)) or inspect.isclass(selectors):
        selectors = [selectors]
    selectors = list(selectors)
    for selector in selectors:
        if not (isinstance(selector, (str, gluon.Block)) or
                (inspect.isclass(selector) and issubclass(selector, gluon.Block))):
            raise TypeError(f"keep_float32 selector {selector!r} ({type(selector).__name__}): "
                            "give a Block of the network, a Block subclass, or a string (a glob "
                            "of block paths such as 'features.3', or of Gluon names such as "
                            "'dense0')")
    return selectors


def select_blocks(block, selectors):
    """Resolve selectors to the paths of the blocks they select.

    Parameters
    ----------
    block : gluon.Block or BlockIndex
        The network (float32 or cast), or its index.
    selectors : str, gluon.Block, type, or a sequence of them
        See the module docstring; one string or Block may be given alone.

    Returns
    -------
    dict
        ``{key: [paths]}`` in the order given, the key being the string as given, a class's
        ``__name__`` or a block's Gluon name (``describe_selector``), the paths in
        :func:`block_paths` order.

    Raises
    ------
    ValueError
        For a selector that matches nothing (naming it and the nearest block paths), a string
        matching other blocks as a path than as a Gluon name, or the network itself.
    TypeError
        For a selector of another kind.

    Examples
    --------
    >>> from mxnet.gluon import nn
    >>> net = nn.HybridSequential(prefix='net_')
    >>> with net.name_scope():
    ...     net.add(nn.Dense(4), nn.BatchNorm(), nn.Dense(2))
    >>> select_blocks(net, ['2', nn.BatchNorm, 'net_dense0'])
    {'2': ['2'], 'BatchNorm': ['1'], 'net_dense0': ['0']}
    >>> try:
    ...     select_blocks(net, '3')
    ... except ValueError as error:
    ...     print(*str(error).split('; '), sep='\\n')
    keep_float32 selector '3' matches no block: the nearest block paths and names are '0', '1', '2'
    print(net) shows the paths
    """
    index = block if isinstance(block, BlockIndex) else BlockIndex(block)
    selected = {}
    for selector in selector_list(selectors):
        paths = _match(selector, index)
        if not paths:
            _no_match(selector, index, "matches no block")
        key = describe_selector(selector)
        selected[key] = list(dict.fromkeys(selected.get(key, []) + paths))
    return selected
