"""Plain gluon.Block networks (Python in ``forward``, HybridBlocks inside) cast by cast_block:
float32 checkpoints under the float32 network's names, in the legacy and the NumPy front end."""
import mxnet as mx
import numpy as np
import pytest
from mxnet import autograd, gluon, npx
from mxnet.gluon import nn

import mxfp16
from mxfp16.casting.block import CastBlock
from mxfp16.casting.plain_block import CastPlainBlock
from mxfp16.optimizers import master_copies

DTYPES = ["float16", "bfloat16"]


class Body(gluon.Block):
    """A plain Block inside a plain Block: a residual branch chosen in Python."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.dense = nn.Dense(8, in_units=8, activation="relu")
            self.norm = nn.BatchNorm(in_channels=8)

    def forward(self, x):
        return x + self.norm(self.dense(x)) if x.shape[0] > 1 else self.dense(x)


class PlainNet(gluon.Block):
    """A network in the style of "Dive into Deep Learning": Python code between HybridBlocks."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.stem = nn.HybridSequential()
            self.stem.add(nn.Dense(8, in_units=4, activation="relu"))
            self.body = Body()
            self.head = nn.Dense(3, in_units=8)

    def forward(self, x):
        return self.head(self.body(self.stem(x)) * 0.5)


#: The names a float32 PlainNet's save_parameters gives its parameters.
FLOAT32_KEYS = sorted(["stem.0.weight", "stem.0.bias", "body.dense.weight", "body.dense.bias",
                       "body.norm.gamma", "body.norm.beta", "body.norm.running_mean",
                       "body.norm.running_var", "head.weight", "head.bias"])


def plain_net(seed=0):
    mx.random.seed(seed)
    net = PlainNet()
    net.initialize(mx.init.Xavier())
    return net


def batch(seed=1, size=8):
    """Inputs and labels, as arrays of the front end that is on."""
    rng = np.random.RandomState(seed)
    array = mx.np.array if mx.util.is_np_array() else mx.nd.array
    return (array(rng.uniform(-1, 1, (size, 4)), dtype="float32"),
            array(rng.randint(0, 3, size), dtype="float32"))


def train(net, dtype, steps=4):
    """A few steps of mxfp16.Trainer on one batch; the losses."""
    trainer = mxfp16.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.2, "momentum": 0.9},
                             dtype=dtype)
    x, y = batch()
    losses = []
    for _ in range(steps):
        with autograd.record():
            loss = gluon.loss.SoftmaxCrossEntropyLoss()(net(x), y)
        trainer.backward(loss)
        trainer.step(x.shape[0])
        losses.append(float(loss.mean().asnumpy()))
    return losses


def as_float32(array):
    return array.astype("float32").asnumpy()


def rounded(array, dtype):
    """A float32 value as a parameter holds it in a network cast to ``dtype``: float16 rounds it,
    bfloat16 keeps its parameters float32 (the graph casts them)."""
    return as_float32(array.astype("float16")) if dtype == "float16" else array.asnumpy()


@pytest.mark.parametrize("dtype", DTYPES)
def test_cast_block_returns_the_plain_block_itself_its_parts_cast(dtype):
    net = plain_net()
    assert mxfp16.cast_block(net, dtype) is net
    assert isinstance(net, PlainNet) and isinstance(net, CastPlainBlock)
    assert isinstance(net.body, CastPlainBlock) and type(net).__name__ == "PlainNet"
    assert isinstance(net.stem, CastBlock) and isinstance(net.body.dense, CastBlock)
    assert net(batch()[0]).dtype == np.float32
    assert mxfp16.cast_block(net, dtype) is net  # again: nothing changes
    assert isinstance(net.stem, CastBlock) and type(net).__mro__.count(CastPlainBlock) == 1


@pytest.mark.parametrize("dtype", DTYPES)
def test_checkpoint_holds_the_master_weights_under_the_float32_names(dtype, tmp_path):
    net = plain_net()
    mxfp16.cast_block(net, dtype)
    losses = train(net, dtype)
    assert losses[-1] < losses[0], losses
    path = str(tmp_path / "net.params")
    net.save_parameters(path)
    saved = mx.nd.load(path)
    assert sorted(saved) == FLOAT32_KEYS
    assert {np.dtype(value.dtype) for value in saved.values()} == {np.dtype("float32")}
    weight = net.head.weight  # the cast part reads the original's attributes
    if dtype == "float16":  # master weights exactly, not the float16 values widened
        np.testing.assert_array_equal(saved["head.weight"].asnumpy(),
                                      master_copies(weight)[0].asnumpy())
    np.testing.assert_array_equal(  # the network's values are the saved ones rounded
        rounded(saved["head.weight"], dtype), as_float32(weight.data()))
    np.testing.assert_array_equal(saved["body.norm.running_mean"].asnumpy(),
                                  net.body.norm.running_mean.data().asnumpy())


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_fresh_float32_network_loads_the_checkpoint_with_no_option(dtype, tmp_path):
    net = plain_net()
    mxfp16.cast_block(net, dtype)
    train(net, dtype)
    path = str(tmp_path / "net.params")
    net.save_parameters(path)
    fresh = PlainNet()
    fresh.load_parameters(path)
    x = batch(seed=7)[0]
    tolerance = 2e-2 if dtype == "float16" else 1e-1
    np.testing.assert_allclose(fresh(x).asnumpy(), net(x).asnumpy(), atol=tolerance,
                               rtol=tolerance)
    fresh.save_parameters(str(tmp_path / "again.params"))  # the float32 file round-trips exactly
    again = mx.nd.load(str(tmp_path / "again.params"))
    for key, value in mx.nd.load(path).items():
        np.testing.assert_array_equal(again[key].asnumpy(), value.asnumpy())


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_float32_file_loads_into_the_cast_block(dtype, tmp_path):
    source = plain_net(seed=3)
    path = str(tmp_path / "float32.params")
    source.save_parameters(path)
    net = plain_net(seed=4)
    mxfp16.cast_block(net, dtype)
    train(net, dtype, steps=1)  # the optimizer holds master weights: they take the file's values
    net.load_parameters(path)
    values = mx.nd.load(path)
    head = net.head.weight
    np.testing.assert_array_equal(as_float32(head.data()),
                                  rounded(values["head.weight"], dtype))
    if dtype == "float16":
        np.testing.assert_array_equal(master_copies(head)[0].asnumpy(),
                                      values["head.weight"].asnumpy())
    gamma = net.body.norm.gamma
    assert gamma.dtype == np.float32  # normalization stays float32: loaded exactly
    np.testing.assert_array_equal(gamma.data().asnumpy(), values["body.norm.gamma"].asnumpy())
    out = tmp_path / "back.params"  # and saved back: the float32 file's values
    net.save_parameters(str(out))
    if dtype == "float16":
        for key, value in mx.nd.load(str(out)).items():
            np.testing.assert_array_equal(value.asnumpy(), values[key].asnumpy())


def test_the_float16_option_and_the_files_of_gluons_other_savers_load(tmp_path):
    net = plain_net()
    mxfp16.cast_block(net, "float16")
    half = str(tmp_path / "half.params")
    net.save_parameters(half, dtype="float16")
    saved = mx.nd.load(half)
    assert saved["head.weight"].dtype == np.float16 and saved["body.norm.gamma"].dtype == np.float32
    PlainNet().load_parameters(half, cast_dtype=True)
    net.load_parameters(half)
    legacy = str(tmp_path / "legacy.params")  # save_params' names: the parameters' own
    mx.random.seed(5)
    other = PlainNet(prefix=net.prefix)
    other.initialize(mx.init.Xavier())
    other.collect_params().save(legacy, strip_prefix=net.prefix)
    net.load_parameters(legacy)
    np.testing.assert_array_equal(as_float32(net.head.weight.data()),
                                  rounded(other.head.weight.data(), "float16"))


def test_load_errors_name_the_parameters_and_the_fix(tmp_path):
    net = plain_net()
    mxfp16.cast_block(net, "float16")
    path = str(tmp_path / "part.params")
    mx.nd.save(path, {"head.weight": mx.nd.zeros((3, 8)), "tail.weight": mx.nd.zeros(2)})
    with pytest.raises(ValueError, match=r"no value for parameter.*allow_missing=True"):
        net.load_parameters(path)
    with pytest.raises(ValueError, match=r"'tail.weight'.*ignore_extra=True"):
        net.load_parameters(path, allow_missing=True)
    net.load_parameters(path, allow_missing=True, ignore_extra=True)
    assert float(net.head.weight.data().abs().sum().asscalar()) == 0
    with pytest.raises(ValueError, match="dtype='bfloat16'.*float32, float16"):
        net.save_parameters(path, dtype="bfloat16")


@pytest.fixture
def numpy_mode_reset():
    """The test may turn the NumPy interface on; it is off again afterwards."""
    yield
    npx.reset_np()


def test_numpy_mode_float32_network_loads_a_legacy_cast_checkpoint(numpy_mode_reset, tmp_path):
    net = plain_net()
    mxfp16.cast_block(net, "float16")
    train(net, "float16")
    path = str(tmp_path / "net.params")
    net.save_parameters(path)
    expected = {key: value.asnumpy() for key, value in mx.nd.load(path).items()}
    npx.set_np()
    fresh = PlainNet()
    fresh.load_parameters(path)  # numpy mode, no option
    for key, param in mxfp16.mxnet_internals.block_param_keys(fresh).items():
        assert isinstance(param.data(), mx.np.ndarray)
        np.testing.assert_array_equal(param.data().asnumpy(), expected[key])


@pytest.mark.parametrize("dtype", DTYPES)
def test_numpy_mode_cast_trains_and_checkpoints_in_float32(numpy_mode_reset, dtype, tmp_path):
    npx.set_np()
    net = plain_net()
    assert mxfp16.cast_block(net, dtype) is net
    assert isinstance(net.stem, CastBlock) and isinstance(net(batch()[0]), mx.np.ndarray)
    losses = train(net, dtype)
    assert losses[-1] < losses[0], losses
    path = str(tmp_path / "net.params")
    net.save_parameters(path)
    loaded = npx.load(path)  # npx.save's format, as Gluon writes with the NumPy interface on
    assert sorted(loaded) == FLOAT32_KEYS
    assert {np.dtype(value.dtype) for value in loaded.values()} == {np.dtype("float32")}
    fresh = PlainNet()
    fresh.load_parameters(path)  # the numpy-mode float32 network, no option
    np.testing.assert_array_equal(
        fresh.head.weight.data().asnumpy(), master_copies(net.head.weight)[0].asnumpy()
        if dtype == "float16" else net.head.weight.data().asnumpy())
    x = batch(seed=7)[0]
    tolerance = 2e-2 if dtype == "float16" else 1e-1
    np.testing.assert_allclose(fresh(x).asnumpy(), net(x).asnumpy(), atol=tolerance,
                               rtol=tolerance)
    source = plain_net(seed=3)  # a numpy-mode float32 file into the cast network
    source.save_parameters(str(tmp_path / "float32.params"))
    net.load_parameters(str(tmp_path / "float32.params"))
    np.testing.assert_array_equal(as_float32(net.head.weight.data()),
                                  rounded(source.head.weight.data(), dtype))
    np.testing.assert_array_equal(net.body.norm.gamma.data().asnumpy(),
                                  source.body.norm.gamma.data().asnumpy())


def test_a_numpy_mode_checkpoint_loads_into_a_legacy_cast_network(numpy_mode_reset, tmp_path):
    npx.set_np()
    net = plain_net()
    mxfp16.cast_block(net, "float16")
    train(net, "float16")
    path = str(tmp_path / "net.params")
    net.save_parameters(path)
    master = master_copies(net.head.weight)[0].asnumpy()
    npx.reset_np()  # plain Gluon refuses this file here ("saved in np shape semantics")
    legacy_net = plain_net(seed=2)
    mxfp16.cast_block(legacy_net, "float16")
    legacy_net.load_parameters(path)
    np.testing.assert_array_equal(as_float32(legacy_net.head.weight.data()),
                                  as_float32(mx.nd.array(master).astype("float16")))
