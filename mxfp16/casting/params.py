"""Converting float32 checkpoint parameters to the dtypes a cast graph expects: fine-tuning a float32
pretrained model in float16 with ``mx.mod.Module``, or deploying a bfloat16 one."""
import mxnet as mx
import numpy as np

from .graph import internal_dtypes

#: MXNet's bfloat16 dtype (``mxnet.contrib.amp.amp.bfloat16``), which numpy names ``'void16'``.
BFLOAT16 = np.dtype([("bfloat16", np.uint16)])


def stored_as(value, dtype_name):
    """``value`` in the dtype numpy names ``dtype_name``, as MXNet stores it: a bfloat16 value
    (numpy's ``'void16'``) through ``amp_cast``, as MXNet AMP's conversions store it.

    Examples
    --------
    >>> stored_as(mx.nd.array([1.5, 3.14159]), 'void16').dtype == BFLOAT16
    True
    """
    if dtype_name in ("void16", "bfloat16"):
        return mx.nd.amp_cast(value, dtype=BFLOAT16)
    return value.astype(dtype_name, copy=False)


def _input_names(sym, data_names, label_names):
    """The graph's arguments that are data or labels, not parameters."""
    labels = label_names if label_names is not None else [
        name for name in sym.list_arguments() if name.endswith("label")]
    return set(data_names) | set(labels)


def _checked(given, expected, allow_missing, allow_extra):
    """The values of ``given`` the graph expects, after the missing/extra checks."""
    given = dict(given or {})
    missing = [n for n in expected if n not in given]
    extra = [n for n in given if n not in expected]
    if missing and not allow_missing:
        raise ValueError(f"the checkpoint has no value for parameter(s) {missing}: pass "
                         "allow_missing=True to leave them to the initializer")
    if extra and not allow_extra:
        raise ValueError(f"the checkpoint has parameter(s) {extra} that the graph does not "
                         "use: pass allow_extra=True to ignore them, or check the network")
    return {n: v for n, v in given.items() if n in expected}


def cast_params(arg_params, aux_params, sym, data_names=("data",), label_names=None,
                allow_missing=False, allow_extra=False):
    """Convert float32 checkpoint parameters to the dtypes a cast symbol expects.

    Use it to fine-tune a float32 pretrained model in float16 with ``mx.mod.Module``.

    Parameters
    ----------
    arg_params, aux_params : dict of str to NDArray
        As ``mx.model.load_checkpoint`` returns them.
    sym : mx.sym.Symbol
        The graph the parameters are for, usually the output of :func:`cast_symbol`.
    data_names : sequence of str
        The graph's data inputs (not parameters).
    label_names : sequence of str or None
        The graph's label inputs; ``None`` means the arguments whose names end in ``label``.
    allow_missing : bool
        Leave out graph parameters the checkpoint lacks (for example a new classifier) instead of
        raising.
    allow_extra : bool
        Ignore checkpoint parameters the graph does not use instead of raising.

    Returns
    -------
    (dict, dict)
        ``arg_params`` and ``aux_params`` in the graph's dtypes (bfloat16 as MXNet's
        ``amp_cast`` stores it).

    Raises
    ------
    ValueError
        Naming every missing or unexpected parameter.

    Examples
    --------
    >>> import mxnet as mx
    >>> net = mx.sym.FullyConnected(mx.sym.var('data'), num_hidden=2, name='fc')
    >>> params = {'fc_weight': mx.nd.ones((2, 3)), 'fc_bias': mx.nd.zeros((2,))}
    >>> from mxfp16 import cast_symbol
    >>> args, aux = cast_params(params, {}, cast_symbol(net, 'float16', emulate=False))
    >>> args['fc_weight'].dtype.__name__
    'float16'
    """
    data_names = tuple(data_names)
    types = internal_dtypes(sym, data_names)
    inputs = _input_names(sym, data_names, label_names)
    expected_args = [n for n in sym.list_arguments() if n not in inputs]
    converted = [_checked(given, expected, allow_missing, allow_extra)
                 for given, expected in ((arg_params, expected_args),
                                         (aux_params, sym.list_auxiliary_states()))]
    return tuple({n: stored_as(v, types.get(n, "float32")) for n, v in values.items()}
                 for values in converted)
