"""The torch installations a worker offers (minify_worker/service/versions/envs.py): its own, MINIFY_TORCH_ENVS,
and versions uv installs from an index into a bounded cache.

The index is a real one for uv, a local folder of wheels, holding a stand-in: a tiny package named
torch (a `__version__` and `torch.version.git_version`, nothing else), so that installing and
evicting costs milliseconds instead of the gigabytes of a real torch. uv runs for real.
"""

from __future__ import annotations

import base64
import hashlib
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import zipfile
from pathlib import Path

import pytest

from minify_worker.service.versions.envs import (
    ENVS_ENV,
    IndexInstaller,
    configured_envs,
    find_uv,
    interpreter_of,
    own_env,
    split_env_list,
)


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def stand_in_torch_wheel(folder: Path, version: str, padding_bytes: int = 0) -> Path:
    """A wheel of a package named torch that only knows its version (and `padding_bytes` of ballast)."""
    info = f"torch-{version}.dist-info"
    files = {
        "torch/__init__.py": f"__version__ = {version!r}\nfrom torch import version\n".encode(),
        "torch/version.py": f"__version__ = {version!r}\ngit_version = 'standin{version}'\n".encode(),
        "torch/ballast.bin": b"\0" * padding_bytes,
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: torch\nVersion: {version}\n".encode(),
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: minify-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = "\n".join([*(_record_line(name, data) for name, data in files.items()), f"{info}/RECORD,,"]) + "\n"
    path = folder / f"torch-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as wheel:
        for name, data in {**files, f"{info}/RECORD": record.encode()}.items():
            wheel.writestr(name, data)
    return path


@pytest.fixture
def wheelhouse(tmp_path: Path) -> Path:
    folder = tmp_path / "wheels"
    folder.mkdir()
    for version in ("9.1.0", "9.2.0", "9.3.0"):
        stand_in_torch_wheel(folder, version, padding_bytes=2 << 20)
    return folder


def test_env_lists_split_on_colons_or_commas() -> None:
    assert split_env_list("/a/venv:/b/bin/python, /c ,") == ["/a/venv", "/b/bin/python", "/c"]


def test_a_venv_folder_or_an_interpreter_names_an_interpreter(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="neither an executable interpreter"):
        interpreter_of(str(tmp_path))
    own = own_env()
    assert interpreter_of(str(own.python)) == own.python
    # Relative to where the worker started, absolute for a probe in its own folder, the venv's link kept.
    assert interpreter_of(os.path.relpath(own.python)) == own.python.absolute()


def test_the_workers_own_torch_is_read_without_importing_it() -> None:
    import torch

    own = own_env()
    assert (own.torch, own.git_version, own.origin) == (torch.__version__, torch.version.git_version, "own")


def test_the_index_installs_a_version_once_into_its_own_venv_and_reports_it(tmp_path: Path, wheelhouse: Path) -> None:
    find_uv()
    installer = IndexInstaller(str(wheelhouse), tmp_path / "cache", max_bytes=1 << 30)
    env = installer.ensure("9.2.0")
    assert (env.torch, env.git_version, env.origin) == ("9.2.0", "standin9.2.0", "index")
    assert env.python.parent.parent == tmp_path / "cache" / "torch-9.2.0"
    stamp_before = os.stat(env.python.parent.parent / ".minify-installed").st_mtime_ns
    again = installer.ensure("9.2.0")
    assert again == env
    assert os.stat(env.python.parent.parent / ".minify-installed").st_mtime_ns >= stamp_before
    assert [found.torch for found in installer.installed()] == ["9.2.0"]


def test_the_cache_evicts_the_least_recently_used_version_past_its_bound(tmp_path: Path, wheelhouse: Path) -> None:
    probe = IndexInstaller(str(wheelhouse), tmp_path / "probe", max_bytes=1 << 40)
    one_venv = sum(path.stat().st_size for path in probe.ensure("9.1.0").python.parent.parent.rglob("*")
                   if path.is_file() and not path.is_symlink())
    installer = IndexInstaller(str(wheelhouse), tmp_path / "cache", max_bytes=int(one_venv * 2.5))
    installer.ensure("9.1.0")
    installer.ensure("9.2.0")
    installer.ensure("9.1.0")  # used last: 9.2.0 is now the least recently used
    installer.ensure("9.3.0")
    assert [env.torch for env in installer.installed()] == ["9.1.0", "9.3.0"]


def test_a_version_the_index_lacks_is_an_error_that_says_so(tmp_path: Path, wheelhouse: Path) -> None:
    installer = IndexInstaller(str(wheelhouse), tmp_path / "cache", max_bytes=1 << 30)
    with pytest.raises(RuntimeError, match=r"installing torch==9\.9\.9 from .* failed"):
        installer.ensure("9.9.9")
    assert installer.installed() == []


def test_configured_envs_are_the_own_then_the_listed_then_the_cached_ones_one_per_version(
        tmp_path: Path, wheelhouse: Path) -> None:
    cache = tmp_path / "cache"
    listed = IndexInstaller(str(wheelhouse), tmp_path / "listed", max_bytes=1 << 30).ensure("9.1.0")
    IndexInstaller(str(wheelhouse), cache, max_bytes=1 << 30).ensure("9.3.0")
    environ = {ENVS_ENV: f"{listed.python.parent.parent}:{tmp_path / 'missing'}:{listed.python}",
               "MINIFY_TORCH_INDEX": str(wheelhouse), "MINIFY_TORCH_CACHE": str(cache)}
    envs = configured_envs(environ)
    assert [(env.torch, env.origin) for env in envs] == [
        (own_env().torch, "own"), ("9.1.0", ENVS_ENV), ("9.3.0", "index")]


# A repro that starts a grandchild (as inductor starts a compiler) and then waits: its pids land in `pids`.
_LINGERING_REPRO = """
import subprocess, sys, time
grandchild = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
open(sys.argv[0] + ".pids", "w").write(f"{__import__('os').getpid()} {grandchild.pid}")
time.sleep(120)
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    status = Path(f"/proc/{pid}/stat")
    return status.exists() and status.read_text().split(") ")[-1][:1] != "Z"


def _wait_for_pids(repro: Path) -> list[int]:
    marks = repro.with_name(repro.name + ".pids")
    deadline = time.monotonic() + 30
    while not (marks.exists() and marks.read_text()) and time.monotonic() < deadline:
        time.sleep(0.05)
    return [int(pid) for pid in marks.read_text().split()]


def test_a_stopped_probe_ends_at_once_with_what_it_started(tmp_path: Path) -> None:
    """A cancelled job or a worker shutting down (`stop_all`) ends a running probe and its
    grandchildren now, not at the probe's timeout."""
    from minify_worker.service.versions.probe import run_repro, stop_all

    repro = tmp_path / "repro.py"
    repro.write_text(_LINGERING_REPRO)
    env = own_env()
    results = []
    runner = threading.Thread(target=lambda: results.append(run_repro(env, repro, None, None, timeout_s=120)))
    started = time.monotonic()
    runner.start()
    pids = _wait_for_pids(repro)
    stop_all()
    runner.join(30)
    assert not runner.is_alive() and time.monotonic() - started < 30
    assert results[0].outcome.value != "passed"
    deadline = time.monotonic() + 5
    while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [pid for pid in pids if _alive(pid)]


def test_a_probe_dies_with_the_process_that_ran_it_and_the_next_probe_removes_its_folder(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A work horse killed outright (SIGKILL, no handler runs) takes its probe's repro with it, and
    leaves the probe's working folder, which the next probe on the machine removes (one of a
    process still alive stays)."""
    from minify_worker.engine.workdirs import OWNER_FILE, PROBE_PREFIX, make_job_dir
    from minify_worker.service.versions.probe import run_repro

    temp = tmp_path / "temp"
    temp.mkdir()
    monkeypatch.setenv("TMPDIR", str(temp))
    monkeypatch.setattr(tempfile, "tempdir", None)  # gettempdir() reads TMPDIR again
    repro = tmp_path / "repro.py"
    repro.write_text(_LINGERING_REPRO)
    horse = subprocess.Popen([sys.executable, "-c", (
        "import sys; from pathlib import Path\n"
        "from minify_worker.service.versions.envs import own_env\n"
        "from minify_worker.service.versions.probe import run_repro\n"
        f"run_repro(own_env(), Path({str(repro)!r}), None, None, timeout_s=120)\n")])
    try:
        repro_pid = _wait_for_pids(repro)[0]
        horse.send_signal(signal.SIGKILL)
        horse.wait(10)
        deadline = time.monotonic() + 10
        while _alive(repro_pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(repro_pid)
    finally:
        horse.kill()
    left = list(temp.iterdir())
    assert len(left) == 1 and left[0].name.startswith(PROBE_PREFIX), left
    assert (left[0] / OWNER_FILE).read_text().split()[0] == str(horse.pid)  # marked with the killed horse
    alive = make_job_dir(PROBE_PREFIX)  # a probe's folder of this live process
    assert alive.parent == temp
    passing = tmp_path / "passing.py"
    passing.write_text("print('repro passed')\n")
    assert run_repro(own_env(), passing, None, None, timeout_s=60).outcome.value == "passes"
    assert [folder.name for folder in temp.iterdir()] == [alive.name]
