"""The docs run as written: every fenced block of README.md, CONTRIBUTING.md and docs/*.md is marked
with how it is tested (tests/docs_blocks.py says how to mark one) and the runnable ones run here, at
tiny sizes, with the output they show or promise checked.  Also: relative links and anchors
resolve, and every flag the docs give mxfp16's scripts, examples and benchmarks exists in their
``--help``.

A new block without a marker fails ``test_every_block_is_marked``; so does a marker with an unknown
KIND, a ``not-here`` without an accepted reason, or an ``after:`` of an unknown id.
"""
import concurrent.futures
import contextlib
import importlib.util
import io
import json
import os
import re
import shlex
import shutil
import subprocess
import sys

import pytest

from conftest import chosen_items, write_image_folder
from docs_blocks import (PROGRAM, ROOT, doc_pages, broken_links, flags_of, inline_code, key_lines,
                         logical_lines, parse_overrides, program_calls, read_blocks, words_of)

BLOCKS = [block for page in doc_pages() for block in read_blocks(page)]
BY_NAME = {block.name: block for block in BLOCKS}
#: Seconds one block group may take before the test fails: a hung command, not a slow machine.
TIMEOUT = 600


def _records(workdir):
    from mxfp16.train.prepare import prepare_dataset
    folder = write_image_folder(os.path.join(workdir, "_images"))
    data = prepare_dataset(folder, os.path.join(workdir, "_rec"), train_ratio=0.75, seed=0)
    for name in ("train_rec", "train_idx", "val_rec", "val_idx"):
        shutil.copy(getattr(data, name), os.path.join(workdir, name.replace("_", ".")))
    return ""


def _folder(path):
    def write(workdir):
        write_image_folder(os.path.join(workdir, path))
        return ""
    return write


def _module_checkpoint(prefix, epoch):
    """A small float32 Module checkpoint, ``PREFIX-symbol.json`` + ``PREFIX-NNNN.params``."""
    def write(workdir):
        import mxnet as mx
        net = mx.sym.Convolution(mx.sym.var("data"), num_filter=4, kernel=(3, 3), name="conv0")
        net = mx.sym.Pooling(mx.sym.BatchNorm(net, name="bn0"), global_pool=True, kernel=(1, 1),
                             pool_type="avg", name="pool0")
        net = mx.sym.FullyConnected(mx.sym.Flatten(net), num_hidden=3, name="fc")
        module = mx.mod.Module(mx.sym.SoftmaxOutput(net, name="softmax"), context=mx.cpu())
        module.bind(data_shapes=[("data", (1, 3, 8, 8))], label_shapes=[("softmax_label", (1,))])
        module.init_params(mx.init.Xavier())
        os.makedirs(os.path.dirname(os.path.join(workdir, prefix)), exist_ok=True)
        module.save_checkpoint(os.path.join(workdir, prefix), epoch)
        return ""
    return write


#: What a block's ``given:`` may name: files written into its directory (the return value is "")
#: or Python run before the block in its namespace (tiny stand-ins for the reader's own objects).
GIVEN = {
    "train.rec": _records,  # train.rec/.idx and val.rec/.idx: 4 classes of 40x48 JPEGs, 36 + 12
    "~/data/101_ObjectCategories": _folder("data/101_ObjectCategories"),  # 4 classes x 12 JPEGs
    "~/data/256_ObjectCategories": _folder("data/256_ObjectCategories"),
    "train_data": lambda _: (
        "import mxnet as mx\n"
        "train_data = [(mx.nd.random.uniform(shape=(2, 3, 32, 32)), mx.nd.array([0, 1]))] * 2\n"),
    "train_iter": lambda _: (
        "import mxnet as mx\n"
        "train_iter = mx.io.NDArrayIter(mx.nd.random.uniform(shape=(4, 3, 32, 32)),\n"
        "                               mx.nd.array([0, 1, 2, 3]), batch_size=2,\n"
        "                               label_name='softmax_label')\n"),
    "tokens": lambda _: (  # token ids, (sequence, batch): 32 sequences of 35 tokens
        "import mxnet as mx\nimport gluonnlp as nlp\n"
        "tokens = mx.nd.array(mx.nd.random.randint(0, 100, shape=(35, 32)))\n"
        "token_types, valid_length = mx.nd.zeros_like(tokens), mx.nd.full((35,), 32)\n"),
    "bert_classifier": lambda _: (  # GluonNLP's BERTClassifier, one layer, vocabulary of 100
        "import mxnet as mx\nimport gluonnlp as nlp\n"
        "_encoder = nlp.model.BERTEncoder(num_layers=1, units=16, hidden_size=32, num_heads=2,\n"
        "                                 max_length=64, dropout=0.0)\n"
        "_bert = nlp.model.BERTModel(_encoder, vocab_size=100, token_type_vocab_size=2, units=16,\n"
        "                            embed_size=16, use_pooler=True, use_decoder=False,\n"
        "                            use_classifier=False)\n"
        "bert_classifier = nlp.model.BERTClassifier(_bert, num_classes=2, dropout=0.0)\n"
        "bert_classifier.initialize(mx.init.Normal(0.02))\n"),
    "resnet50-0000.params": _module_checkpoint("resnet50", 0),
    "runs/resnet-0010.params": _module_checkpoint("runs/resnet", 10),
    "net": lambda _: (  # a small trained-shape Gluon network, called once
        "import mxnet as mx, mxfp16\nfrom mxfp16.models import get_network\n"
        "net = get_network('cifar_resnet20_v1', num_classes=4)\n"
        "net.initialize(mx.init.Xavier())\nnet.hybridize()\nnet(mx.nd.zeros((1, 3, 32, 32)))\n"),
    "build": lambda _: (  # the loop's build(), its length, seed and epoch
        "import sys\nimport mxnet as mx, mxfp16\nfrom mxnet import gluon\n"
        "def build():\n"
        "    net = gluon.nn.Dense(2, in_units=3)\n"
        "    net.initialize()\n"
        "    return net, mxfp16.Trainer(net.collect_params(), 'sgd', {'learning_rate': 0.1})\n"
        "total_steps, seed, epoch = 3, 0, 0\n"),
}


# ---- the markers --------------------------------------------------------------------------------

def test_every_block_is_marked():
    problems = [f"{block.where}: {block.problem}" for block in BLOCKS if block.problem]
    names = [block.options["id"] for block in BLOCKS if "id" in block.options]
    problems += [f"id {name!r} is given to more than one block" for name in set(names)
                 if names.count(name) > 1]
    for at, block in enumerate(BLOCKS):
        if block.kind == "after" and (block.argument not in BY_NAME
                                      or not BY_NAME[block.argument].runs):
            problems.append(f"{block.where}: after: {block.argument}: no running block has that id")
        elif block.kind == "after" and BLOCKS.index(BY_NAME[block.argument]) > at:
            problems.append(f"{block.where}: after: {block.argument}: that block comes later in "
                            "the reading order (docs_blocks.doc_pages): move it or link its page "
                            "earlier in docs/guide.md")
        if block.kind == "output" and block.argument and block.argument not in BY_NAME:
            problems.append(f"{block.where}: output: {block.argument}: no block has that id")
        problems += [f"{block.where}: given: {name!r} is not one of GIVEN ({', '.join(GIVEN)})"
                     for name in block.given if name not in GIVEN]
    assert problems == [], "\n".join(problems)


def test_the_docs_have_blocks_of_every_kind():
    """A parser that found no blocks, or markers it could not read, would pass everything."""
    kinds = {block.kind for block in BLOCKS}
    assert {"run", "after", "shared", "not-here", "output", "diff"} <= kinds
    assert len(BLOCKS) > 60


# ---- running the blocks -------------------------------------------------------------------------

def _group_of(block):
    while block.kind == "after":
        block = BY_NAME[block.argument]
    return block.name


def _groups():
    groups = {}
    for block in BLOCKS:
        if block.runs and block.problem is None and (block.kind == "run" or block.argument in BY_NAME):
            groups.setdefault(_group_of(block), []).append(block)
    return groups


GROUPS = _groups()


#: The caches of the user running the suite, kept under the groups' fresh HOMEs: what a reader's
#: machine has built once (the fused float16 rounding, about 8 CPU-s to compile, and
#: matplotlib's font list), not what a docs block shows.
CACHE = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")


def _workdir(tmp_path):
    for name in ("scripts", "examples", "benchmarks"):
        os.symlink(os.path.join(ROOT, name), tmp_path / name)
    env = dict(os.environ, HOME=str(tmp_path), XDG_CACHE_HOME=CACHE, PYTHONPATH=ROOT,
               MPLBACKEND="Agg", PYTHONDONTWRITEBYTECODE="1")
    return str(tmp_path), env


def _replace(block, text):
    replacements, _, _ = parse_overrides(block.overrides)
    for old, new in replacements:
        assert old in text, f"{block.where}: run: {old!r} => ...: the block has no {old!r}"
        text = text.replace(old, new)
    return text


def _skipped(words):
    """pip installs and the test suite itself are not run (the test runs inside them)."""
    words = [word for word in words if not re.match(r"^[A-Z_]+=", word)]
    return words[:2] == ["pip", "install"] or words[:3] == ["python", "-m", "pytest"] \
        or words[:1] == ["pytest"]


def _apply_flags(block, words, parsers, used):
    """``words`` of one command with the block's flag overrides applied to the first of mxfp16's
    programs it calls (only flags that program takes)."""
    _, flags, removals = parse_overrides(block.overrides)
    calls = program_calls(words)
    if not calls or calls[0][0] not in parsers:
        return words
    program, args = calls[0]
    start = 1 + next(at for at, word in enumerate(words)
                     if PROGRAM.search(word) or word == "mxfp16.doctor")
    end = start + len(args)
    args = list(args)
    for flag in removals:
        while flag in args:
            at = args.index(flag)
            has_value = at + 1 < len(args) and not args[at + 1].startswith("-")
            del args[at:at + 1 + has_value]
            used.add(flag)
    for flag, value in flags:
        if flag not in parsers[program]:
            continue
        used.add(flag)
        if flag in args:
            for at, arg in enumerate(args):
                if arg == flag and value is not None:
                    args[at + 1] = value
        else:
            args += [flag] + ([value] if value is not None else [])
    return words[:start] + args + words[end:]


def _bash_script(block, parsers, first_args):
    """The block as the bash script the test runs: overrides applied, ``...`` expanded (to the
    flags of the first command of that program in the block or the blocks it runs after, kept in
    ``first_args``), pip and pytest commands left out."""
    lines, used = [], set()
    for line in logical_lines(_replace(block, block.text)):
        commands, words = [], []
        for word in words_of(line) + ["&&"]:
            if word != "&&":
                words.append(word)
                continue
            calls = program_calls(words)
            if calls and "..." in calls[0][1]:
                program, args = calls[0]
                assert program in first_args, \
                    f"{block.where}: '...' before any {program} command of the block or its after: chain"
                at = words.index("...")
                words = words[:at] + first_args[program] + words[at + 1:]
            if words and not _skipped(words):
                words = _apply_flags(block, words, parsers, used)
                commands.append(" ".join("~/" + shlex.quote(word[2:]) if word.startswith("~/")
                                         else shlex.quote(word) for word in words))
                if calls:  # as it runs, the block's overrides applied
                    first_args.setdefault(calls[0][0], list(program_calls(words)[0][1]))
            words = []
        if commands:
            lines.append(" && ".join(commands))
    _, flags, removals = parse_overrides(block.overrides)
    unused = {flag for flag, _ in flags} | set(removals)
    assert unused <= used, f"{block.where}: run: {sorted(unused - used)} changes no command"
    return "\n".join(lines) + "\n"


def _run_python(blocks, workdir, env):
    """Run the python blocks of a group in one fresh process and one namespace; ``{block: output}``."""
    sources = []
    for block in blocks:
        prelude = "".join(GIVEN[name](workdir) for name in block.given)
        # blank lines first: a traceback gives the line of the page
        sources.append((block.where, prelude, "\n" * block.line + _replace(block, block.text)))
    driver = os.path.join(workdir, "_driver.py")
    with open(driver, "w") as file:
        file.write("import json, sys\nnamespace = {'__name__': '__main__'}\n"
                   f"for where, prelude, source in json.loads({json.dumps(json.dumps(sources))}):\n"
                   "    print(f'@@docs-test {where}', flush=True)\n"
                   "    print(f'@@docs-test {where}', file=sys.stderr, flush=True)\n"
                   "    exec(compile(prelude, where + ' (given)', 'exec'), namespace)\n"
                   "    exec(compile(source, where.split(':')[0], 'exec'), namespace)\n")
    done = subprocess.run([sys.executable, driver], cwd=workdir, env=env, capture_output=True,
                          text=True, timeout=TIMEOUT)
    outputs = _split(done.stdout, done.stderr)
    last = list(outputs)[-1] if outputs else blocks[0].where
    assert done.returncode == 0, f"{last} failed (exit {done.returncode}):\n{outputs.get(last, '')}"
    return outputs


def _split(stdout, stderr):
    outputs = {}
    for text in (stdout, stderr):
        where = None
        for line in text.splitlines():
            if line.startswith("@@docs-test "):
                where = line[len("@@docs-test "):]
                outputs.setdefault(where, "")
            elif where:
                outputs[where] += line + "\n"
    return outputs


def _run_bash(block, workdir, env, parsers, first_args):
    for name in block.given:
        GIVEN[name](workdir)
    script = _bash_script(block, parsers, first_args)
    done = subprocess.run(["bash", "-e", "-c", script], cwd=workdir, env=env, capture_output=True,
                          text=True, timeout=TIMEOUT)
    output = done.stdout + done.stderr
    expected = int(block.options.get("exit", 0))
    assert done.returncode == expected, \
        f"{block.where}: exit {done.returncode}, not {expected}:\n{script}\n{output[-3000:]}"
    return output


def _check_output(block, output):
    missing = [text for text in block.expects if text not in output]
    assert missing == [], f"{block.where}: the output lacks {missing}:\n{output[-3000:]}"
    for shown in BLOCKS:
        if shown.kind == "output" and shown.argument == block.name:
            got = [key for key in key_lines(output) if key in set(key_lines(shown.text))]
            keys = key_lines(shown.text)
            assert got[:len(keys)] == keys or _in_order(keys, key_lines(output)), \
                f"{shown.where} shows lines {keys}; the run of {block.where} printed {key_lines(output)}"


def _in_order(keys, got):
    position = iter(got)
    return all(key in position for key in keys)


def _run_group(group, tmp_path, parsers):
    """Run a group of blocks (a ``run`` block and the ``after:`` blocks that follow it) in a fresh
    directory, each block's output checked as it ends; python blocks share one process, bash
    blocks the directory."""
    workdir, env = _workdir(tmp_path)
    blocks = GROUPS[group]
    python = [block for block in blocks if block.lang == "python"]
    outputs = _run_python(python, workdir, env) if python else {}
    first_args = {}
    for block in blocks:
        if block.lang == "bash":
            outputs[block.where] = _run_bash(block, workdir, env, parsers, first_args)
        _check_output(block, outputs.get(block.where, ""))


def _processes(group):
    """The processes a group starts: its bash blocks' command lines, and one for its python."""
    blocks = GROUPS[group]
    return sum(len(logical_lines(block.text)) for block in blocks if block.lang == "bash") + \
        any(block.lang == "python" for block in blocks)


@pytest.fixture(scope="module")
def group_runs(request, tmp_path_factory, program_flags):
    """``{group: future of its run}`` for the groups this session runs, two groups at a time: a
    group leaves one of the two cores idle most of its time (interpreters starting, networks of a
    few layers), so two run side by side.  The groups of most processes start first (the
    training scripts' chain of 7 is the longest), so that no long group runs alone at the end."""
    selected = [item.callspec.params["group"]
                for item in chosen_items(request, "test_block_runs")]
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        yield {group: pool.submit(_run_group, group, tmp_path_factory.mktemp("docs"), program_flags)
               for group in sorted(selected, key=_processes, reverse=True)}
        pool.shutdown(cancel_futures=True)  # after -x or Ctrl-C: the groups not started yet


@pytest.mark.slow  # each group runs fresh interpreters: 2 to 50 s
@pytest.mark.parametrize("group", list(GROUPS))
def test_block_runs(group, group_runs):
    """Each group of blocks runs as written, its outputs checked (:func:`_run_group`); the groups
    run two at a time, each test waiting for its own."""
    group_runs[group].result()


# ---- shared, diff and python names ---------------------------------------------------------------

def test_shared_blocks_name_a_test_that_runs_their_programs():
    problems = []
    for block in BLOCKS:
        if block.kind != "shared":
            continue
        path = os.path.join(ROOT, block.argument)
        if not os.path.isfile(path):
            problems.append(f"{block.where}: shared: no file {block.argument}")
            continue
        test = open(path).read()
        for line in logical_lines(block.text):
            for program, _ in program_calls(words_of(line)):
                stem = os.path.basename(program)[:-3]
                if stem not in test:
                    problems.append(f"{block.where}: {block.argument} never mentions {stem}")
    assert problems == [], "\n".join(problems)


def _mxfp16_names(block):
    text = block.text
    if block.kind == "diff":
        text = "\n".join(line[1:] for line in text.splitlines() if line.startswith("+"))
    return set(re.findall(r"\bmxfp16((?:\.[A-Za-z_]\w*)+)", text))


def test_every_mxfp16_name_in_a_python_or_diff_block_exists():
    import importlib
    problems = []
    for block in BLOCKS:
        if block.lang not in ("python", "diff"):
            continue
        for dotted in sorted(_mxfp16_names(block)):
            target, parts = importlib.import_module("mxfp16"), dotted[1:].split(".")
            for index, part in enumerate(parts):
                if hasattr(target, part):
                    target = getattr(target, part)
                    continue
                try:
                    target = importlib.import_module("mxfp16." + ".".join(parts[:index + 1]))
                except ImportError:
                    problems.append(f"{block.where}: mxfp16{dotted} does not exist")
                    break
    assert problems == [], "\n".join(problems)


def test_the_readme_counts_the_example_scripts():
    """README's "examples/ holds N complete scripts" (it said six when there were seven)."""
    words = ("one two three four five six seven eight nine ten eleven twelve").split()
    readme = open(os.path.join(ROOT, "README.md")).read()
    said = re.search(r"`examples/` holds (\w+) complete scripts", readme).group(1)
    scripts = [name for name in os.listdir(os.path.join(ROOT, "examples"))
               if name.endswith(".py") and name != "common.py"]
    assert words.index(said) + 1 == len(scripts), sorted(scripts)


# ---- links and flags ----------------------------------------------------------------------------

def test_relative_links_and_anchors_resolve():
    problems = [problem for page in doc_pages() for problem in broken_links(page)]
    assert problems == [], "\n".join(problems)


def _help_flags(program):
    """The flags ``program --help`` lists (its ``get_args_parser()``'s, when it has one)."""
    if program == "mxfp16/doctor":
        from mxfp16.doctor.__main__ import get_args_parser
        return {flag for action in get_args_parser()._actions for flag in action.option_strings}
    path = os.path.join(ROOT, program)
    directory = os.path.dirname(path)
    added = directory not in sys.path
    if added:
        sys.path.insert(0, directory)  # examples/common.py, benchmarks/bench_common.py
    try:
        spec = importlib.util.spec_from_file_location(f"docs_{program.replace('/', '_')}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        if hasattr(module, "get_args_parser"):
            return {flag for action in module.get_args_parser()._actions
                    for flag in action.option_strings}
        shown = io.StringIO()
        with contextlib.redirect_stdout(shown), pytest.raises(SystemExit):
            module.main(["--help"])
        return set(re.findall(r"(?<![\w-])(--?[A-Za-z][\w-]*)", shown.getvalue()))
    finally:
        if added:
            sys.path.remove(directory)


@pytest.fixture(scope="module")
def program_flags():
    """``{program: set of its flags}`` for every mxfp16 program the docs call, and scripts/*."""
    programs = {program for _, words in _doc_commands() for program, _ in program_calls(words)}
    programs |= {"scripts/" + name for name in os.listdir(os.path.join(ROOT, "scripts"))
                 if name.endswith(".py")}
    return {program: _help_flags(program) for program in sorted(programs)
            if os.path.exists(os.path.join(ROOT, program)) or program == "mxfp16/doctor"}


def _doc_commands():
    """``(where, words)`` of every command line in the docs' bash blocks and inline code."""
    for block in BLOCKS:
        if block.lang in ("bash", "sh", "") and block.kind not in ("output",):
            for line in logical_lines(block.text):
                yield block.where, words_of(line)
    for page in doc_pages():
        for number, code in inline_code(page):
            if re.search(r"(scripts|examples|benchmarks)/\w+\.py|mxfp16\.doctor", code) and \
                    re.search(r"^python |\s-", code):
                try:
                    yield f"{page}:{number}", words_of(code)
                except ValueError:  # an unbalanced quote in prose: not a command
                    continue


def test_every_flag_the_docs_give_a_program_is_in_its_help(program_flags):
    problems = []
    for where, words in _doc_commands():
        for program, args in program_calls(words):
            if program not in program_flags:
                problems.append(f"{where}: {program} does not exist")
                continue
            problems += [f"{where}: {program} has no flag {flag}" for flag in flags_of(args)
                         if flag not in program_flags[program]]
    assert problems == [], "\n".join(problems)
