"""Targets and metrics of a classification run: label smoothing, mixup, accuracy and mean loss.

The metrics accumulate on MXNet's engine and are read back to the host only when asked
(``get()``), so a training step never waits on the device for them.  ``mx.metric.Accuracy`` would
read every batch's outputs back (``asnumpy``), a stall per step that costs a GPU run of short steps a
few percent of its speed.
"""
import mxnet as mx


def make_targets(labels, num_classes, smoothing=0.0, mixup_lambda=None):
    """Soft targets ``(N, num_classes)`` for label smoothing and mixup (GluonCV's recipe).

    Smoothing puts ``1 - smoothing + smoothing / K`` on the label and ``smoothing / K`` elsewhere;
    mixup blends each row with the row of the reversed batch: ``lam * y + (1 - lam) * y[::-1]``
    (mix the data with :func:`mixup_data` and the same ``lam``).

    Examples
    --------
    >>> import mxnet as mx
    >>> make_targets(mx.nd.array([0, 2]), 3, smoothing=0.3).asnumpy().astype(float).round(2).tolist()
    [[0.8, 0.1, 0.1], [0.1, 0.1, 0.8]]
    >>> make_targets(mx.nd.array([0, 2]), 3, mixup_lambda=0.75).asnumpy().tolist()
    [[0.75, 0.0, 0.25], [0.25, 0.0, 0.75]]
    """
    off = smoothing / num_classes
    targets = labels.one_hot(num_classes, on_value=1.0 - smoothing + off, off_value=off)
    if mixup_lambda is None:
        return targets
    return mixup_lambda * targets + (1.0 - mixup_lambda) * targets.flip(axis=0)


def mixup_data(data, mixup_lambda):
    """Blend each image with the image at the mirrored position of the batch."""
    return mixup_lambda * data + (1.0 - mixup_lambda) * data.flip(axis=0)


def _on_cpu(arrays):
    """One array of the pieces (split over devices, in order), copied to the CPU."""
    pieces = [array.as_in_context(mx.cpu()) for array in arrays]
    return pieces[0] if len(pieces) == 1 else mx.nd.concat(*pieces, dim=0)


class Accuracy:
    """Top-1 and top-k accuracy, accumulated without waiting on the device.

    Parameters
    ----------
    top_k : int
        ``k`` of the second accuracy; at most ``num_classes`` is used.
    num_classes : int

    Examples
    --------
    >>> import mxnet as mx
    >>> acc = Accuracy(top_k=2, num_classes=3)
    >>> acc.update([mx.nd.array([0, 1, 1])], [mx.nd.array([[3, 2, 1], [3, 2, 1], [1, 2, 3]])], pad=1)
    >>> acc.get()  # the third sample is padding: top-1 1/2, top-2 2/2
    (0.5, 1.0)
    """

    def __init__(self, top_k, num_classes):
        self.k = min(top_k, num_classes)
        self.reset()

    def reset(self):
        self._top1 = self._topk = None
        self.count = 0

    def update(self, labels, outputs, pad=0):
        """Add a batch: ``labels`` and class scores ``outputs`` as lists split over devices; the last
        ``pad`` samples (repeats) are left out."""
        label, scores = _on_cpu(labels), _on_cpu(outputs)
        valid = label.shape[0] - (pad or 0)
        if valid <= 0:
            return
        if pad:
            label, scores = label[:valid], scores[:valid]
        label = label.astype("float32", copy=False)
        top1 = (mx.nd.argmax(scores, axis=1) == label).sum()
        if self.k > 1:
            top = mx.nd.topk(scores, axis=1, k=self.k, ret_typ="indices").astype("float32")
            topk = mx.nd.broadcast_equal(top, label.reshape((-1, 1))).sum()
        else:
            topk = top1
        self._top1 = top1 if self._top1 is None else self._top1 + top1
        self._topk = topk if self._topk is None else self._topk + topk
        self.count += valid

    def totals(self):
        """``[top-1 hits, top-k hits, samples]`` so far, as floats (one wait): what ranks sum."""
        if not self.count:
            return [0.0, 0.0, 0.0]
        return [float(self._top1.asscalar()), float(self._topk.asscalar()), float(self.count)]

    def state(self):
        """The counts so far, JSON-ready (a mid-epoch checkpoint keeps them)."""
        return self.totals()

    def load_state(self, state):
        """Continue from :meth:`state`'s counts.

        Examples
        --------
        >>> import mxnet as mx
        >>> acc = Accuracy(top_k=1, num_classes=2)
        >>> acc.load_state([3.0, 3.0, 4.0])
        >>> acc.update([mx.nd.array([0])], [mx.nd.array([[0.0, 1.0]])])
        >>> acc.get()
        (0.6, 0.6)
        """
        top1, topk, count = state
        self.reset()
        if count:
            self._top1, self._topk = mx.nd.array([top1]), mx.nd.array([topk])
            self.count = int(count)

    def get(self):
        """``(top1, topk)`` so far (reads the counts back: one wait); NaN before any sample."""
        if not self.count:
            return float("nan"), float("nan")
        return (float(self._top1.asscalar()) / self.count,
                float(self._topk.asscalar()) / self.count)


class MeanLoss:
    """The mean of per-sample losses over the batches whose losses are all finite (an overflowing
    float16 step is left out), accumulated without waiting on the device.

    Examples
    --------
    >>> import mxnet as mx
    >>> mean = MeanLoss()
    >>> mean.update([mx.nd.array([1.0, 3.0])]); mean.update([mx.nd.array([float('inf'), 0.0])])
    >>> mean.get()
    2.0
    """

    def __init__(self):
        self._sum = self._count = None

    def update(self, losses):
        """Add a batch's per-sample losses (a list over devices)."""
        loss = _on_cpu([item.reshape((-1,)) for item in losses]).astype("float32", copy=False)
        total = loss.sum()
        finite = mx.nd.contrib.isfinite(total)
        total = mx.nd.where(finite, total, mx.nd.zeros_like(total))
        count = finite * loss.shape[0]
        self._sum = total if self._sum is None else self._sum + total
        self._count = count if self._count is None else self._count + count

    def state(self):
        """``[sum, count]`` so far, JSON-ready (a mid-epoch checkpoint keeps them)."""
        if self._sum is None:
            return [0.0, 0.0]
        return [float(self._sum.asscalar()), float(self._count.asscalar())]

    def load_state(self, state):
        """Continue from :meth:`state`'s sums.

        Examples
        --------
        >>> import mxnet as mx
        >>> mean = MeanLoss()
        >>> mean.load_state([4.0, 2.0])
        >>> mean.update([mx.nd.array([5.0])])
        >>> mean.get()
        3.0
        """
        total, count = state
        self._sum = self._count = None
        if count:
            self._sum, self._count = mx.nd.array([total]), mx.nd.array([count])

    def get(self):
        """The mean so far (one wait); NaN before any finite batch."""
        count = float(self._count.asscalar()) if self._count is not None else 0.0
        return float(self._sum.asscalar()) / count if count else float("nan")
