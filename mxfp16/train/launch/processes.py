"""The processes of a job, each in a session of its own: started (dying with the launcher), looked
at without being reaped, signalled (here with ``killpg``, on another host through its agent) and
stopped.  :mod:`.launcher` decides when; this module only does it.
"""
import codecs
import ctypes
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

from ...checkpoints.preemption import STOP_SIGNALS
from .plan import LaunchError, ProcessSpec

log = logging.getLogger("mxfp16.train.launch.launcher")

#: Seconds between SIGTERM and SIGKILL when stopping a process group.
KILL_GRACE = 3.0

#: Seconds the ssh clients get to exit after their remote processes were killed; then they are.
REMOTE_EXIT_GRACE = 5.0

#: Exit codes of a process stopped by one of the stop signals of mxfp16's scripts (128 + N).
STOP_CODES = frozenset(128 + int(signum) for signum in STOP_SIGNALS)

#: Seconds between two looks at the processes.
POLL_INTERVAL = 0.1

#: prctl(2)'s request that sends a signal to a process when its parent dies (Linux).
PR_SET_PDEATHSIG = 1
_PRCTL = getattr(ctypes.CDLL(None), "prctl", None) if sys.platform.startswith("linux") else None


def die_with_launcher():
    """In a child, before its command starts: SIGTERM when the launcher dies, even by SIGKILL,
    so that no process of the job outlives it here (the remote ones see their ssh end)."""
    if _PRCTL is not None:
        _PRCTL(PR_SET_PDEATHSIG, signal.SIGTERM)


@dataclass
class Running:
    spec: ProcessSpec
    popen: subprocess.Popen
    log_file: object = None
    relays: tuple = ()
    tail: bytearray = None


def relay_output(source, target, tail):
    """Copy a process's output to ``target`` (a text stream) as it comes, keeping its last 8 kB in
    ``tail``."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    for chunk in iter(lambda: source.read1(65536), b""):
        target.write(decoder.decode(chunk))
        target.flush()
        tail.extend(chunk)
        del tail[:-8192]


def start(spec, log_dir):
    """Start one process in a session (and process group) of its own; a remote one's ssh client
    gets a pipe as stdin, which carries the control words to its agent."""
    log_file = None
    if log_dir is not None:
        os.makedirs(log_dir, exist_ok=True)
        log_file = open(os.path.join(log_dir, f"{spec.role}-{spec.index}.log"), "wb")
    # horovodrun's and mpirun's output is relayed here (not inherited): their account of a failure
    relayed = spec.account is not None and log_file is None
    try:
        popen = subprocess.Popen(list(spec.argv), env=dict(os.environ, **spec.env),
                                 stdin=subprocess.PIPE if spec.remote else subprocess.DEVNULL,
                                 stdout=subprocess.PIPE if relayed else log_file,
                                 stderr=subprocess.PIPE if relayed else
                                 subprocess.STDOUT if log_file else None,
                                 start_new_session=True, preexec_fn=die_with_launcher)
    except OSError as error:
        if log_file:
            log_file.close()
        raise LaunchError(f"cannot start {spec.name} ({spec.argv[0]!r}: {error.strerror}): "
                          "check the command and that it is on PATH") from None
    log.info("started %s on %s (pid %d): %s", spec.name, spec.host, popen.pid, spec.shown)
    running = Running(spec, popen, log_file, tail=bytearray())
    if relayed:
        running.relays = tuple(
            threading.Thread(target=relay_output, args=(stream, target, running.tail), daemon=True)
            for stream, target in ((popen.stdout, sys.stdout), (popen.stderr, sys.stderr)))
        for thread in running.relays:
            thread.start()
    return running


def exit_code(returncode):
    """A shell-style exit code: a process killed by signal N gives 128 + N.

    Examples
    --------
    >>> exit_code(3), exit_code(-9)
    (3, 137)
    """
    return 128 - returncode if returncode < 0 else returncode


def returncode(proc):
    """Popen's return code (None while running), read without reaping the process.

    An exited but unreaped process keeps its pid, and so its process-group id, reserved: signalling
    the group in :func:`stop` can reach the process's own children but never a newcomer that was
    given the same pid.
    """
    if proc.popen.returncode is not None:
        return proc.popen.returncode
    info = os.waitid(os.P_PID, proc.popen.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    if info is None:
        return None
    return info.si_status if info.si_code == os.CLD_EXITED else -info.si_status


def signal_groups(running, sig, stop=False):
    """``sig`` to each process group: here with killpg, on a remote host through its agent; to ask
    workers to ``stop``, the signal their runner passes on instead (``spec.stop_signals``: mpirun's,
    :data:`.mpi.STOP_SIGNALS`), to the runner alone."""
    for proc in running:
        if stop and (proc.spec.stop_signals or {}).get(sig):
            os.kill(proc.popen.pid, proc.spec.stop_signals[sig])
            continue
        if proc.spec.remote and proc.popen.stdin:
            try:
                proc.popen.stdin.write(f"{signal.Signals(sig).name[3:]}\n".encode())
                proc.popen.stdin.flush()
            except (BrokenPipeError, ValueError):
                pass  # the ssh client is gone, and with it the remote process (its agent stops it)
            continue
        try:
            os.killpg(proc.popen.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass  # the group is gone already


def wait_exit(running, grace):
    limit = time.monotonic() + grace
    while any(returncode(proc) is None for proc in running) and time.monotonic() < limit:
        time.sleep(POLL_INTERVAL)


def stop(running, grace=KILL_GRACE):
    """SIGTERM every process group, SIGKILL what is left after ``grace`` seconds, reap all.

    A remote process is signalled through its agent; its ssh client then gets
    :data:`REMOTE_EXIT_GRACE` seconds to bring back the exit status before it is killed too.
    """
    signal_groups(running, signal.SIGTERM)
    wait_exit(running, grace)
    signal_groups(running, signal.SIGKILL)
    remote = [proc for proc in running if proc.spec.remote]
    wait_exit(remote, REMOTE_EXIT_GRACE)
    for proc in remote:
        try:
            proc.popen.stdin.close()  # the end of the agent's stdin: it stops what is left
        except BrokenPipeError:
            pass
        try:
            os.killpg(proc.popen.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    for proc in running:
        try:
            proc.popen.wait(timeout=grace)
        except subprocess.TimeoutExpired:  # stuck in the kernel; nothing more can be done
            log.error("%s (pid %d) did not die on SIGKILL", proc.spec.name, proc.popen.pid)
        if proc.log_file:
            proc.log_file.close()
