"""Where a captured program goes: files in a directory, a job on a server, or both.

Without `submit_to` and `save_to`, `$MINIFY_CAPTURE_DIR/<name>/` is used when set, else a
submission to `$MINIFY_SERVER` when set, else `./minify-captures/<name>/`.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from minify_client.client import Client
from minify_contract.models import JobCreated, JobSpec

from .program_file import INPUTS, write_program

logger = logging.getLogger(__name__)

DEFAULT_CAPTURE_DIR = Path("minify-captures")


@dataclass(frozen=True)
class Captured:
    """Where a captured program went: files kept in `directory` (None when only submitted), and
    the job when it was submitted. `chain` is the failure's exception chain, outermost first (one
    "Type: first line" per link), when a failing compile was captured."""

    name: str
    spec: JobSpec
    directory: Path | None = None
    program_name: str = ""  # the program file's name in `directory`: `<name>.pt2`, or `<name>.json` (program_file)
    job: JobCreated | None = None
    dashboard: str | None = None
    chain: tuple[str, ...] = field(default=())

    @property
    def program(self) -> Path | None:
        return self.directory / (self.program_name or f"{self.name}.pt2") if self.directory is not None else None

    def describe(self) -> str:
        """One line for a log or an exception note."""
        parts = []
        if self.job is not None:
            parts.append(f"submitted as minify job {self.job.id} ({self.dashboard})")
        if self.directory is not None:
            parts.append(
                f"saved to {self.directory}; submit with: minify-client submit {self.program} "
                f"--spec {self.directory / 'spec.json'} --inputs {self.directory / 'inputs.pt'} --wait"
            )
        return "minify: failing program " + "; ".join(parts)


def resolve(
    name: str, submit_to: str | Client | None, save_to: str | os.PathLike[str] | None
) -> tuple[Path | None, str | Client | None]:
    """(directory to keep the files in or None, server to submit to or None)."""
    if submit_to is not None or save_to is not None:
        return (Path(save_to) if save_to is not None else None), submit_to
    if os.environ.get("MINIFY_CAPTURE_DIR"):
        return Path(os.environ["MINIFY_CAPTURE_DIR"]) / name, None
    if os.environ.get("MINIFY_SERVER"):
        return None, os.environ["MINIFY_SERVER"]
    return DEFAULT_CAPTURE_DIR / name, None


def save_and_submit(
    program: Any,
    args: Sequence[Any],
    kwargs: dict[str, Any],
    spec: JobSpec,
    *,
    name: str,
    destination: Path | None,
    submit_to: str | Client | None,
    token: str | None = None,
    chain: tuple[str, ...] = (),
) -> Captured:
    """Write `program` (an ExportedProgram), spec.json and inputs.pt to `destination` and/or submit
    them; without a destination the files live in a temporary directory removed afterwards. A
    program torch.export.save cannot write goes as program.json (`program_file`), its spec saying so."""
    directory = destination or Path(tempfile.mkdtemp(prefix="minify-capture-"))
    try:
        directory.mkdir(parents=True, exist_ok=True)
        written = write_program(program, args, kwargs, directory, name)
        program_path = directory / written.name
        spec = written.described_by(spec)
        (directory / "spec.json").write_text(spec.model_dump_json(indent=2) + "\n")
        job = dashboard = None
        if submit_to is not None:
            client = submit_to if isinstance(submit_to, Client) else Client(submit_to, token)
            try:
                job = client.submit(program_path, spec, inputs=directory / INPUTS)
                dashboard = client.dashboard_url(job)
            finally:
                if client is not submit_to:
                    client.close()
    finally:
        if destination is None:
            shutil.rmtree(directory, ignore_errors=True)
    captured = Captured(name=name, spec=spec, directory=destination, job=job, dashboard=dashboard, chain=chain,
                        program_name=written.name)
    logger.warning("%s", captured.describe())
    return captured


def add_note(error: BaseException, note: str) -> None:
    if hasattr(error, "add_note"):  # Python 3.11+
        error.add_note(note)
