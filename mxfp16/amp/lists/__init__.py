"""MXNet AMP's op lists, by the names ``mxnet.contrib.amp`` gives them, and the check of the
``*_ops`` arguments that override them.

:mod:`.symbol_fp16` and :mod:`.symbol_bf16` are the lists (``amp.lists.symbol_fp16.FP32_FUNCS``,
as MXNet's): MXNet's with mxfp16's rows applied, each row with its reason.  The ``list_*``
functions return those lists themselves, as MXNet's do, and take the dtype as a string
(``'float16'``, ``'bfloat16'``) as well as MXNet's dtype objects.
"""
import numpy as np

from . import symbol_bf16, symbol_fp16

#: The dtypes ``target_dtype`` may name, as in MXNet AMP.
TARGET_DTYPES = ("float16", "bfloat16")

#: MXNet's bfloat16 dtype object (``mxnet.contrib.amp.amp.bfloat16``): how MXNet names the dtype of
#: a bfloat16 array, parameter or variable.
BFLOAT16 = np.dtype([("bfloat16", np.uint16)])


class AmpArgumentError(AssertionError, ValueError):
    """An invalid AMP argument (a dtype, an op list): MXNet AMP raises ``AssertionError`` where
    mxfp16 raises ``ValueError``; this is both, so either ``except`` catches it."""


class AmpTypeError(AssertionError, TypeError):
    """An AMP argument of the wrong type: MXNet AMP asserts, mxfp16 raises ``TypeError``; this is
    both."""


def target_dtype_name(target_dtype):
    """``'float16'`` or ``'bfloat16'`` for any spelling MXNet AMP accepts, else
    :class:`AmpArgumentError`.

    Examples
    --------
    >>> target_dtype_name(np.float16), target_dtype_name(BFLOAT16)
    ('float16', 'bfloat16')
    """
    if isinstance(target_dtype, str):
        name = target_dtype
    elif target_dtype == BFLOAT16:
        name = "bfloat16"
    else:
        try:
            name = np.dtype(target_dtype).name
        except TypeError:
            name = repr(target_dtype)
    if name not in TARGET_DTYPES:
        raise AmpArgumentError(f"target_dtype={target_dtype!r}: mxfp16.amp trains in "
                               f"{' or '.join(TARGET_DTYPES)}, as MXNet AMP does; pass "
                               "target_dtype='float16' (or 'bfloat16')")
    return name


def _module(target_dtype):
    return symbol_fp16 if target_dtype_name(target_dtype) == "float16" else symbol_bf16


def list_lp16_ops(target_dtype):
    """Ops AMP runs in ``target_dtype`` (``FP16_FUNCS`` / ``BF16_FUNCS``).

    Examples
    --------
    >>> 'Convolution' in list_lp16_ops('float16')
    True
    """
    lists = _module(target_dtype)
    return lists.FP16_FUNCS if lists is symbol_fp16 else lists.BF16_FUNCS


def list_fp32_ops(target_dtype):
    """Ops AMP keeps in float32 (``FP32_FUNCS``).

    Examples
    --------
    >>> 'softmax' in list_fp32_ops('float16')
    True
    """
    return _module(target_dtype).FP32_FUNCS


def list_lp16_fp32_ops(target_dtype):
    """Ops that run in whichever dtype their inputs have (``FP16_FP32_FUNCS``).

    Examples
    --------
    >>> 'relu' in list_lp16_fp32_ops('float16')
    True
    """
    lists = _module(target_dtype)
    return lists.FP16_FP32_FUNCS if lists is symbol_fp16 else lists.BF16_FP32_FUNCS


def list_conditional_fp32_ops(target_dtype):
    """``(op, attribute, values)``: ops AMP keeps in float32 when ``attribute`` is one of ``values``.

    Examples
    --------
    >>> ('Activation', 'act_type', ['softrelu']) in list_conditional_fp32_ops('float16')
    True
    """
    return _module(target_dtype).CONDITIONAL_FP32_FUNCS


def list_widest_type_cast(target_dtype):
    """Ops whose inputs AMP casts to the widest dtype among them (``WIDEST_TYPE_CASTS``).

    Examples
    --------
    >>> 'elemwise_add' in list_widest_type_cast('float16')
    True
    """
    return _module(target_dtype).WIDEST_TYPE_CASTS


def list_loss_output_functions(target_dtype):
    """Loss heads whose ``grad_scale`` AMP multiplies by the loss scale (``SoftmaxOutput``, ...).

    Examples
    --------
    >>> 'SoftmaxOutput' in list_loss_output_functions('float16')
    True
    """
    return _module(target_dtype).LOSS_OUTPUT_FUNCTIONS


def list_lp16_use_fp32_params(target_dtype):
    """For bfloat16, ``{op: parameters kept float32}``; None for float16, as in MXNet AMP.

    Examples
    --------
    >>> list_lp16_use_fp32_params('float16') is None
    True
    """
    lists = _module(target_dtype)
    return None if lists is symbol_fp16 else lists.BF16_USE_FP32_PARAMS


def default_lists(target_dtype):
    """The op lists as they stand now (extended by the user or not), as the ``*_ops`` arguments:
    ``{'target_precision_ops': [...], 'fp32_ops': [...], 'conditional_fp32_ops': [...]}``."""
    return {"target_precision_ops": list(list_lp16_ops(target_dtype)),
            "fp32_ops": list(list_fp32_ops(target_dtype)),
            "conditional_fp32_ops": list(list_conditional_fp32_ops(target_dtype))}


def _listed(target_dtype):
    return {name: list(entries) for name, entries in (
        ("lp16", list_lp16_ops(target_dtype)), ("fp32", list_fp32_ops(target_dtype)),
        ("lp16_fp32", list_lp16_fp32_ops(target_dtype)),
        ("widest", list_widest_type_cast(target_dtype)),
        ("conditional", list_conditional_fp32_ops(target_dtype)))}


def _contents(target_dtype):
    """What the lists hold, whatever the order."""
    return {key: sorted(map(repr, entries)) for key, entries in _listed(target_dtype).items()}


_BUILT = {name: _contents(name) for name in TARGET_DTYPES}


def lists_extended(target_dtype):
    """Whether code has changed the lists of ``target_dtype`` since mxfp16 built them."""
    name = target_dtype_name(target_dtype)
    return _contents(name) != _BUILT[name]


def _given(target_precision_ops, conditional_fp32_ops, fp32_ops):
    given = {name: value for name, value in (("target_precision_ops", target_precision_ops),
                                             ("conditional_fp32_ops", conditional_fp32_ops),
                                             ("fp32_ops", fp32_ops)) if value is not None}
    for name, value in given.items():
        if not isinstance(value, list):
            raise AmpArgumentError(f"{name}={value!r}: pass a list (of op names, or of (op, "
                                   "attribute, [values]) for conditional_fp32_ops), as for "
                                   "MXNet AMP")
    for entry in given.get("conditional_fp32_ops", []):
        if not (isinstance(entry, (list, tuple)) and len(entry) == 3 and isinstance(entry[0], str)
                and isinstance(entry[1], str) and isinstance(entry[2], list)):
            raise AmpArgumentError(f"conditional_fp32_ops entry {entry!r}: each is (op name, "
                                   "attribute name, [attribute values]), e.g. ('Activation', "
                                   "'act_type', ['softrelu'])")
    return given


def check_op_lists(target_dtype, target_precision_ops=None, conditional_fp32_ops=None,
                   fp32_ops=None):
    """Check the ``*_ops`` overrides as MXNet AMP's ``convert_symbol`` does, with errors that say
    what is wrong; return them as ``{argument: list}`` (the ones given only).

    Raises
    ------
    AmpArgumentError
        (an ``AssertionError`` and a ``ValueError``) for an argument that is not a list, an op in
        no AMP list, or an op in two of the arguments.

    Examples
    --------
    >>> check_op_lists('float16', fp32_ops=['Convolution'])
    {'fp32_ops': ['Convolution']}
    """
    given = _given(target_precision_ops, conditional_fp32_ops, fp32_ops)
    names = {"target_precision_ops": given.get("target_precision_ops", []),
             "fp32_ops": given.get("fp32_ops", []),
             "conditional_fp32_ops": [entry[0] for entry in
                                      given.get("conditional_fp32_ops", [])]}
    listed = _listed(target_dtype)
    known = set().union(*(entries for key, entries in listed.items()
                          if key not in ("conditional", "widest")))
    known.update(entry[0] for entry in listed["conditional"])
    for name, ops in names.items():
        unknown = sorted(set(ops) - known)
        if unknown:
            raise AmpArgumentError(f"{name}: op(s) {unknown} are in none of MXNet AMP's lists "
                                   f"(with mxfp16's rows) for {target_dtype_name(target_dtype)}; "
                                   "choose ops from amp.list_lp16_ops, list_fp32_ops, "
                                   "list_lp16_fp32_ops or list_conditional_fp32_ops (the ops of "
                                   "list_widest_type_cast take the widest dtype of their inputs "
                                   "and cannot be moved)")
    pairs = (("target_precision_ops", "fp32_ops"), ("target_precision_ops", "conditional_fp32_ops"),
             ("fp32_ops", "conditional_fp32_ops"))
    for first, second in pairs:
        common = sorted(set(names[first]) & set(names[second]))
        if common:
            raise AmpArgumentError(f"op(s) {common} are in both {first} and {second}: an op goes "
                                   "in one list only")
    return given
