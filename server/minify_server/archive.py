"""Is an upload a torch.export archive that loads without running code (or a program.json, a
StableHLO or HLO program that is what it says)? No torch, no unpickling.

The format is decided from the zip directory; the members that would run code when
`torch.export.load` reads them (pickled weights and constants, ...) are found by
`minify_contract.archive`, which the worker runs again before it loads.
"""

from __future__ import annotations

import zipfile
from pathlib import Path

from minify_contract.archive import (
    ALLOW_PICKLE_ENV,
    MLIR_BYTECODE_MAGIC,
    describe_not_a_zip,
    describe_unsafe_members,
    find_unsafe_members,
    starts_as_pickle,
)
from minify_contract.program_json import ProgramJsonError, read_document

# Entries that mark a torch.export archive, relative to its single top-level folder: the pt2 archive
# format (torch >= 2.7: `archive_format`, `models/<name>.json`) and the older flat layout.
_MARKERS = ("archive_format", "serialized_exported_program.json")
_MODEL_PREFIX = "models/"


class NotAnExportArchive(ValueError):
    """The file is not what `torch.export.save` writes."""


class NotAProgram(ValueError):
    """The file is not a program.json, a StableHLO module or HLO text (or its inputs not an .npz of
    plain arrays)."""


class CodeInArchive(NotAnExportArchive):
    """The archive holds members that would run code when loaded (pickles), and pickles are not allowed."""


def check_export_archive(path: Path, *, allow_pickle: bool = False) -> None:
    """Raise NotAnExportArchive with the reason when `path` is not a torch.export .pt2 archive, and
    CodeInArchive naming the members that would run code when loaded, unless `allow_pickle`."""
    try:
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
    except (zipfile.BadZipFile, OSError) as error:
        raise NotAnExportArchive(f"not a torch.export archive: {describe_not_a_zip(path)}; save the program "
                                 "with torch.export.save") from error
    if not names:
        raise NotAnExportArchive("not a torch.export archive: the zip file is empty")
    roots = {name.split("/", 1)[0] for name in names}
    if len(roots) != 1 or any("/" not in name for name in names):
        raise NotAnExportArchive("not a torch.export archive: expected one top-level folder in the zip")
    if any(name.startswith("/") or ".." in name.split("/") for name in names):
        raise NotAnExportArchive("not a torch.export archive: unsafe entry names")
    (root,) = roots
    inner = {name[len(root) + 1:] for name in names}
    has_model = any(name.startswith(_MODEL_PREFIX) and name.endswith(".json") for name in inner)
    if not (has_model or any(marker in inner for marker in _MARKERS)):
        raise NotAnExportArchive(
            "not a torch.export archive: no archive_format, models/*.json or serialized_exported_program.json"
        )
    if not allow_pickle:
        _check_no_code(path)


def is_pickle_file(path: Path) -> bool:
    """A raw pickle, or a torch.save zip (a folder holding data.pkl): what torch.save writes."""
    with open(path, "rb") as file:
        head = file.read(2)
    if starts_as_pickle(head):
        return True
    try:
        check_torch_save_file(path)
    except NotAnExportArchive:
        return False
    return True


def _check_no_code(path: Path) -> None:
    try:
        unsafe = find_unsafe_members(path)
    except (zipfile.BadZipFile, OSError) as error:
        raise NotAnExportArchive(f"not a torch.export archive: a damaged zip file ({error})") from error
    if unsafe:
        raise CodeInArchive(f"refused: {describe_unsafe_members(unsafe)}; the operator accepts such archives "
                            f"by setting {ALLOW_PICKLE_ENV}=1 (trusted uploads only)")


def check_torch_save_file(path: Path) -> None:
    """inputs.pt is a torch.save zip: one top-level folder holding data.pkl (never unpickled here)."""
    try:
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
    except (zipfile.BadZipFile, OSError) as error:
        raise NotAnExportArchive(f"not a torch.save file: {describe_not_a_zip(path)}") from error
    if not any(name.count("/") == 1 and name.endswith("/data.pkl") for name in names):
        raise NotAnExportArchive("not a torch.save file (no data.pkl)")


# -- minify's program.json (JobSpec.program_format fx_json; minify_contract.program_json) --------


def check_program_json(path: Path) -> None:
    """program.json: JSON in minify's program format, its structure, node references and target
    names checked (`minify_contract.program_json.check_document`); raises NotAProgram. Its targets
    are resolved, and its values read, only in a sandbox child."""
    try:
        read_document(path.read_bytes())
    except ProgramJsonError as error:
        raise NotAProgram(str(error)) from None


# -- StableHLO and HLO programs (JobSpec.program_format; docs/hlo.md) ---------------------------

_NPY_MAGIC = b"\x93NUMPY"


def check_hlo_program(path: Path, program_format: str) -> None:
    """`stablehlo`: MLIR bytecode (a portable VHLO artifact too) or UTF-8 MLIR text naming a
    function; `hlo`: UTF-8 text starting `HloModule`. The container only: nothing is parsed or
    run here (a sandbox child parses it)."""
    data = path.read_bytes()
    if program_format == "stablehlo" and data.startswith(MLIR_BYTECODE_MAGIC):
        return
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise NotAProgram(f"not a {program_format} program: neither MLIR bytecode nor UTF-8 text ({error})") from error
    if program_format == "hlo":
        if not text.lstrip().startswith("HloModule"):
            raise NotAProgram("not HLO text: it does not start with 'HloModule' (what XLA's --xla_dump_to writes)")
        return
    if "func.func" not in text and "func @" not in text:
        raise NotAProgram("not a StableHLO module: MLIR text with no function (func.func), nor MLIR bytecode")


def check_npz_file(path: Path) -> None:
    """inputs.npz: a zip of .npy arrays, none of them pickled objects (never loaded here)."""
    try:
        with zipfile.ZipFile(path) as archive:
            for info in archive.infolist():
                with archive.open(info) as member:
                    head = member.read(256)
                if not info.filename.endswith(".npy") or not head.startswith(_NPY_MAGIC):
                    raise NotAProgram(f"not an .npz of arrays: {info.filename!r} is not a .npy array")
                if b"'descr': '|O'" in head or b"'descr': 'O'" in head:
                    raise NotAProgram(f"refused: {info.filename!r} holds pickled objects; save plain arrays")
    except (zipfile.BadZipFile, OSError) as error:
        raise NotAProgram(f"not an .npz of arrays (not a zip: {error})") from error
