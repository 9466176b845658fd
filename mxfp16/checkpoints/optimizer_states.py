"""Optimizer states in a file that cannot run code: MXNet's NDArray format plus JSON, no pickle.

MXNet writes optimizer states with ``pickle`` (``Trainer.save_states``,
``Module.save_optimizer_states``, ``Updater.get_states``), and unpickling a file runs whatever code
its author put in it.  mxfp16's checkpoints and training states write them with
:func:`save_optimizer_states` instead: one ``mx.nd.save`` file whose arrays are the states'
NDArrays and whose entry ``mxfp16:record`` holds, as UTF-8 JSON bytes, how they nest (each
parameter's state is None, an NDArray, or a tuple of those: momentum, the float32 master weight),
the optimizer's counters (``num_update``, the update count of every parameter on every device) and
its other plain settings, the lr scheduler's, and a caller's ``extra`` values (the loss scaler's
state).  Loading reads arrays and JSON only, and restores every value bit for bit.

A pickled ``.states`` file (MXNet's, GluonCV's, or an mxfp16 checkpoint written before this
format) is read only when the caller says it trusts it (``allow_pickle=True``, ``--allow-pickle``).
"""
import copy
import json

import mxnet as mx
import numpy as np

from .. import mxnet_internals
from ..optimizers import adapt_states, restore_multi_precision

__all__ = ["save_optimizer_states", "read_optimizer_states", "restore_optimizer",
           "save_trainer_states", "load_trainer_states", "is_pickle_file", "PICKLE_RISK"]

STATES_FORMAT = "mxfp16-optimizer-states"
RECORD_KEY = "mxfp16:record"

#: The one line that says why pickled state files are read only on request.
PICKLE_RISK = ("a pickled .states file can run any code when it is read (MXNet and GluonCV write "
               "them with pickle): load one only from a source you trust")

_PLAIN = (bool, int, float, str, type(None))


def is_pickle_file(path):
    """Whether ``path`` starts like a pickle (protocol 2 or later: MXNet's and GluonCV's
    ``.states`` files) rather than like an MXNet NDArray file.

    Examples
    --------
    >>> import os, pickle, tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), 'x.states')
    >>> pickle.dump({0: None}, open(path, 'wb'))
    >>> is_pickle_file(path)
    True
    """
    with open(path, "rb") as data:
        return data.read(1) == b"\x80"


def _flatten(state, arrays):
    if state is None:
        return None
    if isinstance(state, mx.nd.NDArray):
        arrays[f"s{len(arrays)}"] = state
        return {"array": len(arrays) - 1}
    if isinstance(state, (tuple, list)):
        kind = "tuple" if isinstance(state, tuple) else "list"
        return {kind: [_flatten(item, arrays) for item in state]}
    if isinstance(state, _PLAIN):
        return {"value": state}
    raise TypeError(f"an optimizer state of type {type(state).__name__} cannot be saved without "
                    "pickle: states are NDArrays, tuples or lists of them, numbers or None")


def _unflatten(spec, arrays):
    if spec is None:
        return None
    if "array" in spec:
        return arrays[f"s{spec['array']}"]
    if "value" in spec:
        return spec["value"]
    kind = "tuple" if "tuple" in spec else "list"
    items = [_unflatten(item, arrays) for item in spec[kind]]
    return tuple(items) if kind == "tuple" else items


def _plain_attributes(obj):
    return {key: value for key, value in vars(obj).items() if type(value) in _PLAIN}


def _optimizer_record(optimizer):
    counts = getattr(optimizer, "_all_index_update_counts", {0: optimizer._index_update_count})
    scheduler = getattr(optimizer, "lr_scheduler", None)
    return {"class": type(optimizer).__name__, "attributes": _plain_attributes(optimizer),
            "index_update_counts": [[device, list(map(list, per_index.items()))]
                                    for device, per_index in counts.items()],
            "lr_scheduler": None if scheduler is None else _plain_attributes(scheduler)}


def save_optimizer_states(path, states, optimizer=None, extra=None):
    """Write optimizer ``states`` (``{index: state}`` as an ``Updater`` keeps them) and the
    ``optimizer``'s counters and settings to ``path`` without pickle (see the module notes).

    Parameters
    ----------
    path : str
    states : dict
        Keys int or str; each state None, an NDArray, a number, or a tuple/list of those.
    optimizer : mx.optimizer.Optimizer, optional
        Its plain attributes (``num_update``, ``lr``, ``multi_precision``, ...), per-parameter
        update counts and lr scheduler's plain attributes are recorded too.
    extra : dict, optional
        JSON-ready values kept alongside (the loss scaler's state).

    Examples
    --------
    >>> import os, tempfile, mxnet as mx
    >>> path = os.path.join(tempfile.mkdtemp(), 'x.states')
    >>> momentum, master = mx.nd.array([0.5, -1]), mx.nd.array([1, 2])
    >>> save_optimizer_states(path, {0: (momentum, master), 1: None}, extra={'step': 3})
    >>> states, record = read_optimizer_states(path)
    >>> states[0][0].asnumpy().tolist(), states[1], record['extra']
    ([0.5, -1.0], None, {'step': 3})
    """
    arrays = {}
    record = {"format": STATES_FORMAT, "version": 1,
              "states": [[key, _flatten(state, arrays)] for key, state in states.items()],
              "optimizer": None if optimizer is None else _optimizer_record(optimizer),
              "extra": extra or {}}
    text = json.dumps(record, sort_keys=True).encode()
    arrays[RECORD_KEY] = mx.nd.array(np.frombuffer(text, dtype=np.uint8), dtype="uint8")
    mx.nd.save(path, arrays)


def read_optimizer_states(path):
    """``(states, record)`` of a file :func:`save_optimizer_states` wrote: the states keyed as they
    were saved (arrays on the CPU) and the JSON record (``optimizer``, ``extra``).

    Raises
    ------
    ValueError
        If the file is a pickle (naming :data:`PICKLE_RISK` and the flag that allows it) or not a
        states file.
    """
    if is_pickle_file(path):
        raise ValueError(f"{path} is a pickled optimizer state: {PICKLE_RISK}; pass "
                         "--allow-pickle (allow_pickle=True) if you trust it")
    try:
        arrays = mx.nd.load(path)
        record = json.loads(arrays.pop(RECORD_KEY).asnumpy().tobytes().decode())
    except (mx.base.MXNetError, KeyError, ValueError, AttributeError) as error:
        raise ValueError(f"{path} is not an optimizer state file mxfp16 wrote "
                         f"({' '.join(str(error).split())[:120]}): pass the .states file of a "
                         "checkpoint") from None
    if not isinstance(record, dict) or record.get("format") != STATES_FORMAT:
        raise ValueError(f"{path} is not an optimizer state file mxfp16 wrote: pass the .states "
                         "file of a checkpoint")
    states = {key: _unflatten(spec, arrays) for key, spec in record["states"]}
    return states, record


def restore_optimizer(optimizer, record):
    """Give ``optimizer`` the counters and plain settings a :func:`save_optimizer_states` record
    holds (``record['optimizer']``), and its lr scheduler the scheduler's: as unpickling MXNet's
    file would, without the pickle."""
    saved = record.get("optimizer")
    if not saved:
        return
    for key, value in saved["attributes"].items():
        setattr(optimizer, key, value)
    counts = {device: {index: count for index, count in per_index}
              for device, per_index in saved["index_update_counts"]}
    if hasattr(optimizer, "_all_index_update_counts"):
        optimizer._all_index_update_counts = counts
        optimizer._index_update_count = counts[next(iter(counts))]
    else:
        optimizer._index_update_count = counts[next(iter(counts))]
    scheduler = getattr(optimizer, "lr_scheduler", None)
    if scheduler is not None and saved.get("lr_scheduler"):
        for key, value in saved["lr_scheduler"].items():
            setattr(scheduler, key, value)


def _updaters(trainer):
    updaters = mxnet_internals.trainer_updaters(trainer)
    if not updaters:
        raise ValueError("this Trainer updates on its kvstore (update_on_kvstore=True), which keeps "
                         "the optimizer state where it can only be pickled: create it with "
                         "update_on_kvstore=False (mxfp16.Trainer and mxfp16.make_trainer do)")
    return updaters


def save_trainer_states(trainer, path):
    """Write a Gluon Trainer's optimizer state to ``path`` without pickle: what
    ``trainer.save_states`` keeps (the first device's states, the optimizer), plus the loss
    scaler's state of an :class:`mxfp16.Trainer`.

    Examples
    --------
    >>> import os, tempfile, mxnet as mx
    >>> from mxnet import gluon
    >>> net = gluon.nn.Dense(1, in_units=2)
    >>> net.initialize(mx.init.One())
    >>> trainer = gluon.Trainer(net.collect_params(), 'sgd', {'momentum': 0.9})
    >>> with mx.autograd.record():
    ...     loss = net(mx.nd.ones((1, 2))).sum()
    >>> loss.backward(); trainer.step(1)
    >>> path = os.path.join(tempfile.mkdtemp(), 'trainer.states')
    >>> save_trainer_states(trainer, path)
    >>> fresh = gluon.Trainer(net.collect_params(), 'sgd', {'momentum': 0.9})
    >>> load_trainer_states(fresh, path)
    >>> fresh.optimizer.num_update
    1
    """
    mxnet_internals.init_trainer_kvstore(trainer)
    updater = _updaters(trainer)[0]
    scaler = getattr(trainer, "scaler", None)
    extra = {} if scaler is None else {scaler.state_dict_key: scaler.state_dict()}
    save_optimizer_states(path, updater.states, trainer.optimizer, extra)


def load_trainer_states(trainer, path, allow_pickle=False):
    """Load a file :func:`save_trainer_states` wrote into ``trainer`` (every device gets its own
    copy of the states), or, with ``allow_pickle``, a pickled ``trainer.save_states`` file.

    An :class:`mxfp16.Trainer` gets its loss scaler's state back, and the states are fitted to
    its weights' dtypes as in :meth:`mxfp16.Trainer.load_states`.

    Raises
    ------
    ValueError
        For a pickled file without ``allow_pickle`` (naming the risk), or a file that is not a
        states file.
    """
    if allow_pickle and is_pickle_file(path):
        trainer.load_states(path)
        return
    states, record = read_optimizer_states(path)
    mxnet_internals.init_trainer_kvstore(trainer)
    updaters = _updaters(trainer)
    for number, updater in enumerate(updaters):
        updater.states = states if number == 0 else {
            key: copy.deepcopy(state) for key, state in states.items()}
        updater.states_synced = dict.fromkeys(updater.states, False)
    restore_optimizer(trainer.optimizer, record)
    scaler = getattr(trainer, "scaler", None)
    if scaler is not None and scaler.state_dict_key in record["extra"]:
        scaler.load_state_dict(record["extra"][scaler.state_dict_key])
    dtype = getattr(trainer, "dtype", None)
    if dtype is not None:
        restore_multi_precision(trainer.optimizer, dtype)
        params = mxnet_internals.trainer_params(trainer)
        for updater in updaters:
            adapt_states(updater, params)
