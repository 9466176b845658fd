"""A training run's state on disk: its checkpoints, where they live and how a run resumes.

- :mod:`.checkpoint`: saving and loading the scripts' checkpoints (parameters, optimizer and scaler
  state, epoch, config);
- :mod:`.resume`: finding the checkpoint a run resumes from, and checking it fits the run;
- :mod:`.prefix`: the ``--model-prefix`` directory and its files;
- :mod:`.param_names`: parameter names across MXNet's, GluonCV's and mxfp16's checkpoint formats.
"""
