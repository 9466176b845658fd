"""Cost of CPU float16 emulation: one ResNet-50 training step, emulated float16 vs float32.

Usage: python benchmarks/emulation_step.py [--network resnet50_v1] [--batch-size 16] [--image-size 224]
[--quick]
Prints one JSON line per dtype and the ratio; docs/benchmarks.md records the results.  --quick times
one step of resnet18_v1 on 2 images of 32x32 (tests/test_benchmarks.py runs it).
"""
import argparse
import json
import os
import platform
import sys
import time

import mxnet as mx
from mxnet import autograd, gluon

import mxfp16
import mxfp16.casting.fastround
from mxfp16.models import get_network


def time_steps(net, trainer, scaler, data, label, steps, warmup):
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    times = []
    for i in range(warmup + steps):
        start = time.perf_counter()
        with autograd.record():
            loss = scaler.scale(loss_fn(net(data), label))
        loss.backward()
        scaler.step(trainer, data.shape[0])
        mx.nd.waitall()
        if i >= warmup:
            times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def measure(network, dtype, batch_size, image_size, steps, warmup):
    mx.random.seed(0)
    net = get_network(network, num_classes=1000)
    net.initialize(mx.init.Xavier())
    net = mxfp16.cast_block(net, dtype)
    net.hybridize(static_alloc=True, static_shape=True)
    trainer = mxfp16.make_trainer(net.collect_params(), "sgd", dtype, learning_rate=0.01,
                                  momentum=0.9)
    # A static scale of 1 checks overflow like the real loop but never skips on this data.
    scaler = mxfp16.StaticLossScaler(1.0, enabled=False)
    data = mx.nd.random.uniform(shape=(batch_size, 3, image_size, image_size))
    label = mx.nd.array([i % 1000 for i in range(batch_size)])
    return time_steps(net, trainer, scaler, data, label, steps, warmup)


#: What --quick sets: one timed step of a small network on two small images.
QUICK = {"network": "resnet18_v1", "batch_size": 2, "image_size": 32, "steps": 1, "warmup": 0}


def get_args_parser():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--network", default="resnet50_v1", help="(default: resnet50_v1)")
    parser.add_argument("--batch-size", type=int, default=16, help="(default: 16)")
    parser.add_argument("--image-size", type=int, default=224, help="(default: 224)")
    parser.add_argument("--steps", type=int, default=5, help="timed steps (default: 5)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps (default: 2)")
    parser.add_argument("--quick", action="store_true",
                        help="one step of resnet18_v1, batch 2, 32x32, for tests; overrides the "
                             "size flags (default: off)")
    return parser


def main(argv=None):
    args = get_args_parser().parse_args(argv)
    if args.quick:
        vars(args).update(QUICK)
    results = {}
    for dtype in ("float32", "float16"):
        results[dtype] = measure(args.network, dtype, args.batch_size, args.image_size,
                                 args.steps, args.warmup)
        print(json.dumps({"dtype": dtype, "median_step_s": round(results[dtype], 3),
                          "img_per_s": round(args.batch_size / results[dtype], 2)}))
    print(json.dumps({"network": args.network, "batch_size": args.batch_size,
                      "image_size": args.image_size, "machine": platform.machine(),
                      "cores": os.cpu_count(), "mxnet": mx.__version__,
                      "fused_rounding": mxfp16.casting.fastround.wanted() and mxfp16.casting.fastround.load(),
                      "float16_over_float32": round(results["float16"] / results["float32"], 3)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
