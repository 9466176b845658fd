"""NVIDIA's MXNet ResNet-50 flags (mxfp16.train.cli.nvidia_compat): what each becomes, and one error line
for what cannot be honoured.  The runner's full command under Horovod is in tests/test_horovod.py."""
import pytest

from mxfp16.train.cli.config import TrainConfig


def checked(**settings):
    return TrainConfig(**settings).checked()


@pytest.mark.parametrize("arch, layers, network", [
    ("resnetv15", None, "resnet50_v1b"), ("resnetv1", 18, "resnet18_v1"),
    ("resnextv1", 101, "resnext101_32x4d")])
def test_arch_and_num_layers_name_the_zoo_network(arch, layers, network):
    config = checked(arch=arch, num_layers=layers)
    assert config.network == network
    assert f"--arch {arch} --num-layers {layers or 50} is the model zoo's {network}" in \
        config.notes[0]


def test_gpu_only_flags_are_noted_and_the_run_keeps_its_own_layout():
    config = checked(image_shape=(4, 224, 224), conv_layout="NHWC", batchnorm_layout="NHWC",
                     fuse_bn_relu=1, data_backend="dali-gpu")
    assert config.image_shape == (3, 224, 224)
    notes = " | ".join(config.notes)
    for words in ("--conv-layout NHWC --batchnorm-layout NHWC: NVIDIA's channels-last GPU "
                  "layouts; the network keeps NCHW", "--fuse-bn-relu 1: fused BatchNorm",
                  "--data-backend dali-gpu: no DALI here", "--image-shape 4,224,224: NVIDIA pads"):
        assert words in notes


def test_synthetic_data_backend_is_benchmark_1():
    assert checked(data_backend="synthetic", data_train="x.rec").synthetic


@pytest.mark.parametrize("settings, words", [
    ({"arch": "xception"}, "--arch 'xception' is not supported: choose one of resnetv1"),
    ({"arch": "resnetv1", "network": "vgg16"}, "--arch resnetv1 and --network vgg16 both name"),
    ({"conv_layout": "NCWH"}, "--conv-layout 'NCWH' is not a layout: choose one of NCHW, NHWC"),
    ({"data_backend": "dali"}, "--data-backend 'dali' is not supported: choose one of dali-gpu"),
])
def test_flags_that_cannot_be_honoured_are_one_error(settings, words):
    with pytest.raises(ValueError, match=words.replace("(", r"\(")):
        checked(**settings)


def test_nvidia_command_without_arch_trains_nvidias_default_resnet_v1_5():
    assert checked(data_backend="mxnet").network == "resnet50_v1b"
    assert checked(data_backend="mxnet", network="vgg16").network == "vgg16"
