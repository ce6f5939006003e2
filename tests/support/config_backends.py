"""A test backend whose failure depends on a setting that a capture records: it fails to compile a
graph with relu only while inductor's `cpp.inject_relu_bug_TESTING_ONLY` is "compile_error", as
inductor does with that setting, but without inductor's code generation and g++ (a job under
inductor compiles every candidate). A capture of it reproduces in the worker only if the worker
applies the spec's recorded config, which is what the test that uses it checks
(tests/client/capture/test_client_capture.py); the same setting under real inductor, captured in a
pytest run and minimized, is test_capture_plugin.py's graph-break capture.

Sandbox children import it by path (`tests.support.config_backends:fail_on_relu_while_injected`)
when `MINIFY_ALLOWED_BACKENDS` allows `tests.support`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch._inductor.config
from torch import fx

from tests.support.backends import fail_on_relu


def fail_on_relu_while_injected(gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
    """`fail_on_relu` while the relu bug is injected at compile time; the graph itself otherwise."""
    if torch._inductor.config.cpp.inject_relu_bug_TESTING_ONLY == "compile_error":
        return fail_on_relu(gm, example_inputs)
    return gm
