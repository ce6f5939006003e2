// The HTTP API (docs/service.md, "HTTP API") as the dashboard uses it, with token handling:
// on a 401 the user is asked for a token once; it is kept in localStorage and sent as
// `Authorization: Bearer` on fetches and as `?token=` where headers cannot be set (EventSource).

const TOKEN_KEY = "minify.token";

export class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

export function storedToken() {
  return localStorage.getItem(TOKEN_KEY) || "";
}

export function forgetToken() {
  localStorage.removeItem(TOKEN_KEY);
  showForgetButton();
}

function showForgetButton() {
  const button = document.getElementById("forget-token");
  if (button) button.hidden = !storedToken();
}

// All requests that meet a 401 while the dialog is open wait for the same answer.
let pendingTokenPrompt = null;

function askForToken(rejected) {
  if (pendingTokenPrompt) return pendingTokenPrompt;
  const dialog = document.getElementById("token-dialog");
  const form = document.getElementById("token-form");
  const input = document.getElementById("token-input");
  const error = document.getElementById("token-error");
  error.hidden = !rejected;
  error.textContent = rejected ? "The server refused the token you gave; try another." : "";
  input.value = "";
  pendingTokenPrompt = new Promise((resolve) => {
    const onSubmit = () => {
      const token = input.value.trim();
      if (!token) return;
      localStorage.setItem(TOKEN_KEY, token);
      showForgetButton();
      form.removeEventListener("submit", onSubmit);
      pendingTokenPrompt = null;
      resolve(token);
    };
    form.addEventListener("submit", onSubmit);
    // Escape would close the dialog without a token; keep asking instead.
    dialog.addEventListener("cancel", (event) => event.preventDefault(), { once: true });
    dialog.showModal();
    input.focus();
  });
  return pendingTokenPrompt;
}

async function messageOf(response) {
  const text = await response.text();
  let body = null;
  try {
    body = JSON.parse(text);
  } catch {
    return text || `${response.status} ${response.statusText}`;
  }
  // ErrorResponse's `error` says it in words; FastAPI's own errors have only `detail`.
  if (typeof body?.error === "string" && body.error) return body.error;
  const detail = body?.detail;
  if (Array.isArray(detail)) return detail.map((d) => (d.loc ? `${d.loc.join(".")}: ${d.msg}` : d.msg)).join("; ");
  if (typeof detail === "string") return detail;
  return text;
}

/**
 * fetch() against the API: JSON back (or the Response itself with `raw: true`); ApiError on a
 * non-2xx. `json`: a value sent as the JSON body.
 */
export async function api(path, { method = "GET", body, json, raw = false } = {}) {
  let sentToken = storedToken();
  if (json !== undefined) body = JSON.stringify(json);
  for (;;) {
    const headers = {};
    if (sentToken) headers.Authorization = `Bearer ${sentToken}`;
    if (json !== undefined) headers["Content-Type"] = "application/json";
    const response = await fetch(path, { method, body, headers });
    if (response.status === 401) {
      // A 401 with a token we did not send (another request already got a new one): just retry.
      const current = storedToken();
      sentToken = current && current !== sentToken ? current : await askForToken(Boolean(sentToken));
      continue;
    }
    if (!response.ok) throw new ApiError(response.status, await messageOf(response));
    if (raw) return response;
    if (response.status === 204) return null;
    const text = await response.text();
    return text ? JSON.parse(text) : null;
  }
}

/** A URL for places that cannot send headers (EventSource): the token goes in the query. */
export function withToken(path) {
  const token = storedToken();
  if (!token) return path;
  return `${path}${path.includes("?") ? "&" : "?"}token=${encodeURIComponent(token)}`;
}

/** Save an API resource as a file, through fetch so that the Authorization header goes with it. */
export async function downloadWithToken(path, filename) {
  const response = await api(path, { raw: true });
  const blob = await response.blob();
  const url = URL.createObjectURL(blob);
  const link = document.createElement("a");
  link.href = url;
  link.download = filename;
  document.body.append(link);
  link.click();
  link.remove();
  setTimeout(() => URL.revokeObjectURL(url), 10_000);
}

export function initTokenControls() {
  showForgetButton();
  document.getElementById("forget-token")?.addEventListener("click", () => forgetToken());
}
