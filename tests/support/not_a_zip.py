"""Files that are no zip, and what the server's upload check and the worker's loader both say each
is (`minify_contract.archive.describe_not_a_zip`): tests/server/test_api_archive.py and
tests/worker/programs/fx/test_prepare.py take the same cases."""

from __future__ import annotations

from pathlib import Path

CASES = [
    (b"", "the file is empty (0 bytes)"),
    (b"print('hi')\n", "it is a text file (it starts \"print('hi')\")"),
    (b"\n\n  \n", "it is a text file (it starts '')"),
    (b"\xff\xfe\x00garbage", "it is neither a zip nor text (it starts ff fe 00 67"),
    (b"\x80\x02}q\x00.", "it is a pickle"),
    (b"ML\xefR\x00\x01", "it is MLIR bytecode: submit it as StableHLO"),
    (b"module {\n  func.func @main() {}\n}\n", "it is MLIR text: submit it as StableHLO"),
    (b"HloModule m\nENTRY e {}\n", "it is HLO text: submit it as HLO"),
    (b'{"format": "minify-fx"}', "it is JSON: submit minify's program.json as such"),
]

TRUNCATED = "it begins as a zip but its end (the zip's directory) is missing: a truncated upload or copy?"


def truncated_copy(archive: Path, to: Path) -> Path:
    """The first half of `archive`: a zip whose directory (at its end) never arrived."""
    data = archive.read_bytes()
    to.write_bytes(data[: len(data) // 2])
    return to
