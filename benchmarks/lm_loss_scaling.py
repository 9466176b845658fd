"""The bigLSTM effect: an LSTM language model whose gradients underflow in float16 unless the loss is
scaled.

Micikevicius et al. 2018 ("Mixed Precision Training", ICLR) needed a loss scale of 128 for bigLSTM
(a word-level language model, vocabulary 800k) to match float32's perplexity: without one,
gradients below float16's smallest subnormal, 2**-24, become zero.  This is the language-model
counterpart of ``loss_scaling_matters.py``, on real text.

How the regime is produced (honestly: by hand).  A character-level LSTM language model (the corpus
and model of ``sequence_parity.py``: the docstrings of Python's standard library, 96 characters)
has a cross-entropy loss averaged over every token of the batch (batch x sequence length = 2048
tokens, PyTorch's ``reduction='mean'``) and multiplied by a ``factor`` 2**k.  The averaging is what
makes a language model's gradients small (bigLSTM's 800k-way softmax made each logit's share smaller
still); the factor stands for the rest of bigLSTM's regime that a small model on 2 CPU cores cannot
reach: the larger vocabulary, the longer sequences, the smaller initial weights.  Adam's epsilon and
the clipping threshold are multiplied by the same factor: Adam, clipping by global norm and the
averaging are then invariant to a power-of-two factor, so every float32 run takes exactly the same
steps whatever the factor (the float32 rows check it).  In float16 (CPU emulation: float16 weights,
activations, LSTM states and gradients, float32 master weights) a gradient below 2**-25 rounds to
zero.  Without scaling, as the factor shrinks, more weight gradients are exactly zero and perplexity
rises towards the untrained model's; dynamic loss scaling (``mxfp16.DynamicLossScaler``, initial
scale 2**16, as PyTorch's GradScaler) shifts the gradients back into float16's range.

Reported per factor and mode: validation perplexity (mean over seeds), the fraction of weight-gradient
entries that are exactly zero (sampled during training), skipped steps, final loss scale.  Outputs in
--out-dir: lm_loss_scaling.md and .json.

Usage: python benchmarks/lm_loss_scaling.py [--log2-factors 0,-8,-12,-16] [--seeds 3] [--quick]
"""
import argparse
import sys
from dataclasses import asdict, dataclass

import mxnet as mx
import numpy as np
from bench_common import (add_output_arguments, command_line, config_from, header_lines,
                          machine_info, markdown_table, mean_std, parse_argv, parse_exponents,
                          publish, require_positive)
from bench_sequence import CharLM, corpus, perplexity, sequences
from mxnet import autograd, gluon

import mxfp16

#: Mode name -> (training dtype, loss scale as mxfp16.Trainer takes it; 1 disables scaling).
MODES = {
    "float32": ("float32", 1.0),
    "float16-no-scaling": ("float16", 1.0),
    "float16-dynamic": ("float16", "dynamic"),
}

NAME = "lm_loss_scaling"

#: Adam's epsilon at factor 1 (MXNet's default); multiplied by the factor with the gradients.
ADAM_EPSILON = 1e-8


@dataclass(frozen=True)
class Config:
    log2_factors: tuple
    seeds: int
    epochs: int
    hidden: int
    num_chars: int
    seq_len: int
    batch_size: int
    lr: float
    clip: float
    probe_every: int
    out_dir: str


def build(mode, factor, seed, vocab_size, config):
    """The cast LM and its Adam trainer, epsilon scaled with the gradients by ``factor``."""
    dtype, loss_scale = MODES[mode]
    mx.random.seed(seed)
    net = CharLM(vocab_size, config.hidden)
    net.initialize(mx.init.Xavier())
    net.hybridize(static_alloc=True)
    net = mxfp16.cast_block(net, dtype)
    trainer = mxfp16.Trainer(net.collect_params(), "adam",
                             {"learning_rate": config.lr, "epsilon": ADAM_EPSILON * factor},
                             dtype=dtype, loss_scale=loss_scale)
    return net, trainer


def zero_fraction(net):
    """Fraction of the weight-gradient entries (biases excluded) that are exactly 0."""
    grads = [param.grad() for name, param in net.collect_params().items()
             if name.endswith("weight")]
    # counted in float32: a float16 sum stops at 65504
    zeros = sum(int((grad == 0).astype("float32").sum().asscalar()) for grad in grads)
    return zeros / sum(grad.size for grad in grads)


def train(net, trainer, factor, data, label, config, rng):
    """Adam on the token-mean loss times ``factor``; return the zero-gradient fractions."""
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    zeros, step = [], 0
    for _ in range(config.epochs):
        order = rng.permutation(len(data))
        for start in range(0, len(order) - config.batch_size + 1, config.batch_size):
            rows = order[start:start + config.batch_size]
            with autograd.record():
                loss = loss_fn(net(mx.nd.array(data[rows])), mx.nd.array(label[rows])).mean()
                scaled = loss * factor
            trainer.backward(scaled)
            if step % config.probe_every == 0:
                zeros.append(zero_fraction(net))
            trainer.clip_global_norm(config.clip * factor)
            trainer.step(1)  # the mean over the tokens is already in the loss
            step += 1
    return zeros


def run_one(mode, log2_factor, seed, config, text):
    factor = 2.0 ** log2_factor
    train_ids, val_ids, vocab_size = text
    net, trainer = build(mode, factor, seed, vocab_size, config)
    data, label = sequences(train_ids, config.seq_len)
    zeros = train(net, trainer, factor, data, label, config, np.random.RandomState(seed))
    return {"mode": mode, "log2_factor": log2_factor, "seed": seed,
            "val_perplexity": perplexity(net, *sequences(val_ids, config.seq_len),
                                         config.batch_size),
            "zero_grad_fraction": float(np.mean(zeros)), "skipped_steps": trainer.num_skipped,
            "steps": trainer.num_steps, "final_loss_scale": trainer.loss_scale}


def summarize(runs, config):
    """One row per (factor, mode), means over seeds."""
    rows = []
    for log2_factor in config.log2_factors:
        for mode in MODES:
            mine = [r for r in runs if r["mode"] == mode and r["log2_factor"] == log2_factor]
            ppl, ppl_std = mean_std(r["val_perplexity"] for r in mine)
            rows.append({"log2_factor": log2_factor, "mode": mode, "seeds": len(mine),
                         "val_perplexities": [r["val_perplexity"] for r in mine],
                         "val_perplexity_mean": ppl, "val_perplexity_std": ppl_std,
                         "zero_grad_fraction": mean_std(r["zero_grad_fraction"] for r in mine)[0],
                         "skipped_steps_mean": mean_std(r["skipped_steps"] for r in mine)[0],
                         "final_loss_scale": mine[0]["final_loss_scale"]})
    return rows


def markdown(summary, vocab_size):
    header = ["loss factor", "mode", "validation perplexity per seed",
              "validation perplexity (mean ± std)", "zero weight grads %", "skipped steps",
              "final loss scale (seed 0)"]
    rows = [[f"2^{row['log2_factor']}", row["mode"],
             ", ".join(f"{value:.4g}" for value in row["val_perplexities"]),
             f"{row['val_perplexity_mean']:.4g} ± {row['val_perplexity_std']:.2g}",
             f"{100 * row['zero_grad_fraction']:.1f}", f"{row['skipped_steps_mean']:g}",
             f"{row['final_loss_scale']:g}"] for row in summary]
    return (f"Vocabulary {vocab_size} characters: an untrained model's perplexity is about "
            f"{vocab_size}.\n\n" + markdown_table(header, rows))


def get_args_parser():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add = parser.add_argument
    add("--log2-factors", default="0,-8,-12,-16",
        help="comma-separated exponents k of the loss factors 2^k (default: 0,-8,-12,-16)")
    add("--seeds", type=int, default=3, help="seeds per factor and mode (default: 3)")
    add("--epochs", type=int, default=2, help="training epochs (default: 2)")
    add("--hidden", type=int, default=256, help="LSTM hidden size (default: 256)")
    add("--num-chars", type=int, default=200000,
        help="characters of the docstring corpus used (default: 200000)")
    add("--seq-len", type=int, default=64, help="characters per sequence (default: 64)")
    add("--batch-size", type=int, default=32, help="(default: 32)")
    add("--lr", type=float, default=0.005, help="Adam learning rate (default: 0.005)")
    add("--clip", type=float, default=1.0,
        help="gradient global-norm clip at factor 1; multiplied by the factor (default: 1)")
    add("--probe-every", type=int, default=10,
        help="steps between zero-gradient counts (default: 10)")
    return add_output_arguments(parser, "the .md and .json",
                                "factor 2^-16 only, 1 seed, 1 epoch on 6000 characters")


def parse_factors(text):
    return parse_exponents(text, "--log2-factors", -40, 0, "0,-12,-16")


def make_config(args):
    require_positive(args, ("seeds", "epochs", "hidden", "seq_len", "batch_size", "probe_every"))
    factors = parse_factors(args.log2_factors)
    if args.num_chars < 10 * args.seq_len * args.batch_size:
        raise ValueError(f"--num-chars {args.num_chars} is too short for --batch-size "
                         f"{args.batch_size} x --seq-len {args.seq_len}: pass at least "
                         f"{10 * args.seq_len * args.batch_size} characters")
    values = dict(vars(args), log2_factors=factors)
    if args.quick:
        values.update(log2_factors=(-16,), seeds=1, epochs=1, num_chars=6000, seq_len=16,
                      batch_size=16, hidden=32, probe_every=2)
    return config_from(Config, values)


def main(argv=None):
    config, argv, failed = parse_argv(get_args_parser(), make_config, argv)
    if failed:
        return failed
    text = corpus(config.num_chars)
    runs = [run_one(mode, k, seed, config, text)
            for k in config.log2_factors for seed in range(config.seeds) for mode in MODES]
    summary = summarize(runs, config)
    record = {"benchmark": NAME, "command": command_line(NAME, argv), "machine": machine_info(),
              "config": asdict(config), "vocab_size": text[2], "summary": summary, "runs": runs}
    publish(config.out_dir, NAME, header_lines(record) + markdown(summary, text[2]), record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
