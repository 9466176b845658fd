"""mxfp16.train.launch.launcher and scripts/launch.py: a real dist_sync job of 2 float16 workers on 127.0.0.1,
failure and timeout handling, the ssh command lines, and the script's user errors."""
import os
import shlex
import signal
import subprocess
import sys
import contextlib
import time
from dataclasses import replace

import numpy as np
import pytest

from mxfp16.train.launch import plan as launch_plan
from mxfp16.train.launch.hosts import parse_host, read_hostfile
from mxfp16.train.launch import processes
from mxfp16.train.launch.plan import LaunchError, plan_processes
from mxfp16.train.launch.launcher import launch

import dist_worker
from conftest import chosen_items, started_ahead

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
TRAIN_IMAGENET = os.path.join(os.path.dirname(TESTS_DIR), "scripts", "train_imagenet.py")
#: Two workers, a server and a scheduler share 2 cores: one thread each.
ONE_THREAD = {"OMP_NUM_THREADS": "1", "MXNET_CPU_WORKER_NTHREADS": "1"}
JOB_TIMEOUT = 80

#: A worker that starts a grandchild (``sleep``), records the pids in ``<dir>/pids-<task>``, and
#: then either sleeps (task 0, or every task with 'hang') or exits with code 3 once task 0's pids
#: are written.
STUCK_OR_FAILING_WORKER = """
import os, subprocess, sys, time
out_dir, mode = sys.argv[1], sys.argv[2]
task = os.environ["DMLC_TASK_ID"]
child = subprocess.Popen(["sleep", "60"])
with open(os.path.join(out_dir, "pids-" + task + ".tmp"), "w") as f:
    f.write("%d %d" % (os.getpid(), child.pid))
os.rename(os.path.join(out_dir, "pids-" + task + ".tmp"), os.path.join(out_dir, "pids-" + task))
if mode == "hang" or task == "0":
    time.sleep(60)
for _ in range(200):
    if os.path.exists(os.path.join(out_dir, "pids-0")):
        break
    time.sleep(0.1)
sys.exit(3)
"""


@pytest.fixture
def launch_main(script_main):
    return script_main("launch")


def alive(pid):
    """Whether a process exists and is not a zombie (reaped or not, a zombie has stopped)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False


def recorded_pids(out_dir):
    return [int(pid) for name in os.listdir(out_dir) if name.startswith("pids-")
            for pid in (out_dir / name).read_text().split()]


def job_logs(log_dir):
    """The last lines of every process's log, for assertion messages."""
    if not os.path.isdir(log_dir):
        return "(no logs)"
    return "\n".join(f"--- {name}\n" + "\n".join(open(os.path.join(log_dir, name), errors="replace")
                                                  .read().splitlines()[-15:])
                     for name in sorted(os.listdir(log_dir)))


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """The records of tests/dist_worker.py run as 2 workers + 1 server, by rank."""
    out_dir = tmp_path_factory.mktemp("dist")
    log_dir = out_dir / "logs"
    start = time.monotonic()
    code = launch([sys.executable, os.path.join(TESTS_DIR, "dist_worker.py"), str(out_dir)],
                  num_workers=2, num_servers=1, timeout=JOB_TIMEOUT, env=ONE_THREAD,
                  log_dir=str(log_dir))
    assert code == 0, job_logs(log_dir)
    print(f"2-worker float16 job: {time.monotonic() - start:.1f} s")
    return [dict(np.load(out_dir / f"worker-{rank}.npz")) for rank in range(2)]


@pytest.mark.slow
def test_workers_know_their_rank_and_the_job_size(trained):
    assert [int(record["rank"]) for record in trained] == [0, 1]
    assert [int(record["num_workers"]) for record in trained] == [2, 2]


@pytest.mark.slow
def test_gradients_are_summed_over_the_workers(trained):
    first, second = trained
    assert first["aggregated_grads"].shape == (len(dist_worker.GRAD_STEPS), 16, 8)
    assert first["aggregated_grads"].dtype == np.float16
    for step, local0, local1, aggregated0, aggregated1 in zip(
            dist_worker.GRAD_STEPS, first["local_grads"], second["local_grads"],
            first["aggregated_grads"], second["aggregated_grads"]):
        assert not np.array_equal(local0, local1), step  # different shards
        assert np.all(np.isfinite(aggregated0)), step
        np.testing.assert_array_equal(aggregated0, aggregated1, err_msg=f"step {step}")
        np.testing.assert_array_equal(aggregated0, local0 + local1, err_msg=f"step {step}")


@pytest.mark.slow
def test_inf_in_one_workers_batch_makes_every_worker_skip(trained):
    first, second = trained
    assert dist_worker.INF_STEP in first["skipped"].tolist()
    np.testing.assert_array_equal(first["skipped"], second["skipped"])
    assert len(first["skipped"]) == len(second["skipped"]) > 0
    assert first["loss_scale"] == second["loss_scale"]


@pytest.mark.slow
def test_every_worker_measures_the_same_auto_start(trained):
    first, second = trained
    assert 0 not in first["skipped"].tolist()  # the measuring step updates
    start = float(first["start_scale"])
    assert start == float(second["start_scale"]) and start > 1
    assert start == 2.0 ** round(np.log2(start))  # a power of two


@pytest.mark.slow
def test_workers_end_with_identical_float16_weights(trained):
    # The workers initialise differently (dist_worker.make_net): equal weights need the Trainer's
    # broadcast of rank 0's weights as well as identical updates.
    first, second = trained
    names = [key for key in first if key.startswith("param:")]
    assert len(names) == 4
    for name in names:
        assert first[name].dtype == np.float16, name
        assert np.array_equal(first[name], second[name]), name


@pytest.mark.slow
def test_training_converges(trained):
    for record in trained:
        losses = record["losses"][np.isfinite(record["losses"])]
        assert losses[-10:].mean() < 0.25 * losses[:3].mean(), losses
        assert record["accuracy"] > 0.9  # chance: about 0.5


def test_first_failing_worker_code_is_returned_and_every_process_stopped(tmp_path):
    start = time.monotonic()
    code = launch([sys.executable, "-c", STUCK_OR_FAILING_WORKER, str(tmp_path), "fail"],
                  num_workers=2, num_servers=1, timeout=JOB_TIMEOUT, log_dir=str(tmp_path / "logs"))
    assert code == 3, job_logs(tmp_path / "logs")
    assert time.monotonic() - start < 30
    pids = recorded_pids(tmp_path)
    assert len(pids) == 4  # two workers and their grandchildren
    assert not [pid for pid in pids if alive(pid)]


@pytest.mark.slow
def test_script_timeout_stops_every_process_and_exits_124(launch_main, tmp_path, capsys):
    start = time.monotonic()
    code = launch_main(["-n", "2", "-s", "1", "--timeout", "6", "--log-dir", str(tmp_path / "logs"),
                        "--", sys.executable, "-c", STUCK_OR_FAILING_WORKER, str(tmp_path), "hang"])
    assert code == 124
    assert time.monotonic() - start < 6 + processes.KILL_GRACE + 10
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: the job ran past its timeout"), err
    pids = recorded_pids(tmp_path)
    assert len(pids) == 4, job_logs(tmp_path / "logs")
    assert not [pid for pid in pids if alive(pid)]


def test_ssh_plan_places_processes_round_robin_and_exports_the_dmlc_variables(monkeypatch):
    for name in list(os.environ):
        if name in launch_plan.forwarded_env():
            monkeypatch.delenv(name)
    for name, value in [("PS_VERBOSE", "1"), ("MALLOC_MMAP_THRESHOLD_", "65536"),
                        ("MXNET_ENGINE_TYPE", "NaiveEngine"), ("UNRELATED_SECRET", "x")]:
        monkeypatch.setenv(name, value)
    command = ["python", "train.py", "--kv-store", "dist_sync", "--name", "a b"]
    hosts = [replace(parse_host("node1"), address="10.0.0.1"),
             replace(parse_host("admin@node2:2222"), address="10.0.0.2")]
    specs = plan_processes(command, num_workers=3, num_servers=2, launcher="ssh", hosts=hosts,
                           root_uri="10.0.0.1", root_port=9000, env={"OMP_NUM_THREADS": "2"},
                           workdir="/shared/run dir", job_id="j1")
    assert [(spec.name, spec.host) for spec in specs] == [
        ("scheduler 0", "10.0.0.1"), ("server 0", "10.0.0.1"), ("server 1", "10.0.0.2"),
        ("worker 0", "10.0.0.1"), ("worker 1", "10.0.0.2"), ("worker 2", "10.0.0.1")]
    scheduler = specs[0]
    assert scheduler.argv == (sys.executable, "-c", "import mxnet")
    assert scheduler.env["DMLC_ROLE"] == "scheduler" and scheduler.env["DMLC_PS_ROOT_PORT"] == "9000"
    for spec, task in zip(specs[1:], [3, 4, 0, 1, 2]):
        port, target = (["-p", "2222"], "admin@node2") if spec.host == "10.0.0.2" else ([], "node1")
        assert spec.env == {} and spec.remote.target == target
        assert list(spec.argv[:-1]) == ["ssh", *launch_plan.SSH_OPTIONS, *port, target]
        words = shlex.split(spec.argv[-1])
        assert words[:3] == ["cd", "/shared/run dir", "&&"] and words[3] == "export"
        split = words.index("exec")
        exports = dict(word.split("=", 1) for word in words[4:split - 1])
        assert exports == {
            "PYTHONUNBUFFERED": "1", "PS_VERBOSE": "1", "MALLOC_MMAP_THRESHOLD_": "65536",
            "MXNET_ENGINE_TYPE": "NaiveEngine", "OMP_NUM_THREADS": "2", "MXFP16_JOB_ID": "j1",
            "DMLC_ROLE": spec.role, "DMLC_PS_ROOT_URI": "10.0.0.1", "DMLC_PS_ROOT_PORT": "9000",
            "DMLC_NUM_WORKER": "3", "DMLC_NUM_SERVER": "2", "DMLC_NODE_HOST": spec.host,
            "DMLC_TASK_ID": str(task)}
        # The agent runs the command, a bare python being this interpreter.
        agent = words[split + 1:split + 8]
        assert agent[:2] == [sys.executable, "-c"] and agent[3:] == ["run", "25.0", "stdin", "--"]
        expected = [sys.executable, *command[1:]] if spec.role == "worker" else \
            [sys.executable, "-c", "import mxnet"]
        assert words[split + 8:] == expected and list(spec.command) == expected


def test_ssh_remote_command_runs_in_the_directory_with_the_variables(tmp_path):
    workdir = tmp_path / "run dir; echo injected"
    workdir.mkdir()
    program = "import os, sys; print(os.getcwd(), os.environ['DMLC_ROLE'], sys.argv[1])"
    remote = launch_plan.remote_shell_command([sys.executable, "-c", program, "it's $HOME"],
                                              {"DMLC_ROLE": "worker"}, str(workdir))
    result = subprocess.run(["bash", "-c", remote], capture_output=True, text=True, timeout=30)
    assert result.stdout == f"{workdir} worker it's $HOME\n", result.stderr


@pytest.mark.parametrize("status, signum", [(3, None), (137, signal.SIGKILL), (143, signal.SIGTERM)])
def test_the_remote_agent_exits_with_the_commands_status_128_plus_n_for_a_signal(status, signum):
    program = f"import os, signal; os.kill(os.getpid(), {signum})" if signum else "exit(3)"
    agent = [sys.executable, "-c", launch_plan.agent_source(), "run", "1", "stdout", "--"]
    result = subprocess.run([*agent, sys.executable, "-c", program], stdin=subprocess.DEVNULL,
                            capture_output=True, timeout=30)
    assert result.returncode == status


@pytest.mark.parametrize("signum", [signal.SIGUSR1, signal.SIGTERM])
def test_the_remote_agent_passes_slurms_warnings_on_instead_of_dying_of_them(signum):
    # SLURM signals every process of a step: the agent too, which would die of SIGUSR1 and
    # orphan its command.
    program = ("import signal, sys, time; signal.signal(signal.SIGUSR1, lambda *_: sys.exit(138)); "
               "print('up', flush=True); time.sleep(60)")
    agent = [sys.executable, "-c", launch_plan.agent_source(), "run", "1", "stdout", "--"]
    child = subprocess.Popen([*agent, sys.executable, "-c", program], stdin=subprocess.DEVNULL,
                             stdout=subprocess.PIPE)
    assert child.stdout.readline() == b"up\n"
    child.send_signal(signum)
    assert child.wait(timeout=30) == (138 if signum == signal.SIGUSR1 else 143)


@pytest.mark.parametrize("word", [b"KILL\n", b""])
def test_the_remote_agent_signals_its_command_on_a_word_and_stops_it_when_stdin_ends(word):
    agent = [sys.executable, "-c", launch_plan.agent_source(), "run", "1", "stdin", "--"]
    child = subprocess.Popen([*agent, "sleep", "60"], stdin=subprocess.PIPE)
    child.stdin.write(word)
    child.stdin.flush()
    if not word:
        child.stdin.close()  # the launcher (or its ssh client) is gone
    assert child.wait(timeout=30) == 128 + (signal.SIGKILL if word else signal.SIGTERM)


def test_read_hostfile_skips_comments_and_blank_lines(tmp_path):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("# cluster\nnode1\n\n  admin@node2:2222  # big one\n")
    assert [str(host) for host in read_hostfile(str(hostfile))] == ["node1", "admin@node2:2222"]


@pytest.mark.parametrize("entry", ["node1:ssh", "@node1", "a@b@node1", ":22"])
def test_bad_host_entry_is_rejected(entry):
    with pytest.raises(LaunchError, match=f"bad host entry '{entry}'"):
        parse_host(entry)


@pytest.mark.parametrize("args, message", [
    (["-n", "0", "--", "python", "-c", "pass"], "the number of workers must be a whole number >= 1"),
    (["-n", "2", "-s", "0", "--", "python"], "the number of servers must be a whole number >= 1"),
    (["-n", "2"], "no command to run"),
    (["-n", "2", "--"], "no command to run"),
    (["-n", "2", "-H", "{missing}", "--", "python"], "cannot read hostfile"),
    (["-n", "2", "-H", "{empty}", "--", "python"], "names no host"),
    (["-n", "2", "--launcher", "ssh", "--", "python"], "the ssh launcher needs hosts"),
    (["-n", "2", "--timeout", "0", "--", "python"], "timeout must be a positive number"),
    (["-n", "2", "--env", "MXFP16_UNSET_VARIABLE", "--", "python"], "the variable is not set"),
])
def test_script_user_errors_print_one_line_and_exit_2(launch_main, tmp_path, capsys, args, message):
    (tmp_path / "empty").write_text("\n# nothing\n")
    paths = {"missing": str(tmp_path / "missing"), "empty": str(tmp_path / "empty")}
    assert launch_main([arg.format(**paths) for arg in args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and message in err[0], err


SCRIPT_JOB_TEST = "test_train_imagenet_runs_as_a_two_worker_float16_job"


def script_job_argv(api, log_dir):
    """scripts/launch.py's dist_sync job of train_imagenet.py: 2 float16 workers, 1 server."""
    return [sys.executable, os.path.join(os.path.dirname(TRAIN_IMAGENET), "launch.py"), "-n", "2",
            "-s", "1", "--timeout", str(JOB_TIMEOUT), "--log-dir", str(log_dir), "--env",
            "OMP_NUM_THREADS:1", "--", sys.executable, TRAIN_IMAGENET, "--kv-store", "dist_sync",
            "--api", api, "--dtype", "float16", "--loss-scale", "dynamic", "--benchmark", "1",
            "--network", "cifar_resnet20_v1", "--num-classes", "4", "--image-shape", "3,16,16",
            "--batch-size", "4", "--num-examples", "32", "--num-epochs", "1", "--max-batches", "3"]


@pytest.fixture(scope="module", autouse=True)
def script_jobs(request, tmp_path_factory):
    """API -> ``(result, log_dir)`` of :func:`script_job_argv`, started with this module's first
    test (conftest.started_ahead) for the APIs the session runs :data:`SCRIPT_JOB_TEST` with:
    they train while the jobs and the light tests before them run."""
    apis = {item.callspec.params["api"] for item in chosen_items(request, SCRIPT_JOB_TEST)}
    jobs = {}
    with contextlib.ExitStack() as stack:
        for api in sorted(apis if os.path.exists(TRAIN_IMAGENET) else ()):
            log_dir = tmp_path_factory.mktemp(f"script-{api}") / "logs"
            result = stack.enter_context(started_ahead(
                request, SCRIPT_JOB_TEST, script_job_argv(api, log_dir), JOB_TIMEOUT + 30,
                env=dict(os.environ, PYTHONPATH=os.pathsep.join(
                    [os.path.dirname(TESTS_DIR), os.environ.get("PYTHONPATH", "")]))))
            jobs[api] = result, log_dir
        yield jobs


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists(TRAIN_IMAGENET), reason="scripts/train_imagenet.py not written")
@pytest.mark.parametrize("api", ["gluon", "module"])
def test_train_imagenet_runs_as_a_two_worker_float16_job(script_jobs, api):
    """scripts/launch.py as users type it (started ahead, see :func:`script_jobs`)."""
    result, log_dir = script_jobs[api]
    job = result()
    assert job.returncode == 0, job.stderr[-2000:] + job_logs(log_dir)
