// The dashboard: one page, hash routes.
//   #/jobs[?status=S&offset=N]   every job
//   #/jobs/ID                    one job, live
//   #/submit                     upload a program
//   #/bugs[?offset=N]            bugs: jobs grouped by signature and graph shape
//   #/bugs/ID                    one bug and its jobs
//   /?job=ID                     what the client links to: the same as #/jobs/ID

import { initTokenControls } from "./api.js";
import { renderBug, renderBugs } from "./bugs.js";
import { renderJob } from "./job.js";
import { renderJobs } from "./jobs.js";
import { renderSubmit } from "./submit.js";

const view = document.getElementById("view");
let stopCurrent = () => {};

function route() {
  // The client links to /?job=ID; show that job and keep the address in the hash form.
  const linked = new URLSearchParams(location.search).get("job");
  if (linked) {
    history.replaceState(null, "", `${location.pathname}#/jobs/${encodeURIComponent(linked)}`);
  }
  stopCurrent();
  const hash = location.hash.replace(/^#/, "") || "/jobs";
  const [path, queryText = ""] = hash.split("?");
  const query = new URLSearchParams(queryText);
  const parts = path.split("/").filter(Boolean);
  let section = "jobs";
  if (parts[0] === "jobs" && parts[1]) {
    stopCurrent = renderJob(view, decodeURIComponent(parts[1]));
    document.title = `minify · job ${decodeURIComponent(parts[1]).slice(0, 12)}`;
  } else if (parts[0] === "bugs") {
    section = "bugs";
    stopCurrent = parts[1] ? renderBug(view, decodeURIComponent(parts[1])) : renderBugs(view, query);
    document.title = parts[1] ? `minify · bug ${decodeURIComponent(parts[1]).slice(0, 12)}` : "minify · bugs";
  } else if (parts[0] === "submit") {
    section = "submit";
    stopCurrent = renderSubmit(view);
    document.title = "minify · submit";
  } else {
    stopCurrent = renderJobs(view, query);
    document.title = "minify · jobs";
  }
  for (const link of document.querySelectorAll("[data-nav]")) {
    link.classList.toggle("active", link.dataset.nav === section);
  }
  window.scrollTo(0, 0);
}

initTokenControls();
window.addEventListener("hashchange", route);
route();
