"""No import cycle in src/spekula: the layers import downwards only.

The graph is read statically with `ast`: every `import` and `from ... import` of a spekula module counts,
at module level and inside functions (a lazy import still ties the two modules together). Relative
imports are resolved. An edge to a package is an edge to its `__init__`; a module gets no implicit edge
to its parent package (else every package whose `__init__` re-exports its modules would be a cycle).
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"
ROOT = "spekula"


def module_names(src: Path = SRC, root: str = ROOT) -> dict[str, Path]:
    """Dotted module name -> file; a package is named by its `__init__.py`."""
    names = {}
    for path in sorted((src / root).rglob("*.py")):
        parts = path.relative_to(src).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        names[".".join(parts)] = path
    return names


def imported_modules(name: str, path: Path, known: set[str], root: str = ROOT) -> set[str]:
    """The modules of `known` that `name` (at `path`) imports anywhere in its body."""
    is_package = path.name == "__init__.py"
    package = name if is_package else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            for alias in node.names:
                submodule = f"{source}.{alias.name}"
                # `from pkg import mod` imports the module; `from mod import name` imports mod.
                found.add(submodule if submodule in known else source)
    return {m for m in found if m in known and (m == root or m.startswith(root + "."))}


def import_graph(src: Path = SRC, root: str = ROOT) -> dict[str, set[str]]:
    names = module_names(src, root)
    known = set(names)
    return {name: imported_modules(name, path, known, root) for name, path in names.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle as [a, b, ..., a], or None. Depth-first search with white/grey/black marks."""
    WHITE, GREY, BLACK = 0, 1, 2
    colour = dict.fromkeys(graph, WHITE)
    for start in sorted(graph):
        if colour[start] != WHITE:
            continue
        path = [start]
        colour[start] = GREY
        stack = [iter(sorted(graph[start]))]
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                colour[path.pop()] = BLACK
                stack.pop()
            elif colour.get(nxt, BLACK) == GREY:
                return path[path.index(nxt) :] + [nxt]
            elif colour.get(nxt, BLACK) == WHITE:
                colour[nxt] = GREY
                path.append(nxt)
                stack.append(iter(sorted(graph.get(nxt, ()))))
    return None


def test_find_cycle_on_small_graphs():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None  # a diamond is not a cycle
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"a"}}) == ["a", "a"]
    assert find_cycle({"x": {"a"}, "a": {"b"}, "b": {"a"}}) == ["a", "b", "a"]


def test_edges_are_read_as_python_resolves_them(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from pkg.a import A\n")
    (pkg / "a.py").write_text("A = 1\ndef f():\n    from . import b\n")  # lazy and relative
    (pkg / "b.py").write_text("import pkg.sub.c\nfrom pkg import A\n")  # `from pkg import A`: the __init__
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "c.py").write_text("from ..a import A\nfrom .. import b\nimport os\n")
    graph = import_graph(tmp_path, "pkg")
    assert graph == {
        "pkg": {"pkg.a"},
        "pkg.a": {"pkg.b"},
        "pkg.b": {"pkg.sub.c", "pkg"},
        "pkg.sub": set(),
        "pkg.sub.c": {"pkg.a", "pkg.b"},
    }
    assert find_cycle(graph) == ["pkg", "pkg.a", "pkg.b", "pkg"]


def test_spekula_has_no_import_cycle():
    graph = import_graph()
    # The walk saw the real package: the CLI imports its sub-commands (never the reverse).
    assert {"spekula.bench.cli", "spekula.server.cli", "spekula.models.cli"} <= graph["spekula.cli"]
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle in src/spekula: " + " -> ".join(cycle)
