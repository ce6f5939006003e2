// Job page: one job, live over its SSE stream (progress / status / log events, replayed from the
// first one), then its result: the minimized graph, repro.py, the artifacts, how to rerun. The
// culprit phase runs after the result is delivered: while the job's culprit_state is "running" the
// stream stays open and the culprit card says so, until the "culprit" event fills it in.

import { ApiError, api, downloadWithToken, storedToken, withToken } from "./api.js";
import { bisectText, bugReportMarkdown, culpritText, VERSION_OUTCOMES } from "./bugreport.js";
import { NodeChart } from "./chart.js";
import {
  FINISHED, copyButton, formatClock, formatCount, formatDuration, h, jobElapsed, nodesText, parseTime, statusBadge,
} from "./dom.js";
import { pythonBlock } from "./highlight.js";

const ARTIFACT_NAMES = ["minimized.pt2", "minimized.json", "repro.py", "inputs.pt", "report.json", "bundle.tar.gz"];
const ARTIFACT_WORDS = {
  "minimized.pt2": "the minimal graph (torch.export.load)",
  "minimized.json": "the minimal graph as minify's program.json (torch.export.save cannot write it)",
  "repro.py": "standalone script: python repro.py",
  "inputs.pt": "the inputs repro.py loads",
  "report.json": "numbers, signature, timeline",
  "bundle.tar.gz": "all of the above",
};
const OUTCOME_KINDS = ["passes", "fails", "crashed", "timed_out", "oom", "invalid"];
const OUTCOME_WORDS = {
  passes: "candidate no longer fails",
  fails: "still fails the same way",
  crashed: "child died on a signal",
  timed_out: "ran past its timeout",
  oom: "ran out of memory",
  invalid: "could not be built",
};
const LOG_LINES_KEPT = 300;
// The worker log's lines asked for (GET /v1/jobs/{id}/log?tail=), and how often while the job runs.
const WORKER_LOG_TAIL = 500;
const WORKER_LOG_REFRESH_MS = 5000;

// How often the page asks again about a job that waits in its queue (its warnings change).
const QUEUED_REFRESH_MS = 5000;
// How often the page asks about a culprit phase still running when the stream is gone.
const CULPRIT_REFRESH_MS = 2000;
const RECONNECT_MS = 2000;

function plural(count, noun) {
  return `${formatCount(count)} ${noun}${count === 1 ? "" : "s"}`;
}

function stat(label, valueElement, note) {
  return h("div", { class: "stat" }, h("div", { class: "stat-label" }, label), valueElement, note);
}

function reasonText(job, lastMessage) {
  const result = job.result || {};
  let given = (job.reason || result.reason || lastMessage || "").trim();
  // A reason that only repeats the status ("cancelled") says nothing the sentence below does not.
  if (given.replace(/[._\s]/g, "").toLowerCase() === job.status.replace(/_/g, "")) given = "";
  const reason = given ? `${given[0].toUpperCase()}${given.slice(1)}${/[.!?]$/.test(given) ? "" : "."}` : "";
  const failure = job.spec?.failure || {};
  const wanted = `${failure.kind || "any"}${failure.match ? ` matching /${failure.match}/` : ""}`;
  switch (job.status) {
    case "not_reproducible": {
      let text = reason
        ? `${reason} There was nothing to minimize.`
        : `The original program did not fail the way this job asks (${wanted}), so there was nothing to minimize.`;
      if (result.flaky) text += ` It is flaky: it failed in ${result.original_failures} of ${result.original_runs} runs.`;
      // What to try next: the worker's own words fit what the original did (the card below); a
      // report without them gets the usual cause (the spec: a setting, a device or a backend).
      if (!result.next_step) {
        text += " Next: check that the spec (backend, device, config, failure kind) is the one it failed with, " +
          "and run the program where it failed with those settings to see what it does.";
      }
      return text;
    }
    case "failed":
      return `The minifier could not finish this job. ${reason}`.trim();
    case "cancelled":
      return `This job was cancelled before it finished. ${reason}`.trim();
    default:
      return "";
  }
}

/** Render job `id` into `root`; returns a function that closes its stream and timers. */
export function renderJob(root, id) {
  const base = `v1/jobs/${encodeURIComponent(id)}`;
  let job = null;
  let source = null;
  let stopped = false;
  let reconnectTimer = 0;
  let culpritTimer = 0;
  let finishedShown = false;
  let lastMessage = "";
  let lastGraphCode = "";
  let lastSpecShown = "";
  const live = { elapsed: 0, at: performance.now(), running: false };
  const progress = {
    phase: "", nodes_original: null, nodes_current: null, checks_total: 0, checks_cached: 0,
    checks_in_flight: 0, outcomes: {}, signature: null,
  };

  // --- the page skeleton; the functions below fill it in ---------------------------------------
  const title = h("h1", {}, "Job ", h("code", {}, id));
  const badgeSlot = h("span", { id: "job-status" });
  const program = h("span", { class: "muted" });
  const cancelButton = h("button", { type: "button", class: "danger", id: "cancel-job", hidden: true }, "Cancel job");
  const reason = h("p", { class: "reason", id: "job-reason", hidden: true });
  // Why a queued job is not running (the server's words: "no worker has served the cuda queue for ...").
  const warnings = h("p", { class: "reason", id: "job-warnings", hidden: true });
  const error = h("p", { class: "error", hidden: true });

  const nodesValue = h("div", { class: "stat-value", id: "stat-nodes" }, "–");
  const checksValue = h("div", { class: "stat-value", id: "stat-checks" }, "0");
  const checksNote = h("div", { class: "stat-note" });
  const elapsedValue = h("div", { class: "stat-value", id: "stat-elapsed" }, "–");
  const elapsedNote = h("div", { class: "stat-note" });
  const phaseValue = h("div", { class: "stat-value phase", id: "stat-phase" }, "–");
  const phaseNote = h("div", { class: "stat-note" });

  const chartBox = h("div", { class: "chart-box", id: "chart" });
  const outcomesList = h("div", { class: "outcomes", id: "outcomes" });
  const signatureBlock = h("pre", { class: "code signature", id: "signature" }, "not known yet");
  const specList = h("dl", { class: "spec", id: "job-facts" });
  const failureHeading = h("h2", {}, "Failure being preserved");

  const resultSection = h("section", { class: "card", id: "result", hidden: true });
  // One button for the page's life: the result card is drawn anew whenever a later phase ends, and
  // a click's "Copied" must land on the button the user sees, not on one the redraw took away.
  let reproText = Promise.resolve(null);
  const bugReport = copyButton(async () => bugReportMarkdown(job, await reproText.catch(() => null)), "Copy as bug report");
  bugReport.id = "copy-bug-report";
  bugReport.title = "the signature, repro.py and the environment as one Markdown block, for a PyTorch issue";
  const environmentList = h("dl", { class: "spec", id: "environment" });
  const environmentCard = h("section", { class: "card", id: "environment-card", hidden: true },
    h("div", { class: "card-head" }, h("h2", {}, "Environment"),
      h("span", { class: "muted small" }, "the worker's, as torch.utils.collect_env reports it")),
    environmentList);
  const culpritList = h("dl", { class: "spec", id: "culprit" });
  const culpritCard = h("section", { class: "card", id: "culprit-card", hidden: true },
    h("div", { class: "card-head" }, h("h2", {}, "Culprit and workarounds"),
      h("span", { class: "muted small" },
        "torch's compiler bisector on the minimal program; settings verified on the original")),
    culpritList);
  const versionsSummary = h("p", { class: "versions-summary", id: "versions-summary" });
  const versionsRow = h("div", { class: "versions", id: "versions" });
  const bisectLine = h("p", { class: "bisect", id: "bisect", hidden: true });
  const versionsCard = h("section", { class: "card", id: "versions-card", hidden: true },
    h("div", { class: "card-head" }, h("h2", {}, "Torch versions"),
      h("span", { class: "muted small" }, "repro.py under every torch version the workers offer")),
    versionsRow, versionsSummary, bisectLine);
  const graphHeading = h("h2", {}, "Current best graph");
  const graphNote = h("span", { class: "muted small" });
  const graphSlot = h("div", { id: "graph-code" }, h("p", { class: "muted" }, "The graph appears here once the engine reports it."));
  const logList = h("pre", { class: "log", id: "log" });
  const progressCard = h("section", { class: "card", id: "progress-card" },
    h("div", { class: "card-head" }, h("h2", {}, "Progress"),
      h("span", { class: "legend" }, h("span", { class: "key key-nodes" }), "nodes in the best failing candidate",
        h("span", { class: "key key-checks" }), "checks run")),
    chartBox);
  const outcomesCard = h("section", { class: "card", id: "outcomes-card" }, h("h2", {}, "Candidate outcomes"), outcomesList);
  const graphCard = h("section", { class: "card", id: "graph-card" },
    h("div", { class: "card-head" }, graphHeading, graphNote), graphSlot);
  const logCount = h("span", { class: "muted small" });
  const nextStep = h("p", { class: "next-step", id: "next-step" });
  const originalOutput = h("pre", { class: "log", id: "original-output" });
  const originalCard = h("section", { class: "card", id: "original-card", hidden: true },
    h("div", { class: "card-head" }, h("h2", {}, "The original in the worker"),
      h("span", { class: "muted small" }, "what it printed (stdout and stderr, the last lines) and raised")),
    originalOutput, nextStep);
  const workerLog = h("pre", { class: "log", id: "worker-log" });
  const workerLogNote = h("span", { class: "muted small", id: "worker-log-note" });
  const workerLogCard = h("details", { class: "card", id: "worker-log-card" },
    h("summary", {}, h("h2", {}, "Worker log"), workerLogNote), workerLog);

  const stats = h("div", { class: "stats", id: "stats" },
    stat("Nodes", nodesValue),
    stat("Checks", checksValue, checksNote),
    stat("Elapsed", elapsedValue, elapsedNote),
    stat("Phase", phaseValue, phaseNote));
  // What the job found leads (the result, its culprit, the minimal graph); how it got there (the
  // chart, the outcomes), the spec and the environment follow.
  root.replaceChildren(
    h("section", { class: "page-head" },
      h("a", { href: "#/jobs", class: "back" }, "← Jobs"), title, badgeSlot, program, h("span", { class: "grow" }), cancelButton),
    error, reason, warnings, originalCard,
    stats,
    resultSection,
    versionsCard,
    culpritCard,
    graphCard,
    progressCard,
    h("div", { class: "columns" },
      outcomesCard,
      h("section", { class: "card" }, failureHeading, signatureBlock, specList)),
    environmentCard,
    h("details", { class: "card" }, h("summary", {}, h("h2", {}, "Log"), logCount), logList),
    workerLogCard,
  );
  const chart = new NodeChart(chartBox);

  // --- rendering ---------------------------------------------------------------------------------
  function renderHeader() {
    badgeSlot.replaceChildren(statusBadge(job.status));
    program.textContent = job.program_name || "";
    cancelButton.hidden = FINISHED.has(job.status);
    const text = reasonText(job, lastMessage);
    reason.hidden = !text;
    reason.textContent = text;
    reason.dataset.status = job.status;
    renderOriginal();
    const notes = job.status === "queued" ? (job.warnings || []) : [];
    warnings.hidden = !notes.length;
    warnings.textContent = notes.map((note) => `${note[0].toUpperCase()}${note.slice(1)}.`).join(" ");
  }

  /** A not reproducible job: what the original printed and raised in the worker, and what to try next. */
  function renderOriginal() {
    const result = job.result || {};
    originalCard.hidden = job.status !== "not_reproducible" || result.original_output == null;
    if (originalCard.hidden) return;
    originalOutput.textContent = result.original_output.trim() || "(nothing: it printed nothing and raised nothing)";
    originalOutput.classList.toggle("empty-output", !result.original_output.trim());
    // The flags as code, each kept on one line.
    const words = result.next_step ? `${result.next_step[0].toUpperCase()}${result.next_step.slice(1)}.`
      : "Check the spec it ran with.";
    nextStep.replaceChildren(h("strong", {}, "Next: "), ...words.split(/(--[a-z-]+(?: [A-Z]+)?)/)
      .map((part, index) => (index % 2 ? h("code", { class: "flag" }, part) : part)));
  }

  /** The job's own log (GET /v1/jobs/{id}/log), asked for when the card is opened, and again while the job runs. */
  let workerLogTimer = 0;
  async function loadWorkerLog() {
    clearTimeout(workerLogTimer);
    if (stopped || !workerLogCard.open) return;
    try {
      const found = await api(`${base}/log?tail=${WORKER_LOG_TAIL}`);
      workerLog.textContent = found.lines.length ? found.lines.join("\n")
        : job?.status === "queued" ? "Nothing yet: no worker has taken the job." : "Nothing logged.";
      workerLogNote.textContent = `${plural(found.lines.length, "line")}${found.more ? ` (the last ${WORKER_LOG_TAIL})` : ""}`;
    } catch (failure) {
      workerLog.textContent = `Could not load the worker log: ${failure.message}`;
    }
    if (job && !FINISHED.has(job.status) && !stopped) workerLogTimer = setTimeout(loadWorkerLog, WORKER_LOG_REFRESH_MS);
  }
  workerLogCard.addEventListener("toggle", loadWorkerLog);

  function renderSpec() {
    const spec = job.spec || {};
    const failure = spec.failure || {};
    const rows = [
      ["Backend", spec.backend], ["Device", spec.device],
      ["Failure", `${failure.kind || "any"}${failure.match ? ` /${failure.match}/` : ""}`],
      ["Config", Object.keys(spec.config || {}).length
        ? Object.entries(spec.config).map(([key, value]) => `${key}=${JSON.stringify(value)}`).join("\n") : "none"],
      ["Submitted", formatClock(parseTime(job.created_at))],
      ["Worker", job.worker || "–"],
    ];
    if (job.bug) rows.push(["Bug", h("a", { href: `#/bugs/${encodeURIComponent(job.bug)}`, id: "job-bug" }, h("code", {}, job.bug))]);
    const result = job.result;
    if (result?.torch_version) rows.push(["Torch", result.torch_version]);
    if (result?.candidate_timeout_s) rows.push(["Candidate timeout", formatDuration(result.candidate_timeout_s)]);
    if (result?.original_runs) rows.push(["Original runs", `${result.original_failures} of ${result.original_runs} failed`]);
    if (result?.original_state) rows.push(["Original's verdict", originalText(result)]);
    const inputs = inputShapesText(result);
    if (inputs) rows.push(["Inputs", inputs]);
    const phases = Object.entries(result?.phase_s || {});
    if (phases.length) rows.push(["Time by phase", phases.map(([name, seconds]) => `${name} ${formatDuration(seconds)}`).join(" · ")]);
    if (result?.sandbox_start) {
      rows.push(["Sandbox", result.sandbox_start === "fork" ? "forked from the warm worker" : "started a fresh Python"]);
    }
    // Rebuilt only when something in it changed: a job's every update re-rendered it, and a click
    // on its bug link that landed while the link was being replaced went nowhere.
    const shown = JSON.stringify(rows.map(([name, value]) =>
      [name, value instanceof Node ? [value.textContent, value.getAttribute?.("href")] : value ?? "–"]));
    if (shown === lastSpecShown) return;
    lastSpecShown = shown;
    specList.replaceChildren(...rows.flatMap(([name, value]) => [h("dt", {}, name), h("dd", {}, value ?? "–")]));
  }

  /** report.json's original_state: the verdict may follow the delivered result, or contradict it (the result is kept). */
  function originalText(result) {
    if (result.original_state === "running") return "running: it follows the delivered result";
    if (result.original_state === "confirmed") return "confirmed: the original fails the same way";
    const state = result.original_state.replace("_", " ");
    return `${state}${result.original_verdict ? `: ${result.original_verdict}` : ""}` +
      (job.status === "succeeded" ? " (the result is kept)" : "");
  }

  /** "x: float32 [256, 128] → [1, 1]" a line per tensor input: its sizes before and after the shrink phase. */
  function inputShapesText(result) {
    const final = Object.entries(result?.input_shapes_final || {});
    const shape = (entry) => `[${entry.shape.join(", ")}]`;
    return final.map(([name, after]) => {
      const before = result.input_shapes_original?.[name];
      const shrunk = before && shape(before) !== shape(after) ? `${shape(before)} → ` : "";
      return `${name}: ${after.dtype} ${shrunk}${shape(after)}`;
    }).join("\n");
  }

  function renderEnvironment() {
    const rows = Object.entries(job.result?.environment || {});
    environmentCard.hidden = !rows.length;
    environmentList.replaceChildren(...rows.flatMap(([name, value]) => [h("dt", {}, name), h("dd", {}, value)]));
  }

  /** The culprit phase's finding (report.json's culprit, culprit_reason, workarounds), once the job has a result. */
  function renderCulprit() {
    const result = job.result;
    // The culprit phase follows a delivered result: a job that delivered none has no culprit to tell.
    culpritCard.hidden = !result || job.status !== "succeeded" || (!result.culprit && !result.culprit_reason);
    if (culpritCard.hidden) return;
    const running = culpritRunning();
    culpritCard.classList.toggle("pending", running);
    if (running) {
      culpritList.replaceChildren(h("dt", {}, "Culprit"), h("dd", { class: "culprit-running" },
        "bisecting the compiler… (the repro above is ready; this fills in when the phase ends)"));
      return;
    }
    const rows = [["Culprit", culpritText(result.culprit, result.culprit_reason)]];
    if (result.culprit?.probes) rows.push(["Probes", `${result.culprit.probes}, each in its own process`]);
    for (const note of result.culprit?.notes || []) rows.push(["Probe", note]);
    const workarounds = result.workarounds || [];
    rows.push(["Workarounds", workarounds.length
      ? workarounds.map((w) => `${w.setting} = ${JSON.stringify(w.value)}  (${w.verified_on})`).join("\n")
      : "none verified"]);
    const tried = Object.entries(result.workarounds_tried || {});
    if (tried.length) rows.push(["Also tried", tried.map(([setting, what]) => `${setting}: ${what}`).join("\n")]);
    culpritList.replaceChildren(...rows.flatMap(([name, value]) => [h("dt", {}, name), h("dd", {}, value)]));
  }

  /** The version phase's runs as a row of badges (report.json's versions), and its summary line. */
  function renderVersions() {
    const result = job.result;
    // With one torch on the workers there is no range to tell: the card says nothing then.
    const versionsTried = new Set((result?.versions || []).map((run) => run.torch)).size;
    versionsCard.hidden = !result?.bisect && (!result?.versions_state ||
      (result.versions_state !== "running" && versionsTried < 2));
    if (versionsCard.hidden) return;
    bisectLine.hidden = !result.bisect;
    if (result.bisect) bisectLine.textContent = `Bisect ${result.bisect.good}..${result.bisect.bad}: ${bisectText(result.bisect)}`;
    const running = result.versions_state === "running";
    versionsCard.classList.toggle("pending", running);
    versionsRow.replaceChildren(...(result.versions || []).map((run) => h("span", {
      class: `badge version version-${run.outcome}`,
      title: [run.git_version && `git ${run.git_version}`, run.signature, run.reason,
        run.seconds ? `${run.seconds} s` : ""].filter(Boolean).join("\n"),
    }, `${run.torch} ${VERSION_OUTCOMES[run.outcome] || run.outcome}`)));
    versionsSummary.textContent = running
      ? "running repro.py under the other torch versions… (the repro above is ready)"
      : result.versions_summary || result.versions_state;
  }

  function phaseRunning() {
    return culpritRunning() || job?.result?.versions_state === "running" || job?.result?.bisect?.state === "running" ||
      job?.result?.original_state === "running";
  }

  function culpritRunning() {
    return (job?.culprit_state || job?.result?.culprit_state) === "running";
  }

  /** The culprit phase ended (its event, or a poll saw it): the card, the repro.py header and the bug report change. */
  async function culpritEnded() {
    clearTimeout(culpritTimer);
    closeStream();
    try {
      await loadJob();
    } catch (failure) {
      showError(failure);
      return;
    }
    renderResult();
  }

  /** Without a stream, ask about a culprit phase still running until it ends. */
  function pollCulprit() {
    clearTimeout(culpritTimer);
    culpritTimer = setTimeout(async () => {
      if (stopped) return;
      try {
        await loadJob();
      } catch {
        // the server is away: ask again below
      }
      if (phaseRunning()) pollCulprit();
      else renderResult();
    }, CULPRIT_REFRESH_MS);
  }

  function renderProgress() {
    nodesValue.textContent = nodesText(progress.nodes_original, progress.nodes_current);
    nodesValue.dataset.current = progress.nodes_current ?? "";
    checksValue.textContent = formatCount(progress.checks_total);
    checksValue.dataset.total = String(progress.checks_total);
    checksNote.textContent = `${formatCount(progress.checks_cached)} cached · ${formatCount(progress.checks_in_flight)} in flight`;
    phaseValue.textContent = progress.phase || (job?.status === "queued" ? "waiting for a worker" : "–");
    phaseNote.textContent = job && FINISHED.has(job.status) && progress.phase ? "the last phase" : "";
    if (progress.signature) {
      // The root cause first; the wrappers it came through (outermost first) below it.
      const chain = progress.signature_chain || [];
      signatureBlock.textContent = progress.signature +
        (chain.length > 1 ? `\n\nexception chain, outermost first:\n${chain.map((link) => `  ${link}`).join("\n")}` : "");
    }
    const counts = { ...progress.outcomes };
    const kinds = [...OUTCOME_KINDS, ...Object.keys(counts).filter((kind) => !OUTCOME_KINDS.includes(kind))];
    const largest = Math.max(1, ...kinds.map((kind) => counts[kind] || 0));
    outcomesList.replaceChildren(...kinds.map((kind) => {
      const count = counts[kind] || 0;
      return h("div", { class: `outcome outcome-${kind}`, "data-kind": kind, title: OUTCOME_WORDS[kind] || kind },
        h("span", { class: "outcome-name" }, kind.replace("_", " ")),
        h("span", { class: "outcome-bar" }, h("span", { style: `width:${(100 * count) / largest}%` })),
        h("span", { class: "outcome-count" }, formatCount(count)));
    }));
    chart.setOriginal(progress.nodes_original);
    // A job that ended before its first candidate (not reproducible, cancelled while queued) has
    // no progress to show; its reason says why.
    // A job that found nothing to minimize (not reproducible) shows no candidates either: the few
    // that ran beside the original's runs were cancelled when its verdict came.
    const nothingRan = Boolean(job && FINISHED.has(job.status)) && (!progress.checks_total || job.status === "not_reproducible");
    progressCard.hidden = nothingRan;
    outcomesCard.hidden = nothingRan;
    stats.hidden = job?.status === "not_reproducible";
    graphCard.hidden = nothingRan && !lastGraphCode;
    if (job && FINISHED.has(job.status) && !lastGraphCode) {
      graphSlot.replaceChildren(h("p", { class: "muted" }, "No graph: the job ended before the engine reported one."));
    }
    // Nothing was preserved of a job the original did not reproduce: what it asked for, and how it ran.
    failureHeading.textContent = job?.status === "not_reproducible" ? "What the job asked for" : "Failure being preserved";
    signatureBlock.hidden = job?.status === "not_reproducible";
    if (!progress.signature && job?.status === "not_reproducible") {
      signatureBlock.textContent = "none: the original program did not fail";
    } else if (!progress.signature && job && FINISHED.has(job.status)) {
      signatureBlock.textContent = "none recorded: the job ended before the original program failed";
    }
  }

  function renderElapsed() {
    let seconds = live.running ? live.elapsed + (performance.now() - live.at) / 1000 : live.elapsed;
    if (live.running && !live.elapsed && job?.started_at) {
      // No progress event yet: count from the start the server recorded.
      seconds = Math.max(0, (Date.now() - parseTime(job.started_at)) / 1000);
    }
    elapsedValue.textContent = job?.status === "queued" ? "–" : formatDuration(seconds);
    const started = parseTime(job?.started_at);
    elapsedNote.textContent = started ? `started ${started.toLocaleTimeString()}` : "";
  }

  function showGraph(code, finished) {
    graphHeading.textContent = finished ? "Minimized graph" : "Current best graph";
    if (!code || code === lastGraphCode) return;
    lastGraphCode = code;
    graphSlot.replaceChildren(pythonBlock(code, { "data-nodes": String(progress.nodes_current ?? "") }));
    graphNote.textContent = progress.nodes_current != null ? plural(progress.nodes_current, "node") : "";
  }

  function appendLog(line) {
    const lines = logList.textContent ? logList.textContent.split("\n") : [];
    lines.push(line);
    logList.textContent = lines.slice(-LOG_LINES_KEPT).join("\n");
    logCount.textContent = `${lines.length > LOG_LINES_KEPT ? `last ${LOG_LINES_KEPT}` : lines.length} lines`;
  }

  // --- the event stream ----------------------------------------------------------------------------
  function applyEvent(event) {
    if (event.nodes_original != null) progress.nodes_original = event.nodes_original;
    if (event.nodes_current != null) progress.nodes_current = event.nodes_current;
    if (event.signature) progress.signature = event.signature;
    if (event.type === "progress") {
      for (const key of ["phase", "checks_total", "checks_cached", "checks_in_flight"]) progress[key] = event[key];
      progress.outcomes = event.outcomes || {};
      live.elapsed = event.elapsed_s || live.elapsed;
      live.at = performance.now();
      chart.add(event.elapsed_s || 0, progress.nodes_current, progress.checks_total);
    }
    if (event.graph_code) showGraph(event.graph_code, false);
    if (event.type === "log" && event.message) appendLog(event.message);
    if ((event.milestone === "original_confirmed" || event.milestone === "original_not_reproduced") && job?.result) {
      // The original's verdict after the delivered result: the record's result has it now.
      loadJob().catch(() => {});
    }
    if (event.type === "versions") {
      if (event.message) appendLog(`[versions] ${event.message}`);
      return;
    }
    if (event.type === "culprit") {
      if (event.message) appendLog(`[culprit ${event.culprit_state}] ${event.message}`);
      if (event.culprit_state !== "running") culpritEnded();
      return;
    }
    if (event.type === "status" && event.status) {
      if (event.message) {
        lastMessage = event.message;
        appendLog(`[${event.status}] ${event.message}`);
      }
      if (job && job.status !== event.status) {
        job.status = event.status;
        live.running = event.status === "running";
        renderHeader();
        // The start time and the worker come with the status; the event does not carry them.
        if (!FINISHED.has(event.status)) loadJob().catch(() => {});
      }
      if (FINISHED.has(event.status)) {
        // A succeeded job whose culprit phase follows keeps its stream open for the "culprit" event.
        if (event.culprit_state !== "running") closeStream();
        if (job && event.culprit_state) job.culprit_state = event.culprit_state;
        finish();
      }
    }
    renderProgress();
  }

  function openStream() {
    if (stopped) return;
    chart.clear(); // the stream replays from the first event
    logList.textContent = "";
    source = new EventSource(withToken(`${base}/events`));
    const onMessage = (message) => {
      try {
        applyEvent(JSON.parse(message.data));
      } catch (failure) {
        console.error("bad event", message.data, failure);
      }
    };
    for (const type of ["progress", "status", "log", "culprit", "versions", "message"]) source.addEventListener(type, onMessage);
    // The server ends the stream when the job ends; EventSource would reconnect and replay it all.
    source.addEventListener("error", async () => {
      closeStream();
      if (stopped) return;
      if (finishedShown) {
        if (phaseRunning()) pollCulprit();
        return;
      }
      try {
        await loadJob();
      } catch {
        // the server is away: try the stream again below
      }
      if (job && FINISHED.has(job.status)) {
        await finish();
        if (phaseRunning()) pollCulprit();
      } else reconnectTimer = setTimeout(openStream, RECONNECT_MS);
    });
  }

  function closeStream() {
    if (source) source.close();
    source = null;
  }

  async function loadJob() {
    const fresh = await api(base);
    // The stream may have told of the end before this answer was written; the end stands.
    if (job && FINISHED.has(job.status) && !FINISHED.has(fresh.status)) fresh.status = job.status;
    job = fresh;
    live.running = job.status === "running";
    if (!live.running) {
      live.elapsed = jobElapsed(job) || live.elapsed;
    } else if ((job.progress?.elapsed_s || 0) > live.elapsed) {
      live.elapsed = job.progress.elapsed_s;
      live.at = performance.now();
    }
    for (const [key, value] of Object.entries(job.progress || {})) {
      if (value !== null && value !== undefined && value !== "" && progress[key] !== undefined && !progress[key]) {
        progress[key] = value;
      }
    }
    renderHeader();
    renderSpec();
    renderEnvironment();
    renderCulprit();
    renderVersions();
    renderProgress();
    renderElapsed();
  }

  // --- the result ----------------------------------------------------------------------------------
  async function finish() {
    if (finishedShown || stopped) return;
    finishedShown = true;
    try {
      await loadJob();
    } catch (failure) {
      showError(failure);
      return;
    }
    live.running = false;
    const result = job.result || {};
    if (result.nodes_final != null) progress.nodes_current = result.nodes_final;
    if (result.nodes_original != null) progress.nodes_original = result.nodes_original;
    if (result.signature) progress.signature = result.signature;
    if (result.signature_chain?.length) progress.signature_chain = result.signature_chain;
    if (result.checks_total) {
      progress.checks_total = result.checks_total;
      progress.checks_cached = result.checks_cached;
    }
    progress.checks_in_flight = 0;
    if (result.outcomes && Object.keys(result.outcomes).length) progress.outcomes = result.outcomes;
    if (result.elapsed_s) live.elapsed = result.elapsed_s;
    if (chart.points.length < 2 && result.timeline?.length) {
      chart.clear();
      for (const point of result.timeline) chart.add(point.elapsed_s, point.nodes, point.checks);
    }
    const last = chart.points[chart.points.length - 1];
    if (progress.nodes_current != null && (!last || last.nodes !== progress.nodes_current)) {
      chart.add(live.elapsed, progress.nodes_current, progress.checks_total);
    }
    renderProgress();
    renderElapsed();
    showGraph(result.graph_code || lastGraphCode, job.status === "succeeded");
    renderResult();
    loadWorkerLog();
    // A stream that ended at the status (no culprit phase follows) tells nothing of what still runs.
    if (!source && phaseRunning()) pollCulprit();
  }

  function artifactNames() {
    const listed = job.result?.artifacts?.length ? job.result.artifacts : Object.keys(job.links?.artifacts || {});
    const rank = (name) => (ARTIFACT_NAMES.includes(name) ? ARTIFACT_NAMES.indexOf(name) : ARTIFACT_NAMES.length);
    if (listed.length) return [...listed].sort((a, b) => rank(a) - rank(b) || a.localeCompare(b));
    return job.status === "succeeded" ? ARTIFACT_NAMES : [];
  }

  function downloadLink(name) {
    const path = `${base}/artifacts/${encodeURIComponent(name)}`;
    return h("a", {
      class: "button download", href: path, download: name, "data-artifact": name, title: ARTIFACT_WORDS[name] || name,
      onclick: (event) => {
        // A plain link cannot carry the Authorization header; fetch it instead.
        if (!storedToken()) return;
        event.preventDefault();
        downloadWithToken(path, name).catch(showError);
      },
    }, h("span", { class: "download-name" }, name), h("span", { class: "download-note" }, ARTIFACT_WORDS[name] || ""));
  }

  function command(text) {
    return h("div", { class: "command" }, h("code", {}, text), copyButton(text));
  }

  async function renderResult() {
    const result = job.result || {};
    const names = artifactNames();
    const repro = names.includes("repro.py")
      ? api(`${base}/artifacts/repro.py`, { raw: true }).then((response) => response.text()) : Promise.resolve(null);
    repro.catch(() => {}); // not unhandled: the repro.py slot below shows the error
    reproText = repro;
    // A job that delivered no result still has its report to download.
    const heading = job.status === "succeeded" ? "Result" : "Report";
    const parts = [h("div", { class: "card-head" }, h("h2", {}, heading), result.signature ? bugReport : null)];
    if (job.status === "succeeded") {
      parts.push(h("p", { class: "summary", id: "result-summary" },
        `Minimized from ${formatCount(result.nodes_original ?? progress.nodes_original)} to `,
        h("strong", {}, plural(result.nodes_final ?? progress.nodes_current, "node")),
        ` in ${formatDuration(result.elapsed_s || live.elapsed)} with ${plural(result.checks_total || progress.checks_total, "check")}`,
        ` (${formatCount(result.checks_cached || progress.checks_cached)} answered from the cache).`));
      // The client's default server; name this one when it is elsewhere.
      const server = location.origin === "http://127.0.0.1:8000" ? "" : ` --server ${location.origin}`;
      parts.push(h("h3", {}, "Run it again"),
        command(`minify-client download ${job.id}${server}`),
        command(`cd minify-${job.id} && python repro.py`));
    }
    if (job.status !== "succeeded" && !names.length) return;
    if (names.length) {
      parts.push(h("h3", {}, "Artifacts"), h("div", { class: "downloads", id: "downloads" }, names.map(downloadLink)));
    }
    const reproSlot = h("div", { id: "repro" });
    if (names.includes("repro.py")) parts.push(h("div", { class: "card-head" }, h("h3", {}, "repro.py")), reproSlot);
    resultSection.replaceChildren(...parts);
    resultSection.hidden = false;
    if (!names.includes("repro.py")) return;
    reproSlot.append(h("p", { class: "muted" }, "loading repro.py…"));
    try {
      const source = await repro;
      reproSlot.replaceChildren(h("div", { class: "code-tools" }, copyButton(source, "Copy repro.py")),
        pythonBlock(source, { id: "repro-code" }));
    } catch (failure) {
      reproSlot.replaceChildren(h("p", { class: "error" }, `Could not load repro.py: ${failure.message}`));
    }
  }

  // --- cancel --------------------------------------------------------------------------------------
  let confirmTimer = 0;
  cancelButton.addEventListener("click", async () => {
    if (!cancelButton.classList.contains("confirming")) {
      cancelButton.classList.add("confirming");
      cancelButton.textContent = "Click again to cancel";
      confirmTimer = setTimeout(() => {
        cancelButton.classList.remove("confirming");
        cancelButton.textContent = "Cancel job";
      }, 4000);
      return;
    }
    clearTimeout(confirmTimer);
    cancelButton.disabled = true;
    cancelButton.textContent = "Cancelling…";
    try {
      await api(base, { method: "DELETE" });
      await loadJob();
      if (FINISHED.has(job.status)) finish();
    } catch (failure) {
      showError(failure);
    } finally {
      cancelButton.disabled = false;
      cancelButton.classList.remove("confirming");
      cancelButton.textContent = "Cancel job";
    }
  });

  function showError(failure) {
    error.hidden = false;
    error.textContent = failure instanceof ApiError && failure.status === 404 ? `There is no job ${id}.` : failure.message;
  }

  // --- start ---------------------------------------------------------------------------------------
  const ticker = setInterval(renderElapsed, 1000);
  // A queued job's warnings ("no worker has served the cuda queue for 40 s") are the server's
  // words when asked: ask again while the job waits, so they stay true (the stream is quiet then).
  const queuedRefresh = setInterval(() => {
    if (job && job.status === "queued" && !stopped) loadJob().catch(() => {});
  }, QUEUED_REFRESH_MS);
  loadJob().then(openStream, showError);

  return () => {
    stopped = true;
    clearInterval(ticker);
    clearInterval(queuedRefresh);
    clearTimeout(reconnectTimer);
    clearTimeout(culpritTimer);
    clearTimeout(confirmTimer);
    clearTimeout(workerLogTimer);
    closeStream();
    chart.destroy();
  };
}
