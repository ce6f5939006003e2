"""`POST /v1/jobs` bodies: multipart parsed as it streams in, files written straight to the store.

Starlette's form parser would spool the whole body first; this one counts bytes as they arrive,
so an oversized upload is refused (413) after at most `limit` bytes, none of them held in memory.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from python_multipart.exceptions import MultipartParseError
from python_multipart.multipart import MultipartParser, parse_options_header
from starlette.concurrency import run_in_threadpool

from minify_server.store import ArtifactStore, BlobWriter, UploadTooLarge

FILE_FIELDS = ("program", "inputs")
TEXT_FIELDS = ("spec", "force")
TEXT_FIELD_LIMIT = 1024 * 1024
# A chunk this small is parsed (and written to its temp file) on the event loop: a hop to the
# thread pool costs more than that under load, and most submissions are a few such chunks.
INLINE_CHUNK_BYTES = 256 * 1024


class BadUpload(ValueError):
    """The body is not the multipart form POST /v1/jobs takes."""


@dataclass
class JobUpload:
    files: dict[str, BlobWriter] = field(default_factory=dict)
    filenames: dict[str, str] = field(default_factory=dict)
    texts: dict[str, str] = field(default_factory=dict)

    def discard(self) -> None:
        for writer in self.files.values():
            writer.discard()


class _FormCollector:
    """python-multipart callbacks: route each part to a BlobWriter (files) or a small buffer (text)."""

    def __init__(self, store: ArtifactStore, upload: JobUpload) -> None:
        self.store = store
        self.upload = upload
        self._header_field = b""
        self._header_value = b""
        self._headers: dict[bytes, bytes] = {}
        self._name = ""
        self._text: bytearray | None = None
        self._writer: BlobWriter | None = None

    def callbacks(self) -> dict:
        return {
            "on_part_begin": self._part_begin,
            "on_header_field": lambda data, start, end: self._append("_header_field", data[start:end]),
            "on_header_value": lambda data, start, end: self._append("_header_value", data[start:end]),
            "on_header_end": self._header_end,
            "on_headers_finished": self._headers_finished,
            "on_part_data": self._part_data,
            "on_part_end": self._part_end,
        }

    def _append(self, attribute: str, data: bytes) -> None:
        setattr(self, attribute, getattr(self, attribute) + data)

    def _part_begin(self) -> None:
        self._headers = {}
        self._name = ""

    def _header_end(self) -> None:
        self._headers[self._header_field.lower()] = self._header_value
        self._header_field = self._header_value = b""

    def _headers_finished(self) -> None:
        _, options = parse_options_header(self._headers.get(b"content-disposition", b""))
        self._name = options.get(b"name", b"").decode("utf-8", "replace")
        if self._name in self.upload.files or self._name in self.upload.texts:
            raise BadUpload(f"form field {self._name!r} given twice")
        if self._name in FILE_FIELDS:
            self._writer = self.store.new_writer()
            self.upload.files[self._name] = self._writer
            self.upload.filenames[self._name] = options.get(b"filename", b"").decode("utf-8", "replace")
        elif self._name in TEXT_FIELDS:
            self._text = bytearray()
        else:
            expected = ", ".join(FILE_FIELDS + TEXT_FIELDS)
            raise BadUpload(f"unexpected form field {self._name!r}; POST /v1/jobs takes {expected}")

    def _part_data(self, data: bytes, start: int, end: int) -> None:
        if self._writer is not None:
            self._writer.write(data[start:end])
        elif self._text is not None:
            self._text += data[start:end]
            if len(self._text) > TEXT_FIELD_LIMIT:
                raise BadUpload(f"form field {self._name!r} is over {TEXT_FIELD_LIMIT} bytes")

    def _part_end(self) -> None:
        if self._writer is not None:
            self._writer.close()
        elif self._text is not None:
            self.upload.texts[self._name] = self._text.decode("utf-8", "replace")
        self._writer = None
        self._text = None


async def receive_job_upload(content_type: str, body: AsyncIterator[bytes], store: ArtifactStore,
                             limit_bytes: int) -> JobUpload:
    """Parse the streamed body; on any error every partial file is removed before the error propagates."""
    media_type, options = parse_options_header(content_type)
    boundary = options.get(b"boundary")
    if media_type != b"multipart/form-data" or not boundary:
        raise BadUpload("POST /v1/jobs takes multipart/form-data with fields program, spec and optional inputs")
    upload = JobUpload()
    parser = MultipartParser(boundary, _FormCollector(store, upload).callbacks())
    received = 0
    try:
        async for chunk in body:
            received += len(chunk)
            if received > limit_bytes:
                raise UploadTooLarge(limit_bytes)
            if len(chunk) <= INLINE_CHUNK_BYTES:
                parser.write(chunk)
            else:
                await run_in_threadpool(parser.write, chunk)
        parser.finalize()
    except MultipartParseError as error:
        upload.discard()
        raise BadUpload(f"malformed multipart body: {error}") from error
    except BaseException:
        upload.discard()
        raise
    return upload
