"""GluonNLP's AWD-LSTM (``word_language_model.py``) in float16 and bfloat16 against float32.

The training loop is GluonNLP 0.10's ``scripts/language_model/word_language_model.py`` with the
guide's drop-in edits (``cast_block`` of the training and the evaluation model, ``mxfp16.Trainer``,
``trainer.backward(Ls)``, ``trainer.clip_global_norm(clip)``): ``nlp.model.train.AWDRNN`` with
weight drop (GluonNLP's ``WeightDrop`` calls ``nd.Dropout`` outside the hybridized graph) and
dropout on the embedding, between layers and on the output, the script's joint loss (cross-entropy
plus activation and temporal activation regularization), SGD at lr 30 scaled by each batch's random
``bptt``, validation perplexity after each epoch.  The corpus is word-level text already on the
machine (the docstrings of Python's standard library; rare words as ``<unk>``), so nothing
downloads.  float16 runs through the CPU emulation (float16 weights, activations and gradients,
float32 master weights) with dynamic loss scaling.

``--bypass-head-check`` runs the same training with mxfp16's loss-head check answering "no
head-ignoring op" without looking (issue 34): an ordinary loss must train bit for bit the same
either way, so the two rows must be equal.

Reported per mode: the best validation perplexity (the script's final figure) per seed, mean and
spread, and its excess over float32.  Outputs in --out-dir: awd_lstm_parity.md and .json.

Usage: python benchmarks/awd_lstm_parity.py [--seeds 3] [--epochs 2] [--quick]
"""
import argparse
import collections
import math
import os
import random
import re
import sys
import tempfile
from dataclasses import asdict, dataclass

import gluonnlp as nlp
import mxnet as mx
import numpy as np
from bench_common import (add_output_arguments, command_line, config_from, header_lines,
                          machine_info, markdown_table, mean_std, parse_argv, publish,
                          require_positive, stdlib_text)
from mxnet import autograd, gluon

import mxfp16

NAME = "awd_lstm_parity"

#: Mode -> training dtype; ``float16-bypass`` is float16 with the loss-head check bypassed.
MODES = {"float32": "float32", "float16": "float16", "bfloat16": "bfloat16",
         "float16-bypass": "float16"}

#: The script's defaults for what the issue's command did not set: dropout on the output, weight
#: drop, between layers, on the input, on the embedding; AR and TAR factors; weight decay, clip.
DROPOUTS = (0.4, 0.5, 0.2, 0.65, 0.1)
ALPHA, BETA = 2.0, 1.0
WD, CLIP = 1.2e-6, 0.25
#: The script's settings of each --optimizer (its default learning rate is 30, for SGD).
OPTIMIZER_PARAMS = {"sgd": {"momentum": 0, "wd": WD},
                    "adam": {"wd": WD, "beta1": 0, "beta2": 0.999, "epsilon": 1e-9}}
VAL_BATCH_SIZE = 10
#: Fraction of the corpus used for training; the rest is the validation text.
TRAIN_FRACTION = 0.9


#: The whole-number flags: (field, default, --quick's value or None to keep the flag's, help); the
#: parser, the checks and the quick mode read this one table.
SIZES = (
    ("seeds", 3, 1, "seeds per mode, 0 to N-1"),
    ("epochs", 2, 1, "training epochs"),
    ("emsize", 64, 16, "word embedding size"),
    ("nhid", 128, 16, "hidden units per layer"),
    ("nlayers", 2, None, "LSTM layers"),
    ("bptt", 35, 10, "sequence length"),
    ("batch_size", 20, 4, "sequences per batch"),
    ("min_count", 3, None, "words seen fewer times in training become <unk>"),
)


@dataclass(frozen=True)
class Config:
    modes: tuple
    seeds: int
    epochs: int
    emsize: int
    nhid: int
    nlayers: int
    bptt: int
    batch_size: int
    optimizer: str
    lr: float
    min_count: int
    num_chars: int
    out_dir: str


class JointActivationRegularizationLoss(gluon.loss.Loss):
    """word_language_model.py's loss: cross-entropy plus activation regularization of the dropped
    encoder states and temporal activation regularization of the states."""

    def __init__(self, loss, alpha, beta, **kwargs):
        super().__init__(None, None, **kwargs)
        self._loss = loss
        self._ar_loss = nlp.loss.ActivationRegularizationLoss(alpha)
        self._tar_loss = nlp.loss.TemporalActivationRegularizationLoss(beta)

    def hybrid_forward(self, F, out, target, states, dropped_states):
        loss = self._loss(out.reshape(-3, -1), target.reshape(-1,))
        return loss + self._ar_loss(*dropped_states) + self._tar_loss(*states)


def word_corpus(num_chars, min_count):
    """``(train ids, validation ids, vocabulary size)``: the docstrings as lower-case words and
    punctuation, words seen fewer than ``min_count`` times in the training part as ``<unk>``."""
    tokens = re.findall(r"[a-z0-9_]+|[^\sa-z0-9_]", stdlib_text(num_chars).lower())
    split = int(len(tokens) * TRAIN_FRACTION)
    counts = collections.Counter(tokens[:split])
    vocab = ["<unk>"] + sorted(word for word, count in counts.items() if count >= min_count)
    index = {word: i for i, word in enumerate(vocab)}
    ids = np.array([index.get(token, 0) for token in tokens], dtype=np.float32)
    return ids[:split], ids[split:], len(vocab)


def batchify(ids, batch_size):
    """GluonNLP's CorpusBatchify: a (time, batch) array of ``batch_size`` contiguous streams."""
    count = len(ids) // batch_size
    return mx.nd.array(ids[:count * batch_size].reshape(batch_size, count).T)


def build(dtype, vocab_size, config):
    """The cast training and evaluation models and their Trainer, as the ported script makes them."""
    args = ("lstm", vocab_size, config.emsize, config.nhid, config.nlayers, False, *DROPOUTS)
    model_eval = nlp.model.AWDRNN(*args)
    model = nlp.model.train.AWDRNN(*args)
    model.initialize(mx.init.Xavier())
    model.hybridize(static_alloc=True)
    model = mxfp16.cast_block(model, dtype)
    model_eval = mxfp16.cast_block(model_eval, dtype)
    trainer = mxfp16.Trainer(model.collect_params(), config.optimizer,
                             dict(OPTIMIZER_PARAMS[config.optimizer], learning_rate=config.lr),
                             update_on_kvstore=False, dtype=dtype)
    return model, model_eval, trainer


def detach(hidden):
    """The script's ``detach``: the states cut from the history, as nested as they came."""
    if isinstance(hidden, (list, tuple)):
        return [detach(h) for h in hidden]
    return hidden.detach()


def train_epoch(model, trainer, joint_loss, train_data, config):
    """One epoch of the script's loop; returns the mean training loss per token."""
    hidden = model.begin_state(config.batch_size, func=mx.nd.zeros)
    total, count, i = 0.0, 0, 0
    while i < len(train_data) - 1 - 1:
        bptt = config.bptt if mx.nd.random.uniform().asscalar() < 0.95 else config.bptt / 2
        seq_len = min(max(5, int(mx.nd.random.normal(bptt, 5).asscalar())),
                      len(train_data) - 1 - i)
        lr_batch_start = trainer.learning_rate
        trainer.set_learning_rate(lr_batch_start * seq_len / config.bptt)
        data, target = train_data[i:i + seq_len], train_data[i + 1:i + 1 + seq_len]
        hidden = detach(hidden)
        with autograd.record():
            output, hidden, encoder_hs, dropped_encoder_hs = model(data, hidden)
            loss = joint_loss(output, target, encoder_hs, dropped_encoder_hs) / data.size
        trainer.backward([loss])
        trainer.clip_global_norm(CLIP)
        trainer.step(1)
        total += float(loss.sum().asscalar())
        count += 1
        trainer.set_learning_rate(lr_batch_start)
        i += seq_len
    return total / count


def evaluate(model_eval, val_data, bptt):
    """Mean cross-entropy per token of the evaluation model over the validation text."""
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    hidden = model_eval.begin_state(batch_size=VAL_BATCH_SIZE, func=mx.nd.zeros)
    total, count, i = 0.0, 0, 0
    while i < len(val_data) - 1 - 1:
        seq_len = min(bptt, len(val_data) - 1 - i)
        output, hidden = model_eval(val_data[i:i + seq_len], hidden)
        hidden = detach(hidden)
        loss = loss_fn(output.reshape(-3, -1), val_data[i + 1:i + 1 + seq_len].reshape(-1,))
        total += float(loss.sum().asscalar())
        count += loss.size
        i += bptt
    return total / count


def bypass_head_check():
    """Make every loss-head check answer "no head-ignoring op" without looking."""
    from mxfp16.scaling import heads
    heads.HeadCheck.ops = lambda self, *args: []


def run_one(mode, seed, config, corpus, workdir):
    """Train one seed of one mode; return its per-epoch figures and the best validation
    perplexity (the script reloads the best epoch's weights for its final figure)."""
    random.seed(seed)
    np.random.seed(seed)
    mx.random.seed(seed)
    train_ids, val_ids, vocab_size = corpus
    model, model_eval, trainer = build(MODES[mode], vocab_size, config)
    joint_loss = JointActivationRegularizationLoss(gluon.loss.SoftmaxCrossEntropyLoss(), ALPHA,
                                                   BETA)
    train_data = batchify(train_ids, config.batch_size)
    val_data = batchify(val_ids, VAL_BATCH_SIZE)
    params_file = os.path.join(workdir, f"{mode}-{seed}.params")
    train_losses, val_ppls = [], []
    for _ in range(config.epochs):
        train_losses.append(train_epoch(model, trainer, joint_loss, train_data, config))
        model.save_parameters(params_file)
        model_eval.load_parameters(params_file)
        val_ppls.append(math.exp(evaluate(model_eval, val_data, config.bptt)))
    return {"mode": mode, "seed": seed, "train_losses": train_losses, "val_ppls": val_ppls,
            "best_val_ppl": min(val_ppls), "skipped_steps": trainer.num_skipped,
            "final_loss_scale": trainer.loss_scale}


def summarize(runs, config):
    base = {r["seed"]: r["best_val_ppl"] for r in runs if r["mode"] == "float32"}
    rows = []
    for mode in config.modes:
        mine = [r for r in runs if r["mode"] == mode]
        mean, std = mean_std(r["best_val_ppl"] for r in mine)
        excess = [100 * (r["best_val_ppl"] / base[r["seed"]] - 1) for r in mine if r["seed"] in base]
        rows.append({"mode": mode, "best_val_ppls": [r["best_val_ppl"] for r in mine],
                     "mean": mean, "std": std,
                     "excess_percent": excess, "excess_percent_mean": float(np.mean(excess))
                     if excess else None,
                     "skipped_steps": [r["skipped_steps"] for r in mine]})
    return rows


def markdown(summary, vocab_size, tokens):
    header = ["mode", "best validation perplexity per seed", "mean ± std",
              "excess over float32 per seed", "mean excess", "skipped steps"]
    rows = [[row["mode"], ", ".join(f"{v:.2f}" for v in row["best_val_ppls"]),
             f"{row['mean']:.2f} ± {row['std']:.2f}",
             ", ".join(f"{v:+.1f}%" for v in row["excess_percent"]),
             "" if row["excess_percent_mean"] is None else f"{row['excess_percent_mean']:+.1f}%",
             ", ".join(str(s) for s in row["skipped_steps"])] for row in summary]
    return (f"Vocabulary {vocab_size} words, {tokens} training tokens.\n\n"
            + markdown_table(header, rows))


def get_args_parser():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add = parser.add_argument
    add("--modes", default="float32,float16,bfloat16,float16-bypass",
        help=f"comma-separated modes among {', '.join(MODES)} "
             "(default: float32,float16,bfloat16,float16-bypass)")
    for name, default, _, text in SIZES:
        add("--" + name.replace("_", "-"), type=int, default=default,
            help=f"{text} (default: {default})")
    add("--optimizer", default="sgd", choices=sorted(OPTIMIZER_PARAMS),
        help="with the script's settings for each (default: sgd)")
    add("--lr", type=float, default=30.0, help="initial learning rate (default: 30)")
    add("--num-chars", type=int, default=0,
        help="characters of the docstring corpus, 0 for all of it (default: 0)")
    return add_output_arguments(parser, "the .md and .json",
                                "float32, float16 and float16-bypass, 1 seed, 1 epoch on 20000 "
                                "characters")


def make_config(args):
    require_positive(args, [name for name, _, _, _ in SIZES])
    if not args.lr > 0:
        raise ValueError(f"--lr {args.lr}: pass a learning rate > 0, for example 30 (sgd)")
    modes = tuple(item.strip() for item in args.modes.split(",") if item.strip())
    unknown = [mode for mode in modes if mode not in MODES]
    if unknown or not modes:
        raise ValueError(f"--modes {args.modes!r}: choose among {', '.join(MODES)}, "
                         "for example float32,float16")
    values = dict(vars(args), modes=modes, num_chars=args.num_chars or 10 ** 9)
    if args.quick:
        values.update({name: quick for name, _, quick, _ in SIZES if quick is not None},
                      modes=("float32", "float16", "float16-bypass"), num_chars=20000)
    return config_from(Config, values)


def main(argv=None):
    config, argv, failed = parse_argv(get_args_parser(), make_config, argv)
    if failed:
        return failed
    corpus = word_corpus(config.num_chars, config.min_count)
    runs = []
    with tempfile.TemporaryDirectory() as workdir:
        # the bypass last: it changes the check for the rest of the process
        for mode in sorted(config.modes, key=lambda mode: mode == "float16-bypass"):
            if mode == "float16-bypass":
                bypass_head_check()
            runs += [run_one(mode, seed, config, corpus, workdir) for seed in range(config.seeds)]
    summary = summarize(runs, config)
    record = {"benchmark": NAME, "command": command_line(NAME, argv), "machine": machine_info(),
              "config": asdict(config), "vocab_size": corpus[2],
              "train_tokens": len(corpus[0]), "summary": summary, "runs": runs}
    publish(config.out_dir, NAME, header_lines(record) + markdown(summary, corpus[2],
                                                                  len(corpus[0])), record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
