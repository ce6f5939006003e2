"""The capture's key, without torch.compile: which failing compiler calls a capture run saves once
(minify_client.capture.failed_graph), kept in each captures.json entry."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.fx as fx

from minify_client.capture import failed_graph
from minify_client.capture.torch_hooks import FailedCompile

pytestmark = pytest.mark.fast


def _model(x: torch.Tensor, n: int) -> Any:
    return torch.relu(x.view(2, 4)).sum(dim=[1], keepdim=True) * n, (x, [x, 1.5], {"k": "v"})


def failed_call(**fields: Any) -> FailedCompile:
    return FailedCompile(**{"level": "aot", "error": RuntimeError("injected failure on relu"), "backend": "inductor",
                            "config": {"triton.cudagraphs": True}, "graph": fx.symbolic_trace(_model),
                            "inputs": [torch.zeros(4, 2), 3], **fields})


@pytest.fixture(autouse=True)
def settings_as_given(monkeypatch: pytest.MonkeyPatch) -> None:
    """The settings enter the key as changed_config reports them; here, as given (no fresh Python)."""
    monkeypatch.setattr(failed_graph, "changed_config", lambda values=None: dict(values or {}))


def test_the_capture_key_of_a_known_call_never_changes() -> None:
    # Each captures.json entry keeps its key: a capture run extending a manifest matches on it.
    assert failed_graph.capture_key(failed_call()) == "94177ab53a47e5f1"


def test_the_capture_key_sees_the_backend_the_inputs_and_the_error_but_not_node_names() -> None:
    key = failed_graph.capture_key(failed_call())
    renamed = fx.symbolic_trace(_model)
    for node in renamed.graph.nodes:
        if node.op == "call_function":
            node.name = f"renamed_{node.name}"
    assert failed_graph.capture_key(failed_call(graph=renamed)) == key
    assert failed_graph.capture_key(failed_call(backend="eager")) != key
    assert failed_graph.capture_key(failed_call(inputs=[torch.zeros(4, 2, dtype=torch.float64), 3])) != key
    assert failed_graph.capture_key(failed_call(error=RuntimeError("injected failure on cos"))) != key
