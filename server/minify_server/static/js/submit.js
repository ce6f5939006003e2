// Submit page: upload a program (a .pt2, a StableHLO module or HLO text) and optionally its inputs,
// with every field of the job spec `minify-client submit` has a flag for; POST /v1/jobs.

import { api } from "./api.js";
import { h } from "./dom.js";

const BACKENDS = ["inductor", "aot_inductor", "aot_eager", "eager"];
const FAILURE_KINDS = ["any", "compile_error", "runtime_error", "crash", "accuracy", "timeout", "oom"];
const DYNAMIC_MODES = ["as_exported", "auto", "static"];
const STABLEHLO_SUFFIXES = [".mlir", ".mlirbc", ".stablehlo", ".vhlo"];
const HLO_SUFFIXES = [".hlo", ".hlo.txt"];

/** The spec's program_format for a file name, as the CLI tells it by suffix (a zip is a .pt2). */
export function programFormat(name) {
  const lower = name.toLowerCase();
  if (HLO_SUFFIXES.some((suffix) => lower.endsWith(suffix))) return "hlo";
  if (STABLEHLO_SUFFIXES.some((suffix) => lower.endsWith(suffix))) return "stablehlo";
  return "pt2";
}

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
  const text = (name) => String(data.get(name) || "").trim();
  const limits = {};
  for (const name of ["candidate_timeout_s", "original_timeout_s", "job_timeout_s", "memory_mb", "parallelism"]) {
    if (number(name) !== null) limits[name] = number(name);
  }
  const failure = { kind: text("kind") || "any", strict_accuracy: data.get("strict_accuracy") === "on" };
  if (text("match")) failure.match = text("match");
  if (text("signature")) failure.signature = text("signature");
  if (number("tolerance") !== null) failure.tolerance = number("tolerance");
  const opModules = text("op_modules").split(/[\s,]+/).filter(Boolean);
  const program = form.elements.program.files[0];
  return {
    backend: text("backend") || "inductor",
    device: text("device") || "cpu",
    failure,
    config: parseConfigLines(String(data.get("config") || "")),
    limits,
    dynamic: text("dynamic") || "as_exported",
    ...(opModules.length ? { op_modules: opModules } : {}),
    program_format: program ? programFormat(program.name) : "pt2",
    shrink: data.get("shrink") === "on",
    culprit: data.get("culprit") === "on",
    versions: data.get("versions") === "on",
  };
}

export function renderSubmit(root) {
  const error = h("p", { class: "error", id: "submit-error", hidden: true });
  const submitButton = h("button", { type: "submit", class: "primary", id: "submit-job" }, "Start minifying");
  const form = h("form", { class: "card submit-form", id: "submit-form" },
    h("div", { class: "form-grid" },
      field("Program (.pt2, .mlir, .hlo)", h("input", { type: "file", name: "program", required: true,
        accept: [".pt2", ".zip", ...STABLEHLO_SUFFIXES, ".hlo", ".txt"].join(",") }),
      "torch.export.save(exported_program, 'program.pt2'), or a StableHLO module (.mlir, .mlirbc) or HLO text (.hlo)"),
      field("Inputs (optional)", h("input", { type: "file", name: "inputs", accept: ".pt,.npz" }),
        "a .pt (an .npz for StableHLO or HLO); default: the example inputs saved in the program"),
      field("Backend", h("input", { name: "backend", list: "backend-names", value: "inductor", required: true, spellcheck: "false" }),
        "inductor, aot_inductor, aot_eager, eager, or pkg.module:callable"),
      field("Device", h("input", { name: "device", list: "device-names", value: "cpu", required: true, spellcheck: "false" })),
      field("Failure kind", h("select", { name: "kind" }, FAILURE_KINDS.map((kind) => h("option", { value: kind }, kind)))),
      field("Failure match (regex, optional)", h("input", { name: "match", placeholder: "CppCompileError", spellcheck: "false" }),
        "default: the signature the original program shows"),
      field("Known signature (optional)", h("input", { name: "signature", spellcheck: "false",
        placeholder: "CppCompileError: 'tmpN' was not declared in this scope" }),
      "the root cause as report.json writes it: its failure is the target from the start (--signature)"),
      field("Accuracy tolerance", h("input", { name: "tolerance", type: "number", min: "0", step: "any", placeholder: "0.001" }),
        "for accuracy failures (--tolerance)"),
      field("Dynamic dims", h("select", { name: "dynamic" }, DYNAMIC_MODES.map((mode) => h("option", { value: mode }, mode))),
        "as_exported: symbolic with their ranges; auto: torch.compile's automatic dynamic; static (--dynamic)"),
      field("Custom op modules (optional)", h("input", { name: "op_modules", spellcheck: "false", placeholder: "my_pkg.ops" }),
        "modules that register the program's custom ops, comma-separated (--op-module)"),
      field("Candidate timeout (s)", h("input", { name: "candidate_timeout_s", type: "number", min: "0.1", step: "any" }),
        "default: calibrated from the original (--candidate-timeout)"),
      field("Original timeout (s)", h("input", { name: "original_timeout_s", type: "number", min: "0.1", step: "any" }),
        "the original program's runs (--original-timeout)"),
      field("Job timeout (s)", h("input", { name: "job_timeout_s", type: "number", min: "1", max: "604800", step: "any",
        placeholder: "3600" }), "the whole job's limit (--job-timeout)"),
      field("Memory limit (MiB)", h("input", { name: "memory_mb", type: "number", min: "64", step: "1" }),
        "of one candidate's processes; default: the machine's memory / parallelism (--memory-limit)"),
      field("Parallelism", h("input", { name: "parallelism", type: "number", min: "1", max: "256", step: "1" }),
        "default: what the device holds"),
      field("Config overrides", h("textarea", { name: "config", rows: 3, spellcheck: "false",
        placeholder: "cpp.inject_relu_bug_TESTING_ONLY=compile_error" }), "torch._inductor.config, one KEY=VALUE a line"),
      h("label", { class: "field checkbox" }, h("input", { type: "checkbox", name: "strict_accuracy" }), "Strict accuracy"),
      h("label", { class: "field checkbox" }, h("input", { type: "checkbox", name: "shrink", checked: true }),
        "Shrink the inputs once minimal"),
      h("label", { class: "field checkbox" }, h("input", { type: "checkbox", name: "culprit", checked: true }),
        "Find the culprit and workarounds"),
      h("label", { class: "field checkbox" }, h("input", { type: "checkbox", name: "versions", checked: true }),
        "Run the repro on the other torch versions the workers hold"),
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
    h("p", { class: "muted" }, "The same as ", h("code", {}, "minify-client submit PROGRAM --backend … --device …"),
      ": every field below is one of its flags."),
    form);
  return () => {};
}
