"""Stopping a training loop cleanly on SIGTERM, SIGINT, SIGHUP, SIGUSR1 and SIGUSR2: :class:`StopRequest`.

Spot and preemptible instances, Kubernetes and SLURM end a job with SIGTERM and a grace period
(30 s to 2 min) before SIGKILL; a person presses Ctrl-C (SIGINT).  Python's defaults end the process
at once (SIGTERM) or raise ``KeyboardInterrupt`` wherever the program is (SIGINT), in the middle of a
step or of a checkpoint write.  While a :class:`StopRequest` is active a signal only sets a flag;
the loop reads it between steps, saves, and exits with the code a shell gives a process killed by
that signal (128 + its number: 143 for SIGTERM, 130 for SIGINT), so schedulers and shells see what
happened.  SIGHUP (the terminal closed, an ``ssh`` session dropped) is treated like SIGTERM: the run
saves and exits 129; so are SIGUSR1 and SIGUSR2, the warnings a SLURM job asks for ahead of its
time limit (``sbatch --signal=USR1@120``), whose default action would kill the process (exit
codes 138 and 140).

A process forked while the handler is installed (a data-loading worker that a pool respawns)
inherits it; there a stop signal is not the run's to handle: the child exits quietly on SIGTERM and
SIGHUP, as with the default action, and ignores SIGINT (a Ctrl-C reaches the whole process group;
the run stops its workers itself).

A second SIGINT (Ctrl-C pressed again, say while the checkpoint is being written) raises
``KeyboardInterrupt`` at once: the impatient user gets the prompt back, and an interrupted save,
which is atomic, leaves the previous checkpoint intact.  A second SIGTERM only repeats the request
(schedulers send SIGKILL when they stop waiting).
"""
import os
import signal
import threading

__all__ = ["StopRequest", "STOP_SIGNALS"]


#: The signals that ask a run to stop.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)


class StopRequest:
    """A context manager under which SIGTERM, SIGINT, SIGHUP, SIGUSR1 and SIGUSR2 ask the loop to
    stop instead of killing it.

    Parameters
    ----------
    signals : tuple of signal.Signals
        The signals to catch (default :data:`STOP_SIGNALS`: SIGTERM, SIGINT, SIGHUP, SIGUSR1 and
        SIGUSR2).

    Notes
    -----
    Signal handlers can only be installed from the main thread; elsewhere the context is a no-op
    (``requested`` stays False) and the process keeps Python's default behaviour.

    Examples
    --------
    >>> import os, signal
    >>> with StopRequest() as stop:
    ...     for step in range(1000):
    ...         if step == 3:
    ...             os.kill(os.getpid(), signal.SIGTERM)  # what a scheduler sends
    ...         if stop.requested:
    ...             break
    >>> step, stop.signal_name, stop.exit_code
    (3, 'SIGTERM', 143)
    """

    def __init__(self, signals=STOP_SIGNALS):
        self._signals = tuple(signals)
        self._previous = {}
        self._signum = None
        self._pid = os.getpid()

    def __enter__(self):
        self._pid = os.getpid()
        if threading.current_thread() is threading.main_thread():
            for signum in self._signals:
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc_info):
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous = {}

    def _handle(self, signum, frame):
        if os.getpid() != self._pid:  # a forked child (a data worker): not the run's signal
            if signum != signal.SIGINT:
                signal.signal(signum, signal.SIG_DFL)
                os.kill(os.getpid(), signum)
            return
        if signum == signal.SIGINT and self._signum is not None:
            raise KeyboardInterrupt("second SIGINT: stopped at once")
        if self._signum is None:
            self._signum = signum

    def request(self, signum=signal.SIGTERM):
        """Ask to stop as if ``signum`` had arrived (for a stop decided elsewhere, e.g. by another
        worker of a distributed job)."""
        if self._signum is None:
            self._signum = signum

    @property
    def requested(self):
        """True once a signal has arrived."""
        return self._signum is not None

    @property
    def signal_name(self):
        """``'SIGTERM'``, ``'SIGINT'``, ... for the first signal; None before any."""
        return None if self._signum is None else signal.Signals(self._signum).name

    @property
    def exit_code(self):
        """128 + the first signal's number (143 for SIGTERM, 130 for SIGINT); None before any."""
        return None if self._signum is None else 128 + int(self._signum)
