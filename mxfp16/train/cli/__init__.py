"""The command line of the training scripts: flags, the flags of MXNet's examples, GluonCV and
NVIDIA's scripts translated to mxfp16's, and the one config object the rest of the application reads.

- :mod:`.flags` and :mod:`.flags_deploy`: mxfp16's own flags;
- :mod:`.compat`, :mod:`.flags_compat`, :mod:`.nvidia_compat`, :mod:`.gluoncv_states`: other tools'
  commands and files, accepted as their users write them;
- :mod:`.config`: ``TrainConfig``, checked once, then passed by keyword.
"""
