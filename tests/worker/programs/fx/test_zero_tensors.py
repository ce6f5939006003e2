"""ZeroTensor inputs through the worker (minify_contract.zero_tensors; pytorch#197067): the inputs
file's marker rebuilt by prepare, kept as a marker in values.pt and rebuilt by the sandbox, never
made dense by a copy before a run or by the shrink, and passed as a ZeroTensor by repro.py, whether
it writes its inputs in or reads them from inputs.pt. Their neighbours, views with the conjugate or
negative bit, need no marker (torch.save keeps the bit) but keep it through the same copies.

The backends fail only while such an input is carried as what it is
(tests/support/special_input_backends.py: a run of a relu graph reads every input's data pointer, or
checks its bits), so a run that fails proves it was.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

import pytest
import torch

from minify_contract import zero_tensors
from minify_contract.accuracy import clone_inputs
from minify_contract.models import JobSpec, JobState
from minify_worker.engine import minify
from minify_worker.programs.fx.artifacts import write_program_files
from minify_worker.programs.fx.backends import ALLOWED_BACKENDS_ENV, for_training
from minify_worker.programs.fx.graph import graph_from_wire
from minify_worker.programs.fx.prepare import PROGRAM_JSON, VALUES, prepare
from minify_worker.programs.fx.repro import inline_inputs, render_repro
from minify_worker.programs.fx.shrink import narrowed
from tests.support.graphs import ops_of
from tests.support.repro import run_repro
from tests.support.special_input_backends import MODULE


@pytest.fixture(autouse=True)
def _backends_allowed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ALLOWED_BACKENDS_ENV, MODULE)


class ReluPlus(torch.nn.Module):
    def forward(self, t: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        return torch.relu(t) + u.sum()


class Bits(torch.nn.Module):
    def forward(self, c: torch.Tensor, n: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return c * 2, torch.relu(n)


class Chain(torch.nn.Module):
    def forward(self, t: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        return torch.relu(t * 2) + torch.cos(u) * 3


def _zero(shape: tuple[int, ...], dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch._efficientzerotensor(shape, dtype=dtype)


def _save(tmp_path: Path, module: torch.nn.Module, args: tuple[Any, ...]) -> tuple[Path, Path]:
    """program.pt2 and inputs.pt as a capture writes them."""
    program = torch.export.export(module, args, strict=False)
    zero_tensors.save_program(program, tmp_path / "program.pt2")
    torch.save(zero_tensors.encode((args, {})), tmp_path / "inputs.pt")
    return tmp_path / "program.pt2", tmp_path / "inputs.pt"


def _spec(backend: str, kind: str, **extra: Any) -> JobSpec:
    return JobSpec.model_validate({"backend": f"{MODULE}:{backend}", "failure": {"kind": kind},
                                   "culprit": False, "versions": False, **extra})


@pytest.mark.parametrize(("zero", "dtype"), [
    (_zero((3,)), torch.float32),
    (_zero((2, 3), torch.float64), torch.float64),
    (_zero((2, 3), torch.bfloat16).t(), torch.bfloat16),  # a view: strides (1, 3)
    (_zero((), torch.int64), torch.int64),
], ids=["1d float32", "2d float64", "transposed bfloat16", "0-d int64"])
def test_prepare_rebuilds_a_zero_tensor_input_and_keeps_it_in_the_value_store(
        tmp_path: Path, zero: torch.Tensor, dtype: torch.dtype) -> None:
    program, inputs = _save(tmp_path, ReluPlus(), (zero, torch.randn(4)))
    prepare(program, inputs, tmp_path / "work")
    stored = torch.load(tmp_path / "work" / VALUES, weights_only=True)  # as the sandbox reads it
    assert zero_tensors.is_marker(stored["t"])
    values = zero_tensors.decode(stored)
    assert values["t"]._is_zerotensor()
    assert (values["t"].shape, values["t"].stride(), values["t"].dtype) == (zero.shape, zero.stride(), dtype)
    assert not values["u"]._is_zerotensor() and torch.equal(values["u"], torch.load(inputs)[0][1])


def test_an_intermediate_that_is_a_zero_tensor_is_kept_as_one(tmp_path: Path) -> None:
    """`t * 2` of a ZeroTensor is a ZeroTensor: promoted to an input, it must still be one."""
    program, inputs = _save(tmp_path, Chain(), (_zero((2, 3)), torch.randn(2, 3)))
    prepare(program, inputs, tmp_path / "work")
    values = zero_tensors.decode(torch.load(tmp_path / "work" / VALUES, weights_only=True))
    assert values["mul"]._is_zerotensor()
    assert not values["cos"]._is_zerotensor()


def test_a_shrunk_zero_tensor_is_a_smaller_zero_tensor() -> None:
    shrunk = narrowed(_zero((4, 6), torch.float64).t(), [3, 2])
    assert shrunk._is_zerotensor()
    assert (list(shrunk.shape), shrunk.stride(), shrunk.dtype) == ([3, 2], (1, 3), torch.float64)


def test_the_copies_a_run_gets_keep_a_zero_tensor_and_copy_the_rest() -> None:
    zero, dense = _zero((3,)), torch.randn(3)
    copies = clone_inputs([zero, dense, dense[1:]])
    assert copies[0] is zero
    assert copies[1] is not dense and torch.equal(copies[1], dense) and copies[2]._base is copies[1]


def test_a_training_runs_inputs_are_leaves_that_keep_a_zero_tensor_and_the_view_bits() -> None:
    complex_ = torch.randn(3, dtype=torch.complex64)
    inputs = [_zero((2, 3)), complex_.conj(), torch._neg_view(torch.randn(4)), torch.randn(2), torch.arange(3)]

    leaves = for_training(inputs)

    assert leaves[0]._is_zerotensor() and leaves[1].is_conj() and leaves[2].is_neg()
    for leaf, value in zip(leaves[:4], inputs[:4], strict=True):
        assert leaf.is_leaf and leaf.requires_grad and leaf is not value and torch.equal(leaf, value)
    assert leaves[4] is inputs[4]  # integers take no gradient
    with torch.no_grad():
        leaves[1].add_(1)  # a copy: the caller's input is left as it was
    assert torch.equal(inputs[1], complex_.conj())


def test_a_zero_tensor_input_minimizes_and_shrinks_to_a_repro_that_passes_a_zero_tensor(tmp_path: Path) -> None:
    program, inputs = _save(tmp_path, Chain(), (_zero((8, 4)), torch.randn(8, 4)))
    done = minify(program, _spec("raise_on_zero_tensor", "runtime_error"), tmp_path / "out", inputs=inputs)
    assert done.status is JobState.succeeded, done.reason
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["signature"] == "RuntimeError: kernel read a null data pointer (input N)"
    assert ops_of(torch.export.load(tmp_path / "out" / "minimized.pt2").graph) == ["relu"]
    (shrunk,) = zero_tensors.decode(torch.load(tmp_path / "out" / "inputs.pt", weights_only=True))
    assert shrunk._is_zerotensor() and list(shrunk.shape) == [1, 1]
    repro = (tmp_path / "out" / "repro.py").read_text()
    assert "torch._efficientzerotensor([1, 1], dtype=torch.float32)" in repro
    ran = run_repro(tmp_path / "out" / "repro.py")
    assert ran.returncode != 0 and "kernel read a null data pointer (input 0)" in ran.stderr, ran.stderr[-2000:]


def test_a_repro_reading_inputs_pt_rebuilds_the_zero_tensor_beside_dense_inputs(tmp_path: Path) -> None:
    """Too many dense elements to write in: repro.py reads inputs.pt, whose marker it rebuilds, and
    its copies for the compiled call keep the ZeroTensor (a dense copy would not crash)."""
    program, inputs = _save(tmp_path, ReluPlus(), (_zero((16, 16)), torch.randn(128)))
    prepare(program, inputs, tmp_path / "work")
    graph = graph_from_wire(json.loads((tmp_path / "work" / PROGRAM_JSON).read_text())["graph"])
    values = zero_tensors.decode(torch.load(tmp_path / "work" / VALUES, weights_only=True))
    written = write_program_files(graph, values, tmp_path / "out", _spec("segfault_on_zero_tensor", "crash"))
    assert written["errors"] == {} and "minimized.pt2" in written["files"]
    assert "def zero_tensor(marker)" in (tmp_path / "out" / "repro.py").read_text()
    ran = run_repro(tmp_path / "out" / "repro.py")
    assert ran.returncode == -signal.SIGSEGV, ran.stderr[-2000:]


def test_a_zero_tensor_is_written_into_the_repro_beside_dense_inputs() -> None:
    text = inline_inputs([_zero((2, 3), torch.float64), torch.tensor([1.5, 2.0]), 3])
    assert text is not None and "torch._efficientzerotensor([2, 3], dtype=torch.float64)" in text
    zero, dense, number = eval(f"[\n{text}]", {"torch": torch})
    assert zero._is_zerotensor() and zero.dtype == torch.float64 and list(zero.shape) == [2, 3]
    assert torch.equal(dense, torch.tensor([1.5, 2.0])) and number == 3


def test_a_zero_tensor_moved_to_another_device_stays_one() -> None:
    """`to` another device makes a ZeroTensor dense (the meta device stands for CUDA here)."""
    moved = zero_tensors.to_device(_zero((2, 3)).t(), "meta")
    assert moved._is_zerotensor() and moved.device.type == "meta" and moved.stride() == (1, 3)


def test_a_cuda_repro_builds_its_zero_tensor_on_the_device_from_inputs_pt(tmp_path: Path) -> None:
    """Written in, it would be moved with `to`, which makes it dense."""
    program, inputs = _save(tmp_path, ReluPlus(), (_zero((3,)), torch.randn(2)))
    prepare(program, inputs, tmp_path / "work")
    graph = graph_from_wire(json.loads((tmp_path / "work" / PROGRAM_JSON).read_text())["graph"])
    values = zero_tensors.decode(torch.load(tmp_path / "work" / VALUES, weights_only=True))
    spec = _spec("segfault_on_zero_tensor", "crash", device="cuda")
    text = render_repro(graph, spec, None, torch.__version__, inputs=[values["t"], values["u"]])
    assert "def zero_tensor(marker)" in text and "device=DEVICE" in text and "inputs = [" not in text


def _views() -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(4, 2, dtype=torch.complex64).conj(), torch._neg_view(torch.randn(4, 2))


def test_conjugate_and_negative_views_keep_their_bit_in_the_value_store_the_copies_and_the_shrink(
        tmp_path: Path) -> None:
    conj, neg = _views()
    program, inputs = _save(tmp_path, Bits(), (conj, neg))
    prepare(program, inputs, tmp_path / "work")
    values = torch.load(tmp_path / "work" / VALUES, weights_only=True)
    assert values["c"].is_conj() and values["n"].is_neg()
    assert torch.equal(values["c"], conj) and torch.equal(values["n"], neg)
    copies = clone_inputs([values["c"], values["n"]])
    assert copies[0].is_conj() and copies[1].is_neg() and torch.equal(copies[0], conj)
    shrunk_conj, shrunk_neg = narrowed(values["c"], [2, 1]), narrowed(values["n"], [2, 1])
    assert shrunk_conj.is_conj() and torch.equal(shrunk_conj, conj[:2, :1])
    assert shrunk_neg.is_neg() and torch.equal(shrunk_neg, neg[:2, :1])


def test_a_repro_passes_a_negative_view_with_its_bit(tmp_path: Path) -> None:
    """A few elements, but a literal would lose the bit: read from inputs.pt, copied with it."""
    program, inputs = _save(tmp_path, Bits(), _views())
    prepare(program, inputs, tmp_path / "work")
    graph = graph_from_wire(json.loads((tmp_path / "work" / PROGRAM_JSON).read_text())["graph"])
    values = torch.load(tmp_path / "work" / VALUES, weights_only=True)
    write_program_files(graph, values, tmp_path / "out", _spec("raise_on_view_bit", "runtime_error"))
    assert "inputs = [" not in (tmp_path / "out" / "repro.py").read_text()
    ran = run_repro(tmp_path / "out" / "repro.py")
    assert ran.returncode != 0, ran.stdout[-2000:]
    assert "kernel ignored the conjugate or negative bit of input 0" in ran.stderr, ran.stderr[-2000:]


@pytest.mark.inductor
def test_inductor_reads_the_null_pointer_of_the_zero_tensor_the_repro_passes(tmp_path: Path) -> None:
    """pytorch#197067 with the repro minify writes: inductor's C++ kernel for `t[-1] + 10`."""

    class LastPlusTen(torch.nn.Module):
        def forward(self, t: torch.Tensor) -> torch.Tensor:
            return t[-1] + 10

    program, inputs = _save(tmp_path, LastPlusTen(), (_zero((3,)),))
    prepare(program, inputs, tmp_path / "work", eager_may_fail=True)
    graph = graph_from_wire(json.loads((tmp_path / "work" / PROGRAM_JSON).read_text())["graph"])
    values = zero_tensors.decode(torch.load(tmp_path / "work" / VALUES, weights_only=True))
    spec = JobSpec.model_validate({"backend": "inductor", "failure": {"kind": "crash"}})
    write_program_files(graph, values, tmp_path / "out", spec)
    ran = run_repro(tmp_path / "out" / "repro.py")
    assert ran.returncode == -signal.SIGSEGV, ran.stderr[-2000:]
