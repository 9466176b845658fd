"""Horovod as a kvstore: ``--kv-store horovod``, the engine of NVIDIA's and MXNet's Horovod examples.

:class:`Horovod` is an ``mx.kvstore.KVStoreBase`` (registered, so ``mx.kv.create('horovod')`` makes
one once this module is imported) whose ``pushpull`` is Horovod's allreduce (a sum, as MXNet's
kvstores sum) and whose ``broadcast`` is Horovod's broadcast from rank 0.  ``gluon.Trainer``,
:class:`mxfp16.Trainer` and Module take it where they take a kvstore, so float16 training on Horovod
runs the same loss-scaling code as on one device or on ``dist_sync``:

* gradients are summed in their own dtype (float16 gradients: half the bytes of float32) *before*
  the loss scaler checks them, so every rank sees the same summed gradients, makes the same
  skip-or-update decision, keeps the same scale and measures the same ``'auto'`` start;
* the Trainer's first gradient exchange broadcasts rank 0's weights (``sync_initial_weights``);
* ``rescale_grad`` divides by the batch of all ranks, as for ``dist_sync``.

Horovod is optional: :func:`import_horovod` turns a missing or MXNet-less Horovod into one error that
says how to install it.
"""
import weakref

import mxnet as mx
import numpy as np

#: What installs Horovod for MXNet (after MXNet itself): its build imports the installed mxnet for
#: headers and libmxnet.so, which pip's isolated build environment would hide.  It builds with MPI
#: where OpenMPI's development files are installed (Horovod's own detection), with Gloo always.
INSTALL_COMMAND = ("pip install wheel && HOROVOD_WITH_MXNET=1 HOROVOD_WITH_GLOO=1 "
                   "HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_PYTORCH=1 "
                   "pip install --no-build-isolation horovod==0.28.1")

#: Name prefix of this module's Horovod operations (names must match across ranks).
_OP_PREFIX = "mxfp16."

#: ``set_gradient_compression`` types: Horovod's float16 compression of float32 gradients.
COMPRESSION_TYPES = ("none", "fp16")


class HorovodUnavailable(ImportError):
    """Horovod is not installed, or was built without MXNet support."""


def import_horovod():
    """``horovod.mxnet``, or :class:`HorovodUnavailable` saying how to install it.

    Raises
    ------
    HorovodUnavailable
        Horovod missing (the install command), or built without MXNet (``HOROVOD_WITH_MXNET=1``),
        or built against another MXNet (Horovod's own reason).
    """
    try:
        import horovod
    except ImportError:
        raise HorovodUnavailable(f"--kv-store horovod needs Horovod, which is not installed: "
                                 f"{INSTALL_COMMAND}") from None
    try:
        import horovod.mxnet as hvd
    except ImportError as error:
        reason = " ".join(str(error).split())
        if "has not been built" in reason:
            raise HorovodUnavailable(
                f"Horovod {horovod.__version__} was built without MXNet support: reinstall it with "
                f"HOROVOD_WITH_MXNET=1 after MXNet, e.g. pip uninstall -y horovod && "
                f"{INSTALL_COMMAND.replace('horovod==', '--no-cache-dir horovod==')}") from None
        raise HorovodUnavailable(f"Horovod {horovod.__version__} does not load with MXNet "
                                 f"{mx.__version__} ({reason}): reinstall it with "
                                 f"{INSTALL_COMMAND}") from None
    return hvd


def _as_list(arrays):
    return list(arrays) if isinstance(arrays, (list, tuple)) else [arrays]


@mx.kvstore.KVStoreBase.register
class Horovod(mx.kvstore.KVStoreBase):
    """A kvstore whose ``pushpull`` is Horovod's allreduce (sum) and ``broadcast`` rank 0's value.

    Create it in every process of a ``horovodrun`` (or ``mpirun``) job; it initializes Horovod.
    Gradients of several devices of one process are summed locally first, then over the processes.

    Parameters
    ----------
    compression : {'none', 'fp16'}
        ``'fp16'`` sends float32 gradients as float16 (Horovod's ``Compression.fp16``) and sums
        them in float16; float16 gradients are sent as they are either way.
    prefix : str
        Prepended to the names of this kvstore's Horovod operations.  Several Trainers (a GAN's
        generator and discriminator) each need a kvstore of their own with a different prefix:
        a Trainer's keys are its parameter indices, so two Trainers on one kvstore would send
        operations of the same name, which Horovod refuses while one is in flight (Horovod's
        ``DistributedTrainer`` has the same ``prefix``).

    Examples
    --------
    >>> kv = Horovod()  # doctest: +SKIP
    >>> trainer = mxfp16.Trainer(net.collect_params(), 'sgd', kvstore=kv)  # doctest: +SKIP
    """

    def __init__(self, compression="none", prefix=""):
        self._hvd = import_horovod()
        self._hvd.init()
        self._prefix = _OP_PREFIX + str(prefix)
        self._compression = "none"
        self.set_gradient_compression({"type": compression})
        #: Bytes this process sent into allreduce since creation (gradient payloads only).
        self.bytes_allreduced = 0
        self._trainer = None  # weak reference to the one Trainer whose keys this kvstore names

    @property
    def type(self):
        return "horovod"

    @property
    def rank(self):
        return self._hvd.rank()

    @property
    def num_workers(self):
        return self._hvd.size()

    @property
    def local_rank(self):
        """This process's rank on its machine (the GPU it should use)."""
        return self._hvd.local_rank()

    @staticmethod
    def is_capable(capability):
        """No optimizer runs inside the allreduce: the update stays on the workers, after the loss
        scaler's check."""
        if capability.lower() == mx.kvstore.KVStoreBase.OPTIMIZER:
            return False
        raise ValueError(f"unknown capability {capability!r}: Horovod's kvstore knows 'optimizer'")

    def attach(self, trainer):
        """Record ``trainer`` as this kvstore's Trainer; a second live one is refused.

        Raises
        ------
        ValueError
            When another Trainer already uses this kvstore (its operations would take the same
            names), naming the fix.
        """
        current = self._trainer() if self._trainer is not None else None
        if current is not None and current is not trainer:
            raise ValueError("this Horovod kvstore already serves another Trainer, and two "
                             "Trainers on one kvstore send Horovod operations of the same names: "
                             "give each Trainer its own, e.g. kvstore=mxfp16.distributed.horovod.Horovod("
                             "prefix='discriminator.')")
        self._trainer = weakref.ref(trainer)

    def set_optimizer(self, optimizer):
        raise ValueError("Horovod updates on the workers: create the Trainer with "
                         "update_on_kvstore=False (mxfp16.Trainer and make_trainer do)")

    def set_gradient_compression(self, compression_params):
        """``{'type': 'fp16'}`` sends float32 gradients as float16; ``{'type': 'none'}`` does not."""
        kind = str(dict(compression_params or {}).get("type", "none")).lower()
        if kind not in COMPRESSION_TYPES:
            raise ValueError(f"Horovod's gradient compression {kind!r} is not supported: choose "
                             f"one of {', '.join(COMPRESSION_TYPES)}")
        self._compression = kind

    def init(self, key, value):
        """Module's kvstore initialization: every rank gets rank 0's ``value`` (in place)."""
        for name, array in zip(_as_list(key), _as_list(value)):
            self._broadcast_(array, name=f"{self._prefix}init.{name}")

    def broadcast(self, key, value, out, priority=0):
        """Rank 0's ``value`` into ``out`` (an array or one per device) on every rank."""
        buffer = value.copy()
        self._broadcast_(buffer, name=f"{self._prefix}bcast.{key}", priority=priority)
        for array in _as_list(out):
            buffer.copyto(array)

    def _broadcast_(self, array, name, priority=0):
        """Rank 0's ``array`` on every rank, in place: an allreduce (a sum) to which every other
        rank adds -0.0, and ``x + (-0.0)`` is ``x`` for every ``x``, the sign of a zero included.

        Not Horovod's ``broadcast_``: Horovod 0.28.1 reads the name of a broadcast for a log line
        after it has queued the operation (``EnqueueTensorBroadcast``), and when its background
        thread has finished the operation first, MXNet has freed the name with the operation's
        parameters.  With one process there is nothing to wait for, and on a loaded machine
        MXNet's engine thread is often descheduled in between: the read segfaults (a one-process
        ``--kv-store horovod`` run at its first step).  Horovod's allreduce logs before queueing.
        """
        if self.rank != 0:
            mx.nd.negative(mx.nd.zeros_like(array), out=array)
        self._hvd.allreduce_(array, op=self._hvd.Sum, name=name, priority=priority)

    def pushpull(self, key, value, out=None, priority=0):
        """Sum ``value`` (an array, or one per device) over the devices and the ranks into ``out``
        (default: into ``value``), in the arrays' dtype."""
        values = _as_list(value)
        total = values[0] if len(values) == 1 else \
            mx.nd.add_n(*[v.as_in_context(values[0].context) for v in values])
        wire = total.astype("float16") \
            if self._compression == "fp16" and np.dtype(total.dtype) == np.float32 else total
        self.bytes_allreduced += wire.size * np.dtype(wire.dtype).itemsize
        self._hvd.allreduce_(wire, op=self._hvd.Sum, name=f"{self._prefix}grad.{key}",
                             priority=priority)
        if wire is not total:
            wire.astype(total.dtype).copyto(total)
        for array in (_as_list(out) if out is not None else values):
            if array is not total:
                total.copyto(array)

    def allreduce_values(self, name, values, op="sum"):
        """Python numbers summed (or ``op='max'``: the largest) over the ranks, as float64.

        For decisions every rank must share (validation counts).  Blocks until every rank called it.
        """
        array = mx.nd.array(values, dtype="float64")
        reduce_op = self._hvd.Sum if op == "sum" else self._hvd.Max
        return self._hvd.allreduce(array, op=reduce_op, name=f"{self._prefix}{name}").asnumpy()

    def allgather_object(self, obj, name):
        """Every rank's ``obj`` (picklable), in rank order."""
        return self._hvd.allgather_object(obj, name=f"{self._prefix}{name}")

    def save_optimizer_states(self, fname, dump_optimizer=False):
        raise NotImplementedError("Horovod keeps no optimizer: save the Trainer's states")

    def load_optimizer_states(self, fname):
        raise NotImplementedError("Horovod keeps no optimizer: load the Trainer's states")


def rank_devices(ctx, local_rank):
    """The devices of one Horovod process: one GPU, picked as NVIDIA's and MXNet's examples do.

    Every process gets the same ``--gpus``; the one of local rank ``r`` takes the list's ``r``-th
    GPU when the list has one per process (NVIDIA's ``--gpus 0,1,2,3``), else ``gpu(r)`` (MXNet's
    fit.py, ``--gpus 0``).  CPU contexts stay as they are (a rehearsal on the CPU).

    Examples
    --------
    >>> rank_devices([mx.gpu(0), mx.gpu(1), mx.gpu(2)], 2), rank_devices([mx.gpu(0)], 1)
    ([gpu(2)], [gpu(1)])
    >>> rank_devices([mx.cpu(0)], 1)
    [cpu(0)]
    """
    if not ctx or ctx[0].device_type != "gpu":
        return ctx
    return [ctx[local_rank]] if local_rank < len(ctx) else [mx.gpu(local_rank)]


def is_horovod(kvstore):
    """Whether ``kvstore`` is a :class:`Horovod` kvstore (without importing Horovod)."""
    return getattr(kvstore, "type", None) == "horovod"
