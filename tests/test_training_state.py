"""mxfp16.save_training_state / load_training_state / StopRequest for users' own loops, and
examples/preemptible_loop.py stopped by signals and resumed bit for bit."""
import concurrent.futures
import os
import signal
import subprocess
import sys

import mxnet as mx
import numpy as np
import pytest
from mxnet import autograd, gluon
from mxnet.gluon import nn

import mxfp16

EXAMPLE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples",
                       "preemptible_loop.py")


def make_loop(units=8):
    """A float16 network with dropout and its Trainer (dynamic loss scaling), built alike each time."""
    net = nn.HybridSequential()
    net.add(nn.Dense(units, activation="relu", in_units=6), nn.Dropout(0.5),
            nn.Dense(3, in_units=units))
    mx.random.seed(7)
    net.initialize(mx.init.Xavier())
    net = mxfp16.cast_block(net, "float16")
    trainer = mxfp16.Trainer(net.collect_params(), "adam", {"learning_rate": 0.01},
                             dtype="float16")
    return net, trainer


def train(net, trainer, steps, first=0):
    data = np.random.RandomState(0).randn(steps + first, 4, 6).astype("float32")
    for step in range(first, first + steps):
        mxfp16.seed_step(1, step)  # dropout draws of the step
        with autograd.record():
            loss = gluon.loss.SoftmaxCrossEntropyLoss()(net(mx.nd.array(data[step])),
                                                        mx.nd.array([0, 1, 2, 0]))
        trainer.backward(loss)
        trainer.step(4)


def values(net):
    return {name: p.data().asnumpy() for name, p in net.collect_params().items()}


def test_a_restored_loop_continues_bit_for_bit(tmp_path):
    net, trainer = make_loop()
    train(net, trainer, 10)  # uninterrupted
    stopped, stopped_trainer = make_loop()
    train(stopped, stopped_trainer, 4)
    prefix = str(tmp_path / "state")
    mxfp16.save_training_state(prefix, 4, stopped, stopped_trainer, extra={"epoch": 0})
    resumed, resumed_trainer = make_loop()  # a new process builds the loop again
    state = mxfp16.load_training_state(prefix, resumed, resumed_trainer)
    assert (state.step, state.extra) == (4, {"epoch": 0})
    train(resumed, resumed_trainer, 6, first=4)
    for (name, expected), actual in zip(values(net).items(), values(resumed).values()):
        assert (expected == actual).all(), name
    assert (resumed_trainer.loss_scale, resumed_trainer.optimizer.num_update) == \
        (trainer.loss_scale, trainer.optimizer.num_update)


def test_random_state_and_several_trainers_are_restored(tmp_path):
    generator, g_trainer = make_loop()
    critic, c_trainer = make_loop(units=4)
    train(generator, g_trainer, 2)
    np.random.seed(5)
    expected = np.random.rand(3)
    np.random.seed(5)
    name = mxfp16.save_training_state(str(tmp_path / "gan"), 2, [generator, critic],
                                      [g_trainer, c_trainer])
    np.random.rand(10)  # moves on
    generator2, g_trainer2 = make_loop()
    critic2, c_trainer2 = make_loop(units=4)
    mxfp16.load_training_state(name, [generator2, critic2], [g_trainer2, c_trainer2])
    assert (np.random.rand(3) == expected).all()
    assert g_trainer2.optimizer.num_update == 2 and c_trainer2.optimizer.num_update == 0


def test_a_state_cut_short_is_passed_over_and_old_states_are_rotated(tmp_path):
    net, trainer = make_loop()
    prefix = str(tmp_path / "state")
    for step in (1, 2, 3):
        mxfp16.save_training_state(prefix, step, net, trainer, keep=2)
    assert sorted(os.listdir(tmp_path)) == sorted(
        f"state-0000000{s}.{part}" for s in (2, 3) for part in ("json", "net0.params",
                                                                "trainer0.states"))
    with open(f"{prefix}-00000003.trainer0.states", "r+b") as cut:
        cut.truncate(10)  # the machine died before the disk had all of it
    assert mxfp16.latest_training_state(prefix) == prefix + "-00000002"
    assert mxfp16.load_training_state(prefix, *make_loop()).step == 2
    with pytest.raises(ValueError, match=r"00000003' is incomplete or damaged: .*trainer0.states has 10 "
                                         r"bytes, not \d+; load another one"):
        mxfp16.load_training_state(prefix + "-00000003", *make_loop())


def test_latest_state_is_none_before_the_first_save_and_an_error_when_none_is_intact(tmp_path):
    prefix = str(tmp_path / "state")
    assert mxfp16.latest_training_state(prefix) is None  # a first run starts at step 0
    net, trainer = make_loop()
    for step in (1, 2):
        mxfp16.save_training_state(prefix, step, net, trainer)
    for step in (1, 2):
        with open(f"{prefix}-0000000{step}.net0.params", "r+b") as cut:
            cut.truncate(10)
    with pytest.raises(ValueError, match=r"none of the 2 training state\(s\) under '.*state' is "
                                         r"intact \(the oldest: .*00000001.net0.params has 10 "
                                         r"bytes, .*\): starting afresh would save over them"):
        mxfp16.latest_training_state(prefix)


def test_bad_loads_name_the_file_and_the_fix(tmp_path):
    net, trainer = make_loop()
    name = mxfp16.save_training_state(str(tmp_path / "s"), 1, net, trainer)
    with pytest.raises(ValueError, match="no complete training state .*elsewhere"):
        mxfp16.load_training_state(str(tmp_path / "elsewhere"), net, trainer)
    with pytest.raises(ValueError, match=r"holds 1 network\(s\) and 1 Trainer\(s\), not 2 and 2"):
        mxfp16.load_training_state(name, [net, net], [trainer, trainer])
    with pytest.raises(ValueError, match=r"s-00000001.net0.params does not fit the network: .*build "
                                         "the network as when it was saved"):
        mxfp16.load_training_state(name, *make_loop(units=5))


def run_example(prefix, until=None, signum=signal.SIGTERM):
    """Run examples/preemptible_loop.py; with ``until``, send ``signum`` once that line is printed."""
    process = subprocess.Popen([sys.executable, EXAMPLE, "--prefix", prefix, "--num-epochs", "3"],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    for line in process.stdout:
        lines.append(line)
        if until and line.startswith(until):
            process.send_signal(signum)
            break
    rest, _ = process.communicate(timeout=300)
    return process.returncode, "".join(lines) + rest


@pytest.fixture(scope="module")
def uninterrupted_example(tmp_path_factory):
    """A callable returning the prefix of an uninterrupted run of the example, the reference of
    every stopped one, once the run has ended: it starts at once, beside the first stopped run."""
    full = str(tmp_path_factory.mktemp("full") / "s")
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        run = pool.submit(run_example, full)

        def finished():
            code, output = run.result()
            assert code == 0, output
            return full
        yield finished


@pytest.mark.slow
@pytest.mark.parametrize("signum, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_example_stopped_by_a_signal_resumes_to_the_same_weights(uninterrupted_example, tmp_path,
                                                                 signum, code):
    part = str(tmp_path / "part" / "s")
    stopped, output = run_example(part, until="step 30 ", signum=signum)
    assert stopped == code, output
    line = output.strip().splitlines()[-1]
    assert line.startswith(f"stopped by {signal.Signals(signum).name} after step 3")
    assert line.endswith("run the same command again to resume")
    finished, output = run_example(part)
    assert finished == 0, output
    assert "resumed_from=s-000000" in output.strip().splitlines()[-1]
    expected = mx.nd.load(mxfp16.latest_training_state(uninterrupted_example()) + ".net0.params")
    actual = mx.nd.load(mxfp16.latest_training_state(part) + ".net0.params")
    assert sorted(expected) == sorted(actual)
    assert all((expected[key] == actual[key]).min().asscalar() for key in expected)
