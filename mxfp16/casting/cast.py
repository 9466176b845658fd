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
from .keep import Keep, block_keep, graph_keep, kept_ops
from .rules import check_dtype, check_mode
from .selectors import block_paths
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


def _graph_keep(sym, keep_float32):
    """The :class:`~mxfp16.casting.keep.Keep` of a graph's ``keep_float32`` (None: nothing kept)."""
    if keep_float32 is None or isinstance(keep_float32, Keep):
        return keep_float32
    if isinstance(keep_float32, (list, tuple)) and not keep_float32:
        return None
    return graph_keep(sym, keep_float32)


def cast_symbol(sym, dtype="float16", emulate=None, mode="full", data_names=("data",),
                keep_float32=None):
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
    keep_float32 : str, gluon.Block, or a sequence of them, optional
        Ops that run in float32, with float32 parameters, whatever the cast: a string is a glob
        matched against each op's name and the Gluon names it starts with (``'fc2'``,
        ``'resnetv10_stage4_*'``: the op ``'resnetv10_stage4_conv0_fwd'`` carries the names
        ``'resnetv10'``, ``'resnetv10_stage4'``, ``'resnetv10_stage4_conv0'``); a Block of the
        network the graph was traced from selects the ops its prefixes (and those of the blocks
        inside it) start.  Casts sit only where a kept op meets a float16 op.  See
        :func:`cast_block`.

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
        For an unknown ``dtype`` or ``mode``, a data name the graph does not have, or a
        ``keep_float32`` selector that selects no op (naming it and the nearest names).

    Examples
    --------
    >>> import mxnet as mx
    >>> net = mx.sym.FullyConnected(mx.sym.var('data'), num_hidden=4, name='fc')
    >>> net = mx.sym.SoftmaxOutput(net, name='softmax')
    >>> cast = cast_symbol(net, 'float16', emulate=False)
    >>> arg_types, _, _ = cast.infer_type(data='float32')
    >>> dict(zip(cast.list_arguments(), [t.__name__ for t in arg_types]))['fc_weight']
    'float16'
    >>> kept = cast_symbol(net, 'float16', emulate=False, keep_float32=['fc'])
    >>> arg_types, _, _ = kept.infer_type(data='float32')
    >>> dict(zip(kept.list_arguments(), [t.__name__ for t in arg_types]))['fc_weight']
    'float32'
    """
    if not isinstance(sym, mx.sym.Symbol):
        raise TypeError(f"cast_symbol takes an mx.sym.Symbol, got {_describe(sym)}: "
                        "use cast_block for a Gluon block")
    dtype = check_dtype(dtype)
    check_mode(mode)
    data_names = tuple(data_names)
    _check_data_names(sym, data_names)
    keep = _graph_keep(sym, keep_float32)  # checked in float32 too: a typo fails every dtype
    if dtype == "float32":
        return sym
    if dtype == "bfloat16":
        resolve_emulate(emulate, dtype)
        return cast_with_amp(sym, dtype, data_names, keep)
    gpu = cast_whole_graph(sym, data_names, keep) if mode == "full" else \
        cast_with_amp(sym, dtype, data_names, keep)
    if not resolve_emulate(emulate, dtype):
        return gpu
    plan = internal_dtypes(gpu, data_names)
    return emulate_float16(sym, plan, data_names, frozenset(kept_ops(sym, keep)))



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



def cast_block(block, dtype="float16", emulate=None, mode="full", input_names=None,
               keep_float32=None):
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
    keep_float32 : selector or sequence of selectors, optional
        Blocks whose ops run in float32 and whose parameters stay float32, whatever ``dtype``
        and ``mode`` (the fix for a layer that overflows float16).  A selector is a Block of the
        network (``net.encoder.attention``), a Block subclass (every instance), or a glob
        (``fnmatch``, case-sensitive) matched against the block paths, the children's names
        joined by ``'.'`` as ``print(net)`` shows them (``'features.3'``,
        ``'encoder.*.attention'``), and against the blocks' Gluon names (``'dense0'``); a string
        matching other blocks as a path than as a name is refused.  A selected block keeps every
        block inside it.  An op is kept when the block it belongs to is (the innermost block
        whose Gluon prefix starts the op's name: ``hybrid_forward`` runs in the block's
        ``name_scope``), so the parent's own ops between its children (a residual addition) are
        the parent's.  Casts sit only where a kept op meets a float16 op (mode ``'amp'``: MXNet
        AMP's pass keeps them through its ``excluded_sym_names``); the CPU emulation reads the
        data unrounded into a kept op and rounds a kept op's output where a float16 op reads it,
        as the GPU graph casts it there.  For a ``SymbolBlock`` (whose blocks are gone) a string
        is a glob of its op names and of the Gluon names they start with
        (``'resnetv10_stage4'``), and a Block of the network it was traced from selects the ops
        of its prefixes; a plain Block's kept parts stay float32 HybridBlocks, uncast.
        A selector that matches nothing is one ``ValueError`` naming it and the nearest block
        paths, also with ``dtype='float32'``.  Checkpoints are unchanged: float32 values under the
        float32 network's names.  The cast network's ``keep_float32`` lists the kept paths and
        ``kept_ops`` the kept ops of its inference graph.

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
        For an unknown ``dtype`` or ``mode``, or a ``keep_float32`` selector that matches no
        block (or other blocks as a path than as a Gluon name).

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

    One block kept in float32 (its path, as ``print(net)`` shows it):

    >>> net = nn.HybridSequential()
    >>> net.add(nn.Dense(8, in_units=3), nn.Dense(8, in_units=8), nn.Dense(2, in_units=8))
    >>> net.initialize()
    >>> net16 = cast_block(net, 'float16', keep_float32=['1'])
    >>> [layer.weight.data().dtype.__name__ for layer in net], net16.keep_float32
    (['float16', 'float32', 'float16'], ('1',))
    """
    plain = isinstance(block, gluon.Block) and not isinstance(block, gluon.HybridBlock) \
        and bool(mxnet_internals.block_children(block))
    if not (plain or isinstance(block, gluon.HybridBlock)):
        raise TypeError(f"cast_block takes a gluon.HybridBlock, got {_describe(block)}: "
                        "make the network hybridizable, or pass a Symbol to cast_symbol")
    dtype = check_dtype(dtype)
    check_mode(mode)
    keep = _block_keep(block, keep_float32)  # checked in float32 too: a typo fails every dtype
    if dtype == "float32":
        return block
    if plain:  # its HybridBlock parts cast in place, float32 checkpoints (see plain_block)
        return _cast_plain(block, keep, functools.partial(cast_block, dtype=dtype,
                                                          emulate=emulate, mode=mode))
    if dtype == "bfloat16":
        _default_layouts(block.collect_params())
    cast_graph = functools.partial(cast_symbol, dtype=dtype, emulate=emulate, mode=mode,
                                   keep_float32=keep)
    traced = _symbol_block_traces(block, cast_graph) if isinstance(block, gluon.SymbolBlock) \
        else _hybrid_block_traces(block, cast_graph, input_names_given=input_names)
    return _cast_network(block, dtype, mode, traced, keep)


def _block_keep(block, keep_float32):
    """The :class:`~mxfp16.casting.keep.Keep` of ``keep_float32`` on a network (None: nothing
    kept): by its blocks, or by the names of its graph's ops for a ``SymbolBlock`` that is not a
    cast network (whose blocks are gone)."""
    if keep_float32 is None or isinstance(keep_float32, Keep):
        return keep_float32
    if isinstance(keep_float32, (list, tuple)) and not keep_float32:
        return None
    if isinstance(block, gluon.SymbolBlock) and vars(block).get("_original") is None:
        return graph_keep(_block_graphs(block)[1], keep_float32)
    return block_keep(block, keep_float32)[0]


def _cast_plain(block, keep, cast):
    """A plain Block's HybridBlock parts cast in place with ``cast``: a part ``keep`` keeps whole
    stays float32, the others are cast keeping the blocks ``keep`` keeps inside them."""
    if keep is None:
        return cast_children(block, lambda child, path: cast(child))
    paths = block_paths(block)

    def cast_part(child, path):
        if path in keep.paths:
            return child
        inside = [paths[p] for p in keep.paths if p.startswith(path + ".")]
        return cast(child, keep_float32=inside or None)
    cast_children(block, cast_part)
    block.keep_float32 = keep.paths
    return block


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


def _cast_network(block, dtype, mode, traced, keep=None):
    """The :class:`CastBlock` of the traces, with the block's hybridize settings and what
    ``keep`` (``keep_float32``'s) keeps."""
    keys = block.param_keys if isinstance(block, CastBlock) else \
        mxnet_internals.block_param_keys(block)
    cast = CastBlock(traced.graphs, traced.data_names, block.collect_params(), keys, dtype,
                     tracer=traced.tracer, plain=traced.plain,
                     original=None if traced.tracer is None else block,
                     plain_training=traced.plain_training, numpy=traced.numpy)
    # export's float16 graph, with the same blocks kept
    cast.recast = functools.partial(cast_symbol, mode=mode, keep_float32=keep)
    cast._keep = keep
    cast.keep_float32 = () if keep is None else keep.paths
    flags = mxnet_internals.hybridize_flags(block)
    if flags is not None:
        cast.hybridize(True, **flags)
    return cast
