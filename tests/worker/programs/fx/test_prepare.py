"""Prepare: a user's program and inputs become a flat graph (program.json) and a value store (values.pt).

Most cases call `loader.prepare` in this process (it is what the child runs); the last ones go
through `prepare_program`, the sandboxed entry the engine uses.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from examples import programs
from minify_contract.models import JobSpec
from minify_worker.programs.fx.graph import graph_from_wire
from minify_worker.programs.fx.prepare import prepare
from minify_worker.programs.prepared import PreparedProgram, ProgramError
from minify_worker.sandbox import prepare_program
from tests.support import not_a_zip


def saved(name: str, directory: Path) -> Path:
    return programs.save(name, directory)


def values_of(workdir: Path) -> dict:
    return torch.load(workdir / "values.pt", mmap=True, weights_only=True)


def test_a_pt2_without_inputs_uses_its_example_inputs(tmp_path: Path) -> None:
    program = saved("relu_cos", tmp_path)
    example = torch.export.load(program).example_inputs[0][0]
    metadata = prepare(program, None, tmp_path / "work")
    values = values_of(tmp_path / "work")
    assert metadata["user_inputs"] == ["x"] and metadata["nodes_original"] == 2
    assert torch.equal(values["x"], example)
    assert torch.equal(values["relu"], torch.relu(example))


def test_program_json_holds_the_wire_graph_with_value_keys(tmp_path: Path) -> None:
    prepare(saved("relu_cos", tmp_path), None, tmp_path / "work")
    prepared = PreparedProgram.read(tmp_path / "work")
    graph = graph_from_wire(prepared.wire_graph)
    keys = {node.name: node.meta.get("minify_value") for node in graph.nodes if node.op != "output"}
    assert keys == {"x": "x", "relu": "relu", "cos": "cos"}


def test_dict_and_keyword_inputs_are_flattened_in_placeholder_order(tmp_path: Path) -> None:
    program = saved("linear_relu_sigmoid_dict", tmp_path)
    x, y, k = torch.randn(8, 10), torch.randn(8, 10), torch.randn(8, 10)
    torch.save((({"y": y, "x": x},), {"k": k}), tmp_path / "inputs.pt")
    metadata = prepare(program, tmp_path / "inputs.pt", tmp_path / "work")
    values = values_of(tmp_path / "work")
    assert metadata["user_inputs"] == ["inp_x", "inp_y", "k"]
    assert torch.equal(values["inp_x"], x) and torch.equal(values["inp_y"], y) and torch.equal(values["k"], k)
    assert values["p_fc1_weight"].shape == (16, 10)


def test_a_plain_tuple_of_args_is_accepted(tmp_path: Path) -> None:
    x = torch.randn(20, 20)
    torch.save((x,), tmp_path / "inputs.pt")
    prepare(saved("relu_cos", tmp_path), tmp_path / "inputs.pt", tmp_path / "work")
    assert torch.equal(values_of(tmp_path / "work")["x"], x)


def test_without_any_inputs_they_are_made_from_placeholder_metadata(tmp_path: Path) -> None:
    ep, _ = programs.relu_cos()
    ep._example_inputs = None
    torch.export.save(ep, tmp_path / "bare.pt2")
    prepare(tmp_path / "bare.pt2", None, tmp_path / "work")
    made = values_of(tmp_path / "work")["x"]
    assert made.shape == (20, 20) and made.dtype == torch.float32


def test_a_text_file_named_pt2_is_refused_with_how_to_export(tmp_path: Path) -> None:
    (tmp_path / "model.pt2").write_text("def forward(x): return x\n")
    with pytest.raises(ProgramError, match=r"not a torch.export archive.*torch.export.save"):
        prepare(tmp_path / "model.pt2", None, tmp_path / "work")


def test_a_truncated_pt2_is_refused_as_cut_short(tmp_path: Path) -> None:
    path = not_a_zip.truncated_copy(saved("relu_cos", tmp_path), tmp_path / "cut.pt2")
    with pytest.raises(ProgramError) as refused:
        prepare(path, None, tmp_path / "work")
    assert str(refused.value).startswith(f"cut.pt2 is not a torch.export archive (.pt2): {not_a_zip.TRUNCATED}")


# JSON the loader reads as the program.json it may be, whatever the file's name (the next test's own words)
@pytest.mark.parametrize(("content", "says"), [case for case in not_a_zip.CASES if not case[0].startswith(b"{")])
def test_a_file_that_is_not_a_zip_is_refused_in_the_servers_words(tmp_path: Path, content: bytes, says: str) -> None:
    """The offline command's loader says what the file is as the server's upload check does."""
    (tmp_path / "model.pt2").write_bytes(content)
    with pytest.raises(ProgramError) as refused:
        prepare(tmp_path / "model.pt2", None, tmp_path / "work")
    assert str(refused.value).startswith(f"model.pt2 is not a torch.export archive (.pt2): {says}")


def test_inputs_of_the_wrong_shape_are_named(tmp_path: Path) -> None:
    torch.save(((torch.randn(3, 3),), {}), tmp_path / "inputs.pt")
    with pytest.raises(ProgramError, match=r"input 0 \('x'\) must have shape \[20, 20\], got \[3, 3\]"):
        prepare(saved("relu_cos", tmp_path), tmp_path / "inputs.pt", tmp_path / "work")


def test_inputs_of_the_wrong_dtype_are_named(tmp_path: Path) -> None:
    torch.save((torch.zeros(20, 20, dtype=torch.int64),), tmp_path / "inputs.pt")
    with pytest.raises(ProgramError, match=r"must have dtype torch\.float32"):
        prepare(saved("relu_cos", tmp_path), tmp_path / "inputs.pt", tmp_path / "work")


def test_too_many_inputs_do_not_fit(tmp_path: Path) -> None:
    torch.save((torch.randn(20, 20), torch.randn(20, 20)), tmp_path / "inputs.pt")
    with pytest.raises(ProgramError, match="do not fit the program: it takes 1 inputs"):
        prepare(saved("relu_cos", tmp_path), tmp_path / "inputs.pt", tmp_path / "work")


def pickled_graph_module(directory: Path) -> Path:
    from torch.fx.experimental.proxy_tensor import make_fx

    gm = make_fx(lambda x: torch.cos(torch.relu(x)))(torch.randn(20, 20))
    torch.save(gm, directory / "gm.pt")
    torch.save((torch.randn(20, 20),), directory / "inputs.pt")
    return directory / "gm.pt"


def test_a_pickled_graph_module_is_refused_without_allow_pickle(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MINIFY_ALLOW_PICKLE", raising=False)
    program = pickled_graph_module(tmp_path)
    with pytest.raises(ProgramError, match=r"MINIFY_ALLOW_PICKLE=1.*torch.export.export\(model, args"):
        prepare(program, tmp_path / "inputs.pt", tmp_path / "work")


def test_a_pickled_graph_module_is_exported_with_allow_pickle(tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MINIFY_ALLOW_PICKLE", "1")
    metadata = prepare(pickled_graph_module(tmp_path), tmp_path / "inputs.pt", tmp_path / "work")
    assert metadata["source"] == "pickle" and metadata["nodes_original"] == 2


def test_prepare_program_runs_the_loader_in_a_sandbox_child(tmp_path: Path) -> None:
    prepared = prepare_program(saved("linear_relu_sigmoid", tmp_path), None, tmp_path / "work", JobSpec())
    assert prepared.nodes_original == 3 and prepared.values_path.is_file()
    assert sorted(path.name for path in (tmp_path / "work").iterdir()) == ["program.json", "values.pt"]


def test_prepare_program_reports_a_bad_file_as_program_error(tmp_path: Path) -> None:
    (tmp_path / "notes.pt2").write_text("hello")
    with pytest.raises(ProgramError, match=r"not a torch\.export archive"):
        prepare_program(tmp_path / "notes.pt2", None, tmp_path / "work", JobSpec())


def test_a_pt2_with_a_pickled_weight_is_refused_before_torch_export_load_runs_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.support.archives import pickled_weight_archive

    monkeypatch.delenv("MINIFY_ALLOW_PICKLE", raising=False)
    program = pickled_weight_archive(tmp_path, tmp_path / "ran")
    with pytest.raises(ProgramError, match=r"pickled_weight\.pt2 is refused: .*data/weights/weight_0 \(weight "
                                           r"'fc1\.weight' is marked use_pickle.*MINIFY_ALLOW_PICKLE=1"):
        prepare(program, None, tmp_path / "work")
    assert not (tmp_path / "ran").exists()


def test_a_pt2_with_a_pickled_weight_tensor_loads_where_the_operator_allows_pickles(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.support.archives import pickled_weight_archive

    monkeypatch.setenv("MINIFY_ALLOW_PICKLE", "1")
    weight = torch.nn.Parameter(torch.randn(16, 10))
    metadata = prepare(pickled_weight_archive(tmp_path, tmp_path / "ran", payload=weight), None, tmp_path / "work")
    assert metadata["source"] == "pt2" and torch.equal(values_of(tmp_path / "work")["p_fc1_weight"], weight)


def test_a_program_with_weights_and_tensor_constants_loads(tmp_path: Path) -> None:
    from tests.support.archives import constant_archive

    metadata = prepare(constant_archive(tmp_path), None, tmp_path / "work")
    assert metadata["constants"] and metadata["nodes_original"] == 2
    assert torch.equal(values_of(tmp_path / "work")[metadata["constants"][0]], torch.arange(4.0))


def test_a_program_torch_export_load_cannot_load_says_what_it_raised(tmp_path: Path) -> None:
    from tests.support.archives import rewrite_archive

    program = rewrite_archive(saved("relu_cos", tmp_path), tmp_path / "future.pt2",
                              lambda inner, data: b"9" if inner == "archive_version" else None)
    with pytest.raises(ProgramError, match=r"^torch\.export\.load could not load future\.pt2: ValueError: "
                                           r"Saved archive version 9 does not match"):
        prepare(program, None, tmp_path / "work")


def test_an_nn_sequential_export_loads_with_its_argument_input_renamed(tmp_path: Path) -> None:
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    x = torch.randn(2, 8)
    torch.export.save(torch.export.export(model, (x,)), tmp_path / "seq.pt2")
    metadata = prepare(tmp_path / "seq.pt2", None, tmp_path / "work")
    values = values_of(tmp_path / "work")
    assert metadata["user_inputs"] == ["input"] and metadata["nodes_original"] == 3
    assert torch.equal(values["input_1"], x)  # `input` shadows a builtin: the flat copy renames it


def test_an_input_the_program_mutates_in_place_is_stored_as_it_was_given(tmp_path: Path) -> None:
    class Doubles(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x.mul_(2)  # torch.export keeps the in-place op
            return x.relu()

    x = torch.ones(4)
    torch.export.save(torch.export.export(Doubles(), (x.clone(),)), tmp_path / "doubles.pt2")
    prepare(tmp_path / "doubles.pt2", None, tmp_path / "work")
    values = values_of(tmp_path / "work")
    assert torch.equal(values["x"], x) and torch.equal(values["relu"], 2 * x)


def _with_node_target(old: str, new: str) -> Callable[[str, bytes], bytes | None]:
    def rewrite(inner: str, data: bytes) -> bytes | None:
        return data.replace(old.encode(), new.encode()) if inner.startswith("models/") else None

    return rewrite


def test_a_program_calling_a_custom_op_the_worker_lacks_names_it_and_how_to_provide_it(tmp_path: Path) -> None:
    from tests.support.archives import rewrite_archive

    program = rewrite_archive(saved("relu_cos", tmp_path), tmp_path / "custom.pt2", _with_node_target(
        "torch.ops.aten.relu.default", "torch.ops.minify_unregistered.scale.default"))
    with pytest.raises(ProgramError) as refused:
        prepare(program, None, tmp_path / "work")
    message = str(refused.value)
    assert message.startswith("custom.pt2 calls custom ops that are not registered in the worker: "
                              "minify_unregistered::scale. ")
    assert "'op_modules'" in message and "MINIFY_ALLOWED_OP_MODULES=" in message
    assert "torch.export.load: SerializeError: We failed to resolve torch.ops.minify_unregistered.scale" in message


def test_a_load_torch_only_logs_the_cause_of_says_that_cause(tmp_path: Path) -> None:
    from tests.support.archives import rewrite_archive

    def unknown_namedtuple(inner: str, data: bytes) -> bytes | None:
        if not inner.startswith("models/"):
            return None
        document = json.loads(data)
        leaf = {"type": None, "context": None, "children_spec": []}
        document["graph_module"]["module_call_graph"][0]["signature"]["out_spec"] = json.dumps(
            [1, {"type": "collections.namedtuple", "context": "elsewhere.Point", "children_spec": [leaf]}])
        return json.dumps(document).encode()

    program = rewrite_archive(saved("relu_cos", tmp_path), tmp_path / "point.pt2", unknown_namedtuple)
    with pytest.raises(ProgramError, match=r"^torch\.export\.load could not load point\.pt2: NotImplementedError: "
                                           r"Can't deserialize TreeSpec of namedtuple class elsewhere\.Point .*; "
                                           r"RuntimeError: We ran into an error when deserializing"):
        prepare(program, None, tmp_path / "work")


def test_the_sandboxed_loader_refuses_a_pickled_constant(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.support.archives import pickled_constant_archive

    monkeypatch.delenv("MINIFY_ALLOW_PICKLE", raising=False)
    program = pickled_constant_archive(tmp_path, tmp_path / "ran")
    with pytest.raises(ProgramError, match=r"data/constants/tensor_0 \(constant .* is marked use_pickle"):
        prepare_program(program, None, tmp_path / "work", JobSpec())
    assert not (tmp_path / "ran").exists()


def test_the_sandboxed_loader_sees_the_operators_allow_pickle(tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.support.archives import pickled_weight_archive

    monkeypatch.setenv("MINIFY_ALLOW_PICKLE", "1")
    program = pickled_weight_archive(tmp_path, tmp_path / "ran", payload=torch.nn.Parameter(torch.randn(16, 10)))
    assert prepare_program(program, None, tmp_path / "work", JobSpec()).nodes_original == 3


def _text_file(directory: Path) -> Path:
    (directory / "model.pt2").write_text("def forward(x): return x\n")
    return directory / "model.pt2"


def _truncated_archive(directory: Path) -> Path:
    (directory / "cut.pt2").write_bytes(saved("relu_cos", directory).read_bytes()[:3000])
    return directory / "cut.pt2"


def _zip_of_something_else(directory: Path) -> Path:
    import zipfile

    with zipfile.ZipFile(directory / "other.pt2", "w") as archive:
        archive.writestr("readme.txt", b"hello")
    return directory / "other.pt2"


def _pickled_weight(directory: Path) -> Path:
    from tests.support.archives import pickled_weight_archive

    return pickled_weight_archive(directory, directory / "ran")


# Each upload the file alone shows is bad: the engine refuses it before any sandbox starts, with
# the words the loader's child would say (`refusal` and `prepare` share the checks).
REFUSED: dict[str, tuple[Callable[[Path], Path], str]] = {
    "a text file": (_text_file, r"model\.pt2 is not a torch\.export archive .*torch\.export\.save"),
    "a truncated archive": (_truncated_archive, r"cut\.pt2 is not a torch\.export archive"),
    "a zip of something else": (_zip_of_something_else, r"other\.pt2 is a zip file but not a torch\.export archive"),
    "a pickled module": (pickled_graph_module, r"gm\.pt is a pickle .*MINIFY_ALLOW_PICKLE=1"),
    "a pickled weight": (_pickled_weight, r"pickled_weight\.pt2 is refused: .*use_pickle.*MINIFY_ALLOW_PICKLE=1"),
    "no file": (lambda directory: directory / "missing.pt2", r"program file missing\.pt2 does not exist"),
}


@pytest.mark.parametrize("kind", list(REFUSED))
def test_an_upload_the_file_alone_shows_is_bad_is_refused_with_the_loaders_words(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str) -> None:
    from minify_worker.programs.fx.prepare import refusal

    monkeypatch.delenv("MINIFY_ALLOW_PICKLE", raising=False)
    make, words = REFUSED[kind]
    program = make(tmp_path)

    said = refusal(program)

    assert said is not None and re.search(words, said), said
    with pytest.raises(ProgramError) as raised:
        prepare(program, None, tmp_path / "work")
    assert str(raised.value) == said
    assert not (tmp_path / "ran").exists()


def test_a_good_archive_a_program_json_and_an_allowed_pickle_are_left_to_the_loader(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from minify_worker.programs.fx.prepare import refusal

    monkeypatch.delenv("MINIFY_ALLOW_PICKLE", raising=False)
    archive = saved("relu_cos", tmp_path)
    prepare(archive, None, tmp_path / "work")
    program_json = tmp_path / "program.json"
    program_json.write_text((tmp_path / "work" / "program.json").read_text())
    assert refusal(archive) is None and refusal(program_json) is None
    monkeypatch.setenv("MINIFY_ALLOW_PICKLE", "1")
    assert refusal(pickled_graph_module(tmp_path)) is None
