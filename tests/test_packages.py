"""The four packages and who imports whom, read statically with `ast` (issue 41): the contract
(`minify_contract`) is what client, server and worker share, and imports none of them; the server
imports neither the client nor the worker; the worker imports neither the server nor the client,
but for the FX representation's use of the capture's torch-side helpers (the same rewrite of
higher-order ops and the same torch namespaces as the user's capture); the client imports no
server or worker."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.fast

REPO = Path(__file__).resolve().parents[1]
PACKAGES = {
    "minify_contract": REPO / "contract" / "minify_contract",
    "minify_client": REPO / "client" / "minify_client",
    "minify_server": REPO / "server" / "minify_server",
    "minify_worker": REPO / "worker" / "minify_worker",
}
ALLOWED = {
    "minify_contract": set(),
    "minify_client": {"minify_contract"},
    "minify_server": {"minify_contract"},
    "minify_worker": {"minify_contract"},
}
# The FX representation shares these with the capture (client/minify_client/capture/): module → its users.
SHARED_WITH_THE_CAPTURE = {
    "minify_client.capture.higher_order": {"minify_worker.programs.fx.graph.form"},
    "minify_client.capture.custom_ops": {"minify_worker.programs.fx.op_modules"},
}


def _imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            found.add(node.module)
    return {name for name in found if name.split(".")[0] in PACKAGES}


def _module(package: str, path: Path) -> str:
    parts = [package, *path.relative_to(PACKAGES[package]).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@pytest.mark.parametrize("package", sorted(PACKAGES))
def test_each_package_imports_only_what_its_layer_allows(package: str) -> None:
    wrong = []
    for path in sorted(PACKAGES[package].rglob("*.py")):
        if "static" in path.parts:
            continue
        module = _module(package, path)
        for name in sorted(_imports(path)):
            top = name.split(".")[0]
            if top == package or top in ALLOWED[package]:
                continue
            if module in SHARED_WITH_THE_CAPTURE.get(name, set()):
                continue
            wrong.append(f"{module} imports {name}")
    assert not wrong


def test_the_client_installs_without_torch_and_the_contract_is_in_its_distribution() -> None:
    """The base install (no extras) carries the contract: `pyproject.toml` finds its packages under
    contract/, and its dependencies are pydantic, httpx and rich, no torch."""
    text = (REPO / "pyproject.toml").read_text()
    assert 'where = ["client", "contract", "server", "worker"]' in text
    base = text.split("dependencies = [", 1)[1].split("]", 1)[0]
    assert "torch" not in base and "pydantic" in base


def _shadowing(init: Path, package: str) -> list[str]:
    """Names `init` binds to something other than the submodule of the same name: after them,
    `import package.name.sub as alias` fails (the import statement looks `name` up as an attribute)."""
    directory = init.parent
    children = {path.stem for path in directory.glob("*.py") if path.name != "__init__.py"}
    children |= {path.name for path in directory.iterdir() if (path / "__init__.py").is_file()}
    found = []
    for node in ast.parse(init.read_text(), str(init)).body:
        if isinstance(node, ast.ImportFrom):
            itself = (node.level == 1 and node.module is None) or (not node.level and node.module == package)
            found += [f"{alias.asname or alias.name} (from {node.module})" for alias in node.names
                      if (alias.asname or alias.name) in children and not itself]
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name in children:
            found.append(f"{node.name} (defined)")
        elif isinstance(node, ast.Assign):
            found += [f"{target.id} (assigned)" for target in node.targets
                      if isinstance(target, ast.Name) and target.id in children]
    return found


@pytest.mark.parametrize("package", sorted(PACKAGES))
def test_no_package_hides_a_submodule_behind_a_name_of_its_own(package: str) -> None:
    # `from minify_client.capture import capture` in minify_client/__init__.py once made
    # `import minify_client.capture.config as config` fail: the function stood where the subpackage is.
    hidden = {}
    for init in sorted(PACKAGES[package].rglob("__init__.py")):
        name = _module(package, init)
        if found := _shadowing(init, name):
            hidden[name] = found
    assert hidden == {}
