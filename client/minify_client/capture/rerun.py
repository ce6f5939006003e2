"""What runs inside one rerun of a failure no captured graph holds (capture/diagnose.py): the
program or test runs as the user ran it, and how it ended is written as JSON to `$MINIFY_RERUN_OUT`:
`{"failed": bool, "signature": "Type: key" | null, "raised_in": "torch.export" | null}` (the signature
as `signatures.signature_line` writes it, so it compares with the user's own failure; `raised_in`:
the torch module the program called when the error was raised, so that a failure inside
`torch.export`, which the program calls itself and `TORCHDYNAMO_DISABLE` does not turn off, is not
taken for the program's own).

- `python -c BY_PATH .../rerun.py script.py args...` (`diagnose.script_command`; or `python -m
  minify_client.capture.rerun script.py args...`, which imports the whole client first): the script
  as `python script.py` runs it (runpy, as `__main__`, its argv and exit code);
- `pytest -p minify_client.capture.rerun NODEID`: the test's error, as a plugin (no test that
  passes writes anything: the parent reads pytest's exit status).
"""

from __future__ import annotations

import json
import os
import runpy
import sys
import traceback
from typing import Any

from minify_contract import signatures

OUT_ENV = "MINIFY_RERUN_OUT"
# Runs this file as `__main__` from its path, its arguments after it: no package of the client is
# imported (this module needs only minify_contract's signatures).
BY_PATH = "import os, runpy, sys; sys.path[0] = os.getcwd(); runpy.run_path(sys.argv.pop(1), run_name='__main__')"


def torch_entry(error: BaseException) -> str | None:
    """The torch module the program called into when `error` was raised ("torch.export",
    "torch.nn.modules.module"): the outermost frame of its traceback inside torch's package."""
    torch = sys.modules.get("torch")
    if torch is None or not getattr(torch, "__file__", None):
        return None
    root = os.path.dirname(torch.__file__) + os.sep
    for frame, _ in traceback.walk_tb(error.__traceback__):
        filename = frame.f_code.co_filename
        if filename.startswith(root):
            module = filename[len(root):].removesuffix(".py").replace(os.sep, ".")
            return "torch." + module.removesuffix(".__init__")
    return None


def record(error: BaseException | None) -> None:
    path = os.environ.get(OUT_ENV)
    if not path:
        return
    signature = signatures.signature_line(error) if error is not None else None
    raised_in = torch_entry(error) if error is not None else None
    with open(path, "w") as out:
        json.dump({"failed": error is not None, "signature": signature, "raised_in": raised_in}, out)


def pytest_exception_interact(node: Any, call: Any, report: Any) -> None:
    if report.when == "call" and call.excinfo is not None:
        record(call.excinfo.value)


def main(argv: list[str]) -> int:
    script, *args = argv
    sys.argv = [script, *args]
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as exit_:
        failed = exit_.code not in (None, 0)
        record(exit_ if failed else None)
        return exit_.code if isinstance(exit_.code, int) else int(failed)
    except BaseException as error:
        record(error)
        traceback.print_exc()
        return 1
    record(None)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
