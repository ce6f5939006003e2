// A small Python highlighter for repro.py and graph code: one pass of one regex, tokens wrapped
// in <span class="tok-KIND">, everything else escaped. It does not parse Python; it colours it.

const KEYWORDS = new Set(
  ("False None True and as assert async await break class continue def del elif else except finally " +
    "for from global if import in is lambda nonlocal not or pass raise return try while with yield match case")
    .split(" "),
);
const BUILTINS = new Set(
  ("print len range int float str bool list dict tuple set isinstance getattr setattr hasattr super " +
    "open enumerate zip map sorted min max sum abs type object Exception RuntimeError ValueError " +
    "TypeError AssertionError KeyError NotImplementedError SystemExit self").split(" "),
);

const TOKEN = new RegExp(
  [
    /(#[^\n]*)/.source, // 1 comment
    // 2 string, with an optional prefix; triple quotes first; an unterminated one runs to the end
    /((?:[rRbBuUfF]{1,2})?(?:"""[\s\S]*?(?:"""|$(?![\s\S]))|'''[\s\S]*?(?:'''|$(?![\s\S]))|"(?:\\.|[^"\\\n])*"?|'(?:\\.|[^'\\\n])*'?))/
      .source,
    /(\b0[xXoObB][\da-fA-F_]+\b|\b\d[\d_]*(?:\.[\d_]*)?(?:[eE][+-]?\d+)?j?|\.\d+(?:[eE][+-]?\d+)?)/.source, // 3 number
    /(^[ \t]*@[\w.]+)/.source, // 4 decorator
    /([A-Za-z_]\w*)/.source, // 5 name
  ].join("|"),
  "gm",
);

function escapeHtml(text) {
  return text.replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);
}

function span(kind, text) {
  return `<span class="tok-${kind}">${escapeHtml(text)}</span>`;
}

/** Python source → HTML (escaped, with token spans). */
export function highlightPython(source) {
  let html = "";
  let last = 0;
  let previousName = "";
  TOKEN.lastIndex = 0;
  for (let match = TOKEN.exec(source); match; match = TOKEN.exec(source)) {
    if (match[0] === "") {
      TOKEN.lastIndex += 1;
      continue;
    }
    html += escapeHtml(source.slice(last, match.index));
    last = match.index + match[0].length;
    const [, comment, string, number, decorator, name] = match;
    if (comment !== undefined) html += span("comment", comment);
    else if (string !== undefined) html += span("string", string);
    else if (number !== undefined) html += span("number", number);
    else if (decorator !== undefined) html += span("decorator", decorator);
    else if (name !== undefined) {
      if (previousName === "def" || previousName === "class") html += span("defname", name);
      else if (KEYWORDS.has(name)) html += span(name === "None" || name === "True" || name === "False" ? "constant" : "keyword", name);
      else if (BUILTINS.has(name)) html += span("builtin", name);
      else html += escapeHtml(name);
      previousName = name;
      continue;
    }
    previousName = "";
  }
  html += escapeHtml(source.slice(last));
  return html;
}

/** A <pre><code> block element holding highlighted Python. */
export function pythonBlock(source, attrs = {}) {
  const pre = document.createElement("pre");
  pre.className = "code";
  for (const [key, value] of Object.entries(attrs)) pre.setAttribute(key, value);
  const code = document.createElement("code");
  code.className = "language-python";
  code.innerHTML = highlightPython(source);
  pre.append(code);
  return pre;
}
