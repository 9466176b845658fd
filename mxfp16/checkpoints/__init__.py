"""What a run writes to disk, and how it survives a crash or a preemption.

- :mod:`.files`: sealed checkpoint files (SHA-256 manifest), damaged-file detection, stale temporaries;
- :mod:`.atomic`: ``StagedFiles``, writing a set of files so that a crash leaves the old set whole;
- :mod:`.optimizer_states`: Trainer and optimizer states without pickle, with float32 master weights;
- :mod:`.training_state`: ``TrainingState``, the whole of a run (parameters, optimizer, scaler, step,
  random state) in one sealed directory, for exact resume;
- :mod:`.preemption`: ``StopRequest``, turning SIGTERM/SIGINT into a save at the next step boundary.
"""
