"""Graphs that hold higher-order ops (`cond`, `while_loop`, `scan`, `map`, `invoke_subgraph`,
`tag_activation_checkpoint`, `flex_attention` ...): exported with their subgraphs, or refused at
capture time with the reason where torch.export cannot export them.

A higher-order op carries its subgraphs with it through `torch.export`, `torch.export.save` and
`torch.export.load`, and the worker minimizes inside them. Two things stand in the way on torch 2.13:

- `torch.utils.checkpoint` under `torch.compile` becomes `tag_activation_checkpoint`, whose export
  reads the body's `_checkpoint_context_fn` meta, set by dynamo only when the user gave a
  `context_fn`: a plain checkpoint fails export with `KeyError: '_checkpoint_context_fn'`.
  `for_export` gives the exported copy torch's own default (recompute everything), which is what
  the op does without one, so the program and its outcome are the same.
- Some ops export but do not save, or save but do not load (`flex_attention`: its block-mask tuple
  mixes ints, None and tensors, which torch's serializer cannot write; a `while_loop` carrying a
  Python int). `program_file` saves a program holding higher-order ops and loads it back at capture
  time; where either fails, the program is written as minify's program.json instead.
"""

from __future__ import annotations

import copy
import functools
import logging
from typing import Any

logger = logging.getLogger(__name__)

_CONTEXT_FN = "_checkpoint_context_fn"


class CaptureRefused(ValueError):
    """The failing graph cannot become a program the worker loads; the message says why."""


def higher_order_ops(graph: Any) -> list[str]:
    """The names of the higher-order ops `graph` (an fx.Graph of a GraphModule) calls, its
    subgraphs' included, each once."""
    import torch

    found: dict[str, None] = {}
    owner = getattr(graph, "owning_module", None)
    for node in graph.nodes:
        if node.op == "call_function" and isinstance(node.target, torch._ops.HigherOrderOperator):
            found[node.target.name()] = None
        elif node.op == "get_attr" and owner is not None:
            subgraph = getattr(owner, str(node.target), None)
            if isinstance(subgraph, torch.fx.GraphModule):
                found.update(dict.fromkeys(higher_order_ops(subgraph.graph)))
    return list(found)


def for_export(module: Any) -> Any:
    """`module` (a GraphModule) with each `tag_activation_checkpoint` body that has no
    `_checkpoint_context_fn` replaced by a copy that has torch's default one; the user's own
    modules are not changed."""
    import torch

    for node in module.graph.nodes:
        if node.op != "call_function" or node.target is not torch.ops.higher_order.tag_activation_checkpoint:
            continue
        body_node = node.args[0]
        body = getattr(module, str(body_node.target), None)
        if isinstance(body, torch.fx.GraphModule) and _CONTEXT_FN not in body.meta:
            own = copy.copy(body)
            own.meta = {**body.meta, _CONTEXT_FN: _recompute_all()}
            setattr(module, str(body_node.target), own)
    return module


def _recompute_all() -> Any:
    """torch's context for a checkpoint without a `context_fn` (`tag_activation_checkpoint_impl`)."""
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

    return functools.partial(create_selective_checkpoint_contexts, _prefer_recompute(CheckpointPolicy))


def _prefer_recompute(policy: Any) -> Any:
    def prefer_recompute(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> Any:
        return policy.PREFER_RECOMPUTE

    return prefer_recompute


# What a user can do where torch.export is the gap (it cannot export the graph at all).
_NEXT = ("Next: TORCH_LOGS=graph_code prints the graph dynamo handed the compiler, to shrink by hand; torch.export's "
         "gap is PyTorch's to fix (module: export)")


def export_refused(error: BaseException, ops: list[str], transforms: list[str]) -> CaptureRefused:
    """What to say when `torch.export` itself failed on a graph holding higher-order ops or
    transform calls."""
    import torch

    held = [f"the higher-order op{'s' if len(ops) > 1 else ''} {', '.join(ops)}"] if ops else []
    held += [f"torch.func transform calls ({', '.join(transforms[:4])})"] if transforms else []
    return CaptureRefused(f"torch.export cannot export a graph holding {' and '.join(held)} on torch "
                          f"{torch.__version__} ({root_cause(error)}): the failing graph is not captured. {_NEXT}")


def root_cause(error: BaseException) -> str:
    """The innermost cause of `error` (`raise ... from`), `Type: first line`, clipped: torch's
    serializer wraps its cause in messages that repeat the whole node. Not the context: a capture
    runs while the user's own error is being handled."""
    seen = {id(error)}
    while error.__cause__ is not None and id(error.__cause__) not in seen:
        error = error.__cause__
        seen.add(id(error))
    lines = str(error).strip().splitlines()
    text = f"{type(error).__name__}: {lines[0]}" if lines else type(error).__name__
    return text if len(text) <= 300 else text[:299] + "…"
