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

**ssh launcher.**  The hostfile lists one machine per line, ``host``, ``user@host`` or
``host:ssh_port`` (see :mod:`.hosts`).  Before anything starts, the names are resolved here (ps-lite
binds to ``DMLC_NODE_HOST``, which must be an address; a name that resolves to loopback in a job of
several machines is an error) and every host is logged in to with ``ssh -o BatchMode=yes -o
ConnectTimeout=10``: an unreachable host, one that asks for a password, or one without the
interpreter is one error line each.  Worker ``i`` runs on host ``i % len(hosts)`` and server ``j``
on host ``j % len(hosts)``, each through ``ssh HOST 'cd DIR && export ... && exec PYTHON -c AGENT
run ... -- COMMAND'``: ``DIR`` is the current directory (the code, the Python and the data must be
at the same path on every machine, e.g. a shared file system), a bare ``python`` in the command
becomes this interpreter's absolute path, and the exports are the variables below,
``DMLC_NODE_HOST=<address>``, those of :data:`.plan.FORWARDED_PREFIXES` and
:data:`.plan.FORWARDED_NAMES` set here, and those passed with ``env``.  The agent
(:mod:`.remote_agent`) runs the command in a process group of its own, signals that group on the
launcher's word (sent through ssh's stdin), stops it when the launcher or the connection is gone,
and exits with the command's status (128 + N for a signal N, where ssh alone would say 255).  The
scheduler's default address is this machine's address on the route to the other hosts (pass
``--host-ip`` otherwise); every machine must reach it and every other machine on the ports ps-lite
picks.  Once the job has ended, each host is swept over ssh: any process of the job still there
(marked by :data:`.plan.JOB_VARIABLE` in its environment) is killed and logged.

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

**mpi launcher.**  MXNet's ``--launcher mpi``: the scheduler here, the servers and the workers
started by mpirun (one each) over the hostfile's hosts or on this machine, with the same variables;
mpirun's ranks run under the remote agent's ``mpi`` mode, and the stop signals reach them as
SIGUSR1/SIGUSR2, which mpirun passes on (see :mod:`.mpi`, also for ``horovod_controller='mpi'``).

**SLURM launcher.**  Inside an allocation (``sbatch``, ``salloc``), every process is a job step of
its own on the allocation's nodes, under the same agent; a ``--kv-store horovod`` command gets
Horovod's ranks and rendezvous server instead of servers; after a stop by a signal, the job may
requeue itself (see :mod:`.slurm`).

**Supervision.**  The launcher logs which process runs where (with its local pid) and waits for the
workers.  Once all have exited with 0, it gives the servers and scheduler
:data:`SERVER_EXIT_GRACE` seconds to exit and returns 0.  The first worker (or server, or scheduler) to fail
decides the exit code (a signal N counts as 128 + N), and every other process is stopped: SIGTERM
to its process group (each process runs in a session of its own; a remote one through its
agent), SIGKILL after :data:`.processes.KILL_GRACE` seconds.  With ``log_dir``, the first error line of a
failed process's log is shown with the failure.  The same happens after ``timeout`` seconds
(:class:`LaunchTimeout`).

**Preemption.**  SIGTERM to the launcher (a scheduler's notice) or Ctrl-C is passed to the workers
first, and the servers and scheduler keep running while the workers stop: mxfp16's training
scripts then agree on a step, rank 0 saves it, and the workers exit with 143 (130 for Ctrl-C), which
the launcher returns once all have (at most :data:`WORKER_STOP_GRACE` seconds, then everything is
killed).  A worker that exits by a stop signal of its own (128 + N: a scheduler signals every
process of a job) means the same: the other workers get that time to save, instead of being stopped
as after a failure.  Resume with the same launch command plus ``--resume PREFIX`` (or pass
``--resume auto`` from the start).  Should the launcher itself
be killed (SIGKILL), its children here get SIGTERM from the kernel and the remote agents stop
their processes when their ssh stdin ends.  A second Ctrl-C stops
everything at once.
"""
import functools
import logging
import math
import signal
import threading
import time
import uuid
from contextlib import contextmanager

from . import slurm, slurm_horovod
from .hosts import is_this_machine, prepare_hosts, route_address, sweep_hosts
from .mpi import job_hosts, plan_job, uses_mpirun
from .plan import (ERROR_LINE, JOB_VARIABLE, LOCAL_HOST, LaunchError, LaunchTimeout,
                   asks_for_horovod, check_job, free_port, remote_python, server_python)
from .processes import (POLL_INTERVAL, STOP_CODES, exit_code, returncode, signal_groups, start,
                        stop)

log = logging.getLogger(__name__)

#: Seconds the servers and the scheduler get to exit after the last worker succeeded.
SERVER_EXIT_GRACE = 15.0

#: Seconds the workers have to save and exit after SIGTERM or Ctrl-C reached the launcher, within
#: the grace periods of spot instances and Kubernetes (30 s and more).
WORKER_STOP_GRACE = 25.0

#: Processes whose success is the job's: the workers, or horovodrun or mpirun, which run them.
WORKER_ROLES = ("worker", "horovodrun", "mpirun")

#: Signals to the launcher that it passes to the workers, which save and stop (Ctrl-C is
#: KeyboardInterrupt's): a scheduler's notice, a closed terminal, SLURM's --signal warnings.
EXIT_SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)

#: ...passed on as these (the agents' control words have no HUP; the scripts treat both alike).
PASSED_AS = {signal.SIGHUP: signal.SIGTERM}


def _first_failure(running):
    """(process, exit code) of a process that exited with an error, or None."""
    for proc in running:
        code = returncode(proc)
        if code:
            return proc, exit_code(code)
    return None


def first_error_line(path):
    """The first line of the log at ``path`` that says what went wrong (:data:`ERROR_LINE`), or
    None.

    Examples
    --------
    >>> import tempfile
    >>> with tempfile.NamedTemporaryFile('w', suffix='.log', delete=False) as log_file:
    ...     _ = log_file.write('Traceback (most recent call last):\\n  File "<string>", line 1\\n'
    ...                        "ModuleNotFoundError: No module named 'mxnet'\\n")
    >>> first_error_line(log_file.name)
    "ModuleNotFoundError: No module named 'mxnet'"
    """
    try:
        with open(path, errors="replace") as lines:
            return next((line.strip() for line in lines if ERROR_LINE.search(line.strip())), None)
    except OSError:
        return None


def _output(proc):
    """The output of ``proc`` (its log, or the last 8 kB relayed), once it has exited."""
    for relay in proc.relays:
        relay.join(timeout=5)
    if not proc.log_file:
        return bytes(proc.tail).decode(errors="replace")
    proc.log_file.flush()
    with open(proc.log_file.name, errors="replace") as log_text:
        return log_text.read()


def _report_failure(proc, code):
    """Log the failure of ``proc`` and the first error line of its log; the job's exit code (that
    of the first of its own processes that failed, for horovodrun and mpirun)."""
    account = proc.spec.account(_output(proc), code) if proc.spec.account else None
    if account:
        log.error(account[0])
        return account[1]
    where = f" on {proc.spec.host}" if proc.spec.remote else ""
    why = " (ssh's code: the connection failed or was lost)" if proc.spec.remote and code == 255 \
        else ""
    log.error("%s%s failed with exit code %d%s: stopping the job", proc.spec.name, where, code, why)
    line = first_error_line(proc.log_file.name) if proc.log_file else None
    if line:
        log.error("%s's log %s: %s", proc.spec.name, proc.log_file.name, line)
    return code


class _WorkerStopped(Exception):
    """A worker exited by a stop signal it got itself (a scheduler signals every process)."""

    def __init__(self, proc, code):
        super().__init__(proc.spec.name)
        self.proc, self.code = proc, code


def _wait_workers(running, deadline):
    """Exit code of the job once every worker has exited, or at the first failure; a worker that
    exits by a stop signal (128 + N) raises :class:`_WorkerStopped`."""
    workers = [proc for proc in running if proc.spec.role in WORKER_ROLES]
    while True:
        failure = _first_failure(running)
        # A stop signal of its own (a scheduler signals every process): the job is stopping, and
        # the other workers get the time to save instead of being stopped as after a failure.
        if failure and failure[0].spec.role == "worker" and failure[1] in STOP_CODES:
            raise _WorkerStopped(*failure)
        if failure:
            return _report_failure(*failure)
        if all(returncode(proc) == 0 for proc in workers):
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
    while any(returncode(proc) is None for proc in others) and time.monotonic() < limit:
        time.sleep(POLL_INTERVAL)
    for proc in others:
        if returncode(proc) is None:
            log.warning("%s still runs after the workers finished: stopping it", proc.spec.name)


def _stop_workers_first(running, sig, grace=WORKER_STOP_GRACE):
    """Pass ``sig`` to the workers and wait (up to ``grace`` seconds) until they have exited, the
    servers and scheduler still up; the workers' exit code (the first nonzero one), or None."""
    workers = [proc for proc in running if proc.spec.role in WORKER_ROLES]
    signal_groups(workers, sig, stop=True)
    limit = time.monotonic() + grace
    while any(returncode(proc) is None for proc in workers) and time.monotonic() < limit:
        time.sleep(POLL_INTERVAL)
    codes = [returncode(proc) for proc in workers]
    if any(code is None for code in codes):
        log.error("workers still running %g s after %s: stopping the job", grace,
                  signal.Signals(sig).name)
        return None
    return next((exit_code(code) for code in codes if code), 0)


@contextmanager
def _signals_as_exit():
    """Turn SIGTERM (and SIGHUP, SIGUSR1, SIGUSR2: a closed terminal, SLURM's ``--signal``
    warnings) into SystemExit(128 + N) so that the processes are stopped on the way out."""
    if threading.current_thread() is not threading.main_thread():  # signal() works there only
        yield
        return

    def handler(signum, frame):
        log.error("received %s: passing it to the workers, which save and stop",
                  signal.Signals(signum).name)
        raise SystemExit(128 + signum)
    previous = {signum: signal.signal(signum, handler) for signum in EXIT_SIGNALS}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def launch(command, num_workers, num_servers=None, launcher="local", hosts=None, timeout=None,
           root_uri=None, env=None, log_dir=None, workdir=None, horovod_controller="gloo"):
    """Run a ``dist_sync`` job: start scheduler, servers and workers, wait, stop everything.

    Parameters
    ----------
    command : sequence of str
        The workers' command line, e.g. ``['python', 'train.py', '--kv-store', 'dist_sync']``.
    num_workers : int
    num_servers : int or None
        Default: ``num_workers`` (as MXNet's launcher).
    launcher : {'local', 'ssh', 'mpi', 'horovod', 'slurm'}
        ``mpi``: mpirun starts the servers and workers (:mod:`.mpi`).  ``horovod`` runs
        ``horovodrun`` over Gloo instead, which starts the workers (no servers); the script needs
        ``--kv-store horovod``.  ``slurm`` runs every process as an ``srun`` step
        on the nodes of this SLURM allocation, for either kvstore (:mod:`.slurm`).
    hosts : list of str or Host or None
        ``host``, ``user@host`` or ``host:ssh_port`` entries for the ssh launcher (see
        :func:`.hosts.read_hostfile`), or the hosts horovodrun spreads the workers over; resolved
        and logged in to before anything starts.
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
    horovod_controller : {'gloo', 'mpi'}
        What starts a Horovod job's ranks: horovodrun over Gloo, or mpirun (:mod:`.mpi`).

    Returns
    -------
    int
        0 if every worker succeeded, else the exit code of the first process that failed.

    Raises
    ------
    LaunchError
        For a job that cannot be launched (see :func:`.plan.plan_processes`), or hosts that cannot
        be used (one line each, see :func:`.hosts.probe_hosts`).
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
    uses_mpirun(launcher, horovod_controller)  # a bad controller is an error before anything
    check_job(command, num_workers, num_servers, launcher, hosts)
    job = dict(command=command, num_workers=num_workers, num_servers=num_servers, root_uri=root_uri,
               env=env, job_id=uuid.uuid4().hex[:16])
    planned = _slurm_plan(**job) if launcher == "slurm" else \
        _plan(launcher=launcher, hosts=hosts, workdir=workdir, controller=horovod_controller, **job)
    deadline = time.monotonic() + (timeout if timeout else math.inf)
    with planned as (specs, finish), _signals_as_exit():
        running, code = [], None
        try:
            for spec in specs:
                running.append(start(spec, log_dir))
            code = _supervise(running, deadline, launcher)
            return code
        except SystemExit as stopped:
            code = stopped.code
            raise
        finally:
            stop(running)
            finish(code)


@contextmanager
def _plan(command, num_workers, num_servers, launcher, hosts, root_uri, env, workdir, job_id,
          controller):
    """A local, ssh, horovodrun or mpirun job: ``(its processes, what to run after it)``; the
    hosts resolved and probed first."""
    hosts = prepare_hosts(command, launcher, hosts)
    if root_uri is None:
        root_uri = route_address(hosts) if hosts and launcher in ("ssh", "mpi") else LOCAL_HOST
    specs = plan_job(command, num_workers, num_servers, launcher, hosts, root_uri,
                     free_port(root_uri), env, workdir, job_id, controller)
    hosts = job_hosts(hosts) if uses_mpirun(launcher, controller) else hosts  # this one too
    python = server_python(remote_python(command))
    yield specs, lambda code: hosts and sweep_hosts(hosts, python, job_id,
                                                    horovod=launcher in ("horovod", "mpi"))


@contextmanager
def _slurm_plan(command, num_workers, num_servers, root_uri, env, job_id):
    """A job in this SLURM allocation (:mod:`.slurm`): ``(its processes, what to run after it)``,
    Horovod's rendezvous server up while it runs a Horovod job."""
    hosts = slurm.allocation_hosts()
    log.info(slurm.slurm_line())
    env = dict(env or {}, **{JOB_VARIABLE: job_id})
    finish = functools.partial(slurm.finish_job, hosts, server_python(remote_python(command)),
                               job_id, command)
    if asks_for_horovod(command):
        with slurm_horovod.horovod_job(command, num_workers, hosts, env) as specs:
            yield specs, finish
        return
    root_uri = root_uri or hosts[0].address  # the scheduler's step runs on the first node
    # free there when the launcher runs there (sbatch); from an salloc shell elsewhere, free here
    port = free_port(root_uri) if is_this_machine(root_uri) else free_port("0.0.0.0")
    yield slurm.plan_slurm(command, num_workers, num_servers, hosts, root_uri, port, env), finish


def _supervise(running, deadline, launcher):
    """Wait for the job's end, a failure, Ctrl-C or SIGTERM; the job's exit code."""
    try:
        code = _wait_workers(running, deadline)
    except KeyboardInterrupt:
        log.error("Ctrl-C: passing it to the workers, which save and stop (again to stop at once)")
        code = _stop_workers_first(running, signal.SIGINT)
        # horovodrun reports its ranks' 130 as its own failure (1): the ranks' code counts
        return 130 if code is None or launcher == "horovod" else code or 130
    except _WorkerStopped as stopped:
        signum = signal.Signals(stopped.code - 128)
        log.warning("%s stopped on %s (exit code %d): waiting for the other workers to save and "
                    "stop", stopped.proc.spec.name, signum.name, stopped.code)
        code = _stop_workers_first(running, PASSED_AS.get(signum, signum))
        return stopped.code if code is None else code or stopped.code
    except SystemExit as stop:
        if stop.code - 128 not in EXIT_SIGNALS:
            raise
        signum = signal.Signals(stop.code - 128)
        code = _stop_workers_first(running, PASSED_AS.get(signum, signum))
        if code is None or launcher == "horovod":
            raise SystemExit(stop.code) from None
        raise SystemExit(code or stop.code) from None
    if code == 0:
        _wait_servers(running, deadline)
    return code
