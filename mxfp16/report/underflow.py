"""Activation-gradient histogram under CPU float16 emulation, and a static loss scale to recommend.

As in Micikevicius et al. 2018 ("Mixed Precision Training", ICLR), Figure 5: the magnitudes of the
gradients with respect to the activations, in log2 buckets, against float16's range (largest
65504, smallest normal 2**-14, smallest subnormal 2**-24).  A gradient below 2**-24 becomes zero in
float16.

The network is cast with ``cast_block(net, 'float16', emulate=True)`` and trained for a few steps of
softmax cross-entropy (SGD with float32 master weights).  Gradients are read by probes
(:mod:`mxfp16.diagnose.probes`) on every tensor the GPU graph keeps in float16, as the float32 values
emulation computes before rounding them.  Two runs from the same starting weights on the same
batches: at loss scale 1, then at the recommended scale; the histograms are of the values as stored
(multiplied by the loss scale).  "Underflow" counts the nonzero values below 2**-24, the paper's
threshold (strictly, round-to-nearest sends values above 2**-25 to 2**-24 rather than to 0).

The recommended scale is :func:`mxfp16.scaling.scalers.recommend_loss_scale`, the rule a
``DynamicLossScaler(init_scale='auto')`` starts from, with the same default headroom.

Cost: the probes roughly triple the activation memory of the CPU run (ResNet-50 at batch 8, 224x224:
about 5.5 GB of RAM and a minute or two for the default 3 steps, run twice).
"""
import math

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon

from ..casting import cast_block, cast_symbol
from ..casting.graph import internal_dtypes
from ..scaling.scalers import DEFAULT_HEADROOM, FLOAT16_MAX, StaticLossScaler, recommend_loss_scale
from ..optimizers import make_trainer
from ..diagnose.probes import add_gradient_probes

#: float16's smallest normal and smallest subnormal (its largest, 65504, is the core's FLOAT16_MAX).
FLOAT16_MIN_NORMAL = 2.0 ** -14
FLOAT16_MIN_SUBNORMAL = 2.0 ** -24

#: Histogram buckets: [2**k, 2**(k+1)) for k in this range; values outside go to the end buckets.
HISTOGRAM_EXPONENTS = range(-80, 21)


def gradient_stats(values):
    """Counts of gradient magnitudes against float16's range.

    Parameters
    ----------
    values : numpy.ndarray
        Gradient values as stored (already multiplied by the loss scale).

    Returns
    -------
    dict
        ``counts`` per bucket of :data:`HISTOGRAM_EXPONENTS`, ``zeros``, ``nonzero``, ``nonfinite``,
        ``underflow`` (nonzero, below 2**-24), ``subnormal`` (2**-24 to 2**-14), ``overflow``
        (above 65504, or inf/NaN) and ``max_abs``.

    Examples
    --------
    >>> import numpy as np
    >>> stats = gradient_stats(np.array([0.0, 2.0 ** -30, 2.0 ** -20, 1.5, 1e5]))
    >>> stats['nonzero'], stats['underflow'], stats['subnormal'], stats['overflow']
    (4, 1, 1, 1)
    """
    magnitude = np.abs(values.ravel().astype(np.float64))
    finite = magnitude[np.isfinite(magnitude)]
    nonzero = finite[finite > 0]
    exponent = np.frexp(nonzero)[1] - 1  # floor(log2 |g|), exactly
    low, high = HISTOGRAM_EXPONENTS[0], HISTOGRAM_EXPONENTS[-1]
    counts = np.bincount(np.clip(exponent, low, high) - low, minlength=high - low + 1)
    return {"counts": counts.tolist(), "zeros": int(finite.size - nonzero.size),
            "nonzero": int(nonzero.size + magnitude.size - finite.size),
            "nonfinite": int(magnitude.size - finite.size),
            "underflow": int(np.sum(nonzero < FLOAT16_MIN_SUBNORMAL)),
            "subnormal": int(np.sum((nonzero >= FLOAT16_MIN_SUBNORMAL)
                                    & (nonzero < FLOAT16_MIN_NORMAL))),
            "overflow": int(np.sum(nonzero > FLOAT16_MAX) + magnitude.size - finite.size),
            "max_abs": float(nonzero.max()) if nonzero.size else 0.0}


def merge_stats(total, stats):
    """Add ``stats`` into ``total`` (both :func:`gradient_stats` dicts; ``{}`` to start); returns
    ``total``.

    Examples
    --------
    >>> import numpy as np
    >>> total = merge_stats({}, gradient_stats(np.array([1.0, 0.0])))
    >>> merge_stats(total, gradient_stats(np.array([4.0])))['nonzero'], total['max_abs']
    (2, 4.0)
    """
    if not total:
        total.update(stats, counts=list(stats["counts"]))
        return total
    for key, value in stats.items():
        if key == "counts":
            total[key] = [a + b for a, b in zip(total[key], value)]
        elif key == "max_abs":
            total[key] = max(total[key], value)
        else:
            total[key] += value
    return total


def _total(per_probe):
    total = {}
    for stats in per_probe:
        merge_stats(total, stats)
    return total


def _summary(run, scale):
    """One run's totals with the fractions the report prints."""
    stats = _total(run["per_probe"])
    nonzero = max(stats["nonzero"], 1)
    return dict(stats, loss_scale=scale, skipped_steps=run["skipped"],
                weight_grad_max=run["weight_grad_max"],
                underflow_fraction=stats["underflow"] / nonzero,
                subnormal_fraction=stats["subnormal"] / nonzero,
                overflow_fraction=stats["overflow"] / nonzero)


def probed_network(net, data_name="data"):
    """Cast ``net`` for emulated float16 and add gradient probes.

    Parameters
    ----------
    net : gluon.HybridBlock
        Initialized; its parameters are cast in place (as :func:`mxfp16.cast_block` does).
    data_name : str

    Returns
    -------
    (gluon.SymbolBlock, list of str, list of str)
        A block taking ``data`` and one zero array per probe, sharing ``net``'s parameters; the
        probe names; the output each probe stands for.

    Examples
    --------
    >>> import mxnet as mx
    >>> from mxnet.gluon import nn
    >>> net = nn.Dense(4, in_units=3)
    >>> net.initialize()
    >>> block, probes, outputs = probed_network(net)
    >>> len(probes), outputs[0].endswith('_fwd_output'), net.weight.dtype.__name__
    (1, True, 'float16')
    """
    gpu = cast_symbol(net(mx.sym.var(data_name)), "float16", emulate=False, data_names=[data_name])
    dtypes = internal_dtypes(gpu, [data_name])
    emulated = cast_block(net, "float16", emulate=True, input_names=[data_name])
    sym, probes, outputs = add_gradient_probes(emulated(mx.sym.var(data_name)), dtypes)
    inputs = [mx.sym.var(name, dtype="float32") for name in [data_name] + probes]
    return gluon.SymbolBlock(sym, inputs, params=emulated.collect_params()), probes, outputs


def _probe_shapes(block, probes, data_shape):
    sym = block(*[mx.sym.var(name) for name in ["data"] + probes])
    arg_shapes, _, _ = sym.infer_shape_partial(data=data_shape)
    shapes = dict(zip(sym.list_arguments(), arg_shapes))
    return [shapes[name] for name in probes]


def _float16_grad_max(params):
    """The largest gradient magnitude of the float16 parameters (inf if one overflowed or NaN)."""
    grads = [param.grad() for param in params.values()
             if param.grad_req != "null" and np.dtype(param.dtype) == np.float16]
    values = [float(mx.nd.max(mx.nd.abs(grad)).asscalar()) for grad in grads]
    return max((math.inf if math.isnan(value) else value for value in values), default=0.0)


def run_steps(block, probes, batches, loss_scale, learning_rate=0.01):
    """Train ``block`` on ``batches`` at a static loss scale, reading the probes' gradients.

    Parameters
    ----------
    block, probes
        As :func:`probed_network` returns them.
    batches : list of (NDArray, NDArray)
        Data and integer labels.
    loss_scale : float
    learning_rate : float
        SGD (momentum 0.9, float32 master weights); steps whose gradients overflow are skipped.

    Returns
    -------
    dict
        ``per_probe``: :func:`gradient_stats` of each probe summed over the steps (scaled values);
        ``weight_grad_max``: the largest scaled gradient of a float16 weight; ``skipped``: steps.

    Examples
    --------
    >>> import mxnet as mx
    >>> from mxnet.gluon import nn
    >>> net = nn.Dense(4, in_units=3)
    >>> net.initialize()
    >>> block, probes, _ = probed_network(net)
    >>> run = run_steps(block, probes, random_batches((2, 3), 4, steps=1), loss_scale=8.0)
    >>> run['skipped'], run['per_probe'][0]['nonzero']
    (0, 8)
    """
    params = block.collect_params()
    trainer = make_trainer(params, "sgd", "float16", learning_rate=learning_rate, momentum=0.9)
    scaler, loss_fn = StaticLossScaler(loss_scale), gluon.loss.SoftmaxCrossEntropyLoss()
    shapes = _probe_shapes(block, probes, batches[0][0].shape)
    run = {"per_probe": [{} for _ in probes], "weight_grad_max": 0.0, "skipped": 0}
    for data, label in batches:
        zeros = [mx.nd.zeros(shape) for shape in shapes]
        for array in zeros:
            array.attach_grad()
        with autograd.record():
            scaled = scaler.scale(loss_fn(block(data, *zeros), label))
        scaled.backward()
        for index, array in enumerate(zeros):
            merge_stats(run["per_probe"][index], gradient_stats(array.grad.asnumpy()))
        run["weight_grad_max"] = max(run["weight_grad_max"], _float16_grad_max(params))
        run["skipped"] += not scaler.step(trainer, data.shape[0])
    return run


def random_batches(data_shape, num_classes, steps, seed=0):
    """``steps`` batches of standard-normal data and uniform labels (reproducible with ``seed``).

    Examples
    --------
    >>> [(data.shape, label.shape) for data, label in random_batches((4, 3, 8, 8), 10, steps=2)]
    [((4, 3, 8, 8), (4,)), ((4, 3, 8, 8), (4,))]
    """
    rng = np.random.RandomState(seed)
    return [(mx.nd.array(rng.standard_normal(data_shape)),
             mx.nd.array(rng.randint(0, num_classes, size=data_shape[0])))
            for _ in range(steps)]


def _per_layer(outputs, per_probe):
    return [{"output": name, "nonzero": stats["nonzero"], "underflow": stats["underflow"],
             "underflow_fraction": stats["underflow"] / max(stats["nonzero"], 1),
             "max_abs": stats["max_abs"]} for name, stats in zip(outputs, per_probe)]


def gradient_underflow(net, batches, headroom=DEFAULT_HEADROOM, learning_rate=0.01,
                       training_batch_size=None):
    """Histogram activation gradients at loss scale 1 and at the recommended static scale.

    The recommended scale keeps both the activation gradients and the float16 weight gradients
    ``headroom`` times below 65504.  Weight gradients are sums over the batch (Gluon losses are
    per sample and summed by ``backward``), so the ones measured here are multiplied by
    ``training_batch_size / measured batch size`` first: an upper bound for the batch you train
    with.

    Parameters
    ----------
    net : gluon.HybridBlock
        An initialized network (its parameters are cast to float16 in place).
    batches : list of (NDArray, NDArray)
        The training steps' data and labels (see :func:`random_batches`).
    headroom : float
        See :func:`recommend_loss_scale`.
    learning_rate : float
    training_batch_size : int or None
        The batch size (per GPU) of real training; None means the batch size of ``batches``.

    Returns
    -------
    dict
        ``steps``, ``batch_size``, ``training_batch_size``, ``headroom``, ``recommended_scale``,
        ``scale_1`` and ``recommended`` (the two runs: :func:`gradient_stats` totals of the
        activation gradients with ``loss_scale``, ``skipped_steps``, ``weight_grad_max``,
        ``underflow_fraction``, ``subnormal_fraction``, ``overflow_fraction``), ``exponents`` (the
        buckets' k) and ``layers`` (per probed output, at scale 1).

    Examples
    --------
    >>> import mxnet as mx
    >>> from mxnet.gluon import nn
    >>> net = nn.HybridSequential()
    >>> net.add(nn.Dense(8), nn.Dense(8), nn.Dense(3))
    >>> net.initialize(mx.init.Normal(1e-4))  # tiny weights: tiny gradients in the first layers
    >>> result = gradient_underflow(net, random_batches((4, 5), 3, steps=2))
    >>> result['scale_1']['underflow_fraction'] > result['recommended']['underflow_fraction']
    True
    """
    net(batches[0][0])  # completes deferred initialization before the cast
    block, probes, outputs = probed_network(net)
    start = {name: param.data().copy() for name, param in block.collect_params().items()}
    first = run_steps(block, probes, batches, 1.0, learning_rate)
    measured = int(batches[0][0].shape[0])
    growth = max(1.0, (training_batch_size or measured) / measured)
    scale_1 = _summary(first, 1.0)
    largest = max(scale_1["max_abs"], first["weight_grad_max"] * growth)
    scale = recommend_loss_scale(largest, headroom)
    for name, param in block.collect_params().items():
        param.set_data(start[name])
    second = run_steps(block, probes, batches, scale, learning_rate)
    return {"steps": len(batches), "batch_size": measured,
            "training_batch_size": training_batch_size or measured, "headroom": headroom,
            "recommended_scale": scale, "scale_1": scale_1, "recommended": _summary(second, scale),
            "exponents": list(HISTOGRAM_EXPONENTS),
            "layers": _per_layer(outputs, first["per_probe"])}
