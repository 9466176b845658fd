"""AMP's conversions for inference (``convert_symbol``, ``convert_model``, ``convert_hybrid_block``,
``convert_bucketing_module``), on mxfp16's casting.

Without op lists a graph is cast by mxfp16's rules (:func:`mxfp16.cast_symbol`, outputs float32);
with ``target_dtype_ops``, ``fp32_ops``, ``conditional_fp32_ops`` or ``excluded_sym_names`` MXNet's
own AMP pass decides op by op with those lists.  Either way float16 is emulated where MXNet sees no
GPU (the CPU has no float16 GEMM), so the converted model runs on any machine.
"""
import mxnet as mx
from mxnet import gluon
from mxnet.contrib.amp import amp as _mx_amp

from .. import mxnet_internals
from ..casting import cast_params, cast_symbol, resolve_emulate
from ..casting.deploy import float32_value
from ..casting.emulation import emulate_float16
from ..casting.graph import internal_dtypes
from .lists import check_op_lists, target_dtype_name


def _default_data_names(sym, param_names=()):
    """AMP's default data inputs: the inputs that are neither parameters nor labels."""
    params = set(param_names)
    names = [name for name in sym.list_inputs()
             if name not in params and not name.endswith("label")]
    if not param_names:  # a bare symbol: its data, as MXNet's examples name it
        names = [name for name in names if name == "data" or name.startswith("data")] or names[:1]
    return names


def _with_lists(sym, dtype, data_names, lists, excluded, cast_optional_params):
    """MXNet's AMP pass with the user's lists; float16 emulated on a machine without a GPU."""
    gpu_graph = _mx_amp.convert_symbol(
        sym, target_dtype=dtype, target_dtype_ops=lists.get("target_precision_ops"),
        fp32_ops=lists.get("fp32_ops"), conditional_fp32_ops=lists.get("conditional_fp32_ops"),
        excluded_sym_names=excluded, data_names=list(data_names),
        cast_optional_params=cast_optional_params)
    if dtype != "float16" or not resolve_emulate(None, dtype):
        return gpu_graph
    return emulate_float16(sym, internal_dtypes(gpu_graph, list(data_names)), list(data_names))


def convert_symbol(sym, target_dtype="float16", target_dtype_ops=None, fp32_ops=None,
                   conditional_fp32_ops=None, excluded_sym_names=None, data_names=None,
                   cast_optional_params=False):
    """A float32 graph in mixed precision, as ``mxnet.contrib.amp.convert_symbol``.

    Parameters
    ----------
    sym : mx.sym.Symbol
    target_dtype : {'float16', 'bfloat16'}
    target_dtype_ops, fp32_ops, conditional_fp32_ops, excluded_sym_names : list or None
        MXNet AMP's overrides; given, MXNet's AMP pass decides with them, else mxfp16's rules.
    data_names : list of str or None
        The data inputs; None: ``data`` (the inputs named ``data*``).
    cast_optional_params : bool
        For MXNet's pass: float16 parameters where a cast would follow.

    Returns
    -------
    mx.sym.Symbol

    Examples
    --------
    >>> import mxnet as mx
    >>> fc = mx.sym.FullyConnected(mx.sym.var('data'), num_hidden=2, name='fc')
    >>> out = convert_symbol(fc)
    >>> out.infer_type(data='float32')[1][0].__name__
    'float32'
    """
    dtype = target_dtype_name(target_dtype)
    lists = check_op_lists(dtype, target_dtype_ops, conditional_fp32_ops, fp32_ops)
    data_names = list(data_names) if data_names is not None else _default_data_names(sym)
    if lists or excluded_sym_names:
        return _with_lists(sym, dtype, data_names, lists, excluded_sym_names,
                           cast_optional_params)
    return cast_symbol(sym, dtype, data_names=data_names)


def convert_model(sym, arg_params, aux_params, target_dtype="float16", target_dtype_ops=None,
                  fp32_ops=None, conditional_fp32_ops=None, excluded_sym_names=None,
                  cast_optional_params=False):
    """A float32 checkpoint in mixed precision: ``(sym, arg_params, aux_params)`` converted, each
    parameter in the dtype the converted graph gives it, as ``mxnet.contrib.amp.convert_model``.

    Examples
    --------
    >>> import mxnet as mx
    >>> fc = mx.sym.FullyConnected(mx.sym.var('data'), num_hidden=2, name='fc')
    >>> args = {'fc_weight': mx.nd.ones((2, 3)), 'fc_bias': mx.nd.zeros(2)}
    >>> sym, args16, aux16 = convert_model(fc, args, {})
    >>> args16['fc_weight'].dtype.__name__
    'float16'
    """
    if not isinstance(arg_params, dict) or not isinstance(aux_params, dict):
        raise TypeError("convert_model takes arg_params and aux_params as dicts of name to "
                        "NDArray, as mx.model.load_checkpoint returns them")
    data_names = _default_data_names(sym, list(arg_params) + list(aux_params))
    converted = convert_symbol(sym, target_dtype, target_dtype_ops, fp32_ops,
                               conditional_fp32_ops, excluded_sym_names, data_names,
                               cast_optional_params)
    args, aux = cast_params(arg_params, aux_params, converted, data_names=data_names,
                            allow_missing=True, allow_extra=True)
    return converted, args, aux


def convert_hybrid_block(block, target_dtype="float16", target_dtype_ops=None, fp32_ops=None,
                         conditional_fp32_ops=None, excluded_sym_names=None, ctx=None,
                         cast_optional_params=False):
    """A new ``SymbolBlock`` running ``block`` in mixed precision, for inference, as
    ``mxnet.contrib.amp.convert_hybrid_block``; ``block`` and its float32 values stay as they are.

    ``block`` must have been hybridized and called once (its graph is the one it cached), as
    MXNet AMP requires.  ``ctx`` None means the current context (MXNet AMP's default is
    ``mx.gpu(0)``).

    Examples
    --------
    >>> import mxnet as mx
    >>> net = mx.gluon.nn.Dense(2, in_units=3)
    >>> net.initialize(); net.hybridize(); _ = net(mx.nd.ones((1, 3)))
    >>> converted = convert_hybrid_block(net)
    >>> converted(mx.nd.ones((1, 3))).dtype.__name__, net.weight.data().dtype.__name__
    ('float32', 'float32')
    """
    if not isinstance(block, gluon.HybridBlock):
        raise TypeError(f"convert_hybrid_block takes a gluon.HybridBlock, got "
                        f"{type(block).__name__}")
    try:
        inputs, sym = mxnet_internals.symbol_block_graph(block)
    except (AttributeError, TypeError, ValueError):
        inputs = sym = None
    if sym is None:
        raise RuntimeError("convert_hybrid_block needs the block's graph: call block.hybridize() "
                           "and run one forward pass before converting it, as with MXNet AMP")
    data_names = [symbol.name for symbol in inputs]
    params = block.collect_params()
    values = {name: float32_value(param) for name, param in params.items()}
    aux_names = set(sym.list_auxiliary_states())
    converted = convert_symbol(sym, target_dtype, target_dtype_ops, fp32_ops,
                               conditional_fp32_ops, excluded_sym_names, data_names,
                               cast_optional_params)
    args, aux = cast_params({k: v for k, v in values.items() if k not in aux_names},
                            {k: v for k, v in values.items() if k in aux_names}, converted,
                            data_names=data_names, allow_missing=True, allow_extra=True)
    result = gluon.SymbolBlock(converted, [mx.sym.var(name, dtype='float32') for name in data_names])
    loaded = dict(args, **aux)
    for name, param in result.collect_params().items():
        if name in loaded and param.dtype != loaded[name].dtype:
            param.cast(loaded[name].dtype)
    result.collect_params().load_dict(loaded, ctx=ctx or mx.current_context())
    return result


def convert_bucketing_module(bucketing_mod, target_dtype="float16", target_dtype_ops=None,
                             fp32_ops=None, conditional_fp32_ops=None, excluded_sym_names=None,
                             cast_optional_params=False):
    """A new ``BucketingModule`` whose buckets, the present and every later one, run in mixed
    precision, with the module's parameters converted, as
    ``mxnet.contrib.amp.convert_bucketing_module``.

    Raises
    ------
    TypeError
        If ``bucketing_mod`` is not a BucketingModule.
    ValueError
        If it has no bound bucket or its parameters are not initialized.
    """
    if not isinstance(bucketing_mod, mx.mod.BucketingModule):
        raise TypeError(f"convert_bucketing_module takes an mx.mod.BucketingModule, got "
                        f"{type(bucketing_mod).__name__}: convert a Module's symbol with "
                        "convert_model")
    if not bucketing_mod.binded or not bucketing_mod.params_initialized:
        raise ValueError("convert_bucketing_module needs a bound BucketingModule with its "
                         "parameters initialized: call bind() and init_params() (or "
                         "set_params) first")
    arg_params, aux_params = bucketing_mod.get_params()
    options = dict(target_dtype=target_dtype, target_dtype_ops=target_dtype_ops,
                   fp32_ops=fp32_ops, conditional_fp32_ops=conditional_fp32_ops,
                   excluded_sym_names=excluded_sym_names,
                   cast_optional_params=cast_optional_params)
    sym_gen, default_key, context = mxnet_internals.bucketing_module_spec(bucketing_mod)

    def converted_gen(bucket_key):
        sym, data_names, label_names = sym_gen(bucket_key)
        return convert_symbol(sym, data_names=list(data_names), **options), data_names, \
            label_names

    sym, _, _ = converted_gen(default_key)
    _, args, aux = convert_model(sym_gen(default_key)[0], arg_params, aux_params, **options)
    module = mx.mod.BucketingModule(converted_gen, default_bucket_key=default_key,
                                    context=context,
                                    logger=bucketing_mod.logger)
    module.bind(bucketing_mod.data_shapes, bucketing_mod.label_shapes, for_training=False)
    module.set_params(args, aux, allow_missing=False, allow_extra=True)
    return module
