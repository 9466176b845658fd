"""Install mxfp16: ``pip install -e ".[cpu]"`` (CPU) or ``pip install -e ".[cu112]"`` (CUDA 11.2 GPUs)."""
from setuptools import find_packages, setup

setup(
    name="mxfp16",
    version="0.1.0",
    description="Mixed-precision (float16) training for Apache MXNet 1.9, Gluon and Module APIs",
    long_description=open("README.md").read(),
    long_description_content_type="text/markdown",
    packages=find_packages(include=["mxfp16", "mxfp16.*"]),
    # The fused float16-rounding operator is compiled on first use (see mxfp16/casting/fastround.py for why
    # not here), so its C++ source ships with the package.
    package_data={"mxfp16": ["casting/csrc/*.cc"]},
    python_requires=">=3.7",
    install_requires=[
        # MXNet 1.9.1 fails to import with numpy >= 1.24; other packages would pull numpy 2.
        "numpy>=1.17,<1.24",
        "gluoncv==0.10.5.post0",
        "tqdm>=4.40",
        "tensorboardX>=2.1",
        "matplotlib>=3.1",
        "opencv-python-headless>=4.1",
    ],
    extras_require={
        # The MXNet build is the user's choice: CPU, or CUDA 11.2 for GPUs.
        "cpu": ["mxnet==1.9.1"],
        "cu112": ["mxnet-cu112==1.9.1"],
        # GluonNLP 0.10, the last release for MXNet 1.x (BERT, Transformer, language models); pip
        # builds it from source with Cython, about a minute.
        "nlp": ["gluonnlp==0.10.0"],
        # Horovod, the second distributed engine (--kv-store horovod, launch.py --launcher horovod).
        # Its setup.py compiles against the installed mxnet (headers, libmxnet.so), so install
        # MXNet first, `pip install wheel`, and pass --no-build-isolation (an isolated build
        # environment hides the installed mxnet); HOROVOD_WITH_MXNET=1 makes a missing MXNet a
        # build error instead of a Horovod without MXNet support.  See docs/distributed.md, Horovod.
        "horovod": ["horovod==0.28.1"],
        # ONNX export (scripts/export.py --onnx): MXNet 1.9.1's exporter imports onnx.mapping, which
        # onnx 1.19 removed. onnxruntime is not here: its wheels need numpy>=1.24, which MXNet 1.9.1
        # cannot import; run it from a venv of its own (docs/deployment.md).
        "onnx": ["onnx<1.19"],
        # The linters are pinned: tests/test_lint.py runs them, and a new rule must not fail CI.
        # GluonNLP is in: the sequence-model tests cast and train its models; onnx for the ONNX
        # export tests (skipped, and said so, without it).
        # The documentation site (tests/test_site.py builds it with -W): Sphinx, MyST and numpydoc
        # pinned like the linters, since a new release's new warning would fail the build (Sphinx 9
        # needs Python 3.11; the site's tests skip without it); websocket-client drives the
        # headless Chromium of its browser test over the DevTools protocol.
        "test": ["pytest>=6", "scikit-learn>=0.24", "ruff==0.17.6", "import-linter==2.16",
                 "gluonnlp==0.10.0", "onnx<1.19"] + [
                     f"{name}; python_version >= '3.11'" for name in (
                         "sphinx==9.0.4", "myst-parser==5.2.0", "numpydoc==1.11.0",
                         "websocket-client==1.9.2")],
    },
)
