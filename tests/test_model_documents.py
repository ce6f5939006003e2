"""export_load.model_documents: the one reader of a .pt2's serialized programs (models/*.json),
for the loader's pytree stand-ins and op_modules.custom_ops_of_program. No torch needed."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path
from typing import Any

from minify_worker.programs.fx.export_load import model_documents
from minify_worker.programs.fx.op_modules import custom_ops_of_program


def _graph(*targets: str, subgraph: dict[str, Any] | None = None) -> dict[str, Any]:
    nodes = [{"target": target, "inputs": []} for target in targets]
    return {"graph_module": {"graph": {"nodes": nodes}, "subgraphs": [subgraph] if subgraph else []}}


def _pt2(path: Path, members: dict[str, str]) -> Path:
    with zipfile.ZipFile(path, "w") as archive:
        for name, text in members.items():
            archive.writestr(name, text)
    return path


def test_the_documents_are_the_archives_model_json_files(tmp_path: Path) -> None:
    model = _graph("torch.ops.aten.relu.default")
    path = _pt2(tmp_path / "p.pt2", {"p/models/model.json": json.dumps(model), "p/data/weights/w.json": "{}",
                                     "p/version": "1"})
    assert list(model_documents(path)) == [model]


def test_a_model_file_that_is_not_json_is_skipped(tmp_path: Path) -> None:
    model = _graph("torch.ops.aten.relu.default")
    path = _pt2(tmp_path / "p.pt2", {"p/models/broken.json": "{not json", "p/models/model.json": json.dumps(model)})
    assert list(model_documents(path)) == [model]


def test_a_file_that_is_not_a_zip_has_no_documents(tmp_path: Path) -> None:
    path = tmp_path / "text.pt2"
    path.write_text("not a zip")
    assert list(model_documents(path)) == []
    assert list(model_documents(tmp_path / "missing.pt2")) == []


def test_the_custom_ops_of_a_program_are_those_outside_torchs_namespaces_subgraphs_included(tmp_path: Path) -> None:
    model = _graph("torch.ops.aten.relu.default", "torch.ops.mylib.scale.default",
                   subgraph=_graph("torch.ops.mylib.shift.Tensor", "torch.ops.mylib.scale.default"))
    path = _pt2(tmp_path / "p.pt2", {"p/models/model.json": json.dumps(model)})
    assert custom_ops_of_program(path) == ["mylib::scale", "mylib::shift"]


def test_a_file_that_is_not_a_program_has_no_custom_ops(tmp_path: Path) -> None:
    path = tmp_path / "text.pt2"
    path.write_text("not a zip")
    assert custom_ops_of_program(path) == []
