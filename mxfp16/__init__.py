"""mxfp16: mixed-precision (float16) training for Apache MXNet 1.9, Gluon and Module APIs.

Examples
--------
>>> import mxnet as mx
>>> from mxnet import autograd
>>> from mxnet.gluon import nn, loss
>>> import mxfp16
>>> net = nn.HybridSequential()
>>> net.add(nn.Dense(16, activation='relu'), nn.Dense(2))
>>> net.initialize()
>>> net = mxfp16.cast_block(net, 'float16')
>>> trainer = mxfp16.make_trainer(net.collect_params(), 'sgd', 'float16', learning_rate=0.1)
>>> scaler = mxfp16.DynamicLossScaler()
>>> x, y = mx.nd.ones((8, 4)), mx.nd.zeros(8)
>>> with autograd.record():
...     l = loss.SoftmaxCrossEntropyLoss()(net(x), y)
...     scaled = scaler.scale(l)
>>> scaled.backward()
>>> scaler.step(trainer, batch_size=8)  # 2**16 overflows these float16 gradients: skipped
False
>>> scaler.loss_scale, scaler.num_skipped
(32768.0, 1)
"""
from .casting import cast_block, cast_params, cast_symbol
from .dtypes import SUPPORTED_DTYPES
from .emulation import resolve_emulate
from .loss_scaling import (DynamicLossScaler, LossScaleCollapse, LossScaler, StaticLossScaler,
                           make_loss_scaler)
from .module import init_optimizer, make_scaled_module, module_step, scale_loss_symbol
from .optimizers import MULTI_PRECISION_OPTIMIZERS, make_optimizer, make_trainer, rescale_grad
from .trainer import Trainer

__version__ = "0.1.0"

__all__ = [
    "cast_block", "cast_symbol", "cast_params", "SUPPORTED_DTYPES", "resolve_emulate",
    "LossScaler", "StaticLossScaler", "DynamicLossScaler", "LossScaleCollapse", "make_loss_scaler",
    "make_optimizer", "make_trainer", "rescale_grad", "MULTI_PRECISION_OPTIMIZERS", "Trainer",
    "scale_loss_symbol", "make_scaled_module", "init_optimizer", "module_step",
]
