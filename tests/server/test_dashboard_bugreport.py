"""The job page's "Copy as bug report" Markdown (static/js/bugreport.js), built in a real browser
from a job as the API returns it: what a PyTorch issue needs, and nothing the Markdown can break on."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.browser import launched_browser, needs_chromium, static_server

pytestmark = [pytest.mark.browser, needs_chromium]

JOB = {
    "id": "j1",
    "status": "succeeded",
    "spec": {"backend": "inductor", "device": "cpu", "config": {"cpp.inject_relu_bug_TESTING_ONLY": "compile_error"}},
    "result": {
        "status": "succeeded", "backend": "inductor", "device": "cpu",
        "signature": "CppCompileError: C++ compile error",
        "signature_chain": ["InductorError: CppCompileError: C++ compile error", "CppCompileError: C++ compile error"],
        "config": {"cpp.inject_relu_bug_TESTING_ONLY": "compile_error"},
        "nodes_original": 40, "nodes_final": 1, "checks_total": 12,
        "environment": {"PyTorch version": "2.13.0+cpu", "GPU models and configuration": "GPU 0: NVIDIA H100"},
    },
}


@pytest.fixture(scope="module")
def page() -> Iterator[Any]:
    with static_server() as base, launched_browser() as browser:
        page = browser.new_page()
        page.goto(base)
        yield page


def markdown(page: Any, job: dict, repro: str | None) -> str:
    return page.evaluate(f"""async () => {{
        const m = await import('/static/js/bugreport.js');
        return m.bugReportMarkdown({json.dumps(job)}, {json.dumps(repro)});
    }}""")


def test_the_bug_report_has_the_signature_its_chain_the_config_the_repro_and_the_versions(page: Any) -> None:
    text = markdown(page, JOB, "import torch\nprint('repro')\n")

    describe, versions = text.split("### Versions")
    assert describe.startswith("### 🐛 Describe the bug")
    assert "backend `inductor` on `cpu`" in describe
    assert "```\nCppCompileError: C++ compile error\n```" in describe
    assert "```\nInductorError: CppCompileError: C++ compile error\nCppCompileError: C++ compile error\n```" in describe
    assert 'cpp.inject_relu_bug_TESTING_ONLY="compile_error"' in describe
    assert "from 40 to 1 ops" in describe
    assert "```python\nimport torch\nprint('repro')\n```" in describe
    assert "```\nPyTorch version: 2.13.0+cpu\nGPU models and configuration: GPU 0: NVIDIA H100\n```" in versions


def test_backticks_in_the_repro_cannot_close_its_block(page: Any) -> None:
    repro = 'DOC = """\n```\nnot the end\n```\n"""\n'

    text = markdown(page, JOB, repro)

    assert f"````python\n{repro.rstrip()}\n````" in text
