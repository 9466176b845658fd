"""What the early overflow warning costs: an ordinary run's step time before and after it, side by
side, and the locator's own time on ResNet-50 at batch 16.

The warning (:mod:`mxfp16.overflow_warning`) must cost nothing on steps that do not overflow: no
work on the device, no extra wait, no copy; a clean step records two numbers, and a cast network
keeps references to its last call's inputs.  Measured on the paths that carry it, each an ordinary
float16 run (emulated; no step overflows):

* ``trainer-mlp``: ``mxfp16.Trainer`` on a 3-layer MLP (batch 64, 128 features): the shortest
  steps, where a per-step cost on the host shows most;
* ``amp-mlp``: the same MLP through ``mxfp16.amp`` (``init``, ``init_trainer``, ``scale_loss``);
* ``module-mlp``: the same MLP as a Symbol through ``make_scaled_module`` and ``module_step``;
* ``trainer-resnet``: ``mxfp16.Trainer`` on MXNet's ``resnet18_v1`` (10 classes, 32 px, batch 16);
* ``script-resnet``: the scripts' Gluon step (``mxfp16.train.gluon_api.GluonAPI.train_step``) on
  ``cifar_resnet20_v1`` (32 px, batch 16).

Each path runs in two worker processes started alike, one importing mxfp16 from ``--baseline`` (a
checkout before the warning, e.g. ``git worktree add --detach /tmp/before COMMIT``), one from
this checkout; after --warmup steps they take turns, round by round (each side first in turn), each
timing --steps steps (``waitall`` after each, on both sides).  Reported per path: the median step
of each side over all rounds, the speed ratio before / after (1: unchanged; below 1: slower after),
and the spread of the per-round ratios.  Then, in the worker of this checkout, as many steps again
with the warning's per-step calls taken out (no-ops) and with them, alternating step by step (a
finer interleaving, in one process: what the calls cost, whatever else the two checkouts differ
in); and, in this process, the microseconds of the calls themselves (``timeit``).  Then the locator:
``mxfp16.find_overflow`` on a cast ``resnet50_v1`` and a batch of --locator-batch 224x224 images,
timed twice (the first call traces and casts), with its peak memory, beside an ordinary training
step of the same network and batch (each in a process of its own).  Outputs in --out-dir:
overflow_warning.md and .json.

Usage: python benchmarks/overflow_warning.py --baseline DIR [--paths ...] [--rounds 10]
       [--steps 20] [--locator-batch 16] [--quick]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass

from bench_common import (add_output_arguments, command_line, header_lines, machine_info,
                          markdown_table, parse_argv, parse_choices, publish, require_positive)

NAME = "overflow_warning"
PATHS = ("trainer-mlp", "amp-mlp", "module-mlp", "trainer-resnet", "script-resnet")
HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@dataclass(frozen=True)
class Config:
    baseline: str
    paths: tuple
    rounds: int
    steps: int
    warmup: int
    locator_batch: int
    locator_size: int
    locator_network: str
    out_dir: str


# --- the worker: one path, built once, stepping on request (runs on either checkout) ---

def _mlp():
    from mxnet.gluon import nn
    net = nn.HybridSequential()
    net.add(nn.Dense(256, activation="relu", in_units=128), nn.Dense(256, activation="relu"),
            nn.Dense(10))
    net.initialize()
    return net


def _data(batch, shape, classes=10):
    import mxnet as mx
    return mx.nd.random.uniform(-1, 1, shape=(batch,) + shape), \
        mx.nd.array([i % classes for i in range(batch)])


def _trainer_step(net, shape, batch):
    import mxnet as mx
    from mxnet import autograd, gluon
    import mxfp16
    net = mxfp16.cast_block(net, "float16")
    net.hybridize(static_alloc=True, static_shape=True)
    trainer = mxfp16.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.01}, dtype="float16")
    loss_fn, (x, y) = gluon.loss.SoftmaxCrossEntropyLoss(), _data(batch, shape)

    def step():
        with autograd.record():
            loss = loss_fn(net(x), y)
        trainer.backward(loss)
        trainer.step(batch)
        mx.nd.waitall()
    return step


def _amp_step():
    import mxnet as mx
    from mxnet import autograd, gluon
    from mxfp16 import amp
    amp.init()
    net = _mlp()
    net.hybridize(static_alloc=True, static_shape=True)
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.01},
                            update_on_kvstore=False)
    amp.init_trainer(trainer)
    loss_fn, (x, y) = gluon.loss.SoftmaxCrossEntropyLoss(), _data(64, (128,))

    def step():
        with autograd.record():
            loss = loss_fn(net(x), y)
            with amp.scale_loss(loss, trainer) as scaled:
                autograd.backward(scaled)
        trainer.step(64)
        mx.nd.waitall()
    return step


def _module_step():
    import mxnet as mx
    import mxfp16
    data = mx.sym.var("data")
    hidden = mx.sym.relu(mx.sym.FullyConnected(data, num_hidden=256, name="fc1"))
    hidden = mx.sym.relu(mx.sym.FullyConnected(hidden, num_hidden=256, name="fc2"))
    sym = mx.sym.SoftmaxOutput(mx.sym.FullyConnected(hidden, num_hidden=10, name="fc3"),
                               name="softmax")
    scaler = mxfp16.make_loss_scaler(None, "float16")
    module = mxfp16.make_scaled_module(mxfp16.cast_symbol(sym, "float16"), scaler)
    module.bind(data_shapes=[("data", (64, 128))], label_shapes=[("softmax_label", (64,))])
    module.init_params(mx.init.Xavier())
    optimizer = mxfp16.make_optimizer("sgd", "float16", learning_rate=0.01)
    mxfp16.init_optimizer(module, optimizer)
    batch = mx.io.DataBatch(list(_data(64, (128,))[:1]), [_data(64, (128,))[1]])

    def step():
        mxfp16.module_step(module, batch, scaler, optimizer, 64)
        mx.nd.waitall()
    return step


def _script_step():
    import mxnet as mx
    import mxfp16
    from mxfp16.models import new_network
    from mxfp16.train.gluon_api import GluonAPI
    network = new_network("cifar_resnet20_v1", 10, (3, 32, 32))
    api = GluonAPI(network, mxfp16.make_loss_scaler(None, "float16"), ctx=[mx.cpu()],
                   dtype="float16", kvstore="device", optimizer="sgd",
                   optimizer_params={"learning_rate": 0.01})
    x, y = _data(16, (3, 32, 32))

    def step():
        api.train_step([x], [y], 16)
        mx.nd.waitall()
    return step


def _path_step(path):
    import mxnet as mx
    mx.random.seed(0)
    if path == "trainer-mlp":
        return _trainer_step(_mlp(), (128,), 64)
    if path == "trainer-resnet":
        from mxnet.gluon.model_zoo import vision
        net = vision.resnet18_v1(classes=10)
        net.initialize(mx.init.Xavier())
        return _trainer_step(net, (3, 32, 32), 16)
    return {"amp-mlp": _amp_step, "module-mlp": _module_step, "script-resnet": _script_step}[path]()


def _seconds(step):
    start = time.perf_counter()
    step()
    return time.perf_counter() - start


def toggled_steps(step, pairs):
    """``{'off': [s, ...], 'on': [s, ...]}``: ``pairs`` steps with the warning's per-step calls
    taken out (``keep_call``, ``forget_calls``, ``OverflowAlarm.after_step`` as no-ops) and as
    many with them, alternating step by step in this process (each first in turn)."""
    from mxfp16.overflow_warning import OverflowAlarm
    from mxfp16.scaling import boundary
    calls = {"on": (boundary.keep_call, boundary.forget_calls, OverflowAlarm.after_step),
             "off": (lambda network, inputs: None, lambda: None,
                     lambda self, *args, **kwargs: None)}
    times = {"off": [], "on": []}
    try:
        for index in range(pairs):
            for mode in ("off", "on") if index % 2 == 0 else ("on", "off"):
                boundary.keep_call, boundary.forget_calls, OverflowAlarm.after_step = calls[mode]
                times[mode].append(_seconds(step))
    finally:
        boundary.keep_call, boundary.forget_calls, OverflowAlarm.after_step = calls["on"]
    return times


def worker(path, warmup):
    """Build ``path``, take ``warmup`` steps, then answer each line of stdin, until ``quit``:
    ``N`` with the seconds of N timed steps, ``toggle N`` with :func:`toggled_steps` (JSON)."""
    import mxfp16
    step = _path_step(path)
    for _ in range(warmup):
        step()
    print(json.dumps({"ready": os.path.dirname(os.path.dirname(mxfp16.__file__))}), flush=True)
    for line in sys.stdin:
        words = line.split()
        if words == ["quit"]:
            return 0
        answer = toggled_steps(step, int(words[1])) if words[0] == "toggle" else \
            [_seconds(step) for _ in range(int(words[0]))]
        print(json.dumps(answer), flush=True)
    return 0


# --- the driver: the two sides in turn ---

def _start(tree, path, warmup):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [tree] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    return subprocess.Popen([sys.executable, os.path.abspath(__file__), "--worker", path,
                             "--warmup", str(warmup)], env=env, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, cwd=HERE)


def _ready(process, tree):
    """Wait for a worker's first line; it must have imported mxfp16 from ``tree``."""
    ready = json.loads(process.stdout.readline())["ready"]
    if os.path.realpath(ready) != os.path.realpath(tree):
        process.kill()
        raise RuntimeError(f"the worker for {tree} imported mxfp16 from {ready}")


def _ask(process, steps):
    process.stdin.write(f"{steps}\n")
    process.stdin.flush()
    return json.loads(process.stdout.readline())


def compare(path, config):
    """Per round, the median step of the checkout before and after, side by side; then this
    checkout's steps with the warning's calls off and on, alternating in its worker."""
    trees = {"before": config.baseline, "after": HERE}
    sides = {side: _start(tree, path, config.warmup) for side, tree in trees.items()}
    rounds = []
    try:
        for side, process in sides.items():  # started together, each warmed up on its own
            _ready(process, trees[side])
        for index in range(config.rounds):
            order = ("before", "after") if index % 2 == 0 else ("after", "before")
            rounds.append({side: statistics.median(_ask(sides[side], config.steps))
                           for side in order})
        toggled = _ask(sides["after"], f"toggle {config.rounds * config.steps}")
        return rounds, toggled
    finally:
        for process in sides.values():
            process.stdin.write("quit\n")
            process.stdin.flush()
            process.wait(timeout=60)




def _timed(call):
    import mxnet as mx
    start = time.perf_counter()
    result = call()
    mx.nd.waitall()
    return time.perf_counter() - start, result


def _locator_network(network, batch, size):
    import mxnet as mx
    from mxnet.gluon.model_zoo import vision
    import mxfp16
    mx.random.seed(0)
    net = getattr(vision, network)(classes=1000)
    net.initialize(mx.init.Xavier())
    x = mx.nd.random.uniform(-1, 1, shape=(batch, 3, size, size))
    return mxfp16.cast_block(net, "float16"), x, mx.nd.array([i % 1000 for i in range(batch)])


def locator_worker(what, network, batch, size):
    """In a process of its own, so that each peak of memory is its own: ``'locate'``,
    ``find_overflow`` twice (the first call traces); ``'step'``, two ordinary training steps of the
    same network and batch.  Prints the seconds of each, the culprits and the peak RSS (JSON)."""
    import resource
    from mxnet import autograd, gluon
    import mxfp16
    net, x, label = _locator_network(network, batch, size)
    if what == "locate":
        net(x)  # the parameters' shapes, as a training step would have given them
        calls = [_timed(lambda: mxfp16.find_overflow(net, x, label=label)) for _ in range(2)]
        seconds, culprits = [seconds for seconds, _ in calls], len(calls[-1][1].culprits)
    else:
        net.hybridize(static_alloc=True, static_shape=True)
        trainer = mxfp16.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.01},
                                 dtype="float16")

        def step():
            with autograd.record():
                loss = gluon.loss.SoftmaxCrossEntropyLoss()(net(x), label)
            trainer.backward(loss)
            trainer.step(batch)
        seconds, culprits = [_timed(step)[0] for _ in range(2)], None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2 ** 20  # KiB -> GiB
    print(json.dumps({"seconds": seconds, "culprits": culprits, "peak_gib": peak}), flush=True)
    return 0


def locator_seconds(config):
    """The locator's cost on a cast ``locator_network`` (:func:`locator_worker`, each part in a
    process of its own): its two calls' seconds and peak memory, beside a training step's."""
    found = {}
    for what in ("locate", "step"):
        done = subprocess.run([sys.executable, os.path.abspath(__file__), "--locator", what,
                               config.locator_network, str(config.locator_batch),
                               str(config.locator_size)], capture_output=True, text=True,
                              cwd=HERE, check=True)
        found[what] = json.loads(done.stdout.strip().splitlines()[-1])
    return {"seconds": found["locate"]["seconds"], "culprits": found["locate"]["culprits"],
            "peak_gib": found["locate"]["peak_gib"], "step_seconds": found["step"]["seconds"][-1],
            "step_peak_gib": found["step"]["peak_gib"]}


def added_microseconds():
    """Microseconds of what a clean step does more than before: the alarm told of the step
    (``OverflowAlarm.after_step``), the inputs kept and let go (``keep_call`` + ``forget_calls``)
    and, in ``module_step``, the Module's alarm found, each the best of 5 runs of 20000
    (``timeit``), in this process."""
    import timeit
    import mxnet as mx
    import mxfp16
    from mxfp16.overflow_warning import OverflowAlarm
    from mxfp16.scaling import boundary
    scaler = mxfp16.make_loss_scaler(None, "float16")
    alarm, x, net = OverflowAlarm(scaler, "benchmark"), mx.nd.ones((2, 2)), _mlp()
    losses = [x]
    from mxfp16.module import overflow_alarm
    overflow_alarm(net, scaler)  # any object stands for the Module: the look-up is by identity
    calls = {
        "after_step": lambda: alarm.after_step(scaler, 1.0, True, None, losses),
        "keep_call + forget_calls": lambda: (boundary.keep_call(net, (x,)),
                                             boundary.forget_calls()),
        "module_step's alarm look-up": lambda: overflow_alarm(net, scaler),
    }
    return {name: 1e6 * min(timeit.repeat(call, number=20000, repeat=5)) / 20000
            for name, call in calls.items()}


def summarize(path, measured):
    """Medians of each side, their ratio, the median and quartiles of the per-round ratios, and
    the medians of the toggled steps with their ratio (off / on)."""
    rounds, toggled = measured
    before = statistics.median(r["before"] for r in rounds)
    after = statistics.median(r["after"] for r in rounds)
    ratios = sorted(r["before"] / r["after"] for r in rounds)
    quartiles = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else ratios * 3
    off, on = (statistics.median(toggled[mode]) for mode in ("off", "on"))
    return {"path": path, "before_ms": 1000 * before, "after_ms": 1000 * after,
            "ratio": before / after, "round_ratio_median": statistics.median(ratios),
            "round_ratio_q1": quartiles[0], "round_ratio_q3": quartiles[-1],
            "off_ms": 1000 * off, "on_ms": 1000 * on, "toggled_ratio": off / on,
            "rounds": rounds, "toggled": toggled}


def markdown(rows, locator, record):
    body = [[row["path"], f"{row['before_ms']:.2f}", f"{row['after_ms']:.2f}",
             f"{row['ratio']:.3f}", f"{row['round_ratio_median']:.3f} "
             f"({row['round_ratio_q1']:.3f}–{row['round_ratio_q3']:.3f})",
             f"{row['off_ms']:.2f} / {row['on_ms']:.2f}", f"{row['toggled_ratio']:.3f}"]
            for row in rows]
    config = record["config"]
    text = (f"# The early overflow warning: step time before and after, and the locator\n\n"
            f"{header_lines(record)}Before: `{config['baseline']}`; {config['rounds']} rounds of "
            f"{config['steps']} steps each side.\n\n"
            + markdown_table(["path", "median step before (ms)", "after (ms)",
                              "speed ratio before / after",
                              "per-round ratios: median (quartiles)",
                              "one process, calls off / on (ms)", "ratio off / on"], body))
    added = record["added_us"]
    text += ("\nWhat a clean step does more, in this process (best of 5 x 20000): "
             + ", ".join(f"{name} {value:.2f} µs" for name, value in added.items()) + "\n")
    if locator is None:
        return text
    first, second = locator["seconds"]
    return text + (f"\nfind_overflow on {config['locator_network']}, batch "
                   f"{config['locator_batch']} at {config['locator_size']} px: {first:.1f} s "
                   f"the first call, {second:.1f} s the second ({locator['culprits']} culprits), "
                   f"peak RSS {locator['peak_gib']:.1f} GiB; one training step of the same "
                   f"network and batch: {locator['step_seconds']:.1f} s, peak RSS "
                   f"{locator['step_peak_gib']:.1f} GiB\n")


def make_config(args):
    require_positive(args, ["rounds", "steps"])
    if args.locator_batch < 0:
        raise ValueError(f"--locator-batch must be >= 0 (0 skips the locator), got "
                         f"{args.locator_batch}")
    paths = parse_choices(args.paths, PATHS, "--paths", "path") if args.paths.strip() else ()
    if args.quick:
        return Config(args.baseline or HERE, ("trainer-mlp",), 1, 2, 1, 2, 32, "mobilenet0_25",
                      args.out_dir)
    if not args.baseline or not os.path.isdir(os.path.join(args.baseline, "mxfp16")):
        raise ValueError(f"--baseline {args.baseline!r}: give a checkout of mxfp16 before the "
                         "warning (a folder holding mxfp16/), for example one made by git worktree "
                         "add --detach /tmp/before COMMIT")
    return Config(os.path.abspath(args.baseline), paths, args.rounds, args.steps, 3,
                  args.locator_batch, 224, "resnet50_v1", args.out_dir)


def get_args_parser():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", help="a checkout of mxfp16 before the warning (required, "
                                           "but for --quick: this checkout) (default: none)")
    parser.add_argument("--paths", default=",".join(PATHS),
                        help=f"comma-separated paths to time, '' for none (the locator only) "
                             f"(default: {','.join(PATHS)})")
    parser.add_argument("--rounds", type=int, default=10, help="rounds, each side in turn "
                                                               "(default: 10)")
    parser.add_argument("--steps", type=int, default=20, help="timed steps per side and round "
                                                              "(default: 20)")
    parser.add_argument("--locator-batch", type=int, default=16,
                        help="batch of the locator's ResNet-50 run, 0 to skip it (default: 16)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--warmup", type=int, default=3, help=argparse.SUPPRESS)
    add_output_arguments(parser, "the .md and .json", "trainer-mlp, 1 round of 2 steps against "
                                                      "this checkout, the locator on MobileNet "
                                                      "0.25 at batch 2, 32 px")
    return parser


def main(argv=None):
    if argv is None and "--worker" in sys.argv:
        args = get_args_parser().parse_args()
        return worker(args.worker, args.warmup)
    if argv is None and "--locator" in sys.argv:
        what, network, batch, size = sys.argv[sys.argv.index("--locator") + 1:][:4]
        return locator_worker(what, network, int(batch), int(size))
    config, argv, failed = parse_argv(get_args_parser(), make_config, argv)
    if config is None:
        return failed
    rows = []
    for path in config.paths:
        rows.append(summarize(path, compare(path, config)))
        print(f"{path}: before {rows[-1]['before_ms']:.2f} ms, after {rows[-1]['after_ms']:.2f} "
              f"ms, ratio {rows[-1]['ratio']:.3f}; toggled in one process "
              f"{rows[-1]['toggled_ratio']:.3f}", flush=True)
    record = {"benchmark": NAME, "command": command_line(NAME, argv), "machine": machine_info(),
              "config": asdict(config), "paths": rows, "added_us": added_microseconds(),
              "locator": locator_seconds(config) if config.locator_batch else None}
    publish(config.out_dir, NAME, markdown(rows, record["locator"], record), record)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
