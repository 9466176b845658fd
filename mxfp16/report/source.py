"""The network a report is about: a model-zoo name, a built-in sequence network (``lstm_lm``), or a
checkpoint (Module or Gluon export)."""
import os

import mxnet as mx
from mxnet import gluon

from ..models import get_network, load_mxnet_checkpoint
from .sequence import SEQUENCE_NETWORKS, sequence_network


def symbol_block(sym, arg_params, aux_params, data_name="data"):
    """A Gluon SymbolBlock over ``sym`` holding the given parameter values.

    Parameters
    ----------
    sym : mx.sym.Symbol
        A graph without loss head.
    arg_params, aux_params : dict of str to NDArray
        As ``mx.model.load_checkpoint`` returns them.
    data_name : str
        The data input.

    Returns
    -------
    gluon.SymbolBlock

    Raises
    ------
    ValueError
        If ``sym`` has no input ``data_name`` or a parameter has no value.

    Examples
    --------
    >>> import mxnet as mx
    >>> fc = mx.sym.FullyConnected(mx.sym.var('data'), num_hidden=2, name='fc')
    >>> block = symbol_block(fc, {'fc_weight': mx.nd.ones((2, 3)), 'fc_bias': mx.nd.zeros(2)}, {})
    >>> block(mx.nd.ones((1, 3))).asnumpy().tolist()
    [[3.0, 3.0]]
    """
    if data_name not in sym.list_arguments():
        raise ValueError(f"the network has no input {data_name!r} (its arguments start with "
                         f"{sym.list_arguments()[:4]}): the report expects the data input named "
                         f"'{data_name}', as MXNet's examples and Gluon's export name it")
    block = gluon.SymbolBlock(sym, [mx.sym.var(data_name, dtype="float32")])
    values = dict(aux_params or {}, **(arg_params or {}))
    for name, param in block.collect_params().items():
        if name not in values:
            raise ValueError(f"the checkpoint has no value for parameter {name!r}: save the "
                             "checkpoint from the same network")
        param.shape = values[name].shape
        param.initialize(ctx=mx.cpu())
        param.set_data(values[name])
    return block


def load_checkpoint(prefix, epoch, data_name="data"):
    """A checkpoint's graph (without a labelled loss head) and a block holding its parameters.

    Parameters
    ----------
    prefix : str
        ``PREFIX`` of ``PREFIX-symbol.json`` and ``PREFIX-EPOCH.params``.
    epoch : int
    data_name : str

    Returns
    -------
    (mx.sym.Symbol, gluon.SymbolBlock)

    Raises
    ------
    FileNotFoundError
        Naming the missing file.

    Examples
    --------
    >>> import os, tempfile
    >>> import mxnet as mx
    >>> fc = mx.sym.FullyConnected(mx.sym.var('data'), num_hidden=2, name='fc')
    >>> prefix = os.path.join(tempfile.mkdtemp(), 'net')
    >>> mx.model.save_checkpoint(prefix, 1, mx.sym.SoftmaxOutput(fc, name='softmax'),
    ...                          {'fc_weight': mx.nd.ones((2, 3)), 'fc_bias': mx.nd.zeros(2)}, {})
    >>> sym, block = load_checkpoint(prefix, 1)
    >>> sym.list_outputs()  # the SoftmaxOutput head is cut off
    ['fc_output']
    """
    try:
        network = load_mxnet_checkpoint(prefix, epoch)
    except FileNotFoundError as error:
        raise FileNotFoundError(f"{error}: pass --checkpoint PREFIX and --epoch N of such "
                                "files") from None
    return network.symbol, symbol_block(network.symbol, network.arg_params, network.aux_params,
                                        data_name)


def load_network(network=None, checkpoint=None, epoch=0, num_classes=1000, sequence_sizes=None):
    """The network's name, float32 graph (input ``data``) and Gluon block.

    Parameters
    ----------
    network : str or None
        A model-zoo name (see :func:`mxfp16.models.get_network`) or a built-in sequence network
        (:data:`mxfp16.report.sequence.SEQUENCE_NETWORKS`); used when ``checkpoint`` is None.
    checkpoint : str or None
        A checkpoint prefix (Module checkpoint or Gluon export).
    epoch : int
        The checkpoint's epoch.
    num_classes : int
        Classes of a model-zoo network.
    sequence_sizes : dict or None
        ``vocab_size``, ``embed_size``, ``hidden_size``, ``num_layers`` of a sequence network
        (see :func:`mxfp16.report.sequence.sequence_network`).

    Returns
    -------
    (str, mx.sym.Symbol, gluon.HybridBlock)
        The block of a zoo network is not initialized; a checkpoint's holds its parameters.

    Raises
    ------
    ValueError
        For an unknown network name.
    FileNotFoundError
        For a missing checkpoint file.

    Examples
    --------
    >>> name, sym, block = load_network('resnet18_v1', num_classes=10)
    >>> name, sym.infer_shape(data=(1, 3, 32, 32))[1]
    ('resnet18_v1', [(1, 10)])
    """
    if checkpoint:
        sym, block = load_checkpoint(checkpoint, epoch)
        return os.path.basename(checkpoint), sym, block
    if not network:
        raise ValueError("no network given: pass a model-zoo name (e.g. network='resnet50_v1') or a "
                         "checkpoint prefix")
    if network in SEQUENCE_NETWORKS:
        block = sequence_network(network, **(sequence_sizes or {}))
    else:
        block = get_network(network, num_classes=num_classes)
    return network, block(mx.sym.var("data")), block
