"""The artifact store: content-addressed upload blobs and per-job result folders under the data dir."""

from __future__ import annotations

import hashlib
import os
import re
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

from minify_client.models import ARTIFACT_NAMES

JOB_ID = re.compile(r"^[0-9a-f]{32}$")
BUNDLE = "bundle.tar.gz"


class UploadTooLarge(Exception):
    def __init__(self, limit_bytes: int) -> None:
        super().__init__(f"upload exceeds the limit of {limit_bytes} bytes")
        self.limit_bytes = limit_bytes


class UnknownArtifact(LookupError):
    """Not one of the artifact names a job can have, or not produced (yet)."""


@dataclass(frozen=True)
class Blob:
    sha256: str
    path: Path
    size: int


class BlobWriter:
    """Streams one upload to a temp file in the data dir, hashing as it goes; never holds it in memory."""

    def __init__(self, tmp_dir: Path) -> None:
        handle, name = tempfile.mkstemp(dir=tmp_dir, prefix="upload-")
        self._file = os.fdopen(handle, "wb")
        self.path = Path(name)
        self._hash = hashlib.sha256()
        self.size = 0

    def write(self, data: bytes) -> None:
        self._file.write(data)
        self._hash.update(data)
        self.size += len(data)

    def close(self) -> None:
        self._file.close()

    def discard(self) -> None:
        self._file.close()
        self.path.unlink(missing_ok=True)

    @property
    def sha256(self) -> str:
        return self._hash.hexdigest()


class ArtifactStore:
    def __init__(self, data_dir: Path) -> None:
        self.root = data_dir.resolve()
        self.blobs = self.root / "blobs"
        self.jobs = self.root / "jobs"
        self.tmp = self.root / "tmp"
        for folder in (self.blobs, self.jobs, self.tmp):
            folder.mkdir(parents=True, exist_ok=True)

    def new_writer(self) -> BlobWriter:
        return BlobWriter(self.tmp)

    def commit(self, writer: BlobWriter) -> Blob:
        """Move a finished upload to blobs/<sha256[:2]>/<sha256>; identical uploads share one blob."""
        writer.close()
        digest = writer.sha256
        target = self.blobs / digest[:2] / digest
        target.parent.mkdir(exist_ok=True)
        if target.exists():
            writer.path.unlink()
        else:
            os.replace(writer.path, target)
        return Blob(sha256=digest, path=target, size=writer.size)

    def job_dir(self, job_id: str) -> Path:
        if not JOB_ID.match(job_id):
            raise UnknownArtifact(f"no job {job_id!r}")
        return self.jobs / job_id

    def out_dir(self, job_id: str) -> Path:
        """Where the worker writes the job's artifacts."""
        return self.job_dir(job_id) / "out"

    def artifact(self, job_id: str, name: str) -> Path:
        """The file of a known artifact name; raises UnknownArtifact for any other name or a missing file."""
        if name not in ARTIFACT_NAMES:
            raise UnknownArtifact(f"{name!r} is not an artifact name; one of {', '.join(ARTIFACT_NAMES)}")
        out = self.out_dir(job_id)
        path = self.job_dir(job_id) / BUNDLE if name == BUNDLE else out / name
        if name == BUNDLE and not path.exists():
            self._bundle(out, path)
        resolved = path.resolve()
        if not resolved.is_relative_to(self.root) or not resolved.is_file():
            raise UnknownArtifact(f"job {job_id} has no {name}")
        return resolved

    def available(self, job_id: str) -> list[str]:
        out = self.out_dir(job_id)
        names = [name for name in ARTIFACT_NAMES if name != BUNDLE and (out / name).is_file()]
        return [*names, BUNDLE] if names else []

    @staticmethod
    def _bundle(out: Path, path: Path) -> None:
        members = [out / name for name in ARTIFACT_NAMES if name != BUNDLE and (out / name).is_file()]
        if not members:
            return
        partial = path.with_suffix(".partial")
        with tarfile.open(partial, "w:gz") as bundle:
            for member in members:
                bundle.add(member, arcname=f"minify-{out.parent.name[:8]}/{member.name}")
        os.replace(partial, path)
