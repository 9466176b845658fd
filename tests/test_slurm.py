"""SLURM for real: a two-node cluster (tests/slurm_cluster.py: slurmctld, a slurmd on each of the two
hosts of tests/two_hosts.py, munge) and jobs submitted with sbatch.

docs/clusters.md's recipes run as written, at a tiny size: the kvstore job (scripts/launch.py
--launcher slurm) trains on both nodes, and it and the Horovod job (srun python
scripts/train_imagenet.py --kv-store horovod) each requeue themselves after a signal (scancel
--signal=TERM --full, scancel --signal=USR1) and resume to the uninterrupted run's weights, bit for
bit.  A scancel saves the step in flight and leaves nothing of the job on either node; a remote
worker killed with SIGKILL, a worker that cannot start, the launcher's --timeout and the launcher
killed with SIGKILL end the job as they do over ssh (tests/test_multihost.py,
tests/test_distributed.py).

The jobs run at the same time: one fixture submits them all (a watcher thread signals each when
its log shows the batch it waits for), and each test waits for its own.
"""
import os
import re
import signal
import threading
import time

import mxnet as mx
import numpy as np
import pytest

import slurm_cluster
import two_hosts
from docs_blocks import read_blocks
from mxfp16.train.launch import slurm, slurm_horovod

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

#: The recipes' sizes made tiny: a 20-layer network on 16-pixel synthetic images, one epoch of 8
#: batches of 4 per worker, one server, no GPU.
TINY = ("--network cifar_resnet20_v1 --image-shape 3,16,16 --num-classes 4 --top-k 2 "
        "--num-epochs 1 --benchmark 1 --num-examples 32 --batch-size 4 --disp-batches 1 "
        "--optimizer adam --lr 0.01")
SIZES = {"--gres=gpu:1 ": "", " --gpus 0": "", "-n 2 -s 2": "-n 2 -s 1",
         "--network resnet50_v1 --data-train train.rec --data-val val.rec --batch-size 64": TINY}
#: Every process of a job shares the 2 cores: one thread each.
JOB_ENV = {"PYTHONPATH": REPO, "OMP_NUM_THREADS": "1", "MXNET_CPU_WORKER_NTHREADS": "1"}
#: The batch after which the interrupted jobs get their signal (of 8).
SIGNAL_AT = "Epoch[0] Batch[3]"

SKIP = two_hosts.can_make_namespaces() or slurm_cluster.missing_programs()


def on_cluster(test):
    """A test of the rehearsal cluster: slow, and skipped with the reason where it cannot run."""
    return pytest.mark.slow(pytest.mark.skipif(SKIP is not None, reason=str(SKIP))(test))


def recipe(block_id):
    """The sbatch script of docs/clusters.md's block ``block_id``, at the tiny size."""
    block, = [b for b in read_blocks(os.path.join("docs", "clusters.md"))
              if b.options.get("id") == block_id]
    text = block.text
    for old, new in SIZES.items():
        if old in text:
            text = text.replace(old, new)
    return text


def sleeping_job(*, fail=False, escape=False, timeout=None):
    """A job through the launcher whose workers print 'up' and sleep (with ``escape``, each leaving
    a grandchild of its own session behind, which only the sweep can find): a Horovod job's plan
    (``--kv-store horovod`` in the command: no scheduler, no servers, nothing imports MXNet); or a
    kvstore job whose workers fail to start."""
    program = "import no_such_module" if fail else (
        "import subprocess, time; print('up', flush=True); "
        # (without the step's output, which slurmstepd would wait 60 s for after the step's end)
        + ("subprocess.Popen(['sleep', '120'], start_new_session=True, stdout=-3, stderr=-3); "
           if escape else "")
        + "time.sleep(120)")
    return ("#!/bin/bash\n#SBATCH --nodes=2 --output=job.out\n"
            "exec python scripts/launch.py --launcher slurm -n 2 -s 1 --log-dir logs "
            + (f"--timeout {timeout} " if timeout else "") + f"-- python -c \"{program}\""
            + ("\n" if fail else " --kv-store horovod\n"))


HOROVOD_LAUNCH = ("#!/bin/bash\n#SBATCH --nodes=2 --output=job.out\n"
                  "exec python scripts/launch.py --launcher slurm -n 2 --log-dir logs -- "
                  f"python scripts/train_imagenet.py --kv-store horovod --dtype float16 {TINY} "
                  "--model-prefix runs/r --resume auto\n")


class Job:
    """A submitted job, its folder (the submit directory) and the watcher that signals it."""

    def __init__(self, cluster, folder, script, when=None, then=None):
        self.cluster, self.folder = cluster, folder
        folder.mkdir()
        (folder / "scripts").symlink_to(os.path.join(REPO, "scripts"))
        self.id = cluster.sbatch(script, str(folder), env=JOB_ENV)
        self.acted = threading.Event()
        if when:
            threading.Thread(target=self._watch, args=(when, then), daemon=True).start()

    def text(self, *patterns):
        """The text of the job's files that match ``patterns`` (globs in its folder)."""
        return "".join(path.read_text(errors="replace") for pattern in patterns
                       for path in sorted(self.folder.glob(pattern)) if path.is_file())

    def _watch(self, when, then):
        limit = time.monotonic() + slurm_cluster.JOB_TIMEOUT
        try:
            while time.monotonic() < limit:
                if when(self):
                    then(self)
                    self.acted.set()
                    return
                time.sleep(0.1)
        except Exception as error:  # shown by the test that waits for the job
            self.failure = f"{type(error).__name__}: {error}"

    failure = None

    def acted_or_why(self):
        """'' once the watcher has acted, else why not (for the assertion message)."""
        return "" if self.acted.is_set() else f"the watcher did not act: {self.failure}"

    def end(self):
        """The job's fields once it has ended."""
        return self.cluster.wait(self.id)


def at_batch(job):
    return SIGNAL_AT in job.text("runs/train.log")


def both_up(job):
    return job.text("logs/worker-*.log").count("up") >= 2


def scancel(*options):
    return lambda job: job.cluster.run("scancel", *options, job.id)


def job_process(job, host, words, without=" run 25.0 stdin "):
    """The pid of the job's process on ``host`` (0 or 1) whose command line has ``words`` (and
    not the agent's ``without``)."""
    limit = time.monotonic() + 60
    while time.monotonic() < limit:
        for entry in slurm_cluster._job_processes(job.cluster.hosts, host, job.id):
            pid, command = entry.split(" ", 1)
            if words in command and without not in command:
                return int(pid)
        time.sleep(0.1)
    raise AssertionError(f"no process {words!r} of job {job.id} on node{host + 1}")


def kill_remote_worker(job):
    os.kill(job_process(job, 1, "print('up'"), signal.SIGKILL)


def kill_launcher(job):
    os.kill(job_process(job, 0, "scripts/launch.py"), signal.SIGKILL)


@pytest.fixture(scope="session")
def cluster(tmp_path_factory):
    folder = tmp_path_factory.mktemp("slurm")
    (folder / "hosts").mkdir()
    for hosts in two_hosts.make_hosts(folder / "hosts"):
        yield from slurm_cluster.make_cluster(hosts, folder / "cluster")


@pytest.fixture(scope="module")
def jobs(cluster, tmp_path_factory):
    """Every job of this module, submitted at once, the longest first."""
    folder = tmp_path_factory.mktemp("jobs")
    kvstore, horovod = recipe("slurm-kvstore"), recipe("slurm-horovod")
    return {
        "kv-requeued": Job(cluster, folder / "kv-requeued", kvstore, at_batch,
                           scancel("--signal=TERM", "--full")),
        "hvd-requeued": Job(cluster, folder / "hvd-requeued", horovod, at_batch,
                            scancel("--signal=USR1")),
        "kv": Job(cluster, folder / "kv", kvstore),
        "hvd-cancelled": Job(cluster, folder / "hvd-cancelled", HOROVOD_LAUNCH, at_batch,
                             scancel()),
        "killed-worker": Job(cluster, folder / "killed-worker", sleeping_job(escape=True),
                             both_up, kill_remote_worker),
        "killed-launcher": Job(cluster, folder / "killed-launcher", sleeping_job(), both_up,
                               kill_launcher),
        "no-start": Job(cluster, folder / "no-start", sleeping_job(fail=True)),
        "timeout": Job(cluster, folder / "timeout", sleeping_job(timeout=8)),
    }


def final_weights(job, prefix):
    return mx.nd.load(str(job.folder / f"{prefix}-0001.params"))


def assert_same_weights(expected, actual):
    assert sorted(expected) == sorted(actual)
    for name, value in expected.items():
        np.testing.assert_array_equal(actual[name].asnumpy(), value.asnumpy(), err_msg=name)


@on_cluster
def test_the_kvstore_recipe_trains_on_both_nodes_and_leaves_nothing(jobs):
    job = jobs["kv"]
    fields = job.end()
    output = job.text("r50-*.out")
    assert (fields["JobState"], fields["ExitCode"]) == ("COMPLETED", "0:0"), output
    assert "started worker 0 on 10.231.7.1" in output and "started worker 1 on 10.231.7.2" in output
    assert f"SLURM job {job.id} on node[1-2], first run" in output
    assert "--resume auto: no checkpoint under runs/r50 yet, training from the start" in \
        job.text("runs/train.log")
    assert (job.folder / "runs" / "r50-0001.params").exists()
    assert "left over on" not in output and job.cluster.leftovers(job.id) == []


@on_cluster
def test_a_kvstore_job_requeued_by_its_launcher_after_a_signal_resumes_bit_for_bit(jobs):
    job = jobs["kv-requeued"]
    fields = job.end()
    output, log = job.text("r50-*.out"), job.text("runs/train.log")
    assert job.acted.is_set(), job.acted_or_why()
    assert (fields["JobState"], fields["Restarts"]) == ("COMPLETED", "1"), output
    assert "received SIGTERM: passing it to the workers" in output  # --full: the batch step's
    stopped, = [line for line in log.splitlines() if "stopped by SIGTERM" in line]
    batch = int(re.search(r"after batch (\d+) of epoch 0", stopped).group(1))
    assert f"SLURM job {job.id} requeued (scontrol requeue {job.id}): its next run, " \
           "SLURM_RESTART_COUNT=1, resumes with --resume auto" in output
    assert f"SLURM job {job.id} on node[1-2], SLURM_RESTART_COUNT=1: requeued 1 time(s)" in log
    assert f"resuming from checkpoint runs/r50-0000+{batch:06d}" in log
    assert_same_weights(final_weights(jobs["kv"], "runs/r50"), final_weights(job, "runs/r50"))
    assert job.cluster.leftovers(job.id) == []


@on_cluster
def test_the_horovod_recipe_requeues_itself_after_a_warning_and_resumes_bit_for_bit(jobs):
    # Two workers' sums are the same numbers whichever engine adds them: the kvstore job's weights.
    job = jobs["hvd-requeued"]
    fields = job.end()
    output, log = job.text("r50-hvd-*.out"), job.text("runs/train.log")
    assert job.acted.is_set(), job.acted_or_why()
    assert (fields["JobState"], fields["Restarts"]) == ("COMPLETED", "1"), output
    assert "srun task 0 of 2 on node1: Horovod's rank, Gloo rendezvous at node1" in log
    stopped, = [line for line in log.splitlines() if "stopped by SIGUSR1" in line]
    assert stopped.endswith("--resume auto; exit code 138")
    assert f"SLURM job {job.id} requeued" in log  # by rank 0: no launcher above it
    assert "SLURM_RESTART_COUNT=1: requeued 1 time(s), this run resumes" in log
    assert_same_weights(final_weights(jobs["kv"], "runs/r50"), final_weights(job, "runs/r50-hvd"))
    assert job.cluster.leftovers(job.id) == []


@on_cluster
def test_scancel_saves_the_step_in_flight_is_not_undone_and_leaves_nothing(jobs):
    job = jobs["hvd-cancelled"]
    fields = job.end()
    output, log = job.text("job.out"), job.text("runs/train.log")
    assert job.acted.is_set(), job.acted_or_why()
    assert fields["JobState"] == "CANCELLED", output
    stopped, = [line for line in log.splitlines() if "stopped by SIGTERM" in line]
    epoch, batch = (int(n) for n in re.search(r"saved checkpoint runs/r-(\d+)\+(\d+)",
                                              stopped).groups())
    assert epoch == 0 and batch >= 3  # the signal came after batch 3: nothing of it lost
    assert (job.folder / "runs" / f"r-0000+{batch:06d}.json").exists()
    assert f"SLURM job {job.id} is not requeued: it was cancelled (scancel)" in output
    assert job.cluster.leftovers(job.id) == []


@on_cluster
def test_a_remote_worker_killed_with_sigkill_ends_the_job_with_137_and_the_sweep_finds_the_rest(
        jobs):
    job = jobs["killed-worker"]
    fields = job.end()
    output = job.text("job.out")
    assert job.acted.is_set(), job.acted_or_why()
    assert fields["ExitCode"] == "137:0", output
    failed = [line for line in output.splitlines() if "failed" in line]
    assert len(failed) == 1 and "worker 1 on 10.231.7.2 failed with exit code 137" in failed[0]
    # each worker's grandchild of its own session escaped its step: the sweep killed both (the two
    # hosts share their processes, so either node's sweep may find them, and both nodes' sweeps,
    # which run at once, may kill the same one before it is gone: in one run of the suite, 3 lines)
    killed = re.findall(r"after the job, killed (\d+): sleep 120", output)
    assert len(set(killed)) == 2, output
    assert job.cluster.leftovers(job.id) == []


@on_cluster
def test_a_worker_that_cannot_start_is_the_first_error_line_of_its_log(jobs):
    job = jobs["no-start"]
    fields = job.end()
    output = job.text("job.out")
    assert fields["ExitCode"] == "1:0", output
    assert re.search(r"worker [01] on 10\.231\.7\.[12] failed with exit code 1: stopping the job",
                     output), output
    assert "ModuleNotFoundError: No module named 'no_such_module'" in output
    assert job.cluster.leftovers(job.id) == []


@on_cluster
def test_the_launchers_timeout_stops_every_step_and_exits_124_with_one_line(jobs):
    job = jobs["timeout"]
    fields = job.end()
    output = job.text("job.out")
    assert fields["ExitCode"] == "124:0", output
    errors = [line for line in output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith("error: the job ran past its timeout"), output
    assert job.cluster.leftovers(job.id) == []


@on_cluster
def test_a_launcher_killed_with_sigkill_leaves_nothing_on_either_node(jobs):
    job = jobs["killed-launcher"]
    fields = job.end()
    assert job.acted.is_set(), job.acted_or_why()
    assert fields["JobState"] == "FAILED", job.text("job.out")
    assert job.cluster.leftovers(job.id, wait=15) == []


# --------------------------------------------------------------------------------------------------
# Without a cluster
# --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("args, message", [
    (["--launcher", "slurm", "-n", "2", "--", "python", "-c", "pass"],
     "--launcher slurm runs inside a SLURM allocation and SLURM_JOB_NODELIST is not set"),
    (["--launcher", "slurm", "-H", "{hosts}", "-n", "2", "--", "python", "-c", "pass"],
     "the slurm launcher runs on the nodes of its SLURM allocation (SLURM_JOB_NODELIST): leave -H "
     "out"),
])
def test_the_slurm_launcher_outside_an_allocation_or_with_a_hostfile_is_one_error_line(
        script_main, tmp_path, capsys, monkeypatch, args, message):
    for name in ("SLURM_JOB_NODELIST", "SLURM_NODELIST"):
        monkeypatch.delenv(name, raising=False)
    (tmp_path / "hosts").write_text("node1\n")
    assert script_main("launch")([arg.format(hosts=tmp_path / "hosts") for arg in args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {message}"), err


@pytest.mark.parametrize("fields, refusal", [
    ({"JobState": "PREEMPTED"}, "it is PREEMPTED (SLURM requeues or ends it itself)"),
    ({"BatchFlag": "0"}, "it is not a batch job (salloc): SLURM requeues batch jobs only"),
    ({"Requeue": "0"}, "it may not be requeued (--no-requeue, or JobRequeue=0 without --requeue)"),
    ({"JobState": "COMPLETING", "Reason": "TimeLimit"}, None),
])
def test_requeue_decisions_follow_the_jobs_state_and_flags(fields, refusal):
    running = {"JobState": "RUNNING", "Reason": "None", "Requeue": "1", "BatchFlag": "1"}
    assert slurm.requeue_refusal(dict(running, **fields), ["train.py", "--resume=auto"]) == refusal


def test_srun_tasks_become_horovod_ranks_as_horovodrun_numbers_them(monkeypatch):
    pytest.importorskip("horovod.runner", reason="Horovod is not installed (README's test command)")
    monkeypatch.setattr(slurm_horovod, "scontrol", lambda *args: "n1\nn2\nn3\n")
    environ = {"SLURM_STEP_NODELIST": "n[1-3]", "SLURM_STEP_TASKS_PER_NODE": "2(x2),1",
               "SLURMD_NODENAME": "n2", "SLURM_PROCID": "3", "SLURM_LOCALID": "1"}
    variables, plan, nodes = slurm_horovod.srun_ranks(environ)
    assert variables == {"HOROVOD_HOSTNAME": "n2", "HOROVOD_RANK": "3", "HOROVOD_SIZE": "5",
                         "HOROVOD_LOCAL_RANK": "1", "HOROVOD_LOCAL_SIZE": "2",
                         "HOROVOD_CROSS_RANK": "1", "HOROVOD_CROSS_SIZE": "2"}
    assert nodes == ["n1", "n2", "n3"] and [slot.hostname for slot in plan] == \
        ["n1", "n1", "n2", "n2", "n3"]
    mine = plan[3]  # Horovod's own placement of the same step gives this task the same numbers
    assert (mine.rank, mine.local_rank, mine.cross_rank, mine.cross_size) == (3, 1, 1, 2)

