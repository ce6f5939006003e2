"""The artifact store: content-addressed upload blobs and per-job result folders under the data dir."""

from __future__ import annotations

import errno
import hashlib
import os
import re
import shutil
import tarfile
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from minify_contract.models import ARTIFACT_NAMES, JOB_LOG_NAME

JOB_ID = re.compile(r"^[0-9a-f]{32}$")
BUNDLE = "bundle.tar.gz"
# What a full disk looks like to a write: no space left, a quota, or a file over the size limit
# (RLIMIT_FSIZE, a filesystem's largest file).
STORAGE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})


class UploadTooLarge(Exception):
    def __init__(self, limit_bytes: int) -> None:
        super().__init__(f"upload exceeds the limit of {limit_bytes} bytes")
        self.limit_bytes = limit_bytes


class StorageFull(Exception):
    """The data dir refused a write (disk full, quota, file size limit); what was written is removed."""

    def __init__(self, cause: OSError) -> None:
        super().__init__(f"{cause.strerror or cause} (errno {cause.errno})")
        self.cause = cause


@contextmanager
def _storage_errors() -> Iterator[None]:
    """Turns an OSError that means "disk full" into StorageFull; other errors pass through."""
    try:
        yield
    except OSError as error:
        if error.errno in STORAGE_ERRNOS:
            raise StorageFull(error) from error
        raise


class UnknownArtifact(LookupError):
    """Not one of the artifact names a job can have, or not produced (yet)."""


@dataclass(frozen=True)
class Blob:
    sha256: str
    path: Path
    size: int
    new: bool = False  # this commit created the file (no identical upload had)


class BlobWriter:
    """Streams one upload to a temp file in the data dir, hashing as it goes; never holds it in memory."""

    def __init__(self, tmp_dir: Path) -> None:
        with _storage_errors():
            handle, name = tempfile.mkstemp(dir=tmp_dir, prefix="upload-")
        self._file = os.fdopen(handle, "wb")
        self.path = Path(name)
        self._hash = hashlib.sha256()
        self.size = 0

    def write(self, data: bytes) -> None:
        with _storage_errors():
            self._file.write(data)
        self._hash.update(data)
        self.size += len(data)

    def close(self) -> None:
        with _storage_errors():
            self._file.close()

    def discard(self) -> None:
        """Remove the file, whatever state the write left it in (a full disk fails the close's flush too)."""
        try:
            self._file.close()
        except OSError:
            pass
        finally:
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
        """Move a finished upload to blobs/<sha256[:2]>/<sha256>; identical uploads share one blob.

        A blob that already exists is touched: retention deletes blobs by age (retention.py).
        Raises StorageFull (the upload removed) when the disk is full.
        """
        try:
            writer.close()
            digest = writer.sha256
            target = self.blobs / digest[:2] / digest
            with _storage_errors():
                target.parent.mkdir(exist_ok=True)
        except BaseException:
            writer.discard()
            raise
        new = not target.exists()
        if new:
            os.replace(writer.path, target)
        else:
            writer.path.unlink()
            os.utime(target)
        return Blob(sha256=digest, path=target, size=writer.size, new=new)

    def remove_job(self, job_id: str) -> None:
        """Delete a job's results (retention)."""
        shutil.rmtree(self.job_dir(job_id), ignore_errors=True)

    def remove_stale_files(self, referenced_blobs: set[str], older_than: float) -> int:
        """Delete blobs no job refers to and uploads left in tmp/, last touched before `older_than`
        (epoch seconds; a blob's time is its last upload). Returns the files deleted."""
        removed = 0
        stale = [path for path in self.blobs.glob("*/*") if path.name not in referenced_blobs]
        for path in [*stale, *self.tmp.glob("upload-*")]:
            try:
                if path.stat().st_mtime < older_than:
                    path.unlink()
                    removed += 1
            except FileNotFoundError:
                continue
        return removed

    def size_bytes(self) -> int:
        """Bytes of every file under the data dir (uploads, results, the embedded Redis)."""
        total = 0
        for folder, _, names in os.walk(self.root):
            for name in names:
                try:
                    total += os.lstat(os.path.join(folder, name)).st_size
                except FileNotFoundError:
                    continue
        return total

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
        if name == BUNDLE and (not path.exists() or self._stale(out, path)):
            self._bundle(out, path)
        resolved = path.resolve()
        if not resolved.is_relative_to(self.root) or not resolved.is_file():
            raise UnknownArtifact(f"job {job_id} has no {name}")
        return resolved

    def available(self, job_id: str) -> list[str]:
        out = self.out_dir(job_id)
        names = [name for name in ARTIFACT_NAMES if name != BUNDLE and (out / name).is_file()]
        return [*names, BUNDLE] if names else []

    def job_log(self, job_id: str, tail: int) -> tuple[list[str], bool, int]:
        """The last `tail` lines of the job's own log (JOB_LOG_NAME, and the older file its rotation
        kept), whether older lines were left out, and the bytes held; nothing yet for a job no
        worker has run."""
        current = self.job_dir(job_id) / JOB_LOG_NAME
        data = b""
        for path in (current.with_name(f"{JOB_LOG_NAME}.1"), current):
            try:
                data += path.read_bytes()
            except FileNotFoundError:
                continue
        lines = data.decode(errors="replace").splitlines()
        return lines[-tail:], len(lines) > tail, len(data)

    @staticmethod
    def _stale(out: Path, path: Path) -> bool:
        """Whether a member changed after the bundle was made (the culprit phase rewrites report.json
        and repro.py after the result is delivered)."""
        made = path.stat().st_mtime
        return any((out / name).is_file() and (out / name).stat().st_mtime > made
                   for name in ARTIFACT_NAMES if name != BUNDLE)

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
