"""The Module-API path of the training scripts (``--api module``).

The network's float32 graph gets a ``SoftmaxOutput`` head and goes through
:func:`mxfp16.cast_symbol`; its parameters through :func:`mxfp16.cast_params`.  The loss scaler
drives a ``BucketingModule`` keyed by the loss scale (:func:`mxfp16.make_scaled_module`), one
:func:`mxfp16.module_step` per batch.  :mod:`mxfp16.train.loop` runs it through the methods
:class:`ModuleAPI` shares with :class:`mxfp16.train.gluon_api.GluonAPI`.
"""
import copy
import functools
import logging
import pickle
import warnings

import mxnet as mx

from .. import mxnet_internals
from ..casting import cast_symbol
from ..casting.params import cast_params
from ..models import Network
from ..module import init_optimizer, make_scaled_module, module_step, overflow_alarm
from ..overflow_warning import FLAGS
from ..checkpoints.optimizer_states import is_pickle_file, read_optimizer_states, save_optimizer_states
from ..optimizers import NO_WD_SUFFIXES, make_optimizer, master_weight
from .data import DATA_NAME, LABEL_NAME

log = logging.getLogger("mxfp16.train")

#: Name of the softmax head; its label input is ``softmax_label`` (:data:`mxfp16.train.data.LABEL_NAME`).
SOFTMAX_NAME = "softmax"


def training_symbol(network):
    """The float32 training graph of ``network``: its logits into ``SoftmaxOutput``.

    Examples
    --------
    >>> import mxnet as mx
    >>> logits = mx.sym.FullyConnected(mx.sym.var('data'), num_hidden=3, name='fc')
    >>> training_symbol(Network(logits, {}, {})).list_arguments()
    ['data', 'fc_weight', 'fc_bias', 'softmax_label']
    """
    return mx.sym.SoftmaxOutput(network.symbol, name=SOFTMAX_NAME)


def make_module(network, scaler, *, ctx, dtype, data_shape, label_shape, kvstore, optimizer,
                optimizer_params, no_wd=False, states_path=None, allow_pickle=False,
                keep_float32=None):
    """A bound, initialized ``BucketingModule`` for ``network`` in ``dtype``, and its optimizer.

    Parameters
    ----------
    network : mxfp16.models.Network
        float32 graph (logits) and values; ``fixed_param_names`` are not trained, ``lr_mult``
        multiplies learning rates by name.
    scaler : mxfp16.LossScaler
        Its scale is the module's first bucket.
    ctx : list of Context
    dtype : {'float32', 'float16', 'bfloat16'}
    data_shape : tuple of int
        ``(N, C, H, W)``.
    label_shape : tuple of int
        ``(N,)`` for class labels, ``(N, K)`` for soft targets (label smoothing, mixup).
    kvstore : str or KVStore
    optimizer : str
    optimizer_params : dict
        For :func:`mxfp16.make_optimizer` (see :func:`mxfp16.train.schedule.optimizer_params`).
    no_wd : bool
        No weight decay on biases and BatchNorm's gamma and beta.
    states_path : str, optional
        A checkpoint's optimizer state to restore.
    keep_float32 : mxfp16.casting.keep.Keep, optional
        The ops that stay float32 (``--keep-float32``, :mod:`mxfp16.train.keep_float32`).

    Returns
    -------
    tuple
        ``(module, optimizer)``: train with :func:`mxfp16.module_step`.

    Examples
    --------
    >>> import mxnet as mx, mxfp16
    >>> logits = mx.sym.FullyConnected(mx.sym.var('data'), num_hidden=4, name='fc')
    >>> network = Network(logits, {'fc_weight': mx.nd.ones((4, 12)), 'fc_bias': mx.nd.zeros(4)}, {})
    >>> module, opt = make_module(network, mxfp16.DynamicLossScaler(), ctx=[mx.cpu()],
    ...                           dtype='float16', data_shape=(2, 3, 2, 2), label_shape=(2,),
    ...                           kvstore='device', optimizer='sgd',
    ...                           optimizer_params={'learning_rate': 0.1})
    >>> module.get_params()[0]['fc_weight'].dtype.__name__, opt.multi_precision
    ('float16', True)
    """
    sym = cast_symbol(training_symbol(network), dtype, data_names=(DATA_NAME,),
                      keep_float32=keep_float32)
    module = make_scaled_module(sym, scaler, data_names=(DATA_NAME,), label_names=(LABEL_NAME,),
                                context=ctx, fixed_param_names=list(network.fixed_param_names),
                                logger=log)
    module.bind(data_shapes=[(DATA_NAME, data_shape)], label_shapes=[(LABEL_NAME, label_shape)])
    arg_params, aux_params = cast_params(network.arg_params, network.aux_params, sym,
                                         data_names=(DATA_NAME,), label_names=(LABEL_NAME,))
    module.init_params(arg_params=arg_params, aux_params=aux_params)
    opt = make_optimizer(optimizer, dtype, **optimizer_params)
    opt.set_lr_mult(dict(network.lr_mult))
    if no_wd:
        opt.set_wd_mult({name: 0.0 for name in network.param_names
                         if name.endswith(NO_WD_SUFFIXES)})
    with warnings.catch_warnings():  # module_step sets rescale_grad itself, for each loss scale
        warnings.filterwarnings("ignore", message=".*rescale_grad.*")
        init_optimizer(module, opt, kvstore)
    if states_path:
        load_module_states(module, states_path, num_devices=len(ctx), allow_pickle=allow_pickle)
    return module, opt


def save_module_states(module, path, *, num_devices):
    """Write a Module's optimizer state, without pickle
    (:func:`mxfp16.checkpoints.optimizer_states.save_optimizer_states`), as a one-device Module holds it: one
    entry per parameter (the first device's), so the checkpoint loads onto any number of devices.

    MXNet's ``save_optimizer_states`` keys the state by ``param_index * num_devices + device``.
    """
    updater = mxnet_internals.module_updater(module)
    states = {index // num_devices: state for index, state in updater.states.items()
              if index % num_devices == 0}
    save_optimizer_states(path, states)


def load_module_states(module, path, *, num_devices, allow_pickle=False):
    """Give each of the Module's devices its own copy of the state :func:`save_module_states`
    wrote (or, with ``allow_pickle``, the pickle a one-device Module's
    ``save_optimizer_states`` writes)."""
    if allow_pickle and is_pickle_file(path):
        with open(path, "rb") as states_file:
            blob = states_file.read()
        copies = [pickle.loads(blob) for _ in range(num_devices)]
    else:
        states = read_optimizer_states(path)[0]
        copies = [states] + [copy.deepcopy(states) for _ in range(num_devices - 1)]
    updater = mxnet_internals.module_updater(module)
    updater.states = {index * num_devices + device: state
                      for device, copy in enumerate(copies) for index, state in copy.items()}
    updater.states_synced = dict.fromkeys(updater.states, False)  # moved to each device on use


def _cross_entropy(probs, targets):
    """Per-sample cross-entropy of softmax outputs against class labels ``(N,)`` or targets
    ``(N, K)``."""
    probs = mx.nd.clip(probs, 1e-12, 1.0)
    if targets.ndim == 1:
        return -mx.nd.log(mx.nd.pick(probs, targets, axis=1))
    return -(targets * mx.nd.log(probs)).sum(axis=1)


class ModuleAPI:
    """Forward, backward and update of a Module on one or more devices (Module splits the batch).

    The parameters are those of :class:`mxfp16.train.gluon_api.GluonAPI`; the loss is the
    ``SoftmaxOutput`` head's, which scales its gradient by the loss scale (``grad_scale``).
    """

    name = "module"

    def __init__(self, network, scaler, *, ctx, dtype, kvstore, optimizer, optimizer_params,
                 soft_targets=False, no_wd=False, states_path=None, data_shape, num_classes,
                 allow_pickle=False, keep_float32=None):
        self.network, self.scaler = network, scaler
        label_shape = (data_shape[0], num_classes) if soft_targets else (data_shape[0],)
        self.module, self._optimizer = make_module(
            network, scaler, ctx=ctx, dtype=dtype, data_shape=data_shape, label_shape=label_shape,
            kvstore=kvstore, optimizer=optimizer, optimizer_params=optimizer_params, no_wd=no_wd,
            states_path=states_path, allow_pickle=allow_pickle, keep_float32=keep_float32)
        self._num_devices = len(ctx)
        self.alarm = overflow_alarm(self.module, scaler, caller="mxfp16.train", logger=log,
                                    fixes=FLAGS)
        # Workers of a distributed kvstore (or Horovod) agree on skipping a step through it.
        self._step_kvstore = kvstore if isinstance(kvstore, mx.kvstore.KVStoreBase) else None

    @property
    def optimizer(self):
        return self._optimizer

    def split(self, array):
        """The batch's array as one piece: the Module splits it over its devices itself."""
        return [array]

    def train_step(self, data, targets, batch_size):
        """One :func:`mxfp16.module_step`; returns ``(outputs, losses, updated)`` as
        :meth:`GluonAPI.train_step` does (the outputs are softmax probabilities)."""
        batch = mx.io.DataBatch(data, targets)
        updated = module_step(self.module, batch, self.scaler, self._optimizer, batch_size,
                              kvstore=self._step_kvstore)
        probs = self.module.get_outputs()[0]
        return [probs], [_cross_entropy(probs, targets[0].as_in_context(probs.context))], updated

    def predict(self, data):
        """Softmax probabilities of a batch (inference mode).

        The forward pass runs in the bucket of the current loss scale (the one the next training
        step uses), so prediction binds nothing new.
        """
        self.module.forward(mx.io.DataBatch([data], None, bucket_key=self.scaler.loss_scale,
                                            provide_data=self.module.data_shapes,
                                            provide_label=self.module.label_shapes),
                            is_train=False)
        return self.module.get_outputs()

    def snapshot(self):
        """``(network, save_states)``: the float32 network with its current values, and the
        function that writes the optimizer state to a path."""
        mxnet_internals.refresh_module_params(self.module)
        arg_params, aux_params = self.module.get_params()
        arg_params = dict(arg_params, **self._master_weights(arg_params))
        network = Network(self.network.symbol,
                          {k: v.astype("float32") for k, v in arg_params.items()},
                          {k: v.astype("float32") for k, v in aux_params.items()},
                          self.network.fixed_param_names, self.network.lr_mult)
        return network, functools.partial(save_module_states, self.module,
                                          num_devices=self._num_devices)

    def _master_weights(self, arg_params):
        """``{name: float32 master weight}`` the optimizer holds for the float16 weights in
        ``arg_params`` (state ``param_index * num_devices``, the first device's), where the weight
        is that copy rounded."""
        updater = mxnet_internals.module_updater(self.module)
        names = [name for name in mxnet_internals.module_arrays_per_device(self.module)
                 if name in arg_params]
        masters = {}
        for index, name in enumerate(names):
            master = master_weight(self._optimizer,
                                   updater.states.get(index * self._num_devices)) \
                if updater is not None else None
            weight = arg_params[name]
            if master is not None and master.shape == weight.shape and bool(
                    (master.astype(weight.dtype).as_in_context(weight.context) == weight)
                    .min().asscalar()):
                masters[name] = master.copyto(mx.cpu())
        return masters

    def device_aux(self):
        """The auxiliary states (BatchNorm statistics) of every device, which each updates on its
        own part of the batch, ``{'DEVICE:name': NDArray}``; empty on one device (the checkpoint's
        ``.params`` file has the devices' mean, as ``Module.get_params`` gives it)."""
        arrays = mxnet_internals.module_arrays_per_device(self.module)
        return {f"{index}:{name}": array for name in self.network.aux_params
                for index, array in enumerate(arrays[name]) if self._num_devices > 1}

    def load_device_aux(self, saved):
        """Give every device the states :meth:`device_aux` saved (same devices)."""
        arrays = mxnet_internals.module_arrays_per_device(self.module)
        for key, value in saved.items():
            index, name = key.split(":", 1)
            value.copyto(arrays[name][int(index)])
