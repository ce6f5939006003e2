"""A stand-in vendor compiler for `backend: command` (tests/worker/programs/stablehlo/test_stablehlo_engine.py), run as
`python hlo_compiler.py MODULE.mlir`: it refuses a reduce-max (`error: ...`, exit status 1), and
dies of SIGSEGV on a module with a multiply but no reduce-max (a crash in a candidate); it accepts
everything else."""

from __future__ import annotations

import os
import signal
import sys


def main() -> int:
    text = open(sys.argv[1]).read()
    if "stablehlo.reduce" in text and "stablehlo.maximum" in text:
        print("error: reduce-max is not supported on this target", file=sys.stderr)
        return 1
    if "stablehlo.multiply" in text:
        os.kill(os.getpid(), signal.SIGSEGV)
    return 0


if __name__ == "__main__":
    sys.exit(main())
