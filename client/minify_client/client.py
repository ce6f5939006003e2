"""The HTTP client of the minify API (docs/service.md, "HTTP API")."""

from __future__ import annotations

import builtins
import email.utils
import json
import logging
import os
import random
import tempfile
import time
from collections.abc import Callable, Iterator
from datetime import datetime, timezone
from pathlib import Path
from types import TracebackType
from typing import IO, Any, TypeVar

import httpx
from pydantic import BaseModel, ValidationError

from minify_client._sse import ServerSentEvent, parse_events
from minify_client.errors import (
    ApiError,
    BadRequest,
    Conflict,
    ConnectionFailed,
    DownloadInterrupted,
    MinifyError,
    NotFound,
    api_error,
)
from minify_contract.config_schema import ConfigSchemas, config_problems
from minify_contract.models import (
    ARTIFACT_NAMES,
    Bisection,
    BisectRequest,
    Bug,
    BugCloseRequest,
    BugList,
    BugReopenRequest,
    BugResolution,
    CulpritState,
    Health,
    JobCreated,
    JobList,
    JobLog,
    JobSpec,
    JobState,
    JobStatus,
    ProgressEvent,
)

DEFAULT_SERVER = "http://127.0.0.1:8000"
# How long the client keeps trying an unreachable server (a restart, a deploy) before it gives up.
DEFAULT_RETRY_FOR_S = 300.0
RETRY_FOR_ENV = "MINIFY_RETRY_FOR"
# Answers that mean "not now" from a proxy or a server whose backend is briefly away.
RETRYABLE_STATUS = frozenset({502, 503, 504})
_FIRST_RETRY_DELAY_S = 0.5
_MAX_RETRY_DELAY_S = 5.0
# The artifacts a finished job is downloaded as; bundle.tar.gz repeats them in one file.
DEFAULT_ARTIFACTS = tuple(name for name in ARTIFACT_NAMES if name != "bundle.tar.gz")

logger = logging.getLogger(__name__)

_Model = TypeVar("_Model", bound=BaseModel)

ProgramSource = str | os.PathLike[str] | bytes | IO[bytes]


class Client:
    """A minify server. `server` and `token` default to $MINIFY_SERVER and $MINIFY_TOKEN.

    While the server cannot be reached (connection refused or reset, timeouts, 502/503/504) every
    call retries with backoff, honouring Retry-After, for up to `retry_for_s` seconds (default
    $MINIFY_RETRY_FOR, else 300) counted from the first failure; `on_retry` hears when an outage
    begins and ends (default: a log warning). A job submission is sent again only when the
    connection was never made, so it never creates two jobs. Then every method raises
    `ConnectionFailed` when the server cannot be reached and an `ApiError` subclass when it
    answers 4xx/5xx.
    """

    def __init__(
        self,
        server: str | None = None,
        token: str | None = None,
        *,
        timeout_s: float = 60.0,
        retry_for_s: float | None = None,
        on_retry: Callable[[str], None] | None = None,
    ) -> None:
        self.server = (server or os.environ.get("MINIFY_SERVER") or DEFAULT_SERVER).rstrip("/")
        self.token = token if token is not None else os.environ.get("MINIFY_TOKEN") or None
        self.retry_for_s = retry_for_from_environment() if retry_for_s is None else retry_for_s
        self._on_retry = on_retry or logger.warning
        self._unreachable_since: float | None = None
        self._failed_attempts = 0
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
        force: bool = False,
    ) -> JobCreated:
        """Post a failing program (a `torch.export.save` .pt2) and its spec; returns the new job, or
        (`deduplicated`) the job of an identical submission that is queued, running or succeeded,
        unless `force`."""
        job_spec = spec if isinstance(spec, JobSpec) else JobSpec.model_validate(spec or {})
        self._check_config(job_spec)
        with _opened(program, name or "program.pt2") as program_part, _opened_optional(
            inputs, "inputs.pt"
        ) as inputs_part:
            files = {"program": program_part}
            if inputs_part is not None:
                files["inputs"] = inputs_part
            response = self._request(
                "POST", "/v1/jobs", files=files, data={"spec": job_spec.model_dump_json()}, resend=False,
                params={"force": "true"} if force else None,
            )
        return _parse(JobCreated, response)

    def config_schemas(self) -> ConfigSchemas:
        """What the torch of each live worker accepts in JobSpec.config (`GET /v1/config`)."""
        return _parse(ConfigSchemas, self._request("GET", "/v1/config"))

    def _check_config(self, spec: JobSpec) -> None:
        """Refuse a spec whose config the server's workers would not take, before uploading anything
        (the server refuses it too: a 422 naming the key)."""
        if not spec.config:
            return
        try:
            schemas = self.config_schemas().schemas
        except NotFound:  # a server older than /v1/config: it checks nothing, nor can we
            return
        for schema in schemas:
            if problems := config_problems(spec.config, schema):
                raise BadRequest(422, "; ".join(problems))

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

    def bisect(self, job_id: str, good: str, bad: str) -> Bisection:
        """Start narrowing a succeeded job's regression to the first bad torch release between `good`
        and `bad` (a worker with a torch index installs the releases in between); follow it in
        `status(job_id).result.bisect`."""
        body = BisectRequest(good=good, bad=bad).model_dump()
        return _parse(Bisection, self._request("POST", f"/v1/jobs/{job_id}/bisect", json=body, resend=False))

    def cancel(self, job_id: str) -> JobStatus:
        """Cancel a job (its running candidates die); returns its status after the request."""
        response = self._request("DELETE", f"/v1/jobs/{job_id}")
        try:
            return JobStatus.model_validate_json(response.content)
        except ValidationError:
            return self.status(job_id)

    def bugs(self, *, offset: int = 0, limit: int = 50, status: str | None = None) -> BugList:
        """Bugs (succeeded jobs grouped by signature and minimal graph shape), most recently seen first;
        `status` open or fixed (a newer torch passes its repro) keeps only those."""
        params: dict[str, str | int] = {"offset": offset, "limit": limit}
        if status:
            params["status"] = status
        return _parse(BugList, self._request("GET", "/v1/bugs", params=params))

    def bug(self, bug_id: str) -> Bug:
        return _parse(Bug, self._request("GET", f"/v1/bugs/{bug_id}"))

    def close_bug(self, bug_id: str, reason: str, resolution: BugResolution = "fixed", by: str | None = None) -> Bug:
        """Close a bug by hand, saying why; `by` counts on a server without tokens (one with tokens
        records the token's name). Closed as `fixed`, the next job that finds it reopens it
        (regressed); as `wont_fix` or `not_a_bug` it stays closed. Conflict when it is closed already."""
        body = BugCloseRequest(reason=reason, resolution=resolution, by=by).model_dump()
        return _parse(Bug, self._request("POST", f"/v1/bugs/{bug_id}/close", json=body, resend=False))

    def reopen_bug(self, bug_id: str, reason: str, by: str | None = None) -> Bug:
        """Reopen a bug closed by hand, saying why. Conflict when it is not closed."""
        body = BugReopenRequest(reason=reason, by=by).model_dump()
        return _parse(Bug, self._request("POST", f"/v1/bugs/{bug_id}/reopen", json=body, resend=False))

    def log(self, job_id: str, tail: int = 200) -> JobLog:
        """The job's own log: the last `tail` lines of what the worker logged while it ran the job."""
        return _parse(JobLog, self._request("GET", f"/v1/jobs/{job_id}/log", params={"tail": tail}))

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

    def events(self, job_id: str, *, culprit: bool = False) -> Iterator[ProgressEvent]:
        """The job's progress events until it ends; a stream that drops (a server restart, a proxy)
        is resumed after the last event seen (Last-Event-ID); events the client does not
        understand are skipped. With `culprit`, a succeeded job's events go on while its culprit
        phase runs (it follows the delivered result), to the `culprit` event that ends it."""
        last_event_id: str | None = None
        # Set once the status says the job has ended although its stream had not: one more
        # stream replays what came after the last event seen (the job may have ended while
        # the server was away), and the server ends that stream itself.
        ended = False
        while True:
            finished = False
            try:
                for sse in self._event_stream(job_id, last_event_id):
                    if sse.id is not None:
                        last_event_id = sse.id
                    event = _progress_event(sse)
                    if event is None:
                        continue
                    yield event
                    if _ends(event, culprit):
                        finished = True
                        break
                if finished or ended:
                    return
                status = self.status(job_id)
                ended = status.status.finished and not (culprit and status.culprit_state is CulpritState.running)
            except httpx.TransportError as error:
                logger.info("event stream of %s dropped (%s); reconnecting", job_id, error)
                self._wait_to_retry(_connection_failed(self.server, error))
                continue
            if not ended:
                # The stream closed while the job runs (a proxy's idle timeout, a server restart).
                time.sleep(1.0)

    def wait(
        self, job_id: str, on_event: Callable[[ProgressEvent], None] | None = None, *, culprit: bool = False
    ) -> JobStatus:
        """Follow the job until it ends (with `culprit`, a succeeded job until its culprit phase
        ends too), calling `on_event` for each progress event; returns its final status."""
        for event in self.events(job_id, culprit=culprit):
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
        while True:
            try:
                return self._download_once(url, name, out_dir)
            except DownloadInterrupted as error:
                self._wait_to_retry(error)

    def _download_once(self, url: str, name: str, out_dir: Path) -> Path:
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

    def _request(self, method: str, url: str, *, resend: bool = True, **kwargs: Any) -> httpx.Response:
        """One request, retried while the server is unreachable. `resend=False` for a request that
        creates something: it is sent again only when it cannot have reached the server."""
        while True:
            try:
                response = self._http.request(method, url, **kwargs)
            except httpx.TransportError as error:
                if not _may_retry(error, resend):
                    raise _connection_failed(self.server, error) from error
                self._wait_to_retry(_connection_failed(self.server, error))
                continue
            if resend and response.status_code in RETRYABLE_STATUS:
                self._wait_to_retry(api_error(response.status_code, _error_message(response)),
                                    _retry_after_s(response))
                continue
            self._reached()
            _raise_for_status(response)
            return response

    def _wait_to_retry(self, error: MinifyError, retry_after_s: float | None = None) -> None:
        """Sleep before the next attempt, or raise `error` once `retry_for_s` has passed since
        the server was last reached."""
        now = time.monotonic()
        if self._unreachable_since is None:
            self._unreachable_since, self._failed_attempts = now, 0
            if self.retry_for_s > 0:
                self._on_retry(f"server {_unreachable(error)}, retrying for up to {self.retry_for_s:g} s ...")
        self._failed_attempts += 1
        left_s = self._unreachable_since + self.retry_for_s - now
        if left_s <= 0:
            self._unreachable_since = None
            raise _gave_up(error, self.retry_for_s) from error
        if retry_after_s is None:
            backoff_s = min(_MAX_RETRY_DELAY_S, _FIRST_RETRY_DELAY_S * 2 ** (self._failed_attempts - 1))
            retry_after_s = backoff_s * random.uniform(0.5, 1.0)  # jitter: clients do not return in step
        time.sleep(min(retry_after_s, left_s))

    def _reached(self) -> None:
        if self._unreachable_since is not None:
            self._on_retry(f"server reachable again after {time.monotonic() - self._unreachable_since:.0f} s")
            self._unreachable_since = None

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
    """`httpx.Client.stream` with connection errors and error statuses raised as MinifyErrors;
    opening it is retried as `Client._request` retries."""

    def __init__(self, client: Client, method: str, url: str, kwargs: dict[str, Any]) -> None:
        self._client = client
        self._method, self._url, self._kwargs = method, url, kwargs
        self._context: Any = None

    def __enter__(self) -> httpx.Response:
        client = self._client
        while True:
            self._context = client._http.stream(self._method, self._url, **self._kwargs)
            try:
                response = self._context.__enter__()
            except httpx.TransportError as error:
                if not _may_retry(error, resend=True):
                    raise _connection_failed(client.server, error) from error
                client._wait_to_retry(_connection_failed(client.server, error))
                continue
            if not response.is_error:
                client._reached()
                return response
            response.read()
            self._context.__exit__(None, None, None)
            if response.status_code in RETRYABLE_STATUS:
                client._wait_to_retry(api_error(response.status_code, _error_message(response)),
                                      _retry_after_s(response))
                continue
            client._reached()
            raise api_error(response.status_code, _error_message(response))

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._context.__exit__(kind, value, tb)


def retry_for_from_environment() -> float:
    """$MINIFY_RETRY_FOR (seconds), else DEFAULT_RETRY_FOR_S; ValueError unless a number >= 0."""
    raw = os.environ.get(RETRY_FOR_ENV, "").strip()
    if not raw:
        return DEFAULT_RETRY_FOR_S
    return parse_retry_for(raw, RETRY_FOR_ENV)


def parse_retry_for(raw: str, source: str = "--retry-for") -> float:
    """Seconds to keep retrying an unreachable server: a number >= 0 (0: give up at once)."""
    try:
        seconds = float(raw)
    except ValueError:
        seconds = -1.0
    if not seconds >= 0 or seconds == float("inf"):
        raise ValueError(f"{source} must be a number of seconds >= 0, not {raw!r}")
    return seconds


def _may_retry(error: httpx.TransportError, resend: bool) -> bool:
    if isinstance(error, (httpx.ConnectError, httpx.ConnectTimeout)):
        return True  # the connection was never made: the request did not reach the server
    return resend and isinstance(error, (httpx.NetworkError, httpx.TimeoutException, httpx.RemoteProtocolError))


def _retry_after_s(response: httpx.Response) -> float | None:
    """Retry-After in seconds (a number of seconds or an HTTP date), when the server sent one."""
    value = response.headers.get("retry-after")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return max(0.0, (when - datetime.now(timezone.utc)).total_seconds())


def _unreachable(error: MinifyError) -> str:
    if isinstance(error, ConnectionFailed):
        return f"unreachable ({error.reason})"
    if isinstance(error, ApiError):
        return f"unavailable (it answered {error.status_code}: {error.message})"
    return f"unreachable ({error})"


def _gave_up(error: MinifyError, retry_for_s: float) -> MinifyError:
    """`error`, saying how long the client retried (nothing to say when it was told not to)."""
    if retry_for_s <= 0:
        return error
    suffix = f" (gave up after retrying for {retry_for_s:g} s)"
    if isinstance(error, ConnectionFailed):
        return ConnectionFailed(error.server, error.reason + suffix)
    if isinstance(error, DownloadInterrupted):
        return DownloadInterrupted(error.name, error.reason + suffix)
    if isinstance(error, ApiError):
        return api_error(error.status_code, error.message + suffix)
    return error


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


def _ends(event: ProgressEvent, culprit: bool) -> bool:
    """Whether `event` ends the job's events: its final status, or with `culprit`, the end of a
    succeeded job's culprit phase."""
    if event.type == "culprit":
        return culprit and event.culprit_state is not CulpritState.running
    if event.type != "status" or event.status is None or not event.status.finished:
        return False
    return not (culprit and event.culprit_state is CulpritState.running)


def _progress_event(sse: ServerSentEvent) -> ProgressEvent | None:
    try:
        payload = json.loads(sse.data)
    except ValueError:
        return None
    if not isinstance(payload, dict):
        return None
    if "type" not in payload and sse.event in ("progress", "status", "log", "culprit"):
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

