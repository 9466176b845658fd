"""The graph transforms behind ``convert_symbol``: MXNet's AMP pass with mxfp16's op lists,
mxfp16's own rules, and the inputs stored as MXNet's conversion stores them.

MXNet's meaning of the arguments: ``data_names`` None means every input without a ``__dtype__``
attribute is data (float32, cast where an op needs another dtype); every other input is a
parameter.  A parameter whose ops want float16 (bfloat16) stays float32 behind a cast unless
``cast_optional_params``, which stores it in the dtype it is cast to.
"""
from mxnet.contrib.amp import amp as _mx_amp

from ..casting import cast_symbol
from ..casting.emulation import emulate_float16
from ..casting.graph import GraphRewriter, internal_dtypes
from .lists import AmpArgumentError, check_op_lists, default_lists

#: MXNet's type codes of the dtypes a conversion stores inputs in (``__dtype__``).
DTYPE_CODES = {"float32": "0", "float16": "2", "bfloat16": "12"}

#: The ops that cast (an input consumed only by them is "behind a cast").
_CASTS = ("Cast", "amp_cast")


def dtype_name(name):
    """MXNet's name of a dtype given as numpy's name: bfloat16 is numpy's ``'void16'``.

    Examples
    --------
    >>> dtype_name('void16'), dtype_name('float16')
    ('bfloat16', 'float16')
    """
    return "bfloat16" if name == "void16" else name


def mxnet_data_names(sym, data_names):
    """``data_names`` as MXNet AMP reads it: None is every input without ``__dtype__``."""
    if data_names is not None:
        return list(data_names)
    attrs = sym.attr_dict()
    return [name for name in sym.list_inputs() if "__dtype__" not in attrs.get(name, {})]


def _mxnet_known(dtype):
    """The ops MXNet's ``convert_symbol`` accepts in its lists (not its widest-type ops)."""
    names = ("list_lp16_ops", "list_fp32_ops", "list_lp16_fp32_ops")
    mx_dtype = "float16" if dtype == "float16" else _mx_amp.bfloat16
    known = set().union(*(getattr(_mx_amp, name)(mx_dtype) for name in names))
    return known | {entry[0] for entry in _mx_amp.list_conditional_fp32_ops(mx_dtype)}


def with_op_lists(sym, dtype, lists, excluded, data_names, cast_optional_params):
    """MXNet's AMP pass deciding op by op: the lists given, mxfp16's lists for the others.

    MXNet's pass takes only ops of its own lists: the float32 ops of mxfp16's rows it does not
    take run in float32 through ``excluded_sym_names`` (the pass casts an excluded op's inputs to
    float32); the matrix multiplies mxfp16's float16 list adds (``dot``, ``batch_dot``) stay
    MXNet's widest-type ops there."""
    chosen = dict(default_lists(dtype), **lists)
    check_op_lists(dtype, chosen["target_precision_ops"], chosen["conditional_fp32_ops"],
                   chosen["fp32_ops"])
    known = _mxnet_known(dtype)
    outside = {op for op in chosen["fp32_ops"] if op not in known}
    excluded = list(excluded or []) + [node["name"] for node in GraphRewriter(sym).old_nodes
                                       if node["op"] in outside]
    return _mx_amp.convert_symbol(
        sym, target_dtype=dtype,
        target_dtype_ops=[op for op in chosen["target_precision_ops"] if op in known],
        fp32_ops=[op for op in chosen["fp32_ops"] if op in known],
        conditional_fp32_ops=[tuple(entry) for entry in chosen["conditional_fp32_ops"]
                              if entry[0] in known],
        excluded_sym_names=excluded, data_names=data_names,
        cast_optional_params=cast_optional_params)


def emulated(sym, converted, data_names):
    """The CPU emulation of ``converted`` (a float16 graph of ``sym``): its dtypes, GPU numerics."""
    return emulate_float16(sym, internal_dtypes(converted, data_names), data_names)


def _rule_data_names(sym, data_names):
    """The inputs mxfp16's rules cast as data: those named, else the ones called ``data*``."""
    arguments = sym.list_arguments()
    if data_names is not None:
        return [name for name in data_names if name in arguments]
    named = [name for name in arguments if name.startswith("data")]
    return named or [name for name in arguments[:1]]


def with_rules(sym, dtype, data_names, cast_optional_params, emulate):
    """mxfp16's rules (:func:`mxfp16.cast_symbol`), the inputs then stored as MXNet stores them."""
    data = mxnet_data_names(sym, data_names)
    rule_data = _rule_data_names(sym, data_names)
    converted = cast_symbol(sym, dtype, emulate=emulate, data_names=rule_data)
    params = [name for name in converted.list_arguments() if name not in data]
    converted = store_float32(converted, set(data) | (set() if cast_optional_params else
                                                     set(params)), rule_data)
    return store_cast(converted, params) if cast_optional_params else converted


def store_float32(sym, names, data_names):
    """``sym`` with the arguments ``names`` stored float32, each behind a cast to the dtype its ops
    want (what MXNet AMP does with a data input, or a parameter without cast_optional_params)."""
    types = internal_dtypes(sym, data_names)
    rw = GraphRewriter(sym, drop_inserted=False)
    for old_id, node in rw.nodes_in_order():
        dtype = dtype_name(types.get(node["name"], "float32"))
        if node["op"] != "null" or node["name"] not in names or dtype == "float32" \
                or node["name"] in sym.list_auxiliary_states():
            rw.copy(old_id, node)
            continue
        attrs = dict(node.get("attrs", {}), __dtype__=DTYPE_CODES["float32"])
        new = (rw.copy(old_id, dict(node, attrs=attrs)), 0, 0)
        rw.replace(old_id, rw.cast(new, dtype))
    return rw.to_symbol(rw.heads())


def _consumers(rw):
    found = {}
    for node in rw.old_nodes:
        for entry in node["inputs"]:
            found.setdefault(entry[0], []).append(node)
    return found


def store_cast(sym, names):
    """``sym`` with each argument of ``names`` that only casts read (to one dtype, not float32)
    stored in that dtype and the casts taken out: MXNet AMP's ``cast_optional_params``."""
    rw = GraphRewriter(sym, drop_inserted=False)
    consumers = _consumers(rw)
    heads = {head[0] for head in rw.old_heads}
    folded = {}
    for old_id, node in enumerate(rw.old_nodes):
        readers = consumers.get(old_id, [])
        dtypes = {reader.get("attrs", {}).get("dtype") for reader in readers}
        if node["op"] == "null" and node["name"] in names and old_id not in heads and readers \
                and all(reader["op"] in _CASTS for reader in readers) and len(dtypes) == 1 \
                and next(iter(dtypes)) in DTYPE_CODES and dtypes != {"float32"}:
            folded[old_id] = next(iter(dtypes))
    cast_of = {id(reader): source for source in folded for reader in consumers[source]}
    for old_id, node in rw.nodes_in_order():
        if old_id in folded:
            attrs = dict(node.get("attrs", {}), __dtype__=DTYPE_CODES[folded[old_id]])
            rw.copy(old_id, dict(node, attrs=attrs))
        elif id(node) in cast_of:
            rw.replace(old_id, rw.input_entry(node["inputs"][0]))
        else:
            rw.copy(old_id, node)
    return rw.to_symbol(rw.heads())


def check_excluded(excluded_sym_names):
    """``excluded_sym_names`` as a list, or :class:`AmpArgumentError`."""
    if excluded_sym_names is not None and not isinstance(excluded_sym_names, list):
        raise AmpArgumentError(f"excluded_sym_names={excluded_sym_names!r}: pass a list of the "
                               "names of the ops to keep in float32, as for MXNet AMP")
    return excluded_sym_names
