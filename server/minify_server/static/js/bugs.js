// Bugs page: succeeded jobs grouped by root-cause signature and minimal graph shape, most recently
// seen first; one bug's page lists its jobs. Polled every 5 s.

import { api, downloadWithToken, storedToken } from "./api.js";
import { formatAgo, formatClock, h, nodesText, parseTime, statusBadge as jobBadge } from "./dom.js";
import { outcomeText, searchForm } from "./jobs.js";

const PAGE_SIZE = 25;
const POLL_MS = 5000;

function reproLink(bug) {
  const name = "repro.py";
  const path = bug.repro.replace(/^\//, ""); // relative, as every API path of the dashboard
  return h("a", {
    class: "repro-link", href: path, download: name, title: `the repro of job ${bug.representative}`,
    onclick: (event) => {
      // A plain link cannot carry the Authorization header; fetch it instead.
      if (!storedToken()) return;
      event.preventDefault();
      downloadWithToken(path, name).catch(() => {});
    },
  }, "repro.py");
}

const RESOLUTION_WORDS = { fixed: "fixed", wont_fix: "won't fix", not_a_bug: "not a bug" };

function regressed(bug) {
  const last = bug.history?.[bug.history.length - 1];
  return bug.status === "open" && last?.action === "regressed" ? last : null;
}

/** "open", "regressed", "closed: won't fix" (by hand) or "fixed in 2.15.0" (a newer torch passes its repro). */
function statusBadge(bug) {
  if (bug.status === "closed") {
    const closure = bug.closure || {};
    return h("span", {
      class: "badge bug-status bug-closed", "data-state": "closed",
      title: `closed by ${closure.by || "someone"}: ${closure.reason || ""}`,
    }, `closed: ${RESOLUTION_WORDS[closure.resolution] || closure.resolution || "fixed"}`);
  }
  const fixed = bug.status === "fixed";
  const again = regressed(bug);
  return h("span", {
    class: `badge bug-status ${fixed ? "status-succeeded" : "status-failed"}`, "data-state": bug.status,
    title: again ? again.reason : bug.affected?.length ? `fails on torch ${bug.affected.join(", ")}` : "",
  }, fixed ? `fixed in ${bug.fixed_in}` : again ? "open: regressed" : "open");
}

/** One line of a bug's history: when, what, by whom, why. */
function changeItem(change) {
  const what = change.action === "closed" ? `closed (${RESOLUTION_WORDS[change.resolution] || change.resolution})`
    : change.action === "regressed" ? "reopened: regressed" : "reopened";
  return h("li", { class: `bug-change bug-change-${change.action}` },
    h("span", { class: "muted small" }, formatClock(parseTime(change.at))), " ",
    h("strong", {}, what), change.by ? ` by ${change.by}` : "", ": ", change.reason,
    change.job ? h("span", {}, " (", h("a", { href: `#/jobs/${encodeURIComponent(change.job)}` },
      `job ${change.job.slice(0, 12)}`), ")") : null);
}

function row(bug, now) {
  const lastSeen = parseTime(bug.last_seen);
  return h("tr", { class: "bug-row", "data-bug-id": bug.id },
    h("td", { "data-label": "Bug" }, h("a", { href: `#/bugs/${encodeURIComponent(bug.id)}`, class: "bug-link" },
      h("code", {}, bug.id.slice(0, 12)))),
    h("td", { "data-label": "Jobs", class: "num bug-count" }, String(bug.count)),
    h("td", { "data-label": "Last seen", title: formatClock(lastSeen), class: "bug-last-seen" }, formatAgo(lastSeen, now)),
    h("td", { "data-label": "Status" }, statusBadge(bug)),
    h("td", { "data-label": "Signature" }, h("code", { class: "bug-signature" }, bug.signature),
      h("div", { class: "muted small" }, `${bug.failure_kind || "failure"} · ${bug.backend} on ${bug.device}`)),
    h("td", { "data-label": "Repro" }, reproLink(bug),
      h("div", { class: "muted small" }, h("a", { href: `#/jobs/${encodeURIComponent(bug.representative)}` },
        `job ${bug.representative.slice(0, 12)}`))),
  );
}

function poller(refresh) {
  let stopped = false;
  let timer = 0;
  async function tick() {
    if (!document.hidden) await refresh(() => stopped);
    if (!stopped) timer = setTimeout(tick, POLL_MS);
  }
  tick();
  return () => {
    stopped = true;
    clearTimeout(timer);
  };
}

/** Render the bugs page into `root`; returns a function that stops its polling. */
export function renderBugs(root, query) {
  const offset = Math.max(0, Number.parseInt(query.get("offset") || "0", 10) || 0);
  const status = ["open", "closed", "fixed"].includes(query.get("status")) ? query.get("status") : "";
  const search = (query.get("q") || "").trim();
  const hash = (state, at, text) => {
    const params = new URLSearchParams();
    if (state) params.set("status", state);
    if (text) params.set("q", text);
    if (at) params.set("offset", String(at));
    return `#/bugs${params.toString() ? `?${params}` : ""}`;
  };
  const filters = h("div", { class: "filters", id: "bug-filters" }, [["", "All"], ["open", "Open"], ["closed", "Closed"], ["fixed", "Fixed"]].map(
    ([value, label]) => h("a", { class: `chip${value === status ? " active" : ""}`, href: hash(value, 0, search),
      "data-filter": value || "all" }, label)));
  const searchBox = searchForm("bugs-search", "signature, backend, device, id", search,
    (text) => { location.hash = hash(status, 0, text); });
  const tbody = h("tbody");
  const table = h("table", { class: "jobs bugs" },
    h("thead", {}, h("tr", {}, ["Bug", "Jobs", "Last seen", "Status", "Signature", "Repro"].map((name) =>
      h("th", { class: name === "Jobs" ? "num" : null }, name)))),
    tbody);
  const empty = h("p", { class: "empty", hidden: true },
    search ? `No bugs match “${search}”.` : status ? `No ${status} bugs.`
      : "No bugs yet: a job that succeeds files its minimal program under one.");
  const pager = h("div", { class: "pager" });
  const error = h("p", { class: "error", hidden: true });
  root.replaceChildren(h("section", { class: "page-head" }, h("h1", {}, "Bugs")),
    h("div", { class: "toolbar" }, filters, searchBox), error, h("div", { class: "table-wrap" }, table), empty, pager);
  return poller(async (stopped) => {
    try {
      const params = new URLSearchParams({ offset: String(offset), limit: String(PAGE_SIZE) });
      if (status) params.set("status", status);
      if (search) params.set("q", search);
      const list = await api(`v1/bugs?${params}`);
      if (stopped()) return;
      const now = new Date();
      tbody.replaceChildren(...list.bugs.map((bug) => row(bug, now)));
      table.hidden = list.bugs.length === 0;
      empty.hidden = list.bugs.length !== 0;
      const last = Math.min(offset + list.bugs.length, list.total);
      pager.replaceChildren(h("span", {},
        h("span", { class: "muted" }, list.total ? `${offset + 1}–${last} of ${list.total}` : ""), " ",
        offset > 0 ? h("a", { class: "button", href: hash(status, Math.max(0, offset - PAGE_SIZE), search) }, "← Newer") : null, " ",
        last < list.total ? h("a", { class: "button", href: hash(status, offset + PAGE_SIZE, search) }, "Older →") : null));
      error.hidden = true;
    } catch (failure) {
      if (stopped()) return;
      error.hidden = false;
      error.textContent = `Could not load bugs: ${failure.message}`;
    }
  });
}

const JOBS_DETAILED = 20;

function jobItem(jobId, job, representative) {
  const link = h("a", { href: `#/jobs/${encodeURIComponent(jobId)}` }, h("code", {}, jobId.slice(0, 12)));
  if (!job) return h("li", { class: "bug-job" }, link);
  const result = job.result || {};
  return h("li", { class: "bug-job", "data-job-id": jobId }, link, " ", jobBadge(job.status), " ",
    h("span", { class: "bug-job-program" }, job.program_name || ""), " ",
    h("span", { class: "muted small" }, [nodesText(result.nodes_original, result.nodes_final),
      result.culprit ? `culprit ${[result.culprit.backend, result.culprit.subsystem, result.culprit.detail].filter(Boolean).join(" / ")}` : "",
      representative ? "the representative repro" : ""].filter((part) => part && part !== "–").join(" · ")),
    job.status !== "succeeded" ? h("div", { class: "muted small" }, outcomeText(job)) : null);
}

const NAME_KEY = "minify.name";

/**
 * The close / reopen form of a bug's page: a reason (required), a resolution when closing, and a
 * name where no token is kept (a server with tokens records the token's name). Built once, so the
 * page's polling never clears what is being typed; `show(bug)` switches it to what the bug allows.
 */
function stateForm(id, onChanged) {
  const reason = h("textarea", { name: "reason", id: "bug-reason", rows: 2,
    placeholder: "why: the fix (a PR, a torch version), or why it is not a bug" });
  const resolution = h("select", { name: "resolution", id: "bug-resolution" },
    Object.entries(RESOLUTION_WORDS).map(([value, words]) => h("option", { value }, words)));
  const name = h("input", { name: "by", id: "bug-by", value: localStorage.getItem(NAME_KEY) || "",
    placeholder: "your name" });
  const rule = h("span", { class: "hint", id: "bug-rule" });
  const resolutionField = h("label", { class: "field" }, h("span", { class: "field-label" }, "Resolution"), resolution,
    rule);
  const nameField = h("label", { class: "field" }, h("span", { class: "field-label" }, "Name"), name,
    h("span", { class: "hint" }, "recorded with the reason"));
  const submit = h("button", { type: "submit", class: "primary", id: "bug-action" }, "Close bug");
  const heading = h("h3", {}, "Close this bug");
  const error = h("p", { class: "error", id: "bug-action-error", hidden: true });
  let action = "close";
  const sayRule = () => {
    rule.textContent = resolution.value === "fixed"
      ? "a job that finds it again reopens it (regressed)" : "it stays closed; jobs that find it again are counted";
  };
  resolution.addEventListener("change", sayRule);
  const form = h("form", { class: "bug-state-form", id: "bug-state-form" }, heading,
    h("label", { class: "field" }, h("span", { class: "field-label" }, "Reason"), reason),
    h("div", { class: "bug-state-row" }, resolutionField, nameField), error, h("div", { class: "actions" }, submit));
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    if (!reason.value.trim()) {
      error.hidden = false;
      error.textContent = `Say why you ${action} it: the reason is recorded with the change.`;
      return;
    }
    if (name.value.trim()) localStorage.setItem(NAME_KEY, name.value.trim());
    const body = { reason: reason.value.trim(), by: name.value.trim() || null };
    if (action === "close") body.resolution = resolution.value;
    submit.disabled = true;
    try {
      const bug = await api(`v1/bugs/${encodeURIComponent(id)}/${action}`, { method: "POST", json: body });
      reason.value = "";
      error.hidden = true;
      onChanged(bug);
    } catch (failure) {
      error.hidden = false;
      error.textContent = failure.message;
    } finally {
      submit.disabled = false;
    }
  });
  return {
    form,
    show(bug) {
      action = bug.status === "closed" ? "reopen" : "close";
      submit.textContent = action === "close" ? "Close bug" : "Reopen bug";
      heading.textContent = action === "close" ? "Close this bug" : "Reopen this bug";
      reason.placeholder = action === "close" ? "why: the fix (a PR, a torch version), or why it is not a bug"
        : "why: where it was seen again, or why the close was wrong";
      submit.dataset.action = action;
      resolutionField.hidden = action !== "close";
      nameField.hidden = Boolean(storedToken());
      sayRule();
    },
  };
}

/** One bug: what it is, its state (close, reopen, the history), its representative repro and its jobs. */
export function renderBug(root, id) {
  const details = h("dl", { class: "spec", id: "bug-details" });
  const jobs = h("ul", { class: "bug-jobs", id: "bug-jobs" });
  const history = h("ul", { class: "bug-history", id: "bug-history" });
  const stateLine = h("p", { class: "bug-state", id: "bug-status" });
  const historyHead = h("h3", {}, "History");
  const error = h("p", { class: "error", hidden: true });
  let actions = null;
  const showState = (bug) => {
    const again = regressed(bug);
    const closure = bug.closure;
    const since = bug.jobs_since_closed
      ? ` · ${bug.jobs_since_closed} job${bug.jobs_since_closed === 1 ? "" : "s"} found it since` : "";
    const evidence = bug.fixed_evidence;
    stateLine.replaceChildren(statusBadge(bug), " ", bug.status === "closed" && closure
      ? `by ${closure.by || "someone"} ${formatAgo(parseTime(closure.at))}: ${closure.reason}${since}`
      : again ? `${again.reason}.`
        : bug.status === "fixed" && evidence
          ? `${evidence.how}: job ${evidence.job.slice(0, 12)}'s repro passed on torch ${evidence.torch}`
          : "nobody has closed it");
    history.replaceChildren(...(bug.history || []).map(changeItem));
    historyHead.hidden = history.hidden = !bug.history?.length;
    actions.show(bug);
  };
  actions = stateForm(id, showState);
  root.replaceChildren(
    h("section", { class: "page-head" }, h("h1", {}, "Bug ", h("code", {}, id.slice(0, 12))),
      h("a", { href: "#/bugs", class: "button" }, "All bugs")),
    error,
    h("section", { class: "card" }, details),
    h("section", { class: "card", id: "bug-state-card" }, h("h2", {}, "State"), stateLine, historyHead, history,
      actions.form),
    h("section", { class: "card" }, h("h2", {}, "Jobs"), jobs));
  return poller(async (stopped) => {
    try {
      const bug = await api(`v1/bugs/${encodeURIComponent(id)}`);
      if (stopped()) return;
      showState(bug);
      const rows = [
        ["Signature", h("code", { class: "bug-signature" }, bug.signature)],
        ["Failure", bug.failure_kind || "–"], ["Backend", `${bug.backend} on ${bug.device}`],
        ["Jobs", String(bug.count)],
        ["Fails on", bug.affected?.length ? bug.affected.join(", ") : "–"],
        ["Tried on", Object.entries(bug.versions_tried || {}).map(([version, outcome]) => `${version}: ${outcome}`).join(", ") || "–"],
        ["First seen", formatClock(parseTime(bug.first_seen))], ["Last seen", formatClock(parseTime(bug.last_seen))],
        ["Repro", h("span", {}, reproLink(bug), " of ",
          h("a", { href: `#/jobs/${encodeURIComponent(bug.representative)}` }, `job ${bug.representative.slice(0, 12)}`))],
      ];
      details.replaceChildren(...rows.flatMap(([name, value]) => [h("dt", {}, name), h("dd", {}, value)]));
      // Each job with its program, status and size (the first JOBS_DETAILED of them; the rest by id).
      const detailed = await Promise.all(bug.job_ids.slice(0, JOBS_DETAILED).map((jobId) =>
        api(`v1/jobs/${encodeURIComponent(jobId)}`).catch(() => null)));
      if (stopped()) return;
      jobs.replaceChildren(...bug.job_ids.map((jobId, index) => jobItem(jobId, detailed[index], jobId === bug.representative)));
      error.hidden = true;
    } catch (failure) {
      if (stopped()) return;
      error.hidden = false;
      error.textContent = failure.status === 404 ? `No bug ${id}.` : `Could not load the bug: ${failure.message}`;
    }
  });
}
