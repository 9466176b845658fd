"""The Gluon side of the training loop (``--api gluon``): a cast ``SymbolBlock`` and a Trainer.

The network's float32 graph becomes a ``SymbolBlock`` cast with :func:`mxfp16.cast_block`
(float16 weights, float32 normalization and outputs, the data cast to float16 on the device); the
Trainer keeps float32 master weights (:func:`mxfp16.make_trainer`) and the loss scaler drives every
step.  :mod:`mxfp16.train.loop` runs it through the methods :class:`GluonAPI` shares with
:class:`mxfp16.train.module_api.ModuleAPI`.
"""
import functools
import logging

import mxnet as mx
from mxnet import autograd, gluon

from .. import mxnet_internals
from ..checkpoints import optimizer_states
from ..casting import cast_block
from ..casting.deploy import float32_value
from ..models import DATA_INPUT, block_to_network
from ..optimizers import NO_WD_SUFFIXES, make_trainer
from ..overflow_warning import FLAGS, Batch, OverflowAlarm
from ..scaling import boundary as boundary_scale
from ..scaling.scalers import LossScaleCollapse

log = logging.getLogger("mxfp16.train")

#: Optimizer settings a resumed run takes from the command line, not from the checkpoint's
#: optimizer, so both APIs resume alike (the schedule follows --num-epochs, which may be extended).
COMMAND_LINE_SETTINGS = ("lr", "wd", "momentum", "lr_scheduler")


def gluon_network(network, ctx, dtype, no_wd=False, hybridize=True, keep_float32=None):
    """A hybridized Gluon network for ``network``: ``(block, net)``.

    Parameters
    ----------
    network : mxfp16.models.Network
        Graph and values; ``fixed_param_names`` get ``grad_req='null'``, ``lr_mult`` sets each
        parameter's ``lr_mult``.
    ctx : list of Context
    dtype : {'float32', 'float16', 'bfloat16'}
    no_wd : bool
        ``wd_mult=0`` on biases and BatchNorm's gamma and beta.
    hybridize : bool
        ``False`` runs the network imperatively (GluonCV's ``--mode imperative``).
    keep_float32 : mxfp16.casting.keep.Keep, optional
        The ops that stay float32 (``--keep-float32``, :mod:`mxfp16.train.keep_float32`).

    Returns
    -------
    tuple
        ``block``, the ``SymbolBlock`` whose parameters are trained (cast in place to ``dtype``,
        normalization kept float32), and ``net``, the cast network to call.

    Examples
    --------
    >>> import mxnet as mx
    >>> from mxfp16.models import new_network
    >>> block, net = gluon_network(new_network('mobilenet0.25', 4, (3, 32, 32)), [mx.cpu()],
    ...                            'float16')
    >>> block.collect_params()['mobilenet0_conv0_weight'].dtype.__name__
    'float16'
    >>> net(mx.nd.zeros((2, 3, 32, 32))).dtype.__name__
    'float32'
    """
    block = gluon.SymbolBlock(network.symbol, [mx.sym.var(DATA_INPUT, dtype="float32")])
    params = block.collect_params()
    params.load_dict({**network.arg_params, **network.aux_params}, ctx=ctx)
    for name, param in params.items():
        if name in network.fixed_param_names:
            param.grad_req = "null"
        param.lr_mult = network.lr_mult.get(name, 1.0)
        if no_wd and name.endswith(NO_WD_SUFFIXES):
            param.wd_mult = 0.0
    net = cast_block(block, dtype, keep_float32=keep_float32)
    if hybridize:
        # static_shape races on several devices in MXNet 1.9.1: BatchNorm's running statistics
        # came out wrong on one device in 2 of 8 identical runs (see docs/performance.md).
        net.hybridize(static_alloc=True, static_shape=len(ctx) == 1)
    return block, net


def load_trainer_states(trainer, states_path, allow_pickle=False):
    """Load a checkpoint's optimizer state into ``trainer``
    (:func:`mxfp16.checkpoints.optimizer_states.load_trainer_states`; a pickled file only with
    ``allow_pickle``), keeping the settings of :data:`COMMAND_LINE_SETTINGS`.

    The checkpoint restores the optimizer state and the update count (the schedule's position), on
    any number of devices: every device gets the saved update counts.
    """
    fresh = trainer.optimizer
    kept = {name: getattr(fresh, name) for name in COMMAND_LINE_SETTINGS if hasattr(fresh, name)}
    scheduler = getattr(fresh, "lr_scheduler", None)
    scheduler_settings = dict(vars(scheduler)) if scheduler is not None else None
    optimizer_states.load_trainer_states(trainer, states_path, allow_pickle=allow_pickle)
    devices = mxnet_internals.trainer_params(trainer)[0].list_ctx()
    mxnet_internals.align_update_counts(trainer.optimizer, [c.device_id for c in devices])
    for name, value in kept.items():
        setattr(trainer.optimizer, name, value)
    if scheduler is not None:  # the command line's schedule, not the saved one's settings
        vars(scheduler).update(scheduler_settings)


class GluonAPI:
    """Forward, scaled backward and update of a Gluon network on one or more devices.

    Parameters
    ----------
    network : mxfp16.models.Network
        The float32 network and its starting values.
    scaler : mxfp16.LossScaler
        Drives every step (a disabled one for float32 and bfloat16).
    ctx : list of Context
        The batch is split over these devices; gradients are aggregated by the Trainer's kvstore.
    dtype : {'float32', 'float16', 'bfloat16'}
    kvstore : str or KVStore
    optimizer : str
    optimizer_params : dict
        For :func:`mxfp16.make_optimizer` (see :func:`mxfp16.train.schedule.optimizer_params`).
    soft_targets : bool
        Train on ``(N, K)`` targets (label smoothing, mixup) instead of class labels.
    no_wd : bool
        No weight decay on biases and BatchNorm's gamma and beta.
    states_path : str, optional
        A checkpoint's Trainer state to restore.
    allow_pickle : bool
        Whether ``states_path`` may be a pickle (an older checkpoint's: see ``--allow-pickle``).
    keep_float32 : mxfp16.casting.keep.Keep, optional
        The ops that stay float32 (``--keep-float32``).
    """

    name = "gluon"

    def __init__(self, network, scaler, *, ctx, dtype, kvstore, optimizer, optimizer_params,
                 soft_targets=False, no_wd=False, states_path=None, hybridize=True,
                 allow_pickle=False, keep_float32=None):
        self.network, self.scaler, self.ctx = network, scaler, ctx
        self.block, self.net = gluon_network(network, ctx, dtype, no_wd, hybridize, keep_float32)
        self.trainer = make_trainer(self.block.collect_params(), optimizer, dtype, kvstore=kvstore,
                                    **optimizer_params)
        if states_path:
            load_trainer_states(self.trainer, states_path, allow_pickle)
        self.loss_fn = gluon.loss.SoftmaxCrossEntropyLoss(sparse_label=not soft_targets)
        self.alarm = OverflowAlarm(scaler, "mxfp16.train", log, FLAGS)

    @property
    def optimizer(self):
        return self.trainer.optimizer

    def split(self, array):
        """A batch's array split over the devices (the pieces :meth:`train_step` takes)."""
        return gluon.utils.split_and_load(array, self.ctx)

    def train_step(self, data, targets, batch_size):
        """Forward, scaled backward and ``scaler.step`` (update, or skip on overflow).

        Parameters
        ----------
        data, targets : list of NDArray
            One piece per device (:meth:`split`).
        batch_size : int
            Samples behind the gradients (all workers').

        Returns
        -------
        tuple
            ``(outputs, losses, updated)``: logits and per-sample losses per device, and whether
            the update ran.
        """
        used = self.scaler.loss_scale
        with autograd.record():
            outputs = [self.net(x) for x in data]
            losses = [self.loss_fn(out, target) for out, target in zip(outputs, targets)]
            scaled = self.scaler.scale(losses)
        autograd.backward(scaled)
        batch = functools.partial(Batch, self.net, (data[0],),
                                  {"label": targets[0], "loss_fn": self.loss_fn})
        try:
            updated = self.scaler.step(self.trainer, batch_size)
        except LossScaleCollapse as collapse:
            raise self.alarm.collapsed(collapse, self.scaler, used, batch) from None
        if self.scaler.enabled:  # the early overflow warning (two assignments on a clean step)
            self.alarm.after_step(self.scaler, used, updated, batch, losses)
        boundary_scale.forget_calls()  # the inputs the cast network kept for it
        return outputs, losses, updated

    def predict(self, data):
        """Class scores of a batch (inference mode), one piece per device of :meth:`split`."""
        return [self.net(x) for x in self.split(data)]

    def snapshot(self):
        """``(network, save_states)``: the float32 network with its current values (the Trainer's
        float32 master weights where it holds them), and the function that writes the optimizer
        state to a path."""
        network = block_to_network(self.block)
        params = self.block.collect_params()
        network.arg_params = {name: float32_value(params[name]) for name in network.arg_params}
        return network, functools.partial(optimizer_states.save_trainer_states, self.trainer)

    def device_aux(self):
        """The auxiliary states (BatchNorm statistics) of every device, which each updates on its
        own part of the batch, ``{'DEVICE:name': NDArray}``; empty on one device."""
        params = self.block.collect_params()
        return {f"{index}:{name}": array for name in self.network.aux_params
                for index, array in enumerate(params[name].list_data()) if len(self.ctx) > 1}

    def load_device_aux(self, saved):
        """Give every device the states :meth:`device_aux` saved (same devices)."""
        params = self.block.collect_params()
        for key, value in saved.items():
            index, name = key.split(":", 1)
            value.copyto(params[name].list_data()[int(index)])
