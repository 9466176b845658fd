"""mxfp16.train.logs: the run's log file, warnings as log lines, metrics.jsonl."""
import json
import logging
import warnings

import pytest

from mxfp16.train.logs import MetricsLog, run_files, run_logging, settle_log_rank


def test_a_warning_during_a_run_is_one_line_of_the_log_file(tmp_path):
    log_file = tmp_path / "run" / "train.log"
    with run_logging(str(log_file)):
        warnings.warn("logits beyond\n  65504", RuntimeWarning, stacklevel=1)
    lines = log_file.read_text().splitlines()
    assert len(lines) == 1
    assert lines[0].endswith(" WARNING RuntimeWarning: logits beyond 65504")
    # Outside the run, warnings go back to Python's own handling.
    assert warnings.showwarning.__name__ != "_log_warning"


def test_handlers_are_removed_after_a_run(tmp_path):
    with run_logging(str(tmp_path / "train.log")):
        pass
    assert logging.getLogger("mxfp16").handlers == []


def test_metrics_log_appends_json_lines(tmp_path):
    path = tmp_path / "metrics.jsonl"
    for epoch in range(2):
        with MetricsLog(str(path)) as metrics:
            metrics.write({"epoch": epoch, "top1": 0.5, "lr": float("nan")}, step=epoch)
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert [record["epoch"] for record in records] == [0, 1]


def test_run_files_follow_the_model_prefix():
    assert run_files(None, "runs/r50") == ("runs/train.log", "runs/metrics.jsonl")
    assert run_files("logs/a.log", "runs/r50") == ("logs/a.log", "logs/metrics.jsonl")
    assert run_files(None, None) == (None, None)


@pytest.mark.parametrize("rank, written", [(0, ["before", "after"]), (1, [])])
def test_a_dist_run_log_file_is_written_by_rank_0_alone_once_the_rank_is_known(tmp_path, rank,
                                                                            written):
    log_file = tmp_path / "train.log"
    with run_logging(str(log_file), rank_known=False) as log:
        log.info("before")  # the scheduler has not numbered this worker yet
        assert not log_file.exists()
        settle_log_rank(rank)
        log.info("after")
    lines = log_file.read_text().splitlines() if log_file.exists() else []
    assert [line.split(" INFO ")[1] for line in lines] == written
