"""``from mxfp16 import amp``: MXNet AMP's API (``mxnet.contrib.amp``, MXNet 1.9.1) on mxfp16.

A script written for MXNet AMP ports with one line, ``from mxnet.contrib import amp`` ->
``from mxfp16 import amp`` (or ``from mxnet.contrib.amp import amp`` -> ``from mxfp16.amp import
amp``, GluonNLP's form: the functions live in :mod:`mxfp16.amp.amp`): ``amp.init()``,
``amp.init_trainer(trainer)``, ``with amp.scale_loss(loss, trainer) as scaled:
autograd.backward(scaled)``, ``amp.unscale(trainer)`` and the ``convert_*`` / ``list_*``
functions keep their names and arguments.  Behind them:

* the network a Trainer given to ``init_trainer`` trains is cast by :func:`mxfp16.cast_block` at
  its first call, whether it was built before or after ``init()`` (see :mod:`.session`): float16
  weights with float32 master copies in the optimizer, float32 normalization, float16 emulated
  on a CPU; ``target_dtype='bfloat16'`` trains in bfloat16;
* the loss scale is an :class:`mxfp16.DynamicLossScaler` with the measured ``'auto'`` start, one
  per Trainer; every gradient on every device is checked after aggregation and an overflowing
  step is skipped everywhere (see :mod:`.scaling`); its state rides in ``trainer.save_states``;
* ``gluon.utils.clip_global_norm`` and ``nlp.utils.clip_grad_global_norm``, unchanged, clip the
  float16 and float32 gradients and compare the true norm with ``max_norm`` while the gradients
  still hold the loss scale (see :mod:`mxfp16.scaling.clipping`);
* ``amp.reset()`` undoes ``init()``: no state outlives it.

Examples
--------
>>> import mxnet as mx
>>> from mxnet import autograd, gluon
>>> from mxfp16 import amp
>>> amp.init()
>>> net = gluon.nn.HybridSequential()
>>> net.add(gluon.nn.Dense(8, activation='relu'), gluon.nn.Dense(2))
>>> net.initialize()
>>> trainer = gluon.Trainer(net.collect_params(), 'sgd', {'learning_rate': 0.1},
...                         update_on_kvstore=False)
>>> amp.init_trainer(trainer)
>>> with autograd.record():
...     loss = gluon.loss.SoftmaxCELoss()(net(mx.nd.ones((4, 3))), mx.nd.zeros(4))
...     with amp.scale_loss(loss, trainer) as scaled_loss:
...         autograd.backward(scaled_loss)
>>> trainer.step(4)
>>> net[0].weight.dtype.__name__, amp.loss_scaler(trainer).num_steps
('float16', 1)
>>> amp.reset()
"""
# The package is its module amp (mxfp16.amp.amp), as mxnet.contrib.amp is: both import forms work.
from .amp import *  # noqa: F403
from .amp import __all__  # noqa: F401
