"""Check this machine before a long float16 job: ``python -m mxfp16.doctor [--json] [--bench]``."""
import argparse
import json
import sys

from . import diagnose
from .render import render_text


class _OneLineParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose usage errors are one ``error: ...`` line and exit code 2."""

    def error(self, message):
        self.exit(2, f"error: {message}\n")


def get_args_parser():
    """The doctor's flags: ``--json`` and ``--bench``."""
    parser = _OneLineParser(prog="python -m mxfp16.doctor", description=__doc__.split(":")[0])
    parser.add_argument("--json", action="store_true",
                        help="print the report as JSON, for tools (default: text)")
    parser.add_argument("--bench", action="store_true",
                        help="also time a float32 GEMM against each low-precision dtype that runs "
                             "natively here, a few seconds (default: off)")
    return parser


def main(argv=None):
    """Print the report of this machine; the exit code is 0 (2 for bad flags), also when MXNet
    does not import (the report names why and the fix).

    Parameters
    ----------
    argv : list of str, optional
        The flags (default ``sys.argv[1:]``).

    Returns
    -------
    int

    Examples
    --------
    >>> import contextlib, io
    >>> with contextlib.redirect_stdout(io.StringIO()) as out:
    ...     code = main(["--json"])
    >>> code, json.loads(out.getvalue())["mxnet_version"]
    (0, '1.9.1')
    """
    args = get_args_parser().parse_args(argv)
    report = diagnose()
    if args.bench and report["mxnet_import_error"]:
        report["bench"] = []
    elif args.bench:
        from .bench import run_bench  # imports MXNet: only once it is known to import
        report["bench"] = run_bench(report)
    print(json.dumps(report, indent=2) if args.json else render_text(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
