"""minify_contract.program_json: what the server and the worker accept as program.json, without torch.

A malformed program.json is refused with where and why, before it costs a job; the format is told
from a file's name or first bytes.
"""

from __future__ import annotations

import copy
import json
import re
import subprocess
import sys
from typing import Any

import pytest

from minify_contract.models import detect_program_format
from minify_contract.program_json import FORMAT, MAX_SUBGRAPH_DEPTH, ProgramJsonError, check_document, read_document

pytestmark = pytest.mark.fast


def node(name: str, op: str, target: Any = None, args: list[Any] | None = None, **extra: Any) -> dict[str, Any]:
    entry = {"name": name, "op": op, "args": args or [], "kwargs": {}, **extra}
    if target is not None:
        entry["target"] = target
    return entry


def graph(*nodes: dict[str, Any]) -> dict[str, Any]:
    return {"version": 1, "nodes": list(nodes)}


def relu_of_x() -> dict[str, Any]:
    return graph(node("x", "placeholder", "x", meta={"minify_kind": "tensor"}),
                 node("relu", "call_function", "aten.relu.default", [{"node": "x"}]),
                 node("output", "output", None, [{"tuple": [{"node": "relu"}]}]))


def document(wire: dict[str, Any]) -> dict[str, Any]:
    return {"format": FORMAT, "graph": wire, "torch_version": "2.13.0+cpu", "why": "test"}


def a_loop(depth: int) -> dict[str, Any]:
    """A graph whose get_attr subgraph holds one nested `depth` deep."""
    inner = relu_of_x()
    for level in range(depth):
        inner = graph(node("x", "placeholder", "x"), node(f"body_{level}", "get_attr", f"body_{level}", subgraph=inner),
                      node("output", "output", None, [{"tuple": [{"node": "x"}]}]))
    return inner


def test_a_graph_with_a_subgraph_and_every_argument_tag_is_accepted() -> None:
    body = relu_of_x()
    wire = graph(
        node("x", "placeholder", "x"),
        node("body", "get_attr", "body", subgraph=body),
        node("loop", "call_function", "higher_order.while_loop",
             [{"node": "body"}, {"node": "body"}, {"tuple": [0, {"node": "x"}]}, {"tuple": []}]),
        node("other", "call_function", "aten.full.default",
             [{"list": [2, 2]}, {"float": 1.5}],
             kwargs={"dtype": {"dtype": "float32"}, "device": {"device": "cpu"}}),
        node("item", "call_function", "operator.getitem", [{"node": "loop"}, {"slice": [None, 1, None]}]),
        node("output", "output", None, [{"tuple": [{"node": "item"}, {"node": "other"}]}]),
    )

    check_document(document(wire))


@pytest.mark.parametrize(("mutate", "reason"), [
    (lambda doc: doc.update(format="minify-program/1"), "its format is 'minify-program/1'"),
    (lambda doc: doc["graph"].update(version=2), "wire version 2"),
    (lambda doc: doc["graph"].update(nodes=[]), "'nodes' must be a non-empty list"),
    (lambda doc: doc["graph"]["nodes"][1].update(op="call_module"), "op 'call_module' is not one of"),
    (lambda doc: doc["graph"]["nodes"][1].update(target="os.system('x')"), "is not an operator name"),
    (lambda doc: doc["graph"]["nodes"][1].update(target="builtins.eval.__code__.co_code"), "is not an operator name"),
    (lambda doc: doc["graph"]["nodes"][1].update(target="os.system"), "names a function of Python's os module"),
    (lambda doc: doc["graph"]["nodes"][1].update(target="subprocess.run"), "Python's subprocess module"),
    (lambda doc: doc["graph"]["nodes"][1].update(target="builtins.eval"), "is not one a program may call"),
    (lambda doc: doc["graph"]["nodes"][1].update(target="torch.load"), "is not one a program may call"),
    (lambda doc: doc["graph"]["nodes"][1].update(target="operator._private"), "not a public function of operator"),
    (lambda doc: doc["graph"]["nodes"][1].update(args=[{"node": "later"}]), "refers to 'later', not a node before it"),
    (lambda doc: doc["graph"]["nodes"][1].update(args=[{"pickle": "gASV"}]), "unknown argument tag 'pickle'"),
    (lambda doc: doc["graph"]["nodes"][1].update(args=[{"a": 1, "b": 2}]), "malformed argument"),
    (lambda doc: doc["graph"]["nodes"][1].update(name="x"), "a second node of that name"),
    (lambda doc: doc["graph"]["nodes"][1].update(name="not a name"), "is not an identifier"),
    (lambda doc: doc["graph"]["nodes"][1].update(meta={"val": 1}), "'meta' must be an object of minify_* keys"),
    (lambda doc: doc["graph"]["nodes"].pop(), "needs exactly one output node, the last"),
    (lambda doc: doc["graph"]["nodes"].insert(1, node("get", "get_attr", "other", subgraph=relu_of_x())),
     "its target must be its name"),
    (lambda doc: doc.update(graph=a_loop(MAX_SUBGRAPH_DEPTH + 1)), "nested more than"),
])
def test_a_malformed_program_json_is_refused_saying_where_and_why(mutate: Any, reason: str) -> None:
    doc = document(relu_of_x())
    mutate(doc)

    with pytest.raises(ProgramJsonError, match=re.escape(reason)):
        read_document(json.dumps(doc).encode())


@pytest.mark.parametrize(("data", "reason"), [
    (b"\x80\x04\x95", "not UTF-8 text"),
    (b"{\"format\": ", "not JSON"),
    (b"[1, 2]", "the top level is a list"),
    (b"[" * 100_000 + b"]" * 100_000, "nested too deeply|not JSON"),
])
def test_what_is_not_json_or_not_an_object_is_refused(data: bytes, reason: str) -> None:
    with pytest.raises(ProgramJsonError, match=reason):
        read_document(data)


def test_a_document_is_checked_unchanged() -> None:
    doc = document(a_loop(3))
    before = copy.deepcopy(doc)

    check_document(doc)

    assert doc == before


@pytest.mark.parametrize(("name", "head", "expected"), [
    ("program.json", b'{"format": "minify-fx-program/1"', "fx_json"),
    ("capture.py.json", b"  \n{", "fx_json"),
    ("uploaded", b'{"format"', "fx_json"),
    ("program.pt2", b"PK\x03\x04", "pt2"),
])
def test_program_json_is_told_from_its_name_or_first_bytes(name: str, head: bytes, expected: str) -> None:
    assert detect_program_format(name, head) == expected


def test_checking_a_program_json_imports_no_torch() -> None:
    script = ("import sys, minify_contract.program_json, minify_contract.models; "
              "print('torch' in sys.modules)")
    ran = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert ran.stdout.strip() == "False"
