"""How mxfp16's AMP op lists are built: MXNet 1.9's own lists, with mxfp16's rows applied.

A row moves ops into one list (out of whichever list MXNet has them in, or adds them when MXNet
lists them nowhere) and says why.  The rows come from the rules mxfp16's conversions apply
(:mod:`mxfp16.casting.rules` and :mod:`mxfp16.casting.amp_graph`), so the lists are what the
conversions do.  Every op stays in exactly one list.
"""
from collections import namedtuple

import mxnet as mx

from ...casting.fastround import ROUND_OP

#: One of mxfp16's additions: ``ops`` go to list ``into``, for ``reason``.
Row = namedtuple("Row", ["ops", "into", "reason"])


#: mxfp16's own operator (the CPU emulation's float16 rounding, registered when first used), which
#: the lists hold as if registered from the start.
OWN_OPS = frozenset([ROUND_OP])


def registered_ops():
    """Every operator MXNet registers, without its backward ops (as MXNet's coverage test counts),
    and mxfp16's own.

    Examples
    --------
    >>> 'FullyConnected' in registered_ops()
    True
    """
    return OWN_OPS | frozenset(name for name in mx.operator.get_all_registered_operators()
                               if not name.startswith(("_backward", "_contrib_backward_")))


def listed_ops(lists, conditional="CONDITIONAL_FP32_FUNCS"):
    """The op names of ``lists`` (``{list name: list}``), conditional entries by their op."""
    names = set()
    for name, entries in lists.items():
        names.update(entry[0] for entry in entries) if name == conditional else names.update(entries)
    return names


def build(mxnet_lists, names, rows):
    """``{name: list}``: copies of MXNet's lists ``names`` with ``rows`` applied in order.

    Raises
    ------
    ValueError
        If two rows claim one op, or an op would end up in two lists.
    """
    lists = {name: list(getattr(mxnet_lists, name)) for name in names}
    claimed = {}
    for row in rows:
        for op in row.ops:
            if op in claimed:
                raise ValueError(f"op {op!r} is in mxfp16's rows for {claimed[op]} and "
                                 f"{row.into}: an op goes in one list only")
            claimed[op] = row.into
            for name, entries in lists.items():
                entries[:] = [entry for entry in entries
                              if (entry[0] if name == "CONDITIONAL_FP32_FUNCS" else entry) != op]
            lists[row.into].append(op)
    check_exactly_once(lists)
    return lists


def check_exactly_once(lists):
    """Raise ``ValueError`` naming the ops that sit in more than one list (or twice in one)."""
    seen, twice = set(), set()
    for name, entries in lists.items():
        for entry in entries:
            op = entry[0] if name == "CONDITIONAL_FP32_FUNCS" else entry
            (twice if op in seen else seen).add(op)
    if twice:
        raise ValueError(f"op(s) {sorted(twice)} are in more than one AMP list: each op goes in "
                         "exactly one")
