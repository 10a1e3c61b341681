"""The import floors of docs/architecture.md, held over every import in src/ (at module top level and inside
functions alike): a module never imports one on a higher floor, no two units (a package, or a module that sits on a
floor of its own) import each other round any loop, and no two modules do."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"

# Top floor first. A module stands on the floor of its longest listed prefix.
FLOORS: list[tuple[str, ...]] = [
    (  # commands and the Python API
        "lmforge",
        "lmforge.api",
        "lmforge.cli",
        "lmforge.run_kinds",
        "lmforge.hf_trainer",
    ),
    ("lmforge.experiments",),
    (  # run kinds, reading any run back, and the commands that evaluate or export a run by its path
        "lmforge.train.pretrain",
        "lmforge.train.finetune",
        "lmforge.align",
        "lmforge.compress",
        "lmforge.loading",
        "lmforge.eval.text",
        "lmforge.eval.position_probe",
        "lmforge.eval.harness",
        "lmforge.eval.harness_model",
        "lmforge.eval.finetuned",
        "lmforge.tasks.export_run",
    ),
    ("lmforge.train",),  # the loop, parallelism, checkpoint writing
    ("lmforge.tasks", "lmforge.eval", "lmforge.adapt"),
    ("lmforge.data", "lmforge.objectives", "lmforge.metrics"),
    ("lmforge.models", "lmforge.tokenizers"),
    (  # the config core and what every floor shares
        "lmforge.config",
        "lmforge.checkpoints",
        "lmforge.checkpoint_write",
        "lmforge.dcp_read",
        "lmforge.registry",
        "lmforge.errors",
        "lmforge.files",
        "lmforge.extras",
        "lmforge.progress",
        "lmforge.flag_hints",
    ),
]
_FLOOR = {prefix: len(FLOORS) - 1 - i for i, prefixes in enumerate(FLOORS) for prefix in prefixes}


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


def floor(module: str) -> int:
    name = module
    while name not in _FLOOR:
        name = name.rpartition(".")[0]
    return _FLOOR[name]


def unit(module: str) -> str:
    """A package (lmforge.data), or a module standing on a floor other than its package's (lmforge.data.cli)."""
    parts = module.split(".")
    for n in range(2, len(parts) + 1):
        if all(floor(".".join(parts[:k])) == floor(module) for k in range(n, len(parts) + 1)):
            return ".".join(parts[:n])
    return module


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
    units: dict[str, set[str]] = defaultdict(set)
    for m, targets in GRAPH.items():
        units[unit(m)] |= {unit(t) for t in targets if unit(t) != unit(m)}
    assert _cycles(units) == []


def test_no_module_cycle() -> None:
    """Within a package too, counting the imports that run (a module may name a type of one that imports it, under
    `if TYPE_CHECKING:`); a package's __init__, which gathers its modules' names, is left out."""
    inits = {m for m, p in MODULES.items() if p is None or p.name == "__init__.py"}
    graph = {
        m: {t for t in _imports(m, p, runtime_only=True) if t not in inits}
        for m, p in MODULES.items()
        if m not in inits
    }
    assert _cycles(graph) == []


def test_the_floors_name_real_modules() -> None:
    """A renamed module must not drop out of the order unseen."""
    assert [p for ps in FLOORS for p in ps if p not in MODULES] == []
