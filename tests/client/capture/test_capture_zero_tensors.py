"""ZeroTensor inputs captured (issue 38, pytorch#197067): the zero gradient of `sgn` has no storage,
torch.save refuses it, and a dense zeros tensor would be another program. The capture writes it as
a marker in inputs.pt (`minify_contract.zero_tensors`), leaves it out of the .pt2's example inputs,
and never changes what the user's program receives; the worker rebuilds it, and what it minimizes
fails as the user's program did: on the runtime-error, accuracy and crash paths.

The backends fail only while the ZeroTensor is carried as one (tests/support/special_input_backends.py).
"""

from __future__ import annotations

import json
import signal
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch

from minify_client.capture import capture_failures, crash
from minify_client.capture.torch_hooks import snapshot
from minify_contract import zero_tensors
from minify_contract.models import JobSpec, JobState
from minify_worker.engine import minify
from minify_worker.outcomes import Fails, Outcome
from minify_worker.programs.fx.backends import ALLOWED_BACKENDS_ENV
from minify_worker.programs.fx.prepare import PROGRAM_JSON, VALUES, prepare
from minify_worker.programs.fx.run import run_wire_candidate
from tests.support import special_input_backends
from tests.support.captures import only_entry
from tests.support.graphs import ops_of
from tests.support.repro import run_repro
from tests.support.subprocesses import REPO, run_clean

REALBUG = REPO / "bench" / "realbugs" / "pt_197067_zerotensor_segfault.py"


@pytest.fixture(autouse=True)
def _backends_allowed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ALLOWED_BACKENDS_ENV, special_input_backends.MODULE)


def _zero_grad(shape: tuple[int, ...], dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """What autograd gives: the gradient of sgn, a ZeroTensor."""
    x = torch.randn(shape, dtype=dtype, requires_grad=True)
    return torch.autograd.grad(torch.sgn(x).sum(), x)[0]


def _as_the_worker(directory: Path, workdir: Path) -> Outcome:
    """The worker's outcome for the capture in `directory`: its prepare, then the whole program as
    one candidate, with the value store read back as the sandbox reads it."""
    spec = JobSpec.model_validate_json((directory / "spec.json").read_text())
    (program,) = directory.glob("*.pt2")
    prepare(program, directory / "inputs.pt", workdir, device=spec.device,
            eager_may_fail=spec.failure.kind in ("accuracy", "crash"))
    wire_graph = json.loads((workdir / PROGRAM_JSON).read_text())["graph"]
    values = zero_tensors.decode(torch.load(workdir / VALUES, weights_only=True))
    return run_wire_candidate(wire_graph, values, spec, workdir)


def _relu_plus(t: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    return torch.relu(t) * 2 + u.sum()


def test_the_capture_s_snapshot_keeps_a_zero_tensor_and_the_conjugate_and_negative_bits() -> None:
    """What the capture copies is what the compiled graph received (a clone() would make the
    ZeroTensor dense and resolve the bits)."""
    zero = _zero_grad((2,))
    conj, neg = torch.randn(3, dtype=torch.complex64).conj(), torch._neg_view(torch.randn(3))
    taken = snapshot([zero, conj, neg])
    assert taken[0]._is_zerotensor() and taken[1].is_conj() and taken[2].is_neg()
    assert torch.equal(taken[1], conj) and torch.equal(taken[2], neg)
    assert taken[1].data_ptr() != conj.data_ptr() and taken[2].data_ptr() != neg.data_ptr()


def test_a_zero_tensor_is_kept_by_the_crash_guard() -> None:
    crash.check_savable([torch.ones(2), _zero_grad((3,))])


@pytest.mark.parametrize(("shape", "dtype"), [((3,), torch.float32), ((2, 3), torch.float64), ((), torch.bfloat16)],
                         ids=["1d float32", "2d float64", "0-d bfloat16"])
def test_a_runtime_error_on_a_zero_tensor_is_captured_as_one_and_fails_so_in_the_worker(
        tmp_path: Path, shape: tuple[int, ...], dtype: torch.dtype) -> None:
    zero, dense = _zero_grad(shape, dtype), torch.randn(4)
    compiled = torch.compile(_relu_plus, backend=special_input_backends.raise_on_zero_tensor)
    with pytest.raises(RuntimeError, match="null data pointer"), \
            capture_failures(_relu_plus, (zero, dense), save_to=tmp_path / "cap", name="relu_plus"):
        compiled(zero, dense)
    assert zero._is_zerotensor()  # the user's input is what it was
    args, kwargs = torch.load(tmp_path / "cap" / "inputs.pt", weights_only=True)
    assert zero_tensors.is_marker(args[0]) and kwargs == {}
    assert (args[0]["shape"], args[0]["dtype"]) == (list(shape), str(dtype).removeprefix("torch."))
    assert torch.equal(args[1], dense)
    assert torch.export.load(tmp_path / "cap" / "relu_plus.pt2").example_inputs is None
    outcome = _as_the_worker(tmp_path / "cap", tmp_path / "work")
    assert isinstance(outcome, Fails) and outcome.signature.kind == "runtime_error", outcome
    spec = json.loads((tmp_path / "cap" / "spec.json").read_text())
    assert str(outcome.signature) == spec["failure"]["signature"]


def test_an_accuracy_failure_on_a_zero_tensor_is_captured_and_fails_so_in_the_worker(tmp_path: Path) -> None:
    zero, dense = _zero_grad((2, 3)), torch.randn(3)
    compiled = torch.compile(_relu_plus, backend=special_input_backends.wrong_on_zero_tensor)
    with capture_failures(_relu_plus, (zero, dense), save_to=tmp_path / "cap", name="relu_plus",
                          accuracy=True) as block:
        compiled(zero, dense)
    assert block.captured is not None, block.capture_error
    spec = json.loads((tmp_path / "cap" / "spec.json").read_text())
    assert spec["failure"]["kind"] == "accuracy"
    args, _ = torch.load(tmp_path / "cap" / "inputs.pt", weights_only=True)
    assert zero_tensors.is_marker(args[0])
    outcome = _as_the_worker(tmp_path / "cap", tmp_path / "work")
    assert isinstance(outcome, Fails) and outcome.signature.kind == "accuracy", outcome


def _runner(tmp_path: Path, script: str, *args: str) -> Any:
    (tmp_path / "script.py").write_text(script)
    return run_clean([sys.executable, "-m", "minify_client.capture", "--crash", "--dir", "caps", "script.py", *args],
                     tmp_path, timeout_s=600)


def test_a_crash_on_a_zero_tensor_is_captured_minimized_and_its_repro_dies_the_same_way(tmp_path: Path) -> None:
    """The user's way: the capture runner with crash capture on a script whose compiled code reads the
    ZeroTensor's null pointer beside a dense input, then the engine on the capture, then repro.py."""
    done = _runner(tmp_path, textwrap.dedent("""
        import torch
        from tests.support import special_input_backends
        x = torch.randn(6, 4, requires_grad=True)
        zero_grad = torch.autograd.grad(torch.sgn(x).sum(), x)[0]
        step = lambda t, u: torch.relu(t * 2) + torch.cos(u) * 3
        print("compiling", flush=True)
        torch.compile(step, backend=special_input_backends.segfault_on_zero_tensor)(zero_grad, torch.randn(6, 4))
        print("survived", flush=True)
    """))
    assert done.returncode == -signal.SIGSEGV, done.stderr[-3000:]  # the script dies as it did
    assert "compiling" in done.stdout and "survived" not in done.stdout
    entry = only_entry(tmp_path / "caps")
    assert (entry["kind"], entry["signature"]) == ("crash", "SIGSEGV")
    # The inputs' shrink left out with the culprit: after minimality, not what is checked (test_shrink.py).
    spec = {**json.loads((tmp_path / "caps" / entry["spec"]).read_text()), "culprit": False, "versions": False,
            "shrink": False}
    result = minify(tmp_path / "caps" / entry["program"], JobSpec.model_validate(spec), tmp_path / "out",
                    inputs=tmp_path / "caps" / entry["inputs"])
    assert result.status is JobState.succeeded, result.reason
    assert json.loads((tmp_path / "out" / "report.json").read_text())["signature"] == "SIGSEGV"
    assert ops_of(torch.export.load(tmp_path / "out" / "minimized.pt2").graph) == ["relu"]
    ran = run_repro(tmp_path / "out" / "repro.py")
    assert ran.returncode == -signal.SIGSEGV, ran.stderr[-2000:]


@pytest.mark.inductor
def test_the_realbug_script_is_captured_with_its_zero_tensor(tmp_path: Path) -> None:
    """pytorch#197067 itself: inductor's kernel segfaults on the ZeroTensor, the script dies by
    SIGSEGV as without the capture, and the capture holds the ZeroTensor's marker."""
    done = _runner(tmp_path, REALBUG.read_text())
    assert done.returncode == -signal.SIGSEGV, done.stderr[-3000:]
    entry = only_entry(tmp_path / "caps")
    assert (entry["kind"], entry["signature"], entry["backend"]) == ("crash", "SIGSEGV", "inductor")
    args, _ = torch.load(tmp_path / "caps" / entry["inputs"], weights_only=True)
    assert [zero_tensors.is_marker(value) for value in args] == [True] and args[0]["shape"] == [3]
