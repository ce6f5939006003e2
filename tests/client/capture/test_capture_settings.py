"""What made a graph compile for the user reaches the worker (issue 38, classes 5 and 6).

- Settings: a graph that reads sizes or scalars from data (`nonzero`, `.item()`, a boolean mask,
  `masked_select`) is compiled for a user only under dynamo's `capture_dynamic_output_shape_ops`
  / `capture_scalar_outputs`. The capture records them (and every other setting the user
  changed, `torch.compile(options=...)` included) in the spec's config; the worker applies them
  and compiles such a graph under dynamo, whose ShapeEnv the data-dependent sizes need (given the
  plain graph, AOT autograd's fake tensors raise `DynamicOutputShapeException`), so the captured
  program fails in the worker as it failed for the user.
- Symbols: `torch.compile(dynamic=True)` gives two equal dims one symbol (duck sizing),
  `mark_dynamic` gives each dim its own. The capture keeps which dims share a symbol, and the
  worker compiles the program with the same sharing: a failure that depends on it reproduces,
  and a program whose dims had symbols of their own does not get a shared one.

Each program is captured the user's way (`capture_failures` around `torch.compile`) and its
captured graph run as the worker runs a candidate (`run_wire_candidate`), in this process; the
settings the worker sets are restored after each test.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from minify_client.capture import capture_failures
from minify_contract.config_keys import CONFIG_MODULES
from minify_contract.models import JobSpec, JobState
from minify_worker.engine import minify
from minify_worker.outcomes import Fails
from minify_worker.programs.fx.backends import DynamicShapes, data_dependent, dynamic_shapes_of, shared_dims
from minify_worker.programs.fx.graph import flat_graph_from_exported_program
from tests.support.backends import PREFIX, fail_naming_symbol_sharing, fail_on_relu_after_aot
from tests.support.captures import run_as_the_worker
from tests.support.graphs import ops_of
from tests.support.repro import run_repro

DATA_DEPENDENT = {
    "torch._dynamo.config.capture_dynamic_output_shape_ops": True,
    "torch._dynamo.config.capture_scalar_outputs": True,
}
RELU_SIGNATURE = "RuntimeError: injected failure on relu"
SHARED = "RuntimeError: injected failure on relu: two input dims share one size symbol"
OWN = "RuntimeError: injected failure on relu: each input dim has a size symbol of its own"


@pytest.fixture(autouse=True)
def restored_settings(test_backends_allowed: None) -> Iterator[None]:
    """The config modules as they were: a candidate run in this process sets its spec's config."""
    modules: list[Any] = [importlib.import_module(name) for name in CONFIG_MODULES]
    saved = [module.get_config_copy() for module in modules]
    torch._dynamo.reset()
    yield
    for module, values in zip(modules, saved, strict=True):
        for key, value in module.get_config_copy().items():
            if value != values[key]:
                setattr(module, key, values[key])
    torch._dynamo.reset()


def captured_by_the_user(function: Callable[..., Any], inputs: tuple[torch.Tensor, ...], directory: Path,
                         backend: Any, **compile_options: Any) -> None:
    """Compile and call `function` as a user does, inside a capture block that saves into `directory`."""
    with pytest.raises(torch._dynamo.exc.BackendCompilerFailed), capture_failures(function, inputs,
                                                                                  save_to=directory):
        torch.compile(function, backend=backend, **compile_options)(*inputs)
    torch._dynamo.reset()


def spec_of(directory: Path) -> JobSpec:
    return JobSpec.model_validate_json((directory / "spec.json").read_text())


# ---------------------------------------------------------------------------------------------
# Data-dependent sizes and scalars: the settings that let them compile


def nonzero_rows(x: torch.Tensor) -> torch.Tensor:
    return torch.relu(torch.nonzero(x > 0).float() + x.sum())


def item_scale(x: torch.Tensor) -> torch.Tensor:
    return torch.relu(x * (x > 0).sum().item())


def masked(x: torch.Tensor) -> torch.Tensor:
    return torch.relu(x[x > 0] * 2)


def selected(x: torch.Tensor) -> torch.Tensor:
    return torch.relu(torch.masked_select(x, x < 0.5) - 1)


@pytest.mark.parametrize("function", [nonzero_rows, item_scale, masked, selected],
                         ids=lambda function: function.__name__)
def test_a_data_dependent_graph_fails_in_the_worker_as_it_failed_for_the_user(
        function: Callable[..., Any], tmp_path: Path) -> None:
    directory = tmp_path / "capture"
    with torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True, capture_scalar_outputs=True):
        captured_by_the_user(function, (torch.randn(16),), directory, fail_on_relu_after_aot)

    spec = spec_of(directory)
    assert spec.config.items() >= DATA_DEPENDENT.items()
    outcome = run_as_the_worker(directory, tmp_path)
    assert isinstance(outcome, Fails), outcome
    assert outcome.signature.text == RELU_SIGNATURE


@pytest.mark.parametrize(("function", "expected"), [
    (nonzero_rows, True), (item_scale, True), (masked, True), (selected, True),
    (lambda x: torch.relu(x[torch.tensor([0, 2])]), False), (lambda x: torch.relu(x).sum(), False),
], ids=["nonzero", "item", "mask", "masked_select", "integer-index", "plain"])
def test_a_graph_is_data_dependent_when_it_reads_sizes_or_scalars_from_data(
        function: Callable[..., Any], expected: bool) -> None:
    with torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True, capture_scalar_outputs=True):
        program = torch.export.export(torch.fx.symbolic_trace(function), (torch.randn(16),), strict=False)
    graph = flat_graph_from_exported_program(program)

    assert data_dependent(graph) is expected
    assert (dynamic_shapes_of(graph, "static") is not None) is expected  # through dynamo, every dim static


def test_settings_patched_around_the_compile_are_carried_in_the_spec(tmp_path: Path) -> None:
    directory = tmp_path / "capture"
    settings = {"specialize_int": True, "automatic_dynamic_shapes": False, "capture_scalar_outputs": True}
    with torch._dynamo.config.patch(**settings), torch._functorch.config.patch(donated_buffer=False):
        captured_by_the_user(item_scale, (torch.randn(8),), directory, fail_on_relu_after_aot)

    config = spec_of(directory).config
    assert {key: config.get(f"torch._dynamo.config.{key}") for key in settings} == settings
    assert config["torch._functorch.config.donated_buffer"] is False


@pytest.mark.inductor
def test_options_given_to_torch_compile_are_carried_and_reproduce(tmp_path: Path) -> None:
    directory = tmp_path / "capture"
    options = {"cpp.inject_relu_bug_TESTING_ONLY": "compile_error", "max_autotune": True}

    with pytest.raises(torch._inductor.exc.InductorError), \
            capture_failures(nonzero_rows, (torch.randn(8),), save_to=directory), \
            torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True):
        torch.compile(nonzero_rows, options=options)(torch.randn(8))
    torch._dynamo.reset()

    spec = spec_of(directory)
    assert spec.backend == "inductor" and spec.config.items() >= options.items()
    outcome = run_as_the_worker(directory, tmp_path)
    assert isinstance(outcome, Fails) and outcome.signature.exc_type == "CppCompileError", outcome


# ---------------------------------------------------------------------------------------------
# Shared size symbols


def relu_of_first(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.relu(x).sum() + y.sum()


def relu_of_transposed(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.relu(x).sum() + y.t().sum()


@pytest.mark.parametrize(("function", "shapes"), [
    (relu_of_first, [(8,), (8,)]),
    (relu_of_first, [(8, 3), (8, 5)]),
    (relu_of_transposed, [(6, 3), (3, 6)]),
], ids=["one-dim", "first-dims", "crossed-dims"])
def test_dims_that_shared_a_symbol_for_the_user_share_one_in_the_worker(
        function: Callable[..., Any], shapes: list[tuple[int, ...]], tmp_path: Path) -> None:
    directory = tmp_path / "capture"
    captured_by_the_user(function, tuple(torch.randn(shape) for shape in shapes), directory,
                         fail_naming_symbol_sharing, dynamic=True)

    assert spec_of(directory).failure.signature == SHARED
    outcome = run_as_the_worker(directory, tmp_path)
    assert isinstance(outcome, Fails) and outcome.signature.text == SHARED, outcome


def test_dims_the_user_marked_dynamic_one_by_one_keep_a_symbol_each(tmp_path: Path) -> None:
    x, y = torch.randn(8), torch.randn(8)
    torch._dynamo.mark_dynamic(x, 0)
    torch._dynamo.mark_dynamic(y, 0)
    directory = tmp_path / "capture"
    captured_by_the_user(relu_of_first, (x, y), directory, fail_naming_symbol_sharing)

    assert spec_of(directory).failure.signature == OWN
    outcome = run_as_the_worker(directory, tmp_path)
    assert isinstance(outcome, Fails) and outcome.signature.text == OWN, outcome


def test_a_user_without_duck_sizing_gets_a_symbol_per_dim_in_the_worker_too(tmp_path: Path) -> None:
    directory = tmp_path / "capture"
    with torch.fx.experimental._config.patch(use_duck_shape=False):
        captured_by_the_user(relu_of_first, (torch.randn(8), torch.randn(8)), directory,
                             fail_naming_symbol_sharing, dynamic=True)

    spec = spec_of(directory)
    assert spec.config["torch.fx.experimental._config.use_duck_shape"] is False
    assert spec.failure.signature == OWN
    outcome = run_as_the_worker(directory, tmp_path)
    assert isinstance(outcome, Fails) and outcome.signature.text == OWN, outcome


def test_two_shared_symbols_of_equal_sizes_are_not_merged() -> None:
    dims = ({0: {"name": "s0"}}, {0: {"name": "s0"}}, {0: {"name": "s1"}}, {0: {"name": "s1"}},
            {0: {"name": "s2"}}, {0: {"name": "s2"}})
    inputs = [torch.randn(4), torch.randn(4), torch.randn(4), torch.randn(4), torch.randn(5), torch.randn(5)]

    shared = shared_dims(inputs, DynamicShapes("as_exported", dims))

    assert shared == {(4, 0), (5, 0)}  # s0 and s1 (both 4) would become one symbol: marked instead


def test_a_derived_dim_keeps_its_mark() -> None:
    dims = ({0: {"name": "s0"}}, {0: {"name": "s0"}}, {0: {"name": "s0", "scale": 2}})
    inputs = [torch.randn(4), torch.randn(4), torch.randn(8)]

    assert shared_dims(inputs, DynamicShapes("as_exported", dims)) == {(0, 0), (1, 0)}


def test_a_bug_that_needs_a_shared_symbol_is_minimized_and_its_repro_reproduces(tmp_path: Path) -> None:
    directory = tmp_path / "capture"
    inputs = (torch.randn(8), torch.randn(8))
    captured_by_the_user(lambda x, y: torch.relu(x.sin()).sum() + y.cos().sum(), inputs, directory,
                         fail_naming_symbol_sharing, dynamic=True)
    (program,) = directory.glob("*.pt2")
    spec = JobSpec.model_validate({**spec_of(directory).model_dump(), "culprit": False, "versions": False,
                                   "limits": {"candidate_timeout_s": 60, "parallelism": 2}})
    assert spec.backend == f"{PREFIX}:fail_naming_symbol_sharing"

    result = minify(program, spec, tmp_path / "out", inputs=directory / "inputs.pt")

    assert result.status is JobState.succeeded, result.reason
    assert "relu" in ops_of(result.report.graph_code or "")
    ran = run_repro(tmp_path / "out" / "repro.py")
    assert ran.returncode != 0 and "two input dims share one size symbol" in ran.stderr, ran.stderr[-2000:]
