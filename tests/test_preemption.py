"""Preemption: SIGTERM, SIGINT and kill -9 in the middle of an epoch, then ``--resume``, end with the
weights of a run that was never interrupted, bit for bit (float16, dynamic loss scaling), for both
APIs, one and two devices, synthetic data and an image folder.

The signals are sent when the script's log shows the batch was reached (``--disp-batches 1`` logs
every batch), never after a fixed sleep.
"""
import json
import os
import signal
import subprocess
import sys
import threading

import mxnet as mx
import pytest

from conftest import SCRIPTS_DIR, chosen_items, load_module, load_script_main
from mxfp16.train import logs
from mxfp16.train.cli.config import Cifar10Config, FineTuneConfig, TrainConfig
from mxfp16.train.state import checkpoint
from mxfp16.train.gluon_api import GluonAPI

#: float16 with the default dynamic loss scale, a network with BatchNorm; 2 epochs.
COMMON = ["--network", "cifar_resnet20_v1", "--image-shape", "3,16,16", "--num-classes", "4",
          "--top-k", "2", "--dtype", "float16", "--num-epochs", "2", "--disp-batches", "1",
          "--optimizer", "adam", "--lr", "0.01", "--lr-mode", "cosine"]
#: Synthetic data: 12 batches of 4 per epoch.  Image folder (48 images, 38 for training): 10.
SOURCES = {"synthetic": ["--benchmark", "1", "--num-examples", "48", "--batch-size", "4"],
           "folder": ["--batch-size", "4", "--val-fraction", "0.2"],
           "records": ["--batch-size", "4"]}


def data_flags(source, image_folder, rec_files=None):
    if source == "folder":
        return SOURCES[source] + ["--data-dir", str(image_folder)]
    if source == "records":  # 36 training images: 9 batches
        return SOURCES[source] + ["--data-train", rec_files.train_rec, "--data-val",
                                  rec_files.val_rec]
    return SOURCES[source]


@pytest.fixture(scope="module")
def train_imagenet():
    return load_script_main("train_imagenet")


def start_until(args, marker, signum, cwd):
    """Start train_imagenet.py with ``args``; a thread sends ``signum`` once a log line contains
    ``marker``, so this process may work meanwhile (on the other core).

    Returns
    -------
    callable
        Waits for the run; returns ``(exit code, output)``.
    """
    process = subprocess.Popen([sys.executable, os.path.join(SCRIPTS_DIR, "train_imagenet.py"),
                                *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, cwd=cwd)
    lines = []

    def watch():
        for line in process.stdout:
            lines.append(line)
            if marker in line:
                process.send_signal(signum)
                break
        lines.append(process.stdout.read())
    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()

    def finish():
        watcher.join(timeout=300)
        process.wait(timeout=30)
        return process.returncode, "".join(lines)
    finish.process = process
    return finish


def final_weights(prefix, epoch=2):
    return mx.nd.load(checkpoint.checkpoint_paths(prefix, epoch).params)


def assert_identical(expected, actual):
    assert sorted(expected) == sorted(actual)
    different = [name for name in expected
                 if not (expected[name] == actual[name]).min().asscalar()]
    assert different == []


#: signal, API, devices, data, --save-steps: every signal, API, device count and source is covered.
CASES = [
    ("SIGTERM", "gluon", 1, "synthetic", 0),
    ("SIGTERM", "module", 2, "folder", 0),
    ("SIGINT", "gluon", 2, "folder", 0),
    ("SIGINT", "module", 1, "synthetic", 0),
    ("SIGKILL", "gluon", 1, "folder", 3),
    ("SIGKILL", "module", 2, "synthetic", 3),
    ("SIGTERM", "gluon", 1, "records", 0),  # ImageRecordIter: the epochs' resets replayed
]
CASE_NAMES = ("signal_name", "api", "devices", "source", "save_steps")
#: The second epoch's batch whose log line starts the signal (it arrives a few batches later: the
#: test's watcher thread sends it while the test trains on the other core; in one CI run a SIGINT
#: came 5 batches late), and the batches of an epoch per source.  SIGKILL waits for a --save-steps
#: checkpoint inside the epoch (batches 3, 5 and 3 of the three sources).
SIGNAL_AT = {"SIGTERM": 2, "SIGINT": 2, "SIGKILL": 5}
PER_EPOCH = {"synthetic": 12, "folder": 10, "records": 9}


def case_flags(case, image_folder, rec_files):
    """The flags of a case's runs but --model-prefix, and its --resume ('auto' in the first)."""
    signal_name, api, devices, source, save_steps = case
    args = COMMON + data_flags(source, image_folder, rec_files) + ["--api", api]
    args += ["--cpus", str(devices)] * (devices > 1) + ["--save-steps", str(save_steps)] * (
        save_steps > 0)
    return args, "auto" if case == CASES[0] else None  # one command run twice: starts, continues


@pytest.fixture(scope="module")
def interrupted_runs(request, image_folder, rec_files, tmp_path_factory):
    """``case -> (prefix, finish)`` of the case's interrupted run (:func:`start_until`).  A case's
    run starts while the case before it trains and resumes here: one of the two cores would idle."""
    chosen = [tuple(item.callspec.params[name] for name in CASE_NAMES) for item in
              chosen_items(request, "test_interrupted_and_resumed_run_ends_bit_identical")]
    started = {}

    def start(case):
        args, resume = case_flags(case, image_folder, rec_files)
        workdir = tmp_path_factory.mktemp("interrupted")
        part = str(workdir / "part" / "r")
        started[case] = part, start_until(args + ["--model-prefix", part] + ["--resume", "auto"] * (
            resume == "auto"), f"Epoch[1] Batch[{SIGNAL_AT[case[0]]}]", getattr(signal, case[0]),
            workdir)

    def run(case):
        for next_case in chosen[chosen.index(case):chosen.index(case) + 2]:
            if next_case not in started:
                start(next_case)
        return started.pop(case)
    yield run
    for _, finish in started.values():  # not waited for (a case failed before it, -x)
        finish.process.kill()
        finish()


@pytest.mark.slow
@pytest.mark.parametrize(",".join(CASE_NAMES), CASES)
def test_interrupted_and_resumed_run_ends_bit_identical(train_imagenet, image_folder, rec_files,
                                                        interrupted_runs, tmp_path, signal_name,
                                                        api, devices, source, save_steps):
    case = (signal_name, api, devices, source, save_steps)
    args, resume = case_flags(case, image_folder, rec_files)
    full = str(tmp_path / "full" / "r")
    part, interrupted = interrupted_runs(case)  # started first: it imports MXNet as this trains
    resume = resume or part
    assert train_imagenet(args + ["--model-prefix", full]) == 0
    code, output = interrupted()
    expected_code = {"SIGTERM": 143, "SIGINT": 130, "SIGKILL": -signal.SIGKILL}[signal_name]
    assert code == expected_code, output
    if resume == "auto":
        assert f"--resume auto: no checkpoint under {part} yet, training from the start" in output
    positions = checkpoint.saved_positions(part)
    epoch, batch = positions[-1]
    per_epoch = PER_EPOCH[source]
    if signal_name == "SIGKILL":  # the newest --save-steps checkpoint, no line
        assert epoch == 1 and 0 < batch < per_epoch and "stopped by" not in output, positions
        assert (epoch * per_epoch + batch) % save_steps == 0  # counted over the run
    else:  # stopped inside the epoch, after the batch whose line started the signal
        assert epoch == 1 and SIGNAL_AT[signal_name] <= batch < per_epoch, positions
        stopped = [line for line in output.splitlines() if "stopped by" in line]
        assert len(stopped) == 1
        assert f"stopped by {signal_name} after batch {batch} of epoch 1: saved checkpoint " \
               f"{part}-0001+{batch:06d}; resume with: " in stopped[0]
        assert stopped[0].endswith(f"--model-prefix {part} --resume {resume}; exit code "
                                   f"{expected_code}")
    assert [b for _, b in positions if b] == [batch]  # only the newest mid-epoch one is kept
    with open(checkpoint.checkpoint_paths(part, epoch, batch).meta) as meta:
        assert json.load(meta)["progress"]["batches"] == batch

    assert train_imagenet(args + ["--model-prefix", part, "--resume", resume]) == 0
    assert_identical(final_weights(full), final_weights(part))
    with open(checkpoint.checkpoint_paths(full, 2).meta) as a, \
            open(checkpoint.checkpoint_paths(part, 2).meta) as b:
        full_meta, part_meta = json.load(a), json.load(b)
    for key in ("num_update", "lr", "loss_scaler"):
        assert full_meta[key] == part_meta[key]
    for key in ("train_loss", "train_acc", "top1", "skipped_steps", "num_skipped"):
        assert full_meta["metrics"][key] == part_meta["metrics"][key], key
    assert checkpoint.saved_positions(part) == [(1, 0), (2, 0)]  # mid-epoch ones removed


# --------------------------------------------------------------------------------------------------
# Distributed jobs (scripts/launch.py, dist_sync on 127.0.0.1)
# --------------------------------------------------------------------------------------------------

LAUNCH = os.path.join(SCRIPTS_DIR, "launch.py")
#: A job is stopped by the launcher's own timeout if anything hangs.
JOB_TIMEOUT = 120
DIST = ["--kv-store", "dist_sync", "--network", "cifar_resnet20_v1", "--image-shape", "3,16,16",
        "--num-classes", "4", "--top-k", "2", "--dtype", "float16", "--num-epochs", "2",
        "--disp-batches", "1", "--optimizer", "adam", "--lr", "0.01", "--benchmark", "1",
        "--num-examples", "48", "--batch-size", "4"]


def launch_command(log_dir, args):
    return [sys.executable, LAUNCH, "-n", "2", "-s", "1", "--timeout", str(JOB_TIMEOUT),
            "--log-dir", str(log_dir), "--env", "OMP_NUM_THREADS:1", "--", sys.executable,
            os.path.join(SCRIPTS_DIR, "train_imagenet.py"), *args]


def rank_0_log(log_dir):
    """The text of the log of the worker that logs at INFO level (rank 0), '' before it does."""
    for name in ("worker-0.log", "worker-1.log"):
        path = os.path.join(log_dir, name)
        text = open(path, errors="replace").read() if os.path.exists(path) else ""
        if " INFO " in text:
            return text
    return ""


def wait_for_log(process, log_dir, marker):
    """Poll rank 0's log until it shows ``marker``; fail if the job ends first."""
    while process.poll() is None:
        if marker in rank_0_log(log_dir):
            return
        try:
            process.wait(timeout=0.2)
        except subprocess.TimeoutExpired:
            pass
    raise AssertionError(f"the job ended before {marker!r}: {rank_0_log(log_dir)[-2000:]}")


@pytest.mark.slow
def test_sigterm_to_the_launcher_stops_every_worker_at_one_step_then_the_job_resumes(tmp_path):
    prefix = str(tmp_path / "run" / "r")
    args = DIST + ["--model-prefix", prefix]
    job = subprocess.Popen(launch_command(tmp_path / "logs", args), stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True)
    wait_for_log(job, tmp_path / "logs", "Epoch[1] Batch[3]")
    job.send_signal(signal.SIGTERM)
    output, _ = job.communicate(timeout=JOB_TIMEOUT)
    assert job.returncode == 143, output
    logs = {task: open(tmp_path / "logs" / f"worker-{task}.log").read() for task in (0, 1)}
    stopped = [line for log in logs.values() for line in log.splitlines() if "stopped by" in line]
    assert len(stopped) == 1 and "stopped by SIGTERM" in stopped[0]  # rank 0 speaks for the job
    (epoch, batch), = [p for p in checkpoint.saved_positions(prefix) if p[1]]
    assert epoch == 1 and batch >= 3
    assert f"saved checkpoint {prefix}-0001+{batch:06d}" in stopped[0]
    # Both workers stopped after that step: rank 1 did not log a batch past it.
    assert f"Epoch[1] Batch[{batch + 1}]" not in logs[0] + logs[1]

    resumed = subprocess.run(launch_command(tmp_path / "logs2", args + ["--resume", prefix]),
                             capture_output=True, text=True, timeout=JOB_TIMEOUT + 30)
    assert resumed.returncode == 0, rank_0_log(tmp_path / "logs2")[-3000:]
    assert checkpoint.saved_positions(prefix) == [(1, 0), (2, 0)]
    assert f"starting at epoch 1, batch {batch}" in rank_0_log(tmp_path / "logs2")


@pytest.mark.slow
def test_a_killed_worker_ends_the_job_with_one_line_and_it_resumes_from_save_steps(tmp_path):
    prefix = str(tmp_path / "run" / "r")
    args = DIST + ["--api", "module", "--model-prefix", prefix, "--save-steps", "2"]
    job = subprocess.Popen(launch_command(tmp_path / "logs", args), stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True)
    wait_for_log(job, tmp_path / "logs", "Epoch[0] Batch[5]")
    output_so_far = ""
    worker_1 = None
    for line in job.stdout:  # the launcher names each process and its pid as it starts it
        output_so_far += line
        if "started worker 1" in line or "started worker-1" in line:
            worker_1 = int(line.split("(pid ")[1].split(")")[0])
            break
    assert worker_1, output_so_far
    os.kill(worker_1, signal.SIGKILL)
    output, _ = job.communicate(timeout=JOB_TIMEOUT)
    output = output_so_far + output
    assert job.returncode == 128 + signal.SIGKILL, output
    failed = [line for line in output.splitlines() if "failed with exit code" in line]
    assert len(failed) == 1 and "137" in failed[0] and "worker" in failed[0], output
    epoch, batch = checkpoint.saved_positions(prefix)[-1]
    assert (epoch, batch) >= (0, 2) and (epoch * 12 + batch) % 2 == 0

    resumed = subprocess.run(launch_command(tmp_path / "logs2", args + ["--resume", prefix]),
                             capture_output=True, text=True, timeout=JOB_TIMEOUT + 30)
    assert resumed.returncode == 0, rank_0_log(tmp_path / "logs2")[-3000:]
    assert checkpoint.saved_positions(prefix)[-1] == (2, 0)


# --------------------------------------------------------------------------------------------------
# In one process: signals at chosen points, bad resumes
# --------------------------------------------------------------------------------------------------

QUICK = COMMON + SOURCES["synthetic"]


def with_flag(argv, flag, value):
    """``argv`` with the value of ``flag`` replaced."""
    index = argv.index(flag)
    return argv[:index + 1] + [value] + argv[index + 2:]


def signal_at_batch(monkeypatch, batch, signum=signal.SIGTERM, epoch=0):
    """Send ``signum`` to this process once epoch ``epoch`` has trained ``batch`` batches."""
    real_update = logs.EpochMeter.update

    def update(self, *args):
        real_update(self, *args)
        if self.epoch == epoch and self.batches == batch:
            os.kill(os.getpid(), signum)
    monkeypatch.setattr(logs.EpochMeter, "update", update)


@pytest.mark.slow
def test_resuming_mid_epoch_with_another_batch_size_is_one_error_line(
        train_imagenet, tmp_path, monkeypatch, capsys):
    prefix = str(tmp_path / "r")
    signal_at_batch(monkeypatch, 5)
    assert train_imagenet(QUICK + ["--model-prefix", prefix]) == 143
    monkeypatch.undo()
    capsys.readouterr()
    argv = with_flag(QUICK, "--batch-size", "8")
    assert train_imagenet(argv + ["--model-prefix", prefix, "--resume", prefix]) == 2
    err = capsys.readouterr().err
    assert err == (f"error: checkpoint '{prefix}-0000+000005' stopped after batch 5 of epoch 0 "
                   "with --batch-size 4, this run has --batch-size 8: the same position would mean "
                   "other images; resume with --batch-size 4, or from an epoch checkpoint "
                   f"({prefix}-NNNN), which any settings may continue\n")
    # --num-epochs may change: the run continues to the new end.
    argv = with_flag(QUICK, "--num-epochs", "3")
    assert train_imagenet(argv + ["--model-prefix", prefix, "--resume", prefix]) == 0
    assert checkpoint.saved_positions(prefix) == [(1, 0), (2, 0), (3, 0)]


@pytest.mark.slow
def test_a_signal_during_validation_saves_the_trained_epoch_and_resumes_exactly(
        train_imagenet, image_folder, tmp_path, monkeypatch):
    full, part = str(tmp_path / "full" / "r"), str(tmp_path / "part" / "r")
    args = COMMON + data_flags("folder", image_folder)  # 2 validation batches
    assert train_imagenet(args + ["--model-prefix", full]) == 0
    real_predict = GluonAPI.predict

    def predict(self, data):  # the signal arrives while the first epoch is being validated
        os.kill(os.getpid(), signal.SIGTERM)
        return real_predict(self, data)
    monkeypatch.setattr(GluonAPI, "predict", predict)
    assert train_imagenet(args + ["--model-prefix", part]) == 143
    monkeypatch.undo()
    assert checkpoint.saved_positions(part) == [(0, 10)]  # every batch trained, not validated
    assert train_imagenet(args + ["--model-prefix", part, "--resume", part]) == 0
    assert_identical(final_weights(full), final_weights(part))
    with open(checkpoint.checkpoint_paths(full, 1).meta) as a, \
            open(checkpoint.checkpoint_paths(part, 1).meta) as b:
        assert json.load(a)["metrics"]["top1"] == json.load(b)["metrics"]["top1"]


@pytest.mark.slow
def test_a_second_ctrl_c_during_the_save_stops_at_once_and_keeps_the_last_checkpoint(
        train_imagenet, tmp_path, monkeypatch, capsys):
    prefix = str(tmp_path / "r")
    signal_at_batch(monkeypatch, 3, signal.SIGINT, epoch=1)
    real_save = checkpoint.mx.nd.save

    def impatient_save(path, data):  # Ctrl-C again while the stop's checkpoint is written
        if "+" in path:
            os.kill(os.getpid(), signal.SIGINT)
        return real_save(path, data)
    monkeypatch.setattr(checkpoint.mx.nd, "save", impatient_save)
    assert train_imagenet(QUICK + ["--model-prefix", prefix]) == 130
    monkeypatch.undo()
    assert capsys.readouterr().err == ("error: interrupted twice (SIGINT): stopped at once without "
                                       "saving; the checkpoints saved before are intact\n")
    assert checkpoint.saved_positions(prefix) == [(1, 0)]
    assert not [name for name in os.listdir(tmp_path) if ".tmp-" in name]
    assert checkpoint.load_checkpoint(prefix).name == prefix + "-0001"


def test_save_steps_without_model_prefix_is_one_error_line(train_imagenet, capsys):
    assert train_imagenet(QUICK + ["--save-steps", "100"]) == 2
    assert capsys.readouterr().err == ("error: --save-steps 100 saves mid-epoch checkpoints, which "
                                       "need --model-prefix: add --model-prefix PREFIX (e.g. "
                                       "runs/r50)\n")


@pytest.mark.slow
def test_a_signal_without_model_prefix_says_nothing_was_saved(train_imagenet, monkeypatch, capsys):
    signal_at_batch(monkeypatch, 2)
    assert train_imagenet(QUICK) == 143
    assert ("stopped by SIGTERM after batch 2 of epoch 0: nothing saved (no --model-prefix; pass "
            "--model-prefix PREFIX to save on a signal); exit code 143") in capsys.readouterr().out


@pytest.mark.slow
def test_a_signal_during_an_epoch_checkpoint_stops_right_after_it(train_imagenet, tmp_path,
                                                                  monkeypatch, capsys):
    prefix = str(tmp_path / "r")
    real_write = checkpoint._write_json

    def write_json(path, record):  # SIGTERM while the epoch's checkpoint is written
        os.kill(os.getpid(), signal.SIGTERM)
        real_write(path, record)
    monkeypatch.setattr(checkpoint, "_write_json", write_json)
    assert train_imagenet(QUICK + ["--model-prefix", prefix]) == 143
    assert checkpoint.saved_positions(prefix) == [(1, 0)]  # written in full, nothing after it
    assert "stopped by SIGTERM at the end of epoch 0: saved checkpoint " in capsys.readouterr().out


@pytest.mark.slow
def test_mixup_and_label_smoothing_resume_with_the_same_draws(train_imagenet, image_folder,
                                                              tmp_path, monkeypatch):
    args = COMMON + data_flags("folder", image_folder) + ["--mixup", "--label-smoothing", "0.1"]
    full, part = str(tmp_path / "full" / "r"), str(tmp_path / "part" / "r")
    assert train_imagenet(args + ["--model-prefix", full]) == 0
    signal_at_batch(monkeypatch, 6, epoch=1)
    assert train_imagenet(args + ["--model-prefix", part]) == 143
    monkeypatch.undo()
    assert checkpoint.saved_positions(part)[-1] == (1, 6)
    assert train_imagenet(args + ["--model-prefix", part, "--resume", part]) == 0
    assert_identical(final_weights(full), final_weights(part))


@pytest.mark.slow
def test_sigterm_to_a_horovod_job_stops_both_ranks_at_one_step_then_it_resumes(tmp_path):
    pytest.importorskip("horovod.mxnet", reason="Horovod is not installed (README's test command)")
    prefix = str(tmp_path / "run" / "r")
    command = [sys.executable, LAUNCH, "--launcher", "horovod", "-n", "2", "--timeout",
               str(JOB_TIMEOUT), "--", sys.executable,
               os.path.join(SCRIPTS_DIR, "train_imagenet.py"), *with_flag(DIST, "--kv-store",
                                                                        "horovod"),
               "--model-prefix", prefix]
    job = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for line in job.stdout:  # horovodrun passes rank 0's log lines through
        if "Epoch[1] Batch[3]" in line:
            job.send_signal(signal.SIGTERM)
            break
    output, _ = job.communicate(timeout=JOB_TIMEOUT)
    assert job.returncode == 143, output
    log_text = open(tmp_path / "run" / "train.log").read()
    stopped = [line for line in log_text.splitlines() if "stopped by SIGTERM" in line]
    (epoch, batch), = [p for p in checkpoint.saved_positions(prefix) if p[1]]
    assert len(stopped) == 1 and f"{prefix}-0001+{batch:06d}" in stopped[0] and batch >= 3
    resumed = subprocess.run(command + ["--resume", prefix], capture_output=True, text=True,
                             timeout=JOB_TIMEOUT + 30)
    assert resumed.returncode == 0, resumed.stdout[-3000:]
    assert checkpoint.saved_positions(prefix) == [(1, 0), (2, 0)]


#: Each script's smallest command line that checks (fine_tune.py's network is read at the start of
#: training, not when the flags are checked).
SCRIPT_CONFIGS = {"train_imagenet": (TrainConfig, []), "train_cifar10": (Cifar10Config, []),
                  "fine_tune": (FineTuneConfig, ["--pretrained-model", "base", "--load-epoch", "1"])}


def checked_config(name, argv):
    config_type, required = SCRIPT_CONFIGS[name]
    parser = load_module(SCRIPTS_DIR, name, "scripts").get_args_parser()
    return config_type(**vars(parser.parse_args(required + argv))).checked()


@pytest.mark.parametrize("name", sorted(SCRIPT_CONFIGS))
def test_resume_auto_starts_a_first_run_and_continues_the_newest_checkpoint_in_every_script(
        name, tmp_path):
    prefix = str(tmp_path / "r")
    config = checked_config(name, ["--model-prefix", prefix, "--resume", "auto"])
    assert config.resume is None
    assert f"--resume auto: no checkpoint under {prefix} yet, training from the start" in \
        config.notes
    open(checkpoint.checkpoint_paths(prefix, 0, 7).meta, "w").close()  # stopped after batch 7
    config = checked_config(name, ["--model-prefix", prefix, "--resume", "auto"])
    assert config.resume == prefix  # load_checkpoint takes the newest intact one
    assert f"--resume auto: continuing the newest intact checkpoint under {prefix}" in config.notes


@pytest.mark.parametrize("flags, message", [
    ([], "--resume auto continues the newest checkpoint of --model-prefix: pass --model-prefix "
         "PREFIX (e.g. runs/r50), or leave --resume out"),
    (["--model-prefix", "runs/r", "--load-epoch", "3"],
     "--resume auto and --load-epoch 3 both choose the checkpoint to start from: pass one of them"),
])
def test_resume_auto_without_a_prefix_or_with_another_choice_is_one_error_line(
        train_imagenet, capsys, flags, message):
    assert train_imagenet(SOURCES["synthetic"] + flags + ["--resume", "auto"]) == 2
    assert capsys.readouterr().err == f"error: {message}\n"


@pytest.mark.slow
def test_resume_auto_refuses_to_start_afresh_over_checkpoints_none_of_which_is_intact(
        train_imagenet, tmp_path, capsys):
    prefix = str(tmp_path / "r")
    argv = QUICK + ["--max-batches", "2", "--num-epochs", "1", "--model-prefix", prefix]
    assert train_imagenet(argv) == 0
    with open(checkpoint.checkpoint_paths(prefix, 1).params, "r+b") as damaged:
        damaged.truncate(100)
    capsys.readouterr()
    assert train_imagenet(with_flag(argv, "--num-epochs", "2") + ["--resume", "auto"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: checkpoint file '{prefix}-0001.params' "
                                               "has 100 bytes"), err
    assert checkpoint.saved_positions(prefix) == [(1, 0)]  # nothing written over it
