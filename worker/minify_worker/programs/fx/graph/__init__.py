"""The program form the engine minimizes: flat fx graphs (docs/internals.md).

A program is a flat `torch.fx.Graph`: placeholders (parameters, buffers, constants, user inputs
and promoted intermediates), `call_function` nodes, one `output` node returning a flat tuple.
Nodes carry only small JSON-safe meta (`minify_value`, `minify_kind`, `minify_tensor`, and three
additions: `minify_role` on placeholders, `minify_scalar` = "int" | "float" | "bool" on scalar
nodes, `minify_narrow` on a placeholder the shrink phase made smaller: shrink.py), never
FakeTensors, so graphs are cheap to copy and to send to sandbox children.

A higher-order op (`torch.cond`, `while_loop`, `map`, flex attention, ...) is one call_function
node; each subgraph it calls is a `get_attr` node (target = its own name) whose
`meta["minify_subgraph"]` holds the subgraph as a graph of the same form, recursively. Subgraphs
are shared between copies, never mutated: an operation on one builds a new one.

Every operation here is pure: it copies its argument and returns a new graph.

By concept: `form` (queries, copying, a runnable GraphModule), `hashing` (the structural and the
bug-shape hash), `surgery` (the pure candidate-making operations), `higher_order` (inlining and
editing subgraphs). The form's vocabulary (the meta keys), `ingest` (from an ExportedProgram),
`targets` (naming and resolving call targets) and `wire` (the JSON-safe form sandbox children
exchange, and program.json) are the capture's too: they live in `minify_contract.fx`. Everything
public is re-exported here: `from minify_worker.programs.fx.graph import X` and `graph.X`.
"""

from minify_contract.fx.form import (
    META_KIND,
    META_NARROW,
    META_ROLE,
    META_SCALAR,
    META_SUBGRAPH,
    META_TAKEN,
    META_TENSOR,
    META_VALUE,
    PROMOTABLE_KINDS,
    GraphFormatError,
    dtype_name,
    subgraph_of,
)
from minify_contract.fx.ingest import dynamic_dims, flat_graph_from_exported_program, tensor_meta
from minify_contract.fx.targets import resolve_target, target_name
from minify_contract.fx.wire import WIRE_VERSION, graph_from_wire, graph_to_wire
from minify_worker.programs.fx.graph.form import (
    copy_graph,
    count_ops,
    graph_code,
    is_float_dtype_name,
    is_mutating,
    is_promotable,
    misplaced_placeholders,
    output_node,
    outputs,
    placeholders,
    size_key,
    subgraphs,
    to_graph_module,
)
from minify_worker.programs.fx.graph.hashing import graph_shape_hash, structural_hash
from minify_worker.programs.fx.graph.higher_order import (
    drop_in_subgraph,
    holds_autograd_functions,
    inlinable_subgraphs,
    inline_subgraph,
    with_subgraph,
)
from minify_worker.programs.fx.graph.surgery import (
    canonicalize,
    consolidate_inputs,
    cut_chain,
    derive,
    drop_node,
    eliminate_dead_code,
    extract,
    is_output_value,
    promote_to_inputs,
    promotion_targets,
    prune_outputs,
    remove_outputs,
    remove_unused_inputs,
    stand_in_for,
    truncate_after,
)

__all__ = [
    "META_KIND",
    "META_NARROW",
    "META_ROLE",
    "META_SCALAR",
    "META_SUBGRAPH",
    "META_TAKEN",
    "META_TENSOR",
    "META_VALUE",
    "PROMOTABLE_KINDS",
    "WIRE_VERSION",
    "GraphFormatError",
    "canonicalize",
    "consolidate_inputs",
    "copy_graph",
    "count_ops",
    "cut_chain",
    "derive",
    "drop_in_subgraph",
    "drop_node",
    "dtype_name",
    "dynamic_dims",
    "eliminate_dead_code",
    "extract",
    "flat_graph_from_exported_program",
    "graph_code",
    "graph_from_wire",
    "graph_shape_hash",
    "graph_to_wire",
    "holds_autograd_functions",
    "inlinable_subgraphs",
    "inline_subgraph",
    "is_float_dtype_name",
    "is_mutating",
    "is_output_value",
    "is_promotable",
    "misplaced_placeholders",
    "output_node",
    "outputs",
    "placeholders",
    "promote_to_inputs",
    "promotion_targets",
    "prune_outputs",
    "remove_outputs",
    "remove_unused_inputs",
    "resolve_target",
    "size_key",
    "stand_in_for",
    "structural_hash",
    "subgraph_of",
    "subgraphs",
    "target_name",
    "tensor_meta",
    "to_graph_module",
    "truncate_after",
    "with_subgraph",
]
