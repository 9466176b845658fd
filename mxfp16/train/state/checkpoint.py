"""Checkpoints in MXNet's own formats plus a small JSON file: one save/load pair for both APIs.

The checkpoint of epoch ``N`` (``N`` epochs done) under ``PREFIX`` is four files:

* ``PREFIX-symbol.json``: the float32 graph, data to logits (shared by the epochs);
* ``PREFIX-NNNN.params``: float32 parameters named ``arg:...`` / ``aux:...``, so the pair is an
  ordinary MXNet checkpoint (``mx.model.load_checkpoint``, ``SymbolBlock.imports``) whatever the
  training dtype, and ``get_model(name, classes=N).load_parameters`` loads it too (the names are
  relative to the zoo network's name scope: :mod:`mxfp16.train.state.param_names`); float16 training
  stores the optimizer's float32 master weights, the values its float16 weights are rounded from;
* ``PREFIX-NNNN.states``: the optimizer state as arrays plus JSON, never a pickle
  (:mod:`mxfp16.checkpoints.optimizer_states`): it cannot run code when it is read;
* ``PREFIX-NNNN.json``: epoch, update count, learning rate, loss-scaler state (under
  ``LossScaler.state_dict_key``), metrics, the resolved configuration, and the size and SHA-256 of
  each of the other files.

A mid-epoch checkpoint (``--save-steps``, ``--save-minutes``, or a stop on SIGTERM/SIGINT) is
``PREFIX-NNNN+BBBBBB``: ``NNNN`` epochs and ``BBBBBB`` batches of the next epoch done, with the same
four files (``PREFIX-0001+000250.params``, ...) and, in its JSON file, the position and the partial
epoch's metrics.  Checkpoints are ordered by position, so ``PREFIX-0002`` comes after
``PREFIX-0001+000250``.

Saving is atomic: each file is written to a temporary file in the same folder and flushed to disk
(``fsync``), then all are renamed, the JSON file last, and the folder is flushed.  A checkpoint
exists once its JSON file does, so a process killed during a save leaves the previous checkpoints
loadable and no half-written one that looks complete; and since the JSON file records the other
files' sizes, a checkpoint cut short anyway (a machine that died before the disk had everything) is
passed over when resuming from ``PREFIX``, for the newest complete one.

Loading recomputes the SHA-256 of every file: a checkpoint damaged after its save (bit flips of the
same size included) is passed over with one warning naming the file, or, named explicitly, is one
error.  Parameters that are not finite are refused, naming the parameter.  The graph file is shared
by all checkpoints and not needed to resume (the network comes from ``--network``): a damaged one is
named in a warning and rewritten by the next save.  Checkpoints written before checksums load with
a note; their ``.states`` file is a pickle, read only with ``--allow-pickle``.
"""
import glob
import json
import logging
import os
import re
from dataclasses import dataclass

import mxnet as mx

from ...checkpoints.atomic import StagedFiles
from ...checkpoints.files import (damaged_files, non_finite_name, seal, seal_broken,
                                write_failure_cause)
from ...models import Network
from ...checkpoints.optimizer_states import is_pickle_file
from .param_names import relative_names, with_prefix

#: Written into every JSON file, checked when loading.
CHECKPOINT_FORMAT = "mxfp16-checkpoint"
CHECKPOINT_VERSION = 2

#: The JSON key of the name-scope prefix taken off the parameter names (``''``: none).
PARAM_PREFIX_KEY = "param_prefix"

log = logging.getLogger("mxfp16.train")

_EPOCH_SUFFIX = re.compile(r"^(?P<prefix>.+)-(?P<epoch>\d{4,})$")
_POSITION_SUFFIX = re.compile(r"^(?P<prefix>.+)-(?P<epoch>\d{4,})(\+(?P<batch>\d{6,}))?$")


class CheckpointError(ValueError):
    """A checkpoint that does not exist, is incomplete or corrupt, or does not fit the network."""


@dataclass(frozen=True)
class CheckpointPaths:
    """The files of one checkpoint (see the module notes)."""

    symbol: str
    params: str
    states: str
    meta: str
    devices: str = None


def checkpoint_name(prefix, epoch, batch=0):
    """``PREFIX-NNNN`` after ``epoch`` epochs, ``PREFIX-NNNN+BBBBBB`` ``batch`` batches further.

    Examples
    --------
    >>> checkpoint_name('runs/r50', 3), checkpoint_name('runs/r50', 3, 250)
    ('runs/r50-0003', 'runs/r50-0003+000250')
    """
    return "%s-%04d" % (prefix, epoch) + ("+%06d" % batch if batch else "")


def checkpoint_paths(prefix, epoch, batch=0):
    """The files of the checkpoint of ``epoch`` (and ``batch`` batches of the next) under
    ``prefix``.

    Examples
    --------
    >>> checkpoint_paths('runs/r50', 3).params
    'runs/r50-0003.params'
    >>> checkpoint_paths('runs/r50', 3, 250).meta
    'runs/r50-0003+000250.json'
    """
    stem = checkpoint_name(prefix, epoch, batch)
    return CheckpointPaths(f"{prefix}-symbol.json", f"{stem}.params", f"{stem}.states",
                           f"{stem}.json", f"{stem}.devices")


@dataclass
class Checkpoint:
    """A loaded checkpoint.

    Attributes
    ----------
    prefix : str
    epoch : int
        Epochs done; training resumes with epoch ``epoch`` (counting from 0).
    batch : int
        Batches of epoch ``epoch`` done (0 for an epoch checkpoint).
    network : mxfp16.models.Network
        The float32 graph and parameters.
    states_path : str
        The optimizer-state file, for ``Trainer.load_states`` / ``Module.load_optimizer_states``.
    meta : dict
        The JSON file: ``num_update``, ``lr``, ``api``, ``dtype``, ``metrics``, ``config`` and the
        loss-scaler state under ``LossScaler.state_dict_key``.
    """

    prefix: str
    epoch: int
    network: Network
    states_path: str
    meta: dict
    batch: int = 0

    @property
    def states_pickled(self):
        """Whether the ``.states`` file is a pickle (a checkpoint written before version 2)."""
        return is_pickle_file(self.states_path)

    @property
    def devices_path(self):
        """The ``.devices`` file (each device's auxiliary states), None without."""
        path = checkpoint_paths(self.prefix, self.epoch, self.batch).devices
        return path if os.path.basename(path) in self.meta.get("files", {}) else None

    @property
    def name(self):
        """``PREFIX-NNNN`` or ``PREFIX-NNNN+BBBBBB``, as ``--resume`` takes it."""
        return checkpoint_name(self.prefix, self.epoch, self.batch)


def save_checkpoint(prefix, epoch, network, save_states, scaler, batch=0, device_aux=None,
                    **meta):
    """Save a checkpoint atomically (see the module notes).

    Parameters
    ----------
    prefix : str
        Path prefix, e.g. ``runs/r50``; its folder is created.
    epoch : int
        Epochs done.
    network : mxfp16.models.Network
        The float32 graph and the current parameters (any float dtype; stored as float32).
    save_states : callable
        ``save_states(path)`` writes the optimizer state (``trainer.save_states``,
        ``module.save_optimizer_states``).
    scaler : mxfp16.LossScaler
        Its ``state_dict()`` is stored under its ``state_dict_key``.
    batch : int
        Batches of epoch ``epoch`` done: a mid-epoch checkpoint ``PREFIX-NNNN+BBBBBB``.
    device_aux : dict of str to NDArray, optional
        Each device's auxiliary states (``'DEVICE:name'``), which a run on several devices keeps
        apart: written to a fifth file, ``.devices``, so that a resumed run on the same devices
        continues bit for bit (the ``.params`` file has one value for all).
    **meta
        JSON-ready values stored too (``num_update``, ``lr``, ``api``, ``dtype``, ``config``, ...).

    Returns
    -------
    CheckpointPaths
    """
    paths = checkpoint_paths(prefix, epoch, batch)
    network, meta[PARAM_PREFIX_KEY] = relative_names(network)
    params = {**{f"arg:{k}": v.astype("float32") for k, v in network.arg_params.items()},
              **{f"aux:{k}": v.astype("float32") for k, v in network.aux_params.items()}}
    try:
        with StagedFiles(os.path.dirname(os.path.abspath(prefix))) as files:
            files.write(paths.symbol, lambda p: network.symbol.save(p, remove_amp_cast=False),
                        verify=mx.sym.load)
            files.write(paths.params, lambda p: mx.nd.save(p, params), verify=mx.nd.load)
            files.write(paths.states, save_states, verify=_whole_states)
            if device_aux:
                files.write(paths.devices, lambda p: mx.nd.save(p, device_aux), verify=mx.nd.load)
            record = dict(meta, format=CHECKPOINT_FORMAT, version=CHECKPOINT_VERSION, epoch=epoch,
                          batch=batch, files=files.sizes(), sha256=files.digests(),
                          **{scaler.state_dict_key: scaler.state_dict()})
            files.write(paths.meta, lambda p: _write_json(p, record))
    except (OSError, mx.base.MXNetError) as error:
        raise CheckpointWriteError(checkpoint_name(prefix, epoch, batch), prefix, error) from None
    return paths


def _whole_states(path):
    """Read an optimizer-state file back (a pickle written by a caller's own ``save_states`` is
    left alone)."""
    if not is_pickle_file(path):
        mx.nd.load(path)


class CheckpointWriteError(CheckpointError):
    """A checkpoint could not be written (disk full, file size limit, read-only folder): the
    message names it, the cause and the fix; the checkpoints before are intact."""

    def __init__(self, name, prefix, error):
        likely = write_failure_cause(os.path.dirname(os.path.abspath(prefix)))
        cause = error.strerror if isinstance(error, OSError) and error.strerror else \
            f"a file was written incompletely{': ' + likely if likely else ''}; MXNet says: " \
            f"{_first_line(error)}"
        super().__init__(f"checkpoint {name} could not be written ({cause}): the checkpoints saved "
                         "before are intact and no temporary file is left; free disk space, raise "
                         "the file size limit (ulimit -f) or make the folder writable, then resume "
                         f"with --resume {prefix}")


def _first_line(error):
    """The informative first line of an exception (MXNet's carry a C++ stack trace)."""
    lines = [line.strip() for line in str(error).strip().splitlines() if line.strip()]
    for line in lines:
        if "Stack trace" not in line and not line.startswith(("[bt]", "File ", "Traceback")):
            return line.replace("MXNetError: ", "")[:160]
    return lines[0][:160] if lines else type(error).__name__


def _write_json(path, record):
    with open(path, "w") as out:
        json.dump(seal(record), out, indent=1, sort_keys=True)


def saved_positions(prefix):
    """``(epoch, batch)`` of every checkpoint with a JSON file under ``prefix``, oldest first
    (``batch`` 0 for epoch checkpoints).

    Examples
    --------
    >>> import tempfile, os
    >>> prefix = os.path.join(tempfile.mkdtemp(), 'run')
    >>> for epoch, batch in ((2, 0), (10, 0), (2, 31)):
    ...     open(checkpoint_paths(prefix, epoch, batch).meta, 'w').close()
    >>> saved_positions(prefix)
    [(2, 0), (2, 31), (10, 0)]
    """
    positions = []
    for path in glob.glob(glob.escape(prefix) + "-*.json"):
        match = _POSITION_SUFFIX.match(path[:-len(".json")])
        if match and match.group("prefix") == prefix:
            positions.append((int(match.group("epoch")), int(match.group("batch") or 0)))
    return sorted(positions)


def remove_mid_epoch_checkpoints(prefix, before):
    """Delete the mid-epoch checkpoints under ``prefix`` older than position ``before`` (an
    ``(epoch, batch)`` just saved), JSON file first so none is ever left looking complete.

    Examples
    --------
    >>> import tempfile, os
    >>> prefix = os.path.join(tempfile.mkdtemp(), 'run')
    >>> for epoch, batch in ((1, 0), (1, 50), (1, 100)):
    ...     open(checkpoint_paths(prefix, epoch, batch).meta, 'w').close()
    >>> remove_mid_epoch_checkpoints(prefix, before=(1, 100))
    >>> saved_positions(prefix)
    [(1, 0), (1, 100)]
    """
    for epoch, batch in saved_positions(prefix):
        if batch and (epoch, batch) < tuple(before):
            paths = checkpoint_paths(prefix, epoch, batch)
            for path in (paths.meta, paths.params, paths.states, paths.devices):
                if os.path.exists(path):
                    os.remove(path)


def saved_epochs(prefix):
    """Epochs with a complete checkpoint (a JSON file) under ``prefix``, in increasing order;
    mid-epoch checkpoints left out.

    Examples
    --------
    >>> import tempfile, os
    >>> prefix = os.path.join(tempfile.mkdtemp(), 'run')
    >>> for epoch in (2, 10):
    ...     open(checkpoint_paths(prefix, epoch).meta, 'w').close()
    >>> saved_epochs(prefix)
    [2, 10]
    """
    return [epoch for epoch, batch in saved_positions(prefix) if not batch]


def _candidates(spec):
    """``[(prefix, epoch, batch), ...]`` a ``--resume`` value may mean, the one to try first first:
    the named checkpoint, or every checkpoint under a prefix, newest first."""
    spec = str(spec)
    match = _POSITION_SUFFIX.match(spec)
    if match and os.path.isfile(f"{spec}.json"):
        return [(match.group("prefix"), int(match.group("epoch")), int(match.group("batch") or 0))]
    positions = saved_positions(spec)
    if positions:
        return [(spec, epoch, batch) for epoch, batch in reversed(positions)]
    if match and os.path.isfile(f"{spec}.params"):
        raise CheckpointError(f"checkpoint {spec!r} has {spec}.params but no {spec}.json: its save "
                              "was interrupted or it was not written by mxfp16; resume from an "
                              "earlier epoch, or fine-tune from it with scripts/fine_tune.py")
    raise CheckpointError(f"no checkpoint {spec!r}: expected {spec}.json (PREFIX-NNNN or "
                          f"PREFIX-NNNN+BBBBBB) or {spec}-NNNN.json files (PREFIX); pass the "
                          "--model-prefix of a run, with or without -NNNN")


def find_checkpoint(spec):
    """``(prefix, epoch, batch)`` of a ``--resume`` value: ``PREFIX-NNNN``, ``PREFIX-NNNN+BBBBBB``,
    or ``PREFIX`` for its newest checkpoint (mid-epoch ones included; :func:`load_checkpoint` passes
    over incomplete ones).

    Raises
    ------
    CheckpointError
        If there is no such checkpoint, naming what was looked for.
    """
    return _candidates(spec)[0]


def _read_meta(path):
    try:
        with open(path) as lines:
            meta = json.load(lines)
    except (OSError, ValueError) as error:
        raise CheckpointError(f"checkpoint file {path!r} cannot be read ({error}): resume from "
                              "another epoch") from None
    if not isinstance(meta, dict) or meta.get("format") != CHECKPOINT_FORMAT:
        raise CheckpointError(f"{path!r} is not an mxfp16 checkpoint file (no format "
                              f"{CHECKPOINT_FORMAT!r}): pass a checkpoint written by the training "
                              "scripts")
    if seal_broken(meta):
        raise CheckpointError(f"checkpoint file {path!r} has other contents than when it was saved "
                              "(its SHA-256 differs): it is damaged; resume from another checkpoint")
    return meta


def _check_files(paths, meta):
    """Raise for the first damaged file of the checkpoint (the shared graph file left out: see
    :func:`_load_symbol`)."""
    folder = os.path.dirname(paths.meta)
    symbol = os.path.basename(paths.symbol)
    sizes = {k: v for k, v in meta.get("files", {}).items() if k != symbol}
    for path, why in damaged_files(folder, sizes, meta.get("sha256", {})):
        raise CheckpointError(f"checkpoint file {path!r} {why}: the checkpoint is incomplete, "
                              "damaged or was overwritten; resume from another checkpoint")


def verify_mxnet_files(prefix, epoch):
    """Verify the files of ``PREFIX-symbol.json`` + ``PREFIX-NNNN.params`` against the checksums
    of the mxfp16 checkpoint they belong to, if they belong to one (a fine-tuning start): the graph
    file counts too, since fine-tuning needs it.

    Raises
    ------
    CheckpointError
        Naming the damaged file.
    """
    paths = checkpoint_paths(prefix, epoch)
    if not os.path.isfile(paths.meta):
        return
    meta = _read_meta(paths.meta)
    names = {os.path.basename(paths.symbol), os.path.basename(paths.params)}
    sizes = {k: v for k, v in meta.get("files", {}).items() if k in names}
    for path, why in damaged_files(os.path.dirname(paths.meta), sizes, meta.get("sha256", {})):
        raise CheckpointError(f"checkpoint file {path!r} {why}: it is damaged or was overwritten; "
                              "fine-tune from another checkpoint (--load-epoch)")


def check_finite(arrays, source):
    """Raise :class:`CheckpointError` naming the first parameter of ``arrays`` that holds NaN or
    infinity (``source`` names the file)."""
    bad = non_finite_name(arrays)
    if bad is not None:
        raise CheckpointError(f"{source} holds NaN or infinite values in parameter "
                              f"{bad.split(':', 1)[-1]!r}: it was saved after training diverged "
                              "and cannot be trained on; use an earlier checkpoint (and lower --lr "
                              "or use a loss scaler)")


def _load_symbol(paths, meta):
    """The graph, or None with a warning naming the file when it is damaged (resuming rebuilds the
    graph from --network; the next save rewrites the file)."""
    name = os.path.basename(paths.symbol)
    recorded = {k: v for k, v in meta.get("sha256", {}).items() if k == name}
    size = meta.get("files", {}).get(name)
    problems = damaged_files(os.path.dirname(paths.meta), {name: size}, recorded) \
        if size is not None else []
    try:
        if not problems:
            return mx.sym.load(paths.symbol)
        why = problems[0][1]
    except mx.base.MXNetError as error:
        why = f"cannot be read ({_first_line(error)})"
    log.warning("graph file %s %s: not needed to resume (the graph comes from --network; the next "
                "checkpoint rewrites it); to use the checkpoint elsewhere, restore the file or "
                "export the network again", paths.symbol, why)
    return None


def load_checkpoint(spec):
    """Load a checkpoint written by :func:`save_checkpoint`.

    Parameters
    ----------
    spec : str
        ``PREFIX-NNNN`` or ``PREFIX-NNNN+BBBBBB``, or ``PREFIX`` for the newest complete checkpoint
        saved under it: an incomplete or unreadable one is passed over (with a warning) for the one
        before.

    Returns
    -------
    Checkpoint

    Raises
    ------
    CheckpointError
        If it does not exist, is incomplete or cannot be read (for ``PREFIX``: none under it
        can).

    Examples
    --------
    >>> import os, tempfile, mxnet as mx, mxfp16
    >>> fc = mx.sym.FullyConnected(mx.sym.var('data'), num_hidden=2, name='fc')
    >>> network = Network(fc, {'fc_weight': mx.nd.ones((2, 3)), 'fc_bias': mx.nd.zeros(2)}, {})
    >>> prefix = os.path.join(tempfile.mkdtemp(), 'run')
    >>> from mxfp16.checkpoints.optimizer_states import save_optimizer_states
    >>> def save_states(path):  # e.g. functools.partial(save_trainer_states, trainer)
    ...     save_optimizer_states(path, {})
    >>> for epoch in (1, 2):
    ...     _ = save_checkpoint(prefix, epoch, network, save_states, mxfp16.DynamicLossScaler(),
    ...                         num_update=10 * epoch)
    >>> loaded = load_checkpoint(prefix)  # the latest epoch
    >>> os.path.basename(loaded.name), loaded.meta['num_update'], loaded.meta['loss_scaler']['loss_scale']
    ('run-0002', 20, 65536.0)
    >>> sorted(loaded.network.arg_params)
    ['fc_bias', 'fc_weight']
    """
    candidates = _candidates(spec)
    for index, (prefix, epoch, batch) in enumerate(candidates):
        try:
            return _load(prefix, epoch, batch)
        except CheckpointError as error:
            if index + 1 == len(candidates):
                raise
            log.warning("checkpoint %s is passed over: %s", checkpoint_name(prefix, epoch, batch),
                        " ".join(str(error).split()))
    raise AssertionError("unreachable")


def _load(prefix, epoch, batch):
    paths = checkpoint_paths(prefix, epoch, batch)
    name = checkpoint_name(prefix, epoch, batch)
    meta = _read_meta(paths.meta)
    _check_files(paths, meta)
    if "sha256" not in meta:
        log.warning("checkpoint %s was saved without checksums (before mxfp16's checkpoint version "
                    "2): loaded without verifying its files", name)
    try:
        saved = mx.nd.load(paths.params)
    except mx.base.MXNetError as error:
        raise CheckpointError(f"checkpoint file {paths.params!r} cannot be read "
                              f"({_first_line(error)}): resume from another checkpoint") from None
    check_finite(saved, f"checkpoint file {paths.params!r}")
    symbol = _load_symbol(paths, meta)
    arg_params = {k[4:]: v for k, v in saved.items() if k.startswith("arg:")}
    aux_params = {k[4:]: v for k, v in saved.items() if k.startswith("aux:")}
    network = with_prefix(Network(symbol, arg_params, aux_params), meta.get(PARAM_PREFIX_KEY, ""))
    return Checkpoint(prefix, epoch, network, paths.states, meta, batch)
