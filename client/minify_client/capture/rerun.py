"""What runs inside one rerun of a failure no captured graph holds (capture/diagnose.py): the
program or test runs as the user ran it, and how it ended is written as JSON to `$MINIFY_RERUN_OUT`:
`{"failed": bool, "signature": "Type: key" | null, "raised_in": "torch.export" | null}` (the signature
as `signatures.signature_line` writes it, so it compares with the user's own failure; `raised_in`:
the torch module the program called when the error was raised, so that a failure inside
`torch.export`, which the program calls itself and `TORCHDYNAMO_DISABLE` does not turn off, is not
taken for the program's own), and for a script that failed, `raised_at`: the source line of the
script that raised (`reduce` holds a smaller script to the same statement).

- `python -c BY_PATH .../rerun.py script.py args...` (`diagnose.script_command`; or `python -m
  minify_client.capture.rerun script.py args...`, which imports the whole client first): the script
  as `python script.py` runs it (runpy, as `__main__`, its argv and exit code);
- `pytest -p minify_client.capture.rerun NODEID`: the test's error, as a plugin (no test that
  passes writes anything: the parent reads pytest's exit status), and `raised_at`, the line of the
  test's file that raised; `python -c BY_PATH .../rerun.py --pytest NODEID -p
  minify_client.capture.rerun ...` runs it so (`reduce` on a test, `diagnose.pytest_command`);
- `python -c BY_PATH .../rerun.py --serve MODULES...` (`serve`, driven through `Server`): a fork
  server that imports MODULES (torch) once and runs each of many runs above in a child of its own.
"""

from __future__ import annotations

import ast
import json
import linecache
import os
import runpy
import sys
import traceback
from pathlib import Path
from typing import Any

from minify_contract import signatures

OUT_ENV = "MINIFY_RERUN_OUT"
# This module as a pytest plugin (`-p PLUGIN`), by its name also where it runs as `__main__`.
PLUGIN = "minify_client.capture.rerun"
# Set in a run where torch.export.export must not trace: it hands back the module to run as it is
# (`reduce`'s reference run for a failure inside torch.export, which TORCHDYNAMO_DISABLE leaves on).
EAGER_EXPORT_ENV = "MINIFY_RERUN_EAGER_EXPORT"
_EXPORT_ENTRY_POINTS = ("export", "export_for_training", "draft_export")
# Runs this file as `__main__` from its path, its arguments after it: no package of the client is
# imported (this module needs only minify_contract's signatures).
BY_PATH = "import os, runpy, sys; sys.path[0] = os.getcwd(); runpy.run_path(sys.argv.pop(1), run_name='__main__')"


# What a rerun leaves out of the user's environment: the capture's own switches (a rerun captures
# nothing), pytest's per-test variables, and torch's settings that the rerun itself chooses.
_NOT_INHERITED = ("MINIFY_CAPTURE", "MINIFY_SERVER", "PYTEST_XDIST", "PYTEST_CURRENT_TEST", "TORCH_BISECT",
                  "TORCHDYNAMO_DISABLE", OUT_ENV, EAGER_EXPORT_ENV)


class EagerExport:
    """What torch.export.export gives a run with EAGER_EXPORT_ENV set: the module it was handed, run
    as it is (`module()`, or called), in place of a traced program. A script that goes further
    with the program (saving it, reading its graph) fails there, and so is not reduced against this."""

    def __init__(self, module: Any, args: Any = (), kwargs: Any = None) -> None:
        self._module = module
        self.example_inputs = (tuple(args or ()), dict(kwargs or {}))

    def module(self, *args: Any, **kwargs: Any) -> Any:
        return self._module

    def run_decompositions(self, *args: Any, **kwargs: Any) -> EagerExport:
        return self

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._module(*args, **kwargs)


def export_eagerly() -> None:
    """torch.export's entry points, for the rest of this process, hand back `EagerExport`s."""
    import torch.export

    def export(module: Any, args: Any = (), kwargs: Any = None, *rest: Any, **options: Any) -> EagerExport:
        return EagerExport(module, args, kwargs)

    for name in _EXPORT_ENTRY_POINTS:
        if hasattr(torch.export, name):
            setattr(torch.export, name, export)


# The modules a run's failure was raised inside (`torch_entry`) when it is torch.export's: the program
# called torch.export itself, which TORCHDYNAMO_DISABLE leaves on.
EXPORT_MODULES = ("torch.export", "torch._export")


def raised_inside_export(raised_in: str | None) -> bool:
    """Whether a run that failed inside the torch module `raised_in` (`torch_entry`) failed in torch.export."""
    return raised_in is not None and raised_in.startswith(EXPORT_MODULES)


# torch.export's ways of refusing a program as written, by exception type: a guard on a value only
# known when the program runs (data-dependent control flow or sizes: torch.cond, torch._check), a
# user error (dynamic control flow, an input or output export does not take), what strict export's
# dynamo cannot trace, a dynamic dim the program constrains. Export's documentation tells the
# program how to change for each; anything else raised inside torch.export (a KeyError, an
# AssertionError, an internal error) is export's own failure.
EXPORT_REFUSALS = frozenset({"GuardOnDataDependentSymNode", "UserError", "Unsupported", "ConstraintViolationError"})
# How a program changes for them, as the diagnosis and `reduce` say it.
EXPORT_REFUSAL_REMEDIES = ("torch.cond for a branch on a tensor's value, torch._check for a size known only at run "
                           "time, strict=False for what strict tracing refuses")


def export_refusal(signature: str | None) -> str | None:
    """The exception type of `signature` ("Type: key", as `signatures.signature_line` writes it)
    where it is one of torch.export's refusals (`EXPORT_REFUSALS`), else None."""
    kind = (signature or "").split(":", 1)[0].strip().rsplit(".", 1)[-1]
    return kind if kind in EXPORT_REFUSALS else None


def environment(settings: dict[str, str]) -> dict[str, str]:
    """The environment of a rerun: this process's, less what it must not inherit, with `settings`."""
    return {**{key: value for key, value in os.environ.items() if not key.startswith(_NOT_INHERITED)}, **settings}


def torch_entry(error: BaseException) -> str | None:
    """The torch module the program called into when `error` was raised ("torch.export",
    "torch.nn.modules.module"): the outermost frame of its traceback inside torch's package."""
    torch = sys.modules.get("torch")
    if torch is None or not getattr(torch, "__file__", None):
        return None
    root = os.path.dirname(torch.__file__) + os.sep
    for frame, _ in traceback.walk_tb(error.__traceback__):
        filename = frame.f_code.co_filename
        if filename.startswith(root):
            module = filename[len(root):].removesuffix(".py").replace(os.sep, ".")
            return "torch." + module.removesuffix(".__init__")
    return None


def raised_at(error: BaseException, script: str) -> str | None:
    """The source text of the line of `script` that raised `error` (its innermost frame in that
    file): which statement failed, whatever the message says."""
    path = os.path.abspath(script)
    line = None
    for frame, lineno in traceback.walk_tb(error.__traceback__):
        if os.path.abspath(frame.f_code.co_filename) == path:
            line = linecache.getline(path, lineno).strip() or None
    return line


def record(error: BaseException | None, script: str | None = None) -> None:
    path = os.environ.get(OUT_ENV)
    if not path:
        return
    signature = signatures.signature_line(error) if error is not None else None
    raised_in = torch_entry(error) if error is not None else None
    written = {"failed": error is not None, "signature": signature, "raised_in": raised_in}
    if error is not None and script is not None:
        written["raised_at"] = raised_at(error, script)
    with open(path, "w") as out:
        json.dump(written, out)


def read_record(path: str | os.PathLike[str]) -> dict[str, Any] | None:
    """What a rerun wrote to its `OUT_ENV` file, or None where it wrote nothing (it passed as a
    pytest test, or died before it could)."""
    try:
        with open(path) as file:
            written = json.load(file)
    except (OSError, ValueError):
        return None
    return written if isinstance(written, dict) else None


def pytest_exception_interact(node: Any, call: Any, report: Any) -> None:
    if report.when == "call" and call.excinfo is not None:
        path = getattr(node, "path", None)  # the test's file: `raised_at` is its line that raised
        record(call.excinfo.value, str(path) if path is not None else None)


def serve(modules: list[str]) -> int:
    """A fork server for many runs of scripts (`minify_client.reduce`, the diagnosis's stages): import
    `modules` once (torch costs seconds a run), then for each request read from stdin, a JSON line
    `{"argv", "out", "timeout_s", "settings", "cwd" or "script", "log"?}` (`settings`: that run's own
    environment variables), fork a child that runs `main(argv)` (the script, or `--pytest NODEID
    ...`) from `cwd` (else the script's folder), its output to `log` (else discarded) and its
    record to `out`, wait for it (killed once past `timeout_s`), and answer on stdout with a JSON
    line `{"returncode": N, "timed_out": bool}` (a death by a signal: minus its number). The
    server itself runs nothing else, with one exception: once a run tells it (over a pipe of its
    own) that it compiled with inductor on the CPU, the server runs inductor's vector-ISA probe
    before the next fork (`probe_vec_isa`: 2 CPU-s that every such run paid again), so the runs
    after it start with the probe's answer, which is the machine's and not a run's, as the
    sandbox's candidates do. No run leaves anything else to the next."""
    import gc
    import importlib
    import signal
    import time

    for name in modules:
        try:
            importlib.import_module(name)
        except Exception:  # the script's own run will say so
            pass
    if "pytest" in modules:
        _import_pytest_plugins()
    # Every child inherits what is here: its collections (pytest runs three as it ends) need not
    # walk torch's objects again (gc.freeze: what a server that forks is meant to do).
    gc.freeze()
    answers = sys.stdout
    probe_due = probed = False
    for line in sys.stdin:
        request = json.loads(line)
        if probe_due and not probed:  # the runs before this one compiled with inductor: probe once, for all after
            probe_vec_isa()
            gc.freeze()
            probed = True
        hear, tell = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(hear)
            _run_forked(request, tell)
        os.close(tell)
        deadline = time.monotonic() + float(request["timeout_s"])
        timed_out = False
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            if time.monotonic() > deadline:
                timed_out = True
                os.kill(pid, signal.SIGKILL)
                _, status = os.waitpid(pid, 0)
                break
            time.sleep(0.005)
        probe_due = probe_due or told(hear)
        os.close(hear)
        answers.write(json.dumps({"returncode": os.waitstatus_to_exitcode(status), "timed_out": timed_out}) + "\n")
        answers.flush()
    return 0


def told(read_end: int) -> bool:
    """Whether the child that just ended wrote "1" to its end of the pipe (`_run_forked`: it probed
    the vector ISA); without waiting for a process of its own that may still hold that end."""
    os.set_blocking(read_end, False)
    try:
        return os.read(read_end, 1) == b"1"
    except OSError:
        return False


def vec_isa_probed() -> bool:
    """Whether this process ran inductor's CPU vector-ISA probe (`valid_vec_isa_list`, cached for
    the process: a dozen `python -c` dlopen checks and compiler queries, about 2 CPU-s, in every
    process that compiles with inductor on the CPU) with the choice left to it (`cpp.vec_isa_ok`
    unset, as in a program that does not set it)."""
    isa = sys.modules.get("torch._inductor.cpu_vec_isa")
    config = sys.modules.get("torch._inductor.config")
    try:
        return (isa is not None and config is not None and config.cpp.vec_isa_ok is None
                and isa.valid_vec_isa_list.cache_info().currsize > 0)
    except AttributeError:  # another torch's layout: nothing to share
        return False


def probe_vec_isa() -> None:
    """Run inductor's CPU vector-ISA probe in this process (a fork server, once a run compiled with
    inductor on the CPU), so that every run forked after it inherits the answer, as the sandbox's
    fork server probes before its candidates. Its answer depends on the machine and its compiler
    alone."""
    try:
        import torch._inductor.cpu_vec_isa as cpu_vec_isa

        cpu_vec_isa.valid_vec_isa_list()
    except Exception:  # the runs probe for themselves, as before
        pass


# What a script's first torch.compile imports (dynamo, inductor's compiler): 1.4 of a run's 1.8 s
# here for a script that compiles with the eager backend, and the same in every run. With
# TORCHDYNAMO_DISABLE=1 too, torch.compile looks its backend up, which imports dynamo's backends
# (backends.common, and with it aot_autograd): 0.2 s of every run without the compiler.
COMPILER_MODULES = ("torch._dynamo", "torch._dynamo.backends.common", "torch._inductor.compile_fx")


def preloaded_modules(*trees: ast.Module) -> list[str]:
    """What a fork server (`serve`) imports once for runs of the code in `trees` (a script; a test
    file and its conftest.py files): the torch modules they import at their top level and, with
    torch, what its torch.compile will import. Nothing else: the program's own modules run in every
    child. Nothing at all where any of them may change the environment (`os.environ[...] = ...`,
    `putenv`; reading a variable is fine): torch reads variables when these modules are imported,
    which in a server would be before the program set them, so each run is a fresh interpreter."""
    if any(_changes_environment(tree) for tree in trees):
        return []
    names = []
    for statement in (statement for tree in trees for statement in tree.body):
        if isinstance(statement, ast.Import):
            names += [alias.name for alias in statement.names]
        elif isinstance(statement, ast.ImportFrom) and statement.module and not statement.level:
            names.append(statement.module)
    modules = [name for name in dict.fromkeys(names) if name == "torch" or name.startswith("torch.")]
    return [*modules, *(name for name in COMPILER_MODULES if name not in modules)] if modules else []


def conftests(test_file: Path, root: Path | None = None) -> list[Path]:
    """The conftest.py files pytest may load for `test_file`, outermost first: in its folder and
    each folder above it (up to `root`, where given)."""
    folders = [folder for folder in test_file.resolve().parents
               if root is None or folder == root.resolve() or folder.is_relative_to(root.resolve())]
    return [folder / "conftest.py" for folder in reversed(folders) if (folder / "conftest.py").is_file()]


def server_modules(sources: list[Path] | tuple[Path, ...], *, pytest: bool = False) -> list[str]:
    """What a server imports for runs of the program in `sources` (a script; a test file and the
    conftest.py files above it, `conftests`): `preloaded_modules` of them, none where one cannot be
    read or parsed; for a test, with pytest and this module, the plugin each run loads (`-p`: the
    client's package, 0.15 s a run)."""
    trees = parsed(sources)
    modules = preloaded_modules(*trees) if trees is not None else []
    return [*modules, "pytest", PLUGIN] if modules and pytest else modules


def parsed(paths: list[Path] | tuple[Path, ...]) -> list[ast.Module] | None:
    """The files at `paths` parsed (for `preloaded_modules`); None where one cannot be read or parsed:
    what it does is unknown, so its runs are fresh."""
    trees = []
    for path in paths:
        try:
            trees.append(ast.parse(path.read_text(), filename=str(path)))
        except (OSError, SyntaxError, ValueError):
            return None
    return trees


def _changes_environment(tree: ast.AST) -> bool:
    """Whether the code may change its environment: `putenv` or `unsetenv` named at all, or
    `environ` (`os.environ`, or by name) used for anything but reading one variable
    (`environ.get(...)`, `environ[...]`, `... in environ`): a write, a method that writes, or the
    mapping handed elsewhere."""
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    for node in ast.walk(tree):
        named = node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else None
        if named in _ENVIRONMENT_CHANGES or (isinstance(node, ast.alias) and node.name in _ENVIRONMENT_CHANGES):
            return True
        if isinstance(node, ast.alias) and node.name in _ENVIRONMENT and node.asname:  # its uses go unseen
            return True
        if named in _ENVIRONMENT and not _reads_one_variable(node, parents):
            return True
    return False


def _reads_one_variable(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> bool:
    parent = parents.get(node)
    if isinstance(parent, ast.Subscript) and parent.value is node:
        return isinstance(parent.ctx, ast.Load)
    if isinstance(parent, ast.Attribute) and parent.attr == "get":
        call = parents.get(parent)
        return isinstance(call, ast.Call) and call.func is parent
    return (isinstance(parent, ast.Compare) and len(parent.ops) == 1 and isinstance(parent.ops[0], (ast.In, ast.NotIn))
            and parent.comparators[0] is node)


_ENVIRONMENT = frozenset({"environ", "environb"})
_ENVIRONMENT_CHANGES = frozenset({"putenv", "unsetenv"})


class Server:
    """A `serve` process, seen from the process that hands it runs: started from `cwd` with
    `environment` and `modules` imported; `run` sends one request and waits for its answer."""

    def __init__(self, modules: list[str], *, cwd: str | os.PathLike[str], environment: dict[str, str]) -> None:
        import subprocess

        self._process = subprocess.Popen([sys.executable, "-c", BY_PATH, __file__, "--serve", *modules], cwd=cwd,
                                         env=environment, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=subprocess.DEVNULL, text=True)

    def alive(self) -> bool:
        return self._process.poll() is None

    def run(self, request: dict[str, Any]) -> dict[str, Any] | None:
        """The server's answer to `request` (`{"returncode": N, "timed_out": bool}`, see `serve`), or
        None where the server is gone: that run is for a fresh interpreter."""
        assert self._process.stdin is not None and self._process.stdout is not None
        try:
            self._process.stdin.write(json.dumps(request) + "\n")
            self._process.stdin.flush()
            answer = self._process.stdout.readline()
        except OSError:
            return None
        return json.loads(answer) if answer else None

    def close(self) -> None:
        self._process.kill()
        self._process.wait()


def _import_pytest_plugins() -> None:
    """The plugins pytest loads at every start (its `pytest11` entry points: 0.8 s a run here, most
    of it importing them and rewriting their asserts), imported once in the server instead; pytest
    then finds them imported (its warning that it cannot rewrite them is silenced by the runs)."""
    from importlib.metadata import entry_points

    for entry in entry_points(group="pytest11"):
        try:
            entry.load()
        except Exception:  # pytest will say so in the run
            pass


def _run_forked(request: dict[str, Any], tell: int) -> None:
    """In a child of `serve`: run the request's script, then end with its exit code, having told
    the server on `tell` whether the run probed the CPU's vector ISA (`vec_isa_probed`)."""
    code = 1
    try:
        quiet = os.open(os.devnull, os.O_RDWR)
        log = request.get("log")
        output = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644) if log else quiet
        for stream, source in ((0, quiet), (1, output), (2, output)):
            os.dup2(source, stream)
        os.environ[OUT_ENV] = request["out"]
        os.environ.update(request.get("settings") or {})
        _settings_read_on_import()
        os.chdir(request.get("cwd") or os.path.dirname(request["script"]))
        code = main(request["argv"])
    finally:
        try:
            if vec_isa_probed():
                os.write(tell, b"1")
        finally:
            os._exit(code if isinstance(code, int) else 1)


def _settings_read_on_import() -> None:
    """What torch read from the environment when the server imported it, read again now that this
    run's settings are set: whether its compiler bisector is on (`TORCH_BISECT_*`, computed when
    torch._inductor.compiler_bisector is imported; the backend itself it reads at each
    torch.compile, as dynamo reads TORCHDYNAMO_DISABLE at each call)."""
    bisector = sys.modules.get("torch._inductor.compiler_bisector")
    if bisector is not None and hasattr(bisector, "get_is_bisection_enabled"):
        bisector.CompilerBisector.bisection_enabled = bisector.get_is_bisection_enabled()


def main(argv: list[str]) -> int:
    if argv[:1] == ["--serve"]:
        return serve(argv[1:])
    if os.environ.get(EAGER_EXPORT_ENV) == "1":
        export_eagerly()
    if argv[:1] == ["--pytest"]:  # `--pytest NODEID ARGS...`: one test, its failure recorded by this plugin
        import pytest

        return int(pytest.main(argv[1:]))
    script, *args = argv
    sys.argv = [script, *args]
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as exit_:
        failed = exit_.code not in (None, 0)
        record(exit_ if failed else None, script)
        return exit_.code if isinstance(exit_.code, int) else int(failed)
    except BaseException as error:
        record(error, script)
        traceback.print_exc()
        return 1
    record(None)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
