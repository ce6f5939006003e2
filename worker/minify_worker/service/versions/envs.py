"""The torch installations a worker offers for version probes.

- its own (the interpreter the worker runs in);
- `MINIFY_TORCH_ENVS`: other interpreters or venv folders, `:`- or `,`-separated;
- on demand, `MINIFY_TORCH_INDEX`: a package index (a URL, or a local folder of wheels) from which
  `uv` installs a requested torch into a venv of its own under `MINIFY_TORCH_CACHE`
  (default ~/.cache/minify/torch), kept within `MINIFY_TORCH_CACHE_GB` (default 40) by evicting the
  least recently used.

Each installation's torch version and git version come from running its interpreter once
(`read_version`, remembered per interpreter and its modification time): what it imports is what a
probe will run, whatever its folder is called.
"""

from __future__ import annotations

import fcntl
import importlib.metadata
import importlib.util
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from minify_worker.service.versions.ranges import parse_version

log = logging.getLogger(__name__)

ENVS_ENV = "MINIFY_TORCH_ENVS"
INDEX_ENV = "MINIFY_TORCH_INDEX"
CACHE_ENV = "MINIFY_TORCH_CACHE"
CACHE_GB_ENV = "MINIFY_TORCH_CACHE_GB"
DEFAULT_CACHE_GB = 40.0
READ_TIMEOUT_S = 300.0  # a first import of torch on a loaded box, from a cold disk
INSTALL_TIMEOUT_S = 1800.0  # a CUDA build of torch is several GB
_STAMP = ".minify-installed"  # written last: a venv without it is half-installed; its mtime is the last use
_READ_VERSION = ("import json, torch; "
                 "print(json.dumps([str(torch.__version__), getattr(torch.version, 'git_version', None)]))")


class EnvError(RuntimeError):
    """A torch installation that cannot be used: no interpreter, no torch, an install that failed."""


@dataclass(frozen=True)
class TorchEnv:
    """One torch installation: the interpreter that runs it, and what it reports."""

    python: Path
    torch: str
    git_version: str | None
    origin: str  # "own", ENVS_ENV, or "index"

    def describe(self) -> dict[str, str | None]:
        return {"torch": self.torch, "git_version": self.git_version, "python": str(self.python),
                "origin": self.origin}


def interpreter_of(entry: str) -> Path:
    """The interpreter an entry of MINIFY_TORCH_ENVS names: itself, or a venv folder's bin/python,
    as an absolute path (probes run in a folder of their own) whose symlinks are kept (a venv's
    python is a link to its base interpreter, which would not see the venv's packages)."""
    path = Path(os.path.abspath(Path(entry).expanduser()))  # normalized ('..' taken out), links not followed
    if path.is_dir():
        path = path / "bin" / "python"
    if not (path.is_file() and os.access(path, os.X_OK)):
        raise EnvError(f"{entry}: neither an executable interpreter nor a venv folder with bin/python")
    return path


def split_env_list(raw: str) -> list[str]:
    """MINIFY_TORCH_ENVS's entries: separated by ':' or ','."""
    return [entry.strip() for entry in re.split(r"[:,]", raw) if entry.strip()]


_versions_read: dict[tuple[str, float], tuple[str, str | None]] = {}


def read_version(python: Path, timeout_s: float = READ_TIMEOUT_S) -> tuple[str, str | None]:
    """(torch.__version__, torch.version.git_version) as `python` imports them; run once per
    interpreter (and its modification time)."""
    key = (str(python), python.stat().st_mtime)
    if key not in _versions_read:
        try:
            done = subprocess.run([str(python), "-c", _READ_VERSION], capture_output=True, text=True,
                                  timeout=timeout_s, stdin=subprocess.DEVNULL, start_new_session=True)
        except subprocess.TimeoutExpired as error:
            raise EnvError(f"{python}: importing torch took over {timeout_s:g} s") from error
        lines = done.stdout.strip().splitlines()
        if done.returncode != 0 or not lines:
            last = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
            raise EnvError(f"{python} cannot import torch: {last}")
        version, git_version = json.loads(lines[-1])
        parse_version(version)
        _versions_read[key] = (version, git_version)
    return _versions_read[key]


def own_env() -> TorchEnv:
    """The worker's own torch, read without importing it (the RQ parent never imports torch)."""
    version = importlib.metadata.version("torch")
    # The package's spec, not torch.version's: finding a submodule imports its package (torch, and
    # with it some 5 s of CPU at a worker's start).
    spec = importlib.util.find_spec("torch")
    git_version = None
    version_file = Path(spec.origin).parent / "version.py" if spec is not None and spec.origin else None
    if version_file is not None and version_file.is_file():
        found = re.search(r"^git_version\s*=\s*['\"]([^'\"]*)['\"]", version_file.read_text(), re.MULTILINE)
        git_version = found.group(1) if found else None
    return TorchEnv(python=Path(sys.executable), torch=version, git_version=git_version, origin="own")


def configured_envs(environ: Mapping[str, str] | None = None) -> list[TorchEnv]:
    """The worker's own torch, then MINIFY_TORCH_ENVS's and the index's installed ones, one per version
    (the first wins). An entry that cannot be used is logged and left out."""
    environ = os.environ if environ is None else environ
    envs = [own_env()]
    for entry in split_env_list(environ.get(ENVS_ENV, "")):
        try:
            python = interpreter_of(entry)
            version, git_version = read_version(python)
        except EnvError as error:
            log.warning("%s: %s", ENVS_ENV, error)
            continue
        envs.append(TorchEnv(python=python, torch=version, git_version=git_version, origin=ENVS_ENV))
    installer = IndexInstaller.from_environ(environ)
    if installer is not None:
        envs.extend(installer.installed())
    unique: dict[str, TorchEnv] = {}
    for env in envs:
        unique.setdefault(env.torch, env)
    return list(unique.values())


def _tree_bytes(path: Path) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                continue
    return total


def find_uv() -> Path:
    """uv beside the worker's interpreter (the worker extra installs it), else on PATH."""
    beside = Path(sys.executable).parent / "uv"
    if beside.is_file():
        return beside
    found = shutil.which("uv")
    if found is None:
        raise EnvError("uv is not installed (pip install uv, or the minify[worker] extra): "
                       f"{INDEX_ENV} needs it to install torch versions")
    return Path(found)


class IndexInstaller:
    """Installs torch versions from a package index into cached per-version venvs, least recently
    used evicted past the disk bound. One lock per cache folder: workers on a machine share it."""

    def __init__(self, index: str, cache_dir: Path, max_bytes: int) -> None:
        self.index = index
        self.cache_dir = cache_dir
        self.max_bytes = max_bytes

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> IndexInstaller | None:
        index = environ.get(INDEX_ENV, "").strip()
        if not index:
            return None
        cache = Path(environ.get(CACHE_ENV) or Path.home() / ".cache" / "minify" / "torch").expanduser()
        gigabytes = float(environ.get(CACHE_GB_ENV) or DEFAULT_CACHE_GB)
        return cls(index, cache, int(gigabytes * (1 << 30)))

    def _venv(self, version: str) -> Path:
        return self.cache_dir / f"torch-{version}"

    def has(self, version: str) -> bool:
        """Whether `version` is installed already (using it costs no install)."""
        return (self._venv(version) / _STAMP).is_file()

    def available(self, timeout_s: float = 60.0) -> list[str]:
        """The torch versions the index has a wheel of for this Python (or any Python), oldest first:
        a local folder's wheels, or the links of a PEP 503 index's torch page."""
        if Path(self.index).is_dir():
            names = [path.name for path in Path(self.index).glob("torch-*.whl")]
        else:
            with urllib.request.urlopen(self.index.rstrip("/") + "/torch/", timeout=timeout_s) as page:
                text = page.read().decode(errors="replace")
            names = [urllib.parse.unquote(name) for name in re.findall(r"(torch-[^\s\"'<>/#]+?\.whl)", text)]
        python = f"cp{sys.version_info.major}{sys.version_info.minor}"
        versions = set()
        for name in names:
            parts = name.removesuffix(".whl").split("-")
            if len(parts) >= 5 and (parts[-3] == python or parts[-3].startswith("py3")):
                try:
                    versions.add(str(parse_version(parts[1])))
                except ValueError:
                    continue
        return sorted(versions, key=parse_version)

    def installed(self) -> list[TorchEnv]:
        """The cached venvs that finished installing, oldest version first."""
        envs = []
        for stamp in sorted(self.cache_dir.glob(f"torch-*/{_STAMP}")):
            recorded = json.loads(stamp.read_text())
            envs.append(TorchEnv(python=stamp.parent / "bin" / "python", torch=recorded["torch"],
                                 git_version=recorded.get("git_version"), origin="index"))
        return sorted(envs, key=lambda env: parse_version(env.torch))

    def ensure(self, version: str) -> TorchEnv:
        """torch `version` from the index, installed once into its venv; each use makes it the most
        recently used."""
        parse_version(version)
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        with open(self.cache_dir / ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            venv = self._venv(version)
            stamp = venv / _STAMP
            if not stamp.is_file():
                self._install(version, venv)
            now = time.time_ns()  # the file system's own clock may be coarser than two uses apart
            os.utime(stamp, ns=(now, now))
            self._evict(keep=venv)
            recorded = json.loads(stamp.read_text())
            return TorchEnv(python=venv / "bin" / "python", torch=recorded["torch"],
                            git_version=recorded.get("git_version"), origin="index")

    def _install(self, version: str, venv: Path) -> None:
        uv = find_uv()
        building = venv.with_name(venv.name + ".partial")
        shutil.rmtree(building, ignore_errors=True)
        shutil.rmtree(venv, ignore_errors=True)
        source = (["--no-index", "--find-links", self.index] if Path(self.index).is_dir()
                  else ["--index-url", self.index])
        steps = [[str(uv), "venv", "--quiet", "--python", sys.executable, str(building)],
                 [str(uv), "pip", "install", "--quiet", "--python", str(building / "bin" / "python"),
                  "--prerelease", "allow", *source, f"torch=={version}"]]
        for step in steps:
            done = subprocess.run(step, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S,
                                  stdin=subprocess.DEVNULL, start_new_session=True)
            if done.returncode != 0:
                shutil.rmtree(building, ignore_errors=True)
                last = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
                raise EnvError(f"installing torch=={version} from {self.index} failed: {last}")
        building.rename(venv)  # a venv's scripts name their folder: uv's are relocatable, python's own is
        torch, git_version = read_version(venv / "bin" / "python")
        (venv / _STAMP).write_text(json.dumps({"torch": torch, "git_version": git_version,
                                               "installed_at": time.time()}))

    def _evict(self, keep: Path) -> None:
        """Remove the least recently used venvs (and half-installed ones) until the cache fits."""
        for partial in self.cache_dir.glob("torch-*.partial"):
            shutil.rmtree(partial, ignore_errors=True)
        venvs = [path for path in self.cache_dir.glob("torch-*") if path.is_dir()]
        sizes = {path: _tree_bytes(path) for path in venvs}
        total = sum(sizes.values())
        by_last_use = sorted((path for path in venvs if path != keep),
                             key=lambda path: (path / _STAMP).stat().st_mtime if (path / _STAMP).is_file() else 0)
        for path in by_last_use:
            if total <= self.max_bytes:
                break
            log.info("evicting %s (%d MB) from the torch cache", path.name, sizes[path] >> 20)
            shutil.rmtree(path, ignore_errors=True)
            total -= sizes[path]
