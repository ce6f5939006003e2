"""Running one candidate: compile vs run errors, out of memory, accuracy the way torch judges it.

The test-backend cases call `run_candidate` in this process (those backends neither crash nor
hang); the real-inductor cases run in sandbox children of one warm pool, as in production.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from torch import fx

from minify_contract.models import FailureSpec, JobSpec
from minify_worker.outcomes import Fails, Invalid, OutOfMemory, Passes, outcome_from_dict
from minify_worker.programs.fx.graph import graph_to_wire
from minify_worker.programs.fx.run import run_candidate
from minify_worker.sandbox import SandboxPool, compile_cache_dir
from tests.support import calls
from tests.support.backends import PREFIX
from tests.support.graphs import chain_graph

pytestmark = pytest.mark.usefixtures("test_backends_allowed")


def run(ops: tuple[str, ...], backend: str, tmp_path: Path, **failure: object) -> object:
    spec = JobSpec(backend=backend, failure=FailureSpec(**failure))
    gm = fx.GraphModule(torch.nn.Module(), chain_graph(*ops))
    return run_candidate(gm, [torch.randn(20, 20)], spec, tmp_path)


def test_a_graph_the_backend_handles_passes(tmp_path: Path) -> None:
    assert isinstance(run(("relu", "cos"), "eager", tmp_path), Passes)
    assert isinstance(run(("relu", "cos"), "aot_eager", tmp_path), Passes)


def test_an_exception_while_compiling_is_a_compile_error(tmp_path: Path) -> None:
    outcome = run(("relu", "cos"), f"{PREFIX}:fail_on_relu", tmp_path)
    assert isinstance(outcome, Fails)
    assert (outcome.signature.kind, outcome.signature.exc_type, outcome.signature.key) == \
        ("compile_error", "RuntimeError", "injected failure on relu")


def test_an_exception_while_running_is_a_runtime_error(tmp_path: Path) -> None:
    outcome = run(("relu",), f"{PREFIX}:fail_on_relu_at_runtime", tmp_path)
    assert isinstance(outcome, Fails) and outcome.signature.kind == "runtime_error"


def test_a_different_error_gets_a_different_signature(tmp_path: Path) -> None:
    relu = run(("relu",), f"{PREFIX}:fail_on_relu", tmp_path)
    cos = run(("cos",), f"{PREFIX}:fail_on_cos", tmp_path)
    assert isinstance(relu, Fails) and isinstance(cos, Fails)
    assert not relu.signature.same_as(cos.signature)


def test_an_allocator_out_of_memory_is_out_of_memory(tmp_path: Path) -> None:
    assert isinstance(run(("relu",), f"{PREFIX}:oom_on_relu", tmp_path), OutOfMemory)


def test_a_numerically_wrong_backend_is_an_accuracy_error(tmp_path: Path) -> None:
    outcome = run(("relu", "cos"), f"{PREFIX}:wrong_on_relu", tmp_path, kind="accuracy")
    assert isinstance(outcome, Fails)
    assert (outcome.signature.kind, outcome.signature.exc_type) == ("accuracy", "AccuracyError")


def test_an_accurate_backend_passes_the_accuracy_check(tmp_path: Path) -> None:
    assert isinstance(run(("relu", "cos"), "aot_eager", tmp_path, kind="accuracy"), Passes)


def test_a_compile_error_in_accuracy_mode_is_not_an_accuracy_error(tmp_path: Path) -> None:
    outcome = run(("relu",), f"{PREFIX}:fail_on_relu", tmp_path, kind="accuracy")
    assert isinstance(outcome, Fails) and outcome.signature.kind == "compile_error"


def test_a_backend_outside_the_allowed_prefixes_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MINIFY_ALLOWED_BACKENDS", "somebody_else.")
    outcome = run(("relu",), f"{PREFIX}:fail_on_relu", tmp_path)
    assert isinstance(outcome, Invalid) and "MINIFY_ALLOWED_BACKENDS" in outcome.message


def test_an_unknown_inductor_config_key_is_invalid(tmp_path: Path) -> None:
    spec = JobSpec(backend="eager", config={"cpp.no_such_option": 1})
    gm = fx.GraphModule(torch.nn.Module(), chain_graph("relu"))
    outcome = run_candidate(gm, [torch.randn(2)], spec, tmp_path)
    assert isinstance(outcome, Invalid) and "cpp.no_such_option" in outcome.message


# -- real inductor, in sandbox children -------------------------------------------------------


@pytest.fixture(scope="module")
def inductor_pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SandboxPool]:
    workdir = tmp_path_factory.mktemp("inductor")
    torch.save({"x": torch.randn(20, 20)}, workdir / "values.pt")
    spec = JobSpec(config={"cpp.inject_relu_bug_TESTING_ONLY": "compile_error"})
    with SandboxPool(workdir, workdir / "values.pt", spec, parallelism=2, env=calls.ALLOWED) as pool:
        yield pool


def run_in_child(pool: SandboxPool, ops: tuple[str, ...], spec: JobSpec) -> object:
    result = pool.call(f"{calls.PREFIX}:run_with_spec",
                       {"wire_graph": graph_to_wire(chain_graph(*ops)), "spec_json": spec.model_dump_json()},
                       timeout_s=300)
    return outcome_from_dict(result)


@pytest.mark.inductor
def test_inductor_relu_compile_error_has_one_signature_for_relu_cos_and_relu_alone(
        inductor_pool: SandboxPool) -> None:
    relu_cos = inductor_pool.submit(graph_to_wire(chain_graph("relu", "cos")), timeout_s=300)
    relu = inductor_pool.submit(graph_to_wire(chain_graph("relu")), timeout_s=300)
    first, second = relu_cos.result(), relu.result()
    assert isinstance(first, Fails) and isinstance(second, Fails)
    assert (first.signature.kind, first.signature.exc_type) == ("compile_error", "CppCompileError")
    assert "was not declared in this scope" in first.signature.key
    assert first.signature.same_as(second.signature)


@pytest.mark.inductor
def test_inductor_relu_runtime_error_is_a_runtime_error(inductor_pool: SandboxPool) -> None:
    spec = JobSpec(config={"cpp.inject_relu_bug_TESTING_ONLY": "runtime_error"})
    outcome = run_in_child(inductor_pool, ("relu", "cos"), spec)
    assert isinstance(outcome, Fails)
    assert (outcome.signature.kind, outcome.signature.exc_type) == ("runtime_error", "RuntimeError")


@pytest.mark.inductor
def test_inductor_relu_accuracy_bug_is_an_accuracy_error(inductor_pool: SandboxPool) -> None:
    spec = JobSpec(config={"cpp.inject_relu_bug_TESTING_ONLY": "accuracy"}, failure=FailureSpec(kind="accuracy"))
    outcome = run_in_child(inductor_pool, ("relu", "cos"), spec)
    assert isinstance(outcome, Fails)
    assert (outcome.signature.kind, outcome.signature.exc_type) == ("accuracy", "AccuracyError")


@pytest.mark.inductor
def test_a_kernel_left_half_written_in_the_compile_cache_is_rebuilt_not_reported(inductor_pool: SandboxPool) -> None:
    """A child killed while its compiler wrote a kernel (a cancelled candidate) leaves a truncated
    .so in the shared cache; the next candidate needing that kernel must not fail with "file too
    short" (a different bug, or worse: a lost reduction step), but rebuild it."""
    started = time.time()
    graph = fx.Graph()
    x = graph.placeholder("x")
    x.meta["minify_value"] = "x"
    # A constant no earlier run used (exact in binary, so its C++ source spells it as repr does): its
    # kernel is new, and its source names it. The cache is the machine's, shared with the tests that
    # other xdist workers run meanwhile: only kernels whose source has the constant are this test's.
    constant = 2.0 + random.randrange(1, 2**20) / 2**20
    scaled = graph.call_function(torch.ops.aten.mul.Tensor, (x, constant))
    graph.output((graph.call_function(torch.ops.aten.sin.default, (scaled,)),))
    wire = graph_to_wire(graph)
    assert isinstance(inductor_pool.submit(wire, timeout_s=300).result(), Passes)
    kernels = [path for path in (compile_cache_dir(inductor_pool.root) / "inductor").rglob("*.so")
               if path.stat().st_mtime >= started and repr(constant) in _source_of(path)]
    assert kernels, f"the candidate compiled no kernel with {constant!r} into the cache"
    sizes = {path: path.stat().st_size for path in kernels}
    for path in kernels:
        os.truncate(path, 64)

    outcome = inductor_pool.submit(wire, timeout_s=300).result()

    assert isinstance(outcome, Passes), outcome
    assert all(path.stat().st_size == size for path, size in sizes.items())


def _source_of(kernel: Path) -> str:
    """The C++ inductor compiled `kernel` (x.main.so) from: x.main.cpp beside it, or x.cpp."""
    for source in (kernel.with_suffix(".cpp"), kernel.with_name(kernel.name.split(".")[0] + ".cpp")):
        if source.is_file():
            return source.read_text(errors="replace")
    return ""


def test_config_keys_of_dynamo_and_functorch_are_set_in_their_modules() -> None:
    import torch._dynamo.config as dynamo_config
    import torch._functorch.config as functorch_config

    from minify_worker.programs.fx.backends import apply_inductor_config

    saved = dynamo_config.cache_size_limit, functorch_config.donated_buffer
    try:
        apply_inductor_config({"torch._dynamo.config.cache_size_limit": 17,
                               "torch._functorch.config.donated_buffer": False})
        assert dynamo_config.cache_size_limit == 17
        assert functorch_config.donated_buffer is False
    finally:
        dynamo_config.cache_size_limit, functorch_config.donated_buffer = saved
