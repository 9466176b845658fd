"""Exporting a cast network for deployment: graphs and parameters plain MXNet loads.

A cast network computes with an emulation graph on a CPU (float32 arithmetic rounded through
float16, with mxfp16's own ``_mxfp16_round_float16`` operator), which plain MXNet cannot load, and
MXNet 1.9.1's ``HybridBlock.export`` saves parameters only after a forward pass, which a float16
graph cannot run on a CPU.  :func:`export_network` writes, from the graphs and the parameters alone:

* ``dtype='float32'``: the original float32 graph with the float32 master weights (the optimizer's
  copies where it holds them), what plain MXNet, ONNX and a float32 server load;
* ``dtype='float16'``: the float16 GPU graph of the MXNet float16 guide (float16 weights and GEMMs,
  float32 normalization, softmax and outputs, as trained), every parameter in its dtype;
* ``dtype='float16', emulate=True`` (asked for only): the emulation graph with ``Cast`` pairs in
  place of the extension operator, so plain MXNet runs float16 numerics on a CPU.

Each is MXNet's checkpoint pair ``PATH-symbol.json`` + ``PATH-NNNN.params`` (``arg:``/``aux:``
names), written atomically.
"""
import json
import os

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon

from .. import mxnet_internals, numpy_interface
from ..checkpoints.atomic import StagedFiles
from ..optimizers import master_copies
from . import fastround
from .graph import GraphRewriter, internal_dtypes, strip
from .params import cast_params

#: The dtypes :func:`export_network` writes graphs in.
EXPORT_DTYPES = ("float32", "float16")


def float32_value(param):
    """A parameter's float32 value on the CPU: the optimizer's master copy when the weight is that
    copy rounded (the optimizer holds it), else the value widened, averaged over the devices as
    Gluon saves it (BatchNorm's running statistics differ between devices).

    Examples
    --------
    >>> p = mx.gluon.Parameter('w', shape=(2,), dtype='float16', init=mx.init.One())
    >>> p.initialize()
    >>> float32_value(p).dtype.__name__
    'float32'
    """
    arrays = [numpy_interface.legacy(array) for array in param.list_data()]
    masters = master_copies(param)
    if masters and bool((masters[0].astype(arrays[0].dtype) == arrays[0]).min().asscalar()):
        return masters[0].copyto(mx.cpu())
    widened = [array.copyto(mx.cpu()).astype("float32", copy=False) for array in arrays]
    return widened[0] if len(widened) == 1 else mx.nd.add_n(*widened) / len(widened)


def float32_graph(net, data_names=("data",)):
    """``(graph, data names)``: the float32 inference graph of a Gluon network, cast or not.

    A cast network's graph without what casting inserted; a ``SymbolBlock``'s own graph; any other
    HybridBlock traced in inference mode with inputs ``data_names``.
    """
    if hasattr(net, "graphs") and hasattr(net, "data_names"):  # a CastBlock
        names = tuple(net.data_names)
        return strip(net.graphs[0], names), names
    if isinstance(net, gluon.SymbolBlock):
        inputs, outputs = mxnet_internals.symbol_block_graph(net)
        names = tuple(s.name for s in inputs)
        return strip(outputs, names), names
    if not isinstance(net, gluon.HybridBlock):
        raise TypeError(f"export takes a Gluon HybridBlock (cast or not), got {type(net).__name__}: "
                        "make the network hybridizable")
    numpy = numpy_interface.numpy_mode()  # a NumPy-interface network takes numpy symbols
    with autograd.predict_mode():
        out = net(*[numpy_interface.input_symbol(name, numpy) for name in data_names])
    out = [numpy_interface.legacy_symbol(sym) for sym in
           (out if isinstance(out, (list, tuple)) else [out])]
    return (out[0] if len(out) == 1 else mx.sym.Group(out)), tuple(data_names)


def float32_params(net, sym, data_names):
    """``(arg_params, aux_params)``: float32 values of every parameter of ``sym`` in ``net``.

    Raises
    ------
    ValueError
        For a parameter of the graph that is not initialized (nothing to export).
    """
    params = dict(net.collect_params().items())
    names = [n for n in sym.list_arguments() if n not in data_names] + \
        list(sym.list_auxiliary_states())
    missing = [n for n in names if n not in params or params[n]._data is None]
    if missing:
        raise ValueError(f"parameter(s) {missing[:4]} of the network have no value: initialize "
                         "the network or load its parameters before exporting it")
    values = {n: float32_value(params[n]) for n in names}
    aux = set(sym.list_auxiliary_states())
    return ({n: v for n, v in values.items() if n not in aux},
            {n: v for n, v in values.items() if n in aux})


def _plain_rounding(sym):
    """``sym`` with every ``_mxfp16_round_float16`` node replaced by the ``Cast`` pair that gives the
    same values bit for bit, an op plain MXNet has."""
    rw = GraphRewriter(sym, drop_inserted=False)
    for old_id, node in rw.nodes_in_order():
        if node["op"] == fastround.ROUND_OP:
            half = rw.cast(rw.input_entry(node["inputs"][0]), "float16")
            rw.replace(old_id, rw.insert_op("Cast", half, "round_float16", dtype="float32"))
        else:
            rw.copy(old_id, node)
    return rw.to_symbol(rw.heads())


def check_plain_mxnet(sym):
    """Raise ``RuntimeError`` if ``sym`` holds an operator only mxfp16 registers.

    Examples
    --------
    >>> check_plain_mxnet(mx.sym.relu(mx.sym.var('data')))  # no error
    """
    ops = {node["op"] for node in json.loads(sym.tojson(remove_amp_cast=False))["nodes"]}
    if fastround.ROUND_OP in ops:
        raise RuntimeError(f"the graph holds mxfp16's operator {fastround.ROUND_OP}, which plain "
                           "MXNet cannot load: export with emulate=False (the GPU graph)")


def deployment_graph(sym32, dtype, data_names, recast, emulate=False):
    """The graph to write: ``sym32`` itself for float32, else ``recast(sym32, dtype, emulate=...,
    data_names=...)`` (``cast_symbol`` with the network's mode), its rounding in plain ops."""
    if dtype == "float32":
        return sym32
    if recast is None:
        raise ValueError(f"dtype={dtype!r} exports a network cast with mxfp16.cast_block: cast it "
                         f"first (mxfp16.cast_block(net, {dtype!r})), or export dtype='float32'")
    sym = recast(sym32, dtype, emulate=emulate, data_names=data_names)
    return _plain_rounding(sym) if emulate else sym


def export_network(net, path, dtype="float32", epoch=0, emulate=False, recast=None,
                   data_names=("data",)):
    """Write ``PATH-symbol.json`` and ``PATH-NNNN.params`` for plain MXNet (see the module notes).

    :meth:`mxfp16.casting.CastBlock.export` and :func:`mxfp16.export` call it.

    Parameters
    ----------
    net : gluon.HybridBlock
        A cast network (:func:`mxfp16.cast_block`), or a float32 one for ``dtype='float32'``.
    path : str
        The prefix of the two files, as for ``HybridBlock.export``.
    dtype : {'float32', 'float16'}
    epoch : int
        The number in the parameter file's name.
    emulate : bool
        float16 only: the CPU emulation graph (float32 compute rounded through float16) instead of
        the GPU graph.
    recast : callable, optional
        ``cast_symbol`` with the network's mode; default: the cast network's own.
    data_names : sequence of str
        The inputs of a network that is neither cast nor a ``SymbolBlock``.

    Returns
    -------
    (str, str)
        The symbol and parameter files.

    Raises
    ------
    ValueError
        For another dtype, ``emulate`` with float32, or a network without values.

    Examples
    --------
    >>> import os, tempfile
    >>> from mxnet.gluon import nn
    >>> import mxfp16
    >>> net = nn.HybridSequential()
    >>> net.add(nn.Dense(4, in_units=3), nn.BatchNorm(in_channels=4), nn.Dense(2, in_units=4))
    >>> net.initialize()
    >>> net16 = mxfp16.cast_block(net, 'float16')
    >>> prefix = os.path.join(tempfile.mkdtemp(), 'net')
    >>> symbol_file, params_file = mxfp16.export(net16, prefix, dtype='float16')
    >>> sorted(param_dtypes(mx.sym.load(symbol_file)).values())  # no forward pass needed
    ['float16', 'float16', 'float16', 'float16', 'float32', 'float32', 'float32', 'float32']
    >>> {v.dtype.__name__ for v in mx.nd.load(net16.export(prefix)[1]).values()}  # float32
    {'float32'}
    """
    if dtype not in EXPORT_DTYPES:
        raise ValueError(f"dtype={dtype!r}: choose one of {', '.join(EXPORT_DTYPES)} ('float32' for "
                         "plain MXNet, ONNX and float32 servers; 'float16' for GPU servers)")
    if emulate and dtype != "float16":
        raise ValueError("emulate=True exports the float16 emulation graph: pass dtype='float16', "
                         "or emulate=False")
    sym32, names = float32_graph(net, data_names)
    args, aux = float32_params(net, sym32, names)
    sym = deployment_graph(sym32, dtype, names, recast or getattr(net, "recast", None), emulate)
    check_plain_mxnet(sym)
    if dtype != "float32":
        args, aux = cast_params(args, aux, sym, data_names=names, label_names=())
    return write_checkpoint(path, epoch, sym, args, aux)


def write_checkpoint(path, epoch, sym, arg_params, aux_params):
    """``mx.model.save_checkpoint``'s two files, written atomically; returns their paths."""
    files = (f"{path}-symbol.json", "%s-%04d.params" % (path, epoch))
    saved = {**{f"arg:{k}": v for k, v in arg_params.items()},
             **{f"aux:{k}": v for k, v in aux_params.items()}}
    folder = os.path.dirname(os.path.abspath(path))
    with StagedFiles(folder) as staged:
        staged.write(files[0], lambda p: sym.save(p, remove_amp_cast=False))
        staged.write(files[1], lambda p: mx.nd.save(p, saved))
    return files


def param_dtypes(sym, data_names=("data",)):
    """``{parameter name: dtype name}`` of a graph with float32 data, as MXNet infers them.

    Examples
    --------
    >>> fc = mx.sym.FullyConnected(mx.sym.var('data'), num_hidden=2, name='fc')
    >>> param_dtypes(fc)
    {'fc_weight': 'float32', 'fc_bias': 'float32'}
    """
    types = internal_dtypes(sym, list(data_names))
    names = [n for n in sym.list_arguments() if n not in data_names] + \
        list(sym.list_auxiliary_states())
    return {n: np.dtype(types[n]).name for n in names if n in types}
