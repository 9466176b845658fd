"""Jobs that OpenMPI's ``mpirun`` starts: ``--launcher mpi`` and Horovod over MPI.

``--launcher mpi`` has the meaning of MXNet 1.9's ``tools/launch.py --launcher mpi`` (dmlc-core's
``tracker/dmlc_tracker/mpi.py``): the kvstore job's scheduler runs here, its servers and its workers
are started by ``mpirun`` (one mpirun for the servers, one for the workers) with the DMLC variables.
``--launcher horovod --horovod-controller mpi`` starts Horovod's ranks with the mpirun command that
``horovodrun --mpi`` builds (``-bind-to none -map-by slot -mca pml ob1 -mca btl ^openib``), started
here directly: horovodrun execs it under ``/bin/sh``, which a forwarded signal would end.

**Placement.**  The hosts are those of the hostfile (:mod:`.hosts`; this machine without one).  Each
process is an application context of its own (``-np 1 -host ADDRESS:SLOTS ... : ...``), with its
own ``-x`` variables: the kvstore's processes as the ssh launcher places them (worker ``i`` on host
``i % len(hosts)``, ``DMLC_NODE_HOST`` its address, ``DMLC_TASK_ID`` as the ssh launcher numbers
them), Horovod's ranks in blocks (``ceil(n / len(hosts))`` per host, as horovodrun's ``-H``).  mpirun
reaches the other hosts with ssh (BatchMode, one port for every host: ``-mca plm_rsh_args``) and
starts its daemon, ``orted``, there; every host needs OpenMPI and the same code, Python and data at
the same paths.  As root, mpirun gets ``--allow-run-as-root`` (it refuses to start otherwise).

**Signals.**  Every rank runs under the remote agent's ``mpi`` mode (:mod:`.remote_agent`).  mpirun
ends its whole job on SIGTERM or SIGINT (SIGTERM to every rank, SIGKILL a second later: too soon for
a checkpoint) and passes SIGUSR1 and SIGUSR2 on to the ranks, so the launcher asks the workers to
stop with those (:data:`STOP_SIGNALS`), the agents turn them into SIGTERM and SIGINT, and a rank
that stops as asked exits with 0 for mpirun, which then waits for the others (rank 0 saving).  The
launcher still ends a job by SIGTERM to mpirun (a failure, the timeout), and the sweep over every
host (:data:`.plan.JOB_VARIABLE`) kills what is left.

**Failures.**  mpirun ends the job at a rank's first nonzero status and exits with it (128 + N for
a signal N); :func:`rank_account` turns its report into the process's name, host and first error
line.
"""
import logging
import math
import os
import re
import shlex
import shutil
import signal
import subprocess
from functools import partial

from .hosts import Host, is_this_machine
from .plan import (AGENT_GRACE, ERROR_LINE, HOROVOD_CONTROLLERS, JOB_VARIABLE, LOCAL_HOST,
                   SSH_OPTIONS, LaunchError, ProcessSpec, check_job, check_one_ssh_port, check_ssh_users,
                   dmlc_env, forwarded_env, plan_processes, remote_python, server_python)

log = logging.getLogger(__name__)

#: The signal the launcher sends to mpirun for each stop signal it passes on to the workers: mpirun
#: passes SIGUSR1 and SIGUSR2 on, which the ranks' agents turn into SIGTERM and SIGINT.
STOP_SIGNALS = {signal.SIGTERM: signal.SIGUSR1, signal.SIGINT: signal.SIGUSR2,
                signal.SIGUSR1: signal.SIGUSR1, signal.SIGUSR2: signal.SIGUSR2}

#: horovodrun --mpi's own options for OpenMPI (horovod/runner/mpi_run.py) but ``-bind-to none``,
#: which every job here gets (:func:`mpirun_options`): ranks by slot, TCP rather than openib.
HOROVOD_MPI_OPTIONS = ("-map-by", "slot", "-mca", "pml", "ob1", "-mca", "btl", "^openib")

#: What mpirun says of the first rank that failed: its exit code, or the signal that killed it.
FIRST_EXIT = re.compile(r"Process name: \[\[\d+,\d+\],(\d+)\]\s*Exit code:\s*(\d+)")
FIRST_SIGNAL = re.compile(r"process rank (\d+) with PID \d+ on node \S+ exited on signal (\d+)")

#: ``--tag-output``'s prefix of what a rank wrote: ``[JOB,RANK]<stderr>:``, before each line and
#: before each piece of a line written in several (an unbuffered Python's traceback line).
OUTPUT_TAG = re.compile(r"\[\d+,(\d+)\]<std(?:out|err)>:")

#: The OpenMPI package of Debian and Ubuntu, for the error when mpirun is missing.
INSTALL_HINT = "apt-get install openmpi-bin libopenmpi-dev"


def uses_mpirun(launcher, horovod_controller="gloo"):
    """Whether mpirun starts the job's processes (``--launcher mpi``, Horovod's ``mpi`` controller).

    Raises
    ------
    LaunchError
        For an unknown controller.

    Examples
    --------
    >>> uses_mpirun('mpi'), uses_mpirun('horovod'), uses_mpirun('horovod', 'mpi')
    (True, False, True)
    """
    if horovod_controller not in HOROVOD_CONTROLLERS:
        raise LaunchError(f"unknown Horovod controller {horovod_controller!r}: use one of "
                          f"{', '.join(HOROVOD_CONTROLLERS)}")
    return launcher == "mpi" or launcher == "horovod" and horovod_controller == "mpi"


def plan_job(command, num_workers, num_servers, launcher, hosts, root_uri, root_port, env,
             workdir, job_id, horovod_controller="gloo"):
    """Every process of a job, in start order: :func:`plan_mpi_job` or :func:`plan_horovod_job`
    when mpirun starts them (:func:`uses_mpirun`), else :func:`.plan.plan_processes`."""
    if launcher == "mpi":
        return plan_mpi_job(command, num_workers, num_servers, hosts, root_uri, root_port, env,
                            workdir, job_id)
    if uses_mpirun(launcher, horovod_controller):
        return plan_horovod_job(command, num_workers, hosts, env, workdir, job_id)
    return plan_processes(command, num_workers, num_servers, launcher, hosts, root_uri, root_port,
                          env, workdir, job_id=job_id)


def find_mpirun(why):
    """``'mpirun'``, OpenMPI's on PATH; LaunchError (one line, with the install command) otherwise."""
    if shutil.which("mpirun") is None:
        raise LaunchError(f"mpirun is not installed ({why}): {INSTALL_HINT}, or use --launcher ssh")
    mpirun = "mpirun"  # by name: a path would be taken as OpenMPI's --prefix (/bin/mpirun: "/")
    try:
        version = subprocess.run([mpirun, "--version"], capture_output=True, text=True, timeout=30,
                                 stdin=subprocess.DEVNULL).stdout
    except (OSError, subprocess.TimeoutExpired) as error:
        raise LaunchError(f"mpirun --version failed ({error}): check the MPI install") from None
    if "Open MPI" not in version and "OpenRTE" not in version:
        first = (version.strip().splitlines() or ["no version"])[0]
        raise LaunchError(f"mpirun is not OpenMPI's ({first!r}), whose options (-x, --mca, "
                          f"--tag-output) the launcher passes: install OpenMPI ({INSTALL_HINT}) "
                          "and put its mpirun first on PATH")
    return mpirun


def mpirun_options(mpirun, hosts):
    """mpirun and the options of every job: root, output tags, no binding, the ssh options."""
    argv = [mpirun]
    if os.geteuid() == 0:  # mpirun refuses root without it
        log.info("running as root: mpirun gets --allow-run-as-root, without which it refuses")
        argv.append("--allow-run-as-root")
    argv += ["--tag-output", "-bind-to", "none"]
    remote = [host for host in hosts if not is_this_machine(host.address)]
    if remote:
        port = check_one_ssh_port(remote, "mpirun")
        check_ssh_users(remote, "mpirun")
        argv += ["-mca", "plm_rsh_args", shlex.join([*SSH_OPTIONS, "-p", str(port)])]
    return argv


def rank_argv(command):
    """A rank: the remote agent's ``mpi`` mode around ``command``, a bare python made absolute."""
    command = remote_python(command)
    agent = os.path.join(os.path.dirname(os.path.abspath(__file__)), "remote_agent.py")
    return [server_python(command), "-I", agent, "run", str(AGENT_GRACE), "mpi", "--", *command]


def context_args(host, slots, variables, workdir, argv):
    """One application context of one process: ``-np 1 -host ADDRESS:SLOTS -wdir ... -x ...``.

    Examples
    --------
    >>> context_args(Host('n1', address='10.0.0.1'), 2, {'DMLC_ROLE': 'worker'}, '/run', ['a'])
    ['-np', '1', '-host', '10.0.0.1:2', '-wdir', '/run', '-x', 'DMLC_ROLE=worker', 'a']
    """
    exports = [word for name, value in variables.items() for word in ("-x", f"{name}={value}")]
    return ["-np", "1", "-host", f"{host.address}:{slots}", "-wdir", workdir, *exports, *argv]


def mpirun_spec(role, processes, options, extra, workdir):
    """The one local process, mpirun, that starts ``processes``: ``[(name, host, variables,
    argv)]`` in rank order, each with the forwarded variables and ``extra``."""
    slots = {}
    for _, host, _, _ in processes:
        slots[host.address] = slots.get(host.address, 0) + 1
    argv = list(options)
    for rank, (_, host, variables, command) in enumerate(processes):
        exports = dict({"PYTHONUNBUFFERED": "1"}, **forwarded_env(), **extra, **variables)
        argv += ([":"] if rank else []) + context_args(host, slots[host.address], exports,
                                                       workdir, rank_argv(command))
    ranks = tuple((name, host.address) for name, host, _, _ in processes)
    placement = ",".join(f"{address}:{count}" for address, count in slots.items())
    shown = [options[0], "-np", str(len(processes)), "-host", placement, *processes[0][3]]
    log.info("mpirun places %s", ", ".join(f"{name} on {address}" for name, address in ranks))
    return ProcessSpec(role, 0, LOCAL_HOST, tuple(argv), dict(extra), command=tuple(shown),
                       account=partial(rank_account, ranks), stop_signals=STOP_SIGNALS)


def job_hosts(hosts):
    """The hosts of an mpirun job: the hostfile's (resolved), or this machine."""
    return list(hosts) if hosts else [Host("localhost", address=LOCAL_HOST)]


def plan_mpi_job(command, num_workers, num_servers, hosts=None, root_uri=LOCAL_HOST,
                 root_port=9091, env=None, workdir=None, job_id=None):
    """``--launcher mpi``: the scheduler here, then one mpirun for the servers and one for the
    workers (see the module's notes).

    Parameters
    ----------
    command : sequence of str
        The workers' command line.
    num_workers, num_servers : int
    hosts : list of mxfp16.train.launch.hosts.Host or None
        The machines, their addresses resolved; None: this machine.
    root_uri : str
        The scheduler's address.
    root_port : int
    env : dict of str to str or None
        Extra variables for the servers and workers.
    workdir : str or None
        Their working directory (default: the current directory).
    job_id : str or None
        :data:`.plan.JOB_VARIABLE` of every process.

    Returns
    -------
    list of ProcessSpec
        ``scheduler 0``, ``mpirun-servers 0``, ``mpirun 0`` (the workers).
    """
    command = [str(arg) for arg in command]
    check_job(command, num_workers, num_servers, "mpi", hosts)
    hosts, workdir = job_hosts(hosts), workdir or os.getcwd()
    options = mpirun_options(find_mpirun("--launcher mpi starts the servers and workers with it"),
                             hosts)
    extra = dict(env or {}, **({JOB_VARIABLE: job_id} if job_id else {}))
    job = dict(num_workers=num_workers, num_servers=num_servers, root_uri=root_uri,
               root_port=root_port)
    python = server_python(remote_python(command))
    scheduler = ProcessSpec("scheduler", 0, root_uri, (python, "-c", "import mxnet"),
                            dict(extra, DMLC_JOB_CLUSTER="mpi", **dmlc_env("scheduler", **job)))
    specs = [scheduler]
    for role, count, argv, first_task in (("server", num_servers, [python, "-c", "import mxnet"],
                                           num_workers), ("worker", num_workers, command, 0)):
        processes = []
        for index in range(count):  # round-robin over the hosts, as the ssh launcher
            host = hosts[index % len(hosts)]
            variables = dict(DMLC_JOB_CLUSTER="mpi", **dmlc_env(
                role, node_host=host.address, task_id=first_task + index, **job))
            processes.append((f"{role} {index}", host, variables, list(argv)))
        specs.append(mpirun_spec("mpirun" if role == "worker" else "mpirun-servers", processes,
                                 options, extra, workdir))
    return specs


def plan_horovod_job(command, num_workers, hosts=None, env=None, workdir=None, job_id=None):
    """``--launcher horovod --horovod-controller mpi``: one mpirun of ``num_workers`` Horovod ranks,
    in blocks over the hosts (horovodrun's placement), with horovodrun --mpi's options.

    Returns
    -------
    list of ProcessSpec
        ``[mpirun 0]``.
    """
    command = [str(arg) for arg in command]
    check_job(command, num_workers, 1, "horovod", hosts)
    hosts, workdir = job_hosts(hosts), workdir or os.getcwd()
    mpirun = find_mpirun("--horovod-controller mpi starts the Horovod processes with it")
    options = mpirun_options(mpirun, hosts) + list(HOROVOD_MPI_OPTIONS)
    extra = dict(env or {}, **({JOB_VARIABLE: job_id} if job_id else {}))
    per_host = math.ceil(num_workers / len(hosts))
    processes = [(f"Horovod rank {rank}", hosts[rank // per_host], {}, command)
                 for rank in range(num_workers)]
    return [mpirun_spec("mpirun", processes, options, extra, workdir)]


def rank_account(ranks, text, code=None):
    """``(message, exit code)`` of the first rank that failed, from mpirun's output ``text``, or
    when none did, mpirun's own message with its exit ``code``; ``ranks`` are ``(name,
    address)`` in rank order.

    Examples
    --------
    >>> text = ('[1,1]<stderr>:ModuleNotFoundError: No module named x\\n'
    ...         'The first process to do so was:\\n\\n  Process name: [[417,1],1]\\n  Exit code:    1')
    >>> print(rank_account([('worker 0', '10.0.0.1'), ('worker 1', '10.0.0.2')], text)[0])
    worker 1 on 10.0.0.2 (MPI rank 1) failed first, with exit code 1: stopping the job; its output: \
ModuleNotFoundError: No module named x
    """
    found = FIRST_EXIT.search(text)
    if found:
        code = int(found.group(2))
    else:
        found = FIRST_SIGNAL.search(text)
        code = 128 + int(found.group(2)) if found else code
    if found is None or int(found.group(1)) >= len(ranks):
        return mpirun_message(text, code)
    rank = int(found.group(1))
    name, address = ranks[rank]
    message = f"{name} on {address} (MPI rank {rank}) failed first, with exit code {code}: " \
              "stopping the job"
    said = [line.strip() for line in rank_output(text, rank).splitlines()]
    line = next((line for line in said if ERROR_LINE.search(line)), None)
    return (message + (f"; its output: {line}" if line else "")), code


def rank_output(text, rank):
    """What rank ``rank`` wrote, from mpirun's ``--tag-output`` output ``text``: each tagged piece
    runs to the next tag or the end of its line.

    Examples
    --------
    >>> rank_output('[1,1]<stderr>:ValueError[1,0]<stdout>:up\\n[1,1]<stderr>:: [1,1]<stderr>:x'
    ...             '[1,1]<stderr>:\\nmpirun noticed that process rank 1 ...', 1)
    'ValueError: x\\n'
    """
    pieces = []
    for tag in OUTPUT_TAG.finditer(text):
        if int(tag.group(1)) != rank:
            continue
        following = OUTPUT_TAG.search(text, tag.end())
        newline = text.find("\n", tag.end())
        ends = [len(text)] + ([following.start()] if following else []) + \
            ([newline + 1] if newline >= 0 else [])
        pieces.append(text[tag.end():min(ends)])
    return "".join(pieces)


def mpirun_message(text, code):
    """``(message, code)`` of mpirun failing before any of its processes did (its first words of
    explanation, between its lines of dashes), or None when it said nothing.

    Examples
    --------
    >>> mpirun_message('----\\nmpirun was unable to launch the specified application as it\\n'
    ...                'could not find an executable:\\n\\nExecutable: pyth\\n----\\n', 1)[0]
    'mpirun failed with exit code 1: mpirun was unable to launch the specified application as it'
    """
    said = [line.strip() for line in text.splitlines()
            if line.strip() and not line.startswith("-") and not OUTPUT_TAG.match(line)]
    if not said:
        return None
    return f"mpirun failed with exit code {code}: {said[0]}", code
