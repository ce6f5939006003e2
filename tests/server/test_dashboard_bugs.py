"""The dashboard's Bugs view against the real service in headless Chromium: succeeded jobs grouped
into bugs, the representative's repro a click away, and the bug on the job page."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.server.test_bugs import FIVE_BUGS, build_program
from tests.support.browser import LAPTOP, launched_browser, needs_chromium, screenshot, watch_for_errors
from tests.support.service import Service, start_service, wait_for_status

pytestmark = [pytest.mark.browser, needs_chromium]


@pytest.fixture(scope="module")
def service_with_bugs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Service, dict[str, list[str]]]]:
    """Three succeeded jobs: two of the relu bug (other ops, other sizes), one of the exp bug."""
    programs = tmp_path_factory.mktemp("programs")  # the three it posts, not test_bugs' twenty
    with start_service(tmp_path_factory.mktemp("data"), workers=1) as service, service.client() as client:
        jobs: dict[str, list[str]] = {"relu": [], "exp": []}
        for op, index in (("relu", 0), ("relu", 1), ("exp", 2)):
            path = build_program(programs, op, index)
            created = client.post("/v1/jobs", files={"program": (path.name, path.read_bytes())},
                                  data={"spec": json.dumps(FIVE_BUGS)})
            jobs[op].append(created.json()["id"])
        for job_id in [*jobs["relu"], *jobs["exp"]]:
            assert wait_for_status(client, job_id, {"succeeded", "failed", "not_reproducible"})["status"] == "succeeded"
        yield service, jobs


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """One Chromium for the module's tests (each opens a page of its own and closes it), not a launch
    per test."""
    with launched_browser() as browser:
        yield browser


def test_the_bugs_view_lists_each_bug_once_with_its_count_and_repro(
        browser: Any, service_with_bugs: tuple[Service, dict[str, list[str]]], tmp_path: Path) -> None:
    service, jobs = service_with_bugs
    with service.client() as client:
        relu_bug = client.get(f"/v1/jobs/{jobs['relu'][0]}").json()["bug"]
    page = browser.new_page(viewport=LAPTOP, accept_downloads=True)
    errors = watch_for_errors(page)
    page.goto(service.url)
    page.click("nav >> text=Bugs")
    page.wait_for_selector(f"tr.bug-row[data-bug-id='{relu_bug}']")
    rows = page.eval_on_selector_all("tr.bug-row", """rows => rows.map((row) => ({
        id: row.dataset.bugId, count: row.querySelector('.bug-count').textContent,
        signature: row.querySelector('.bug-signature').textContent,
        lastSeen: row.querySelector('.bug-last-seen').textContent}))""")
    screenshot(page, "bugs-laptop")
    relu_row = page.locator(f"tr.bug-row[data-bug-id='{relu_bug}']")
    with page.expect_download() as download_info:
        relu_row.locator("a.repro-link").click()
    repro = Path(download_info.value.path()).read_text()

    relu_row.locator("a.bug-link").click()
    page.wait_for_selector("#bug-jobs li")
    listed = page.eval_on_selector_all("#bug-jobs a", "links => links.map((a) => a.getAttribute('href'))")

    page.goto(f"{service.url}/#/jobs/{jobs['relu'][1]}")
    page.wait_for_selector("#job-bug")
    job_bug = page.inner_text("#job-bug")
    page.click("#job-bug")
    page.wait_for_url(f"**/#/bugs/{relu_bug}")
    page.close()
    assert [row["count"] for row in rows] == ["1", "2"], rows  # most recently seen first: exp, then relu
    assert rows[1] == {"id": relu_bug, "count": "2", "signature": "RuntimeError: injected failure on relu",
                       "lastSeen": rows[1]["lastSeen"]}
    assert rows[1]["lastSeen"].endswith("ago") or rows[1]["lastSeen"] == "just now", rows[1]
    assert "injected failure on relu" in repro and "class Repro" in repro
    assert sorted(listed) == sorted(f"#/jobs/{job_id}" for job_id in jobs["relu"])
    assert job_bug == relu_bug
    assert errors == []


def test_jobs_and_bugs_are_searchable_and_say_what_each_found(
        browser: Any, service_with_bugs: tuple[Service, dict[str, list[str]]]) -> None:
    service, jobs = service_with_bugs
    with service.client() as client:
        exp_bug = client.get(f"/v1/jobs/{jobs['exp'][0]}").json()["bug"]
        relu_bug = client.get(f"/v1/jobs/{jobs['relu'][0]}").json()["bug"]
    page = browser.new_page(viewport=LAPTOP)
    errors = watch_for_errors(page)
    page.goto(f"{service.url}/#/jobs")
    page.wait_for_selector(f"tr.job-row[data-job-id='{jobs['exp'][0]}']")
    found = page.inner_text(f"tr.job-row[data-job-id='{jobs['exp'][0]}'] .job-outcome")
    page.fill("#jobs-search", "injected failure on exp")
    page.press("#jobs-search", "Enter")
    page.wait_for_function("document.querySelectorAll('tr.job-row').length === 1")
    searched_jobs = page.eval_on_selector_all("tr.job-row", "rows => rows.map((row) => row.dataset.jobId)")
    screenshot(page, "jobs-search-laptop")

    page.goto(f"{service.url}/#/bugs")
    page.wait_for_selector("tr.bug-row")
    page.fill("#bugs-search", "RELU")
    page.press("#bugs-search", "Enter")
    page.wait_for_function("document.querySelectorAll('tr.bug-row').length === 1")
    searched_bugs = page.eval_on_selector_all("tr.bug-row", "rows => rows.map((row) => row.dataset.bugId)")
    wraps = page.evaluate("""() => [...document.querySelectorAll('.bug-last-seen')].some((cell) => {
        const range = document.createRange();
        range.selectNodeContents(cell);
        return range.getClientRects().length > 1;  // one rectangle per line of text
    })""")
    screenshot(page, "bugs-search-laptop")

    page.goto(f"{service.url}/#/bugs/{relu_bug}")
    page.wait_for_selector("#bug-jobs li.bug-job .badge")
    listed = page.inner_text("#bug-jobs")
    screenshot(page, "bug-page-laptop")
    page.close()
    assert found == "RuntimeError: injected failure on exp"
    assert searched_jobs == jobs["exp"]
    assert searched_bugs == [relu_bug] and relu_bug != exp_bug
    assert not wraps
    assert "relu-0.pt2" in listed and "relu-1.pt2" in listed and "the representative repro" in listed
    assert errors == []


def test_a_bug_is_closed_and_reopened_on_its_page_and_the_bugs_view_filters_closed_ones(
        browser: Any, service_with_bugs: tuple[Service, dict[str, list[str]]]) -> None:
    service, jobs = service_with_bugs
    with service.client() as client:
        exp_bug = client.get(f"/v1/jobs/{jobs['exp'][0]}").json()["bug"]
        relu_bug = client.get(f"/v1/jobs/{jobs['relu'][0]}").json()["bug"]
    page = browser.new_page(viewport=LAPTOP)
    errors = watch_for_errors(page)
    page.goto(f"{service.url}/#/bugs/{exp_bug}")
    page.wait_for_selector("#bug-action[data-action=close]")
    page.click("#bug-action")  # no reason: refused on the page, nothing sent
    refused = page.inner_text("#bug-action-error")
    page.fill("#bug-reason", "not a compiler bug: the test backend fails on exp on purpose")
    page.select_option("#bug-resolution", "not_a_bug")
    page.fill("#bug-by", "dana")
    page.click("#bug-action")
    page.wait_for_selector("#bug-action[data-action=reopen]")
    closed_state = page.inner_text("#bug-status")
    screenshot(page, "bug-closed-laptop")

    page.goto(f"{service.url}/#/bugs?status=closed")
    page.wait_for_selector(f"tr.bug-row[data-bug-id='{exp_bug}']")
    closed_rows = page.eval_on_selector_all("tr.bug-row", "rows => rows.map((row) => row.dataset.bugId)")
    badge = page.inner_text(f"tr.bug-row[data-bug-id='{exp_bug}'] .bug-status")
    page.click("[data-filter=open]")
    # the table is emptied while the open bugs load: wait for the relu bug's row, not only the exp row's going
    page.wait_for_selector(f"tr.bug-row[data-bug-id='{relu_bug}']")
    open_rows = page.eval_on_selector_all("tr.bug-row", "rows => rows.map((row) => row.dataset.bugId)")

    page.goto(f"{service.url}/#/bugs/{exp_bug}")
    page.wait_for_selector("#bug-action[data-action=reopen]")
    page.fill("#bug-reason", "it is one after all")
    page.click("#bug-action")
    page.wait_for_selector("#bug-action[data-action=close]")
    history = page.eval_on_selector_all("#bug-history li", "items => items.map((item) => item.textContent)")
    page.close()
    with service.client() as client:
        bug = client.get(f"/v1/bugs/{exp_bug}").json()
    assert "Say why you close it" in refused
    assert closed_state.startswith("closed: not a bug by dana") and "fails on exp on purpose" in closed_state
    assert closed_rows == [exp_bug] and badge == "closed: not a bug"
    assert open_rows == [relu_bug]  # the relu bug is still open, the closed exp bug is filtered out
    assert len(history) == 2 and "closed (not a bug) by dana" in history[0] and "reopened by dana" in history[1]
    assert bug["status"] == "open" and [change["by"] for change in bug["history"]] == ["dana", "dana"]
    assert errors == []
