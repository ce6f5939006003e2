"""minify client: submit a failing PyTorch program to a minify server and fetch its repro.

    from minify_client import Client

    with Client("http://minify:8000", token) as client:
        job = client.submit("failing.pt2", spec={"config": {...}})
        final = client.wait(job.id, on_event=print)
        client.download(job.id, "repro/")

Importing this package never imports torch; only the capture (`minify_client.capture`) does, when
it captures.
"""

from minify_client.capture import Captured, capture_failures
from minify_client.client import DEFAULT_SERVER, Client
from minify_client.errors import (
    ApiError,
    BadRequest,
    Conflict,
    ConnectionFailed,
    DownloadInterrupted,
    MinifyError,
    NotFound,
    ServerError,
    Unauthorized,
)
from minify_contract.models import JobCreated, JobSpec, JobState, JobStatus, ProgressEvent, Report

__all__ = [
    "DEFAULT_SERVER",
    "ApiError",
    "BadRequest",
    "Captured",
    "Client",
    "Conflict",
    "ConnectionFailed",
    "DownloadInterrupted",
    "JobCreated",
    "JobSpec",
    "JobState",
    "JobStatus",
    "MinifyError",
    "NotFound",
    "ProgressEvent",
    "Report",
    "ServerError",
    "Unauthorized",
    "capture_failures",
]
