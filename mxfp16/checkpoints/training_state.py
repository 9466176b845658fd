"""The whole state of a user's own training loop, saved and restored in one call each, so that a
preempted loop continues as if it had never stopped.

What a float16 loop must keep, and what Gluon's ``save_parameters`` alone loses: the float32 values
of the weights (the optimizer's master weights), the optimizer state (momenta, update counts), the
loss scaler's scale and counters (:meth:`mxfp16.Trainer.save_states` carries them), the step, and the
random state.  :func:`save_training_state` writes all of it for one or several networks and
Trainers (a GAN's two), as ``PREFIX-SSSSSSSS`` (the step, 8 digits):

* ``PREFIX-00000120.net0.params``, ``.net1.params``, ...: each network's parameters in float32
  (``block.save_parameters``; a :func:`mxfp16.cast_block` network writes its master weights);
* ``PREFIX-00000120.trainer0.states``, ...: each Trainer's optimizer state (and an
  :class:`mxfp16.Trainer`'s loss scaler) as arrays plus JSON, never a pickle
  (:func:`mxfp16.checkpoints.optimizer_states.save_trainer_states`): reading it cannot run code;
* ``PREFIX-00000120.json``: the step, your ``extra`` values (epoch, batch, metrics: anything
  JSON-ready), Python's and numpy's global random states, and the other files' sizes and SHA-256.

Each file is written to a temporary name, flushed to disk and renamed, the JSON file last: a state
exists once its JSON file does and its files have the sizes it records, so a write cut short by a
kill or a crash is never taken for a complete state, and :func:`latest_training_state` passes over
it.  Loading recomputes the checksums: a state whose files changed after the save (same size or
not) is passed over by :func:`latest_training_state`, and named in the error when asked for by
name; parameters that are not finite are refused, naming the parameter.  The newest ``keep``
states are kept, older ones deleted after the new one is complete; temporary files that a killed
write left (their writer's process is gone) are removed at the next save.  A state saved before checksums
loads with a warning; its pickled ``.states`` files only with ``allow_pickle=True``.

MXNet's own random generators (dropout, ``mx.nd.random``) cannot be read back; call
:func:`seed_step` at the start of every step to make each step's draws depend on ``(seed, step)``
only, and a resumed loop draws what the uninterrupted one drew.

Examples
--------
>>> import os, tempfile, mxnet as mx, mxfp16
>>> from mxnet import autograd, gluon
>>> def make():
...     net = gluon.nn.Dense(2, in_units=3)
...     net.initialize(mx.init.Constant(0.5))
...     net = mxfp16.cast_block(net, 'float16')
...     return net, mxfp16.Trainer(net.collect_params(), 'sgd', {'learning_rate': 0.1},
...                                dtype='float16')
>>> net, trainer = make()
>>> x = mx.nd.ones((4, 3))
>>> with autograd.record():
...     loss = net(x).sum()
>>> trainer.backward(loss); trainer.step(4)   # True: updated
True
>>> prefix = os.path.join(tempfile.mkdtemp(), 'state')
>>> name = mxfp16.save_training_state(prefix, 1, net, trainer, extra={'epoch': 0})
>>> net2, trainer2 = make()   # a new process: build the same loop, then restore
>>> state = mxfp16.load_training_state(prefix, net2, trainer2)
>>> state.step, state.extra, (net2(x) == net(x)).min().asscalar()
(1, {'epoch': 0}, 1.0)
"""
import functools
import glob
import json
import logging
import os
import random
import re
from dataclasses import dataclass

import mxnet as mx
import numpy as np

from .atomic import StagedFiles
from .files import (damaged_files, non_finite_name, remove_stale_temporaries, seal,
                               seal_broken)
from .optimizer_states import PICKLE_RISK, is_pickle_file, load_trainer_states, save_trainer_states

__all__ = ["TrainingState", "save_training_state", "load_training_state",
           "latest_training_state", "seed_step"]

#: Written into every JSON file, checked when loading.
STATE_FORMAT = "mxfp16-training-state"

log = logging.getLogger("mxfp16")

_STEP_SUFFIX = re.compile(r"^(?P<prefix>.+)-(?P<step>\d{8,})$")


@dataclass
class TrainingState:
    """What :func:`load_training_state` restored besides the networks and Trainers.

    Attributes
    ----------
    name : str
        ``PREFIX-SSSSSSSS``.
    step : int
    extra : dict
        The ``extra`` values given to :func:`save_training_state`.
    """

    name: str
    step: int
    extra: dict


def _as_list(items):
    return list(items) if isinstance(items, (list, tuple)) else [items]


def _files(name, num_nets, num_trainers):
    return ([f"{name}.net{i}.params" for i in range(num_nets)]
            + [f"{name}.trainer{i}.states" for i in range(num_trainers)])


def _write_json(path, record):
    with open(path, "w") as out:
        json.dump(seal(record), out, indent=1, sort_keys=True)


def _random_states():
    name, keys, pos, has_gauss, cached = np.random.get_state()
    python = random.getstate()
    return {"python": [python[0], list(python[1]), python[2]],
            "numpy": [name, keys.tolist(), int(pos), int(has_gauss), float(cached)]}


def _set_random_states(states):
    version, internal, gauss = states["python"]
    random.setstate((version, tuple(internal), gauss))
    name, keys, pos, has_gauss, cached = states["numpy"]
    np.random.set_state((name, np.array(keys, dtype=np.uint32), pos, has_gauss, cached))


def save_training_state(prefix, step, nets, trainers, extra=None, keep=2):
    """Save networks, Trainers, the step, ``extra`` and the random state as ``PREFIX-SSSSSSSS``.

    Parameters
    ----------
    prefix : str
        Path prefix, e.g. ``runs/gan/state``; its folder is created.
    step : int
        The steps done (resume continues with the next).
    nets : Block or list of Block
    trainers : gluon.Trainer or list of gluon.Trainer
        :class:`mxfp16.Trainer` saves its loss scaler's state too.
    extra : dict, optional
        JSON-ready values to keep (epoch, batch, metrics, ...).
    keep : int
        The newest states to keep; older ones are deleted once this one is complete.

    Returns
    -------
    str
        The state's name, ``PREFIX-SSSSSSSS``.
    """
    nets, trainers = _as_list(nets), _as_list(trainers)
    name = "%s-%08d" % (prefix, step)
    writers = [net.save_parameters for net in nets] + \
        [functools.partial(save_trainer_states, t) for t in trainers]
    remove_stale_temporaries(prefix, dead_writers_only=True)  # of a write killed before
    with StagedFiles(os.path.dirname(os.path.abspath(prefix))) as files:
        for path, write in zip(_files(name, len(nets), len(trainers)), writers):
            files.write(path, write, verify=mx.nd.load)
        record = {"format": STATE_FORMAT, "step": step, "extra": extra or {},
                  "nets": len(nets), "trainers": len(trainers), "random": _random_states(),
                  "files": files.sizes(), "sha256": files.digests()}
        files.write(f"{name}.json", lambda p: _write_json(p, record))
    for old in _saved_names(prefix)[:-keep] if keep else []:
        _remove(old)
    return name


def _saved_names(prefix):
    """``PREFIX-SSSSSSSS`` of the states with a JSON file under ``prefix``, oldest first."""
    names = []
    for path in glob.glob(glob.escape(prefix) + "-*.json"):
        match = _STEP_SUFFIX.match(path[:-len(".json")])
        if match and match.group("prefix") == prefix:
            names.append((int(match.group("step")), path[:-len(".json")]))
    return [name for _, name in sorted(names)]


def _remove(name):
    for path in [f"{name}.json"] + glob.glob(glob.escape(name) + ".*"):
        if os.path.exists(path):
            os.remove(path)


def _problem(name):
    """Why the state ``name`` is not complete, or None."""
    try:
        with open(f"{name}.json") as lines:
            record = json.load(lines)
    except (OSError, ValueError) as error:
        return f"{name}.json cannot be read ({error})"
    if not isinstance(record, dict) or record.get("format") != STATE_FORMAT:
        return f"{name}.json is not an mxfp16 training state"
    if seal_broken(record):
        return f"{name}.json has other contents than when it was saved (SHA-256 differs)"
    for path, why in damaged_files(os.path.dirname(name), record.get("files", {}),
                                   record.get("sha256", {})):
        return f"{path} {why}"
    return None


def latest_training_state(prefix):
    """The newest complete state under ``prefix`` (``PREFIX-SSSSSSSS``), or None if there is none:
    the rule of the scripts' ``--resume auto``, so that one command starts a loop and continues it.

    A state whose files are missing, of another size or of other bytes than its JSON file records
    (a write cut short, a damaged disk) is passed over, with one warning naming the file.

    Raises
    ------
    ValueError
        When states were saved under ``prefix`` but none is intact: starting afresh would save
        over them.

    Examples
    --------
    >>> import os, tempfile
    >>> prefix = os.path.join(tempfile.mkdtemp(), 'state')
    >>> latest_training_state(prefix) is None   # a first run: start at step 0
    True
    """
    names = _saved_names(prefix)
    problem = None
    for name in reversed(names):
        problem = _problem(name)
        if problem is None:
            return name
        log.warning("training state %s is passed over: %s", name, problem)
    if names:
        raise ValueError(f"none of the {len(names)} training state(s) under {prefix!r} is intact "
                         f"(the oldest: {problem}): starting afresh would save over them; move "
                         "them away (or pass another prefix) to start afresh")
    return None


def load_training_state(name_or_prefix, nets, trainers, allow_pickle=False):
    """Restore networks, Trainers and the random state from a state; return what else it holds.

    Parameters
    ----------
    name_or_prefix : str
        ``PREFIX-SSSSSSSS``, or ``PREFIX`` for its newest complete state.
    nets, trainers
        The same networks and Trainers, in the same order, as given to
        :func:`save_training_state`, built as before (same code, same dtype).
    allow_pickle : bool
        Read pickled ``.states`` files (a state saved before mxfp16 stopped pickling): a pickle
        can run any code when read, so only for files you trust.

    Returns
    -------
    TrainingState

    Raises
    ------
    ValueError
        No (complete, intact) state, another number of networks or Trainers, parameters that do
        not fit or are not finite, or a pickled state without ``allow_pickle``, each naming the
        file and the fix.
    """
    nets, trainers = _as_list(nets), _as_list(trainers)
    name = name_or_prefix
    if not os.path.isfile(f"{name}.json"):
        name = latest_training_state(name_or_prefix)
        if name is None:
            raise ValueError(f"no complete training state {name_or_prefix!r}: expected "
                             f"{name_or_prefix}.json or {name_or_prefix}-SSSSSSSS.json; pass the "
                             "prefix given to save_training_state")
    problem = _problem(name)
    if problem:
        raise ValueError(f"training state {name!r} is incomplete or damaged: {problem}; load "
                         "another one (latest_training_state finds the newest intact one)")
    with open(f"{name}.json") as lines:
        record = json.load(lines)
    if "sha256" not in record:
        log.warning("training state %s was saved without checksums: loaded without verifying "
                    "its files", name)
    if (record["nets"], record["trainers"]) != (len(nets), len(trainers)):
        raise ValueError(f"training state {name!r} holds {record['nets']} network(s) and "
                         f"{record['trainers']} Trainer(s), not {len(nets)} and {len(trainers)}: "
                         "pass the networks and Trainers that were saved, in the same order")
    files = _files(name, len(nets), len(trainers))
    for path in files[len(nets):]:
        if is_pickle_file(path) and not allow_pickle:
            raise ValueError(f"{path} is a pickled optimizer state (saved before mxfp16 stopped "
                             f"pickling): {PICKLE_RISK}; pass allow_pickle=True if you trust it")
    for net, path in zip(nets, files):
        _load_parameters(net, path)
    for trainer, path in zip(trainers, files[len(nets):]):
        load_trainer_states(trainer, path, allow_pickle=allow_pickle)
    _set_random_states(record["random"])
    return TrainingState(name, record["step"], record["extra"])


def _load_parameters(net, path):
    saved = mx.nd.load(path)
    bad = non_finite_name(saved)
    if bad is not None:
        raise ValueError(f"{path} holds NaN or infinite values in parameter {bad!r}: it was saved "
                         "after training diverged and cannot be trained on; load an earlier state")
    try:
        net.load_parameters(path)
    except (ValueError, AssertionError) as error:
        raise ValueError(f"{path} does not fit the network: {' '.join(str(error).split())}; "
                         "build the network as when it was saved") from None


def seed_step(seed, step):
    """Reseed Python's, numpy's and MXNet's random generators for step ``step`` of a run seeded
    ``seed``: call it first in every step, and a resumed loop draws (dropout masks, shuffles) what
    the uninterrupted one drew.

    Examples
    --------
    >>> import mxnet as mx
    >>> seed_step(0, 5); a = mx.nd.random.uniform(shape=3)
    >>> seed_step(0, 5); b = mx.nd.random.uniform(shape=3)
    >>> (a == b).min().asscalar()
    1.0
    """
    value = int(np.random.SeedSequence([seed, step]).generate_state(1)[0])
    random.seed(value)
    np.random.seed(value)
    mx.random.seed(value)
