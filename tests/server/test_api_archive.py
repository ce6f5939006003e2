"""The upload check: a torch.export archive is recognised from its zip directory, without torch."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from minify_server.archive import NotAnExportArchive, check_export_archive, check_torch_save_file
from tests.support import not_a_zip


def make_zip(path: Path, names: list[str]) -> Path:
    with zipfile.ZipFile(path, "w") as archive:
        for name in names:
            archive.writestr(name, b"" if name.endswith(".pt") else b"{}")  # torch reads an empty .pt as {}
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


@pytest.mark.parametrize(("content", "says"), not_a_zip.CASES)
def test_a_file_that_is_not_a_zip_is_refused_saying_what_it_is(tmp_path: Path, content: bytes, says: str) -> None:
    path = tmp_path / "p.pt2"
    path.write_bytes(content)
    with pytest.raises(NotAnExportArchive) as refused:
        check_export_archive(path)
    assert str(refused.value).startswith(f"not a torch.export archive: {says}")


def test_a_truncated_archive_is_refused_as_cut_short(tmp_path: Path) -> None:
    from examples.programs import save

    path = not_a_zip.truncated_copy(save("relu_cos", tmp_path), tmp_path / "cut.pt2")
    with pytest.raises(NotAnExportArchive) as refused:
        check_export_archive(path)
    assert str(refused.value).startswith(f"not a torch.export archive: {not_a_zip.TRUNCATED}")


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


def test_an_archive_with_a_pickled_weight_is_refused_naming_the_member(tmp_path: Path) -> None:
    from minify_server.archive import CodeInArchive
    from tests.support.archives import pickled_weight_archive

    with pytest.raises(CodeInArchive, match=r"data/weights/weight_0 .*MINIFY_ALLOW_PICKLE=1"):
        check_export_archive(pickled_weight_archive(tmp_path, tmp_path / "ran"))


def test_an_archive_with_a_pickled_weight_is_accepted_where_the_operator_allows_pickles(tmp_path: Path) -> None:
    from tests.support.archives import pickled_weight_archive

    check_export_archive(pickled_weight_archive(tmp_path, tmp_path / "ran"), allow_pickle=True)


def test_the_server_answers_415_naming_the_pickled_member_and_nothing_runs(tmp_path: Path) -> None:
    import json

    from tests.support.archives import pickled_weight_archive
    from tests.support.service import start_service

    program = pickled_weight_archive(tmp_path, tmp_path / "ran")
    with start_service(tmp_path / "data", workers=0) as service, service.client() as client:
        response = client.post("/v1/jobs", files={"program": (program.name, program.read_bytes())},
                               data={"spec": json.dumps({"backend": "eager"})})
        listed = client.get("/v1/jobs").json()
    assert response.status_code == 415, response.text
    assert "data/weights/weight_0 (weight 'fc1.weight' is marked use_pickle" in response.json()["error"]
    assert listed["jobs"] == [] and not (tmp_path / "ran").exists()
