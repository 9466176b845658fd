"""Parameter names in the scripts' checkpoints: those a model-zoo network loads, GluonCV's way.

A zoo network's parameters carry its Gluon name scope (``resnetv10_conv0_weight``), and Gluon's
``load_parameters`` adds the network's own prefix to every name of a file with no structural names
(``resnetv10_`` + ``conv0_weight``).  Checkpoints therefore store names relative to that prefix, in
the graph and in the ``.params`` file alike, so one file loads with
``gluoncv.model_zoo.get_model(name, classes=N).load_parameters(path)`` (whatever the network's
name-scope count in that process), ``SymbolBlock.imports`` and ``mx.model.load_checkpoint``; the
prefix is recorded in the checkpoint's JSON file and given back when the scripts load it.
"""
import json
import re

import mxnet as mx

from ...models import DATA_INPUT, Network

#: A Gluon name-scope prefix: the block's class name in lower case, its count, ``_``
#: (``resnetv10_``, ``se_resnetv10_``, ``mobilenetv20_``).
_SCOPE_PREFIX = re.compile(r"^[a-z][a-z0-9_]*?\d+_")


def scope_prefix(names):
    """The Gluon name-scope prefix all ``names`` share, or ``''``.

    Examples
    --------
    >>> scope_prefix(['resnetv10_conv0_weight', 'resnetv10_stage1_conv0_weight'])
    'resnetv10_'
    >>> scope_prefix(['resnetv10_conv0_weight', 'fc_weight']), scope_prefix([])
    ('', '')
    """
    names = list(names)
    match = _SCOPE_PREFIX.match(names[0]) if names else None
    if not match or not all(n.startswith(match.group(0)) and len(n) > len(match.group(0))
                            for n in names):
        return ""
    return match.group(0)


def _renamed(network, rename):
    """``network`` with every parameter ``name`` called ``rename(name)``, in graph and values."""
    symbol = network.symbol  # None: a checkpoint whose damaged graph file resuming does not need
    if symbol is not None:
        graph = json.loads(symbol.tojson(remove_amp_cast=False))
        params = set(network.arg_params) | set(network.aux_params)
        for node in graph["nodes"]:
            if node["op"] == "null" and node["name"] in params:
                node["name"] = rename(node["name"])
        symbol = mx.sym.load_json(json.dumps(graph))
    return Network(symbol,
                   {rename(k): v for k, v in network.arg_params.items()},
                   {rename(k): v for k, v in network.aux_params.items()},
                   tuple(rename(n) for n in network.fixed_param_names),
                   {rename(k): v for k, v in network.lr_mult.items()})


def relative_names(network):
    """``(network, prefix)``: ``network`` with its parameters named without their shared
    name-scope prefix, and that prefix (``''`` and ``network`` itself when there is none).

    Examples
    --------
    >>> fc = mx.sym.FullyConnected(mx.sym.var('data'), num_hidden=2, name='net0_fc')
    >>> network = Network(fc, {'net0_fc_weight': mx.nd.ones((2, 3)),
    ...                        'net0_fc_bias': mx.nd.zeros(2)}, {})
    >>> relative, prefix = relative_names(network)
    >>> prefix, relative.symbol.list_arguments()
    ('net0_', ['data', 'fc_weight', 'fc_bias'])
    """
    names = [n for n in list(network.arg_params) + list(network.aux_params) if n != DATA_INPUT]
    prefix = scope_prefix(names)
    if not prefix:
        return network, ""
    return _renamed(network, lambda name: name[len(prefix):]), prefix


def with_prefix(network, prefix):
    """``network`` with ``prefix`` put back in front of its parameter names (the inverse of
    :func:`relative_names`); ``network`` itself for ``''``."""
    if not prefix:
        return network
    return _renamed(network, lambda name: prefix + name)
