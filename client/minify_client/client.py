"""The HTTP client of the minify API (ARCHITECTURE.md, "HTTP API (v1)")."""

from __future__ import annotations

import builtins
import json
import logging
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import TracebackType
from typing import IO, Any, TypeVar

import httpx
from pydantic import BaseModel, ValidationError

from minify_client._sse import ServerSentEvent, parse_events
from minify_client.errors import Conflict, ConnectionFailed, DownloadInterrupted, NotFound, api_error
from minify_client.models import (
    ARTIFACT_NAMES,
    Health,
    JobCreated,
    JobList,
    JobSpec,
    JobState,
    JobStatus,
    ProgressEvent,
)

DEFAULT_SERVER = "http://127.0.0.1:8000"
# The artifacts a finished job is downloaded as; bundle.tar.gz repeats them in one file.
DEFAULT_ARTIFACTS = tuple(name for name in ARTIFACT_NAMES if name != "bundle.tar.gz")

logger = logging.getLogger(__name__)

_Model = TypeVar("_Model", bound=BaseModel)

ProgramSource = str | os.PathLike[str] | bytes | IO[bytes]


class Client:
    """A minify server. `server` and `token` default to $MINIFY_SERVER and $MINIFY_TOKEN.

    Every method raises `ConnectionFailed` when the server cannot be reached and an `ApiError`
    subclass when it answers 4xx/5xx.
    """

    def __init__(
        self,
        server: str | None = None,
        token: str | None = None,
        *,
        timeout_s: float = 60.0,
        max_reconnects: int = 10,
    ) -> None:
        self.server = (server or os.environ.get("MINIFY_SERVER") or DEFAULT_SERVER).rstrip("/")
        self.token = token if token is not None else os.environ.get("MINIFY_TOKEN") or None
        self.max_reconnects = max_reconnects
        headers = {"User-Agent": "minify-client"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        self._http = httpx.Client(base_url=self.server, headers=headers, timeout=timeout_s)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # ---- jobs ---------------------------------------------------------------------------------

    def submit(
        self,
        program: ProgramSource,
        spec: JobSpec | dict[str, Any] | None = None,
        inputs: str | os.PathLike[str] | bytes | IO[bytes] | None = None,
        *,
        name: str | None = None,
    ) -> JobCreated:
        """Post a failing program (a `torch.export.save` .pt2) and its spec; returns the new job."""
        job_spec = spec if isinstance(spec, JobSpec) else JobSpec.model_validate(spec or {})
        with _opened(program, name or "program.pt2") as program_part, _opened_optional(
            inputs, "inputs.pt"
        ) as inputs_part:
            files = {"program": program_part}
            if inputs_part is not None:
                files["inputs"] = inputs_part
            response = self._request(
                "POST", "/v1/jobs", files=files, data={"spec": job_spec.model_dump_json()}
            )
        return _parse(JobCreated, response)

    def status(self, job_id: str) -> JobStatus:
        return _parse(JobStatus, self._request("GET", f"/v1/jobs/{job_id}"))

    def list(
        self, status: JobState | str | None = None, *, offset: int = 0, limit: int = 50
    ) -> JobList:
        """Jobs, newest first."""
        params: dict[str, str | int] = {"offset": offset, "limit": limit}
        if status is not None:
            params["status"] = JobState(status).value
        return _parse(JobList, self._request("GET", "/v1/jobs", params=params))

    def cancel(self, job_id: str) -> JobStatus:
        """Cancel a job (its running candidates die); returns its status after the request."""
        response = self._request("DELETE", f"/v1/jobs/{job_id}")
        try:
            return JobStatus.model_validate_json(response.content)
        except ValidationError:
            return self.status(job_id)

    def health(self) -> Health:
        return _parse(Health, self._request("GET", "/healthz"))

    def dashboard_url(self, job: JobCreated | JobStatus | str) -> str:
        """Where a person watches the job in a browser."""
        if isinstance(job, str):
            return f"{self.server}/?job={job}"
        if job.links is not None and job.links.dashboard:
            return str(httpx.URL(self.server + "/").join(job.links.dashboard))
        return f"{self.server}/?job={job.id}"

    # ---- progress -----------------------------------------------------------------------------

    def events(self, job_id: str) -> Iterator[ProgressEvent]:
        """The job's progress events until it ends, reconnecting (with Last-Event-ID) when the
        stream drops; events the client does not understand are skipped."""
        last_event_id: str | None = None
        failures = 0
        while True:
            finished = False
            try:
                for sse in self._event_stream(job_id, last_event_id):
                    if sse.id is not None:
                        last_event_id = sse.id
                    failures = 0
                    event = _progress_event(sse)
                    if event is None:
                        continue
                    yield event
                    if event.type == "status" and event.status is not None and event.status.finished:
                        finished = True
                if not finished:
                    finished = self.status(job_id).status.finished
            except (httpx.TransportError, ConnectionFailed) as error:
                failures += 1
                if failures > self.max_reconnects:
                    raise _connection_failed(self.server, error) from error
                logger.info("event stream of %s dropped (%s); reconnecting", job_id, error)
                time.sleep(min(0.25 * 2**failures, 5.0))
                continue
            if finished:
                return
            # The stream closed while the job runs (a proxy's idle timeout, a server restart).
            time.sleep(1.0)

    def wait(
        self, job_id: str, on_event: Callable[[ProgressEvent], None] | None = None
    ) -> JobStatus:
        """Follow the job until it ends, calling `on_event` for each progress event; returns its
        final status."""
        for event in self.events(job_id):
            if on_event is not None:
                on_event(event)
        return self.status(job_id)

    # ---- artifacts ----------------------------------------------------------------------------

    def download(
        self,
        job_id: str,
        out_dir: str | os.PathLike[str],
        names: builtins.list[str] | tuple[str, ...] | None = None,
    ) -> dict[str, Path]:
        """Download the job's artifacts into `out_dir`; returns name → path.

        Without `names`: the artifacts the job lists (all but bundle.tar.gz). Each file is
        written to a temporary name and renamed once complete, so no half file is ever left.
        """
        status = self.status(job_id)
        if not status.status.finished:
            raise Conflict(409, f"job {job_id} is {status.status.value}; artifacts appear when it ends")
        listed = _listed_artifacts(status)
        wanted = list(names) if names is not None else [n for n in listed or DEFAULT_ARTIFACTS
                                                         if n != "bundle.tar.gz"]
        paths: dict[str, Path] = {}
        for name in wanted:
            url = (status.links.artifacts.get(name) if status.links else None) or (
                f"/v1/jobs/{job_id}/artifacts/{name}"
            )
            try:
                paths[name] = self._download_file(url, name, Path(out_dir))
            except NotFound:
                # Without a listing we ask for every known artifact; a job that did not minimize
                # has only some of them.
                if names is not None or listed:
                    raise
        return paths

    def download_artifact(self, job_id: str, name: str, out_dir: str | os.PathLike[str]) -> Path:
        """Download one artifact (e.g. `bundle.tar.gz`) into `out_dir`."""
        return self.download(job_id, out_dir, [name])[name]

    def _download_file(self, url: str, name: str, out_dir: Path) -> Path:
        out_dir.mkdir(parents=True, exist_ok=True)
        destination = out_dir / name
        handle, partial_name = tempfile.mkstemp(prefix=f".{name}.", suffix=".part", dir=out_dir)
        partial = Path(partial_name)
        try:
            with os.fdopen(handle, "wb") as file, self._stream("GET", url) as response:
                expected = response.headers.get("content-length")
                encoded = response.headers.get("content-encoding", "identity") != "identity"
                received = 0
                try:
                    for chunk in response.iter_bytes():
                        file.write(chunk)
                        received += len(chunk)
                except httpx.TransportError as error:
                    raise DownloadInterrupted(name, _describe(error)) from error
                if expected is not None and not encoded and received != int(expected):
                    raise DownloadInterrupted(name, f"received {received} of {expected} bytes")
            os.replace(partial, destination)
        finally:
            partial.unlink(missing_ok=True)
        return destination

    # ---- transport ----------------------------------------------------------------------------

    def _request(self, method: str, url: str, **kwargs: Any) -> httpx.Response:
        try:
            response = self._http.request(method, url, **kwargs)
        except httpx.TransportError as error:
            raise _connection_failed(self.server, error) from error
        _raise_for_status(response)
        return response

    def _stream(self, method: str, url: str, **kwargs: Any) -> _StreamContext:
        return _StreamContext(self, method, url, kwargs)

    def _event_stream(self, job_id: str, last_event_id: str | None) -> Iterator[ServerSentEvent]:
        headers = {"Accept": "text/event-stream", "Cache-Control": "no-cache"}
        if last_event_id is not None:
            headers["Last-Event-ID"] = last_event_id
        # Servers ping idle streams; a silent minute means the connection is gone.
        timeout = httpx.Timeout(30.0, read=60.0)
        with self._stream("GET", f"/v1/jobs/{job_id}/events", headers=headers, timeout=timeout) as response:
            yield from parse_events(response.iter_lines())


class _StreamContext:
    """`httpx.Client.stream` with connection errors and error statuses raised as MinifyErrors."""

    def __init__(self, client: Client, method: str, url: str, kwargs: dict[str, Any]) -> None:
        self._client = client
        self._context = client._http.stream(method, url, **kwargs)

    def __enter__(self) -> httpx.Response:
        try:
            response = self._context.__enter__()
        except httpx.TransportError as error:
            raise _connection_failed(self._client.server, error) from error
        if response.is_error:
            response.read()
            self._context.__exit__(None, None, None)
            _raise_for_status(response)
        return response

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._context.__exit__(kind, value, tb)


def _raise_for_status(response: httpx.Response) -> None:
    if response.is_error:
        raise api_error(response.status_code, _error_message(response))


def _error_message(response: httpx.Response) -> str:
    """The server's reason, from `{"error": ...}`, FastAPI's `{"detail": ...}`, or the body."""
    try:
        body = response.json()
    except ValueError:
        text = response.text.strip()
        return text[:300] if text else response.reason_phrase
    if isinstance(body, dict):
        for key in ("error", "detail", "message"):
            value = body.get(key)
            if isinstance(value, str) and value:
                return value
            if isinstance(value, builtins.list) and value:
                return "; ".join(_validation_item(item) for item in value)
    return json.dumps(body)[:300]


def _validation_item(item: Any) -> str:
    if isinstance(item, dict) and "msg" in item:
        where = ".".join(str(part) for part in item.get("loc", ()))
        return f"{where}: {item['msg']}" if where else str(item["msg"])
    return str(item)


def _connection_failed(server: str, error: BaseException) -> ConnectionFailed:
    if isinstance(error, ConnectionFailed):
        return error
    return ConnectionFailed(server, _describe(error))


def _describe(error: BaseException) -> str:
    text = str(error)
    if isinstance(error, httpx.TimeoutException):
        return f"timed out ({text})" if text else "timed out"
    return text or type(error).__name__


def _parse(model: type[_Model], response: httpx.Response) -> _Model:
    try:
        return model.model_validate_json(response.content)
    except ValidationError as error:
        raise api_error(
            502, f"unexpected answer to {response.request.method} {response.request.url.path}: {error}"
        ) from error


def _progress_event(sse: ServerSentEvent) -> ProgressEvent | None:
    try:
        payload = json.loads(sse.data)
    except ValueError:
        return None
    if not isinstance(payload, dict):
        return None
    if "type" not in payload and sse.event in ("progress", "status", "log"):
        payload["type"] = sse.event
    try:
        return ProgressEvent.model_validate(payload)
    except ValidationError:
        logger.debug("skipping event %s: %s", sse.event, sse.data[:200])
        return None


def _listed_artifacts(status: JobStatus) -> builtins.list[str]:
    if status.links is not None and status.links.artifacts:
        return [name for name in status.links.artifacts if name != "bundle.tar.gz"]
    if status.result is not None and status.result.artifacts:
        return [name for name in status.result.artifacts if name != "bundle.tar.gz"]
    return []


class _Opened:
    """A multipart file part from a path, bytes or a binary file, closing what it opened."""

    def __init__(self, source: ProgramSource, default_name: str) -> None:
        self._owned: IO[bytes] | None = None
        if isinstance(source, bytes):
            self.part: tuple[str, Any, str] = (default_name, source, "application/octet-stream")
        elif isinstance(source, (str, os.PathLike)):
            path = Path(source)
            self._owned = path.open("rb")
            self.part = (path.name, self._owned, "application/octet-stream")
        else:
            filename = Path(getattr(source, "name", default_name) or default_name).name
            self.part = (filename, source, "application/octet-stream")

    def __enter__(self) -> tuple[str, Any, str]:
        return self.part

    def __exit__(self, *exc_info: object) -> None:
        if self._owned is not None:
            self._owned.close()


class _NoFile:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc_info: object) -> None:
        return None


def _opened(source: ProgramSource, default_name: str) -> _Opened:
    return _Opened(source, default_name)


def _opened_optional(source: ProgramSource | None, default_name: str) -> _Opened | _NoFile:
    return _NoFile() if source is None else _Opened(source, default_name)

