// Small DOM and formatting helpers shared by the views.

/** h("div", {class: "x", onclick: fn}, child, "text", ...): an element; children may be nested arrays. */
export function h(tag, attrs = {}, ...children) {
  const element = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (name.startsWith("on") && typeof value === "function") {
      element.addEventListener(name.slice(2), value);
    } else if (name === "dataset") {
      Object.assign(element.dataset, value);
    } else {
      element.setAttribute(name, value === true ? "" : String(value));
    }
  }
  append(element, children);
  return element;
}

function append(element, children) {
  for (const child of children) {
    if (child === undefined || child === null || child === false) continue;
    if (Array.isArray(child)) append(element, child);
    else element.append(child instanceof Node ? child : String(child));
  }
}

export const STATES = ["queued", "running", "succeeded", "not_reproducible", "failed", "cancelled"];
export const FINISHED = new Set(["succeeded", "not_reproducible", "failed", "cancelled"]);

const STATE_WORDS = {
  queued: "queued",
  running: "running",
  succeeded: "succeeded",
  not_reproducible: "not reproducible",
  failed: "failed",
  cancelled: "cancelled",
};

export function statusBadge(state) {
  return h("span", { class: `badge status-${state}`, "data-status": state }, STATE_WORDS[state] || state);
}

/** The server's datetimes; a naive ISO string is UTC (the service writes UTC). */
export function parseTime(value) {
  if (!value) return null;
  const hasZone = /([zZ]|[+-]\d\d:?\d\d)$/.test(value);
  const time = new Date(hasZone ? value : `${value}Z`);
  return Number.isNaN(time.getTime()) ? null : time;
}

export function formatDuration(seconds) {
  if (seconds === null || seconds === undefined || Number.isNaN(seconds)) return "–";
  if (seconds < 10) return `${seconds.toFixed(1)} s`;
  if (seconds < 60) return `${Math.round(seconds)} s`;
  const minutes = Math.floor(seconds / 60);
  if (minutes < 60) return `${minutes} min ${String(Math.round(seconds % 60)).padStart(2, "0")} s`;
  return `${Math.floor(minutes / 60)} h ${String(minutes % 60).padStart(2, "0")} min`;
}

export function formatAgo(time, now = new Date()) {
  if (!time) return "–";
  const seconds = Math.max(0, (now - time) / 1000);
  if (seconds < 45) return "just now";
  if (seconds < 3600) return `${Math.round(seconds / 60)} min ago`;
  if (seconds < 86400) return `${Math.round(seconds / 3600)} h ago`;
  return time.toLocaleDateString();
}

export function formatClock(time) {
  return time ? time.toLocaleString() : "–";
}

/** Seconds a job has run: the engine's own count, or the wall clock since it started. */
export function jobElapsed(job, now = new Date()) {
  const started = parseTime(job.started_at);
  const finished = parseTime(job.finished_at);
  const reported = job.progress?.elapsed_s || job.result?.elapsed_s || 0;
  if (job.status === "running" && started) return Math.max(reported, (now - started) / 1000);
  if (started && finished) return Math.max(reported, (finished - started) / 1000);
  return reported || null;
}

export function formatCount(value) {
  return value === null || value === undefined ? "–" : Number(value).toLocaleString("en-US");
}

/** "40 → 2 (−95%)" */
export function nodesText(original, current) {
  if (original === null || original === undefined) return "–";
  if (current === null || current === undefined || current === original) return `${formatCount(original)}`;
  if (!original || current > original) return `${formatCount(original)} → ${formatCount(current)}`;
  // 210 → 1 is not "−100%": a shrink that rounds to 100% keeps a decimal, or says how many times smaller.
  const shrink = (100 * (original - current)) / original;
  const percent = Math.round(shrink) < 100 ? `−${Math.round(shrink)}%` : current ? `${formatCount(Math.round(original / current))}× smaller` : "−100%";
  return `${formatCount(original)} → ${formatCount(current)} (${percent})`;
}

export async function copyText(text) {
  if (navigator.clipboard && window.isSecureContext) {
    await navigator.clipboard.writeText(text);
    return;
  }
  const area = h("textarea", { readonly: true, style: "position:fixed;opacity:0" });
  area.value = text;
  document.body.append(area);
  area.select();
  document.execCommand("copy");
  area.remove();
}

/** A button that copies `text` (a string, or a function that returns one or a promise of one) and says so for a moment. */
export function copyButton(text, label = "Copy") {
  const button = h("button", { type: "button", class: "copy" }, label);
  button.addEventListener("click", async () => {
    try {
      await copyText(typeof text === "function" ? await text() : text);
      button.textContent = "Copied";
    } catch {
      button.textContent = "Copy failed";
    }
    setTimeout(() => (button.textContent = label), 1500);
  });
  return button;
}
