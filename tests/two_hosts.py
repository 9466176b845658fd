"""Two machines on one: Linux network namespaces joined by a veth pair, each with its own address
and its own sshd, for tests/test_multihost.py.

The file system, the processes and the Python are shared, as on machines with a shared file
system; the network is not: each namespace has only its own address and the other's.  Names:
``node1`` and ``node2`` and this machine's host name resolve to the namespace's own address inside
it (``ip netns exec`` mounts ``/etc/netns/<name>/hosts`` over ``/etc/hosts``), as on real machines,
where Horovod binds Gloo to the address of the host's name.
"""
import itertools
import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field

SUBNET = "10.231.7"
SSH_PORTS = (22, 2222)
INTERFACE = "mxfp16net"
#: Numbers the host pairs of one process (a module's and the SLURM cluster's may overlap).
_PAIRS = itertools.count()


@dataclass
class Hosts:
    names: tuple          # the namespaces, host 1 then host 2
    addresses: tuple
    env: dict             # the environment that makes ssh use the test's keys
    sshd: list            # the sshd processes, one per namespace
    daemons: list = field(default_factory=lambda: [[], []])  # per host: other daemons' Popens

    def run(self, index, argv, **kwargs):
        """Run ``argv`` in host ``index`` (0 or 1), as subprocess.run."""
        return subprocess.run(["ip", "netns", "exec", self.names[index], *argv],
                              env=dict(os.environ, **self.env, **kwargs.pop("env", {})), **kwargs)

    def popen(self, index, argv, **kwargs):
        return subprocess.Popen(["ip", "netns", "exec", self.names[index], *argv],
                                env=dict(os.environ, **self.env, **kwargs.pop("env", {})), **kwargs)

    def pids(self, index):
        """Every process of host ``index`` but its sshd and daemons (``ip netns pids``)."""
        out = subprocess.run(["ip", "netns", "pids", self.names[index]], capture_output=True,
                             text=True, check=True).stdout
        kept = {self.sshd[index].pid} | {daemon.pid for daemon in self.daemons[index]}
        return {int(pid) for pid in out.split()} - kept

    def leftovers(self, index, wait=5.0):
        """The processes left on host ``index`` after ``wait`` seconds at most (ssh sessions take
        a moment to end), each as its command line."""
        limit = time.monotonic() + wait
        while self.pids(index) and time.monotonic() < limit:
            time.sleep(0.1)
        return [command_line(pid) for pid in self.pids(index)]


def command_line(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            return f"{pid}: " + cmdline.read().replace(b"\0", b" ").decode(errors="replace")[:200]
    except OSError:
        return f"{pid}: (gone)"


def can_make_namespaces():
    """None if this process can make network namespaces, else why not."""
    if os.geteuid() != 0:
        return "network namespaces need root (CI runs as root)"
    for tool in ("ip", "sshd", "ssh", "ssh-keygen"):
        if not shutil.which(tool) and not os.path.exists(f"/usr/sbin/{tool}"):
            return f"{tool} is not installed (.ci/run installs openssh-server and iproute2)"
    return None


def _sh(*argv):
    subprocess.run(argv, check=True, capture_output=True, text=True)


def _write_etc_hosts(name, own, addresses):
    folder = f"/etc/netns/{name}"
    os.makedirs(folder, exist_ok=True)
    with open(f"{folder}/hosts", "w") as hosts:
        hosts.write(f"127.0.0.1 localhost\n{own} {socket.gethostname()}\n"
                    f"{addresses[0]} node1\n{addresses[1]} node2\n")


def _keys(folder):
    _sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(folder / "host_key"))
    _sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(folder / "client_key"))
    shutil.copy(folder / "client_key.pub", folder / "authorized_keys")


def _sshd_config(folder, address, index):
    path = folder / f"sshd_{index}.conf"
    ports = "".join(f"Port {port}\n" for port in SSH_PORTS)
    path.write_text(f"{ports}ListenAddress {address}\nHostKey {folder / 'host_key'}\n"
                    f"AuthorizedKeysFile {folder / 'authorized_keys'}\nStrictModes no\n"
                    "PermitRootLogin prohibit-password\nPasswordAuthentication no\n"
                    "KbdInteractiveAuthentication no\nUsePAM no\nLogLevel ERROR\n"
                    f"PidFile {folder / f'sshd_{index}.pid'}\n")
    return path


def _client_env(folder):
    """An ``ssh`` first on PATH that adds the test's config: the launcher's ssh calls and
    horovodrun's both use it, and ~/.ssh is left alone.  The host keys go to a known_hosts file of
    the pair's own (the launcher's ``StrictHostKeyChecking=accept-new`` adds them): the pairs of
    other runs have other keys under the same names and addresses."""
    (folder / "ssh_config").write_text(
        f"Host *\n  IdentityFile {folder / 'client_key'}\n  IdentitiesOnly yes\n  User root\n"
        f"  UserKnownHostsFile {folder / 'known_hosts'}\n  StrictHostKeyChecking no\n"
        "  LogLevel ERROR\n")
    bin_dir = folder / "bin"
    bin_dir.mkdir()
    shim = bin_dir / "ssh"
    shim.write_text(f"#!/bin/sh\nexec {shutil.which('ssh')} -F {folder / 'ssh_config'} \"$@\"\n")
    shim.chmod(0o755)
    return {"PATH": f"{bin_dir}:{os.environ['PATH']}"}


def _wait_for_sshd(hosts, index, timeout=10.0):
    limit = time.monotonic() + timeout
    while time.monotonic() < limit:
        probe = hosts.run(index, ["ssh", "-o", "BatchMode=yes", hosts.addresses[index], "true"],
                          capture_output=True, text=True, timeout=timeout)
        if probe.returncode == 0:
            return
        time.sleep(0.2)
    raise RuntimeError(f"sshd on {hosts.addresses[index]} did not answer: {probe.stderr}")


def make_hosts(folder):
    """Make the two hosts (a generator: yields :class:`Hosts`, then tears everything down)."""
    pair = next(_PAIRS)
    tag = f"mxfp16-{os.getpid()}" + (f"-{pair}" if pair else "")
    names = (f"{tag}-1", f"{tag}-2")
    addresses = (f"{SUBNET}.1", f"{SUBNET}.2")
    veth = (f"mxv{os.getpid() % 100000}{pair}a", f"mxv{os.getpid() % 100000}{pair}b")
    sshd = []
    try:
        for name in names:
            _sh("ip", "netns", "add", name)
        _sh("ip", "link", "add", veth[0], "type", "veth", "peer", "name", veth[1])
        for name, device, address in zip(names, veth, addresses):
            _sh("ip", "link", "set", device, "netns", name)
            # One interface name on both (as eth0 on real machines): horovodrun looks for it.
            _sh("ip", "-n", name, "link", "set", "dev", device, "name", INTERFACE)
            _sh("ip", "-n", name, "addr", "add", f"{address}/24", "dev", INTERFACE)
            _sh("ip", "-n", name, "link", "set", INTERFACE, "up")
            _sh("ip", "-n", name, "link", "set", "lo", "up")
            _write_etc_hosts(name, address, addresses)
        _keys(folder)
        os.makedirs("/run/sshd", exist_ok=True)  # sshd's privilege separation directory
        hosts = Hosts(names, addresses, _client_env(folder), sshd)
        for index, address in enumerate(addresses):
            config = _sshd_config(folder, address, index)
            sshd.append(subprocess.Popen(["ip", "netns", "exec", names[index],
                                          shutil.which("sshd") or "/usr/sbin/sshd", "-D", "-e",
                                          "-f", str(config)],
                                         stderr=open(folder / f"sshd_{index}.log", "w")))
        for index in range(2):
            _wait_for_sshd(hosts, index)
        yield hosts
    finally:
        _teardown(names, sshd)


def _teardown(names, sshd):
    for name in names:  # everything still in the namespaces, sshd included
        listed = subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True)
        for pid in listed.stdout.split():
            try:
                os.kill(int(pid), signal.SIGKILL)
            except OSError:
                pass
    for process in sshd:
        process.kill()
        process.wait()
    for name in names:
        subprocess.run(["ip", "netns", "del", name], capture_output=True)
        shutil.rmtree(f"/etc/netns/{name}", ignore_errors=True)
    try:
        os.rmdir("/etc/netns")  # unless another run's namespaces still use it
    except OSError:
        pass
