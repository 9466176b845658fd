"""mxfp16.train.data.augmentation: the example's augmentation flags as ImageRecordIter parameters,
and the same steps on image folders."""
import mxnet as mx
import numpy as np
import pytest

from mxfp16.train.data.augmentation import (CIFAR_RECIPE, FINE_TUNE_RECIPE, IMAGENET_RECIPE,
                                            FolderAugmenter, record_train_params, with_overrides)


@pytest.mark.parametrize("recipe", [IMAGENET_RECIPE, FINE_TUNE_RECIPE, CIFAR_RECIPE])
def test_every_recipe_makes_normalised_tensors_of_the_input_shape(recipe):
    np.random.seed(0)
    image = mx.nd.array(np.random.randint(0, 255, (40, 48, 3)), dtype="uint8")
    out = FolderAugmenter(recipe, (3, 28, 28))(image)
    assert out.shape == (3, 28, 28) and out.dtype == np.float32
    assert abs(out.mean().asscalar()) < 3


def test_level_3_geometry_and_padding_fill_with_fill_value():
    aug = with_overrides(FINE_TUNE_RECIPE, max_random_rotate_angle=30, max_random_shear_ratio=0.2,
                         max_random_aspect_ratio=0.25, min_random_scale=0.8, pad_size=8,
                         fill_value=255, rgb_std=(255.0, 255.0, 255.0), rgb_mean=(0.0, 0.0, 0.0),
                         random_crop=0, random_mirror=0)
    np.random.seed(1)
    image = mx.nd.zeros((32, 32, 3), dtype="uint8")
    out = FolderAugmenter(aug, (3, 40, 40))(image).asnumpy()
    assert out.shape == (3, 40, 40)
    assert out[:, 0, 0].tolist() == [1.0, 1.0, 1.0] and out[:, 20, 20].tolist() == [0.0, 0.0, 0.0]


def test_crop_sizes_and_hsl_shifts_keep_the_shape():
    aug = with_overrides(FINE_TUNE_RECIPE, min_crop_size=16, max_crop_size=24, max_random_h=36,
                         max_random_s=50, max_random_l=50)
    image = mx.nd.array(np.full((30, 30, 3), 100), dtype="uint8")
    assert FolderAugmenter(aug, (3, 20, 20))(image).shape == (3, 20, 20)


def test_record_parameters_follow_mxnet_names():
    params = record_train_params(with_overrides(IMAGENET_RECIPE, random_crop=1,
                                                max_random_aspect_ratio=0.25, pad_size=4))
    assert (params["rand_crop"], params["random_resized_crop"], params["max_aspect_ratio"],
            params["pad"], "min_aspect_ratio" in params) == (1, 0, 0.25, 4, False)
    with pytest.raises(ValueError, match="--max-random-s must be in"):
        with_overrides(IMAGENET_RECIPE, max_random_s=300)
