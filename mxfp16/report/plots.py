"""PNG plots of the report: the gradient histogram, the per-layer time estimate and the error by
layer of the comparison with float32.

matplotlib is imported when a plot is drawn, with its file-only Agg backend (no display needed).
"""
import math
import os

from .compare import plot_comparison
from .underflow import FLOAT16_MAX, FLOAT16_MIN_NORMAL, FLOAT16_MIN_SUBNORMAL


def _pyplot():
    import matplotlib
    matplotlib.use("Agg")
    from matplotlib import pyplot
    return pyplot


def _nonzero_range(underflow):
    used = [e for run in ("scale_1", "recommended")
            for e, count in zip(underflow["exponents"], underflow[run]["counts"]) if count]
    low = min(used + [-26]) - 1
    high = max(used + [int(math.log2(FLOAT16_MAX))]) + 2
    return low, high


def plot_gradient_histogram(underflow, path):
    """Histogram of activation-gradient magnitudes against float16's range (Micikevicius et al.
    2018, Figure 5), at loss scale 1 and at the recommended scale.

    Parameters
    ----------
    underflow : dict
        :func:`mxfp16.report.underflow.gradient_underflow`'s result.
    path : str
        The PNG file to write.

    Returns
    -------
    str
        ``path``.

    Examples
    --------
    >>> import os, tempfile
    >>> import mxnet as mx
    >>> from mxnet.gluon import nn
    >>> from mxfp16.report.underflow import gradient_underflow, random_batches
    >>> net = nn.Dense(3, in_units=4)
    >>> net.initialize()
    >>> result = gradient_underflow(net, random_batches((2, 4), 3, steps=1))
    >>> path = plot_gradient_histogram(result, os.path.join(tempfile.mkdtemp(), 'h.png'))
    >>> os.path.getsize(path) > 0
    True
    """
    pyplot = _pyplot()
    low, high = _nonzero_range(underflow)
    figure, axes = pyplot.subplots(figsize=(10, 4.5))
    for run, color in (("scale_1", "tab:gray"), ("recommended", "tab:blue")):
        stats = underflow[run]
        pairs = [(e, c) for e, c in zip(underflow["exponents"], stats["counts"]) if low <= e <= high]
        axes.bar([e + 0.5 for e, _ in pairs], [c for _, c in pairs], width=1.0, alpha=0.6, color=color,
                 label=f"loss scale {stats['loss_scale']:g}: {stats['underflow_fraction']:.2%} "
                       "of nonzero values underflow")
    axes.axvspan(low, math.log2(FLOAT16_MIN_SUBNORMAL), color="tab:red", alpha=0.12,
                 label="becomes 0 in float16")
    for value, label in ((FLOAT16_MIN_SUBNORMAL, "2^-24 smallest subnormal"),
                         (FLOAT16_MIN_NORMAL, "2^-14 smallest normal"), (FLOAT16_MAX, "65504 largest")):
        axes.axvline(math.log2(value), color="black", linestyle="--", linewidth=0.8)
        axes.annotate(label, (math.log2(value), 1.0), xycoords=("data", "axes fraction"),
                      xytext=(3, -3), textcoords="offset points", rotation=90, va="top", fontsize=7)
    axes.set_xlim(low, high)
    axes.set_yscale("log")
    axes.set_xlabel("log2(|activation gradient| x loss scale)")
    axes.set_ylabel("values")
    axes.set_title("Activation gradients under float16 emulation")
    axes.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.15), ncol=3)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    pyplot.close(figure)
    return path


#: Bar colours of the per-layer plot: Tensor Cores, padded by cuDNN, not eligible, other ops.
LAYER_COLORS = {"eligible": "tab:blue", "padded": "tab:orange", "ineligible": "tab:red",
                "other": "tab:gray", "float32": "lightgray"}


def _layer_color(row):
    return LAYER_COLORS["eligible" if row["eligible"] else
                        "padded" if row["padded_by_cudnn"] else "ineligible"]


def plot_layer_times(estimate, path):
    """Per-layer estimated training time, float32 against float16, for the GEMM layers of one GPU,
    coloured by Tensor Core eligibility; the other ops summed in the last bar.

    Parameters
    ----------
    estimate : dict
        One GPU's entry of :func:`mxfp16.report.speedup.estimate_speedup`.
    path : str

    Returns
    -------
    str
        ``path``.

    Examples
    --------
    >>> import os, tempfile
    >>> from mxfp16.report.build import ReportConfig, build_report
    >>> report = build_report(ReportConfig('resnet18_v1', image_shape=(3, 32, 32), batch_size=8,
    ...                                    num_classes=16, gpus=['A100'], underflow_steps=0))
    >>> path = os.path.join(tempfile.mkdtemp(), 't.png')
    >>> plot_layer_times(report['speedup']['gpus']['A100'], path) == path
    True
    """
    pyplot = _pyplot()
    from matplotlib import patches
    gemms = [row for row in estimate["layers"] if row["tensor_core_layer"]]
    others = [row for row in estimate["layers"] if not row["tensor_core_layer"]]
    names = [row["name"] for row in gemms] + ["all other ops"]
    float32 = [row["float32_s"] * 1e3 for row in gemms] + [sum(r["float32_s"] for r in others) * 1e3]
    float16 = [row["float16_s"] * 1e3 for row in gemms] + [sum(r["float16_s"] for r in others) * 1e3]
    figure, axes = pyplot.subplots(figsize=(9, 1.5 + 0.22 * len(names)))
    positions = range(len(names))
    axes.barh([p + 0.2 for p in positions], float32, height=0.4, color=LAYER_COLORS["float32"])
    axes.barh([p - 0.2 for p in positions], float16, height=0.4,
              color=[_layer_color(row) for row in gemms] + [LAYER_COLORS["other"]])
    axes.set_yticks(list(positions))
    axes.set_yticklabels(names, fontsize=6)
    axes.invert_yaxis()
    axes.set_xlabel("estimated ms per training step")
    axes.set_title(f"{estimate['gpu']}: {estimate['speedup_vs_float32']:.2f}x estimated speed-up")
    labels = {"float32": "float32", "eligible": "float16, Tensor Cores",
              "padded": "float16, padded by cuDNN", "ineligible": "float16, not eligible (FP32 rate)",
              "other": "float16, other ops"}
    axes.legend(handles=[patches.Patch(color=LAYER_COLORS[k], label=v) for k, v in labels.items()],
                fontsize=8, loc="lower right")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    pyplot.close(figure)
    return path


def save_plots(report, directory):
    """Write ``gradient_histogram.png`` and ``error_by_layer.png`` (when the report has them)
    and ``layer_times_<GPU>.png``.

    Parameters
    ----------
    report : dict
        :func:`mxfp16.report.build.build_report`'s result.
    directory : str
        Created if needed.

    Returns
    -------
    list of str
        The files written (see :func:`mxfp16.report.build.save_report` for an example).
    """
    os.makedirs(directory, exist_ok=True)
    written = [plot_layer_times(estimate, os.path.join(directory, f"layer_times_{key}.png"))
               for key, estimate in report["speedup"]["gpus"].items()]
    if report["underflow"]:
        written.insert(0, plot_gradient_histogram(report["underflow"],
                                                  os.path.join(directory, "gradient_histogram.png")))
    if report.get("compare"):
        written.append(plot_comparison(report["compare"],
                                       os.path.join(directory, "error_by_layer.png"), _pyplot()))
    return written
