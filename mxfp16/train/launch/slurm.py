"""Jobs inside a SLURM allocation (``sbatch``, ``salloc``): its nodes, each process a job step of
its own placed with ``srun``, the signals SLURM sends, and the job requeued after a save.

**Nodes.**  ``SLURM_JOB_NODELIST`` expanded by SLURM's own ``scontrol show hostnames``, each name
resolved here (ps-lite binds to an address).  Every process is a job step of its own, so that SLURM
tracks it and ends it with the job: the scheduler on the first node (at its address, or
``--host-ip``, another address of that node), server ``j`` and worker ``i`` on node ``j % N`` and
``i % N``, as with ssh::

    srun --nodes=1 --ntasks=1 --nodelist=NODE --overlap --export=ALL --quiet \\
        PYTHON -c AGENT run GRACE stdin -- COMMAND

``--overlap`` lets the steps share the allocation's CPUs (a server and a worker on one node); srun
passes this environment on (the DMLC variables included) and forwards its stdin, which carries the
launcher's control words to the remote agent as ssh's does (:mod:`.remote_agent`).  A Horovod job
(``--kv-store horovod`` in the command) has no scheduler and no servers: one step per rank, the
ranks placed as horovodrun places them, each with the ``HOROVOD_*`` variables horovodrun would give
it and Horovod's own rendezvous server in the launcher (:mod:`.slurm_horovod`).  After the job,
one step on every node sweeps what is left of it (the agent's ``sweep``).

**Signals.**  ``scancel`` and the time limit send SIGCONT and SIGTERM to every process of every
step and of the batch step, and SIGKILL ``KillWait`` seconds later; ``--signal=SIG@T`` sends SIG to
the steps' processes ``T`` seconds before the time limit, ``--signal=B:SIG@T`` to the batch step's
only (measured on the rehearsal cluster: a process in a session of its own gets them too).  So a
worker may hear a signal before the launcher does, or alone: mxfp16's scripts stop on SIGTERM,
SIGINT, SIGHUP, SIGUSR1 and SIGUSR2, and the launcher counts a worker that exits by one of them as
the job stopping, not failing.  The scheduler and servers ignore SIGTERM, SIGUSR1 and SIGUSR2
(:data:`SHIELDED_SERVER`): the workers need them to agree on the step to stop after; the launcher
stops them once the workers have saved.

**Requeue.**  A job stopped by a signal that does not end it (a ``--signal`` warning,
``scancel --signal``, a preemption notice: the job still ``RUNNING``) or by its time limit
(``COMPLETING``, reason ``TimeLimit``) is requeued with ``scontrol requeue $SLURM_JOB_ID`` once
the workers have saved, when SLURM may requeue it (``Requeue=1``: ``sbatch --requeue``, or the
cluster's ``JobRequeue=1`` default; ``--no-requeue`` turns it off) and when its command resumes by
itself (``--resume auto``: otherwise the next run would start over the checkpoints).  A
``scancel`` (``COMPLETING``, no reason) is never requeued.  The requeued job runs the same batch
script; SLURM sets ``SLURM_RESTART_COUNT``, which the run's first lines show.  The launcher
requeues (``--launcher slurm``); without a launcher (``srun``, or the batch script's own process),
the run's rank 0 does, after its save.
"""
import logging
import os
import re
import shlex
import signal
import subprocess

from .hosts import Host, resolve_hosts
from .plan import (AGENT_GRACE, LaunchError, ProcessSpec, agent_source, dmlc_env, remote_python,
                   server_python)
from .processes import STOP_CODES

log = logging.getLogger("mxfp16.train.launch.launcher")

#: One job step of one task on one node, sharing the allocation's CPUs with the other steps,
#: with this environment; srun's notes left out (its errors stay).
SRUN_STEP = ("srun", "--nodes=1", "--ntasks=1", "--overlap", "--export=ALL", "--quiet")

#: The scheduler's and servers' program: MXNet's server loop, deaf to the signals SLURM sends every
#: process of the job (scancel, the time limit, --signal warnings), which the workers need it to
#: outlive while they agree on a step and save; the launcher stops it after them.
SHIELDED_SERVER = ("import signal; [signal.signal(s, signal.SIG_IGN) for s in (signal.SIGTERM, "
                   "signal.SIGUSR1, signal.SIGUSR2)]; import mxnet")

#: The command-line value that makes a run resume by itself, and so a job safe to requeue.
RESUME_AUTO = ("--resume", "auto")

#: Seconds ``scontrol`` and ``srun`` calls of the launcher may take.
SLURM_CALL_TIMEOUT = 60


def scontrol(*args):
    """``scontrol ARGS``'s output; LaunchError when SLURM's tools are missing or fail."""
    try:
        result = subprocess.run(["scontrol", *args], capture_output=True, text=True,
                                timeout=SLURM_CALL_TIMEOUT)
    except FileNotFoundError:
        raise LaunchError("scontrol is not on PATH: the slurm launcher needs SLURM's tools (run "
                          "it inside an sbatch or salloc job)") from None
    if result.returncode != 0:
        raise LaunchError(f"scontrol {shlex.join(args)} failed: {result.stderr.strip()}")
    return result.stdout


def allocation_nodes(environ=None):
    """The node names of this SLURM allocation, ``SLURM_JOB_NODELIST`` expanded by ``scontrol show
    hostnames``.

    Raises
    ------
    LaunchError
        Outside an allocation (one line saying how to get one).

    Examples
    --------
    >>> allocation_nodes({})  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    mxfp16...LaunchError: --launcher slurm runs inside a SLURM allocation and SLURM_JOB_NODELIST ...
    """
    environ = os.environ if environ is None else environ
    nodelist = environ.get("SLURM_JOB_NODELIST") or environ.get("SLURM_NODELIST")
    if not nodelist:
        raise LaunchError("--launcher slurm runs inside a SLURM allocation and SLURM_JOB_NODELIST "
                          "is not set: submit the launch command with sbatch (or run it in an "
                          "salloc shell), or use --launcher ssh with a hostfile")
    return scontrol("show", "hostnames", nodelist).split()


def allocation_hosts(environ=None):
    """The allocation's nodes as :class:`.hosts.Host` entries with their addresses."""
    return resolve_hosts([Host(name) for name in allocation_nodes(environ)])


def srun_spec(role, index, host, argv, variables):
    """The job step that runs ``argv`` under the remote agent on ``host``, with ``variables``."""
    command = remote_python(argv)
    agent = [server_python(command), "-c", agent_source(), "run", str(AGENT_GRACE), "stdin", "--"]
    step = [*SRUN_STEP, f"--nodelist={host.name}", f"--job-name=mxfp16-{role}-{index}"]
    return ProcessSpec(role, index, host.address, tuple(step + agent + command),
                       dict({"PYTHONUNBUFFERED": "1"}, **variables), remote=host,
                       command=tuple(command))


def plan_slurm(command, num_workers, num_servers, hosts, root_uri, root_port, env=None):
    """Every process of a kvstore job in the allocation, each in a step of its own, in start order:
    the scheduler on the first node (listening on ``root_uri``, one of its addresses), then the
    servers and workers round robin over ``hosts``.

    Examples
    --------
    >>> hosts = [Host('node1', address='10.0.0.1'), Host('node2', address='10.0.0.2')]
    >>> specs = plan_slurm(['python', 'train.py'], 2, 1, hosts, '10.0.0.1', 9000)
    >>> [f'{spec.name} on {spec.host}' for spec in specs]  # doctest: +NORMALIZE_WHITESPACE
    ['scheduler 0 on 10.0.0.1', 'server 0 on 10.0.0.1', 'worker 0 on 10.0.0.1',
     'worker 1 on 10.0.0.2']
    >>> specs[3].argv[:7]
    ('srun', '--nodes=1', '--ntasks=1', '--overlap', '--export=ALL', '--quiet', '--nodelist=node2')
    """
    job = dict(num_workers=num_workers, num_servers=num_servers, root_uri=root_uri,
               root_port=root_port)
    python = server_python(remote_python(command))
    server = [python, "-c", SHIELDED_SERVER]
    specs = [srun_spec("scheduler", 0, hosts[0], server,
                       dict(env or {}, **dmlc_env("scheduler", **job)))]
    roles = [("server", num_servers, server, num_workers),
             ("worker", num_workers, list(command), 0)]
    for role, count, argv, first_task in roles:
        for index in range(count):
            host = hosts[index % len(hosts)]
            variables = dict(env or {}, **dmlc_env(role, node_host=host.address,
                                                   task_id=first_task + index, **job))
            specs.append(srun_spec(role, index, host, argv, variables))
    return specs


def sweep_allocation(hosts, python, job_id):
    """Kill what is left of job ``job_id`` on every node (one step, one task per node, running the
    agent's ``sweep``), logging each process killed."""
    step = ["srun", f"--nodes={len(hosts)}", f"--ntasks={len(hosts)}", "--ntasks-per-node=1",
            "--overlap", "--quiet", "--label", f"--nodelist={','.join(h.name for h in hosts)}",
            "--job-name=mxfp16-sweep", python, "-c", agent_source(), "sweep", job_id]
    try:
        result = subprocess.run(step, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                                timeout=SLURM_CALL_TIMEOUT)
    except subprocess.TimeoutExpired:
        log.error("could not check the nodes for processes left over: srun did not answer in "
                  "%d s", SLURM_CALL_TIMEOUT)
        return
    if result.returncode != 0:
        log.error("could not check the nodes for processes left over (srun's exit code %d): %s",
                  result.returncode, (result.stderr.strip().splitlines() or [""])[-1])
    for line in result.stdout.splitlines():
        task, _, said = line.partition(": ")
        node = hosts[int(task)].name if task.strip().isdigit() and int(task) < len(hosts) else "?"
        log.warning("left over on %s after the job, %s", node, said)


def job_info(job_id):
    """The fields of ``scontrol show job -o JOB_ID`` (``JobState``, ``Reason``, ``Requeue``, ...).

    Examples
    --------
    >>> parse_job_line('JobId=7 JobName=r50 JobState=RUNNING Reason=None Requeue=1')['JobState']
    'RUNNING'
    """
    return parse_job_line(scontrol("show", "job", "-o", str(job_id)))


def parse_job_line(line):
    """``{field: value}`` of one line of ``scontrol show job -o``."""
    return dict(re.findall(r"(\w+)=(\S*)", line))


def requeue_refusal(info, command):
    """Why a job stopped by a signal is not requeued, or None when it is (see the module notes).

    Examples
    --------
    >>> command = ['python', 'train.py', '--resume', 'auto']
    >>> running = {'JobState': 'RUNNING', 'Reason': 'None', 'Requeue': '1', 'BatchFlag': '1'}
    >>> requeue_refusal(running, command) is None
    True
    >>> requeue_refusal(dict(running, JobState='COMPLETING'), command)
    'it was cancelled (scancel): it ends here'
    >>> requeue_refusal(dict(running, JobState='COMPLETING', Reason='TimeLimit'), command) is None
    True
    >>> requeue_refusal(running, ['python', 'train.py'])  # doctest: +ELLIPSIS
    'its command has no --resume auto, so a requeued run would start over ...'
    """
    state, reason = info.get("JobState"), info.get("Reason")
    if state == "COMPLETING" and reason != "TimeLimit":
        return "it was cancelled (scancel): it ends here"
    if state not in ("RUNNING", "COMPLETING"):
        return f"it is {state} (SLURM requeues or ends it itself)"
    if info.get("BatchFlag") != "1":
        return "it is not a batch job (salloc): SLURM requeues batch jobs only"
    if info.get("Requeue") != "1":
        return "it may not be requeued (--no-requeue, or JobRequeue=0 without --requeue)"
    if not resumes_itself(command):
        return ("its command has no --resume auto, so a requeued run would start over its "
                "checkpoints: add --resume auto to requeue it")
    return None


def resumes_itself(command):
    """Whether a command line passes ``--resume auto`` (or ``--resume=auto``)."""
    args = [str(arg) for arg in command]
    return "--resume=auto" in args or any(
        pair == RESUME_AUTO for pair in zip(args, args[1:]))


def requeue_after_stop(command, environ=None, info=None):
    """Requeue this SLURM job after a signal stopped and saved it, when :func:`requeue_refusal`
    finds nothing against it (``info``: the job's fields, read if not given); one log line either
    way.  Outside a SLURM job, nothing.

    Returns
    -------
    bool
        Whether the job was requeued.
    """
    environ = os.environ if environ is None else environ
    job_id = environ.get("SLURM_JOB_ID")
    if not job_id:
        return False
    # SLURM ends the job's processes once it is requeued: this one finishes its line first.
    previous = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        refusal = requeue_refusal(info or job_info(job_id), command)
        if refusal is None:
            scontrol("requeue", job_id)
    except LaunchError as error:
        log.error("SLURM job %s could not be requeued: %s", job_id, error)
        return False
    finally:
        signal.signal(signal.SIGTERM, previous)
    if refusal:
        log.info("SLURM job %s is not requeued: %s", job_id, refusal)
        return False
    restarts = int(environ.get("SLURM_RESTART_COUNT", "0") or 0)
    log.warning("SLURM job %s requeued (scontrol requeue %s): its next run, SLURM_RESTART_COUNT=%d, "
                "resumes with --resume auto", job_id, job_id, restarts + 1)
    return True


def finish_job(hosts, python, job_id, command, code, environ=None):
    """After a job in the allocation: the sweep of every node while the allocation can still run
    steps (once it is ending, SLURM ends what is left of its steps), then, when the job stopped on a
    stop signal (exit code 128 + N), :func:`requeue_after_stop`."""
    environ = os.environ if environ is None else environ
    try:
        info = job_info(environ["SLURM_JOB_ID"])
    except (KeyError, LaunchError) as error:
        log.error("could not read the SLURM job's state: %s", error)
        info = {}
    if info.get("JobState") == "RUNNING":
        sweep_allocation(hosts, python, job_id)
    else:
        log.info("SLURM job %s is ending (%s, reason %s): SLURM ends what is left of its steps",
                 environ.get("SLURM_JOB_ID"), info.get("JobState"), info.get("Reason"))
    if code in STOP_CODES and info:
        requeue_after_stop(command, environ, info)


def slurm_line(environ=None):
    """The log line that says which SLURM job this is and how often it was requeued, or None
    outside one.

    Examples
    --------
    >>> slurm_line({'SLURM_JOB_ID': '12', 'SLURM_JOB_NODELIST': 'node[1-2]',
    ...             'SLURM_RESTART_COUNT': '1'})
    'SLURM job 12 on node[1-2], SLURM_RESTART_COUNT=1: requeued 1 time(s), this run resumes'
    >>> slurm_line({}) is None
    True
    """
    environ = os.environ if environ is None else environ
    job_id = environ.get("SLURM_JOB_ID")
    if not job_id:
        return None
    line = f"SLURM job {job_id} on {environ.get('SLURM_JOB_NODELIST', '?')}"
    restarts = environ.get("SLURM_RESTART_COUNT")
    if restarts and restarts != "0":
        return f"{line}, SLURM_RESTART_COUNT={restarts}: requeued {restarts} time(s), this run resumes"
    return f"{line}, first run (no SLURM_RESTART_COUNT)"

