"""export_load: the one reader of a .pt2's serialized programs (models/*.json, for the loader's
pytree stand-ins and op_modules.custom_ops_of_program), the stand-ins for pytree types this process
does not know, and the real cause of a failed `torch.export.load`. Archives written by hand: no
export, no compile. Loading real programs (in a sandbox child) is in test_prepare.py."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path
from typing import Any

import pytest

from minify_worker.programs.fx.export_load import (
    LoadFailed,
    PytreeStandIn,
    load,
    model_documents,
    register_stand_in,
    unknown_pytree_types,
    unregistered_ops,
)


def _graph(*targets: str, subgraph: dict[str, Any] | None = None) -> dict[str, Any]:
    nodes = [{"target": target, "inputs": []} for target in targets]
    return {"graph_module": {"graph": {"nodes": nodes}, "subgraphs": [subgraph] if subgraph else []}}


def _pt2(path: Path, members: dict[str, str]) -> Path:
    with zipfile.ZipFile(path, "w") as archive:
        for name, text in members.items():
            archive.writestr(name, text)
    return path


def _with_specs(*specs: Any) -> dict[str, Any]:
    """A serialized program whose module call signature has these in and out specs (protocol 1)."""
    in_spec, out_spec = (json.dumps([1, spec]) for spec in specs)
    return {"graph_module": {"module_call_graph": [{"fqn": "", "signature": {"in_spec": in_spec,
                                                                             "out_spec": out_spec}}]}}


def _node(type_name: str | None, *children: dict[str, Any]) -> dict[str, Any]:
    return {"type": type_name, "context": "null", "children_spec": list(children)}


@pytest.mark.fast
def test_the_documents_are_the_archives_model_json_files(tmp_path: Path) -> None:
    model = _graph("torch.ops.aten.relu.default")
    path = _pt2(tmp_path / "p.pt2", {"p/models/model.json": json.dumps(model), "p/data/weights/w.json": "{}",
                                     "p/version": "1"})
    assert list(model_documents(path)) == [model]


@pytest.mark.fast
def test_a_model_file_that_is_not_json_is_skipped(tmp_path: Path) -> None:
    model = _graph("torch.ops.aten.relu.default")
    path = _pt2(tmp_path / "p.pt2", {"p/models/broken.json": "{not json", "p/models/model.json": json.dumps(model)})
    assert list(model_documents(path)) == [model]


@pytest.mark.fast
def test_a_file_that_is_not_a_zip_has_no_documents(tmp_path: Path) -> None:
    path = tmp_path / "text.pt2"
    path.write_text("not a zip")
    assert list(model_documents(path)) == []
    assert list(model_documents(tmp_path / "missing.pt2")) == []


@pytest.mark.fast
def test_the_unknown_pytree_types_are_those_the_specs_name_that_this_process_has_not_registered() -> None:
    document = _with_specs(_node("builtins.tuple", _node("mylib.outputs.ModelOutput", _node(None)),
                                 _node("builtins.dict")),
                           _node("mylib.outputs.Other", _node("mylib.outputs.ModelOutput")))

    assert unknown_pytree_types([document]) == ["mylib.outputs.ModelOutput", "mylib.outputs.Other"]


@pytest.mark.fast
def test_a_stand_in_keeps_its_children_and_its_context_as_written() -> None:
    import torch.utils._pytree as pytree

    stand_in = register_stand_in("tests.worker.programs.fx.test_export_load.Unknown")
    node = stand_in([1, 2])
    node.context = {"keys": ["a", "b"]}

    leaves, spec = pytree.tree_flatten(node)
    rebuilt = pytree.tree_unflatten([10, 20], spec)

    assert issubclass(stand_in, PytreeStandIn) and stand_in.__name__ == "Unknown"
    assert leaves == [1, 2] and list(rebuilt) == [10, 20] and rebuilt.context == {"keys": ["a", "b"]}
    unknown = _node("tests.worker.programs.fx.test_export_load.Unknown")
    assert unknown_pytree_types([_with_specs(unknown, _node(None))]) == []


# Not fast: the first torch.export.load of a process imports its deserializer (seconds).
def test_a_failed_load_says_torchs_logged_cause_first_and_the_custom_ops_missing_here(tmp_path: Path) -> None:
    path = _pt2(tmp_path / "p.pt2", {"p/models/model.json": json.dumps(_graph("torch.ops.nosuch.frob.default")),
                                     "p/version": "1"})

    with pytest.raises(LoadFailed) as raised:
        load(path)

    causes = raised.value.causes
    assert len(causes) >= 2 and "We ran into an error when deserializing" not in causes[0]
    assert "We ran into an error when deserializing" in causes[-1]  # what torch raised comes last
    assert raised.value.missing_ops == ["nosuch::frob"]


@pytest.mark.fast
def test_the_unregistered_ops_are_the_programs_custom_ops_torch_ops_lacks_here(tmp_path: Path) -> None:
    import torch

    torch.library.define("minify_export_load_test::known", "(Tensor x) -> Tensor")
    model = _graph("torch.ops.aten.relu.default", "torch.ops.minify_export_load_test.known.default",
                   "torch.ops.minify_export_load_test.unknown.default")
    path = _pt2(tmp_path / "p.pt2", {"p/models/model.json": json.dumps(model)})

    assert unregistered_ops(path) == ["minify_export_load_test::unknown"]
