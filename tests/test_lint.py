"""The repository's own rules, checked with every test run: ruff is clean, and the import-linter
contracts of .importlinter hold (three layers, no import cycles), and no module is over 500 lines."""
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]

#: No module of the package may grow past this (shared/STYLE.md: one module per concept).
MAX_MODULE_LINES = 500


def run(*command):
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True)


def test_ruff_is_clean():
    done = run(sys.executable, "-m", "ruff", "check", ".")
    assert done.returncode == 0, done.stdout + done.stderr


def test_import_contracts_hold():
    program = ("import sys; from importlinter.cli import lint_imports; "
               "sys.exit(lint_imports(config_filename='.importlinter', no_cache=True, no_logo=True))")
    done = run(sys.executable, "-c", program)
    assert done.returncode == 0, done.stdout + done.stderr


def test_no_module_is_over_the_line_limit():
    counts = {str(path.relative_to(ROOT)): len(path.read_text().splitlines())
              for path in (ROOT / "mxfp16").rglob("*.py")}
    assert {path: count for path, count in counts.items() if count > MAX_MODULE_LINES} == {}
