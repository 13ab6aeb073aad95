"""gpuq's packages and the one direction their imports may go, checked from the source.

`python -m tools.layers` prints the package graph (and `--modules` every module's imports),
then the size of the core and of the extras apart (non-blank lines of Python);
tests/test_layers.py fails on an import against the direction, a cycle of any kind, an
import of a gpuq module inside a function, or a function longer than MAX_FUNCTION_LINES. The
graph is read from the source (ast), so this module imports nothing of gpuq and a broken
module cannot hide an edge.
"""

from __future__ import annotations

import ast
import functools
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parents[1] / "gpuq"

# The layers, lowest first (docs/design.md, "Layers"): a package may import only packages in
# layers below its own, and ALLOWED says which of those it does.
LAYERS: tuple[frozenset[str], ...] = (
    frozenset({"model"}),
    frozenset({"sched", "host"}),
    frozenset({"spool"}),
    frozenset({"run"}),
    frozenset({"worker", "views"}),
    frozenset({"cli"}),
    frozenset({"extras"}),
)
WITHIN_A_LAYER: frozenset[tuple[str, str]] = frozenset()  # imports allowed within a layer: none
ALLOWED: dict[str, frozenset[str]] = {
    "model": frozenset(),
    "sched": frozenset({"model"}),
    "host": frozenset({"model"}),
    "spool": frozenset({"model", "host"}),
    "run": frozenset({"model", "sched", "host", "spool"}),
    "worker": frozenset({"model", "sched", "host", "spool", "run"}),
    "views": frozenset({"model", "sched", "host", "spool", "run"}),
    "cli": frozenset({"model", "sched", "host", "spool", "run", "worker", "views"}),
    # Each folder under gpuq/extras/ is one extra: it may import the core, never another extra
    # (extras_apart), and nothing in the core may import it (found through gpuq/hooks.py).
    "extras": frozenset({"model", "sched", "host", "spool", "run", "worker", "views", "cli"}),
}
# Modules at the top of the package, named by worker.py and pyproject.toml, and the layer each
# belongs to: single_instance is imported by worker.py before anything else (os and fcntl only).
TOP_MODULES = {
    "gpuq": "model",
    "gpuq.single_instance": "host",
    "gpuq.worker_main": "cli",
    "gpuq.worker_run": "cli",
    "gpuq.worker_start": "cli",
    "gpuq.hooks": "model",
}
# Modules loaded by name (importlib), and why. The CLI's verb table names each verb's module, loaded
# when that verb runs (`gpuq status` loads none of the others): its entries count as imports.
DYNAMIC_IMPORTS = {
    "gpuq.cli.verbs": "the verb table: a verb's module is loaded when the verb runs",
    "gpuq.worker_start": "`gpuq-worker` loads worker_main only when no worker runs yet (cron starts it every minute)",
    "gpuq.hooks": "the extras, found by listing gpuq/extras/ (the core never names one), and their verbs' handlers",
}
VERB_TABLE = "_lazy"  # in gpuq/cli/verbs.py: _lazy("cli.submit", "cmd_submit")
# A function, from its `def` line to its last, docstring and comments included: one longer
# than this does more than one thing, and is split along its concerns.
MAX_FUNCTION_LINES = 80

# The only imports allowed inside a function: a module outside gpuq that only some paths need,
# and whose cost at import time the others would pay. Each with why (importer, module).
_FORK = "supervisors are forked by the thousand, and a fork costs more with it loaded"
LAZY_IMPORTS: dict[tuple[str, str], str] = {
    ("gpuq.model.strict_yaml", "yaml"): "`gpuq --help` and a cron start that finds its worker running load no YAML",
    ("gpuq.host.probe", "pynvml"): "only a box with real GPUs loads NVML (fake GPUs, status, the simulator do not)",
    ("gpuq.cli.doctor", "pynvml"): "only a box with real GPUs loads NVML",
    ("gpuq.extras.reports.reporthtml", "matplotlib"): "the optional [report] extra",
    ("gpuq.extras.reports.reporthtml", "numpy"): "the optional [report] extra (matplotlib's)",
    ("gpuq.host.wake", "filelock"): "importing filelock 4 registers fork hooks that double the cost of every fork",
    ("gpuq.host.fake_nvml", "filelock"): "importing filelock 4 registers fork hooks that double the cost of every fork",
    ("gpuq.host.fake_nvml", "subprocess"): _FORK,
    ("gpuq.run.spawner", "subprocess"): _FORK,
    ("gpuq.run.launch", "subprocess"): _FORK,
    ("gpuq.single_instance", "hashlib"): "it loads OpenSSL: " + _FORK,
    (
        "gpuq.host.fake_nvml",
        "hashlib",
    ): "it loads OpenSSL: every job on fake GPUs loads this (fake-use)",
    ("gpuq.host.usage", "psutil"): "only the sampling supervisor needs it: " + _FORK,
}


@dataclass(frozen=True)
class Edge:
    importer: str  # dotted module names
    imported: str
    kind: str  # "module" (at import time), "function" (inside a def), "type" (TYPE_CHECKING), "verb" (by name)
    line: int


@dataclass(frozen=True)
class _Index:
    """What the checks ask of one module, found in one walk of its tree: every call by the
    name it calls (bare or as an attribute), every import statement with where it sits, and
    every def with its qualified name."""

    calls: dict[str, list[ast.Call]]
    imports: list[tuple[ast.Import | ast.ImportFrom, str]]
    functions: list[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]


@functools.lru_cache(maxsize=None)
def _indexed(source: str) -> _Index:
    index = _Index(defaultdict(list), [], [])
    _visit(ast.parse(source), "module", "", index)
    return index


def _visit(node: ast.AST, kind: str, prefix: str, index: _Index) -> None:
    """Each node under `node` into the index. `kind`: where an import here sits (at module
    level, under TYPE_CHECKING, or in a def or lambda); `prefix`: the classes and defs
    around (Worker.__init__)."""
    for child in ast.iter_child_nodes(node):  # every block: if, try, with, match cases, class bodies
        if isinstance(child, ast.Call):
            if isinstance(child.func, ast.Name):
                index.calls[child.func.id].append(child)
            elif isinstance(child.func, ast.Attribute):
                index.calls[child.func.attr].append(child)
        if isinstance(child, (ast.Import, ast.ImportFrom)):
            index.imports.append((child, kind))
        elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
            index.functions.append((prefix + child.name, child))
            _visit(child, "function", f"{prefix}{child.name}.", index)
        elif isinstance(child, ast.Lambda):
            _visit(child, "function", prefix, index)
        elif isinstance(child, ast.ClassDef):
            _visit(child, kind, f"{prefix}{child.name}.", index)
        elif isinstance(child, ast.If) and _is_type_checking(child.test):
            _visit(child.test, kind, prefix, index)
            _visit(ast.Module(body=child.body, type_ignores=[]), "type", prefix, index)
            _visit(ast.Module(body=child.orelse, type_ignores=[]), kind, prefix, index)
        else:
            _visit(child, kind, prefix, index)


def _index(path: Path) -> _Index:
    """A module's index, made once per process for each text it has (every check reads every
    module: the layer tests took 11 s of the fast set parsing them again, the checks walked
    each tree eight times, and the tests' copies of the package differ in a file or two)."""
    source = path.read_text()
    try:
        return _indexed(source)
    except SyntaxError as e:
        e.filename = str(path)
        raise


def modules(package_dir: Path = PACKAGE_DIR) -> dict[str, Path]:
    found = {}
    for path in sorted(package_dir.rglob("*.py")):
        parts = path.relative_to(package_dir.parent).with_suffix("").parts
        if "tests" in parts:
            continue  # an extra's own tests (gpuq/extras/NAME/tests/): not part of the package
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def package_of(module: str) -> str:
    """The package a module counts in: its subpackage, or the one TOP_MODULES gives it ("" for
    a module at the top that TOP_MODULES does not name)."""
    if module in TOP_MODULES:
        return TOP_MODULES[module]
    parts = module.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and parts[1] in ALLOWED) else ""


def edges(package_dir: Path = PACKAGE_DIR) -> list[Edge]:
    known = modules(package_dir)
    out = []
    for name, path in known.items():
        index = _index(path)
        for node, kind in index.imports:
            for target in _targets(name, path, node, known):
                if target != name:
                    out.append(Edge(name, target, kind, node.lineno))
        for call in index.calls.get(VERB_TABLE, ()):
            verb_module = call.args[0].value if call.args and isinstance(call.args[0], ast.Constant) else None
            if isinstance(verb_module, str) and f"gpuq.{verb_module}" in known:
                out.append(Edge(name, f"gpuq.{verb_module}", "verb", call.lineno))
    return out


def dynamic_imports(package_dir: Path = PACKAGE_DIR) -> list[Edge]:
    """Every import by name: importlib.import_module, __import__, exec (imported: the function called)."""
    out = []
    for name, path in modules(package_dir).items():
        calls = _index(path).calls  # by bare name or as an attribute (importlib.import_module)
        for called in ("import_module", "__import__", "exec"):
            out += [Edge(name, called, "dynamic", call.lineno) for call in calls.get(called, ())]
    return out


def lazy_imports(package_dir: Path = PACKAGE_DIR) -> list[Edge]:
    """Every import inside a function, of anything (the imported name is its top-level module)."""
    out = []
    for name, path in modules(package_dir).items():
        for node, kind in _index(path).imports:
            if kind == "function":
                if isinstance(node, ast.ImportFrom):
                    source = "gpuq" if node.level else (node.module or "")
                else:
                    source = node.names[0].name
                out.append(Edge(name, source.split(".")[0], kind, node.lineno))
    return out


def _is_type_checking(test: ast.expr) -> bool:
    """`if TYPE_CHECKING:` or `if typing.TYPE_CHECKING:` exactly (not `if not TYPE_CHECKING:`)."""
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING" and isinstance(test.value, ast.Name)
    )


def _targets(name: str, path: Path, node: ast.Import | ast.ImportFrom, known: dict[str, Path]) -> list[str]:
    if isinstance(node, ast.Import):
        return [a.name for a in node.names if a.name in known]
    if node.level:
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        base = package.split(".")[: len(package.split(".")) - node.level + 1]
        source = ".".join(base + ([node.module] if node.module else []))
    else:
        source = node.module or ""
    found = [source] if source in known else []
    found += [f"{source}.{a.name}" for a in node.names if f"{source}.{a.name}" in known]
    return found


def problems(package_dir: Path = PACKAGE_DIR) -> list[str]:
    """What breaks the layers, one line each; empty when clean: a module in no package, ALLOWED
    letting a package import one beside or above it, an import against ALLOWED, a cycle of
    modules or of packages, an unlisted import inside a function or by name, a function longer
    than MAX_FUNCTION_LINES."""
    found = [
        f"{name} is in no package: put it in one, or give it a layer in TOP_MODULES"
        for name in modules(package_dir)
        if not package_of(name)
    ]
    found += _rules_against_layers()
    all_edges = edges(package_dir)
    for e in all_edges:
        a, b = package_of(e.importer), package_of(e.imported)
        if a and b and a != b and b not in ALLOWED[a]:
            found.append(f"{e.importer} (line {e.line}) imports {e.imported}: {a} may not import {b}")
    for e in lazy_imports(package_dir):
        if (e.importer, e.imported) not in LAZY_IMPORTS:
            found.append(
                f"{e.importer} (line {e.line}) imports {e.imported} inside a function: import it at "
                "the top (a cycle it avoided is a type in the wrong module), or add it to LAZY_IMPORTS "
                "with the cost that only some paths should pay"
            )
    for e in dynamic_imports(package_dir):
        if e.importer not in DYNAMIC_IMPORTS:
            found.append(f"{e.importer} (line {e.line}) imports by name ({e.imported}): import it with a statement")
    found += extras_apart(all_edges)
    for cycle in cycles(all_edges):
        found.append("import cycle: " + " -> ".join(cycle + [cycle[0]]))
    package_edges = [Edge(a, b, "module", 0) for a, bs in package_graph(all_edges).items() for b in bs]
    for cycle in cycles(package_edges):
        found.append("package cycle: " + " -> ".join(cycle + [cycle[0]]))
    found += long_functions(package_dir)
    return found


def long_functions(package_dir: Path = PACKAGE_DIR) -> list[str]:
    """Every function (a method, a nested one too) of the package, core and extras, longer than
    MAX_FUNCTION_LINES, one line each."""
    found = []
    for name, path in modules(package_dir).items():
        for qualname, node in _index(path).functions:
            length = node.end_lineno - node.lineno + 1 if node.end_lineno is not None else 0
            if length > MAX_FUNCTION_LINES:
                found.append(
                    f"{name}: {qualname} (line {node.lineno}) is {length} lines long: split it along "
                    f"its concerns (at most {MAX_FUNCTION_LINES})"
                )
    return found


def line_counts(package_dir: Path = PACKAGE_DIR) -> dict[str, int]:
    """The non-blank lines of Python in the core (the package but gpuq/extras/) and in the
    extras (gpuq/extras/, their own tests/ left out as modules() leaves them)."""
    counts = {"core": 0, "extras": 0}
    for path in modules(package_dir).values():
        part = "extras" if path.relative_to(package_dir).parts[0] == "extras" else "core"
        counts[part] += sum(1 for line in path.read_text().splitlines() if line.strip())
    return counts


def extra_of(module: str) -> str | None:
    """The extra a module belongs to (gpuq.extras.NAME...: NAME), or None for the core."""
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[1] == "extras" else None


def extras_apart(all_edges: list[Edge]) -> list[str]:
    """An extra imports only the core: deleting another extra's folder must not break it."""
    return [
        f"{e.importer} (line {e.line}) imports {e.imported}: one extra may not import another"
        for e in all_edges
        if extra_of(e.importer) and extra_of(e.imported) and extra_of(e.importer) != extra_of(e.imported)
    ]


def _rules_against_layers() -> list[str]:
    """ALLOWED itself must point down the layers (so loosening it cannot pass unnoticed)."""
    layer = {package: i for i, packages in enumerate(LAYERS) for package in packages}
    found = [f"{p} is in ALLOWED but in no layer of LAYERS" for p in ALLOWED if p not in layer]
    for package, imported in ALLOWED.items():
        for other in imported:
            below = layer.get(other, len(LAYERS)) < layer.get(package, -1)
            if not below and (package, other) not in WITHIN_A_LAYER:
                found.append(f"ALLOWED lets {package} import {other}, which is not in a layer below it")
    return found


def cycles(all_edges: list[Edge]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), over every kind of edge."""
    graph: dict[str, set[str]] = defaultdict(set)
    for e in all_edges:
        graph[e.importer].add(e.imported)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for v in sorted(list(graph)):
        if v not in index:
            visit(v)
    return found


def package_graph(all_edges: list[Edge]) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = defaultdict(set)
    for e in all_edges:
        a, b = package_of(e.importer), package_of(e.imported)
        if a != b:
            graph[a].add(b)
    return graph


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    all_edges = edges()
    if "--modules" in argv:
        by_module: dict[str, set[str]] = defaultdict(set)
        for e in all_edges:
            by_module[e.importer].add(e.imported + ("" if e.kind == "module" else f" ({e.kind})"))
        for name in modules():
            print(f"{name} -> {', '.join(sorted(by_module[name])) or '(nothing of gpuq)'}")
        return 0
    sizes: dict[str, int] = defaultdict(int)
    for name in modules():
        sizes[package_of(name)] += 1
    graph = package_graph(all_edges)
    for package in ALLOWED:
        print(
            f"{package:<7} ({sizes[package]:>2} modules) -> {', '.join(sorted(graph[package])) or '(nothing of gpuq)'}"
        )
    counts = line_counts()
    print(
        f"lines: core {counts['core']}, extras {counts['extras']} "
        "(non-blank lines of Python; the extras' own tests/ not counted)"
    )
    found = problems()
    for line in found:
        print("problem:", line)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
