"""The HTTP API against the real service: minify-server, embedded Redis, a real RQ worker."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import tarfile
import zipfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.backends import PREFIX
from tests.support.service import Service, read_events, start_service

FAIL_ON_RELU = {"backend": f"{PREFIX}:fail_on_relu", "failure": {"kind": "compile_error"}}
UPLOAD_LIMIT = 2_000_000


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    data_dir = tmp_path_factory.mktemp("api") / "data"
    with start_service(data_dir, env={"MINIFY_UPLOAD_LIMIT_BYTES": str(UPLOAD_LIMIT)}) as running:
        yield running


@pytest.fixture
def client(service: Service) -> Iterator[httpx.Client]:
    with service.client() as http:
        yield http


def submit(client: httpx.Client, program: Path, spec: dict | None = None) -> httpx.Response:
    """A new job every time (force: these tests submit the same program again; tests/server/test_bugs.py
    covers what an identical submission gets without it)."""
    files = {"program": (program.name, program.read_bytes(), "application/octet-stream")}
    return client.post("/v1/jobs", files=files, data={"spec": json.dumps(spec or FAIL_ON_RELU)},
                       params={"force": "true"})


@pytest.fixture(scope="module")
def finished_job(service: Service, programs: dict[str, Path]) -> dict:
    """One job submitted and run to its end; its events as read live, while it ran."""
    with service.client() as client:
        created = submit(client, programs["relu_cos"])
        assert created.status_code == 201, created.text
        job_id = created.json()["id"]
        events = read_events(client, job_id)
        return {"id": job_id, "created": created.json(), "events": events,
                "status": client.get(f"/v1/jobs/{job_id}").json()}


def test_submit_answers_201_with_id_and_links(finished_job: dict) -> None:
    created = finished_job["created"]
    assert created["status"] == "queued"
    assert created["warnings"] == []  # a live worker serves the cpu queue
    assert created["links"]["self"] == f"/v1/jobs/{created['id']}"
    assert created["links"]["events"] == f"/v1/jobs/{created['id']}/events"


def test_events_arrive_in_order_from_queued_to_succeeded(finished_job: dict) -> None:
    events = finished_job["events"]
    statuses = [event.data["status"] for event in events if event.event == "status"]
    assert statuses[0] == "queued" and statuses[1] == "running" and statuses[-1] == "succeeded"
    # The stream goes on past the succeeded status to the end of the culprit phase (docs/service.md).
    assert events[-1].event == "culprit" and events[-1].data["culprit_state"] == "done"
    assert [event.id for event in events] == sorted(events_ids := [event.id for event in events],
                                                     key=lambda i: tuple(map(int, i.split("-"))))
    assert len(set(events_ids)) == len(events)
    progress = [event.data for event in events if event.event == "progress"]
    assert progress, "the engine's progress events reach the stream"
    checks = [event.get("checks_total", 0) for event in progress]
    assert checks == sorted(checks)


def test_finished_job_shows_result_progress_and_artifact_links(finished_job: dict) -> None:
    status = finished_job["status"]
    assert status["status"] == "succeeded"
    assert status["attempts"] == 1
    assert status["started_at"] and status["finished_at"] and status["worker"]
    assert status["result"]["status"] == "succeeded"
    assert status["progress"]["nodes_current"] == status["result"]["nodes_final"]
    assert {"minimized.pt2", "repro.py", "report.json", "bundle.tar.gz"} <= set(status["links"]["artifacts"])


def test_minimized_program_and_repro_download(client: httpx.Client, finished_job: dict) -> None:
    job_id = finished_job["id"]
    minimized = client.get(f"/v1/jobs/{job_id}/artifacts/minimized.pt2")
    assert minimized.status_code == 200
    with zipfile.ZipFile(io.BytesIO(minimized.content)) as archive:
        assert any(name.endswith("/archive_format") for name in archive.namelist())
    repro = client.get(f"/v1/jobs/{job_id}/artifacts/repro.py")
    assert repro.status_code == 200 and "import torch" in repro.text


def test_bundle_holds_every_artifact(client: httpx.Client, finished_job: dict) -> None:
    bundle = client.get(f"/v1/jobs/{finished_job['id']}/artifacts/bundle.tar.gz")
    assert bundle.status_code == 200
    with tarfile.open(fileobj=io.BytesIO(bundle.content)) as archive:
        names = {Path(name).name for name in archive.getnames()}
    assert {"minimized.pt2", "repro.py", "report.json"} <= names


def test_late_subscriber_gets_the_whole_history(client: httpx.Client, finished_job: dict) -> None:
    again = read_events(client, finished_job["id"])
    assert [(e.id, e.event) for e in again] == [(e.id, e.event) for e in finished_job["events"]]


def test_last_event_id_resumes_after_that_event(client: httpx.Client, finished_job: dict) -> None:
    events = finished_job["events"]
    resumed = read_events(client, finished_job["id"], last_event_id=events[1].id)
    assert [e.id for e in resumed] == [e.id for e in events[2:]]


def test_list_is_newest_first_and_paginated(client: httpx.Client, programs: dict[str, Path]) -> None:
    ids = [submit(client, programs["chain"], {"backend": "eager"}).json()["id"] for _ in range(3)]
    page = client.get("/v1/jobs", params={"limit": 2}).json()
    assert [job["id"] for job in page["jobs"]] == ids[::-1][:2]
    assert page["total"] >= 3 and page["limit"] == 2 and page["offset"] == 0
    second = client.get("/v1/jobs", params={"limit": 2, "offset": 2}).json()
    assert second["jobs"][0]["id"] == ids[0]
    for job_id in ids:
        client.delete(f"/v1/jobs/{job_id}")


def test_list_filters_by_status(client: httpx.Client, finished_job: dict, programs: dict[str, Path]) -> None:
    queued = submit(client, programs["chain"], {"backend": "eager"}).json()["id"]
    client.delete(f"/v1/jobs/{queued}")
    succeeded = client.get("/v1/jobs", params={"status": "succeeded"}).json()
    cancelled = client.get("/v1/jobs", params={"status": "cancelled"}).json()
    assert finished_job["id"] in [job["id"] for job in succeeded["jobs"]]
    assert {job["status"] for job in succeeded["jobs"]} == {"succeeded"}
    assert succeeded["total"] == len(succeeded["jobs"])
    assert queued in [job["id"] for job in cancelled["jobs"]]
    assert client.get("/v1/jobs", params={"status": "exploded"}).status_code == 422


def pickled_graph_module(directory: Path) -> Path:
    """A GraphModule saved with torch.save: a pickle (made in a subprocess: the test process stays torch-free)."""
    path = directory / "module.pt2"
    subprocess.run([sys.executable, "-c", (
        "import sys, torch\n"
        "gm = torch.fx.symbolic_trace(lambda x: torch.relu(x).cos())\n"
        "torch.save(gm, sys.argv[1])\n"
    ), str(path)], check=True)
    return path


def test_a_pickled_graph_module_is_refused_with_how_to_export(client: httpx.Client, tmp_path: Path) -> None:
    program = pickled_graph_module(tmp_path)
    assert_error(submit(client, program), 415, "MINIFY_ALLOW_PICKLE=1")
    assert "torch.export.export" in submit(client, program).json()["error"]


def assert_error(response: httpx.Response, status: int, words: str) -> None:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    body = response.json()
    assert words.lower() in body["error"].lower(), body


def test_missing_spec_is_400(client: httpx.Client, programs: dict[str, Path]) -> None:
    response = client.post("/v1/jobs", files={"program": ("p.pt2", programs["relu_cos"].read_bytes())})
    assert_error(response, 400, "missing form field 'spec'")


def test_missing_program_is_400(client: httpx.Client) -> None:
    response = client.post("/v1/jobs", data={"spec": "{}"}, files={"other": ("x", b"x")})
    assert_error(response, 400, "unexpected form field 'other'")
    response = client.post("/v1/jobs", files={"spec": (None, "{}")})
    assert_error(response, 400, "missing form field 'program'")


def test_invalid_spec_is_400_in_words(client: httpx.Client, programs: dict[str, Path]) -> None:
    response = submit(client, programs["relu_cos"], {"backend": "not a backend", "device": "tpu"})
    assert_error(response, 400, "invalid spec")
    assert "backend" in response.json()["error"] and "device 'tpu'" in response.json()["error"]
    response = client.post("/v1/jobs", files={"program": ("p.pt2", programs["relu_cos"].read_bytes()),
                                              "spec": (None, "{not json")})
    assert_error(response, 400, "invalid spec")


def test_a_job_timeout_beyond_a_week_is_400(client: httpx.Client, programs: dict[str, Path]) -> None:
    response = submit(client, programs["relu_cos"], {**FAIL_ON_RELU, "limits": {"job_timeout_s": 1e12}})
    assert_error(response, 400, "limits.job_timeout_s: Input should be less than or equal to 604800")


def test_backend_module_not_allowed_is_400(client: httpx.Client, programs: dict[str, Path]) -> None:
    response = submit(client, programs["relu_cos"], {"backend": "os:system"})
    assert_error(response, 400, "not allowed")


@pytest.mark.parametrize(("content", "says"), [
    (b"", "the file is empty (0 bytes)"),
    (b"print('hello')\n", "it is a text file (it starts \"print('hello')\")"),
    (bytes(range(7, 250)) * 4, "it is neither a zip nor text (it starts 07 08 09 0a"),
    (b"\x80\x04\x95\x10\x00", "it is a pickle"),
    (b"HloModule m\n", "it is HLO text: submit it as HLO"),
])
def test_a_program_that_is_not_an_archive_is_415_saying_what_it_is(client: httpx.Client, content: bytes,
                                                                   says: str) -> None:
    response = client.post("/v1/jobs", files={"program": ("model.pt2", content), "spec": (None, "{}")})
    assert_error(response, 415, f"program 'model.pt2': not a torch.export archive: {says}")
    # the pickle hint only where the upload is a pickle
    assert ("MINIFY_ALLOW_PICKLE" in response.json()["error"]) == (says == "it is a pickle")


def test_inputs_that_are_not_a_torch_save_file_are_415_saying_what_they_are(
        client: httpx.Client, programs: dict[str, Path]) -> None:
    files = {"program": ("p.pt2", programs["relu_cos"].read_bytes()), "inputs": ("inputs.pt", b""),
             "spec": (None, json.dumps(FAIL_ON_RELU))}
    assert_error(client.post("/v1/jobs", files=files, params={"force": "true"}), 415,
                 "inputs: not a torch.save file: the file is empty (0 bytes)")


def test_upload_over_the_limit_is_413_and_leaves_no_file(client: httpx.Client, service: Service) -> None:
    big = b"\0" * (UPLOAD_LIMIT + 1)
    response = client.post("/v1/jobs", files={"program": ("big.pt2", big), "spec": (None, "{}")})
    assert_error(response, 413, "exceeds the limit")
    assert list((service.data_dir / "tmp").iterdir()) == []


def test_unknown_job_is_404(client: httpx.Client) -> None:
    for path in ("/v1/jobs/0123456789abcdef0123456789abcdef", "/v1/jobs/nope/events",
                 "/v1/jobs/nope/artifacts/repro.py"):
        assert_error(client.get(path), 404, "no job")
    assert_error(client.delete("/v1/jobs/nope"), 404, "no job")


TRAVERSALS = ["..%2F..%2Fetc%2Fpasswd", "%2E%2E", "%2e%2e%2fredis%2fdump.rdb", "report.json.bak", "out"]


@pytest.mark.parametrize("name", TRAVERSALS)
def test_artifact_names_outside_the_known_set_are_refused(client: httpx.Client, finished_job: dict,
                                                          name: str) -> None:
    response = client.get(f"/v1/jobs/{finished_job['id']}/artifacts/{name}")
    assert response.status_code in (400, 404), response.text
    assert "error" in response.json()


def test_healthz_sees_redis_and_the_worker(client: httpx.Client) -> None:
    health = client.get("/healthz").json()
    assert health["status"] == "ok" and health["redis"] is True and health["workers"] == 1
    assert set(health["queues"]) == {"cpu", "cuda"}


def test_metrics_count_jobs_queues_and_checks(client: httpx.Client, finished_job: dict) -> None:
    text = client.get("/metrics").text
    assert 'minify_jobs{status="succeeded"}' in text
    assert 'minify_queue_depth{queue="cpu"}' in text
    checks = [line for line in text.splitlines() if line.startswith("minify_checks_total ")]
    assert checks and float(checks[0].split()[1]) >= finished_job["status"]["result"]["checks_total"]
    assert "minify_candidate_outcomes_total{" in text


def test_openapi_documents_every_route(client: httpx.Client) -> None:
    assert client.get("/docs").status_code == 200
    paths = client.get("/openapi.json").json()["paths"]
    assert {"/v1/jobs", "/v1/jobs/{job_id}", "/v1/jobs/{job_id}/events", "/v1/jobs/{job_id}/artifacts/{name}",
            "/healthz", "/metrics"} <= set(paths)
    assert set(paths["/v1/jobs/{job_id}"]) == {"get", "delete"}


def test_dashboard_is_served_at_root(client: httpx.Client) -> None:
    response = client.get("/")
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/html")


def test_server_never_imports_torch(tmp_path: Path) -> None:
    code = (
        "import sys\n"
        "from fastapi.testclient import TestClient\n"
        "from minify_server import cli\n"
        "from minify_server.app import create_app\n"
        "from minify_server.config import Settings\n"
        f"app = create_app(Settings(data_dir={str(tmp_path)!r}), 'redis://127.0.0.1:1')\n"
        "TestClient(app).get('/openapi.json')\n"
        "assert 'torch' not in sys.modules, 'minify_server imported torch'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_the_config_route_says_what_the_workers_torch_takes(client: httpx.Client) -> None:
    import torch

    schemas = client.get("/v1/config").json()["schemas"]
    assert [schema["torch"] for schema in schemas] == [torch.__version__]
    keys = schemas[0]["keys"]
    assert keys["max_autotune"] == {"kinds": ["bool"], "choices": None}
    assert keys["cpp.inject_relu_bug_TESTING_ONLY"]["choices"] == ["compile_error", "runtime_error", "accuracy", None]
    assert "torch._dynamo.config.assume_static_by_default" in keys


@pytest.mark.parametrize(("config", "says"), [
    ({"cpp.inject_relu_bug_TESTING_ONLY": "compile_errr"},
     "config cpp.inject_relu_bug_TESTING_ONLY='compile_errr' is not one of 'compile_error', 'runtime_error', "
     "'accuracy', null"),
    ({"cpp.no_such_key": 1}, "config key 'cpp.no_such_key' is not a setting of torch"),
    ({"cpp.inject_relu_bug_TESTING_ONLI": "compile_error"},
     "did you mean 'cpp.inject_relu_bug_TESTING_ONLY'?"),
    ({"max_autotune": "yes"}, "config max_autotune='yes' is a str; torch"),
    ({"torch._dynamo.config.assume_static_by_default": 3}, "is a int; torch"),
])
def test_a_config_the_workers_torch_does_not_take_is_422_before_any_job(
        client: httpx.Client, programs: dict[str, Path], config: dict, says: str) -> None:
    before = client.get("/v1/jobs").json()["total"]
    response = submit(client, programs["relu_cos"], {**FAIL_ON_RELU, "config": config})
    assert_error(response, 422, says)
    assert client.get("/v1/jobs").json()["total"] == before


def test_a_config_the_workers_torch_takes_is_queued(client: httpx.Client, programs: dict[str, Path]) -> None:
    config = {"cpp.inject_relu_bug_TESTING_ONLY": "compile_error", "max_autotune": False, "epilogue_fusion": True,
              "torch._dynamo.config.cache_size_limit": 8}
    response = submit(client, programs["relu_cos"], {**FAIL_ON_RELU, "config": config})
    assert response.status_code == 201, response.text
    client.delete(f"/v1/jobs/{response.json()['id']}")


def test_an_unknown_artifact_name_is_404_quoted_whole(client: httpx.Client, finished_job: dict) -> None:
    response = client.get(f"/v1/jobs/{finished_job['id']}/artifacts/nope.txt")
    assert_error(response, 404, "'nope.txt' is not an artifact name; one of minimized.pt2, minimized.json, repro.py")
