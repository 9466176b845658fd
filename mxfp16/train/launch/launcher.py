"""Launching MXNet's parameter-server (``dist_sync``) training: scheduler, servers and workers.

MXNet's ``tools/launch.py`` and the dmlc-core tracker behind it are not part of the pip wheel; this
module does their job for the two cases that matter: every process on this machine, or workers and
servers spread over a list of machines reached with ssh.  From the command line::

    python scripts/launch.py -n 2 -s 1 -- python scripts/train_imagenet.py --kv-store dist_sync ...
    python scripts/launch.py -n 4 -s 2 -H hosts.txt -- python scripts/train_imagenet.py ...

and from Python, ``launch(['python', 'train.py', '--kv-store', 'dist_sync'], num_workers=2,
num_servers=1, timeout=600)`` returns the job's exit code.

**Processes.**  One scheduler, always on this machine, listening on a free port of ``root_uri``
(127.0.0.1 for a local job).  ``num_servers`` servers and the scheduler run ``<python> -c "import
mxnet"``: importing mxnet with ``DMLC_ROLE=server`` or ``scheduler`` runs the server loop, which
returns and exits the process once every worker has finalized its kvstore (at worker exit).
``<python>`` is the first word of the worker command when that names a Python interpreter
(``python``, ``python3.11``, a virtualenv's ``bin/python``), else this interpreter.
``num_workers`` workers run the given command (no shell: pass ``bash -c '...'`` for shell
syntax); each creates ``mx.kv.create('dist_sync')`` and learns its ``kv.rank`` (assigned by the
scheduler, not the launch order) and ``kv.num_workers``.

**Local launcher.**  Every process runs here with this environment plus the variables below and
``DMLC_NODE_HOST=127.0.0.1``, so ps-lite listens and connects on 127.0.0.1 only.

**ssh launcher.**  The hostfile lists one machine per line, ``host``, ``host:ssh_port`` or
``user@host[:ssh_port]`` (blank lines and ``#`` comments are skipped).  Worker ``i`` runs on host
``i % len(hosts)`` and server ``j`` on host ``j % len(hosts)``, each through
``ssh -tt -o StrictHostKeyChecking=no -o BatchMode=yes -p PORT HOST 'cd DIR && export ... && exec
COMMAND'``: ``DIR`` is the current directory (the code and data must be at the same path on every
machine, e.g. a shared file system), the exports are the variables below, ``DMLC_NODE_HOST=HOST``,
the variables of :data:`FORWARDED_ENV` that are set here, and those passed with ``env``.  ``-tt``
gives the remote command a terminal, so that stopping the local ssh client hangs it up.  Every
machine must reach the scheduler at ``root_uri`` (default: this machine's address from its host
name; pass ``--host-ip`` when that resolves to a loopback address) and every other machine on the
ports ps-lite picks.

**Environment of every process**: ``DMLC_ROLE`` (scheduler, server or worker),
``DMLC_PS_ROOT_URI`` and ``DMLC_PS_ROOT_PORT`` (the scheduler's address), ``DMLC_NUM_SERVER``,
``DMLC_NUM_WORKER``, ``DMLC_NODE_HOST`` (the address a server or worker listens on) and
``DMLC_TASK_ID`` (launch index, as dmlc's local launcher numbers it: workers 0..n-1, then servers).
``PS_VERBOSE=1`` or ``2`` in the environment makes ps-lite log its connections.

**Training code.**  ``mxfp16.make_trainer(..., kvstore=kv)`` with ``kv = mx.kv.create('dist_sync')``
aggregates on the servers and updates on each worker: the gradients a worker gets back are the
*sums* over the workers, so pass the global batch, ``batch_size * kv.num_workers``, to
``scaler.step`` / ``trainer.step``.  The Trainer sends rank 0's weights to every worker at its first
step, after that step's forward and backward, and that broadcast races with the first gradient
push: mxfp16's loss scalers call :func:`mxfp16.distributed.kvstore.sync_initial_weights` at a Trainer's first
step (call it yourself before a bare ``trainer.step``), and initialise alike on every worker (same
seed).  A loss scaler's skip decision is then the same on every worker (tests/test_distributed.py
checks all of this on a real job).

**Supervision.**  The launcher logs which process runs where (with its local pid) and waits for the
workers.  Once all have exited with 0, it gives the servers and scheduler
:data:`SERVER_EXIT_GRACE` seconds to exit and returns 0.  The first worker (or server, or scheduler) to fail
decides the exit code (a signal N counts as 128 + N), and every other process is stopped: SIGTERM
to its process group (each process runs in a session of its own), SIGKILL after
:data:`KILL_GRACE` seconds.  The same happens after ``timeout`` seconds (:class:`LaunchTimeout`).

**Preemption.**  SIGTERM to the launcher (a scheduler's notice) or Ctrl-C is passed to the workers
first, and the servers and scheduler keep running while the workers stop: mxfp16's training
scripts then agree on a step, rank 0 saves it, and the workers exit with 143 (130 for Ctrl-C), which
the launcher returns once all have (at most :data:`WORKER_STOP_GRACE` seconds, then everything is
killed).  Resume with the same launch command plus ``--resume PREFIX``.  A second Ctrl-C stops
everything at once.
"""
import logging
import math
import os
import shlex
import signal
import subprocess
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass

from .plan import (LaunchError, LaunchTimeout, ProcessSpec, check_job, default_root_uri,
                          free_port, plan_processes)

log = logging.getLogger(__name__)

#: Seconds the servers and the scheduler get to exit after the last worker succeeded.
SERVER_EXIT_GRACE = 15.0

#: Seconds between SIGTERM and SIGKILL when stopping a process group.
KILL_GRACE = 3.0

#: Seconds the workers have to save and exit after SIGTERM or Ctrl-C reached the launcher, within
#: the grace periods of spot instances and Kubernetes (30 s and more).
WORKER_STOP_GRACE = 25.0

#: Seconds between two looks at the processes.
POLL_INTERVAL = 0.1

#: Processes whose success is the job's: the workers, or horovodrun, which runs them.
WORKER_ROLES = ("worker", "horovodrun")


@dataclass
class _Running:
    spec: ProcessSpec
    popen: subprocess.Popen
    log_file: object = None


def _start(spec, log_dir):
    """Start one process in a session (and process group) of its own."""
    log_file = None
    if log_dir is not None:
        os.makedirs(log_dir, exist_ok=True)
        log_file = open(os.path.join(log_dir, f"{spec.role}-{spec.index}.log"), "wb")
    try:
        popen = subprocess.Popen(list(spec.argv), env=dict(os.environ, **spec.env),
                                 stdin=subprocess.DEVNULL, stdout=log_file,
                                 stderr=subprocess.STDOUT if log_file else None,
                                 start_new_session=True)
    except OSError as error:
        if log_file:
            log_file.close()
        raise LaunchError(f"cannot start {spec.name} ({spec.argv[0]!r}: {error.strerror}): "
                          "check the command and that it is on PATH") from None
    log.info("started %s on %s (pid %d): %s", spec.name, spec.host, popen.pid,
             shlex.join(spec.argv))
    return _Running(spec, popen, log_file)


def exit_code(returncode):
    """A shell-style exit code: a process killed by signal N gives 128 + N.

    Examples
    --------
    >>> exit_code(3), exit_code(-9)
    (3, 137)
    """
    return 128 - returncode if returncode < 0 else returncode


def _returncode(proc):
    """Popen's return code (None while running), read without reaping the process.

    An exited but unreaped process keeps its pid, and so its process-group id, reserved: signalling
    the group in :func:`_stop` can reach the process's own children but never a newcomer that was
    given the same pid.
    """
    if proc.popen.returncode is not None:
        return proc.popen.returncode
    info = os.waitid(os.P_PID, proc.popen.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    if info is None:
        return None
    return info.si_status if info.si_code == os.CLD_EXITED else -info.si_status


def _first_failure(running):
    """(name, exit code) of a process that exited with an error, or None."""
    for proc in running:
        code = _returncode(proc)
        if code:
            return proc.spec.name, exit_code(code)
    return None


def _wait_workers(running, deadline):
    """Exit code of the job once every worker has exited, or at the first failure."""
    workers = [proc for proc in running if proc.spec.role in WORKER_ROLES]
    while True:
        failure = _first_failure(running)
        if failure:
            log.error("%s failed with exit code %d: stopping the job", *failure)
            return failure[1]
        if all(_returncode(proc) == 0 for proc in workers):
            log.info("all %d workers finished", len(workers))
            return 0
        if time.monotonic() > deadline:
            raise LaunchTimeout("the job ran past its timeout and was stopped: raise --timeout "
                                "or look for a hung process in the logs")
        time.sleep(POLL_INTERVAL)


def _wait_servers(running, deadline):
    """Give the servers and scheduler time to exit on their own after the workers finished."""
    others = [proc for proc in running if proc.spec.role not in WORKER_ROLES]
    limit = min(deadline, time.monotonic() + SERVER_EXIT_GRACE)
    while any(_returncode(proc) is None for proc in others) and time.monotonic() < limit:
        time.sleep(POLL_INTERVAL)
    for proc in others:
        if _returncode(proc) is None:
            log.warning("%s still runs after the workers finished: stopping it", proc.spec.name)


def _signal_groups(running, sig):
    for proc in running:
        try:
            os.killpg(proc.popen.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass  # the group is gone already


def _stop_workers_first(running, sig, grace=WORKER_STOP_GRACE):
    """Pass ``sig`` to the workers and wait (up to ``grace`` seconds) until they have exited, the
    servers and scheduler still up; the workers' exit code (the first nonzero one), or None."""
    workers = [proc for proc in running if proc.spec.role in WORKER_ROLES]
    _signal_groups(workers, sig)
    limit = time.monotonic() + grace
    while any(_returncode(proc) is None for proc in workers) and time.monotonic() < limit:
        time.sleep(POLL_INTERVAL)
    codes = [_returncode(proc) for proc in workers]
    if any(code is None for code in codes):
        log.error("workers still running %g s after %s: stopping the job", grace,
                  signal.Signals(sig).name)
        return None
    return next((exit_code(code) for code in codes if code), 0)


def _stop(running, grace=KILL_GRACE):
    """SIGTERM every process group, SIGKILL what is left after ``grace`` seconds, reap all."""
    _signal_groups(running, signal.SIGTERM)
    limit = time.monotonic() + grace
    while any(_returncode(proc) is None for proc in running) and time.monotonic() < limit:
        time.sleep(POLL_INTERVAL)
    _signal_groups(running, signal.SIGKILL)
    for proc in running:
        try:
            proc.popen.wait(timeout=grace)
        except subprocess.TimeoutExpired:  # stuck in the kernel; nothing more can be done
            log.error("%s (pid %d) did not die on SIGKILL", proc.spec.name, proc.popen.pid)
        if proc.log_file:
            proc.log_file.close()


@contextmanager
def _sigterm_as_exit():
    """Turn SIGTERM into SystemExit(143) so that the processes are stopped on the way out."""
    if threading.current_thread() is not threading.main_thread():  # signal() works there only
        yield
        return

    def handler(signum, frame):
        log.error("received SIGTERM: passing it to the workers, which save and stop")
        raise SystemExit(128 + signum)
    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def launch(command, num_workers, num_servers=None, launcher="local", hosts=None, timeout=None,
           root_uri=None, env=None, log_dir=None, workdir=None):
    """Run a ``dist_sync`` job: start scheduler, servers and workers, wait, stop everything.

    Parameters
    ----------
    command : sequence of str
        The workers' command line, e.g. ``['python', 'train.py', '--kv-store', 'dist_sync']``.
    num_workers : int
    num_servers : int or None
        Default: ``num_workers`` (as MXNet's launcher).
    launcher : {'local', 'ssh', 'horovod'}
        ``horovod`` runs ``horovodrun`` over Gloo instead, which starts the workers (no servers);
        the script needs ``--kv-store horovod``.
    hosts : list of str or None
        ``host`` or ``host:ssh_port`` entries for the ssh launcher (see :func:`read_hostfile`), or
        the hosts horovodrun spreads the workers over.
    timeout : float or None
        Seconds before the whole job is stopped; None waits forever.
    root_uri : str or None
        The scheduler's address; default: 127.0.0.1 (local) or this machine's address (ssh).
    env : dict of str to str or None
        Extra variables for the servers and workers.
    log_dir : str or None
        Write each process's output to ``<log_dir>/<role>-<index>.log`` instead of this terminal.
    workdir : str or None
        The remote working directory for ssh (default: the current directory).

    Returns
    -------
    int
        0 if every worker succeeded, else the exit code of the first process that failed.

    Raises
    ------
    LaunchError
        For a job that cannot be launched (see :func:`plan_processes`).
    LaunchTimeout
        If the job ran past ``timeout``.

    Examples
    --------
    >>> import sys
    >>> launch([sys.executable, '-c', 'pass'], num_workers=0)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    mxfp16...LaunchError: the number of workers must be a whole number >= 1, got 0: pass e.g. -n 2
    """
    num_servers = num_workers if num_servers is None else num_servers
    if timeout is not None and not timeout > 0:
        raise LaunchError(f"timeout must be a positive number of seconds, got {timeout!r}")
    check_job(command, num_workers, num_servers, launcher, hosts)
    root_uri = root_uri or default_root_uri(launcher)
    specs = plan_processes(command, num_workers, num_servers, launcher, hosts, root_uri,
                           free_port(root_uri), env, workdir)
    deadline = time.monotonic() + (timeout if timeout else math.inf)
    running = []
    with _sigterm_as_exit():
        try:
            for spec in specs:
                running.append(_start(spec, log_dir))
            try:
                code = _wait_workers(running, deadline)
            except KeyboardInterrupt:
                log.error("Ctrl-C: passing it to the workers, which save and stop (again to stop "
                          "at once)")
                code = _stop_workers_first(running, signal.SIGINT)
                # horovodrun reports its ranks' 130 as its own failure (1): the ranks' code counts
                return 130 if code is None or launcher == "horovod" else code or 130
            except SystemExit as stop:
                if stop.code != 128 + signal.SIGTERM:
                    raise
                code = _stop_workers_first(running, signal.SIGTERM)
                if code is None or launcher == "horovod":
                    raise SystemExit(stop.code) from None
                raise SystemExit(code or stop.code) from None
            if code == 0:
                _wait_servers(running, deadline)
            return code
        finally:
            _stop(running)
