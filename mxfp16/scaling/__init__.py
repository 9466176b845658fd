"""Loss scaling: keeping float16 gradients above 2**-24 and below 65504, and undoing the scale.

One concept, one subpackage:

- :mod:`.scalers`: ``StaticLossScaler``, ``DynamicLossScaler`` and ``make_loss_scaler``;
- :mod:`.settings`: what a loss-scale setting may be (numbers, ``'auto'``, the growth rules), checked
  once for every scaler;
- :mod:`.overflow`: the all-finite and magnitude checks of gradients on every device;
- :mod:`.heads`: losses that ignore the head gradient (SoftmaxOutput, MakeLoss, ...), found in the
  recorded graph, so that the scale reaches every gradient;
- :mod:`.boundary`: the scale applied at a cast network's float32 boundary for such losses;
- :mod:`.clipping`: gradient clipping by the true norm while the gradients hold the scale
  (``clip_global_norm``, ``clip_grad_global_norm``).

It sits on the casting rules and MXNet's internals, never on checkpoints or the distributed helpers'
callers: a run's files (:mod:`mxfp16.checkpoints`) store a scaler's plain-number state, not the reverse.
"""
