"""`python -m tests.support.cuda_parent PROGRAM OUT SPEC_JSON [--preload] [--poison]`: minify as a worker does.

With --preload the process preloads (imports, warm-up) and the engine forks its fork server from
it, as an RQ work horse does; without, it spawns one, as the offline command does. --poison sets
`tests.support.backends.POISONED` here first, so forked sandbox children see it and spawned ones
do not. Prints the result as JSON: status, reason, sandbox_start, graph_code.
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
    parser.add_argument("spec")
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
    result = minify(args.program, JobSpec.model_validate_json(args.spec), args.out)
    print(json.dumps({"status": result.status.value, "reason": result.reason,
                      "sandbox_start": result.report.sandbox_start, "graph_code": result.report.graph_code,
                      "signature": result.report.signature}))


if __name__ == "__main__":
    main()
