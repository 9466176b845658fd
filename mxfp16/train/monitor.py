"""MXNet example's ``--monitor N``: log the network's parameters every N batches.

The statistic is MXNet ``Monitor``'s default, ``norm(x) / sqrt(x.size)`` (the root mean square), of
the float32 values of every parameter, logged as ``Batch: N name value`` lines as ``Monitor.toc_print``
writes them.  It reads every parameter back from the device, so use it with a large N.
"""
import logging

import numpy as np

log = logging.getLogger("mxfp16.train")


def root_mean_square(array):
    """``norm(x) / sqrt(x.size)``, MXNet ``Monitor``'s default statistic.

    Examples
    --------
    >>> import mxnet as mx
    >>> root_mean_square(mx.nd.array([3.0, 4.0]))
    3.5355...
    """
    values = array.asnumpy().astype(np.float64)
    return float(np.sqrt(np.mean(values ** 2)))


class ParameterMonitor:
    """A training API (``GluonAPI`` or ``ModuleAPI``) that logs its parameters every
    ``interval`` training steps; everything else is the wrapped API's.

    Examples
    --------
    >>> import mxnet as mx
    >>> from mxfp16.models import Network
    >>> class Api:
    ...     def train_step(self, data, targets, batch_size):
    ...         return [], [], True
    ...     def snapshot(self):
    ...         return Network(mx.sym.var('w'), {'w': mx.nd.array([3.0, 4.0])}, {}), None
    >>> monitored = ParameterMonitor(Api(), interval=2)
    >>> [monitored.train_step([], [], 1)[2] for _ in range(2)], monitored.last['w']
    ([True, True], 3.5355...)
    """

    def __init__(self, api, interval):
        self.api, self.interval = api, interval
        self.steps, self.last = 0, {}

    def __getattr__(self, name):
        return getattr(self.api, name)

    def train_step(self, data, targets, batch_size):
        result = self.api.train_step(data, targets, batch_size)
        self.steps += 1
        if self.steps % self.interval == 0:
            network = self.api.snapshot()[0]
            self.last = {name: root_mean_square(value) for name, value in
                         sorted({**network.arg_params, **network.aux_params}.items())}
            for name, value in self.last.items():
                log.info("Batch: %7d %30s %.8g", self.steps, name, value)
        return result
