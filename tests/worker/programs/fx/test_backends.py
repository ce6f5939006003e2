"""backends: which compile function a spec's backend names (custom ones only where
MINIFY_ALLOWED_BACKENDS allows their module), which backends get dynamo's form of a candidate, the
program's constants, and the dynamic dims a candidate compiles symbolically, as values. Nothing is
compiled here: candidates compiled with each backend are in test_run.py, test_dynamic_shapes.py,
test_registered_backends.py (dynamo's form) and test_capture_settings.py (shared and data-dependent dims)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from torch import fx
from torch.export import Dim

from minify_worker.programs.fx.backends import (
    ALLOWED_BACKENDS_ENV,
    BackendError,
    DynamicShapes,
    constant_positions,
    dynamic_shapes_of,
    dynamo_range,
    export_dynamic_shapes,
    load_custom_backend,
    registered_backend,
    size_range,
    uses_torch_functions,
)
from minify_worker.programs.fx.graph import META_ROLE

BATCH = {"name": "s0", "min": 2, "max": 64}


@pytest.fixture
def backend_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A module of the test's own on sys.path, `minify_test_backends`, with one backend, `relu_fails`."""
    (tmp_path / "minify_test_backends.py").write_text(
        "def relu_fails(gm, inputs):\n    return gm\n\nNOT_A_BACKEND = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    sys.modules.pop("minify_test_backends", None)


def graph_of(*placeholders: dict[str, object]) -> fx.Graph:
    """A graph with one placeholder per `meta` given, returned as it is."""
    graph = fx.Graph()
    nodes = []
    for position, meta in enumerate(placeholders):
        node = graph.placeholder(f"x{position}")
        node.meta.update(meta)
        nodes.append(node)
    graph.output(tuple(nodes))
    return graph


@pytest.mark.fast
def test_a_custom_backend_whose_module_is_allowed_is_its_callable(backend_dir: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ALLOWED_BACKENDS_ENV, "minify_test_")

    backend = load_custom_backend("minify_test_backends:relu_fails")

    assert backend.__name__ == "relu_fails" and backend.__module__ == "minify_test_backends"


@pytest.mark.fast
def test_a_custom_backend_whose_module_is_not_allowed_is_refused_before_it_is_imported(
        backend_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ALLOWED_BACKENDS_ENV, "mycompany.")

    with pytest.raises(BackendError, match=f"not allowed: .* {ALLOWED_BACKENDS_ENV} \\(now mycompany.\\)"):
        load_custom_backend("minify_test_backends:relu_fails")
    assert "minify_test_backends" not in sys.modules


@pytest.mark.fast
def test_a_custom_backend_that_is_missing_or_not_callable_says_so(backend_dir: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ALLOWED_BACKENDS_ENV, "minify_test_")

    with pytest.raises(BackendError, match="cannot import minify_test_nowhere"):
        load_custom_backend("minify_test_nowhere:compile")
    with pytest.raises(BackendError, match="has no callable 'NOT_A_BACKEND'"):
        load_custom_backend("minify_test_backends:NOT_A_BACKEND")
    with pytest.raises(BackendError, match="has no callable 'absent'"):
        load_custom_backend("minify_test_backends:absent")


def test_a_backend_name_the_worker_has_not_registered_is_refused_naming_those_it_has() -> None:
    with pytest.raises(BackendError, match=r"'no_such_backend' is not registered on this worker; it has: .*eager"):
        registered_backend("no_such_backend")


@pytest.mark.fast
def test_only_backends_registered_on_the_worker_get_candidates_in_dynamos_form() -> None:
    assert uses_torch_functions("tensorrt") and uses_torch_functions("openxla")
    assert not any(uses_torch_functions(name) for name in ("inductor", "aot_inductor", "aot_eager", "eager"))
    assert not uses_torch_functions("mycompany.backends:compile")


@pytest.mark.fast
def test_the_constants_are_the_placeholders_whose_role_is_constant() -> None:
    graph = graph_of({META_ROLE: "input"}, {META_ROLE: "constant"}, {META_ROLE: "parameter"}, {META_ROLE: "constant"})

    assert constant_positions(graph) == [1, 3]


@pytest.mark.fast
def test_a_dynamic_dims_size_range_is_its_symbols_scaled_and_offset() -> None:
    assert size_range(BATCH) == (2, 64)
    assert size_range({"name": "s0", "min": 2, "max": 64, "scale": 2, "offset": 1}) == (5, 129)
    assert size_range({"name": "s0", "min": 2}) == (2, None)


@pytest.mark.fast
def test_dynamo_is_given_both_ends_of_a_range_or_neither() -> None:
    assert dynamo_range(2, 64) == (2, 64) and dynamo_range(None, None) == (None, None)
    assert dynamo_range(2, None) == (2, sys.maxsize - 1)
    assert dynamo_range(None, 64) == (0, 64)


@pytest.mark.fast
def test_the_dynamic_dims_are_those_the_placeholders_record_unless_the_spec_says_static() -> None:
    tensor = {"shape": [8, 3], "dtype": "torch.float32"}
    graph = graph_of({"minify_tensor": {**tensor, "dynamic": {"0": BATCH}}}, {"minify_tensor": tensor})

    assert dynamic_shapes_of(graph, "as_exported") == DynamicShapes("as_exported", ({0: BATCH}, {}))
    assert dynamic_shapes_of(graph, "auto") == DynamicShapes("auto", ({0: BATCH}, {}))
    assert dynamic_shapes_of(graph, "static") is None  # compiled without dynamo
    assert dynamic_shapes_of(graph_of({"minify_tensor": tensor}), "as_exported") is None


@pytest.mark.fast
def test_export_gets_one_dim_per_symbol_shared_by_its_dims_and_derived_where_scaled() -> None:
    shapes = DynamicShapes("as_exported", ({0: BATCH}, {}, {0: BATCH, 1: {**BATCH, "scale": 2, "offset": 1}}))

    first, nothing, third = export_dynamic_shapes(shapes)  # type: ignore[misc]

    assert nothing is None and first[0] is third[0]
    assert (first[0].__name__, first[0].min, first[0].max) == ("s0", 2, 64)
    assert str(third[1]) != str(third[0])  # 2 * s0 + 1, derived from the same root
    assert export_dynamic_shapes(None) is None


@pytest.mark.fast
def test_export_of_an_auto_dim_lets_torch_choose() -> None:
    assert export_dynamic_shapes(DynamicShapes("auto", ({0: BATCH}, {}))) == [{0: Dim.AUTO}, None]


@pytest.mark.fast
def test_a_graph_without_dynamic_dims_nor_data_dependent_ops_compiles_without_dynamo() -> None:
    graph = fx.Graph()
    x = graph.placeholder("x")
    x.meta["minify_tensor"] = {"shape": [4], "dtype": "torch.float32"}
    graph.output(graph.call_function(torch.ops.aten.relu.default, (x,)))

    assert dynamic_shapes_of(graph, "as_exported") is None
