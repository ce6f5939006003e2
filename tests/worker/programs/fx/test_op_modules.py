"""op_modules: which modules that register custom ops the worker imports (MINIFY_ALLOWED_OP_MODULES),
what it says when one cannot be imported, and which custom ops a .pt2 calls (read from its
serialized graphs, nothing loaded). Modules written by the tests; no sandbox, no compile. A job
with a custom op end to end is in test_custom_ops.py."""

from __future__ import annotations

import json
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from minify_worker.programs.fx import op_modules
from minify_worker.programs.fx.op_modules import (
    ALLOWED_OP_MODULES_ENV,
    OpModuleError,
    allowed,
    custom_ops_of_program,
    import_op_modules,
)

pytestmark = pytest.mark.fast


def _graph(*targets: str, subgraph: dict[str, Any] | None = None) -> dict[str, Any]:
    nodes = [{"target": target, "inputs": []} for target in targets]
    return {"graph_module": {"graph": {"nodes": nodes}, "subgraphs": [subgraph] if subgraph else []}}


def _pt2(path: Path, model: dict[str, Any]) -> Path:
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("p/models/model.json", json.dumps(model))
    return path


@pytest.fixture
def module_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A folder on sys.path for the test's own op modules (forgotten afterwards)."""
    (tmp_path / "minify_test_ops").mkdir()
    (tmp_path / "minify_test_ops" / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path / "minify_test_ops"
    for name in [name for name in sys.modules if name.startswith("minify_test_ops")]:
        del sys.modules[name]


def test_a_module_is_allowed_by_its_own_name_or_a_package_above_it() -> None:
    assert allowed("mylib", ["mylib"]) and allowed("mylib.ops", ["mylib"]) and allowed("mylib.ops", ["mylib."])
    assert not allowed("mylib_extra", ["mylib"])  # a name that only starts alike is another package
    assert not allowed("other.ops", ["mylib", "mylib.ops"]) and not allowed("mylib", [])


def test_an_allowed_module_is_imported(module_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (module_dir / "scale.py").write_text("REGISTERED = True\n")
    monkeypatch.setenv(ALLOWED_OP_MODULES_ENV, "minify_test_ops")

    import_op_modules(["minify_test_ops.scale"])

    assert sys.modules["minify_test_ops.scale"].REGISTERED


def test_a_module_the_worker_does_not_allow_is_refused_saying_how_to_allow_it(module_dir: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    (module_dir / "scale.py").write_text("raise AssertionError('must not be imported')\n")
    monkeypatch.setenv(ALLOWED_OP_MODULES_ENV, "mylib")

    with pytest.raises(OpModuleError) as raised:
        import_op_modules(["minify_test_ops.scale"], ["mylib::scale"])

    message = str(raised.value)
    assert "the program's custom ops (mylib::scale) need module 'minify_test_ops.scale'" in message
    assert f"{ALLOWED_OP_MODULES_ENV}=minify_test_ops.scale" in message and "now mylib" in message
    assert "minify_test_ops.scale" not in sys.modules


def test_a_module_that_cannot_be_imported_is_named_with_its_error(module_dir: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    (module_dir / "broken.py").write_text("raise ValueError('no kernel for this machine')\n")
    monkeypatch.setenv(ALLOWED_OP_MODULES_ENV, "minify_test_ops")

    with pytest.raises(OpModuleError, match=r"'minify_test_ops\.broken'.*cannot be imported on this worker: "
                                            r"ValueError: no kernel for this machine"):
        import_op_modules(["minify_test_ops.broken"])
    with pytest.raises(OpModuleError, match=r"the job needs module 'minify_test_ops\.missing'.*ModuleNotFoundError"):
        import_op_modules(["minify_test_ops.missing"])


def test_a_module_that_initializes_cuda_when_imported_is_refused(module_dir: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    (module_dir / "cuda.py").write_text("import torch\ntorch.cuda.init()\n")
    monkeypatch.setenv(ALLOWED_OP_MODULES_ENV, "minify_test_ops")
    initialized = iter([False, True])  # before the import, after it: as torch.cuda.init() leaves it
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: next(initialized))
    monkeypatch.setattr(torch.cuda, "init", lambda: None)

    with pytest.raises(OpModuleError, match="initialized CUDA when imported"):
        import_op_modules(["minify_test_ops.cuda"])


def test_the_custom_ops_of_a_program_are_those_outside_torchs_namespaces_subgraphs_included(tmp_path: Path) -> None:
    model = _graph("torch.ops.aten.relu.default", "torch.ops.mylib.scale.default",
                   subgraph=_graph("torch.ops.mylib.shift.Tensor", "torch.ops.mylib.scale.default"))
    assert custom_ops_of_program(_pt2(tmp_path / "p.pt2", model)) == ["mylib::scale", "mylib::shift"]


def test_a_file_that_is_not_a_program_has_no_custom_ops(tmp_path: Path) -> None:
    path = tmp_path / "text.pt2"
    path.write_text("not a zip")
    assert custom_ops_of_program(path) == []
    assert op_modules.custom_ops_of_program(_pt2(tmp_path / "aten.pt2", _graph("torch.ops.aten.cos.default"))) == []
