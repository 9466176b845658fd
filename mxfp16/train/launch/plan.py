"""The plan of a distributed job: which processes run where, with which DMLC variables.

See :mod:`mxfp16.train.launch.launcher` for the job as a whole; this module only computes (the process
list, the environment of each, the ssh command lines) and starts nothing.
"""
import math
import os
import shlex
import shutil
import socket
import sys
from dataclasses import dataclass, field

#: The ways to start servers and workers; ``horovod`` starts the workers alone, through horovodrun.
LAUNCHERS = ("local", "ssh", "horovod")

#: The address of a local job: nothing listens beyond this machine.
LOCAL_HOST = "127.0.0.1"

#: Variables an ssh launch passes on when they are set here, as dmlc's ssh launcher does:
#: thread count, library paths, the network interface ps-lite should use, ps-lite's log level.
FORWARDED_ENV = ("OMP_NUM_THREADS", "MXNET_CPU_WORKER_NTHREADS", "LD_LIBRARY_PATH", "PYTHONPATH",
                 "DMLC_INTERFACE", "PS_VERBOSE")

#: Options of every ssh call: no host-key prompt, no password prompt (fail instead of hanging),
#: and a remote terminal, so the remote command is hung up when the local ssh client stops.
SSH_OPTIONS = ("-tt", "-o", "StrictHostKeyChecking=no", "-o", "BatchMode=yes")


class LaunchError(ValueError):
    """A job that cannot be launched as asked (bad counts, command, hostfile or launcher)."""


class LaunchTimeout(RuntimeError):
    """The job ran longer than its ``timeout``; every process was stopped."""


@dataclass(frozen=True)
class ProcessSpec:
    """One process of a job: its role, launch index, host, command line and added environment.

    For an ssh process ``argv`` is the local ssh call and ``env`` is empty (the variables are
    exported inside the remote command); otherwise ``env`` is added to this environment.
    """
    role: str
    index: int
    host: str
    argv: tuple
    env: dict = field(default_factory=dict)

    @property
    def name(self):
        """``'worker 0'``, ``'server 1'``, ``'scheduler 0'``."""
        return f"{self.role} {self.index}"


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


def read_hostfile(path):
    """The hosts of a hostfile: one ``host`` or ``host:ssh_port`` per line.

    Blank lines and ``#`` comments are skipped.

    Returns
    -------
    list of str

    Raises
    ------
    LaunchError
        If the file cannot be read or names no host.

    Examples
    --------
    >>> import os, tempfile
    >>> with tempfile.NamedTemporaryFile('w', suffix='.txt', delete=False) as hostfile:
    ...     _ = hostfile.write('node1\\n# spare: node3\\n\\nnode2:2222\\n')
    >>> read_hostfile(hostfile.name)
    ['node1', 'node2:2222']
    >>> os.remove(hostfile.name)
    """
    try:
        with open(path) as lines:
            hosts = [line.split("#", 1)[0].strip() for line in lines]
    except OSError as error:
        raise LaunchError(f"cannot read hostfile {path!r} ({error.strerror}): pass -H with a "
                          "file listing one host (or host:ssh_port) per line") from None
    hosts = [host for host in hosts if host]
    if not hosts:
        raise LaunchError(f"hostfile {path!r} names no host: list one host (or host:ssh_port) "
                          "per line")
    return hosts


def split_host(entry):
    """``'node1:2222'`` -> ``('node1', 2222)``; without a port, ssh's default 22.

    Examples
    --------
    >>> split_host('node1:2222'), split_host('10.0.0.5')
    (('node1', 2222), ('10.0.0.5', 22))
    """
    host, _, port = str(entry).strip().partition(":")
    if not host or (port and not port.isdigit()):
        raise LaunchError(f"bad host entry {entry!r}: write 'host' or 'host:ssh_port', "
                          "e.g. node1:22")
    return host, int(port or 22)


def ssh_command(host, command, env, workdir, port=22):
    """The local ssh call that runs ``command`` on ``host`` in ``workdir`` with ``env`` exported.

    Parameters
    ----------
    host : str
    command : sequence of str
        The remote command line, one argument per item (quoted for the remote shell here).
    env : dict of str to str
        Variables exported before the command.
    workdir : str
        The remote working directory.
    port : int
        The ssh port.

    Returns
    -------
    list of str

    Examples
    --------
    >>> ssh_command('node1', ['python', 'train.py', '--lr', '0.1'], {'DMLC_ROLE': 'worker'},
    ...             '/data/run 1', port=2222)[-3:]
    ['2222', 'node1', "cd '/data/run 1' && export DMLC_ROLE=worker && exec python train.py --lr 0.1"]
    """
    exports = " ".join(f"{name}={shlex.quote(str(value))}" for name, value in env.items())
    remote = f"cd {shlex.quote(workdir)} && "
    if exports:
        remote += f"export {exports} && "
    remote += "exec " + " ".join(shlex.quote(str(arg)) for arg in command)
    return ["ssh", *SSH_OPTIONS, "-p", str(port), host, remote]


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
    if launcher != "horovod" and _asks_for_horovod(command):
        raise LaunchError(f"the command trains with --kv-store horovod, which the {launcher} "
                          "launcher's scheduler and servers do not serve: pass --launcher horovod "
                          "(or --kv-store dist_sync for the parameter server)")


def _asks_for_horovod(command):
    """Whether a command line passes ``--kv-store horovod`` (or ``--kv-store=horovod``)."""
    args = [str(arg) for arg in command]
    return "--kv-store=horovod" in args or any(
        flag == "--kv-store" and value == "horovod" for flag, value in zip(args, args[1:]))


def plan_processes(command, num_workers, num_servers, launcher="local", hosts=None,
                   root_uri=LOCAL_HOST, root_port=9091, env=None, workdir=None):
    """Every process of a job: the scheduler, the servers and the workers, in start order.

    Parameters
    ----------
    command : sequence of str
        The workers' command line.
    num_workers, num_servers : int
    launcher : {'local', 'ssh', 'horovod'}
        ``horovod``: one process, horovodrun, which starts the workers (:func:`horovodrun_argv`).
    hosts : list of str or None
        ``host``, ``host:ssh_port`` or ``user@host[:ssh_port]`` entries (ssh, horovod).
    root_uri : str
        The scheduler's address, on this machine.
    root_port : int
        The scheduler's port.
    env : dict of str to str or None
        Extra variables for the servers and workers.
    workdir : str or None
        The remote working directory (ssh; default: the current directory).

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
    if launcher == "horovod":  # horovodrun starts and numbers the workers; no servers
        return [ProcessSpec("horovodrun", 0, LOCAL_HOST,
                            tuple(horovodrun_argv(command, num_workers, hosts)), dict(env or {}))]
    python = server_python(command)
    common = dict(num_workers=num_workers, num_servers=num_servers, root_uri=root_uri,
                  root_port=root_port)
    specs = [ProcessSpec("scheduler", 0, root_uri, (python, "-c", "import mxnet"),
                         dict(env or {}, **dmlc_env("scheduler", **common)))]
    roles = [("server", num_servers, [python, "-c", "import mxnet"], num_workers),
             ("worker", num_workers, command, 0)]
    placement = hosts if launcher == "ssh" else [LOCAL_HOST]
    for role, count, argv, first_task in roles:
        for index in range(count):  # round-robin over the hosts
            host, ssh_port = split_host(placement[index % len(placement)])
            address = host.rpartition("@")[2]  # 'user@node1' listens on node1
            variables = dict(env or {}, **dmlc_env(role, node_host=address,
                                                   task_id=first_task + index, **common))
            if launcher == "ssh":
                forwarded = {name: os.environ[name] for name in FORWARDED_ENV if name in os.environ}
                remote = ssh_command(host, argv, dict(forwarded, **variables),
                                     workdir or os.getcwd(), port=ssh_port)
                specs.append(ProcessSpec(role, index, address, tuple(remote)))
            else:
                specs.append(ProcessSpec(role, index, host, tuple(argv), variables))
    return specs


def horovodrun_argv(command, num_workers, hosts=None):
    """The horovodrun call that runs ``command`` as ``num_workers`` Horovod processes over Gloo.

    On this machine (``-H localhost:N``), or spread evenly over ``hosts`` (``-H host:slots,...``;
    horovodrun reaches them with ssh).  The command is handed over as one ``sh -c 'exec ...'``
    argument: horovodrun's own parser reads options anywhere in its command line and fails on an
    abbreviation of its options, and the examples' ``--network`` abbreviates both
    ``--network-interface`` and ``--network-interfaces``.

    Raises
    ------
    LaunchError
        When horovodrun is not installed.

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
    if hosts:
        slots = math.ceil(num_workers / len(hosts))
        placement = ",".join(f"{split_host(host)[0]}:{slots}" for host in hosts)
    else:
        placement = f"localhost:{num_workers}"
    return [horovodrun, "-np", str(num_workers), "-H", placement, "--gloo",
            "sh", "-c", "exec " + shlex.join(command)]


def default_root_uri(launcher):
    """The scheduler's address: 127.0.0.1 for a local job, this machine's address for ssh.

    Raises
    ------
    LaunchError
        If the host name of this machine resolves to a loopback address (ssh only).

    Examples
    --------
    >>> default_root_uri('local')
    '127.0.0.1'
    """
    if launcher != "ssh":
        return LOCAL_HOST
    address = socket.gethostbyname(socket.gethostname())
    if address.startswith("127."):
        raise LaunchError(f"this machine's name resolves to {address}, which other machines "
                          "cannot reach: pass --host-ip with its network address")
    return address
