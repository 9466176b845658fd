"""The report as readable text and as Markdown.

Both renderings come from one list of blocks: ``('title', text)``, ``('text', text)`` and
``('table', headers, rows)``.
"""
from .compare import compare_blocks
from .underflow import FLOAT16_MIN_NORMAL, FLOAT16_MIN_SUBNORMAL

#: Rows of the longest per-layer tables in the text rendering (Markdown and JSON have all).
TEXT_TOP_LAYERS = 10


def format_bytes(count):
    """Bytes in binary units.

    Examples
    --------
    >>> format_bytes(512), format_bytes(3 * 2 ** 20), format_bytes(17179869184)
    ('512 B', '3.00 MiB', '16.00 GiB')
    """
    for unit, size in (("GiB", 2 ** 30), ("MiB", 2 ** 20), ("KiB", 2 ** 10)):
        if count >= size:
            return f"{count / size:.2f} {unit}"
    return f"{count:.0f} B"


def _ms(seconds):
    return "-" if seconds is None else f"{seconds * 1e3:.2f}"


def _ratio(value):
    return "-" if value is None else f"{value:.2f}x"


def _header_blocks(report):
    shape = "x".join(str(d) for d in report["data_shape"])
    return [("title", f"Float16 precision report: {report['network']}"),
            ("text", f"Input {shape} (batch size {report['data_shape'][0]}).")]


def _suggestion(layer):
    if not layer["suggestions"]:
        return "-"
    return ", ".join(f"{dim} {layer['dims'][dim]} -> {size}" for dim, size in
                     layer["suggestions"].items())


def _tensor_core_blocks(cores):
    layers = cores["layers"]
    rows = [[layer["name"], layer["op"], "x".join(map(str, layer["input_shape"])),
             "x".join(map(str, layer["weight_shape"])),
             " ".join(f"{k}={v}" for k, v in layer["dims"].items()),
             "yes" if layer["eligible"] else "NO", _suggestion(layer), layer["note"] or "-"]
            for layer in layers + cores.get("embeddings", [])]
    batch = f"batch size {cores['batch_size']} is " + (
        "a multiple" if cores["batch_size_ok"] else
        f"not a multiple: use {cores['suggested_batch_size']}")
    text = (f"{len(layers) - len(cores['violations'])} of {len(layers)} GEMM layers have every "
            f"dimension a multiple of {cores['multiple']}; {batch}. Suggestions round up "
            "(zero-padding keeps the network's function); grouped convolutions are checked per group.")
    broken = ", ".join(cores["violations"]) or "none"
    return [("title", "1. Tensor Core eligibility"), ("text", text),
            ("text", f"Layers breaking the rule: {broken}."),
            ("table", ["layer", "op", "input", "weight", "dims", "ok", "suggestion", "note"], rows)]


def _precision_blocks(precision):
    rows = [[op, counts.get("float16", 0), counts.get("float32", 0)]
            for op, counts in precision["ops"].items()]
    casts = precision["casts"]
    float32 = [layer["name"] for layer in precision["layers"] if layer["dtype"] == "float32"]
    return [("title", "2. Precision map (GPU float16 graph)"),
            ("text", f"{precision['float16_ops']} ops run in float16, {precision['float32_ops']} in "
                     f"float32; {casts['inserted']} casts inserted ({casts['to_float16']} to float16, "
                     f"{casts['to_float32']} to float32)."),
            ("table", ["op", "float16", "float32"], rows),
            ("text", f"Ops in float32: {', '.join(float32) or 'none'}.")]


def _memory_blocks(memory):
    rows = []
    for key, label in (("weights", "weights"), ("gradients", "gradients"),
                       ("master_weights", "float32 master weights"),
                       ("optimizer_state", f"optimizer state ({memory['optimizer']})"),
                       ("aux", "BatchNorm statistics"), ("total", "parameters total")):
        rows.append([label] + [format_bytes(memory[d]["parameters"][key])
                               for d in ("float32", "float16")])
    rows.append(["activations per sample"] + [format_bytes(memory[d]["activations_per_sample"])
                                              for d in ("float32", "float16")])
    rows.append([f"total at batch {memory['batch_size']}"] + [format_bytes(memory[d]["total_at_batch"])
                                                             for d in ("float32", "float16")])
    rows.append([f"largest batch in {format_bytes(memory['gpu_bytes'])}"] +
                [f"{memory[d]['max_batch_size']} ({memory[d]['max_batch_size_multiple_of_8']} as a "
                 "multiple of 8)" for d in ("float32", "float16")])
    return [("title", "3. Memory"), ("table", ["", "float32", "float16 + master"], rows),
            ("text", f"Activation model: {memory['activation_model']}.")]


def _speed_blocks(speedup, samples="img"):
    rows = [[key, gpu["gpu"], _ms(gpu["step_s"]["float32"]), _ms(gpu["step_s"]["tf32"]),
             _ms(gpu["step_s"]["float16"]), f"{gpu['images_per_s']['float16']:.0f}",
             _ratio(gpu["speedup_vs_float32"]), _ratio(gpu["speedup_vs_tf32"])]
            for key, gpu in speedup["gpus"].items()]
    blocks = [("title", "4. Estimated GPU speed-up (training step)"),
              ("table", ["gpu", "model", "float32 ms", "tf32 ms", "float16 ms", f"float16 {samples}/s",
                         "vs float32", "vs tf32"], rows),
              ("text", f"Model: {speedup['model']}.")]
    if speedup["published"]:
        blocks.append(("table", ["published measurement", "speed-up", "source"],
                       [[p["setup"], _ratio(p["speedup"]), p["source"]] for p in speedup["published"]]))
    return blocks


def _slowest_layers(speedup, count=TEXT_TOP_LAYERS):
    key, gpu = next(iter(speedup["gpus"].items()))
    layers = sorted(gpu["layers"], key=lambda row: -row["float16_s"])[:count]
    rows = [[row["name"], row["op"], _ms(row["float32_s"]), _ms(row["float16_s"]),
             row["float16_bound"], "yes" if row["eligible"] else "-"] for row in layers]
    return [("text", f"Slowest ops in float16 on {key}:"),
            ("table", ["op name", "op", "float32 ms", "float16 ms", "bound", "Tensor Cores"], rows)]


def _bar(count, largest, width=20):
    return "#" * max(1, round(width * count / largest)) if count else ""


def _histogram_rows(underflow):
    """One row per log2 bucket used at either scale: the counts and bars of both runs."""
    first, second = underflow["scale_1"]["counts"], underflow["recommended"]["counts"]
    used = [i for i, (a, b) in enumerate(zip(first, second)) if a or b]
    if not used:
        return []
    return [[f"2^{underflow['exponents'][i]}", first[i], _bar(first[i], max(first)), second[i],
             _bar(second[i], max(second))] for i in range(used[0], used[-1] + 1)]


def _underflow_rows(underflow):
    return [[f"{run['loss_scale']:g}", run["nonzero"], f"{run['underflow_fraction']:.2%}",
             f"{run['subnormal_fraction']:.2%}", f"{run['overflow_fraction']:.2%}",
             f"{run['max_abs']:.3g}", f"{run['weight_grad_max']:.3g}", run["skipped_steps"]]
            for run in (underflow["scale_1"], underflow["recommended"])]


def _underflow_blocks(underflow):
    if not underflow:
        return [("title", "5. Gradient underflow"), ("text", "Skipped (underflow steps = 0).")]
    worst = sorted(underflow["layers"], key=lambda row: -row["underflow_fraction"])[:5]
    summary = (f"{underflow['steps']} training steps at batch {underflow['batch_size']} on random "
               f"data. Recommended static loss scale: {underflow['recommended_scale']:g}, the largest "
               f"power of two keeping {underflow['headroom']:g}x headroom below 65504 for the "
               "activation gradients and for the float16 weight gradients (these grow with the "
               f"batch: extrapolated to batch {underflow['training_batch_size']}).")
    return [("title", "5. Activation-gradient underflow (CPU float16 emulation)"), ("text", summary),
            ("table", ["loss scale", "nonzero", "< 2^-24 (underflow)",
                       f"subnormal (< {FLOAT16_MIN_NORMAL:.3g})", "> 65504", "max |g| x scale",
                       "max weight grad x scale", "skipped steps"], _underflow_rows(underflow)),
            ("text", "Outputs whose gradients underflow most at scale 1:"),
            ("table", ["output", "nonzero", "underflow", "max |g|"],
             [[w["output"], w["nonzero"], f"{w['underflow_fraction']:.2%}", f"{w['max_abs']:.3g}"]
              for w in worst]),
            ("text", f"Histogram of |g| x loss scale (float16 keeps {FLOAT16_MIN_SUBNORMAL:.3g} "
                     "to 65504):"),
            ("table", ["|g| x scale", "scale 1", "", f"scale {underflow['recommended_scale']:g}", ""],
             _histogram_rows(underflow))]


def report_blocks(report):
    """The report's blocks, in order (see the module docstring).

    Examples
    --------
    >>> from mxfp16.report.build import ReportConfig, build_report
    >>> report = build_report(ReportConfig('resnet18_v1', image_shape=(3, 32, 32), batch_size=8,
    ...                                    num_classes=16, underflow_steps=0))
    >>> [block[1] for block in report_blocks(report) if block[0] == 'title'][1:3]
    ['1. Tensor Core eligibility', '2. Precision map (GPU float16 graph)']
    """
    return (_header_blocks(report) + _tensor_core_blocks(report["tensor_cores"])
            + _precision_blocks(report["precision"]) + _memory_blocks(report["memory"])
            + _speed_blocks(report["speedup"], "seq" if len(report["data_shape"]) == 2 else "img")
            + _slowest_layers(report["speedup"])
            + _underflow_blocks(report["underflow"]) + compare_blocks(report.get("compare")))


def _text_table(headers, rows):
    cells = [[str(c) for c in row] for row in [headers] + rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in cells]
    return "\n".join([lines[0], "  ".join("-" * w for w in widths)] + lines[1:])


def render_text(report):
    """The report as plain text for a terminal.

    Examples
    --------
    >>> from mxfp16.report.build import ReportConfig, build_report
    >>> report = build_report(ReportConfig('resnet18_v1', image_shape=(3, 32, 32), batch_size=8,
    ...                                    num_classes=10, underflow_steps=0))
    >>> print(render_text(report).splitlines()[0])
    Float16 precision report: resnet18_v1
    """
    out = []
    for block in report_blocks(report):
        if block[0] == "title":
            out += ["", block[1], "=" * len(block[1])]
        elif block[0] == "text":
            out.append(block[1])
        else:
            out.append(_text_table(block[1], block[2]))
    return "\n".join(out).strip() + "\n"


def _markdown_table(headers, rows):
    def line(cells):
        return "| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |"
    return "\n".join([line(headers), line(["---"] * len(headers))] + [line(row) for row in rows])


def render_markdown(report):
    """The report as Markdown (the per-op dtype list is folded in a ``<details>`` block).

    Examples
    --------
    >>> from mxfp16.report.build import ReportConfig, build_report
    >>> report = build_report(ReportConfig('resnet18_v1', image_shape=(3, 32, 32), batch_size=8,
    ...                                    num_classes=16, underflow_steps=0))
    >>> render_markdown(report).splitlines()[0]
    '# Float16 precision report: resnet18_v1'
    """
    out = []
    for block in report_blocks(report):
        if block[0] == "title":
            out.append(("# " if not out else "## ") + block[1])
        elif block[0] == "text":
            out.append(block[1])
        else:
            out.append(_markdown_table(block[1], block[2]))
    layers = [[layer["name"], layer["op"], layer["dtype"]] for layer in report["precision"]["layers"]]
    out.append("<details><summary>Every op and its dtype</summary>\n\n"
               + _markdown_table(["op name", "op", "dtype"], layers) + "\n\n</details>")
    return "\n\n".join(out) + "\n"
