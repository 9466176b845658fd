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
from .mxnet_import import import_core

# The public names load on first use (PEP 562 ``__getattr__``), not here: MXNet 1.9.1 fails to
# import with numpy >= 1.24, and ``python -m mxfp16.doctor`` (which imports this package first) must
# still run to diagnose that; a user gets import_core's clear error instead of MXNet's traceback.
# Module -> the public names it defines, as ``from .<module> import <names>`` did here.
_EXPORTS = {
    "scaling.clipping": ("clip_global_norm", "clip_grad_global_norm"),
    "estimator": ("BatchProcessor",),
    "casting": ("cast_block", "cast_symbol", "cast_params", "SUPPORTED_DTYPES", "resolve_emulate",
                "export"),
    "scaling.scalers": ("DynamicLossScaler", "LossScaleCollapse", "LossScaler", "StaticLossScaler",
                        "make_loss_scaler"),
    "module": ("init_optimizer", "make_scaled_module", "module_step", "scale_loss_symbol"),
    "optimizers": ("MULTI_PRECISION_OPTIMIZERS", "make_optimizer", "make_trainer", "rescale_grad"),
    "checkpoints.preemption": ("StopRequest",),
    "trainer": ("Trainer",),
    "diagnose": ("find_overflow", "OverflowReport", "compare_precision", "PrecisionReport"),
    "checkpoints.training_state": ("TrainingState", "save_training_state", "load_training_state",
                                   "latest_training_state", "seed_step"),
}

#: The core's subpackages and modules, loaded as attributes of the package on first use
#: (``mxfp16.scaling.scalers``), and the names earlier releases gave some of them (``mxfp16.kvstore``).
_MODULES = {
    "scaling": "scaling", "checkpoints": "checkpoints", "distributed": "distributed",
    "diagnose": "diagnose",
    "mxnet_internals": "mxnet_internals",
    "grad_checks": "scaling.overflow", "kvstore": "distributed.kvstore",
    "loss_scale_settings": "scaling.settings",
}

__version__ = "0.1.0"

__all__ = [
    "cast_block", "cast_symbol", "cast_params", "SUPPORTED_DTYPES", "resolve_emulate", "export",
    "clip_global_norm", "clip_grad_global_norm",
    "LossScaler", "StaticLossScaler", "DynamicLossScaler", "LossScaleCollapse", "make_loss_scaler",
    "make_optimizer", "make_trainer", "rescale_grad", "MULTI_PRECISION_OPTIMIZERS", "Trainer",
    "scale_loss_symbol", "make_scaled_module", "init_optimizer", "module_step",
    "BatchProcessor", "StopRequest", "TrainingState", "save_training_state", "load_training_state",
    "latest_training_state", "seed_step", "find_overflow", "OverflowReport", "compare_precision",
    "PrecisionReport",
]


def __getattr__(name):
    if name in _MODULES:
        return import_core(f"{__name__}.{_MODULES[name]}")
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    for module_name, names in _EXPORTS.items():
        module = import_core(f"{__name__}.{module_name}")
        globals().update((public, getattr(module, public)) for public in names)
    return globals()[name]


def __dir__():
    return sorted(set(globals()) | set(__all__))
