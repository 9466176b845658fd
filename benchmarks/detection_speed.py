"""Training-step speed of detectors, float16 (CPU emulation) and bfloat16 against float32, the casts in
the float16 GPU graph against MXNet AMP's, and where the step time goes.

Detectors (``bench_detection.py``): the SSD of ``examples/ssd_detection.py`` on mobilenet0.25 and on
resnet50_v1 (the base of MXNet's AMP tutorial), and GluonCV's YOLOv3 on mobilenet0.25 and on
darknet53 (the zoo's ``yolo3_darknet53_custom``), on 128-pixel images of the digits detection set.
A training step is GluonCV's for the family (SSD: forward, ``SSDMultiBoxLoss``; YOLOv3: the
network's losses given the targets), backward through
``mxfp16.Trainer`` (dynamic loss scaling in float16) and an SGD update, hybridized with
``static_alloc`` and ``static_shape``.

Fairness on a shared machine: the dtypes are timed in turns, ``--rounds`` times, each round timing
``--steps`` steps of every dtype after the warm-up; a round's ratio divides times measured within
seconds of each other, and the table reports the median over rounds.  Goals of issue 20: bfloat16
at least 1.6x float32's speed; emulated float16 at most 2x float32's step time.

Casts: the ``Cast``/``amp_cast``/``amp_multicast`` nodes that ``mxfp16.cast_symbol(sym, 'float16',
emulate=False)`` (the graph a GPU runs) and MXNet AMP's ``amp.convert_hybrid_block(net, 'float16',
cast_optional_params=True)`` insert in the same training-mode graph (the graph's own casts
subtracted); each runs once per forward pass and once more in backward.

Profile: per operator, the milliseconds per step in each dtype (MXNet's profiler, aggregate
statistics, with bulk execution off so that each operator is timed alone, the dtypes a step each in
turn), the --top-ops largest; and from it, bfloat16's bounds: float32 ÷ bfloat16 if the GEMMs
alone took time, and if the other operators cost what they cost in float32.

Outputs in --out-dir: detection_speed.md and .json.
Usage: python benchmarks/detection_speed.py [--detectors ssd_mobilenet0.25,...] [--rounds 5] [--quick]
"""
import argparse
import atexit
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import asdict, dataclass

import mxnet as mx
from bench_common import (add_output_arguments, command_line, config_from, header_lines,
                          machine_info, markdown_table, parse_argv, publish, require_positive)
from bench_detection import (DETECTORS, add_detector_arguments, build, detection_data, drop_rules,
                             loss_function, parse_detector_arguments, prepare, short_error,
                             targets, train_step)
from mxnet import autograd
from mxnet.contrib import amp

import mxfp16

NAME = "detection_speed"
DEFAULT_DETECTORS = ("ssd_mobilenet0.25", "ssd_resnet50_v1", "yolo3_mobilenet0.25",
                     "yolo3_darknet53")

#: Graph ops that convert dtypes: MXNet's Cast and the two casts AMP inserts.
CAST_OPS = ("Cast", "amp_cast", "amp_multicast")

#: Goals of issue 20: bfloat16 speed-up at least this; emulated float16 slow-down at most this.
BFLOAT16_GOAL, FLOAT16_GUARD = 1.6, 2.0

#: The profiler's names of the GEMM operators (what bfloat16 speeds up), forward and backward.
GEMM_OPS = ("Convolution", "_backward_Convolution", "FullyConnected", "_backward_FullyConnected")

#: MXNet's bulk execution runs segments of operators as one profiler entry; off, each is timed.
UNBULKED = {"MXNET_EXEC_BULK_EXEC_TRAIN": "0", "MXNET_EXEC_BULK_EXEC_INFERENCE": "0",
            "MXNET_EXEC_BULK_EXEC_MAX_NODE_TRAIN_FWD": "1",
            "MXNET_EXEC_BULK_EXEC_MAX_NODE_TRAIN_BWD": "1"}


@dataclass(frozen=True)
class Config:
    detectors: tuple
    dtypes: tuple
    batch_size: int
    size: int
    rounds: int
    steps: int
    warmup: int
    profile_steps: int
    top_ops: int
    profile_of: str
    without_rules: tuple
    out_dir: str


def build_step(detector, dtype, config):
    """A closure running one training step of ``detector`` in ``dtype`` and waiting for it, or
    the error that building or running the first step gave."""
    (images, labels), _ = detection_data(config.batch_size, 1, config.size)
    try:
        net = build(detector, config.size, 0, config.batch_size)
        batch_targets = targets(detector, net, labels, config.size)
        net, trainer = prepare(net, dtype, lr=1e-3)
        loss_fn, data = loss_function(detector), mx.nd.array(images)

        def step():
            train_step(detector, net, trainer, data, batch_targets, loss_fn)
            mx.nd.waitall()
        step()
    except Exception as error:  # a dtype that cannot train is a result
        return short_error(error)
    return step


def time_steps(step, count):
    start = time.perf_counter()
    for _ in range(count):
        step()
    return (time.perf_counter() - start) / count


def time_interleaved(steps, config):
    """Per dtype: the step time of every round; dtypes alternate within each round."""
    for step in steps.values():
        time_steps(step, config.warmup)
    times = {dtype: [] for dtype in steps}
    for _ in range(config.rounds):
        for dtype, step in steps.items():
            times[dtype].append(time_steps(step, config.steps))
    return times


def cast_nodes(sym):
    """``(op, input names)`` of every cast node of ``sym``; ``amp_multicast`` casts several."""
    # tojson() hides amp_cast nodes unless told not to.
    nodes = json.loads(sym.tojson(remove_amp_cast=False))["nodes"]
    return [(node["op"], [nodes[entry[0]]["name"] for entry in node["inputs"]])
            for node in nodes if node["op"] in CAST_OPS]


def cast_counts(detector, config):
    """Casts inserted in the float16 training-mode graph by mxfp16 (its GPU graph) and by AMP:
    nodes, tensors converted (an ``amp_multicast`` node converts several) and the tensors cast."""
    (images, labels), _ = detection_data(config.batch_size, 1, config.size)
    net = build(detector, config.size, 0, config.batch_size)
    inputs = [mx.nd.array(images)]
    family = DETECTORS[detector][0]
    if family in ("yolo3", "rcnn"):  # their training calls take targets or gt boxes and labels
        inputs += targets(detector, net, labels, config.size)[:2 if family == "rcnn" else None]
    net.hybridize()
    with autograd.record():  # YOLOv3 computes its losses only while recording
        net(*inputs)
    variables, sym = net._cached_graph  # what convert_hybrid_block converts
    names = [variable.name for variable in variables]
    own = len(cast_nodes(sym))
    result = {}
    for name, convert in (
            ("mxfp16_gpu_graph", lambda: mxfp16.cast_symbol(sym, "float16", emulate=False,
                                                             data_names=names)),
            ("mxnet_amp", lambda: amp.convert_hybrid_block(
                net, target_dtype="float16", ctx=mx.cpu(),
                cast_optional_params=True)._cached_graph[1])):
        try:
            nodes = cast_nodes(convert())
        except Exception as error:  # a graph that does not convert is a result
            result[name] = {"error": short_error(error)}
            continue
        result[name] = {"nodes": len(nodes) - own,
                        "tensors": sum(len(inputs) for _, inputs in nodes) - own,
                        "cast_inputs": [inputs for _, inputs in nodes]}
    return result


def profile(steps, config):
    """Per dtype: operator name -> milliseconds per step (steps built with bulk execution off),
    the dtypes profiled a step each in turn, as they are timed."""
    # MXNet's profiler deletes the file it is given (and writes it at exit): a file of our own,
    # never os.devnull, which it would replace with a regular file (as root)
    folder = tempfile.mkdtemp(prefix="mxfp16-profile-")
    atexit.register(shutil.rmtree, folder, True)
    mx.profiler.set_config(profile_all=True, aggregate_stats=True,
                           filename=os.path.join(folder, "profile.json"))
    result = {dtype: defaultdict(float) for dtype in steps}
    for _ in range(config.profile_steps):
        for dtype, step in steps.items():
            mx.profiler.set_state("run")
            step()
            mx.profiler.set_state("stop")
            stats = json.loads(mx.profiler.dumps(reset=True, format="json"))
            for name, entry in stats.get("Time", {}).get("operator", {}).items():
                result[dtype][name] += entry["Total"] / config.profile_steps
    return {dtype: dict(per_op) for dtype, per_op in result.items()}


def gemm_bounds(ops, dtype):
    """GEMM and other milliseconds per step of float32 and ``dtype`` (a profile of both), and
    float32 ÷ ``dtype`` of the step as profiled and its bounds: the GEMMs alone (every other op
    free in both dtypes) and the other ops at float32's cost in both (only GEMMs change)."""
    gemm = {d: sum(ops[d].get(op, 0.0) for op in GEMM_OPS) for d in ("float32", dtype)}
    other = {d: sum(ops[d].values()) - gemm[d] for d in gemm}
    return {"gemm_ms": gemm, "other_ms": other,
            "profiled": (gemm["float32"] + other["float32"]) / (gemm[dtype] + other[dtype]),
            "gemms_alone": gemm["float32"] / gemm[dtype],
            "others_as_float32": (gemm["float32"] + other["float32"])
            / (gemm[dtype] + other["float32"])}


def bounds_markdown(results):
    """The table of :func:`gemm_bounds` for bfloat16, one row per profiled detector."""
    rows = []
    for result in results:
        ops = result["profile_ms_per_step"]
        if ops and "error" not in ops and {"float32", "bfloat16"} <= set(ops):
            b = gemm_bounds(ops, "bfloat16")
            rows.append([result["detector"]] + [
                f"{b[key][d]:.1f}" for key in ("gemm_ms", "other_ms")
                for d in ("float32", "bfloat16")] + [
                f"{b[key]:.2f}" for key in ("profiled", "gemms_alone", "others_as_float32")])
    if not rows:
        return ""
    return ("\nbfloat16 against float32 from the profiles: GEMM (Convolution, FullyConnected, "
            "forward and backward) and other operators' ms per step, and float32 ÷ bfloat16 "
            "as profiled, for the GEMMs alone, and with the other operators at float32's "
            "cost:\n\n" + markdown_table(
                ["detector", "GEMM f32", "GEMM bf16", "other f32", "other bf16", "profiled",
                 "GEMMs alone", "others at f32 cost"], rows))


def profile_in_subprocess(detector, config):
    """:func:`profile` of ``detector`` in a fresh process with bulk execution off (MXNet reads the
    switch once per process), or the error it gave."""
    argv = [sys.executable, os.path.abspath(__file__), "--profile-of", detector,
            "--dtypes", ",".join(config.dtypes), "--batch-size", str(config.batch_size),
            "--size", str(config.size), "--profile-steps", str(config.profile_steps),
            "--without-rules", ",".join(config.without_rules)]
    done = subprocess.run(argv, env=dict(os.environ, **UNBULKED), capture_output=True, text=True)
    if done.returncode:
        return {"error": short_error(RuntimeError(done.stderr))}
    return json.loads(done.stdout.strip().splitlines()[-1])


def summarize(detector, times, errors, casts, ops):
    rows = []
    for dtype, values in times.items():
        ratios = [base / value for value, base in zip(values, times["float32"])] \
            if "float32" in times else []
        rows.append({"detector": detector, "dtype": dtype, "step_times_s": values,
                     "median_step_s": statistics.median(values),
                     "speedups_over_float32": ratios,
                     "median_speedup": statistics.median(ratios) if ratios else None})
    rows += [{"detector": detector, "dtype": dtype, "error": error}
             for dtype, error in errors.items()]
    return {"detector": detector, "rows": rows, "casts": casts, "profile_ms_per_step": ops}


def verdict(row):
    if row["dtype"] == "bfloat16":
        return "goal >= 1.6: " + ("met" if row["median_speedup"] >= BFLOAT16_GOAL else "missed")
    if row["dtype"] == "float16":
        return "guard <= 2.0x time: " + ("met" if 1 / row["median_speedup"] <= FLOAT16_GUARD
                                          else "missed")
    return ""


def markdown(results, config):
    speed = [[r["detector"], r["dtype"], f"{r['median_step_s'] * 1000:.0f}",
              f"{r['median_speedup']:.2f}" if r["median_speedup"] else "-",
              " ".join(f"{v:.2f}" for v in r["speedups_over_float32"]), verdict(r)]
             if "error" not in r else [r["detector"], r["dtype"], "-", "-", "-",
                                       f"not measured: `{r['error']}`"]
             for result in results for r in result["rows"]]
    text = markdown_table(["detector", "dtype", "median step ms", "speed-up over float32",
                           "per round", "issue 20"], speed)
    casts = [[result["detector"]] + [
        f"{c['nodes']} nodes, {c['tensors']} tensors" if "nodes" in c else f"`{c['error']}`"
        for c in (result["casts"]["mxfp16_gpu_graph"], result["casts"]["mxnet_amp"])]
        for result in results]
    text += "\nCasts inserted in the float16 training graph (each runs forward and backward):\n\n"
    text += markdown_table(["detector", "mxfp16 GPU graph", "MXNet AMP convert_hybrid_block"],
                           casts)
    for result in results:
        ops = result["profile_ms_per_step"]
        if not ops:
            continue
        if "error" in ops:
            text += f"\n{result['detector']}: no profile: `{ops['error']}`\n"
            continue
        dtypes = list(ops)
        names = {op for times in ops.values() for op in times}
        top = sorted(names, key=lambda op: max(ops[d].get(op, 0.0) for d in dtypes),
                     reverse=True)[:config.top_ops]
        text += (f"\n{result['detector']}: operators by time, ms per step "
                 f"(profiler, bulk execution off):\n\n")
        rows = [[op] + [f"{ops[d].get(op, 0.0):.1f}" for d in dtypes] for op in top]
        rows.append(["all operators"] + [f"{sum(ops[d].values()):.1f}" for d in dtypes])
        text += markdown_table(["operator"] + dtypes, rows)
    return text + bounds_markdown(results)


def get_args_parser():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add = parser.add_argument
    add_detector_arguments(add, DEFAULT_DETECTORS)
    add("--batch-size", type=int, default=16, help="images per step (default: 16)")
    add("--size", type=int, default=128, help="image side in pixels (default: 128)")
    add("--rounds", type=int, default=5, help="interleaved timing rounds (default: 5)")
    add("--steps", type=int, default=5, help="steps timed per dtype and round (default: 5)")
    add("--warmup", type=int, default=2, help="untimed steps per dtype first (default: 2)")
    add("--profile-steps", type=int, default=3,
        help="profiled steps per dtype, 0 for no profile (default: 3)")
    add("--profile-of", default="", help=argparse.SUPPRESS)  # the profiling subprocess
    add("--top-ops", type=int, default=10, help="operators listed per profile (default: 10)")
    return add_output_arguments(parser, "the .md and .json",
                                "batch 2 at 64 px, 2 rounds of 1 step, 1 profiled step")


def make_config(args):
    detectors, dtypes, without = parse_detector_arguments(args)
    require_positive(args, ("batch_size", "rounds", "steps", "top_ops"))
    values = dict(vars(args), detectors=detectors, dtypes=dtypes, without_rules=without)
    if args.quick:
        values.update(batch_size=2, size=64, rounds=2, steps=1, warmup=1, profile_steps=1)
    return config_from(Config, values)


def measure(detector, config):
    built = {dtype: build_step(detector, dtype, config) for dtype in config.dtypes}
    steps = {dtype: step for dtype, step in built.items() if callable(step)}
    errors = {dtype: error for dtype, error in built.items() if not callable(error)}
    times = time_interleaved(steps, config)
    ops = profile_in_subprocess(detector, config) if config.profile_steps else {}
    return summarize(detector, times, errors, cast_counts(detector, config), ops)


def main(argv=None):
    config, argv, failed = parse_argv(get_args_parser(), make_config, argv)
    if failed:
        return failed
    drop_rules(config.without_rules)
    if config.profile_of:
        steps = {dtype: build_step(config.profile_of, dtype, config) for dtype in config.dtypes}
        print(json.dumps(profile({d: s for d, s in steps.items() if callable(s)}, config)))
        return 0
    results = [measure(detector, config) for detector in config.detectors]
    record = {"benchmark": NAME, "command": command_line(NAME, argv), "machine": machine_info(),
              "config": asdict(config), "results": results}
    publish(config.out_dir, NAME, header_lines(record) + markdown(results, config), record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
