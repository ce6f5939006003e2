"""minify_contract.archive: which members of a .pt2 would run code when torch.export.load reads them.

The archives are real torch.export.save output, rewritten as an attacker would (tests/support/archives.py).
"""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from examples import programs
from minify_contract.archive import find_unsafe_members
from tests.support import archives


def members(path: Path) -> list[str]:
    return [finding.member.split("/", 1)[1] for finding in find_unsafe_members(path)]


@pytest.fixture(autouse=True)
def _directories(tmp_path: Path) -> None:
    for name in ("w", "c", "o", "i", "e"):
        (tmp_path / name).mkdir()


def test_torch_export_load_really_runs_each_payload(tmp_path: Path) -> None:
    markers = {name: tmp_path / f"ran-{name}" for name in ("weight", "constant", "opaque", "inputs", "expression")}
    built = [
        archives.pickled_weight_archive(tmp_path / "w", markers["weight"]),
        archives.pickled_constant_archive(tmp_path / "c", markers["constant"]),
        archives.pickled_constant_archive(tmp_path / "o", markers["opaque"], prefix="opaque_obj_"),
        archives.pickled_sample_inputs_archive(tmp_path / "i", markers["inputs"]),
        archives.shape_expression_archive(tmp_path / "e", markers["expression"]),
    ]
    archives.load_in_child(built)
    # torch before 2.13 (2.11, 2.12) has no opaque objects in archives: it never reads an `opaque_obj_*` file
    # (the check refuses one all the same, below).
    expected_silent = [] if _torch_reads_opaque_objects() else ["opaque"]
    assert [name for name, marker in markers.items() if not marker.exists()] == expected_silent


def test_a_module_named_in_the_input_structure_is_imported_by_torch_and_named(tmp_path: Path) -> None:
    marker, module = tmp_path / "imported", "minify_structure_import_marker"
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / f"{module}.py").write_text(f"import pathlib\npathlib.Path({str(marker)!r}).touch()\n")
    archive = archives.structure_import_archive(tmp_path / "e", module)
    archives.load_in_child([archive], python_path=tmp_path / "m")
    assert marker.exists()  # plain torch.export.load imported it
    [finding] = find_unsafe_members(archive)
    assert f"an enum of module {module!r}" in finding.reason and finding.member.endswith(".json")


def _torch_reads_opaque_objects() -> bool:
    from torch.export.pt2_archive import constants

    return hasattr(constants, "OPAQUE_OBJ_FILENAME_PREFIX")


@pytest.mark.parametrize("name", ["relu_cos", "linear_relu_sigmoid", "linear_relu_sigmoid_dict"])
def test_what_torch_export_save_writes_has_no_unsafe_member(tmp_path: Path, name: str) -> None:
    assert find_unsafe_members(programs.save(name, tmp_path)) == []


def test_tensor_constants_and_shape_expressions_are_safe(tmp_path: Path) -> None:
    assert find_unsafe_members(archives.constant_archive(tmp_path / "c")) == []
    assert find_unsafe_members(archives.dynamic_archive(tmp_path / "e")) == []


def test_a_weight_marked_use_pickle_is_named(tmp_path: Path) -> None:
    (finding,) = find_unsafe_members(archives.pickled_weight_archive(tmp_path / "w", tmp_path / "ran"))
    assert finding.member.endswith("/data/weights/weight_0")
    assert "weight 'fc1.weight' is marked use_pickle" in finding.reason


def test_a_weight_marked_use_pickle_is_named_even_when_it_holds_a_tensor(tmp_path: Path) -> None:
    import torch

    archive = archives.pickled_weight_archive(tmp_path / "w", tmp_path / "ran", payload=torch.ones(16, 10))
    assert members(archive) == ["data/weights/weight_0"]


def test_a_tensor_constant_marked_use_pickle_is_named(tmp_path: Path) -> None:
    assert members(archives.pickled_constant_archive(tmp_path / "c", tmp_path / "ran")) == ["data/constants/tensor_0"]


@pytest.mark.parametrize(("prefix", "reason"), [("opaque_obj_", "pickle.loads"), ("custom_obj_", "TorchScript")])
def test_object_constants_are_named(tmp_path: Path, prefix: str, reason: str) -> None:
    (finding,) = find_unsafe_members(archives.pickled_constant_archive(tmp_path / "o", tmp_path / "ran", prefix=prefix))
    assert finding.member.endswith(f"/data/constants/{prefix}0") and reason in finding.reason


def test_example_inputs_whose_pickle_calls_anything_but_tensor_rebuilders_are_named(tmp_path: Path) -> None:
    (finding,) = find_unsafe_members(archives.pickled_sample_inputs_archive(tmp_path / "i", tmp_path / "ran"))
    assert finding.member.endswith("/data/sample_inputs/model.pt") and "pathlib" in finding.reason


def test_example_inputs_that_are_not_a_zip_are_named(tmp_path: Path) -> None:
    source = programs.save("relu_cos", tmp_path)
    archive = archives.rewrite_archive(source, tmp_path / "raw.pt2", lambda inner, data: (
        b"\x80\x02cos\nsystem\n." if inner == "data/sample_inputs/model.pt" else None))
    assert members(archive) == ["data/sample_inputs/model.pt"]


def test_legacy_weight_files_are_scanned_like_example_inputs(tmp_path: Path) -> None:
    source = programs.save("relu_cos", tmp_path)
    evil = archives.torch_saved(archives.TouchOnUnpickle(tmp_path / "ran"))
    archive = archives.rewrite_archive(source, tmp_path / "legacy.pt2", lambda inner, data: None,
                                       extra={"data/weights/model.pt": evil})
    assert members(archive) == ["data/weights/model.pt"]


def test_a_shape_expression_that_runs_python_is_named(tmp_path: Path) -> None:
    (finding,) = find_unsafe_members(archives.shape_expression_archive(tmp_path / "e", tmp_path / "ran"))
    assert finding.member.endswith("/models/model.json")
    assert "__import__" in finding.reason and "sympy.sympify" in finding.reason


def test_compiled_aotinductor_code_is_named(tmp_path: Path) -> None:
    source = programs.save("relu_cos", tmp_path)
    archive = archives.rewrite_archive(source, tmp_path / "aoti.pt2", lambda inner, data: None,
                                       extra={"data/aotinductor/model/model.so": b"\x7fELF"})
    assert members(archive) == ["data/aotinductor/model/model.so"]


def test_a_member_stored_twice_is_named(tmp_path: Path) -> None:
    source = programs.save("relu_cos", tmp_path)
    archive = tmp_path / "twice.pt2"
    archive.write_bytes(source.read_bytes())
    with zipfile.ZipFile(archive, "a") as zipped, pytest.warns(UserWarning, match="Duplicate name"):
        zipped.writestr(zipped.namelist()[0], b"{}")
    assert any("appears twice" in finding.reason for finding in find_unsafe_members(archive))
