"""Stand-ins for the version phase's tests (tests/worker/service/test_versions_*.py): a bug whose presence depends on
`torch.__version__`, and an interpreter that shares the CI venv's torch but reports another version.

No real inductor bug that differs between the releases we can install cheaply in CI is used
here: `fail_on_relu_from_2_13_until_2_14` stands in for a bug introduced in torch 2.13 and fixed
in 2.14, and `stand_in_env` makes a second interpreter that says it is another torch.
"""

from __future__ import annotations

import subprocess
import sys
import sysconfig
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import fx

from tests.support.backends import has_op

MODULE = "tests.support.torch_versions"


def _release(version: str) -> tuple[int, int]:
    major, minor = version.split(".")[:2]
    return int(major), int(minor)


def fail_on_relu_from_2_13_until_2_14(gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
    """Fails compiling a graph with relu on torch 2.13.x only (a stand-in for a regression in 2.13
    fixed in 2.14); compiles to eager otherwise."""
    if has_op(gm, "relu") and _release(str(torch.__version__)) == (2, 13):
        raise RuntimeError("injected failure on relu")

    def run(*args: Any) -> Any:
        return gm(*args)

    return run


_SITECUSTOMIZE = '''\
# A stand-in (tests/support/torch_versions.py): this interpreter shares the CI venv's torch and says
# it is torch {version}.
import torch
from torch.torch_version import TorchVersion

torch.__version__ = TorchVersion({version!r})
torch.version.__version__ = {version!r}
torch.version.git_version = {git_version!r}
'''


def stand_in_env(folder: Path, version: str) -> Path:
    """A venv in `folder` whose interpreter imports the CI venv's packages (a .pth that adds its
    site-packages, its own .pth files processed) and whose torch says it is `version` (a
    sitecustomize sets torch.__version__): a second torch "installation" that costs no download.
    Returns the venv folder."""
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", "--without-pip", str(folder)], check=True)
    site_packages = folder / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    shared = sysconfig.get_paths()["purelib"]
    (site_packages / "minify_shared_venv.pth").write_text(f"import site; site.addsitedir({shared!r})\n")
    (site_packages / "sitecustomize.py").write_text(
        _SITECUSTOMIZE.format(version=version, git_version=f"standin{version.replace('.', '')}"))
    return folder
