"""Child process: run our engine on one .pt2, as `minify-worker minify` does offline.

    python bench/ours_side.py PROGRAM.pt2 --out DIR --result FILE [--config JSON] [--parallelism N]
                              [--backend NAME] [--kind KIND] [--signature TEXT]

The engine isolates every candidate by design (a fork server, one child per candidate), so there
is no in-process variant to compare. The result file is rewritten on every progress event, so a
parent that kills this process at its time limit still knows how far it got.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from common import DEFAULT_CONFIG, RunResult, result_to_json, write_json


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("program", type=Path)
    parser.add_argument("--case", default="")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--result", type=Path, required=True)
    parser.add_argument("--config", default=json.dumps(DEFAULT_CONFIG), help="inductor config, JSON")
    parser.add_argument("--backend", default="inductor", help="the job spec's backend")
    parser.add_argument("--kind", default="compile_error", help="the job spec's failure kind")
    parser.add_argument("--signature", default=None,
                        help="the job spec's failure.signature, as a capture gives it (run.py --given-signature)")
    parser.add_argument("--parallelism", type=int, default=None)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--reuse", type=int, default=None, help="candidates per long-lived sandbox child")
    parser.add_argument("--no-culprit", dest="culprit", action="store_false",
                        help="skip the culprit phase (the spec's culprit: false)")
    parser.add_argument("--no-preload", dest="preload", action="store_false",
                        help="spawn the fork server (a fresh interpreter) instead of forking it from this process")
    options = parser.parse_args(argv)

    process_start = time.perf_counter()
    if options.reuse is not None:
        os.environ["MINIFY_SANDBOX_REUSE"] = str(options.reuse)
    from minify_contract.models import JobSpec, ProgressEvent
    from minify_worker.engine import minify
    from minify_worker.sandbox import preload

    preload_s = None
    if options.preload:
        # What `minify-worker` (the RQ worker) does once at start, before any job. Torch's side has
        # imported inductor before its clock starts too (through after_aot).
        started = time.perf_counter()
        # As the offline command does: inductor's CPU warm-up only for a CPU job (on the H200 it
        # took 53 s cold, which a CUDA job never uses).
        preload(warm=options.backend in ("inductor", "aot_inductor") and options.device == "cpu")
        preload_s = round(time.perf_counter() - started, 2)

    spec = JobSpec(
        backend=options.backend,
        device=options.device,
        config=json.loads(options.config),
        failure={"kind": options.kind, "signature": options.signature},
        limits={"parallelism": options.parallelism},
        shrink=False,  # torch's minifier does not shrink inputs: the bench compares the reductions
        culprit=options.culprit,  # on, as for users; its seconds are a column of their own (run.py)
    )
    result = RunResult(case=options.case, minifier="ours" if options.preload else "ours-spawn", preload_s=preload_s)

    def on_event(event: ProgressEvent) -> None:
        if event.type != "progress":
            return
        if event.phase and event.phase not in result.phases:
            result.phases[event.phase] = round(time.perf_counter() - minify_start, 2)
        result.checks = event.checks_total
        result.checks_cached = event.checks_cached
        result.ops_initial = event.nodes_original
        result.wall_s = time.perf_counter() - minify_start
        result.process_s = time.perf_counter() - process_start
        write_json(options.result, result_to_json(result))

    def on_result(delivered: object) -> None:
        """The result is delivered (artifacts written) before the culprit phase, and before the
        original's verdict where the failure is known (a given signature): what a user waits for."""
        result.repro_s = time.perf_counter() - minify_start
        result.delivered_at = time.clock_gettime(time.CLOCK_MONOTONIC)  # system-wide: the parent's clock too
        write_json(options.result, result_to_json(result))

    minify_start = time.perf_counter()
    try:
        # An engine from before the result came first (--ours-rev) has no on_result: repro_s stays unset.
        delivery = {"on_result": on_result} if "on_result" in inspect.signature(minify).parameters else {}
        outcome = minify(options.program, spec, options.out, on_event=on_event, **delivery)
    except Exception as error:  # the engine promises not to raise; a bench reports it if it does
        result.status = "error"
        result.error = f"{type(error).__name__}: {error}"
    else:
        report = outcome.report
        result.status = "ok" if outcome.status.value == "succeeded" else "error"
        result.error = None if result.status == "ok" else f"{outcome.status.value}: {outcome.reason}"
        result.checks = report.checks_total
        result.checks_cached = report.checks_cached
        result.checks_distinct = report.checks_total - report.checks_cached
        result.original_runs = report.original_runs
        result.ops_initial = report.nodes_original
        result.ops_final = report.nodes_final
        result.final_code = report.graph_code
        result.outcomes = dict(report.outcomes)
        result.phase_s = dict(report.phase_s)
        result.sandbox_start = report.sandbox_start
    result.wall_s = time.perf_counter() - minify_start
    result.process_s = time.perf_counter() - process_start
    write_json(options.result, result_to_json(result))
    return 0 if result.status == "ok" else 1


if __name__ == "__main__":
    sys.exit(main())
