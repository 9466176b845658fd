"""The settings of loss scaling, checked: ``--loss-scale`` forms, ``init_scale``, growth, bounds.

:mod:`mxfp16.scaling.scalers` builds its scalers from what these functions accept; every error names
the value received, the accepted values and the fix.
"""
import math

#: float16's largest finite value: a scaled gradient above it becomes inf.
FLOAT16_MAX = 65504.0

#: Headroom between the largest scaled gradient measured and 65504: 8x (three doublings), because
#: one measurement (a few report steps on random data, or a run's first step) sees smaller maxima
#: than the steps that follow.
DEFAULT_HEADROOM = 8.0

#: The largest loss scale (apex's and MXNet AMP's maximum).
MAX_LOSS_SCALE = 2.0 ** 24

#: The smallest scale of dynamic loss scaling: below 1, as PyTorch's GradScaler goes, for losses whose
#: gradients overflow float16 even unscaled (a loss weighted 1e6, YOLOv3's objectness loss summed
#: over its anchors, which settles at 1/32).  2**-24, the scale at which a gradient of 1 becomes
#: float16's smallest subnormal, chosen by measurement (benchmarks/loss_scale_floor.py, the floor
#: table of docs/benchmarks.md): a three-layer regression trained with Adam matches float32's loss
#: (after as many updates) with its loss weighted up to 2**30 at this floor, where a floor of 1
#: never updates from 2**20 on and one of 2**-12 from 2**30 on; only weights beyond 2**30 would need
#: a lower floor.  LossScaleCollapse still stops a run that overflows at every scale: the default
#: 200 skipped steps in a row reach the floor from any start (2**24 at most: 48 halvings).
MIN_LOSS_SCALE = 2.0 ** -24

#: The classic fixed start of dynamic scaling (PyTorch's and apex's), DynamicLossScaler's default.
CLASSIC_INIT_SCALE = 2.0 ** 16

#: ``init_scale`` that measures the start of dynamic scaling at the first step.
AUTO = "auto"

#: The ``loss_scale`` forms :func:`parse_loss_scale` accepts.
LOSS_SCALE_FORMS = ("'dynamic' (dynamic, start measured at the first step), 'dynamic:N' such as "
                    "'dynamic:65536' (dynamic, starting at N), a positive number such as 128 "
                    "(static; 1 disables scaling), or None (dynamic for float16, none otherwise)")


def parse_loss_scale(loss_scale, dtype, init_scale=None):
    """``('dynamic', init_scale)`` or ``('static', scale)`` for a ``--loss-scale`` setting.

    Parameters
    ----------
    loss_scale : str, float or None
        One of :data:`LOSS_SCALE_FORMS` (see :func:`mxfp16.make_loss_scaler`).
    dtype : str
        The training dtype: None means ``'dynamic'`` for float16 and 1 otherwise.
    init_scale : float, 'auto' or None
        The start of dynamic scaling when ``loss_scale`` has no ``:N`` suffix; None means 'auto'.

    Returns
    -------
    (str, float or 'auto')

    Raises
    ------
    ValueError
        For a ``loss_scale`` of none of the forms, or ``init_scale`` with a static scale or a
        ``:N`` suffix.

    Examples
    --------
    >>> parse_loss_scale(None, 'float16'), parse_loss_scale('Dynamic:65536', 'float16')
    (('dynamic', 'auto'), ('dynamic', 65536.0))
    >>> parse_loss_scale(None, 'float32'), parse_loss_scale('128', 'float16')
    (('static', 1.0), ('static', 128.0))
    """
    if loss_scale is None:
        loss_scale = "dynamic" if dtype == "float16" else 1.0
    kind, colon, suffix = str(loss_scale).strip().lower().partition(":")
    if kind == "dynamic":
        return "dynamic", _dynamic_start(loss_scale, suffix if colon else None, init_scale)
    if init_scale is not None:
        raise ValueError(f"init_scale={init_scale!r} is where dynamic scaling starts, but loss "
                         f"scale {loss_scale!r} is static: pass loss_scale='dynamic', or drop "
                         "init_scale")
    try:
        value = float(loss_scale)
    except (TypeError, ValueError):
        raise ValueError(f"loss scale {loss_scale!r} is none of the accepted forms: "
                         f"{LOSS_SCALE_FORMS}") from None
    check_positive("loss scale", value)
    return "static", value


def _dynamic_start(loss_scale, suffix, init_scale):
    """The start a ``'dynamic'`` or ``'dynamic:N'`` form asks for, with ``init_scale``."""
    if suffix is None:
        return AUTO if init_scale is None else init_scale
    if init_scale is not None:
        raise ValueError(f"loss scale {loss_scale!r} and init_scale={init_scale!r} both give the "
                         "start of dynamic scaling: pass one of them")
    try:
        return AUTO if is_auto(suffix) else float(suffix)
    except ValueError:
        raise ValueError(f"loss scale {loss_scale!r} has no start after 'dynamic:'; accepted "
                         f"forms: {LOSS_SCALE_FORMS}") from None


def is_auto(init_scale):
    """Whether ``init_scale`` is ``'auto'`` rather than a positive number.

    Raises
    ------
    ValueError
        If it is neither.

    Examples
    --------
    >>> is_auto('auto'), is_auto(65536)
    (True, False)
    """
    if isinstance(init_scale, str) and init_scale.strip().lower() == AUTO:
        return True
    if not _is_positive(init_scale):
        raise ValueError(f"init_scale must be 'auto' (measure the start at the first step) or a "
                         f"positive number such as 65536, got {init_scale!r}")
    return False


def check_dynamic_settings(init_scale, growth_factor, backoff_factor, growth_interval, min_scale,
                           max_scale):
    """ValueError naming the first setting of a dynamic scaler out of its range.

    Examples
    --------
    >>> check_dynamic_settings('auto', 2.0, 0.5, 2000, MIN_LOSS_SCALE, 2.0 ** 24)
    """
    check_positive("min_scale", min_scale)
    if not growth_factor > 1:
        raise ValueError(f"growth_factor must be > 1, got {growth_factor!r}")
    if not 0 < backoff_factor < 1:
        raise ValueError(f"backoff_factor must be between 0 and 1, got {backoff_factor!r}")
    check_whole("growth_interval", growth_interval)
    start = min_scale if is_auto(init_scale) else float(init_scale)
    if not min_scale <= start <= max_scale:
        raise ValueError(f"need min_scale <= init_scale <= max_scale, got {min_scale!r}, "
                         f"{init_scale!r}, {max_scale!r}")


def check_whole(name, value):
    """ValueError unless ``value`` is a whole number >= 1."""
    if int(value) != value or value < 1:
        raise ValueError(f"{name} must be a whole number >= 1, got {value!r}")


def check_positive(name, value):
    """ValueError unless ``value`` is a positive finite number."""
    if not _is_positive(value):
        raise ValueError(f"{name} must be a positive finite number, got {value!r}")


def _is_positive(value):
    try:
        return float(value) > 0 and math.isfinite(float(value))
    except (TypeError, ValueError):
        return False


def recommend_loss_scale(max_abs, headroom=DEFAULT_HEADROOM, max_scale=MAX_LOSS_SCALE,
                         min_scale=1.0):
    """The largest power of two with ``max_abs * scale * headroom <= 65504``, within
    [min_scale, max_scale] (``min_scale`` below 1 for losses whose gradients overflow float16
    unscaled, such as YOLOv3's summed objectness loss).

    The report's recommended static scale and the ``'auto'`` start of :class:`DynamicLossScaler`.
    1 when ``max_abs`` is inf or NaN (the gradients overflow at scale 1 already).

    Parameters
    ----------
    max_abs : float
        The largest gradient magnitude seen at loss scale 1.
    headroom : float
        Factor kept between the largest scaled gradient and float16's maximum.
    max_scale : float
        The largest scale returned.
    min_scale : float
        The smallest scale returned (1 by default: the report recommends no scale below 1).

    Returns
    -------
    float

    Raises
    ------
    ValueError
        If ``headroom`` is smaller than 1.

    Examples
    --------
    >>> recommend_loss_scale(1.0), recommend_loss_scale(3.0), recommend_loss_scale(0.0)
    (4096.0, 2048.0, 16777216.0)
    >>> recommend_loss_scale(1e5), recommend_loss_scale(1e5, min_scale=2.0 ** -24)
    (1.0, 0.0625)
    """
    if not headroom >= 1:
        raise ValueError(f"headroom must be >= 1 (a factor below float16's maximum), "
                         f"got {headroom!r}")
    if not math.isfinite(max_abs):  # gradients overflow even unscaled: no scale helps
        return 1.0
    if not max_abs > 0 or max_abs * headroom * max_scale <= FLOAT16_MAX:
        return float(max_scale)
    exponent = math.frexp(FLOAT16_MAX / (headroom * max_abs))[1] - 1  # floor(log2), exactly
    return float(min(max(2.0 ** exponent, min_scale), max_scale))


def scale_text(scale):
    """A loss scale as the messages write it: ``2**-24`` below 1 for a power of two, else ``%g``.

    Examples
    --------
    >>> scale_text(2.0 ** -24), scale_text(0.75), scale_text(65536.0)
    ('2**-24', '0.75', '65536')
    """
    mantissa, exponent = math.frexp(scale)
    return f"2**{exponent - 1}" if scale < 1 and mantissa == 0.5 else f"{scale:g}"
