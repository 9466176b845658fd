"""The plan of a distributed job: which processes run where, with which DMLC variables.

See :mod:`mxfp16.train.launch.launcher` for the job as a whole; this module only computes (the process
list, the environment of each, the ssh command lines) and starts nothing.
"""
import getpass
import math
import os
import re
import shlex
import shutil
import socket
import sys
from dataclasses import dataclass, field

#: The ways to start servers and workers; ``mpi`` through mpirun (:mod:`.mpi`); ``horovod`` starts
#: the workers alone, through horovodrun (or mpirun); ``slurm`` places them with ``srun`` inside a
#: SLURM allocation (:mod:`.slurm`).
LAUNCHERS = ("local", "ssh", "mpi", "horovod", "slurm")

#: What starts the ranks of a Horovod job: horovodrun over Gloo, or mpirun (:mod:`.mpi`).
HOROVOD_CONTROLLERS = ("gloo", "mpi")

#: The address of a local job: nothing listens beyond this machine.
LOCAL_HOST = "127.0.0.1"

#: Variables an ssh launch passes on when they are set here, by prefix: MXNet's, ps-lite's, OpenMP's
#: (GNU and Intel), glibc malloc's (``MALLOC_MMAP_THRESHOLD_`` of long runs) and mxfp16's own.
FORWARDED_PREFIXES = ("MXNET_", "DMLC_", "PS_", "OMP_", "KMP_", "MALLOC_", "MXFP16_")

#: ...and these by name: the library and module paths.
FORWARDED_NAMES = ("LD_LIBRARY_PATH", "PYTHONPATH")

#: Options of every ssh call: no password or host-key prompt (fail instead of hanging), a bound on
#: the connection time.  No ``-t``: the remote output stays plain text (no CRLF, no "Connection
#: to X closed."); the remote agent (:mod:`mxfp16.train.launch.remote_agent`) carries the signals.
SSH_OPTIONS = ("-o", "BatchMode=yes", "-o", "ConnectTimeout=10",
               "-o", "StrictHostKeyChecking=accept-new")

#: The variable that marks every process of one job, on every host (see ``remote_agent sweep``).
JOB_VARIABLE = "MXFP16_JOB_ID"

#: The launch command as the user typed it (``scripts/launch.py ...``), set by scripts/launch.py for
#: every process: the training scripts' "resume with:" line repeats it.
#: What counts as the error line of a failed process's log: ``error: ...`` (mxfp16's scripts, the
#: remote agent), an exception's last line, or a missing file or program.
ERROR_LINE = re.compile(r"^(error:|[\w.]*(Error|Exception)\b)|No such file|not found|denied")

#: horovodrun's account of the first process that failed, whose status is the job's (horovodrun
#: itself exits 1 whatever the status).
HOROVOD_FIRST_FAILURE = re.compile(r"The first process to do so was:\s*Process name: (\d+)\s*"
                                   r"Exit code: (\d+)")

LAUNCH_COMMAND_VARIABLE = "MXFP16_LAUNCH_COMMAND"

#: Seconds a remote agent gives its process between SIGTERM and SIGKILL once the launcher is gone.
AGENT_GRACE = 25.0

class LaunchError(ValueError):
    """A job that cannot be launched as asked (bad counts, command, hostfile or launcher)."""


class LaunchTimeout(RuntimeError):
    """The job ran longer than its ``timeout``; every process was stopped."""


@dataclass(frozen=True)
class ProcessSpec:
    """One process of a job: its role, launch index, host, command line and added environment.

    For a remote process ``argv`` is the local ssh call, ``env`` is empty (the variables are
    exported inside the remote command), ``remote`` is the :class:`mxfp16.train.launch.hosts.Host` and
    ``command`` the command it runs there; otherwise ``env`` is added to this environment.  A
    process that starts others (horovodrun, mpirun) has an ``account``: ``account(output, code)`` is
    ``(message, exit code)`` of the first of its processes that failed, or None; ``stop_signals``
    maps a stop signal for its workers to the one it is sent instead (mpirun's, :mod:`.mpi`).
    """
    role: str
    index: int
    host: str
    argv: tuple
    env: dict = field(default_factory=dict)
    remote: object = None
    command: tuple = ()
    account: object = None
    stop_signals: dict = None

    @property
    def name(self):
        """``'worker 0'``, ``'server 1'``, ``'scheduler 0'``."""
        return f"{self.role} {self.index}"

    @property
    def shown(self):
        """The command line to show: the remote command of an ssh process, else ``argv``."""
        return shlex.join(self.command or self.argv)


def dmlc_env(role, num_workers, num_servers, root_uri, root_port, node_host=None, task_id=None):
    """The DMLC variables that make a process a scheduler, server or worker of one job.

    Parameters
    ----------
    role : {'scheduler', 'server', 'worker'}
    num_workers, num_servers : int
    root_uri : str
        The scheduler's address.
    root_port : int
        The scheduler's port.
    node_host : str or None
        The address this server or worker listens on (``DMLC_NODE_HOST``).
    task_id : int or None
        The launch index (``DMLC_TASK_ID``).

    Returns
    -------
    dict of str to str

    Raises
    ------
    LaunchError
        For an unknown role.

    Examples
    --------
    >>> env = dmlc_env('worker', 2, 1, '127.0.0.1', 9091, node_host='127.0.0.1', task_id=0)
    >>> env['DMLC_ROLE'], env['DMLC_PS_ROOT_PORT'], env['DMLC_NUM_WORKER'], env['DMLC_TASK_ID']
    ('worker', '9091', '2', '0')
    """
    if role not in ("scheduler", "server", "worker"):
        raise LaunchError(f"unknown role {role!r}: use 'scheduler', 'server' or 'worker'")
    env = {"DMLC_ROLE": role, "DMLC_PS_ROOT_URI": str(root_uri), "DMLC_PS_ROOT_PORT": str(root_port),
           "DMLC_NUM_WORKER": str(num_workers), "DMLC_NUM_SERVER": str(num_servers)}
    if node_host is not None:
        env["DMLC_NODE_HOST"] = str(node_host)
    if task_id is not None:
        env["DMLC_TASK_ID"] = str(task_id)
    return env


def free_port(host=LOCAL_HOST):
    """A TCP port that is free on ``host`` (an address of this machine) at the time of the call.

    Examples
    --------
    >>> 0 < free_port() < 65536
    True
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def forwarded_env(environ=None):
    """The variables of ``environ`` (default: this one) that remote processes get by default:
    :data:`FORWARDED_PREFIXES` and :data:`FORWARDED_NAMES`.

    Examples
    --------
    >>> forwarded_env({'OMP_NUM_THREADS': '4', 'MALLOC_ARENA_MAX': '2', 'HOME': '/root'})
    {'OMP_NUM_THREADS': '4', 'MALLOC_ARENA_MAX': '2'}
    """
    environ = os.environ if environ is None else environ
    return {name: value for name, value in environ.items()
            if name.startswith(FORWARDED_PREFIXES) or name in FORWARDED_NAMES}


def agent_source():
    """The text of :mod:`mxfp16.train.launch.remote_agent`, which remote hosts run with ``python -c``."""
    with open(os.path.join(os.path.dirname(__file__), "remote_agent.py")) as source:
        return source.read()


def ssh_argv(host, remote_command):
    """The local ssh call that runs the shell command line ``remote_command`` on ``host``.

    Examples
    --------
    >>> from mxfp16.train.launch.hosts import parse_host
    >>> ssh_argv(parse_host('admin@node2:2222'), 'true')[-4:]
    ['-p', '2222', 'admin@node2', 'true']
    """
    port = ["-p", str(host.port)] if host.port else []
    return ["ssh", *SSH_OPTIONS, *port, host.target, remote_command]


def remote_shell_command(command, env, workdir, agent=None):
    """The shell command line that runs ``command`` in ``workdir`` with ``env`` exported, under the
    remote agent when ``agent`` (``[python, '-c', source, 'run', grace, mode, '--']``) is given.

    Examples
    --------
    >>> remote_shell_command(['python', 'train.py', '--lr', '0.1'], {'DMLC_ROLE': 'worker'},
    ...                      '/data/run 1')
    "cd '/data/run 1' && export DMLC_ROLE=worker && exec python train.py --lr 0.1"
    """
    exports = " ".join(f"{name}={shlex.quote(str(value))}" for name, value in env.items())
    remote = f"cd {shlex.quote(workdir)} && "
    if exports:
        remote += f"export {exports} && "
    return remote + "exec " + shlex.join([str(arg) for arg in [*(agent or []), *command]])


def remote_python(command):
    """The command with a bare ``python``/``python3...`` replaced by this interpreter's absolute
    path: a remote login shell has no virtualenv on its PATH.  A path (``/opt/venv/bin/python``)
    or another program is kept.

    Examples
    --------
    >>> remote_python(['python', 'train.py'])[0] == sys.executable
    True
    >>> remote_python(['/opt/venv/bin/python3', 'train.py'])[0]
    '/opt/venv/bin/python3'
    """
    command = [str(arg) for arg in command]
    if command and "/" not in command[0] and command[0].startswith("python"):
        return [sys.executable, *command[1:]]
    return command


def server_python(command):
    """The interpreter for servers and the scheduler: the command's own if it is a Python.

    Examples
    --------
    >>> server_python(['/opt/venv/bin/python3', 'train.py'])
    '/opt/venv/bin/python3'
    """
    first = os.path.basename(str(command[0])) if command else ""
    return command[0] if first.startswith("python") else sys.executable


def _check_count(name, value, flag):
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise LaunchError(f"{name} must be a whole number >= 1, got {value!r}: pass e.g. {flag} 2")


def check_job(command, num_workers, num_servers, launcher, hosts):
    if not command or not all(str(arg) for arg in command):
        raise LaunchError(f"no command to run (got {list(command or [])!r}): give one after "
                          "'--', e.g. -- python train.py --kv-store dist_sync")
    _check_count("the number of workers", num_workers, "-n")
    _check_count("the number of servers", num_servers, "-s")
    if launcher not in LAUNCHERS:
        raise LaunchError(f"unknown launcher {launcher!r}: use one of {', '.join(LAUNCHERS)}")
    if launcher == "ssh" and not hosts:
        raise LaunchError("the ssh launcher needs hosts: pass -H with a file listing one host "
                          "per line, or --launcher local")
    if launcher == "slurm" and hosts:
        raise LaunchError("the slurm launcher runs on the nodes of its SLURM allocation "
                          "(SLURM_JOB_NODELIST): leave -H out, or pass --launcher ssh")
    if launcher not in ("horovod", "slurm") and asks_for_horovod(command):
        raise LaunchError(f"the command trains with --kv-store horovod, which the {launcher} "
                          "launcher's scheduler and servers do not serve: pass --launcher horovod "
                          "(or --kv-store dist_sync for the parameter server)")


def asks_for_horovod(command):
    """Whether a command line passes ``--kv-store horovod`` (or ``--kv-store=horovod``)."""
    args = [str(arg) for arg in command]
    return "--kv-store=horovod" in args or any(
        flag == "--kv-store" and value == "horovod" for flag, value in zip(args, args[1:]))



def plan_processes(command, num_workers, num_servers, launcher="local", hosts=None,
                   root_uri=LOCAL_HOST, root_port=9091, env=None, workdir=None, job_id=None):
    """Every process of a job: the scheduler, the servers and the workers, in start order.

    Parameters
    ----------
    command : sequence of str
        The workers' command line.
    num_workers, num_servers : int
    launcher : {'local', 'ssh', 'horovod'}
        ``horovod``: one process, horovodrun, which starts the workers (:func:`horovodrun_argv`).
    hosts : list of mxfp16.train.launch.hosts.Host or None
        The machines, their addresses resolved (ssh, horovod).
    root_uri : str
        The scheduler's address, on this machine.
    root_port : int
        The scheduler's port.
    env : dict of str to str or None
        Extra variables for the servers and workers.
    workdir : str or None
        The remote working directory (ssh; default: the current directory).
    job_id : str or None
        Exported as :data:`JOB_VARIABLE` to every process, which marks them on every host.

    Returns
    -------
    list of ProcessSpec

    Raises
    ------
    LaunchError
        For an empty command, counts below 1, an unknown launcher or ssh without hosts.

    Examples
    --------
    >>> specs = plan_processes(['python', 'train.py'], num_workers=2, num_servers=1)
    >>> [spec.name for spec in specs]
    ['scheduler 0', 'server 0', 'worker 0', 'worker 1']
    >>> specs[3].argv, specs[3].env['DMLC_ROLE'], specs[3].env['DMLC_NODE_HOST']
    (('python', 'train.py'), 'worker', '127.0.0.1')
    """
    command = [str(arg) for arg in (command or [])]
    check_job(command, num_workers, num_servers, launcher, hosts)
    extra = dict(env or {}, **({JOB_VARIABLE: job_id} if job_id else {}))
    if launcher == "horovod":  # horovodrun starts and numbers the workers; no servers
        argv = horovodrun_argv(command, num_workers, hosts)
        shown = argv[:-1] + [shlex.join(command)]  # the command without the agent's source
        return [ProcessSpec("horovodrun", 0, LOCAL_HOST, tuple(argv), extra, command=tuple(shown),
                            account=horovod_account)]
    job = dict(num_workers=num_workers, num_servers=num_servers, root_uri=root_uri,
               root_port=root_port)
    python = server_python(remote_python(command) if launcher == "ssh" else command)
    specs = [ProcessSpec("scheduler", 0, root_uri, (python, "-c", "import mxnet"),
                         dict(extra, **dmlc_env("scheduler", **job)))]
    roles = [("server", num_servers, [python, "-c", "import mxnet"], num_workers),
             ("worker", num_workers, command, 0)]
    for role, count, argv, first_task in roles:
        for index in range(count):  # round-robin over the hosts
            host = hosts[index % len(hosts)] if launcher == "ssh" else None
            variables = dict(extra, **dmlc_env(role, node_host=host.address if host else LOCAL_HOST,
                                               task_id=first_task + index, **job))
            specs.append(_remote_spec(role, index, host, argv, variables, workdir) if host else
                         ProcessSpec(role, index, LOCAL_HOST, tuple(argv), variables))
    return specs


def _remote_spec(role, index, host, argv, variables, workdir):
    """An ssh process: the agent runs ``argv`` on ``host`` with the forwarded variables and
    ``variables``, reading its control words from the launcher through ssh's stdin."""
    command = remote_python(argv)
    agent = [server_python(command), "-c", agent_source(), "run", str(AGENT_GRACE), "stdin", "--"]
    # Unbuffered: the remote output reaches the log files through ssh as it is written.
    exports = dict({"PYTHONUNBUFFERED": "1"}, **forwarded_env(), **variables)
    remote = remote_shell_command(command, exports, workdir or os.getcwd(), agent)
    return ProcessSpec(role, index, host.address, tuple(ssh_argv(host, remote)), remote=host,
                       command=tuple(command))


def horovodrun_argv(command, num_workers, hosts=None):
    """The horovodrun call that runs ``command`` as ``num_workers`` Horovod processes over Gloo.

    On this machine (``-H localhost:N``), or spread evenly over ``hosts`` (``-H address:slots,...``
    and ``-p`` with their ssh port; horovodrun reaches them with ssh, and each process runs under
    the remote agent, which stops it when its ssh connection closes).  The command is handed over
    as one ``sh -c 'exec ...'`` argument: horovodrun's own parser reads options anywhere in its
    command line and fails on an abbreviation of its options, and the examples' ``--network``
    abbreviates both ``--network-interface`` and ``--network-interfaces``.

    Raises
    ------
    LaunchError
        When horovodrun is not installed, or the hosts have different ssh ports.

    Examples
    --------
    >>> horovodrun_argv(['python', 'train.py', '--network', 'resnet'], 2)[1:]  # doctest: +SKIP
    ['-np', '2', '-H', 'localhost:2', '--gloo', 'sh', '-c', "exec python train.py --network resnet"]
    """
    horovodrun = shutil.which("horovodrun")
    if horovodrun is None:
        from ...distributed.horovod import INSTALL_COMMAND  # imports MXNet: only on this error
        raise LaunchError("horovodrun is not installed (it comes with Horovod, which builds "
                          f"against the installed MXNet): {INSTALL_COMMAND}")
    if not hosts:
        return [horovodrun, "-np", str(num_workers), "-H", f"localhost:{num_workers}", "--gloo",
                "sh", "-c", "exec " + shlex.join(command)]
    port = check_one_ssh_port(hosts, "horovodrun")
    check_ssh_users(hosts, "horovodrun")
    slots = math.ceil(num_workers / len(hosts))
    placement = ",".join(f"{host.address}:{slots}" for host in hosts)
    command = remote_python(command)
    agent = [server_python(command), "-c", agent_source(), "run", str(AGENT_GRACE), "stdout", "--"]
    return [horovodrun, "-np", str(num_workers), "-H", placement, "-p", str(port), "--gloo",
            "sh", "-c", "exec " + shlex.join(agent + command)]


def check_one_ssh_port(hosts, tool):
    """The ssh port of every host, for a ``tool`` (horovodrun, mpirun) that takes only one.

    Raises
    ------
    LaunchError
        When the hosts have different ports.
    """
    ports = sorted({host.port or 22 for host in hosts})
    if len(ports) > 1:
        raise LaunchError(f"{tool} takes one ssh port for every host, the hostfile has "
                          f"{', '.join(map(str, ports))}: use one port, or set Port per host in "
                          "~/.ssh/config")
    return ports[0]


def check_ssh_users(hosts, tool):
    """``tool``'s hosts take no user (horovodrun's ``-H``, mpirun's ``-host``): ``user@host``
    entries must name the user ssh logs in as anyway (this one); another user belongs in
    ~/.ssh/config."""
    me = getpass.getuser()
    for host in hosts:
        if host.user and host.user != me:
            raise LaunchError(f"{tool} cannot log in to {host} as {host.user} (its hosts take no "
                              f"user; ssh logs in as {me}): add 'Host {host.address}' with "
                              f"'User {host.user}' to ~/.ssh/config and write {host.name} in the "
                              "hostfile")


def horovod_account(text, code=None):
    """``(message, exit code)`` of the first Horovod process that failed, from horovodrun's output
    ``text`` (:data:`HOROVOD_FIRST_FAILURE`), or None; horovodrun's own exit ``code`` (1) is not
    the job's.

    Examples
    --------
    >>> horovod_account('The first process to do so was:\\n Process name: 1\\n Exit code: 3', 1)
    ('Horovod process 1 failed first, with exit code 3: stopping the job', 3)
    """
    found = HOROVOD_FIRST_FAILURE.search(text)
    if found is None:
        return None
    rank, code = int(found.group(1)), int(found.group(2))
    return f"Horovod process {rank} failed first, with exit code {code}: stopping the job", code
