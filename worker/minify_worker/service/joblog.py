"""A job's own log: the work horse's log records while it runs one job, kept beside the job's
result folder (`<out_dir>/../worker.log`, JOB_LOG_NAME), where the server reads it for
`GET /v1/jobs/{id}/log`, the client's `minify-client logs` and the job page's "Worker log".

It holds what the worker logs (the sandbox's restarts and faults, the last output of candidates'
children that died, the engine's warnings and errors, their tracebacks) and a line at the start
and end of every attempt. Bounded: the file rotates at MAX_BYTES, one older file kept, so a job's
log never holds more than twice that. A folder of its own per attempt would lose what killed the
attempt before: the file sits above `out/`, which each attempt starts clean.
"""

from __future__ import annotations

import functools
import logging
import os
import time
from collections.abc import Callable
from logging.handlers import RotatingFileHandler
from pathlib import Path
from typing import Any

from minify_contract.models import JOB_LOG_NAME

log = logging.getLogger(__name__)

MAX_BYTES = 256 * 1024
FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def log_path(out_dir: Path) -> Path:
    """The log of the job whose results go to `out_dir`."""
    return out_dir.parent / JOB_LOG_NAME


def attach(path: Path) -> logging.Handler | None:
    """Copy the process's log records (at the root logger's level) into `path` from now on; None
    when the file cannot be opened (the job runs on without its log)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handler = RotatingFileHandler(path, maxBytes=MAX_BYTES, backupCount=1, encoding="utf-8")
    except OSError as error:
        log.warning("no job log at %s: %s", path, error)
        return None
    handler.setFormatter(logging.Formatter(FORMAT))
    logging.getLogger().addHandler(handler)
    return handler


def detach(handler: logging.Handler | None) -> None:
    if handler is not None:
        logging.getLogger().removeHandler(handler)
        handler.close()


def kept(run: Callable[[dict[str, Any]], str]) -> Callable[[dict[str, Any]], str]:
    """`run` (the RQ job entry, given a ticket's wire form) with the job's log kept while it runs."""

    @functools.wraps(run)
    def run_with_log(wire: dict[str, Any]) -> str:
        from rq import get_current_job

        job_id = wire.get("job_id", "?")
        handler = attach(log_path(Path(wire["out_dir"])))
        started = time.monotonic()
        rq_job = get_current_job()
        worker = os.environ.get("RQ_WORKER_ID") or (rq_job.worker_name if rq_job else None) or "?"
        log.info("job %s: an attempt starts on worker %s (work horse %d)", job_id, worker, os.getpid())
        try:
            status = run(wire)
        except BaseException as error:
            log.warning("job %s: the attempt ended after %.1f s: %s: %s", job_id, time.monotonic() - started,
                        type(error).__name__, error)
            raise
        else:
            log.info("job %s: the attempt ended after %.1f s: %s", job_id, time.monotonic() - started, status)
            return status
        finally:
            detach(handler)

    return run_with_log
