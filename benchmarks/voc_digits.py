"""Write the digits detection set (``examples/common.py``'s ``digit_detection_set``) in Pascal VOC's
layout, so that GluonCV's training scripts read it as VOC, unchanged: a learnable task on which a
float16 run of ``train_ssd.py --amp`` / ``train_yolo3.py --amp`` can be compared with float32 by
the VOC07 mAP the scripts print.

Layout, under ``--root`` (the folder GluonCV's ``VOCDetection`` reads, by default
``~/.mxnet/datasets/voc``)::

    VOC2007/JPEGImages/<id>.jpg   VOC2007/Annotations/<id>.xml   VOC2007/ImageSets/Main/{trainval,test}.txt
    VOC2012/JPEGImages/<id>.jpg   VOC2012/Annotations/<id>.xml   VOC2012/ImageSets/Main/trainval.txt

GluonCV's scripts train on ``(2007, 'trainval')`` + ``(2012, 'trainval')`` and validate on
``(2007, 'test')``: the --num-train training images are split between the two trainval lists (even
indices in 2007, odd in 2012), the --num-test test images (unseen digits, on other canvases) go to
2007's test list.

Class names: the scripts take VOC's 20 class names from ``VOCDetection.CLASSES`` and the
annotations must use them, so digit ``d`` is written under VOC's ``d``-th class name (digits 0-9
are ``aeroplane``, ``bicycle``, ``bird``, ``boat``, ``bottle``, ``bus``, ``car``, ``cat``,
``chair``, ``cow``); the other ten classes have no objects, and GluonCV's ``VOC07MApMetric`` leaves
them out of the mean (their AP is NaN).  Boxes use VOC's 1-based inclusive pixel coordinates.

The images are JPEGs (quality 95) of ``--size`` pixels a side.  The same arguments give the same
files.  An existing VOC folder is never overwritten: the script refuses a ``--root`` that already
holds ``VOC2007`` or ``VOC2012``.

Usage: python benchmarks/voc_digits.py --root DIR [--num-train 400] [--num-test 100] [--size 128]
       [--quick]
"""
import argparse
import importlib.util
import os
import sys
from xml.sax.saxutils import escape

import numpy as np

EXAMPLES_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")

#: VOC's class names in GluonCV's order (``gluoncv.data.VOCDetection.CLASSES``); digit d is the
#: d-th.  Kept here so that the check below can name the ones used without importing GluonCV.
VOC_CLASSES = ('aeroplane', 'bicycle', 'bird', 'boat', 'bottle', 'bus', 'car', 'cat', 'chair',
               'cow', 'diningtable', 'dog', 'horse', 'motorbike', 'person', 'pottedplant',
               'sheep', 'sofa', 'train', 'tvmonitor')

#: The VOC class name each digit 0-9 is written under.
DIGIT_AS_VOC = VOC_CLASSES[:10]


def digit_detection_set(num_images, size, seed, split, max_digits=3):
    """``examples/common.py``'s generator (the examples' folder on ``sys.path`` for its imports)."""
    if EXAMPLES_DIR not in sys.path:
        sys.path.insert(0, EXAMPLES_DIR)
    spec = importlib.util.spec_from_file_location("mxfp16_examples_common",
                                                  os.path.join(EXAMPLES_DIR, "common.py"))
    common = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(common)
    return common.digit_detection_set(num_images, size, seed=seed, split=split,
                                      max_digits=max_digits)


def annotation_xml(folder, image_id, size, rows):
    """A VOC annotation: ``rows`` of ``xmin, ymin, xmax, ymax, digit`` in 0-based pixels, the
    right/bottom edges exclusive (the generator's boxes), written 1-based inclusive as VOC does.

    >>> xml = annotation_xml("VOC2007", "000001", 64, np.array([[2, 3, 10, 12, 7], [-1] * 5]))
    >>> "<name>cat</name>" in xml, "<xmin>3</xmin>" in xml, "<xmax>10</xmax>" in xml
    (True, True, True)
    >>> xml.count("<object>")
    1
    """
    objects = []
    for xmin, ymin, xmax, ymax, digit in rows:
        if digit < 0:
            continue
        objects.append(
            "  <object>\n"
            f"    <name>{escape(DIGIT_AS_VOC[int(digit)])}</name>\n"
            "    <pose>Unspecified</pose>\n    <truncated>0</truncated>\n"
            "    <difficult>0</difficult>\n"
            "    <bndbox>\n"
            f"      <xmin>{int(xmin) + 1}</xmin>\n      <ymin>{int(ymin) + 1}</ymin>\n"
            f"      <xmax>{int(xmax)}</xmax>\n      <ymax>{int(ymax)}</ymax>\n"
            "    </bndbox>\n  </object>\n")
    return ("<annotation>\n"
            f"  <folder>{folder}</folder>\n  <filename>{image_id}.jpg</filename>\n"
            f"  <size>\n    <width>{size}</width>\n    <height>{size}</height>\n"
            "    <depth>3</depth>\n  </size>\n  <segmented>0</segmented>\n"
            + "".join(objects) + "</annotation>\n")


def write_split(root, year, image_set, ids, images, labels, size):
    """Write the images, their annotations and the ImageSets list of one (year, image set)."""
    import cv2  # GluonCV's own image library; PIL's JPEG encoder failed in the full test run

    base = os.path.join(root, f"VOC{year}")
    for sub in ("JPEGImages", "Annotations", os.path.join("ImageSets", "Main")):
        os.makedirs(os.path.join(base, sub), exist_ok=True)
    for image_id, image, rows in zip(ids, images, labels):
        pixels = np.clip(np.round(image.transpose(1, 2, 0) * 255), 0, 255).astype(np.uint8)
        path = os.path.join(base, "JPEGImages", f"{image_id}.jpg")
        if not cv2.imwrite(path, pixels[:, :, ::-1], [cv2.IMWRITE_JPEG_QUALITY, 95]):  # BGR
            raise OSError(f"could not write {path}")
        with open(os.path.join(base, "Annotations", f"{image_id}.xml"), "w") as xml_file:
            xml_file.write(annotation_xml(f"VOC{year}", image_id, size, rows))
    with open(os.path.join(base, "ImageSets", "Main", f"{image_set}.txt"), "w") as list_file:
        list_file.write("".join(f"{image_id}\n" for image_id in ids))


def write_voc(root, num_train, num_test, size):
    """Write the set under ``root``; returns ``{(year, image_set): number of images}``."""
    train_images, train_labels = digit_detection_set(num_train, size, seed=0, split="train")
    test_images, test_labels = digit_detection_set(num_test, size, seed=1, split="test")
    train_ids = [f"{index:06d}" for index in range(num_train)]
    test_ids = [f"{num_train + index:06d}" for index in range(num_test)]
    counts = {}
    for year, part in ((2007, slice(0, None, 2)), (2012, slice(1, None, 2))):
        write_split(root, year, "trainval", train_ids[part], train_images[part],
                    train_labels[part], size)
        counts[(year, "trainval")] = len(train_ids[part])
    write_split(root, 2007, "test", test_ids, test_images, test_labels, size)
    counts[(2007, "test")] = num_test
    return counts


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", required=True,
                        help="folder to write VOC2007/ and VOC2012/ into (GluonCV reads "
                             "~/.mxnet/datasets/voc)")
    parser.add_argument("--num-train", type=int, default=400)
    parser.add_argument("--num-test", type=int, default=100)
    parser.add_argument("--size", type=int, default=128, help="image side in pixels")
    parser.add_argument("--quick", action="store_true", help="4 training, 2 test images of 64 px")
    args = parser.parse_args(argv)
    if args.quick:
        args.num_train, args.num_test, args.size = 4, 2, 64
    if args.num_train < 2 or args.num_test < 1:
        print(f"error: --num-train {args.num_train} --num-test {args.num_test}: need at least 2 "
              "training images (one per trainval list) and 1 test image; pass larger values",
              file=sys.stderr)
        return 2
    if args.size < 32:
        print(f"error: --size {args.size}: digits need at least 32 pixels a side; pass --size 32 "
              "or more", file=sys.stderr)
        return 2
    existing = [name for name in ("VOC2007", "VOC2012")
                if os.path.exists(os.path.join(args.root, name))]
    if existing:
        print(f"error: --root {args.root} already holds {', '.join(existing)}; it is never "
              "overwritten: pass an empty or new folder", file=sys.stderr)
        return 2
    counts = write_voc(args.root, args.num_train, args.num_test, args.size)
    for (year, image_set), count in counts.items():
        print(f"VOC{year} {image_set}: {count} images")
    print("classes: " + ", ".join(f"{digit}={name}" for digit, name in enumerate(DIGIT_AS_VOC)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
