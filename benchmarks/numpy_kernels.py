"""Which NumPy-interface ops MXNet 1.9.1 runs in float16 and bfloat16 on this machine.

Each op is built in a graph on values cast to the dtype (the NumPy interface cannot make a bfloat16
array: ``astype('bfloat16')`` fails) and run; the table gives "ok" or MXNet's error.  The rows
``bfloat16_float32`` of mxfp16's rules (``NUMPY_NO_BFLOAT16_KERNEL``) come from this table.

    python benchmarks/numpy_kernels.py
"""
import argparse
import dataclasses
import json
import sys

import mxnet as mx
import numpy as np
from mxnet import gluon

from bench_common import (add_output_arguments, command_line, header_lines, machine_info,
                          markdown_table, parse_config, publish)
from mxfp16.numpy_interface import semantics

NAME = "numpy_kernels"
DTYPES = ("float16", "bfloat16")

#: op name -> the NumPy-interface call that records it, on two (2, 3, 4) values ``a``, ``b``.
CASES = {
    "_npx_relu": lambda F, a, b: F.npx.relu(a),
    "_npx_sigmoid": lambda F, a, b: F.npx.sigmoid(a),
    "_npi_add": lambda F, a, b: a + b,
    "_npi_multiply": lambda F, a, b: a * b,
    "_npi_true_divide": lambda F, a, b: a / (b + 3),
    "_npi_multiply_scalar": lambda F, a, b: a * 2,
    "_npi_true_divide_scalar": lambda F, a, b: a / 2,
    "_npi_rtrue_divide_scalar": lambda F, a, b: 2 / (a + 3),
    "_npi_power_scalar": lambda F, a, b: a ** 2,
    "_np_sum": lambda F, a, b: F.np.sum(a, axis=1),
    "_npi_mean": lambda F, a, b: F.np.mean(a, axis=1),
    "_npi_std": lambda F, a, b: F.np.std(a, axis=1),
    "_npi_var": lambda F, a, b: F.np.var(a, axis=1),
    "_np_max": lambda F, a, b: F.np.max(a, axis=1),
    "_npi_norm": lambda F, a, b: F.np.linalg.norm(a),
    "_npi_exp": lambda F, a, b: F.np.exp(a),
    "_npi_log": lambda F, a, b: F.np.log(a + 3),
    "_npi_tanh": lambda F, a, b: F.np.tanh(a),
    "_npi_sqrt": lambda F, a, b: F.np.sqrt(a + 3),
    "_npx_reshape": lambda F, a, b: F.npx.reshape(a, (-5, -2)),
    "_np_reshape": lambda F, a, b: a.reshape(6, 4),
    "_np_transpose": lambda F, a, b: a.transpose(1, 0, 2),
    "_npi_concatenate": lambda F, a, b: F.np.concatenate((a, b), axis=2),
    "_npi_stack": lambda F, a, b: F.np.stack((a, b)),
    "_np_copy": lambda F, a, b: F.np.copy(a),
    "_npi_full_like": lambda F, a, b: F.np.zeros_like(a),
    "_npi_where": lambda F, a, b: F.np.where(a > 0, a, b),
    "_npi_matmul": lambda F, a, b: F.np.matmul(a, b.transpose(0, 2, 1)),
    "_np_dot": lambda F, a, b: F.np.dot(a.reshape(6, 4), b.reshape(6, 4).T),
    "_npi_einsum": lambda F, a, b: F.np.einsum("bij,bkj->bik", a, b),
    "softmax (_npx_softmax)": lambda F, a, b: F.npx.softmax(a),
    "log_softmax (_npx_log_softmax)": lambda F, a, b: F.npx.log_softmax(a),
    "LayerNorm (_npx_layer_norm)": lambda F, a, b: F.npx.layer_norm(a, a[0, 0] * 0 + 1,
                                                                    a[0, 0] * 0),
}


@dataclasses.dataclass
class Config:
    ops: tuple = tuple(CASES)
    out_dir: str = ""


def cast_to(symbol, dtype, name):
    """``symbol`` cast to ``dtype`` by an ``amp_cast`` node (Python's ``amp_cast`` refuses
    ``'bfloat16'``: the attribute is set in the graph's JSON)."""
    graph = json.loads(mx.sym.amp_cast(symbol, dtype="float16", name=name).tojson(
        remove_amp_cast=False))
    graph["nodes"][-1]["attrs"]["dtype"] = dtype
    return mx.sym.load_json(json.dumps(graph))


def run(case, dtype):
    """"ok", or the last line of MXNet's error for the op in ``dtype``."""
    x, y = mx.sym.var("x"), mx.sym.var("y")
    a = cast_to(x, dtype, "a").as_np_ndarray()
    b = cast_to(y, dtype, "b").as_np_ndarray()
    out = mx.sym.amp_cast(case(mx.sym, a, b).as_nd_ndarray(), dtype="float32")
    block = gluon.SymbolBlock(out.as_np_ndarray(), [x.as_np_ndarray(), y.as_np_ndarray()])
    values = np.random.RandomState(0).uniform(-1, 1, size=(2, 2, 3, 4)).astype(np.float32)
    try:
        block(mx.np.array(values[0]), mx.np.array(values[1])).wait_to_read()
    except mx.base.MXNetError as error:
        lines = [line.strip() for line in str(error).splitlines() if line.strip()]
        return lines[-1][:120]
    return "ok"


def get_args_parser():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_output_arguments(parser, "the .md and .json", "three ops")
    return parser


def make_config(args):
    return Config(tuple(CASES)[:3] if args.quick else tuple(CASES), args.out_dir)


def main(argv=None):
    config, code = parse_config(get_args_parser(), make_config, argv)
    if config is None:
        return code
    with semantics(True):
        results = {op: {dtype: run(CASES[op], dtype) for dtype in DTYPES} for op in config.ops}
    record = {"benchmark": NAME, "command": command_line(NAME, sys.argv[1:] if argv is None
                                                        else argv),
              "machine": machine_info(), "config": dataclasses.asdict(config), "ops": results}
    rows = [(op, r["float16"], r["bfloat16"]) for op, r in results.items()]
    text = (f"# NumPy-interface ops in float16 and bfloat16 on this CPU\n\n{header_lines(record)}"
            + markdown_table(["op", "float16", "bfloat16"], rows))
    publish(config.out_dir, NAME, text, record)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
