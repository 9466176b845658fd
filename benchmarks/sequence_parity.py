"""Accuracy parity of recurrent networks on real sequential data: float32 vs float16 vs bfloat16.

The sequence counterpart of ``accuracy_parity.py`` (itself the small-scale counterpart of
Micikevicius et al. 2018, "Mixed Precision Training", Table 1).  Two tasks, both offline:

* ``digits``: scikit-learn's handwritten digits read row by row (8 time steps of 8 pixels) by an LSTM
  whose last hidden state goes to a Dense classifier; the fixed stratified split of
  ``accuracy_parity.py`` (1347 training, 450 test images).  Reported: test accuracy.
* ``charlm``: a character-level LSTM language model on the docstrings of Python's standard library
  (the corpus of ``examples/lstm_language_model.py``: a fixed module list, fixed order), the first
  --num-chars characters, the first 90% for training and the last 10% for validation.  Reported:
  validation perplexity per character.

Modes: float32; float16 (CPU emulation with GPU numerics: float16 weights, inputs, outputs and states
of the LSTM, float32 master weights, dynamic loss scaling); bfloat16 (MXNet's AMP bfloat16 pass:
FullyConnected in bfloat16, the RNN op float32, as MXNet 1.9.1 has no bfloat16 RNN kernel).  Every
mode starts from the same weights for a given seed and sees the same batches; Adam with gradient
clipping by global norm (of the unscaled gradients).  The verdict per task and mode: whether its
mean lies within float32's seed-to-seed range (min..max over seeds), or beyond it on the better or
the worse side, and its distance from float32's mean in float32 standard deviations.

Outputs in --out-dir: sequence_parity.md (one row per task and mode), sequence_parity.json (every
run).  Usage: python benchmarks/sequence_parity.py [--seeds 3] [--tasks digits,charlm] [--quick]
"""
import argparse
import sys
from dataclasses import asdict, dataclass

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon
from mxnet.gluon import nn, rnn

import mxfp16
from bench_common import (add_output_arguments, command_line, config_from, digits_split,
                          header_lines, machine_info, markdown_table, mean_std, parse_argv,
                          parse_choices, parse_dtypes, publish, require_positive)
from bench_sequence import CharLM, corpus, perplexity, sequences

DTYPES = ("float32", "float16", "bfloat16")
TASKS = ("digits", "charlm")
NAME = "sequence_parity"

@dataclass(frozen=True)
class Config:
    seeds: int
    tasks: tuple
    dtypes: tuple
    digits_epochs: int
    digits_hidden: int
    lm_epochs: int
    lm_hidden: int
    num_chars: int
    seq_len: int
    batch_size: int
    lr: float
    clip: float
    out_dir: str


class DigitsLSTM(gluon.HybridBlock):
    """LSTM over the 8 rows of a digit (NTC), the last time step's output to 10 classes."""

    def __init__(self, hidden, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.lstm = rnn.LSTM(hidden, layout="NTC")
            self.output = nn.Dense(10)

    def hybrid_forward(self, F, rows):
        return self.output(F.squeeze(F.slice_axis(self.lstm(rows), axis=1, begin=-1, end=None),
                                     axis=1))


def prepare(net, dtype, seed, lr):
    """Initialize with ``seed``, cast to ``dtype``, and the Adam trainer (loss scaler inside)."""
    mx.random.seed(seed)
    net.initialize(mx.init.Xavier())
    net.hybridize(static_alloc=True)
    net = mxfp16.cast_block(net, dtype)
    trainer = mxfp16.Trainer(net.collect_params(), "adam", {"learning_rate": lr}, dtype=dtype)
    return net, trainer


def train_step(net, trainer, data, label, clip):
    """One step on a batch: scaled backward, clipping of the unscaled gradients, update."""
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    with autograd.record():
        loss = loss_fn(net(data), label)
    trainer.backward(loss)
    trainer.clip_global_norm(clip)
    trainer.step(data.shape[0])


def run_digits(dtype, seed, config, train_data, test_data):
    """Train the row-by-row LSTM; return its test accuracy."""
    net, trainer = prepare(DigitsLSTM(config.digits_hidden), dtype, seed, config.lr)
    images = train_data[0].reshape(-1, 8, 8)
    rng = np.random.RandomState(seed)
    for _ in range(config.digits_epochs):
        order = rng.permutation(len(images))
        for start in range(0, len(order) - config.batch_size + 1, config.batch_size):
            rows = order[start:start + config.batch_size]
            train_step(net, trainer, mx.nd.array(images[rows]), mx.nd.array(train_data[1][rows]),
                       config.clip)
    predictions = net(mx.nd.array(test_data[0].reshape(-1, 8, 8))).argmax(axis=1).asnumpy()
    return {"test_accuracy": float((predictions == test_data[1]).mean()),
            "skipped_steps": trainer.num_skipped, "final_loss_scale": trainer.loss_scale}


def run_charlm(dtype, seed, config, text):
    """Train the character LM; return its validation perplexity."""
    train_ids, val_ids, vocab_size = text
    net, trainer = prepare(CharLM(vocab_size, config.lm_hidden), dtype, seed, config.lr)
    data, label = sequences(train_ids, config.seq_len)
    rng = np.random.RandomState(seed)
    for _ in range(config.lm_epochs):
        order = rng.permutation(len(data))
        for start in range(0, len(order) - config.batch_size + 1, config.batch_size):
            rows = order[start:start + config.batch_size]
            train_step(net, trainer, mx.nd.array(data[rows]), mx.nd.array(label[rows]),
                       config.clip)
    return {"val_perplexity": perplexity(net, *sequences(val_ids, config.seq_len),
                                         config.batch_size),
            "skipped_steps": trainer.num_skipped, "final_loss_scale": trainer.loss_scale}


#: Task -> (the metric a run returns, its Markdown label, its format, the factor it is shown with:
#: 100 for a percentage, where higher is better; 1 for a perplexity, where lower is).
METRICS = {"digits": ("test_accuracy", "test accuracy %", "{:.2f}", 100.0),
           "charlm": ("val_perplexity", "validation perplexity", "{:.3f}", 1.0)}


def versus_range(mean, reference, higher_is_better):
    """``'within'`` float32's seed range (min..max), else ``'better'`` or ``'worse'``."""
    if min(reference) <= mean <= max(reference):
        return "within"
    return "better" if (mean > max(reference)) == higher_is_better else "worse"


def summarize(runs, config):
    """One row per task and dtype: mean, std, range over seeds, and the parity verdict."""
    rows = []
    for task in config.tasks:
        metric = METRICS[task][0]
        reference = [r[metric] for r in runs if r["task"] == task and r["dtype"] == "float32"]
        for dtype in config.dtypes:
            values = [r[metric] for r in runs if r["task"] == task and r["dtype"] == dtype]
            mean, std = mean_std(values)
            row = {"task": task, "dtype": dtype, "metric": metric, "values": values, "mean": mean,
                   "std": std, "min": min(values), "max": max(values),
                   "skipped_steps_mean": mean_std(r["skipped_steps"] for r in runs
                                                  if r["task"] == task and r["dtype"] == dtype)[0]}
            if reference:
                ref_mean, ref_std = mean_std(reference)
                row["vs_float32_range"] = versus_range(mean, reference, METRICS[task][3] > 1)
                row["float32_stds_away"] = (mean - ref_mean) / ref_std if ref_std else None
            rows.append(row)
    return rows


def markdown(summary):
    header = ["task", "dtype", "metric", "per seed", "mean ± std", "min–max",
              "mean vs float32's seed range", "(mean − float32 mean) / float32 std",
              "skipped steps (mean)"]
    rows = []
    for row in summary:
        _, label, fmt, factor = METRICS[row["task"]]

        def cell(value, fmt=fmt, factor=factor):
            return fmt.format(factor * value)
        away = row.get("float32_stds_away")
        rows.append([row["task"], row["dtype"], label, ", ".join(cell(v) for v in row["values"]),
                     f"{cell(row['mean'])} ± {cell(row['std'])}",
                     f"{cell(row['min'])}–{cell(row['max'])}",
                     row.get("vs_float32_range", "–"),
                     "–" if away is None else f"{away:+.2f}", f"{row['skipped_steps_mean']:g}"])
    return markdown_table(header, rows)


def get_args_parser():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add = parser.add_argument
    add("--seeds", type=int, default=3, help="seeds per task and dtype (default: 3)")
    add("--tasks", default=",".join(TASKS), help=f"comma-separated subset of {', '.join(TASKS)} "
                                                 "(default: both)")
    add("--dtypes", default=",".join(DTYPES), help="comma-separated subset of "
                                                   f"{', '.join(DTYPES)} (default: all)")
    add("--digits-epochs", type=int, default=20, help="epochs of the digits LSTM (default: 20)")
    add("--digits-hidden", type=int, default=64, help="digits LSTM hidden size (default: 64)")
    add("--lm-epochs", type=int, default=4, help="epochs of the character LM (default: 4)")
    add("--lm-hidden", type=int, default=256, help="character LM hidden size (default: 256)")
    add("--num-chars", type=int, default=200000,
        help="characters of the docstring corpus used (default: 200000)")
    add("--seq-len", type=int, default=64, help="characters per LM sequence (default: 64)")
    add("--batch-size", type=int, default=32, help="(default: 32)")
    add("--lr", type=float, default=0.005, help="Adam learning rate (default: 0.005)")
    add("--clip", type=float, default=1.0, help="gradient global-norm clip (default: 1)")
    return add_output_arguments(parser, "the .md and .json",
                                "1 seed, 1 digits epoch, 1 LM epoch on 4000 characters")


def make_config(args):
    tasks = parse_choices(args.tasks, TASKS, "--tasks", "task")
    dtypes = parse_dtypes(args.dtypes, DTYPES)
    require_positive(args, ("seeds", "digits_epochs", "digits_hidden", "lm_epochs", "lm_hidden",
                            "seq_len", "batch_size"))
    if args.num_chars < 10 * args.seq_len * args.batch_size:
        raise ValueError(f"--num-chars {args.num_chars} is too short for --batch-size "
                         f"{args.batch_size} x --seq-len {args.seq_len}: pass at least "
                         f"{10 * args.seq_len * args.batch_size} characters")
    values = dict(vars(args), tasks=tasks, dtypes=dtypes)
    if args.quick:
        values.update(seeds=1, digits_epochs=1, lm_epochs=1, num_chars=4000, seq_len=16,
                      batch_size=16, lm_hidden=32, digits_hidden=16)
    return config_from(Config, values)


def main(argv=None):
    config, argv, failed = parse_argv(get_args_parser(), make_config, argv)
    if failed:
        return failed
    runs = []
    if "digits" in config.tasks:
        train_data, test_data = digits_split()
        runs += [dict(task="digits", dtype=dtype, seed=seed,
                      **run_digits(dtype, seed, config, train_data, test_data))
                 for seed in range(config.seeds) for dtype in config.dtypes]
    if "charlm" in config.tasks:
        text = corpus(config.num_chars)
        runs += [dict(task="charlm", dtype=dtype, seed=seed, **run_charlm(dtype, seed, config, text))
                 for seed in range(config.seeds) for dtype in config.dtypes]
    summary = summarize(runs, config)
    record = {"benchmark": NAME, "command": command_line(NAME, argv), "machine": machine_info(),
              "config": asdict(config), "summary": summary, "runs": runs}
    publish(config.out_dir, NAME, header_lines(record) + markdown(summary), record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
