"""Data-loading worker processes that leave stop signals to the run.

A scheduler (SLURM's ``scancel``, a Kubernetes pod's end, a closed terminal) signals every process
of a job, the data-loading workers of ``gluon.data.DataLoader`` (``--num-data-workers N``, GluonCV's
``-j``) included.  Workers killed by that signal lose the batches they were decoding, the pool
forks new ones that inherit the run's stop handler, and ``DataLoader.__del__``'s
``Pool.terminate`` then waits forever for workers that no longer die on SIGTERM.

:class:`WorkerLoader` is a ``DataLoader`` whose workers ignore SIGTERM, SIGINT and SIGHUP from
outside: the run decides to stop, saves, and ends them itself (:meth:`WorkerLoader.close`, also at
garbage collection and at interpreter exit), and only then does SIGTERM end a worker.
"""
import atexit
import functools
import multiprocessing
import os
import signal
import weakref

from mxnet import gluon

from ...preemption import STOP_SIGNALS

__all__ = ["WorkerLoader"]

#: The shutdown event of the loader whose workers are being forked (None otherwise).
_forking = None
_loaders = weakref.WeakSet()


def _worker_signal(shutdown, signum, frame):
    """A worker's handler: SIGTERM ends it once its loader is shutting down; else nothing."""
    if signum == signal.SIGTERM and shutdown.is_set():
        os._exit(0)


def _after_fork_in_child():
    if _forking is None:
        return
    handler = functools.partial(_worker_signal, _forking)
    for signum in STOP_SIGNALS:
        signal.signal(signum, handler)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)


os.register_at_fork(after_in_child=_after_fork_in_child)


class WorkerLoader(gluon.data.DataLoader):
    """``gluon.data.DataLoader`` whose worker processes leave stop signals to the run (see the
    module notes); the same arguments.

    Examples
    --------
    >>> import mxnet as mx
    >>> loader = WorkerLoader(gluon.data.ArrayDataset(mx.nd.arange(8)), batch_size=4,
    ...                       num_workers=2)
    >>> [batch.asnumpy().tolist() for batch in loader]
    [[0.0, 1.0, 2.0, 3.0], [4.0, 5.0, 6.0, 7.0]]
    >>> loader.close()
    """

    def __init__(self, *args, **kwargs):
        global _forking
        processes = kwargs.get("num_workers", 0) > 0 and not kwargs.get("thread_pool", False)
        self._shutdown = multiprocessing.Event() if processes else None
        if not processes:
            super().__init__(*args, **kwargs)
            return
        # Blocked while the workers are forked (the parent gets any signal once they are), so a
        # worker never sees one before its own handler is in place.
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
        _forking = self._shutdown
        try:
            super().__init__(*args, **kwargs)
        finally:
            _forking = None
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        _loaders.add(self)

    def close(self):
        """End the worker processes (at once; they hold nothing to save)."""
        pool = getattr(self, "_worker_pool", None)
        if pool is None:
            return
        self._worker_pool = None
        if self._shutdown is not None:
            self._shutdown.set()
        pool.terminate()

    def __del__(self):
        self.close()


@atexit.register
def _close_all():
    """Before multiprocessing's own exit handler terminates the (daemon) workers with SIGTERM."""
    for loader in list(_loaders):
        loader.close()
