"""A program dynamo refuses before any graph reaches a compiler (issue 38: pytorch#156724, #158566)
gets a note that names the refusal in dynamo's own words: the first `Explanation:` and `Hint:` of
its graph-break message, so that a refusal a setting lifts says which setting. The family: a
`torch.cond` whose branches dynamo cannot capture whole (`nonzero` and `masked_select`, whose sizes
the values decide: `capture_dynamic_output_shape_ops`; `.item()`: `capture_scalar_outputs`; a
`print`: no setting). Dynamo alone (backend "eager"): nothing is compiled. A compiler's own error,
which dynamo raises wrapped in its `BackendCompilerFailed` (pytorch#172956: AOT autograd's
partitioner), is no refusal: a graph reached the compiler.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from minify_client.capture.diagnose import refused_before_compile

Branch = Callable[[torch.Tensor], torch.Tensor]


def in_cond(positive: Branch, negative: Branch) -> Branch:
    def program(x: torch.Tensor) -> torch.Tensor:
        return torch.cond(x.sum() > 0, positive, negative, (x,))

    return program


def noisy(x: torch.Tensor) -> torch.Tensor:
    print("positive")
    return x + 1


REFUSED: list[tuple[str, Branch, str, str]] = [
    ("nonzero", in_cond(lambda x: torch.nonzero(x).sum().reshape(1).float(),
                        lambda x: torch.nonzero(-x).sum().reshape(1).float()),
     "`aten.nonzero.default`'s output shape depends on input Tensor data", "capture_dynamic_output_shape_ops = True"),
    ("masked_select", in_cond(lambda x: torch.masked_select(x, x > 0).sum().reshape(1),
                              lambda x: torch.masked_select(x, x < 0).sum().reshape(1)),
     "`aten.masked_select.default`'s output shape depends on input Tensor data",
     "capture_dynamic_output_shape_ops = True"),
    ("item", in_cond(lambda x: x * x.sum().item(), lambda x: x - x.max().item()),
     "Tensor.item()", "capture_scalar_outputs = True"),
    ("print", in_cond(noisy, lambda x: x - 1), "builtin operator `print`", "Avoid calling builtin `print`"),
]


def refusal(program: Branch) -> BaseException:
    torch._dynamo.reset()
    try:
        torch.compile(program, backend="eager")(torch.randn(4, 3))
    except Exception as error:  # dynamo's refusal is the subject
        return error
    finally:
        torch._dynamo.reset()
    raise AssertionError("dynamo compiled the program")


@pytest.mark.parametrize(("name", "program", "explained", "hint"), REFUSED, ids=[case[0] for case in REFUSED])
def test_a_refusal_is_said_with_dynamos_explanation_and_hint(name: str, program: Branch, explained: str,
                                                            hint: str) -> None:
    error = refusal(program)
    note = refused_before_compile(error)

    assert note is not None and note.startswith(f"minify: dynamo refused the program before any graph reached a "
                                                f"compiler ({type(error).__name__}: ")
    assert explained in note, note
    assert "; hint: " in note and hint in note, note


def test_the_setting_a_hint_names_lifts_that_refusal() -> None:
    torch._dynamo.reset()
    with torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True):
        torch.compile(REFUSED[0][1], backend="eager")(torch.randn(4, 3))
    torch._dynamo.reset()


def test_a_dynamo_error_without_explanation_is_named_by_its_type_alone() -> None:
    from torch._dynamo.exc import Unsupported

    note = refused_before_compile(Unsupported("no words of dynamo's own"))

    assert note is not None and "(Unsupported), so there is no graph" in note


def failing_compiler(gm: torch.fx.GraphModule, example_inputs: list[torch.Tensor]) -> None:
    raise AssertionError("Node add was invalid, but is output")


def test_a_compilers_own_error_wrapped_by_dynamo_is_no_refusal() -> None:
    torch._dynamo.reset()
    try:
        torch.compile(lambda x: x + 1, backend=failing_compiler)(torch.ones(2))
    except Exception as error:  # dynamo's BackendCompilerFailed, the subject
        assert type(error).__name__ == "BackendCompilerFailed"
        assert refused_before_compile(error) is None
    else:
        raise AssertionError("the compiler did not fail")
    finally:
        torch._dynamo.reset()
