"""The small program that runs on a remote host around each process of a job the launcher started.

Standalone on purpose (the standard library only, no mxfp16 import): the launcher sends this file's
text as ``python -c`` through ssh, so nothing needs installing on the hosts (mpirun runs it by its
path, ``python -I .../remote_agent.py``, as it runs the training code).  Three commands::

    python -c AGENT run GRACE stdin|stdout|mpi -- COMMAND...   # runs COMMAND, supervised
    python -c AGENT sweep JOB_ID                          # kills what is left of a job here
    python -c AGENT probe                                 # prints this host's name and its address

**run.**  COMMAND starts in a session (and process group) of its own.  The agent passes on
SIGTERM, SIGINT, SIGHUP, SIGUSR1 and SIGUSR2 it receives to that group (SIGHUP as SIGTERM; SIGUSR1
and SIGUSR2 are SLURM's ``--signal`` warnings, which would kill the agent and orphan COMMAND),
reads control words from stdin (``stdin`` mode: ``TERM``, ``INT``, ``USR1``, ``USR2``, ``KILL``
signal the group; the end of
stdin, i.e. the launcher or its ssh client gone, stops it) and watches its stdout (when the ssh
channel behind it closes, the group is stopped): SIGTERM, then SIGKILL after GRACE seconds.  Once
COMMAND has exited, what it left in its group is killed, and the agent exits with COMMAND's
status, 128 + N for a signal N (ssh passes that on, where it would report 255 for a killed remote
process).  A COMMAND that cannot start is one ``error:`` line and status 127.

**run ... mpi** (an MPI rank: mpirun starts the agent, see :mod:`mxfp16.train.launch.mpi`).
COMMAND stays in the agent's process group, the one mpirun made for the rank, so that mpirun's
SIGTERM and SIGKILL to the rank reach COMMAND and its children (the agent itself waits for COMMAND
and ignores them).  mpirun ends its whole job on SIGTERM or SIGINT, one second before SIGKILL, but
passes SIGUSR1 and SIGUSR2 on to every rank's group: the agent turns them into SIGTERM and SIGINT
to the group, COMMAND having them blocked (so that its run says it was stopped by SIGTERM, and a
program that does not handle them lives), so that a preemption reaches the training code and leaves
it time to save.  After a stop signal (these, or SIGTERM, SIGINT or SIGHUP sent to the group by
anyone else), COMMAND's exit with a stop status (128 + N) is what was asked, and the agent exits
with 0: mpirun would end the other ranks at the first nonzero status, rank 0 perhaps in the middle
of its checkpoint.  Every other status is passed on.  Once COMMAND has exited, what it left in the
group is killed; when the agent's stdout (mpirun's pipe) closes, the group is stopped.

**sweep.**  Every process on this host whose environment holds ``MXFP16_JOB_ID=JOB_ID`` (the
launcher exports it to every process of the job, and children inherit it) gets SIGKILL; one line
per process killed.
"""
import os
import select
import signal
import subprocess
import sys
import threading
import time

JOB_VARIABLE = "MXFP16_JOB_ID"
CONTROL_WORDS = {"TERM": signal.SIGTERM, "INT": signal.SIGINT, "USR1": signal.SIGUSR1,
                 "USR2": signal.SIGUSR2, "KILL": signal.SIGKILL}
#: The signals the agent passes on to its command's group, and as which.
PASSED_ON = {signal.SIGTERM: signal.SIGTERM, signal.SIGHUP: signal.SIGTERM,
             signal.SIGINT: signal.SIGINT, signal.SIGUSR1: signal.SIGUSR1,
             signal.SIGUSR2: signal.SIGUSR2}


def signal_group(pgid, signum):
    try:
        os.killpg(pgid, signum)
    except OSError:  # the group is gone already
        pass


def stop_group(pgid, grace):
    """SIGTERM to the group, SIGKILL after ``grace`` seconds if any member is left."""
    signal_group(pgid, signal.SIGTERM)
    limit = time.monotonic() + grace
    while time.monotonic() < limit:
        try:
            os.killpg(pgid, 0)
        except OSError:
            return
        time.sleep(0.1)
    signal_group(pgid, signal.SIGKILL)


def read_control(pgid, grace):
    """Signal the group on each control word from stdin; stop it when stdin ends."""
    for line in sys.stdin.buffer:
        signum = CONTROL_WORDS.get(line.strip().decode(errors="replace"))
        if signum:
            signal_group(pgid, signum)
    stop_group(pgid, grace)


def watch_stdout(pgid, grace):
    """Stop the group once nothing reads this process's stdout any more (the ssh channel closed)."""
    poller = select.poll()
    poller.register(sys.stdout.fileno(), 0)  # only POLLERR / POLLHUP, which are always reported
    while not poller.poll(1000):
        pass
    stop_group(pgid, grace)


def run(grace, mode, command):
    if mode == "mpi":
        return run_rank(grace, command)
    try:
        child = subprocess.Popen(command, stdin=subprocess.DEVNULL, start_new_session=True)
    except OSError as error:
        print(f"error: cannot start {command[0]!r} on {os.uname().nodename}: {error.strerror}",
              flush=True)
        return 127
    for signum, passed in PASSED_ON.items():
        signal.signal(signum, lambda *_, sig=passed: signal_group(child.pid, sig))
    watchers = [watch_stdout] + ([read_control] if mode == "stdin" else [])
    for watcher in watchers:
        threading.Thread(target=watcher, args=(child.pid, grace), daemon=True).start()
    code = child.wait()
    signal_group(child.pid, signal.SIGKILL)  # whatever the command left behind in its group
    return 128 - code if code < 0 else code


def group_members(pgid):
    """The pids of process group ``pgid`` but this process (from ``/proc``)."""
    members = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:  # gone meanwhile
            continue
        if int(fields[2]) == pgid and int(pid) != os.getpid():
            members.append(int(pid))
    return members


#: mpirun's relays of a stop (see ``run ... mpi``), and the signal each stands for.
MPI_RELAYS = {signal.SIGUSR1: signal.SIGTERM, signal.SIGUSR2: signal.SIGINT}

#: The signals that stop a run (mxfp16's scripts exit with 128 + N).
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)


def _block_mpi_relays():
    """In COMMAND, before it starts: mpirun's relays (SIGUSR1, SIGUSR2), sent to the whole group,
    are the agent's alone; blocked, as a handler of COMMAND's own would override an ignored one."""
    signal.pthread_sigmask(signal.SIG_BLOCK, MPI_RELAYS)


def run_rank(grace, command):
    """``run ... mpi``: COMMAND in this process group; see the module's notes."""
    group, asked = os.getpgrp(), []

    def stop_asked(signum, frame):
        asked.append(signum)
        if signum in MPI_RELAYS:
            signal_group(group, MPI_RELAYS[signum])  # this process only notes it (below)
    for signum in STOP_SIGNALS:  # a signal to the group itself is COMMAND's to handle
        signal.signal(signum, stop_asked)
    try:
        child = subprocess.Popen(command, stdin=subprocess.DEVNULL,
                                 preexec_fn=_block_mpi_relays)
    except OSError as error:
        print(f"error: cannot start {command[0]!r} on {os.uname().nodename}: {error.strerror}",
              flush=True)
        return 127
    threading.Thread(target=watch_stdout, args=(group, grace), daemon=True).start()
    code = child.wait()
    for pid in group_members(group):  # whatever the command left behind in the group
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    status = 128 - code if code < 0 else code
    return 0 if asked and status in {128 + int(signum) for signum in STOP_SIGNALS} else status


def sweep(job_id):
    """SIGKILL every process of job ``job_id`` on this host; the number killed."""
    marker = f"{JOB_VARIABLE}={job_id}".encode()
    killed = 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        if int(pid) == os.getpid():
            continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as environ:
                if marker not in environ.read().split(b"\0"):
                    continue
            with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
                name = cmdline.read().replace(b"\0", b" ").decode(errors="replace")[:120]
            os.kill(int(pid), signal.SIGKILL)
        except OSError:  # gone meanwhile, or not ours
            continue
        killed += 1
        print(f"killed {pid}: {name}", flush=True)
    return 0


def probe():
    import socket
    name = socket.gethostname()
    try:
        address = socket.gethostbyname(name)
    except OSError:
        address = "unresolved"
    print(name, address, flush=True)
    return 0


def main(argv):
    if argv[:1] == ["run"] and argv[3:4] == ["--"]:
        return run(float(argv[1]), argv[2], argv[4:])
    if argv[:1] == ["sweep"] and len(argv) == 2:
        return sweep(argv[1])
    if argv == ["probe"]:
        return probe()
    print(f"error: usage: run GRACE stdin|stdout|mpi -- COMMAND | sweep JOB_ID | probe; got {argv}")
    return 2


if __name__ == "__main__":
    status = main(sys.argv[1:])
    sys.stdout.flush()
    os._exit(status)  # at once: a watcher thread may still block on reading stdin
