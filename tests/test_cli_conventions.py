"""mxfp16.train.cli.conventions: the tables of where the scripts' flag names come from name only
flags the scripts have, and agree with the flags tests/test_gluoncv_commands.py runs."""
import importlib.util
import os

import pytest

from mxfp16.train.cli import conventions
from test_gluoncv_commands import EXAMPLE_FLAGS

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _flags(script):
    path = os.path.join(ROOT, "scripts", f"{script}.py")
    spec = importlib.util.spec_from_file_location(f"conventions_{script}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return {flag for action in module.get_args_parser()._actions for flag in action.option_strings}


@pytest.mark.parametrize("table, script", [
    ("MXNET_EXAMPLE", "train_imagenet"), ("GLUONCV", "train_imagenet"),
    ("MXNET_FINE_TUNE", "fine_tune"), ("MXNET_LAUNCH", "launch"), ("MXNET_IM2REC", "prepare_data")])
def test_every_flag_a_table_names_is_a_flag_of_its_script(table, script):
    assert sorted(getattr(conventions, table) - _flags(script)) == []


def test_the_nvidia_flags_are_flags_of_the_training_scripts():
    assert conventions.nvidia_flags() <= _flags("train_imagenet") & _flags("fine_tune")


def test_the_example_table_is_the_flags_the_gluoncv_commands_test_runs():
    assert conventions.MXNET_EXAMPLE == set(EXAMPLE_FLAGS)


def test_a_flag_of_several_tools_names_each_and_an_own_flag_names_mxfp16():
    assert conventions.conventions("train_imagenet", "--batch-size") == ["MXNet example", "GluonCV"]
    assert conventions.conventions("train_imagenet", "--data-backend") == ["GluonCV", "NVIDIA"]
    assert conventions.conventions("fine_tune", "--layer-before-fullc") == \
        ["MXNet example's fine-tune.py"]
    assert conventions.conventions("launch", "-H") == ["MXNet's tools/launch.py"]
    assert conventions.conventions("report", "--network") == ["mxfp16"]
