"""Figures of fedhet's source: modules, the imports between them, import circles, and the longest functions.

    python scripts/code_figures.py [--src src] [--top 15]

An import is any ``import fedhet...`` / ``from fedhet... import`` in a module, at its top, inside a function or
under ``TYPE_CHECKING`` (each says that one module needs another). A circle is a set of two or more modules that
reach each other through imports (a strongly connected component). A function's length is its lines from ``def``
to its last line, docstring included.
"""

from __future__ import annotations

import argparse
import ast
from pathlib import Path


def module_name(path: Path, src: Path) -> str:
    parts = list(path.relative_to(src).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(tree: ast.AST, name: str, is_package: bool, known: set[str]) -> set[str]:
    """The fedhet modules that module `name` imports (a name imported from a package counts as its module when
    that is one)."""
    found: set[str] = set()
    package = name if is_package else name.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parent, base] if base else parent)
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of two or more modules (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
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
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--src", type=Path, default=Path("src"))
    parser.add_argument("--top", type=int, default=15)
    args = parser.parse_args()
    files = sorted(args.src.glob("fedhet/**/*.py"))
    trees = {module_name(f, args.src): (f, ast.parse(f.read_text(), str(f))) for f in files}
    known = set(trees)
    graph = {name: imported(tree, name, path.name == "__init__.py", known) for name, (path, tree) in trees.items()}
    lines = sum(len(path.read_text().splitlines()) for path, _ in trees.values())
    print(f"modules {len(trees)}, lines {lines}, imports between modules {sum(len(v) for v in graph.values())}")
    found = circles(graph)
    print(f"import circles {len(found)}")
    for circle in found:
        print(f"  {len(circle)} modules: {', '.join(circle)}")
    functions = []
    for path, tree in trees.values():
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                end = node.end_lineno or node.lineno
                functions.append((end - node.lineno + 1, f"{path}:{node.lineno} {node.name}"))
    functions.sort(reverse=True)
    print(f"longest functions (of {len(functions)}):")
    for length, where in functions[: args.top]:
        print(f"  {length:4d}  {where}")


if __name__ == "__main__":
    main()
