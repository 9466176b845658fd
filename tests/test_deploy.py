"""mxfp16.export / CastBlock.export: what plain MXNet loads in a process that never imports mxfp16.

The float32 export holds the float32 master weights, the float16 export the GPU graph with every
parameter in the dtype the graph gives it (written without a forward pass), the emulation graph
only when asked for and then in plain ops.
"""
import json
import os
import subprocess
import sys
import textwrap

import mxnet as mx
import numpy as np
import pytest
from mxnet import autograd

import mxfp16
from mxfp16.casting import fastround
from mxfp16.casting.deploy import float32_value, param_dtypes
from mxfp16.models import get_network

#: Run in a fresh interpreter without the worktree on the path: plain MXNet only.
PLAIN_MXNET = """
import json, sys
import mxnet as mx, numpy as np
from mxnet import gluon
out = {}
for prefix in sys.argv[1:]:
    block = gluon.SymbolBlock.imports(prefix + "-symbol.json", ["data"], prefix + "-0000.params")
    sym, args, aux = mx.model.load_checkpoint(prefix, 0)
    params = {n: p.dtype.__name__ for n, p in block.collect_params().items()}
    result = {"params": params, "count": len(args) + len(aux)}
    if "float16" not in params.values() or prefix.endswith("emulated"):
        x = mx.nd.array(np.load(prefix + "-input.npy"))
        result["out"] = block(x).asnumpy().tolist()
    out[prefix] = result
assert "mxfp16" not in sys.modules
print(json.dumps(out))
"""


def plain_mxnet(*prefixes):
    """What a process with plain MXNet (no mxfp16 on its path) makes of the exported files."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(PLAIN_MXNET), *prefixes],
                          capture_output=True, text=True, env=env, cwd="/", timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A float16 CIFAR ResNet-20 after two SGD steps (its master weights differ from the float16
    weights), its exports, and a check batch."""
    folder = tmp_path_factory.mktemp("deploy")
    mx.random.seed(0)
    net = get_network("cifar_resnet20_v1", 4)
    net.initialize(mx.init.Xavier())
    net16 = mxfp16.cast_block(net, "float16")
    trainer = mxfp16.make_trainer(net16.collect_params(), "sgd", "float16", learning_rate=0.05)
    x = mx.nd.random.uniform(shape=(2, 3, 16, 16))
    for _ in range(2):
        with autograd.record():
            loss = net16(x).sum()
        loss.backward()
        trainer.step(2)
    prefixes = {"float32": str(folder / "net"), "float16": str(folder / "net-float16"),
                "emulated": str(folder / "net-float16-emulated")}
    net16.export(prefixes["float32"])
    mxfp16.export(net16, prefixes["float16"], dtype="float16")
    mxfp16.export(net16, prefixes["emulated"], dtype="float16", emulate=True)
    for prefix in prefixes.values():
        np.save(prefix + "-input.npy", x.asnumpy())
    loaded = plain_mxnet(*prefixes.values())  # one fresh process reads all three
    return net, net16, x, prefixes, {kind: loaded[p] for kind, p in prefixes.items()}


@pytest.mark.slow
def test_float32_export_holds_the_master_weights_and_loads_without_mxfp16(trained):
    net, net16, x, prefixes, loaded = trained
    weight = net.collect_params()[net.prefix + "conv0_weight"]
    master = float32_value(weight).asnumpy()
    assert (master != master.astype(np.float16).astype(np.float32)).any()  # not the rounded one
    saved = mx.nd.load(prefixes["float32"] + "-0000.params")
    np.testing.assert_array_equal(saved["arg:" + weight.name].asnumpy(), master)
    loaded = loaded["float32"]
    assert set(loaded["params"].values()) == {"float32"}
    assert loaded["count"] == len(net.collect_params().keys())
    # the float32 network with the master weights, as a float32 server computes it
    reference = get_network("cifar_resnet20_v1", 4)
    reference.load_parameters(_gluon_file(net16, prefixes["float32"]))
    np.testing.assert_allclose(loaded["out"], reference(x).asnumpy(), rtol=1e-5, atol=1e-5)


def _gluon_file(net16, prefix):
    path = prefix + "-gluon.params"
    net16.save_parameters(path)  # float32 masters under the original's names
    return path


@pytest.mark.slow
def test_float16_export_has_every_parameter_in_the_gpu_graphs_dtypes(trained):
    net, _, _, prefixes, loaded = trained
    sym = mx.sym.load(prefixes["float16"] + "-symbol.json")
    nodes = json.loads(sym.tojson())["nodes"]
    assert fastround.ROUND_OP not in {node["op"] for node in nodes}
    expected = param_dtypes(sym)
    saved = {k.split(":", 1)[1]: v for k, v in mx.nd.load(prefixes["float16"] + "-0000.params").items()}
    assert set(saved) == set(expected) and len(saved) == len(net.collect_params().keys())
    assert {n: v.dtype.__name__ for n, v in saved.items()} == expected
    kinds = {suffix: {t for n, t in expected.items() if n.endswith(suffix)}
             for suffix in ("_weight", "_gamma", "_running_var")}
    assert kinds == {"_weight": {"float16"}, "_gamma": {"float32"}, "_running_var": {"float32"}}
    # the float16 weight is the master weight rounded, as the trained network holds it
    name = net.prefix + "conv0_weight"
    np.testing.assert_array_equal(saved[name].asnumpy(),
                                  net.collect_params()[name].data().asnumpy())
    assert loaded["float16"]["params"] == expected


@pytest.mark.slow
def test_emulation_graph_only_when_asked_and_then_in_plain_ops(trained):
    _, net16, x, prefixes, loaded = trained
    ops = {node["op"] for node in json.loads(
        open(prefixes["emulated"] + "-symbol.json").read())["nodes"]}
    assert fastround.ROUND_OP not in ops and "Cast" in ops
    np.testing.assert_allclose(loaded["emulated"]["out"], net16(x).asnumpy(), rtol=2e-3, atol=2e-3)


def test_bad_requests_raise_with_the_fix():
    net = mx.gluon.nn.Dense(2, in_units=3)
    net.initialize()
    with pytest.raises(ValueError, match="dtype='bfloat16': choose one of float32, float16"):
        mxfp16.export(net, "unused", dtype="bfloat16")
    with pytest.raises(ValueError, match=r"cast it first \(mxfp16.cast_block"):
        mxfp16.export(net, "unused", dtype="float16")
    with pytest.raises(ValueError, match="emulate=True exports the float16 emulation graph"):
        mxfp16.export(net, "unused", emulate=True)
    fresh = mx.gluon.nn.Dense(2, in_units=3)
    with pytest.raises(ValueError, match="have no value: initialize the network"):
        mxfp16.export(fresh, "unused")


@pytest.mark.slow
def test_resnet50_exports_both_graphs_at_a_small_image_size(tmp_path):
    net = get_network("resnet50_v1", 10)
    net.initialize()
    net(mx.nd.zeros((1, 3, 32, 32)))
    net16 = mxfp16.cast_block(net, "float16")
    prefix = str(tmp_path / "r50")
    net16.export(prefix)
    mxfp16.export(net16, prefix + "-float16", dtype="float16")
    loaded = plain_mxnet(prefix + "-float16")[prefix + "-float16"]
    assert loaded["params"] == {  # normalization float32, convolutions and the classifier float16
        name: "float32" if "batchnorm" in name else "float16" for name in net.collect_params().keys()}
    assert loaded["count"] == len(net.collect_params().keys())
    sym32, args, aux = mx.model.load_checkpoint(prefix, 0)
    assert {v.dtype.__name__ for v in list(args.values()) + list(aux.values())} == {"float32"}
    assert sym32.infer_shape(data=(1, 3, 32, 32))[1] == [(1, 10)]
