"""GluonCV's optimizer state (``--resume-states``): a ``gluon.Trainer.save_states`` file of
GluonCV's network, loaded into the Trainer of a run.

gluon.Trainer keys each parameter's state by the parameter's position in its list, the sorted
names of ``net.collect_params()``.  GluonCV's file follows its network's order; the run's Trainer
has its own, so the states are matched by name.  A float32 run's states become the float16 layout
when the run trains in float16 (:func:`mxfp16.optimizers.adapt_states`), with the float32 weights
of ``--resume-params`` as master weights, not their float16 rounding; a float16 run's master
weights become the weights of parameters that train in float32 (all of them in a float32 run,
BatchNorm's in a float16 one).
"""
import os
import pickle
import tempfile

from ... import mxnet_internals
from ...checkpoints.optimizer_states import PICKLE_RISK
from ...optimizers import adapt_states, master_weight, restore_multi_precision
from ..gluon_api import load_trainer_states


def read_states(path, allow_pickle=False):
    """``(states, optimizer)`` of a ``gluon.Trainer.save_states`` file (``optimizer`` None when
    the file holds the states alone).  Such a file is a pickle, which can run code when read: it is
    read only with ``allow_pickle`` (``--allow-pickle``).

    Raises
    ------
    ValueError
        If the file is not such a file, or ``allow_pickle`` is False.
    """
    if not allow_pickle:
        raise ValueError(f"--resume-states {path}: {PICKLE_RISK}; pass --allow-pickle if you "
                         "trust this file")
    try:
        with open(path, "rb") as blob:
            saved = pickle.load(blob)
    except (OSError, pickle.UnpicklingError, EOFError, AttributeError, ImportError) as error:
        raise ValueError(f"--resume-states {path} cannot be read ({error}): pass the file "
                         "GluonCV's trainer.save_states wrote") from None
    states, optimizer = saved if isinstance(saved, tuple) and len(saved) == 2 else (saved, None)
    if not isinstance(states, dict):
        raise ValueError(f"--resume-states {path} is not a gluon.Trainer state file: pass the "
                         "file GluonCV's trainer.save_states wrote")
    return states, optimizer


def reorder_states(states, saved_order, names, path):
    """``states`` keyed by positions in ``saved_order``, re-keyed by positions in ``names``.

    Raises
    ------
    ValueError
        If a state belongs to no parameter of ``saved_order`` or of ``names``.

    Examples
    --------
    >>> reorder_states({0: 'state of b', 1: 'state of a'}, ('b', 'a'), ['a', 'b'], 'x.states')
    {1: 'state of b', 0: 'state of a'}
    """
    position = {name: i for i, name in enumerate(names)}
    if any(not 0 <= i < len(saved_order) for i in states):
        raise ValueError(f"--resume-states {path} holds states of {max(states) + 1} or more "
                         f"parameters and --model has {len(saved_order)}: pass the .states file "
                         "of the run that saved --resume-params")
    unknown = [saved_order[i] for i, state in states.items()
               if state is not None and saved_order[i] not in position]
    if unknown:
        raise ValueError(f"--resume-states {path}: the network has no parameter {unknown[0]} "
                         "(and maybe others): pass the --model the run was trained with")
    return {position[saved_order[i]]: state for i, state in states.items()
            if saved_order[i] in position}


def load_gluoncv_states(trainer, path, saved_order, *, dtype, master_values, allow_pickle=False):
    """Load GluonCV's ``trainer.save_states`` file ``path`` into ``trainer``.

    Parameters
    ----------
    trainer : gluon.Trainer
        The run's Trainer, its optimizer created from the command line (its settings and
        schedule position are kept; the file gives the states).
    path : str
    saved_order : tuple of str
        Parameter names in the file's order (sorted names of GluonCV's ``net.collect_params()``).
    dtype : str
        The training dtype: float16 states get float32 master weights.
    master_values : dict of str to NDArray
        float32 values of the weights (``--resume-params``), the master weights of float16.

    Raises
    ------
    ValueError
        For a file that is not such a file, holds another optimizer, or another network's states.
    """
    fresh = trainer.optimizer
    states, optimizer = read_states(path, allow_pickle)
    if optimizer is not None and type(optimizer) is not type(fresh):
        raise ValueError(f"--resume-states {path} holds the state of a "
                         f"{type(optimizer).__name__} optimizer and this run trains with "
                         f"{type(fresh).__name__}: pass --optimizer "
                         f"{type(optimizer).__name__.lower()}")
    params = mxnet_internals.trainer_params(trainer)
    states = reorder_states(states, saved_order, [param.name for param in params], path)
    handle, staged = tempfile.mkstemp(suffix=".states")
    try:
        with os.fdopen(handle, "wb") as out:
            pickle.dump((states, optimizer if optimizer is not None else fresh), out)
        load_trainer_states(trainer, staged, allow_pickle=True)  # the user's trusted file, re-keyed
    finally:
        os.remove(staged)
    saved_masters = {index: master_weight(trainer.optimizer, state)  # of a float16 run
                     for index, state in states.items()}
    restore_multi_precision(trainer.optimizer, dtype)
    for updater in mxnet_internals.trainer_updaters(trainer):
        saved = dict(updater.states)
        adapt_states(updater, params)
        for index, state in updater.states.items():
            if state is saved[index]:
                continue
            master = master_weight(updater.optimizer, state)
            if master is not None and params[index].name in master_values:  # a master added
                master[:] = master_values[params[index].name].as_in_context(master.context)
            elif master is None and saved_masters.get(index) is not None:  # a master dropped
                params[index].set_data(saved_masters[index].astype(params[index].dtype))
    mxnet_internals.restart_update_counts(trainer.optimizer, fresh.begin_num_update)
