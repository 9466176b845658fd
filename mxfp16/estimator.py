"""Gluon's Fit API (``mx.gluon.contrib.estimator.Estimator``) in float16 and bfloat16.

The Estimator's default batch processor calls ``loss.backward()`` itself, which leaves the
gradients unscaled, and :class:`mxfp16.Trainer` refuses to step on those.  MXNet's own extension
point is the ``batch_processor`` argument: :class:`BatchProcessor` is its drop-in, whose
``fit_batch`` calls ``trainer.backward(loss)``.  Everything else is the Estimator's: its
``GradientUpdateHandler`` calls ``trainer.step``, which skips a step whose gradients overflowed;
its handlers see the cast network's float32 outputs and losses; its ``CheckpointHandler`` saves
through the network's ``save_parameters`` (float32 for a cast network) and the Trainer's
``save_states`` (the loss scaler's state included).
"""
import inspect

import numpy as np
from mxnet import autograd
from mxnet.gluon.contrib import estimator as gluon_estimator

from .numpy_interface import legacy

#: The module names of MXNet's Fit API: a frame of one of them on the stack means an Estimator
#: drives the training step.
ESTIMATOR_MODULE = "mxnet.gluon.contrib.estimator"

#: The fix a Trainer's refusal of unscaled gradients names when an Estimator made them.
ESTIMATOR_ROUTE = (
    "the Estimator's default batch processor calls loss.backward() itself: pass "
    "Estimator(..., trainer=trainer, batch_processor=mxfp16.BatchProcessor()), whose fit_batch "
    "calls trainer.backward(loss)")


def called_by_estimator():
    """Whether a Gluon Estimator is on the call stack (its ``fit`` or a handler of it).

    Examples
    --------
    >>> called_by_estimator()
    False
    """
    frame = inspect.currentframe().f_back
    while frame is not None:
        if frame.f_globals.get("__name__", "").startswith(ESTIMATOR_MODULE):
            return True
        frame = frame.f_back
    return False


def for_handlers(arrays):
    """The arrays as the Estimator's handlers and metrics take them: float16 and bfloat16 ones
    widened to float32 (a cast network's outputs are float32 already), ``mx.np.ndarray`` ones as
    legacy views (no copy): MXNet 1.9.1's metrics (``Accuracy``, ``Loss``) call legacy operators,
    which refuse NumPy-interface arrays, so the Estimator fails in numpy mode even in float32.

    Examples
    --------
    >>> import mxnet as mx
    >>> [type(a).__name__ + ' ' + a.dtype.__name__
    ...  for a in for_handlers([mx.np.ones(2, dtype='float16'), mx.nd.ones(2)])]
    ['NDArray float32', 'NDArray float32']
    """
    def widened(array):
        dtype = np.dtype(array.dtype)
        low = dtype == np.float16 or dtype.names == ("bfloat16",)
        return array.astype("float32") if low else array
    return [widened(legacy(array)) for array in arrays]


def _scaling_trainer(estimator):
    trainer = estimator.trainer
    if not callable(getattr(trainer, "backward", None)):
        raise TypeError(
            f"mxfp16.BatchProcessor scales the loss through trainer.backward(loss), which "
            f"{type(trainer).__name__} does not have: pass Estimator(..., "
            "trainer=mxfp16.Trainer(net.collect_params(), optimizer, optimizer_params, "
            "dtype=...)) (the Estimator makes a gluon.Trainer when given none)")
    return trainer


class BatchProcessor(gluon_estimator.BatchProcessor):
    """A drop-in for the Estimator's ``BatchProcessor`` that trains with loss scaling:
    ``fit_batch`` back-propagates through ``estimator.trainer.backward(loss)`` (an
    :class:`mxfp16.Trainer`) instead of ``loss.backward()``.

    Predictions and losses reach the Estimator's handlers in float32.  Give the Estimator the
    cast network (:func:`mxfp16.cast_block`) and an :class:`mxfp16.Trainer` over its parameters.

    Raises
    ------
    TypeError
        From ``fit_batch``, when the Estimator's Trainer has no ``backward`` (a ``gluon.Trainer``,
        the one an Estimator makes when given none).

    Examples
    --------
    >>> import mxnet as mx
    >>> from mxnet.gluon import nn, loss
    >>> from mxnet.gluon.contrib.estimator import Estimator
    >>> import mxfp16
    >>> net = nn.Dense(2, in_units=4)
    >>> net.initialize()
    >>> net = mxfp16.cast_block(net, 'float16')
    >>> trainer = mxfp16.Trainer(net.collect_params(), 'sgd', {'learning_rate': 0.1},
    ...                          dtype='float16', loss_scale=1024)
    >>> est = Estimator(net, loss.SoftmaxCrossEntropyLoss(), trainer=trainer,
    ...                 batch_processor=mxfp16.BatchProcessor())
    >>> data = mx.gluon.data.ArrayDataset(mx.nd.ones((8, 4)), mx.nd.zeros(8))
    >>> _, _, pred, losses = est.batch_processor.fit_batch(est, next(iter(
    ...     mx.gluon.data.DataLoader(data, batch_size=8))))
    >>> pred[0].dtype.__name__, losses[0].dtype.__name__, trainer.step(8)
    ('float32', 'float32', True)
    """

    def fit_batch(self, estimator, train_batch, batch_axis=0):
        """Train on one batch: forward and loss recorded, then ``trainer.backward(loss)``.

        Parameters
        ----------
        estimator : Estimator
        train_batch : tuple
            Data and label of a batch of the training data loader.
        batch_axis : int
            The batch axis to split the batch over the Estimator's devices along.

        Returns
        -------
        (data, label, pred, loss)
            As the Estimator's ``fit_batch`` returns them, one array per device; ``label``,
            ``pred`` and ``loss`` as :func:`for_handlers` gives them (float32, legacy views in
            numpy mode).
        """
        trainer = _scaling_trainer(estimator)
        data, label = self._get_data_and_label(train_batch, estimator.context, batch_axis)
        with autograd.record():
            pred = [estimator.net(x) for x in data]
            loss = [estimator.loss(y_hat, y) for y_hat, y in zip(pred, label)]
        trainer.backward(loss)
        return data, for_handlers(label), for_handlers(pred), for_handlers(loss)

    def evaluate_batch(self, estimator, val_batch, batch_axis=0):
        """Evaluate one batch as the Estimator does, ``label``, ``pred`` and ``loss`` as
        :func:`for_handlers` gives them."""
        data, label, pred, loss = super().evaluate_batch(estimator, val_batch, batch_axis)
        return data, for_handlers(label), for_handlers(pred), for_handlers(loss)
