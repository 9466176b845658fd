"""Training augmentation with the meanings of MXNet's example flags, for RecordIO and image folders.

One :class:`Augmentation` describes a run's training augmentation in the terms of MXNet's
``ImageRecordIter`` (``src/io/image_aug_default.cc``), the parameters the example's
``--random-crop``, ``--max-random-h``, ``--pad-size``, ... set.  RecordIO files pass it straight to
``ImageRecordIter`` (:func:`record_train_params`); image folders apply the same steps in the same
order with OpenCV and Gluon transforms (:class:`FolderAugmenter`).

Two recipes: :data:`IMAGENET_RECIPE` (train_imagenet.py: random resized crop, mirror, colour jitter)
and :data:`FINE_TUNE_RECIPE` (fine_tune.py: MXNet's fine-tuning level 1, a random crop and a mirror
of the image resized to the validation size).  Flags given on the command line override single
settings of the recipe (:func:`with_overrides`).
"""
import dataclasses
import math
from dataclasses import dataclass

import cv2
import mxnet as mx
import numpy as np
from mxnet.gluon.data.vision import transforms

from .base import COLOR_JITTER, CROP_ASPECT_RATIOS, IMAGENET_MEAN_RGB, IMAGENET_STD_RGB, MIN_CROP_AREA


@dataclass(frozen=True)
class Augmentation:
    """Training augmentation, field by field the flag of MXNet's example (``--random-crop`` ->
    ``random_crop``) and the ``ImageRecordIter`` parameter it sets.

    ``resize`` (> 0) resizes the shorter side before cropping (``ImageRecordIter``'s ``resize``).
    Without ``random_resized_crop``, ``max_random_aspect_ratio`` is the largest change of the aspect
    ratio (``[1 - a, 1 + a]``) unless ``min_random_aspect_ratio`` is given, as in MXNet.
    """

    random_crop: int = 0
    random_mirror: int = 1
    random_resized_crop: int = 1
    min_random_area: float = MIN_CROP_AREA
    max_random_area: float = 1.0
    min_random_aspect_ratio: float = CROP_ASPECT_RATIOS[0]
    max_random_aspect_ratio: float = CROP_ASPECT_RATIOS[1]
    max_random_h: int = 0
    max_random_s: int = 0
    max_random_l: int = 0
    brightness: float = COLOR_JITTER
    contrast: float = COLOR_JITTER
    saturation: float = COLOR_JITTER
    pca_noise: float = 0.0
    max_random_rotate_angle: int = 0
    max_random_shear_ratio: float = 0.0
    max_random_scale: float = 1.0
    min_random_scale: float = 1.0
    pad_size: int = 0
    fill_value: int = 127
    rgb_mean: tuple = IMAGENET_MEAN_RGB
    rgb_std: tuple = IMAGENET_STD_RGB
    min_crop_size: int = -1
    max_crop_size: int = -1
    resize: int = -1


#: train_imagenet.py's recipe (GluonCV's ImageNet recipe without PCA lighting).
IMAGENET_RECIPE = Augmentation()

#: The crop settings of MXNet's example when ``random_resized_crop`` is off.
_PLAIN_CROP = dict(random_resized_crop=0, min_random_area=1.0, max_random_area=1.0,
                   min_random_aspect_ratio=None, max_random_aspect_ratio=0.0)

#: fine_tune.py's recipe: MXNet's ``set_data_aug_level(parser, 1)`` (random crop, mirror), no
#: colour jitter; the image is first resized to the validation size (256 for 224).
FINE_TUNE_RECIPE = dataclasses.replace(IMAGENET_RECIPE, random_crop=1, brightness=0.0,
                                       contrast=0.0, saturation=0.0, **_PLAIN_CROP)

#: train_cifar10.py's recipe: MXNet's ``set_data_aug_level(parser, 2)`` (random crop, mirror,
#: hue/saturation/lightness jitter 36/50/50) on images padded by 4 pixels.
CIFAR_RECIPE = dataclasses.replace(FINE_TUNE_RECIPE, max_random_h=36, max_random_s=50,
                                   max_random_l=50, pad_size=4)

#: Flags of the augmentation (every field but ``resize``).
AUGMENTATION_FLAGS = tuple(f.name for f in dataclasses.fields(Augmentation) if f.name != "resize")


def with_overrides(recipe, **explicit):
    """``recipe`` with the settings given on the command line (``None``: not given).

    Turning a crop on switches the crop settings: ``random_resized_crop=1`` takes the ImageNet
    recipe's area and aspect ranges, ``random_crop=1`` alone MXNet's plain crop (no resized crop);
    the other settings given override single fields.

    Examples
    --------
    >>> aug = with_overrides(IMAGENET_RECIPE, random_crop=1, max_random_h=36, brightness=None)
    >>> aug.random_resized_crop, aug.max_random_aspect_ratio, aug.max_random_h, aug.brightness
    (0, 0.0, 36, 0.4)
    """
    given = {name: value for name, value in explicit.items() if value is not None}
    if given.get("random_resized_crop"):
        crop = {name: getattr(IMAGENET_RECIPE, name) for name in _PLAIN_CROP}
        recipe = dataclasses.replace(recipe, **crop)
    elif given.get("random_crop") and "random_resized_crop" not in given:
        recipe = dataclasses.replace(recipe, **_PLAIN_CROP)
    return check_augmentation(dataclasses.replace(recipe, **given))


def check_augmentation(aug):
    """``aug``, or ``ValueError`` naming the flag out of range."""
    limits = dict(max_random_h=(0, 180), max_random_s=(0, 255), max_random_l=(0, 255),
                  max_random_rotate_angle=(0, 360), max_random_shear_ratio=(0, 1),
                  min_random_area=(0, 1), max_random_area=(0, 1), pad_size=(0, 10000),
                  fill_value=(0, 255), brightness=(0, 10), contrast=(0, 10), saturation=(0, 10),
                  pca_noise=(0, 10))
    for name, (low, high) in limits.items():
        if not low <= getattr(aug, name) <= high:
            raise ValueError(f"--{name.replace('_', '-')} must be in [{low}, {high}], got "
                             f"{getattr(aug, name)}")
    if aug.min_random_area > aug.max_random_area or aug.min_random_scale > aug.max_random_scale:
        raise ValueError("need --min-random-area <= --max-random-area and --min-random-scale <= "
                         f"--max-random-scale, got {aug.min_random_area}, {aug.max_random_area}, "
                         f"{aug.min_random_scale}, {aug.max_random_scale}")
    if len(aug.rgb_mean) != 3 or len(aug.rgb_std) != 3 or min(aug.rgb_std) <= 0:
        raise ValueError(f"--rgb-mean and --rgb-std take three numbers (R,G,B; std > 0), got "
                         f"{aug.rgb_mean} and {aug.rgb_std}: e.g. --rgb-std 58.393,57.12,57.375")
    return aug


def recipe_of(augmentation, jitter, lighting, mean_rgb, std_rgb):
    """``augmentation``, or the ImageNet recipe with these jitter, lighting and normalisation."""
    if augmentation is not None:
        return augmentation
    return dataclasses.replace(IMAGENET_RECIPE, brightness=jitter, contrast=jitter,
                               saturation=jitter, pca_noise=lighting, rgb_mean=tuple(mean_rgb),
                               rgb_std=tuple(std_rgb))


def aspect_range(aug):
    """``(min, max)`` aspect ratio (width / height) of the crops, MXNet's rule."""
    if aug.min_random_aspect_ratio is not None:
        return aug.min_random_aspect_ratio, aug.max_random_aspect_ratio or aug.min_random_aspect_ratio
    return 1.0 - aug.max_random_aspect_ratio, 1.0 + aug.max_random_aspect_ratio


def record_train_params(aug):
    """The ``mx.io.ImageRecordIter`` parameters of ``aug`` (training).

    Examples
    --------
    >>> params = record_train_params(IMAGENET_RECIPE)
    >>> params['random_resized_crop'], params['min_random_area'], params['rand_mirror']
    (1, 0.08, 1)
    """
    low, high = aspect_range(aug)
    params = dict(rand_crop=aug.random_crop, rand_mirror=aug.random_mirror,
                  random_resized_crop=aug.random_resized_crop,
                  min_random_area=aug.min_random_area, max_random_area=aug.max_random_area,
                  random_h=aug.max_random_h, random_s=aug.max_random_s, random_l=aug.max_random_l,
                  brightness=aug.brightness, contrast=aug.contrast, saturation=aug.saturation,
                  pca_noise=aug.pca_noise, max_rotate_angle=aug.max_random_rotate_angle,
                  max_shear_ratio=aug.max_random_shear_ratio, max_random_scale=aug.max_random_scale,
                  min_random_scale=aug.min_random_scale, pad=aug.pad_size,
                  fill_value=aug.fill_value, min_crop_size=aug.min_crop_size,
                  max_crop_size=aug.max_crop_size, **mean_std_params(aug.rgb_mean, aug.rgb_std))
    if aug.random_resized_crop:
        params.update(min_aspect_ratio=low, max_aspect_ratio=high)
    elif aug.min_random_aspect_ratio is not None:
        params.update(min_aspect_ratio=low, max_aspect_ratio=high)
    else:
        params.update(max_aspect_ratio=aug.max_random_aspect_ratio)
    if aug.resize > 0:
        params["resize"] = aug.resize
    return params


def mean_std_params(mean_rgb, std_rgb):
    """``ImageRecordIter``'s ``mean_r`` ... ``std_b`` parameters."""
    return dict(mean_r=mean_rgb[0], mean_g=mean_rgb[1], mean_b=mean_rgb[2],
                std_r=std_rgb[0], std_g=std_rgb[1], std_b=std_rgb[2])


class FolderAugmenter:
    """``aug`` applied to one RGB HWC uint8 image (an ``NDArray``) of an image folder, in the order
    of MXNet's default augmenter: resize, rotate/shear/scale/aspect, pad, crop, HSL, mirror, then
    brightness/contrast/saturation and PCA noise (Gluon transforms); returns the float32 CHW tensor
    normalised by ``rgb_mean``/``rgb_std``."""

    def __init__(self, aug, image_shape):
        self.aug = aug
        self.height, self.width = image_shape[1:]
        color = []
        if aug.brightness or aug.contrast or aug.saturation:
            color.append(transforms.RandomColorJitter(brightness=aug.brightness,
                                                      contrast=aug.contrast,
                                                      saturation=aug.saturation))
        if aug.pca_noise:
            color.append(transforms.RandomLighting(aug.pca_noise))
        self.finish = transforms.Compose(color + normalised_tensor(aug.rgb_mean, aug.rgb_std))

    def __call__(self, image):
        pixels = image.asnumpy()
        for step in (self._resize, self._affine, self._pad, self._crop, self._hsl, self._mirror):
            pixels = step(pixels)
        return self.finish(mx.nd.array(np.ascontiguousarray(pixels), dtype="uint8"))

    def _resize(self, pixels):
        if self.aug.resize <= 0:
            return pixels
        height, width = pixels.shape[:2]
        scale = self.aug.resize / min(height, width)
        return cv2.resize(pixels, (max(round(width * scale), 1), max(round(height * scale), 1)))

    def _affine(self, pixels):
        aug = self.aug
        low, high = aspect_range(aug)
        if not (aug.max_random_rotate_angle or aug.max_random_shear_ratio or
                aug.max_random_scale != 1 or aug.min_random_scale != 1 or
                (not aug.random_resized_crop and (low, high) != (1.0, 1.0))):
            return pixels
        angle = np.deg2rad(np.random.uniform(-1, 1) * aug.max_random_rotate_angle)
        shear = np.random.uniform(-1, 1) * aug.max_random_shear_ratio
        scale = np.random.uniform(aug.min_random_scale, aug.max_random_scale)
        ratio = 1.0 if aug.random_resized_crop else np.random.uniform(low, high)
        sx, sy = scale * math.sqrt(ratio), scale / math.sqrt(ratio)
        height, width = pixels.shape[:2]
        out_w, out_h = max(int(round(width * sx)), 1), max(int(round(height * sy)), 1)
        rotate = np.array([[math.cos(angle), -math.sin(angle)], [math.sin(angle), math.cos(angle)]])
        matrix = rotate @ np.array([[1.0, shear], [0.0, 1.0]]) @ np.diag([sx, sy])
        centre_in, centre_out = np.array([width, height]) / 2.0, np.array([out_w, out_h]) / 2.0
        warp = np.hstack([matrix, (centre_out - matrix @ centre_in)[:, None]])
        fill = (aug.fill_value,) * 3
        return cv2.warpAffine(pixels, warp, (out_w, out_h), borderMode=cv2.BORDER_CONSTANT,
                              borderValue=fill)

    def _pad(self, pixels):
        size = self.aug.pad_size
        if not size:
            return pixels
        return cv2.copyMakeBorder(pixels, size, size, size, size, cv2.BORDER_CONSTANT,
                                  value=(self.aug.fill_value,) * 3)

    def _crop(self, pixels):
        aug, (height, width) = self.aug, pixels.shape[:2]
        if aug.random_resized_crop:
            return self._resized_crop(pixels)
        if aug.min_crop_size > 0 or aug.max_crop_size > 0:
            low = aug.min_crop_size if aug.min_crop_size > 0 else min(self.height, self.width)
            high = aug.max_crop_size if aug.max_crop_size > 0 else min(height, width)
            side = min(np.random.randint(low, max(high, low) + 1), height, width)
            crop_h = crop_w = side
        else:
            crop_h, crop_w = min(self.height, height), min(self.width, width)
        if aug.random_crop:
            top = np.random.randint(0, height - crop_h + 1)
            left = np.random.randint(0, width - crop_w + 1)
        else:
            top, left = (height - crop_h) // 2, (width - crop_w) // 2
        return self._fit(pixels[top:top + crop_h, left:left + crop_w])

    def _resized_crop(self, pixels):
        aug, (height, width) = self.aug, pixels.shape[:2]
        low, high = aspect_range(aug)
        for _ in range(10):
            area = height * width * np.random.uniform(aug.min_random_area, aug.max_random_area)
            ratio = math.exp(np.random.uniform(math.log(low), math.log(high)))
            crop_w, crop_h = int(round(math.sqrt(area * ratio))), int(round(math.sqrt(area / ratio)))
            if 0 < crop_w <= width and 0 < crop_h <= height:
                top = np.random.randint(0, height - crop_h + 1)
                left = np.random.randint(0, width - crop_w + 1)
                return self._fit(pixels[top:top + crop_h, left:left + crop_w])
        side = min(height, width)
        top, left = (height - side) // 2, (width - side) // 2
        return self._fit(pixels[top:top + side, left:left + side])

    def _fit(self, pixels):
        if pixels.shape[:2] == (self.height, self.width):
            return pixels
        return cv2.resize(pixels, (self.width, self.height), interpolation=cv2.INTER_LINEAR)

    def _hsl(self, pixels):
        aug = self.aug
        if not (aug.max_random_h or aug.max_random_s or aug.max_random_l):
            return pixels
        hls = cv2.cvtColor(pixels, cv2.COLOR_RGB2HLS).astype(np.int32)
        shifts = [np.random.randint(-limit, limit + 1) if limit else 0
                  for limit in (aug.max_random_h, aug.max_random_l, aug.max_random_s)]
        hls[..., 0] = (hls[..., 0] + shifts[0]) % 180
        hls[..., 1:] = np.clip(hls[..., 1:] + np.array(shifts[1:]), 0, 255)
        return cv2.cvtColor(hls.astype(np.uint8), cv2.COLOR_HLS2RGB)

    def _mirror(self, pixels):
        return pixels[:, ::-1] if self.aug.random_mirror and np.random.rand() < 0.5 else pixels


def normalised_tensor(mean_rgb, std_rgb):
    """HWC uint8 -> CHW float32, normalised as ImageRecordIter does (ToTensor divides by 255)."""
    return [transforms.ToTensor(),
            transforms.Normalize([m / 255.0 for m in mean_rgb], [s / 255.0 for s in std_rgb])]
