"""The site's own Sphinx directives: the API reference of mxfp16's core and the command-line
reference of its scripts, both generated from the code, and the links from the pages' inline code
to the API entries.

``mxfp16-modules``
    One section per module named in its content (one a line): the module's docstring, then an
    autodoc entry for each of its public names (:func:`public_names`).  A name is documented once,
    where users import it first (``mxfp16.cast_block``, not ``mxfp16.casting.cast.cast_block``):
    the modules that also export it list it with a link to that entry.
``mxfp16-speedups``
    A bar chart of the Markdown table right above it in the page's source: the speed of each
    model in each low-precision dtype relative to float32, so the figure cannot disagree with
    its table (:class:`SpeedupsDirective`).  A build output, drawn by matplotlib into
    ``docs/_generated/`` (not committed).
``mxfp16-cli``
    The reference of one program (``scripts/NAME.py`` or ``mxfp16.doctor``) from the parser it
    builds: its usage, description and, per argument group, each flag with its help and the tool
    whose convention the flag's name follows (:mod:`mxfp16.train.cli.conventions`).

Inline code in the Markdown pages that names an API entry (```cast_block```,
```mxfp16.DynamicLossScaler```, ```mxfp16.scaling.clipping```) becomes a link to that entry, so
the Markdown stays plain for GitHub and the site links every name it can (:func:`link_targets`).
"""
import argparse
import ast
import importlib
import importlib.util
import inspect
import os
import pkgutil
import re
import sys

from docutils import nodes
from docutils.parsers.rst import Directive, directives
from docutils.statemachine import StringList
from sphinx import addnodes
from sphinx.util.nodes import nested_parse_with_titles

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
#: The layers of mxfp16 that are applications, not the library users import (their programs are
#: in the command-line reference).
NOT_API = ("mxfp16.train", "mxfp16.report", "mxfp16.doctor")


def api_modules():
    """Every module of the core, the library users import: ``mxfp16`` and its modules outside
    :data:`NOT_API`, in import order."""
    import mxfp16
    names = [info.name for info in pkgutil.walk_packages(mxfp16.__path__, "mxfp16.")]
    return ["mxfp16"] + [name for name in names
                         if not any(name == app or name.startswith(app + ".") for app in NOT_API)]


def _defined_names(module):
    """The public names a module without ``__all__`` defines: its functions and classes and its
    UPPER_CASE constants, read from its source (imported names are not its own)."""
    tree = ast.parse(inspect.getsource(module))
    names = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.append(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names += [target.id for target in targets
                      if isinstance(target, ast.Name) and target.id.isupper()]
    return [name for name in dict.fromkeys(names) if not name.startswith("_")]


def public_names(module_name):
    """A module's public names: its ``__all__``, else the names it defines (:func:`_defined_names`).

    Examples
    --------
    >>> public_names("mxfp16")[:3]
    ['cast_block', 'cast_symbol', 'cast_params']
    """
    module = importlib.import_module(module_name)
    if getattr(module, "__all__", None) is not None:
        return list(module.__all__)
    return _defined_names(module)


def _kind(value):
    """The py role and the autodoc directive of a public value."""
    if inspect.ismodule(value):
        return "mod", None
    if inspect.isclass(value):
        return "class", "autoclass"
    if callable(value):
        return "func", "autofunction"
    return "data", "autodata"


def canonical_entries():
    """``{(module, name): full name of its entry}`` for every public name of :func:`api_modules`:
    the first module (in that order) to export an object holds its entry."""
    entries, owner = {}, {}
    for module_name in api_modules():
        module = importlib.import_module(module_name)
        for name in public_names(module_name):
            value = getattr(module, name)
            shared = inspect.isclass(value) or callable(value) or inspect.ismodule(value)
            key = id(value) if shared else (module_name, name)
            full = owner.setdefault(key, f"{module_name}.{name}")
            entries[(module_name, name)] = full
    return entries


def _module_rst(module_name, entries):
    module = importlib.import_module(module_name)
    lines = [module_name, "-" * len(module_name), "", f".. automodule:: {module_name}", ""]
    elsewhere = []
    for name in public_names(module_name):
        full = entries[(module_name, name)]
        role, directive = _kind(getattr(module, name))
        if full != f"{module_name}.{name}" or directive is None:
            elsewhere.append(f":py:{role}:`{name} <{full}>`")
            continue
        lines += [f".. {directive}:: {full}"]
        if directive == "autoclass":
            lines += ["   :members:", "   :undoc-members:", "   :show-inheritance:"]
        lines.append("")
    if elsewhere:
        lines += ["Also exported here, documented where users import them first: "
                  + ", ".join(elsewhere) + ".", ""]
    return lines


class ModulesDirective(Directive):
    """``mxfp16-modules``: the API sections of the modules named in the content."""
    has_content = True

    def run(self):
        env = self.state.document.settings.env
        entries = env.app.mxfp16_entries
        lines = []
        for module_name in (line.strip() for line in self.content if line.strip()):
            if module_name not in api_modules():
                raise self.error(f"{module_name} is not a module of mxfp16's core "
                                 f"(choose from {', '.join(api_modules())})")
            lines += _module_rst(module_name, entries)
        node = nodes.section()
        nested_parse_with_titles(self.state, StringList(lines, source=env.docname), node)
        return node.children


# ---- the command-line reference -----------------------------------------------------------------

def program_parser(program):
    """The ``argparse`` parser of ``program`` (``scripts/NAME.py`` or ``mxfp16.doctor``), as the
    program builds it (its ``get_args_parser()``)."""
    if program == "mxfp16.doctor":
        from mxfp16.doctor.__main__ import get_args_parser
        return get_args_parser()
    path = os.path.join(ROOT, program)
    spec = importlib.util.spec_from_file_location(f"_cli_{os.path.basename(path)[:-3]}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_args_parser()


def programs():
    """The programs of the command-line reference: every ``scripts/*.py`` and the doctor."""
    scripts = sorted(name for name in os.listdir(os.path.join(ROOT, "scripts"))
                     if name.endswith(".py"))
    return [f"scripts/{name}" for name in scripts] + ["mxfp16.doctor"]


def flag_rows(program):
    """``[(group title, [(flags, help, conventions), ...]), ...]`` of ``program``'s parser."""
    from mxfp16.train.cli.conventions import conventions
    parser = program_parser(program)
    script = os.path.basename(program)[:-3] if program.endswith(".py") else "doctor"
    groups = []
    for group in parser._action_groups:
        rows = []
        for action in group._group_actions:
            if action.help == argparse.SUPPRESS:
                continue
            flags = action.option_strings or [action.metavar or action.dest]
            tools = sorted({tool for flag in action.option_strings
                            for tool in conventions(script, flag)}, key=_tool_order) or ["mxfp16"]
            rows.append((flags, _help_text(action, parser), tools))
        if rows:
            groups.append((group.title, rows))
    return groups


def _tool_order(tool):
    return (tool != "mxfp16", tool)


def _help_text(action, parser):
    text = action.help or ""
    if "%" in text:
        text = text % dict(vars(action), prog=parser.prog)
    return " ".join(text.split())


def _cli_rst(program):
    parser = program_parser(program)
    parser.prog = program if program.endswith(".py") else f"python -m {program}"
    command = f"python -m {program}" if program == "mxfp16.doctor" else f"python {program}"
    anchor = "cli-" + re.sub(r"[^a-z0-9]+", "-", program.lower()).strip("-")
    lines = [f".. _{anchor}:", "", f"``{command}``", "~" * (len(command) + 4), "",
             parser.description or "", "", "::", ""]
    lines += ["   " + line for line in parser.format_usage().strip().splitlines()] + [""]
    for title, rows in flag_rows(program):
        lines += [f".. rubric:: {title}", "", ".. list-table::", "   :header-rows: 1",
                  "   :widths: 22 60 18", "", "   * - flag", "     - meaning", "     - convention"]
        for flags, text, tools in rows:
            shown = ", ".join(f"``{flag}``" for flag in flags)
            lines += [f"   * - {shown}", f"     - {_escape(text)}", f"     - {', '.join(tools)}"]
        lines.append("")
    if parser.epilog:
        lines += [_escape(" ".join(parser.epilog.split())), ""]
    return lines


def _escape(text):
    """Help text as literal reStructuredText: backslashes, stars, backquotes and pipes escaped."""
    return re.sub(r"([\\*`|_])", r"\\\1", text)


class CliDirective(Directive):
    """``mxfp16-speedups``
    A bar chart of the Markdown table right above it in the page's source: the speed of each
    model in each low-precision dtype relative to float32, so the figure cannot disagree with
    its table (:class:`SpeedupsDirective`).  A build output, drawn by matplotlib into
    ``docs/_generated/`` (not committed).
``mxfp16-cli``: the reference of the programs named in the content (one a line)."""
    has_content = True

    def run(self):
        env = self.state.document.settings.env
        lines = []
        for program in (line.strip() for line in self.content if line.strip()):
            if program not in programs():
                raise self.error(f"{program} is not one of {', '.join(programs())}")
            lines += _cli_rst(program)
        node = nodes.section()
        nested_parse_with_titles(self.state, StringList(lines, source=env.docname), node)
        return node.children


# ---- figures of the benchmarks' tables ---------------------------------------------------------

def table_above(lines, line_number):
    """The last Markdown table of ``lines`` that ends before ``line_number`` (1-based), as a list
    of rows of stripped cells, header first (the ``|---|`` row left out)."""
    tables, current = [], []
    for line in lines[:line_number - 1]:
        if line.startswith("|"):
            current.append(line)
        elif current:
            tables.append(current)
            current = []
    if current:
        tables.append(current)
    if not tables:
        return []
    return [[cell.strip() for cell in row.strip().strip("|").split("|")] for row in tables[-1]
            if not re.match(r"^\|[-| :]+\|$", row.strip())]


def _number(cell):
    match = re.search(r"\d+(\.\d+)?", cell.replace("*", ""))
    if match is None:
        raise ValueError(f"no number in the table cell {cell!r}")
    return float(match.group())


def speedups(rows, column, dtypes, invert=False, model=None):
    """``{dtype: [(model, speed vs float32), ...]}`` of a table's ``rows`` (header first): the
    ``column``'s number for each row whose ``dtype`` cell is one of ``dtypes`` (its reciprocal
    with ``invert``, for a column of time ratios), by the first column's model (or ``model``).

    Examples
    --------
    >>> rows = [["model", "dtype", "ratio"], ["LM", "float32", "1.00"], ["LM", "bfloat16", "0.80"]]
    >>> speedups(rows, "ratio", ["bfloat16"], invert=True)
    {'bfloat16': [('LM', 1.25)]}
    """
    header, body = rows[0], rows[1:]
    if column not in header or "dtype" not in header:
        raise ValueError(f"the table above has no column {column!r} or 'dtype' (its columns: "
                         f"{', '.join(header)})")
    value_at, dtype_at = header.index(column), header.index("dtype")
    out = {dtype: [] for dtype in dtypes}
    for row in body:
        if row[dtype_at] in out:
            value = _number(row[value_at])
            out[row[dtype_at]].append((model or row[0], round(1 / value if invert else value, 3)))
    return out


def draw_speedups(data, title, path):
    """A grouped bar chart of :func:`speedups`' ``data``, float32 as the line at 1."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    models = list(dict.fromkeys(name for values in data.values() for name, _ in values))
    fig, axis = plt.subplots(figsize=(max(5.5, 1.5 * len(models) + 3.5), 3.4))
    width = 0.8 / max(1, len(data))
    for index, (dtype, values) in enumerate(data.items()):
        found = dict(values)
        xs = [at + (index - (len(data) - 1) / 2) * width for at in range(len(models))]
        bars = axis.bar(xs, [found.get(name, 0) for name in models], width, label=dtype)
        axis.bar_label(bars, fmt="%.2f", fontsize=8)
    axis.axhline(1.0, color="black", linewidth=0.8, linestyle="--", label="float32")
    axis.set_xticks(range(len(models)), models, fontsize=8)
    top = max([value for values in data.values() for _, value in values] + [1.0])
    axis.set(ylabel="speed relative to float32", title=title, ylim=(0, 1.15 * top))
    axis.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


class SpeedupsDirective(Directive):
    """``mxfp16-speedups``: the table above drawn as speed-ups; the argument is its title."""
    required_arguments, final_argument_whitespace = 1, True
    option_spec = {"column": directives.unchanged_required, "invert": directives.flag,
                   "model": directives.unchanged,
                   "dtypes": lambda text: [part.strip() for part in text.split(",")]}

    def run(self):
        env = self.state.document.settings.env
        source, line = self.state_machine.get_source_and_line(self.lineno)
        with open(source, encoding="utf-8") as file:
            rows = table_above(file.read().splitlines(), line)
        try:
            data = speedups(rows, self.options["column"],
                            self.options.get("dtypes", ["float16 (emulated)", "bfloat16"]),
                            invert="invert" in self.options, model=self.options.get("model"))
        except (ValueError, IndexError, KeyError) as error:
            raise self.error(f"mxfp16-speedups: {error}") from None
        name = f"{env.docname}-{line}.png".replace("/", "-")
        folder = os.path.join(env.srcdir, "_generated")
        os.makedirs(folder, exist_ok=True)
        draw_speedups(data, self.arguments[0], os.path.join(folder, name))
        env.note_dependency(source)
        return [nodes.image(uri=f"/_generated/{name}", alt=self.arguments[0])]


# ---- inline code -> API entries -----------------------------------------------------------------

def link_targets(entries):
    """``{inline code text: entry}``: each entry's full name, its name after ``mxfp16.`` and its
    name alone when no other entry has it and it is :func:`_distinctive`, each also with ``()``."""
    full_names = set(entries.values()) | set(api_modules())
    short = {}
    for full in full_names:
        short.setdefault(full.rsplit(".", 1)[-1], set()).add(full)
    modules = set(api_modules())
    targets = {}
    for full in sorted(full_names):
        targets[full] = full
        rest, name = full[len("mxfp16."):], full.rsplit(".", 1)[-1]
        if full.startswith("mxfp16.") and ("." in rest or _distinctive(rest, full, modules)):
            targets.setdefault(rest, full)
        if len(short[name]) == 1 and _distinctive(name, full, modules):
            targets.setdefault(name, full)
    targets.update(_aliases(entries))
    targets.update({text + "()": full for text, full in list(targets.items())})
    return targets


def _aliases(entries):
    """``{module.attribute: entry}`` for each function or class a core module imports from
    another (``mxfp16.scaling.scalers.recommend_loss_scale``, defined in ``.settings``)."""
    by_object = {}
    for (module_name, name), full in entries.items():
        value = getattr(importlib.import_module(module_name), name)
        if inspect.isclass(value) or inspect.isfunction(value):
            by_object.setdefault(id(value), full)
    aliases = {}
    for module_name in api_modules():
        for attribute, value in vars(importlib.import_module(module_name)).items():
            if not attribute.startswith("_") and id(value) in by_object:
                aliases.setdefault(f"{module_name}.{attribute}", by_object[id(value)])
    return aliases


def _distinctive(name, full, modules):
    """Whether a bare ``name`` in inline code can only mean ``full``: not a module, and a name
    with an underscore or in CamelCase (``cast_block``, ``DynamicLossScaler``), not a word such
    as ``export``, ``init`` or ``Trainer`` that other libraries use too."""
    return full not in modules and len(name) >= 8 and \
        ("_" in name.strip("_") or re.search(r"[a-z][A-Z]", name) is not None)


def _link_inline_code(app, doctree):
    if app.env.docname.startswith("api/") or app.env.docname == "cli":
        return
    targets = app.mxfp16_targets
    for literal in list(doctree.findall(nodes.literal)):
        text = literal.astext()
        if text not in targets or isinstance(literal.parent, (nodes.reference, addnodes.pending_xref)):
            continue
        target = targets[text]
        xref = addnodes.pending_xref("", refdomain="py", reftype="obj", reftarget=target,
                                     refexplicit=True, refwarn=True, refdoc=app.env.docname)
        literal.replace_self(xref)
        xref += literal


def _resolve_short_name(app, env, node, contnode):
    """``missing-reference``: a docstring's short name (``cast_block`` in ``mxfp16.casting.block``,
    ``CastBlock.export``, ``save_parameters`` inside a class) as the entry it names, when exactly
    one entry fits; anything else stays missing (and ``-n`` reports it)."""
    if node.get("refdomain") != "py":
        return None
    target, module = node["reftarget"].lstrip("~."), node.get("py:module")
    head, _, rest = target.partition(".")
    candidates = []
    for base in (module and (module, head), None):
        if base and base in app.mxfp16_entries:
            candidates.append(app.mxfp16_entries[base] + ("." + rest if rest else ""))
    if head in app.mxfp16_targets:
        candidates.append(app.mxfp16_targets[head] + ("." + rest if rest else ""))
    candidates.append("mxfp16." + target)  # amp.convert_symbol
    candidates += _methods_of_bases(app, module, node.get("py:class"), target)
    if rest and "." not in rest:  # Class.method, the method defined by a base class
        candidates += _methods_of_bases(app, module, head, rest)
    domain = env.get_domain("py")
    for candidate in candidates:
        found = domain.resolve_xref(env, node["refdoc"], app.builder, node["reftype"] if
                                    node["reftype"] != "obj" else "obj", candidate,
                                    node, contnode)
        if found is not None:
            return found
    return None


def _methods_of_bases(app, module, class_name, target):
    """``Entry.target`` for each documented class in the MRO of ``module.class_name``."""
    if not (module and class_name and "." not in target):
        return []
    try:
        cls = getattr(importlib.import_module(module), class_name.split(".")[0])
    except (ImportError, AttributeError):
        return []
    by_object = {}
    for (module_name, name), full in app.mxfp16_entries.items():
        value = getattr(importlib.import_module(module_name), name, None)
        if inspect.isclass(value):
            by_object.setdefault(id(value), full)
    return [f"{by_object[id(base)]}.{target}" for base in inspect.getmro(cls)
            if id(base) in by_object]


def _setup_entries(app):
    app.mxfp16_entries = canonical_entries()
    app.mxfp16_targets = link_targets(app.mxfp16_entries)


def setup(app):
    sys.path.insert(0, ROOT)
    app.connect("builder-inited", _setup_entries)
    app.connect("doctree-read", _link_inline_code)
    app.connect("missing-reference", _resolve_short_name)
    app.add_directive("mxfp16-modules", ModulesDirective)
    app.add_directive("mxfp16-cli", CliDirective)
    app.add_directive("mxfp16-speedups", SpeedupsDirective)
    return {"parallel_read_safe": True, "parallel_write_safe": True, "version": "1"}


