"""``--keep-float32 SELECTOR[,SELECTOR...]``: the blocks a run keeps in float32, resolved on the
network once and logged in one line.

The scripts train the float32 graph of a model-zoo network (a ``SymbolBlock`` for ``--api gluon``,
a Symbol for ``--api module``), whose blocks are gone; the graph's op names still carry the Gluon
prefixes of the blocks that made them.  :attr:`mxfp16.models.Network.block_prefixes` records
those prefixes by block path when the network is built, so the selectors are the zoo network's
block paths (``features.3``, as ``print(net)`` shows them) and Gluon names (``resnetv10_stage4``),
globs allowed; a network read from an MXNet checkpoint (``scripts/fine_tune.py
--pretrained-model``), which has no blocks, is selected by its op names and the Gluon names they
start with.  Either way the same :class:`~mxfp16.casting.keep.Keep` goes to ``cast_block`` and
``cast_symbol``.
"""
import logging

from ..casting.keep import block_keep, graph_keep, kept_ops
from ..casting.selectors import BlockIndex

log = logging.getLogger(__name__)

__all__ = ["network_keep"]


def _summary(network, keep, index):
    """``'features.3 (5 ops), output (1 op)'``: each selected block (the outermost) and the
    ops of the graph it keeps."""
    ops = kept_ops(network.symbol, keep)
    if index is None:
        return f"{len(ops)} op{'s' * (len(ops) != 1)} ({', '.join(ops[:4])}" \
               f"{', ...' if len(ops) > 4 else ''})"
    tops = [p for p in keep.paths if not any(p.startswith(q + ".") for q in keep.paths)]
    counts = {top: sum(1 for op in ops if (index.owner(op) + ".").startswith(top + "."))
              for top in tops}
    return ", ".join(f"{top} ({n} op{'s' * (n != 1)})" for top, n in counts.items())


def network_keep(network, selectors):
    """The :class:`~mxfp16.casting.keep.Keep` of ``--keep-float32`` on ``network`` (None for
    none), logged in one line: the blocks kept and their op counts.

    Parameters
    ----------
    network : mxfp16.models.Network
        The float32 network of the run.
    selectors : sequence of str
        Block paths or Gluon names (globs), or op names for a network without blocks.

    Raises
    ------
    ValueError
        For a selector that matches nothing, naming it and the nearest paths (``--keep-float32``
        first, for the one ``error:`` line of the scripts).

    Examples
    --------
    >>> from mxnet.gluon import nn
    >>> from mxfp16.models import block_to_network
    >>> net = nn.HybridSequential(prefix='net_')
    >>> with net.name_scope():
    ...     net.add(nn.Dense(4, in_units=3), nn.Dense(2, in_units=4))
    >>> net.initialize()
    >>> network_keep(block_to_network(net), ['1']).paths
    ('1',)
    """
    if not selectors:
        return None
    index = BlockIndex.from_prefixes(network.block_prefixes) if network.block_prefixes else None
    try:
        keep = block_keep(index, selectors)[0] if index is not None else \
            graph_keep(network.symbol, selectors)
    except (TypeError, ValueError) as error:
        raise ValueError(f"--keep-float32 {','.join(selectors)}: {error}") from None
    log.info("--keep-float32: kept in float32: %s", _summary(network, keep, index))
    return keep
