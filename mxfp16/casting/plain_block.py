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
from mxnet import autograd, gluon

from .. import mxnet_internals
from ..scaling import boundary as boundary_scale
from .block import CastBlock, CastCheckpoints

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


def cast_children(block, cast, prefix=""):
    """Cast the HybridBlock parts of a plain Block in place with ``cast(child, path)`` (those of
    its plain Block parts too, recursively; a part ``cast`` returns as it is stays), and give each
    plain Block the float32 checkpoints of :class:`CastPlainBlock`; return ``block`` itself."""
    for name, child in mxnet_internals.block_children(block).items():
        if isinstance(child, CastBlock):
            continue
        if isinstance(child, gluon.HybridBlock):
            cast_child = cast(child, prefix + name)
            if cast_child is not child:
                mxnet_internals.replace_child(block, name, cast_child)
        else:
            cast_children(child, cast, f"{prefix}{name}.")
    if not isinstance(block, CastPlainBlock):
        cls = type(block)
        if cls not in _cast_classes:
            _cast_classes[cls] = type(cls.__name__, (CastPlainBlock, cls), {
                "__module__": cls.__module__, "__qualname__": cls.__qualname__,
                "__doc__": cls.__doc__})
        block.__class__ = _cast_classes[cls]
    return block


class CastPlainBlock(CastCheckpoints):
    """What a plain Block cast by :func:`mxfp16.cast_block` becomes: the Block itself, of a class
    made of its own and this one, whose ``save_parameters`` and ``load_parameters`` are those of a
    :class:`~mxfp16.casting.block.CastBlock` (:class:`~mxfp16.casting.block.CastCheckpoints`),
    and whose recorded calls keep their inputs until the step ends (the overflow warning's batch,
    :func:`mxfp16.scaling.boundary.keep_call`); everything else is the Block's.

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

    #: The paths of the blocks ``keep_float32`` keeps (see :func:`mxfp16.cast_block`).
    keep_float32 = ()

    def __call__(self, *args, **kwargs):
        if autograd.is_recording():  # the batch an overflow warning locates on, by reference
            boundary_scale.keep_call(self, args)
        return super().__call__(*args, **kwargs)

    def _save_keys(self):
        return float32_keys(self)

    def _load_keys(self):
        keys = dict(mxnet_internals.block_param_keys(self))  # the cast parts' own names
        keys.update(float32_keys(self))
        return keys
