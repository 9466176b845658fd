"""The report's layer-by-layer comparison (``scripts/report.py --compare``): every layer of the
network in float16 (or bfloat16) against float32 on a batch of random data, by
:func:`mxfp16.diagnose.compare_precision`; its blocks for the text and Markdown renderings, and
its plot of the error by layer.
"""
import math

from ..diagnose.precision import compare_precision

__all__ = ["compare_blocks", "layer_comparison", "plot_comparison"]

#: Layers the text lists, those adding the most to their input's rounding.
TOP_LAYERS = 8


def layer_comparison(block, data, dtype, tolerance=None):
    """:func:`~mxfp16.diagnose.compare_precision` of ``block`` on ``data``, as JSON-ready values
    (``PrecisionReport.to_dict``)."""
    return compare_precision(block, data, dtype=dtype, tolerance=tolerance).to_dict()


def _number(value):
    return float(value) if isinstance(value, str) else value


def _text(value, digits=3):
    value = _number(value)
    return "" if value is None else f"{value:.{digits}g}"


def compare_blocks(compare):
    """The report's blocks of a comparison (None: the section says how to ask for one)."""
    title = ("title", "6. Layer by layer against float32")
    if not compare:
        return [title, ("text", "Not run (--compare float16 or --compare bfloat16 runs it).")]
    layers = compare["layers"]
    first = next((layer for layer in layers if layer["op"] == compare["first_beyond_tolerance"]),
                 None)
    summary = (f"{len(layers)} layers in {compare['dtype']} against float32 on one batch of random "
               f"data (inference mode), tolerance {compare['tolerance']:g} on the relative error "
               "(largest |error| over largest |float32 value|). " +
               (f"First layer beyond it: {first['op']} ({first['path'] or 'the network'}), "
                f"relative error {_text(first['rel_error'])}." if first else
                "Every layer is within it.") +
               (f" Last layer: relative error {_text(layers[-1]['rel_error'])}." if layers else ""))
    scored = [layer for layer in layers if layer["excess"] is not None
              and not math.isnan(_number(layer["excess"]))]
    worst = sorted(scored, key=lambda layer: -_number(layer["excess"]))[:TOP_LAYERS]
    return [title, ("text", summary),
            ("text", "Layers adding the most to what the rounding of their input explains "
                     "(excess: their error over that of the float32 layer on its rounded input):"),
            ("table", ["block", "op", "dtype", "relative error", "input rounding", "excess"],
             [[layer["path"] or "(network)", layer["op"], layer["dtype"], _text(layer["rel_error"]),
               _text(_number(layer["input_error"]) / _number(layer["max_abs"])
                     if _number(layer["max_abs"]) else 0.0), _text(layer["excess"])]
              for layer in worst])]


def plot_comparison(compare, path, pyplot):
    """The relative error of every layer, in execution order, beside the relative error the
    rounding of its input alone explains, with the tolerance and the first layer beyond it."""
    layers = compare["layers"]
    steps = list(range(len(layers)))

    def shown(value):  # log axes: 0 at the bottom, inf and NaN at the top
        value = _number(value)
        return 1e-12 if value == 0 else 1e3 if not math.isfinite(value) else value
    figure, axes = pyplot.subplots(figsize=(10, 4.5))
    axes.semilogy(steps, [shown(layer["rel_error"]) for layer in layers], ".-",
                  color="tab:blue", label=f"{compare['dtype']} against float32")
    axes.semilogy(steps, [shown(_number(layer["input_error"]) / _number(layer["max_abs"])
                                if _number(layer["max_abs"]) else 0.0) for layer in layers],
                  ".", color="tab:gray", label="float32 layer on its rounded input")
    axes.axhline(compare["tolerance"], color="tab:red", linestyle="--",
                 label=f"tolerance {compare['tolerance']:g}")
    first = [i for i, layer in enumerate(layers) if layer["op"] == compare["first_beyond_tolerance"]]
    if first:
        axes.axvline(first[0], color="tab:red", alpha=0.4)
        axes.annotate(layers[first[0]]["op"], (first[0], compare["tolerance"]), rotation=90,
                      fontsize=7, color="tab:red", va="bottom")
    axes.set_xlabel("layer (op, in execution order)")
    axes.set_ylabel("relative error (max |error| / max |float32|)")
    axes.set_title("Error by layer")
    axes.legend(loc="upper left", fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    pyplot.close(figure)
    return path
