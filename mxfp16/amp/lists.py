"""MXNet AMP's op lists, by the names ``mxnet.contrib.amp`` gives them, and the check of the
``*_ops`` arguments that override them.

The lists are MXNet's own (``mxnet.contrib.amp.lists``); these functions take the dtype as a string
(``'float16'``, ``'bfloat16'``) as well as MXNet's dtype objects.
"""
import numpy as np
from mxnet.contrib.amp import amp as _mx_amp

#: The dtypes ``target_dtype`` may name, as in MXNet AMP.
TARGET_DTYPES = ("float16", "bfloat16")


def target_dtype_name(target_dtype):
    """``'float16'`` or ``'bfloat16'`` for any spelling MXNet AMP accepts, else ``ValueError``.

    Examples
    --------
    >>> import numpy as np
    >>> target_dtype_name(np.float16), target_dtype_name('bfloat16')
    ('float16', 'bfloat16')
    """
    if isinstance(target_dtype, str):
        name = target_dtype
    elif target_dtype is _mx_amp.bfloat16:
        name = "bfloat16"
    else:
        try:
            name = np.dtype(target_dtype).name
        except TypeError:
            name = repr(target_dtype)
    if name not in TARGET_DTYPES:
        raise ValueError(f"target_dtype={target_dtype!r}: mxfp16.amp trains in "
                         f"{' or '.join(TARGET_DTYPES)}, as MXNet AMP does; pass "
                         "target_dtype='float16' (or 'bfloat16')")
    return name


def _mx_dtype(target_dtype):
    name = target_dtype_name(target_dtype)
    return "float16" if name == "float16" else _mx_amp.bfloat16


def list_lp16_ops(target_dtype):
    """Ops AMP runs in ``target_dtype`` (``FP16_FUNCS`` / ``BF16_FUNCS``).

    Examples
    --------
    >>> 'Convolution' in list_lp16_ops('float16')
    True
    """
    return list(_mx_amp.list_lp16_ops(_mx_dtype(target_dtype)))


def list_fp32_ops(target_dtype):
    """Ops AMP keeps in float32 (``FP32_FUNCS``).

    Examples
    --------
    >>> 'softmax' in list_fp32_ops('float16')
    True
    """
    return list(_mx_amp.list_fp32_ops(_mx_dtype(target_dtype)))


def list_lp16_fp32_ops(target_dtype):
    """Ops that run in whichever dtype their inputs have (``FP16_FP32_FUNCS``).

    Examples
    --------
    >>> 'relu' in list_lp16_fp32_ops('float16')
    True
    """
    return list(_mx_amp.list_lp16_fp32_ops(_mx_dtype(target_dtype)))


def list_conditional_fp32_ops(target_dtype):
    """``(op, attribute, values)``: ops AMP keeps in float32 when ``attribute`` is one of ``values``.

    Examples
    --------
    >>> ('Activation', 'act_type', ['softrelu']) in list_conditional_fp32_ops('float16')
    True
    """
    return list(_mx_amp.list_conditional_fp32_ops(_mx_dtype(target_dtype)))


def list_widest_type_cast(target_dtype):
    """Ops whose inputs AMP casts to the widest dtype among them (``WIDEST_TYPE_CASTS``).

    Examples
    --------
    >>> 'elemwise_add' in list_widest_type_cast('float16')
    True
    """
    return list(_mx_amp.list_widest_type_cast(_mx_dtype(target_dtype)))


def list_loss_output_functions(target_dtype):
    """Loss heads whose ``grad_scale`` AMP multiplies by the loss scale (``SoftmaxOutput``, ...).

    Examples
    --------
    >>> 'SoftmaxOutput' in list_loss_output_functions('float16')
    True
    """
    return list(_mx_amp.list_loss_output_functions(_mx_dtype(target_dtype)))


def list_lp16_use_fp32_params(target_dtype):
    """For bfloat16, ``{op: parameters kept float32}``; None for float16, as in MXNet AMP.

    Examples
    --------
    >>> list_lp16_use_fp32_params('float16') is None
    True
    """
    return _mx_amp.list_lp16_use_fp32_params(_mx_dtype(target_dtype))


def check_op_lists(target_dtype, target_precision_ops=None, conditional_fp32_ops=None,
                   fp32_ops=None):
    """Check the ``*_ops`` overrides as MXNet AMP's ``convert_symbol`` does, with errors that say
    what is wrong; return them as ``{argument: list}`` (the ones given only).

    Raises
    ------
    ValueError
        For an argument that is not a list, an op in no AMP list, or an op in two lists.

    Examples
    --------
    >>> check_op_lists('float16', fp32_ops=['Convolution'])
    {'fp32_ops': ['Convolution']}
    """
    given = {name: value for name, value in (("target_precision_ops", target_precision_ops),
                                             ("conditional_fp32_ops", conditional_fp32_ops),
                                             ("fp32_ops", fp32_ops)) if value is not None}
    for name, value in given.items():
        if not isinstance(value, list):
            raise ValueError(f"{name}={value!r}: pass a list (of op names, or of (op, attribute, "
                             "[values]) for conditional_fp32_ops), as for MXNet AMP")
    conditional = given.get("conditional_fp32_ops", [])
    for entry in conditional:
        if not (isinstance(entry, (list, tuple)) and len(entry) == 3
                and isinstance(entry[2], list)):
            raise ValueError(f"conditional_fp32_ops entry {entry!r}: each is (op name, attribute "
                             "name, [attribute values]), e.g. ('Activation', 'act_type', "
                             "['softrelu'])")
    names = {"target_precision_ops": given.get("target_precision_ops", []),
             "fp32_ops": given.get("fp32_ops", []),
             "conditional_fp32_ops": [entry[0] for entry in conditional]}
    known = set(list_lp16_ops(target_dtype) + list_fp32_ops(target_dtype)
                + list_lp16_fp32_ops(target_dtype)
                + [entry[0] for entry in list_conditional_fp32_ops(target_dtype)])
    for name, ops in names.items():
        unknown = sorted(set(ops) - known)
        if unknown:
            raise ValueError(f"{name}: op(s) {unknown} are in none of MXNet AMP's lists for "
                             f"{target_dtype_name(target_dtype)}; choose ops from "
                             "amp.list_lp16_ops, list_fp32_ops, list_lp16_fp32_ops or "
                             "list_conditional_fp32_ops")
    pairs = (("target_precision_ops", "fp32_ops"), ("target_precision_ops", "conditional_fp32_ops"),
             ("fp32_ops", "conditional_fp32_ops"))
    for first, second in pairs:
        common = sorted(set(names[first]) & set(names[second]))
        if common:
            raise ValueError(f"op(s) {common} are in both {first} and {second}: an op goes in "
                             "one list only")
    return given
