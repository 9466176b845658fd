"""The machines of a job: hostfile entries as users write them, their addresses, and the checks
made over ssh before anything starts.

A hostfile lists one machine per line: ``host``, ``user@host``, ``host:ssh_port`` or
``user@host:ssh_port``; blank lines and ``#`` comments are skipped.  ssh reads ``~/.ssh/config``
as usual (``User``, ``Port``, ``IdentityFile`` per host); every call adds ``BatchMode=yes`` (fail
rather than ask for a password), ``ConnectTimeout`` and ``StrictHostKeyChecking=accept-new``.
"""
import logging
import shlex
import socket
import subprocess
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace

from .plan import LaunchError, agent_source, remote_python, server_python, ssh_argv

log = logging.getLogger(__name__)

#: Seconds a host has to answer the probe (ssh login and a Python start).
PROBE_TIMEOUT = 30

@dataclass(frozen=True)
class Host:
    """One machine of a hostfile: its name as written, ssh user and port, and its address."""
    name: str
    user: str = None
    port: int = None
    address: str = None

    @property
    def target(self):
        """What ssh is given: ``user@name`` or ``name``."""
        return f"{self.user}@{self.name}" if self.user else self.name

    def __str__(self):
        return self.target + (f":{self.port}" if self.port else "")


def parse_host(entry):
    """A :class:`Host` from ``host``, ``user@host``, ``host:port`` or ``user@host:port``.

    Examples
    --------
    >>> parse_host('admin@node2:2222')
    Host(name='node2', user='admin', port=2222, address=None)
    >>> parse_host('10.0.0.5').target
    '10.0.0.5'
    """
    user, at, rest = str(entry).strip().rpartition("@")
    name, _, port = rest.partition(":")
    if not name or (port and not port.isdigit()) or "@" in user or (at and not user):
        raise LaunchError(f"bad host entry {entry!r}: write 'host', 'user@host' or "
                          "'host:ssh_port', e.g. admin@node1:22")
    return Host(name, user or None, int(port) if port else None)


def read_hostfile(path):
    """The hosts of a hostfile (see the module's docstring), as :class:`Host` entries.

    Raises
    ------
    LaunchError
        If the file cannot be read, names no host or has a bad entry.

    Examples
    --------
    >>> import os, tempfile
    >>> with tempfile.NamedTemporaryFile('w', suffix='.txt', delete=False) as hostfile:
    ...     _ = hostfile.write('node1\\n# spare: node3\\n\\nroot@node2:2222\\n')
    >>> [str(host) for host in read_hostfile(hostfile.name)]
    ['node1', 'root@node2:2222']
    >>> os.remove(hostfile.name)
    """
    try:
        with open(path) as lines:
            entries = [line.split("#", 1)[0].strip() for line in lines]
    except OSError as error:
        raise LaunchError(f"cannot read hostfile {path!r} ({error.strerror}): pass -H with a "
                          "file listing one host (or user@host:ssh_port) per line") from None
    hosts = [parse_host(entry) for entry in entries if entry]
    if not hosts:
        raise LaunchError(f"hostfile {path!r} names no host: list one host (or "
                          "user@host:ssh_port) per line")
    return hosts


def resolve_hosts(hosts):
    """The hosts with their IPv4 addresses, resolved here before anything starts.

    ps-lite binds to ``DMLC_NODE_HOST`` and accepts only an address there, so names are resolved
    once, on this machine.

    Raises
    ------
    LaunchError
        For names that do not resolve, or (several machines) a name that resolves to a loopback
        address, which the other machines cannot reach.

    Examples
    --------
    >>> [host.address for host in resolve_hosts([parse_host('root@127.0.0.1:22')])]
    ['127.0.0.1']
    """
    resolved = []
    for host in hosts:
        try:
            address = socket.getaddrinfo(host.name, None, socket.AF_INET)[0][4][0]
        except OSError as error:
            raise LaunchError(f"host {host.name!r} of the hostfile does not resolve ({error}): "
                              "fix the name, or write its address") from None
        resolved.append(replace(host, address=address))
    if len({host.address for host in resolved}) > 1:
        for host in resolved:
            if host.address.startswith("127."):
                raise LaunchError(
                    f"host {host.name!r} resolves to the loopback address {host.address} in a job "
                    "of several machines, which the other machines cannot reach: write its "
                    "network address in the hostfile, or map the name to it in /etc/hosts")
    return resolved


def route_address(hosts):
    """This machine's address on the way to the first other machine of ``hosts``, which every
    host can reach (the scheduler's default address); 127.0.0.1 when all are this machine."""
    for host in hosts:
        if not host.address.startswith("127."):
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
                sock.connect((host.address, 9))  # no packet is sent: this only picks the route
                address = sock.getsockname()[0]
            if address != host.address:
                return address
    return "127.0.0.1"


def _ssh_failure(host, result, python):
    """The one line that says why a host cannot be used, from its probe's result."""
    said = [line for line in (result.stderr or "").splitlines()
            if line.strip() and not line.startswith("Warning: Permanently added")]
    message = said[-1].strip() if said else f"exit code {result.returncode}"
    if "Permission denied" in message or "Host key verification failed" in message:
        return (f"host {host}: ssh cannot log in without a password ({message}): set up a key "
                f"(ssh-copy-id {host.target}) so that 'ssh -o BatchMode=yes {host.target} true' "
                "works")
    if result.returncode == 255:
        return f"host {host}: unreachable over ssh ({message}): check the name, port and network"
    return (f"host {host}: {python} does not run there ({message}): the same Python must exist at "
            "the same path on every host (a shared file system), or name the interpreter in the "
            "command")


def is_this_machine(address):
    """Whether ``address`` is one of this machine's own (a socket can bind to it).

    Examples
    --------
    >>> is_this_machine('127.0.0.1'), is_this_machine('192.0.2.1')
    (True, False)
    """
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((address, 0))
        return True
    except OSError:
        return False


def agent_argv(host, python, args, over_ssh=True):
    """The call that runs the remote agent with ``args`` on ``host``: over ssh, or here."""
    command = [python, "-c", agent_source(), *args]
    return ssh_argv(host, shlex.join(command)) if over_ssh else command


def _probe(host, python, over_ssh):
    """``(host, error line or None, remote host name, its address)`` of one host."""
    try:
        result = subprocess.run(agent_argv(host, python, ["probe"], over_ssh),
                                stdin=subprocess.DEVNULL, capture_output=True, text=True,
                                timeout=PROBE_TIMEOUT)
    except subprocess.TimeoutExpired:
        return host, f"host {host}: no answer over ssh within {PROBE_TIMEOUT} s", None, None
    words = result.stdout.split()
    if result.returncode != 0 or len(words) != 2:
        return host, _ssh_failure(host, result, python), None, None
    return host, None, words[0], words[1]


def _over_ssh(host, horovod):
    """Whether the launcher reaches ``host`` over ssh: always for its own processes; horovodrun
    starts those of this machine without ssh, which therefore needs no sshd."""
    return not (horovod and is_this_machine(host.address))


def probe_hosts(hosts, python, horovod=False):
    """Log in to every host (in parallel) before the job starts and run ``python`` there (for
    Horovod, this machine is looked at here, without ssh).

    Raises
    ------
    LaunchError
        With one line per host that is unreachable, asks for a password, lacks the interpreter,
        or (``horovod``, several machines) whose own name resolves to a loopback address there.
    """
    several = len({host.address for host in hosts}) > 1
    with ThreadPoolExecutor(max_workers=min(len(hosts), 16)) as pool:
        results = list(pool.map(lambda host: _probe(host, python, _over_ssh(host, horovod)),
                                hosts))
    errors = [error for _, error, _, _ in results if error]
    for host, error, name, address in results:
        if not error and horovod and several and address.startswith(("127.", "unresolved")):
            errors.append(
                f"host {host}: its own name {name!r} resolves to {address} there, and Horovod "
                "0.28.1 binds Gloo to that address, which aborts the job: map the name to the "
                "host's network address in its /etc/hosts")
    if errors:
        raise LaunchError("\n".join(dict.fromkeys(errors)))


def prepare_hosts(command, launcher, hosts):
    """The hosts of an ssh or multi-host Horovod job, parsed, resolved and probed (see
    :mod:`.hosts`); None for a job on this machine."""
    if not hosts or launcher == "local":
        return None
    hosts = resolve_hosts([host if isinstance(host, Host) else parse_host(host) for host in hosts])
    python = server_python(remote_python(command))
    probe_hosts(hosts, python, horovod=launcher == "horovod")
    return hosts


def _sweep_host(host, python, job_id, over_ssh):
    """Kill what is left of job ``job_id`` on ``host`` (:mod:`.remote_agent` ``sweep``)."""
    try:
        result = subprocess.run(agent_argv(host, python, ["sweep", job_id], over_ssh),
                                stdin=subprocess.DEVNULL, capture_output=True, text=True,
                                timeout=60)
    except subprocess.TimeoutExpired:
        log.error("could not check %s for processes left over: ssh did not answer in 60 s", host)
        return
    if result.returncode != 0:
        log.error("could not check %s for processes left over (exit code %d): %s", host,
                  result.returncode, (result.stderr.strip().splitlines() or [""])[-1])
    for line in result.stdout.splitlines():
        log.warning("left over on %s after the job, %s", host, line)


def sweep_hosts(hosts, python, job_id, horovod=False):
    """Run :func:`_sweep_host` on every host of ``hosts`` (once per address), in parallel."""
    unique = list({host.address: host for host in hosts}.values())
    with ThreadPoolExecutor(max_workers=min(len(unique), 16)) as pool:
        list(pool.map(lambda host: _sweep_host(host, python, job_id, _over_ssh(host, horovod)),
                      unique))
