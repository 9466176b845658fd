"""Every benchmark script runs end to end in --quick mode and writes what it promises.

The assertions are on structure and on exact facts (modes, row counts, files, the float16 underflow
of the loss-scaling benchmark), never on wall-clock times.
"""
import contextlib
import json
import math
import os
import sys

import numpy as np
import pytest

from conftest import BENCHMARKS_DIR, chosen_items, started_ahead

#: The --quick runs that mostly wait for processes of their own, as the test that checks each one
#: names it: started as scripts with this module's first test (conftest.started_ahead), they run
#: on one core while the in-process tests here run on the other.
AHEAD = {"overflow_warning": "test_overflow_warning_quick_times_two_workers_side_by_side_and_the_"
                             "locator",
         "train_throughput": "test_train_throughput_quick"}


@pytest.fixture(scope="module", autouse=True)
def quick_ahead(request, tmp_path_factory):
    """``{name: (result, out_dir)}`` of the :data:`AHEAD` runs this session checks, ``result``
    giving the script's ``CompletedProcess``."""
    with contextlib.ExitStack() as stack:
        runs = {}
        for name, test in AHEAD.items():
            out_dir = tmp_path_factory.mktemp(name)
            command = [sys.executable, os.path.join(BENCHMARKS_DIR, f"{name}.py"), "--quick",
                       "--out-dir", str(out_dir)]
            result = stack.enter_context(started_ahead(request, test, command, timeout=600,
                                                       cwd=os.path.dirname(BENCHMARKS_DIR)))
            runs[name] = (result, out_dir)
        yield runs


def run_quick(module, out_dir, *extra):
    assert module.main(["--quick", "--out-dir", str(out_dir), *extra]) == 0
    return quick_results(module, out_dir)


def ran_ahead(module, quick_ahead):
    """The record and Markdown of ``module``'s --quick run started ahead (:func:`quick_ahead`)."""
    result, out_dir = quick_ahead[module.NAME]
    done = result()
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return quick_results(module, out_dir)


def quick_results(module, out_dir):
    with open(out_dir / f"{module.NAME}.json") as json_file:
        record = json.load(json_file)
    markdown = (out_dir / f"{module.NAME}.md").read_text()
    assert record["benchmark"] == module.NAME
    assert record["command"].startswith(f"python benchmarks/{module.NAME}.py --quick")
    assert {"cpu", "cores", "mxnet", "date"} <= set(record["machine"])
    assert f"MXNet {record['machine']['mxnet']}" in markdown and record["command"] in markdown
    return record, markdown


def table_rows(markdown):
    """The body rows of the Markdown table in a result file."""
    return [line for line in markdown.splitlines() if line.startswith("| ")][1:]


@pytest.mark.slow
def test_accuracy_parity_quick(load_benchmark, tmp_path):
    module = load_benchmark("accuracy_parity")
    record, markdown = run_quick(module, tmp_path)
    modes = list(module.MODES)
    assert modes == ["float32", "float16", "float16-no-scaling", "bfloat16"]
    assert [row["mode"] for row in record["summary"]] == modes
    assert len(table_rows(markdown)) == len(modes)
    assert len(record["runs"]) == len(modes)  # one seed
    for run in record["runs"]:
        assert len(run["epoch_losses"]) == 2
        assert 0.0 <= run["test_accuracy"] <= 1.0
    float32 = next(run for run in record["runs"] if run["mode"] == "float32")
    assert float32["skipped_steps"] == 0 and float32["final_loss_scale"] == 1.0
    assert float32["step_loss_scales"] == [1.0] * (2 * (1347 // 32))  # 2 epochs of 42 steps
    float16 = next(run for run in record["runs"] if run["mode"] == "float16")
    scales = float16["step_loss_scales"]
    halvings = sum(after == before / 2 for before, after in zip(scales, scales[1:]))
    # each skipped step halves the scale of the next; the last step's halving is in the final scale
    assert halvings + (float16["final_loss_scale"] < scales[-1]) == float16["skipped_steps"]
    assert (tmp_path / "accuracy_parity_loss.png").stat().st_size > 0


@pytest.mark.slow
def test_awd_lstm_parity_quick_float16_is_the_same_with_the_head_check_bypassed(load_benchmark,
                                                                               tmp_path,
                                                                               monkeypatch):
    from mxfp16.scaling import heads

    # the benchmark bypasses the check for the rest of its process: here, for this test only
    monkeypatch.setattr(heads.HeadCheck, "ops", heads.HeadCheck.ops)
    record, markdown = run_quick(load_benchmark("awd_lstm_parity"), tmp_path)
    runs = {run["mode"]: run for run in record["runs"]}
    assert list(runs) == ["float32", "float16", "float16-bypass"]
    assert len(table_rows(markdown)) == 3
    assert all(math.isfinite(run["best_val_ppl"]) for run in runs.values())
    for key in ("train_losses", "val_ppls"):  # issue 34: bit for bit
        assert runs["float16"][key] == runs["float16-bypass"][key]


@pytest.mark.slow
def test_loss_scaling_matters_quick_shows_underflow(load_benchmark, tmp_path):
    module = load_benchmark("loss_scaling_matters")
    record, markdown = run_quick(module, tmp_path)
    assert len(table_rows(markdown)) == 3
    rows = {row["mode"]: row for row in record["summary"]}
    assert list(rows) == ["float32", "float16-no-scaling", "float16-dynamic"]
    assert all(row["log2_factor"] == -20 for row in rows.values())
    # Quick mode uses the loss factor 2**-20: every logit gradient is below
    # 2**-20 * 1 / batch_size = 2**-26, under half of float16's smallest subnormal, so without
    # scaling it rounds to 0, and every weight gradient with it.  Exact, not statistical.
    assert rows["float16-no-scaling"]["zero_grad_fraction"] == 1.0
    assert rows["float16-dynamic"]["zero_grad_fraction"] < 1.0
    assert rows["float16-dynamic"]["final_loss_scale"] > 1.0
    assert (tmp_path / "loss_scaling_matters.png").stat().st_size > 0


@pytest.mark.slow
def test_loss_scale_floor_quick_goes_below_1_only_with_the_floor(load_benchmark, tmp_path):
    record, markdown = run_quick(load_benchmark("loss_scale_floor"), tmp_path)
    runs = {(run["log2_weight"], run["log2_floor"]): run for run in record["runs"]}
    assert len(table_rows(markdown)) == len(runs) == 4
    # 2**10: the gradients fit at scale 1, the 'auto' start takes 2**-3 where it may go below 1
    assert [runs[10, floor]["final_scale"] for floor in (0, -24)] == [1.0, 2.0 ** -3]
    assert runs[10, 0]["updates"] == runs[10, -24]["updates"] == 12
    # 2**20 overflows at scale 1: no update at a floor of 1; ten halvings, then updates
    assert runs[20, 0]["updates"] == 0 and runs[20, 0]["final_scale"] == 1.0
    assert runs[20, -24]["updates"] == 2 and runs[20, -24]["final_scale"] < 2.0 ** -10


def test_cast_time_quick_counts_casts(load_benchmark, tmp_path):
    module = load_benchmark("cast_time")
    record, markdown = run_quick(module, tmp_path)
    results = {row["conversion"]: row for row in record["results"]}
    assert list(results) == list(module.CONVERSIONS)
    assert len(table_rows(markdown)) == 3
    gpu, emulated, amp = results.values()
    assert gpu["casts_inserted"] > 0 and amp["casts_inserted"] > 0
    assert emulated["casts_inserted"] > gpu["casts_inserted"]  # a rounding pair per GEMM
    assert all(len(row["times_s"]) == 1 for row in results.values())


def test_data_pipeline_quick(load_benchmark, tmp_path):
    module = load_benchmark("data_pipeline")
    record, markdown = run_quick(module, tmp_path)
    assert record["config"]["num_train"] == 8 and record["config"]["num_val"] == 8
    assert list(record["results"]) == ["train", "val"]
    for by_iterator in record["results"].values():
        assert list(by_iterator) == ["raw ImageRecordIter", "mxfp16 record_iter"]
        assert all(value["img_per_s"] > 0 for value in by_iterator.values())
    assert len(table_rows(markdown)) == 4


@pytest.mark.slow
def test_loop_overhead_quick(load_benchmark, tmp_path):
    module = load_benchmark("loop_overhead")
    record, markdown = run_quick(module, tmp_path, "--dtypes", "float32,float16")
    rows = record["results"]
    assert [row["dtype"] for row in rows] == ["float32", "float16"]
    assert len(table_rows(markdown)) == 2
    for row in rows:
        (round_,) = row["rounds"]  # --quick: one round
        assert round_["bare_img_per_s"] > 0 and round_["script_img_per_s"] > 0
        assert row["median_ratio"] == round_["script_img_per_s"] / round_["bare_img_per_s"]


def test_train_throughput_skips_a_missing_script(load_benchmark, tmp_path, monkeypatch):
    module = load_benchmark("train_throughput")
    monkeypatch.setattr(module, "SCRIPT", str(tmp_path / "missing.py"))
    config = module.make_config(module.get_args_parser().parse_args(["--quick"]))
    result = module.run_script(config, "float16")
    assert result["status"] == f"skipped: {os.path.relpath(tmp_path / 'missing.py')} not found"
    assert result["img_per_s"] is None
    assert "--benchmark 1 --network resnet18_v1 --batch-size 2 --image-shape 3,32,32 " \
           "--dtype float16 --max-batches 3 --num-epochs 1" in result["command"]


@pytest.mark.parametrize("log, expected", [
    ("Epoch[0] Batch [5]\tSpeed: 12.50 samples/sec\taccuracy=0.1\n", 12.5),
    ("Speed: 10.0 samples/sec\nINFO done: 3 batches, 11.25 img/s\n", 11.25),
    ("train 7 images/s", 7.0),
    ("no figure here", None),
])
def test_train_throughput_parses_the_last_figure(load_benchmark, log, expected):
    assert load_benchmark("train_throughput").parse_throughput(log) == expected


def test_train_throughput_takes_the_summary_line_over_the_log(load_benchmark):
    module = load_benchmark("train_throughput")
    stdout = "resnet50_v1 float16 (gluon): 1 epoch, top-1 0.1, top-5 0.5, 8.5 img/s, loss scale 1\n"
    stderr = "Epoch[0] Batch[20] speed 9.9 img/s loss 2.3\n"
    assert module.script_throughput(stdout, stderr) == 8.5
    assert module.script_throughput("", stderr) == 9.9


@pytest.mark.slow
def test_preemption_quick_stops_with_143_and_sizes_the_checkpoint(load_benchmark, tmp_path):
    record, markdown = run_quick(load_benchmark("preemption"), tmp_path)
    (round_,) = record["rounds"]  # --quick: one round
    assert round_["checkpoint"].startswith("r-0000+")  # the stop's mid-epoch checkpoint
    assert set(round_["sizes"]) == {".params", ".states", ".json"}
    assert round_["seconds_to_exit"] > 0 and len(table_rows(markdown)) == 1 + 1 + 3  # 2 tables


def test_checkpoint_format_quick_measures_both_formats(load_benchmark, tmp_path):
    record, markdown = run_quick(load_benchmark("checkpoint_format"), tmp_path)
    assert set(record["median_seconds"]) == {"pickle_write", "pickle_read", "ndarray_write",
                                             "ndarray_read", "sha256", "read_back"}
    assert record["bytes"]["ndarray"] > record["bytes"]["params"] and len(table_rows(markdown)) == 4


@pytest.mark.slow
def test_sequence_parity_quick(load_benchmark, tmp_path):
    module = load_benchmark("sequence_parity")
    record, markdown = run_quick(module, tmp_path)
    assert [(row["task"], row["dtype"]) for row in record["summary"]] == [
        (task, dtype) for task in ("digits", "charlm") for dtype in ("float32", "float16", "bfloat16")]
    assert len(table_rows(markdown)) == 6 and len(record["runs"]) == 6  # one seed
    for row in record["summary"]:
        assert row["values"] == [row["mean"]] and row["std"] == 0.0
        assert row["vs_float32_range"] in ("within", "better", "worse")
        assert row["dtype"] != "float32" or row["vs_float32_range"] == "within"
    digits = [run for run in record["runs"] if run["task"] == "digits"]
    assert all(0.0 <= run["test_accuracy"] <= 1.0 for run in digits)
    charlm = [run for run in record["runs"] if run["task"] == "charlm"]
    # quick mode's 4000 characters hold 55 distinct ones (vocabulary padded to 56): one epoch takes
    # the perplexity below the 56 of a uniform guess
    assert all(1.0 < run["val_perplexity"] < 56 for run in charlm)


@pytest.mark.slow
def test_lm_loss_scaling_quick_shows_underflow(load_benchmark, tmp_path):
    module = load_benchmark("lm_loss_scaling")
    record, markdown = run_quick(module, tmp_path)
    rows = {row["mode"]: row for row in record["summary"]}
    assert list(rows) == ["float32", "float16-no-scaling", "float16-dynamic"]
    assert len(table_rows(markdown)) == 3
    assert all(row["log2_factor"] == -16 for row in rows.values())
    assert rows["float16-no-scaling"]["zero_grad_fraction"] > rows["float32"]["zero_grad_fraction"]
    assert rows["float16-dynamic"]["zero_grad_fraction"] < rows["float16-no-scaling"][
        "zero_grad_fraction"]
    assert rows["float32"]["final_loss_scale"] == rows["float16-no-scaling"]["final_loss_scale"] == 1
    assert rows["float16-dynamic"]["final_loss_scale"] > 1


@pytest.mark.slow
def test_sequence_speed_quick_counts_casts(load_benchmark, tmp_path):
    module = load_benchmark("sequence_speed")
    record, markdown = run_quick(module, tmp_path)
    rows = record["results"]
    dtypes = ["float32", "float16", "bfloat16"]
    assert [(row["model"], row["dtype"]) for row in rows] == (
        [("lstm_lm", dtype) for dtype in dtypes + [module.RNN_LAYER, module.UNROLLED_LAYER,
                                                   module.UNROLLED_LM]]
        + [("transformer", dtype) for dtype in dtypes])
    assert len(table_rows(markdown)) == 9 + 1 + 2  # speed rows, then the casts table with its header
    for row in rows:
        assert len(row["step_times_s"]) == 2 and all(t > 0 for t in row["step_times_s"])
        if row["dtype"] == "float32":
            assert row["ratios_to_float32"] == [1.0, 1.0]
    casts = {row["model"]: row["casts"] for row in rows}
    # the LSTM LM's GPU graph: one cast, of the float16 logits to float32; AMP casts the RNN's
    # inputs (data, parameters, two states) as well
    assert casts["lstm_lm"] == {"mxfp16_gpu_graph": 1, "mxnet_amp": 5}
    assert casts["transformer"]["mxfp16_gpu_graph"] < casts["transformer"]["mxnet_amp"]
    # MXNet 1.9.1's RNN op has no bfloat16 kernel: CreateRNNState's type switch knows float32,
    # float64 and float16 only (bfloat16 is type enum 12)
    bound = record["bfloat16_rnn"]
    assert bound["bfloat16_rnn_error"].endswith("Unknown type enum 12")
    # Amdahl's bounds from the measured share (times, so no bound is asserted: under load the
    # layers alone were once timed at 183% of the whole step)
    share = bound["rnn_share_of_float32_step"]
    assert share > 0 and bound["bound_rest_free"] == 1 / share
    assert bound["bound_rest_twice_as_fast"] == 1 / (share + (1 - share) / 2)
    assert bound["unrolled_bfloat16_over_fused_float32"] > 0
    assert bound["unrolled_lm_bfloat16_speedup"] > 0


def test_rnn_emulation_error_quick_stays_within_float16_resolution(load_benchmark, tmp_path):
    record, markdown = run_quick(load_benchmark("rnn_emulation_error"), tmp_path)
    (rows,) = record["seeds"].values()  # --quick: one seed
    assert set(rows) == {"emulated", "per-step", "unrolled, no rounding", "emulated vs per-step"}
    assert len(table_rows(markdown)) == 12
    for label, parts in rows.items():  # within a few float16 roundings of the largest value
        assert all(worst < 8 * 2.0 ** -11 for worst, _ in parts.values()), (label, parts)
    # the reference (unrolled LSTMCells) is the fused float32 layer when it rounds nothing
    assert all(worst < 1e-5 for worst, _ in rows["unrolled, no rounding"].values())


@pytest.mark.slow
def test_detection_parity_quick_trains_ssd_yolo3_and_faster_rcnn_in_every_dtype(load_benchmark,
                                                                               tmp_path):
    module = load_benchmark("detection_parity")
    record, markdown = run_quick(module, tmp_path)
    pairs = [(d, t) for d in ("ssd_mobilenet0.25", "yolo3_mobilenet0.25", "faster_rcnn_resnet18_v1b")
             for t in ("float32", "float16", "bfloat16")]
    assert [(row["detector"], row["dtype"]) for row in record["summary"]] == pairs
    assert [(run["detector"], run["dtype"]) for run in record["runs"]] == pairs  # one seed
    assert len(table_rows(markdown)) == 9 and "Errors:" not in markdown
    assert [len(run["final_losses"]) for run in record["runs"]] == [2] * 3 + [4] * 6
    for run in record["runs"]:
        assert "error" not in run, run
        assert 0.0 <= run["map"] <= 1.0 and all(np.isfinite(run["final_losses"]))
        # dynamic loss scaling in float16 only ('auto': YOLOv3's large first gradients keep 1)
        assert math.log2(run["final_loss_scale"]).is_integer()
        assert run["final_loss_scale"] == 1 or run["dtype"] == "float16"
    ssd_float16 = record["runs"][1]
    assert ssd_float16["final_loss_scale"] > 1 and ssd_float16["skipped_steps"] == 0
    for row in record["summary"]:
        assert row["vs_float32_range"] in ("within", "better", "worse")
        assert row["dtype"] != "float32" or row["vs_float32_range"] == "within"


@pytest.mark.slow
def test_detection_speed_quick_counts_casts_and_profiles(load_benchmark, tmp_path):
    module = load_benchmark("detection_speed")
    record, markdown = run_quick(module, tmp_path, "--detectors", "ssd_mobilenet0.25")
    (result,) = record["results"]
    rows = result["rows"]
    assert [row["dtype"] for row in rows] == ["float32", "float16", "bfloat16"]
    for row in rows:
        assert len(row["step_times_s"]) == 2 and all(t > 0 for t in row["step_times_s"])
    assert rows[0]["speedups_over_float32"] == [1.0, 1.0]
    # both cast the images to float16 first and return float32 class and box predictions
    for casts in result["casts"].values():
        assert casts["cast_inputs"][0] == ["data"], casts
        assert casts["tensors"] >= casts["nodes"] >= 3
    profile = result["profile_ms_per_step"]
    assert list(profile) == ["float32", "float16", "bfloat16"]
    assert "Convolution" in profile["float32"] and "_backward_Convolution" in profile["bfloat16"]
    # speed rows; the casts table's header and row; the profile's header, 10 operators and total;
    # the bfloat16 bounds' header and row
    assert len(table_rows(markdown)) == 3 + 2 + 12 + 2
    bounds = module.gemm_bounds(profile, "bfloat16")
    assert bounds["gemm_ms"]["float32"] > 0 and bounds["gemms_alone"] > 0


@pytest.mark.parametrize("name, argv, message", [
    ("accuracy_parity", ["--modes", "float8"], "unknown mode(s) ['float8']"),
    ("loss_scaling_matters", ["--log2-factors", "3"], "integers in [-40, 0]"),
    ("overflow_warning", ["--baseline", "/nonexistent"], "--baseline '/nonexistent': give a "
                                                          "checkout of mxfp16 before the warning"),
    ("loss_scale_floor", ["--log2-floors", "0,2"], "--log2-floors '0,2': give comma-separated "
                                                   "integers in [-60, 0]"),
    ("data_pipeline", ["--image-shape", "224,224"], "--image-shape '224,224'"),
    ("train_throughput", ["--dtypes", "int8"], "unknown dtype(s) ['int8']"),
    ("loop_overhead", ["--rounds", "0"], "--rounds must be >= 1, got 0"),
    ("preemption", ["--signal-batch", "0"], "--signal-batch must be >= 1, got 0"),
    ("checkpoint_format", ["--rounds", "0"], "--rounds must be >= 1, got 0"),
    ("rnn_emulation_error", ["--seeds", "a"], "--seeds 'a': give integers"),
    ("sequence_parity", ["--tasks", "mnist"], "unknown task(s) ['mnist']"),
    ("lm_loss_scaling", ["--log2-factors", "4,x"], "integers in [-40, 0]"),
    ("sequence_speed", ["--units", "250", "--heads", "4"], "--units 250 is not a multiple"),
    ("detection_parity", ["--detectors", "ssd_vgg16"], "unknown detector(s) ['ssd_vgg16']"),
    ("detection_speed", ["--size", "100"], "--size 100: pass a power of two >= 64"),
    ("detection_speed", ["--without-rules", "fast"], "unknown rule(s) ['fast']"),
    ("detection_parity", ["--without-rules", "gemm,fast"], "unknown rule(s) ['fast']"),
])
def test_user_errors_exit_2_with_one_line(load_benchmark, capsys, name, argv, message):
    assert load_benchmark(name).main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and err.count("\n") == 1


@pytest.mark.slow
def test_amp_ssd_quick_counts_casts_and_times_three_dtypes(load_benchmark, tmp_path):
    module = load_benchmark("amp_ssd")
    record, markdown = run_quick(module, tmp_path)
    casts = list(record["casts"].values())
    float32, mxnet_amp, ours = casts
    assert float32["casts"] == 0
    assert mxnet_amp["parameter_casts"] > 0 and ours["parameter_casts"] == 0  # float16 weights
    assert ours["casts"] < mxnet_amp["casts"]
    (round_,) = record["rounds"]  # --quick: one round
    assert list(round_) == list(module.DTYPES)
    assert len(table_rows(markdown)) == 3 + 1 + 3  # casts; the step-time header and rows


@pytest.mark.slow
def test_transposed_conv_step_quick_times_every_dtype(load_benchmark, tmp_path):
    module = load_benchmark("transposed_conv_step")
    record, markdown = run_quick(module, tmp_path)
    assert [row["mode"] for row in record["summary"]] == [name for name, _, _ in module.MODES]
    assert record["summary"][0]["over_float32"] == 1.0
    assert len(table_rows(markdown)) == 5


@pytest.mark.slow
def test_boundary_scale_step_quick_times_every_mode(load_benchmark, tmp_path):
    module = load_benchmark("boundary_scale_step")
    record, markdown = run_quick(module, tmp_path)
    assert [row["mode"] for row in record["summary"]] == list(module.MODES)
    assert record["summary"][0]["over_boundary_off"] == 1.0
    assert len(table_rows(markdown)) == 3


def test_voc_digits_quick_is_read_by_gluoncv_as_voc(load_benchmark, tmp_path, capsys):
    from gluoncv.data import VOCDetection

    module = load_benchmark("voc_digits")
    root = tmp_path / "voc"
    assert module.main(["--quick", "--root", str(root)]) == 0
    assert module.DIGIT_AS_VOC == VOCDetection.CLASSES[:10]  # the scripts' class names
    # GluonCV's scripts: train on 2007+2012 trainval, validate on 2007 test
    train = VOCDetection(root=str(root), splits=[(2007, "trainval"), (2012, "trainval")])
    test = VOCDetection(root=str(root), splits=[(2007, "test")])
    assert (len(train), len(test)) == (4, 2)
    images, labels = module.digit_detection_set(4, 64, seed=0, split="train")
    order = [0, 2, 1, 3]  # even indices in VOC2007, odd in VOC2012
    for position, index in enumerate(order):
        image, label = train[position]
        assert image.shape == (64, 64, 3)
        truth = labels[index][labels[index][:, 4] >= 0]
        # VOC's 1-based inclusive boxes read back as GluonCV does: xmax, ymax one less
        np.testing.assert_array_equal(label[:, :4], truth[:, :4] - [0, 0, 1, 1])
        np.testing.assert_array_equal(label[:, 4], truth[:, 4])  # digit d = VOC class d
        np.testing.assert_array_equal(label[:, 5], 0)  # none difficult
        jpeg_error = np.abs(image.asnumpy() / 255.0 - images[index].transpose(1, 2, 0)).mean()
        assert jpeg_error < 0.05  # JPEG on a noisy canvas: ~0.03; another image: ~0.1+
    # an existing set is never overwritten
    capsys.readouterr()
    assert module.main(["--quick", "--root", str(root)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "already holds VOC2007, VOC2012" in err
    assert err.count("\n") == 1


@pytest.mark.slow
def test_digit_backbone_quick_writes_weights_the_zoo_network_loads(load_benchmark, tmp_path,
                                                                   capsys):
    from gluoncv.model_zoo import get_model

    module = load_benchmark("digit_backbone")
    out = tmp_path / "mobilenet0.25_digits.params"
    assert module.main(["--quick", "--out", str(out)]) == 0
    line = capsys.readouterr().out
    assert line.startswith("mobilenet0.25: 20 steps, held-out digit accuracy ")
    accuracy = float(line.split("accuracy ")[1].split(",")[0])
    assert 0.0 <= accuracy <= 1.0
    net = get_model("mobilenet0.25", pretrained=False)
    net.load_parameters(str(out))  # the model store's file layout: every parameter, same shapes
    assert net.output.weight.shape == (1000, 256)
    # never overwritten; a network the zoo does not have is named
    assert module.main(["--quick", "--out", str(out)]) == 2
    assert module.main(["--quick", "--out", str(tmp_path / "x"), "--network", "mobilenet9"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert "exists; it is never overwritten" in err[0] and "'mobilenet9'" in err[1]


UPSTREAM_LIKE_SCRIPT = '''
import sys, time
import mxnet as mx
from mxnet import gluon
from gluoncv.model_zoo import get_model
from mxfp16 import amp

amp.init()
net = get_model("ssd_300_mobilenet0.25_voc", pretrained_base=True, norm_layer=gluon.nn.BatchNorm)
net.initialize()
first_conv = net.collect_params()["ssd0_mobilenet0_conv0_weight"]
try:
    print("first conv weight sum", float(first_conv.data().sum().asscalar()))
except gluon.parameter.DeferredInitializationError:  # not loaded: shapes come at the first call
    print("first conv weight deferred")
trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1},
                        update_on_kvstore=False)
amp.init_trainer(trainer)
print("args", sys.argv[1:])
time.sleep(0.3)
'''


@pytest.mark.slow
def test_emulation_step_quick_times_both_dtypes(load_benchmark, capsys):
    assert load_benchmark("emulation_step").main(["--quick"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [line.get("dtype") for line in lines] == ["float32", "float16", None]
    assert all(line["median_step_s"] > 0 for line in lines[:2])
    assert (lines[2]["network"], lines[2]["batch_size"], lines[2]["image_size"]) == ("resnet18_v1", 2, 32)
    assert lines[2]["float16_over_float32"] > 0


def test_numpy_interface_quick_counts_no_more_casts_than_legacy(load_benchmark, tmp_path):
    record, markdown = run_quick(load_benchmark("numpy_interface"), tmp_path,
                                 "--parts", "fidelity,casts")
    assert set(record["fidelity"]) == {"resnet_digits_test_acc", "lstm_lm_val_loss"}
    assert all(len(values) == 1 for task in record["fidelity"].values()
               for values in task.values())
    assert len(record["casts"]) == 6 and "## casts" in markdown
    assert all(c["numpy"] <= c["legacy"] for c in record["casts"].values())


def test_numpy_kernels_quick_runs_three_ops_in_both_dtypes(load_benchmark, tmp_path):
    record, markdown = run_quick(load_benchmark("numpy_kernels"), tmp_path)
    assert list(record["ops"]) == ["_npx_relu", "_npx_sigmoid", "_npi_add"]
    assert all(set(result) == {"float16", "bfloat16"} for result in record["ops"].values())
    assert len(table_rows(markdown)) == 3


# ---- the runs started ahead (quick_ahead), checked last: they ran beside the tests above ----

@pytest.mark.slow
def test_train_throughput_quick(load_benchmark, quick_ahead):
    module = load_benchmark("train_throughput")
    record, markdown = ran_ahead(module, quick_ahead)
    rows = record["results"]
    assert [row["dtype"] for row in rows] == ["float32", "float16", "bfloat16"]
    assert len(table_rows(markdown)) == 3
    assert rows[0]["bare_over_float32"] == 1.0
    for row in rows:
        assert row["bare_img_per_s"] > 0 and len(row["bare_step_times_s"]) == 3  # 1 + 2 steps
        status = row["script"]["status"]
        if os.path.isfile(module.SCRIPT):
            assert status == "ok", row["script"]
            assert row["script_over_bare"] > 0
        else:
            assert status.startswith("skipped: ") and row["script_over_bare"] is None


@pytest.mark.slow
def test_overflow_warning_quick_times_two_workers_side_by_side_and_the_locator(load_benchmark,
                                                                            quick_ahead):
    record, markdown = ran_ahead(load_benchmark("overflow_warning"), quick_ahead)
    (row,) = record["paths"]
    assert row["path"] == "trainer-mlp" and len(row["rounds"]) == 1
    assert row["before_ms"] > 0 and row["after_ms"] > 0 and row["ratio"] > 0
    assert row["round_ratio_q1"] <= row["round_ratio_median"] <= row["round_ratio_q3"]
    assert len(table_rows(markdown)) == 1 and len(record["locator"]["seconds"]) == 2
    assert record["locator"]["step_seconds"] > 0 and isinstance(record["locator"]["culprits"], int)
    assert "find_overflow on mobilenet0_25, batch 2 at 32 px" in markdown
    assert set(record["added_us"]) == {"after_step", "keep_call + forget_calls",
                                       "module_step's alarm look-up"}


UPSTREAM_TEST = "test_run_upstream_gives_the_backbone_samples_memory_and_reports_the_scaler"


@pytest.fixture(scope="module", autouse=True)
def upstream_runs(request, tmp_path_factory):
    """``(results, rss_log)`` of :data:`UPSTREAM_TEST`'s three independent run_upstream.py runs
    (a stand-in backbone, none, a random base), started together with this module's first test
    (conftest.started_ahead): each is mostly an interpreter starting; None when the session does
    not run that test."""
    if not chosen_items(request, UPSTREAM_TEST):
        yield None
        return
    import mxnet as mx
    from gluoncv.model_zoo import get_model

    tmp_path = tmp_path_factory.mktemp("upstream")
    backbone = get_model("mobilenet0.25", pretrained=False)
    backbone.initialize(mx.init.Constant(0.5))
    backbone(mx.nd.zeros((1, 3, 32, 32)))  # the convolutions' input channels are inferred
    weights = tmp_path / "backbone.params"
    backbone.save_parameters(str(weights))
    script = tmp_path / "train_like.py"
    script.write_text(UPSTREAM_LIKE_SCRIPT)
    runner = os.path.join(BENCHMARKS_DIR, "run_upstream.py")
    rss_log = tmp_path / "rss.log"
    options = (["--backbone", f"mobilenet0.25={weights}", "--rss-log", str(rss_log),
                "--rss-interval", "0.1"], [], ["--random-base"])
    with contextlib.ExitStack() as stack:
        yield [stack.enter_context(started_ahead(
            request, UPSTREAM_TEST, [sys.executable, runner, *option, str(script), "--seed", "3"],
            timeout=300, cwd=tmp_path)) for option in options], rss_log


@pytest.mark.slow
def test_run_upstream_gives_the_backbone_samples_memory_and_reports_the_scaler(upstream_runs):
    results, rss_log = upstream_runs
    done, refused, random_base = [result() for result in results]
    assert done.returncode == 0, done.stderr
    # the first conv of the base holds the file's 0.5s: 8 filters of 3x3x3
    assert "first conv weight sum 108.0\n" in done.stdout
    assert "args ['--seed', '3']\n" in done.stdout  # the script's own arguments, untouched
    assert "mxfp16.amp loss scaler: final scale " in done.stdout
    assert "skipped steps 0\n" in done.stdout
    samples = [line.split() for line in rss_log.read_text().splitlines()]
    assert samples and all(float(gb) > 0 for _, gb in samples)
    # without a stand-in the zoo's download is refused, naming the fix
    assert refused.returncode != 0
    assert "offline: no weights for 'mobilenet0.25'; pass --backbone mobilenet0.25=FILE" \
        in refused.stderr
    assert random_base.returncode == 0 and "first conv weight deferred\n" in random_base.stdout
