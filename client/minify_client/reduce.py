"""The smallest script that still fails the same way, for failures no graph holds.

When dynamo is to blame (a guard it did not install, a value it replays, a graph reused where it
should have recompiled) or AOT autograd's runtime wrappers are, no graph a compiler received holds
the failure, and the capture has nothing to minimize (the diagnosis says which layer). What can
shrink then is the program itself. `reduce_script(script)` does what C-Reduce does for C, on the
script's syntax tree: it deletes statements (halves of a block first, then smaller runs, then one
at a time), replaces a block (`if`, `for`, `while`, `with`, `try`) by its body, makes integer
literals smaller (a tensor's sizes), and replaces an expression by a part of it (a method call by
its receiver, a call by an argument or less a keyword, an operation by an operand), keeping each
change only when the smaller script

- still fails the same way: the same exception type raised by the same statement (for an error
  other than an `AssertionError`, the same signature too, as `minify_contract.signatures` keys it;
  for a death, the same signal), and
- still passes with torch.compile switched off (`TORCHDYNAMO_DISABLE=1`): a script that is wrong
  without the compiler is the script's bug, not the compiler's, so the reduction never drifts there.

Every run is a fresh process (`minify_client/capture/rerun.py` by its path, as the capture's
diagnosis reruns a script), `jobs` of them at
a time, each bounded by `timeout_s`; a run that hangs counts as passing. The candidates live beside
the script while they run (`.<name>.minify-<n>.py`: its imports and relative paths still resolve)
and are removed after; the script itself is never written: the result goes to `<name>.min.py`. The
reduction repeats its passes until none changes the script, or until `budget_s` runs out (the
smallest script so far is kept). Comments and formatting are not kept: the result is `ast.unparse`'s.

A failing test reduces the same way (`minify-client reduce tests/test_model.py::test_step`, as pytest
names it; `test=` here): the file is the script, and each run is that one test under pytest from a
candidate beside the file (`_minify_<name>_<pid>_<n>.py`: pytest imports it as a module, with the
folder's conftest.py), its failure recorded by `rerun`'s plugin with the test file's line that raised;
the result (`<name>_min.py`, a name pytest can import) is a test file whose test still fails so.
"""

from __future__ import annotations

import argparse
import ast
import builtins
import copy
import functools
import itertools
import os
import queue
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from minify_client.capture import rerun
from minify_client.capture.crash import death_signature

DISABLE_ENV = {"TORCHDYNAMO_DISABLE": "1"}
# Each candidate compiles its own graphs: with inductor's FX graph and AOT autograd caches on, a
# candidate was judged by a graph an earlier one had compiled for other inputs (pytorch#139789's
# reduction dropped the call that compiled for separate inputs and kept failing on the cached graph:
# its result failed in none of 3 fresh runs). The kernel cache (keyed by source) stays.
INDEPENDENT_RUNS_ENV = {"TORCHINDUCTOR_FX_GRAPH_CACHE": "0", "TORCHINDUCTOR_AUTOGRAD_CACHE": "0"}
_BLOCK_FIELDS = ("body", "orelse", "finalbody")


class ReduceRefused(ValueError):
    """The script cannot be reduced against its failure: it passes, or fails without the compiler."""


@dataclass(frozen=True)
class Run:
    """How one run of a script ended."""

    failed: bool
    signature: str | None = None  # "Type: key" (signatures.signature_line), or the signal's name
    raised_at: str | None = None  # the script's statement that raised
    timed_out: bool = False
    raised_in: str | None = None  # the torch module the script called when it raised ("torch.export")

    def describe(self) -> str:
        if self.timed_out:
            return "ran past its time bound"
        if not self.failed:
            return "passes"
        return f"{self.signature}" + (f" at `{self.raised_at}`" if self.raised_at else "")


@dataclass(frozen=True)
class Reduced:
    """The result: the smallest failing script, and what it took."""

    source: str
    failure: Run
    lines_before: int
    lines_after: int
    runs: int
    seconds: float
    finished: bool  # False: the budget ran out before the passes stopped changing the script
    passes_without: str = "torch.compile"  # what the reference runs left out (torch.export too, for its failure)
    # The failure is torch.export refusing the program as written (`rerun.export_refusal`: its type),
    # export asking the program to change rather than an error of its own.
    export_refusal: str | None = None

    def meaning(self) -> str:
        """What the result is a repro of, for the command's last line."""
        if self.export_refusal is None:
            return ""
        return (f"\n{self.export_refusal} is torch.export refusing the program as written, asking it to change "
                f"({rerun.EXPORT_REFUSAL_REMEDIES}), not an error of export's own: the result is the smallest "
                "program export refuses so, for a question or a feature request, not a bug report")


def same_failure(expected: Run, observed: Run) -> bool:
    """Whether `observed` fails the way `expected` does (see the module's docstring); a hang
    (`expected.timed_out`, `--hang`) is kept by running past the bound again."""
    if expected.timed_out:
        return observed.timed_out
    if not observed.failed or observed.timed_out or expected.signature is None or observed.signature is None:
        return False
    if expected.raised_at != observed.raised_at:
        return False
    kind = expected.signature.split(":", 1)[0]
    if kind == "AssertionError":  # its message holds the values, which a smaller script changes
        return observed.signature.split(":", 1)[0] == kind
    return observed.signature == expected.signature


class ScriptRunner:
    """Runs a script's text as `script` would run (beside it, as `__main__`), with or without
    torch.compile, each run in a process of its own: a child forked from a server that imported
    torch once (`rerun.serve`, one per job; `preload`), else a fresh `python`. Runs with and without
    torch.compile fork from the same servers: TORCHDYNAMO_DISABLE is a run's own setting, which
    torch reads at each torch.compile, not on import. With `test`
    (a test's name in `script`, as pytest's node id has it after `::`), the text is a test file and
    a run is that one test under pytest (`args` are pytest's), beside the file, so its conftest.py
    and imports hold."""

    def __init__(self, script: Path, args: list[str], timeout_s: float, *, preload: list[str] | None = None,
                 jobs: int = 1, test: str | None = None) -> None:
        self.script = script.resolve()
        self.args = args
        self.test = test
        self.timeout_s = timeout_s
        self.preload = preload or []
        self._counter = itertools.count()
        self._servers: queue.Queue[rerun.Server | None] = queue.Queue()
        for _ in range(jobs if self.preload else 0):
            self._servers.put(None)  # started when first used
        self._lock = threading.Lock()
        self.runs = 0
        # The reference runs (without torch.compile) also run torch.export eagerly (`export_eagerly`):
        # set once the script is found to fail inside torch.export with torch.compile off.
        self.eager_export = False

    def run(self, source: str, *, compiled: bool = True) -> Run:
        with self._lock:
            self.runs += 1
            number = next(self._counter)
        # A test file's candidate is imported by pytest as a module: its name must be one.
        name = (f"_minify_{self.script.stem}_{os.getpid()}_{number}.py" if self.test
                else f".{self.script.stem}.minify-{os.getpid()}-{number}.py")
        path = self.script.with_name(name)
        handle, out = tempfile.mkstemp(prefix="minify-reduce-", suffix=".json")
        os.close(handle)
        try:
            path.write_text(source)
            returncode = self._through_server(path, out, compiled) if self.preload else None
            if returncode is None:
                returncode = self._fresh(path, out, compiled)
            if returncode is None:
                return Run(failed=False, timed_out=True)
            return _ended(returncode, Path(out))
        finally:
            path.unlink(missing_ok=True)
            os.unlink(out)

    def close(self) -> None:
        while not self._servers.empty():
            server = self._servers.get_nowait()
            if server is not None:
                server.close()

    def _environment(self) -> dict[str, str]:
        """Every run's environment, with torch.compile or without (`_settings`)."""
        # A test file's candidates write no bytecode (pytest's rewritten asserts) beside the user's.
        quiet = {"PYTHONDONTWRITEBYTECODE": "1"} if self.test else {}
        return rerun.environment({**INDEPENDENT_RUNS_ENV, **quiet})

    def _argv(self, path: Path) -> list[str]:
        """What `rerun.main` runs for the candidate at `path`: the script, or the one test in it."""
        if self.test is None:
            return [str(path), *self.args]
        return ["--pytest", f"{path}::{self.test}", "-p", rerun.PLUGIN, "-p", "no:cacheprovider",
                "-q", "-x", "-W", "ignore::pytest.PytestAssertRewriteWarning", *self.args]

    def _settings(self, compiled: bool) -> dict[str, str]:
        """What one run sets beyond every run's environment (`_environment`): TORCHDYNAMO_DISABLE=1
        for a run without torch.compile."""
        eager_export = {rerun.EAGER_EXPORT_ENV: "1"} if self.eager_export and not compiled else {}
        return {**({} if compiled else DISABLE_ENV), **eager_export}

    def _fresh(self, path: Path, out: str, compiled: bool) -> int | None:
        """The exit status of a fresh `python` running `path` (None: it timed out)."""
        env = {**self._environment(), **self._settings(compiled), rerun.OUT_ENV: out}
        try:
            done = subprocess.run([sys.executable, "-c", rerun.BY_PATH, rerun.__file__, *self._argv(path)],
                                  cwd=self.script.parent, env=env, stdin=subprocess.DEVNULL,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                  timeout=self.timeout_s, check=False)
        except subprocess.TimeoutExpired:
            return None
        return done.returncode

    def _through_server(self, path: Path, out: str, compiled: bool) -> int | None:
        """The exit status of a child of a fork server running `path` (None: it timed out); a fresh
        run (`_fresh`) where no server can be had."""
        servers = self._servers
        server = servers.get()
        try:
            if server is None or not server.alive():
                server = rerun.Server(self.preload, cwd=self.script.parent, environment=self._environment())
            ended = server.run({"script": str(path), "argv": self._argv(path), "out": out,
                                "timeout_s": self.timeout_s, "settings": self._settings(compiled)})
        except OSError:
            ended = None
        finally:
            servers.put(server)
        if ended is None:  # the server died: this run goes fresh, the next starts another server
            return self._fresh(path, out, compiled)
        return None if ended["timed_out"] else int(ended["returncode"])


def _ended(returncode: int, out: Path) -> Run:
    written = rerun.read_record(out)
    if written is None:
        if returncode < 0:
            return Run(failed=True, signature=death_signature(returncode))
        return Run(failed=returncode != 0, signature=f"ExitStatus: {returncode}" if returncode else None)
    return Run(failed=bool(written.get("failed")), signature=written.get("signature"),
               raised_at=written.get("raised_at"), raised_in=written.get("raised_in"))


def reduce_script(script: str | os.PathLike[str], args: list[str] | None = None, *, jobs: int = 2,
                  timeout_s: float | None = None, budget_s: float = 1800.0,
                  on_progress: Callable[[str], None] | None = None, test: str | None = None,
                  hang_s: float | None = None) -> Reduced:
    """Reduce `script` (run with `args`) to the smallest script that still fails the same way and
    passes without torch.compile; with `test`, the test file `script` to the smallest in which that
    test (its name as pytest's node id has it after `::`; `args` are pytest's) still fails so. With
    `hang_s`, the failure kept is a run past `hang_s` seconds under torch.compile (a compile or a
    program that hangs), and without torch.compile each run must end, passing, within them. Raises
    `ReduceRefused` when the script passes (ends, with `hang_s`), or fails without torch.compile
    too; `SyntaxError` when it is not Python."""
    if hang_s is not None:
        timeout_s = hang_s
    path = Path(script)
    tree = ast.parse(path.read_text(), filename=str(path))
    started = time.monotonic()
    say = on_progress or (lambda text: None)
    # A test's runs load the conftest.py files above it too.
    sources = [path, *rerun.conftests(path)] if test is not None else [path]
    preload = rerun.server_modules(sources, pytest=test is not None)
    runner = ScriptRunner(path, list(args or []), timeout_s or 600.0, preload=preload, jobs=jobs, test=test)
    try:
        return _reduce(path, tree, runner, jobs=jobs, timeout_s=timeout_s, budget_s=budget_s, say=say,
                       started=started, hang=hang_s is not None)
    finally:
        runner.close()


def _reduce(path: Path, tree: ast.Module, runner: ScriptRunner, *, jobs: int, timeout_s: float | None,
            budget_s: float, say: Callable[[str], None], started: float, hang: bool = False) -> Reduced:
    # The script as the candidates are written (ast.unparse: one statement a line, no comments) is
    # what the failure is held to: the statement that raised is compared by its text.
    source = ast.unparse(tree) + "\n"
    first = time.monotonic()
    expected = runner.run(source)
    if hang and not expected.timed_out:
        raise ReduceRefused(f"{path} ends within {runner.timeout_s:g} s under torch.compile ({expected.describe()}): "
                            "there is no hang to keep")
    if not hang and not expected.failed:
        as_written = runner.run(path.read_text()).failed
        written = " once rewritten as the reduction writes it (ast.unparse)" if as_written else ""
        hint = " (a script that hangs under torch.compile: --hang SECONDS)" if expected.timed_out else ""
        raise ReduceRefused(f"{path} {'timed out' if expected.timed_out else 'passes'}{written}: there is no "
                            f"failure to keep{hint}")
    eager = runner.run(source, compiled=False)
    without, refusal = "torch.compile", None
    if _fails_or_hangs(eager) and not hang and _inside_export(eager):
        refusal = rerun.export_refusal(eager.signature)
        # torch.export is the compiler here: the script calls it, and TORCHDYNAMO_DISABLE leaves it on.
        runner.eager_export = True
        eager_export = runner.run(source, compiled=False)
        if _fails_or_hangs(eager_export):
            raise ReduceRefused(
                f"{path} fails inside torch.export with torch.compile off ({eager.describe()}), and also with "
                f"torch.export handing back the module to run as it is ({eager_export.describe()}): the failure "
                "is the script's own, not the compiler's; nothing to reduce it against")
        eager, without = eager_export, "torch.compile or torch.export (the module run as it is)"
    if _fails_or_hangs(eager):
        raise ReduceRefused(f"{path} fails without torch.compile too (TORCHDYNAMO_DISABLE=1: {eager.describe()}): "
                            "the failure is the script's own, not the compiler's; nothing to reduce it against")
    if timeout_s is None:  # a run may take longer than the original's, not much longer
        runner.timeout_s = max(30.0, 3 * (time.monotonic() - first))
    say(f"reduce: {path.name} runs past {runner.timeout_s:g} s under torch.compile; it ends within them without it"
        if hang else f"reduce: {path.name} fails with {expected.describe()}; it passes without {without}"
        + (f" ({refusal}: torch.export refusing the program as written, not an error of its own)" if refusal else ""))

    verdicts: dict[str, bool] = {}  # a program tried once is not run again: another pass may write it too

    def keeps_failing(candidate: str) -> bool:
        if candidate not in verdicts:
            verdicts[candidate] = (same_failure(expected, runner.run(candidate))
                                   and not _fails_or_hangs(runner.run(candidate, compiled=False)))
        return verdicts[candidate]

    lines_before = _lines(source)
    unbound = unbound_names(tree)
    finished = False
    passes = (_deletions, _unwrapped_blocks, _smaller_integers,
              functools.partial(_simpler_expressions, raising=expected.raised_at))
    # The passes take turns until each has had its turn on the script as it stands: a pass that
    # changed it ended with none of its candidates kept, so it is done until another pass changes it.
    # (Going round again from the first pass repeated the last changing pass's every candidate.)
    done, turn = 0, 0
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        while time.monotonic() - started < budget_s:
            make_candidates = passes[turn % len(passes)]
            turn += 1
            changed = False
            while time.monotonic() - started < budget_s:
                smaller = _first_kept(pool, jobs, tree, make_candidates(tree), keeps_failing, unbound,
                                      deadline=started + budget_s)
                if smaller is None:
                    break
                tree, changed = smaller, True
                say(f"reduce: {lines_before} → {_lines(ast.unparse(tree))} lines, {runner.runs} runs")
            done = 1 if changed else done + 1
            if done == len(passes) and time.monotonic() - started < budget_s:
                finished = True
                break
    reduced = ast.unparse(tree) + "\n"
    return Reduced(source=reduced, failure=expected, lines_before=lines_before, lines_after=_lines(reduced),
                   runs=runner.runs, seconds=time.monotonic() - started, finished=finished, passes_without=without,
                   export_refusal=refusal)


def _inside_export(run: Run) -> bool:
    """Whether `run` failed inside torch.export (the script's call into torch was one of export's)."""
    return rerun.raised_inside_export(run.raised_in)


def _fails_or_hangs(run: Run) -> bool:
    return run.failed or run.timed_out


def _lines(source: str) -> int:
    return len([line for line in source.splitlines() if line.strip()])


def _first_kept(pool: ThreadPoolExecutor, jobs: int, current: ast.Module, candidates: Iterator[ast.Module],
                keeps_failing: Callable[[str], bool], unbound: set[str], *,
                deadline: float | None = None) -> ast.Module | None:
    """The first of `candidates` (smaller versions of `current`), in their order, whose script keeps
    failing; `jobs` tried at once. One that reads the same as `current` (an emptied block's `pass`
    deleted and put back) is not tried. Nor is one that reads a name it binds nowhere (its
    definition deleted): it would raise NameError, a failure of its own (`unbound`: the names the
    script itself reads unbound). Nor one that seeds a random generator less (`_seeding_calls`):
    without its seed a script fails on some runs only, and a reduction that kept it on one run
    delivered a script that failed in 1 of 3 (pytorch#145466). None too once `deadline` (a
    `time.monotonic()`) has passed: the budget holds inside a pass, whose candidates can take many
    minutes (a 300 s budget ran to 365 s, and a reduction killed at its process limit wrote nothing)."""
    seen = {ast.unparse(current)}
    seeds = _seeding_calls(current)
    while deadline is None or time.monotonic() < deadline:
        batch = []
        for tree in candidates:
            if unbound_names(tree) - unbound or _seeding_calls(tree) < seeds:
                continue
            text = _valid_source(tree)
            if text is not None and text not in seen:
                seen.add(text)
                batch.append((tree, text))
            if len(batch) == jobs:
                break
        if not batch:
            return None
        for (tree, _), kept in zip(batch, pool.map(lambda entry: keeps_failing(entry[1]), batch), strict=True):
            if kept:
                return tree
    return None


_SEEDING = frozenset({"manual_seed", "seed", "set_rng_state", "manual_seed_all"})


def _seeding_calls(tree: ast.AST) -> int:
    """How many calls in `tree` seed a random generator (`torch.manual_seed(0)`, `random.seed(1)`,
    `np.random.seed(2)`, `generator.manual_seed(3)`)."""
    return sum(1 for node in ast.walk(tree) if isinstance(node, ast.Call)
               and (node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None))
               in _SEEDING)


def unbound_names(tree: ast.AST) -> set[str]:
    """The names `tree` reads that nothing in it binds (an assignment, a definition, an import, a
    parameter, a `global`, a handler, a pattern) and that are not builtins. Flow-insensitive: a name
    bound anywhere counts as bound everywhere, so only a name bound nowhere is reported."""
    bound = set(dir(builtins)) | {"__name__", "__file__", "__doc__", "__spec__", "__loader__", "__builtins__"}
    read = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (read if isinstance(node.ctx, ast.Load) else bound).add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                if alias.name == "*":
                    return set()  # a star import binds what it binds: nothing can be said
                bound.add(alias.asname or alias.name.split(".")[0])
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            bound.update(node.names)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            bound.add(node.name)
        elif isinstance(node, (ast.MatchAs, ast.MatchStar)) and node.name:
            bound.add(node.name)
        elif isinstance(node, ast.MatchMapping) and node.rest:
            bound.add(node.rest)
    return read - bound


def _valid_source(tree: ast.Module) -> str | None:
    try:
        text = ast.unparse(ast.fix_missing_locations(tree))
        compile(text, "<candidate>", "exec")
    except (SyntaxError, ValueError, RecursionError):
        return None
    return text


def _blocks(tree: ast.AST) -> list[list[ast.stmt]]:
    """Every statement list of `tree` (a module's, a function's, a branch's), outermost first, in
    an order a deep copy of `tree` repeats."""
    found = []
    for node in ast.walk(tree):
        for field in _BLOCK_FIELDS:
            block = getattr(node, field, None)
            if isinstance(block, list) and block and isinstance(block[0], ast.stmt):
                found.append(block)
    return found


def _deletions(tree: ast.Module) -> Iterator[ast.Module]:
    """`tree` less a run of statements of one block: halves first, then smaller runs, down to one."""
    for index, block in enumerate(_blocks(tree)):
        size = len(block)
        while size >= 1:
            for start in range(0, len(block), size):
                smaller = copy.deepcopy(tree)
                target = _blocks(smaller)[index]
                del target[start:start + size]
                if not target:
                    target.append(ast.Pass())
                yield smaller
            size //= 2


def _unwrapped_blocks(tree: ast.Module) -> Iterator[ast.Module]:
    """`tree` with one `if`/`for`/`while`/`with`/`try` replaced by its body (an `if` by its `else` too)."""
    for index, block in enumerate(_blocks(tree)):
        for position, statement in enumerate(block):
            if not isinstance(statement, (ast.If, ast.For, ast.While, ast.With, ast.Try)):
                continue
            bodies = [statement.body] + ([statement.orelse] if isinstance(statement, ast.If) and statement.orelse
                                         else [])
            for which in range(len(bodies)):
                smaller = copy.deepcopy(tree)
                target = _blocks(smaller)[index]
                replaced = target[position]
                body = replaced.body if which == 0 else replaced.orelse  # type: ignore[union-attr]
                target[position:position + 1] = body
                yield smaller


def _smaller_integers(tree: ast.Module) -> Iterator[ast.Module]:
    """`tree` with integer literals above 1 made 1, else half as big: every literal of one value at
    once first (a size a script writes in several places), then one literal at a time."""
    literals = _integer_literals(tree)
    for value in dict.fromkeys(literal.value for literal in literals):
        for smaller_value in _smaller_values(value):
            smaller = copy.deepcopy(tree)
            for literal in _integer_literals(smaller):
                if literal.value == value:
                    literal.value = smaller_value
            yield smaller
    for index, literal in enumerate(literals):
        for smaller_value in _smaller_values(literal.value):
            smaller = copy.deepcopy(tree)
            _integer_literals(smaller)[index].value = smaller_value
            yield smaller


def _simpler_expressions(tree: ast.Module, raising: str | None = None) -> Iterator[ast.Module]:
    """`tree` with one expression replaced by a part of it, outermost first: a method call by what
    it is called on (`x.nonzero().sum()` is `x.nonzero()`), a call by one of its arguments
    (`torch.relu(x)` is `x`) or less one keyword argument, an operation by an operand (`a + b`,
    `-a`, `a and b`, `b if c else a`), a subscript by what it subscripts, a list, tuple or set
    literal by a half of it or, short, by itself less one element. A module's function is
    never replaced by the module (`torch.relu(x)` is not `torch`), nor is anything in the line that
    raised (`raising`: the failure is held to that line's text, which any change there breaks)."""
    modules = _imported_names(tree)
    holders = list(ast.walk(tree))
    lines = _statement_lines(tree)
    for index, (field, position) in _expression_slots(tree):
        if raising is not None and lines.get(id(holders[index])) == raising:
            continue
        node = _slot(holders[index], field, position)
        shorten = not _unpacked(holders[index], field)
        for which in range(len(_parts(node, modules, shorten=shorten))):
            smaller = copy.deepcopy(tree)
            parent = list(ast.walk(smaller))[index]
            replacement = _parts(_slot(parent, field, position), modules, shorten=shorten)[which]
            if position is None:
                setattr(parent, field, replacement)
            else:
                getattr(parent, field)[position] = replacement
            yield smaller


def _statement_lines(tree: ast.AST) -> dict[int, str]:
    """For each node of `tree` (by id), the first line of the innermost statement holding it, as
    the candidates are written (ast.unparse)."""
    lines: dict[int, str] = {}
    for statement in ast.walk(tree):  # outer statements first: an inner one overwrites
        if isinstance(statement, ast.stmt):
            text = ast.unparse(statement).split("\n", 1)[0].strip()
            for node in ast.walk(statement):
                lines[id(node)] = text
    return lines


def _expression_slots(tree: ast.AST) -> list[tuple[int, tuple[str, int | None]]]:
    """Where `tree` holds an expression: (the holder's index in `ast.walk` order, (its field, the
    position in a list field or None)), outermost first; `ast.walk` of a deep copy repeats it."""
    slots = []
    for index, node in enumerate(ast.walk(tree)):
        for field, value in ast.iter_fields(node):
            if isinstance(value, ast.expr):
                slots.append((index, (field, None)))
            elif isinstance(value, list):
                slots += [(index, (field, position)) for position, item in enumerate(value)
                          if isinstance(item, ast.expr)]
    return slots


def _slot(holder: ast.AST, field: str, position: int | None) -> ast.expr:
    value = getattr(holder, field)
    return value if position is None else value[position]


def _unpacked(holder: ast.AST, field: str) -> bool:
    """Whether `holder`'s `field` is unpacked into names (`a, b = (x, y)`): a shorter literal there
    could only fail to unpack."""
    return isinstance(holder, ast.Assign) and field == "value" and \
        any(isinstance(target, (ast.Tuple, ast.List)) for target in holder.targets)


def _parts(node: ast.expr, modules: set[str], *, shorten: bool = True) -> list[ast.expr]:
    """The simpler expressions `node` may be replaced by (fresh copies): see `_simpler_expressions`;
    a literal's shorter versions only with `shorten`."""
    parts: list[ast.expr] = []
    if isinstance(node, ast.Call):
        receiver = node.func.value if isinstance(node.func, ast.Attribute) else None
        if receiver is not None and not _names_a_module(receiver, modules):
            parts.append(receiver)
        parts += [argument for argument in node.args if not isinstance(argument, ast.Starred)]
        for position in range(len(node.keywords)):
            fewer = copy.deepcopy(node)
            del fewer.keywords[position]
            parts.append(fewer)
    elif isinstance(node, ast.BinOp):
        parts += [node.left, node.right]
    elif isinstance(node, ast.UnaryOp):
        parts.append(node.operand)
    elif isinstance(node, ast.BoolOp):
        parts += node.values
    elif isinstance(node, ast.IfExp):
        parts += [node.body, node.orelse]
    elif isinstance(node, ast.Subscript):
        parts.append(node.value)
    elif shorten and isinstance(node, (ast.List, ast.Tuple, ast.Set)) and len(node.elts) >= 2 \
            and not isinstance(getattr(node, "ctx", None), ast.Store) \
            and not any(isinstance(element, ast.Starred) for element in node.elts):
        elements = node.elts
        middle = (len(elements) + 1) // 2
        shorter = [elements[:middle], elements[middle:]]
        if 3 <= len(elements) <= _FEWEST_ELEMENTS_ONE_BY_ONE:
            shorter += [elements[:position] + elements[position + 1:] for position in range(len(elements))]
        context = {"ctx": node.ctx} if isinstance(node, (ast.List, ast.Tuple)) else {}
        parts += [type(node)(elts=chosen, **context) for chosen in shorter]
    return [copy.deepcopy(part) for part in parts]


# A list, tuple or set literal this long or shorter is also offered less each one of its elements;
# any literal, either half of it (a shape `[2, 3, 64, 64]`, a data array the failure needs a few of).
_FEWEST_ELEMENTS_ONE_BY_ONE = 8


def _imported_names(tree: ast.AST) -> set[str]:
    return {alias.asname or alias.name.split(".")[0] for node in ast.walk(tree)
            if isinstance(node, (ast.Import, ast.ImportFrom)) for alias in node.names}


def _names_a_module(node: ast.expr, modules: set[str]) -> bool:
    """`torch`, `torch.nn.functional`: a name an import binds, or an attribute chain from one."""
    while isinstance(node, ast.Attribute):
        node = node.value
    return isinstance(node, ast.Name) and node.id in modules


def _integer_literals(tree: ast.AST) -> list[ast.Constant]:
    return [node for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and type(node.value) is int and node.value > 1]


def _smaller_values(value: int) -> list[int]:
    return [smaller for smaller in dict.fromkeys((1, value // 2)) if smaller < value]


def main(argv: list[str] | None = None) -> int:
    """`python -m minify_client.reduce SCRIPT [ARGS...]` (also `minify-client reduce`)."""
    parser = argparse.ArgumentParser(prog="minify-client reduce", description=DESCRIPTION)
    add_arguments(parser)
    return run_command(parser.parse_args(argv))


DESCRIPTION = ("Write the smallest script that still fails the way SCRIPT does under torch.compile, and passes "
               "without it (for failures no captured graph holds: dynamo's, AOT autograd's runtime wrappers').")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The command's arguments, on `parser`."""
    parser.add_argument("script", help="the failing Python script, or a failing test as pytest names it "
                                       "(FILE::TEST, FILE::CLASS::TEST[PARAMS])")
    parser.add_argument("args", nargs="*", help="its arguments (pytest's, for a test; after --)")
    parser.add_argument("--out", type=Path, help="where to write the result (default: beside SCRIPT, <name>.min.py; "
                                                 "for a test, <name>_min.py)")
    parser.add_argument("--jobs", type=int, default=2, help="scripts run at once (default 2)")
    bound = parser.add_mutually_exclusive_group()
    bound.add_argument("--timeout", type=float,
                       help="seconds one run may take (default: 3x the first run, at least 30); a run past it counts "
                            "as not failing")
    bound.add_argument("--hang", type=float, metavar="SECONDS",
                       help="the failure to keep is a hang: SCRIPT runs past SECONDS under torch.compile (it is "
                            "stopped then) and ends within them without it")
    parser.add_argument("--budget", type=float, default=1800.0, help="seconds for the whole reduction (default 1800)")


def run_command(args: argparse.Namespace) -> int:
    """Run the command for parsed `args`; its exit status (2: the script cannot be reduced)."""
    file, _, test = str(args.script).partition("::")
    script = Path(file)
    # A test file's result must import as a module for pytest to run it: `test_x_min.py`.
    out: Path = args.out or script.with_name(f"{script.stem}_min.py" if test else f"{script.stem}.min.py")
    try:
        reduced = reduce_script(script, args.args, jobs=args.jobs, timeout_s=args.timeout, budget_s=args.budget,
                                on_progress=lambda text: print(text, file=sys.stderr, flush=True), test=test or None,
                                hang_s=args.hang)
    except (OSError, SyntaxError, ReduceRefused) as error:
        print(f"minify-client reduce: {error}", file=sys.stderr)
        return 2
    out.write_text(reduced.source)
    ending = "" if reduced.finished else " (the budget ran out: the smallest so far)"
    target = f"{script}::{test}" if test else str(script)
    print(f"reduced {target} from {reduced.lines_before} to {reduced.lines_after} lines in {reduced.runs} runs, "
          f"{reduced.seconds:.0f} s{ending}: {out}\n" + (
              f"it runs past {args.hang:g} s under torch.compile, and ends within them without it" if args.hang else
              f"it fails with {reduced.failure.describe()}, and passes without {reduced.passes_without}")
          + reduced.meaning())
    return 0


if __name__ == "__main__":
    sys.exit(main())
