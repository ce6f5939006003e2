"""Wrong values a compiled graph shows in its inputs, not its outputs (issue 38): an input mutation
written back wrong, and a graph whose inputs share memory (AOT autograd's synthetic base,
pytorch#198095). The accuracy capture (`MINIFY_CAPTURE_ACCURACY=1`) runs eager and the compiled
graph on copies that alias as the user's inputs did (`accuracy.clone_inputs`), compares the outputs
and then every input a run wrote into (`accuracy.written_inputs`); a failure only the written
inputs show is keyed `AccuracyError: written inputs only`, and the worker judges it the same.
A graph dynamo reuses for inputs that alias otherwise than those it was compiled for
(pytorch#139789) is no graph's failure: the capture says so and captures nothing.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import fx

from minify_client.capture import capture_failures
from minify_contract.accuracy import WRITTEN_INPUTS_ONLY, aliased_inputs, clone_inputs
from minify_contract.models import JobSpec
from minify_worker.outcomes import Fails
from minify_worker.programs.fx.backends import ALLOWED_BACKENDS_ENV
from tests.client.capture.test_accuracy_backends import minimize_capture
from tests.support.captures import run_as_the_worker

# This file by its path from the repo root (`tests.client.capture.test_accuracy_aliasing`), as sandbox children and
# the capture's backend name import it; pytest imports it by another name.
_HERE = Path(__file__).resolve()
MODULE = ".".join(_HERE.relative_to(next(folder for folder in _HERE.parents if (folder / "pyproject.toml").exists()))
                  .with_suffix("").parts)


def skip_write_back(gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
    """A backend whose compiled graph never writes into its inputs: it runs on copies of them, so
    its outputs are eager's and every input mutation is lost (a dropped write-back)."""
    def run(*args: Any) -> Any:
        return gm(*[value.clone() if isinstance(value, torch.Tensor) else value for value in args])

    return run


def importable(backend: Callable[..., Any]) -> Any:
    """`backend` as imported from `MODULE`, so the capture names it by a path the worker allows."""
    return getattr(importlib.import_module(MODULE), backend.__name__)


@pytest.fixture
def allowed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ALLOWED_BACKENDS_ENV, MODULE)


def randn(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(0))


def scale(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    x.mul_(2)
    return y + 1


def accumulate(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    x.add_(y, alpha=3)
    return y.sin()


def overwrite(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    x.copy_(y)
    return y.cos()


def rectify(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    torch.relu_(x)
    return y * 2


def set_row(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    x[0] = 5.0
    return y - 1


WRITE_BACKS = [scale, accumulate, overwrite, rectify, set_row]


def bump_base_read_view(t0: torch.Tensor, ta: torch.Tensor) -> torch.Tensor:
    t0.add_(100)
    return ta[0]


def capture(program: Callable[..., Any], args: tuple[Any, ...], backend: Any, directory: Path) -> tuple[Any, Any]:
    """What the compiled program returned and the capture."""
    torch._dynamo.reset()
    with capture_failures(program, args, save_to=directory, accuracy=True, exceptions=()) as captured:
        result = torch.compile(program, backend=backend)(*args)
    torch._dynamo.reset()
    return result, captured


@pytest.mark.fast
def test_copies_of_inputs_that_share_a_storage_are_views_of_one_copy() -> None:
    base = torch.arange(24.0).reshape(4, 6)
    other = torch.ones(3)
    copies = clone_inputs([base[1:], base, 7, other])

    assert aliased_inputs(copies) == [[0, 1]]
    assert copies[1].untyped_storage().data_ptr() != base.untyped_storage().data_ptr()
    assert copies[0]._base is copies[1]  # a real view: AOT autograd replays views from the base
    assert (copies[0].shape, copies[0].stride(), copies[0].storage_offset()) == ((3, 6), (6, 1), 6)
    copies[1].add_(1)
    assert torch.equal(copies[0], base[1:] + 1) and torch.equal(base, torch.arange(24.0).reshape(4, 6))
    assert copies[2] == 7 and torch.equal(copies[3], other) and copies[3] is not other


def _conj(value: torch.Tensor) -> torch.Tensor:
    return value.conj()


def _neg_of_a_slice(value: torch.Tensor) -> torch.Tensor:
    return torch._neg_view(value[1:])


def _conj_neg_of_a_slice(value: torch.Tensor) -> torch.Tensor:
    return torch._neg_view(value[1:]).conj()


@pytest.mark.fast
@pytest.mark.parametrize("view", [_conj, _neg_of_a_slice, _conj_neg_of_a_slice])
@pytest.mark.parametrize("view_first", [False, True], ids=["base_first", "view_first"])
def test_an_aliased_input_keeps_its_conjugate_and_negative_bits_in_the_copies(
        view: Callable[[torch.Tensor], torch.Tensor], view_first: bool) -> None:
    # A view with the bit and its base, both inputs: the copies share one storage, as the inputs
    # did, and each keeps the bits it had (view_as_real raises on a conjugate view, for one).
    base = torch.randn(2, 5, dtype=torch.complex64)
    inputs = [view(base), base] if view_first else [base, view(base)]

    copies = clone_inputs(inputs)

    assert aliased_inputs(copies) == [[0, 1]]
    assert copies[0].untyped_storage().data_ptr() != base.untyped_storage().data_ptr()
    for copy_, value in zip(copies, inputs, strict=True):
        assert (copy_.is_conj(), copy_.is_neg()) == (value.is_conj(), value.is_neg())
        assert (copy_.shape, copy_.stride(), copy_.storage_offset()) == \
            (value.shape, value.stride(), value.storage_offset())
        assert torch.equal(copy_, value)


@pytest.mark.parametrize("program", WRITE_BACKS, ids=[program.__name__ for program in WRITE_BACKS])
def test_a_lost_input_mutation_is_captured_keyed_by_the_written_inputs_and_the_worker_judges_it_the_same(
        program: Callable[..., Any], tmp_path: Path, allowed: None) -> None:
    x, y = randn(2, 3), randn(2, 3) + 1

    result, captured = capture(program, (x.clone(), y), importable(skip_write_back), tmp_path)

    assert torch.equal(result, program(x.clone(), y))  # the outputs were right: only the input is wrong
    assert captured.captured is not None, "the lost write-back went unnoticed"
    spec = JobSpec.model_validate_json((tmp_path / "spec.json").read_text())
    assert spec.failure.kind == "accuracy"
    assert spec.failure.signature == f"AccuracyError: {WRITTEN_INPUTS_ONLY}"
    outcome = run_as_the_worker(tmp_path)
    assert isinstance(outcome, Fails), outcome
    assert outcome.signature.key == WRITTEN_INPUTS_ONLY
    assert str(outcome.signature) == spec.failure.signature
    assert " written by the graph: " in outcome.signature.text


def test_a_lost_write_back_is_minimized_and_its_repro_judges_the_written_input(tmp_path: Path, allowed: None) -> None:
    x, y = randn(2, 3), randn(2, 3) + 1
    capture(accumulate, (x, y), importable(skip_write_back), tmp_path / "capture")

    spec, ran = minimize_capture(tmp_path / "capture", tmp_path / "out", ["add_"])

    assert "written by the graph" in ran.stdout + ran.stderr
    assert spec.failure.signature == f"AccuracyError: {WRITTEN_INPUTS_ONLY}"


def test_a_synthetic_base_view_returned_wrong_by_aot_eager_is_captured_with_its_aliased_inputs(
        tmp_path: Path) -> None:
    """pytorch#198095 (aot_eager, no compiler): `t0.add_(100); return ta[0]` with `ta = t0[1:]`."""
    base = torch.arange(24, dtype=torch.float64).reshape(4, 6)
    eager_base = base.clone()
    expected = bump_base_read_view(eager_base, eager_base[1:]).clone()
    plain_base = base.clone()
    torch._dynamo.reset()
    uncaptured = torch.compile(bump_base_read_view, backend="aot_eager")(plain_base, plain_base[1:]).clone()
    compiled_base = base.clone()

    result, captured = capture(bump_base_read_view, (compiled_base, compiled_base[1:]), "aot_eager", tmp_path)

    assert torch.equal(result, uncaptured) and torch.equal(compiled_base, plain_base)  # the capture observes
    assert not torch.equal(result, expected)  # torch's bug, still there
    assert captured.captured is not None, "the wrong view went unnoticed"
    spec = JobSpec.model_validate_json((tmp_path / "spec.json").read_text())
    assert (spec.failure.kind, spec.failure.signature) == ("accuracy", "AccuracyError")
    args, _ = torch.load(tmp_path / "inputs.pt", weights_only=True)
    assert aliased_inputs(list(args)) == [[0, 1]]  # inputs.pt keeps the sharing the graph was compiled for
    outcome = run_as_the_worker(tmp_path)
    assert isinstance(outcome, Fails), outcome
    assert str(outcome.signature) == spec.failure.signature


def test_a_graph_reused_for_inputs_that_alias_otherwise_is_said_and_not_captured(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """pytorch#139789: compiled for separate inputs, run on overlapping ones without a recompile."""
    def program() -> torch.Tensor:
        compiled = torch.compile(scale_then_add, backend="aot_eager")
        compiled(torch.ones(4), torch.ones(4))
        base = torch.ones(8)
        return compiled(base[:4], base[2:6])

    torch._dynamo.reset()
    with caplog.at_level(logging.WARNING), capture_failures(program, (), save_to=tmp_path,
                                                             accuracy=True) as captured:
        result = program()
    torch._dynamo.reset()

    assert result.tolist() == [3.0, 3.0, 3.0, 3.0]  # torch's bug, unchanged: eager gives [4, 4, 3, 3]
    assert captured.captured is None and not list(tmp_path.glob("**/*.pt2"))
    said = [record.getMessage() for record in caplog.records if "pytorch#139789" in record.getMessage()]
    assert len(said) == 1 and "compiled for inputs sharing no memory on inputs sharing 0 and 1" in said[0]


def scale_then_add(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    x.mul_(2)
    return x + y
