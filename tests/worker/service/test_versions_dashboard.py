"""The version phase on the dashboard: the job page's row of version badges, the "Copy as bug
report" text and the Bugs view's status (open / fixed in), in a real browser. The page's files are
the real ones on a plain static server; the job and the bug it shows are answered by the browser
(Playwright's routing) as the API returns them, so no service has to run a job on several torch
versions first (tests/worker/service/test_versions_fanout.py does that)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.browser import launched_browser, needs_chromium, static_server, watch_for_errors

pytestmark = [pytest.mark.browser, needs_chromium, pytest.mark.xdist_group("test_versions_dashboard")]

SUMMARY = "fails on 2.13.0+cpu; passes on 2.12.0, 2.14.1: regression in (2.12.0, 2.13.0+cpu]; fixed in 2.14.1"
RESULT = {
    "status": "succeeded", "backend": "inductor", "device": "cpu",
    "signature": "RuntimeError: injected failure on relu",
    "nodes_original": 2, "nodes_final": 1, "checks_total": 7, "culprit_state": "done", "culprit_reason": "none found",
    "versions_state": "done", "versions_summary": SUMMARY,
    "versions": [
        {"torch": "2.11.0", "git_version": None, "outcome": "cannot_run", "signature": None,
         "reason": "this torch lacks what the repro uses: AttributeError: no attribute 'new_op'", "seconds": 2.0},
        {"torch": "2.12.0", "git_version": "0123456789abcdef", "outcome": "passes", "signature": None,
         "reason": "repro passed", "seconds": 3.1},
        {"torch": "2.13.0+cpu", "git_version": "cf30153c4c13", "outcome": "same",
         "signature": "RuntimeError: injected failure on relu", "reason": "the job's own run", "seconds": 0.0},
        {"torch": "2.14.1", "git_version": None, "outcome": "different", "signature": "TypeError: x",
         "reason": None, "seconds": 2.5},
    ],
    "regression_range": {"last_good": "2.12.0", "first_bad": "2.13.0+cpu"}, "fixed_in": None,
    "bisect": {"good": "2.11.0", "bad": "2.13.0", "state": "done", "last_good": "2.12.0", "first_bad": "2.13.0",
               "commits": "aaa..bbb", "releases": ["2.11.0", "2.12.0", "2.13.0"], "installs": 2, "reason": None,
               "steps": [{"torch": "2.11.0", "outcome": "passes"}, {"torch": "2.13.0", "outcome": "same"},
                         {"torch": "2.12.0", "outcome": "passes"}]},
}
BUG = {"id": "b" * 24, "signature": "RuntimeError: injected failure on relu", "graph_shape_hash": "g",
       "backend": "inductor", "device": "cpu", "count": 1, "job_ids": ["j1"], "first_seen": "2026-01-01T00:00:05Z",
       "last_seen": "2026-01-01T00:00:05Z", "representative": "j1", "repro": "/v1/jobs/j1/artifacts/repro.py",
       "status": "fixed", "affected": ["2.13.0+cpu"], "fixed_in": "2.14.1",
       "fixed_evidence": {"job": "j1", "torch": "2.14.1", "how": "re-test"},
       "versions_tried": {"2.12.0": "passes", "2.13.0+cpu": "same", "2.14.1": "passes"}}
JOB = {"id": "j1", "status": "succeeded", "spec": {"backend": "inductor", "device": "cpu"},
       "created_at": "2026-01-01T00:00:00Z", "finished_at": "2026-01-01T00:00:05Z", "culprit_state": "done",
       "progress": {"phase": "done"}, "result": RESULT}


@pytest.fixture(scope="module")
def page() -> Iterator[Any]:
    with static_server() as base, launched_browser() as browser:
        page = browser.new_page()
        errors = watch_for_errors(page)

        def answer(route: Any) -> None:
            path = route.request.url.split("?", 1)[0]
            if path.endswith("/v1/bugs"):
                fixed = "status=fixed" in route.request.url or "status=" not in route.request.url
                bugs = [BUG] if fixed else []
                route.fulfill(status=200, content_type="application/json",
                              body=json.dumps({"bugs": bugs, "total": len(bugs), "offset": 0, "limit": 50}))
            elif path.endswith(f"/v1/bugs/{BUG['id']}"):
                route.fulfill(status=200, content_type="application/json", body=json.dumps(BUG))
            elif path.endswith("/v1/jobs/j1"):
                route.fulfill(status=200, content_type="application/json", body=json.dumps(JOB))
            elif path.endswith("/events"):
                route.fulfill(status=200, content_type="text/event-stream", body="")
            elif path.endswith("/repro.py"):
                route.fulfill(status=200, content_type="text/plain", body="import torch\n")
            else:
                route.fulfill(status=404, content_type="application/json", body='{"error": "not here"}')

        page.route("**/v1/**", answer)
        page.goto(f"{base}/#/jobs/j1")
        page.wait_for_selector("#versions .badge")
        page.base = base
        page.errors = errors
        yield page


def test_the_job_page_shows_a_badge_per_torch_version_and_the_summary(page: Any) -> None:
    badges = page.eval_on_selector_all("#versions .badge", "nodes => nodes.map(n => [n.textContent, n.className])")

    assert badges == [
        ["2.11.0 cannot run", "badge version version-cannot_run"],
        ["2.12.0 passes", "badge version version-passes"],
        ["2.13.0+cpu fails", "badge version version-same"],
        ["2.14.1 fails otherwise", "badge version version-different"],
    ]
    assert page.text_content("#versions-summary") == SUMMARY
    assert page.text_content("#bisect") == ("Bisect 2.11.0..2.13.0: first bad 2.13.0 (last good 2.12.0; git aaa..bbb), "
                                            "2 installs: 2.11.0 passes, 2.13.0 fails, 2.12.0 passes")
    assert "TypeError: x" in page.get_attribute("#versions .version-different", "title")
    assert page.errors == []


def test_the_bug_report_says_which_torch_versions_have_the_bug(page: Any) -> None:
    text = page.evaluate(f"""async () => {{
        const m = await import('/static/js/bugreport.js');
        return m.bugReportMarkdown({json.dumps(JOB)}, null);
    }}""")

    assert f"Torch versions (minify ran repro.py on each): {SUMMARY}" in text
    assert "- torch 2.12.0 (git 0123456789ab): passes\n" in text
    assert "- torch 2.14.1: fails otherwise (TypeError: x)\n" in text
    assert "- torch 2.11.0: cannot run (this torch lacks what the repro uses" in text
    assert "Bisected torch releases 2.11.0..2.13.0: first bad 2.13.0 (last good 2.12.0; git aaa..bbb)" in text


def test_the_bugs_view_shows_which_are_fixed_and_filters_by_status(page: Any) -> None:
    page.goto(f"{page.base}/#/bugs?status=fixed")
    page.wait_for_selector("tr.bug-row .bug-status")
    listed = page.inner_text("tr.bug-row .bug-status")
    active = page.inner_text("#bug-filters .chip.active")
    page.goto(f"{page.base}/#/bugs?status=open")
    page.wait_for_selector("p.empty:not([hidden])")
    page.goto(f"{page.base}/#/bugs/{BUG['id']}")
    page.wait_for_selector("#bug-status")
    status = page.inner_text("#bug-status")

    assert (listed, active) == ("fixed in 2.14.1", "Fixed")
    assert status == "fixed in 2.14.1 re-test: job j1's repro passed on torch 2.14.1"
    assert page.errors == []
