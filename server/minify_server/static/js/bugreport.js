// "Copy as bug report": one Markdown block, shaped like PyTorch's issue template ("Describe the
// bug", "Versions"), with the failure's signature and exception chain, repro.py and the worker's
// environment (torch.utils.collect_env's labels), ready to paste into an issue.

/** A fenced block whose fence is longer than any backtick run in `text`, so the text cannot close it. */
export function fenced(text, language = "") {
  const longest = Math.max(0, ...(text.match(/`+/g) || []).map((run) => run.length));
  const fence = "`".repeat(Math.max(3, longest + 1));
  return `${fence}${language}\n${text.replace(/\n+$/, "")}\n${fence}`;
}

/** "inductor / lowerings #0: relu": the stage, the subsystem, which application, what it was; or "none (why)". */
export function culpritText(culprit, reason) {
  if (!culprit) return `none${reason ? ` (${reason})` : ""}`;
  let text = [culprit.backend, culprit.subsystem].filter(Boolean).join(" / ");
  if (culprit.bisect_number != null && culprit.detail !== culprit.subsystem) text += ` #${culprit.bisect_number}`;
  if (culprit.detail) text += `: ${culprit.detail}`;
  return reason ? `${text} (${reason})` : text;
}

/** How each version-phase outcome reads on a badge and in the bug report. */
export const VERSION_OUTCOMES = { same: "fails", different: "fails otherwise", passes: "passes", cannot_run: "cannot run" };

/** A bisection of torch releases in a line: the first bad one, or how far it got, or why it stopped. */
export function bisectText(bisect) {
  const runs = (bisect.steps || []).map((run) => `${run.torch} ${VERSION_OUTCOMES[run.outcome] || run.outcome}`).join(", ");
  if (bisect.state === "running") return `bisecting… ${runs || "waiting for a worker with a torch index"}`;
  if (!bisect.first_bad) return `stopped: ${bisect.reason}`;
  const commits = bisect.commits ? `; git ${bisect.commits}` : "";
  return `first bad ${bisect.first_bad} (last good ${bisect.last_good}${commits}), ${bisect.installs} installs: ${runs}`;
}

/** The Markdown for `job` (the API's job status, with its `result` report) and `repro` (repro.py's text, or null). */
export function bugReportMarkdown(job, repro) {
  const result = job.result || {};
  const spec = job.spec || {};
  const backend = result.backend || spec.backend || "?";
  const device = result.device || spec.device || "?";
  const signature = result.signature || "(no signature recorded)";
  const lines = ["### 🐛 Describe the bug", ""];
  lines.push(`\`torch.compile\` with backend \`${backend}\` on \`${device}\` fails with:`, "", fenced(signature), "");
  const chain = result.signature_chain || [];
  if (chain.length > 1) lines.push("Exception chain (outermost first, root cause last):", "", fenced(chain.join("\n")), "");
  const config = Object.entries(result.config || spec.config || {});
  if (config.length) {
    lines.push("Config overrides (set by the repro):", "",
      fenced(config.map(([key, value]) => `${key}=${JSON.stringify(value)}`).join("\n")), "");
  }
  if (result.nodes_original != null && result.nodes_final != null) {
    lines.push(`Minimized by minify from ${result.nodes_original} to ${result.nodes_final} ops ` +
      `(${result.checks_total ?? 0} checks, every candidate in its own process).`, "");
  }
  if (result.culprit_state === "running") {
    lines.push("Culprit: not known yet (minify's culprit phase was still running when this was copied)", "");
  } else if (result.culprit || result.culprit_reason) {
    lines.push(`Culprit (torch's compiler bisector on the minimal program): ${culpritText(result.culprit, result.culprit_reason)}`);
    const workarounds = result.workarounds || [];
    lines.push(workarounds.length
      ? `Workarounds (verified on the original program): ${workarounds.map((w) => `\`${w.setting}=${JSON.stringify(w.value)}\``).join(", ")}`
      : "Workarounds: none verified", "");
  }
  if (result.versions_state === "running") {
    lines.push("Torch versions: not known yet (minify's version phase was still running when this was copied)", "");
  } else if (result.versions_summary && new Set((result.versions || []).map((run) => run.torch)).size > 1) {
    lines.push(`Torch versions (minify ran repro.py on each): ${result.versions_summary}`, "");
    for (const run of result.versions || []) {
      const detail = run.outcome === "different" ? run.signature : run.outcome === "cannot_run" ? run.reason : "";
      lines.push(`- torch ${run.torch}${run.git_version ? ` (git ${run.git_version.slice(0, 12)})` : ""}: ` +
        `${VERSION_OUTCOMES[run.outcome] || run.outcome}${detail ? ` (${detail})` : ""}`);
    }
    lines.push("");
  }
  if (result.bisect && result.bisect.state !== "running") {
    lines.push(`Bisected torch releases ${result.bisect.good}..${result.bisect.bad}: ${bisectText(result.bisect)}`, "");
  }
  if (repro) {
    // A repro that holds its inputs runs as pasted; a bigger one reads inputs.pt, which an issue cannot
    // carry: say where it is (the job's artifacts) instead of calling it attached.
    const readsFile = /\binputs\.pt\b/.test(repro.split("\n").filter((line) => !line.startsWith("#")).join("\n"));
    lines.push(readsFile
      ? "Repro (`python repro.py`; its inputs are too big to paste: `inputs.pt`, from `minify-client download " +
        `${job.id}\` or the job's page, beside it):`
      : "Repro (`python repro.py`, self-contained):", "", fenced(repro, "python"), "");
  }
  const environment = Object.entries(result.environment || {});
  lines.push("### Versions", "");
  lines.push(environment.length
    ? fenced(environment.map(([key, value]) => `${key}: ${value}`).join("\n"))
    : `torch ${result.torch_version || "?"} (the worker recorded no environment)`);
  return `${lines.join("\n")}\n`;
}
