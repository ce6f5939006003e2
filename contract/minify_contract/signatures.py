"""How an exception becomes the text of a failure signature: its root cause and a normalized key.

Pure and standalone (only `re`): the oracle uses it in the worker, the capture helper in the client
(`minify_client.capture`, which writes a capture's `failure.signature`), and `repro.py` carries
this module's source verbatim, so the repro prints its failure in exactly the form report.json records.

The root cause: compilers wrap the error that means something. Inductor raises `InductorError`
around it, dynamo `BackendCompilerFailed`, inductor's code cache a `RuntimeError("Failed to import
<path>\\nSyntaxError: ...")` around a broken generated module (its cause dropped; AOTInductor's
autotuning block puts "Failed to run autotuning code block: " in front of it). `exception_chain`
walks from the outermost exception to the innermost meaningful one, through the wrapped objects
where they survive and through the wrapper's text where only that is left; the last link is the
root cause, and the whole chain is kept for reports and `--match`.

The key: the root cause's first meaningful line (a compiler's first `error:` line, for build logs;
with the line after it where the first only leads in, ending with a colon)
with what changes between candidates of the same bug normalized away: paths, hex, addresses,
numbers and generated names (`tmp3`, `buf12`, `arg0_1`). An FX node's name loses its numeric
suffix (`relu_2` is `relu`): FX numbers a name only when it is taken already, so the same node is
`add` in one graph and `add_6` in another (pytorch#172956's partitioner error names the joint
graph's node, whose number depends on how many `add`s come before it: one more in a program traced
with symbolic sizes).
"""

from __future__ import annotations

import re

MAX_KEY = 240

# Wrappers whose own type says nothing: the root cause is what they wrap.
WRAPPER_TYPES = ("InductorError", "BackendCompilerFailed", "LoweringException")
# Wrapper messages around another exception's "Type: message", by what they start with.
_WRAPPED_TEXT = re.compile(
    r"^\s*(?:backend=\S+ raised:\s*)?(?:Failed to import \S+\s*\n)?"
    r"(?P<type>[A-Za-z_][\w.]*(?:Error|Exception|Failure|Exit|Interrupt)):\s?(?P<rest>.*)",
    re.DOTALL,
)
# The code cache's words for a generated module that does not compile, also where a wrapper put
# its own in front on the same line (AOTInductor's "Failed to run autotuning code block: {e}").
_FAILED_IMPORT = re.compile(r"^[^\n]*?\bFailed to import \S+\s*\n(?P<type>[A-Za-z_][\w.]*):\s?(?P<rest>.*)",
                            re.DOTALL)
_MAX_DEPTH = 8

_NOISE_LINE = re.compile(
    r"^(Traceback \(most recent call last\)|While executing|Original traceback|Set TORCH_LOGS|"
    r"You can suppress this exception|Exception raised from|frame #|\s*File \")"
)
_COMPILER_ERROR = re.compile(r"(?:^|\s|:)(?:fatal )?error:\s*(?P<rest>.+)$")
_PATH = re.compile(r"(?:[A-Za-z]:)?(?:/[\w.\-+@~]+)+/?")
_HEX = re.compile(r"\b0x[0-9a-fA-F]+\b")
_LONG_HASH = re.compile(r"\b[0-9a-z]{20,}\b")
_GENERATED_NAME = re.compile(
    r"\b(tmp|buf|arg|primals|tangents|getitem|in_ptr|out_ptr|in_out_ptr|ks|xindex|x|y|r|s|u)\d+(_\d+)?\b"
)
_NODE_SUFFIX = re.compile(r"\b([A-Za-z][A-Za-z]*(?:_[A-Za-z]+)*)_\d+\b")
_NUMBER = re.compile(r"(?<![A-Za-z_])[-+]?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")
_SPACES = re.compile(r"\s+")


def exception_chain(error: BaseException) -> list[tuple[str, str]]:
    """`(type name, message)` from the outermost exception to its root cause."""
    chain = [(type(error).__name__, str(error))]
    for _ in range(_MAX_DEPTH):
        name, message = chain[-1]
        inner = getattr(error, "inner_exception", None) or getattr(error, "inner_exc", None)
        if name in WRAPPER_TYPES and not isinstance(inner, BaseException):
            inner = error.__cause__
        if name in WRAPPER_TYPES and isinstance(inner, BaseException):
            error = inner
            chain.append((type(error).__name__, str(error)))
            continue
        unwrapped = _unwrap_text(name, message)
        if unwrapped is None:
            break
        chain.append(unwrapped)
        error = _TextOnly()  # only text is left to unwrap from here on
    return chain


class _TextOnly(Exception):
    """Stands for a link known only from a wrapper's text (no object, no cause)."""


def _unwrap_text(name: str, message: str) -> tuple[str, str] | None:
    """The "Type: message" a wrapper kept only as text, if this link is one."""
    found = _FAILED_IMPORT.match(message)
    if found is None and name in WRAPPER_TYPES:
        found = _WRAPPED_TEXT.match(message)
    if found is None:
        return None
    return found.group("type").rsplit(".", 1)[-1], found.group("rest")


def root_cause(error: BaseException) -> tuple[str, str]:
    """`(type name, message)` of the innermost meaningful exception of `error`."""
    return exception_chain(error)[-1]


def describe_chain(chain: list[tuple[str, str]]) -> list[str]:
    """One line per link: "Type: first meaningful line"."""
    return [f"{name}: {first_meaningful_line(message)}".rstrip(": ").rstrip() for name, message in chain]


def signature_line(error: BaseException) -> str:
    """"Type: normalized key" of `error`'s root cause: what the signature prints as."""
    name, message = root_cause(error)
    key = normalize_message(message)
    return f"{name}: {key}" if key else name


_SIGNATURE_TEXT = re.compile(r"^\s*(?P<type>[A-Za-z_][\w.]*)\s*(?::\s?(?P<rest>.*))?$", re.DOTALL)


def parse_signature(text: str) -> tuple[str, str, str] | None:
    """`(type, key, message)` of a signature given as text: "Type: key" or "Type" as `signature_line`
    and report.json's `signature` write it. The message is normalized into the key by the same
    rules, so a key stays itself and the raw "Type: message" of the root cause gives the same key;
    a dotted type keeps its last part, a wrapper's text ("InductorError: CppCompileError: ...") is
    unwrapped to what it wraps. None when `text` does not start with a type name."""
    found = _SIGNATURE_TEXT.match(text)
    if found is None:
        return None
    name, message = found.group("type").rsplit(".", 1)[-1], found.group("rest") or ""
    for _ in range(_MAX_DEPTH):
        unwrapped = _unwrap_text(name, message)
        if unwrapped is None:
            break
        name, message = unwrapped
    return name, normalize_message(message), message.strip()


def normalize_message(message: str) -> str:
    """The normalized first meaningful line of `message` (the compiler's first `error:` line if any)."""
    line = _first_compiler_error(message) or first_meaningful_line(message)
    line = _PATH.sub("<path>", line)
    line = _HEX.sub("<hex>", line)
    line = _LONG_HASH.sub("<hash>", line)
    line = _GENERATED_NAME.sub(lambda match: f"{match.group(1)}N", line)
    line = _NODE_SUFFIX.sub(lambda match: match.group(1), line)
    line = _NUMBER.sub("N", line)
    return _SPACES.sub(" ", line).strip()[:MAX_KEY]


def _first_compiler_error(message: str) -> str | None:
    for line in message.splitlines():
        found = _COMPILER_ERROR.search(line)
        if found:
            return found.group("rest")
    return None


def first_meaningful_line(message: str) -> str:
    """The message's first line that is not a traceback's, joined with the next one where it only
    leads in to it (ends with a colon): dynamo's `UncapturedHigherOrderOpError` opens with "... Got
    graph break/error:" whatever the graph break, and names it on the next line ("Dynamic shape
    operator", "torch.cond: unsupported branch return type ..."), which is what tells one bug from
    another."""
    lines = (line.strip() for line in message.splitlines())
    meaningful = (line for line in lines if line and not _NOISE_LINE.match(line))
    first = next(meaningful, "")
    if first.endswith(":"):
        return f"{first} {next(meaningful, '')}".rstrip()
    return first
