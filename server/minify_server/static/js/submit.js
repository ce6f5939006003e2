// Submit page: upload a .pt2 (and optionally inputs.pt) with the job spec; POST /v1/jobs.

import { api } from "./api.js";
import { h } from "./dom.js";

const BACKENDS = ["inductor", "aot_inductor", "aot_eager", "eager"];
const FAILURE_KINDS = ["any", "compile_error", "runtime_error", "crash", "accuracy", "timeout", "oom"];

/** `KEY=VALUE` lines → config dict; values are JSON when they parse, else strings (as the CLI does). */
export function parseConfigLines(text) {
  const config = {};
  for (const [index, rawLine] of text.split("\n").entries()) {
    const line = rawLine.trim();
    if (!line || line.startsWith("#")) continue;
    const equals = line.indexOf("=");
    if (equals <= 0) throw new Error(`config line ${index + 1} is not KEY=VALUE: ${line}`);
    const key = line.slice(0, equals).trim();
    const raw = line.slice(equals + 1).trim();
    try {
      config[key] = JSON.parse(raw);
    } catch {
      config[key] = raw;
    }
  }
  return config;
}

function field(label, control, hint) {
  return h("label", { class: "field" }, h("span", { class: "field-label" }, label), control,
    hint ? h("span", { class: "hint" }, hint) : null);
}

function specFrom(form) {
  const data = new FormData(form);
  const number = (name) => {
    const value = String(data.get(name) || "").trim();
    return value === "" ? null : Number(value);
  };
  const match = String(data.get("match") || "").trim();
  const limits = {};
  if (number("candidate_timeout_s") !== null) limits.candidate_timeout_s = number("candidate_timeout_s");
  if (number("job_timeout_s") !== null) limits.job_timeout_s = number("job_timeout_s");
  if (number("parallelism") !== null) limits.parallelism = number("parallelism");
  return {
    backend: String(data.get("backend") || "inductor").trim(),
    device: String(data.get("device") || "cpu").trim(),
    failure: {
      kind: String(data.get("kind") || "any"),
      ...(match ? { match } : {}),
      strict_accuracy: data.get("strict_accuracy") === "on",
    },
    config: parseConfigLines(String(data.get("config") || "")),
    limits,
    shrink: data.get("shrink") === "on",
    culprit: data.get("culprit") === "on",
  };
}

export function renderSubmit(root) {
  const error = h("p", { class: "error", id: "submit-error", hidden: true });
  const submitButton = h("button", { type: "submit", class: "primary", id: "submit-job" }, "Start minifying");
  const form = h("form", { class: "card submit-form", id: "submit-form" },
    h("div", { class: "form-grid" },
      field("Program (.pt2)", h("input", { type: "file", name: "program", accept: ".pt2,.zip", required: true }),
        "torch.export.save(exported_program, 'program.pt2')"),
      field("Inputs (.pt, optional)", h("input", { type: "file", name: "inputs", accept: ".pt" }),
        "default: the example inputs saved in the .pt2"),
      field("Backend", h("input", { name: "backend", list: "backend-names", value: "inductor", required: true, spellcheck: "false" }),
        "inductor, aot_inductor, aot_eager, eager, or pkg.module:callable"),
      field("Device", h("input", { name: "device", list: "device-names", value: "cpu", required: true, spellcheck: "false" })),
      field("Failure kind", h("select", { name: "kind" }, FAILURE_KINDS.map((kind) => h("option", { value: kind }, kind)))),
      field("Failure match (regex, optional)", h("input", { name: "match", placeholder: "CppCompileError", spellcheck: "false" }),
        "default: the signature the original program shows"),
      field("Candidate timeout (s)", h("input", { name: "candidate_timeout_s", type: "number", min: "0.1", step: "any" }),
        "default: calibrated from the original"),
      field("Parallelism", h("input", { name: "parallelism", type: "number", min: "1", max: "256", step: "1" }),
        "default: what the device holds"),
      field("Config overrides", h("textarea", { name: "config", rows: 3, spellcheck: "false",
        placeholder: "cpp.inject_relu_bug_TESTING_ONLY=compile_error" }), "torch._inductor.config, one KEY=VALUE a line"),
      h("label", { class: "field checkbox" }, h("input", { type: "checkbox", name: "strict_accuracy" }), "Strict accuracy"),
      h("label", { class: "field checkbox" }, h("input", { type: "checkbox", name: "shrink", checked: true }),
        "Shrink the inputs once minimal"),
      h("label", { class: "field checkbox" }, h("input", { type: "checkbox", name: "culprit", checked: true }),
        "Find the culprit and workarounds"),
    ),
    h("datalist", { id: "backend-names" }, BACKENDS.map((name) => h("option", { value: name }))),
    h("datalist", { id: "device-names" }, ["cpu", "cuda", "cuda:0"].map((name) => h("option", { value: name }))),
    error,
    h("div", { class: "actions" }, submitButton),
  );

  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    error.hidden = true;
    let spec;
    try {
      spec = specFrom(form);
    } catch (failure) {
      error.hidden = false;
      error.textContent = failure.message;
      return;
    }
    const body = new FormData();
    const program = form.elements.program.files[0];
    const inputs = form.elements.inputs.files[0];
    body.append("program", program, program.name);
    if (inputs) body.append("inputs", inputs, inputs.name);
    body.append("spec", JSON.stringify(spec));
    submitButton.disabled = true;
    submitButton.textContent = "Uploading…";
    try {
      const created = await api("v1/jobs", { method: "POST", body });
      location.hash = `#/jobs/${encodeURIComponent(created.id)}`;
    } catch (failure) {
      error.hidden = false;
      error.textContent = `The server refused the job: ${failure.message}`;
    } finally {
      submitButton.disabled = false;
      submitButton.textContent = "Start minifying";
    }
  });

  root.replaceChildren(
    h("section", { class: "page-head" }, h("a", { href: "#/jobs", class: "back" }, "← Jobs"), h("h1", {}, "Submit a failing program")),
    h("p", { class: "muted" }, "The same as ", h("code", {}, "minify-client submit PROGRAM.pt2 --backend … --device …"), "."),
    form);
  return () => {};
}
