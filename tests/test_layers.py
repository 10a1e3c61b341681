"""The import floors of docs/architecture.md, held over every import in src/ (at module top level and inside
functions alike): a module never imports one on a higher floor, no two units (a package, or a module that sits on a
floor of its own) import each other round any loop, and no two modules do."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"

# Top floor first. Each entry is a top-level unit of the package (a subpackage such as lmforge.data, or a module
# such as lmforge.api), and every module stands on its unit's floor: none is listed on a floor of its own.
FLOORS: list[tuple[str, ...]] = [
    ("lmforge", "lmforge.api", "lmforge.cli", "lmforge.run_kinds", "lmforge.hf_trainer"),  # commands, Python API
    ("lmforge.experiments",),
    ("lmforge.pretraining", "lmforge.finetuning", "lmforge.align", "lmforge.compress"),  # the run kinds
    ("lmforge.eval",),  # evaluations, of a model or of any run by its path
    ("lmforge.loading", "lmforge.train"),  # reading any run back; the machinery every run kind trains with
    ("lmforge.tasks",),
    ("lmforge.adapt",),
    ("lmforge.data", "lmforge.objectives", "lmforge.metrics"),
    ("lmforge.models", "lmforge.tokenizers"),
    (  # the config core and what every floor shares
        "lmforge.config",
        "lmforge.checkpoint",
        "lmforge.registry",
        "lmforge.errors",
        "lmforge.files",
        "lmforge.extras",
        "lmforge.progress",
        "lmforge.flag_hints",
    ),
]
_FLOOR = {unit: len(FLOORS) - 1 - i for i, units in enumerate(FLOORS) for unit in units}


def _modules() -> dict[str, Path | None]:
    """Dotted name → source file; None for a package without an __init__.py (a namespace package)."""
    found: dict[str, Path | None] = {}
    for path in sorted((SRC / "lmforge").rglob("*.py")):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
        for n in range(1, len(parts)):
            found.setdefault(".".join(parts[:n]), None)
    return found


MODULES = _modules()


def _resolve(name: str) -> str:
    """The module `name` refers to: itself, or the module that defines it (`from pkg.mod import Class`)."""
    while name not in MODULES:
        name = name.rpartition(".")[0]
    return name


def _type_only(tree: ast.AST) -> set[int]:
    """The import statements under `if TYPE_CHECKING:`, which run for type checkers only."""
    return {
        id(sub)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        for stmt in node.body
        for sub in ast.walk(stmt)
    }


def _imports(module: str, path: Path | None, runtime_only: bool = False) -> set[str]:
    """Every lmforge module `module` imports, wherever the import statement stands (`runtime_only`: leaving out
    those under `if TYPE_CHECKING:`)."""
    if path is None:
        return set()
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skip = _type_only(tree) if runtime_only else set()
    out = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            names = [f"{base}.{a.name}" for a in node.names]
        else:
            continue
        out |= {_resolve(n) for n in names if n == "lmforge" or n.startswith("lmforge.")}
    out.discard(module)
    return out


GRAPH = {m: _imports(m, p) for m, p in MODULES.items()}


def unit(module: str) -> str:
    """The top-level unit a module belongs to: lmforge.data.corpus.read → lmforge.data; lmforge → lmforge."""
    return ".".join(module.split(".")[:2])


def floor(module: str) -> int:
    return _FLOOR[unit(module)]


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def upward_imports() -> set[tuple[str, str]]:
    return {(m, t) for m, targets in GRAPH.items() for t in targets if floor(t) > floor(m)}


def test_no_module_imports_a_higher_floor() -> None:
    found = sorted(upward_imports())
    assert not found, "imports against the floor order:\n" + "\n".join(f"{m} -> {t}" for m, t in found)


def test_no_package_cycle() -> None:
    """At every grain: the top-level units, and the subpackages inside each (lmforge.models.hf against
    lmforge.models, lmforge.data.corpus against lmforge.data.fetch)."""
    for depth in range(2, max(m.count(".") for m in MODULES) + 1):
        packages: dict[str, set[str]] = defaultdict(set)
        for m, targets in GRAPH.items():
            here = ".".join(m.split(".")[:depth])
            packages[here] |= {t2 for t in targets if (t2 := ".".join(t.split(".")[:depth])) != here}
        assert _cycles(packages) == [], f"package cycle at depth {depth}"


def test_no_module_cycle() -> None:
    """Every import counts, inside functions and under `if TYPE_CHECKING:` alike, and a package's __init__ is a
    module like any other."""
    assert _cycles(GRAPH) == []


def test_every_unit_has_a_floor() -> None:
    """A new top-level module or package must be placed on a floor, not fall through to one unseen; a renamed one
    must not drop out of the order."""
    units = {unit(m) for m in MODULES}
    assert sorted(units - set(_FLOOR)) == []
    assert sorted(set(_FLOOR) - units) == []
