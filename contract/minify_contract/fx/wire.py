"""The wire form: a graph as JSON-safe data (no pickle), how it travels to sandbox children and
back, and the graph of a program.json (`minify_contract.program_json`); `graph_from_wire` resolves
targets and values from allowlists only.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.fx as fx

from minify_contract.fx.form import META_KEYS, META_SUBGRAPH, GraphFormatError, dtype_name, subgraph_of
from minify_contract.fx.targets import resolve_target, target_name
from minify_contract.program_json import WIRE_VERSION

__all__ = ["WIRE_VERSION", "graph_from_wire", "graph_to_wire"]


def graph_to_wire(graph: fx.Graph) -> dict[str, Any]:
    """JSON-safe description of `graph`, readable back by `graph_from_wire`."""
    nodes = []
    for node in graph.nodes:
        entry: dict[str, Any] = {"name": node.name, "op": node.op}
        if node.op == "call_function":
            entry["target"] = target_name(node.target)
        elif node.op == "placeholder":
            entry["target"] = node.target
        elif node.op == "get_attr":
            entry["target"] = node.target
            entry["subgraph"] = graph_to_wire(subgraph_of(node))
        elif node.op != "output":
            raise GraphFormatError(f"node {node.name!r}: unsupported op {node.op!r}")
        entry["args"] = [_encode(arg) for arg in node.args]
        entry["kwargs"] = {key: _encode(value) for key, value in node.kwargs.items()}
        meta = {key: node.meta[key] for key in META_KEYS if key in node.meta}
        if meta:
            entry["meta"] = meta
        nodes.append(entry)
    return {"version": WIRE_VERSION, "nodes": nodes}


def graph_from_wire(data: dict[str, Any]) -> fx.Graph:
    """Rebuild the graph `graph_to_wire` described; refuses unknown targets and values."""
    if data.get("version") != WIRE_VERSION:
        raise GraphFormatError(f"unsupported wire version {data.get('version')!r}")
    graph = fx.Graph()
    env: dict[str, fx.Node] = {}
    for entry in data["nodes"]:
        op = entry["op"]
        args = tuple(_decode(arg, env) for arg in entry.get("args", []))
        kwargs = {key: _decode(value, env) for key, value in entry.get("kwargs", {}).items()}
        if op == "placeholder":
            target: Any = str(entry["target"])
        elif op == "call_function":
            target = resolve_target(entry["target"])
        elif op == "output":
            target = "output"
        elif op == "get_attr" and entry.get("target") == entry["name"] and "subgraph" in entry:
            target = entry["name"]
        else:
            raise GraphFormatError(f"unsupported op {op!r}")
        node = graph.create_node(op, target, args, kwargs, name=entry["name"])
        if node.name != entry["name"]:
            raise GraphFormatError(f"node name {entry['name']!r} is not usable in a graph")
        node.meta.update(entry.get("meta", {}))
        if op == "get_attr":
            node.meta[META_SUBGRAPH] = graph_from_wire(entry["subgraph"])
        env[node.name] = node
    graph.lint()
    return graph


def _encode(value: Any) -> Any:
    if isinstance(value, fx.Node):
        return {"node": value.name}
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return {"float": value if math.isfinite(value) else repr(value)}
    if isinstance(value, complex):
        return {"complex": [_encode(value.real), _encode(value.imag)]}
    if isinstance(value, list):
        return {"list": [_encode(item) for item in value]}
    if isinstance(value, tuple):
        return {"tuple": [_encode(item) for item in value]}
    if isinstance(value, dict):
        return {"dict": [[_encode(key), _encode(item)] for key, item in value.items()]}
    if isinstance(value, torch.dtype):
        return {"dtype": dtype_name(value)}
    if isinstance(value, torch.device):
        return {"device": str(value)}
    if isinstance(value, torch.layout):
        return {"layout": str(value).removeprefix("torch.")}
    if isinstance(value, torch.memory_format):
        return {"memory_format": str(value).removeprefix("torch.")}
    if isinstance(value, slice):
        return {"slice": [_encode(value.start), _encode(value.stop), _encode(value.step)]}
    if value is Ellipsis:
        return {"ellipsis": True}
    raise GraphFormatError(f"cannot encode argument of type {type(value).__name__}: {value!r}")


def _decode(value: Any, env: dict[str, fx.Node]) -> Any:
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if not isinstance(value, dict) or len(value) != 1:
        raise GraphFormatError(f"malformed wire value {value!r}")
    ((tag, payload),) = value.items()
    if tag == "node":
        if payload not in env:
            raise GraphFormatError(f"reference to unknown or later node {payload!r}")
        return env[payload]
    if tag == "float":
        return float(payload)
    if tag == "complex":
        return complex(_decode(payload[0], env), _decode(payload[1], env))
    if tag == "list":
        return [_decode(item, env) for item in payload]
    if tag == "tuple":
        return tuple(_decode(item, env) for item in payload)
    if tag == "dict":
        return {_decode(key, env): _decode(item, env) for key, item in payload}
    if tag == "slice":
        return slice(*(_decode(item, env) for item in payload))
    if tag == "ellipsis":
        return Ellipsis
    if tag in ("dtype", "layout", "memory_format"):
        resolved = getattr(torch, str(payload), None)
        expected = {"dtype": torch.dtype, "layout": torch.layout, "memory_format": torch.memory_format}
        if not isinstance(resolved, expected[tag]):
            raise GraphFormatError(f"unknown {tag} {payload!r}")
        return resolved
    if tag == "device":
        try:
            return torch.device(payload)
        except (RuntimeError, TypeError) as error:
            raise GraphFormatError(f"bad device {payload!r}: {error}") from None
    raise GraphFormatError(f"unknown wire tag {tag!r}")
