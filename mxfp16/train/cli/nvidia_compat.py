"""The flags of NVIDIA's MXNet ResNet-50 v1.5 (DeepLearningExamples ``MxNet/Classification/RN50v1.5``)
that its ``runner`` passes to ``train.py``, and what they mean here.

``--arch resnetv15 --num-layers 50`` is the model zoo's ``resnet50_v1b`` (the stride-2 3x3
convolution of ResNet v1.5); the GPU-only flags (NHWC layouts, fused BatchNorm kernels of NVIDIA's
MXNet container, DALI, 4-channel padded images) have no counterpart in MXNet 1.9.1 on these
machines: the run keeps NCHW, separate BatchNorm and ReLU, ImageRecordIter and 3 channels, and says
so in one log line each.
"""
import dataclasses

#: ``--arch`` -> the model zoo's name pattern (``{layers}`` from ``--num-layers``, 50 by default).
ARCHITECTURES = {"resnetv1": "resnet{layers}_v1", "resnetv15": "resnet{layers}_v1b",
                 "resnextv1": "resnext{layers}_32x4d", "resnextv15": "resnext{layers}_32x4d"}
LAYOUTS = ("NCHW", "NHWC")
DATA_BACKENDS = ("dali-gpu", "dali-cpu", "mxnet", "synthetic")
LAYOUT_FLAGS = ("input_layout", "conv_layout", "batchnorm_layout", "pooling_layout")


def add_nvidia_arguments(group, d):
    """The flags of NVIDIA's runner command line, on the argparse ``group``."""
    group.add_argument("--arch", default=d.arch, help="NVIDIA's: " + ", ".join(ARCHITECTURES)
                       + " with --num-layers (resnetv15: the zoo's resnet50_v1b) (default: "
                       "--network decides; resnetv15 with NVIDIA's --data-backend or --fuse-* "
                       "and no --network)")
    for flag in ("--fuse-bn-relu", "--fuse-bn-add-relu"):
        group.add_argument(flag, type=int, default=0, help="NVIDIA's fused BatchNorm kernels "
                           "(its container's MXNet): noted, BatchNorm and ReLU stay separate "
                           "(default: 0)")
    for name in LAYOUT_FLAGS:
        flag = "--" + name.replace("_", "-")
        group.add_argument(flag, default="NCHW", help=f"NVIDIA's: {', '.join(LAYOUTS)}; NHWC "
                           "is noted and NCHW kept (default: NCHW)")
    group.add_argument("--data-backend", default=d.data_backend,
                       help=f"NVIDIA's: {', '.join(DATA_BACKENDS)}; DALI is noted and the .rec "
                            "files read by ImageRecordIter; synthetic is --benchmark 1 "
                            f"(default: {d.data_backend})")


def _nvidia_command(config):
    """Whether flags only NVIDIA's train.py has were given (its runner always passes
    ``--data-backend``)."""
    return config.data_backend is not None or config.fuse_bn_relu or config.fuse_bn_add_relu


def _network(config):
    if config.arch is None and _nvidia_command(config) and \
            config.network == type(config)().network:  # NVIDIA's default architecture
        config = dataclasses.replace(config, arch="resnetv15")
    if config.arch is None:
        return {}, []
    if config.arch not in ARCHITECTURES:
        raise ValueError(f"--arch {config.arch!r} is not supported: choose one of "
                         f"{', '.join(ARCHITECTURES)} (NVIDIA's xception is not in the model zoo)")
    if config.network != type(config)().network:
        raise ValueError(f"--arch {config.arch} and --network {config.network} both name the "
                         "network: pass one of them")
    layers = config.num_layers or 50
    network = ARCHITECTURES[config.arch].format(layers=layers)
    note = f"--arch {config.arch} --num-layers {layers} is the model zoo's {network}"
    if config.arch == "resnextv15":
        note += " (its stride sits where ResNeXt v1 has it: GluonCV has no v1.5 ResNeXt)"
    return {"network": network, "num_layers": None}, [note]


def _devices_and_data(config):
    settings, notes = {}, []
    for name in LAYOUT_FLAGS:
        value = getattr(config, name)
        if value not in LAYOUTS:
            raise ValueError(f"--{name.replace('_', '-')} {value!r} is not a layout: choose one "
                             f"of {', '.join(LAYOUTS)}")
    nhwc = [name for name in LAYOUT_FLAGS if getattr(config, name) == "NHWC"]
    if nhwc:
        notes.append(" ".join(f"--{n.replace('_', '-')} NHWC" for n in nhwc) + ": NVIDIA's "
                     "channels-last GPU layouts; the network keeps NCHW")
    fused = [flag for flag, value in (("--fuse-bn-relu", config.fuse_bn_relu),
                                      ("--fuse-bn-add-relu", config.fuse_bn_add_relu)) if value]
    if fused:
        notes.append(" ".join(f"{flag} 1" for flag in fused) + ": fused BatchNorm kernels of "
                     "NVIDIA's MXNet container, not in MXNet 1.9.1; BatchNorm and ReLU stay apart")
    if config.data_backend is not None:
        if config.data_backend not in DATA_BACKENDS:
            raise ValueError(f"--data-backend {config.data_backend!r} is not supported: choose "
                             f"one of {', '.join(DATA_BACKENDS)}")
        if config.data_backend == "synthetic":
            settings["benchmark"] = 1
        elif config.data_backend.startswith("dali"):
            notes.append(f"--data-backend {config.data_backend}: no DALI here; the .rec files "
                         "are read by MXNet's ImageRecordIter")
    if config.image_shape and config.image_shape[0] == 4:
        settings["image_shape"] = (3, *config.image_shape[1:])
        notes.append(f"--image-shape {','.join(map(str, config.image_shape))}: NVIDIA pads the "
                     "images to 4 channels for its NHWC kernels; the network takes 3")
    return settings, notes


def resolve_nvidia_flags(config):
    """``config`` with NVIDIA's flags turned into mxfp16's settings, and the notes to log.

    Raises
    ------
    ValueError
        For an unknown ``--arch``, layout or data backend, or ``--arch`` with ``--network``.
    """
    settings, notes = _network(config)
    more, more_notes = _devices_and_data(config)
    return dataclasses.replace(config, **settings, **more), notes + more_notes
