"""What a compiler engineer receives: minimized.pt2, inputs.pt, repro.py (and signature_rules.py
beside it), report.json, bundle.tar.gz.

By concept: `repro` renders repro.py (pure: `render_repro`); `files` writes the files, the
program's in a sandbox child (`write_program_artifacts`: it needs the value store and
torch.export), report.json and the bundle in the engine's process (`write_report`,
`write_bundle`). The bug a result files under is report.json's (report.py `build_report`).

repro.py holds its inputs inline when they are a few elements, each written exactly (a repro that
fits in an issue); else it reads them from inputs.pt, which keeps exact bits, dtypes, strides and
scalar types for any size. Either way the values are the job's: an accuracy or data-dependent
failure may hinge on them (torch's own repros regenerate random inputs and can lose the failure
that way).

Sandbox call targets name this package ("minify_worker.artifacts:write_program_artifacts"):
keep what they name re-exported here.
"""

from .files import (
    BUNDLE,
    BUNDLE_FOLDER,
    INPUTS,
    MINIMIZED,
    REPORT,
    REPRO,
    SIGNATURE_RULES,
    STORAGE_ERRNOS,
    ArtifactWriteError,
    InputValue,
    export_minimized,
    graph_inputs,
    raise_storage_error,
    rewrite_for_culprit,
    rewrite_with_header_lines,
    write_bundle,
    write_program_artifacts,
    write_program_files,
    write_report,
)
from .repro import render_repro

__all__ = [
    "BUNDLE",
    "BUNDLE_FOLDER",
    "INPUTS",
    "MINIMIZED",
    "REPORT",
    "REPRO",
    "SIGNATURE_RULES",
    "STORAGE_ERRNOS",
    "ArtifactWriteError",
    "InputValue",
    "export_minimized",
    "graph_inputs",
    "raise_storage_error",
    "render_repro",
    "rewrite_for_culprit",
    "rewrite_with_header_lines",
    "write_bundle",
    "write_program_artifacts",
    "write_program_files",
    "write_report",
]
