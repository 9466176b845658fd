"""Plain ``gluon.Block`` networks (not hybridizable, made of HybridBlocks): cast in place, with
float32 checkpoints.

:func:`mxfp16.cast_block` cannot trace a Block whose ``forward`` is Python code (GluonNLP's
``NMTModel``, most research code, every model of "Dive into Deep Learning"), so it casts the
HybridBlocks inside it in place and returns the Block itself.  The Block then saves and loads as a
:class:`~mxfp16.casting.block.CastBlock` does: ``save_parameters`` writes the float32 master
weights under the names the float32 network gives them (``'body.0.weight'``), so a float32 network
of the same class loads the file with no option, and ``load_parameters`` reads float32 or float16
files, from the float32 network or from itself.  Both front ends: the legacy NDArray one and the
NumPy interface (``npx.set_np()``), whose files Gluon writes with ``npx.save``.
"""
import mxnet as mx
from mxnet import gluon

from .. import mxnet_internals
from ..numpy_interface import legacy, load_arrays, save_arrays
from ..optimizers import master_copies
from .block import SAVE_DTYPES, CastBlock
from .deploy import float32_value

_cast_classes = {}  # a network's class -> its cast class (the class and CastPlainBlock)


def float32_keys(block, prefix=""):
    """``{name: Parameter}`` under the names the float32 network's ``save_parameters`` gives its
    parameters (``'body.0.weight'``), its cast parts read through their ``param_keys``.

    Examples
    --------
    >>> from mxnet.gluon import nn
    >>> net = nn.Sequential()
    >>> net.add(nn.Dense(2, in_units=3))
    >>> sorted(float32_keys(net))
    ['0.bias', '0.weight']
    """
    keys = {prefix + name: param for name, param in mxnet_internals.block_own_params(block).items()}
    for name, child in mxnet_internals.block_children(block).items():
        if isinstance(child, CastBlock):
            keys.update((f"{prefix}{name}.{key}", param) for key, param in child.param_keys.items())
        else:
            keys.update(float32_keys(child, f"{prefix}{name}."))
    return keys


def cast_children(block, cast):
    """Cast the HybridBlock parts of a plain Block in place with ``cast(child)`` (those of its plain
    Block parts too, recursively), and give each plain Block the float32 checkpoints of
    :class:`CastPlainBlock`; return ``block`` itself."""
    for name, child in mxnet_internals.block_children(block).items():
        if isinstance(child, CastBlock):
            continue
        if isinstance(child, gluon.HybridBlock):
            mxnet_internals.replace_child(block, name, cast(child))
        else:
            cast_children(child, cast)
    if not isinstance(block, CastPlainBlock):
        cls = type(block)
        if cls not in _cast_classes:
            _cast_classes[cls] = type(cls.__name__, (CastPlainBlock, cls), {
                "__module__": cls.__module__, "__qualname__": cls.__qualname__,
                "__doc__": cls.__doc__})
        block.__class__ = _cast_classes[cls]
    return block


class CastPlainBlock:
    """What a plain Block cast by :func:`mxfp16.cast_block` becomes: the Block itself, of a class
    made of its own and this one, whose ``save_parameters`` and ``load_parameters`` are those of a
    :class:`~mxfp16.casting.block.CastBlock`; everything else is the Block's.

    Examples
    --------
    >>> import os, tempfile
    >>> import mxnet as mx
    >>> from mxnet.gluon import nn
    >>> import mxfp16
    >>> def network():
    ...     net = nn.Sequential()  # a plain Block
    ...     net.add(nn.Dense(4, in_units=3), nn.Dense(2, in_units=4))
    ...     return net
    >>> net = network()
    >>> net.initialize()
    >>> net16 = mxfp16.cast_block(net, 'float16')
    >>> net16 is net, net[0].weight.dtype.__name__, isinstance(net, nn.Sequential)
    (True, 'float16', True)
    >>> path = os.path.join(tempfile.mkdtemp(), 'net.params')
    >>> net.save_parameters(path)
    >>> sorted((k, v.dtype.__name__) for k, v in mx.nd.load(path).items())[:2]
    [('0.bias', 'float32'), ('0.weight', 'float32')]
    >>> network().load_parameters(path)  # the float32 network, no option
    >>> net.load_parameters(path)
    """

    def save_parameters(self, filename, deduplicate=False, dtype="float32"):
        """Save the parameters under the float32 network's names, in float32 by default.

        Parameters
        ----------
        filename : str
        deduplicate : bool
            Save a parameter shared by several layers once, as in Gluon.
        dtype : {'float32', 'float16'}
            ``'float32'``: the optimizer's float32 master weights where it holds them, else the
            values widened; the float32 network loads the file with no option.  ``'float16'``:
            the values as the network holds them, half the size; a float32 network loads it with
            ``load_parameters(filename, cast_dtype=True)``.

        Raises
        ------
        ValueError
            For another ``dtype``.
        """
        if dtype not in SAVE_DTYPES:
            raise ValueError(f"dtype={dtype!r}: choose one of {', '.join(SAVE_DTYPES)} ('float32' "
                             "for a checkpoint any float32 network loads)")
        saved, seen = {}, set()
        for key, param in float32_keys(self).items():
            if not (deduplicate and id(param) in seen):
                seen.add(id(param))
                saved[key] = float32_value(param) if dtype == "float32" else \
                    legacy(param.list_data()[0]).copyto(mx.cpu())
        save_arrays(filename, saved)  # as Gluon writes in this front end

    def load_parameters(self, filename, ctx=None, allow_missing=False, ignore_extra=False,
                        cast_dtype=False, dtype_source="current"):
        """Load a float32 or float16 parameter file, each value converted to its parameter's dtype.

        The names may be the float32 network's (its ``save_parameters``, or this network's), the
        cast parts' own, or the parameters' (``save_params``; ``arg:``/``aux:`` prefixes allowed).
        Loaded float32 values also become the optimizer's master weights.  ``cast_dtype`` is
        accepted for Gluon's signature: values are always converted.

        Raises
        ------
        ValueError
            For a parameter the file lacks (unless ``allow_missing``), a name it has that this
            network does not (unless ``ignore_extra``), or ``dtype_source='saved'``.
        """
        if dtype_source != "current":
            raise ValueError(f"dtype_source={dtype_source!r}: a cast network keeps its own dtypes; "
                             "leave dtype_source='current'")
        values, extra = _values_by_name(self, load_arrays(filename))
        params = self.collect_params()
        missing = [name for name in params if name not in values]
        if missing and not allow_missing:
            raise ValueError(f"{filename!r} has no value for parameter(s) {missing[:4]}: pass "
                             "allow_missing=True to keep their current values, or check the file")
        if extra and not ignore_extra:
            raise ValueError(f"{filename!r} holds {extra[:4]}, which this network does not have: "
                             "pass ignore_extra=True to skip them, or check the file")
        params.load_dict(values, ctx=ctx, allow_missing=True, cast_dtype=True)
        for name, value in values.items():
            for master in master_copies(params[name]):
                master[:] = legacy(value).astype("float32").as_in_context(master.context)


def _values_by_name(block, loaded):
    """``({parameter name: value}, [unknown keys])`` for a loaded parameter file."""
    by_key = dict(mxnet_internals.block_param_keys(block))  # the cast parts' own names
    by_key.update(float32_keys(block))
    by_name = dict(block.collect_params().items())
    values, extra = {}, []
    for key, value in loaded.items():
        name = key[4:] if key.startswith(("arg:", "aux:")) else key
        param = by_key.get(name) or by_name.get(name) or by_name.get(block.prefix + name)
        if param is None:
            extra.append(key)
        else:
            values[param.name] = value
    return values, extra
