"""Programs as users export them: a generated family of export shapes, each prepared by the loader.

A `Shape` says how a module's forward is declared and called: its tensor arguments' names
(builtins such as `input`, `list`, `sum`, which the flat copy renames, and names that clash once
renamed: `input` and `input_1`), how they are passed (positionally, by keyword, keyword-only), a
constant input of each kind (int, float, bool, None, str, or one left to its default), a container
around the last argument (tuple, list, dict, nested dict), the output's structure (a tensor, tuple,
list, dict, nested dict, or a dataclass registered with pytree under a name the loading process does
not know, as transformers' ModelOutputs are to a worker) and what it mutates in place (a buffer, an
input). `SHAPES` takes every pair of names and passing, and deals the other axes out in cycles of
different lengths, so every value of every axis appears, in varied company.

Each shape is exported, saved and prepared in this process (`loader.prepare`): the placeholders get
the values the module was called with, every op counts, and the eager run records what the module
computes. A few go through the offline engine with a cheap test backend that fails on relu, and end
at the relu with a repro.py that reproduces.
"""

from __future__ import annotations

import dataclasses
import itertools
import runpy
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils._pytree import tree_leaves

from minify_contract.models import JobSpec, JobState
from minify_contract.signatures import signature_line
from minify_worker.engine import minify
from minify_worker.programs.fx.graph import META_ROLE, META_VALUE, graph_from_wire, output_node, placeholders
from minify_worker.programs.fx.prepare import prepare
from minify_worker.programs.prepared import PreparedProgram, ProgramError
from tests.support.archives import rewrite_archive
from tests.support.backends import PREFIX

NAMES = (("x",), ("input",), ("list", "type"), ("input", "input_1"), ("id", "x", "x_1"), ("sum", "min"))
PASSING = ("positional", "keyword", "keyword_only")
CONSTANTS = (None, "int", "float", "bool", "none", "str", "defaulted")
CONTAINERS_IN = ("plain", "tuple", "list", "dict", "nested_dict")
OUTPUTS = ("tensor", "tuple", "list", "dict", "nested_dict", "dataclass")
MUTATIONS = ("none", "buffer", "input")

# A constant input of each kind: its argument's name and the value it is called with.
CONSTANT_ARGUMENTS: dict[str, tuple[str, Any]] = {
    "int": ("n", 4), "float": ("scale", 3.0), "bool": ("flag", False), "none": ("none", None),
    "str": ("mode", "fast"), "defaulted": ("alpha", 0.5),
}
# The name the archive gives the output dataclass instead of its own: one no process has registered.
UNKNOWN_TYPE_NAME = "elsewhere.modeling_outputs.PairOutput"
SIGNATURE = "RuntimeError: injected failure on relu"


@dataclasses.dataclass
class PairOutput:
    y: torch.Tensor
    z: torch.Tensor


torch.export.register_dataclass(PairOutput, serialized_type_name=f"{__name__}.PairOutput")


@dataclasses.dataclass(frozen=True)
class Shape:
    names: tuple[str, ...]
    passing: str
    constant: str | None = None
    container_in: str = "plain"
    output: str = "tensor"
    mutation: str = "none"

    @property
    def id(self) -> str:
        return "-".join([".".join(self.names), self.passing, self.constant or "no_constant", self.container_in,
                         self.output, self.mutation])


def _shapes() -> list[Shape]:
    cycles = [itertools.cycle(axis) for axis in (CONSTANTS, CONTAINERS_IN, OUTPUTS, MUTATIONS)]
    return [Shape(names, passing, *(next(cycle) for cycle in cycles))
            for names, passing in itertools.product(NAMES, PASSING)]


SHAPES = _shapes()


def _run(module: ShapedModule, arguments: list[Any], constant: Any) -> Any:
    """What every generated forward does with its arguments (and its constant, baked in by export)."""
    tensors = [leaf for leaf in tree_leaves(arguments) if isinstance(leaf, torch.Tensor)]
    h = tensors[0]
    for tensor in tensors[1:]:
        h = h + tensor
    if isinstance(constant, bool):
        h = h + 1 if constant else h - 1
    elif isinstance(constant, int | float):
        h = h * constant
    elif isinstance(constant, str):
        h = h + len(constant)
    if module.shape.mutation == "buffer":
        module.steps.add_(1)
        h = h + module.steps
    elif module.shape.mutation == "input":
        tensors[0].mul_(2)
    y, z = torch.relu(h), h.cos()
    return {
        "tensor": lambda: y - z,
        "tuple": lambda: (y, z),
        "list": lambda: [y, z],
        "dict": lambda: {"y": y, "z": z},
        "nested_dict": lambda: {"outer": {"y": y}, "z": [z]},
        "dataclass": lambda: PairOutput(y, z),
    }[module.shape.output]()


class ShapedModule(torch.nn.Module):
    def __init__(self, shape: Shape) -> None:
        super().__init__()
        self.shape = shape
        self.register_buffer("steps", torch.zeros(4))


def module_for(shape: Shape) -> ShapedModule:
    """A module whose forward is declared as `shape` says (generated source: its argument names are
    the shape's)."""
    parameters = list(shape.names)
    constant_name = None
    if shape.constant is not None:
        constant_name, value = CONSTANT_ARGUMENTS[shape.constant]
        parameters.append(f"{constant_name}={value!r}" if shape.constant == "defaulted" else constant_name)
    star = "*, " if shape.passing == "keyword_only" else ""
    source = (f"def forward(self, {star}{', '.join(parameters)}):\n"
              f"    return _run(self, [{', '.join(shape.names)}], {constant_name or 'None'})\n")
    namespace: dict[str, Any] = {"_run": _run}
    exec(source, namespace)
    return type("Shaped", (ShapedModule,), {"forward": namespace["forward"]})(shape)


def call_for(shape: Shape) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The arguments the module is called (and exported) with, keywords in the order declared; the
    same on every call."""
    generator = torch.Generator().manual_seed(0)
    values: dict[str, Any] = {name: torch.randn(4, generator=generator) for name in shape.names}
    last, other = shape.names[-1], torch.randn(4, generator=generator)
    values[last] = {
        "plain": lambda: values[last],
        "tuple": lambda: (values[last], other),
        "list": lambda: [values[last], other],
        "dict": lambda: {"a": values[last], "b": other},
        "nested_dict": lambda: {"a": {"deep": values[last]}, "b": [other]},
    }[shape.container_in]()
    if shape.constant not in (None, "defaulted"):
        name, value = CONSTANT_ARGUMENTS[shape.constant]
        values[name] = value
    if shape.passing == "positional":
        return tuple(values.values()), {}
    return (), values


def _clone(value: Any) -> Any:
    return torch.utils._pytree.tree_map(lambda leaf: leaf.clone() if isinstance(leaf, torch.Tensor) else leaf, value)


def exported(shape: Shape, directory: Path) -> Path:
    """`shape`'s module exported and saved as users do; a dataclass output under a type name this
    process does not know."""
    args, kwargs = call_for(shape)
    path = directory / "program.pt2"
    torch.export.save(torch.export.export(module_for(shape), _clone(args), _clone(kwargs)), path)
    if shape.output != "dataclass":
        return path
    own_name = f"{__name__}.PairOutput".encode()
    return rewrite_archive(path, directory / "unknown_type.pt2",
                           lambda inner, data: data.replace(own_name, UNKNOWN_TYPE_NAME.encode())
                           if inner.startswith("models/") else None)


def prepared(program: Path, workdir: Path, inputs: Path | None = None) -> tuple[PreparedProgram, Any, dict[str, Any]]:
    prepare(program, inputs, workdir)
    prepared = PreparedProgram.read(workdir)
    return prepared, graph_from_wire(prepared.wire_graph), torch.load(prepared.values_path, weights_only=True)


def call_count(program: Path) -> int:
    """How many call_function nodes a saved program's graph has."""
    return sum(node.op == "call_function" for node in torch.export.load(program).graph.nodes)


def test_the_family_covers_every_value_of_every_axis() -> None:
    for axis, field in ((NAMES, "names"), (PASSING, "passing"), (CONSTANTS, "constant"),
                        (CONTAINERS_IN, "container_in"), (OUTPUTS, "output"), (MUTATIONS, "mutation")):
        assert {getattr(shape, field) for shape in SHAPES} == set(axis), field
    assert len({shape.id for shape in SHAPES}) == len(SHAPES) == 18


def assert_inputs_hold(graph: Any, values: dict[str, Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """The user-input placeholders hold the call's tensors, in order; constant inputs have none."""
    inputs = [node for node in placeholders(graph) if node.meta[META_ROLE] == "input"]
    given = [leaf for leaf in tree_leaves((args, kwargs)) if isinstance(leaf, torch.Tensor)]
    assert len(inputs) == len(given)
    for node, tensor in zip(inputs, given, strict=True):
        assert torch.equal(values[node.meta[META_VALUE]], tensor), node.name


@pytest.mark.parametrize("shape", SHAPES, ids=lambda shape: shape.id)
def test_the_loader_prepares_every_export_shape(shape: Shape, tmp_path: Path) -> None:
    args, kwargs = call_for(shape)
    program = exported(shape, tmp_path)
    prepared_program, graph, values = prepared(program, tmp_path / "work")

    assert prepared_program.nodes_original == call_count(program)
    assert_inputs_hold(graph, values, args, kwargs)
    eager = [leaf for leaf in tree_leaves(module_for(shape)(*_clone(args), **_clone(kwargs)))]
    recorded = [values[node.meta[META_VALUE]] for node in output_node(graph).args[0][-len(eager):]]
    assert all(torch.allclose(got, want) for got, want in zip(recorded, eager, strict=True))


@pytest.mark.parametrize("shape", SHAPES, ids=lambda shape: shape.id)
def test_every_export_shape_takes_its_call_as_an_inputs_file(shape: Shape, tmp_path: Path) -> None:
    args, kwargs = call_for(shape)
    torch.save((args, kwargs), tmp_path / "inputs.pt")
    _, graph, values = prepared(exported(shape, tmp_path), tmp_path / "work", tmp_path / "inputs.pt")
    assert_inputs_hold(graph, values, args, kwargs)


def test_a_builtin_argument_name_keeps_its_value_under_the_name_the_flat_copy_gives_it(tmp_path: Path) -> None:
    shape = Shape(("input", "input_1"), "positional")
    args, _ = call_for(shape)
    _, graph, values = prepared(exported(shape, tmp_path), tmp_path / "work")
    renamed = [node.name for node in placeholders(graph) if node.meta[META_ROLE] == "input"]
    assert renamed == ["input_1", "input_2"]  # `input` shadows a builtin; then `input_1` is taken
    assert torch.equal(values["input_1"], args[0]) and torch.equal(values["input_2"], args[1])


def test_an_output_type_the_worker_does_not_know_loads_with_a_stand_in(tmp_path: Path) -> None:
    prepared_program, _, _ = prepared(exported(Shape(("x",), "positional", output="dataclass"), tmp_path),
                                      tmp_path / "work")
    assert prepared_program.metadata["out_spec"].startswith("TreeSpec(PairOutput, ")


def test_inputs_given_with_the_programs_constants_fit(tmp_path: Path) -> None:
    shape = Shape(("x",), "keyword_only", constant="float")
    program = exported(shape, tmp_path)
    x = torch.randn(4)
    torch.save(((), {"x": x, "scale": 3.0}), tmp_path / "inputs.pt")
    metadata = prepare(program, tmp_path / "inputs.pt", tmp_path / "work")
    assert metadata["user_inputs"] == ["x", "scale"]
    assert torch.equal(torch.load(tmp_path / "work" / "values.pt", weights_only=True)["x"], x)


def test_inputs_that_change_a_constant_the_program_was_exported_with_are_refused(tmp_path: Path) -> None:
    program = exported(Shape(("x",), "keyword_only", constant="int"), tmp_path)
    torch.save(((), {"x": torch.randn(4), "n": 5}), tmp_path / "inputs.pt")
    with pytest.raises(ProgramError, match=r"input 1 \('n'\) was exported as the constant 4, .*got 5"):
        prepare(program, tmp_path / "inputs.pt", tmp_path / "work")


# --- through the engine: minimized to the relu, repro.py reproduces ---------------------------------


ENGINE_SHAPES = [
    Shape(("input",), "positional"),  # nn.Sequential's argument
    Shape(("input", "input_1"), "keyword_only", constant="none", container_in="nested_dict", output="dataclass",
          mutation="buffer"),
    Shape(("sum", "min"), "keyword", constant="str", container_in="dict", output="nested_dict", mutation="input"),
]


def repro_signature(out: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """The signature of what repro.py raises, run in this process (`python repro.py` would import
    torch again: seconds), by the rules its `repro failed with: ...` line uses. A repro with small
    inputs is a straight script that raises as it runs; a larger one defines main() and calls it
    only as __main__."""
    monkeypatch.setattr(sys, "argv", [str(out / "repro.py")])
    with pytest.raises(Exception) as raised:
        repro = runpy.run_path(str(out / "repro.py"))
        repro["main"]()
    return signature_line(raised.value)


@pytest.mark.parametrize("shape", ENGINE_SHAPES, ids=lambda shape: shape.id)
def test_an_export_shape_is_minimized_to_the_relu_and_its_repro_reproduces(
        shape: Shape, tmp_path: Path, test_backends_allowed: None, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = JobSpec.model_validate({"backend": f"{PREFIX}:fail_on_relu", "culprit": False,
                                   "limits": {"candidate_timeout_s": 30, "parallelism": 2}})
    result = minify(exported(shape, tmp_path), spec, tmp_path / "out")

    assert result.status is JobState.succeeded, result.report.reason
    assert [line.split("torch.ops.aten.")[1].split(".")[0] for line in (result.report.graph_code or "").splitlines()
            if "torch.ops.aten." in line] == ["relu"]
    assert result.report.signature == SIGNATURE
    assert repro_signature(tmp_path / "out", monkeypatch) == SIGNATURE
