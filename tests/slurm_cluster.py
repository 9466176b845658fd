"""A two-node SLURM cluster on one machine, for tests/test_slurm.py: slurmctld and a slurmd in the
first network namespace of tests/two_hosts.py, a slurmd in the second, one munged (on the shared
file system) with a key made here, and a slurm.conf written here.

What it took on Debian's slurm-wlm 22.05 (measured): ``ProctrackType=proctrack/linuxproc`` and
``TaskPlugin=task/none`` (no cgroup setup of our own); slurmd still loads its cgroup plugin, so each
one runs with the host's cgroup mounts replayed inside its namespace (``ip netns exec`` mounts a
fresh /sys); ``SlurmctldHost`` is this machine's name (the namespaces share it) and each slurmd is
told its node name (``-N``); ``AuthInfo=cred_expire=10`` makes a requeued job eligible 11 s later
instead of about 2 minutes, and ``sched_interval=1`` has the main scheduler start it then (every
60 s by default: the requeued jobs waited 20 s more), as ``bf_interval=1`` does for backfill.
"""
import os
import pathlib
import re
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass

#: The daemons and clients the cluster needs.
PROGRAMS = ("munged", "slurmctld", "slurmd", "sbatch", "scontrol", "srun", "scancel", "squeue")

#: Seconds for the nodes to come up, and for a job to end.
START_TIMEOUT, JOB_TIMEOUT = 30.0, 240.0

NODES = ("node1", "node2")

SLURM_CONF = """\
ClusterName=rehearsal
SlurmctldHost={controller}({address})
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={munge}/munge.sock,cred_expire=10
StateSaveLocation={folder}/state
SlurmdSpoolDir={folder}/spool/%n
SlurmctldPidFile={folder}/slurmctld.pid
SlurmdPidFile={folder}/slurmd-%n.pid
SlurmctldLogFile={folder}/slurmctld.log
SlurmdLogFile={folder}/slurmd-%n.log
MailProg=/bin/true
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
SchedulerParameters=bf_interval=1,sched_interval=1
ReturnToService=2
KillWait=10
MinJobAge=600
{nodes}
PartitionName=rehearsal Nodes={node_names} Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
"""


def missing_programs():
    """None if SLURM and munge are installed, else the one-line reason to skip."""
    missing = [name for name in PROGRAMS
               if not shutil.which(name) and not os.path.exists(f"/usr/sbin/{name}")]
    if missing:
        return (f"{', '.join(missing)} not installed (.ci/run installs slurm-wlm and munge)")
    return None


def _cgroup_mounts():
    """Shell commands that mount, inside a namespace, the cgroup file systems this machine has."""
    commands = []
    with open("/proc/self/mounts") as mounts:
        for line in mounts:
            source, point, kind, options = line.split()[:4]
            if point == "/sys/fs/cgroup" or point.startswith("/sys/fs/cgroup/"):
                commands.append(f"mkdir -p {point} && mount -t {kind} -o {options} {source} "
                                f"{point}")
    return commands


@dataclass
class Cluster:
    hosts: object   # tests/two_hosts.Hosts
    folder: object  # pathlib.Path
    env: dict       # SLURM_CONF, for every SLURM command

    def run(self, *argv, check=True):
        """A SLURM command on node 1 (the controller's host), its output."""
        result = self.hosts.run(0, list(argv), env=self.env, capture_output=True, text=True,
                                timeout=60)
        if check and result.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} failed: {result.stderr}")
        return result.stdout

    def sbatch(self, script, cwd, *options, env=None):
        """Submit ``script`` (its text) from ``cwd``; the job id."""
        path = os.path.join(cwd, f"job-{time.monotonic_ns()}.sh")
        with open(path, "w") as out:
            out.write(script)
        result = self.hosts.run(0, ["sbatch", "--parsable", *options, path], cwd=cwd,
                                env=dict(self.env, **(env or {})), capture_output=True,
                                text=True, timeout=60)
        if result.returncode != 0:
            raise RuntimeError(f"sbatch failed: {result.stderr}")
        return result.stdout.strip().split(";")[0]

    def job(self, job_id):
        """``scontrol show job -o``'s fields of a job."""
        return dict(re.findall(r"(\w+)=(\S*)", self.run("scontrol", "show", "job", "-o",
                                                        str(job_id))))

    def wait(self, job_id, timeout=JOB_TIMEOUT):
        """The job's fields once it has ended (a state that is neither pending nor running)."""
        limit = time.monotonic() + timeout
        while True:
            fields = self.job(job_id)
            if fields.get("JobState") not in ("PENDING", "RUNNING", "COMPLETING", "REQUEUED",
                                              "CONFIGURING", "SUSPENDED"):
                return fields
            if time.monotonic() > limit:
                self.run("scancel", str(job_id), check=False)
                raise AssertionError(f"job {job_id} still {fields.get('JobState')} after "
                                     f"{timeout:g} s")
            time.sleep(0.5)

    def leftovers(self, job_id, wait=10.0):
        """The processes of job ``job_id`` left on either node (its environment names it, or it is
        one of its slurmstepd) after ``wait`` seconds at most."""
        limit = time.monotonic() + wait
        while True:
            left = [f"node{index + 1}: {command}" for index in range(2)
                    for command in _job_processes(self.hosts, index, str(job_id))]
            if not left or time.monotonic() > limit:
                return left
            time.sleep(0.2)


def _job_processes(hosts, index, job_id):
    found = []
    for pid in hosts.pids(index):
        try:
            with open(f"/proc/{pid}/environ", "rb") as environ:
                variables = environ.read().split(b"\0")
            with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
                command = cmdline.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if f"SLURM_JOB_ID={job_id}".encode() in variables or f"[{job_id}." in command:
            found.append(f"{pid} {command[:160]}")
    return found


def _wait_for_nodes(cluster, timeout=START_TIMEOUT):
    limit = time.monotonic() + timeout
    while time.monotonic() < limit:
        states = cluster.run("sinfo", "-h", "-N", "-o", "%N %t", check=False).split()
        if states.count("idle") == len(NODES):
            return
        time.sleep(0.3)
    raise RuntimeError(f"the SLURM nodes did not come up: {states}; see {cluster.folder}")


def make_cluster(hosts, folder):
    """Start the cluster on ``hosts`` (a generator: yields :class:`Cluster`, then stops it)."""
    for name in ("state", "spool", *(f"spool/{node}" for node in NODES)):
        (folder / name).mkdir(parents=True, exist_ok=True)
    # munged wants every folder above its socket searchable by all (pytest's are not), its own not
    # writable by others, and its key readable by its user only.
    munge = pathlib.Path(tempfile.mkdtemp(prefix="mxfp16-munge-"))
    os.chmod(munge, 0o711)
    key = munge / "munge.key"
    key.write_bytes(os.urandom(1024))
    os.chmod(key, 0o400)
    nodes = "\n".join(f"NodeName={node} NodeAddr={address} CPUs=8 State=UNKNOWN"
                      for node, address in zip(NODES, hosts.addresses))
    conf = folder / "slurm.conf"
    conf.write_text(SLURM_CONF.format(controller=socket.gethostname(), address=hosts.addresses[0],
                                      folder=folder, munge=munge, nodes=nodes,
                                      node_names=",".join(NODES)))
    env = {"SLURM_CONF": str(conf)}
    daemons = [subprocess.Popen(["munged", "-F", f"--key-file={key}", f"--socket={munge}/munge.sock",
                                 f"--pid-file={munge}/munged.pid", f"--log-file={folder}/munged.log",
                                 f"--seed-file={munge}/munged.seed"],
                                stdout=subprocess.DEVNULL, stderr=open(folder / "munged.err", "w"))]
    try:
        while not (munge / "munge.sock").exists():
            if daemons[0].poll() is not None:
                raise RuntimeError("munged did not start: "
                                   + (folder / "munged.err").read_text().strip()[-300:])
            time.sleep(0.05)
        mounts = " && ".join(_cgroup_mounts() + [""])
        started = [(0, ["slurmctld", "-D", "-f", str(conf)])] + [
            (index, ["sh", "-c", f"{mounts}exec slurmd -D -N {node} -f {conf}"])
            for index, node in enumerate(NODES)]
        for index, argv in started:
            daemon = hosts.popen(index, argv, env=env, stdout=subprocess.DEVNULL,
                                 stderr=open(folder / f"{argv[0]}-{index}.err", "w"))
            daemons.append(daemon)
            hosts.daemons[index].append(daemon)
        cluster = Cluster(hosts, folder, env)
        _wait_for_nodes(cluster)
        yield cluster
    finally:
        for daemon in reversed(daemons):
            daemon.terminate()
        for daemon in reversed(daemons):
            try:
                daemon.wait(timeout=10)
            except subprocess.TimeoutExpired:
                daemon.kill()
                daemon.wait()
        shutil.rmtree(munge, ignore_errors=True)
