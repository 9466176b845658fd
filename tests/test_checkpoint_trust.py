"""Checkpoints a run can trust (scripts/train_imagenet.py as a hostile but realistic operator meets
it): damaged files passed over or named, no code run from a state file, one run per prefix, stop
signals sent to the whole process group, write failures and bad flags one line each.

Signals are sent when the log shows the batch was reached, never after a fixed sleep.
"""
import os
import signal
import subprocess
import sys

import pytest

from conftest import SCRIPTS_DIR, load_script_main
from mxfp16.train import checkpoint

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


def test_sigterm_to_the_process_group_with_two_data_workers_saves_and_exits(image_folder,
                                                                             tmp_path):
    prefix = str(tmp_path / "r")
    process = start(TINY + ["--data-dir", str(image_folder), "--val-fraction", "0.2",
                            "--num-data-workers", "2", "--num-epochs", "2",
                            "--model-prefix", prefix], start_new_session=True)
    lines = wait_for(process, "Epoch[0] Batch[3]")
    os.killpg(process.pid, signal.SIGTERM)  # what SLURM's scancel and Kubernetes do
    code, output = finish(process, lines)
    assert code == 143, output
    assert len([line for line in output.splitlines() if "stopped by SIGTERM" in line]) == 1
    assert "Traceback" not in output
    assert checkpoint.saved_positions(prefix)[-1][0] == 0
