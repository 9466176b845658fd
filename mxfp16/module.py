"""Loss scaling for the Symbol / Module API.

Static scaling is MXNet's own: the loss head's ``grad_scale`` is multiplied by the scale and
``rescale_grad`` divides it out (:func:`scale_loss_symbol` + :func:`mxfp16.make_optimizer`).

Dynamic scaling needs the scale to change during training, but ``grad_scale`` is fixed when a graph
is bound.  :func:`make_scaled_module` therefore builds a ``BucketingModule`` whose bucket key is the
loss scale: each scale gets its own executor, bound with shared parameters, gradients, memory and
optimizer, so a change of scale costs one bind (the scale changes a few dozen times in a run).
:func:`module_step` drives forward/backward, checks the gradients, and updates or skips, with the
same scaler classes the Gluon path uses.
"""
import contextlib
import json
import os

import mxnet as mx
import numpy as np

from . import mxnet_internals
from .dtypes import GRAD_SCALE_HEADS
from .loss_scaling import all_finite
from .optimizers import rescale_grad

#: kvstore key of the per-step overflow flag that workers sum so that all skip alike.
OVERFLOW_KEY = "__mxfp16_overflow__"


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
    if isinstance(kvstore, mx.kv.KVStore) and "dist" in kvstore.type:
        kvstore.init(OVERFLOW_KEY, mx.nd.zeros((1,)))


def _grad_arrays(module):
    """Gradient arrays of a Module's parameters, on every device."""
    return mxnet_internals.module_grad_arrays(module)


def _sum_cannot_overflow(arrays, num_workers):
    """Whether gradients summed over ``num_workers`` workers stay finite, from one worker's.

    Module sums the workers' gradients inside ``update()``, after the check, and two finite float16
    gradients can add up to inf.  ``|sum| <= num_workers * max|g|`` bounds the sum, so each worker
    asks for ``max|g| <= max / num_workers`` of its gradients' dtype: conservative by at most a
    factor ``num_workers`` in the loss scale a dynamic scaler settles at.
    """
    if not arrays:
        return True
    maxima = mx.nd.concat(*[mx.nd.max(mx.nd.abs(a)).astype("float32").reshape((1,))
                            for a in arrays], dim=0).asnumpy()  # one host sync
    limits = np.array([np.finfo(a.dtype).max for a in arrays], dtype="float64") / num_workers
    return bool(np.all(maxima <= limits))


def _all_workers_finite(kvstore, finite):
    """Sum the workers' overflow flags, so every worker takes the same decision."""
    flag = mx.nd.array([0.0 if finite else 1.0])
    kvstore.push(OVERFLOW_KEY, flag)
    kvstore.pull(OVERFLOW_KEY, out=flag)
    return float(flag.asscalar()) == 0.0


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
        For distributed training: the workers agree on skipping through it.

    Returns
    -------
    bool
        True if the parameters were updated, False if the step was skipped.
    """
    used_scale = scaler.loss_scale
    batch.bucket_key = used_scale
    if batch.provide_data is None:
        batch.provide_data = module.data_shapes
        batch.provide_label = module.label_shapes
    module.forward_backward(batch)
    finite = True
    if scaler.enabled:
        grads = _grad_arrays(module)
        finite = all_finite(grads)
        if kvstore is not None and "dist" in kvstore.type:
            finite = finite and _sum_cannot_overflow(grads, kvstore.num_workers)
            finite = _all_workers_finite(kvstore, finite)
        scaler.update(finite)
    if finite:
        optimizer.rescale_grad = rescale_grad(used_scale, batch_size)
        module.update()
    return finite
