"""program.json through the real service (minify-server, embedded Redis, a real worker): a malformed
one, or one without its values, is refused before a job exists; a capture's program.json of a
`while_loop` carrying an int (torch.export.save refuses it) runs to a result whose program is
minimized.json."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import torch

from tests.support.backends import PREFIX
from tests.support.service import Service, read_events, start_service
from tests.support.wire_programs import ReluInIntLoop, unsavable, write

SPEC = {"backend": f"{PREFIX}:fail_on_relu_in_subgraph", "failure": {"kind": "compile_error"},
        "program_format": "fx_json", "culprit": False, "shrink": False, "versions": False}


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    with start_service(tmp_path_factory.mktemp("api_program_json") / "data") as running:
        yield running


@pytest.fixture(scope="module")
def program(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    _, document, values = unsavable(ReluInIntLoop(), torch.randn(4, 8))
    return write(tmp_path_factory.mktemp("program"), document, values)


def post(client: httpx.Client, program: bytes, inputs: bytes | None) -> httpx.Response:
    files = {"program": ("program.json", program), "spec": (None, json.dumps(SPEC))}
    if inputs is not None:
        files["inputs"] = ("inputs.pt", inputs)
    return client.post("/v1/jobs", files=files, params={"force": "true"})


def jobs(client: httpx.Client) -> int:
    return len(client.get("/v1/jobs").json()["jobs"])


@pytest.mark.parametrize(("edit", "says"), [
    (lambda document: document.update(format="something else"), "its format is 'something else'"),
    (lambda document: document["graph"]["nodes"][3].update(args=[{"node": "nowhere"}]),
     "refers to 'nowhere', not a node before it"),
    (lambda document: document["graph"]["nodes"][3].update(op="call_module"), "op 'call_module' is not one of"),
])
def test_a_malformed_program_json_is_415_saying_where_before_a_job_exists(
        service: Service, program: tuple[Path, Path], edit: object, says: str) -> None:
    document = json.loads(program[0].read_text())
    edit(document)  # type: ignore[operator]
    with service.client() as client:
        before = jobs(client)
        response = post(client, json.dumps(document).encode(), program[1].read_bytes())
        assert response.status_code == 415, response.text
        assert says in response.json()["error"] and "program 'program.json'" in response.json()["error"]
        assert jobs(client) == before


def test_a_program_json_without_its_inputs_is_400(service: Service, program: tuple[Path, Path]) -> None:
    with service.client() as client:
        response = post(client, program[0].read_bytes(), None)
    assert response.status_code == 400 and "needs its inputs file" in response.json()["error"], response.text


def test_a_captured_program_json_is_minimized_and_delivered_as_minimized_json(
        service: Service, program: tuple[Path, Path]) -> None:
    with service.client() as client:
        created = post(client, program[0].read_bytes(), program[1].read_bytes())
        assert created.status_code == 201, created.text
        job_id = created.json()["id"]
        read_events(client, job_id)
        status = client.get(f"/v1/jobs/{job_id}").json()
        assert status["status"] == "succeeded", status
        minimized = client.get(f"/v1/jobs/{job_id}/artifacts/minimized.json")
        assert minimized.status_code == 200
        assert "higher_order.while_loop" in minimized.text
        assert client.get(f"/v1/jobs/{job_id}/artifacts/minimized.pt2").status_code == 404
