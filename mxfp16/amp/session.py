"""What ``amp.init()`` turns on: the networks a script trains run cast by mxfp16's rules.

MXNet AMP rewrites every ``mx.nd``/``mx.sym`` op function at ``init()``, so only networks whose
graphs are built afterwards are cast (mxnet#18902).  mxfp16.amp casts the *network*, whenever it was
built: ``init()`` wraps ``HybridBlock.__call__`` so that a top-level call, with NDArrays, of a
block whose parameters a Trainer given to ``amp.init_trainer`` updates runs that block's
:func:`mxfp16.cast_block` (made on that first call; the parameters become float16, normalization
layers keep float32).  Calls with Symbols (tracing, ``export``), calls nested in another block's
call, losses and blocks no AMP Trainer updates (GluonCV's target generators, YOLOv3's
``async_net``) run as before.  The same wrappers let the block's ``save_parameters``,
``save_params`` and ``load_parameters`` write and read float32 files, as under MXNet AMP, and make
``net.cast('float16')`` a no-op (mxfp16's rules decide each parameter's dtype).  A block that
clears its cached graph outside ``hybridize()`` (GluonCV's ``set_nms``, ``reset_class``) is traced
again at its next call.  ``amp.reset()`` removes every wrapper.
"""
import functools
import logging
import operator
import threading
import weakref

import mxnet as mx
from mxnet import gluon

from .. import mxnet_internals
from ..casting import CastBlock, cast_block
from ..casting.deploy import float32_value
from ..casting.keep import block_keep, op_keep
from ..casting.selectors import BlockIndex

log = logging.getLogger(__name__)

#: Dtype names a script's ``net.cast(...)`` may give under ``--amp``: left to mxfp16's rules.
_LOW_PRECISION_NAMES = ("float16", "bfloat16")

_calls = threading.local()  # .depth: HybridBlock calls in progress; .hybridizing: in hybridize()


def _depth():
    return getattr(_calls, "depth", 0)


def _first_array(args):
    for arg in args:
        if isinstance(arg, (list, tuple)):
            found = _first_array(arg)
            if found is not None:
                return found
        elif arg is not None:
            return arg
    return None


class Session:
    """The state of one ``amp.init()``: the target dtype, the AMP Trainers' parameters and the
    cast network of each block adopted; dropped whole by ``amp.reset()``.

    Parameters
    ----------
    target_dtype : {'float16', 'bfloat16'}
    op_lists : dict
        The ``*_ops`` arguments given to ``init`` (checked), kept for :func:`amp.convert_symbol`;
        its ``fp32_ops`` also stay float32 in every network cast.
    keep_float32 : list, optional
        ``init``'s selectors (checked): the blocks each network cast keeps in float32.
    """

    def __init__(self, target_dtype, op_lists, keep_float32=()):
        self.target_dtype = target_dtype
        self.op_lists = op_lists
        self.keep_float32 = list(keep_float32 or ())
        self._trained = weakref.WeakSet()  # Parameters of Trainers given to init_trainer
        # block -> [CastBlock, its hybridize flags, whether the block's graph changed since]
        self._casts = weakref.WeakKeyDictionary()
        self._declined = weakref.WeakKeyDictionary()  # block -> generation it was declined at
        self._generation = 0

    def add_trainer(self, trainer):
        """Blocks with parameters of ``trainer`` train in the target dtype from their next call."""
        self._trained.update(mxnet_internals.trainer_params(trainer))
        self._generation += 1

    def cast_of(self, block):
        """The cast network that runs for ``block`` (None: it runs as it is)."""
        entry = self._casts.get(block)
        if entry is None:
            if self._declined.get(block) == self._generation or not self._adopts(block):
                self._declined[block] = self._generation
                return None
            entry = self._casts[block] = [None, None, True]
        if entry[2]:  # first call, or the block's graph changed since (set_nms)
            if entry[0] is not None:  # GluonCV's validation calls set_nms every epoch: free the
                mxnet_internals.release_cached_ops(entry[0])  # old graphs' memory at once
            entry[:] = [cast_block(block, self.target_dtype, keep_float32=self.keep_for(block)),
                        None, False]
        flags = mxnet_internals.hybridize_flags(block)
        if flags != entry[1]:  # the script's hybridize(), before or after the cast
            entry[0].hybridize(flags is not None, **(flags or {}))
            entry[1] = flags
        return entry[0]

    def keep_for(self, block):
        """What ``block``'s cast keeps in float32: the ops of ``fp32_ops`` (MXNet AMP's op types),
        and the blocks of ``keep_float32``, of which a Block of another network is left out
        (strings and classes must match in every network cast: one line naming the nearest
        paths)."""
        keeps = [op_keep(self.op_lists["fp32_ops"])] if self.op_lists.get("fp32_ops") else []
        if self.keep_float32:
            index = BlockIndex(block)
            selectors = [s for s in self.keep_float32
                         if not isinstance(s, gluon.Block) or index.path_of(s) is not None]
            if selectors:
                keeps.append(block_keep(index, selectors)[0])
        return functools.reduce(operator.or_, keeps) if keeps else None

    def graph_changed(self, block):
        """``block`` cleared its cached graph (``set_nms``): trace it again at its next call (its
        present cast network still saves and loads its parameters until then)."""
        entry = self._casts.get(block)
        if entry is not None:
            entry[2] = True

    def adopted(self, block):
        """The cast network of ``block`` if it was adopted, else None."""
        entry = self._casts.get(block)
        return None if entry is None else entry[0]

    def _adopts(self, block):
        if isinstance(block, (gluon.loss.Loss, CastBlock)):
            return False
        return any(param in self._trained for param in block.collect_params().values())


_state = {"session": None, "originals": {}}


def current():
    """The active :class:`Session`, or None before ``init()`` and after ``reset()``."""
    return _state["session"]


def _amp_call(self, *args):
    session = current()
    if session is not None and _depth() == 0 and isinstance(_first_array(args), mx.nd.NDArray):
        cast = session.cast_of(self)
        if cast is not None:
            return _nested(cast, args)
    return _nested(self, args, original=True)


def _nested(block, args, original=False):
    _calls.depth = _depth() + 1
    try:
        return gluon.Block.__call__(block, *args) if original else block(*args)
    finally:
        _calls.depth -= 1


def _amp_cast(self, dtype):
    if current() is not None and getattr(dtype, "__name__", str(dtype)) in _LOW_PRECISION_NAMES:
        log.info("mxfp16.amp: %s.cast(%s) left to mxfp16's rules (float16 weights, float32 "
                 "normalization), applied at the first training call", type(self).__name__, dtype)
        return
    _state["originals"]["cast"](self, dtype)


def _amp_clear_cached_op(self):
    _state["originals"]["_clear_cached_op"](self)
    session = current()
    if session is not None and not getattr(_calls, "hybridizing", 0):
        session.graph_changed(self)


def _amp_hybridize(self, *args, **kwargs):
    # hybridize() clears the cached graphs of the block and its children, without changing them
    _calls.hybridizing = getattr(_calls, "hybridizing", 0) + 1
    try:
        _state["originals"]["hybridize"](self, *args, **kwargs)
    finally:
        _calls.hybridizing -= 1


def _amp_save_parameters(self, filename, deduplicate=False):
    cast = current().adopted(self) if current() else None
    if cast is None:
        return _state["originals"]["save_parameters"](self, filename, deduplicate)
    return cast.save_parameters(filename, deduplicate)


def _amp_save_params(self, filename):
    cast = current().adopted(self) if current() else None
    if cast is None:
        return _state["originals"]["save_params"](self, filename)
    mx.nd.save(filename, {name[len(self.prefix):] if name.startswith(self.prefix) else name:
                          float32_value(param)
                          for name, param in self.collect_params().items()})
    return None


def _amp_load_parameters(self, filename, ctx=None, allow_missing=False, ignore_extra=False,
                         cast_dtype=False, dtype_source="current"):
    cast = current().adopted(self) if current() else None
    load = _state["originals"]["load_parameters"].__get__(self) if cast is None else \
        cast.load_parameters
    return load(filename, ctx=ctx, allow_missing=allow_missing,
                  ignore_extra=ignore_extra, cast_dtype=cast_dtype, dtype_source=dtype_source)


#: (class, attribute, wrapper): what ``install`` replaces.
_WRAPPERS = (
    (gluon.HybridBlock, "__call__", _amp_call),
    (gluon.HybridBlock, "cast", _amp_cast),
    (gluon.HybridBlock, "_clear_cached_op", _amp_clear_cached_op),
    (gluon.HybridBlock, "hybridize", _amp_hybridize),
    (gluon.Block, "save_parameters", _amp_save_parameters),
    (gluon.Block, "save_params", _amp_save_params),
    (gluon.Block, "load_parameters", _amp_load_parameters),
)


def install(session):
    """Make ``session`` the active one and put the wrappers in place (once)."""
    if not _state["originals"]:
        for cls, name, wrapper in _WRAPPERS:
            key = name if name != "__call__" else "call"
            _state["originals"][key] = cls.__dict__.get(name)
            setattr(cls, name, wrapper)
    _state["session"] = session


def uninstall():
    """Remove every wrapper and forget the session; networks cast so far stay cast."""
    originals = _state["originals"]
    for cls, name, _ in _WRAPPERS:
        if not originals:
            break
        original = originals.get(name if name != "__call__" else "call")
        if original is None:
            delattr(cls, name)
        else:
            setattr(cls, name, original)
    originals.clear()
    _state["session"] = None
