"""The fused float16-rounding operator: bit-exact against numpy and the Cast pair it replaces,
forward and backward, imperatively, in symbol graphs and in hybridized Gluon blocks; and its
build-on-first-use loader (idempotent, safe under concurrent first builds, falls back without a
compiler)."""
import functools
import json
import os
import subprocess
import sys
import textwrap

import mxnet as mx
import numpy as np
import pytest

from mxfp16.casting import fastround

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: Above the library's parallel threshold (2**16 elements), so the OpenMP path runs.
LARGE = 3 * (1 << 16) + 5


@pytest.fixture(scope="module")
def round_nd():
    """The imperative operator, ``round_nd(x) -> y``; skips when the library cannot be loaded."""
    if not fastround.load():
        pytest.skip("mxfp16.casting.fastround.load() returned False (no C++ compiler or no mxnet headers; "
                    "see the warning it logged)")
    return getattr(mx.nd._internal, fastround.ROUND_OP)


def round_sym(data, name):
    return getattr(mx.sym._internal, fastround.ROUND_OP)(data, name=name)


def cast_pair_sym(data, name):
    return mx.sym.Cast(mx.sym.Cast(data, dtype="float16"), dtype="float32", name=name)


def numpy_round(x):
    return x.astype(np.float16).astype(np.float32)


def assert_bits_equal(actual, expected):
    """Equal as uint32 bit patterns: -0 differs from 0 and NaN payloads count."""
    actual, expected = np.ascontiguousarray(actual), np.ascontiguousarray(expected)
    assert actual.dtype == expected.dtype == np.float32
    assert actual.shape == expected.shape
    differ = actual.view(np.uint32) != expected.view(np.uint32)
    assert not differ.any(), (f"{differ.sum()} of {differ.size} differ, first inputs' results "
                              f"{actual[differ][:5]} != {expected[differ][:5]}")


def from_bits(bits):
    return np.asarray(bits, dtype=np.uint32).view(np.float32)


def edge_values():
    """The named edge cases with both signs, an odd count so that a vector tail remains."""
    magnitudes = [
        0.0, 1.0, 0.1, 65504.0, 65519.99, 65520.0, 65536.0, 1e6, 3.4e38,
        2.0 ** -14, 2.0 ** -14 * (1 - 2.0 ** -11),  # smallest normal, and just below it
        2.0 ** -24, 2.0 ** -25, 2.0 ** -25 * (1 + 2.0 ** -20), 2.0 ** -25 * (1 - 2.0 ** -20),
        3 * 2.0 ** -25, 2.0 ** -26, 1e-30, 1 + 2.0 ** -11, 1 + 3 * 2.0 ** -11, np.inf,
    ]
    nan_bits = [0x7FC00000, 0x7F800001, 0x7FA00000, 0x7FC00001, 0x7FBFFFFF,  # quiet/signalling
                0x00000001, 0x007FFFFF]  # float32 subnormals
    values = np.concatenate([np.array(magnitudes, dtype=np.float32), from_bits(nan_bits)])
    values = np.concatenate([values, -values, [np.float32(np.nan)]])
    assert values.size % 8 != 0
    return values


def random_values(seed=0):
    """4 Mi values over the whole float16 range and beyond, plus 1 Mi arbitrary bit patterns."""
    rng = np.random.RandomState(seed)
    n = 1 << 22
    exponent = rng.randint(127 - 27, 127 + 17, n).astype(np.uint32)  # 2**-27 <= |x| < 2**17
    mantissa = rng.randint(0, 1 << 23, n).astype(np.uint32)
    sign = rng.randint(0, 2, n).astype(np.uint32)
    spread = from_bits((sign << 31) | (exponent << 23) | mantissa)
    anything = from_bits(rng.randint(0, 1 << 32, 1 << 20, dtype=np.uint64))
    return np.concatenate([spread, anything])


def tie_values():
    """Every float16 value, every midpoint between neighbours and the floats either side of it."""
    halves = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16)
    finite = np.sort(halves[np.isfinite(halves)].astype(np.float32))
    finite = np.unique(finite)  # -0 and 0 collapse; both signs of zero are in edge_values()
    mid = ((finite[:-1].astype(np.float64) + finite[1:]) / 2).astype(np.float32)
    return np.concatenate([halves.astype(np.float32), mid, np.nextafter(mid, np.float32(np.inf)),
                           np.nextafter(mid, np.float32(-np.inf))])


def test_load_is_idempotent(round_nd):
    assert fastround.load() is True
    assert fastround.load() is True
    assert fastround.available() is True
    assert hasattr(mx.sym._internal, fastround.ROUND_OP)


def test_edge_values_match_numpy_exactly(round_nd):
    x = edge_values()
    assert_bits_equal(round_nd(mx.nd.array(x)).asnumpy(), numpy_round(x))
    named = round_nd(mx.nd.array([65519.99, 65520.0, 2.0 ** -25, 2.0 ** -25 * 1.0001])).asnumpy()
    assert named.tolist() == [65504.0, np.inf, 0.0, 2.0 ** -24]


@pytest.mark.parametrize("size", [1, 7, 8, 9, 4099, LARGE])
def test_sizes_cover_vector_tail_and_parallel_paths(round_nd, size):
    x = np.resize(np.concatenate([tie_values(), edge_values()]), size)
    assert_bits_equal(round_nd(mx.nd.array(x)).asnumpy(), numpy_round(x))


def test_ties_match_numpy_exactly(round_nd):
    x = tie_values()
    assert_bits_equal(round_nd(mx.nd.array(x)).asnumpy(), numpy_round(x))


@pytest.mark.slow
def test_random_values_match_numpy_exactly(round_nd):
    x = random_values()
    assert_bits_equal(round_nd(mx.nd.array(x)).asnumpy(), numpy_round(x))


def test_matches_the_cast_pair_it_replaces(round_nd):
    x = mx.nd.array(np.concatenate([random_values(seed=1)[: 1 << 20], edge_values()]))
    cast_pair = mx.nd.Cast(mx.nd.Cast(x, dtype="float16"), dtype="float32")
    assert_bits_equal(round_nd(x).asnumpy(), cast_pair.asnumpy())


def test_any_shape_is_kept(round_nd):
    x = mx.nd.array(np.linspace(-70000, 70000, 2 * 3 * 4 * 5).reshape(2, 3, 4, 5))
    y = round_nd(x)
    assert y.shape == (2, 3, 4, 5) and y.dtype == np.float32
    assert_bits_equal(y.asnumpy(), numpy_round(x.asnumpy()))


def test_backward_rounds_the_gradient(round_nd):
    x = mx.nd.array(np.linspace(-3, 3, LARGE))
    dy = np.concatenate([random_values(seed=2)[: LARGE - 50], edge_values()[:50]])
    x.attach_grad()
    with mx.autograd.record():
        y = round_nd(x)
    y.backward(mx.nd.array(dy))
    assert_bits_equal(x.grad.asnumpy(), numpy_round(dy))


@pytest.mark.parametrize("dtype", ["float16", "float64", "int32", "uint8"])
def test_rejects_other_dtypes(round_nd, dtype):
    with pytest.raises(mx.base.MXNetError, match="accepts float32 input only, got " + dtype):
        round_nd(mx.nd.ones((3,), dtype=dtype)).wait_to_read()


def test_rejects_parameters(round_nd):
    with pytest.raises(mx.base.MXNetError, match="takes no parameters, got dtype=float16"):
        round_nd(mx.nd.ones((3,)), dtype="float16").wait_to_read()


def gemm_graph(round_fn):
    """data -> round -> Convolution -> round -> FullyConnected -> round: rounding at GEMM edges."""
    data = mx.sym.var("data", dtype="float32")
    conv = mx.sym.Convolution(round_fn(data, "r0"), kernel=(3, 3), num_filter=8, name="conv")
    fc = mx.sym.FullyConnected(round_fn(conv, "r1"), num_hidden=5, name="fc")
    return round_fn(fc, "r2")


def graph_arrays(seed=3):
    rng = np.random.RandomState(seed)
    shapes = {"data": (2, 3, 8, 8), "conv_weight": (8, 3, 3, 3), "conv_bias": (8,),
              "fc_weight": (5, 288), "fc_bias": (5,)}
    args = {name: mx.nd.array(rng.normal(0, 1, shape)) for name, shape in shapes.items()}
    head_grad = mx.nd.array(rng.normal(0, 1e-3, (2, 5)))  # small: rounding visibly matters
    return args, head_grad


def run_graph(sym, args, head_grad):
    """Forward and backward through a bound executor: (output, {arg name: gradient})."""
    grads = {name: mx.nd.zeros_like(value) for name, value in args.items()}
    executor = sym.bind(mx.cpu(), args=dict(args), args_grad=grads)
    out = executor.forward(is_train=True)[0].asnumpy()
    executor.backward([head_grad])
    return out, {name: grad.asnumpy() for name, grad in grads.items()}


def test_symbol_graph_equals_cast_pair_graph(round_nd):
    args, head_grad = graph_arrays()
    out, grads = run_graph(gemm_graph(round_sym), args, head_grad)
    want_out, want_grads = run_graph(gemm_graph(cast_pair_sym), args, head_grad)
    assert_bits_equal(out, want_out)
    for name, grad in grads.items():
        assert_bits_equal(grad, want_grads[name])
    unrounded_out, unrounded_grads = run_graph(gemm_graph(lambda data, name: data), args, head_grad)
    assert not np.array_equal(out, unrounded_out)  # the comparison above can tell rounding apart
    assert not np.array_equal(grads["data"], unrounded_grads["data"])


def test_graph_json_node_binds_and_runs(round_nd):
    graph = {"nodes": [{"op": "null", "name": "data", "inputs": []},
                       {"op": fastround.ROUND_OP, "name": "round", "inputs": [[0, 0, 0]]}],
             "arg_nodes": [0], "node_row_ptr": [0, 1, 2], "heads": [[1, 0, 0]],
             "attrs": {"mxnet_version": ["int", 10901]}}
    sym = mx.sym.load_json(json.dumps(graph))
    assert sym.infer_type(data="float32")[1] == [np.float32]
    assert sym.infer_shape(data=(4, 3))[1] == [(4, 3)]
    x, dy = edge_values()[:12].reshape(4, 3), random_values(seed=4)[:12].reshape(4, 3)
    out, grads = run_graph(sym, {"data": mx.nd.array(x)}, mx.nd.array(dy))
    assert_bits_equal(out, numpy_round(x))
    assert_bits_equal(grads["data"], numpy_round(dy))
    assert json.loads(sym.tojson())["nodes"][1]["op"] == fastround.ROUND_OP


def symbol_block(round_fn, args):
    data = mx.sym.var("data", dtype="float32")
    block = mx.gluon.SymbolBlock(gemm_graph(round_fn), data)
    block.initialize()
    for name, param in block.collect_params().items():
        param.set_data(args[name])
    block.hybridize(static_alloc=True, static_shape=True)
    return block


def run_block(block, x, head_grad):
    x = x.copy()
    x.attach_grad()
    with mx.autograd.record():
        out = block(x)
    out.backward(head_grad)
    grads = {name: p.grad().asnumpy() for name, p in block.collect_params().items()}
    return out.asnumpy(), x.grad.asnumpy(), grads


def test_hybridized_symbol_block_equals_cast_pair_block(round_nd):
    args, head_grad = graph_arrays(seed=5)
    fused = symbol_block(round_sym, args)
    reference = symbol_block(cast_pair_sym, args)
    for _ in range(2):  # the second call runs the cached graph
        out, x_grad, grads = run_block(fused, args["data"], head_grad)
        want_out, want_x_grad, want_grads = run_block(reference, args["data"], head_grad)
        assert_bits_equal(out, want_out)
        assert_bits_equal(x_grad, want_x_grad)
        for name, grad in grads.items():
            assert_bits_equal(grad, want_grads[name])


SCALAR = """
    import numpy as np, mxnet as mx
    from mxfp16.casting import fastround
    from tests.test_fastround import (edge_values, numpy_round, random_values, tie_values,
                                      assert_bits_equal)
    assert fastround.load()
    x = np.concatenate([edge_values(), tie_values(), random_values()[: 1 << 20]])
    y = getattr(mx.nd._internal, fastround.ROUND_OP)(mx.nd.array(x)).asnumpy()
    assert_bits_equal(y, numpy_round(x))
    print("scalar ok")
"""
WITHOUT_COMPILER = """
    from mxfp16.casting import fastround
    print(fastround.load(), fastround.load(), fastround.available())
"""
FIRST_BUILDS = """
    import logging, threading
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    from mxfp16.casting import fastround
    results = []
    threads = [threading.Thread(target=lambda: results.append(fastround.load()))
               for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    print(results)
"""
#: test -> (the program its fresh interpreters run, how many, their environment in its folder).
FRESH_RUNS = {
    "test_scalar_path_matches_numpy_exactly": (SCALAR, 1, lambda _: {
        "MXFP16_FASTROUND_SCALAR": "1"}),
    "test_without_a_compiler_load_warns_once_and_returns_false": (WITHOUT_COMPILER, 1, lambda d: {
        "CXX": str(d / "no-such-compiler"), "XDG_CACHE_HOME": str(d / "cache")}),
    "test_concurrent_first_builds_compile_once": (FIRST_BUILDS, 3, lambda d: {
        "XDG_CACHE_HOME": str(d), "OMP_NUM_THREADS": "1"}),
}


def finished(process):
    stdout, stderr = process.communicate(timeout=600)
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


@pytest.fixture(scope="module")
def fresh_runs(request, tmp_path_factory):
    """``test -> (its folder, a callable giving its interpreters' CompletedProcess list)``: the
    fresh interpreters (the library loads once per process) of the tests of FRESH_RUNS this session
    runs, started together when the first of them starts, as they are independent (the first
    builds leave a core idle while one of them compiles and the others wait)."""
    from conftest import chosen_items  # here: SCALAR imports this module without tests/ on the path

    runs = {}
    for test, (code, count, env) in FRESH_RUNS.items():
        if chosen_items(request, test):
            folder = tmp_path_factory.mktemp("fresh")
            processes = [subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)],
                                          cwd=REPO_ROOT, env=dict(os.environ, **env(folder)),
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                          text=True) for _ in range(count)]
            runs[test] = folder, functools.cache(lambda processes=processes: [
                finished(process) for process in processes])
    yield runs
    for _, results in runs.values():  # waits for those of a test that did not ask (-x)
        results()


@pytest.mark.slow
def test_scalar_path_matches_numpy_exactly(round_nd, fresh_runs):
    (result,) = fresh_runs["test_scalar_path_matches_numpy_exactly"][1]()
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split() == ["scalar", "ok"]


@pytest.mark.slow
def test_without_a_compiler_load_warns_once_and_returns_false(fresh_runs):
    (result,) = fresh_runs["test_without_a_compiler_load_warns_once_and_returns_false"][1]()
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split() == ["False", "False", "False"]
    warnings = [line for line in result.stderr.splitlines() if "mxfp16" in line]
    assert len(warnings) == 1 and "no C++ compiler" in warnings[0], result.stderr
    assert "keeps the Cast pair" in warnings[0]


@pytest.mark.slow
def test_concurrent_first_builds_compile_once(round_nd, fresh_runs):
    tmp_path, results = fresh_runs["test_concurrent_first_builds_compile_once"]
    for result in results():
        assert result.returncode == 0, result.stderr[-3000:]
        assert result.stdout.split() == ["[True,", "True,", "True,", "True]"], result.stderr[-3000:]
    compiles = sum(result.stderr.count("mxfp16: compiling") for result in results())
    assert compiles == 1
    built = list(tmp_path.glob("mxfp16/*/*.so"))
    assert [path.name for path in built] == [fastround.LIBRARY_NAME]
