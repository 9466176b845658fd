"""mxfp16.train.data: RecordIO, image-folder and synthetic iterators, file checks and label checks."""
import os
import shutil
from collections import Counter

import mxnet as mx
import numpy as np
import pytest

from mxfp16.train.data import (DataError, check_labels, check_record_file, folder_iters, list_image_folder,
                         record_iter, split_image_folder, synthetic_iter)

from conftest import IMAGE_CLASSES, write_image_folder

IMAGE_SHAPE = (3, 32, 32)


def epoch(data_iter):
    """Reset, then [(data, labels, pad)] as numpy for every batch of one epoch."""
    data_iter.reset()
    return [(batch.data[0].asnumpy(), batch.label[0].asnumpy(), batch.pad) for batch in data_iter]


def real_labels(batches):
    """The labels of one epoch without the padding at the end of batches."""
    return np.concatenate([labels[:len(labels) - pad] for _, labels, pad in batches])


def list_labels(path_lst):
    with open(path_lst) as lines:
        return sorted(float(line.split("\t")[1]) for line in lines)


def check_batches(batches, batch_size, num_classes):
    for data, labels, _ in batches:
        assert data.shape == (batch_size,) + IMAGE_SHAPE and data.dtype == np.float32
        assert labels.shape == (batch_size,) and labels.dtype == np.float32
        assert set(labels) <= set(range(num_classes)) and np.isfinite(data).all()


def test_record_iter_train(rec_files):
    train_data = record_iter(rec_files.train_rec, 8, IMAGE_SHAPE, num_threads=1)
    assert train_data.provide_data[0].shape == (8,) + IMAGE_SHAPE
    assert train_data.provide_label[0].shape == (8,)
    for _ in range(3):
        batches = epoch(train_data)
        assert len(batches) in (4, 5)  # round_batch: the last batch takes the next epoch's first
        assert [pad for _, _, pad in batches] == [0] * len(batches)
        check_batches(batches, 8, 4)
    assert abs(np.concatenate([data for data, _, _ in batches]).mean()) < 1.5  # normalised


def test_record_iter_val_reads_every_image_once_per_epoch(rec_files):
    val_data = record_iter(rec_files.val_rec, 5, IMAGE_SHAPE, train=False, num_threads=1)
    first, second = epoch(val_data), epoch(val_data)
    check_batches(first, 5, 4)
    assert [pad for _, _, pad in first] == [0, 0, 3]
    assert sorted(real_labels(first)) == list_labels(rec_files.val_rec[:-4] + ".lst")
    for (data_1, labels_1, _), (data_2, labels_2, _) in zip(first, second):
        np.testing.assert_array_equal(labels_1, labels_2)
        np.testing.assert_allclose(data_1, data_2)  # centre crops: deterministic


def test_record_iter_normalises_to_the_class_colour(rec_files):
    """Red images (label 2) have a high red channel after normalisation, blue ones (0) a low one."""
    data, labels, _ = epoch(record_iter(rec_files.val_rec, 12, IMAGE_SHAPE, train=False))[0]
    red_channel = data[:, 0].mean(axis=(1, 2))
    assert (red_channel[labels == 2] > 1).all() and (red_channel[labels == 0] < -1).all()


@pytest.mark.parametrize("num_parts", [2, 5])
def test_record_iter_parts_cover_every_record_once(rec_files, num_parts):
    labels = []
    for part_index in range(num_parts):
        part = record_iter(rec_files.train_rec, 4, IMAGE_SHAPE, train=False, num_threads=1,
                           num_parts=num_parts, part_index=part_index)
        labels.append(real_labels(epoch(part)))
    assert [len(part) for part in labels] == {2: [18, 18], 5: [8, 8, 8, 8, 4]}[num_parts]
    assert sorted(np.concatenate(labels)) == list_labels(rec_files.train_rec[:-4] + ".lst")


def test_record_iter_empty_part_is_an_error(rec_files):
    with pytest.raises(DataError, match=r"part 4 of 5 .* is empty: the file has 12 records"):
        record_iter(rec_files.val_rec, 4, IMAGE_SHAPE, num_parts=5, part_index=4)


def _remove_idx(rec, idx):
    os.remove(idx)
    return idx


def _remove_rec(rec, idx):
    os.remove(rec)
    return rec


def _truncate_last_record(rec, idx):
    with open(rec, "r+b") as record_file:
        record_file.truncate(os.path.getsize(rec) - 100)
    return rec


def _truncate_half(rec, idx):
    with open(rec, "r+b") as record_file:
        record_file.truncate(os.path.getsize(rec) // 2)
    return rec


def _garbage(rec, idx):
    size = os.path.getsize(rec)
    with open(rec, "wb") as record_file:
        record_file.write(np.random.RandomState(0).bytes(size))
    return rec


def _corrupt_image(rec, idx):
    """Valid RecordIO framing and header, but the JPEG bytes of the first record are zeroed."""
    with open(rec, "r+b") as record_file:
        record_file.seek(8 + 24 + 2)  # RecordIO header, IRHeader, past the JPEG magic
        record_file.write(bytes(600))
    return rec


def _empty_idx(rec, idx):
    open(idx, "w").close()
    return idx


def _malformed_idx(rec, idx):
    with open(idx, "a") as index_file:
        index_file.write("12\tnot-a-number\n")
    return idx


@pytest.mark.parametrize("damage, expected", [
    (_remove_idx, "not found"),
    (_remove_rec, "not found"),
    (_truncate_last_record, "truncated or corrupt"),
    (_truncate_half, "start past its end"),
    (_garbage, "truncated or corrupt"),
    (_corrupt_image, "does not decode as an image"),
    (_empty_idx, "is empty"),
    (_malformed_idx, "line 13 is not 'key<TAB>offset'"),
], ids=["missing-idx", "missing-rec", "truncated-last", "truncated-half", "garbage", "corrupt-image",
        "empty-idx", "malformed-idx"])
def test_damaged_record_files_raise_data_error(rec_files, tmp_path, damage, expected):
    rec, idx = str(tmp_path / "val.rec"), str(tmp_path / "val.idx")
    shutil.copy(rec_files.val_rec, rec)
    shutil.copy(rec_files.val_idx, idx)
    damaged = damage(rec, idx)
    with pytest.raises(DataError, match="prepare_data.py") as error:
        record_iter(rec, 4, IMAGE_SHAPE, train=False)
    assert repr(damaged) in str(error.value) and expected in str(error.value)


def test_check_record_file_counts_records(rec_files):
    assert check_record_file(rec_files.train_rec) == 36
    assert check_record_file(rec_files.val_rec, rec_files.val_idx) == 12


def test_listing_agrees_with_image_folder_dataset(image_folder):
    dataset = mx.gluon.data.vision.ImageFolderDataset(str(image_folder))
    classes, items, non_images = list_image_folder(str(image_folder))
    assert list(classes) == dataset.synsets and list(items) == dataset.items and non_images == ()


def test_folder_split_is_seeded_stratified_and_disjoint(image_folder):
    first, again, other = (split_image_folder(str(image_folder), 0.25, seed) for seed in (3, 3, 4))
    assert first == again and first.val != other.val
    assert not set(first.train) & set(first.val)
    assert len(first.train) + len(first.val) == 48
    assert Counter(label for _, label in first.val) == {label: 3 for label in range(4)}


def test_folder_iters_shapes_and_deterministic_val(image_folder):
    train_data, val_data, classes = folder_iters(str(image_folder), 8, IMAGE_SHAPE, val_fraction=0.25)
    assert classes == tuple(sorted(IMAGE_CLASSES))
    train_batches = epoch(train_data)
    check_batches(train_batches, 8, 4)
    assert len(train_batches) == 5 and train_batches[-1][2] == 4  # 36 = 4 * 8 + 4
    val_batches = epoch(val_data)
    assert [pad for _, _, pad in val_batches] == [0, 4]
    assert Counter(real_labels(val_batches)) == {label: 3 for label in range(4)}
    _, val_again, _ = folder_iters(str(image_folder), 8, IMAGE_SHAPE, val_fraction=0.25)
    for (data_1, labels_1, _), (data_2, labels_2, _) in zip(val_batches, epoch(val_again)):
        np.testing.assert_array_equal(labels_1, labels_2)
        np.testing.assert_allclose(data_1, data_2)


def test_folder_iters_uses_train_and_val_folders(tmp_path):
    write_image_folder(tmp_path / "train", images_per_class=2)
    write_image_folder(tmp_path / "val", images_per_class=1)
    train_data, val_data, classes = folder_iters(str(tmp_path), 4, IMAGE_SHAPE, val_fraction=0.5)
    assert len(real_labels(epoch(train_data))) == 8 and len(real_labels(epoch(val_data))) == 4


def test_folder_iters_without_validation(image_folder):
    _, val_data, _ = folder_iters(str(image_folder), 8, IMAGE_SHAPE, val_fraction=0)
    assert val_data is None


@pytest.mark.parametrize("layout, expected", [
    ({}, "has no class sub-folders"),
    ({"cat/1.jpg": True, "dog/notes.txt": False}, "dog' has no images"),
])
def test_unusable_folders_raise_data_error(tmp_path, layout, expected):
    for name, is_image in layout.items():
        os.makedirs(tmp_path / os.path.dirname(name), exist_ok=True)
        (tmp_path / name).write_bytes(b"\xff\xd8" if is_image else b"text")
    with pytest.raises(DataError, match=expected):
        folder_iters(str(tmp_path), 4, IMAGE_SHAPE)
    with pytest.raises(DataError, match="not found"):
        folder_iters(str(tmp_path / "missing"), 4, IMAGE_SHAPE)


def test_folder_iters_names_an_undecodable_image(tmp_path):
    write_image_folder(tmp_path, images_per_class=1)
    (tmp_path / "red" / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 garbage")
    train_data, _, _ = folder_iters(str(tmp_path), 8, IMAGE_SHAPE, val_fraction=0)
    with pytest.raises(DataError, match="broken.jpg"):
        epoch(train_data)


def test_synthetic_iter():
    data_iter = synthetic_iter(6, IMAGE_SHAPE, num_classes=3, num_batches=4, seed=1)
    batches = epoch(data_iter)
    assert len(batches) == 4 and len(epoch(data_iter)) == 4
    check_batches(batches, 6, 3)
    again = epoch(synthetic_iter(6, IMAGE_SHAPE, num_classes=3, num_batches=4, seed=1))
    np.testing.assert_array_equal(batches[0][0], again[0][0])


@pytest.mark.parametrize("image_shape", [(1, 8, 8), (3, 8), (3, 0, 8), "3,8,8"])
def test_bad_image_shape_is_a_value_error(image_shape):
    with pytest.raises(ValueError, match=r"\(3, height, width\)"):
        synthetic_iter(2, image_shape, num_classes=2, num_batches=1)


def test_check_labels_raises_on_label_equal_to_num_classes():
    data = mx.io.NDArrayIter(np.zeros((6, 3, 2, 2)), np.array([0, 1, 2, 0, 3, 1]), batch_size=2)
    checked = check_labels(data, num_classes=3)
    assert checked.provide_label == data.provide_label
    next(checked)
    next(checked)
    with pytest.raises(DataError, match=r"label 3 in batch 2 .* valid range \[0, 3\)"):
        next(checked)
    checked.reset()
    assert len(list(check_labels(data, num_classes=4))) == 3


def _tiny_symbol(num_classes):
    data = mx.sym.Variable("data")
    net = mx.sym.Convolution(data, kernel=(3, 3), num_filter=8, name="conv")
    net = mx.sym.Activation(net, act_type="relu")
    net = mx.sym.Pooling(net, global_pool=True, pool_type="avg", kernel=(1, 1))
    net = mx.sym.FullyConnected(mx.sym.flatten(net), num_hidden=num_classes, name="fc")
    return mx.sym.SoftmaxOutput(net, name="softmax")


def test_module_learns_the_fixture_classes_from_records(rec_files):
    """Module consumes the iterators as they are, and the fixture data is learnable (chance is 25%)."""
    mx.random.seed(0)
    train_data = check_labels(record_iter(rec_files.train_rec, 12, IMAGE_SHAPE, num_threads=1), 4)
    val_data = record_iter(rec_files.val_rec, 12, IMAGE_SHAPE, train=False, num_threads=1)
    module = mx.mod.Module(_tiny_symbol(4), context=mx.cpu())
    module.fit(train_data, num_epoch=8, optimizer="adam", optimizer_params={"learning_rate": 0.05},
               initializer=mx.init.Xavier())
    assert dict(module.score(val_data, "acc"))["accuracy"] >= 0.75


@pytest.mark.slow
def test_folder_iters_shards_training_images_over_workers(image_folder):
    from mxfp16.train.data import split_image_folder
    split = split_image_folder(str(image_folder), 0.25, 0)
    shards = [folder_iters(str(image_folder), 4, (3, 16, 16), val_fraction=0.25, num_parts=3,
                           part_index=part)[0] for part in range(3)]
    sizes = [sum(4 - batch.pad for batch in shard) for shard in shards]
    assert sizes == [12, 12, 12] and sum(sizes) == len(split.train)
    with pytest.raises(ValueError, match="part_index"):
        folder_iters(str(image_folder), 4, (3, 16, 16), num_parts=2, part_index=2)
