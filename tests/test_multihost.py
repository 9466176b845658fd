"""Training across two machines over ssh (scripts/launch.py -H, for dist_sync and Horovod): a real
rehearsal on two hosts made as network namespaces, each with its own address and sshd
(tests/two_hosts.py).  The launcher runs on host 1; the faults are a remote worker killed with
SIGKILL, SIGTERM to the launcher (checkpoint, then a resume that ends with the uninterrupted run's
weights), a hostfile with names, users and ports, and hosts that cannot be used.  After every job,
nothing of it is left on either host.
"""
import os
import re
import signal
import subprocess
import sys
import time

import mxnet as mx
import numpy as np
import pytest

import two_hosts
from mxfp16.train.launch.hosts import parse_host, resolve_hosts
from mxfp16.train.launch.plan import LaunchError
from mxfp16.train.state import checkpoint

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LAUNCH = os.path.join("scripts", "launch.py")
#: The launcher's own timeout, should anything hang.
JOB_TIMEOUT = 120
#: One epoch of 24 batches: a stop after batch 3 lands inside it with room to spare, and the resume
#: has batches to train after it (a resume that crosses into another epoch is test_preemption's).
TRAIN = ["python", os.path.join("scripts", "train_imagenet.py"), "--network", "cifar_resnet20_v1",
         "--image-shape", "3,16,16", "--num-classes", "4", "--top-k", "2", "--dtype", "float16",
         "--num-epochs", "1", "--disp-batches", "1", "--optimizer", "adam", "--lr", "0.01",
         "--benchmark", "1", "--num-examples", "96", "--batch-size", "4"]

pytestmark = pytest.mark.skipif(two_hosts.can_make_namespaces() is not None,
                                reason=str(two_hosts.can_make_namespaces()))


@pytest.fixture(scope="module")
def hosts(tmp_path_factory):
    yield from two_hosts.make_hosts(tmp_path_factory.mktemp("hosts"))


def hostfile(tmp_path, *lines):
    path = tmp_path / "hosts.txt"
    path.write_text("# the two namespaces\n" + "\n".join(lines) + "\n")
    return str(path)


def launch_argv(hostfile_path, log_dir, *args, launcher=(), num_servers=("-s", "1")):
    return [sys.executable, LAUNCH, "-n", "2", *num_servers, *launcher, "-H", hostfile_path,
            "--timeout", str(JOB_TIMEOUT), "--log-dir", str(log_dir), "--env", "OMP_NUM_THREADS:1",
            "--", *args]


def start(hosts, argv):
    """The launcher on host 1, its output (both streams) in a pipe."""
    return hosts.popen(0, argv, cwd=REPO, env={"PYTHONPATH": REPO}, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True)


def run(hosts, argv):
    job = start(hosts, argv)
    output, _ = job.communicate(timeout=JOB_TIMEOUT + 60)
    return job.returncode, output


def logs(log_dir):
    """The workers' logs (horovodrun's, which holds its ranks')."""
    return "".join(path.read_text(errors="replace") for path in sorted(log_dir.glob("*-*.log"))
                   if not path.name.startswith(("server", "scheduler")))


def wait_for_log(job, log_dir, marker):
    while job.poll() is None:
        if marker in logs(log_dir):
            return
        time.sleep(0.2)
    raise AssertionError(f"the job ended before {marker!r}: {job.stdout.read()[-3000:]}")


def assert_nothing_left(hosts, output):
    """Nothing on either host, and the launcher's sweep found nothing either: the agents and the
    launcher stopped everything themselves (the two hosts share their processes, so a sweep
    would hide a process left on the wrong host)."""
    assert "left over on" not in output, output
    assert hosts.leftovers(0) == [] and hosts.leftovers(1) == []


def final_weights(prefix):
    return mx.nd.load(checkpoint.checkpoint_paths(prefix, 1).params)


@pytest.mark.slow
def test_dist_sync_across_two_hosts_named_with_users_and_ports_stops_on_sigterm_and_resumes(
        hosts, tmp_path):
    path = hostfile(tmp_path, "root@node1", "node2:2222")
    full, part = str(tmp_path / "full" / "r"), str(tmp_path / "part" / "r")
    dist = [*TRAIN, "--kv-store", "dist_sync"]
    code, output = run(hosts, launch_argv(path, tmp_path / "full-logs", *dist,
                                          "--model-prefix", full))
    assert code == 0, output + logs(tmp_path / "full-logs")
    assert "started worker 0 on 10.231.7.1" in output and "started worker 1 on 10.231.7.2" in output
    # One rank writes the log file: each epoch's line once.
    assert open(tmp_path / "full" / "train.log").read().count("Epoch[0] train loss") == 1
    assert "\r" not in logs(tmp_path / "full-logs") and "Connection to" not in output
    assert_nothing_left(hosts, output)

    job = start(hosts, launch_argv(path, tmp_path / "logs", *dist, "--model-prefix", part))
    wait_for_log(job, tmp_path / "logs", "Epoch[0] Batch[3]")  # of 24
    job.send_signal(signal.SIGTERM)
    output, _ = job.communicate(timeout=JOB_TIMEOUT)
    assert job.returncode == 143, output + logs(tmp_path / "logs")
    stopped = [line for line in logs(tmp_path / "logs").splitlines() if "stopped by" in line]
    assert len(stopped) == 1 and "stopped by SIGTERM" in stopped[0], stopped
    (epoch, batch), = [position for position in checkpoint.saved_positions(part) if position[1]]
    assert epoch == 0 and f"resume with: python {LAUNCH} -n 2 -s 1 -H {path} " in stopped[0]
    assert_nothing_left(hosts, output)

    code, output = run(hosts, launch_argv(path, tmp_path / "logs2", *dist, "--model-prefix", part,
                                          "--resume", part))
    assert code == 0, output + logs(tmp_path / "logs2")
    assert f"starting at epoch 0, batch {batch}" in logs(tmp_path / "logs2")
    expected, resumed = final_weights(full), final_weights(part)
    assert sorted(expected) == sorted(resumed)
    for name, value in expected.items():  # bit for bit
        np.testing.assert_array_equal(resumed[name].asnumpy(), value.asnumpy(), err_msg=name)
    assert_nothing_left(hosts, output)


def remote_worker(hosts):
    """The pid of the training process on host 2 (not its agent), once it runs."""
    for _ in range(100):
        for pid in hosts.pids(1):
            words = two_hosts.command_line(pid).split()
            if len(words) > 2 and words[2].endswith("train_imagenet.py"):
                return pid
        time.sleep(0.1)
    raise AssertionError("no training process on host 2")


def horovod_log(log_dir):
    path = log_dir / "horovodrun-0.log"
    return path.read_text(errors="replace") if path.exists() else ""


HOROVOD = dict(launcher=("--launcher", "horovod"), num_servers=())


@pytest.mark.slow
@pytest.mark.parametrize("launcher", ["dist_sync", "horovod"])
def test_a_remote_worker_killed_with_sigkill_stops_the_job_on_both_hosts_with_137(
        hosts, tmp_path, launcher):
    path = hostfile(tmp_path, "10.231.7.1:2222", "10.231.7.2:2222")
    options = HOROVOD if launcher == "horovod" else {}
    job = start(hosts, launch_argv(path, tmp_path / "logs", *TRAIN, "--kv-store", launcher,
                                   **options))
    wait_for_log(job, tmp_path / "logs", "Epoch[0] Batch[2]")
    os.kill(remote_worker(hosts), signal.SIGKILL)
    output, _ = job.communicate(timeout=JOB_TIMEOUT)
    assert job.returncode == 137, output + horovod_log(tmp_path / "logs")
    failed = [line for line in output.splitlines() if "failed" in line]
    assert len(failed) == 1, output
    assert ("Horovod process 1 failed first, with exit code 137" if launcher == "horovod" else
            "worker 1 on 10.231.7.2 failed with exit code 137") in failed[0]
    assert_nothing_left(hosts, output)


@pytest.mark.slow
def test_horovod_across_two_hosts_stops_on_sigterm_with_a_checkpoint_and_resumes(hosts, tmp_path):
    pytest.importorskip("horovod.mxnet", reason="Horovod is not installed (README's test command)")
    path = hostfile(tmp_path, "node1:2222", "root@node2:2222")
    prefix = str(tmp_path / "run" / "r")
    argv = launch_argv(path, tmp_path / "logs", *TRAIN, "--kv-store", "horovod", "--model-prefix",
                       prefix, **HOROVOD)
    job = start(hosts, argv)
    wait_for_log(job, tmp_path / "logs", "Epoch[0] Batch[3]")
    job.send_signal(signal.SIGTERM)
    output, _ = job.communicate(timeout=JOB_TIMEOUT)
    ranks = horovod_log(tmp_path / "logs")
    assert job.returncode == 143, output + ranks
    assert "Horovod: rank 0 of 2 processes" in ranks and "\r" not in ranks
    stopped = [line for line in ranks.splitlines() if "stopped by SIGTERM" in line]
    (epoch, batch), = [position for position in checkpoint.saved_positions(prefix) if position[1]]
    assert len(stopped) == 1 and f"{prefix}-0000+{batch:06d}" in stopped[0]
    assert_nothing_left(hosts, output)

    code, output = run(hosts, argv + ["--resume", prefix])
    assert code == 0, output + horovod_log(tmp_path / "logs")
    assert checkpoint.saved_positions(prefix) == [(1, 0)]
    assert_nothing_left(hosts, output)


@pytest.mark.slow
def test_a_launcher_killed_with_sigkill_leaves_nothing_on_either_host(hosts, tmp_path):
    path = hostfile(tmp_path, "node1", "node2")
    job = start(hosts, launch_argv(path, tmp_path / "logs", "python", "-c",
                                   "import time; print('up', flush=True); time.sleep(120)"))
    while logs(tmp_path / "logs").count("up") < 2:  # both workers run
        assert job.poll() is None, job.stdout.read()
        time.sleep(0.1)
    job.kill()
    job.wait(timeout=10)
    # The processes here die with their parent; the remote agents see their ssh stdin end.
    assert hosts.leftovers(0, wait=15) == [] and hosts.leftovers(1, wait=15) == []


@pytest.mark.slow
def test_unusable_hosts_are_one_line_each_before_anything_starts(hosts, tmp_path):
    path = hostfile(tmp_path, "node1", "node2:2200", "nobody@node2", "10.231.7.9")
    code, output = run(hosts, launch_argv(path, tmp_path / "logs", *TRAIN, "--kv-store",
                                          "dist_sync"))
    lines = output.strip().splitlines()
    assert code == 2, output
    assert len(lines) == 3 and all(line.startswith("error: host ") for line in lines), output
    assert "node2:2200: unreachable over ssh" in lines[0] and "Connection refused" in lines[0]
    assert "nobody@node2: ssh cannot log in without a password" in lines[1]
    assert "10.231.7.9: unreachable" in lines[2]
    assert not (tmp_path / "logs").exists()
    assert_nothing_left(hosts, output)


@pytest.mark.slow
def test_a_remote_process_that_fails_to_start_shows_the_first_error_line_of_its_log(hosts,
                                                                                     tmp_path):
    path = hostfile(tmp_path, "node2")
    code, output = run(hosts, launch_argv(path, tmp_path / "logs", "python", "-c",
                                          "import no_such_module"))
    assert code == 1, output
    assert re.search(r"worker [01] on 10\.231\.7\.2 failed with exit code 1: stopping the job",
                     output), output
    assert "ModuleNotFoundError: No module named 'no_such_module'" in output
    assert_nothing_left(hosts, output)


def test_a_name_that_resolves_to_loopback_among_several_hosts_is_one_error():
    with pytest.raises(LaunchError, match="host 'localhost' resolves to the loopback address "
                                          "127.0.0.1 in a job of several machines"):
        resolve_hosts([parse_host("localhost"), parse_host("root@10.0.0.2:22")])
    assert resolve_hosts([parse_host("localhost")])[0].address == "127.0.0.1"  # alone: fine
