"""scripts/prepare_data.py and mxfp16.train.prepare, end to end on real JPEG files."""
import os
import re
import shutil

import mxnet as mx
import numpy as np
import pytest

from mxfp16.train import prepare
from mxfp16.train.data import DataError

from conftest import IMAGE_CLASSES, IMAGE_HEIGHT, IMAGE_WIDTH, write_image_folder

OUTPUT_FILES = ["classes.txt", "train.idx", "train.lst", "train.rec", "val.idx", "val.lst", "val.rec"]


@pytest.fixture
def prepare_main(script_main):
    return script_main("prepare_data")


@pytest.fixture
def dirty_folder(image_folder, tmp_path):
    """The image folder plus a corrupt JPEG and a text file."""
    root = tmp_path / "images"
    shutil.copytree(image_folder, root)
    (root / "red" / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0" + bytes(range(256)) * 2)
    (root / "green" / "notes.txt").write_text("not an image")
    return root


def read_records(prefix):
    """[(label, image)] of every record of ``prefix.rec``, in key order."""
    record = mx.recordio.MXIndexedRecordIO(f"{prefix}.idx", f"{prefix}.rec", "r")
    try:
        return [mx.recordio.unpack_img(record.read_idx(key))[:2] for key in sorted(record.keys)]
    finally:
        record.close()


def read_list(path):
    """[(key, label, relative path)] of a .lst file."""
    with open(path) as lines:
        return [(int(key), float(label), name) for key, label, name in
                (line.rstrip("\n").split("\t") for line in lines)]


def test_main_writes_records_and_skips_bad_files(prepare_main, dirty_folder, tmp_path, capsys, caplog):
    out_dir = tmp_path / "out"
    assert prepare_main([str(dirty_folder), str(out_dir), "--train-ratio", "0.75"]) == 0
    summary = capsys.readouterr().out.strip()
    match = re.fullmatch(r"wrote (\d+) train \+ (\d+) val images in 4 classes to (.+) "
                         r"\(2 skipped: green/notes.txt, red/broken.jpg\)", summary)
    assert match, summary
    num_train, num_val = int(match[1]), int(match[2])
    assert num_train + num_val == 48 and num_val == 12
    assert match[3] == str(out_dir)
    assert sorted(os.listdir(out_dir)) == OUTPUT_FILES
    assert (out_dir / "classes.txt").read_text().split() == sorted(IMAGE_CLASSES)
    assert "broken.jpg" in caplog.text and "notes.txt" in caplog.text
    for split, count in (("train", num_train), ("val", num_val)):
        entries = read_list(out_dir / f"{split}.lst")
        records = read_records(out_dir / split)
        assert len(entries) == len(records) == count
        for (key, label, name), (header, image) in zip(entries, records):
            assert header.label == label == sorted(IMAGE_CLASSES).index(name.split("/")[0])
            assert header.id == key and image.shape == (IMAGE_HEIGHT, IMAGE_WIDTH, 3)


def test_records_keep_the_class_colour(rec_files):
    """The stored JPEGs decode to the class colour (BGR), so labels and pixels belong together."""
    for header, image in read_records(rec_files.train_rec[:-4]):
        colour = IMAGE_CLASSES[rec_files.classes[int(header.label)]]
        assert np.abs(image.reshape(-1, 3).mean(axis=0) - colour).max() < 15


def test_split_is_seeded_and_stratified(image_folder, tmp_path):
    runs = [prepare.prepare_dataset(str(image_folder), str(tmp_path / name), train_ratio=0.75, seed=seed)
            for name, seed in (("a", 1), ("b", 1), ("c", 2))]
    lists = [(tmp_path / name / "train.lst").read_text() for name in "abc"]
    assert lists[0] == lists[1] != lists[2]
    val_names = [name for _, _, name in read_list(tmp_path / "a" / "val.lst")]
    assert sorted(name.split("/")[0] for name in val_names) == sorted(list(IMAGE_CLASSES) * 3)
    assert all(run.num_train == 36 and run.num_val == 12 for run in runs)


def test_resize_sets_the_shorter_side(image_folder, tmp_path):
    prepared = prepare.prepare_dataset(str(image_folder), str(tmp_path), resize=20, train_ratio=1.0)
    assert (prepared.num_train, prepared.num_val) == (48, 0)
    assert {image.shape for _, image in read_records(tmp_path / "train")} == {(20, 24, 3)}
    assert os.path.getsize(prepared.val_rec) == 0


def test_train_and_val_folders_are_the_split(tmp_path, prepare_main, capsys):
    write_image_folder(tmp_path / "images" / "train", images_per_class=3)
    write_image_folder(tmp_path / "images" / "val", images_per_class=2, seed=1)
    assert prepare_main([str(tmp_path / "images"), str(tmp_path / "out"), "--train-ratio", "0.5"]) == 0
    assert capsys.readouterr().out.startswith("wrote 12 train + 8 val images in 4 classes")
    names = [name for _, _, name in read_list(tmp_path / "out" / "val.lst")]
    assert all(name.startswith("val/") for name in names)


def _empty_folder(tmp_path):
    (tmp_path / "in").mkdir()
    return tmp_path / "in", "no class sub-folders"


def _class_without_images(tmp_path):
    write_image_folder(tmp_path / "in", images_per_class=2)
    (tmp_path / "in" / "empty").mkdir()
    (tmp_path / "in" / "empty" / "readme.txt").write_text("no images here")
    return tmp_path / "in", "empty' has no images"


def _val_without_a_class(tmp_path):
    write_image_folder(tmp_path / "in" / "train", images_per_class=2)
    write_image_folder(tmp_path / "in" / "val", images_per_class=2)
    shutil.rmtree(tmp_path / "in" / "val" / "red")
    return tmp_path / "in", "missing: ['red']"


@pytest.mark.parametrize("make_input, extra_args", [
    (lambda tmp_path: (tmp_path / "missing", "not found"), []),
    (_empty_folder, []),
    (_class_without_images, []),
    (_val_without_a_class, []),
    (lambda tmp_path: (write_image_folder(tmp_path / "in", 2), "train ratio must be in (0, 1]"),
     ["--train-ratio", "1.5"]),
    (lambda tmp_path: (write_image_folder(tmp_path / "in", 2), "quality must be"), ["--quality", "0"]),
], ids=["missing", "empty", "class-without-images", "val-without-a-class", "bad-ratio", "bad-quality"])
def test_bad_input_is_one_error_line_and_keeps_outputs(make_input, extra_args, prepare_main, tmp_path,
                                                       capsys):
    root, expected = make_input(tmp_path)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    (out_dir / "train.rec").write_bytes(b"previous result")
    assert prepare_main([str(root), str(out_dir)] + extra_args) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and error.startswith("error: ") and expected in error, error
    assert sorted(os.listdir(out_dir)) == ["train.rec"]
    assert (out_dir / "train.rec").read_bytes() == b"previous result"


def test_failure_while_writing_keeps_previous_outputs(image_folder, tmp_path, monkeypatch, prepare_main,
                                                      capsys):
    out_dir = tmp_path / "out"
    assert prepare_main([str(image_folder), str(out_dir)]) == 0
    before = {name: (out_dir / name).read_bytes() for name in OUTPUT_FILES}
    calls = []

    def pack_then_fail(header, image, **kwargs):
        calls.append(1)
        if len(calls) > 40:
            raise OSError(28, "No space left on device")
        return original_pack(header, image, **kwargs)

    original_pack = mx.recordio.pack_img
    monkeypatch.setattr(mx.recordio, "pack_img", pack_then_fail)
    assert prepare_main([str(image_folder), str(out_dir), "--seed", "5"]) == 2
    assert "No space left on device" in capsys.readouterr().err
    assert {name: (out_dir / name).read_bytes() for name in os.listdir(out_dir)} == before


def test_no_decodable_image_is_an_error(tmp_path):
    (tmp_path / "in" / "cat").mkdir(parents=True)
    (tmp_path / "in" / "cat" / "fake.jpg").write_text("not a JPEG")
    with pytest.raises(DataError, match="none of the images"):
        prepare.prepare_dataset(str(tmp_path / "in"), str(tmp_path / "out"))
    assert os.listdir(tmp_path / "out") == []


def test_summary_names_at_most_five_skipped_files():
    skipped = tuple((f"c/{i}.txt", "not an image file") for i in range(7))
    prepared = prepare.PreparedData("out", ("c",), 3, 1, skipped)
    assert prepared.summary() == (
        "wrote 3 train + 1 val images in 1 classes to out (7 skipped: "
        "c/0.txt, c/1.txt, c/2.txt, c/3.txt, c/4.txt and 2 more (see the log))")
