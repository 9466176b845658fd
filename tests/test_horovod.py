"""Horovod as the second distributed engine: real ``horovodrun -np 2 -H localhost:2 --gloo`` jobs on
loopback (each bounded by a timeout), float16 with dynamic loss scaling through both APIs, the
training scripts' ``--kv-store horovod`` (checkpoints, resume on one process and two), the launcher,
and the errors a user meets.  Skipped, with the reason shown, where Horovod is not installed.

The launches run in the background, two at a time (see :func:`background`); a test waits for the
result of its own."""
import concurrent.futures
import getpass
import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest

from conftest import SCRIPTS_DIR, horovod_missing, load_script_main, started_ahead
from mxfp16.train.launch.horovod_start import check_same_flags
from mxfp16.train.launch.hosts import Host
from mxfp16.train.launch.plan import LaunchError, horovodrun_argv

import horovod_worker

HOROVOD_REASON = horovod_missing()
if HOROVOD_REASON:
    HOROVOD_REASON += ": pip install -e \".[horovod]\" as docs/distributed.md says"


def needs_horovod(test):
    """Skipped where Horovod is not installed; slow (horovodrun jobs)."""
    skip = pytest.mark.skipif(HOROVOD_REASON is not None, reason=HOROVOD_REASON or "")
    return pytest.mark.slow(skip(test))


TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(TESTS_DIR)
#: Two ranks share 2 cores: one thread each.
ENV = dict(os.environ, OMP_NUM_THREADS="1", MXNET_CPU_WORKER_NTHREADS="1",
           PYTHONPATH=os.pathsep.join([REPO, TESTS_DIR, os.environ.get("PYTHONPATH", "")]))
JOB_TIMEOUT = 120
#: Float16 weights of two ranks against one process on the same global batch: each step's gradient
#: is rounded to float16 once in one process, and per half batch then again after the sum on two
#: ranks (relative error 2**-11 each), over 16 steps with momentum: measured at most 1.6e-3 of the
#: largest weight; the bound allows eight such roundings.
REFERENCE_RTOL = 8 * 2.0 ** -11
TINY = ["--network", "mobilenet0.25", "--num-classes", "4", "--image-shape", "3,32,32",
        "--batch-size", "8", "--max-batches", "2", "--dtype", "float16", "--benchmark", "1",
        "--disp-batches", "1", "--lr", "0.01"]


def run(argv, timeout=JOB_TIMEOUT, env=None):
    return subprocess.run(argv, cwd=REPO, env=env or ENV, capture_output=True, text=True,
                          timeout=timeout)


def launch(command, num_workers=2):
    """``scripts/launch.py --launcher horovod -n 2 -- <command>``: horovodrun over Gloo."""
    return run([sys.executable, os.path.join(SCRIPTS_DIR, "launch.py"), "--launcher", "horovod",
                "-n", str(num_workers), "--timeout", str(JOB_TIMEOUT - 10), "--", *command])


def train_imagenet(*flags):
    return [sys.executable, os.path.join(SCRIPTS_DIR, "train_imagenet.py"), *flags]


def timed_launch(command):
    """``(launch(command), seconds it took)``."""
    started = time.monotonic()
    job = launch(command)
    return job, time.monotonic() - started


class LaunchPool:
    """Runs launches (functions that start processes and return what they did) in threads, two
    at a time.  The threads only start processes and wait: MXNet runs in this process's main
    thread alone."""

    def __init__(self, workers=2):
        self._executor = concurrent.futures.ThreadPoolExecutor(workers)

    def submit(self, function, *args):
        return self._executor.submit(function, *args)

    def close(self):
        self._executor.shutdown(cancel_futures=True)


@pytest.fixture(scope="module")
def pool():
    launches = LaunchPool()
    yield launches
    launches.close()


#: The fixtures that start launches (the pool's the longest first; the hanging job's beside them).
LAUNCH_FIXTURES = ("hanging_launch", "resume_launches", "worker_launch", "nvidia_launch",
                   "different_flags_launch", "dying_rank_launch", "one_process_launch")


@pytest.fixture(scope="module", autouse=True)
def background(request, pool):
    """At the module's first test, submit every launch that the selected tests of this module use:
    one job's processes leave a core idle at times (horovodrun's start, the rendezvous, one-process
    runs), two jobs keep both cores busy."""
    if HOROVOD_REASON:
        return
    used = {name for item in request.session.items if getattr(item, "module", None) is request.module
            for name in getattr(item, "fixturenames", ())}
    for name in LAUNCH_FIXTURES:
        if name in used:
            request.getfixturevalue(name)


@needs_horovod
def test_allreduce_benchmark_quick_halves_the_bytes_in_float16(load_benchmark, tmp_path,
                                                               monkeypatch):
    """In this process (its Horovod jobs are its own subprocesses), one thread per rank; the
    module's first test, so that it runs here while the launches run in the background."""
    for name in ("OMP_NUM_THREADS", "MXNET_CPU_WORKER_NTHREADS", "PYTHONPATH"):
        monkeypatch.setenv(name, ENV[name])
    assert load_benchmark("horovod_allreduce").main(["--quick", "--out-dir", str(tmp_path)]) == 0
    record = json.load(open(tmp_path / "horovod_allreduce.json"))
    ratios = {row["gradients"]: row["vs_float32"] for row in record["bytes"]}
    assert 0.5 < ratios["float16"] < 0.55  # BatchNorm's gamma and beta stay float32
    assert ratios["float32, Horovod fp16 compression"] == 0.5
    assert [row["processes"] for row in record["throughput"]] == [1, 2]
    assert [row["gradients"] for row in record["allreduce"]] == ["float32", "float16"]


@pytest.fixture(scope="module")
def worker_launch(pool, tmp_path_factory):
    """``(out_dir, job, reference)``: a 2-rank horovodrun job of the worker and the one-process
    reference, writing to ``out_dir`` (futures)."""
    out = tmp_path_factory.mktemp("horovod")
    worker = os.path.join(TESTS_DIR, "horovod_worker.py")
    job = pool.submit(run, ["horovodrun", "-np", "2", "-H", "localhost:2", "--gloo",
                            sys.executable, worker, str(out)])
    return out, job, pool.submit(run, [sys.executable, worker, str(out)])


@pytest.fixture(scope="module")
def worker_results(worker_launch):
    """The worker's arrays from a 2-rank horovodrun job and from the one-process reference."""
    out, job, reference = worker_launch
    job, reference = job.result(), reference.result()
    assert job.returncode == 0, job.stdout[-3000:] + job.stderr[-3000:]
    assert reference.returncode == 0, reference.stderr[-3000:]
    results = {(api, name): dict(np.load(out / f"{api}-{name}.npz"))
               for api in ("gluon", "module") for name in ("rank0-of2", "rank1-of2", "rank0-of1")}
    results["compressed"] = [np.load(out / f"compressed-rank{rank}.npy") for rank in (0, 1)]
    results["gan"] = [dict(np.load(out / f"gan-rank{rank}.npz")) for rank in (0, 1)]
    return results


def weights(arrays):
    return {key: value for key, value in arrays.items() if key.startswith(("param:", "master:"))}


@needs_horovod
@pytest.mark.parametrize("api", ["gluon", "module"])
def test_both_ranks_end_with_bit_identical_weights(worker_results, api):
    rank0, rank1 = worker_results[api, "rank0-of2"], worker_results[api, "rank1-of2"]
    assert weights(rank0) and weights(rank0).keys() == weights(rank1).keys()
    for key, value in weights(rank0).items():
        assert value.dtype == (np.float32 if key.startswith("master:") else np.float16), key
        np.testing.assert_array_equal(value, rank1[key], err_msg=key)


@needs_horovod
@pytest.mark.parametrize("api", ["gluon", "module"])
def test_two_ranks_equal_one_process_on_the_same_global_batch(worker_results, api):
    two, one = worker_results[api, "rank0-of2"], worker_results[api, "rank0-of1"]
    for key, value in weights(one).items():
        error = np.abs(two[key].astype(np.float64) - value).max()
        assert error <= REFERENCE_RTOL * np.abs(value).max(), (key, error)


@needs_horovod
@pytest.mark.parametrize("api", ["gluon", "module"])
def test_an_overflow_on_rank_1_alone_skips_the_step_on_both_with_the_same_scale(worker_results,
                                                                               api):
    rank0, rank1, one = (worker_results[api, name] for name in ("rank0-of2", "rank1-of2",
                                                                 "rank0-of1"))
    assert rank0["skipped"].tolist() == rank1["skipped"].tolist() == [horovod_worker.INF_STEP]
    # the 'auto' start (measured on the summed gradients), growth and back-off, step by step
    np.testing.assert_array_equal(rank0["scales"], rank1["scales"])
    np.testing.assert_array_equal(rank0["scales"], one["scales"])
    step = horovod_worker.INF_STEP
    assert rank0["scales"][step] == rank0["scales"][step - 1] / 2


@needs_horovod
def test_clipping_measures_the_same_unscaled_global_norm_on_every_rank(worker_results):
    rank0, rank1, one = (worker_results["gluon", name] for name in ("rank0-of2", "rank1-of2",
                                                                     "rank0-of1"))
    np.testing.assert_array_equal(rank0["norms"], rank1["norms"])
    assert not np.isfinite(rank0["norms"][horovod_worker.INF_STEP])
    finite = np.isfinite(one["norms"])
    np.testing.assert_allclose(rank0["norms"][finite], one["norms"][finite], rtol=1e-2)


@needs_horovod
def test_gradients_travel_in_float16(worker_results):
    """Every step allreduces each float16 gradient once: 2 bytes per value."""
    rank0 = worker_results["gluon", "rank0-of2"]
    values = sum(value.size for key, value in rank0.items() if key.startswith("param:"))
    assert values == 8 * 16 + 16 + 16 * 2 + 2
    assert int(rank0["bytes"]) == horovod_worker.NUM_STEPS * values * 2


@needs_horovod
def test_two_trainers_each_on_its_own_prefixed_kvstore_and_not_on_a_shared_one(worker_results):
    rank0, rank1 = worker_results["gan"]
    for key in ("net0", "net1"):
        np.testing.assert_array_equal(rank0[key], rank1[key])
    assert "already serves another Trainer" in str(rank0["error"])
    assert "kvstore=mxfp16.distributed.horovod.Horovod(prefix='discriminator.')" in str(rank0["error"])


@needs_horovod
def test_fp16_compression_sends_float32_gradients_as_float16(worker_results):
    """The sum of the float16 roundings, rounded to float16 (inf past its max), back in float32."""
    halves = [horovod_worker.compressed_values(rank).astype(np.float16) for rank in (0, 1)]
    with np.errstate(over="ignore"):
        expected = (halves[0] + halves[1]).astype(np.float32)
    assert np.isinf(expected[2])
    for result in worker_results["compressed"]:
        assert result.dtype == np.float32
        np.testing.assert_array_equal(result, expected)


@pytest.fixture(scope="module")
def dying_rank_launch(pool, tmp_path_factory):
    out = tmp_path_factory.mktemp("dying")
    return pool.submit(timed_launch, [sys.executable, os.path.join(TESTS_DIR, "horovod_worker.py"),
                                      str(out), "--die-at", "3"])


@needs_horovod
def test_a_dying_rank_ends_the_job_at_once_with_its_exit_code(dying_rank_launch):
    job, seconds = dying_rank_launch.result()
    # rank 1's exit (3), or rank 0's error from the broken connection (1), whichever horovodrun
    # sees first: the job's code is that process's, not horovodrun's own 1
    assert "Horovod detected that one or more processes exited with non-zero status" in job.stderr
    first = {3: "Horovod process 1 failed first, with exit code 3: stopping the job",
             1: "Horovod process 0 failed first, with exit code 1: stopping the job"}
    assert first.get(job.returncode, "no such line") in job.stderr, job.stderr[-2000:]
    assert seconds < JOB_TIMEOUT - 10  # ended by the failure, not the timeout


def resume_sequence(api, run_dir):
    """Two ranks train an epoch, one process resumes it, two ranks resume that:
    ``[(processes, CompletedProcess)]``, up to the first failure.  Each way across is one resume:
    a 2-rank checkpoint read by one process and one process's read by 2 ranks (2 ranks reading
    their own is the multi-host tests' and tests/test_slurm.py's)."""
    prefix = str(run_dir / "r")
    runs = [(2, []), (1, ["--resume", prefix]), (2, ["--resume", prefix])]
    jobs = []
    for epochs, (processes, resume) in enumerate(runs, start=1):
        flags = TINY + ["--api", api, "--model-prefix", prefix, "--num-epochs", str(epochs),
                        *resume]
        if processes == 2:
            job = launch(train_imagenet("--kv-store", "horovod", *flags))
        else:
            job = run(train_imagenet("--kv-store", "device", *flags))
        jobs.append((processes, job))
        if job.returncode != 0:
            break
    return jobs


@pytest.fixture(scope="module")
def resume_launches(pool, tmp_path_factory):
    """API -> the future of its :func:`resume_sequence`, and its run directory."""
    run_dirs = {api: tmp_path_factory.mktemp(f"resume-{api}") / "run" for api in ("gluon", "module")}
    return {api: (pool.submit(resume_sequence, api, run_dir), run_dir)
            for api, run_dir in run_dirs.items()}


@needs_horovod
@pytest.mark.parametrize("api", ["gluon", "module"])
def test_script_checkpoints_resume_on_one_process_and_on_two(resume_launches, api):
    """Two ranks train an epoch, one process resumes it, two ranks resume that; only rank 0 logs
    and saves, and each run continues the update count and the loss scale."""
    future, run_dir = resume_launches[api]
    jobs = future.result()
    for epochs, (processes, job) in enumerate(jobs, start=1):
        if processes == 2:
            assert not [line for line in job.stdout.splitlines()
                        if line.startswith("[1]") and " INFO " in line]  # rank 1: warnings only
        assert job.returncode == 0, job.stdout[-2000:] + job.stderr[-2000:]
        assert f"{api}): {epochs} epochs" in job.stdout or epochs == 1
    assert len(jobs) == 3
    records = [json.loads(line) for line in open(run_dir / "metrics.jsonl")]
    starts = [r for r in records if r["event"] == "start"]
    ends = [r for r in records if r["event"] == "epoch"]
    assert [r["epoch"] for r in ends] == [0, 1, 2]  # one record per epoch: rank 0's only
    assert [r["num_update"] for r in starts] == [0] + [r["num_update"] for r in ends[:-1]]
    assert [end["num_update"] - start["num_update"] + end["skipped_steps"]
            for start, end in zip(starts, ends)] == [2, 2, 2]  # 2 steps an epoch
    assert [r["loss_scale"] for r in starts[1:]] == [r["loss_scale"] for r in ends[:-1]]
    log_text = open(run_dir / "train.log").read()
    assert log_text.count("Horovod: rank 0 of 2 processes") == 2


#: MXNet's example fit.py command for Horovod (example/distributed_training-horovod).
EXAMPLE_COMMAND = train_imagenet(
    "--network", "resnet", "--num-layers", "20", "--kv-store", "horovod", "--image-shape",
    "3,28,28", "--num-classes", "4", "--num-epochs", "1", "--max-batches", "1", "--batch-size", "4",
    "--benchmark", "1", "--dtype", "float32", "--gc-type", "fp16")


@pytest.fixture(scope="module")
def one_process_launch(pool):
    """:data:`EXAMPLE_COMMAND` as one process, without horovodrun: a Horovod job of one rank (the
    commands reach the ranks through horovodrun in every other job of this module)."""
    return pool.submit(run, EXAMPLE_COMMAND)


@needs_horovod
def test_mxnet_example_horovod_command_with_its_network_flag(one_process_launch):
    """MXNet's example fit.py command: ``--network`` reaches the script; float32 gradients travel
    as float16 with ``--gc-type fp16`` (summed over 2 ranks: horovod_worker's compressed values)."""
    job = one_process_launch.result()
    assert job.returncode == 0, job.stdout[-2000:] + job.stderr[-2000:]
    assert "cifar_resnet20_v2 float32" in job.stdout
    assert "--gc-type fp16: float32 gradients are sent and summed as float16" in job.stdout


class RankOfThree:
    """Horovod as rank ``rank`` of 3 sees it: ``allreduce_`` records what this rank sends."""
    Sum = "sum"

    def __init__(self, rank, sent):
        self._rank, self.sent = rank, sent

    def rank(self):
        return self._rank

    def allreduce_(self, array, op, name, priority=0):
        assert op == self.Sum and name == "mxfp16.bcast.7"
        self.sent[self._rank] = array.asnumpy()

    def broadcast_(self, *args, **kwargs):
        raise AssertionError("Horovod's broadcast_ reads its name after MXNet may have freed it")


def test_the_kvstores_broadcast_is_an_allreduce_that_gives_rank_0s_bits_on_every_rank():
    """Every rank but 0 sends -0.0, so the sum is rank 0's value bit for bit (-0.0 and inf
    included), without Horovod's broadcast_ (see Horovod._broadcast_)."""
    import mxnet as mx
    from mxfp16.distributed.horovod import Horovod
    value = np.array([1.5, -0.0, 0.0, np.inf, -3.0, 65504, 2 ** -24], dtype=np.float16)
    sent = {}
    for rank in range(3):
        kv = Horovod.__new__(Horovod)  # no Horovod library: its calls are RankOfThree's
        kv._hvd, kv._prefix = RankOfThree(rank, sent), "mxfp16."
        own = value if rank == 0 else value[::-1] - rank  # the other ranks' own weights
        kv.broadcast(7, mx.nd.array(own, dtype="float16"),
                     out=mx.nd.zeros(value.shape, dtype="float16"))
    total = sent[2] + (sent[1] + sent[0])  # one order of a ring allreduce's sums
    assert total.view(np.uint16).tolist() == value.view(np.uint16).tolist()


def test_gc_type_fp16_is_horovods_and_only_horovods():
    from mxfp16.train.cli.config import TrainConfig
    with pytest.raises(ValueError, match="--gc-type fp16 is Horovod's float16 compression"):
        TrainConfig(gc_type="fp16").checked()
    assert TrainConfig(gc_type="fp16", kv_store="horovod").checked().gc_type == "fp16"


@needs_horovod
def test_horovod_kvstore_without_horovodrun_says_so_in_the_first_line(one_process_launch):
    job = one_process_launch.result()
    assert job.returncode == 0, job.stderr[-2000:]
    first = job.stdout.splitlines()[0]
    assert "WARNING --kv-store horovod with 1 process: this run was not started by horovodrun" \
        in first


FAKE_HOROVOD = {
    "missing": {"horovod/__init__.py": "raise ImportError('No module named horovod')\n"},
    "without_mxnet": {
        "horovod/__init__.py": "__version__ = '0.28.1'\n",
        "horovod/mxnet/__init__.py": "raise ImportError('Extension horovod.mxnet has not been "
                                     "built: /x/mpi_lib.so not found')\n"},
}


@pytest.mark.parametrize("case, words", [
    ("missing", "--kv-store horovod needs Horovod, which is not installed: pip install wheel && "
                "HOROVOD_WITH_MXNET=1"),
    ("without_mxnet", "Horovod 0.28.1 was built without MXNet support: reinstall it with "
                      "HOROVOD_WITH_MXNET=1 after MXNet"),
])
def test_horovod_missing_or_without_mxnet_is_one_error_line(tmp_path, monkeypatch, capfd, case,
                                                           words):
    """In this process (no Horovod library is loaded: the stand-in fails first), with the stand-in
    package first on the path and any real ``horovod`` modules set aside."""
    for path, text in FAKE_HOROVOD[case].items():
        os.makedirs(os.path.dirname(tmp_path / path), exist_ok=True)
        (tmp_path / path).write_text(text)
    for name in [name for name in sys.modules if name.split(".")[0] == "horovod"]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.syspath_prepend(str(tmp_path))
    capfd.readouterr()
    assert load_script_main("train_imagenet")(["--kv-store", "horovod", *TINY]) == 2
    lines = capfd.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and words in lines[0], lines


class FakeKVStore:
    def __init__(self, *every):
        self.every = list(every)

    def allgather_object(self, obj, name):
        return self.every


def test_ranks_started_with_different_flags_are_one_error_naming_them():
    own = {"lr": 0.1, "loss_scale": "dynamic", "log_file": "a.log"}
    other = {"lr": 0.2, "loss_scale": "dynamic", "log_file": "b.log"}
    with pytest.raises(ValueError, match=r"different settings \(lr: rank 0 0.1, rank 1 0.2\)"):
        check_same_flags(FakeKVStore(own, other), own)
    check_same_flags(FakeKVStore(own, dict(own, log_file="b.log")), own)  # per-rank files


@pytest.fixture(scope="module")
def different_flags_launch(pool):
    command = " ".join(train_imagenet("--kv-store", "horovod", *TINY[:-2], "--num-epochs", "1"))
    return pool.submit(launch, ["sh", "-c", f"exec {command} --lr 0.0$((HOROVOD_RANK+1))"])


@needs_horovod
def test_ranks_started_with_different_flags_stop_together_with_one_line_each(
        different_flags_launch):
    job = different_flags_launch.result()
    assert job.returncode == 2  # the ranks' code for a user error, not horovodrun's 1
    line = ("error: the Horovod ranks were started with different settings (lr: rank 0 0.01, "
            "rank 1 0.02): start every rank with the same command line")
    # Both ranks raise it; horovodrun may stop the second before it prints.
    assert f"[0]<stderr>:{line}" in job.stderr or f"[1]<stderr>:{line}" in job.stderr


def test_horovodrun_gets_the_command_as_one_shell_argument(monkeypatch):
    if HOROVOD_REASON:
        pytest.skip(HOROVOD_REASON)
    argv = horovodrun_argv(["python", "train.py", "--network", "resnet", "--name", "a b"], 2)
    assert argv[1:] == ["-np", "2", "-H", "localhost:2", "--gloo", "sh", "-c",
                        "exec python train.py --network resnet --name 'a b'"]
    hosts = [Host("n1", port=2222, address="10.0.0.1"), Host("n2", "me", 2222, "10.0.0.2")]
    monkeypatch.setattr(getpass, "getuser", lambda: "me")
    argv = horovodrun_argv(["python", "train.py"], 4, hosts=hosts)
    assert argv[4:7] == ["10.0.0.1:2,10.0.0.2:2", "-p", "2222"]
    assert argv[-1].startswith(f"exec {sys.executable} -c ") and argv[-1].endswith(
        f" run 25.0 stdout -- {sys.executable} train.py")  # under the agent, this Python
    with pytest.raises(LaunchError, match="horovodrun takes one ssh port for every host, the "
                                          "hostfile has 22, 2222"):
        horovodrun_argv(["python"], 2, hosts=[Host("n1", address="10.0.0.1"), hosts[1]])
    with pytest.raises(LaunchError, match="horovodrun cannot log in to root@n2:2222 as root"):
        horovodrun_argv(["python"], 2, hosts=[Host("n2", "root", 2222, "10.0.0.2")])


def test_without_horovodrun_the_launcher_gives_the_whole_install_command(monkeypatch):
    """launch.py --launcher horovod and --kv-store horovod name the same build command."""
    from mxfp16.distributed.horovod import INSTALL_COMMAND
    from mxfp16.train.launch.plan import LaunchError
    monkeypatch.setattr("shutil.which", lambda name: None)
    with pytest.raises(LaunchError) as raised:
        horovodrun_argv(["python", "train.py"], 2)
    assert str(raised.value).endswith(f": {INSTALL_COMMAND}")
    assert "--no-build-isolation" in INSTALL_COMMAND and "HOROVOD_WITH_MXNET=1" in INSTALL_COMMAND


@pytest.fixture(scope="module")
def nvidia_launch(pool, rec_files, tmp_path_factory):
    """``(future, out_dir)``: the command NVIDIA's ``runner -n 2 -b 4 --model-prefix model`` execs
    for float16 and DALI, with ``--gpus 0,1`` dropped and the network and data made small
    (appended flags)."""
    tmp_path = tmp_path_factory.mktemp("nvidia")
    command = train_imagenet(
        "--data-train", rec_files.train_rec, "--data-train-idx", rec_files.train_idx,
        "--data-val", rec_files.val_rec, "--data-val-idx", rec_files.val_idx, "--dtype", "float16",
        "--image-shape", "4,32,32", "--fuse-bn-relu", "1", "--fuse-bn-add-relu", "1",
        "--input-layout", "NCHW", "--conv-layout", "NHWC", "--batchnorm-layout", "NHWC",
        "--pooling-layout", "NHWC", "--kv-store", "horovod", "--data-backend", "dali-gpu",
        "--lr", "0.0078125", "--batch-size", "8", "--num-epochs", "1",
        "--model-prefix", str(tmp_path / "model"),
        "--num-layers", "18", "--num-classes", "4", "--max-batches", "2")
    return pool.submit(launch, command), tmp_path


@needs_horovod
def test_nvidia_runner_command_under_horovod(nvidia_launch):
    """NVIDIA's runner command (see :func:`nvidia_launch`) under horovodrun."""
    future, tmp_path = nvidia_launch
    job = future.result()
    assert job.returncode == 0, job.stdout[-2000:] + job.stderr[-2000:]
    assert "--arch resnetv15 --num-layers 18 is the model zoo's resnet18_v1b" in job.stdout
    assert "resnet18_v1b float16 (gluon): 1 epoch" in job.stdout
    assert os.path.exists(tmp_path / "model-0001.params")


def test_validation_counts_are_summed_over_the_ranks_before_dividing():
    """Each Horovod rank validates its shard; the accuracy is that of the summed counts."""
    import mxnet as mx
    import mxfp16
    from mxnet.gluon import nn
    from mxfp16.models import block_to_network
    from mxfp16.train.data import synthetic_iter
    from mxfp16.train.gluon_api import GluonAPI
    from mxfp16.train.loop import evaluate

    net = nn.Dense(3, in_units=12, prefix="fc_")
    net.initialize()
    api = GluonAPI(block_to_network(net), mxfp16.StaticLossScaler(1, enabled=False),
                   ctx=[mx.cpu()], dtype="float32", kvstore="device", optimizer="sgd",
                   optimizer_params={})
    val = synthetic_iter(4, (3, 2, 2), 3, 2)
    seen = []

    def other_rank_adds(totals):  # the other rank: 8 samples, 2 top-1 hits, all top-3 hits
        seen.append(list(totals))
        return [totals[0] + 2, totals[1] + 8, totals[2] + 8]

    top1, top3 = evaluate(api, val, top_k=3, num_classes=3, reduce=other_rank_adds)
    hits, _, count = seen[0]
    assert count == 8 and top3 == 1.0
    assert top1 == (hits + 2) / 16


def test_a_horovod_command_on_the_parameter_server_launcher_is_one_error():
    from mxfp16.train.launch.plan import LaunchError, plan_processes
    with pytest.raises(LaunchError, match="the command trains with --kv-store horovod, which the "
                                          "local launcher's scheduler and servers do not serve"):
        plan_processes(["python", "train.py", "--kv-store", "horovod"], 2, 1)
    assert len(plan_processes(["python", "train.py", "--kv-store", "dist_sync"], 2, 1)) == 4


#: Writes its pid first (before the slow imports, so a loaded machine still writes it in time).
HANGING_RANK = """
import os, sys, time
rank = int(os.environ["HOROVOD_RANK"])
open(os.path.join(sys.argv[1], "pid-%d" % rank), "w").write(str(os.getpid()))
import mxnet as mx
import mxfp16.distributed.horovod
kv = mx.kv.create("horovod")
if rank == 1:
    time.sleep(300)
kv.pushpull(0, mx.nd.ones(3))  # rank 0 waits here for rank 1
"""


#: Seconds before the launcher stops the hanging job, which starts with the module's first test
#: (beside the other launches): the ranks must have started (and written their pids) by then;
#: horovodrun, whose own check of its build imports MXNet in a process of its own, started them
#: 7-9 s after the launch on 2 cores loaded 6-fold, with nothing else of this module running.
HANGING_TIMEOUT = 60


@pytest.fixture(scope="module")
def hanging_launch(request, tmp_path_factory):
    """``(result, out_dir)``: the launcher's job of :data:`HANGING_RANK`, started ahead
    (conftest.started_ahead) so that its timeout runs out while the module's other tests run."""
    out = tmp_path_factory.mktemp("hanging")
    script = out / "hang.py"
    script.write_text(HANGING_RANK)
    argv = [sys.executable, os.path.join(SCRIPTS_DIR, "launch.py"), "--launcher", "horovod", "-n",
            "2", "--timeout", str(HANGING_TIMEOUT), "--", sys.executable, str(script), str(out)]
    test = "test_a_hanging_rank_is_stopped_with_the_whole_job_at_the_timeout"
    with started_ahead(request, test, argv, HANGING_TIMEOUT + 60, cwd=REPO, env=ENV) as result:
        yield result, out


@needs_horovod
def test_a_hanging_rank_is_stopped_with_the_whole_job_at_the_timeout(hanging_launch):
    result, out = hanging_launch
    job = result()
    assert job.returncode == 124, job.stderr[-2000:]
    assert "error: the job ran past its timeout and was stopped" in job.stderr
    pids = [int((out / f"pid-{rank}").read_text()) for rank in (0, 1)]
    deadline = time.monotonic() + 5
    while any(os.path.exists(f"/proc/{pid}") for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [pid for pid in pids if os.path.exists(f"/proc/{pid}")]
