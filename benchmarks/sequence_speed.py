"""Training-step speed of sequence models, float16 (CPU emulation) and bfloat16 against float32, and
the casts in the float16 GPU graph against MXNet AMP's.

Two models: an LSTM language model (Embedding 2000x512, two fused LSTM layers of 512, Dense over the
vocabulary of 2000; batch 32 x 35 time steps, TNC) and a Transformer encoder (Embedding 2000x256,
GluonNLP 0.10's ``BERTEncoder`` with 2 layers, 256 units, 4 heads, FFN 1024, valid lengths, Dense
over the vocabulary; batch 16 x 64 tokens).  A training step is forward, loss, backward (through
``mxfp16.Trainer``: dynamic loss scaling for float16) and an SGD update, hybridized with
``static_alloc``.

Fairness on a shared machine: the dtypes are timed in turns, ``--rounds`` times, each round timing
``--steps`` steps of every dtype after the warm-up; a round's ratio divides times measured within
seconds of each other, and the table reports the median over rounds.  The guard of issue 13:
emulated float16 at most 2.5x float32's step time.

Casts: the number of ``Cast``/``amp_cast``/``amp_multicast`` nodes that
``mxfp16.cast_symbol(sym, 'float16', emulate=False)`` (what a GPU runs) and
``mxnet.contrib.amp.convert_symbol(sym, target_dtype='float16', cast_optional_params=True)`` insert
in the same float32 forward graph (the graph's own casts subtracted); each runs once per forward pass
and once more in backward.  Outputs in --out-dir: sequence_speed.md and .json.

Usage: python benchmarks/sequence_speed.py [--models lstm_lm,transformer] [--rounds 5] [--quick]
"""
import argparse
import json
import statistics
import sys
import time
from dataclasses import asdict, dataclass

import mxnet as mx
from bench_common import (add_output_arguments, command_line, config_from, header_lines,
                          machine_info, markdown_table, parse_argv, parse_choices, parse_dtypes,
                          publish, require_positive)
from mxnet import autograd, gluon
from mxnet.contrib import amp
from mxnet.gluon import nn, rnn

import mxfp16

NAME = "sequence_speed"
DTYPES = ("float32", "float16", "bfloat16")
MODELS = ("lstm_lm", "transformer")

#: Graph ops that convert dtypes: MXNet's Cast and the two casts AMP inserts.
CAST_OPS = ("Cast", "amp_cast", "amp_multicast")

#: The timing entry of the LSTM layers alone (float32), next to the dtypes' whole steps.
RNN_LAYER = "float32 LSTM layers only"

#: The same layers unrolled as FullyConnected ops, in bfloat16 (the workaround measured).
UNROLLED_LAYER = "bfloat16 LSTM layers only, unrolled"

#: The whole LM step in bfloat16 with those unrolled layers in place of the fused RNN op.
UNROLLED_LM = "bfloat16, LSTM unrolled"

#: The guard of issue 13: emulated float16 at most this many times float32's step time.
FLOAT16_GUARD = 2.5


@dataclass(frozen=True)
class Config:
    models: tuple
    dtypes: tuple
    vocab_size: int
    lstm_hidden: int
    lstm_layers: int
    seq_len: int
    lstm_batch: int
    units: int
    heads: int
    layers: int
    tokens: int
    transformer_batch: int
    rounds: int
    steps: int
    warmup: int
    out_dir: str


class LSTMLM(gluon.HybridBlock):
    """Embedding -> fused multi-layer LSTM (TNC) -> Dense over the vocabulary; ``unrolled``
    (``(seq_len, batch_size)``) builds the LSTM from :class:`UnrolledLSTMLayer` instead."""

    def __init__(self, vocab_size, hidden, num_layers, unrolled=None, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.embedding = nn.Embedding(vocab_size, hidden)
            self.lstm = unrolled_lstm(hidden, num_layers, *unrolled) if unrolled else rnn.LSTM(
                hidden, num_layers)
            self.decoder = nn.Dense(vocab_size, flatten=False)

    def hybrid_forward(self, F, data):
        return self.decoder(self.lstm(self.embedding(data)))


class TransformerLM(gluon.HybridBlock):
    """Embedding -> GluonNLP's BERTEncoder (TNC, masked by valid lengths) -> Dense over the
    vocabulary at every token (a masked-language-model head without the masking)."""

    def __init__(self, vocab_size, units, heads, num_layers, max_length, **kwargs):
        super().__init__(**kwargs)
        import gluonnlp

        with self.name_scope():
            self.embedding = nn.Embedding(vocab_size, units)
            self.encoder = gluonnlp.model.BERTEncoder(
                num_layers=num_layers, units=units, hidden_size=4 * units, max_length=max_length,
                num_heads=heads, dropout=0.0)
            self.decoder = nn.Dense(vocab_size, flatten=False)

    def hybrid_forward(self, F, data, valid_length):
        encoded = self.encoder(F.transpose(self.embedding(data), axes=(1, 0, 2)),
                               valid_length=valid_length)
        encoded = encoded[0] if isinstance(encoded, (list, tuple)) else encoded
        return self.decoder(F.transpose(encoded, axes=(1, 0, 2)))


def make_model(model, config, unrolled=False):
    """``(float32 network, its example inputs, input names, batch size)``."""
    if model == "lstm_lm":
        net = LSTMLM(config.vocab_size, config.lstm_hidden, config.lstm_layers,
                     (config.seq_len, config.lstm_batch) if unrolled else None)
        data = mx.nd.random.randint(0, config.vocab_size, (config.seq_len, config.lstm_batch))
        return net, [data.astype("float32")], ("data",), config.lstm_batch
    net = TransformerLM(config.vocab_size, config.units, config.heads, config.layers,
                        config.tokens)
    shape = (config.transformer_batch, config.tokens)
    data = mx.nd.random.randint(0, config.vocab_size, shape).astype("float32")
    valid = mx.nd.array([config.tokens - i % 8 for i in range(config.transformer_batch)])
    return net, [data, valid], ("data", "valid_length"), config.transformer_batch


def build_step(model, dtype, config, unrolled=False):
    """A closure running one training step of ``model`` in ``dtype`` and waiting for it."""
    mx.random.seed(0)
    net, inputs, names, batch = make_model(model, config, unrolled)
    net.initialize(mx.init.Xavier())
    net.hybridize(static_alloc=True)
    net = mxfp16.cast_block(net, dtype, input_names=names)
    trainer = mxfp16.Trainer(net.collect_params(), "sgd", {"learning_rate": 1e-3}, dtype=dtype)
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()

    def step():
        with autograd.record():  # the tokens as labels: timing needs no real next token
            loss = loss_fn(net(*inputs), inputs[0])
        trainer.backward(loss)
        trainer.step(batch)
        mx.nd.waitall()
    return step


class UnrolledLSTMLayer(gluon.HybridBlock):
    """An LSTM layer of FullyConnected ops, which MXNet 1.9.1 runs in bfloat16: the input
    projection of every time step in one GEMM, then the recurrence unrolled (TNC, zero begin
    state).  A measurement of the workaround, not a layer mxfp16 offers."""

    def __init__(self, hidden, seq_len, batch_size, **kwargs):
        super().__init__(**kwargs)
        self._sizes = hidden, seq_len, batch_size
        with self.name_scope():
            for name in ("i2h", "h2h"):
                setattr(self, f"{name}_weight", self.params.get(f"{name}_weight",
                                                                shape=(4 * hidden, hidden)))
                setattr(self, f"{name}_bias", self.params.get(f"{name}_bias", shape=(4 * hidden,),
                                                              init="zeros"))

    def hybrid_forward(self, F, data, i2h_weight, h2h_weight, i2h_bias, h2h_bias):
        hidden, seq_len, batch_size = self._sizes
        projected = F.FullyConnected(data, i2h_weight, i2h_bias, num_hidden=4 * hidden,
                                     flatten=False)
        steps = F.split(projected, num_outputs=seq_len, axis=0, squeeze_axis=True)
        state = cell = F.zeros((batch_size, hidden))
        outputs = []
        for step in range(seq_len):
            gates = steps[step] + F.FullyConnected(state, h2h_weight, h2h_bias,
                                                   num_hidden=4 * hidden)
            in_gate, forget_gate, candidate, out_gate = F.split(gates, num_outputs=4, axis=1)
            cell = F.sigmoid(forget_gate) * cell + F.sigmoid(in_gate) * F.tanh(candidate)
            state = F.sigmoid(out_gate) * F.tanh(cell)
            outputs.append(state)
        return F.stack(*outputs, axis=0)


def unrolled_lstm(hidden, num_layers, seq_len, batch_size):
    """``num_layers`` stacked :class:`UnrolledLSTMLayer` s."""
    layers = nn.HybridSequential()
    for _ in range(num_layers):
        layers.add(UnrolledLSTMLayer(hidden, seq_len, batch_size))
    return layers


def build_rnn_layer_step(config, unrolled=False):
    """One forward and backward of the LM's LSTM layers alone, same shapes: the fused RNN op in
    float32 (the part of the step that MXNet 1.9.1 cannot run in bfloat16), or ``unrolled`` as
    FullyConnected ops in bfloat16."""
    mx.random.seed(0)
    if unrolled:
        layer = unrolled_lstm(config.lstm_hidden, config.lstm_layers, config.seq_len,
                              config.lstm_batch)
    else:
        layer = rnn.LSTM(config.lstm_hidden, config.lstm_layers, input_size=config.lstm_hidden)
    layer.initialize(mx.init.Xavier())
    layer.hybridize(static_alloc=True)
    layer = mxfp16.cast_block(layer, "bfloat16" if unrolled else "float32")
    data = mx.nd.random.uniform(shape=(config.seq_len, config.lstm_batch, config.lstm_hidden))
    data.attach_grad()

    def step():
        with autograd.record():
            out = layer(data)
        out.backward()
        mx.nd.waitall()
    return step


def bfloat16_rnn_probe(config):
    """The error MXNet gives when the fused RNN op is bound with bfloat16 data, parameters and
    states (None if it binds and runs)."""
    bfloat16 = amp.amp.bfloat16  # numpy has no bfloat16; AMP's structured dtype stands for it
    names = ("data", "parameters", "state", "state_cell")
    inputs = [mx.sym.amp_cast(mx.sym.var(name), dtype=bfloat16) for name in names]
    out = mx.sym.RNN(*inputs, state_size=config.lstm_hidden, num_layers=config.lstm_layers,
                     mode="lstm")
    shape = (config.seq_len, config.lstm_batch, config.lstm_hidden)
    try:
        executor = mx.sym.amp_cast(out, dtype="float32").simple_bind(
            mx.cpu(), data=shape, grad_req="null")
        executor.forward()
        mx.nd.waitall()
    except (mx.base.MXNetError, RuntimeError) as error:  # simple_bind wraps the MXNetError
        lines = [line.strip() for line in str(error).splitlines() if line.strip()]
        return " ".join(lines[-2:])
    return None


def time_steps(step, count):
    start = time.perf_counter()
    for _ in range(count):
        step()
    return (time.perf_counter() - start) / count


def time_interleaved(model, config):
    """Per dtype: the step time of every round; dtypes alternate within each round."""
    steps = {dtype: build_step(model, dtype, config) for dtype in config.dtypes}
    if model == "lstm_lm":
        steps[RNN_LAYER] = build_rnn_layer_step(config)
        steps[UNROLLED_LAYER] = build_rnn_layer_step(config, unrolled=True)
        steps[UNROLLED_LM] = build_step(model, "bfloat16", config, unrolled=True)
    for step in steps.values():
        time_steps(step, config.warmup)
    times = {name: [] for name in steps}
    for _ in range(config.rounds):
        for dtype, step in steps.items():
            times[dtype].append(time_steps(step, config.steps))
    return times


def count_casts(sym):
    # tojson() hides amp_cast nodes unless told not to.
    ops = [node["op"] for node in json.loads(sym.tojson(remove_amp_cast=False))["nodes"]]
    return sum(op in CAST_OPS for op in ops)


def cast_counts(model, config):
    """Cast nodes inserted in the float16 forward graph: mxfp16's GPU graph and MXNet AMP's."""
    net, _, names, _ = make_model(model, config)
    sym = net(*[mx.sym.var(name) for name in names])
    own = count_casts(sym)
    ours = mxfp16.cast_symbol(sym, "float16", emulate=False, data_names=names)
    theirs = amp.convert_symbol(sym, target_dtype="float16", data_names=list(names),
                                cast_optional_params=True)
    return {"mxfp16_gpu_graph": count_casts(ours) - own, "mxnet_amp": count_casts(theirs) - own}


def summarize(model, times, casts):
    rows = []
    for dtype, values in times.items():
        ratios = [value / base for value, base in zip(values, times["float32"])] \
            if "float32" in times else []
        rows.append({"model": model, "dtype": dtype, "step_times_s": values,
                     "median_step_s": statistics.median(values),
                     "median_ratio_to_float32": statistics.median(ratios) if ratios else None,
                     "ratios_to_float32": ratios, "casts": casts})
    return rows


def rnn_bound(results, probe_error):
    """The LSTM layers' share of the float32 step and what it bounds bfloat16's speed-up to
    (Amdahl) while the RNN op stays float32."""
    rows = {row["dtype"]: row for row in results if row["model"] == "lstm_lm"}
    if RNN_LAYER not in rows or "float32" not in rows:
        return None
    share = rows[RNN_LAYER]["median_ratio_to_float32"]
    bfloat16 = rows.get("bfloat16", {}).get("median_ratio_to_float32")
    unrolled = rows[UNROLLED_LAYER]["median_ratio_to_float32"]
    return {"rnn_share_of_float32_step": share,
            "unrolled_bfloat16_over_fused_float32": unrolled / share,
            "unrolled_lm_bfloat16_speedup": 1 / rows[UNROLLED_LM]["median_ratio_to_float32"],
            "bound_rest_twice_as_fast": 1 / (share + (1 - share) / 2),
            "bound_rest_free": 1 / share,
            "measured_bfloat16_speedup": 1 / bfloat16 if bfloat16 else None,
            "bfloat16_rnn_error": probe_error}


def bound_markdown(bound):
    if bound is None:
        return ""
    measured = bound["measured_bfloat16_speedup"]
    return (f"\nLSTM LM, bfloat16: the fused LSTM layers alone (float32, forward and backward) take "
            f"{100 * bound['rnn_share_of_float32_step']:.0f}% of the float32 step.  With the RNN op "
            f"in float32, bfloat16 can speed the step up at most "
            f"{bound['bound_rest_twice_as_fast']:.2f}x if everything else runs twice as fast, "
            f"{bound['bound_rest_free']:.2f}x if everything else took no time; measured: "
            + ("–" if measured is None else f"{measured:.2f}x") + ".  The RNN op with bfloat16 "
            f"inputs: {bound['bfloat16_rnn_error'] or 'binds and runs'}.  The same layers unrolled "
            f"as bfloat16 FullyConnected ops take "
            f"{bound['unrolled_bfloat16_over_fused_float32']:.2f}x the fused float32 op's time; the "
            f"LM built on them trains {bound['unrolled_lm_bfloat16_speedup']:.2f}x faster than in "
            "float32.\n")


def markdown(results):
    header = ["model", "dtype", "median step (s)", "step ÷ float32 step (median of rounds)",
              "per-round ratios", "within the 2.5x guard"]
    rows = []
    for row in results:
        ratio = row["median_ratio_to_float32"]
        guard = "–" if row["dtype"] != "float16" or ratio is None else (
            "yes" if ratio <= FLOAT16_GUARD else "no")
        rows.append([row["model"], row["dtype"], f"{row['median_step_s']:.3f}",
                     "–" if ratio is None else f"{ratio:.2f}",
                     ", ".join(f"{r:.2f}" for r in row["ratios_to_float32"]), guard])
    casts = {row["model"]: row["casts"] for row in results}
    cast_rows = [[model, c["mxfp16_gpu_graph"], c["mxnet_amp"]] for model, c in casts.items()]
    return (markdown_table(header, rows) + "\nCast nodes inserted in the float16 forward graph:\n\n"
            + markdown_table(["model", "mxfp16 GPU graph (emulate=False)",
                              "MXNet AMP convert_symbol"], cast_rows))


def get_args_parser():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add = parser.add_argument
    add("--models", default=",".join(MODELS),
        help=f"comma-separated subset of {', '.join(MODELS)} (default: both)")
    add("--dtypes", default=",".join(DTYPES),
        help=f"comma-separated subset of {', '.join(DTYPES)} (default: all)")
    add("--vocab-size", type=int, default=2000, help="vocabulary of both models (default: 2000)")
    add("--lstm-hidden", type=int, default=512, help="LSTM embedding and hidden size (default: 512)")
    add("--lstm-layers", type=int, default=2, help="LSTM layers (default: 2)")
    add("--seq-len", type=int, default=35, help="LSTM time steps (default: 35)")
    add("--lstm-batch", type=int, default=32, help="LSTM batch size (default: 32)")
    add("--units", type=int, default=256, help="Transformer units (default: 256)")
    add("--heads", type=int, default=4, help="Transformer attention heads (default: 4)")
    add("--layers", type=int, default=2, help="Transformer layers (default: 2)")
    add("--tokens", type=int, default=64, help="Transformer sequence length (default: 64)")
    add("--transformer-batch", type=int, default=16, help="Transformer batch size (default: 16)")
    add("--rounds", type=int, default=5, help="rounds of interleaved timing (default: 5)")
    add("--steps", type=int, default=5, help="timed steps per dtype and round (default: 5)")
    add("--warmup", type=int, default=3, help="untimed steps per dtype (default: 3)")
    return add_output_arguments(parser, "the .md and .json",
                                "tiny models (vocabulary 64, 16 units), 2 rounds of 1 step")


def make_config(args):
    models = parse_choices(args.models, MODELS, "--models", "model")
    dtypes = parse_dtypes(args.dtypes, DTYPES)
    require_positive(args, ("vocab_size", "lstm_hidden", "lstm_layers", "seq_len", "lstm_batch",
                            "units", "heads", "layers", "tokens", "transformer_batch", "rounds",
                            "steps"))
    if args.units % args.heads:
        raise ValueError(f"--units {args.units} is not a multiple of --heads {args.heads}: pick "
                         "units divisible by heads, for example 256 and 4")
    if args.tokens < 8:
        raise ValueError(f"--tokens {args.tokens}: pass at least 8 (valid lengths go down by 7)")
    values = dict(vars(args), models=models, dtypes=dtypes)
    if args.quick:
        values.update(vocab_size=64, lstm_hidden=16, seq_len=5, lstm_batch=4, units=16, heads=2,
                      tokens=8, transformer_batch=4, rounds=2, steps=1, warmup=1)
    return config_from(Config, values)


def main(argv=None):
    config, argv, failed = parse_argv(get_args_parser(), make_config, argv)
    if failed:
        return failed
    results = []
    for model in config.models:
        results += summarize(model, time_interleaved(model, config), cast_counts(model, config))
    bound = rnn_bound(results, bfloat16_rnn_probe(config))
    record = {"benchmark": NAME, "command": command_line(NAME, argv), "machine": machine_info(),
              "config": asdict(config), "results": results, "bfloat16_rnn": bound}
    publish(config.out_dir, NAME, header_lines(record) + markdown(results) + bound_markdown(bound),
            record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
