"""Converting float32 checkpoint parameters to the dtypes a cast graph expects: fine-tuning a float32
pretrained model in float16 with ``mx.mod.Module``."""
from .graph import internal_dtypes


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
        ``arg_params`` and ``aux_params`` in the graph's dtypes.

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
    inputs = set(data_names) | set(label_names if label_names is not None else
                                   [n for n in sym.list_arguments() if n.endswith("label")])
    converted = []
    for given, expected in ((arg_params, [n for n in sym.list_arguments() if n not in inputs]),
                            (aux_params, sym.list_auxiliary_states())):
        given = dict(given or {})
        missing = [n for n in expected if n not in given]
        extra = [n for n in given if n not in expected]
        if missing and not allow_missing:
            raise ValueError(f"the checkpoint has no value for parameter(s) {missing}: pass "
                             "allow_missing=True to leave them to the initializer")
        if extra and not allow_extra:
            raise ValueError(f"the checkpoint has parameter(s) {extra} that the graph does not "
                             "use: pass allow_extra=True to ignore them, or check the network")
        converted.append({n: v.astype(types.get(n, "float32"), copy=False)
                          for n, v in given.items() if n in expected})
    return converted[0], converted[1]
