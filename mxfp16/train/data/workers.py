"""Data-loading worker processes that leave stop signals to the run.

A scheduler (SLURM's ``scancel``, a Kubernetes pod's end, a closed terminal) signals every process
of a job, the data-loading workers of ``gluon.data.DataLoader`` (``--num-data-workers N``, GluonCV's
``-j``) included.  Workers killed by that signal lose the batches they were decoding, the pool
forks new ones that inherit the run's stop handler, and ``DataLoader.__del__``'s
``Pool.terminate`` then waits forever for workers that no longer die on SIGTERM.

:class:`WorkerLoader` is a ``DataLoader`` whose workers block the stop signals (SIGTERM, SIGINT,
SIGHUP, and SLURM's warnings SIGUSR1 and SIGUSR2) and wait for them in a thread (``sigwaitinfo``,
which names the sender): a SIGTERM from the run's own process (``Pool.terminate`` when the loader
is done, multiprocessing's exit handler) ends the worker at once; any other stop signal is left to
the run, which saves, stops and then ends its workers.
"""
import os
import signal
import threading

from mxnet import gluon

from ...checkpoints.preemption import STOP_SIGNALS

__all__ = ["WorkerLoader"]

#: True while a WorkerLoader forks its workers.
_forking = False


def _watch_stop_signals(parent):
    """A worker's signal thread: exit on the parent's SIGTERM, ignore every other stop signal."""
    while True:
        info = signal.sigwaitinfo(STOP_SIGNALS)
        if info.si_signo == signal.SIGTERM and info.si_pid == parent:
            os._exit(0)


def _after_fork_in_child():
    if _forking:
        signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
        threading.Thread(target=_watch_stop_signals, args=(os.getppid(),), daemon=True,
                         name="mxfp16-stop-signals").start()


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
    """

    def __init__(self, *args, **kwargs):
        global _forking
        if kwargs.get("num_workers", 0) <= 0 or kwargs.get("thread_pool", False):
            super().__init__(*args, **kwargs)
            return
        # Blocked while the workers are forked (the parent gets any signal once they are), so a
        # worker never sees one before its signal thread is in place.
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
        _forking = True
        try:
            super().__init__(*args, **kwargs)
        finally:
            _forking = False
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
