"""What can go wrong talking to a minify server, as a short hierarchy a caller catches by meaning.

    MinifyError
    ├── ConnectionFailed        the server could not be reached (refused, DNS, timeout, dropped)
    ├── ApiError                the server answered 4xx/5xx
    │   ├── BadRequest          400, 413, 415, 422: the upload or the spec was refused
    │   ├── Unauthorized        401, 403: missing or wrong token
    │   ├── NotFound            404: no such job or artifact
    │   ├── Conflict            409: e.g. artifacts of a job that has not finished
    │   └── ServerError         5xx
    └── DownloadInterrupted     an artifact download stopped part-way (nothing was left behind)
"""

from __future__ import annotations


class MinifyError(Exception):
    """Base class of every error the client raises."""


class ConnectionFailed(MinifyError):
    """The server could not be reached."""

    def __init__(self, server: str, reason: str) -> None:
        super().__init__(f"cannot reach minify server at {server}: {reason}")
        self.server = server
        self.reason = reason


class ApiError(MinifyError):
    """The server answered with an error status."""

    def __init__(self, status_code: int, message: str) -> None:
        super().__init__(f"server answered {status_code}: {message}")
        self.status_code = status_code
        self.message = message


class BadRequest(ApiError):
    """The server refused the request as malformed (bad spec, not a .pt2, too large)."""


class Unauthorized(ApiError):
    """The token is missing or not accepted."""


class NotFound(ApiError):
    """No such job or artifact."""


class Conflict(ApiError):
    """The request does not fit the job's state."""


class ServerError(ApiError):
    """The server failed (5xx)."""


class DownloadInterrupted(MinifyError):
    """An artifact download stopped before the whole file arrived; no partial file is kept."""

    def __init__(self, name: str, reason: str) -> None:
        super().__init__(f"download of {name} interrupted: {reason}")
        self.name = name
        self.reason = reason


def api_error(status_code: int, message: str) -> ApiError:
    """The most specific ApiError for an HTTP status."""
    if status_code in (401, 403):
        return Unauthorized(status_code, message)
    if status_code == 404:
        return NotFound(status_code, message)
    if status_code == 409:
        return Conflict(status_code, message)
    if status_code >= 500:
        return ServerError(status_code, message)
    if status_code in (400, 413, 415, 422):
        return BadRequest(status_code, message)
    return ApiError(status_code, message)
