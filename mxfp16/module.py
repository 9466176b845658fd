"""Loss scaling for the Symbol / Module API.

Static scaling is MXNet's own: the loss head's ``grad_scale`` is multiplied by the scale and
``rescale_grad`` divides it out (:func:`scale_loss_symbol` + :func:`mxfp16.make_optimizer`).

Dynamic scaling needs the scale to change during training, but ``grad_scale`` is fixed when a graph
is bound.  :func:`make_scaled_module` therefore builds a ``BucketingModule`` whose bucket key is the
loss scale: each scale gets its own executor, bound with shared parameters, gradients, memory and
optimizer, so a change of scale costs one bind (the scale changes a few dozen times in a run).
:func:`module_step` drives forward/backward, checks the gradients, and updates or skips, with the
same scaler classes the Gluon path uses, including the ``'auto'`` start: the first step runs at
scale 1 and the start is measured on the gradients summed over devices (and bounded over workers).
"""
import contextlib
import functools
import json
import os
import weakref

import mxnet as mx
import numpy as np
from mxnet import gluon

from . import mxnet_internals
from .casting.graph import strip
from .dtypes import GRAD_SCALE_HEADS
from .overflow_warning import Batch, Fixes, OverflowAlarm
from .scaling.overflow import all_finite, device_sums, max_magnitude, max_magnitudes
from .scaling.scalers import LossScaleCollapse
from .distributed.horovod import is_horovod
from .optimizers import rescale_grad

#: kvstore key of the per-step overflow flag that workers sum so that all skip alike.
OVERFLOW_KEY = "__mxfp16_overflow__"

#: kvstore key of the largest gradient magnitudes that workers sum so that all start alike.
START_KEY = "__mxfp16_start_max__"

#: The fixes the overflow warning gives a Module script.
MODULE_FIXES = Fixes("mxfp16.cast_symbol(sym, 'float16', keep_float32={selectors!r})",
                     "mxfp16.cast_symbol(sym, 'bfloat16') (and 'bfloat16' for cast_params and "
                     "make_optimizer)")

_ALARMS = weakref.WeakKeyDictionary()  # module -> its OverflowAlarm


def scale_loss_symbol(sym, loss_scale):
    """Multiply the ``grad_scale`` of every loss head of ``sym`` by ``loss_scale``.

    Parameters
    ----------
    sym : mx.sym.Symbol
        A graph with at least one of SoftmaxOutput, Linear/Logistic/MAERegressionOutput, MakeLoss.
    loss_scale : float

    Returns
    -------
    mx.sym.Symbol

    Raises
    ------
    ValueError
        If the graph has no such head.

    Examples
    --------
    >>> import mxnet as mx
    >>> net = mx.sym.SoftmaxOutput(mx.sym.var('data'), name='softmax')
    >>> scale_loss_symbol(net, 128).attr('grad_scale')
    '128.0'
    """
    graph = json.loads(sym.tojson(remove_amp_cast=False))
    heads = [node for node in graph["nodes"] if node["op"] in GRAD_SCALE_HEADS]
    if not heads:
        raise ValueError("the graph has no loss head with a grad_scale "
                         f"({', '.join(sorted(GRAD_SCALE_HEADS))}): add one, e.g. MakeLoss")
    if loss_scale == 1:
        return sym
    for node in heads:
        attrs = node.setdefault("attrs", {})
        attrs["grad_scale"] = str(float(attrs.get("grad_scale", 1.0)) * float(loss_scale))
    return mx.sym.load_json(json.dumps(graph))


def make_scaled_module(sym, scaler, data_names=("data",), label_names=("softmax_label",),
                       context=None, **module_kwargs):
    """A BucketingModule that trains ``sym`` with the dynamic (or static) loss scale of ``scaler``.

    Parameters
    ----------
    sym : mx.sym.Symbol
        The (cast) training graph with a loss head.
    scaler : LossScaler
    data_names, label_names : sequence of str
    context : Context or list of Context
        Default: CPU.
    **module_kwargs
        Passed to ``mx.mod.BucketingModule`` (``fixed_param_names``, ``logger``, ...).

    Returns
    -------
    mx.mod.BucketingModule
        Bind it, initialize parameters, then call :func:`init_optimizer` and :func:`module_step`.
    """
    scale_loss_symbol(sym, 1)  # fail now, not at the first bind, when there is no loss head

    def sym_gen(loss_scale):
        return scale_loss_symbol(sym, loss_scale), list(data_names), list(label_names)

    return mx.mod.BucketingModule(sym_gen, default_bucket_key=scaler.loss_scale,
                                  context=context or mx.cpu(), **module_kwargs)


@contextlib.contextmanager
def _updates_on_workers():
    """MXNet's switch for aggregating gradients on the kvstore and updating on the workers."""
    previous = os.environ.get("MXNET_UPDATE_ON_KVSTORE")
    os.environ["MXNET_UPDATE_ON_KVSTORE"] = "0"
    try:
        yield
    finally:
        if previous is None:
            del os.environ["MXNET_UPDATE_ON_KVSTORE"]
        else:
            os.environ["MXNET_UPDATE_ON_KVSTORE"] = previous


def init_optimizer(module, optimizer, kvstore="local"):
    """``module.init_optimizer`` with the update on the workers, so a step can be skipped.

    Parameters
    ----------
    module : mx.mod.BaseModule
    optimizer : mx.optimizer.Optimizer
        From :func:`mxfp16.make_optimizer`; :func:`module_step` sets its ``rescale_grad``.
    kvstore : str or KVStore
        A KVStore object is needed for distributed training (pass the same one to
        :func:`module_step`).
    """
    with _updates_on_workers():
        module.init_optimizer(kvstore=kvstore, optimizer=optimizer)
    if is_horovod(kvstore):  # Module broadcast rank 0's values to its own copy, not the devices
        arg_params, aux_params = module.get_params()
        kvstore.init(sorted(aux_params), [aux_params[name] for name in sorted(aux_params)])
        module.set_params(arg_params, aux_params, force_init=True)
    if _distributed(kvstore):
        kvstore.init(OVERFLOW_KEY, mx.nd.zeros((1,)))
        kvstore.init(START_KEY, mx.nd.zeros((1,)))


def _distributed(kvstore):
    """Whether ``kvstore`` (a KVStore, a name or None) is a distributed KVStore."""
    return "dist" in getattr(kvstore, "type", "")


def _sum_cannot_overflow(per_param, num_workers):
    """Whether gradients summed over this worker's devices, then over ``num_workers`` workers, stay
    finite in their dtype.

    Module sums the gradients inside ``update()``, after the check, in their dtype, and two finite
    float16 gradients can add up to inf.  The devices' sum is computed here (in float32); over the
    workers, ``|sum| <= num_workers * max|g|`` bounds it, so each worker asks for
    ``max|g| <= max / num_workers`` of its gradients' dtype: conservative by at most a factor
    ``num_workers`` in the loss scale a dynamic scaler settles at.

    Parameters
    ----------
    per_param : list of list of NDArray
        ``[[param0 on dev0, on dev1, ...], ...]``, finite.
    num_workers : int
    """
    if not per_param:
        return True
    maxima = max_magnitudes(device_sums(per_param))
    limits = np.array([np.finfo(grads[0].dtype).max for grads in per_param]) / num_workers
    return bool(np.all(maxima <= limits))


def _sum_over_workers(kvstore, key, value):
    """The sum of every worker's ``value`` (each worker must call this at the same step)."""
    total = mx.nd.array([value])
    kvstore.push(key, total)
    kvstore.pull(key, out=total)
    return float(total.asscalar())


def _gradients_finite(module, kvstore):
    """Whether every gradient, and its sum over devices and workers, is finite, as every worker
    agrees."""
    per_param = mxnet_internals.module_grads_per_param(module)
    finite = all_finite([grad for grads in per_param for grad in grads])
    num_workers = kvstore.num_workers if _distributed(kvstore) else 1
    if finite and (num_workers > 1 or any(len(grads) > 1 for grads in per_param)):
        finite = _sum_cannot_overflow(per_param, num_workers)
    if _distributed(kvstore):
        finite = _sum_over_workers(kvstore, OVERFLOW_KEY, 0.0 if finite else 1.0) == 0.0
    return finite


def _start_measurement(module, kvstore):
    """The largest gradient magnitude the update will see, the same on every device and worker.

    Exact over the devices (their sum, as the kvstore will add them); over workers, the sum of
    each worker's maximum, a bound of the summed gradients' as in :func:`_sum_cannot_overflow`.
    """
    measured = max_magnitude(device_sums(mxnet_internals.module_grads_per_param(module)))
    if _distributed(kvstore):
        measured = _sum_over_workers(kvstore, START_KEY, measured)
    return measured


def overflow_alarm(module, scaler, **settings):
    """The early overflow warning of ``module`` (:class:`mxfp16.overflow_warning.OverflowAlarm`,
    whose ``report`` is the overflow report once it fired), made before its first
    :func:`module_step`; ``settings`` (``caller``, ``logger``, ``fixes``: the scripts give their
    flags) apply when it is made."""
    if module not in _ALARMS:
        settings = dict(dict(caller="mxfp16.module_step", fixes=MODULE_FIXES), **settings)
        _ALARMS[module] = OverflowAlarm(scaler, **settings)
    return _ALARMS[module]


def _head_loss(op, attrs, out, label=None):
    """The loss head ``op`` of a Module's graph on the network's output (SoftmaxOutput, ...)."""
    return getattr(mx.nd, op)(out, *([] if label is None else [label]), **attrs)


def located_batch(module, data_batch):
    """What the overflow locator runs on for a Module: its float32 graph without the loss head
    as a ``SymbolBlock`` holding the Module's values (widened), the batch's data, and the head as
    the loss on its label.  Built only when an overflow is located."""
    sym, data_names, label_names = mxnet_internals.bucketing_module_spec(module)[0](1.0)
    graph = strip(sym, list(data_names))
    node = json.loads(graph.tojson())["nodes"][-1]
    inputs = list(data_names) + ([] if node["op"] in GRAD_SCALE_HEADS else list(label_names))
    body, options = graph, {}
    if node["op"] in GRAD_SCALE_HEADS:
        body = graph.get_children()[0]
        label = data_batch.label[0] if label_names and data_batch.label else None
        options = dict(label=label, loss_fn=functools.partial(_head_loss, node["op"],
                                                                node.get("attrs", {})))
    block = gluon.SymbolBlock(body, [mx.sym.var(name, dtype="float32") for name in inputs])
    arg_params, aux_params = module.get_params()
    block.collect_params().load_dict({**arg_params, **aux_params},
                                     ctx=data_batch.data[0].context, ignore_extra=True,
                                     cast_dtype=True)
    arrays = list(data_batch.data) + ([] if options else list(data_batch.label or []))
    return Batch(block, tuple(arrays), options)


def _record(alarm, module, scaler, finite, used_scale, data_batch):
    """The scaler's update of a step, told to the module's early overflow warning (a collapse
    carries its report)."""
    batch = functools.partial(located_batch, module, data_batch)
    try:
        scaler.update(finite)
    except LossScaleCollapse as collapse:
        raise alarm.collapsed(collapse, scaler, used_scale, batch) from None
    alarm.after_step(scaler, used_scale, finite, batch,
                     None if finite else module.get_outputs(merge_multi_context=False)[0])


def _allreduced_step(alarm, module, scaler, kvstore, used_scale, data_batch):
    """Horovod: sum the gradients over devices and ranks first, then decide on the sums, which
    every rank holds bit for bit alike (so all skip alike and start alike)."""
    names = mxnet_internals.module_param_names(module)
    per_param = mxnet_internals.module_grads_per_param(module)
    for index, (name, grads) in enumerate(zip(names, per_param)):
        kvstore.pushpull(name, grads, priority=-index)
    sums = [grads[0] for grads in per_param]
    finite = all_finite(sums) if scaler.enabled else True
    if finite and scaler.needs_start:
        scaler.start_from(max_magnitude(sums))
    if scaler.enabled:
        _record(alarm, module, scaler, finite, used_scale, data_batch)
    return finite


def module_step(module, batch, scaler, optimizer, batch_size, kvstore=None):
    """One training step of a Module: forward, backward, overflow check, update or skip.

    Parameters
    ----------
    module : mx.mod.BucketingModule
        From :func:`make_scaled_module`, bound, initialized, with :func:`init_optimizer` called.
    batch : mx.io.DataBatch
    scaler : LossScaler
    optimizer : mx.optimizer.Optimizer
        The optimizer given to :func:`init_optimizer`.
    batch_size : int
        Samples per step over all workers (the gradients are sums over them).
    kvstore : KVStore or None
        For distributed training: the workers agree on skipping, and on the ``'auto'`` start,
        through it.  With :class:`mxfp16.distributed.horovod.Horovod` the gradients are summed over the ranks
        before the check (in their dtype), and the decision is taken on the sums.

    Returns
    -------
    bool
        True if the parameters were updated, False if the step was skipped.

    Notes
    -----
    A skipped step whose outputs are inf/NaN, or three skipped steps in a row at or below a safe
    loss scale, run :func:`mxfp16.find_overflow` once on ``batch`` (the Module's float32 graph with
    its values, the loss head as the loss) and log one warning with the fix
    (``cast_symbol(..., keep_float32=[...])``); :func:`overflow_alarm` ``(module, scaler).report``
    keeps the report, and a :class:`~mxfp16.scaling.scalers.LossScaleCollapse` carries it.
    """
    used_scale = scaler.loss_scale
    alarm = overflow_alarm(module, scaler)  # made before the first step: it reads the 'auto' start
    batch.bucket_key = used_scale
    if batch.provide_data is None:
        batch.provide_data = module.data_shapes
        batch.provide_label = module.label_shapes
    module.forward_backward(batch)
    if is_horovod(kvstore):
        finite = _allreduced_step(alarm, module, scaler, kvstore, used_scale, batch)
        if finite:
            optimizer.rescale_grad = rescale_grad(used_scale, batch_size)
            with mxnet_internals.module_without_kvstore(module):
                module.update()
        return finite
    finite = True
    if scaler.enabled:
        finite = _gradients_finite(module, kvstore)
        if finite and scaler.needs_start:
            scaler.start_from(_start_measurement(module, kvstore))
        _record(alarm, module, scaler, finite, used_scale, batch)
    if finite:
        optimizer.rescale_grad = rescale_grad(used_scale, batch_size)
        module.update()
    return finite
