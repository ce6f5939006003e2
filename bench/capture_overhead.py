"""What a passing compile pays with minify's capture on (docs/client.md quotes it).

Three figures on one model (a 12-layer MLP, 63 nodes in its dynamo graph): the hook's own work on a
passing compile (one copy of the graph's node list), timed 200 times on the graph dynamo really
produced; and whole `torch.compile(backend="eager")` compiles (a backend that costs nothing, so the
hook is all that differs), capture off and on alternating so warm-up and load drift hit both;
and the same compiles with crash-safe capture on (`MINIFY_CAPTURE_CRASH=1`: each graph exported
and saved to a pending folder before its first run, the folder removed after it).

    .venv/bin/python bench/capture_overhead.py
"""

from __future__ import annotations

import statistics
import tempfile
import time

import torch
from torch._dynamo.output_graph import OutputGraph

from minify_client.capture import torch_hooks
from minify_client.capture.session import CaptureSession


class Mlp(torch.nn.Module):
    def __init__(self, layers: int = 12) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(32, 32) for _ in range(layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = torch.nn.functional.gelu(layer(x)) + x
        return x.sum(-1)


class NoListener:
    level, accuracy = "dynamo", False

    def on_failure(self, failed: torch_hooks.FailedCompile) -> None:
        pass


def main() -> None:
    model, x = Mlp(), torch.randn(8, 32)

    def compile_once(backend: str) -> float:
        torch._dynamo.reset()
        started = time.perf_counter()
        torch.compile(model, backend=backend)(x)
        return time.perf_counter() - started

    graphs = []
    original = OutputGraph.call_user_compiler

    def keep_graph(self: OutputGraph, gm: torch.fx.GraphModule, example_inputs: list) -> object:
        graphs.append(gm)
        return original(self, gm, example_inputs)

    OutputGraph.call_user_compiler = keep_graph
    inductor_s = compile_once("inductor")
    OutputGraph.call_user_compiler = original
    gm = graphs[-1]
    copies = []
    for _ in range(200):
        started = time.perf_counter()
        torch_hooks._copy_graph(gm)
        copies.append(time.perf_counter() - started)
    print(f"dynamo graph: {len(gm.graph.nodes)} nodes; the hook's copy of it: median "
          f"{statistics.median(copies) * 1e3:.2f} ms; inductor compiled it in {inductor_s:.2f} s")

    listener = NoListener()
    for _ in range(5):
        compile_once("eager")
    off, on = [], []
    for _ in range(40):
        off.append(compile_once("eager"))
        torch_hooks.add_listener(listener)
        on.append(compile_once("eager"))
        torch_hooks.remove_listener(listener)
    paired = statistics.median(b - a for a, b in zip(off, on, strict=True))
    print(f"torch.compile(backend='eager'), 40 alternating fresh compiles: median capture off "
          f"{statistics.median(off) * 1e3:.1f} ms, capture on {statistics.median(on) * 1e3:.1f} ms, "
          f"median paired difference {paired * 1e3:+.1f} ms")




def crash_guard() -> None:
    model, x = Mlp(), torch.randn(8, 32)
    with tempfile.TemporaryDirectory() as directory:
        guarded = CaptureSession(directory, crash=True)

        def compile_once(listener: object | None) -> float:
            torch._dynamo.reset()
            if listener is not None:
                torch_hooks.add_listener(listener)
            started = time.perf_counter()
            torch.compile(model, backend="eager")(x)
            elapsed = time.perf_counter() - started
            if listener is not None:
                torch_hooks.remove_listener(listener)
            return elapsed

        for _ in range(2):
            compile_once(guarded)
        off, on = [], []
        for _ in range(10):
            off.append(compile_once(NoListener()))
            on.append(compile_once(guarded))
    paired = statistics.median(b - a for a, b in zip(off, on, strict=True))
    print(f"crash-safe capture, 10 alternating fresh compiles and first runs: median capture on "
          f"{statistics.median(off) * 1e3:.1f} ms, crash-safe on {statistics.median(on) * 1e3:.1f} ms, "
          f"median paired difference {paired * 1e3:+.1f} ms (one export and save per compiled graph)")


if __name__ == "__main__":
    main()
    crash_guard()
