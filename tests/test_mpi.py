"""MPI: ``scripts/launch.py --launcher mpi`` (MXNet's meaning: the kvstore's servers and workers
started by mpirun), ``--launcher horovod --horovod-controller mpi``, and the command HPC users type,
``mpirun -np N python scripts/train_imagenet.py --kv-store horovod``, on this machine and across
the two hosts of tests/two_hosts.py (network namespaces, an sshd each).  The faults are those of the
ssh launcher's tests (tests/test_distributed.py, tests/test_multihost.py): the first failure's
code and error line with every process stopped, the timeout, SIGTERM to the launcher (every worker
saves and stops), a remote worker killed, the launcher killed, hosts that cannot be used.  The plan
and the agent's ``mpi`` mode are checked without mpirun; the jobs skip, with the reason shown,
where mpirun (OpenMPI), Horovod built with MPI or the namespaces are missing."""
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

import pytest

import two_hosts
from mxfp16.train.launch import mpi
from mxfp16.train.launch import plan as launch_plan
from mxfp16.train.launch.hosts import Host
from mxfp16.train.launch.launcher import launch
from mxfp16.train.state import checkpoint
from conftest import chosen_items, load_script_main, started_ahead
from test_distributed import STUCK_OR_FAILING_WORKER, alive, job_logs, recorded_pids

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LAUNCH = os.path.join("scripts", "launch.py")
JOB_TIMEOUT = 120
MPIRUN_REASON = None if shutil.which("mpirun") else \
    "mpirun is not installed (.ci/run installs openmpi-bin and libopenmpi-dev)"
#: The smallest training run: 2 batches of a small network on synthetic data.
TINY = ["--network", "mobilenet0.25", "--num-classes", "4", "--image-shape", "3,32,32",
        "--batch-size", "8", "--max-batches", "2", "--dtype", "float16", "--benchmark", "1",
        "--disp-batches", "1", "--lr", "0.01", "--num-epochs", "1"]
#: Long enough (12 batches an epoch on each of 2 workers) for a signal to arrive in the middle.
TRAIN = ["--network", "cifar_resnet20_v1", "--image-shape", "3,16,16", "--num-classes", "4",
         "--dtype", "float16", "--num-epochs", "1", "--disp-batches", "1", "--benchmark", "1",
         "--num-examples", "96", "--batch-size", "4"]


def horovod_mpi_missing():
    """None if Horovod is built with MPI, else why not."""
    try:
        import horovod.mxnet as hvd
    except ImportError as error:
        return f"Horovod is not installed ({error}): the README's test command builds it"
    return None if hvd.mpi_built() else \
        "Horovod was built without MPI: install libopenmpi-dev, then rebuild it (README)"


needs_mpirun = pytest.mark.skipif(MPIRUN_REASON is not None, reason=str(MPIRUN_REASON))
needs_horovod_mpi = pytest.mark.skipif(
    MPIRUN_REASON is not None or horovod_mpi_missing() is not None,
    reason=str(MPIRUN_REASON or horovod_mpi_missing()))
needs_two_hosts = pytest.mark.skipif(two_hosts.can_make_namespaces() is not None,
                                     reason=str(two_hosts.can_make_namespaces()))


def train_imagenet(*flags):
    return ["python", os.path.join("scripts", "train_imagenet.py"), *flags]


def mpirun_argv(*argv):
    """``mpirun`` as a user types it (as root, with the option it then needs), Horovod's options."""
    root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
    return ["mpirun", *root, "-bind-to", "none", "-map-by", "slot", "-x", "PYTHONPATH",
            "-x", "OMP_NUM_THREADS=1", *argv]


ONE_MACHINE_TEST = "test_mpirun_np_2_trains_with_the_horovod_kvstore_on_one_machine"


@pytest.fixture(scope="module", autouse=True)
def one_machine_job(request):
    """The users' mpirun command of :data:`ONE_MACHINE_TEST`, started with this module's first
    test (conftest.started_ahead): it trains while the light tests before it run."""
    test = None if MPIRUN_REASON or horovod_mpi_missing() else ONE_MACHINE_TEST
    argv = mpirun_argv("-np", "2", *train_imagenet("--kv-store", "horovod", *TINY))
    with started_ahead(request, test, argv, timeout=JOB_TIMEOUT, cwd=REPO,
                       env=dict(os.environ, PYTHONPATH=REPO)) as result:
        yield result


SIGTERM_TEST = "test_sigterm_to_a_horovod_job_over_mpi_saves_on_rank_0_and_exits_143"
#: The batch after which :data:`SIGTERM_TEST`'s job is stopped (of 12 an epoch on each rank).
SIGTERM_AT = "Epoch[0] Batch[3]"


@pytest.fixture(scope="module", autouse=True)
def sigterm_job(request, tmp_path_factory):
    """``(job, folder, prefix, watcher)``: the Horovod job over mpirun of :data:`SIGTERM_TEST`,
    started with this module's first test, as :func:`one_machine_job` (it runs on this machine,
    outside the two hosts whose processes the other jobs' tests count); the watcher thread sends
    the launcher SIGTERM once rank 0's log shows :data:`SIGTERM_AT`."""
    if MPIRUN_REASON or horovod_mpi_missing() or not chosen_items(request, SIGTERM_TEST):
        yield None
        return
    folder = tmp_path_factory.mktemp("sigterm")
    prefix = str(folder / "run" / "r")
    job = start_job(launch_argv(folder / "logs", "--launcher", "horovod", "--horovod-controller",
                                "mpi", "--", *train_imagenet("--kv-store", "horovod", *TRAIN,
                                                             "--model-prefix", prefix)))
    watcher = threading.Thread(target=stop_at, args=(job, folder / "logs" / "mpirun-0.log"),
                               daemon=True)
    watcher.start()
    try:
        yield job, folder, prefix, watcher
    finally:
        if job.poll() is None:  # the test did not wait for it (-x)
            job.kill()
        job.communicate()


def stop_at(job, log):
    """SIGTERM to ``job`` once its log ``log`` shows :data:`SIGTERM_AT` (nothing if it ends)."""
    while job.poll() is None:
        if log.exists() and SIGTERM_AT in log.read_text(errors="replace"):
            job.send_signal(signal.SIGTERM)
            return
        time.sleep(0.2)


# --- the remote agent's mpi mode, as mpirun runs it (a process group of its own) -------------

#: A rank: says it is up and whether it has mpirun's relays (SIGUSR1, SIGUSR2) blocked, stops with
#: 128 + N on a stop signal, as mxfp16's scripts do.
RANK = """
import signal, subprocess, sys, time
subprocess.Popen(['sleep', '60'])  # a child in the rank's group
for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2):
    signal.signal(signum, lambda n, f: sys.exit(128 + n))
blocked = signal.pthread_sigmask(signal.SIG_BLOCK, [])
print("up", {signal.SIGUSR1, signal.SIGUSR2} <= blocked, flush=True)
time.sleep(float(sys.argv[1]))
sys.exit(int(sys.argv[2]))
"""


def agent(*args):
    """The agent's mpi mode around :data:`RANK`, started as mpirun starts a rank."""
    argv = [sys.executable, "-c", launch_plan.agent_source(), "run", "5", "mpi", "--",
            sys.executable, "-c", RANK, *args]
    job = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, start_new_session=True)
    assert job.stdout.readline().split() == ["up", "True"]  # mpirun's relays are the agent's
    return job


@pytest.mark.parametrize("signum, status", [(signal.SIGUSR1, 0), (signal.SIGUSR2, 0),
                                            (signal.SIGTERM, 0), (None, 3)])
def test_the_mpi_agent_turns_sigusr_into_a_stop_of_its_group_that_exits_0(signum, status):
    """SIGUSR1 and SIGUSR2 (mpirun passes them on) stop the rank with SIGTERM and SIGINT, and a
    SIGTERM to the group stops it too: a stop that was asked for, 0 for mpirun; any other status
    is passed on.  The rank's child is killed either way."""
    job = agent("60" if signum else "0", "3")
    if signum:
        os.killpg(job.pid, signum)  # as mpirun signals a rank: its whole group
    assert job.wait(timeout=30) == status
    assert group_left(job.pid) == []


def group_left(pgid):
    """The live processes of group ``pgid`` (a killed one may stay a zombie for a moment)."""
    listed = subprocess.run(["pgrep", "-g", str(pgid)], capture_output=True, text=True).stdout
    return [pid for pid in map(int, listed.split()) if alive(pid)]


def test_the_mpi_agent_passes_a_killed_ranks_signal_on_as_128_plus_n():
    job = agent("60", "0")
    rank, = [int(pid) for pid in subprocess.run(["pgrep", "-P", str(job.pid)], capture_output=True,
                                                text=True).stdout.split()]
    os.kill(rank, signal.SIGKILL)
    assert job.wait(timeout=30) == 137
    assert group_left(job.pid) == []


# --- the plan: no mpirun needed -------------------------------------------------------------

def contexts(spec):
    """The application contexts of an mpirun spec: ``(options, [(host, exports, argv)])``."""
    words, parts = list(spec.argv), []
    first = words.index("-np")
    options, words = words[:first], words[first:]
    while words:
        end = words.index(":") if ":" in words else len(words)
        part, words = words[:end], words[end + 1:]
        exports = dict(value.split("=", 1) for flag, value in zip(part, part[1:]) if flag == "-x")
        start = max(index for index, word in enumerate(part) if word == "-x") + 2
        assert part[:6] == ["-np", "1", "-host", part[3], "-wdir", "/shared/run"]
        parts.append((part[3], exports, part[start:]))
    return options, parts


@pytest.fixture
def fake_mpirun(monkeypatch):
    monkeypatch.setattr(mpi, "find_mpirun", lambda why: "mpirun")
    monkeypatch.setattr(os, "geteuid", lambda: 0)


def test_the_mpi_plan_starts_servers_and_workers_by_mpirun_with_the_dmlc_variables(fake_mpirun):
    hosts = [Host("node1", port=2222, address="10.0.0.1"), Host("node2", port=2222,
                                                               address="10.0.0.2")]
    command = ["python", "train.py", "--kv-store", "dist_sync"]
    specs = mpi.plan_mpi_job(command, 3, 2, hosts, "10.0.0.1", 9000, {"OMP_NUM_THREADS": "1"},
                             "/shared/run", "j1")
    assert [spec.name for spec in specs] == ["scheduler 0", "mpirun-servers 0", "mpirun 0"]
    assert specs[0].env["DMLC_ROLE"] == "scheduler" and specs[0].env["DMLC_PS_ROOT_PORT"] == "9000"
    agent_path = os.path.join(os.path.dirname(launch_plan.__file__), "remote_agent.py")
    for spec, role, count, first_task in ((specs[1], "server", 2, 3), (specs[2], "worker", 3, 0)):
        options, parts = contexts(spec)
        assert options[:3] == ["mpirun", "--allow-run-as-root", "--tag-output"]
        assert options[-2:] == ["plm_rsh_args", " ".join([*launch_plan.SSH_OPTIONS, "-p", "2222"])]
        assert spec.stop_signals[signal.SIGTERM] == signal.SIGUSR1
        assert spec.stop_signals[signal.SIGINT] == signal.SIGUSR2
        assert len(parts) == count
        for index, (host, exports, argv) in enumerate(parts):  # round-robin, as the ssh launcher
            address = hosts[index % 2].address
            assert host == f"{address}:{2 if role == 'worker' and index != 1 else 1}"
            assert {name: exports[name] for name in ("DMLC_ROLE", "DMLC_NODE_HOST", "DMLC_TASK_ID",
                                                     "DMLC_NUM_WORKER", "DMLC_NUM_SERVER",
                                                     "DMLC_PS_ROOT_URI", "MXFP16_JOB_ID",
                                                     "OMP_NUM_THREADS", "DMLC_JOB_CLUSTER")} == {
                "DMLC_ROLE": role, "DMLC_NODE_HOST": address, "DMLC_TASK_ID": str(first_task + index),
                "DMLC_NUM_WORKER": "3", "DMLC_NUM_SERVER": "2", "DMLC_PS_ROOT_URI": "10.0.0.1",
                "MXFP16_JOB_ID": "j1", "OMP_NUM_THREADS": "1", "DMLC_JOB_CLUSTER": "mpi"}
            runs = [sys.executable, *command[1:]] if role == "worker" else \
                [sys.executable, "-c", "import mxnet"]
            assert argv == [sys.executable, "-I", agent_path, "run", "25.0", "mpi", "--", *runs]


def test_horovod_over_mpi_places_the_ranks_in_blocks_with_horovodruns_options(fake_mpirun):
    hosts = [Host("node1", address="10.0.0.1"), Host("node2", address="10.0.0.2")]
    spec, = mpi.plan_horovod_job(["python", "train.py"], 3, hosts, None, "/shared/run", "j1")
    options, parts = contexts(spec)
    assert options[-len(mpi.HOROVOD_MPI_OPTIONS):] == list(mpi.HOROVOD_MPI_OPTIONS)
    assert [host for host, _, _ in parts] == ["10.0.0.1:2", "10.0.0.1:2", "10.0.0.2:1"]
    assert not [name for _, exports, _ in parts for name in exports if name.startswith("DMLC_")]
    assert spec.command[-2:] == ("python", "train.py")


def test_mpiruns_report_names_the_first_failed_process_its_host_and_error_line():
    ranks = [("worker 0", "10.0.0.1"), ("worker 1", "10.0.0.2")]
    killed = "mpirun noticed that process rank 1 with PID 0 on node vm exited on signal 9 (Killed)."
    assert mpi.rank_account(ranks, killed) == (
        "worker 1 on 10.0.0.2 (MPI rank 1) failed first, with exit code 137: stopping the job", 137)
    # an unbuffered Python writes a traceback's last line in pieces, each tagged by mpirun
    split = ("[1,1]<stderr>:ModuleNotFoundError[1,0]<stdout>:up\n[1,1]<stderr>:: [1,1]<stderr>:No "
             "module named 'x'[1,1]<stderr>:\n-----\nThe first process to do so was:\n\n  Process "
             "name: [[417,1],1]\n  Exit code:    1\n")
    assert mpi.rank_account(ranks, split, 1)[0].endswith(
        "(MPI rank 1) failed first, with exit code 1: stopping the job; its output: "
        "ModuleNotFoundError: No module named 'x'")
    own = "[1,0]<stdout>:ValueError: x\n-----\nORTE was unable to reliably start one or more daemons."
    assert mpi.rank_account(ranks, own, 1) == (
        "mpirun failed with exit code 1: ORTE was unable to reliably start one or more daemons.", 1)
    assert mpi.rank_account(ranks, "[1,0]<stdout>:ValueError: x\n", 1) is None  # the ranks' only


@pytest.mark.parametrize("case, message", [
    ("missing", "mpirun is not installed (--launcher mpi starts the servers and workers with it): "
                "apt-get install openmpi-bin libopenmpi-dev, or use --launcher ssh"),
    ("mpich", "is not OpenMPI's ('HYDRA build details:'), whose options"),
    ("ports", "mpirun takes one ssh port for every host, the hostfile has 22, 2222"),
    ("user", "mpirun cannot log in to nobody@10.231.7.9 as nobody"),
    ("controller", "unknown Horovod controller 'nccl': use one of gloo, mpi"),
])
def test_mpi_user_errors_are_one_line_before_anything_starts(tmp_path, monkeypatch, case, message):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    if case == "mpich":
        (bin_dir / "mpirun").write_text("#!/bin/sh\necho 'HYDRA build details:'\n")
        (bin_dir / "mpirun").chmod(0o755)
    if case in ("missing", "mpich"):
        monkeypatch.setenv("PATH", str(bin_dir))
    else:
        monkeypatch.setattr(mpi, "find_mpirun", lambda why: "mpirun")
    hosts = {"ports": [Host("a", port=2222, address="198.51.100.1"), Host("b", address="198.51.100.2")],
             "user": [Host("10.231.7.9", user="nobody", address="198.51.100.9")]}.get(case)
    with pytest.raises(launch_plan.LaunchError) as raised:
        mpi.uses_mpirun("horovod", "nccl" if case == "controller" else "mpi")
        mpi.plan_mpi_job(["python", "train.py"], 2, 1, hosts, workdir="/shared/run")
    assert message in str(raised.value) and "\n" not in str(raised.value)


def test_mpirun_without_the_horovod_kvstore_is_one_error_line_on_every_rank(monkeypatch, capfd):
    """``mpirun -np 2 python scripts/train_imagenet.py`` without ``--kv-store horovod`` would train
    twice on all the data (as mpirun sets it, in this process)."""
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "2")
    for name in ("MXFP16_JOB_ID", "DMLC_ROLE"):
        monkeypatch.delenv(name, raising=False)
    assert load_script_main("train_imagenet")(["--kv-store", "device", *TINY]) == 2
    lines = capfd.readouterr().err.strip().splitlines()
    assert lines == ["error: mpirun started 2 processes but --kv-store is device: each would train "
                     "alone on all the data; pass --kv-store horovod, or run a dist_sync job with "
                     "scripts/launch.py --launcher mpi"]


# --- jobs on this machine ---------------------------------------------------------------------

@pytest.mark.slow
@needs_mpirun
def test_the_first_failing_workers_code_is_the_jobs_and_every_process_is_stopped(tmp_path):
    """As tests/test_distributed.py's job on the local launcher: worker 1 exits with 3 while worker
    0 hangs; both start a grandchild."""
    code = launch([sys.executable, "-c", STUCK_OR_FAILING_WORKER, str(tmp_path), "fail"],
                  num_workers=2, num_servers=1, launcher="mpi", timeout=JOB_TIMEOUT,
                  log_dir=str(tmp_path / "logs"))
    assert code == 3, job_logs(tmp_path / "logs")
    pids = recorded_pids(tmp_path)
    assert len(pids) == 4 and not [pid for pid in pids if alive(pid)]


def start_job(argv):
    """``argv`` started here, its output (both streams) in a pipe."""
    return subprocess.Popen(argv, cwd=REPO, env=dict(os.environ, PYTHONPATH=REPO), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def wait_for(job, path, marker):
    """Until ``marker`` is in the file ``path`` (a job's log), while the job runs."""
    while job.poll() is None:
        if path.exists() and marker in path.read_text(errors="replace"):
            return
        time.sleep(0.2)
    raise AssertionError(f"the job ended before {marker!r}: {job.stdout.read()[-3000:]}")


def launch_argv(log_dir, *args):
    return [sys.executable, LAUNCH, "-n", "2", "--timeout", str(JOB_TIMEOUT), "--log-dir",
            str(log_dir), "--env", "OMP_NUM_THREADS:1", *args]


# --- across the two hosts ---------------------------------------------------------------------

@pytest.fixture(scope="module")
def hosts(tmp_path_factory):
    yield from two_hosts.make_hosts(tmp_path_factory.mktemp("hosts"))


def on_host_1(hosts, argv):
    """``argv`` started on host 1, its output (both streams) in a pipe."""
    return hosts.popen(0, argv, cwd=REPO, env={"PYTHONPATH": REPO}, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True)


def hostfile(tmp_path, *lines):
    path = tmp_path / "hosts.txt"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def assert_nothing_left(hosts, output):
    """Nothing on either host, and the sweep found nothing either (see tests/test_multihost.py)."""
    assert "left over on" not in output, output
    assert hosts.leftovers(0) == [] and hosts.leftovers(1) == []


#: A worker that says it is up, then sleeps (or fails to import, with 'missing').
SLEEPER = "import sys, time; print('up', flush=True); sys.argv[1:] and __import__(sys.argv[1]); " \
          "time.sleep(120)"


def remote_sleeper(hosts, job):
    """The pid of the worker on host 2 (not its agent), once it runs (while ``job`` does)."""
    for _ in range(300):
        if job.poll() is not None:
            raise AssertionError(f"the job ended ({job.returncode}) before its worker ran on host "
                                 f"2: {job.stdout.read()[-3000:]}")
        for pid in hosts.pids(1):
            words = two_hosts.command_line(pid).split()
            if words[2:4] == ["-c", SLEEPER.split()[0]]:  # python -c import ...: not the agent
                return pid
        time.sleep(0.1)
    raise AssertionError("no worker on host 2")


@pytest.mark.slow
@needs_mpirun
@needs_two_hosts
def test_a_remote_worker_killed_or_the_launcher_killed_leaves_nothing_on_either_host(hosts,
                                                                                   tmp_path):
    path = hostfile(tmp_path, "node1", "node2")
    job = on_host_1(hosts, launch_argv(tmp_path / "logs", "--launcher", "mpi", "-s", "1", "-H", path,
                                       "--", "python", "-c", SLEEPER))
    os.kill(remote_sleeper(hosts, job), signal.SIGKILL)
    output, _ = job.communicate(timeout=JOB_TIMEOUT)
    assert job.returncode == 137, output
    failed = [line for line in output.splitlines() if "failed" in line]
    assert len(failed) == 1 and "worker 1 on 10.231.7.2 (MPI rank 1) failed first, with exit " \
                                "code 137: stopping the job" in failed[0], output
    assert_nothing_left(hosts, output)

    job = on_host_1(hosts, launch_argv(tmp_path / "logs2", "--launcher", "mpi", "-H", path, "--",
                                       "python", "-c", SLEEPER))
    remote_sleeper(hosts, job)
    job.kill()  # the launcher, with SIGKILL: mpirun dies with it and ends the job everywhere
    job.wait(timeout=10)
    assert hosts.leftovers(0, wait=15) == [] and hosts.leftovers(1, wait=15) == []


@pytest.mark.slow
@needs_mpirun
@needs_two_hosts
def test_bad_hosts_and_a_remote_worker_that_cannot_start_are_one_line_each(hosts, tmp_path):
    job = on_host_1(hosts, launch_argv(tmp_path / "logs", "--launcher", "mpi", "-H", hostfile(
        tmp_path, "node1", "node2:2200", "nobody@node2"), "--", "python", "-c", "pass"))
    output, _ = job.communicate(timeout=JOB_TIMEOUT)
    lines = output.strip().splitlines()
    assert job.returncode == 2 and len(lines) == 2, output
    assert "node2:2200: unreachable over ssh" in lines[0] and "nobody@node2: ssh cannot" in lines[1]
    assert not (tmp_path / "logs").exists()

    job = on_host_1(hosts, launch_argv(tmp_path / "logs", "--launcher", "mpi", "-H", hostfile(
        tmp_path, "node2"), "--", "python", "-c", SLEEPER, "no_such_module"))
    output, _ = job.communicate(timeout=JOB_TIMEOUT)
    assert job.returncode == 1, output
    assert re.search(r"worker [01] on 10\.231\.7\.2 \(MPI rank [01]\) failed first, with exit code "
                     r"1: stopping the job; its output: ModuleNotFoundError: No module named "
                     r"'no_such_module'", output), output
    assert_nothing_left(hosts, output)


# --- the heavy jobs, the first two started ahead (:func:`one_machine_job`, :func:`sigterm_job`)

@pytest.mark.slow
@needs_horovod_mpi
def test_mpirun_np_2_trains_with_the_horovod_kvstore_on_one_machine(one_machine_job):
    """The command of HPC users, as they type it (started ahead, see :func:`one_machine_job`)."""
    job = one_machine_job()
    assert job.returncode == 0, job.stdout[-3000:] + job.stderr[-3000:]
    assert "Horovod: rank 0 of 2 processes (local rank 0)" in job.stdout
    assert "mobilenet0.25 float16 (gluon): 1 epoch" in job.stdout


@pytest.mark.slow
@needs_horovod_mpi
def test_sigterm_to_a_horovod_job_over_mpi_saves_on_rank_0_and_exits_143(sigterm_job):
    """``--horovod-controller mpi``: mpirun passes the stop on as SIGUSR1, the ranks agree on a
    step, rank 0 saves it, and mpirun lets rank 0 finish (started ahead, see
    :func:`sigterm_job`)."""
    job, folder, prefix, watcher = sigterm_job
    output, _ = job.communicate(timeout=JOB_TIMEOUT)
    log = folder / "logs" / "mpirun-0.log"
    ranks = log.read_text()
    assert job.returncode == 143, output + ranks
    stopped = [line for line in ranks.splitlines() if "stopped by SIGTERM" in line]
    (epoch, batch), = [position for position in checkpoint.saved_positions(prefix) if position[1]]
    assert len(stopped) == 1 and stopped[0].startswith("[1,0]<stdout>:")  # rank 0 saved
    assert f"{prefix}-0000+{batch:06d}" in stopped[0] and "--horovod-controller mpi" in stopped[0]


@pytest.mark.slow
@needs_horovod_mpi
@needs_two_hosts
def test_mpirun_np_2_trains_with_the_horovod_kvstore_across_two_hosts_over_ssh(hosts):
    job = on_host_1(hosts, mpirun_argv("-np", "2", "-H", "node1:1,node2:1",
                                       *train_imagenet("--kv-store", "horovod", *TINY)))
    output, _ = job.communicate(timeout=JOB_TIMEOUT)
    assert job.returncode == 0, output[-3000:]
    assert "Horovod: rank 0 of 2 processes (local rank 0)" in output
    assert "mobilenet0.25 float16 (gluon): 1 epoch" in output
    assert_nothing_left(hosts, output)


@pytest.mark.slow
@needs_mpirun
@needs_two_hosts
def test_dist_sync_by_mpirun_across_two_hosts_stops_on_sigterm_with_rank_0s_checkpoint(hosts,
                                                                                      tmp_path):
    """SIGTERM to the launcher reaches both workers through mpirun; they agree on a step, rank 0
    saves it, all exit (the resume from it is the ssh launcher's, tests/test_multihost.py)."""
    path = hostfile(tmp_path, "root@node1:2222", "node2:2222")
    prefix = str(tmp_path / "run" / "r")
    job = on_host_1(hosts, launch_argv(tmp_path / "logs", "--launcher", "mpi", "-s", "1", "-H", path,
                                       "--", *train_imagenet("--kv-store", "dist_sync", *TRAIN,
                                                             "--model-prefix", prefix)))
    log = tmp_path / "logs" / "mpirun-0.log"
    wait_for(job, log, "Epoch[0] Batch[3]")
    job.send_signal(signal.SIGTERM)
    output, _ = job.communicate(timeout=JOB_TIMEOUT)
    assert job.returncode == 143, output + log.read_text()
    assert "places worker 0 on 10.231.7.1, worker 1 on 10.231.7.2" in output, output
    stopped = [line for line in log.read_text().splitlines() if "stopped by SIGTERM" in line]
    (epoch, batch), = [position for position in checkpoint.saved_positions(prefix) if position[1]]
    assert len(stopped) == 1 and f"saved checkpoint {prefix}-0000+{batch:06d}" in stopped[0]
    assert f"resume with: python {LAUNCH} -n 2 " in stopped[0] and "--launcher mpi" in stopped[0]
    assert_nothing_left(hosts, output)
