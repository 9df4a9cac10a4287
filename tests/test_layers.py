"""The layer rules docs/ARCHITECTURE.md draws, checked on every import statement (function-level ones
included): kvcommon at the very bottom, hwmodels and keyformer above it, traces above them, sim above
traces, notebooks and workflows on top."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("kvcommon", "hwmodels", "keyformer", "traces", "sim", "workflows", "notebooks")
# what each package may import from the project (itself always)
ALLOWED = {
    "kvcommon": set(),
    "hwmodels": {"kvcommon"},
    "keyformer": {"kvcommon", "hwmodels"},
    "traces": {"kvcommon", "hwmodels", "keyformer"},
    "sim": {"kvcommon", "hwmodels", "keyformer", "traces"},
    "workflows": {"kvcommon", "hwmodels", "keyformer", "traces", "sim"},
    "notebooks": {"kvcommon", "hwmodels", "keyformer", "traces", "sim"},
}


def project_imports(path: Path) -> set[tuple[str, int]]:
    """(top-level project package, line) for every import in one file."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        for name in names:
            top = name.split(".")[0]
            if top in PACKAGES:
                found.add((top, node.lineno))
    return found


def files_of(package: str) -> list[Path]:
    return sorted(p for p in (ROOT / package).rglob("*.py") if ".ipynb_checkpoints" not in p.parts)


@pytest.mark.parametrize("package", [p for p in PACKAGES if (ROOT / p).is_dir()])
def test_imports_follow_the_layers(package):
    bad = [f"{path.relative_to(ROOT)}:{line} imports {top}"
           for path in files_of(package) for top, line in sorted(project_imports(path))
           if top != package and top not in ALLOWED[package]]
    assert not bad, "imports against the layer order:\n" + "\n".join(bad)


def test_the_rule_table_is_a_strict_order():
    """No two packages may import each other: the allowed sets form a chain of layers."""
    for a, deps in ALLOWED.items():
        for b in deps:
            assert a not in ALLOWED[b], f"{a} and {b} may import each other"


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def absolute(module: str, path: Path, node: ast.ImportFrom) -> str:
    """The absolute module name of a `from ... import` (relative ones resolved against `module`)."""
    if node.level == 0:
        return node.module or ""
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    base = package[:len(package) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _without_main_block(tree: ast.Module) -> ast.Module:
    """The module minus its `if __name__ == "__main__":` block (a script entry, e.g. `python -m
    keyformer.generate` handing over to keyformer.cli, is not a dependency of the module)."""
    def is_main(node):
        return (isinstance(node, ast.If) and isinstance(node.test, ast.Compare)
                and isinstance(node.test.left, ast.Name) and node.test.left.id == "__name__")
    tree.body = [n for n in tree.body if not is_main(n)]
    return tree


def module_graph() -> dict[str, set[str]]:
    """Module -> project modules it imports. Package __init__ files are left out on both ends: they
    re-export their modules, which is not a dependency between two modules."""
    files = {module_name(p): p for pkg in PACKAGES if (ROOT / pkg).is_dir() for p in files_of(pkg)}
    modules = {m for m, p in files.items() if p.name != "__init__.py"}
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for m in modules:
        for node in ast.walk(_without_main_block(ast.parse(files[m].read_text()))):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = absolute(m, files[m], node)
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in files else base for a in node.names]
            graph[m] |= {t for t in targets if t in modules and t != m}
    return graph


def test_no_import_cycles_between_modules():
    graph = module_graph()
    index, low, stack, on_stack, cycles = {}, {}, [], set(), []

    def visit(v):      # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
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
                cycles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    assert not cycles, "modules that import each other (directly or in a ring): " + "; ".join(map(" <-> ".join, cycles))
