"""Real torch.export archives rewritten the way an attacker would: a member that runs code when loaded.

    program = pickled_weight_archive(tmp_path, marker=tmp_path / "ran")

Each payload is `pathlib.Path.touch(marker)` run by the unpickler (or by sympy's eval): the marker
file appears if and only if something loaded the member. `load_in_child` proves that plain
`torch.export.load` does run each payload, so the refusals tested elsewhere refuse a real attack.
"""

from __future__ import annotations

import io
import json
import os
import pathlib
import pickle
import subprocess
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path

import torch

from examples import programs

Rewrite = Callable[[str, bytes], bytes | None]


class TouchOnUnpickle:
    """Unpickling this object creates `marker`."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[object, ...]]:
        return (pathlib.Path.touch, (pathlib.Path(str(self.marker)),))


def torch_saved(value: object) -> bytes:
    buffer = io.BytesIO()
    torch.save(value, buffer)
    return buffer.getvalue()


def rewrite_archive(source: Path, target: Path, rewrite: Rewrite, extra: dict[str, bytes] | None = None) -> Path:
    """Copy the zip `source` to `target`; `rewrite(inner_name, data)` returns new bytes or None to keep.

    Names are relative to the archive's top folder; `extra` adds members (also relative).
    """
    with zipfile.ZipFile(source) as src, zipfile.ZipFile(target, "w") as dst:
        root = src.namelist()[0].split("/", 1)[0]
        for info in src.infolist():
            data = src.read(info)
            inner = info.filename[len(root) + 1:]
            dst.writestr(info, rewrite(inner, data) or data)
        for inner, data in (extra or {}).items():
            dst.writestr(f"{root}/{inner}", data)
    return target


def _set_config(data: bytes, fqn: str, **fields: object) -> bytes:
    config = json.loads(data)
    config["config"][fqn].update(fields)
    return json.dumps(config).encode()


def pickled_weight_archive(directory: Path, marker: Path, *, payload: object | None = None) -> Path:
    """linear_relu_sigmoid with `fc1.weight` marked use_pickle, its file a torch.save of `payload`
    (default: an object that touches `marker` when unpickled)."""
    source = programs.save("linear_relu_sigmoid", directory)
    saved = torch_saved(TouchOnUnpickle(marker) if payload is None else payload)

    def rewrite(inner: str, data: bytes) -> bytes | None:
        if inner == "data/weights/model_weights_config.json":
            return _set_config(data, "fc1.weight", use_pickle=True)
        return saved if inner == "data/weights/weight_0" else None

    return rewrite_archive(source, directory / "pickled_weight.pt2", rewrite)


class WithConstant(torch.nn.Module):
    """A program with a lifted tensor constant (data/constants/tensor_0)."""

    def __init__(self) -> None:
        super().__init__()
        self.offset = torch.arange(4.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x + self.offset)


def constant_archive(directory: Path) -> Path:
    ep = torch.export.export(WithConstant(), (torch.randn(3, 4),))
    torch.export.save(ep, directory / "with_constant.pt2")
    return directory / "with_constant.pt2"


def constant_fqn(archive: Path) -> str:
    with zipfile.ZipFile(archive) as src:
        name = next(n for n in src.namelist() if n.endswith("data/constants/model_constants_config.json"))
        return next(iter(json.loads(src.read(name))["config"]))


def pickled_constant_archive(directory: Path, marker: Path, *, prefix: str = "tensor_") -> Path:
    """WithConstant whose constant is a pickle that touches `marker`: a `tensor_*` file marked
    use_pickle (torch.load), or an `opaque_obj_*` / `custom_obj_*` file."""
    source = constant_archive(directory)
    fqn = constant_fqn(source)
    path_name = f"{prefix}0"
    payload = torch_saved(TouchOnUnpickle(marker)) if prefix == "tensor_" else pickle.dumps(TouchOnUnpickle(marker))

    def rewrite(inner: str, data: bytes) -> bytes | None:
        if inner == "data/constants/model_constants_config.json":
            return _set_config(data, fqn, use_pickle=True, path_name=path_name)
        return payload if inner == "data/constants/tensor_0" and prefix == "tensor_" else None

    extra = {} if prefix == "tensor_" else {f"data/constants/{path_name}": payload}
    return rewrite_archive(source, directory / f"pickled_{prefix}constant.pt2", rewrite, extra)


def pickled_sample_inputs_archive(directory: Path, marker: Path) -> Path:
    """relu_cos whose example inputs are a torch.save that touches `marker` (torch loads them with
    weights_only=True, and on failure with weights_only=False)."""
    source = programs.save("relu_cos", directory)
    saved = torch_saved(((TouchOnUnpickle(marker),), {}))
    return rewrite_archive(source, directory / "pickled_inputs.pt2",
                           lambda inner, data: saved if inner == "data/sample_inputs/model.pt" else None)


class Dynamic(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x) * x.shape[0]


def dynamic_archive(directory: Path) -> Path:
    x = torch.randn(4, 3)
    ep = torch.export.export(Dynamic(), (x,), dynamic_shapes=({0: torch.export.Dim("n", min=2)},))
    torch.export.save(ep, directory / "dynamic.pt2")
    return directory / "dynamic.pt2"


def shape_expression_archive(directory: Path, marker: Path) -> Path:
    """A dynamic-shape program whose first SymInt expression also touches `marker` (sympy.sympify evals it)."""
    source = dynamic_archive(directory)
    injected = f"__import__('pathlib').Path({str(marker)!r}).touch() or Symbol("

    def rewrite(inner: str, data: bytes) -> bytes | None:
        if inner != "models/model.json":
            return None
        document = json.loads(data)
        _inject_first_expression(document, injected)
        return json.dumps(document).encode()

    return rewrite_archive(source, directory / "shape_expression.pt2", rewrite)


def _inject_first_expression(document: object, prefix: str) -> bool:
    if isinstance(document, dict):
        if isinstance(document.get("expr_str"), str) and document["expr_str"].startswith("Symbol("):
            document["expr_str"] = prefix + document["expr_str"].removeprefix("Symbol(")
            return True
        return any(_inject_first_expression(value, prefix) for value in document.values())
    if isinstance(document, list):
        return any(_inject_first_expression(value, prefix) for value in document)
    return False


def load_in_child(archives: list[Path], python_path: Path | None = None) -> None:
    """Plain `torch.export.load` of each archive in a fresh Python (errors after unpickling are
    ignored), with `python_path` first on its module path when given."""
    script = ("import sys, torch\n"
              "for path in sys.argv[1:]:\n"
              "    try:\n"
              "        torch.export.load(path)\n"
              "    except Exception:\n"
              "        pass\n")
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join(
        str(path) for path in (python_path, os.environ.get("PYTHONPATH")) if path)}
    subprocess.run([sys.executable, "-c", script, *map(str, archives)], check=True, capture_output=True,
                   timeout=120, env=environment)


def structure_import_archive(directory: Path, module: str) -> Path:
    """A program whose input dict's first key is an enum of `module`: torch's pytree reader imports
    `module` to rebuild the key (`torch.utils._pytree.enum_object_hook`)."""
    source = programs.save("linear_relu_sigmoid_dict", directory)
    key = {"__enum__": True, "fqn": f"{module}:Key", "name": "A"}

    def first_dict(spec: dict) -> dict | None:
        if spec.get("type") == "builtins.dict":
            return spec
        return next(filter(None, map(first_dict, spec.get("children_spec", []))), None)

    def rewrite(inner: str, data: bytes) -> bytes | None:
        if not inner.startswith("models/") or not inner.endswith(".json"):
            return None
        document = json.loads(data)
        signature = document["graph_module"]["module_call_graph"][0]["signature"]
        version, spec = json.loads(signature["in_spec"])
        node = first_dict(spec)
        node["context"] = json.dumps([key, *json.loads(node["context"])[1:]])
        signature["in_spec"] = json.dumps([version, spec])
        return json.dumps(document).encode()

    return rewrite_archive(source, directory / "structure_import.pt2", rewrite)
