"""KVStore helpers: creating the kvstore a run names, and giving every worker rank 0's weights.

Loss scaling needs the aggregated gradients before the update, so every kvstore here is used with
``update_on_kvstore=False`` (see :func:`mxfp16.make_trainer`).
"""
import os

import mxnet as mx

from .. import mxnet_internals
from .horovod import Horovod, is_horovod

#: kvstores that aggregate gradients before the update, as loss scaling needs (asynchronous
#: ``dist_async`` updates each worker's gradients separately on the servers).  ``horovod`` is
#: :class:`mxfp16.distributed.horovod.Horovod`: one process per device started by horovodrun or mpirun.
KVSTORE_TYPES = ("local", "device", "nccl", "dist_sync", "dist_device_sync", "horovod")


def make_kvstore(kv_store):
    """``(kvstore, rank, num_workers)`` for a ``--kv-store`` name.

    Distributed kvstores (and Horovod's) are created here (the data is sharded by their rank); for
    the others the name is returned and the Trainer or Module makes one.

    Raises
    ------
    ValueError
        For a distributed kvstore outside a distributed job (no ``DMLC_ROLE``), where MXNet would
        wait for a scheduler forever.
    mxfp16.distributed.horovod.HorovodUnavailable
        (an ImportError) for ``horovod`` without a Horovod built for MXNet, saying how to install it.

    Examples
    --------
    >>> make_kvstore('device')
    ('device', 0, 1)
    """
    if kv_store == "horovod":
        kvstore = Horovod()
        return kvstore, kvstore.rank, kvstore.num_workers
    if "dist" in kv_store:
        if "DMLC_ROLE" not in os.environ:
            raise ValueError(f"--kv-store {kv_store} needs the processes of a distributed job: run "
                             "the script through scripts/launch.py (e.g. launch.py -n 2 -s 1 -- "
                             "python scripts/train_imagenet.py ...), or use --kv-store device")
        kvstore = mx.kv.create(kv_store)
        return kvstore, kvstore.rank, kvstore.num_workers
    return kv_store, 0, 1


def sync_initial_weights(trainer):
    """Give every worker rank 0's weights now, before the first step of a distributed Trainer.

    Call it once after creating the Trainer (e.g. with :func:`mxfp16.make_trainer` and
    ``kvstore=mx.kv.create('dist_sync')``) and before the first ``scaler.step`` / ``trainer.step``.
    Otherwise the Trainer broadcasts the weights lazily inside its first gradient exchange, and
    MXNet 1.9's dist kvstore does not order that broadcast's pull before the first gradient push of
    CPU arrays (``KVStoreDist`` swaps its communication buffer for the gradient array), so a worker
    may receive the summed first gradients as its weights (tests/test_distributed.py's job without
    this call: workers diverged in 1 run of 12 on an idle machine, 2 of 3 under load).  With any
    other kvstore this only creates the Trainer's kvstore.

    Parameters
    ----------
    trainer : gluon.Trainer
        Its parameters initialized, none deferred.

    Raises
    ------
    RuntimeError
        If, with a distributed kvstore, a parameter still waits for its shape (deferred
        initialization).

    Examples
    --------
    >>> import mxnet as mx
    >>> net = mx.gluon.nn.Dense(2, in_units=3)
    >>> net.initialize()
    >>> trainer = mx.gluon.Trainer(net.collect_params(), 'sgd', kvstore='local')
    >>> sync_initial_weights(trainer)
    """
    waiting = mxnet_internals.init_trainer_kvstore(trainer)
    if waiting:
        names = ", ".join(param.name for param in waiting)
        raise RuntimeError(f"parameters {names} have no shape yet (deferred initialization): run "
                           "one forward pass, or give the layers their input sizes (in_units=, "
                           "in_channels=), before sync_initial_weights")
    for param in mxnet_internals.trainer_params(trainer):
        for array in param.list_data():
            array.wait_to_read()  # the broadcast's pull has landed


def sync_if_horovod(trainer, kvstore):
    """With Horovod, give every rank rank 0's weights as the Trainer is created.

    Horovod's own recipe (``hvd.broadcast_parameters`` after creating the Trainer): every rank's
    first forward pass then runs on the same weights.  Left to the first step, the broadcast would
    come after each rank's first backward, on its own initial weights.  Other kvstores wait for
    the first step (see :func:`sync_initial_weights`).  A Horovod kvstore serves one Trainer
    (:meth:`mxfp16.distributed.horovod.Horovod.attach`).
    """
    if is_horovod(kvstore):
        kvstore.attach(trainer)
        sync_initial_weights(trainer)
