"""`minify-client submit` of a program.json (minify's program format, docs/client.md): told from its
name, checked before anything is sent (a malformed one, or one without its inputs, is a usage
error naming where and why), and sent with its spec saying fx_json."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from minify_contract.program_json import FORMAT
from tests.support.scripted_server import ScriptedServer


def run_cli(*args: str | Path) -> subprocess.CompletedProcess[str]:
    env = {key: value for key, value in os.environ.items() if key not in ("MINIFY_SERVER", "MINIFY_TOKEN")}
    return subprocess.run([sys.executable, "-m", "minify_client.cli", *map(str, args)], capture_output=True,
                          text=True, timeout=60, env=env, check=False)


def relu_program() -> dict[str, Any]:
    nodes = [{"name": "x", "op": "placeholder", "target": "x", "args": [], "kwargs": {}},
             {"name": "relu", "op": "call_function", "target": "aten.relu.default", "args": [{"node": "x"}],
              "kwargs": {}},
             {"name": "output", "op": "output", "args": [{"tuple": [{"node": "relu"}]}], "kwargs": {}}]
    return {"format": FORMAT, "graph": {"version": 1, "nodes": nodes}, "torch_version": "2.13.0", "why": "test"}


@pytest.fixture
def inputs(tmp_path: Path) -> Path:
    path = tmp_path / "inputs.pt"
    path.write_bytes(b"PK\x03\x04 stands in for torch.save's zip: the client does not read it")
    return path


def test_a_malformed_program_json_is_a_usage_error_before_anything_is_sent(
        server: ScriptedServer, tmp_path: Path, inputs: Path) -> None:
    document = relu_program()
    document["graph"]["nodes"][1]["args"] = [{"node": "later"}]
    (tmp_path / "program.json").write_text(json.dumps(document))

    result = run_cli("submit", tmp_path / "program.json", "--inputs", inputs, "--server", server.url)

    assert result.returncode == 2
    assert "program.json: graph.nodes[1] (relu): refers to 'later', not a node before it" in result.stderr
    assert server.exchanges == []


def test_a_program_json_without_its_inputs_is_a_usage_error(server: ScriptedServer, tmp_path: Path) -> None:
    (tmp_path / "program.json").write_text(json.dumps(relu_program()))

    result = run_cli("submit", tmp_path / "program.json", "--server", server.url)

    assert result.returncode == 2 and "it needs its inputs file (--inputs" in result.stderr
    assert server.exchanges == []
