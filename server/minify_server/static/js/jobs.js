// Jobs page: every job, newest first, paginated, filtered by status; polled every 2 s.

import { api } from "./api.js";
import {
  FINISHED, STATES, formatAgo, formatClock, formatCount, formatDuration, h, jobElapsed, nodesText, parseTime, statusBadge,
} from "./dom.js";

const PAGE_SIZE = 25;
const POLL_MS = 2000;

function jobsHash(status, offset, search = "") {
  const query = new URLSearchParams();
  if (status) query.set("status", status);
  if (search) query.set("q", search);
  if (offset) query.set("offset", String(offset));
  const text = query.toString();
  return `#/jobs${text ? `?${text}` : ""}`;
}

function row(job, now) {
  const progress = job.progress || {};
  const result = job.result || {};
  const original = progress.nodes_original ?? result.nodes_original;
  const current = result.nodes_final ?? progress.nodes_current;
  const created = parseTime(job.created_at);
  const checks = progress.checks_total || result.checks_total || 0;
  const cached = progress.checks_cached || result.checks_cached || 0;
  const href = `#/jobs/${encodeURIComponent(job.id)}`;
  return h("tr", { class: "job-row", "data-job-id": job.id, "data-status": job.status },
    h("td", { "data-label": "Job" },
      h("a", { href, class: "job-link" }, h("code", {}, job.id.slice(0, 12))),
      job.program_name ? h("div", { class: "muted small" }, job.program_name) : null),
    h("td", { "data-label": "Status" }, statusBadge(job.status),
      job.status === "running" && progress.phase ? h("div", { class: "muted small" }, progress.phase) : null),
    h("td", { "data-label": "Backend" }, h("span", { class: "mono" }, ...breakable(job.spec?.backend ?? "–")),
      h("div", { class: "muted small" }, job.spec?.device ?? "")),
    h("td", { "data-label": "Nodes", class: "num nodes" }, nodesText(original, current)),
    h("td", { "data-label": "Checks", class: "num" }, formatCount(checks),
      cached ? h("div", { class: "muted small" }, `${formatCount(cached)} cached`) : null),
    h("td", { "data-label": "Elapsed", class: "num" }, formatDuration(jobElapsed(job, now))),
    h("td", { "data-label": "Submitted", title: formatClock(created) }, formatAgo(created, now)),
    h("td", { "data-label": "Found", class: "job-outcome" }, outcomeText(job)),
  );
}

/** What a finished job found (its signature) or why it did not (its reason), on one line. */
export function outcomeText(job) {
  const result = job.result || {};
  const text = job.status === "succeeded" ? result.signature : FINISHED.has(job.status) ? (job.reason || result.reason) : "";
  return h("span", { class: `outcome-text${job.status === "succeeded" ? " mono" : ""}`, title: text || "" }, text || "");
}

/** A search box that calls `go(text)` when submitted (Enter); the server does the matching. */
/** `text` with a line-break opportunity after each dot and colon: a module path wraps at its parts. */
function breakable(text) {
  return text.split(/(?<=[.:])/).flatMap((part, index) => (index ? [h("wbr"), part] : [part]));
}

export function searchForm(id, placeholder, value, go) {
  const input = h("input", { type: "search", id, name: "q", value, placeholder: `Search: ${placeholder}`, "aria-label": "search" });
  return h("form", { class: "search", role: "search", onsubmit: (event) => { event.preventDefault(); go(input.value.trim()); } },
    input);
}

/** Render the jobs page into `root`; returns a function that stops its polling. */
export function renderJobs(root, query) {
  const status = STATES.includes(query.get("status")) ? query.get("status") : "";
  const offset = Math.max(0, Number.parseInt(query.get("offset") || "0", 10) || 0);
  const search = (query.get("q") || "").trim();

  const filters = h("div", { class: "filters", role: "group", "aria-label": "filter by status" },
    ["", ...STATES].map((state) =>
      h("a", { href: jobsHash(state, 0, search), class: `chip${state === status ? " active" : ""}`, "data-filter": state || "all" },
        state ? state.replace("_", " ") : "all")));
  const searchBox = searchForm("jobs-search", "program, signature, reason, backend, id", search,
    (text) => { location.hash = jobsHash(status, 0, text); });
  const tbody = h("tbody");
  const table = h("table", { class: "jobs" },
    h("thead", {}, h("tr", {}, ["Job", "Status", "Backend", "Nodes", "Checks", "Elapsed", "Submitted", "Found"].map((name) =>
      h("th", { class: ["Nodes", "Checks", "Elapsed"].includes(name) ? "num" : null }, name)))),
    tbody);
  const empty = h("p", { class: "empty", hidden: true });
  const pager = h("div", { class: "pager" });
  const error = h("p", { class: "error", hidden: true });
  const updated = h("span", { class: "muted small" });
  root.replaceChildren(
    h("section", { class: "page-head" },
      h("h1", {}, "Jobs"), updated,
      h("a", { href: "#/submit", class: "button primary" }, "Submit a program")),
    h("div", { class: "toolbar" }, filters, searchBox), error, h("div", { class: "table-wrap" }, table), empty, pager);

  let stopped = false;
  let timer = 0;

  async function refresh() {
    if (document.hidden) {
      // Nobody is looking: skip this round rather than load the server for a hidden tab.
      timer = setTimeout(refresh, POLL_MS);
      return;
    }
    const params = new URLSearchParams({ offset: String(offset), limit: String(PAGE_SIZE) });
    if (status) params.set("status", status);
    if (search) params.set("q", search);
    try {
      const list = await api(`v1/jobs?${params}`);
      if (stopped) return;
      const now = new Date();
      // The server may not filter by status itself; filtering here too keeps the page honest.
      const jobs = list.jobs.filter((job) => !status || job.status === status);
      tbody.replaceChildren(...jobs.map((job) => row(job, now)));
      table.hidden = jobs.length === 0;
      empty.hidden = jobs.length !== 0;
      empty.textContent = search ? `No ${status ? `${status.replace("_", " ")} ` : ""}jobs match “${search}”.`
        : status ? `No ${status.replace("_", " ")} jobs.` : "No jobs yet. Submit a failing program to start one.";
      const total = list.total ?? jobs.length;
      const last = Math.min(offset + list.jobs.length, total);
      pager.replaceChildren(h("span", {},
        h("span", { class: "muted" }, total ? `${offset + 1}–${last} of ${total}` : ""), " ",
        offset > 0 ? h("a", { class: "button", href: jobsHash(status, Math.max(0, offset - PAGE_SIZE), search) }, "← Newer") : null, " ",
        last < total ? h("a", { class: "button", href: jobsHash(status, offset + PAGE_SIZE, search) }, "Older →") : null));
      updated.textContent = `updated ${now.toLocaleTimeString()}`;
      error.hidden = true;
    } catch (failure) {
      if (stopped) return;
      error.hidden = false;
      error.textContent = `Could not load jobs: ${failure.message}`;
    }
    if (!stopped) timer = setTimeout(refresh, POLL_MS);
  }
  refresh();
  return () => {
    stopped = true;
    clearTimeout(timer);
  };
}
