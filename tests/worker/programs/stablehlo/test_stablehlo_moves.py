"""StableHLO candidates and strategies as pure functions: no jax, no compile (issue 32)."""

from __future__ import annotations

import dataclasses

import pytest

from minify_worker.engine.scheduler import Scheduler, reduce
from minify_worker.outcomes import Fails
from minify_worker.programs.candidates import StrategyContext
from minify_worker.programs.stablehlo import REPRESENTATION, moves, shrink, surgery
from minify_worker.programs.stablehlo.module import Module, Op, Value, catalog, empty, key, render, size
from tests.support.evaluators import SIGNATURE, ThreadEvaluator, still_fails

pytestmark = pytest.mark.fast

T = "tensor<4x8xf32>"
R = "tensor<4xf32>"


def _op(index: int, kind: str, operands: list[str], result_type: str | None = T, results: int = 1) -> Op:
    reads = ", ".join(f"%m.{operand}" for operand in operands)
    if result_type is None:
        return Op(index, kind, (), tuple(operands), f"{kind} {reads}")
    keys = [f"v{index}"] if results == 1 else [f"v{index}#{k}" for k in range(results)]
    return Op(index, kind, tuple(Value(k, result_type) for k in keys), tuple(operands),
              f"{kind} {reads} : {result_type}")


def program(*ops: Op, outputs: tuple[str, ...], args: int = 2, recorded: bool = True) -> Module:
    arguments = tuple(Value(f"a{i}", T) for i in range(args))
    types = catalog(arguments, ops)
    return Module("m", "", (), arguments, tuple(ops), outputs, types,
                  frozenset(k for op in ops for k in op.result_keys) if recorded else frozenset())


def chain() -> Module:
    """sine -> multiply -> reduce(max) -> exponential, beside an unrelated tanh output."""
    return program(
        _op(0, "stablehlo.sine", ["a0"]),
        _op(1, "stablehlo.multiply", ["v0", "a1"]),
        _op(2, "stablehlo.tanh", ["a1"]),
        _op(3, "stablehlo.reduce", ["v1"], R),
        _op(4, "stablehlo.exponential", ["v3"], R),
        outputs=("v4", "v2"),
    )


def test_an_outside_operand_becomes_an_argument_that_receives_its_recorded_value() -> None:
    candidate = surgery.keep_ops(chain(), [chain().ops[3]])
    assert candidate is not None
    assert [value.key for value in candidate.args] == ["v1"]
    assert candidate.outputs == ("v3",)
    assert "func.func public @main(%m.v1: tensor<4x8xf32>) -> (tensor<4xf32>)" in render(candidate)
    assert "%m.v3 = stablehlo.reduce %m.v1 : tensor<4xf32>" in render(candidate)


def test_a_value_without_a_recorded_value_cannot_be_promoted() -> None:
    unrecorded = program(*chain().ops, outputs=("v4",), recorded=False)
    assert surgery.keep_ops(unrecorded, [unrecorded.ops[3]]) is None
    assert surgery.promote(unrecorded, {1}) is None


def test_truncation_returns_the_cut_op_and_drops_what_it_does_not_need() -> None:
    candidate = surgery.truncate(chain(), 1)
    assert candidate is not None
    assert [op.kind for op in candidate.ops] == ["stablehlo.sine", "stablehlo.multiply"]
    assert candidate.outputs == ("v1",)
    assert [value.key for value in candidate.args] == ["a0", "a1"]


def test_dead_code_and_unused_arguments_go_together() -> None:
    module = program(*chain().ops, outputs=("v4",), args=3)
    candidate = surgery.canonical(module)
    assert candidate is not None
    assert "stablehlo.tanh" not in {op.kind for op in candidate.ops}
    assert [value.key for value in candidate.args] == ["a0", "a1"]


def test_an_op_without_results_is_kept_until_dropped_on_purpose() -> None:
    module = program(_op(0, "stablehlo.sine", ["a0"]), _op(1, "stablehlo.custom_call", ["v0"], None),
                     _op(2, "stablehlo.tanh", ["a1"]), outputs=("v2",))
    assert [op.kind for op in surgery.canonical(module).ops] == [  # type: ignore[union-attr]
        "stablehlo.sine", "stablehlo.custom_call", "stablehlo.tanh"]
    dropped = surgery.promote(module, {1})
    assert dropped is not None and [op.kind for op in dropped.ops] == ["stablehlo.tanh"]


def test_one_result_of_several_becomes_an_argument_named_without_its_number() -> None:
    module = program(_op(0, "stablehlo.while", ["a0"], T, results=2), _op(1, "stablehlo.sine", ["v0#1"]),
                     outputs=("v1",))
    candidate = surgery.promote(module, {0})
    assert candidate is not None
    text = render(candidate)
    assert "@main(%m.v0_1: tensor<4x8xf32>)" in text
    assert "stablehlo.sine %m.v0_1" in text
    whole = render(module)
    assert "%m.v0:2 = stablehlo.while %m.a0" in whole and "stablehlo.sine %m.v0#1" in whole


def test_the_same_candidate_has_the_same_key_whichever_way_it_was_made() -> None:
    by_truncation = surgery.truncate(chain(), 3)
    by_promotion = surgery.promote(surgery.subset(chain(), {0, 1, 3}, ["v3"]), set())  # type: ignore[arg-type]
    assert by_truncation is not None and by_promotion is not None
    assert key(by_truncation) == key(by_promotion)


def test_the_empty_program_returns_its_arguments() -> None:
    nothing = empty(chain())
    assert nothing.ops == () and nothing.outputs == ("a0", "a1")
    assert "return %m.a0, %m.a1 : tensor<4x8xf32>, tensor<4x8xf32>" in render(nothing)


def test_every_candidate_a_strategy_proposes_is_smaller_and_new() -> None:
    module = chain()
    context = StrategyContext()
    for tier in moves.PASSES:
        for _, strategy in tier.strategies:
            keys = set()
            for candidate in strategy(module, context):
                assert size(candidate.graph) < size(module)  # type: ignore[arg-type]
                keys.add(key(candidate.graph))  # type: ignore[arg-type]
            assert key(module) not in keys


def test_an_accuracy_failure_is_looked_for_in_integer_and_boolean_outputs_but_never_in_none() -> None:
    # A boolean output is compared exactly (the accuracy module's rule), so a candidate that keeps
    # only the compare can fail and is proposed; a candidate without outputs cannot.
    module = program(_op(0, "stablehlo.sine", ["a0"]), _op(1, "stablehlo.compare", ["v0", "a1"], "tensor<4x8xi1>"),
                     outputs=("v1",))
    context = StrategyContext.for_failure("accuracy")
    proposed = [c.graph for tier in moves.PASSES for _, s in tier.strategies for c in s(module, context)]
    assert proposed and all(c.outputs for c in proposed)  # type: ignore[attr-defined]
    assert any(all(module.types.get(o, "").endswith("xi1>") for o in c.outputs)  # type: ignore[attr-defined]
               for c in proposed)


def test_reduction_ends_at_the_one_op_the_failure_needs() -> None:
    evaluator = ThreadEvaluator(lambda module: "stablehlo.reduce" in {op.kind for op in module.ops}, workers=2)
    scheduler = Scheduler(evaluator, still_fails, parallelism=2, program=REPRESENTATION)
    scheduler.remember(chain(), Fails(SIGNATURE))
    result = reduce(scheduler, chain(), StrategyContext(), REPRESENTATION.passes())
    assert [op.kind for op in result.graph.ops] == ["stablehlo.reduce"]
    assert [value.key for value in result.graph.args] == ["v1"]
    assert scheduler.stats.checks_total < 20


def test_reduction_keeps_two_ops_a_failure_needs_together() -> None:
    def needs_both(module: Module) -> bool:
        kinds = [op.kind for op in module.ops]
        return "stablehlo.multiply" in kinds and "stablehlo.reduce" in kinds and any(
            "v1" in op.operands for op in module.ops)

    evaluator = ThreadEvaluator(needs_both, workers=2)
    scheduler = Scheduler(evaluator, still_fails, parallelism=2, program=REPRESENTATION)
    result = reduce(scheduler, chain(), StrategyContext(), REPRESENTATION.passes())
    assert [op.kind for op in result.graph.ops] == ["stablehlo.multiply", "stablehlo.reduce"]


def test_the_wire_form_round_trips() -> None:
    module = chain()
    again = REPRESENTATION.from_wire(REPRESENTATION.to_wire(module))
    assert render(again) == render(module) and again.recorded == module.recorded
    assert REPRESENTATION.to_wire(module)["representation"] == "stablehlo"


def test_the_same_bug_at_other_sizes_and_places_has_the_same_shape_hash() -> None:
    here = surgery.keep_ops(chain(), [chain().ops[3]])
    elsewhere = program(_op(7, "stablehlo.sine", ["a0"]), _op(9, "stablehlo.reduce", ["v7"], R), outputs=("v9",))
    elsewhere = surgery.keep_ops(elsewhere, [elsewhere.ops[1]])
    assert here is not None and elsewhere is not None
    smaller = dataclasses.replace(elsewhere, args=(Value("v7", "tensor<2x2xf32>"),))
    assert REPRESENTATION.shape_hash(here) == REPRESENTATION.shape_hash(smaller)
    assert REPRESENTATION.shape_hash(here) != REPRESENTATION.shape_hash(chain())
    assert REPRESENTATION.input_shapes(smaller) == {"v7": {"shape": [2, 2], "dtype": "f32"}}


def test_a_reader_sees_values_named_after_the_original_without_the_engines_prefix() -> None:
    code = REPRESENTATION.code(surgery.promote(chain(), {0}))
    assert "%m." not in code
    assert "func.func public @main(%a1: tensor<4x8xf32>, %v0: tensor<4x8xf32>)" in code
    assert "%v1 = stablehlo.multiply %v0, %a1" in code


def test_halving_a_size_changes_it_everywhere_it_is_a_dimension_and_nowhere_else() -> None:
    module = program(_op(0, "stablehlo.reduce", ["a0"], "tensor<8x4xf32>"), outputs=("v0",), args=1)
    module = dataclasses.replace(module, args=(Value("a0", "tensor<4x8x4xf32>"),))
    assert shrink.sizes(module) == [8, 4]
    halved = shrink.resize(module, 4, 2)
    assert halved.args[0].type == "tensor<2x8x2xf32>"
    assert "tensor<8x2xf32>" in halved.ops[0].body and halved.types["v0"] == "tensor<8x2xf32>"
    assert shrink.elements(halved) < shrink.elements(module)
    assert [c.description for c in shrink.candidates(module)] == ["halve size 8 to 4", "halve size 4 to 2"]


def test_inputs_are_read_in_argument_order_by_number_else_in_the_files_order(tmp_path) -> None:
    import numpy as np

    from minify_worker.programs.stablehlo.arrays import read_npz

    np.savez(tmp_path / "savez.npz", *[np.full(1, i) for i in range(12)])  # arr_10 sorts before arr_2 by name
    assert [int(array[0]) for array in read_npz(tmp_path / "savez.npz")] == list(range(12))
    np.savez(tmp_path / "named.npz", arg1=np.ones(1), arg0=np.zeros(1))
    assert [float(array[0]) for array in read_npz(tmp_path / "named.npz")] == [0.0, 1.0]
    np.savez(tmp_path / "free.npz", x=np.ones(1), w=np.zeros(1))
    assert [float(array[0]) for array in read_npz(tmp_path / "free.npz")] == [1.0, 0.0]


def test_the_f64_reference_program_widens_every_narrow_float_and_its_hex_constants() -> None:
    from minify_worker.programs.stablehlo.xla import to_f64

    text = ('%c = stablehlo.constant dense<0xFF800000> : tensor<f32>\n'
            '%d = stablehlo.constant dense<"0x0000803F0000C07F"> : tensor<2xf32>\n'
            '%h = stablehlo.constant dense<0x7FC0> : tensor<bf16>\n'
            '%0 = stablehlo.convert %x : (tensor<4x8xbf16>) -> tensor<4x8xi32>\n')
    assert to_f64(text).splitlines() == [
        "%c = stablehlo.constant dense<0xFFF0000000000000> : tensor<f64>",  # -inf
        '%d = stablehlo.constant dense<"0x000000000000F03F000000000000F87F"> : tensor<2xf64>',  # [1.0, nan]
        "%h = stablehlo.constant dense<0x7FF8000000000000> : tensor<f64>",  # nan
        "%0 = stablehlo.convert %x : (tensor<4x8xf64>) -> tensor<4x8xi32>",
    ]


def test_an_fp64_reference_judges_as_torch_does() -> None:
    import numpy as np

    from minify_contract.models import JobSpec
    from minify_worker.programs.stablehlo.run import compare

    spec = JobSpec(backend="xla", failure={"kind": "accuracy"})
    wide = [np.array([1.0, 2.0, 3.0, 4.0])]
    near = [np.array([1.0, 2.0, 3.0, 4.0001], np.float32)]
    far = [np.array([1.0, 2.0, 3.0, 4.5], np.float32)]
    assert compare(far, near, spec, wide) is None
    assert compare(near, far, spec, wide) is not None


def test_outputs_match_within_the_tolerance_nans_equal_and_integers_exactly_strict_or_not() -> None:
    import numpy as np

    from minify_worker.programs.stablehlo.accuracy import differs

    reference = [np.array([1.0, np.nan, 3.0], np.float32), np.array([1, 2], np.int32)]
    assert differs(reference, [np.array([1.0, np.nan, 3.0005], np.float32), reference[1]], 1e-3, strict=False) is None
    for strict in (False, True):
        wrong = differs(reference, [reference[0], np.array([1, 3], np.int32)], 1e-3, strict=strict)
        assert wrong == "output 1: 1 of 2 elements differ exactly; 3 where the reference has 2 (element 1)"
    # One apart is within any tolerance of a float, and still wrong for an integer.
    assert differs([np.array([1000], np.int64)], [np.array([1001], np.int64)], 1e-2, strict=False) is not None
    assert differs([np.array([True])], [np.array([False])], 1e-3, strict=False) is not None
    dropped = differs(reference, [np.array([1.0, 2.0, 3.0], np.float32), reference[1]], 1e-3, strict=False)
    assert dropped == "output 0 not within tolerance 0.001: 2.0 where the reference has nan (element 1)"
