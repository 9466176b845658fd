"""The fenced blocks of the docs, their ``<!-- docs-test: ... -->`` markers, the commands inside them,
and the relative links of the pages: the reading half of tests/test_docs.py (which runs them).

A marker is the line immediately before a block's opening fence::

    <!-- docs-test: KIND[: ARGUMENT][; OPTION[: VALUE]]... -->

KINDs (the first clause):

``run`` / ``run: OVERRIDES``
    Run the block: a python block as a script in a fresh process, a bash block with ``bash -e`` in a
    fresh directory (HOME is that directory; scripts/, examples/ and benchmarks/ are linked into it,
    the repository is on PYTHONPATH).  OVERRIDES make it tiny, see :func:`parse_overrides`.
``after: ID`` (with an optional ``; run: OVERRIDES``)
    Run the block after block ID, in the same Python namespace / the same directory.
``shared: tests/test_x.py``
    A heavy block whose commands that test file runs at tiny sizes; checked: the file exists and
    names every script of the block.
``not-here: REASON``
    Cannot run on this machine; REASON starts with one of :data:`NOT_HERE_REASONS`.
``output`` / ``output: ID``
    Shown text.  With an ID, it is the output of block ID, compared by its key lines
    (:func:`key_lines`).
``diff``
    An edit of another project's script: the mxfp16 names its ``+`` lines use must exist.

OPTIONs: ``id: NAME``; ``given: NAME, NAME`` (names or files the test provides, see
tests/test_docs.py's ``GIVEN``); ``expect: TEXT`` (a line of the output must contain TEXT; repeat it
for several); ``exit: N`` (the exit code, 0 by default); ``slow`` (only in the slow tier).

In a bash block that runs, ``pip install`` and ``python -m pytest`` commands are not run (the test
runs in the installed environment, inside the suite), and a ``...`` in a command stands for the flags
of the block's first command of the same script, as the docs use it.
"""
import os
import re
import shlex
from dataclasses import dataclass, field

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

KINDS = ("run", "after", "shared", "not-here", "output", "diff")
OPTIONS = ("id", "given", "expect", "exit", "slow")
#: What a ``not-here`` reason must start with.
NOT_HERE_REASONS = ("GPU", "several machines", "a cluster", "the internet", "a long build")
MARKER = re.compile(r"^\s*<!--\s*docs-test:\s*(.*?)\s*-->\s*$")
FENCE = re.compile(r"^(\s*)(```+|~~~+)\s*([\w+-]*)")
#: mxfp16's own command-line programs, as the docs call them.
PROGRAM = re.compile(r"(?:^|/)((?:scripts|examples|benchmarks)/\w+\.py)$")
ENDS_ARGS = {"&&", "||", "|", ";", "--"}


def doc_pages():
    """Every page whose blocks are tested, in reading order: README.md, CONTRIBUTING.md, the guide
    (docs/guide.md, then the pages it links, in its order), then the other docs/*.md.  Blocks run
    in this order, so an ``after: ID`` block may continue a block of an earlier page."""
    docs = sorted(name for name in os.listdir(os.path.join(ROOT, "docs")) if name.endswith(".md"))
    guide = open(os.path.join(ROOT, "docs", "guide.md"), encoding="utf-8").read()
    linked = re.findall(r"\]\(([\w-]+\.md)\)", guide)
    order = ["guide.md"] + [name for name in dict.fromkeys(linked) if name in docs]
    order += [name for name in docs if name not in order]
    return ["README.md", "CONTRIBUTING.md"] + [os.path.join("docs", name) for name in order]


@dataclass
class Block:
    page: str
    line: int  # of the opening fence, 1-based
    lang: str
    text: str
    marker: str = None  # the marker's body, None without one
    kind: str = None
    argument: str = ""
    options: dict = field(default_factory=dict)
    problem: str = None  # why the marker is not valid

    @property
    def where(self):
        return f"{self.page}:{self.line}"

    @property
    def name(self):
        return self.options.get("id", self.where)

    @property
    def expects(self):
        return self.options.get("expect", [])

    @property
    def given(self):
        return [name.strip() for name in self.options.get("given", "").split(",") if name.strip()]

    @property
    def runs(self):
        return self.kind in ("run", "after")

    @property
    def overrides(self):
        return self.argument if self.kind == "run" else self.options.get("run", "")


def read_blocks(page):
    """The fenced blocks of ``page`` (a path relative to the repository), markers parsed."""
    lines = open(os.path.join(ROOT, page), encoding="utf-8").read().splitlines()
    blocks, index = [], 0
    while index < len(lines):
        opening = FENCE.match(lines[index])
        if not opening:
            index += 1
            continue
        indent, fence, lang = opening.groups()
        end = index + 1
        while end < len(lines) and not (lines[end].strip().startswith(fence)
                                        and lines[end].strip().strip(fence[0]) == ""):
            end += 1
        body = [line[len(indent):] if line.startswith(indent) else line.lstrip()
                for line in lines[index + 1:end]]
        marker = MARKER.match(lines[index - 1]) if index else None
        block = Block(page, index + 1, lang, "\n".join(body) + "\n",
                      marker.group(1) if marker else None)
        parse_marker(block)
        blocks.append(block)
        index = end + 1
    return blocks


def parse_marker(block):
    """Fill ``block.kind``, ``argument`` and ``options`` from its marker, or set ``problem``."""
    if block.marker is None:
        block.problem = ("no <!-- docs-test: KIND --> line before the fence (KIND: "
                         f"{', '.join(KINDS)}; see tests/docs_blocks.py)")
        return
    names = "|".join(("run",) + OPTIONS)
    clauses = re.split(rf";\s*(?=(?:{names})\b)", block.marker)
    kind, _, argument = clauses[0].partition(":")
    block.kind, block.argument = kind.strip(), argument.strip()
    for clause in clauses[1:]:
        name, _, value = clause.partition(":")
        name, value = name.strip(), value.strip()
        if name == "expect":
            block.options.setdefault("expect", []).append(value)
        else:
            block.options[name] = value or True
    block.problem = marker_problem(block)


def marker_problem(block):
    if block.kind not in KINDS:
        return f"unknown docs-test KIND {block.kind!r}: choose one of {', '.join(KINDS)}"
    if block.kind == "not-here" and not block.argument.startswith(NOT_HERE_REASONS):
        return (f"not-here needs a reason that starts with one of {', '.join(NOT_HERE_REASONS)}; "
                f"got {block.argument!r}")
    if block.kind in ("after", "shared") and not block.argument:
        return f"{block.kind}: needs {'a block id' if block.kind == 'after' else 'a test file'}"
    if "run" in block.options and block.kind != "after":
        return "'; run: OVERRIDES' goes with 'after: ID' only (else write 'run: OVERRIDES')"
    if block.runs and block.lang not in ("python", "bash"):
        return f"only python and bash blocks run, this one is {block.lang or 'plain'!r}"
    if block.options.get("exit", "0") is not True and not str(block.options.get("exit", "0")).isdigit():
        return f"exit: takes a number, got {block.options['exit']!r}"
    return None


def parse_overrides(text):
    """The size overrides of a ``run:`` marker, from its shell-quoted words.

    ``'OLD' => 'NEW'`` replaces text of the block (every occurrence; OLD must occur);
    ``--flag VALUE`` sets the flag's value in every command of mxfp16's programs that takes the flag
    (replaced where present, appended elsewhere); ``--flag`` alone adds a switch; ``!--flag`` removes
    the flag and its value.

    >>> parse_overrides("'[mx.gpu(0)]' => '[mx.cpu()]' --num-epochs 1 --quick !--gpus")
    ([('[mx.gpu(0)]', '[mx.cpu()]')], [('--num-epochs', '1'), ('--quick', None)], ['--gpus'])
    """
    words, replacements, flags, removals = shlex.split(text), [], [], []
    index = 0
    while index < len(words):
        word = words[index]
        if index + 2 < len(words) and words[index + 1] == "=>":
            replacements.append((word, words[index + 2]))
            index += 3
        elif word.startswith("!-"):
            removals.append(word[1:])
            index += 1
        elif word.startswith("-"):
            value = words[index + 1] if index + 1 < len(words) and not words[index + 1].startswith(
                ("-", "!-")) and words[index + 2:index + 3] != ["=>"] else None
            flags.append((word, value))
            index += 2 if value is not None else 1
        else:
            raise ValueError(f"run: cannot read {word!r} in {text!r}: write --flag VALUE, !--flag "
                             "or 'OLD' => 'NEW'")
    return replacements, flags, removals


def logical_lines(text):
    """The lines of a bash block with ``\\`` continuations joined; blank and comment lines dropped."""
    joined = re.sub(r"\\\n\s*", " ", text)
    return [line for line in joined.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def words_of(line):
    """A command line's words, its trailing comment dropped (split at spaces if its quotes do not
    close: then it is not a command)."""
    try:
        return _shell_words(line)
    except ValueError:
        return line.split("#")[0].split()


def _shell_words(line):
    lexer = shlex.shlex(line, posix=True, punctuation_chars="&|;")
    lexer.whitespace_split, lexer.commenters = True, "#"
    return list(lexer)


def program_calls(words):
    """``[(program, args), ...]`` for every call of mxfp16's programs among ``words``:
    ``scripts/x.py``, ``examples/x.py``, ``benchmarks/x.py`` and ``-m mxfp16.doctor``, also inside a
    quoted ``sh -c '...'`` argument.  ``args`` end at ``--``, ``&&``, ``|`` or ``;``."""
    calls = []
    for index, word in enumerate(words):
        if " " in word and ("scripts/" in word or "examples/" in word or "benchmarks/" in word):
            calls += program_calls(words_of(word))
            continue
        match = PROGRAM.search(word)
        if match or (word == "mxfp16.doctor" and index and words[index - 1] == "-m"):
            args = []
            for arg in words[index + 1:]:
                if arg in ENDS_ARGS or arg.endswith(".py"):  # a script the program runs
                    break
                args.append(arg)
            calls.append((match.group(1) if match else "mxfp16/doctor", args))
    return calls


def flags_of(args):
    """The flag names among a program's arguments (``--x=1`` gives ``--x``; ``[--x]`` gives ``--x``)."""
    flags = []
    for arg in args:
        arg = arg.strip("[]")
        if re.match(r"^--?[A-Za-z]", arg):
            flags.append(arg.split("=", 1)[0])
    return flags


def key_lines(text):
    """The lines of shown output that a run must reproduce: each line's label, the text before its
    first ``:`` (``Versions``, ``float16``, ``Problems (1)``), for lines that start at the margin
    with one; ``[...]`` lines are left out."""
    keys = []
    for line in text.splitlines():
        match = re.match(r"^(\S[^:\[]*?):(\s|$)", line)
        if match:
            keys.append(match.group(1))
    return keys


# ---- links and anchors -------------------------------------------------------------------------

def _outside_fences(page):
    """``(line_number, line)`` of ``page`` outside fenced blocks (fence lines excluded)."""
    fence = None
    for number, line in enumerate(open(os.path.join(ROOT, page), encoding="utf-8"), 1):
        opening = FENCE.match(line)
        if fence is None and opening:
            fence = opening.group(2)
        elif fence is not None and line.strip().startswith(fence) and not line.strip().strip(fence[0]):
            fence = None
        elif fence is None:
            yield number, line


def prose_lines(page, keep_code=False):
    """``(line_number, line)`` of ``page`` outside fenced blocks, with inline code removed (only its
    backticks with ``keep_code``)."""
    return [(number, line.replace("`", "") if keep_code else re.sub(r"`[^`]*`", "", line))
            for number, line in _outside_fences(page)]


def inline_code(page):
    """``(line_number, code)`` of every inline code span outside fenced blocks."""
    return [(number, code) for number, line in _outside_fences(page)
            for code in re.findall(r"`([^`]+)`", line)]


def anchors(page):
    """The anchors of a Markdown page's headings, as GitHub makes them (duplicates get -1, -2)."""
    seen, out = {}, set()
    for _, line in prose_lines(page, keep_code=True):
        match = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not match:
            continue
        slug = re.sub(r"[^\w\- ]", "", match.group(1).strip().lower()).replace(" ", "-")
        out.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
        seen[slug] = seen.get(slug, 0) + 1
    return out


def broken_links(page):
    """``page:line: link: why`` for every relative link or anchor of ``page`` that does not resolve."""
    problems = []
    headings = {}
    for number, line in prose_lines(page):
        for target in re.findall(r"\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)", line):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            resolved = os.path.normpath(os.path.join(os.path.dirname(page), path)) if path else page
            if not os.path.exists(os.path.join(ROOT, resolved)):
                problems.append(f"{page}:{number}: {target}: no file {resolved}")
            elif anchor and resolved.endswith(".md"):
                if resolved not in headings:
                    headings[resolved] = anchors(resolved)
                if anchor not in headings[resolved]:
                    problems.append(f"{page}:{number}: {target}: no heading #{anchor} in {resolved}")
    return problems
