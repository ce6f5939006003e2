"""The upload check: a torch.export archive is recognised from its zip directory, without torch."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from minify_server.archive import NotAnExportArchive, check_export_archive, check_torch_save_file


def make_zip(path: Path, names: list[str]) -> Path:
    with zipfile.ZipFile(path, "w") as archive:
        for name in names:
            archive.writestr(name, b"{}")
    return path


def test_a_real_torch_export_save_is_accepted(tmp_path: Path) -> None:
    from examples.programs import save

    check_export_archive(save("relu_cos", tmp_path))


@pytest.mark.parametrize("names", [
    ["model/archive_format", "model/models/model.json", "model/data/weights/model_weights_config.json"],
    ["model/models/model.json", "model/byteorder"],
    ["ep/serialized_exported_program.json", "ep/serialized_state_dict.pt", "ep/version"],
])
def test_export_archive_layouts_are_accepted(tmp_path: Path, names: list[str]) -> None:
    check_export_archive(make_zip(tmp_path / "p.pt2", names))


def test_a_text_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "p.pt2"
    path.write_text("print('hi')\n")
    with pytest.raises(NotAnExportArchive, match="not a zip file"):
        check_export_archive(path)


@pytest.mark.parametrize(("names", "reason"), [
    (["a/archive_format", "b/models/model.json"], "one top-level folder"),
    (["archive_format"], "one top-level folder"),
    (["a/data.pkl", "a/version"], "no archive_format"),
    (["a/../../etc/archive_format"], "unsafe entry names"),
])
def test_other_zips_are_refused(tmp_path: Path, names: list[str], reason: str) -> None:
    with pytest.raises(NotAnExportArchive, match=reason):
        check_export_archive(make_zip(tmp_path / "p.pt2", names))


def test_torch_save_inputs_are_recognised(tmp_path: Path) -> None:
    import torch

    torch.save({"x": torch.ones(2)}, tmp_path / "inputs.pt")
    check_torch_save_file(tmp_path / "inputs.pt")
    with pytest.raises(NotAnExportArchive, match=r"not a torch\.save file"):
        check_torch_save_file(make_zip(tmp_path / "i.pt", ["a/archive_format"]))
