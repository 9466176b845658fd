"""AMP's conversions for inference (``convert_symbol``, ``convert_model``, ``convert_hybrid_block``,
``convert_bucketing_module``), with MXNet AMP's arguments and their meaning.

``convert_symbol`` and ``convert_model`` are pure graph transforms: the real float16 (bfloat16)
graph on any machine, as MXNet's.  Without op lists mxfp16's rules decide (:func:`mxfp16.cast_symbol`:
the lists of :mod:`.lists` plus the rules that depend on an op's place); with ``target_dtype_ops``,
``fp32_ops``, ``conditional_fp32_ops`` or ``excluded_sym_names``, MXNet's own AMP pass decides op
by op with them (mxfp16's lists for the ones not given), as it does when code has extended the
lists or the graph already holds AMP casts.  A float16 graph bound on a CPU fails at its first
forward with one line saying why (:mod:`.cpu_guard`), where MXNet's fails there too.

Float16 is emulated on a CPU (float32 compute, float16 rounding: :mod:`mxfp16.casting.emulation`)
only where the result runs there: ``convert_hybrid_block`` with a CPU ``ctx``,
``convert_bucketing_module`` of a CPU module, or ``emulate=True``.
"""
import mxnet as mx
from mxnet import gluon

from .. import mxnet_internals, numpy_interface
from ..casting import cast_params
from ..casting.deploy import float32_value
from ..casting.emulation import resolve_emulate
from ..casting.graph import MARK, GraphRewriter
from ..casting.keep import block_keep, graph_keep, kept_ops
from .cpu_guard import cpu_error, float16_gemms, guarded
from .lists import (AmpArgumentError, AmpTypeError, check_op_lists, default_lists,
                    lists_extended, target_dtype_name)
from .passes import check_excluded, emulated, mxnet_data_names, with_op_lists, with_rules


def _holds_amp_casts(sym):
    """Whether the graph has AMP casts of its own (not mxfp16's): MXNet's pass owns their meaning
    for the inputs they read (MXNet's tests of ``cast_optional_params`` build such graphs)."""
    return any(node["op"] in ("amp_cast", "amp_multicast") and MARK not in node.get("attrs", {})
               for node in GraphRewriter(sym, drop_inserted=False).old_nodes)


def _convert(sym, dtype, lists, excluded, data_names, cast_optional_params, emulate):
    """The converted graph: MXNet's pass with op lists, or mxfp16's rules."""
    emulate = resolve_emulate(bool(emulate), dtype)
    if not lists and not excluded and (lists_extended(dtype) or _holds_amp_casts(sym)):
        lists = default_lists(dtype)
    if not (lists or excluded):
        graph = with_rules(sym, dtype, data_names, cast_optional_params, emulate)
    else:
        graph = with_op_lists(sym, dtype, lists, excluded, data_names, cast_optional_params)
        if emulate:
            return emulated(sym, graph, mxnet_data_names(sym, data_names))
    return graph if emulate else guarded(graph, mxnet_data_names(sym, data_names))


def _excluded(sym, excluded_sym_names, keep):
    """``excluded_sym_names`` with the names of the ops ``keep`` keeps (None: as given)."""
    if keep is None:
        return excluded_sym_names
    return list(dict.fromkeys(list(excluded_sym_names or []) + kept_ops(sym, keep)))


def convert_symbol(sym, target_dtype="float16", target_dtype_ops=None, fp32_ops=None,
                   conditional_fp32_ops=None, excluded_sym_names=None, data_names=None,
                   cast_optional_params=False, *, emulate=False, keep_float32=None):
    """A float32 graph in mixed precision, as ``mxnet.contrib.amp.convert_symbol``.

    Parameters
    ----------
    sym : mx.sym.Symbol
    target_dtype : {'float16', 'bfloat16'}
    target_dtype_ops, fp32_ops, conditional_fp32_ops : list or None
        Override MXNet AMP's lists (:mod:`mxfp16.amp.lists`); given, MXNet's AMP pass decides.
    excluded_sym_names : list of str or None
        Ops (by node name) kept in float32, their parameters too: MXNet's AMP pass runs them in
        float32 (mxfp16's lists for the ops not named).
    data_names : list of str or None
        The data inputs (float32, cast where needed); None: every input without ``__dtype__``.
    cast_optional_params : bool
        Store a parameter that is only cast to float16 (bfloat16) in that dtype.
    emulate : bool
        mxfp16's addition: the CPU emulation graph of float16 (float32 compute, float16
        rounding) instead of the real float16 graph.
    keep_float32 : str or list of str, optional
        mxfp16's addition: globs of op names and of the Gluon names they start with
        (``'net0_att0'``, as :func:`mxfp16.cast_symbol`'s); the ops they select join
        ``excluded_sym_names``.  A glob that selects no op is one ``ValueError`` naming it.

    Returns
    -------
    mx.sym.Symbol
        The same graph on any machine.  A float16 one binds on a CPU, as MXNet's, and its first
        forward there raises one line saying why it cannot run and what to do.

    Raises
    ------
    AmpArgumentError
        (an ``AssertionError`` and a ``ValueError``) for another dtype or invalid op lists.

    Examples
    --------
    >>> import mxnet as mx
    >>> fc = mx.sym.FullyConnected(mx.sym.var('data'), num_hidden=2, name='fc')
    >>> out = convert_symbol(fc, data_names=['data'], cast_optional_params=True)
    >>> types = dict(zip(out.list_arguments(), out.infer_type(data='float32')[0]))
    >>> types['fc_weight'].__name__, out.infer_type(data='float32')[1][0].__name__
    ('float16', 'float32')
    """
    if not isinstance(sym, mx.sym.Symbol):
        raise AmpTypeError(f"convert_symbol takes an mx.sym.Symbol, got {type(sym).__name__}")
    dtype = target_dtype_name(target_dtype)
    lists = check_op_lists(dtype, target_dtype_ops, conditional_fp32_ops, fp32_ops)
    keep = None if keep_float32 is None else graph_keep(sym, keep_float32)
    excluded = _excluded(sym, check_excluded(excluded_sym_names), keep)
    return _convert(sym, dtype, lists, excluded, data_names, cast_optional_params, emulate)


def convert_model(sym, arg_params, aux_params, target_dtype="float16", target_dtype_ops=None,
                  fp32_ops=None, conditional_fp32_ops=None, excluded_sym_names=None,
                  cast_optional_params=False, *, emulate=False, keep_float32=None):
    """A float32 checkpoint in mixed precision: ``(sym, arg_params, aux_params)`` converted, each
    parameter in the dtype the converted graph gives it (bfloat16 stored as MXNet stores it), as
    ``mxnet.contrib.amp.convert_model``.  The inputs that are not parameters are data; the other
    arguments are :func:`convert_symbol`'s.

    Raises
    ------
    AmpTypeError
        If ``sym`` is not a Symbol or the parameters are not dicts.
    AmpArgumentError
        For another dtype or invalid op lists.

    Examples
    --------
    >>> import mxnet as mx
    >>> fc = mx.sym.FullyConnected(mx.sym.var('data'), num_hidden=2, name='fc')
    >>> args = {'fc_weight': mx.nd.ones((2, 3)), 'fc_bias': mx.nd.zeros(2)}
    >>> sym, args16, aux16 = convert_model(fc, args, {}, cast_optional_params=True)
    >>> args16['fc_weight'].dtype.__name__
    'float16'
    """
    if not isinstance(arg_params, dict) or not isinstance(aux_params, dict):
        raise AmpTypeError("convert_model takes arg_params and aux_params as dicts of name to "
                           "NDArray, as mx.model.load_checkpoint returns them")
    if not isinstance(sym, mx.sym.Symbol):
        raise AmpTypeError(f"convert_model takes an mx.sym.Symbol, got {type(sym).__name__}")
    data_names = [name for name in sym.list_inputs()
                  if name not in arg_params and name not in aux_params]
    converted = convert_symbol(sym, target_dtype, target_dtype_ops, fp32_ops,
                               conditional_fp32_ops, excluded_sym_names, data_names,
                               cast_optional_params, emulate=emulate, keep_float32=keep_float32)
    args, aux = cast_params(arg_params, aux_params, converted, data_names=data_names,
                            allow_missing=True, allow_extra=True)
    return converted, dict(arg_params, **args), dict(aux_params, **aux)


def _contexts(ctx):
    ctx = ctx if ctx is not None else mx.current_context()
    return ctx, ctx if isinstance(ctx, (list, tuple)) else [ctx]


def _block_graph(block):
    try:
        inputs, sym = mxnet_internals.symbol_block_graph(block)
    except (AttributeError, TypeError, ValueError):
        inputs = sym = None
    if sym is None:
        raise RuntimeError("convert_hybrid_block needs the block's graph: call block.hybridize() "
                           "and run one forward pass before converting it, as with MXNet AMP")
    return [symbol.name for symbol in inputs], sym


def convert_hybrid_block(block, target_dtype="float16", target_dtype_ops=None, fp32_ops=None,
                         conditional_fp32_ops=None, excluded_sym_names=None, ctx=None,
                         cast_optional_params=False, *, emulate=None, keep_float32=None):
    """A new ``SymbolBlock`` running ``block`` in mixed precision, for inference, as
    ``mxnet.contrib.amp.convert_hybrid_block``; ``block`` and its float32 values stay as they are.

    ``block`` must have been hybridized and called once (its graph is the one it cached), as
    MXNet AMP requires.  ``ctx`` (a Context or a list) is where the parameters live; None means
    the current context (MXNet AMP's default is ``mx.gpu(0)``).  ``emulate`` None: float16 is
    emulated when ``ctx`` is a CPU.  ``excluded_sym_names`` are op names kept float32, as MXNet's;
    mxfp16's ``keep_float32`` selects blocks as :func:`mxfp16.cast_block`'s (block paths, Gluon
    names, Block subclasses, Blocks of ``block``): their ops join ``excluded_sym_names``.

    Raises
    ------
    AmpTypeError
        If ``block`` is not a HybridBlock.
    RuntimeError
        If it has not run hybridized yet.
    ValueError
        For a ``keep_float32`` selector that matches no block of ``block``.
    mx.base.MXNetError
        For ``emulate=False`` with a CPU ``ctx``: the float16 graph cannot run there.

    Examples
    --------
    >>> import mxnet as mx
    >>> net = mx.gluon.nn.Dense(2, in_units=3)
    >>> net.initialize(); net.hybridize(); _ = net(mx.nd.ones((1, 3)))
    >>> converted = convert_hybrid_block(net, ctx=mx.cpu())
    >>> converted(mx.nd.ones((1, 3))).dtype.__name__, net.weight.data().dtype.__name__
    ('float32', 'float32')
    """
    if not isinstance(block, gluon.HybridBlock):
        raise AmpTypeError(f"convert_hybrid_block takes a gluon.HybridBlock, got "
                           f"{type(block).__name__}")
    ctx, contexts = _contexts(ctx)
    dtype = target_dtype_name(target_dtype)
    on_cpu = any(context.device_type == "cpu" for context in contexts)
    emulate = (dtype == "float16" and on_cpu) if emulate is None else emulate
    data_names, sym = _block_graph(block)
    keep = None if keep_float32 is None else block_keep(block, keep_float32)[0]
    converted = convert_symbol(sym, dtype, target_dtype_ops, fp32_ops, conditional_fp32_ops,
                               _excluded(sym, check_excluded(excluded_sym_names), keep),
                               data_names, cast_optional_params, emulate=emulate)
    if on_cpu and dtype == "float16" and not emulate and float16_gemms(converted, data_names):
        raise cpu_error(float16_gemms(converted, data_names))
    values = {name: float32_value(param) for name, param in block.collect_params().items()}
    aux_names = set(sym.list_auxiliary_states())
    args, aux = cast_params({k: v for k, v in values.items() if k not in aux_names},
                            {k: v for k, v in values.items() if k in aux_names}, converted,
                            data_names=data_names, allow_missing=True, allow_extra=True)
    numpy = numpy_interface.numpy_mode()  # np arrays in and out for a NumPy-interface block
    result = gluon.SymbolBlock(numpy_interface.numpy_symbol(converted, numpy),
                               [numpy_interface.numpy_symbol(mx.sym.var(name, dtype='float32'),
                                                             numpy) for name in data_names])
    loaded = dict(args, **aux)
    for name, param in result.collect_params().items():
        if name in loaded and param.dtype != loaded[name].dtype:
            param.cast(loaded[name].dtype)
    result.collect_params().load_dict(loaded, ctx=ctx)
    return result


class ConvertedBucketingModule(mx.mod.BucketingModule):
    """The ``BucketingModule`` ``convert_bucketing_module`` returns: every bucket's graph
    converted, and ``bind`` again with other ``for_training``/``inputs_need_grad`` rebinds (with
    the converted parameters) where a BucketingModule would ignore it."""

    def bind(self, data_shapes, label_shapes=None, for_training=True, inputs_need_grad=False,
             force_rebind=False, shared_module=None, grad_req="write"):
        if self.binded and (for_training, inputs_need_grad) != (self.for_training,
                                                                self.inputs_need_grad):
            force_rebind = True
        super().bind(data_shapes, label_shapes, for_training, inputs_need_grad, force_rebind,
                     shared_module, grad_req)


def _checked_bucketing(bucketing_mod):
    if not isinstance(bucketing_mod, mx.mod.BucketingModule):
        raise AmpTypeError(f"convert_bucketing_module takes an mx.mod.BucketingModule, got "
                           f"{type(bucketing_mod).__name__}: convert a Module's symbol with "
                           "convert_model")
    if not bucketing_mod.binded or not bucketing_mod.params_initialized:
        raise AmpArgumentError("convert_bucketing_module needs a bound BucketingModule with its "
                               "parameters initialized: call bind() and init_params() (or "
                               "set_params) first")


def convert_bucketing_module(bucketing_mod, target_dtype="float16", target_dtype_ops=None,
                             fp32_ops=None, conditional_fp32_ops=None, excluded_sym_names=None,
                             cast_optional_params=False, *, emulate=None, keep_float32=None):
    """A new ``BucketingModule`` whose buckets, those bound so far and every later one, run in
    mixed precision, with the module's parameters converted, as
    ``mxnet.contrib.amp.convert_bucketing_module``.  It comes bound to the default bucket as the
    module was (for training or not); it switches buckets, trains and predicts in each.
    ``emulate`` None: float16 is emulated when the module runs on a CPU.  ``keep_float32``:
    op-name globs, as :func:`convert_symbol`'s.

    Raises
    ------
    AmpTypeError
        If ``bucketing_mod`` is not a BucketingModule.
    AmpArgumentError
        If it has no bound bucket or its parameters are not initialized.
    """
    _checked_bucketing(bucketing_mod)
    arg_params, aux_params = bucketing_mod.get_params()
    sym_gen, default_key, context = mxnet_internals.bucketing_module_spec(bucketing_mod)
    _, contexts = _contexts(context)
    dtype = target_dtype_name(target_dtype)
    if emulate is None:
        emulate = dtype == "float16" and any(c.device_type == "cpu" for c in contexts)
    options = dict(target_dtype=dtype, target_dtype_ops=target_dtype_ops, fp32_ops=fp32_ops,
                   conditional_fp32_ops=conditional_fp32_ops,
                   excluded_sym_names=excluded_sym_names,
                   cast_optional_params=cast_optional_params, emulate=emulate,
                   keep_float32=keep_float32)
    _, args, aux = convert_model(sym_gen(default_key)[0], arg_params, aux_params, **options)
    params = set(args) | set(aux)

    def converted_gen(bucket_key):
        sym, data_names, label_names = sym_gen(bucket_key)
        inputs = [name for name in sym.list_inputs() if name not in params]
        return convert_symbol(sym, data_names=inputs, **options), data_names, label_names

    default = mxnet_internals.bucket_modules(bucketing_mod)[default_key]
    module = ConvertedBucketingModule(converted_gen, default_bucket_key=default_key,
                                      context=context, logger=bucketing_mod.logger)
    module.bind(default.data_shapes, default.label_shapes, for_training=default.for_training,
                inputs_need_grad=default.inputs_need_grad)
    module.set_params(args, aux, allow_missing=False, allow_extra=True)
    return module
