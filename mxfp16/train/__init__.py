"""The training application behind the scripts: configuration and flags, data, the training loop of
both APIs, checkpoints, logs, fine-tuning and the distributed launcher (see docs/architecture.md).

It is built on the library (:mod:`mxfp16`), which never imports it.
"""
