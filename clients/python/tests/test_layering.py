"""The package's modules import each other without a cycle, counting the imports made inside
functions too (a lazy import hides a cycle from Python, not from a reader). The Rust crates'
own check is tests/it/layering.rs; this is the Python client's."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "pytest_pglease"


def imports_within_package(path: Path) -> set:
    """The package's modules that `path` imports, at any depth of its code."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            if node.module:
                names.add(node.module.split(".")[0])
            else:
                names.update(alias.name for alias in node.names)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            module = node.module if isinstance(node, ast.ImportFrom) else None
            for name in [module] if module else [alias.name for alias in node.names]:
                if name and name.startswith("pytest_pglease."):
                    names.add(name.split(".")[1])
    return names


def find_cycle(graph: dict) -> list:
    """One cycle of `graph` as a list of modules (first = last), or [] when there is none."""
    done, path = set(), []

    def visit(module):
        if module in path:
            return path[path.index(module):] + [module]
        if module in done:
            return []
        path.append(module)
        for target in sorted(graph.get(module, ())):
            cycle = visit(target)
            if cycle:
                return cycle
        path.pop()
        done.add(module)
        return []

    for module in sorted(graph):
        cycle = visit(module)
        if cycle:
            return cycle
    return []


def test_the_package_has_no_import_cycle():
    graph = {
        path.stem: imports_within_package(path) - {path.stem}
        for path in PACKAGE.glob("*.py")
    }
    assert "plugin" in graph and graph["plugin"], "the modules were not found or read"
    assert find_cycle(graph) == [], f"an import cycle: {' -> '.join(find_cycle(graph))}"


def test_a_cycle_is_found():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) == []
