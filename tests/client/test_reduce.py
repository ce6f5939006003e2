"""`minify-client reduce`: the smallest script that still fails the same way, for failures no
captured graph holds (dynamo's guards and replays, AOT autograd's runtime wrappers).

Scripts here fail "under the compiler" the way such bugs do: only when torch.compile is on, and
not with `TORCHDYNAMO_DISABLE=1`. The family: a wrong value (an `AssertionError` whose message
holds the values, which a smaller script changes), an error (held to its signature), a death (held
to its signal), and a real dynamo bug (pytorch#197811: two closures over different Tensor methods
share one graph, on backend "eager"). What must never happen: the reduction keeping a change that
makes the script fail without the compiler too (drift into the script's own bug), or writing the
user's script.
"""

from __future__ import annotations

import ast
import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from minify_client.reduce import ReduceRefused, Run, _simpler_expressions, reduce_script, same_failure

COMPILED_ONLY = 'os.environ.get("TORCHDYNAMO_DISABLE") != "1"'

WRONG_VALUE = f'''"""A sum that is off by one only "under the compiler"."""
import os


def noise():
    return [i * i for i in range(100)]


data = list(range(40))
total = sum(data)  # the sum
unused = noise()
print("working on", len(data))
expected = sum(range(40))
if {COMPILED_ONLY}:
    total += 1
for item in unused[:3]:
    total += 0
assert total == expected, f"compiled {{total}} != eager {{expected}}"
'''

ERROR = f'''import os
import json

settings = json.loads('{{"depth": 3}}')
names = ["a", "b", "c"]
if {COMPILED_ONLY}:
    names = names[:2]
for name in names:
    print(name)
lookup = dict(zip(names, range(8)))
value = lookup["c"]
'''

DEATH = f'''import os
import signal

sizes = [4, 8, 16]
doubled = [size * 2 for size in sizes]
if {COMPILED_ONLY}:
    os.kill(os.getpid(), signal.SIGABRT)
print(doubled)
'''

# Unwrapping the `if` (its body always run) keeps the same AssertionError at the same statement,
# but then the script fails without the compiler too: the guard must refuse that change.
DRIFT = f'''import os

expected = 3
value = expected
if {COMPILED_ONLY}:
    value += 1
assert value == expected
'''


# A compile that never ends, "under the compiler" only (pytorch#148073's lowering doubles its work
# with each step of a chain): the failure `--hang` keeps. It waits rather than spins: a loop's body
# is deleted to `pass` while it still hangs, and every later hanging run then spun a core to its bound.
HANG = f'''import os
import threading

sizes = [4, 8, 16]
doubled = [size * 2 for size in sizes]
print("working on", doubled)
if {COMPILED_ONLY}:
    threading.Event().wait()
print("done")
'''


def _write(folder: Path, source: str, name: str = "script.py") -> Path:
    path = folder / name
    path.write_text(source)
    return path


def _run(script: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, script.name], cwd=script.parent, capture_output=True, text=True,
                          env={**os.environ, **env}, timeout=300)


def test_a_wrong_value_is_reduced_to_what_it_needs(tmp_path: Path) -> None:
    script = _write(tmp_path, WRONG_VALUE)
    before = hashlib.sha256(script.read_bytes()).hexdigest()

    reduced = reduce_script(script, jobs=2)

    assert reduced.finished and reduced.lines_after < reduced.lines_before
    assert "noise" not in reduced.source and "print" not in reduced.source and "for item" not in reduced.source
    assert "TORCHDYNAMO_DISABLE" in reduced.source and "total += 1" in reduced.source
    assert "range(40)" not in reduced.source  # both 40s made 1 at once: one size written twice
    assert reduced.failure.raised_at is not None and reduced.failure.raised_at.startswith("assert total == expected")
    # The user's script is as it was, and no candidate is left beside it.
    assert hashlib.sha256(script.read_bytes()).hexdigest() == before
    assert sorted(path.name for path in tmp_path.iterdir()) == ["script.py"]
    result = _write(tmp_path, reduced.source, "script.min.py")
    assert "AssertionError: compiled" in _run(result).stderr
    assert _run(result, TORCHDYNAMO_DISABLE="1").returncode == 0


def test_an_error_is_held_to_its_signature_and_a_death_to_its_signal(tmp_path: Path) -> None:
    error = reduce_script(_write(tmp_path, ERROR, "error.py"), jobs=2)
    assert error.failure.signature == "KeyError: 'c'"
    assert "json" not in error.source and "print" not in error.source
    assert "KeyError: 'c'" in _run(_write(tmp_path, error.source, "error.min.py")).stderr

    death = reduce_script(_write(tmp_path, DEATH, "death.py"), jobs=2)
    assert death.failure.signature == "SIGABRT"
    assert "doubled" not in death.source and "sizes" not in death.source
    assert _run(_write(tmp_path, death.source, "death.min.py")).returncode == -6


def test_a_change_that_fails_without_the_compiler_too_is_never_kept(tmp_path: Path) -> None:
    reduced = reduce_script(_write(tmp_path, DRIFT), jobs=2)

    assert "TORCHDYNAMO_DISABLE" in reduced.source  # the `if` stays: without it the script is simply wrong
    result = _write(tmp_path, reduced.source, "script.min.py")
    assert _run(result, TORCHDYNAMO_DISABLE="1").returncode == 0 and _run(result).returncode != 0


@pytest.mark.parametrize(("source", "reason"), [
    ("x = 1\n", "passes: there is no failure to keep"),
    ("raise ValueError('always')\n", "fails without torch.compile too (TORCHDYNAMO_DISABLE=1: ValueError: always"),
])
def test_a_script_that_is_not_the_compilers_bug_is_refused_by_the_command(tmp_path: Path, source: str,
                                                                         reason: str) -> None:
    script = _write(tmp_path, source)

    done = subprocess.run([sys.executable, "-m", "minify_client.cli", "reduce", str(script)],
                          capture_output=True, text=True, timeout=120)

    assert done.returncode == 2, done.stderr
    assert reason in done.stderr
    assert not (tmp_path / "script.min.py").exists()


def test_the_command_writes_the_result_where_it_is_told(tmp_path: Path) -> None:
    script = _write(tmp_path, DEATH)
    out = tmp_path / "out" / "smallest.py"
    out.parent.mkdir()

    done = subprocess.run([sys.executable, "-m", "minify_client.cli", "reduce", str(script), "--out", str(out)],
                          capture_output=True, text=True, timeout=300)

    assert done.returncode == 0, done.stderr
    assert f"reduced {script} from 7 to" in done.stdout and str(out) in done.stdout
    assert "reduce: script.py fails with SIGABRT" in done.stderr  # progress, on stderr
    assert out.is_file() and not (tmp_path / "script.min.py").exists()


@pytest.mark.waits
def test_a_hang_is_reduced_to_what_keeps_it_running_past_the_bound_and_a_script_that_ends_is_refused(
        tmp_path: Path) -> None:
    """`--hang SECONDS` (the corpus's pytorch#148073, a compile that never returns, had no bound on
    reduce's first run: the reduction was killed with nothing written). Each run is stopped at the
    bound; a candidate is kept when it runs past it under the compiler and ends, passing, within
    it without."""
    script = _write(tmp_path, HANG)
    reduced = reduce_script(script, hang_s=1.0)

    assert reduced.finished and reduced.failure.timed_out
    assert "threading.Event().wait()" in reduced.source and "TORCHDYNAMO_DISABLE" in reduced.source
    assert "doubled" not in reduced.source and "print" not in reduced.source
    with pytest.raises(ReduceRefused, match=r"ends within 1 s under torch\.compile"):
        reduce_script(_write(tmp_path, "print('quick')\n", "quick.py"), hang_s=1.0)
    with pytest.raises(ReduceRefused, match=r"without torch\.compile too"):
        reduce_script(_write(tmp_path, "import threading\nthreading.Event().wait()\n", "always.py"), hang_s=1.0)


def test_the_same_failure_is_the_same_statement_and_kind() -> None:
    wrong = Run(failed=True, signature="AssertionError: compiled N != eager N", raised_at="assert a == b")
    assert same_failure(wrong, Run(failed=True, signature="AssertionError: compiled [N] != eager [N]",
                                   raised_at="assert a == b"))
    assert not same_failure(wrong, Run(failed=True, signature="AssertionError: x", raised_at="assert c"))
    assert not same_failure(wrong, Run(failed=True, signature="NameError: name 'a' is not defined",
                                       raised_at="assert a == b"))
    error = Run(failed=True, signature="KeyError: 'c'", raised_at="value = lookup['c']")
    assert not same_failure(error, Run(failed=True, signature="KeyError: 'd'", raised_at="value = lookup['c']"))
    assert not same_failure(error, Run(failed=False, timed_out=True))
    hang = Run(failed=False, timed_out=True)  # `--hang`: kept by running past the bound again
    assert same_failure(hang, Run(failed=False, timed_out=True)) and not same_failure(hang, error)


def test_a_dynamo_bug_is_reduced_to_its_two_closures(tmp_path: Path) -> None:
    """pytorch#197811 (dynamo reuses the first closure's graph for the second), padded with code it
    does not need: the result keeps the two closures and the check, and fails only under dynamo."""
    padded = '''import math

import torch


def make(op):
    def apply(x, y):
        return op(x, y)

    return apply


def main():
    weights = torch.ones(64, 64)
    add, mul = make(torch.Tensor.__add__), make(torch.Tensor.__mul__)
    x, y = torch.tensor(6.0), torch.tensor(3.0)
    print("scale", math.sqrt(2), weights.shape)
    expected = (add(x, y), mul(x, y))
    actual = (torch.compile(add, dynamic=True, backend="eager")(x, y),
              torch.compile(mul, dynamic=True, backend="eager")(x, y))
    assert all(torch.equal(a, e) for a, e in zip(actual, expected)), (
        f"compiled {[a.item() for a in actual]} != eager {[e.item() for e in expected]}")


if __name__ == "__main__":
    main()
'''
    # One run at a time: one fork server per mode, not two (some 5 CPU-s of torch's imports, more than
    # the second run slot gains on runs of 0.2 s; the same for the test file's below). Two per mode:
    # test_reduce_export.py's reductions.
    reduced = reduce_script(_write(tmp_path, padded), jobs=1)

    assert reduced.finished and reduced.lines_after < reduced.lines_before
    assert "math" not in reduced.source and "weights" not in reduced.source and "print" not in reduced.source
    assert "__add__" in reduced.source and "__mul__" in reduced.source
    result = _write(tmp_path, reduced.source, "script.min.py")
    assert "AssertionError: compiled" in _run(result).stderr
    assert _run(result, TORCHDYNAMO_DISABLE="1").returncode == 0


@pytest.mark.fast
def test_an_expression_is_offered_as_each_simpler_part_of_it_outside_the_line_that_raised() -> None:
    source = ("import torch\n"
              "def f(x):\n"
              "    return torch.nonzero(x).sum().reshape(1).float()\n"
              "y = -f(torch.randn(4, 3)) + 1\n"
              "torch.compile(f, backend='eager')(torch.randn(4, 3, dtype=torch.float64))\n")
    tree = ast.parse(source)
    raising = "torch.compile(f, backend='eager')(torch.randn(4, 3, dtype=torch.float64))"
    changed = {line for candidate in _simpler_expressions(tree, raising=raising)
               for line in ast.unparse(candidate).splitlines() if line not in ast.unparse(tree).splitlines()}

    assert "    return torch.nonzero(x).sum().reshape(1)" in changed  # a method call by its receiver
    assert "    return torch.nonzero(x)" not in changed  # one step at a time: the next round goes on
    assert "    return 1 .float()" in changed  # by an argument
    assert "y = -f(torch.randn(4, 3))" in changed and "y = 1" in changed  # an operation by an operand
    assert "y = f(torch.randn(4, 3)) + 1" in changed
    assert not any(line.strip() in ("torch", "return torch") for line in changed)  # never the module
    assert not any(line.startswith("torch.compile(") for line in changed)  # the line that raised stays
    assert sum(1 for _ in _simpler_expressions(tree)) > sum(1 for _ in _simpler_expressions(tree, raising=raising))


@pytest.mark.fast
def test_a_literal_is_offered_shorter_unless_it_is_unpacked() -> None:
    """pytorch#198056's reduction (NumPy's int8 cumsum, traced by dynamo) kept all seven elements
    of its array literal, their values made 1: a list, tuple or set literal is offered as either
    half and, when short, less each one element; one unpacked into names (`a, b = (x, y)`) and an
    assignment's own targets are not, a shorter one could only fail to unpack."""
    source = ("import numpy as np\n"
              "a, b = (1, 2)\n"
              "x = np.array([5, 6, 7, 8, 9], dtype=np.int8)\n"
              "shape = (a, b, 3)\n"
              "assert x.cumsum()[-1] == 35\n")
    tree = ast.parse(source)
    changed = {line for candidate in _simpler_expressions(tree, raising="assert x.cumsum()[-1] == 35")
               for line in ast.unparse(candidate).splitlines() if line not in ast.unparse(tree).splitlines()}

    assert {"x = np.array([5, 6, 7], dtype=np.int8)", "x = np.array([8, 9], dtype=np.int8)"} <= changed
    assert "x = np.array([5, 6, 8, 9], dtype=np.int8)" in changed  # less one element
    assert {"shape = (a, b)", "shape = (3,)", "shape = (a, 3)"} <= changed
    assert not any(line.startswith(("a, b =", "a =", "b =", "(a, b) =")) for line in changed)


@pytest.mark.fast
def test_a_reduction_keeps_the_seed_and_runs_each_candidate_without_graphs_compiled_for_another(
        tmp_path: Path) -> None:
    """pytorch#145466's reduction deleted `torch.manual_seed(0)` and delivered a script that failed
    in 1 of 3 fresh runs; #139789's kept failing on a graph an earlier candidate had put in
    inductor's FX graph cache, and its result failed in none."""
    from concurrent.futures import ThreadPoolExecutor

    from minify_client.reduce import ScriptRunner, _deletions, _first_kept

    tree = ast.parse("import torch\ntorch.manual_seed(0)\nx = torch.randn(3)\ny = x + 1\n")
    with ThreadPoolExecutor(2) as pool:  # every deletion "keeps failing": what may go, goes
        while (smaller := _first_kept(pool, 2, tree, _deletions(tree), lambda source: True, set())) is not None:
            tree = smaller
    assert ast.unparse(tree) == "import torch\ntorch.manual_seed(0)"

    environment = ScriptRunner(_write(tmp_path, "pass\n"), [], 10.0)._environment()
    assert environment["TORCHINDUCTOR_FX_GRAPH_CACHE"] == environment["TORCHINDUCTOR_AUTOGRAD_CACHE"] == "0"


class _CountingRunner:
    """A stand-in for the runs only: a program "fails under the compiler" while it still calls
    `boom()`. The passes' schedule is what is under test."""

    def __init__(self) -> None:
        self.timeout_s, self.runs, self.programs = 1.0, 0, []

    def run(self, source: str, *, compiled: bool = True) -> Run:
        self.runs += 1
        if compiled:
            self.programs.append(source.strip())
        fails = compiled and "boom()" in source
        return Run(failed=fails, signature="RuntimeError: boom" if fails else None,
                   raised_at="boom()" if fails else None)


@pytest.mark.fast
def test_no_program_is_run_twice_and_the_passes_stop_once_each_has_had_its_turn_unchanged(
        tmp_path: Path) -> None:
    """The passes went round again from the first after any change, repeating the last changing
    pass's every candidate on the same script: 103 runs for the failing test's reduction below, 70
    without the repeats, and the same result."""
    import time

    from minify_client.reduce import _reduce

    source = "import os\nx = [1, 2, 3]\nif len(x) > 2:\n    y = 40 + 2\n    boom()\nprint(x)\n"
    runner = _CountingRunner()
    reduced = _reduce(tmp_path / "script.py", ast.parse(source), runner, jobs=1, timeout_s=1.0,  # type: ignore[arg-type]
                      budget_s=60.0, say=lambda text: None, started=time.monotonic())

    assert reduced.finished and reduced.source == "boom()\n"
    assert len(runner.programs) == len(set(runner.programs))


@pytest.mark.fast
def test_the_budget_holds_inside_a_pass() -> None:
    """A pass tried every candidate before the budget was looked at again (a 300 s budget ran to 365 s)."""
    import time
    from concurrent.futures import ThreadPoolExecutor

    from minify_client.reduce import _deletions, _first_kept

    tree = ast.parse("a = 1\nb = 2\nc = 3\n")
    tried = []
    with ThreadPoolExecutor(1) as pool:
        kept = _first_kept(pool, 1, tree, _deletions(tree), lambda source: tried.append(source) or False, set(),
                           deadline=time.monotonic() - 1)
    assert kept is None and tried == []


@pytest.mark.fast
def test_the_fork_servers_import_what_torch_compile_will_unless_the_script_may_change_the_environment() -> None:
    """A run forked from a server that imported torch still imported dynamo and inductor's compiler
    at its first torch.compile: 1.8 s a run here, 0.2 s with them preloaded; one run without the
    compiler (TORCHDYNAMO_DISABLE=1) still imported dynamo's backends, 0.2 s. A script that may set
    variables torch reads on import (`os.environ[...] = ...` before the compile) must see them read
    after it set them: it runs in fresh interpreters. One that only reads a variable does not."""
    from minify_client.capture.rerun import preloaded_modules

    compiles = "import torch\nimport torch._inductor.config\ntorch.compile(torch.sin)(torch.ones(1))\n"
    assert preloaded_modules(ast.parse(compiles)) == ["torch", "torch._inductor.config", "torch._dynamo",
                                                      "torch._dynamo.backends.common", "torch._inductor.compile_fx"]
    for setting in ("import os\nos.environ['TORCHINDUCTOR_FREEZING'] = '1'\n",
                    "from os import environ\nenviron.setdefault('TORCH_LOGS', 'graph')\n",
                    "import os\nos.putenv('TORCHDYNAMO_VERBOSE', '1')\n", "from os import unsetenv\n",
                    "import os\ndel os.environ['TORCH_LOGS']\n", "import os\nos.environ.update(TORCH_LOGS='graph')\n",
                    "import os\nvariables = os.environ\nvariables['TORCH_LOGS'] = 'graph'\n",
                    "from os import environ as variables\nvariables['TORCH_LOGS'] = 'graph'\n"):
        assert preloaded_modules(ast.parse(setting + compiles)) == [], setting
    # Reading a variable changes nothing: the run's own settings are set before the script runs.
    for reading in ("import os\nif os.environ.get('TORCHDYNAMO_DISABLE') != '1':\n    pass\n",
                    "import os\ndevice = os.environ['DEVICE'] if 'DEVICE' in os.environ else 'cpu'\n",
                    "from os import environ\nseed = int(environ.get('SEED', 0))\n", "import os\nos.getenv('SEED')\n"):
        assert preloaded_modules(ast.parse(reading + compiles))[0] == "torch", reading
    assert preloaded_modules(ast.parse("import numpy\nprint(numpy.ones(2))\n")) == []


@pytest.mark.fast
def test_a_test_reduces_in_fresh_interpreters_where_a_conftest_above_it_may_change_the_environment(
        tmp_path: Path) -> None:
    """A test's runs load the conftest.py files above it, before its file: one that sets a variable
    torch reads on import, or one that does not parse, keeps every candidate out of the servers."""
    from minify_client.capture.rerun import conftests, parsed, preloaded_modules

    (tmp_path / "sub").mkdir()
    test_file = tmp_path / "sub" / "test_model.py"
    test_file.write_text("import torch\n\ndef test_step():\n    torch.compile(torch.sin)\n")
    assert conftests(test_file, tmp_path) == []
    (tmp_path / "conftest.py").write_text("import os\nos.environ['TORCHINDUCTOR_FREEZING'] = '1'\n")
    trees = parsed(conftests(test_file))
    assert trees is not None and conftests(test_file, tmp_path) == [tmp_path / "conftest.py"]
    assert preloaded_modules(ast.parse(test_file.read_text())) != []
    assert preloaded_modules(ast.parse(test_file.read_text()), *trees) == []
    (tmp_path / "conftest.py").write_text("def (\n")
    assert parsed(conftests(test_file)) is None


FAILING_TEST = '''import math

import torch

WEIGHTS = torch.ones(8)


def make(op):
    def apply(x, y):
        return op(x, y)

    return apply


def helper():
    return math.sqrt(2)


def test_closures_compile_like_eager():
    add, mul = make(torch.Tensor.__add__), make(torch.Tensor.__mul__)
    x, y = torch.tensor(6.0), torch.tensor(3.0)
    print("scale", helper() * WEIGHTS.sum())
    expected = (add(x, y), mul(x, y))
    actual = (torch.compile(add, dynamic=True, backend="eager")(x, y),
              torch.compile(mul, dynamic=True, backend="eager")(x, y))
    assert all(torch.equal(a, e) for a, e in zip(actual, expected)), "compiled differs from eager"


def test_weights():
    assert WEIGHTS.sum() == 8
'''


def test_a_failing_test_named_as_pytest_names_it_is_reduced_to_a_test_that_still_fails(tmp_path: Path) -> None:
    """`minify-client reduce FILE::TEST`: pytorch#197811 (dynamo reuses the first closure's graph for
    the second) in a test file beside another test and helpers it does not need. Each run is that
    one test under pytest; the result is a test file whose test fails the same way under pytest and
    passes without torch.compile, the user's file untouched and nothing left beside it."""
    from minify_client.reduce import main

    (tmp_path / "conftest.py").write_text("")  # the folder's own, as a suite has
    test_file = _write(tmp_path, FAILING_TEST, "test_closures.py")
    before = test_file.read_text()

    assert main([f"{test_file}::test_closures_compile_like_eager", "--jobs", "1"]) == 0

    result = tmp_path / "test_closures_min.py"
    source = result.read_text()
    assert "__add__" in source and "__mul__" in source and "def test_closures_compile_like_eager" in source
    assert "math" not in source and "def test_weights" not in source and "helper" not in source
    assert test_file.read_text() == before
    assert sorted(path.name for path in tmp_path.iterdir()) == ["conftest.py", "test_closures.py",
                                                                "test_closures_min.py"]
    pytest_run = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", result.name]
    failing = subprocess.run(pytest_run, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert failing.returncode == 1 and "AssertionError" in failing.stdout, failing.stdout[-2000:]
    passing = subprocess.run(pytest_run, cwd=tmp_path, capture_output=True, text=True, timeout=300,
                             env={**os.environ, "TORCHDYNAMO_DISABLE": "1"})
    assert passing.returncode == 0, passing.stdout[-2000:]
