"""The worker's layout, read statically from every module's imports (issue 41).

The worker is four packages and the vocabulary they share: `engine/` (the phases of a run and the
parts they drive), `sandbox/` (children and the fork server), `service/` (the RQ entries, the job's
Redis channel, the worker process, the version phase) and `programs/` (the registry, the pieces
every representation shares, and one package per representation: `programs/fx/`,
`programs/stablehlo/`); beside them `outcomes`, `oracle`, `allowlist`, `environment` and `cli`.
Who may import whom: the service drives the engine; the engine reaches a representation only
through the registry; a representation may use the engine's API (the scheduler for its shrink, the
artifacts' rules) but never another representation or the service; the sandbox knows no
representation; nothing but the service (and the command line that starts it) imports the service.

The worker's parts are the nodes: each top-level module or package of `minify_worker` (`engine`,
`sandbox`, `service`, `programs`, `outcomes`, ...), except that each representation under
`programs/` is a node of its own (`programs.fx`, `programs.stablehlo`). An import counts wherever it
runs, at the top of a module or inside a function; one under `if TYPE_CHECKING:` does not (it is for
the type checker only). Nothing is imported: the modules are parsed with `ast`, so the check is fast
and needs no torch. The registry's own way to a representation is by name, not an import
statement (`importlib.import_module` of its `_MODULES` table, on first use): that is allowed, and
checked to be the only one; no other module may name a representation's modules in a string.
"""

from __future__ import annotations

import ast
import functools
import re
from collections.abc import Collection, Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.fast

PACKAGE = Path(__file__).resolve().parents[2] / "worker" / "minify_worker"
ROOT = "minify_worker"
REPRESENTATIONS = sorted(path.parent.name for path in (PACKAGE / "programs").glob("*/__init__.py"))
REPRESENTATION_NODES = {f"programs.{name}" for name in REPRESENTATIONS}
# A representation named as a module in a string: what `importlib.import_module` would be given.
NAMES_A_REPRESENTATION = re.compile(rf"\b{ROOT}\.programs\.({'|'.join(map(re.escape, REPRESENTATIONS))})\b")

# The engine package, the vocabulary it shares with the representations, and the registry with the
# shared pieces.
ENGINE_MODULES = sorted(
    [f"{ROOT}.engine" if path.name == "__init__.py" else f"{ROOT}.engine.{path.stem}"
     for path in (PACKAGE / "engine").glob("*.py")]
    + [f"{ROOT}.outcomes", f"{ROOT}.oracle"]
    + [f"{ROOT}.programs" if path.name == "__init__.py" else f"{ROOT}.programs.{path.stem}"
       for path in (PACKAGE / "programs").glob("*.py")]
)
# The only module that reaches a representation, and how: `_MODULES` maps each name to its package,
# which `representation(name)` imports with `importlib.import_module` on first use.
REGISTRY = f"{ROOT}.programs"
REGISTRY_TABLE = "_MODULES"

# Import cycles between the worker's parts that are known and allowed, each with why: none.
KNOWN_CYCLES: list[set[str]] = []


def _module_name(path: Path) -> str:
    parts = [ROOT, *path.relative_to(PACKAGE).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}
TREES = {module: ast.parse(path.read_text(), str(path)) for module, path in MODULES.items()}


def _runtime_nodes(tree: ast.AST) -> list[ast.AST]:
    """Every node of `tree` but those under `if TYPE_CHECKING:` (its `else:` branch runs)."""
    found: list[ast.AST] = []
    stack = [tree]
    while stack:
        node = stack.pop()
        found.append(node)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            stack.extend(node.orelse)
        else:
            stack.extend(ast.iter_child_nodes(node))
    return found


RUNTIME = {module: _runtime_nodes(tree) for module, tree in TREES.items()}


def _imports(module: str) -> set[str]:
    """The `minify_worker` modules (or names in them) that `module` imports when it runs."""
    package = module if MODULES[module].name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in RUNTIME[module]:
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            found.update(f"{source}.{alias.name}" for alias in node.names)
    return {name for name in found if name == ROOT or name.startswith(ROOT + ".")}


def _strings(module: str) -> Iterator[ast.Constant]:
    """The string constants `module` runs with, docstrings left out."""
    docstrings = {
        id(node.body[0].value) for node in ast.walk(TREES[module])
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)
    }
    for node in RUNTIME[module]:
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            yield node


def node_of(name: str) -> str:
    """The part of the worker a module (or a name in it) belongs to."""
    parts = name.split(".")[1:]
    if not parts:
        return ROOT
    if parts[0] == "programs" and len(parts) > 1 and parts[1] in REPRESENTATIONS:
        return f"programs.{parts[1]}"
    return parts[0]


IMPORTS = {module: _imports(module) for module in MODULES}


def _graph() -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {}
    for module, names in IMPORTS.items():
        source = node_of(module)
        edges.setdefault(source, set()).update(node_of(name) for name in names)
        edges[source].discard(source)
    return edges


GRAPH = _graph()


def _modules_of(part: str) -> list[str]:
    return [module for module in MODULES if node_of(module) == part]


def _registry_table() -> ast.Dict:
    """The registry's `_MODULES = {"fx": "minify_worker.programs.fx", ...}`."""
    for node in TREES[REGISTRY].body:
        if isinstance(node, ast.Assign) and [ast.unparse(target) for target in node.targets] == [REGISTRY_TABLE]:
            assert isinstance(node.value, ast.Dict)
            return node.value
    raise AssertionError(f"{REGISTRY} has no {REGISTRY_TABLE}: how does it find the representations now?")


@functools.cache
def _reached(module: str) -> tuple[tuple[str, str], ...]:
    """The representations `module` reaches directly, and how: (representation, an import or a
    string that names its modules, which `importlib.import_module` could be given). The registry's
    table is not counted: it is the one way in (`representation(name)` imports from it lazily)."""
    table = {id(value) for value in _registry_table().values} if module == REGISTRY else set()
    found: list[tuple[str, str]] = [
        (node_of(name).partition(".")[2], f"imports {name}")
        for name in sorted(IMPORTS[module]) if node_of(name) in REPRESENTATION_NODES
    ]
    found += [(match.group(1), f"names {node.value!r} (line {node.lineno})")
              for node in _strings(module) if id(node) not in table
              for match in NAMES_A_REPRESENTATION.finditer(node.value)]
    return tuple(found)


def _reached_by(part: str, representations: Collection[str]) -> dict[str, list[str]]:
    """Each module of `part` that reaches one of `representations` directly, and how."""
    reached = {module: [how for name, how in _reached(module) if name in representations]
               for module in _modules_of(part)}
    return {module: hows for module, hows in reached.items() if hows}


def test_the_layout_is_the_one_these_checks_are_written_for() -> None:
    assert REPRESENTATIONS == ["fx", "stablehlo"]
    packages = sorted(path.parent.name for path in PACKAGE.glob("*/__init__.py"))
    assert packages == ["engine", "programs", "sandbox", "service"]
    for part in ("service/versions", *(f"programs/{name}" for name in REPRESENTATIONS)):
        assert (PACKAGE / part / "__init__.py").is_file(), part
    for module in ENGINE_MODULES:
        assert module in MODULES, f"{module} is gone: update ENGINE_MODULES"
    assert {f"{ROOT}.programs.{name}" for name in ("candidates", "prepared", "classify", "culprit")} \
        <= set(ENGINE_MODULES)


# (i) -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("representation", REPRESENTATIONS)
def test_no_representation_imports_another(representation: str) -> None:
    others = [other for other in REPRESENTATIONS if other != representation]
    assert not GRAPH[f"programs.{representation}"] & {f"programs.{other}" for other in others}
    assert not _reached_by(f"programs.{representation}", others)


# (ii) ------------------------------------------------------------------------------------------

def test_the_sandbox_imports_no_representation() -> None:
    assert not GRAPH["sandbox"] & REPRESENTATION_NODES
    assert not _reached_by("sandbox", REPRESENTATIONS)


# (iii) -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("module", ENGINE_MODULES)
def test_the_engine_reaches_representations_only_through_the_registry(module: str) -> None:
    assert not _reached(module)


def test_the_registry_names_each_representation_package_once_and_imports_it_by_name() -> None:
    assert ast.literal_eval(_registry_table()) == {name: f"{ROOT}.programs.{name}" for name in REPRESENTATIONS}
    # ... and imports from nowhere else: `importlib.import_module(_MODULES[name])` in
    # `representation(name)`, and `import_modules(names)`, which imports a representation's own
    # `child_modules` (in the fork server and the origin process: names it declares, not the registry).
    dynamic = sorted(ast.unparse(node) for node in ast.walk(TREES[REGISTRY]) if isinstance(node, ast.Call)
                     and ast.unparse(node.func) in ("importlib.import_module", "__import__"))
    assert dynamic == [f"importlib.import_module({REGISTRY_TABLE}[name])", "importlib.import_module(name)"]


@pytest.mark.parametrize(
    "part", sorted(set(GRAPH) - REPRESENTATION_NODES - {"sandbox"} - {node_of(module) for module in ENGINE_MODULES}))
def test_no_other_part_reaches_a_representation_directly(part: str) -> None:
    """The rest of the worker (the service's cli, job, rqworker, versions, ...) asks the registry too."""
    assert not GRAPH[part] & REPRESENTATION_NODES
    assert not _reached_by(part, REPRESENTATIONS)


# (iv) ------------------------------------------------------------------------------------------

def _strongly_connected(graph: dict[str, set[str]]) -> list[set[str]]:
    """Tarjan's components of `graph` with more than one node: each holds at least one cycle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(component)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return components


def test_the_worker_parts_import_each_other_without_cycles_but_the_known_one() -> None:
    cycles = sorted(map(sorted, _strongly_connected(GRAPH)))
    # Fails on a new cycle (or one that grows into the known one) and when a known one is gone:
    # then remove its entry from KNOWN_CYCLES.
    assert cycles == sorted(map(sorted, KNOWN_CYCLES))


# (v) -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("part", sorted(set(GRAPH) - {"service", "cli"}))
def test_only_the_service_and_the_command_line_import_the_service(part: str) -> None:
    """The engine, the sandbox and the representations run offline (`minify-worker minify`), with no
    Redis and no RQ: none of them may need the service."""
    assert "service" not in GRAPH[part]


def test_importing_the_engine_package_imports_none_of_its_modules() -> None:
    """A sandbox child imports `engine.scheduler` or `engine.artifacts`, not the whole engine."""
    init = TREES[f"{ROOT}.engine"]
    assert not [node for node in RUNTIME[f"{ROOT}.engine"] if isinstance(node, (ast.Import, ast.ImportFrom))
                and ast.unparse(node) not in ("from __future__ import annotations", "import importlib",
                                              "from typing import Any")], ast.unparse(init)


# (vi) ------------------------------------------------------------------------------------------

# The engine's phases, in the order a run goes through them: each returns the job's ending as a value.
ENGINE_PHASES = ["prepare", "reproduce_and_reduce", "shrink", "deliver", "original_verdict", "culprit"]


def _definitions(body: list[ast.stmt]) -> list[ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef]:
    return [node for node in body if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]


def test_the_engine_module_holds_its_phases_and_nothing_else() -> None:
    """engine.py is `minify` (the entry point: the job's sandbox) and one run class whose methods are
    the phases and `run`, which calls them in order; the job's time is budget.py's, the delivery
    delivery.py's, the original's runs original.py's."""
    tree = TREES[f"{ROOT}.engine.engine"]
    definitions = _definitions(tree.body)
    rest = [ast.unparse(node) for node in tree.body[1:] if not isinstance(node, (ast.Import, ast.ImportFrom))
            and node not in definitions]
    assert rest == ["log = logging.getLogger(__name__)"]
    assert [node.name for node in definitions if not isinstance(node, ast.ClassDef)] == ["minify"]
    classes = [node for node in definitions if isinstance(node, ast.ClassDef)]
    assert len(classes) == 1, [node.name for node in classes]
    methods = {node.name: node for node in _definitions(classes[0].body)}
    assert list(methods) == ["__init__", "run", *ENGINE_PHASES]
    calls = sorted((node.lineno, node.col_offset, node.func.attr) for node in ast.walk(methods["run"])
                   if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                   and ast.unparse(node.func.value) == "self")
    assert [name for *_, name in calls] == ENGINE_PHASES, "run() calls its own methods: the phases, in order"
    nested = [node.name for method in methods.values() for node in ast.walk(method)
              if node is not method and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]
    assert not nested, f"helpers hidden inside the phases: {nested}"
