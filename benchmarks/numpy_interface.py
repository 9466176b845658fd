"""MXNet's NumPy interface (``npx.set_np()``) in float16 and bfloat16: fidelity, speed and casts.

Three parts, each against what it must match:

* ``fidelity``: a d2l ResNet on the digits (test accuracy; SGD with a cosine schedule) and a
  character LSTM language model on the standard library's docstrings (validation loss), trained in
  numpy mode in float32, float16 (CPU emulation) and bfloat16 over several seeds: do float16 and
  bfloat16 land within float32's seed spread?
* ``speed``: the bfloat16 speed-up (float32 step time / bfloat16 step time) of d2l's ResNet-18 on
  3x64x64 images, built in numpy mode and in the legacy front end.  The four (front end, dtype)
  runs are timed in interleaved rounds, so a load that changes during the run hits them alike;
  ratios, not times.
* ``casts``: cast nodes per training step in the GPU graph (``emulate=False``) of twin networks
  (the same layers written for each front end), float16 and bfloat16.

    python benchmarks/numpy_interface.py                       # all three parts
    python benchmarks/numpy_interface.py --parts speed --rounds 9
"""
import argparse
import dataclasses
import sys
import time

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon
from mxnet.gluon import nn, rnn

import mxfp16
from bench_common import (add_output_arguments, command_line, digits_split, header_lines,
                          machine_info, markdown_table, mean_std, parse_choices, parse_config,
                          publish, stdlib_text)
from mxfp16 import mxnet_internals
from mxfp16.numpy_interface import semantics

NAME = "numpy_interface"
PARTS = ("fidelity", "speed", "casts")
DTYPES = ("float32", "float16", "bfloat16")
CAST_OPS = ("amp_cast", "amp_multicast", "Cast")


#: The numeric flags: (field, default, --quick's value, help). The parser, the config and the
#: quick mode read their defaults from this one table.
SETTINGS = (
    ("seeds", 3, 1, "seeds per dtype for fidelity"),
    ("epochs", 8, 1, "ResNet epochs on the digits"),
    ("lm_chars", 60000, 8000, "characters of the LM corpus"),
    ("lm_epochs", 3, 1, "LM epochs"),
    ("rounds", 5, 1, "interleaved timing rounds"),
    ("steps", 10, 2, "steps per timing"),
    ("batch_size", 64, 32, "batch size of the digits"),
    ("speed_batch_size", 16, 4, "batch size of the speed part"),
)

Config = dataclasses.make_dataclass(
    "Config", [("parts", tuple, PARTS)] + [(name, int, default) for name, default, _, _ in SETTINGS]
    + [("out_dir", str, ""), ("quick", bool, False)])


class Residual(nn.HybridBlock):
    """d2l's residual block, for either front end (``F.npx.relu`` or ``F.relu``)."""

    def __init__(self, channels, numpy, use_1x1conv=False, strides=1, **kwargs):
        super().__init__(**kwargs)
        self.numpy = numpy
        self.conv1 = nn.Conv2D(channels, 3, padding=1, strides=strides)
        self.conv2 = nn.Conv2D(channels, 3, padding=1)
        self.conv3 = nn.Conv2D(channels, 1, strides=strides) if use_1x1conv else None
        self.bn1, self.bn2 = nn.BatchNorm(), nn.BatchNorm()

    def hybrid_forward(self, F, X):
        relu = F.npx.relu if self.numpy else F.relu
        Y = self.bn2(self.conv2(relu(self.bn1(self.conv1(X)))))
        return relu(Y + (self.conv3(X) if self.conv3 else X))


def resnet(numpy, width=16, classes=10):
    """The ResNet of examples/numpy_interface.py, in either front end."""
    net = nn.HybridSequential()
    net.add(nn.Conv2D(width, 3, padding=1), nn.BatchNorm(), nn.Activation("relu"),
            Residual(width, numpy), Residual(width, numpy),
            Residual(2 * width, numpy, use_1x1conv=True, strides=2), Residual(2 * width, numpy),
            nn.GlobalAvgPool2D(), nn.Dense(classes))
    return net


def resnet18(numpy, classes=10):
    """d2l's ResNet-18 (a 7x7 stem, four stages of two residual blocks, 64 to 512 channels), in
    either front end: the network of the speed part."""
    net = nn.HybridSequential()
    net.add(nn.Conv2D(64, kernel_size=7, strides=2, padding=3), nn.BatchNorm(),
            nn.Activation("relu"), nn.MaxPool2D(pool_size=3, strides=2, padding=1))
    for stage, channels in enumerate((64, 128, 256, 512)):
        net.add(Residual(channels, numpy, use_1x1conv=stage > 0, strides=2 if stage else 1),
                Residual(channels, numpy))
    net.add(nn.GlobalAvgPool2D(), nn.Dense(classes))
    return net


def mlp(numpy):
    """d2l's MLP with its hidden activation through ``F.npx.relu`` (or ``F.relu``)."""
    class MLP(nn.HybridBlock):
        def __init__(self):
            super().__init__()
            self.hidden, self.output = nn.Dense(64), nn.Dense(10)

        def hybrid_forward(self, F, X):
            return self.output((F.npx.relu if numpy else F.relu)(self.hidden(X)))
    return MLP()


class LanguageModel(nn.HybridBlock):
    """d2l's RNN language model (one-hot characters, an LSTM, a dense output per step)."""

    def __init__(self, vocab, numpy, hidden=64, **kwargs):
        super().__init__(**kwargs)
        self.vocab, self.numpy = vocab, numpy
        self.rnn = rnn.LSTM(hidden)
        self.dense = nn.Dense(vocab, flatten=False)

    def hybrid_forward(self, F, inputs, state):
        tokens = inputs.T if self.numpy else F.transpose(inputs)
        X = (F.npx.one_hot if self.numpy else F.one_hot)(tokens, self.vocab)
        Y, state = self.rnn(X, state)
        return self.dense(Y), state


def _train_resnet(dtype, seed, config):
    """Test accuracy of the numpy-mode ResNet after ``config.epochs`` on the digits."""
    (train_x, train_y), (test_x, test_y) = digits_split()
    mx.random.seed(seed)
    net = resnet(True)
    net.initialize(mx.init.Xavier(magnitude=2))
    net(mx.np.zeros((1, 1, 8, 8)))
    net = mxfp16.cast_block(net, dtype)
    steps = config.epochs * (len(train_x) // config.batch_size)
    schedule = mx.lr_scheduler.CosineScheduler(max_update=steps, base_lr=0.05, final_lr=0)
    trainer = mxfp16.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.05, "momentum": 0.9,
                                                            "lr_scheduler": schedule}, dtype=dtype)
    loss_fn, rng = gluon.loss.SoftmaxCrossEntropyLoss(), np.random.RandomState(seed)
    for _ in range(config.epochs):
        order = rng.permutation(len(train_x))
        for start in range(0, len(order) - config.batch_size + 1, config.batch_size):
            batch = order[start:start + config.batch_size]
            with autograd.record():
                loss = loss_fn(net(mx.np.array(train_x[batch])), mx.np.array(train_y[batch]))
            trainer.backward(loss)
            trainer.step(len(batch))
    predicted = net(mx.np.array(test_x)).argmax(axis=1).asnumpy()
    return float((predicted == test_y).mean())


def _lm_batches(config, steps=32, batch=32):
    """``(train, val)`` lists of ``(inputs, targets)`` of the character corpus, as numpy arrays."""
    text = stdlib_text(config.lm_chars)
    vocab = sorted(set(text))
    ids = np.array([vocab.index(c) for c in text], dtype=np.float32)
    count = (len(ids) - 1) // (steps * batch)
    inputs = ids[:count * steps * batch].reshape(batch, -1)
    targets = ids[1:count * steps * batch + 1].reshape(batch, -1)
    pairs = [(inputs[:, i:i + steps], targets[:, i:i + steps])
             for i in range(0, inputs.shape[1], steps)]
    split = int(len(pairs) * 0.9)
    return pairs[:split], pairs[split:], len(vocab)


def _train_lm(dtype, seed, config):
    """Validation loss (nats per character) of the numpy-mode LSTM LM."""
    train, val, vocab = _lm_batches(config)
    mx.random.seed(seed)
    net = LanguageModel(vocab, True)
    net.initialize(mx.init.Xavier())
    net = mxfp16.cast_block(net, dtype)
    trainer = mxfp16.Trainer(net.collect_params(), "adam", {"learning_rate": 0.01}, dtype=dtype)
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    zeros = [mx.np.zeros((1, 32, 64)), mx.np.zeros((1, 32, 64))]
    for _ in range(config.lm_epochs):
        state = zeros
        for x, y in train:
            with autograd.record():
                out, state = net(mx.np.array(x), state)
                loss = loss_fn(out, mx.np.array(y).T)
            trainer.backward(loss)
            trainer.step(x.shape[0])
            state = [s.detach() for s in state]
    state, total = zeros, 0.0
    for x, y in val:
        out, state = net(mx.np.array(x), state)
        total += float(loss_fn(out, mx.np.array(y).T).mean())
    return total / len(val)


def fidelity(config):
    """``{task: {dtype: [value per seed]}}`` and the Markdown table."""
    results = {"resnet_digits_test_acc": {}, "lstm_lm_val_loss": {}}
    with semantics(True):
        for dtype in DTYPES:
            seeds = range(config.seeds)
            results["resnet_digits_test_acc"][dtype] = [_train_resnet(dtype, s, config)
                                                        for s in seeds]
            results["lstm_lm_val_loss"][dtype] = [_train_lm(dtype, s, config) for s in seeds]
    rows = []
    for task, by_dtype in results.items():
        low, high = min(by_dtype["float32"]), max(by_dtype["float32"])
        for dtype, values in by_dtype.items():
            mean, std = mean_std(values)
            where = "within" if low - 1e-9 <= mean <= high + 1e-9 else \
                ("above" if mean > high else "below")
            rows.append((task, dtype, ", ".join(f"{v:.4f}" for v in values),
                         f"{mean:.4f} ± {std:.4f}", where))
    return results, markdown_table(["task", "dtype", "per seed", "mean ± std",
                                    "mean vs float32's seed range"], rows)


def _step_time(net, trainer, x, y, steps):
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    start = time.perf_counter()
    for _ in range(steps):
        with autograd.record():
            loss = loss_fn(net(x), y)
        trainer.backward(loss)
        trainer.step(x.shape[0])
    loss.wait_to_read()
    return (time.perf_counter() - start) / steps


def speed(config):
    """Median step times of ResNet-18 (the small ResNet with --quick) on random 3x64x64 images
    per (front end, dtype), timed in interleaved rounds."""
    rng = np.random.RandomState(0)
    train_x = rng.uniform(size=(config.speed_batch_size, 3, 64, 64)).astype(np.float32)
    train_y = (np.arange(config.speed_batch_size) % 10).astype(np.float32)
    runs = {}
    for numpy in (True, False):
        for dtype in ("float32", "bfloat16"):
            with semantics(numpy):
                array = mx.np.array if numpy else mx.nd.array
                net = resnet(numpy) if config.quick else resnet18(numpy)
                net.initialize(mx.init.Xavier(magnitude=2))
                net = mxfp16.cast_block(net, dtype)
                net.hybridize(static_alloc=True, static_shape=True)
                trainer = mxfp16.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.01},
                                         dtype=dtype)
                x, y = array(train_x), array(train_y)
                _step_time(net, trainer, x, y, 2)  # warm-up: graphs built, memory planned
            runs[(numpy, dtype)] = (net, trainer, x, y, [])
    for _ in range(config.rounds):
        for (numpy, _), (net, trainer, x, y, times) in runs.items():
            with semantics(numpy):
                times.append(_step_time(net, trainer, x, y, config.steps))
    medians = {key: float(np.median(run[4])) for key, run in runs.items()}
    speedups = {numpy: medians[(numpy, "float32")] / medians[(numpy, "bfloat16")]
                for numpy in (True, False)}
    rows = [("numpy" if numpy else "legacy", f"{medians[(numpy, 'float32')] * 1e3:.1f}",
             f"{medians[(numpy, 'bfloat16')] * 1e3:.1f}", f"{speedups[numpy]:.2f}x")
            for numpy in (True, False)]
    ratio = speedups[True] / speedups[False]
    text = markdown_table(["front end", "float32 step (ms)", "bfloat16 step (ms)",
                           "bfloat16 speed-up"], rows)
    text += f"\nnumpy-mode speed-up / legacy-mode speed-up: {ratio:.3f}\n"
    return {"median_step_s": {f"{'numpy' if k[0] else 'legacy'}/{k[1]}": v
                              for k, v in medians.items()},
            "speedup": {"numpy": speedups[True], "legacy": speedups[False]},
            "numpy_over_legacy": ratio}, text


def _cast_nodes(build, numpy, dtype, call):
    """Cast nodes in the GPU graph of one training step of ``build(numpy)``."""
    with semantics(numpy):
        net = build(numpy)
        net.initialize()
        array = mx.np.array if numpy else mx.nd.array
        inputs = [array(item) if not isinstance(item, list) else [array(s) for s in item]
                  for item in call]
        net(*inputs)
        gpu = mxfp16.cast_block(net, dtype, emulate=False)
        block, _, _ = gpu._new_variant(inputs, training=True)
        graph = mxnet_internals.symbol_block_graph(block)[1]
        nodes = mxnet_internals.graph_json(graph)["nodes"]
    return sum(node["op"] in CAST_OPS for node in nodes)


#: Twin networks for the cast count, with a call of each.
TWINS = {
    "mlp": (mlp, [np.ones((4, 20), np.float32)]),
    "resnet": (resnet, [np.ones((4, 1, 8, 8), np.float32)]),
    "lstm_lm": (lambda numpy: LanguageModel(12, numpy),
                [np.ones((4, 6), np.float32), [np.zeros((1, 4, 64), np.float32)] * 2]),
}


def casts(config):
    counts = {f"{name}/{dtype}": {front: _cast_nodes(build, front == "numpy", dtype, call)
                                  for front in ("numpy", "legacy")}
              for name, (build, call) in TWINS.items() for dtype in ("float16", "bfloat16")}
    rows = [(key, c["legacy"], c["numpy"], "yes" if c["numpy"] <= c["legacy"] else "no")
            for key, c in counts.items()]
    return counts, markdown_table(["network/dtype", "legacy casts", "numpy casts",
                                   "numpy <= legacy"], rows)


def get_args_parser():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--parts", default=",".join(PARTS),
                        help=f"which parts (default: {','.join(PARTS)})")
    for name, default, _, text in SETTINGS:
        parser.add_argument("--" + name.replace("_", "-"), type=int, default=default,
                            help=f"{text} (default: {default})")
    add_output_arguments(parser, "the .md and .json", "one seed, one epoch, small corpus, "
                         "one round")
    return parser


def make_config(args):
    parts = parse_choices(args.parts, PARTS, "--parts", "part")
    values = {name: quick if args.quick else getattr(args, name)
              for name, _, quick, _ in SETTINGS}
    return Config(parts=parts, out_dir=args.out_dir, quick=args.quick, **values)


def main(argv=None):
    config, code = parse_config(get_args_parser(), make_config, argv)
    if config is None:
        return code
    record = {"benchmark": NAME, "command": command_line(NAME, sys.argv[1:] if argv is None
                                                        else argv),
              "machine": machine_info(), "config": dataclasses.asdict(config)}
    sections = []
    for part in config.parts:
        record[part], table = {"fidelity": fidelity, "speed": speed, "casts": casts}[part](config)
        sections.append(f"## {part}\n\n{table}")
    text = f"# NumPy interface: fidelity, speed, casts\n\n{header_lines(record)}" + \
        "\n".join(sections)
    publish(config.out_dir, NAME, text, record)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
