"""Resuming a run from a checkpoint: the checks that it fits the network and settings, and the
:class:`StartPoint` the loop continues from (an epoch's start or the middle of an epoch)."""
import dataclasses
import logging

from ...checkpoints.optimizer_states import PICKLE_RISK
from .checkpoint import CheckpointError, load_checkpoint, saved_positions

log = logging.getLogger("mxfp16.train")


@dataclasses.dataclass(frozen=True)
class StartPoint:
    """Where a run starts: the first epoch, the updates done before it and the optimizer state
    (``states_order``: the parameter names in the order of a GluonCV ``.states`` file); from a
    mid-epoch checkpoint also the batches of ``begin_epoch`` done and their statistics."""

    begin_epoch: int = 0
    num_update: int = 0
    states_path: str = None
    states_order: tuple = None
    begin_batch: int = 0
    meter_state: dict = None
    devices_path: str = None
    num_devices: int = None


#: Settings a mid-epoch checkpoint must be resumed with: with others, "batch B of epoch E" would
#: name other images.  (``--num-epochs`` may change, as for epoch checkpoints: the schedules that
#: depend on it follow the new value from the resumed batch on.)
MID_EPOCH_SETTINGS = ("batch_size", "data_dir", "data_train", "synthetic", "num_examples",
                      "max_batches", "val_fraction", "seed")


#: The ``--resume`` value that continues ``--model-prefix``'s newest intact checkpoint if it has
#: one, else trains from the start: one command for a job's first run and every rerun.
AUTO = "auto"


def auto_resume(prefix):
    """What ``--resume auto`` means for the ``--model-prefix`` ``prefix``: ``(spec, note)``.

    ``spec`` is ``prefix`` once a checkpoint is saved under it (a JSON file: :func:`load_checkpoint`
    then takes the newest intact one, passing over damaged ones with a warning, and fails when
    none is intact, rather than train from the start over them), else None (no checkpoint: train
    from the start).  ``note`` is the log line that says which.

    Raises
    ------
    ValueError
        Without ``prefix``.

    Examples
    --------
    >>> import os, tempfile
    >>> prefix = os.path.join(tempfile.mkdtemp(), 'run')
    >>> auto_resume(prefix)[0] is None
    True
    >>> open(prefix + '-0001+000020.json', 'w').close()  # a run stopped after 20 batches
    >>> auto_resume(prefix)[0] == prefix
    True
    """
    if not prefix:
        raise ValueError("--resume auto continues the newest checkpoint of --model-prefix: pass "
                         "--model-prefix PREFIX (e.g. runs/r50), or leave --resume out")
    if not saved_positions(prefix):
        return None, f"--resume auto: no checkpoint under {prefix} yet, training from the start"
    return prefix, f"--resume auto: continuing the newest intact checkpoint under {prefix}"


def _examples(names):
    names = sorted(names)
    return ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")


def check_fits(params, expected, source, hint):
    """Raise :class:`CheckpointError` unless ``params`` has exactly ``expected``'s names and shapes.

    Parameters
    ----------
    params, expected : dict of str to NDArray
        Saved values and the network's (arguments and auxiliary states together).
    source : str
        What the values come from, for the message.
    hint : str
        How to fix a mismatch, for the message.

    Examples
    --------
    >>> import mxnet as mx
    >>> check_fits({'w': mx.nd.zeros((2, 3))}, {'w': mx.nd.zeros((4, 3))}, 'run-0001',
    ...            'pass --num-classes 2')  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    mxfp16...CheckpointError: run-0001 does not fit the network: ...(w (2, 3) vs (4, 3))...
    """
    missing = set(expected) - set(params)
    unexpected = set(params) - set(expected)
    wrong = [f"{name} {params[name].shape} vs {expected[name].shape}"
             for name in sorted(set(params) & set(expected))
             if params[name].shape != expected[name].shape]
    problems = [f"{len(names)} {what} parameter(s) ({_examples(names)})"
                for what, names in (("missing", missing), ("unexpected", unexpected)) if names]
    if wrong:
        problems.append(f"{len(wrong)} of other shape ({_examples(wrong)})")
    if problems:
        raise CheckpointError(f"{source} does not fit the network: {'; '.join(problems)}; {hint}")


def check_mid_epoch_resume(checkpoint, config, num_workers, batches_per_epoch):
    """Raise :class:`CheckpointError` when a mid-epoch checkpoint is resumed with settings under
    which its position means other data (another batch size, data, seed, worker count).

    Examples
    --------
    >>> from mxfp16.train.state.checkpoint import Checkpoint
    >>> meta = {"config": {"batch_size": 32, "seed": 0}, "num_workers": 1, "batches_per_epoch": 40}
    >>> point = Checkpoint("runs/r", 1, None, None, meta, batch=7)
    >>> check_mid_epoch_resume(point, {"batch_size": 64, "seed": 0}, 1, 20)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    mxfp16...CheckpointError: checkpoint 'runs/r-0001+000007' stopped after batch 7 of epoch 1 ...
    """
    if not checkpoint.batch:
        return
    saved = dict(checkpoint.meta.get("config", {}), num_workers=checkpoint.meta.get("num_workers"),
                 batches_per_epoch=checkpoint.meta.get("batches_per_epoch"))
    now = dict(config, num_workers=num_workers, batches_per_epoch=batches_per_epoch)
    for key in MID_EPOCH_SETTINGS + ("num_workers", "batches_per_epoch"):
        if key in saved and saved[key] != now.get(key):
            flag = {"num_workers": "number of workers",
                    "batches_per_epoch": "number of batches per epoch"}.get(
                        key, "--" + key.replace("_", "-"))
            raise CheckpointError(
                f"checkpoint {checkpoint.name!r} stopped after batch {checkpoint.batch} of epoch "
                f"{checkpoint.epoch} with {flag} {saved[key]}, this run has {flag} {now.get(key)}: "
                f"the same position would mean other images; resume with {flag} {saved[key]}, or "
                f"from an epoch checkpoint ({checkpoint.prefix}-NNNN), which any settings may "
                "continue")


def resume_checkpoint(spec, network, *, api, dtype, optimizer):
    """Load the checkpoint ``spec`` (``--resume``) and check it fits the network and settings.

    Raises
    ------
    CheckpointError
        If it does not exist, or was trained with another API, dtype, optimizer, network or class
        count.
    """
    checkpoint = load_checkpoint(spec)
    trained = checkpoint.meta.get("config", {})
    for flag, value in (("api", api), ("dtype", dtype), ("optimizer", optimizer)):
        saved = trained.get(flag)
        if saved != value:
            raise CheckpointError(f"checkpoint {checkpoint.name!r} was trained with --{flag} {saved} "
                                  f"and its optimizer state is for that: resume with --{flag} {saved}")
    check_fits({**checkpoint.network.arg_params, **checkpoint.network.aux_params},
               {**network.arg_params, **network.aux_params},
               f"checkpoint {checkpoint.name!r} (--network {trained.get('network')} "
               f"--num-classes {trained.get('num_classes')})",
               "resume with the --network and --num-classes it was trained with")
    return checkpoint


def _restore_scaler(checkpoint, scaler, loss_scale):
    """The checkpoint's loss-scaler state, unless ``--loss-scale`` was changed for this run: then
    the new setting is applied, and one line says so."""
    saved_flag = checkpoint.meta.get("config", {}).get("loss_scale")
    saved = checkpoint.meta.get(scaler.state_dict_key, scaler.state_dict())
    if loss_scale is not None and str(loss_scale) != str(saved_flag):
        keep = f"pass --loss-scale {saved_flag}" if saved_flag else "leave --loss-scale out"
        log.warning("--loss-scale %s differs from the checkpoint's (%s): the flag wins, the loss "
                    "scaler starts afresh at %s instead of continuing at the saved %g, because you "
                    "asked for it; %s to continue exactly", loss_scale,
                    saved_flag or "the default", loss_scale, saved.get("loss_scale", float("nan")),
                    keep)
        return
    scaler.load_state_dict(saved)


def resume_run(spec, network, scaler, *, api, dtype, optimizer, num_epochs, model_prefix,
               settings=None, num_workers=1, batches_per_epoch=None, allow_pickle=False,
               loss_scale=None):
    """The network and :class:`StartPoint` of a run that resumes the checkpoint ``spec``.

    The network gets the checkpoint's values and ``scaler`` its state; with no ``spec`` the run
    starts from scratch with ``network`` as given.  A mid-epoch checkpoint is checked against
    ``settings`` (the run's configuration), ``num_workers`` and ``batches_per_epoch`` by
    :func:`check_mid_epoch_resume`.  A checkpoint whose optimizer state is a pickle (saved before
    checksums) needs ``allow_pickle``.  ``loss_scale`` (``--loss-scale``) other than the
    checkpoint's is applied, with one warning line; else the saved scaler state continues.

    Raises
    ------
    CheckpointError
        See :func:`resume_checkpoint` and :func:`check_mid_epoch_resume`.
    ValueError
        If the checkpoint has trained all ``num_epochs`` already.
    """
    if not spec:
        return network, StartPoint()
    checkpoint = resume_checkpoint(spec, network, api=api, dtype=dtype, optimizer=optimizer)
    if checkpoint.epoch >= num_epochs:
        raise ValueError(f"checkpoint {checkpoint.name!r} has trained {checkpoint.epoch} epochs, "
                         f"all of --num-epochs {num_epochs}: raise --num-epochs to continue")
    if settings is not None:
        check_mid_epoch_resume(checkpoint, settings, num_workers, batches_per_epoch)
    if checkpoint.states_pickled and not allow_pickle:
        raise CheckpointError(f"checkpoint {checkpoint.name!r} has a pickled optimizer state "
                              f"{checkpoint.states_path} (saved before mxfp16's checkpoint version "
                              f"2): {PICKLE_RISK}; pass --allow-pickle if you trust it")
    _restore_scaler(checkpoint, scaler, loss_scale)
    log.info("resuming from checkpoint %s", checkpoint.name)
    if not model_prefix:
        log.warning("no --model-prefix: this run saves no checkpoint (pass --model-prefix %s to "
                    "continue the run's checkpoints)", checkpoint.prefix)
    network = dataclasses.replace(network, arg_params=checkpoint.network.arg_params,
                                  aux_params=checkpoint.network.aux_params)
    return network, StartPoint(checkpoint.epoch, checkpoint.meta.get("num_update", 0),
                               checkpoint.states_path, begin_batch=checkpoint.batch,
                               meter_state=checkpoint.meta.get("progress"),
                               devices_path=checkpoint.devices_path,
                               num_devices=checkpoint.meta.get("num_devices"))
