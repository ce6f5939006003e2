"""`python -m tests.support.cuda_parent PROGRAM OUT SPEC_JSON [SPEC_JSON ...] [--preload] [--poison]`: minify
as a worker does.

With --preload the process preloads (imports, warm-up) and the engine forks its fork server from
it, as an RQ work horse does; without, it spawns one, as the offline command does. --poison sets
`tests.support.backends.POISONED` here first, so forked sandbox children see it and spawned ones
do not. Prints the result as JSON: status, reason, sandbox_start, graph_code.

Several specs are several jobs, one after the other in this one process, as a long-lived worker
runs them (a process that imports torch and preloads costs seconds of CPU; the tests that need
one such process per claim share it): job N writes to OUT/N, prints its own line, and with the
CUDA spy's log set (tests/support/cuda_spy) marks where its calls start with a "PID root job-N" line.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("program", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("specs", nargs="+")
    parser.add_argument("--preload", action="store_true")
    parser.add_argument("--poison", action="store_true")
    args = parser.parse_args()
    log = os.environ.get("MINIFY_CUDA_SPY_LOG")
    if log:
        with open(log, "a") as handle:
            handle.write(f"{os.getpid()} root engine\n")
    from minify_contract.models import JobSpec
    from minify_worker import sandbox
    from minify_worker.engine import minify
    from tests.support import backends

    if args.preload:
        sandbox.preload()
    backends.POISONED = args.poison
    for number, spec in enumerate(args.specs):
        if log and len(args.specs) > 1:
            with open(log, "a") as handle:
                handle.write(f"{os.getpid()} root job-{number}\n")
        out = args.out if len(args.specs) == 1 else args.out / str(number)
        result = minify(args.program, JobSpec.model_validate_json(spec), out)
        print(json.dumps({"status": result.status.value, "reason": result.reason,
                          "sandbox_start": result.report.sandbox_start, "graph_code": result.report.graph_code,
                          "signature": result.report.signature}), flush=True)


if __name__ == "__main__":
    main()
