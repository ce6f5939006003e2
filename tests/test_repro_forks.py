"""tests/support/repro_forks.py: which environments a repro.py may run in as a fork of the shared
interpreter, and which send it to a fresh one (issue 41: a fork saves 2-3 CPU-s of imports)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.repro_forks import ReproForks, _unread_by_imports, begins_with_prelude

BASE = {"PATH": "/usr/bin", "HOME": "/root", "PYTHONPATH": "/repo"}


@pytest.mark.fast
@pytest.mark.parametrize("name", ["MINIFY_CULPRIT_BUDGET_S", "PYTEST_CURRENT_TEST", "TF_CPP_MIN_LOG_LEVEL",
                                  "TPU_SKIP_MDS_QUERY", "_TORCHINDUCTOR_PYOBJECT_TENSOR_DATA_PTR"])
def test_a_variable_torchs_imports_never_read_is_applied_in_the_fork(name: str) -> None:
    assert _unread_by_imports({**BASE, name: "1"}) == _unread_by_imports(BASE)


@pytest.mark.fast
@pytest.mark.parametrize("change", [{"TORCHINDUCTOR_FREEZING": "1"}, {"TORCHDYNAMO_DISABLE": "1"},
                                    {"PYTHONPATH": "/elsewhere"}, {"TMPDIR": "/scratch"}])
def test_any_other_difference_sends_the_repro_to_a_fresh_interpreter(change: dict[str, str]) -> None:
    assert _unread_by_imports({**BASE, **change}) != _unread_by_imports(BASE)


def test_starting_jax_changes_no_variable_that_would_send_later_repros_to_a_fresh_interpreter() -> None:
    """The StableHLO tests start jax's CPU backend in the test process, which sets variables of its own there;
    a repro run after them must still fork (it did not: every later repro of that xdist worker ran
    fresh). Measured in a fresh interpreter with a bare environment."""
    if importlib.util.find_spec("jax") is None:  # not importorskip: importing it here sets one of them
        pytest.skip("jax is not installed")
    code = ("import json, os; before = dict(os.environ); import jax; jax.devices(); "
            "print(json.dumps(sorted(k for k in {*before, *os.environ} if before.get(k) != os.environ.get(k))))")
    # Not this process's environment: it holds them already where a StableHLO test ran before.
    ran = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={"PATH": os.environ.get("PATH", "")})
    assert ran.returncode == 0, ran.stderr[-2000:]
    changed = json.loads(ran.stdout.strip().splitlines()[-1])
    assert changed, "starting jax set no variable: the rule for them may go"
    assert _unread_by_imports({**BASE, **dict.fromkeys(changed, "1")}) == _unread_by_imports(BASE), changed


@pytest.mark.fast
def test_a_repro_forks_only_where_it_begins_with_torchs_two_imports_after_the_standard_librarys() -> None:
    assert begins_with_prelude('"""Doc."""\nimport faulthandler\nimport torch\nimport torch._inductor.config\nx = 1\n')
    assert not begins_with_prelude("import numpy\nimport torch\nimport torch._inductor.config\n")
    assert not begins_with_prelude("import torch\nx = 1\nimport torch._inductor.config\n")
    assert not begins_with_prelude("import os\nos.environ['TORCHINDUCTOR_FREEZING'] = '1'\nimport torch\n"
                                   "import torch._inductor.config\n")


def test_repros_after_one_that_probed_the_cpus_vector_isa_inherit_the_probe(tmp_path: Path) -> None:
    """The server probes inductor's CPU vector ISA (~2 CPU-s a process) once a repro did, as
    rerun's servers do; a repro that chose its ISA itself (`cpp.vec_isa_ok`) does not make it.
    (The repros call the probe as inductor's codegen does, without a compile's seconds.)"""
    text = ("import torch\nimport torch._inductor.config\nimport torch._inductor.cpu_vec_isa as isa\n\n"
            "print(isa.valid_vec_isa_list.cache_info().currsize)\n{choice}isa.pick_vec_isa()\n")
    repro, own = tmp_path / "probes" / "repro.py", tmp_path / "own_choice" / "repro.py"
    for path, choice in ((repro, ""), (own, "torch._inductor.config.cpp.vec_isa_ok = True\n")):
        path.parent.mkdir()
        path.write_text(text.format(choice=choice))
    with ReproForks() as forks:
        inherited = [forks.run(path, timeout_s=120).stdout.strip() for path in (own, repro, repro)]
    assert inherited == ["0", "0", "1"]
