"""Child process: run torch's own minifier on one .pt2, the way `after_aot`'s `minify` command does.

    python bench/torch_side.py PROGRAM.pt2 --mode inprocess|isolate --result FILE [--config JSON]
                               [--backend inductor|MODULE:CALLABLE] [--kind compile_error|accuracy]

`repro_minify` (torch/_dynamo/repro/after_aot.py) calls
`minifier(mod, args, module_fails=..., dump_state=dump_compiler_graph_state(compiler_name="inductor"))`
under `torch.no_grad()` and `dynamo.config.patch(repro_after=None)`; `module_fails` is
`inductor_fails` (in-process) or `isolate_fails` (`--isolate`: a repro script per check, run by a
fresh Python). We do the same, on the flat core-aten graph of the program with parameters and
buffers as inputs, and wrap `module_fails` to count and time the checks. The strategy each check
belongs to is read from the minifier's own stderr lines ("Strategy: ...", "SUCCESS: ...").

Run it with the working directory set to a scratch folder: torch writes `isolate/`, checkpoints and
`repro.py` into the current directory. The result file is rewritten after every check, so a
parent that kills this process at its time limit still knows how far it got.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import re
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TextIO

from common import DEFAULT_CONFIG, RunResult, apply_inductor_config, result_to_json, write_json

_STRATEGY_LINE = re.compile(r"^Strategy: (?P<name>.+?) \(G: (?P<granularity>\d+)\)")


class StrategyTracker:
    """A stderr that passes everything through and remembers which strategy the minifier is in.

    Torch's minifier only says what it does by printing; a check made right after a "SUCCESS"
    line is its re-verification of the candidate it just accepted (the same graph, checked again).
    """

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.current = "sanity check of the original"
        self._line = ""

    def write(self, text: str) -> int:
        self._line += text
        while "\n" in self._line:
            line, self._line = self._line.split("\n", 1)
            self._observe(line)
        return self.stream.write(text)

    def flush(self) -> None:
        self.stream.flush()

    def _observe(self, line: str) -> None:
        match = _STRATEGY_LINE.match(line)
        if match:
            self.current = f"{match['name']} (G {match['granularity']})"
        elif line.startswith("SUCCESS:"):
            self.current = "re-check of accepted candidate"
        elif line.startswith("FAIL:"):
            self.current = "final check"

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


def flat_inputs(program: Any) -> list[Any]:
    """The program's placeholders' values, in graph order: parameters, buffers, constants, user inputs."""
    import torch
    from torch.export.graph_signature import InputKind

    args, kwargs = program.example_inputs or ((), {})
    user_values = iter(torch.utils._pytree.tree_leaves((args, kwargs)))
    values: list[Any] = []
    for spec in program.graph_signature.input_specs:
        if spec.kind == InputKind.USER_INPUT:
            values.append(next(user_values))
        elif spec.kind in (InputKind.PARAMETER, InputKind.BUFFER) and spec.target in program.state_dict:
            values.append(program.state_dict[spec.target])
        elif spec.target in program.constants:
            values.append(program.constants[spec.target])
        else:
            raise ValueError(f"no value for input {spec.arg.name} ({spec.kind.name} {spec.target})")
    return [value.detach() if isinstance(value, torch.Tensor) else value for value in values]


def backend_fails(backend_name: str, kind: str) -> Callable[..., bool]:
    """Torch's check for a custom backend, as after_aot makes it for its own compilers: any
    exception while compiling or running counts as failing (`inductor_fails`); for accuracy,
    `backend_accuracy_fails` (the comparison after_aot's accuracy minifier uses)."""
    import importlib

    import torch
    from torch._dynamo.debug_utils import backend_accuracy_fails

    module_name, _, attribute = backend_name.partition(":")
    backend = getattr(importlib.import_module(module_name), attribute)

    class Compiled(torch.nn.Module):
        """What the comparison expects a compiler to return: a module (it lists its parameters)."""

        def __init__(self, run: Callable[..., Any]) -> None:
            super().__init__()
            self.run = run

        def forward(self, *args: Any) -> Any:
            return self.run(*args)

    def compile_to_module(candidate: Any, candidate_inputs: list[Any]) -> Any:
        return Compiled(backend(candidate, candidate_inputs))

    def fails(candidate: Any, candidate_inputs: Sequence[Any], check_str: str | None = None) -> bool:
        if kind == "accuracy":
            return backend_accuracy_fails(candidate, candidate_inputs, compile_to_module)
        try:
            backend(candidate, list(candidate_inputs))(*candidate_inputs)
        except Exception:
            return True
        return False

    return fails


def count_ops(graph: Any) -> int:
    return sum(1 for node in graph.nodes if node.op == "call_function")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("program", type=Path)
    parser.add_argument("--mode", choices=("inprocess", "isolate"), required=True)
    parser.add_argument("--case", default="")
    parser.add_argument("--result", type=Path, required=True)
    parser.add_argument("--config", default=json.dumps(DEFAULT_CONFIG), help="inductor config, JSON")
    parser.add_argument("--backend", default="inductor", help='"inductor" or a "module:callable" torch.compile backend')
    parser.add_argument("--kind", default="compile_error", help="compile_error, or accuracy")
    parser.add_argument("--device", default="cpu", help="where the program lives (it was exported there)")
    parser.add_argument("--signature", default=None,
                        help="ignored: torch's minifier takes no signature (any failure of the check counts)")
    options = parser.parse_args(argv)

    process_start = time.perf_counter()
    import torch
    import torch._dynamo.config as dynamo_config
    from torch._dynamo.repro.after_aot import ACCURACY_FAILS, dump_compiler_graph_state, isolate_fails
    from torch._functorch.fx_minifier import minifier

    # Isolated children get the override too: their repro script embeds inductor's whole config.
    apply_inductor_config(json.loads(options.config))
    minifier_name = "torch" if options.mode == "inprocess" else "torch-isolate"
    result = RunResult(case=options.case, minifier=minifier_name, checks_distinct=0, check_s_total=0.0)

    program = torch.export.load(options.program)
    graph_module = program.graph_module
    inputs = [value.to(options.device) if isinstance(value, torch.Tensor) else value for value in flat_inputs(program)]
    result.ops_initial = count_ops(graph_module.graph)

    tracker = StrategyTracker(sys.stderr)
    sys.stderr = tracker
    seen_codes: set[str] = set()

    module_fails: Callable[..., bool]
    if options.backend != "inductor":
        module_fails = backend_fails(options.backend, options.kind)
    elif options.mode == "inprocess":
        # after_aot's own check: inductor_fails, or for accuracy its fp64 comparison (`--accuracy accuracy`)
        module_fails = ACCURACY_FAILS["accuracy" if options.kind == "accuracy" else ""]
    else:
        module_fails = functools.partial(
            isolate_fails,
            env={"CUDA_VISIBLE_DEVICES": "0"},
            compiler_name="inductor",
            save_dir=str(Path.cwd() / "checkpoints"),
            accuracy="",
            tracing_mode="real",
        )

    def counted_fails(candidate: torch.fx.GraphModule, candidate_inputs: Sequence[Any]) -> bool:
        started = time.perf_counter()
        fails = module_fails(candidate, candidate_inputs, check_str=None)
        duration = time.perf_counter() - started
        code = hashlib.sha256(
            (candidate.code + repr([tuple(getattr(i, "shape", ())) for i in candidate_inputs])).encode()
        ).hexdigest()
        duplicate = code in seen_codes
        seen_codes.add(code)
        result.checks += 1
        result.checks_distinct = len(seen_codes)
        result.check_s_total = (result.check_s_total or 0.0) + duration
        entry = result.by_strategy.setdefault(
            tracker.current, {"checks": 0, "fails": 0, "duplicates": 0, "seconds": 0.0}
        )
        entry["checks"] += 1
        entry["fails"] += int(fails)
        entry["duplicates"] += int(duplicate)
        entry["seconds"] = round(entry["seconds"] + duration, 3)
        result.wall_s = time.perf_counter() - minify_start
        result.process_s = time.perf_counter() - process_start
        write_json(options.result, result_to_json(result))
        return fails

    minify_start = time.perf_counter()
    try:
        with torch.no_grad(), dynamo_config.patch(repro_after=None):
            final_module, final_inputs = minifier(
                graph_module,
                inputs,
                module_fails=counted_fails,
                dump_state=functools.partial(dump_compiler_graph_state, compiler_name="inductor"),
            )
    except Exception as error:  # a bench reports a minifier's crash, it does not stop on it
        result.status = "error"
        result.error = f"{type(error).__name__}: {error}"
    else:
        result.ops_final = count_ops(final_module.graph)
        result.inputs_final = len(final_inputs)
        result.final_code = final_module.code
    result.wall_s = time.perf_counter() - minify_start
    result.process_s = time.perf_counter() - process_start
    sys.stderr = tracker.stream
    write_json(options.result, result_to_json(result))
    return 0 if result.status == "ok" else 1


if __name__ == "__main__":
    sys.exit(main())
