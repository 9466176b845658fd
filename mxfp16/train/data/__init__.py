"""The data of a training run: RecordIO files, image folders and synthetic data (see
:mod:`mxfp16.train.data.base` for the conventions every source follows)."""
from .base import (DATA_NAME, IMAGE_EXTENSIONS, IMAGENET_MEAN_RGB, IMAGENET_STD_RGB, LABEL_NAME, DataError,
                   check_labels, synthetic_iter)
from .folders import ImageFolderSplit, folder_iters, list_image_folder, split_image_folder, split_indices
from .recordio import check_record_file, default_index_path, record_iter
from .sources import TrainData, load_data

__all__ = ["DATA_NAME", "LABEL_NAME", "IMAGE_EXTENSIONS", "IMAGENET_MEAN_RGB", "IMAGENET_STD_RGB",
           "DataError", "check_labels", "synthetic_iter", "ImageFolderSplit", "folder_iters",
           "list_image_folder", "split_image_folder", "split_indices", "check_record_file",
           "default_index_path", "record_iter", "TrainData", "load_data"]
