"""Where each flag name of the scripts comes from: the tool whose users already type it.

mxfp16's scripts take the commands of MXNet's ``example/image-classification`` (its
``common/fit.py``, ``common/data.py`` and ``fine-tune.py``), of GluonCV's training scripts, of
NVIDIA's MXNet ResNet-50 and of MXNet's ``tools/launch.py`` and ``tools/im2rec.py``, with the meaning
they have there (:mod:`mxfp16.train.cli.compat`).  These tables name, per tool, the flag spellings
it has and mxfp16 takes; the command-line reference (docs/cli.md) shows them beside each flag, and
``tests/test_cli_conventions.py`` checks that every name here is a flag of the script it is for.
"""
import argparse
import types

from .nvidia_compat import add_nvidia_arguments

#: Every flag of MXNet 1.9's example/image-classification common/fit.py (``add_fit_args``) and
#: common/data.py (``add_data_args``, ``add_data_aug_args``).
MXNET_EXAMPLE = frozenset("""
--network --num-layers --gpus --kv-store --num-epochs --lr --lr-factor --lr-step-epochs
--initializer --optimizer --mom --wd --batch-size --disp-batches --model-prefix --save-period
--monitor --load-epoch --top-k --loss --test-io --dtype --gc-type --gc-threshold --macrobatch-size
--warmup-epochs --warmup-strategy --profile-worker-suffix --profile-server-suffix
--use-imagenet-data-augmentation --data-train --data-train-idx --data-val --data-val-idx
--rgb-mean --rgb-std --pad-size --fill-value --image-shape --num-classes --num-examples
--data-nthreads --benchmark --use-python-iter --use-gpu-augmenter --random-crop --random-mirror
--max-random-h --max-random-s --max-random-l --min-random-aspect-ratio --max-random-aspect-ratio
--max-random-rotate-angle --max-random-shear-ratio --max-random-scale --min-random-scale
--max-random-area --min-random-area --min-crop-size --max-crop-size --brightness --contrast
--saturation --pca-noise --random-resized-crop
""".split())

#: The flags MXNet example's fine-tune.py adds to fit.py's.
MXNET_FINE_TUNE = frozenset({"--pretrained-model", "--layer-before-fullc", "--load-epoch"})

#: GluonCV 0.10's scripts/classification/imagenet/train_imagenet.py, and ``--amp`` of its
#: detection scripts.
GLUONCV = frozenset("""
--data-dir --rec-train --rec-train-idx --rec-val --rec-val-idx --use-rec --batch-size --dtype
--num-gpus -j --num-data-workers --num-epochs --lr --momentum --wd --lr-mode --lr-decay
--lr-decay-period --lr-decay-epoch --warmup-lr --warmup-epochs --last-gamma --mode --model
--input-size --crop-ratio --use-pretrained --use_se --mixup --mixup-alpha --mixup-off-epoch
--label-smoothing --no-wd --teacher --temperature --hard-weight --batch-norm --save-frequency
--save-dir --resume-epoch --resume-params --resume-states --log-interval --logging-file
--rgb-mean --rgb-std --num-training-samples --data-backend --amp
""".split())

#: MXNet's tools/launch.py.
MXNET_LAUNCH = frozenset({"-n", "--num-workers", "-s", "--num-servers", "-H", "--hostfile",
                          "--launcher", "--env"})

#: MXNet's tools/im2rec.py.
MXNET_IM2REC = frozenset({"--resize", "--quality", "--train-ratio"})


def nvidia_flags():
    """The flags NVIDIA's RN50v1.5 ``train.py`` adds to MXNet example's (those of
    :func:`~mxfp16.train.cli.nvidia_compat.add_nvidia_arguments`).

    Examples
    --------
    >>> sorted(nvidia_flags())[:3]
    ['--arch', '--batchnorm-layout', '--conv-layout']
    """
    parser = argparse.ArgumentParser(add_help=False)
    add_nvidia_arguments(parser, types.SimpleNamespace(arch=None, data_backend=None))
    return frozenset(flag for action in parser._actions for flag in action.option_strings)


def tables():
    """``{script: [(tool, flags), ...]}``: the tools whose flag names each script takes."""
    training = [("MXNet example", MXNET_EXAMPLE), ("GluonCV", GLUONCV), ("NVIDIA", nvidia_flags())]
    return {"train_imagenet": training, "train_cifar10": training,
            "fine_tune": training + [("MXNet example's fine-tune.py", MXNET_FINE_TUNE)],
            "evaluate": training[:2], "export": training[:2],
            "launch": [("MXNet's tools/launch.py", MXNET_LAUNCH)],
            "prepare_data": [("MXNet's tools/im2rec.py", MXNET_IM2REC)]}


def conventions(script, flag):
    """The tools whose users type ``flag`` for ``script`` (a script's file stem), or
    ``["mxfp16"]`` for a flag of mxfp16's own.

    Examples
    --------
    >>> conventions("train_imagenet", "--lr-decay-epoch"), conventions("train_imagenet", "--cpus")
    (['GluonCV'], ['mxfp16'])
    >>> conventions("train_imagenet", "--lr")
    ['MXNet example', 'GluonCV']
    """
    tools = [tool for tool, flags in tables().get(script, []) if flag in flags]
    return tools or ["mxfp16"]
