"""Casting Gluon blocks and Symbol graphs to float16 (or bfloat16) for training and inference.

``cast_symbol`` casts a graph: ``mode='full'`` by :mod:`~mxfp16.casting.full_graph` (the MXNet
float16 guide's recipe), ``mode='amp'`` and bfloat16 by MXNet's AMP pass
(:mod:`~mxfp16.casting.amp_graph`), float16 on a CPU then emulated (:mod:`~mxfp16.casting.emulation`).
``cast_block`` traces a Gluon block into such graphs (:mod:`~mxfp16.casting.tracing`), in the
legacy front end or MXNet's NumPy interface, and returns the
:class:`~mxfp16.casting.block.CastBlock` that runs them.
"""
import functools
from collections import namedtuple

import mxnet as mx
from mxnet import gluon

from .. import mxnet_internals, numpy_interface
from .amp_graph import cast_with_amp
from .block import CastBlock
from .plain_block import cast_children
from .emulation import emulate_float16, resolve_emulate
from .full_graph import cast_whole_graph
from .graph import internal_dtypes
from .rules import check_dtype, check_mode
from .signature import ImperativeCallError
from .tracing import cast_parameters, data_input_names, trace_plain, variant_tracer

def _describe(value):
    """A one-line description of a wrong argument: its type and the start of its repr."""
    text = " ".join(repr(value).split())
    return f"{type(value).__name__} {text[:60]}{'...' if len(text) > 60 else ''}"


def _check_data_names(sym, data_names):
    arguments = sym.list_arguments()
    missing = [name for name in data_names if name not in arguments]
    if missing:
        raise ValueError(f"data input(s) {missing} not found among the symbol's arguments "
                         f"{arguments[:8]}{' ...' if len(arguments) > 8 else ''}: pass "
                         "data_names=[...] with the names of the graph's data inputs")


def cast_symbol(sym, dtype="float16", emulate=None, mode="full", data_names=("data",)):
    """Cast a Symbol graph for mixed-precision training.

    Parameters
    ----------
    sym : mx.sym.Symbol
        A float32 graph, for example a ResNet ending in ``SoftmaxOutput``.
    dtype : {'float16', 'bfloat16', 'float32'}
        ``'float32'`` returns ``sym`` unchanged; ``'bfloat16'`` takes MXNet's AMP bfloat16 pass.
    emulate : bool or None
        CPU emulation of float16 (see :mod:`mxfp16.casting.emulation`).  ``None``: on when MXNet sees no
        GPU.  ``False`` builds the GPU graph even on a CPU machine.
    mode : {'full', 'amp'}
        ``'full'``: every op runs in float16 except normalization layers, softmax, losses and the
        ops MXNet's AMP lists keep in float32.  ``'amp'``: MXNet's AMP pass decides op by op.
    data_names : sequence of str
        The data inputs; each gets a cast to float16.  Labels and parameters are not cast.

    Returns
    -------
    mx.sym.Symbol
        The cast graph.  With float32 data, ``infer_type`` gives float16 weights and float32
        normalization parameters; it binds and trains with ``mx.mod.Module``.  Casting a cast graph
        again gives the same graph.

    Raises
    ------
    TypeError
        If ``sym`` is not a Symbol.
    ValueError
        For an unknown ``dtype`` or ``mode``, or a data name the graph does not have.

    Examples
    --------
    >>> import mxnet as mx
    >>> net = mx.sym.FullyConnected(mx.sym.var('data'), num_hidden=4, name='fc')
    >>> net = mx.sym.SoftmaxOutput(net, name='softmax')
    >>> cast = cast_symbol(net, 'float16', emulate=False)
    >>> arg_types, _, _ = cast.infer_type(data='float32')
    >>> dict(zip(cast.list_arguments(), [t.__name__ for t in arg_types]))['fc_weight']
    'float16'
    """
    if not isinstance(sym, mx.sym.Symbol):
        raise TypeError(f"cast_symbol takes an mx.sym.Symbol, got {_describe(sym)}: "
                        "use cast_block for a Gluon block")
    dtype = check_dtype(dtype)
    check_mode(mode)
    data_names = tuple(data_names)
    _check_data_names(sym, data_names)
    if dtype == "float32":
        return sym
    if dtype == "bfloat16":
        resolve_emulate(emulate, dtype)
        return cast_with_amp(sym, dtype, data_names)
    gpu = cast_whole_graph(sym, data_names) if mode == "full" else \
        cast_with_amp(sym, dtype, data_names)
    if not resolve_emulate(emulate, dtype):
        return gpu
    plan = internal_dtypes(gpu, data_names)
    return emulate_float16(sym, plan, data_names)



def _block_graphs(block):
    """``(data names, inference graph, training graph or None where the two are the same)`` of a
    SymbolBlock (a :class:`CastBlock` has both graphs)."""
    if isinstance(block, CastBlock):
        return (block.data_names,) + block.graphs
    inputs, outputs = mxnet_internals.symbol_block_graph(block)
    return [s.name for s in inputs], outputs, None



def _default_layouts(params):
    """Copy each initialized parameter's values into MXNet's default layout: an
    inference-mode forward leaves oneDNN's convolution weights in its blocked layout, which the
    bfloat16 graph's cast of the weight cannot read ("could not create a primitive descriptor for
    a reorder primitive", GluonCV's SSD evaluated before it is cast)."""
    for param in params.values():
        if mxnet_internals.initialized_arrays(param):
            param.cast(param.dtype)  # fresh copies, as a float16 cast makes them



def cast_block(block, dtype="float16", emulate=None, mode="full", input_names=None):
    """Prepare a Gluon HybridBlock for mixed-precision training and inference: ``net.cast``'s
    replacement.

    All parameters become float16 except those of normalization layers (BatchNorm, SyncBatchNorm,
    InstanceNorm, LayerNorm, GroupNorm), whose weights and running statistics stay float32.  Inputs
    of any float dtype are accepted; outputs come back as float32, so softmax and losses run in
    float32.  The parameters are cast in place and shared with the returned block.

    The block is traced in training and in inference mode: calls in either mode run that mode's
    graph, so Python branches on ``autograd.is_training()`` behave as in the original.  Each mode
    is traced with the inputs of its own call: inference at the cast, training too where the
    block takes nothing but its required inputs, else at the first training call with the arrays
    it passes (Faster R-CNN's ``gt_box, gt_label``, YOLOv3's targets), inside ``autograd.record()``
    when that call records.  Nothing is traced with inputs the caller did not give.  The cast
    network always runs as a graph, as a hybridized block does: a block that was not hybridized
    stays so (no ``static_alloc``), and one that was keeps its ``hybridize()`` settings, but the
    Python code of its ``hybrid_forward`` runs at cast time, not at every call, so printing,
    ``asnumpy()`` or data-dependent Python control flow there, and forward hooks of its inner
    layers, do not run per call.

    Parameters
    ----------
    block : gluon.HybridBlock or gluon.Block
        Any hybridizable network (model-zoo networks, ``SymbolBlock.imports`` of a checkpoint),
        initialized or not, hybridized or not, its parameters loaded or not, of the legacy front
        end or of MXNet's NumPy interface (cast with ``npx.set_np()`` on: traced with numpy
        symbols, the cast network takes and returns ``mx.np.ndarray``).  Initialized before
        the cast (shapes known or deferred), a float16 parameter starts from the float32 values
        of the same seed, rounded; initialized after it, its values are drawn in float16.  A ``gluon.Block``
        that is not hybridizable but is made of HybridBlocks (GluonNLP's ``NMTModel``) has those
        cast in place and is returned itself: its own Python code between them runs on their
        float32 outputs, the cast parts keep the methods of the originals, and its
        ``save_parameters`` / ``load_parameters`` become a CastBlock's (float32 checkpoints under
        the float32 network's names; :mod:`~mxfp16.casting.plain_block`).
    dtype : {'float16', 'bfloat16', 'float32'}
        ``'float32'`` returns ``block`` itself, unchanged.
    emulate : bool or None
        CPU emulation of float16; ``None`` turns it on when MXNet sees no GPU.
    mode : {'full', 'amp'}
        As in :func:`cast_symbol`.
    input_names : sequence of str, optional
        Names for the block's inputs, for Symbol-style callers (ignored for a SymbolBlock, which
        has its own).  Without it the cast network is called exactly like ``block``: the inputs
        are read from ``block``'s signature (``data`` for one input), and calls with nested lists
        of states (``net(x, begin_state)`` returning ``(output, states)``), optional inputs given
        or left out, or another number of inputs are traced from ``block`` on their first use.
        A call ``block`` itself does not take is one ``TypeError`` naming both.

    Returns
    -------
    CastBlock
        The cast network, a ``gluon.SymbolBlock``.  It shares the Parameter objects of ``block``,
        so a Trainer over either's ``collect_params()`` trains both.  Its ``save_parameters``
        writes float32 checkpoints under the original's names; save and load through it.

    Raises
    ------
    TypeError
        If ``block`` is not a HybridBlock; a :class:`~mxfp16.numpy_interface.FrontEndError` if its
        layers are of the other front end than the one on (``npx.set_np()`` or not).
    ValueError
        For an unknown ``dtype`` or ``mode``.

    Examples
    --------
    >>> import mxnet as mx
    >>> from mxnet.gluon import nn
    >>> net = nn.HybridSequential()
    >>> net.add(nn.Dense(8), nn.BatchNorm(), nn.Dense(2))
    >>> net.initialize()
    >>> net16 = cast_block(net, 'float16')
    >>> net[0].weight.dtype.__name__, net[1].gamma.dtype.__name__
    ('float16', 'float32')
    >>> net16(mx.nd.ones((4, 3))).dtype.__name__
    'float32'
    """
    plain = isinstance(block, gluon.Block) and not isinstance(block, gluon.HybridBlock) \
        and bool(mxnet_internals.block_children(block))
    if not (plain or isinstance(block, gluon.HybridBlock)):
        raise TypeError(f"cast_block takes a gluon.HybridBlock, got {_describe(block)}: "
                        "make the network hybridizable, or pass a Symbol to cast_symbol")
    dtype = check_dtype(dtype)
    check_mode(mode)
    if dtype == "float32":
        return block
    if plain:  # its HybridBlock parts cast in place, float32 checkpoints (see plain_block)
        return cast_children(block, functools.partial(cast_block, dtype=dtype, emulate=emulate,
                                                      mode=mode))
    if dtype == "bfloat16":
        _default_layouts(block.collect_params())
    cast_graph = functools.partial(cast_symbol, dtype=dtype, emulate=emulate, mode=mode)
    traced = _symbol_block_traces(block, cast_graph) if isinstance(block, gluon.SymbolBlock) \
        else _hybrid_block_traces(block, cast_graph, input_names_given=input_names)
    return _cast_network(block, dtype, mode, traced)


#: What tracing a block gave: the cast graphs (inference, training or None), the data inputs, the
#: tracer of other calls (None for a fixed graph), the plain call in inference and in training
#: mode (see :class:`CastBlock`), and whether the block is one of the NumPy interface.
_Traced = namedtuple("_Traced", ["graphs", "data_names", "tracer", "plain", "plain_training",
                                 "numpy"])


def _symbol_block_traces(block, cast_graph):
    """A SymbolBlock's graphs cast as they are: a fixed graph, its own inputs."""
    data_names, *graphs = _block_graphs(block)
    graphs = [None if sym is None else cast_graph(sym, data_names=data_names) for sym in graphs]
    cast_parameters(block.collect_params(), [sym for sym in graphs if sym is not None],
                    data_names)
    plain = (len(data_names), list(range(len(data_names))), None)
    numpy = getattr(block, "numpy", None)
    numpy = numpy_interface.numpy_mode() if numpy is None else numpy
    return _Traced(graphs, data_names, None, plain, (data_names,) + plain[1:], numpy)


def _hybrid_block_traces(block, cast_graph, input_names_given):
    """A HybridBlock traced called with plain arrays (other calls are traced on first use), in
    the front end the process is in: the NumPy interface's or the legacy one."""
    numpy = numpy_interface.numpy_mode()
    tracer = variant_tracer(block, cast_graph, numpy)
    names = data_input_names(block, input_names_given)
    try:
        inference, training = trace_plain(tracer, block, names)
    except (TypeError, ValueError, AssertionError, mx.base.MXNetError) as error:
        # nd.* in hybrid_forward or the wrong front end fails every trace: say so now
        if input_names_given is not None or isinstance(error, numpy_interface.FrontEndError) \
                or (isinstance(error, ImperativeCallError) and error.method == "hybrid_forward"):
            raise
        return _deferred_traces(block, tracer, numpy, error)
    plain = (len(names), inference.positions, inference.out_fmt)
    plain_training = training and (training.data_names, training.positions, training.out_fmt)
    return _Traced((inference.graph, training and training.graph), inference.data_names, tracer,
                   plain, plain_training, numpy)


def _deferred_traces(block, tracer, numpy, error):
    """Inputs that must be nested (a decoder's ``[memory, mask]`` states): every call is traced
    at its first use, which also casts the parameters.  Until then the graph holds the parameters
    (or, for a block without any, a constant), and a failed later trace names this first error."""
    params = list(block.collect_params().items())
    graph = mx.sym.Group([mx.sym.var(name, dtype=param.dtype) for name, param in params]) \
        if params else mx.sym.zeros((1,), name="untraced")
    first = f"{type(error).__name__}: {' '.join(str(error).split())[:400]}"

    def trace(*args, **kwargs):
        try:
            return tracer(*args, **kwargs)
        except TypeError as later:
            raise TypeError(f"{later} (at the cast, the call with plain inputs failed too: "
                            f"{first})") from None
    return _Traced((graph, None), [], trace, (0, [], None), None, numpy)


def _cast_network(block, dtype, mode, traced):
    """The :class:`CastBlock` of the traces, with the block's hybridize settings."""
    keys = block.param_keys if isinstance(block, CastBlock) else \
        mxnet_internals.block_param_keys(block)
    cast = CastBlock(traced.graphs, traced.data_names, block.collect_params(), keys, dtype,
                     tracer=traced.tracer, plain=traced.plain,
                     original=None if traced.tracer is None else block,
                     plain_training=traced.plain_training, numpy=traced.numpy)
    cast.recast = functools.partial(cast_symbol, mode=mode)  # export's float16 graph
    flags = mxnet_internals.hybridize_flags(block)
    if flags is not None:
        cast.hybridize(True, **flags)
    return cast
