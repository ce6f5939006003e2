"""`python -m minify_client.capture [options] script.py [args...]`: run a script as `python
script.py args...` would (runpy as `__main__`, its argv, its exit code, as cProfile does) and
capture every failing torch.compile graph and aoti_compile_and_package call it makes, into
`--dir` (default `$MINIFY_CAPTURE_DIR` or ./minify-captures) with a manifest `captures.json`.

With `--crash` (or MINIFY_CAPTURE_CRASH=1) the script runs in a child process that this one
supervises, so a compiled graph that kills it still leaves its capture (capture/crash.py); this
process then ends as the child did. With `--hang SECONDS` (or MINIFY_CAPTURE_HANG) the same, and a
compile or first run that lasts past SECONDS is stopped and captured as a hang (exit 124). With
`--diagnose` (or MINIFY_CAPTURE_DIAGNOSE=1), a failing script that compiled something and left no
capture is rerun to say which layer is to blame (capture/diagnose.py).
"""

from __future__ import annotations

import argparse
import os
import runpy
import sys
import time
import traceback

from minify_contract import signatures

from . import crash, custom_ops, diagnose, torch_hooks
from .session import CaptureSession, safe_name


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m minify_client.capture",
        description="Run a Python script and capture every failing torch.compile graph it makes for minify.")
    parser.add_argument("--dir", help="capture directory (default: $MINIFY_CAPTURE_DIR or ./minify-captures)")
    parser.add_argument("--level", choices=["dynamo", "aot"], help="the graph to capture: the one dynamo handed "
                        "the backend (default) or the one inductor received after AOT autograd")
    parser.add_argument("--accuracy", action="store_true",
                        help="also check each compiled graph's first outputs against eager (fp64 reference)")
    parser.add_argument("--crash", action="store_true",
                        help="also capture a compiled graph whose first run kills the process (a segfault, an "
                             "abort): the script runs in a supervised child; each graph is exported before its "
                             "first run")
    parser.add_argument("--hang", type=float, metavar="SECONDS",
                        help="also capture a graph whose compile or first run lasts longer than SECONDS (a compile "
                             "that never returns): the script runs in a supervised child, each graph is exported "
                             "before its compile, and one that hangs is stopped (its Python stack printed) and "
                             "captured as a timeout")
    parser.add_argument("--diagnose", action="store_true",
                        help="when the script fails after compiling something and no graph was captured, rerun it "
                             "with torch.compile off, then backends eager and aot_eager, to say which layer is to "
                             "blame (dynamo, AOT autograd or the backend)")
    parser.add_argument("script", help="the script to run")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="its arguments")
    options = parser.parse_args(argv)

    if options.dir:
        os.environ["MINIFY_CAPTURE_DIR"] = options.dir
    if options.level:
        os.environ["MINIFY_CAPTURE_LEVEL"] = options.level
    if options.accuracy:
        os.environ["MINIFY_CAPTURE_ACCURACY"] = "1"
    if options.crash:
        os.environ[crash.CRASH_ENV] = "1"
    if options.hang is not None:
        os.environ[crash.HANG_ENV] = f"{options.hang:g}"
    if options.diagnose:
        os.environ[diagnose.DIAGNOSE_ENV] = "1"
    try:
        supervised = crash.supervision_requested()
    except crash.BadHangLimit as error:
        parser.error(str(error))
    if supervised and not crash.supervised():
        return _supervise(sys.argv[1:] if argv is None else argv, safe_name(options.script))
    session = CaptureSession.from_environment()
    session.start()
    name = safe_name(options.script)
    session.begin(name)
    invoked_in = os.getcwd()
    sys.argv = [options.script, *options.args]
    sys.path.insert(0, os.path.dirname(os.path.abspath(options.script)))
    custom_ops.main_script = os.path.abspath(options.script)  # ops it registers: recorded by its name
    started = time.monotonic()
    try:
        runpy.run_path(options.script, run_name="__main__")
    except SystemExit as exit_:
        code = _exit_code(exit_.code)
        captured = session.finish()
        if code != 0:
            _diagnose(session, exit_, captured, options, name, invoked_in, time.monotonic() - started)
        return code
    except BaseException as error:
        captured = session.finish(error)
        traceback.print_exc()  # with the note saying where the capture went
        if not isinstance(error, KeyboardInterrupt):
            _diagnose(session, error, captured, options, name, invoked_in, time.monotonic() - started)
        return 130 if isinstance(error, KeyboardInterrupt) else 1
    else:
        session.finish()
        return 0
    finally:
        session.stop()


def _diagnose(session: CaptureSession, error: BaseException, captured: list[object], options: argparse.Namespace,
              name: str, invoked_in: str, seconds: float) -> None:
    """--diagnose: a failure no graph was captured for, in a script that compiled something, rerun
    to say which layer is to blame (capture/diagnose.py). One that dynamo raised before anything
    compiled is named as dynamo's at once, with or without --diagnose; one after graphs whose outputs
    the accuracy check passed though not bit for bit, in a program dynamo broke, is said to be such
    differences turned into a failure by eager code after a break (`diagnose.rounding_amplified`)."""
    if not captured and not session.compiled:
        refused = diagnose.refused_before_compile(error)
        if refused:
            print(refused, file=sys.stderr)
        return
    if captured:
        return
    amplified = diagnose.rounding_amplified(torch_hooks.passed_inexact(), diagnose.graph_breaks())
    if amplified:
        print(amplified, file=sys.stderr)
    if not diagnose.requested():
        return
    print("minify: no failing graph was captured; rerunning the script to find which layer of torch.compile "
          "is to blame (--diagnose)", file=sys.stderr)
    found = diagnose.diagnose(name, signatures.signature_line(error),
                              diagnose.script_command(options.script, options.args, invoked_in),
                              directory=session.directory, name=name, timeout_s=diagnose.rerun_timeout_s(seconds))
    print(f"{found.message}\nminify: reruns and their logs: {session.directory / diagnose.MANIFEST}", file=sys.stderr)


def _supervise(argv: list[str], name: str) -> int:
    """Run this command again as a supervised child; adopt what it left pending if it died."""
    session = CaptureSession.from_environment()
    session.begin(name)
    run = session.supervise([sys.executable, "-m", "minify_client.capture", *argv])
    for entry in run.adopted:
        print(session.describe(entry), file=sys.stderr)
    return run.exit_status()


def _exit_code(code: object) -> int:
    """What the interpreter would exit with for `sys.exit(code)`."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
