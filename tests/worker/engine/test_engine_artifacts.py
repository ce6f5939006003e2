"""The delivered files whatever the program (engine/artifacts.py): the bundle, repro.py's header
rewritten after delivery, and the full-disk rule, over files the tests write themselves: no
sandbox, no compile. The artifacts of real jobs, and their repros run, are in test_artifacts.py."""

from __future__ import annotations

import errno
import gzip
import io
import json
import tarfile
from pathlib import Path

import pytest

from minify_contract.models import JobState, Report
from minify_worker.engine import artifacts
from minify_worker.engine.artifacts import ArtifactWriteError

pytestmark = pytest.mark.fast

PENDING = ["Culprit:          pending: the culprit phase runs after the repro is delivered"]
REPRO = """\
# Signature: RuntimeError: injected failure on relu
#
# Culprit:          pending: the culprit phase runs after the repro is delivered
#
# Environment it failed in (this worker):
#   torch: 2.13.0
#
# Run: python repro.py
import torch
"""


def report(**fields: object) -> Report:
    return Report.model_validate({"status": JobState.succeeded, "backend": "inductor", "device": "cpu", **fields})


def delivered(out_dir: Path, repro: str = REPRO) -> Path:
    """A delivered result: repro.py, report.json, and the bundle of them."""
    out_dir.mkdir(exist_ok=True)
    (out_dir / artifacts.REPRO).write_text(repro)
    artifacts.write_report(report(), out_dir)
    artifacts.write_bundle(out_dir)
    return out_dir


def bundled(out_dir: Path) -> dict[str, bytes]:
    with tarfile.open(out_dir / artifacts.BUNDLE) as archive:
        return {member.name: archive.extractfile(member).read() for member in archive.getmembers()}  # type: ignore[union-attr]


def full_disk(path: Path) -> None:
    path.write_text("half a")
    raise OSError(errno.ENOSPC, "No space left on device")


def test_the_bundle_holds_the_delivered_files_under_one_folder_and_nothing_else(tmp_path: Path) -> None:
    out = delivered(tmp_path / "out")
    (out / "worker.log").write_text("not an artifact")

    artifacts.write_bundle(out)

    assert list(bundled(out)) == [f"{artifacts.BUNDLE_FOLDER}/{artifacts.REPORT}",  # in sorted order
                                  f"{artifacts.BUNDLE_FOLDER}/{artifacts.REPRO}"]
    assert bundled(out)[f"{artifacts.BUNDLE_FOLDER}/{artifacts.REPRO}"] == REPRO.encode()


def test_the_same_artifacts_give_the_same_bundle_bytes(tmp_path: Path) -> None:
    first, second = delivered(tmp_path / "a"), delivered(tmp_path / "b")

    assert (first / artifacts.BUNDLE).read_bytes() == (second / artifacts.BUNDLE).read_bytes()
    assert (first / artifacts.BUNDLE).read_bytes()[4:8] == bytes(4)  # gzip's own mtime, whenever it was written
    with gzip.open(first / artifacts.BUNDLE) as unzipped, tarfile.open(fileobj=io.BytesIO(unzipped.read())) as tar:
        assert {(m.mtime, m.uid, m.gid, m.mode) for m in tar.getmembers()} == {(0, 0, 0, 0o644)}


def test_report_json_is_the_report_model(tmp_path: Path) -> None:
    path = artifacts.write_report(report(nodes_original=7), tmp_path / "new")

    assert path.name == artifacts.REPORT
    assert Report.model_validate(json.loads(path.read_text())) == report(nodes_original=7)


def test_a_write_the_disk_refuses_leaves_no_partial_file_and_names_it(tmp_path: Path) -> None:
    for code in sorted(artifacts.STORAGE_ERRNOS):
        path = tmp_path / artifacts.REPRO

        def refused(target: Path, code: int = code) -> None:
            target.write_text("half a")
            raise OSError(code, "refused")

        with pytest.raises(ArtifactWriteError, match=rf"could not write repro\.py: refused \(errno {code}\)") as raised:
            artifacts.write_artifact(path, refused)
        assert raised.value.name == artifacts.REPRO and not path.exists()


def test_another_write_error_is_not_taken_for_a_full_disk(tmp_path: Path) -> None:
    def denied(target: Path) -> None:
        raise PermissionError(errno.EACCES, "Permission denied")

    with pytest.raises(PermissionError):
        artifacts.write_artifact(tmp_path / artifacts.REPORT, denied)


def test_a_full_disk_met_in_a_child_is_raised_in_the_engine_as_the_same_error() -> None:
    artifacts.raise_storage_error({"written": ["repro.py"]})  # none met: nothing raised

    with pytest.raises(ArtifactWriteError, match=r"could not write inputs\.pt") as raised:
        artifacts.raise_storage_error({"storage_error": ["inputs.pt", [errno.ENOSPC, "No space left on device"]]})
    assert raised.value.name == "inputs.pt"


def test_the_header_tail_says_the_culprit_the_environment_and_how_to_run(tmp_path: Path) -> None:
    tail = artifacts.header_tail(["Culprit:          inductor"], {"torch": "2.13.0", "gcc": "line one\nline two"},
                                 "this worker", "Run: python repro.py")

    assert tail[:5] == ["", "Culprit:          inductor", "", "Environment it failed in (this worker):",
                        "  torch: 2.13.0"]
    assert tail[5] == "  gcc: line one; line two"
    assert tail[6:8] == ["", "Run: python repro.py"]
    assert len(artifacts.header_tail(None, {"os": "x" * 1000}, "w", "Run")[2]) == len("  os: ") + 300


def test_after_the_culprit_phase_the_pending_line_report_and_bundle_are_replaced_whole(tmp_path: Path) -> None:
    out = delivered(tmp_path / "out")
    final = ["Culprit:          inductor / lowerings #0: relu", "Workarounds:      none verified"]

    artifacts.rewrite_for_culprit(out, report(nodes_final=1), PENDING, final)

    repro = (out / artifacts.REPRO).read_text()
    assert "pending" not in repro
    assert "# Culprit:          inductor / lowerings #0: relu\n# Workarounds:      none verified\n#\n" in repro
    assert json.loads((out / artifacts.REPORT).read_text())["nodes_final"] == 1
    assert bundled(out)[f"{artifacts.BUNDLE_FOLDER}/{artifacts.REPRO}"] == repro.encode()
    assert sorted(path.name for path in out.iterdir()) == [artifacts.BUNDLE, artifacts.REPORT, artifacts.REPRO]


def test_lines_added_after_delivery_go_before_the_environment_as_a_paragraph(tmp_path: Path) -> None:
    out = delivered(tmp_path / "out")

    artifacts.rewrite_with_header_lines(out, report(), ["Fixed in:         torch 2.15.0"])

    repro = (out / artifacts.REPRO).read_text()
    assert "#\n# Fixed in:         torch 2.15.0\n#\n# Environment it failed in (this worker):" in repro
    assert bundled(out)[f"{artifacts.BUNDLE_FOLDER}/{artifacts.REPRO}"] == repro.encode()


def test_without_an_environment_paragraph_the_lines_go_before_how_to_run(tmp_path: Path) -> None:
    out = delivered(tmp_path / "out", repro="# Signature: x\n#\n# Run: python repro.py\nimport torch\n")

    artifacts.rewrite_with_header_lines(out, report(), ["Fixed in:         torch 2.15.0"])

    assert (out / artifacts.REPRO).read_text() == (
        "# Signature: x\n#\n# Fixed in:         torch 2.15.0\n#\n# Run: python repro.py\nimport torch\n")


def test_a_rewrite_the_disk_refuses_keeps_the_delivered_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = delivered(tmp_path / "out")
    before = (out / artifacts.REPORT).read_text()
    monkeypatch.setattr(Path, "write_bytes", lambda self, data: full_disk(self))

    with pytest.raises(ArtifactWriteError):
        artifacts.rewrite_for_culprit(out, report(nodes_final=1), PENDING, ["Culprit: x"])

    assert (out / artifacts.REPORT).read_text() == before and (out / artifacts.REPRO).read_text() == REPRO
    assert not [path for path in out.iterdir() if path.name.endswith(".new")]
