"""The gradient exchange across devices, processes and machines.

- :mod:`.kvstore`: MXNet's kvstore types (local, device, dist_sync, ...) and the initial-weight sync;
- :mod:`.horovod`: ``Horovod``, a kvstore-shaped allreduce over Horovod (Gloo or MPI) for
  ``mxfp16.Trainer``.
"""
