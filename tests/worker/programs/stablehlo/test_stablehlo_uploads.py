"""A StableHLO or HLO program through the front doors (issue 32): its format told from the file,
the server's container check (nothing parsed or run there), the client's submit."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from minify_contract.models import JobState, detect_program_format
from minify_server.archive import NotAProgram, check_hlo_program, check_npz_file
from tests.support import hlo_programs
from tests.support.scripted_server import ScriptedServer, job_status, serve_job


@pytest.mark.parametrize(("name", "head", "expected"), [
    ("program.pt2", b"PK\x03\x04rest", "pt2"),
    ("exported", b"PK\x03\x04rest", "pt2"),
    ("module_0001.jit_f.before_optimizations.txt", b"HloModule jit_f, entry_computation_layout", "hlo"),
    ("dump.hlo", b"", "hlo"),
    ("program.bin", b"ML\xefR\rMLIR", "stablehlo"),
    ("program.mlir", b"", "stablehlo"),
    ("lowered.txt", b"\n  module @jit_f attributes {", "stablehlo"),
    ("unknown.bin", b"\x00\x01", "pt2"),
])
def test_a_programs_format_is_told_from_its_suffix_or_content(name: str, head: bytes, expected: str) -> None:
    assert detect_program_format(name, head) == expected


def test_the_server_accepts_mlir_text_bytecode_and_hlo_text_as_they_are(tmp_path: Path) -> None:
    mlir, _ = hlo_programs.write_program(tmp_path, hlo_programs.control_flow_program())
    hlo, _ = hlo_programs.write_program(tmp_path, hlo_programs.hlo_text_program(), name="dump.hlo")
    bytecode = tmp_path / "program.mlirbc"
    bytecode.write_bytes(b"ML\xefR\rMLIR23.0.0git\x00\x01")
    check_hlo_program(mlir, "stablehlo")
    check_hlo_program(bytecode, "stablehlo")
    check_hlo_program(hlo, "hlo")


@pytest.mark.parametrize(("content", "program_format", "reason"), [
    (b"def f(x): return x\n", "stablehlo", "no function"),
    (b"\xff\xfe\x00binary", "stablehlo", "neither MLIR bytecode nor UTF-8 text"),
    (b"module {\n  func.func @main() {\n    return\n  }\n}\n", "hlo", "does not start with 'HloModule'"),
])
def test_the_server_refuses_what_is_not_the_format_the_spec_says(tmp_path: Path, content: bytes,
                                                                  program_format: str, reason: str) -> None:
    path = tmp_path / "program"
    path.write_bytes(content)
    with pytest.raises(NotAProgram, match=reason):
        check_hlo_program(path, program_format)


def test_the_server_accepts_an_npz_of_arrays_and_refuses_pickled_objects(tmp_path: Path) -> None:
    np.savez(tmp_path / "inputs.npz", np.ones((2, 3), np.float32), np.array(3, np.int32))
    check_npz_file(tmp_path / "inputs.npz")
    np.savez(tmp_path / "objects.npz", np.array([{"a": 1}], dtype=object))
    with pytest.raises(NotAProgram, match="pickled objects"):
        check_npz_file(tmp_path / "objects.npz")
    (tmp_path / "text.npz").write_text("not a zip")
    with pytest.raises(NotAProgram, match="not a zip"):
        check_npz_file(tmp_path / "text.npz")


def test_submit_sends_a_stablehlo_modules_format_with_its_spec(server: ScriptedServer, tmp_path: Path) -> None:
    text, arrays = hlo_programs.nan_max_program()
    program, inputs = hlo_programs.write_program(tmp_path, text, arrays)
    serve_job(server, job_status("j1", JobState.queued), [])
    result = subprocess.run([sys.executable, "-m", "minify_client.cli", "submit", str(program), "--inputs", str(inputs),
                             "--backend", "xla", "--server", server.url], capture_output=True, text=True, timeout=60,
                            check=False)
    assert result.returncode == 0, result.stderr
    body = server.requests_to("POST", "/v1/jobs")[0].body
    spec = json.loads(body.split(b'name="spec"\r\n\r\n', 1)[1].split(b"\r\n--", 1)[0])
    assert (spec["program_format"], spec["backend"]) == ("stablehlo", "xla")
    assert inputs.read_bytes() in body
