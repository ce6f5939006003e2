"""What a representation's loader (`prepare_target`, in a sandbox child) leaves in the work dir for
the engine: program.json (the program's wire form and its metadata) beside the value store."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PROGRAM_JSON = "program.json"
VALUES = "values.pt"
FORMAT = "minify-program/1"


class ProgramError(Exception):
    """The program or its inputs cannot be used; the message says why and what to do."""


@dataclass(frozen=True)
class PreparedProgram:
    """What prepare wrote into the work dir."""

    wire_graph: dict[str, Any]
    values_path: Path
    program_json: Path
    metadata: dict[str, Any]

    @property
    def nodes_original(self) -> int:
        return int(self.metadata.get("nodes_original", 0))

    @classmethod
    def read(cls, workdir: Path) -> PreparedProgram:
        path = Path(workdir) / PROGRAM_JSON
        data = json.loads(path.read_text())
        if data.get("format") != FORMAT:
            raise ProgramError(f"{path} is not a {FORMAT} file")
        return cls(data["graph"], Path(workdir) / VALUES, path, data["metadata"])
