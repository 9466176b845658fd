"""Horovod's ranks in a SLURM allocation without horovodrun: each rank's ``HOROVOD_*`` variables and
Horovod's own rendezvous server, from the launcher (``--launcher slurm``) or from SLURM's
environment (``srun -n N python scripts/train_imagenet.py --kv-store horovod``).

horovodrun over Gloo (``horovod/runner/gloo_run.py``, 0.28.1) starts Horovod's HTTP rendezvous
server (``horovod.runner.http.http_server.RendezvousServer``) initialised with the ranks' placement
(``get_host_assignments``), and gives every rank ``HOROVOD_RANK``, ``HOROVOD_SIZE``,
``HOROVOD_LOCAL_RANK``, ``HOROVOD_LOCAL_SIZE``, ``HOROVOD_CROSS_RANK``, ``HOROVOD_CROSS_SIZE`` and
``HOROVOD_HOSTNAME`` (``create_slot_env_vars``), the server's ``HOROVOD_GLOO_RENDEZVOUS_ADDR`` and
``HOROVOD_GLOO_RENDEZVOUS_PORT``, and ``HOROVOD_CONTROLLER=gloo``, ``HOROVOD_CPU_OPERATIONS=gloo``.
The same pieces serve here:

* ``--launcher slurm``: the launcher places the ranks as horovodrun does (``ceil(N / nodes)`` per
  node, in the allocation's order), runs the rendezvous server itself, and starts every rank in a
  job step of its own with its variables (:func:`horovod_job`).
* ``srun`` directly: SLURM numbers the tasks (``SLURM_PROCID``, ``SLURM_LOCALID``, the step's nodes
  and tasks per node); each task turns them into the same variables before Horovod starts
  (:func:`prepare_from_srun`), and task 0 runs the rendezvous server on the step's first node, on
  ``HOROVOD_GLOO_RENDEZVOUS_PORT`` if set, else on a port of the job and step
  (:func:`rendezvous_port`), which the other tasks wait for before they start Horovod.

Gloo binds to the address of the node's host name (Horovod's rule); where that is not the network
the nodes share, set ``HOROVOD_GLOO_IFACE``.  A step started with ``srun --mpi=...`` (PMI's
variables set) is left to Horovod's MPI controller.
"""
import contextlib
import math
import os
import re
import socket
import time

from .plan import JOB_VARIABLE, LaunchError
from .slurm import scontrol, srun_spec

#: The first port and the number of ports :func:`rendezvous_port` picks from.
PORT_BASE, PORT_SPAN = 20000, 20000

#: Seconds the other tasks wait for task 0's rendezvous server.
RENDEZVOUS_WAIT = 60.0

#: Variables that say MPI started the task (``srun --mpi=pmi2`` or ``pmix``): Horovod's MPI
#: controller numbers the ranks then.
MPI_VARIABLES = ("PMI_RANK", "PMIX_RANK", "OMPI_COMM_WORLD_RANK")

#: Kept alive for the life of the process: task 0's rendezvous server.
_SERVERS = []


def rendezvous_env(address, port):
    """The variables of Horovod's Gloo rendezvous, as ``gloo_run.create_run_env_vars`` sets them
    (without its network interface, which is each node's own)."""
    return {"HOROVOD_GLOO_RENDEZVOUS_ADDR": str(address),
            "HOROVOD_GLOO_RENDEZVOUS_PORT": str(port),
            "HOROVOD_CONTROLLER": "gloo", "HOROVOD_CPU_OPERATIONS": "gloo"}


def _assignments(slots_per_node, size):
    """Horovod's placement of ``size`` ranks on ``[(node, slots), ...]`` (SlotInfo per rank)."""
    from horovod.runner.common.util.hosts import HostInfo, get_host_assignments
    return get_host_assignments([HostInfo(node, slots) for node, slots in slots_per_node], size)


def _start_server(plan, port=0):
    """Horovod's rendezvous server for ``plan`` on ``port`` (0: a free one); ``(server, port)``."""
    from horovod.runner.http.http_server import RendezvousHandler, RendezvousHTTPServer
    from horovod.runner.util.threads import in_thread
    server = RendezvousHTTPServer(("", port), RendezvousHandler, False)
    server.init(plan)
    in_thread(target=server.serve_forever)
    return server, server.server_address[1]


@contextlib.contextmanager
def horovod_job(command, num_ranks, hosts, env=None):
    """The job steps of a Horovod job of ``num_ranks`` ranks on ``hosts`` (placed as horovodrun
    places them), with Horovod's rendezvous server running here for the ``with`` block.

    Raises
    ------
    LaunchError
        When Horovod is not installed.
    """
    try:
        from horovod.runner.gloo_run import create_slot_env_vars
    except ImportError:
        from ...distributed.horovod import INSTALL_COMMAND  # imports MXNet: only on this error
        raise LaunchError(f"Horovod is not installed: {INSTALL_COMMAND}") from None
    slots = math.ceil(num_ranks / len(hosts))
    plan = _assignments([(host.name, slots) for host in hosts], num_ranks)
    server, port = _start_server(plan)
    by_name = {host.name: host for host in hosts}
    address = (env or {}).get("HOROVOD_GLOO_RENDEZVOUS_ADDR") or _this_address(hosts)
    try:
        yield [srun_spec("worker", slot.rank, by_name[slot.hostname], command,
                         dict(env or {}, **create_slot_env_vars(slot),
                              **rendezvous_env(address, port)))
               for slot in plan]
    finally:
        server.shutdown()
        server.server_close()


def _this_address(hosts):
    from .hosts import route_address
    address = route_address(hosts)
    return hosts[0].address if address.startswith("127.") else address


def tasks_per_node(text):
    """SLURM's tasks-per-node notation expanded, one count per node.

    Examples
    --------
    >>> tasks_per_node('2(x3),1')
    [2, 2, 2, 1]
    """
    counts = []
    for part in str(text).split(","):
        match = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if not match:
            raise ValueError(f"SLURM_STEP_TASKS_PER_NODE {text!r} is not SLURM's notation "
                             "(e.g. 2(x3),1)")
        counts += [int(match.group(1))] * int(match.group(2) or 1)
    return counts


def srun_tasks(environ=None):
    """The tasks of the ``srun`` step this process is one of when srun started it directly (not
    through mxfp16's launcher, not under MPI), else 1.

    Examples
    --------
    >>> srun_tasks({'SLURM_STEP_ID': '0', 'SLURM_STEP_NUM_TASKS': '4'})
    4
    >>> srun_tasks({'SLURM_STEP_ID': '0', 'SLURM_STEP_NUM_TASKS': '4', 'MXFP16_JOB_ID': 'j'})
    1
    """
    environ = os.environ if environ is None else environ
    if "SLURM_STEP_ID" not in environ or JOB_VARIABLE in environ or \
            any(name in environ for name in MPI_VARIABLES):
        return 1
    return int(environ.get("SLURM_STEP_NUM_TASKS") or 1)  # a batch script has none


def rendezvous_port(job_id, step_id):
    """The rendezvous port of a job step, the same on every task: one of :data:`PORT_SPAN` ports
    from :data:`PORT_BASE`, by job and step.

    Examples
    --------
    >>> rendezvous_port('1234', '0'), rendezvous_port('1234', '1')
    (38976, 38977)
    """
    return PORT_BASE + (int(job_id) * 64 + int(step_id)) % PORT_SPAN


def srun_ranks(environ):
    """``(variables, plan, nodes)`` of this task of a direct ``srun`` step: its ``HOROVOD_*``
    variables from SLURM's numbering, Horovod's placement of the step and its nodes."""
    nodes = scontrol("show", "hostnames", environ["SLURM_STEP_NODELIST"]).split()
    counts = tasks_per_node(environ["SLURM_STEP_TASKS_PER_NODE"])
    node = environ["SLURMD_NODENAME"]
    rank, local_rank = int(environ["SLURM_PROCID"]), int(environ["SLURM_LOCALID"])
    here = nodes.index(node)
    crossing = [index for index, count in enumerate(counts) if count > local_rank]
    variables = {"HOROVOD_HOSTNAME": node, "HOROVOD_RANK": str(rank),
                 "HOROVOD_SIZE": str(sum(counts)), "HOROVOD_LOCAL_RANK": str(local_rank),
                 "HOROVOD_LOCAL_SIZE": str(counts[here]),
                 "HOROVOD_CROSS_RANK": str(crossing.index(here)),
                 "HOROVOD_CROSS_SIZE": str(len(crossing))}
    return variables, _assignments(list(zip(nodes, counts)), sum(counts)), nodes


def prepare_from_srun(environ=None):
    """Before Horovod starts in a task of ``srun -n N`` (N > 1): its ``HOROVOD_*`` variables from
    SLURM's, task 0's rendezvous server started, the other tasks waiting for it.  Nothing when
    horovodrun, mpirun or mxfp16's launcher started the process.

    Returns
    -------
    str or None
        The log line that says how the ranks met, or None.

    Raises
    ------
    ValueError
        When task 0 is not on the step's first node, its port is taken, or it does not answer.
    """
    environ = os.environ if environ is None else environ
    if "HOROVOD_RANK" in environ or srun_tasks(environ) < 2:
        return None
    variables, plan, nodes = srun_ranks(environ)
    port = int(environ.get("HOROVOD_GLOO_RENDEZVOUS_PORT") or
               rendezvous_port(environ["SLURM_JOB_ID"], environ["SLURM_STEP_ID"]))
    address = socket.getaddrinfo(nodes[0], None, socket.AF_INET)[0][4][0]
    if variables["HOROVOD_RANK"] == "0":
        if variables["HOROVOD_HOSTNAME"] != nodes[0]:
            raise ValueError(f"srun put task 0 on {variables['HOROVOD_HOSTNAME']}, not on the "
                             f"step's first node {nodes[0]}, where the other tasks look for "
                             "Horovod's rendezvous: use srun's default --distribution=block")
        _SERVERS.append(_serve(plan, port, nodes[0]))
    else:
        _wait_for(address, port, nodes[0])
    environ.update(variables, **rendezvous_env(address, port))
    return (f"srun task {variables['HOROVOD_RANK']} of {variables['HOROVOD_SIZE']} on "
            f"{variables['HOROVOD_HOSTNAME']}: Horovod's rank, Gloo rendezvous at "
            f"{nodes[0]} ({address}:{port})")


def _serve(plan, port, node):
    try:
        return _start_server(plan, port)[0]
    except OSError as error:
        raise ValueError(f"Horovod's rendezvous cannot listen on port {port} of {node} "
                         f"({error.strerror}): set HOROVOD_GLOO_RENDEZVOUS_PORT to a free port "
                         "for the job") from None


def _wait_for(address, port, node, timeout=RENDEZVOUS_WAIT):
    limit = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection((address, port), timeout=1).close()
            return
        except OSError:
            if time.monotonic() > limit:
                raise ValueError(f"task 0's Horovod rendezvous on {node} ({address}:{port}) did "
                                 f"not answer within {timeout:g} s: look at task 0's log, or set "
                                 "HOROVOD_GLOO_RENDEZVOUS_PORT to a port the nodes can reach") \
                    from None
            time.sleep(0.2)
