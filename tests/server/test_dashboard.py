"""The dashboard against the real service (tests/support/service.py) in headless Chromium: a person
submits a failing program through the page, watches it shrink live, and downloads the repro.

Cheap test backends stand in for inductor (tests/support/backends.py), so a job takes
seconds. Screenshots of the pages (laptop and phone) go to test-artifacts/screenshots/.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from examples import programs
from tests.support.backends import PREFIX
from tests.support.browser import (
    LAPTOP,
    PHONE,
    launched_browser,
    needs_chromium,
    screenshot,
    watch_for_errors,
)
from tests.support.graphs import save_cos_sin_relu
from tests.support.service import Service, start_service, wait_for_culprit, wait_for_status

pytestmark = [pytest.mark.browser, needs_chromium]

FAIL_ON_RELU = f"{PREFIX}:fail_on_relu"
PATTERN_MATCHER_BUG = f"{PREFIX}:fail_on_relu_unless_pattern_matcher_off"
JOB_TIMEOUT_MS = 120_000


@pytest.fixture(scope="module")
def program_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("programs")
    for name in ("relu_cos", "chain", "linear_relu_sigmoid"):
        programs.save(name, directory)
    return directory


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    with start_service(tmp_path_factory.mktemp("minify-data"), workers=1) as service:
        yield service


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with launched_browser() as browser:
        yield browser


@pytest.fixture(autouse=True)
def _pages_closed(request: pytest.FixtureRequest) -> Iterator[None]:
    """Close what a test opened in the module's browser when it ends, passed or not: a jobs page left
    open asks the server for the list every 2 s (jobs.js) through every later test of the module,
    minutes of requests and redraws that no test reads."""
    yield
    if "browser" in request.fixturenames:
        for context in request.getfixturevalue("browser").contexts:
            context.close()


def submit_through_page(page: Any, program: Path, *, backend: str, extra_config: str = "",
                        candidate_timeout_s: float | None = None, screenshot_name: str | None = None) -> str:
    """Fill the submit form, send it, and return the new job's id from the page it lands on."""
    page.click("nav >> text=Submit")
    page.set_input_files("input[name=program]", str(program))
    page.fill("input[name=backend]", backend)
    page.fill("input[name=device]", "cpu")
    if extra_config:
        page.fill("textarea[name=config]", extra_config)
    if candidate_timeout_s is not None:
        page.fill("input[name=candidate_timeout_s]", str(candidate_timeout_s))
    if screenshot_name:
        screenshot(page, screenshot_name)
    page.click("#submit-job")
    page.wait_for_url("**/#/jobs/*")
    return page.url.rsplit("/", 1)[1]


def record_chart_redraws(page: Any) -> None:
    """Keep every redraw of the job page's chart in `window.chartRedraws` as {points, nodes}."""
    page.wait_for_selector("#chart svg")
    page.evaluate("""() => {
        const svg = document.querySelector('#chart svg');
        window.chartRedraws = [];
        const record = () => window.chartRedraws.push({
            points: Number(svg.dataset.points || 0), nodes: svg.dataset.nodes ? Number(svg.dataset.nodes) : null});
        new MutationObserver(record).observe(svg, {attributes: true, attributeFilter: ['data-points']});
        record();
    }""")


def copy_bug_report(page: Any) -> str:
    """Click "Copy as bug report" and return what reached the clipboard. The button says "Copied"
    for 1.5 s only: every label it shows is recorded from before the click, so a loaded box that
    looks late still sees it (and a "Copy failed" is named)."""
    page.evaluate("""() => {
        window.copyLabels = [];
        new MutationObserver(() => {  // the page may render the button anew: look it up each time
            const label = document.querySelector('#copy-bug-report')?.textContent;
            if (label !== undefined && label !== window.copyLabels.at(-1)) window.copyLabels.push(label);
        }).observe(document.body, {childList: true, characterData: true, subtree: true});
    }""")
    page.click("#copy-bug-report")
    page.wait_for_function("window.copyLabels.some(label => label !== 'Copy as bug report')")
    labels = page.evaluate("window.copyLabels")
    assert "Copied" in labels, labels
    return page.evaluate("navigator.clipboard.readText()")


def test_a_job_submitted_through_the_page_is_followed_live_to_a_downloadable_repro(
        browser: Any, service: Service, program_dir: Path, tmp_path: Path) -> None:
    page = browser.new_page(viewport=LAPTOP, accept_downloads=True)
    errors = watch_for_errors(page)
    page.goto(service.url)
    job_id = submit_through_page(page, program_dir / "chain.pt2", backend=FAIL_ON_RELU,
                                 screenshot_name="submit-laptop")
    record_chart_redraws(page)

    # Live: the chart gains points redraw by redraw as events arrive, and the node count falls.
    page.wait_for_selector("#job-status [data-status=succeeded]", timeout=JOB_TIMEOUT_MS)
    page.wait_for_selector("#copy-bug-report")
    page.evaluate("window.reportButton = document.querySelector('#copy-bug-report')")
    with service.client() as client:
        # The culprit phase follows the delivered result and rewrites repro.py's header: the page follows it.
        report = wait_for_culprit(client, job_id, timeout_s=JOB_TIMEOUT_MS / 1000)["result"]
    page.wait_for_selector("#culprit-card:not(.pending):not([hidden])")
    # The result card was drawn anew when the phase ended; a click then (its "Copied") lands on the
    # button the user sees: the redraw keeps the one button.
    assert page.evaluate("document.querySelector('#copy-bug-report') === window.reportButton")
    redraws = page.evaluate("window.chartRedraws")
    points = [redraw["points"] for redraw in redraws]
    nodes = [redraw["nodes"] for redraw in redraws if redraw["nodes"] is not None]
    assert len(set(points)) >= 3, f"the chart did not grow step by step: {redraws}"
    assert points == sorted(points)
    assert nodes == sorted(nodes, reverse=True)
    assert nodes[0] == report["nodes_original"] and nodes[-1] == report["nodes_final"] < report["nodes_original"]

    # Done: the summary, the minimized graph, repro.py highlighted, a button per artifact.
    assert page.inner_text("#stat-nodes").startswith(f"{report['nodes_original']} → {report['nodes_final']}")
    page.wait_for_selector("#repro-code .tok-keyword")
    assert "relu" in page.inner_text("#graph-code")
    artifacts = page.eval_on_selector_all("#downloads [data-artifact]", "links => links.map((a) => a.dataset.artifact)")
    assert set(artifacts) >= {"minimized.pt2", "repro.py", "inputs.pt", "report.json", "bundle.tar.gz"}
    assert f"minify-client download {job_id}" in page.inner_text("#result")
    assert "python repro.py" in page.inner_text("#result")
    facts = page.inner_text("#job-facts")
    assert "Time by phase" in facts and all(phase in facts for phase in report["phase_s"])
    assert "[4, 4] → [1, 1]" in facts  # the input, before and after the shrink phase
    assert "forked from the warm worker" in facts

    with page.expect_download() as download_info:
        page.click("[data-artifact='repro.py']")
    download = download_info.value
    assert download.suggested_filename == "repro.py"
    saved = tmp_path / "repro.py"
    download.save_as(saved)
    served = service.client().get(f"/v1/jobs/{job_id}/artifacts/repro.py").text
    assert saved.read_text() == served == page.inner_text("#repro-code")
    assert "Torch versions" not in served  # one torch on the workers: no range to tell

    # The worker's own log of the job, folded until asked for.
    page.click("#worker-log-card summary")
    page.wait_for_function("document.querySelector('#worker-log').textContent.includes('an attempt starts')")
    assert f"job {job_id}: an attempt starts on worker" in page.inner_text("#worker-log")

    screenshot(page, "job-succeeded-laptop")
    page.set_viewport_size(PHONE)
    screenshot(page, "job-succeeded-phone")
    assert errors == []


def test_jobs_page_lists_every_job_and_filters_by_status(
        browser: Any, service: Service, program_dir: Path) -> None:
    with service.client() as client:
        succeeded = _submit(client, program_dir / "relu_cos.pt2", FAIL_ON_RELU)
        not_reproducible = _submit(client, program_dir / "linear_relu_sigmoid.pt2",
                                   f"{PREFIX}:fail_on_cos")
        wait_for_status(client, succeeded, {"succeeded"}, timeout_s=JOB_TIMEOUT_MS / 1000)
        wait_for_status(client, not_reproducible, {"not_reproducible"}, timeout_s=JOB_TIMEOUT_MS / 1000)

    page = browser.new_page(viewport=LAPTOP)
    errors = watch_for_errors(page)
    page.goto(f"{service.url}/#/jobs")
    row = page.locator(f"tr[data-job-id='{succeeded}']")
    row.wait_for()
    assert row.get_attribute("data-status") == "succeeded"
    assert FAIL_ON_RELU in row.inner_text()
    assert "→" in row.locator("td.nodes").inner_text()
    assert page.locator(f"tr[data-job-id='{not_reproducible}']").get_attribute("data-status") == "not_reproducible"
    screenshot(page, "jobs-laptop")
    page.set_viewport_size(PHONE)
    screenshot(page, "jobs-phone", full_page=False)
    page.set_viewport_size(LAPTOP)

    page.click("[data-filter=not_reproducible]")
    page.wait_for_selector(f"tr[data-job-id='{succeeded}']", state="detached")
    # The filtered list is fetched and drawn anew: wait for it, not just for the old rows to go.
    page.wait_for_selector(f"tr[data-job-id='{not_reproducible}']")
    statuses = page.eval_on_selector_all("tr.job-row", "rows => rows.map((r) => r.dataset.status)")
    assert statuses and set(statuses) == {"not_reproducible"}
    assert errors == []


def test_jobs_page_updates_without_a_reload(browser: Any, service: Service, program_dir: Path) -> None:
    page = browser.new_page(viewport=LAPTOP)
    page.goto(f"{service.url}/#/jobs")
    page.wait_for_selector("text=updated")
    with service.client() as client:
        job_id = _submit(client, program_dir / "relu_cos.pt2", FAIL_ON_RELU)
    page.wait_for_selector(f"tr[data-job-id='{job_id}']", timeout=10_000)
    page.wait_for_selector(f"tr[data-job-id='{job_id}'][data-status=succeeded]", timeout=JOB_TIMEOUT_MS)


def test_not_reproducible_job_says_why_in_words(browser: Any, service: Service, program_dir: Path) -> None:
    page = browser.new_page(viewport=LAPTOP)
    page.goto(service.url)
    submit_through_page(page, program_dir / "linear_relu_sigmoid.pt2",
                        backend=f"{PREFIX}:say_then_fail_on_cos")  # prints a line as it compiles; no cos: passes
    page.wait_for_selector("#job-status [data-status=not_reproducible]", timeout=JOB_TIMEOUT_MS)
    reason = page.locator("#job-reason")
    reason.wait_for()
    assert "did not fail" in reason.inner_text()
    # What the original printed in the worker, and a next step fitted to what it did (it passed every run).
    page.wait_for_selector("#original-card:not([hidden])")
    assert page.inner_text("#original-output") == "say_then_fail_on_cos: compiling 7 nodes"
    assert page.inner_text("#next-step").startswith("Next: The original passed 3 of 3 runs on "
                                                    f"{PREFIX}:say_then_fail_on_cos (cpu, no config)")
    assert "Next:" not in reason.inner_text()  # said once, in the card
    # Nothing beside the verdict that reads as if something was minimized: no counts, chart or outcomes.
    page.wait_for_selector("#stats", state="hidden")
    for card in ("#progress-card", "#outcomes-card", "#graph-card", "#culprit-card"):
        assert page.locator(card).is_hidden(), card
    assert "The graph appears here" not in page.inner_text("main")
    screenshot(page, "job-not-reproducible-laptop")


def test_the_submit_form_sends_every_spec_field(browser: Any, service: Service, program_dir: Path) -> None:
    page = browser.new_page(viewport=LAPTOP)
    sent: list[str] = []

    def refuse(route: Any) -> None:
        sent.append(route.request.post_data_buffer.decode(errors="replace"))
        route.fulfill(status=422, content_type="application/json", body=json.dumps({"error": "checked here"}))

    page.goto(service.url)
    page.route("**/v1/jobs", refuse)
    page.click("nav >> text=Submit")
    page.set_input_files("input[name=program]", str(program_dir / "relu_cos.pt2"))
    for name, value in {"backend": "eager", "signature": "RuntimeError: boom", "tolerance": "0.01",
                        "op_modules": "pkg.ops, other.ops", "original_timeout_s": "30", "job_timeout_s": "600",
                        "memory_mb": "2048", "candidate_timeout_s": "5"}.items():
        page.fill(f"input[name={name}]", value)
    page.select_option("select[name=dynamic]", "static")
    page.uncheck("input[name=versions]")
    screenshot(page, "submit-every-flag-laptop")
    page.click("#submit-job")
    page.wait_for_selector("#submit-error:not([hidden])")
    spec = json.loads(sent[0].split('name="spec"')[1].split("\r\n\r\n", 1)[1].split("\r\n--", 1)[0])
    assert spec["failure"]["signature"] == "RuntimeError: boom" and spec["failure"]["tolerance"] == 0.01
    assert spec["op_modules"] == ["pkg.ops", "other.ops"] and spec["dynamic"] == "static"
    assert spec["limits"] == {"candidate_timeout_s": 5, "original_timeout_s": 30, "job_timeout_s": 600,
                              "memory_mb": 2048}
    assert spec["versions"] is False and spec["program_format"] == "pt2"
    assert "checked here" in page.inner_text("#submit-error")


def test_cancel_button_ends_a_running_job(browser: Any, service: Service, program_dir: Path) -> None:
    page = browser.new_page(viewport=LAPTOP)
    page.goto(service.url)
    submit_through_page(page, program_dir / "relu_cos.pt2", backend=f"{PREFIX}:hang_on_relu",
                        candidate_timeout_s=300)
    page.wait_for_selector("#job-status [data-status=running]", timeout=JOB_TIMEOUT_MS)
    screenshot(page, "job-running-laptop")
    page.click("#cancel-job")
    page.click("#cancel-job")  # the second click confirms
    page.wait_for_selector("#job-status [data-status=cancelled]", timeout=JOB_TIMEOUT_MS)
    assert "cancelled" in page.inner_text("#job-reason")
    screenshot(page, "job-cancelled-laptop")
    assert page.locator("#cancel-job").is_hidden()


def test_token_protected_server_asks_for_the_token_once_and_keeps_it(
        browser: Any, service: Service, program_dir: Path) -> None:
    """The token-protected server is a second API server over the module service's Redis and data
    dir (`--redis-url`), whose worker runs the job: a worker of its own would import torch again
    (~10 CPU-s) for one job. Its program is one no other test here submits with this backend, so
    the submission makes a new job (not an identical one's, which the store would answer with)."""
    shared = ["--redis-url", service.redis_url]
    with start_service(service.data_dir, workers=0, tokens=["s3cret"], args=shared) as protected:
        context = browser.new_context(viewport=LAPTOP, accept_downloads=True)
        page = context.new_page()
        page.goto(protected.url)
        page.wait_for_selector("#token-dialog[open]")
        page.fill("#token-input", "wrong")
        page.click("#token-form button[type=submit]")
        page.wait_for_selector("#token-error:not([hidden])")
        page.fill("#token-input", "s3cret")
        page.click("#token-form button[type=submit]")
        page.wait_for_selector("text=updated")

        # The event stream (?token=) and the downloads (Authorization header) carry it too.
        job_id = submit_through_page(page, program_dir / "linear_relu_sigmoid.pt2", backend=FAIL_ON_RELU)
        page.wait_for_selector("#job-status [data-status=succeeded]", timeout=JOB_TIMEOUT_MS)
        page.wait_for_function("() => Number(document.querySelector('#chart svg').dataset.points) >= 1")
        with page.expect_download() as download_info:
            page.click("[data-artifact='report.json']")
        report = json.loads(Path(download_info.value.path()).read_text())
        assert report["status"] == "succeeded"

        second = context.new_page()
        second.goto(f"{protected.url}/#/jobs/{job_id}")
        second.wait_for_selector("#job-status [data-status=succeeded]")
        assert second.locator("#token-dialog[open]").count() == 0
        context.close()


def _submit(client: Any, program: Path, backend: str) -> str:
    spec = {"backend": backend, "device": "cpu"}
    with program.open("rb") as upload:
        response = client.post("/v1/jobs", files={"program": (program.name, upload)}, data={"spec": json.dumps(spec)},
                               params={"force": "true"})  # a new job each time, not an identical one's
    response.raise_for_status()
    return response.json()["id"]


def test_a_job_no_worker_serves_says_so_and_the_wait_keeps_counting(
        browser: Any, service: Service, program_dir: Path) -> None:
    # The service's worker serves the cpu queue only: a cuda job waits, and its page says why.
    with service.client() as client:
        spec = {"backend": "eager", "device": "cuda"}
        program = program_dir / "relu_cos.pt2"
        created = client.post("/v1/jobs", files={"program": (program.name, program.read_bytes())},
                              data={"spec": json.dumps(spec)})
        created.raise_for_status()
        job_id = created.json()["id"]
        try:
            page = browser.new_page(viewport=LAPTOP)
            page.goto(f"{service.url}/#/jobs/{job_id}")
            warning = page.locator("#job-warnings")
            warning.wait_for(timeout=10_000)
            first = warning.inner_text()
            assert first.startswith("No worker has served the cuda queue for "), first
            # No event comes while a job waits: the page asks again, and the count moves on.
            page.wait_for_function("(first) => document.querySelector('#job-warnings').textContent !== first",
                                   arg=first, timeout=15_000)
            assert warning.inner_text().startswith("No worker has served the cuda queue for ")
        finally:
            client.delete(f"/v1/jobs/{job_id}")


def test_a_refused_upload_shows_the_servers_reason_on_the_form(
        browser: Any, service: Service, tmp_path: Path) -> None:
    not_a_program = tmp_path / "notes.pt2"
    not_a_program.write_text("this is not a torch.export archive")
    page = browser.new_page(viewport=LAPTOP)
    page.goto(f"{service.url}/#/submit")
    page.set_input_files("input[name=program]", str(not_a_program))
    page.click("#submit-job")
    error = page.locator("#submit-error")
    error.wait_for()
    with not_a_program.open("rb") as upload, service.client() as client:
        refusal = client.post("/v1/jobs", files={"program": (not_a_program.name, upload)}, data={"spec": "{}"})
    assert 400 <= refusal.status_code < 500
    assert error.inner_text() == f"The server refused the job: {refusal.json()['error']}"
    assert "#/submit" in page.url


def test_the_job_page_shows_the_workers_environment_and_copies_a_bug_report(
        browser: Any, service: Service, program_dir: Path) -> None:
    with service.client() as client:
        job_id = _submit(client, program_dir / "relu_cos.pt2", FAIL_ON_RELU)
        # repro.py's header changes once the culprit phase (after the result) ends: the bug report copies the last.
        report = wait_for_culprit(client, job_id, timeout_s=JOB_TIMEOUT_MS / 1000)["result"]
        repro = client.get(f"/v1/jobs/{job_id}/artifacts/repro.py").text
    environment = report["environment"]
    context = browser.new_context(viewport=LAPTOP, permissions=["clipboard-read", "clipboard-write"])
    page = context.new_page()
    errors = watch_for_errors(page)
    page.goto(f"{service.url}/#/jobs/{job_id}")

    page.wait_for_selector("#environment-card:not([hidden])")
    shown = page.inner_text("#environment")
    for name in ("PyTorch version", "PyTorch git version", "OS", "Python version", "C++ compiler (inductor)"):
        assert name in shown and environment[name] in shown
    markdown = copy_bug_report(page)

    assert markdown.startswith("### 🐛 Describe the bug")
    assert f"```\n{report['signature']}\n```" in markdown
    assert f"```python\n{repro.rstrip()}\n```" in markdown
    versions = markdown.split("### Versions", 1)[1]
    assert all(f"{name}: {value}" in versions for name, value in environment.items())
    screenshot(page, "job-environment-laptop")
    assert errors == []
    context.close()


def test_the_job_page_shows_the_root_cause_and_the_exception_chain(
        browser: Any, service: Service, program_dir: Path) -> None:
    with service.client() as client:
        job_id = _submit(client, program_dir / "relu_cos.pt2", f"{PREFIX}:failed_import_on_relu")
        wait_for_status(client, job_id, {"succeeded"}, timeout_s=JOB_TIMEOUT_MS / 1000)
    page = browser.new_page(viewport=LAPTOP)
    errors = watch_for_errors(page)
    page.goto(f"{service.url}/#/jobs/{job_id}")

    page.wait_for_selector("#signature:has-text('exception chain')")
    shown = page.inner_text("#signature")
    assert shown.startswith("SyntaxError: invalid syntax")
    assert "InductorError: RuntimeError: Failed to import" in shown
    assert errors == []
    page.close()


def test_the_job_page_shows_the_culprit_card_above_the_graph_and_the_bug_report_has_it(
        browser: Any, service: Service, program_dir: Path) -> None:
    # A custom backend whose bug goes away with inductor's pattern matcher off: no stages to
    # bisect, one workaround verified on the original (tests/worker/programs/fx/test_culprit.py has the details).
    with service.client() as client:
        job_id = _submit(client, program_dir / "relu_cos.pt2", PATTERN_MATCHER_BUG)
        report = wait_for_culprit(client, job_id, timeout_s=JOB_TIMEOUT_MS / 1000)["result"]
    assert report["culprit"] is None and report["workarounds"][0]["setting"] == "pattern_matcher"
    context = browser.new_context(viewport=LAPTOP, permissions=["clipboard-read", "clipboard-write"])
    page = context.new_page()
    errors = watch_for_errors(page)
    page.goto(f"{service.url}/#/jobs/{job_id}")

    page.wait_for_selector("#culprit-card:not([hidden])")
    shown = page.inner_text("#culprit")
    assert f"none ({report['culprit_reason']})" in shown
    assert "pattern_matcher = false  (original program: compiles and runs)" in shown
    assert "freezing=True: minimal program: crashed" in shown
    assert page.evaluate("document.querySelector('#culprit-card').nextElementSibling.id") == "graph-card"
    markdown = copy_bug_report(page)
    assert f"Culprit (torch's compiler bisector on the minimal program): none ({report['culprit_reason']})" in markdown
    assert "Workarounds (verified on the original program): `pattern_matcher=false`" in markdown
    screenshot(page, "job-culprit-laptop")
    assert errors == []
    context.close()


def test_the_culprit_card_says_bisecting_while_the_phase_runs_after_the_result_then_fills_in(
        browser: Any, service: Service, program_dir: Path) -> None:
    # The result is delivered before the culprit phase, which this backend makes last seconds.
    with service.client() as client:
        job_id = _submit(client, program_dir / "relu_cos.pt2", f"{PREFIX}:fail_on_relu_slow_culprit")
        delivered = wait_for_status(client, job_id, {"succeeded"}, timeout_s=JOB_TIMEOUT_MS / 1000)
    assert delivered["culprit_state"] == "running"
    page = browser.new_page(viewport=LAPTOP)
    errors = watch_for_errors(page)
    page.goto(f"{service.url}/#/jobs/{job_id}")

    page.wait_for_selector("#culprit-card.pending .culprit-running:has-text('bisecting the compiler…')")
    page.wait_for_selector("#result #downloads")  # the repro is there meanwhile
    page.wait_for_selector("#culprit-card:not(.pending) #culprit:has-text('none (the custom backend')",
                           timeout=JOB_TIMEOUT_MS)
    page.wait_for_selector("#repro-code:has-text('none: the custom backend')")  # repro.py's new header
    assert errors == []
    page.close()


@pytest.mark.parametrize("culprit", [True, False], ids=["culprit-phase-after", "nothing-else-after"])
def test_the_job_page_shows_the_originals_verdict_that_follows_the_delivered_result(
        browser: Any, service: Service, tmp_path: Path, culprit: bool) -> None:
    # The signature is given: the result goes out while the whole program's 5 s compile runs (in a
    # child of its own beside the reduction's: two at once).
    spec = {"backend": f"{PREFIX}:fail_on_relu_slowly_when_whole", "shrink": False, "culprit": culprit,
            "failure": {"signature": "RuntimeError: injected failure on relu"}, "limits": {"parallelism": 2}}
    program = save_cos_sin_relu(tmp_path)
    with service.client() as client:
        response = client.post("/v1/jobs", files={"program": (program.name, program.read_bytes())},
                               data={"spec": json.dumps(spec)}, params={"force": "true"})
        response.raise_for_status()
        job_id = response.json()["id"]
        page = browser.new_page(viewport=LAPTOP)
        errors = watch_for_errors(page)
        page.goto(f"{service.url}/#/jobs/{job_id}")
        delivered = wait_for_status(client, job_id, {"succeeded"}, timeout_s=JOB_TIMEOUT_MS / 1000)

    assert delivered["result"]["original_state"] == "running"
    page.wait_for_selector("dl.spec:has-text('confirmed: the original fails the same way')", timeout=JOB_TIMEOUT_MS)
    assert errors == []
    page.close()
