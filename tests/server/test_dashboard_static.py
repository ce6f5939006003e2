"""The dashboard's own files: they load with no network beyond the server, and its modules (the
Python highlighter, the config parser, the chart, the router) behave, checked in a real browser
against a plain static file server. The page against the real service is in test_dashboard.py.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.browser import (
    STATIC_DIR,
    launched_browser,
    needs_chromium,
    static_server,
    watch_for_errors,
)

PAGE_FILES = sorted(
    path for path in STATIC_DIR.rglob("*") if path.suffix in (".html", ".js", ".css") and "vendor" not in path.parts
)


def test_the_page_loads_nothing_from_another_host() -> None:
    remote = re.compile(r"""(?:src|href|import|from|url\()\s*=?\s*["'(]?\s*(?:https?:)?//""")
    offenders = [f"{path.name}: {match.group(0)}" for path in PAGE_FILES for match in remote.finditer(path.read_text())]
    assert offenders == []


def test_every_module_the_page_imports_exists() -> None:
    index = (STATIC_DIR / "index.html").read_text()
    referenced = [STATIC_DIR.parent / ref for ref in re.findall(r'(?:src|href)="(static/[^"]+)"', index)]
    for script in (STATIC_DIR / "js").glob("*.js"):
        referenced += [script.parent / ref for ref in re.findall(r'from "(\./[^"]+)"', script.read_text())]
    assert referenced, "index.html references no files"
    assert [path for path in referenced if not path.resolve().is_file()] == []


@pytest.fixture(scope="module")
def base_url() -> Iterator[str]:
    with static_server() as base:
        yield base


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with launched_browser() as browser:
        yield browser


@pytest.fixture(scope="module")
def page(browser: Any, base_url: str) -> Any:
    """One page for the module tests: the dashboard with no API behind it."""
    page = browser.new_page()
    page.goto(f"{base_url}/#/submit")
    return page


def run_module(page: Any, module: str, body: str) -> Any:
    """Import static/js/MODULE in the page and evaluate `body` with it bound to `m`."""
    return page.evaluate(f"async () => {{ const m = await import('/static/js/{module}'); {body} }}")


@pytest.mark.browser
@needs_chromium
def test_highlighter_escapes_html_in_the_source(page: Any) -> None:
    html = run_module(page, "highlight.js", "return m.highlightPython('x = \"<script>\" < 1 & y');")
    assert "<script>" not in html
    assert "&lt;script&gt;" in html and "&lt; " in html and "&amp;" in html


@pytest.mark.browser
@needs_chromium
def test_highlighter_marks_keywords_strings_numbers_comments_and_names(page: Any) -> None:
    source = 'def forward(self, x):  # relu then cos\n    return torch.cos(x) * 2.5 if """a""" else None\n'
    tokens = run_module(page, "highlight.js", f"""
        const div = document.createElement('div');
        div.innerHTML = m.highlightPython({source!r});
        return [...div.querySelectorAll('span')].map((s) => [s.className, s.textContent]);
    """)
    assert ["tok-keyword", "def"] in tokens
    assert ["tok-defname", "forward"] in tokens
    assert ["tok-comment", "# relu then cos"] in tokens
    assert ["tok-number", "2.5"] in tokens
    assert ["tok-string", '"""a"""'] in tokens
    assert ["tok-constant", "None"] in tokens
    assert ["tok-builtin", "self"] in tokens


@pytest.mark.browser
@needs_chromium
def test_highlighter_keeps_the_text_unchanged(page: Any) -> None:
    source = "import torch\nx = f'{a!r}' + r\"\\d\" # c\n@torch.no_grad()\ndef f(): pass\n'unterminated"
    text = run_module(page, "highlight.js", f"""
        const div = document.createElement('div');
        div.innerHTML = m.highlightPython({source!r});
        return div.textContent;
    """)
    assert text == source


@pytest.mark.browser
@needs_chromium
def test_config_lines_take_json_values_and_keep_other_values_as_strings(page: Any) -> None:
    config = run_module(page, "submit.js", """
        return m.parseConfigLines('cpp.inject_relu_bug_TESTING_ONLY=compile_error\\n# a comment\\n\\n'
            + 'max_autotune=true\\ntriton.num_stages = 3\\ncpp.simdlen=null');
    """)
    assert config == {
        "cpp.inject_relu_bug_TESTING_ONLY": "compile_error",
        "max_autotune": True,
        "triton.num_stages": 3,
        "cpp.simdlen": None,
    }


@pytest.mark.browser
@needs_chromium
def test_config_line_without_equals_is_refused_with_its_line_number(page: Any) -> None:
    message = run_module(page, "submit.js", """
        try { m.parseConfigLines('a=1\\nnot a pair'); return null; } catch (e) { return e.message; }
    """)
    assert message is not None and "line 2" in message


@pytest.mark.browser
@needs_chromium
def test_chart_keeps_a_point_per_change_and_draws_the_latest_node_count(page: Any) -> None:
    drawn = run_module(page, "chart.js", """
        const box = document.createElement('div');
        box.style.width = '600px';
        document.body.append(box);
        const chart = new m.NodeChart(box);
        chart.setOriginal(40);
        chart.add(0, 40, 1);
        chart.add(0.5, 40, 1);   // nothing changed: dropped
        chart.add(1, 20, 5);
        chart.add(2, 2, 9);
        chart.draw();
        const svg = box.querySelector('svg');
        return {points: svg.dataset.points, nodes: svg.dataset.nodes, dots: svg.querySelectorAll('circle').length};
    """)
    assert drawn == {"points": "3", "nodes": "2", "dots": 3}


@pytest.mark.browser
@needs_chromium
def test_page_shows_an_error_not_a_blank_page_when_the_api_is_missing(browser: Any, base_url: str) -> None:
    page = browser.new_page()
    errors = watch_for_errors(page)
    page.goto(f"{base_url}/#/jobs")
    page.wait_for_selector("text=Could not load jobs")
    assert [error for error in errors if "uncaught" in error] == []


@pytest.mark.browser
@needs_chromium
def test_client_job_link_opens_the_job_page(browser: Any, base_url: str) -> None:
    """minify-client prints `SERVER/?job=ID`; the page shows that job (here: a 404 from no API)."""
    page = browser.new_page()
    page.goto(f"{base_url}/?job=abc123")
    page.wait_for_selector("h1 >> text=abc123")
    assert page.url.endswith("#/jobs/abc123")
