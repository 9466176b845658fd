"""Checkpoints a run can trust (scripts/train_imagenet.py as a hostile but realistic operator meets
it): damaged files passed over or named, no code run from a state file, one run per prefix, stop
signals sent to the whole process group, write failures and bad flags one line each.

Signals are sent when the log shows the batch was reached, never after a fixed sleep.
"""
import glob
import json
import os
import pickle
import resource
import shutil
import signal
import subprocess
import sys
import time

import mxnet as mx
import pytest

import mxfp16
from conftest import SCRIPTS_DIR, load_script_main
from mxfp16.models import Network
from mxfp16.checkpoints.optimizer_states import read_optimizer_states, save_optimizer_states
from mxfp16.train.state import checkpoint

SCRIPT = os.path.join(SCRIPTS_DIR, "train_imagenet.py")
#: float16, dynamic loss scaling, a small network with BatchNorm; synthetic data, 6 batches of 4.
TINY = ["--network", "cifar_resnet20_v1", "--image-shape", "3,16,16", "--num-classes", "4",
        "--top-k", "2", "--dtype", "float16", "--disp-batches", "1", "--optimizer", "adam",
        "--lr", "0.01", "--batch-size", "4"]
SYNTHETIC = ["--benchmark", "1", "--num-examples", "24"]


@pytest.fixture(scope="module")
def train_imagenet():
    return load_script_main("train_imagenet")


def start(args, **popen):
    return subprocess.Popen([sys.executable, SCRIPT, *args], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, **popen)


def finish(process, lines=(), timeout=120):
    """``(exit code, output)`` once the process ended; a process that does not end is killed with
    its whole group (it started its own session), so no worker outlives a failed test."""
    try:
        rest, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        rest, _ = process.communicate()
        raise AssertionError("did not end: " + "".join(lines) + rest) from None
    return process.returncode, "".join(lines) + rest


def wait_for(process, marker):
    """The output lines up to the first containing ``marker``."""
    lines = []
    for line in process.stdout:
        lines.append(line)
        if marker in line:
            return lines
    raise AssertionError("".join(lines))


def error_lines(capsys):
    return [line for line in capsys.readouterr().err.splitlines() if line.strip()]


@pytest.mark.slow
@pytest.mark.parametrize("signum, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signal_to_the_process_group_with_two_data_workers_saves_and_exits(image_folder,
                                                                              tmp_path, signum,
                                                                              code):
    prefix = str(tmp_path / "r")
    process = start(TINY + ["--data-dir", str(image_folder), "--val-fraction", "0.2",
                            "--num-data-workers", "2", "--num-epochs", "2",
                            "--model-prefix", prefix], start_new_session=True)
    lines = wait_for(process, "Epoch[0] Batch[3]")
    os.killpg(process.pid, signum)  # what scancel does, or Ctrl-C in a terminal
    exit_code, output = finish(process, lines)
    assert exit_code == code, output
    name = signal.Signals(signum).name
    assert len([line for line in output.splitlines() if f"stopped by {name}" in line]) == 1
    assert "Traceback" not in output
    assert checkpoint.saved_positions(prefix)[-1][0] == 0


@pytest.fixture(scope="module")
def finished_run(train_imagenet, tmp_path_factory):
    """A run of 2 epochs (6 batches each) with checkpoints r-0001 and r-0002: read-only, tests that
    change it copy it (:func:`copy_run`)."""
    folder = tmp_path_factory.mktemp("finished")
    assert train_imagenet(TINY + SYNTHETIC + ["--num-epochs", "2",
                                              "--model-prefix", str(folder / "r")]) == 0
    return folder


def copy_run(finished_run, tmp_path):
    shutil.copytree(finished_run, tmp_path / "run")
    return str(tmp_path / "run" / "r")


def flip_bits(path, count=8):
    """Invert ``count`` bytes in the middle of a file: same size, other bytes."""
    with open(path, "r+b") as data:
        data.seek(os.path.getsize(path) // 2)
        chunk = data.read(count)
        data.seek(-len(chunk), os.SEEK_CUR)
        data.write(bytes(b ^ 0xFF for b in chunk))


@pytest.mark.parametrize("kind", ["params", "states", "meta"])
def test_a_bit_flip_in_any_file_passes_the_checkpoint_over_with_one_warning(
        finished_run, tmp_path, caplog, kind):
    prefix = copy_run(finished_run, tmp_path)
    damaged = getattr(checkpoint.checkpoint_paths(prefix, 2), kind)
    flip_bits(damaged)
    assert checkpoint.load_checkpoint(prefix).name == prefix + "-0001"  # the newest intact one
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and warnings[0].startswith(f"checkpoint {prefix}-0002 is passed over")
    assert repr(damaged) in warnings[0]


@pytest.mark.parametrize("kind", ["params", "states", "meta"])
def test_a_damaged_checkpoint_named_explicitly_is_one_error_line(
        train_imagenet, finished_run, tmp_path, capsys, kind):
    prefix = copy_run(finished_run, tmp_path)
    damaged = getattr(checkpoint.checkpoint_paths(prefix, 2), kind)
    flip_bits(damaged)
    code = train_imagenet(TINY + SYNTHETIC + ["--num-epochs", "3", "--resume", prefix + "-0002"])
    errors = error_lines(capsys)
    assert code == 2 and len(errors) == 1, errors
    assert errors[0].startswith("error: checkpoint file ") and repr(damaged) in errors[0]


def test_a_damaged_graph_file_is_named_and_not_needed_to_resume(finished_run, tmp_path, caplog):
    prefix = copy_run(finished_run, tmp_path)
    flip_bits(prefix + "-symbol.json")
    loaded = checkpoint.load_checkpoint(prefix)
    assert loaded.name == prefix + "-0002" and loaded.network.symbol is None
    assert [r.getMessage().split(":")[0] for r in caplog.records] == [
        f"graph file {prefix}-symbol.json has other bytes than when it was saved (SHA-256 "
        "differs)"]
    with pytest.raises(checkpoint.CheckpointError, match="symbol.json' has other bytes"):
        checkpoint.verify_mxnet_files(prefix, 2)  # fine-tuning needs the graph: named


def test_non_finite_parameters_are_refused_by_name(tmp_path):
    fc = mx.sym.FullyConnected(mx.sym.var("data"), num_hidden=2, name="fc")
    weight = mx.nd.array([[1, 2, 3], [4, float("nan"), 6]])
    network = Network(fc, {"fc_weight": weight, "fc_bias": mx.nd.zeros(2)}, {})
    prefix = str(tmp_path / "r")
    checkpoint.save_checkpoint(prefix, 1, network, lambda path: save_optimizer_states(path, {}),
                               mxfp16.DynamicLossScaler())
    with pytest.raises(checkpoint.CheckpointError, match="NaN or infinite values in parameter "
                                                         "'fc_weight'"):
        checkpoint.load_checkpoint(prefix)


class _WritesMarker:
    """A pickle that, when loaded, creates the file ``path``: what a crafted .states file does."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_a_pickle_that_would_write_a_marker_file_does_not_write_it(
        train_imagenet, finished_run, tmp_path, capsys):
    prefix = copy_run(finished_run, tmp_path)
    marker = tmp_path / "pwned"
    paths = checkpoint.checkpoint_paths(prefix, 2)
    with open(paths.states, "wb") as states:  # a checkpoint "downloaded from somewhere"
        pickle.dump({0: _WritesMarker(str(marker))}, states)
    meta = json.load(open(paths.meta))  # its author made the marker agree with the files
    for key in ("sha256", "marker_sha256"):
        meta.pop(key)
    meta["files"][os.path.basename(paths.states)] = os.path.getsize(paths.states)
    json.dump(meta, open(paths.meta, "w"))
    base = TINY + SYNTHETIC + ["--num-epochs", "3"]
    assert train_imagenet(base + ["--resume", prefix]) == 2
    errors = error_lines(capsys)
    assert len(errors) == 1 and "has a pickled optimizer state" in errors[0]
    assert "pass --allow-pickle if you trust it" in errors[0]
    params = tmp_path / "gluoncv.params"  # GluonCV's --resume-params/--resume-states
    shutil.copy(paths.params, params)
    assert train_imagenet(base + ["--resume-params", str(params), "--resume-states",
                                  paths.states]) == 2
    errors = error_lines(capsys)
    assert len(errors) == 1 and "can run any code when it is read" in errors[0]
    with pytest.raises(ValueError, match="pickled optimizer state"):
        read_optimizer_states(paths.states)
    assert not marker.exists()


@pytest.mark.slow
def test_a_second_run_on_a_live_prefix_is_refused_naming_its_pid(train_imagenet, tmp_path,
                                                                  capsys):
    prefix = str(tmp_path / "r")
    first = start(TINY + SYNTHETIC + ["--num-epochs", "50", "--model-prefix", prefix],
                  start_new_session=True)
    try:
        lines = wait_for(first, "Epoch[0] Batch[1]")
        log_before = open(tmp_path / "train.log").read()
        assert train_imagenet(TINY + SYNTHETIC + ["--model-prefix", prefix]) == 2
        errors = error_lines(capsys)
        assert len(errors) == 1 and errors[0].startswith(
            f"error: --model-prefix {prefix} is in use by the run with PID {first.pid} ")
        assert "pass another --model-prefix" in errors[0]
        assert open(tmp_path / "train.log").read().startswith(log_before)  # nothing of the second
    finally:
        first.send_signal(signal.SIGTERM)
        code, output = finish(first, lines)
    assert code == 143, output
    assert train_imagenet(TINY + SYNTHETIC + ["--model-prefix", prefix, "--resume", prefix,
                                              "--num-epochs", "1"]) == 0  # the lock is gone


#: Kill the process with SIGKILL when a checkpoint's first file is renamed into place: its other
#: files are still temporary ones, as a kill -9 during a write leaves them.
KILL_AT_RENAME = """
import os, runpy, signal, sys
replace, aim = os.replace, sys.argv[1]
def replace_then_die(source, target):
    replace(source, target)
    if target.endswith(aim):
        os.kill(os.getpid(), signal.SIGKILL)
os.replace = replace_then_die
sys.argv = sys.argv[2:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


@pytest.mark.slow
def test_kill_9_during_a_write_then_resume_leaves_no_temporary_file(train_imagenet, tmp_path):
    prefix = str(tmp_path / "r")
    args = TINY + SYNTHETIC + ["--num-epochs", "2", "--model-prefix", prefix]
    killed = subprocess.run([sys.executable, "-c", KILL_AT_RENAME, "-0002.params", SCRIPT, *args],
                            capture_output=True, text=True, timeout=300)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert glob.glob(prefix + "-0002.*.tmp-*")  # the write was cut
    assert checkpoint.saved_positions(prefix) == [(1, 0)]
    assert train_imagenet(args + ["--resume", prefix]) == 0
    assert checkpoint.saved_positions(prefix) == [(1, 0), (2, 0)]
    assert glob.glob(str(tmp_path / "*tmp-*")) == []


@pytest.mark.slow
def test_a_full_disk_is_one_error_line_and_the_checkpoints_before_stay(finished_run, tmp_path):
    prefix = copy_run(finished_run, tmp_path)
    limit = os.path.getsize(checkpoint.checkpoint_paths(prefix, 2).params) // 2

    def small_disk():  # ulimit -f: a write past the limit fails with EFBIG
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    done = subprocess.run([sys.executable, SCRIPT, *TINY, *SYNTHETIC, "--num-epochs", "3",
                           "--model-prefix", prefix, "--resume", prefix],
                          capture_output=True, text=True, timeout=300, preexec_fn=small_disk)
    errors = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(errors) == 1, done.stderr
    assert errors[0].startswith(f"error: checkpoint {prefix}-0003 could not be written (a file was "
                                f"written incompletely: the file size limit is {limit} bytes "
                                "(ulimit -f); MXNet says: ")
    assert "): the checkpoints saved before are intact and no temporary file is left; free " \
        "disk space, raise the file size limit (ulimit -f)" in errors[0]
    assert checkpoint.load_checkpoint(prefix).name == prefix + "-0002"
    assert glob.glob(str(tmp_path / "run" / "*tmp-*")) == []


@pytest.mark.parametrize("flags, message", [
    (["--rgb-std", "nan,nan,nan"], "--rgb-std nan,nan,nan must be finite and > 0"),
    (["--rgb-mean", "inf,0,0"], "--rgb-mean inf,0,0 must be finite"),
    (["--wd", "inf"], "--wd inf is not a finite number"),
    (["--lr", "inf"], "--lr inf is not a finite number"),
    (["--model-prefix", "runs/"], "--model-prefix runs/ names a folder only"),
])
def test_non_finite_or_nonsensical_flags_are_one_line_at_start(train_imagenet, capsys, flags,
                                                                message):
    assert train_imagenet(TINY + SYNTHETIC + flags) == 2
    errors = error_lines(capsys)
    assert len(errors) == 1 and errors[0].startswith("error: " + message), errors


@pytest.mark.parametrize("where", ["prefix", "log"])
def test_an_unwritable_prefix_folder_or_log_file_is_one_line_before_training(
        train_imagenet, tmp_path, capsys, where):
    blocker = tmp_path / "a-file"  # a folder that cannot exist, even for root
    blocker.write_text("")
    flags = ["--model-prefix", str(blocker / "r")] if where == "prefix" else \
        ["--model-prefix", str(tmp_path / "r"), "--log-file", str(blocker / "train.log")]
    assert train_imagenet(TINY + SYNTHETIC + flags) == 2
    output = capsys.readouterr()
    errors = [line for line in output.err.splitlines() if line.strip()]
    assert len(errors) == 1 and "Epoch[" not in output.out, output
    flag = "--model-prefix" if where == "prefix" else "--log-file"
    assert errors[0].startswith(f"error: {flag} ") and "cannot write in folder" in errors[0]


def test_a_changed_loss_scale_on_resume_is_applied_and_named(train_imagenet, finished_run,
                                                             tmp_path, capsys):
    prefix = copy_run(finished_run, tmp_path)
    assert train_imagenet(TINY + SYNTHETIC + ["--num-epochs", "3", "--resume", prefix,
                                              "--model-prefix", prefix, "--loss-scale", "256",
                                              "--max-batches", "1"]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if "--loss-scale 256" in line]
    assert len(lines) == 1 and "--loss-scale 256 differs from the checkpoint's (the default): " \
        "the flag wins" in lines[0]
    meta = json.load(open(checkpoint.checkpoint_paths(prefix, 3).meta))
    assert meta["loss_scaler"]["loss_scale"] == 256.0


@pytest.mark.parametrize("skip", [False, True])
def test_a_truncated_jpeg_is_named_at_start_or_skipped_with_a_count(
        train_imagenet, image_folder, tmp_path, capsys, skip):
    folder = tmp_path / "images"
    shutil.copytree(image_folder, folder)
    truncated = folder / "red" / "03.jpg"
    data = truncated.read_bytes()
    truncated.write_bytes(data[:len(data) // 2])
    flags = ["--skip-bad-images"] if skip else []
    code = train_imagenet(TINY + ["--data-dir", str(folder), "--num-epochs", "1",
                                  "--max-batches", "1"] + flags)
    output = capsys.readouterr()
    errors = [line for line in output.err.splitlines() if line.strip()]
    if not skip:
        assert code == 2 and len(errors) == 1
        assert errors[0] == (f"error: 1 of the 48 images of {folder} are not whole JPEG/PNG files "
                             f"({truncated} is a truncated JPEG file (no end-of-image marker)): "
                             "remove or replace them, or pass --skip-bad-images to leave them out")
    else:
        assert code == 0, errors
        lines = [line for line in output.out.splitlines() if "--skip-bad-images" in line]
        assert len(lines) == 1 and lines[0].endswith(
            f"--skip-bad-images: left out 1 of the 48 images of {folder}, which are not whole "
            f"JPEG/PNG files ({truncated} is a truncated JPEG file (no end-of-image marker))")


def test_sighup_saves_like_sigterm_and_a_forked_child_leaves_the_signal_to_the_run():
    with mxfp16.StopRequest() as stop:
        ready, ready_write = os.pipe()
        child = os.fork()
        if child == 0:  # a data worker a pool forks while the run's handler is installed
            os.write(ready_write, b"1")
            while True:  # (MXNet's threads may take the signal: the handler runs between sleeps)
                time.sleep(0.05)
        os.read(ready, 1)  # the child runs Python (signals before that may be lost in a fork)
        os.kill(child, signal.SIGINT)  # a Ctrl-C to the group: the child ignores it
        os.kill(child, signal.SIGTERM)  # ... and ends quietly on SIGTERM
        for _ in range(600):
            ended, status = os.waitpid(child, os.WNOHANG)
            if ended:
                break
            time.sleep(0.1)
        else:
            os.kill(child, signal.SIGKILL)
            raise AssertionError("the forked child did not end on SIGTERM")
        assert not stop.requested
        os.kill(os.getpid(), signal.SIGHUP)  # a closed terminal
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGTERM
    assert (stop.signal_name, stop.exit_code) == ("SIGHUP", 129)


@pytest.mark.parametrize("signum, code", [(signal.SIGUSR1, 138), (signal.SIGUSR2, 140)])
def test_slurms_warning_signals_ask_to_stop_like_sigterm(signum, code):
    with mxfp16.StopRequest() as stop:
        os.kill(os.getpid(), signum)  # sbatch --signal=USR1@120: the default action would kill
        os.kill(os.getpid(), signal.SIGTERM)  # a later signal does not change the first
    assert (stop.signal_name, stop.exit_code) == (signal.Signals(signum).name, code)


def test_training_states_are_verified_and_never_unpickled_by_default(tmp_path, caplog):
    from test_training_state import make_loop, train
    net, trainer = make_loop()
    train(net, trainer, 2)
    prefix = str(tmp_path / "state")
    finished = subprocess.Popen([sys.executable, "-c", "pass"])
    finished.wait()  # its PID is no live process now: the writer of a killed save
    stale = f"{prefix}-00000001.net0.params.tmp-{finished.pid}"
    open(stale, "w").close()
    for step in (1, 2):
        mxfp16.save_training_state(prefix, step, net, trainer)
    assert not os.path.exists(stale)
    flip_bits(f"{prefix}-00000002.net0.params")
    assert mxfp16.latest_training_state(prefix) == prefix + "-00000001"
    assert "net0.params has other bytes than when it was saved" in caplog.records[-1].getMessage()
    with pytest.raises(ValueError, match="00000002' is incomplete or damaged: .*net0.params has "
                                         "other bytes"):
        mxfp16.load_training_state(prefix + "-00000002", *make_loop())
    marker = tmp_path / "pwned"
    states = f"{prefix}-00000001.trainer0.states"
    with open(states, "wb") as out:
        pickle.dump({0: _WritesMarker(str(marker))}, out)
    record = json.load(open(f"{prefix}-00000001.json"))
    for key in ("sha256", "marker_sha256"):
        record.pop(key)
    record["files"][os.path.basename(states)] = os.path.getsize(states)
    json.dump(record, open(f"{prefix}-00000001.json", "w"))
    with pytest.raises(ValueError, match="pickled optimizer state .* can run any code"):
        mxfp16.load_training_state(prefix + "-00000001", *make_loop())
    assert not marker.exists()
